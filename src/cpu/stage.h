/* GPU buffers in the TCP process groups, staged through pinned host memory
 * (stage.c). The public collectives check their buffers with
 * uvccl__stage_check() and hand device memory to uvccl__stage_start(). */
#ifndef UVCCL_CPU_STAGE_H
#define UVCCL_CPU_STAGE_H

#include "uvccl.h"

typedef struct uvccl__stager_s uvccl__stager_t;

typedef enum {
  UVCCL__STAGE_ALLREDUCE = 0,
  UVCCL__STAGE_BROADCAST,
  UVCCL__STAGE_REDUCE,
  UVCCL__STAGE_ALLGATHER,
  UVCCL__STAGE_REDUCE_SCATTER,
  UVCCL__STAGE_ALLTOALL,
  UVCCL__STAGE_GATHER,
  UVCCL__STAGE_SCATTER,
  UVCCL__STAGE_SEND,
  UVCCL__STAGE_RECV,
  UVCCL__STAGE_ALLGATHERV,
  UVCCL__STAGE_REDUCE_SCATTERV,
  UVCCL__STAGE_ALLTOALLV,
  UVCCL__STAGE_COALESCED,
  UVCCL__STAGE_P2P_BATCH
} uvccl__stage_kind_t;

/* The collective to run on host copies of buf[0] (and buf[1]): the first
 * is the input (or in-out), the second the output; in/out say which way
 * each is copied. root is the peer for send/recv. */
typedef struct {
  uvccl__stage_kind_t kind;
  int device;
  int nb;
  void *buf[2];
  size_t len[2];
  int in[2], out[2];
  size_t count;
  uvccl_dtype_t dtype;
  uvccl_redop_t op;
  int root;
  int tag;
} uvccl__stage_args_t;

/* 0: both host memory (or no GPU side loaded: one integer test). 1: at
 * least one is device memory, on *device. UV_EINVAL: two devices. */
int uvccl__stage_check(const void *a, const void *b, int *device);
/* Starts the staged operation on work (same contract as the public call). */
int uvccl__stage_start(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb,
                       const uvccl__stage_args_t *args);
/* The public collectives' staged paths (the buffers' device found by
 * uvccl__stage_check). Unused arguments: 0 / NULL. */
int uvccl__stage_coll(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                      uvccl__stage_kind_t kind, const void *sendbuf,
                      void *recvbuf, size_t count, uvccl_dtype_t dtype,
                      uvccl_redop_t op, int root, uvccl_work_cb cb);
int uvccl__stage_p2p(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                     int is_send, void *buf, size_t len, int peer, int tag,
                     uvccl_work_cb cb);
int uvccl__stage_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                            const void *sendbuf, size_t sendcount,
                            void *const *recvbufs, const size_t *recvcounts,
                            uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__stage_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                 int device, const void *sendbuf,
                                 void *recvbuf, const size_t *recvcounts,
                                 uvccl_dtype_t dtype, uvccl_redop_t op,
                                 uvccl_work_cb cb);
int uvccl__stage_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           const void *sendbuf, const size_t *sendcounts,
                           void *recvbuf, const size_t *recvcounts,
                           uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__stage_coalesced(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           const uvccl_buf_t *bufs, size_t nbufs,
                           uvccl_dtype_t dtype, uvccl_redop_t op,
                           uvccl_work_cb cb);
int uvccl__stage_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           uvccl_p2p_op_t *ops, size_t nops,
                           uvccl_work_cb cb);
/* Folds one more pointer into a list's check: *state starts at 0; after
 * the last call it is uvccl__stage_check's answer for the whole list. */
void uvccl__stage_check_more(const void *p, int *state, int *device);
/* Group destroy: once every staged operation finished, frees the pinned
 * pool and the stream on the device thread, then cb(arg) on the loop. */
void uvccl__stager_close(uvccl__stager_t *sg, void (*cb)(void *arg),
                         void *arg);

#endif
