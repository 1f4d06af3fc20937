/* allgather(v) (Bruck or a segmented ring), gather and scatter. */
#include "algo.h"

/* ---- allgather ----------------------------------------------------------- */

/* Ring: at step t, block r - t goes right and block r - t - 1 comes from
 * the left, straight into its place. Used by split and the bytes
 * collectives too (lens in bytes). */
/* Bruck's allgather for small totals: ceil(log2 P) rounds instead of the
 * ring's P - 1. After round k rank r holds blocks r .. r + 2^(k+1) - 1;
 * in round k it passes the (at most 2^k) blocks it holds to r - 2^k and
 * gets the next ones from r + 2^k. Blocks land straight in place (each
 * block its own message, tagged with its index: one peer per round), so
 * no rotation or scratch copy is needed. */
static int allgather_bruck(sched_t *s, const void *sendbuf, void *const *bufs,
                           const size_t *lens) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, d, i;
  uint32_t *have = uvccl__malloc((size_t)P * sizeof(uint32_t));
  if (have == NULL) return UV_ENOMEM;
  for (i = 0; i < P; i++) have[i] = NONE;
  for (d = 1; d < P; d *= 2) {
    int to = mod(r - d, P), from = mod(r + d, P);
    int cnt = d < P - d ? d : P - d;
    uint32_t *got = uvccl__malloc((size_t)cnt * sizeof(uint32_t));
    if (got == NULL) {
      uvccl__free(have);
      return UV_ENOMEM;
    }
    for (i = 0; i < cnt; i++) {
      int b = mod(r + i, P), nb = mod(from + i, P);
      const char *src = b == r ? sendbuf : bufs[b];
      uint32_t snd = uvccl__sop_send(s, to, (uint32_t)b, src, lens[b]);
      uvccl__sop_dep(s, have[b], snd);
      got[i] = uvccl__sop_recv(s, from, (uint32_t)nb, bufs[nb], lens[nb]);
    }
    /* blocks received in this round are forwarded only in later ones */
    for (i = 0; i < cnt; i++) have[mod(from + i, P)] = got[i];
    uvccl__free(got);
  }
  uvccl__free(have);
  return 0;
}

/* A ring over x where position p carries the m blocks items[p * m ..
 * p * m + m) (group ranks), each cut in nseg segments: at step t, the
 * blocks of position q - t go right and those of q - t - 1 come from the
 * left, straight into place. have[b * nseg + k]: the op after which
 * segment k of block b is in bufs[b] (NONE: there from the start; this
 * rank's own block is sent from sendbuf); what arrives is recorded
 * there. */
static void ring_gather_items(sched_t *s, const ring_t *x, const int *items,
                              int m, uint32_t nseg, const void *sendbuf,
                              void *const *bufs, const size_t *lens,
                              uint32_t *have, uint32_t *first) {
  int P = x->P, st, j;
  uint32_t k;
  for (st = 0; st < P - 1; st++) {
    int ps = mod(x->q - st, P), pr = mod(x->q - st - 1, P);
    for (j = 0; j < m; j++) {
      int bs = items[ps * m + j], br = items[pr * m + j];
      for (k = 0; k < nseg; k++) {
        size_t so, sl, ro, rl;
        uint32_t tag = ((uint32_t)st * (uint32_t)m + (uint32_t)j) * nseg + k;
        uint32_t snd;
        const char *src = bs == s->g->rank ? (const char *)sendbuf
                                           : (const char *)bufs[bs];
        seg_range(lens[bs], nseg, k, &so, &sl);
        seg_range(lens[br], nseg, k, &ro, &rl);
        snd = uvccl__sop_send(s, x->right, tag, src + so, sl);
        uvccl__sop_dep(s, have[(size_t)bs * nseg + k], snd);
        if (first != NULL && st == 0 && j == 0) first[k] = snd;
        have[(size_t)br * nseg + k] =
            uvccl__sop_recv(s, x->left, tag, (char *)bufs[br] + ro, rl);
      }
    }
  }
}

/* Hosts alike (H of L ranks, ring.c): first each rank's block goes
 * around the ring across the hosts at its place (each host's link then
 * carries (H-1)/H of the whole, the least it can), then each host's ring
 * passes the columns it gathered (H blocks a place) through shared
 * memory. A rank's segment k starts across once its left neighbour's
 * segment k - CROSS_AHEAD came round the hosts (the last block that
 * crossing brings, handed on in the host), so that the L connections
 * leaving a host move alike (allreduce.c says why). */
