/* The public process-group and collective calls: each goes to the backend
 * of its group (backend.h). Arguments are checked by the backend, except
 * where both did the same check before the choice. */
#include "backend.h"

#include <stddef.h>
#include <stdio.h>

/* Indexed by uvccl_pg_options_t.backend and uvccl_pg_t.backend_. */
static const uvccl__backend_t *const backends[] = {
    [UVCCL_BACKEND_TCP] = &uvccl__cpu_backend,
    [UVCCL_BACKEND_NCCL] = &uvccl__nccl_backend,
};

#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

/* NULL for a backend this build does not know. */
const uvccl__backend_t *uvccl__backend_for(const uvccl_pg_options_t *opts) {
  unsigned b = opts != NULL ? (unsigned)opts->backend : UVCCL_BACKEND_TCP;
  return b < NBACKENDS ? backends[b] : NULL;
}

/* A group not made (NULL, zeroed, destroyed) goes to the CPU backend, whose
 * calls refuse it as they always have. */
const uvccl__backend_t *uvccl__backend_of(const uvccl_pg_t *pg) {
  unsigned b = pg != NULL ? (unsigned)pg->backend_ : UVCCL_BACKEND_TCP;
  return b < NBACKENDS ? backends[b] : &uvccl__cpu_backend;
}

int uvccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
                  const uvccl_pg_options_t *opts, uvccl_work_t *work,
                  uvccl_work_cb cb) {
  const uvccl__backend_t *b = uvccl__backend_for(opts);
  if (b == NULL) return UV_EINVAL;
  return b->init(loop, pg, store, opts, work, cb);
}

int uvccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
                      const uvccl_pg_options_t *opts, uvccl_work_t *work,
                      uvccl_work_cb cb) {
  const uvccl__backend_t *b = uvccl__backend_for(opts);
  if (b == NULL) return UV_EINVAL;
  return b->init_url(loop, pg, url, opts, work, cb);
}

void uvccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb) {
  uvccl__backend_of(pg)->destroy(pg, cb);
}

void uvccl_pg_abort(uvccl_pg_t *pg, const char *reason) {
  uvccl__backend_of(pg)->abort(pg, reason);
}

int uvccl_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f) {
  if (pg == NULL || f == NULL) return UV_EINVAL;
  return uvccl__backend_of(pg)->get_failure(pg, f);
}

int uvccl_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max) {
  if (pg == NULL || (ranks == NULL && max > 0)) return UV_EINVAL;
  return uvccl__backend_of(pg)->failed_ranks(pg, ranks, max);
}

int uvccl_pg_revoke(uvccl_pg_t *pg, const char *reason) {
  return uvccl__backend_of(pg)->revoke(pg, reason);
}

int uvccl_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg, uvccl_work_t *work,
                    uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->shrink(pg, newpg, NULL, 0, work, cb);
}

int uvccl_pg_shrink_excluding(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                              const int *exclude, int nexclude,
                              uvccl_work_t *work, uvccl_work_cb cb) {
  int i;
  if (pg == NULL || work == NULL || nexclude < 0 ||
      (exclude == NULL && nexclude > 0))
    return UV_EINVAL;
  for (i = 0; i < nexclude; i++) {
    if (exclude[i] < 0 || exclude[i] >= pg->size) {
      snprintf(work->msg, sizeof(work->msg), "shrink: rank %d to exclude is "
               "not in the group (%d ranks)", exclude[i], pg->size);
      return UV_EINVAL;
    }
    if (exclude[i] == pg->rank) {
      snprintf(work->msg, sizeof(work->msg), "shrink: this rank (%d) is in "
               "its own list of ranks to exclude: only the others call it",
               pg->rank);
      return UV_EINVAL;
    }
  }
  return uvccl__backend_of(pg)->shrink(pg, newpg, exclude, nexclude, work, cb);
}

int uvccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg, const int *ranks,
                       int nranks, const char *tag) {
  return uvccl__backend_of(parent)->new_group(parent, pg, ranks, nranks, tag);
}

int uvccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int key,
                   uvccl_work_t *work, uvccl_work_cb cb) {
  return uvccl__backend_of(parent)->split(parent, pg, color, key, work, cb);
}

int uvccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank) {
  return uvccl__backend_of(pg)->global_rank(pg, group_rank);
}

int uvccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank) {
  return uvccl__backend_of(pg)->group_rank(pg, global_rank);
}

const char *uvccl_pg_peer_address(const uvccl_pg_t *pg, int group_rank) {
  return uvccl__backend_of(pg)->peer_address(pg, group_rank);
}

const char *uvccl_pg_peer_transport(const uvccl_pg_t *pg, int group_rank) {
  return uvccl__backend_of(pg)->peer_transport(pg, group_rank);
}

