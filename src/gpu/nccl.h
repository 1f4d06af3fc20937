/* The NCCL backend of uvccl_pg_t (the GPU issue). A group made with
 * opts->backend == UVCCL_BACKEND_NCCL has pg->backend_ set, and every
 * public process-group function in src/coll/ hands it to its counterpart
 * here (same arguments, same contract as the public function in uvccl.h);
 * the TCP code never sees such a group. The files: nccl_api.c (loading
 * libnccl), nccl_pg.c (op life cycle, watchdog, destroy/abort, queries),
 * nccl_boot.c (creation over a store), nccl_subgroup.c (new_group,
 * split), nccl_ops.c (the operations), nccl_exec.c (their device-thread
 * side), nccl_url.c (creation from an init URL); nccl_internal.h is what
 * they share. */
#ifndef UVCCL_GPU_NCCL_H
#define UVCCL_GPU_NCCL_H

#include "uvccl.h"

#define UVCCL__IS_NCCL(pg) ((pg) != NULL && (pg)->backend_ == UVCCL_BACKEND_NCCL)

int uvccl__nccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, uvccl_work_cb cb);
int uvccl__nccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work, const
    uvccl_buf_t *bufs, size_t nbufs, uvccl_dtype_t dtype, uvccl_redop_t op,
    uvccl_work_cb cb);
int uvccl__nccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, uvccl_work_cb cb);
int uvccl__nccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, const size_t *recvcounts, uvccl_dtype_t dtype,
    uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__nccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
    size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb);
int uvccl__nccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, int root, uvccl_work_cb cb);
int uvccl__nccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb
    cb);
int uvccl__nccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, size_t sendcount, void *const *recvbufs, const size_t
    *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__nccl_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
    uvccl_work_cb cb);
int uvccl__nccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
    uvccl_work_cb cb);
int uvccl__nccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb
    cb);
int uvccl__nccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, const size_t *sendcounts, void *recvbuf, const size_t
    *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__nccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int
    wait_all, uvccl_work_cb cb);
int uvccl__nccl_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
    size_t len, int dst, int tag, uvccl_work_cb cb);
int uvccl__nccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t
    len, int src, int tag, uvccl_work_cb cb);
int uvccl__nccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t
    *ops, size_t nops, uvccl_work_cb cb);
int uvccl__nccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__nccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, uvccl_work_cb cb);
int uvccl__nccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__nccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const
    uvccl_buf_t *bufs, size_t nbufs, int root, uvccl_work_cb cb);
int uvccl__nccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
void uvccl__nccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb);
void uvccl__nccl_pg_abort(uvccl_pg_t *pg, const char *reason);
int uvccl__nccl_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f);
int uvccl__nccl_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max);
int uvccl__nccl_pg_revoke(uvccl_pg_t *pg, const char *reason);
int uvccl__nccl_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                          uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg, const int
    *ranks, int nranks, const char *tag);
int uvccl__nccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int
    key, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank);
int uvccl__nccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank);
const char *uvccl__nccl_pg_peer_address(const uvccl_pg_t *pg, int group_rank);
void uvccl__nccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms);
void uvccl__nccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us);
int uvccl__nccl_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t
    *op);
/* For benchmarks: the uvccl__now_ns() times of the group's last completed
 * op: submitted, issued, end event seen by the GPU thread, done() on the
 * loop. */
void uvccl__nccl_pg_times(const uvccl_pg_t *pg, uint64_t times[4]);
/* Tests only: the next collective of any NCCL group, once started on the
 * GPU, waits until the 32-bit word at dev_flag (device-visible, e.g.
 * mapped pinned memory) is >= 1 (cuStreamWaitValue32). */
void uvccl__nccl_debug_block_next(void *dev_flag);

#endif
