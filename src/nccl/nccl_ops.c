/* The collectives and point-to-point operations of NCCL groups: argument
 * checks at the call, the dtype and reduction mapping (c10d's), and the
 * NCCL calls each one is made of (issued by nccl_exec.c). */
#include "nccl_internal.h"

#include <stdio.h>
#include <string.h>

/* NCCL's data type for a uvccl one, and how many NCCL elements one uvccl
 * element is (complex: a pair of floats). */
static int map_dtype(uvccl_dtype_t dt, int *nccl_dt, size_t *mult) {
  *mult = 1;
  switch (dt) {
  case UVCCL_INT8: *nccl_dt = UVCCL__NCCL_INT8; return 0;
  case UVCCL_UINT8: *nccl_dt = UVCCL__NCCL_UINT8; return 0;
  case UVCCL_BOOL: *nccl_dt = UVCCL__NCCL_UINT8; return 0;
  case UVCCL_INT32: *nccl_dt = UVCCL__NCCL_INT32; return 0;
  case UVCCL_INT64: *nccl_dt = UVCCL__NCCL_INT64; return 0;
  case UVCCL_FLOAT16: *nccl_dt = UVCCL__NCCL_FLOAT16; return 0;
  case UVCCL_BFLOAT16: *nccl_dt = UVCCL__NCCL_BFLOAT16; return 0;
  case UVCCL_FLOAT32: *nccl_dt = UVCCL__NCCL_FLOAT32; return 0;
  case UVCCL_FLOAT64: *nccl_dt = UVCCL__NCCL_FLOAT64; return 0;
  case UVCCL_COMPLEX64: *nccl_dt = UVCCL__NCCL_FLOAT32; *mult = 2; return 0;
  case UVCCL_COMPLEX128: *nccl_dt = UVCCL__NCCL_FLOAT64; *mult = 2; return 0;
  /* float8 only moves (every reduction is refused before this matters):
   * as bytes, which every NCCL and every GPU handles, where ncclFloat8*
   * needs NCCL 2.24 and, before 2.28.3, sm90 even to move */
  case UVCCL_FLOAT8_E4M3:
  case UVCCL_FLOAT8_E5M2: *nccl_dt = UVCCL__NCCL_UINT8; return 0;
  default: break;
  }
  LOG_ERROR("nccl", "invalid dtype %d", (int)dt);
  return UV_EINVAL;
}

/* Sets op->dtype (and the reduction, when redop >= 0). */
static int set_types(nccl_group_t *g, nccl_op_t *op, uvccl_dtype_t dt,
                     int has_redop, uvccl_redop_t redop, size_t *mult) {
  uvccl_redop_t base = redop;
  int rc = map_dtype(dt, &op->dtype, mult);
  op->desc.dtype = uvccl_dtype_name(dt);
  if (rc != 0 || !has_redop) return rc;
  if ((int)redop >= UVCCL__NCCL_PREMUL_BASE) {
    int idx = (int)redop - UVCCL__NCCL_PREMUL_BASE;
    if (idx >= g->npremul) {
      LOG_ERROR("nccl", "%s: unknown PREMUL_SUM op %d (not made by "
                "uvccl_pg_premul_sum on this group)", op->name, (int)redop);
      return UV_EINVAL;
    }
    base = UVCCL_PREMUL_SUM;
    op->premul = 1;
    op->factor = g->premul[idx];
  } else if (redop == UVCCL_PREMUL_SUM) {
    LOG_ERROR("nccl", "%s: PREMUL_SUM needs a factor: uvccl_pg_premul_sum()",
              op->name);
    return UV_EINVAL;
  }
  if (uvccl_redop_check(base, dt) != 0) {
    LOG_ERROR("nccl", "%s: %s does not apply to %s", op->name,
              uvccl_redop_name(base) ? uvccl_redop_name(base) : "?",
              uvccl_dtype_name(dt) ? uvccl_dtype_name(dt) : "?");
    return UV_EINVAL;
  }
  switch (base) {
  case UVCCL_SUM: op->redop = UVCCL__NCCL_SUM; break;
  case UVCCL_PRODUCT: op->redop = UVCCL__NCCL_PROD; break;
  case UVCCL_MIN: op->redop = UVCCL__NCCL_MIN; break;
  case UVCCL_MAX: op->redop = UVCCL__NCCL_MAX; break;
  case UVCCL_AVG: op->redop = UVCCL__NCCL_AVG; break;
  case UVCCL_PREMUL_SUM: op->redop = UVCCL__NCCL_SUM; break;
  default:
    LOG_ERROR("nccl", "%s: NCCL has no %s reduction; use a TCP group",
              op->name, uvccl_redop_name(base));
    return UV_EINVAL;
  }
  op->desc.redop = uvccl_redop_name(base);
  /* c10d: bool SUM is OR (MAX over 0/1), PRODUCT is AND (MIN) */
  if (dt == UVCCL_BOOL && base == UVCCL_SUM) op->redop = UVCCL__NCCL_MAX;
  if (dt == UVCCL_BOOL && base == UVCCL_PRODUCT) op->redop = UVCCL__NCCL_MIN;
  return 0;
}

