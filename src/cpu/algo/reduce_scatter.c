/* reduce_scatter(v): a ring, natively; across hosts alike, in two. */
#include "algo.h"

/* ---- reduce_scatter ------------------------------------------------------ */

/* A reduce-scatter ring over x where position p carries the m blocks
 * items[p * m .. p * m + m) (group ranks; off[b], counts[b] in elements,
 * each cut in nseg segments): at step t the blocks of position q - t - 1
 * go right (from in at the first step where from_input, else from work)
 * and those of q - t - 2 are reduced into work as they arrive (in the
 * last ring, this rank's own block into recvbuf, scaled); have[b * nseg + k]:
 * the op after which segment k of block b holds what this rank adds
 * (NONE: the input, from the start), updated with what arrives. A
 * position's m items go in the order jfirst, jfirst - 1, ... (mod m). */
static void ring_reduce_items(sched_t *s, const ring_t *x, const int *items,
                              int m, int jfirst, uint32_t nseg,
                              int from_input, int last, const char *in,
                              char *work, char *recvbuf, const size_t *off,
                              const size_t *counts, uint32_t *have,
                              uint32_t *first) {
  int P = x->P, st, i, j, me = s->g->rank;
  size_t es = s->esize;
  uint32_t k;
  const char *mine = from_input ? in : work; /* what this rank adds */
  for (st = 0; st < P - 1; st++) {
    int ps = mod(x->q - st - 1, P), pr = mod(x->q - st - 2, P);
    for (i = 0; i < m; i++) {
      int bs, br;
      j = mod(jfirst - i, m);
      bs = items[ps * m + j];
      br = items[pr * m + j];
      for (k = 0; k < nseg; k++) {
        size_t so, sl, ro, rl;
        uint32_t tag = ((uint32_t)st * (uint32_t)m + (uint32_t)j) * nseg + k;
        uint32_t snd, rcv;
        char *dst;
        seg_range(counts[bs], nseg, k, &so, &sl);
        seg_range(counts[br], nseg, k, &ro, &rl);
        snd = uvccl__sop_send(s, x->right, tag,
                              (st == 0 ? mine : work) + (off[bs] + so) * es,
                              sl * es);
        uvccl__sop_dep(s, have[(size_t)bs * nseg + k], snd);
        if (first != NULL && st == 0 && i == 0) first[k] = snd;
        dst = last && br == me ? recvbuf + ro * es
                               : work + (off[br] + ro) * es;
        rcv = uvccl__sop_recv_red_from(s, x->left, tag, dst,
                                       mine + (off[br] + ro) * es, rl * es);
        uvccl__sop_dep(s, have[(size_t)br * nseg + k], rcv);
        if (last && br == me && (s->divisor > 1 || s->scale != 1.0)) {
          uint32_t sc = uvccl__sop_scale(s, dst, rl * es);
          uvccl__sop_dep(s, rcv, sc);
          rcv = sc;
        }
        have[(size_t)br * nseg + k] = rcv;
      }
    }
  }
}

/* Hosts alike (H of L ranks, ring.c): each host's ring first reduces
 * the columns (column p: the blocks of the ranks at place p of every
 * host) through shared memory, so that the rank at place p holds column
 * p reduced over its host; then the ring across the hosts at each place
 * reduce-scatters its column, each host's link carrying (H-1)/H of the
 * whole, the least it can. As in the allreduce, the L connections that
 * leave a host are held together (allreduce.c says why): a rank starts
 * segment k across only once its left neighbour in the host has its own
 * block's segment k - CROSS_AHEAD; nothing else comes back into the host
 * here, so the neighbour says so with an empty message. The host ring
 * hands over the column's blocks in the order the ring across adds them
 * (the previous host's first, then the one before it...): in host order
 * the block the first host adds first, the last host's, came last, and
 * the ring across, as slow as its slowest member, waited for the whole
 * host ring. */