int uvccl_pg_peer_host(const uvccl_pg_t *pg, int group_rank) {
  const uvccl__backend_t *b;
  if (pg == NULL) return UV_EINVAL;
  b = uvccl__backend_of(pg);
  return b->peer_host != NULL ? b->peer_host(pg, group_rank) : UVCCL_ENOTSUP;
}

void uvccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms) {
  uvccl__backend_of(pg)->set_timeout(pg, timeout_ms);
}

void uvccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us) {
  uvccl__backend_of(pg)->set_busy_poll(pg, us);
}

int uvccl_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t *op) {
  return uvccl__backend_of(pg)->premul_sum(pg, factor, op);
}

int uvccl_loop_before_block(uv_loop_t *loop) {
  size_t i;
  int busy = 0;
  if (loop == NULL) return UV_EINVAL;
  for (i = 0; i < NBACKENDS; i++)
    if (backends[i] != NULL && backends[i]->before_block != NULL)
      busy |= backends[i]->before_block(loop);
  return busy ? 0 : uv_backend_timeout(loop);
}

int uvccl_pg_loop_stats(uvccl_pg_t *pg, uvccl_loop_stats_t *stats, int reset) {
  const uvccl__backend_t *b = uvccl__backend_of(pg);
  if (b->loop_stats == NULL) return UV_EINVAL;
  return b->loop_stats(pg, stats, reset);
}

int uvccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    void *recvbuf, size_t count, uvccl_dtype_t dtype,
                    uvccl_redop_t op, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->allreduce(pg, work, sendbuf, recvbuf, count, dtype,
           op, cb);
}

int uvccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                              const uvccl_buf_t *bufs, size_t nbufs,
                              uvccl_dtype_t dtype, uvccl_redop_t op,
                              uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->allreduce_coalesced(pg, work, bufs, nbufs, dtype, op,
           cb);
}

int uvccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                         const void *sendbuf, void *recvbuf, size_t count,
                         uvccl_dtype_t dtype, uvccl_redop_t op,
                         uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->reduce_scatter(pg, work, sendbuf, recvbuf, count,
           dtype, op, cb);
}

int uvccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, uvccl_dtype_t dtype,
                          uvccl_redop_t op, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->reduce_scatterv(pg, work, sendbuf, recvbuf,
           recvcounts, dtype, op, cb);
}

int uvccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                    size_t count, uvccl_dtype_t dtype, int root,
                    uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->broadcast(pg, work, buf, count, dtype, root, cb);
}

int uvccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                 void *recvbuf, size_t count, uvccl_dtype_t dtype,
                 uvccl_redop_t op, int root, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->reduce(pg, work, sendbuf, recvbuf, count, dtype, op,
           root, cb);
}

int uvccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    void *recvbuf, size_t count, uvccl_dtype_t dtype,
                    uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->allgather(pg, work, sendbuf, recvbuf, count, dtype,
           cb);
}

int uvccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                     size_t sendcount, void *const *recvbufs,
                     const size_t *recvcounts, uvccl_dtype_t dtype,
                     uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->allgatherv(pg, work, sendbuf, sendcount, recvbufs,
           recvcounts, dtype, cb);
}

int uvccl_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                 void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                 uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->gather(pg, work, sendbuf, recvbuf, count, dtype,
           root, cb);
}

int uvccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                  void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                  uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->scatter(pg, work, sendbuf, recvbuf, count, dtype,
           root, cb);
}

int uvccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                   void *recvbuf, size_t count, uvccl_dtype_t dtype,
                   uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->alltoall(pg, work, sendbuf, recvbuf, count, dtype,
           cb);
}

int uvccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    const size_t *sendcounts, void *recvbuf,
                    const size_t *recvcounts, uvccl_dtype_t dtype,
                    uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->alltoallv(pg, work, sendbuf, sendcounts, recvbuf,
           recvcounts, dtype, cb);
}

int uvccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->barrier(pg, work, cb);
}

int uvccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all,
                            uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->monitored_barrier(pg, work, wait_all, cb);
}

int uvccl_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
               size_t len, int dst, int tag, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->send(pg, work, buf, len, dst, tag, cb);
}

int uvccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
               int src, int tag, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->recv(pg, work, buf, len, src, tag, cb);
}

int uvccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops,
                    size_t nops, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->p2p_batch(pg, work, ops, nops, cb);
}

int uvccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                          size_t len, int root, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->broadcast_bytes(pg, work, buf, len, root, cb);
}

int uvccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                          size_t len, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->allgather_bytes(pg, work, buf, len, cb);
}

int uvccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                       size_t len, int root, uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->gather_bytes(pg, work, buf, len, root, cb);
}

int uvccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                        const uvccl_buf_t *bufs, size_t nbufs, int root,
                        uvccl_work_cb cb) {
  return uvccl__backend_of(pg)->scatter_bytes(pg, work, bufs, nbufs, root, cb);
}