static int root_ok(const nccl_group_t *g, int root, const char *name) {
  if (root >= 0 && root < g->size) return 0;
  LOG_ERROR("nccl", "%s: root %d is not a rank of the group (size %d)", name,
            root, g->size);
  return UV_EINVAL;
}

/* Common prologue: check the group and the work, make the op. */
static int prologue(uvccl_pg_t *pg, uvccl_work_t *work, const char *name,
                    nccl_group_t **g, nccl_op_t **op) {
  int rc = uvccl__nccl_group_check(pg, work, g);
  if (rc != 0) return rc;
  *op = uvccl__nccl_op_new(*g, NOP_CALLS, name);
  return *op ? 0 : UV_ENOMEM;
}

static int refuse(nccl_op_t *op, int rc) {
  uvccl__nccl_op_free(op);
  return rc;
}

#define BAD_BUF(count, p) ((count) > 0 && (p) == NULL)

/* What the flight recorder says of op (elements in and out on this rank,
 * root), as the TCP groups say it. */
static void describe(nccl_op_t *op, uint64_t in, uint64_t out, int root) {
  op->desc.count_in = in;
  op->desc.count_out = out;
  op->desc.root = root;
}

int uvccl__nccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf, size_t count,
                          uvccl_dtype_t dtype, uvccl_redop_t redop,
                          uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "allreduce", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 1, redop, &m)) != 0) return refuse(op, rc);
  if (BAD_BUF(count, sendbuf) || BAD_BUF(count, recvbuf))
    return refuse(op, UV_EINVAL);
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_ALLREDUCE, 0, sendbuf, recvbuf, count * m};
  describe(op, count, count, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                                    const uvccl_buf_t *bufs, size_t nbufs,
                                    uvccl_dtype_t dtype, uvccl_redop_t redop,
                                    uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m, i, es = uvccl_dtype_size(dtype);
  int rc = prologue(pg, work, "allreduce_coalesced", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 1, redop, &m)) != 0) return refuse(op, rc);
  if (nbufs > 0 && bufs == NULL) return refuse(op, UV_EINVAL);
  for (i = 0; i < nbufs; i++)
    if (bufs[i].len % es != 0 || BAD_BUF(bufs[i].len, bufs[i].base)) {
      LOG_ERROR("nccl", "allreduce_coalesced: buffer %zu: %zu bytes is not "
                "a whole number of %s", i, bufs[i].len,
                uvccl_dtype_name(dtype));
      return refuse(op, UV_EINVAL);
    }
  if (uvccl__nccl_op_calls(op, nbufs) == NULL && nbufs > 0)
    return refuse(op, UV_ENOMEM);
  for (i = 0; i < nbufs; i++)
    op->calls[i] = (ncall_t){NCALL_ALLREDUCE, 0, bufs[i].base, bufs[i].base,
                             bufs[i].len / es * m};
  for (i = 0; i < nbufs; i++) op->desc.count_in += bufs[i].len / es;
  op->grouped = nbufs > 1; /* one NCCL group: one launch */
  describe(op, op->desc.count_in, op->desc.count_in, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                               const void *sendbuf, void *recvbuf,
                               size_t count, uvccl_dtype_t dtype,
                               uvccl_redop_t redop, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "reduce_scatter", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 1, redop, &m)) != 0) return refuse(op, rc);
  if (BAD_BUF(count, sendbuf) || BAD_BUF(count, recvbuf))
    return refuse(op, UV_EINVAL);
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] =
      (ncall_t){NCALL_REDUCE_SCATTER, 0, sendbuf, recvbuf, count * m};
  describe(op, count * (size_t)g->size, count, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, uvccl_dtype_t dtype,
                                uvccl_redop_t redop, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m, off = 0, es = uvccl_dtype_size(dtype);
  int rc = prologue(pg, work, "reduce_scatterv", &g, &op), i;
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 1, redop, &m)) != 0) return refuse(op, rc);
  if (recvcounts == NULL || BAD_BUF(recvcounts[g->rank], recvbuf))
    return refuse(op, UV_EINVAL);
  if (uvccl__nccl_op_calls(op, (size_t)g->size) == NULL)
    return refuse(op, UV_ENOMEM);
  /* Block i is reduced to rank i: one ncclReduce per block, grouped. */
  for (i = 0; i < g->size; i++) {
    if (BAD_BUF(recvcounts[i], sendbuf)) return refuse(op, UV_EINVAL);
    op->calls[i] = (ncall_t){NCALL_REDUCE, i, (const char *)sendbuf + off * es,
                             i == g->rank ? recvbuf : (char *)sendbuf + off * es,
                             recvcounts[i] * m};
    off += recvcounts[i];
  }
  op->grouped = 1;
  describe(op, off, recvcounts[g->rank], -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                          size_t count, uvccl_dtype_t dtype, int root,
                          uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "broadcast", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 0, 0, &m)) != 0 ||
      (rc = root_ok(g, root, "broadcast")) != 0)
    return refuse(op, rc);
  if (BAD_BUF(count, buf)) return refuse(op, UV_EINVAL);
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_BROADCAST, root, buf, buf, count * m};
  describe(op, count, count, root);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype,
                       uvccl_redop_t redop, int root, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "reduce", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 1, redop, &m)) != 0 ||
      (rc = root_ok(g, root, "reduce")) != 0)
    return refuse(op, rc);
  if (BAD_BUF(count, sendbuf) || (g->rank == root && BAD_BUF(count, recvbuf)))
    return refuse(op, UV_EINVAL);
  uvccl__nccl_op_calls(op, 1);
  /* recvbuf is only read at root; NCCL wants a pointer everywhere */
  op->calls[0] = (ncall_t){NCALL_REDUCE, root, sendbuf,
                           recvbuf ? recvbuf : (void *)sendbuf, count * m};
  describe(op, count, g->rank == root ? count : 0, root);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf, size_t count,
                          uvccl_dtype_t dtype, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "allgather", &g, &op);
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 0, 0, &m)) != 0) return refuse(op, rc);
  if (BAD_BUF(count, sendbuf) || BAD_BUF(count, recvbuf))
    return refuse(op, UV_EINVAL);
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_ALLGATHER, 0, sendbuf, recvbuf, count * m};
  describe(op, count, count * (size_t)g->size, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work,
                           const void *sendbuf, size_t sendcount,
                           void *const *recvbufs, const size_t *recvcounts,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m;
  int rc = prologue(pg, work, "allgatherv", &g, &op), i;
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 0, 0, &m)) != 0) return refuse(op, rc);
  if (recvbufs == NULL || recvcounts == NULL ||
      sendcount != recvcounts[g->rank] || BAD_BUF(sendcount, sendbuf)) {
    LOG_ERROR("nccl", "allgatherv: sendcount must equal recvcounts[rank] "
              "and the buffers must be given");
    return refuse(op, UV_EINVAL);
  }
  if (uvccl__nccl_op_calls(op, (size_t)g->size) == NULL)
    return refuse(op, UV_ENOMEM);
  /* Uneven blocks: a broadcast from each rank into its receive buffer,
   * all in one NCCL group. */
  for (i = 0; i < g->size; i++) {
    if (BAD_BUF(recvcounts[i], recvbufs[i])) return refuse(op, UV_EINVAL);
    op->calls[i] = (ncall_t){NCALL_BROADCAST, i,
                             i == g->rank ? sendbuf : recvbufs[i],
                             recvbufs[i], recvcounts[i] * m};
  }
  op->grouped = 1;
  {
    uint64_t tot = 0;
    for (i = 0; i < g->size; i++) tot += recvcounts[i];
    describe(op, sendcount, tot, -1);
  }
  return uvccl__nccl_op_start(g, op, work, cb);
}