static int reduce_scatter_hosts(sched_t *s, const ring_t *in_host,
                                const ring_t *across, const char *sendbuf,
                                char *recvbuf, const size_t *counts,
                                const size_t *off, size_t total,
                                size_t maxc) {
  group_t *g = s->g;
  int P = g->size, H = across->P, p;
  uint32_t nseg = nseg_for(maxc * s->esize, g->segment), *have, *first, k;
  uint32_t told = (uint32_t)(in_host->P - 1) * (uint32_t)H * nseg;
  char *work = uvccl__sched_tmp(s, total * s->esize);
  have = uvccl__malloc((size_t)P * nseg * sizeof(uint32_t));
  first = uvccl__malloc(nseg * sizeof(uint32_t));
  if (work == NULL || have == NULL || first == NULL) {
    uvccl__free(have);
    uvccl__free(first);
    return UV_ENOMEM;
  }
  for (p = 0; p < P * (int)nseg; p++) have[p] = NONE;
  /* the host ring's position p carries column p */
  ring_reduce_items(s, in_host, uvccl__ring_columns(g), H,
                    mod(across->q - 1, H), nseg, 1, 0, sendbuf, work, recvbuf,
                    off, counts, have, NULL);
  ring_reduce_items(s, across, across->R, 1, 0, nseg, 0, 1, sendbuf, work,
                    recvbuf, off, counts, have, first);
  /* (tags past the host ring's: the same two neighbours) */
  for (k = 0; k + CROSS_AHEAD < nseg; k++) {
    uint32_t snd = uvccl__sop_send(s, in_host->right, told + k, NULL, 0);
    uint32_t rcv = uvccl__sop_recv(s, in_host->left, told + k, NULL, 0);
    uvccl__sop_dep(s, have[(size_t)g->rank * nseg + k], snd);
    uvccl__sop_dep(s, rcv, first[k + CROSS_AHEAD]);
  }
  uvccl__free(have);
  uvccl__free(first);
  return 0;
}

/* Hosts of different sizes, each of two ranks or more: the mirror of
 * allgather_leaders (gather.c). Every block goes down the host's chain to
 * its leader, each rank adding its input (shared memory); the leaders
 * reduce-scatter the hosts' blocks around a ring of their own, so that
 * each leader ends with its host's blocks; it sends each member its own.
 * A block is reduced in one place at each step, so every rank gets the
 * same bits. Tags: the chain and the ring by block (b nseg + k: the chain
 * stays in a host, the ring leaves it), the leader's sends after them. */