static int allgather_hosts(sched_t *s, const ring_t *in_host,
                           const ring_t *across, const void *sendbuf,
                           void *const *bufs, const size_t *lens) {
  group_t *g = s->g;
  const int *cols = uvccl__ring_columns(g);
  int P = g->size, H = across->P, p, last;
  size_t maxl = 0;
  uint32_t nseg, k, *have, *first;
  for (p = 0; p < P; p++)
    if (lens[p] > maxl) maxl = lens[p];
  nseg = nseg_for(maxl, g->segment);
  have = uvccl__malloc((size_t)P * nseg * sizeof(uint32_t));
  first = uvccl__malloc(nseg * sizeof(uint32_t));
  if (have == NULL || first == NULL) {
    uvccl__free(have);
    uvccl__free(first);
    return UV_ENOMEM;
  }
  for (p = 0; p < P * (int)nseg; p++) have[p] = NONE;
  ring_gather_items(s, across, across->R, 1, nseg, sendbuf, bufs, lens, have,
                    first);
  /* the host ring's position p carries column p */
  ring_gather_items(s, in_host, cols, H, nseg, sendbuf, bufs, lens, have,
                    NULL);
  /* the block the left neighbour's crossing brings last: its column's,
   * from the host after this one */
  last = cols[mod(in_host->q - 1, in_host->P) * H + mod(across->q + 1, H)];
  for (k = CROSS_AHEAD; k < nseg; k++)
    uvccl__sop_dep(s, have[(size_t)last * nseg + k - CROSS_AHEAD], first[k]);
  uvccl__free(have);
  uvccl__free(first);
  return 0;
}

/* Hosts of different sizes, each of two ranks or more: the members hand
 * their blocks to the host's leader (shared memory), the leaders pass the
 * hosts' blocks around a ring of their own, and each block goes up the
 * host's chain from the leader as soon as the leader has it. A host's
 * link carries the blocks of the other hosts in and its own out (with the
 * ring's relays), at most (P - L)/P of the whole for the host of fewest
 * ranks (L), where one ring over all ranks carries (P-1)/P: 1.5 times
 * less for hosts of 4 and 3 (2 x 4 after a shrink). Blocks are tagged by
 * rank: each crosses each link once. */
static int allgather_leaders(sched_t *s, const ring_t *in_host,
                             const ring_t *leaders, const void *sendbuf,
                             void *const *bufs, const size_t *lens) {
  group_t *g = s->g;
  const int *runs = uvccl__ring_lead_runs(g);
  ring_t x;
  int P = g->size, H = leaders->P, L = in_host->P, i = in_host->q, st, j, b;
  int lead = ring_at(in_host, 0);
  int up = i < L - 1 ? ring_at(in_host, i + 1) : -1;
  size_t maxl = 0;
  uint32_t nseg, k, *have;
  uvccl__ring_of(g, &x);
  for (b = 0; b < P; b++)
    if (lens[b] > maxl) maxl = lens[b];
  nseg = nseg_for(maxl, g->segment);
  have = uvccl__malloc((size_t)P * nseg * sizeof(uint32_t));
  if (have == NULL) return UV_ENOMEM;
  for (j = 0; j < P * (int)nseg; j++) have[j] = NONE;
#define SRC(b) ((b) == g->rank ? (const char *)sendbuf : (const char *)bufs[b])
  /* the members' blocks to the leader (tags 0 .. nseg) */
  for (j = 1; j < L; j++) {
    int m = ring_at(in_host, j);
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      seg_range(lens[m], nseg, k, &o, &l);
      if (i == 0)
        have[(size_t)m * nseg + k] =
            uvccl__sop_recv(s, m, k, (char *)bufs[m] + o, l);
      else if (m == g->rank)
        uvccl__sop_send(s, lead, k, (const char *)sendbuf + o, l);
    }
  }
  /* the leaders' ring: at step st the blocks of the host st places to
   * the left go right (tags: nseg + rank * nseg + k) */
  for (st = 0; i == 0 && st < H - 1; st++) {
    int hs = mod(leaders->q - st, H), hr = mod(leaders->q - st - 1, H);
    for (j = runs[hs]; j < runs[hs + 1]; j++) {
      int bs = ring_at(&x, j);
      for (k = 0; k < nseg; k++) {
        size_t o, l;
        uint32_t snd;
        seg_range(lens[bs], nseg, k, &o, &l);
        snd = uvccl__sop_send(s, leaders->right,
                              nseg + ((uint32_t)bs * nseg + k), SRC(bs) + o,
                              l);
        uvccl__sop_dep(s, have[(size_t)bs * nseg + k], snd);
      }
    }
    for (j = runs[hr]; j < runs[hr + 1]; j++) {
      int br = ring_at(&x, j);
      for (k = 0; k < nseg; k++) {
        size_t o, l;
        seg_range(lens[br], nseg, k, &o, &l);
        have[(size_t)br * nseg + k] = uvccl__sop_recv(
            s, leaders->left, nseg + ((uint32_t)br * nseg + k),
            (char *)bufs[br] + o, l);
      }
    }
  }
  /* up the host's chain: every block but the next rank's own, as soon as
   * this rank has it (tags: nseg + P nseg + rank * nseg + k) */
  for (b = 0; b < P; b++) {
    if (b == g->rank) continue;
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      uint32_t tag = nseg + (uint32_t)P * nseg + (uint32_t)b * nseg + k;
      seg_range(lens[b], nseg, k, &o, &l);
      if (i > 0)
        have[(size_t)b * nseg + k] = uvccl__sop_recv(
            s, ring_at(in_host, i - 1), tag, (char *)bufs[b] + o, l);
    }
  }
  for (b = 0; up >= 0 && b < P; b++) {
    if (b == up) continue;
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      uint32_t tag = nseg + (uint32_t)P * nseg + (uint32_t)b * nseg + k, snd;
      seg_range(lens[b], nseg, k, &o, &l);
      snd = uvccl__sop_send(s, up, tag, SRC(b) + o, l);
      uvccl__sop_dep(s, have[(size_t)b * nseg + k], snd);
    }
  }