/* Grouped send/recv with the local block copied on the stream. */
static int p2p_blocks(nccl_group_t *g, nccl_op_t *op, const char *send,
                      const size_t *scounts, const size_t *soffs, char *recv,
                      const size_t *rcounts, const size_t *roffs, size_t es,
                      size_t m, int root) {
  size_t n = 0;
  int i;
  if (uvccl__nccl_op_calls(op, 2 * (size_t)g->size) == NULL) return UV_ENOMEM;
  for (i = 0; i < g->size; i++) {
    int sends = send != NULL && (root < 0 || g->rank == root || i == root);
    int recvs = recv != NULL && (root < 0 || g->rank == root || i == root);
    if (i == g->rank) {
      if (sends && recvs)
        op->calls[n++] = (ncall_t){NCALL_COPY, i, send + soffs[i] * es,
                                   recv + roffs[i] * es, scounts[i] * es};
      continue;
    }
    if (sends && scounts[i] > 0)
      op->calls[n++] = (ncall_t){NCALL_SEND, i, send + soffs[i] * es, NULL,
                                 scounts[i] * m};
    if (recvs && rcounts[i] > 0)
      op->calls[n++] = (ncall_t){NCALL_RECV, i, NULL, recv + roffs[i] * es,
                                 rcounts[i] * m};
  }
  op->ncalls = n;
  op->grouped = 1;
  return 0;
}