static int reduce_scatter_leaders(sched_t *s, const ring_t *in_host,
                                  const ring_t *leaders, const char *sendbuf,
                                  char *recvbuf, const size_t *counts,
                                  const size_t *off, size_t total,
                                  size_t maxc) {
  group_t *g = s->g;
  const int *runs = uvccl__ring_lead_runs(g);
  ring_t x;
  int P = g->size, H = leaders->P, L = in_host->P, i = in_host->q, st, j, b;
  int down = i > 0 ? ring_at(in_host, i - 1) : -1;
  int up = i < L - 1 ? ring_at(in_host, i + 1) : -1;
  size_t es = s->esize;
  uint32_t nseg = nseg_for(maxc * es, g->segment), k, *have;
  char *work = uvccl__sched_tmp(s, total * es);
  uvccl__ring_of(g, &x);
  have = uvccl__malloc((size_t)P * nseg * sizeof(uint32_t));
  if (work == NULL || have == NULL) {
    uvccl__free(have);
    return UV_ENOMEM;
  }
  /* down the chain: work = own input op what came from above */
  for (b = 0; b < P; b++)
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      uint32_t tag = (uint32_t)b * nseg + k, got = NONE, snd;
      seg_range(counts[b], nseg, k, &o, &l);
      o = (off[b] + o) * es;
      if (up >= 0)
        got = uvccl__sop_recv_red_from(s, up, tag, work + o, sendbuf + o,
                                       l * es);
      if (down >= 0) {
        snd = uvccl__sop_send(s, down, tag, (up >= 0 ? work : sendbuf) + o,
                              l * es);
        uvccl__sop_dep(s, got, snd);
      }
      have[(size_t)b * nseg + k] = got;
    }
  /* the leaders' ring: at step st the hosts' blocks st + 1 places to the
   * left go right, those st + 2 places to the left come and are added;
   * the last step brings this host's, into place */
  for (st = 0; i == 0 && st < H - 1; st++) {
    int hs = mod(leaders->q - st - 1, H), hr = mod(leaders->q - st - 2, H);
    for (j = runs[hs]; j < runs[hs + 1]; j++) {
      int bs = ring_at(&x, j);
      for (k = 0; k < nseg; k++) {
        size_t o, l;
        uint32_t snd;
        seg_range(counts[bs], nseg, k, &o, &l);
        snd = uvccl__sop_send(s, leaders->right, (uint32_t)bs * nseg + k,
                              work + (off[bs] + o) * es, l * es);
        uvccl__sop_dep(s, have[(size_t)bs * nseg + k], snd);
      }
    }
    for (j = runs[hr]; j < runs[hr + 1]; j++) {
      int br = ring_at(&x, j);
      for (k = 0; k < nseg; k++) {
        size_t o, l;
        uint32_t rcv;
        char *w;
        seg_range(counts[br], nseg, k, &o, &l);
        w = work + (off[br] + o) * es;
        if (br == g->rank && st == H - 2) /* into place: out = work op in */
          rcv = uvccl__sop_recv_red_from(s, leaders->left,
                                         (uint32_t)br * nseg + k,
                                         recvbuf + o * es, w, l * es);
        else
          rcv = uvccl__sop_recv_red(s, leaders->left, (uint32_t)br * nseg + k,
                                    w, l * es);
        uvccl__sop_dep(s, have[(size_t)br * nseg + k], rcv);
        if (st == H - 2)
          rcv = then_scale(s, br == g->rank ? recvbuf + o * es : w, l * es,
                           rcv);
        have[(size_t)br * nseg + k] = rcv;
      }
    }
  }
  /* the leader sends each member its block; each takes it into place */
  for (j = 1; j < L; j++) {
    int m = ring_at(in_host, j);
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      uint32_t tag = (uint32_t)P * nseg + k, snd;
      seg_range(counts[m], nseg, k, &o, &l);
      if (i == 0) {
        snd = uvccl__sop_send(s, m, tag, work + (off[m] + o) * es, l * es);
        uvccl__sop_dep(s, have[(size_t)m * nseg + k], snd);
      } else if (m == g->rank) {
        uvccl__sop_recv(s, ring_at(in_host, 0), tag, recvbuf + o * es,
                        l * es);
      }
    }
  }
  uvccl__free(have);
  return 0;
}

/* Ring where rank r finishes with block r: at step t the rank at ring
 * position q sends the block of position q - t - 1 and reduces that of
 * q - t - 2 into its working copy. */