#undef SRC
  uvccl__free(have);
  return 0;
}

int uvccl__allgather_build(sched_t *s, const void *sendbuf, void *const *bufs,
                           const size_t *lens) {
  group_t *g = s->g;
  ring_t x;
  int P = g->size, r = g->rank, st, c, left, right;
  size_t maxl = 0, total = 0;
  uint32_t nseg, k, *prev;
  if (sendbuf != bufs[r] && lens[r] > 0)
    uvccl__sop_copy(s, bufs[r], sendbuf, lens[r]);
  if (P == 1) return 0;
  for (c = 0; c < P; c++) {
    if (lens[c] > maxl) maxl = lens[c];
    total += lens[c];
  }
  if (P > 2 && total <= g->small_max)
    return allgather_bruck(s, sendbuf, bufs, lens);
  {
    ring_t in_host, across;
    if (uvccl__ring_hosts(g, &in_host, &across))
      return allgather_hosts(s, &in_host, &across, sendbuf, bufs, lens);
    if (uvccl__ring_leaders(g, &in_host, &across) &&
        uvccl__ring_lead_pairs(g, across.P))
      return allgather_leaders(s, &in_host, &across, sendbuf, bufs, lens);
  }
  uvccl__ring_of(g, &x);
  left = x.left;
  right = x.right;
  nseg = nseg_for(maxl, g->segment);
  prev = uvccl__malloc(nseg * sizeof(uint32_t));
  if (prev == NULL) return UV_ENOMEM;
  for (st = 0; st < P - 1; st++) {
    int cs = ring_at(&x, x.q - st), cr = ring_at(&x, x.q - st - 1);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)st * nseg + k, snd, rcv;
      const char *src;
      seg_range(lens[cs], nseg, k, &so, &sl);
      seg_range(lens[cr], nseg, k, &ro, &rl);
      src = st == 0 ? (const char *)sendbuf + so : (const char *)bufs[cs] + so;
      snd = uvccl__sop_send(s, right, tag, src, sl);
      if (st > 0) uvccl__sop_dep(s, prev[k], snd);
      rcv = uvccl__sop_recv(s, left, tag, (char *)bufs[cr] + ro, rl);
      prev[k] = rcv;
    }
  }
  uvccl__free(prev);
  return 0;
}