/* gather and scatter: grouped send/recv between root and each rank, the
 * root's own block a copy. gather: every rank's block (offset 0) goes to
 * root's block i; scatter: root's block i goes to rank i (offset 0). */
static int gather_scatter(uvccl_pg_t *pg, uvccl_work_t *work, int gather,
                          const void *sendbuf, void *recvbuf, size_t count,
                          uvccl_dtype_t dtype, int root, uvccl_work_cb cb) {
  const char *name = gather ? "gather" : "scatter";
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m, *cnt, *offs, *zero;
  int rc = prologue(pg, work, name, &g, &op), i, me_root;
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 0, 0, &m)) != 0 ||
      (rc = root_ok(g, root, name)) != 0)
    return refuse(op, rc);
  me_root = g->rank == root;
  /* the buffer every rank has, and the one only root has */
  if (BAD_BUF(count, gather ? sendbuf : recvbuf) ||
      (me_root && BAD_BUF(count, gather ? recvbuf : sendbuf)))
    return refuse(op, UV_EINVAL);
  cnt = uvccl__calloc(3 * (size_t)g->size, sizeof(size_t));
  if (cnt == NULL) return refuse(op, UV_ENOMEM);
  offs = cnt + g->size;
  zero = offs + g->size;
  for (i = 0; i < g->size; i++) {
    cnt[i] = count;
    offs[i] = (size_t)i * count;
  }
  if (gather)
    rc = p2p_blocks(g, op, sendbuf, cnt, zero, me_root ? recvbuf : NULL, cnt,
                    offs, uvccl_dtype_size(dtype), m, root);
  else
    rc = p2p_blocks(g, op, me_root ? sendbuf : NULL, cnt, offs, recvbuf, cnt,
                    zero, uvccl_dtype_size(dtype), m, root);
  if (me_root) {
    /* root only receives (gather) or only sends (scatter), besides the
     * copy of its own block */
    size_t j, k = 0;
    for (j = 0; j < op->ncalls; j++)
      if (op->calls[j].type != (gather ? NCALL_SEND : NCALL_RECV))
        op->calls[k++] = op->calls[j];
    op->ncalls = k;
  }
  uvccl__free(cnt);
  if (rc != 0) return refuse(op, rc);
  if (gather)
    describe(op, count, me_root ? count * (size_t)g->size : 0, root);
  else
    describe(op, me_root ? count * (size_t)g->size : 0, count, root);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype,
                       int root, uvccl_work_cb cb) {
  return gather_scatter(pg, work, 1, sendbuf, recvbuf, count, dtype, root, cb);
}

int uvccl__nccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                        const void *sendbuf, void *recvbuf, size_t count,
                        uvccl_dtype_t dtype, int root, uvccl_work_cb cb) {
  return gather_scatter(pg, work, 0, sendbuf, recvbuf, count, dtype, root, cb);
}

