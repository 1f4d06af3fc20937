/* The order of the rings and chains (algo.h, ring_t): each host's ranks
 * one after another, so that a ring crosses each host's link once each
 * way, and a chain once, however the ranks were placed. Hosts come in the
 * order of their lowest group rank, and a host's ranks in rank order:
 * where ranks were placed by host, that is rank order itself.
 *
 * Every member must build the same ring. The hosts come from the
 * shared-memory offers every pair exchanges at creation (net->hosts), so
 * in a world that connected its full mesh every rank knows every peer's
 * host by the time a collective starts; a sparse world (lazy
 * connections) does not, and keeps rank order, as does
 * $UVCCL_RING_ORDER=rank.
 *
 * Hosts alike (as many ranks each, two or more, and two hosts or more):
 * uvccl__ring_hosts gives the two rings of the hierarchical allreduce,
 * one in this rank's host and one across the hosts at its place. Hosts
 * of any sizes: uvccl__ring_leaders gives the ring of this rank's host
 * and the ring of the hosts' leaders. */
#include "algo.h"

static int *make_order(const group_t *g) {
  const net_t *net = g->net;
  int P = g->size, i, j, n = 0, *order, *done;
  if (net->sparse || P < 3) return NULL;
  for (i = 0; i < P; i++)
    if (net->hosts[g->ranks[i]] == 0) return NULL; /* not known */
  order = uvccl__malloc((size_t)P * sizeof(int));
  done = uvccl__calloc((size_t)P, sizeof(int));
  if (order == NULL || done == NULL) {
    uvccl__free(order);
    uvccl__free(done);
    return NULL; /* rank order is as right, only slower */
  }
  for (i = 0; i < P; i++) {
    uint64_t h;
    if (done[i]) continue;
    h = net->hosts[g->ranks[i]];
    for (j = i; j < P; j++)
      if (!done[j] && net->hosts[g->ranks[j]] == h) {
        done[j] = 1;
        order[n++] = j;
      }
  }
  uvccl__free(done);
  for (i = 0; i < P && order[i] == i; i++) {
  }
  if (i == P) { /* placed by host already */
    uvccl__free(order);
    return NULL;
  }
  return order;
}

enum { ORDER_HOST = 0, ORDER_RING, ORDER_RANK };

void uvccl__ring_of(group_t *g, ring_t *x) {
  if (!g->ring_made) {
    int order = ORDER_HOST, i;
    uvccl__config_choice(UVCCL__CFG_RING_ORDER, &order);
    g->ring = order == ORDER_RANK ? NULL : make_order(g);
    g->ring_pos = g->rank;
    for (i = 0; g->ring != NULL && i < g->size; i++)
      if (g->ring[i] == g->rank) g->ring_pos = i;
    g->ring_made = 1;
  }
  x->P = g->size;
  x->R = g->ring;
  x->q = g->ring_pos;
  x->left = ring_at(x, x->q - 1);
  x->right = ring_at(x, x->q + 1);
}

/* The hosts' shapes from the ring (host order): H hosts of L ranks each,
 * or 0. */
static void make_hier(group_t *g) {
  const net_t *net = g->net;
  ring_t x;
  int P = g->size, L = 0, H, i, j, me_h, me_l, order = ORDER_HOST;
  uvccl__config_choice(UVCCL__CFG_RING_ORDER, &order);
  uvccl__ring_of(g, &x);
  if (order != ORDER_HOST || net->sparse || P < 4) return;
  for (i = 0; i < P; i++)
    if (net->hosts[g->ranks[i]] == 0) return;
  /* in host order each host's ranks are consecutive: L is the first run */
  while (L < P && net->hosts[g->ranks[ring_at(&x, L)]] ==
                      net->hosts[g->ranks[ring_at(&x, 0)]])
    L++;
  if (L < 2 || L == P || P % L != 0) return;
  H = P / L;
  for (i = 1; i < P; i++) /* the host changes every L ranks, only there */
    if ((net->hosts[g->ranks[ring_at(&x, i)]] !=
         net->hosts[g->ranks[ring_at(&x, i - 1)]]) != (i % L == 0))
      return;
  for (j = 1; j < H; j++) /* a host's ranks in one run only */
    for (i = 0; i < j; i++)
      if (net->hosts[g->ranks[ring_at(&x, j * L)]] ==
          net->hosts[g->ranks[ring_at(&x, i * L)]])
        return;
  me_h = x.q / L;
  me_l = x.q % L;
  g->hier = uvccl__malloc((size_t)(L + H + P) * sizeof(int));
  if (g->hier == NULL) return; /* one ring is as right */
  for (i = 0; i < L; i++) g->hier[i] = ring_at(&x, me_h * L + i);
  for (j = 0; j < H; j++) g->hier[L + j] = ring_at(&x, j * L + me_l);
  for (i = 0; i < L; i++) /* column i: the rank at place i of every host */
    for (j = 0; j < H; j++) g->hier[L + H + i * H + j] = ring_at(&x, j * L + i);
  g->hier_L = L;
  g->hier_H = H;
  g->hier_me_l = me_l;
  g->hier_me_h = me_h;
}