static int allgather_common(uvccl_pg_t *pg, uvccl_work_t *work,
                            const void *sendbuf, size_t sendcount,
                            void *recvbuf, void *const *recvbufs,
                            const size_t *recvcounts, uvccl_dtype_t dtype,
                            uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t es = uvccl_dtype_size(dtype), total = 0;
  void **bufs;
  size_t *lens;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if (es == 0) return UV_EINVAL;
  if (recvcounts != NULL && recvcounts[g->rank] != sendcount) return UV_EINVAL;
  if (sendcount > 0 && sendbuf == NULL) return UV_EINVAL;
  bufs = uvccl__malloc((size_t)g->size * sizeof(void *));
  lens = uvccl__malloc((size_t)g->size * sizeof(size_t));
  if (bufs == NULL || lens == NULL) {
    uvccl__free(bufs);
    uvccl__free(lens);
    return UV_ENOMEM;
  }
  for (i = 0; i < g->size; i++) {
    size_t c = recvcounts ? recvcounts[i] : sendcount;
    lens[i] = c * es;
    bufs[i] = recvbufs ? recvbufs[i] : (char *)recvbuf + total * es;
    total += c;
    if (lens[i] > 0 && bufs[i] == NULL) rc = UV_EINVAL;
  }
  if (rc == 0) rc = check_count(total, es, total ? (void *)1 : NULL);
  s = rc == 0 ? uvccl__sched_new(g, "allgather", 0) : NULL;
  if (rc == 0 && s == NULL) rc = UV_ENOMEM;
  if (rc == 0 && recvbufs == NULL && recvcounts == NULL &&
      uvccl__algo_box_fits(g, sendcount * es)) {
    /* every rank's part through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_CONCAT, -1, sendbuf, recvbuf, sendcount * es);
  } else if (rc == 0) {
    rc = uvccl__allgather_build(s, sendbuf, bufs, lens);
  }
  if (rc == 0) {
    uvccl__sched_stream(s, total * es);
    uvccl__sched_describe(s, (int)dtype, sendcount, total, -1);
  }
  uvccl__free(bufs);
  uvccl__free(lens);
  if (rc != 0) {
    if (s) uvccl__sched_free(s);
    return rc;
  }
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_allgather(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf, size_t count,
                          uvccl_dtype_t dtype, uvccl_work_cb cb) {
  if (count > 0 && recvbuf == NULL) return UV_EINVAL;
  return allgather_common(pg, work, sendbuf, count, recvbuf, NULL, NULL,
                          dtype, cb);
}

int uvccl__host_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work,
                           const void *sendbuf, size_t sendcount,
                           void *const *recvbufs, const size_t *recvcounts,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  if (recvbufs == NULL || recvcounts == NULL) return UV_EINVAL;
  return allgather_common(pg, work, sendbuf, sendcount, NULL, recvbufs,
                          recvcounts, dtype, cb);
}

/* ---- gather / scatter ---------------------------------------------------- */

int uvccl__host_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype,
                       int root, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t n;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), sendbuf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  if (g->rank == root && count > 0 && recvbuf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "gather", 0);
  if (s == NULL) return UV_ENOMEM;
  n = count * uvccl_dtype_size(dtype);
  if (g->rank == root) {
    for (i = 0; i < g->size; i++) {
      char *dst = (char *)recvbuf + (size_t)i * n;
      if (i == root) {
        if (n) uvccl__sop_copy(s, dst, sendbuf, n);
      } else {
        recv_segs(s, i, dst, n);
      }
    }
  } else {
    send_segs(s, root, sendbuf, n);
  }
  uvccl__sched_describe(s, (int)dtype, count,
                        g->rank == root ? count * (size_t)g->size : 0, root);
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                        void *recvbuf, size_t count, uvccl_dtype_t dtype,
                        int root, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t n;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), recvbuf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  if (g->rank == root && count > 0 && sendbuf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "scatter", 0);
  if (s == NULL) return UV_ENOMEM;
  n = count * uvccl_dtype_size(dtype);
  if (g->rank == root) {
    for (i = 1; i <= g->size; i++) {
      int d = mod(root + i, g->size);
      const char *src = (const char *)sendbuf + (size_t)d * n;
      if (d == root) {
        if (n) uvccl__sop_copy(s, recvbuf, src, n);
      } else {
        send_segs(s, d, src, n);
      }
    }
  } else {
    recv_segs(s, root, recvbuf, n);
  }
  uvccl__sched_describe(s, (int)dtype,
                        g->rank == root ? count * (size_t)g->size : 0, count,
                        root);
  return uvccl__sched_start(s, work, cb);
}
