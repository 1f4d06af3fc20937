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
 * $UVCCL_RING_ORDER=rank. */
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

void uvccl__ring_of(group_t *g, ring_t *x) {
  if (!g->ring_made) {
    int by_rank = 0, i;
    uvccl__config_choice(UVCCL__CFG_RING_ORDER, &by_rank);
    g->ring = by_rank ? NULL : make_order(g);
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