static int alltoall_common(uvccl_pg_t *pg, uvccl_work_t *work,
                           const char *name, const void *sendbuf,
                           const size_t *sendcounts, void *recvbuf,
                           const size_t *recvcounts, size_t count,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t m, *sc, *so, *rc_, *ro, stot = 0, rtot = 0;
  int rc = prologue(pg, work, name, &g, &op), i;
  if (rc != 0) return rc;
  if ((rc = set_types(g, op, dtype, 0, 0, &m)) != 0) return refuse(op, rc);
  sc = uvccl__calloc(4 * (size_t)g->size, sizeof(size_t));
  if (sc == NULL) return refuse(op, UV_ENOMEM);
  so = sc + g->size;
  rc_ = so + g->size;
  ro = rc_ + g->size;
  for (i = 0; i < g->size; i++) {
    sc[i] = sendcounts ? sendcounts[i] : count;
    rc_[i] = recvcounts ? recvcounts[i] : count;
    so[i] = stot;
    ro[i] = rtot;
    stot += sc[i];
    rtot += rc_[i];
  }
  if (BAD_BUF(stot, sendbuf) || BAD_BUF(rtot, recvbuf) ||
      sc[g->rank] != rc_[g->rank] || (stot > 0 && sendbuf == recvbuf)) {
    LOG_ERROR("nccl", "%s: bad buffers or counts (not in place; the own "
              "block's send and receive counts must match)", name);
    uvccl__free(sc);
    return refuse(op, UV_EINVAL);
  }
  rc = p2p_blocks(g, op, sendbuf ? sendbuf : "", sc, so,
                  recvbuf ? recvbuf : (void *)"", rc_, ro,
                  uvccl_dtype_size(dtype), m, -1);
  uvccl__free(sc);
  if (rc != 0) return refuse(op, rc);
  describe(op, stot, rtot, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work,
                         const void *sendbuf, void *recvbuf, size_t count,
                         uvccl_dtype_t dtype, uvccl_work_cb cb) {
  return alltoall_common(pg, work, "alltoall", sendbuf, NULL, recvbuf, NULL,
                         count, dtype, cb);
}

int uvccl__nccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, const size_t *sendcounts,
                          void *recvbuf, const size_t *recvcounts,
                          uvccl_dtype_t dtype, uvccl_work_cb cb) {
  if (sendcounts == NULL || recvcounts == NULL) return UV_EINVAL;
  return alltoall_common(pg, work, "alltoallv", sendbuf, sendcounts, recvbuf,
                         recvcounts, 0, dtype, cb);
}

int uvccl__nccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  int rc = prologue(pg, work, "barrier", &g, &op);
  if (rc != 0) return rc;
  /* A one-word allreduce: every rank must arrive, and the group stream
   * orders it after every earlier op of the group. The scratch word is
   * the group's (it exists once the communicator does), so the call is
   * built at issue time from g->scratch: a NULL here means "scratch". */
  op->dtype = UVCCL__NCCL_INT32;
  op->redop = UVCCL__NCCL_SUM;
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_ALLREDUCE, 0, NULL, NULL, 1};
  describe(op, 0, 0, -1);
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work,
                                  int wait_all, uvccl_work_cb cb) {
  (void)pg; (void)work; (void)wait_all; (void)cb;
  LOG_ERROR("nccl", "monitored_barrier is not available on NCCL groups "
            "(NCCL cannot say which rank is missing): use a TCP group");
  return UV_ENOTSUP;
}

/* ---- point to point (bytes) --------------------------------------------------- */

static int peer_ok(const nccl_group_t *g, int peer, int self_ok,
                   const char *name) {
  if (peer == UVCCL_ANY_SOURCE) {
    LOG_ERROR("nccl", "%s: NCCL has no any-source receive; name the peer",
              name);
    return UV_ENOTSUP;
  }
  if (peer < 0 || peer >= g->size || (!self_ok && peer == g->rank)) {
    LOG_ERROR("nccl", "%s: peer %d is not another rank of the group (size "
              "%d, this is %d)%s", name, peer, g->size, g->rank,
              self_ok ? "" : "; to self only inside uvccl_p2p_batch");
    return UV_EINVAL;
  }
  return 0;
}