static int reduce_scatter_build(sched_t *s, const char *sendbuf, char *recvbuf,
                                const size_t *counts) {
  group_t *g = s->g;
  ring_t x;
  int P = g->size, r = g->rank, st, c, left, right;
  size_t es = s->esize, maxc = 0, total = 0, *off;
  uint32_t nseg, k, *prev;
  char *work;

  off = uvccl__malloc((size_t)P * sizeof(size_t));
  if (off == NULL) return UV_ENOMEM;
  for (c = 0; c < P; c++) {
    off[c] = total;
    total += counts[c];
    if (counts[c] > maxc) maxc = counts[c];
  }
  if (P == 1) {
    uint32_t cp = uvccl__sop_copy(s, recvbuf, sendbuf, counts[0] * es);
    if (s->divisor > 1 || s->scale != 1.0)
      uvccl__sop_dep(s, cp, uvccl__sop_scale(s, recvbuf, counts[0] * es));
    uvccl__free(off);
    return 0;
  }
  {
    ring_t in_host, across;
    if (uvccl__ring_hosts(g, &in_host, &across)) {
      int rc = reduce_scatter_hosts(s, &in_host, &across, sendbuf, recvbuf,
                                    counts, off, total, maxc);
      uvccl__free(off);
      return rc;
    }
    if (uvccl__ring_leaders(g, &in_host, &across) &&
        uvccl__ring_lead_pairs(g, across.P)) {
      int rc = reduce_scatter_leaders(s, &in_host, &across, sendbuf, recvbuf,
                                      counts, off, total, maxc);
      uvccl__free(off);
      return rc;
    }
  }
  uvccl__ring_of(g, &x);
  left = x.left;
  right = x.right;
  nseg = nseg_for(maxc * es, g->segment);
  work = uvccl__sched_tmp(s, total * es);
  prev = uvccl__malloc(nseg * sizeof(uint32_t));
  if (work == NULL || prev == NULL) {
    uvccl__free(off);
    uvccl__free(prev);
    return UV_ENOMEM;
  }
  for (st = 0; st < P - 1; st++) {
    int cs = ring_at(&x, x.q - st - 1), cr = ring_at(&x, x.q - st - 2);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)st * nseg + k, snd, rcv;
      const char *src;
      char *dst;
      seg_range(counts[cs], nseg, k, &so, &sl);
      seg_range(counts[cr], nseg, k, &ro, &rl);
      src = st == 0 ? sendbuf + (off[cs] + so) * es
                    : work + (off[cs] + so) * es;
      snd = uvccl__sop_send(s, right, tag, src, sl * es);
      if (st > 0) uvccl__sop_dep(s, prev[k], snd);
      dst = cr == r ? recvbuf + ro * es : work + (off[cr] + ro) * es;
      /* each block is reduced once per rank: dst = own input op arrival */
      rcv = uvccl__sop_recv_red_from(s, left, tag, dst,
                                     sendbuf + (off[cr] + ro) * es, rl * es);
      if (cr == r && (s->divisor > 1 || s->scale != 1.0))
        uvccl__sop_dep(s, rcv, uvccl__sop_scale(s, dst, rl * es));
      prev[k] = rcv;
    }
  }
  uvccl__free(prev);
  uvccl__free(off);
  return 0;
}

static int reduce_scatter_common(uvccl_pg_t *pg, uvccl_work_t *work,
                                 const void *sendbuf, void *recvbuf,
                                 const size_t *counts, size_t even,
                                 uvccl_dtype_t dtype, uvccl_redop_t op,
                                 uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t *c = NULL, total = 0;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  c = uvccl__malloc((size_t)g->size * sizeof(size_t));
  if (c == NULL) return UV_ENOMEM;
  for (i = 0; i < g->size; i++) {
    c[i] = counts ? counts[i] : even;
    total += c[i];
  }
  if ((rc = check_count(total, uvccl_dtype_size(dtype), sendbuf)) != 0 ||
      (c[g->rank] > 0 && recvbuf == NULL)) {
    uvccl__free(c);
    return rc ? rc : UV_EINVAL;
  }
  s = uvccl__sched_new(g, "reduce_scatter", 0);
  if (s == NULL) {
    uvccl__free(c);
    return UV_ENOMEM;
  }
  rc = uvccl__sched_set_op(s, dtype, op);
  if (rc == 0 && counts == NULL && uvccl__algo_box_fits(g, even * s->esize)) {
    /* every rank's blocks through shared memory, one round (shm.c) */
    size_t n = even * s->esize;
    uint32_t bx = uvccl__sop_box(s, UVCCL__BOX_REDUCE_SCATTER, -1, sendbuf,
                                 recvbuf, n);
    then_scale(s, recvbuf, n, bx);
  } else if (rc == 0) {
    rc = reduce_scatter_build(s, sendbuf, recvbuf, c);
  }
  uvccl__sched_describe(s, -1, total, c[g->rank], -1);
  uvccl__free(c);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                               const void *sendbuf, void *recvbuf, size_t count,
                               uvccl_dtype_t dtype, uvccl_redop_t op,
                               uvccl_work_cb cb) {
  return reduce_scatter_common(pg, work, sendbuf, recvbuf, NULL, count, dtype,
                               op, cb);
}

int uvccl__host_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, uvccl_dtype_t dtype,
                                uvccl_redop_t op, uvccl_work_cb cb) {
  if (recvcounts == NULL) return UV_EINVAL;
  return reduce_scatter_common(pg, work, sendbuf, recvbuf, recvcounts, 0,
                               dtype, op, cb);
}
