/* The CPU backend's collective and point-to-point calls (its table,
 * backend.c): GPU buffers through pinned staging (stage.c), which then runs
 * the host collective; host buffers straight to the host collective
 * (algo/), which builds the schedule. Layers: this file -> stage.c ->
 * algo/ -> sched.c -> xport/. */
#include "internal.h"
#include "stage.h"

/* Byte payloads live in host memory: GPU buffers are refused. */
static int on_device(const void *p) {
  int dev;
  return uvccl__stage_check(p, NULL, &dev) != 0;
}

int uvccl__cpu_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    void *recvbuf, size_t count, uvccl_dtype_t dtype,
                    uvccl_redop_t op, uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0
                 ? st
                 : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_ALLREDUCE,
                                     sendbuf, recvbuf, count, dtype, op, 0, cb);
  }
  return uvccl__host_allreduce(pg, work, sendbuf, recvbuf, count, dtype, op,
                               cb);
}

int uvccl__cpu_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                              const uvccl_buf_t *bufs, size_t nbufs,
                              uvccl_dtype_t dtype, uvccl_redop_t op,
                              uvccl_work_cb cb) {
  if (bufs != NULL) {
    int dev = -1, st = 0;
    size_t k;
    for (k = 0; k < nbufs; k++)
      uvccl__stage_check_more(bufs[k].base, &st, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coalesced(pg, work, dev, bufs, nbufs, dtype,
                                             op, cb);
  }
  return uvccl__host_allreduce_coalesced(pg, work, bufs, nbufs, dtype, op, cb);
}

int uvccl__cpu_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                         const void *sendbuf, void *recvbuf, size_t count,
                         uvccl_dtype_t dtype, uvccl_redop_t op,
                         uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0
                 ? st
                 : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_REDUCE_SCATTER,
                                     sendbuf, recvbuf, count, dtype, op, 0, cb);
  }
  return uvccl__host_reduce_scatter(pg, work, sendbuf, recvbuf, count, dtype,
                                    op, cb);
}

int uvccl__cpu_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf,
                          const size_t *recvcounts, uvccl_dtype_t dtype,
                          uvccl_redop_t op, uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_reduce_scatterv(pg, work, dev, sendbuf,
                                                   recvbuf, recvcounts, dtype,
                                                   op, cb);
  }
  return uvccl__host_reduce_scatterv(pg, work, sendbuf, recvbuf, recvcounts,
                                     dtype, op, cb);
}

int uvccl__cpu_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                    size_t count, uvccl_dtype_t dtype, int root,
                    uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(buf, NULL, &dev);
    if (st != 0)
      return st < 0
                 ? st
                 : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_BROADCAST, buf,
                                     buf, count, dtype, UVCCL_SUM, root, cb);
  }
  return uvccl__host_broadcast(pg, work, buf, count, dtype, root, cb);
}

int uvccl__cpu_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                 void *recvbuf, size_t count, uvccl_dtype_t dtype,
                 uvccl_redop_t op, int root, uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_REDUCE,
                                        sendbuf, recvbuf, count, dtype, op,
                                        root, cb);
  }
  return uvccl__host_reduce(pg, work, sendbuf, recvbuf, count, dtype, op, root,
                            cb);
}

int uvccl__cpu_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    void *recvbuf, size_t count, uvccl_dtype_t dtype,
                    uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_ALLGATHER,
                                        sendbuf, recvbuf, count, dtype,
                                        UVCCL_SUM, 0, cb);
  }
  return uvccl__host_allgather(pg, work, sendbuf, recvbuf, count, dtype, cb);
}

int uvccl__cpu_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                     size_t sendcount, void *const *recvbufs,
                     const size_t *recvcounts, uvccl_dtype_t dtype,
                     uvccl_work_cb cb) {
  {
    int dev = -1, st = 0, i;
    uvccl__stage_check_more(sendbuf, &st, &dev);
    for (i = 0; recvbufs != NULL && pg != NULL && i < pg->size; i++)
      uvccl__stage_check_more(recvbufs[i], &st, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_allgatherv(pg, work, dev, sendbuf,
                                              sendcount, recvbufs, recvcounts,
                                              dtype, cb);
  }
  return uvccl__host_allgatherv(pg, work, sendbuf, sendcount, recvbufs,
                                recvcounts, dtype, cb);
}

int uvccl__cpu_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                 void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                 uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_GATHER,
                                        sendbuf, recvbuf, count, dtype,
                                        UVCCL_SUM, root, cb);
  }
  return uvccl__host_gather(pg, work, sendbuf, recvbuf, count, dtype, root,
                            cb);
}

