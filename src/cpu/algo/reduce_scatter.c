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
 * (NONE: the input, from the start), updated with what arrives. */
static void ring_reduce_items(sched_t *s, const ring_t *x, const int *items,
                              int m, uint32_t nseg, int from_input, int last,
                              const char *in, char *work, char *recvbuf,
                              const size_t *off, const size_t *counts,
                              uint32_t *have, uint32_t *first) {
  int P = x->P, st, j, me = s->g->rank;
  size_t es = s->esize;
  uint32_t k;
  const char *mine = from_input ? in : work; /* what this rank adds */
  for (st = 0; st < P - 1; st++) {
    int ps = mod(x->q - st - 1, P), pr = mod(x->q - st - 2, P);
    for (j = 0; j < m; j++) {
      int bs = items[ps * m + j], br = items[pr * m + j];
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
        if (first != NULL && st == 0 && j == 0) first[k] = snd;
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
 * here, so the neighbour says so with an empty message. */
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
  ring_reduce_items(s, in_host, uvccl__ring_columns(g), H, nseg, 1, 0,
                    sendbuf, work, recvbuf, off, counts, have, NULL);
  ring_reduce_items(s, across, across->R, 1, nseg, 0, 1, sendbuf, work,
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