/* Hosts of any sizes, from the ring (host order): each host's ranks are
 * one run of it; the first of a run leads its host. */
static void make_lead(group_t *g) {
  const net_t *net = g->net;
  ring_t x;
  int P = g->size, H = 0, start = 0, i, j, big = 0, order = ORDER_HOST;
  int *lead;
  uvccl__config_choice(UVCCL__CFG_RING_ORDER, &order);
  uvccl__ring_of(g, &x);
  if (order != ORDER_HOST || net->sparse || P < 3) return;
  for (i = 0; i < P; i++)
    if (net->hosts[g->ranks[i]] == 0) return;
  lead = uvccl__malloc((size_t)(3 * P + 1) * sizeof(int));
  if (lead == NULL) return; /* one ring is as right */
  for (i = 1; i <= P; i++) {
    if (i < P && net->hosts[g->ranks[ring_at(&x, i)]] ==
                     net->hosts[g->ranks[ring_at(&x, i - 1)]])
      continue;
    /* positions [start, i): one host */
    for (j = 0; j < H; j++) /* a host in one run only (host order) */
      if (net->hosts[g->ranks[lead[P + j]]] ==
          net->hosts[g->ranks[ring_at(&x, start)]]) {
        uvccl__free(lead);
        return;
      }
    lead[P + H] = ring_at(&x, start);
    lead[2 * P + H] = start;
    if (x.q >= start && x.q < i) {
      for (j = start; j < i; j++) lead[j - start] = ring_at(&x, j);
      g->lead_L = i - start;
      g->lead_me_l = x.q - start;
      g->lead_me_h = H;
    }
    big |= i - start >= 2;
    H++;
    start = i;
  }
  if (H < 2 || !big) {
    uvccl__free(lead);
    return;
  }
  lead[2 * P + H] = P;
  g->lead = lead;
  g->lead_H = H;
}

static void ring_set(ring_t *x, int P, const int *R, int q) {
  x->P = P;
  x->R = R;
  x->q = q;
  x->left = ring_at(x, q - 1);
  x->right = ring_at(x, q + 1);
}

int uvccl__ring_leaders(group_t *g, ring_t *in_host, ring_t *leaders) {
  if (!g->lead_made) {
    make_lead(g);
    g->lead_made = 1;
  }
  if (g->lead == NULL) return 0;
  ring_set(in_host, g->lead_L, g->lead, g->lead_me_l);
  ring_set(leaders, g->lead_H, g->lead + g->size, g->lead_me_h);
  return 1;
}

const int *uvccl__ring_lead_runs(const group_t *g) {
  return g->lead + 2 * g->size;
}

int uvccl__ring_spans_hosts(const group_t *g) {
  const net_t *net = g->net;
  uint64_t first;
  int i;
  if (net->sparse || g->size < 2) return 0;
  first = net->hosts[g->ranks[0]];
  for (i = 0; i < g->size; i++)
    if (net->hosts[g->ranks[i]] == 0) return 0; /* not known */
  for (i = 1; i < g->size; i++)
    if (net->hosts[g->ranks[i]] != first) return 1;
  return 0;
}

const int *uvccl__ring_columns(const group_t *g) {
  return g->hier + g->hier_L + g->hier_H;
}

int uvccl__ring_hosts(group_t *g, ring_t *in_host, ring_t *across) {
  if (!g->hier_made) {
    make_hier(g);
    g->hier_made = 1;
  }
  if (g->hier == NULL) return 0;
  ring_set(in_host, g->hier_L, g->hier, g->hier_me_l);
  ring_set(across, g->hier_H, g->hier + g->hier_L, g->hier_me_h);
  return 1;
}
