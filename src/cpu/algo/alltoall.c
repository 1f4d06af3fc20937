/* alltoall(v): every transfer posted at once. */
#include "algo.h"

/* ---- alltoall ------------------------------------------------------------ */

static int alltoall_common(uvccl_pg_t *pg, uvccl_work_t *work,
                           const void *sendbuf, const size_t *scounts,
                           void *recvbuf, const size_t *rcounts, size_t even,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t es = uvccl_dtype_size(dtype), *soff, *roff, st = 0, rt = 0;
  int rc = uvccl__pg_check(pg, work, &g), i, P;
  if (rc != 0) return rc;
  if (es == 0) return UV_EINVAL;
  P = g->size;
  soff = uvccl__malloc((size_t)(P + 1) * sizeof(size_t));
  roff = uvccl__malloc((size_t)(P + 1) * sizeof(size_t));
  if (soff == NULL || roff == NULL) {
    uvccl__free(soff);
    uvccl__free(roff);
    return UV_ENOMEM;
  }
  for (i = 0; i < P; i++) {
    soff[i] = st;
    roff[i] = rt;
    st += scounts ? scounts[i] : even;
    rt += rcounts ? rcounts[i] : even;
  }
  soff[P] = st;
  roff[P] = rt;
  if ((rc = check_count(st, es, sendbuf)) != 0 ||
      (rc = check_count(rt, es, recvbuf)) != 0 ||
      (rt > 0 && sendbuf == recvbuf)) {
    uvccl__free(soff);
    uvccl__free(roff);
    return rc ? rc : UV_EINVAL;
  }
  s = uvccl__sched_new(g, "alltoall", 0);
  if (s == NULL) {
    uvccl__free(soff);
    uvccl__free(roff);
    return UV_ENOMEM;
  }
  if (scounts == NULL && rcounts == NULL &&
      uvccl__algo_box_fits(g, even * es)) {
    /* every rank's blocks through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_ALLTOALL, -1, sendbuf, recvbuf, even * es);
    P = 0; /* no messages */
  }
  /* Pairwise order (r+1, r+2, ...) spreads the load over the peers. */
  for (i = 0; i < P; i++) {
    int to = mod(g->rank + i, P), from = mod(g->rank - i, P);
    size_t sl = (soff[to + 1] - soff[to]) * es,
           rl = (roff[from + 1] - roff[from]) * es;
    if (i == 0) {
      if (sl != rl) rc = UV_EINVAL;
      else if (sl) uvccl__sop_copy(s, (char *)recvbuf + roff[from] * es,
                                   (const char *)sendbuf + soff[to] * es, sl);
      continue;
    }
    /* segmented: one huge frame per peer moves at about half the speed
     * (bench/notes/cpu-collectives-history.md) */
    send_segs(s, to, (const char *)sendbuf + soff[to] * es, sl);
    recv_segs(s, from, (char *)recvbuf + roff[from] * es, rl);
  }
  uvccl__free(soff);
  uvccl__free(roff);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  uvccl__sched_describe(s, (int)dtype, st, rt, -1);
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_alltoall(uvccl_pg_t *pg, uvccl_work_t *work,
                         const void *sendbuf, void *recvbuf, size_t count,
                         uvccl_dtype_t dtype, uvccl_work_cb cb) {
  return alltoall_common(pg, work, sendbuf, NULL, recvbuf, NULL, count, dtype,
                         cb);
}

int uvccl__host_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, const size_t *sendcounts,
                          void *recvbuf, const size_t *recvcounts,
                          uvccl_dtype_t dtype, uvccl_work_cb cb) {
  if (sendcounts == NULL || recvcounts == NULL) return UV_EINVAL;
  return alltoall_common(pg, work, sendbuf, sendcounts, recvbuf, recvcounts, 0,
                         dtype, cb);
}