int uvccl__cpu_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                  void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                  uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_SCATTER,
                                        sendbuf, recvbuf, count, dtype,
                                        UVCCL_SUM, root, cb);
  }
  return uvccl__host_scatter(pg, work, sendbuf, recvbuf, count, dtype, root,
                             cb);
}

int uvccl__cpu_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                   void *recvbuf, size_t count, uvccl_dtype_t dtype,
                   uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_coll(pg, work, dev, UVCCL__STAGE_ALLTOALL,
                                        sendbuf, recvbuf, count, dtype,
                                        UVCCL_SUM, 0, cb);
  }
  return uvccl__host_alltoall(pg, work, sendbuf, recvbuf, count, dtype, cb);
}

int uvccl__cpu_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                    const size_t *sendcounts, void *recvbuf,
                    const size_t *recvcounts, uvccl_dtype_t dtype,
                    uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(sendbuf, recvbuf, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_alltoallv(pg, work, dev, sendbuf,
                                             sendcounts, recvbuf, recvcounts,
                                             dtype, cb);
  }
  return uvccl__host_alltoallv(pg, work, sendbuf, sendcounts, recvbuf,
                               recvcounts, dtype, cb);
}

int uvccl__cpu_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  return uvccl__host_barrier(pg, work, cb);
}

int uvccl__cpu_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all,
                            uvccl_work_cb cb) {
  return uvccl__host_monitored_barrier(pg, work, wait_all, cb);
}

int uvccl__cpu_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
               size_t len, int dst, int tag, uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(buf, NULL, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_p2p(pg, work, dev, 1, (void *)buf, len, dst,
                                       tag, cb);
  }
  return uvccl__host_send(pg, work, buf, len, dst, tag, cb);
}

int uvccl__cpu_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
               int src, int tag, uvccl_work_cb cb) {
  {
    int dev, st = uvccl__stage_check(buf, NULL, &dev);
    if (st != 0)
      return st < 0
                 ? st
                 : uvccl__stage_p2p(pg, work, dev, 0, buf, len, src, tag, cb);
  }
  return uvccl__host_recv(pg, work, buf, len, src, tag, cb);
}

int uvccl__cpu_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops,
                    size_t nops, uvccl_work_cb cb) {
  if (ops != NULL) {
    int dev = -1, st = 0;
    size_t k;
    for (k = 0; k < nops; k++) uvccl__stage_check_more(ops[k].buf, &st, &dev);
    if (st != 0)
      return st < 0 ? st
                    : uvccl__stage_p2p_batch(pg, work, dev, ops, nops, cb);
  }
  return uvccl__host_p2p_batch(pg, work, ops, nops, cb);
}

int uvccl__cpu_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                          size_t len, int root, uvccl_work_cb cb) {
  if (on_device(buf)) return UV_ENOTSUP;
  return uvccl__host_broadcast_bytes(pg, work, buf, len, root, cb);
}

int uvccl__cpu_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                          size_t len, uvccl_work_cb cb) {
  if (on_device(buf)) return UV_ENOTSUP;
  return uvccl__host_allgather_bytes(pg, work, buf, len, cb);
}

int uvccl__cpu_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                       size_t len, int root, uvccl_work_cb cb) {
  if (on_device(buf)) return UV_ENOTSUP;
  return uvccl__host_gather_bytes(pg, work, buf, len, root, cb);
}

int uvccl__cpu_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                        const uvccl_buf_t *bufs, size_t nbufs, int root,
                        uvccl_work_cb cb) {
  if (on_device(bufs && nbufs ? bufs[0].base : NULL)) return UV_ENOTSUP;
  return uvccl__host_scatter_bytes(pg, work, bufs, nbufs, root, cb);
}