int uvccl__nccl_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                     size_t len, int dst, int tag, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  int rc = prologue(pg, work, "send", &g, &op);
  (void)tag; /* NCCL matches in order per peer: tags are not compared */
  if (rc != 0) return rc;
  if ((rc = peer_ok(g, dst, 0, "send")) != 0) return refuse(op, rc);
  if (BAD_BUF(len, buf)) return refuse(op, UV_EINVAL);
  op->dtype = UVCCL__NCCL_UINT8;
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_SEND, dst, buf, NULL, len};
  describe(op, len, 0, -1);
  op->desc.p2p = 1;
  op->desc.peer = dst;
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
                     int src, int tag, uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  int rc = prologue(pg, work, "recv", &g, &op);
  (void)tag;
  if (rc != 0) return rc;
  if ((rc = peer_ok(g, src, 0, "recv")) != 0) return refuse(op, rc);
  if (BAD_BUF(len, buf)) return refuse(op, UV_EINVAL);
  op->dtype = UVCCL__NCCL_UINT8;
  op->recv_len = len; /* NCCL messages have exactly the posted length */
  op->recv_src = src;
  uvccl__nccl_op_calls(op, 1);
  op->calls[0] = (ncall_t){NCALL_RECV, src, NULL, buf, len};
  describe(op, 0, len, -1);
  op->desc.p2p = 1;
  op->desc.peer = src;
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl__nccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work,
                          uvccl_p2p_op_t *ops, size_t nops,
                          uvccl_work_cb cb) {
  nccl_group_t *g;
  nccl_op_t *op;
  size_t i;
  int rc = prologue(pg, work, "p2p_batch", &g, &op);
  if (rc != 0) return rc;
  if (nops > 0 && ops == NULL) return refuse(op, UV_EINVAL);
  for (i = 0; i < nops; i++) {
    /* to self is fine here: NCCL pairs it with the recv in the group */
    if ((rc = peer_ok(g, ops[i].peer, 1, "p2p_batch")) != 0)
      return refuse(op, rc);
    if (BAD_BUF(ops[i].len, ops[i].buf)) return refuse(op, UV_EINVAL);
  }
  if (uvccl__nccl_op_calls(op, nops) == NULL && nops > 0)
    return refuse(op, UV_ENOMEM);
  op->dtype = UVCCL__NCCL_UINT8;
  for (i = 0; i < nops; i++)
    op->calls[i] = ops[i].is_send
                       ? (ncall_t){NCALL_SEND, ops[i].peer, ops[i].buf, NULL,
                                   ops[i].len}
                       : (ncall_t){NCALL_RECV, ops[i].peer, NULL, ops[i].buf,
                                   ops[i].len};
  op->grouped = 1;
  op->p2p = ops;
  {
    uint64_t in = 0, out = 0;
    for (i = 0; i < nops; i++) *(ops[i].is_send ? &in : &out) += ops[i].len;
    describe(op, in, out, -1);
    op->desc.p2p = 1;
  }
  return uvccl__nccl_op_start(g, op, work, cb);
}

/* ---- byte collectives: not on NCCL -------------------------------------------- */

static int bytes_refused(const char *name) {
  LOG_ERROR("nccl", "%s is not available on NCCL groups (variable-length "
            "host payloads): use a TCP group", name);
  return UV_ENOTSUP;
}

int uvccl__nccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *buf, size_t len, int root,
                                uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)root; (void)cb;
  return bytes_refused("broadcast_bytes");
}

int uvccl__nccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *buf, size_t len,
                                uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)cb;
  return bytes_refused("allgather_bytes");
}

int uvccl__nccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                             const void *buf, size_t len, int root,
                             uvccl_work_cb cb) {
  (void)pg; (void)work; (void)buf; (void)len; (void)root; (void)cb;
  return bytes_refused("gather_bytes");
}

int uvccl__nccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                              const uvccl_buf_t *bufs, size_t nbufs, int root,
                              uvccl_work_cb cb) {
  (void)pg; (void)work; (void)bufs; (void)nbufs; (void)root; (void)cb;
  return bytes_refused("scatter_bytes");
}

/* ---- stream-ordered completion ------------------------------------------------ */

static int stream_order(uvccl_pg_t *pg, uvccl_work_t *work, void *stream,
                        uvccl_work_cb cb, nop_kind_t kind, const char *name) {
  nccl_group_t *g;
  nccl_op_t *op;
  int rc = uvccl__nccl_group_check(pg, work, &g);
  if (rc != 0) return rc;
  op = uvccl__nccl_op_new(g, kind, name);
  if (op == NULL) return UV_ENOMEM;
  op->user_stream = stream; /* NULL: the legacy default stream */
  return uvccl__nccl_op_start(g, op, work, cb);
}

int uvccl_nccl_stream_wait(uvccl_pg_t *pg, uvccl_work_t *work,
                           void *cuda_stream, uvccl_work_cb cb) {
  if (!UVCCL__IS_NCCL(pg)) return UV_EINVAL;
  return stream_order(pg, work, cuda_stream, cb, NOP_STREAM_WAIT,
                      "nccl_stream_wait");
}

int uvccl_nccl_wait_stream(uvccl_pg_t *pg, uvccl_work_t *work,
                           void *cuda_stream, uvccl_work_cb cb) {
  if (!UVCCL__IS_NCCL(pg)) return UV_EINVAL;
  return stream_order(pg, work, cuda_stream, cb, NOP_WAIT_STREAM,
                      "nccl_wait_stream");
}
