/* Placeholder for the NCCL backend: every entry point reports UV_ENOTSUP
 * until src/gpu/ implements it. */
#include "nccl.h"

int uvccl__nccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)op; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work, const uvccl_buf_t *bufs, size_t nbufs, uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)bufs; (void)nbufs; (void)dtype; (void)op; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)op; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, const size_t *recvcounts, uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)recvcounts; (void)dtype; (void)op; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)count; (void)dtype; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)op; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, size_t sendcount, void *const *recvbufs, const size_t *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)sendcount; (void)recvbufs; (void)recvcounts; (void)dtype; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)recvbuf; (void)count; (void)dtype; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf, const size_t *sendcounts, void *recvbuf, const size_t *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)sendbuf; (void)sendcounts; (void)recvbuf; (void)recvcounts; (void)dtype; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)wait_all; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf, size_t len, int dst, int tag, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)dst; (void)tag; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len, int src, int tag, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)src; (void)tag; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops, size_t nops, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)ops; (void)nops; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf, size_t len, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf, size_t len, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf, size_t len, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const uvccl_buf_t *bufs, size_t nbufs, int root, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)bufs; (void)nbufs; (void)root; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store, const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb) {
  (void)loop; (void)pg; (void)store; (void)opts; (void)work; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url, const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb) {
  (void)loop; (void)pg; (void)url; (void)opts; (void)work; (void)cb;
  return UV_ENOTSUP;
}

void uvccl__nccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb) {
  (void)pg; (void)cb;
}

void uvccl__nccl_pg_abort(uvccl_pg_t *pg, const char *reason) {
  (void)pg; (void)reason;
}

int uvccl__nccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg, const int *ranks, int nranks, const char *tag) {
  (void)parent; (void)pg; (void)ranks; (void)nranks; (void)tag;
  return UV_ENOTSUP;
}

int uvccl__nccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int key, uvccl_work_t *work, uvccl_work_cb cb) {
  (void)parent; (void)pg; (void)color; (void)key; (void)work; (void)cb;
  return UV_ENOTSUP;
}

int uvccl__nccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank) {
  (void)pg; (void)group_rank;
  return -1;
}

int uvccl__nccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank) {
  (void)pg; (void)global_rank;
  return -1;
}

const char *uvccl__nccl_pg_peer_address(const uvccl_pg_t *pg, int group_rank) {
  (void)pg; (void)group_rank;
  return NULL;
}

void uvccl__nccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms) {
  (void)pg; (void)timeout_ms;
}

void uvccl__nccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us) {
  (void)pg; (void)us;
}

int uvccl__nccl_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t *op) {
  (void)pg; (void)factor; (void)op;
  return UV_ENOTSUP;
}
