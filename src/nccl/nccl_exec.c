/* The GPU-thread side of the NCCL groups: issue() of every kind of op.
 * Runs on the device thread only (see gpu.h): it may call NCCL and CUDA,
 * and must not touch loop state. Communicators are nonblocking, so a call
 * that returns ncclInProgress is polled with ncclCommGetAsyncError on the
 * next issue() (UVCCL__GPU_AGAIN) instead of blocking the thread. */
#include "nccl_internal.h"
#include "cuda/cuda_api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define NCCL uvccl__nccl
#define CUDA uvccl__cuda

static int fail_nccl(nccl_op_t *op, const char *call, int r,
                     uvccl__nccl_comm_t comm) {
  char why[120];
  uvccl__nccl_describe(r, comm, why, sizeof(why));
  snprintf(op->gop.msg, sizeof(op->gop.msg), "%s: %s", call, why);
  return UVCCL_ENCCL;
}

static int fail_cuda(nccl_op_t *op, const char *call, int r) {
  const char *s = CUDA.GetErrorString ? CUDA.GetErrorString(r) : NULL;
  snprintf(op->gop.msg, sizeof(op->gop.msg), "%s: %s (%d)", call,
           s ? s : "CUDA error", r);
  return UVCCL_ECUDA;
}

/* Polls a nonblocking communicator: 0 done, AGAIN, or an error. */
static int poll_comm(nccl_op_t *op, const char *call,
                     uvccl__nccl_comm_t comm) {
  int st = UVCCL__NCCL_SUCCESS, r;
  if (comm == NULL) return 0;
  r = NCCL.CommGetAsyncError(comm, &st);
  if (r != UVCCL__NCCL_SUCCESS) return fail_nccl(op, call, r, comm);
  if (st == UVCCL__NCCL_IN_PROGRESS) return UVCCL__GPU_AGAIN;
  if (st != UVCCL__NCCL_SUCCESS) {
    op->async_failed = 1; /* the communicator is unusable now */
    return fail_nccl(op, call, st, comm);
  }
  return 0;
}

/* The scalar of a PreMulSum in the op's data type. */
static void premul_scalar(int dtype, double f, void *out) {
  float x = (float)f;
  uint32_t u;
  switch (dtype) {
  case UVCCL__NCCL_FLOAT64: memcpy(out, &f, sizeof(f)); break;
  case UVCCL__NCCL_FLOAT32: memcpy(out, &x, sizeof(x)); break;
  case UVCCL__NCCL_BFLOAT16: {
    uint16_t h;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    h = (uint16_t)(u >> 16);
    memcpy(out, &h, 2);
    break;
  }
  case UVCCL__NCCL_FLOAT16: {
    uint16_t h, sign;
    int32_t e;
    uint32_t m;
    memcpy(&u, &x, 4);
    sign = (uint16_t)((u >> 16) & 0x8000);
    e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    m = u & 0x7fffff;
    if (e >= 31) h = sign | 0x7c00;
    else if (e <= 0) {
      /* subnormal half (factors this small are unusual) */
      if (e < -10) h = sign;
      else {
        m |= 0x800000;
        h = sign | (uint16_t)((m >> (14 - e)) + ((m >> (13 - e)) & 1));
      }
    } else {
      h = sign | (uint16_t)(e << 10) | (uint16_t)(m >> 13);
      if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) h++;
    }
    memcpy(out, &h, 2);
    break;
  }
  default: memset(out, 0, 8); break;
  }
}

/* Tests only (t/3003, t/3010): the next collective's stream waits, after
 * the op started, until the 32-bit word at this device-visible address is
 * >= 1: a kernel that hangs, to provoke timeouts and aborts. */
static _Atomic(void *) debug_block_next;

void uvccl__nccl_debug_block_next(void *dev_flag) {
  atomic_store(&debug_block_next, dev_flag);
}

/* Fingerprint checks: before the op's own calls, the members allgather
 * their fingerprints (device buffer, then pinned host memory, an event
 * polled: the device thread never waits for a peer) and compare them. A
 * mismatch fails the op on every member (each sees them all) with both
 * sides named; the communicator stays usable. 0 go on, AGAIN, or an error
 * (message in op->gop.msg). */
static int fp_exchange(nccl_op_t *op, nccl_group_t *g) {
  const size_t sz = sizeof(uvccl__fp_t);
  uvccl__fp_t *all;
  char why[256];
  int r;
  if (op->fp_phase == 0) {
    if (g->fp_dev == NULL &&
        (r = CUDA.Malloc(&g->fp_dev, sz * (size_t)g->size)) != 0)
      return fail_cuda(op, "cudaMalloc (fingerprints)", r);
    if (g->fp_host == NULL &&
        (r = CUDA.MallocHost(&g->fp_host, sz * (size_t)g->size)) != 0)
      return fail_cuda(op, "cudaMallocHost (fingerprints)", r);
    if (g->fp_event == NULL &&
        (r = CUDA.EventCreateWithFlags(&g->fp_event,
                                       UVCCL__CUDA_EVENT_DISABLE_TIMING)) != 0)
      return fail_cuda(op, "cudaEventCreateWithFlags", r);
    all = g->fp_host;
    all[g->rank] = op->fp_mine;
    r = CUDA.MemcpyAsync((char *)g->fp_dev + sz * (size_t)g->rank,
                         &all[g->rank], sz, UVCCL__CUDA_MEMCPY_DEFAULT,
                         g->stream);
    if (r != 0) return fail_cuda(op, "cudaMemcpyAsync (fingerprint)", r);
    uvccl__gpu_in_call(&op->gop, "ncclAllGather (fingerprints)");
    r = NCCL.AllGather((char *)g->fp_dev + sz * (size_t)g->rank, g->fp_dev,
                       sz, UVCCL__NCCL_UINT8, g->comm, g->stream);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      return fail_nccl(op, "ncclAllGather (fingerprints)", r, g->comm);
    op->fp_phase = 1;
  }
  if (op->fp_phase == 1) {
    /* the enqueue may still be in progress (nonblocking communicator) */
    r = poll_comm(op, "ncclAllGather (fingerprints)", g->comm);
    if (r != 0) return r;
    r = CUDA.MemcpyAsync(g->fp_host, g->fp_dev, sz * (size_t)g->size,
                         UVCCL__CUDA_MEMCPY_DEFAULT, g->stream);
    if (r != 0) return fail_cuda(op, "cudaMemcpyAsync (fingerprints)", r);
    r = CUDA.EventRecord(g->fp_event, g->stream);
    if (r != 0) return fail_cuda(op, "cudaEventRecord", r);
    op->fp_phase = 2;
  }
  if (op->fp_phase == 2) {
    r = CUDA.EventQuery(g->fp_event);
    if (r == UVCCL__CUDA_ERR_NOT_READY) return UVCCL__GPU_AGAIN;
    if (r != 0) return fail_cuda(op, "cudaEventQuery", r);
    op->fp_phase = 3;
    if (uvccl__fp_verdict(&op->fp_mine, g->fp_host, g->size, why,
                          sizeof(why))) {
      snprintf(op->gop.msg, sizeof(op->gop.msg), "#%u: %.*s", op->seq,
               (int)sizeof(op->gop.msg) - 16, why);
      return UVCCL_EMISMATCH;
    }
  }
  return 0;
}

static int issue_calls(nccl_op_t *op, nccl_group_t *g) {
  uvccl__nccl_comm_t comm = g->comm;
  void *s = g->stream;
  size_t i;
  int r = 0, redop = op->redop, ingroup = 0;
  const char *call = "";

  if (op->phase == 1) goto poll;
  /* the flight recorder: the GPU thread has it now (thread-safe) */
  uvccl__flight_started(g->fg, op->fid);
  if (op->fp && op->fp_phase < 3 && (r = fp_exchange(op, g)) != 0) return r;
  /* An earlier asynchronous error leaves the communicator unusable. */
  r = poll_comm(op, "ncclCommGetAsyncError", comm);
  if (r < 0) return r;
  if (atomic_load(&debug_block_next) != NULL) {
    void *flag = atomic_exchange(&debug_block_next, NULL);
    if (flag != NULL && CUDA.StreamWaitValue32 != NULL)
      CUDA.StreamWaitValue32(s, (unsigned long long)(uintptr_t)flag, 1,
                             UVCCL__CU_STREAM_WAIT_VALUE_GEQ);
  }
  /* Local copies first: they go on the stream before the NCCL work and
   * must not be issued while NCCL's enqueue is in progress. */
  for (i = 0; i < op->ncalls; i++) {
    ncall_t *c = &op->calls[i];
    if (c->type != NCALL_COPY || c->count == 0 || c->send == c->recv)
      continue;
    r = CUDA.MemcpyAsync(c->recv, c->send, c->count,
                         UVCCL__CUDA_MEMCPY_DEFAULT, s);
    if (r != 0) return fail_cuda(op, "cudaMemcpyAsync", r);
  }
  if (op->premul) {
    char scalar[8];
    premul_scalar(op->dtype, op->factor, scalar);
    r = NCCL.RedOpCreatePreMulSum(&op->nccl_op, scalar, op->dtype,
                                  UVCCL__NCCL_SCALAR_HOST_IMMEDIATE, comm);
    /* local to this rank: in progress still means the op id is valid */
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      return fail_nccl(op, "ncclRedOpCreatePreMulSum", r, comm);
    redop = op->nccl_op;
  }
  if (op->grouped) {
    r = NCCL.GroupStart();
    if (r != UVCCL__NCCL_SUCCESS) {
      call = "ncclGroupStart";
      goto failed;
    }
    ingroup = 1;
  }
  for (i = 0; i < op->ncalls; i++) {
    ncall_t *c = &op->calls[i];
    static const char *const names[] = {
        "ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
        "ncclReduceScatter", "ncclSend", "ncclRecv", "cudaMemcpyAsync"};
    uvccl__gpu_in_call(&op->gop, names[c->type]);
    switch (c->type) {
    case NCALL_ALLREDUCE:
      call = "ncclAllReduce";
      /* NULL buffers: the group's scratch word (barrier) */
      r = NCCL.AllReduce(c->send ? c->send : g->scratch,
                         c->recv ? c->recv : g->scratch, c->count, op->dtype,
                         redop, comm, s);
      break;
    case NCALL_BROADCAST:
      call = "ncclBroadcast";
      r = NCCL.Broadcast(c->send, c->recv, c->count, op->dtype, c->peer,
                         comm, s);
      break;
    case NCALL_REDUCE:
      call = "ncclReduce";
      r = NCCL.Reduce(c->send, c->recv, c->count, op->dtype, redop, c->peer,
                      comm, s);
      break;
    case NCALL_ALLGATHER:
      call = "ncclAllGather";
      r = NCCL.AllGather(c->send, c->recv, c->count, op->dtype, comm, s);
      break;
    case NCALL_REDUCE_SCATTER:
      call = "ncclReduceScatter";
      r = NCCL.ReduceScatter(c->send, c->recv, c->count, op->dtype, redop,
                             comm, s);
      break;
    case NCALL_SEND:
      call = "ncclSend";
      r = NCCL.Send(c->send, c->count, op->dtype, c->peer, comm, s);
      break;
    case NCALL_RECV:
      call = "ncclRecv";
      r = NCCL.Recv(c->recv, c->count, op->dtype, c->peer, comm, s);
      break;
    case NCALL_COPY:
      r = 0;
      break;
    }
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      goto failed;
  }
  uvccl__gpu_in_call(&op->gop, NULL);
  if (ingroup) {
    ingroup = 0;
    call = "ncclGroupEnd";
    uvccl__gpu_in_call(&op->gop, call);
    r = NCCL.GroupEnd();
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      goto failed;
  }
  op->phase = 1;
poll:
  r = poll_comm(op, op->name, comm);
  if (r == UVCCL__GPU_AGAIN) return r;
  if (op->premul) {
    /* Not before the enqueue finished: NCCL reads the op until then. */
    NCCL.RedOpDestroy(op->nccl_op, comm);
    op->premul = 0;
  }
  return r;
failed:
  uvccl__gpu_in_call(&op->gop, NULL);
  if (ingroup) NCCL.GroupEnd(); /* closes the group; the error stands */
  r = fail_nccl(op, call, r, comm);
  if (op->premul) NCCL.RedOpDestroy(op->nccl_op, comm);
  op->premul = 0;
  return r;
}

/* The stream, the barrier word: once the communicator exists. */
static int make_group_resources(nccl_op_t *op, nccl_group_t *g) {
  int r;
  if (g->stream == NULL) {
    r = CUDA.StreamCreateWithFlags(&g->stream,
                                   UVCCL__CUDA_STREAM_NON_BLOCKING);
    if (r != 0) return fail_cuda(op, "cudaStreamCreateWithFlags", r);
  }
  if (g->scratch == NULL) {
    r = CUDA.Malloc(&g->scratch, 16);
    if (r != 0) return fail_cuda(op, "cudaMalloc", r);
  }
  return 0;
}

static void free_group_resources(nccl_group_t *g) {
  if (g->stream != NULL) CUDA.StreamDestroy(g->stream);
  if (g->scratch != NULL) CUDA.Free(g->scratch);
  if (g->fp_dev != NULL) CUDA.Free(g->fp_dev);
  if (g->fp_host != NULL) CUDA.FreeHost(g->fp_host);
  if (g->fp_event != NULL) CUDA.EventDestroy(g->fp_event);
  g->stream = NULL;
  g->scratch = NULL;
  g->fp_dev = g->fp_host = g->fp_event = NULL;
}

/* An init or grow ended (r): the group takes the communicator and makes
 * its resources, or the failed one is aborted. */
static int take_comm(nccl_op_t *op, nccl_group_t *g, int r) {
  if (r == 0) {
    g->comm = op->newcomm;
    r = make_group_resources(op, g);
  } else if (op->newcomm != NULL) {
    NCCL.CommAbort(op->newcomm);
  }
  op->newcomm = NULL;
  return r;
}

static int issue_init(nccl_op_t *op, nccl_group_t *g) {
  int r;
  if (op->phase == 0) {
    uvccl__nccl_config_t cfg;
    uvccl__nccl_config_init(&cfg);
    uvccl__gpu_in_call(&op->gop, "ncclCommInitRankConfig");
    r = NCCL.CommInitRankConfig(&op->newcomm, g->size, g->uid,
                                g->rank, &cfg);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS) {
      fail_nccl(op, "ncclCommInitRankConfig", r, op->newcomm);
      if (op->newcomm != NULL) NCCL.CommAbort(op->newcomm);
      op->newcomm = NULL;
      return UVCCL_ENCCL;
    }
    op->phase = 1;
  }
  r = poll_comm(op, "ncclCommInitRankConfig", op->newcomm);
  if (r == UVCCL__GPU_AGAIN) return r;
  return take_comm(op, g, r);
}

/* ncclCommGrow: a member passes its old world (rank 0 with the id it got
 * from ncclCommGetUniqueId, the others without) and keeps its rank; a
 * joiner passes none, the id and its place. */
static int issue_grow(nccl_op_t *op, nccl_group_t *g) {
  nccl_group_t *p = g->grow_parent;
  int r;
  if (op->phase == 0) {
    uvccl__nccl_config_t cfg;
    uvccl__nccl_config_init(&cfg);
    if (p != NULL && p->comm == NULL) {
      snprintf(op->gop.msg, sizeof(op->gop.msg), "ncclCommGrow: the world "
               "it grows from has no communicator (destroyed or aborted)");
      return UVCCL_ECLOSING;
    }
    uvccl__gpu_in_call(&op->gop, "ncclCommGrow");
    r = NCCL.CommGrow(p ? p->comm : NULL, g->size,
                      p == NULL || g->rank == 0 ? &g->uid : NULL,
                      p ? -1 : g->rank, &op->newcomm, &cfg);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS) {
      fail_nccl(op, "ncclCommGrow", r, p ? p->comm : op->newcomm);
      if (op->newcomm != NULL) NCCL.CommAbort(op->newcomm);
      op->newcomm = NULL;
      return UVCCL_ENCCL;
    }
    op->phase = 1;
  }
  r = poll_comm(op, "ncclCommGrow", op->newcomm);
  if (r == UVCCL__GPU_AGAIN) return r;
  return take_comm(op, g, r);
}

static int issue_split(nccl_op_t *op, nccl_group_t *parent) {
  int r;
  nccl_group_t *child = op->target;
  if (op->phase == 0) {
    uvccl__nccl_config_t cfg;
    uvccl__nccl_config_init(&cfg);
    r = poll_comm(op, "ncclCommGetAsyncError", parent->comm);
    if (r < 0) return r;
    uvccl__gpu_in_call(&op->gop, "ncclCommSplit");
    r = NCCL.CommSplit(parent->comm, op->color, op->key, &op->newcomm, &cfg);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      return fail_nccl(op, "ncclCommSplit", r, parent->comm);
    op->phase = 1;
  }
  r = poll_comm(op, "ncclCommSplit", parent->comm);
  if (r == 0) r = poll_comm(op, "ncclCommSplit", op->newcomm);
  if (r == UVCCL__GPU_AGAIN) return r;
  if (r != 0) {
    if (op->newcomm != NULL) NCCL.CommAbort(op->newcomm);
    op->newcomm = NULL;
    return r;
  }
  if (op->newcomm == NULL) return 0; /* NOCOLOR: not a member */
  NCCL.CommUserRank(op->newcomm, &op->split_rank);
  NCCL.CommCount(op->newcomm, &op->split_size);
  if (child == NULL) { /* the child went away meanwhile */
    NCCL.CommDestroy(op->newcomm);
    op->newcomm = NULL;
    return 0;
  }
  child->comm = op->newcomm;
  op->newcomm = NULL;
  return make_group_resources(op, child);
}

/* ncclCommRevoke: in-flight work stops; done once the communicator is
 * quiescent (NCCL says success again). */
static int issue_revoke(nccl_op_t *op, nccl_group_t *g) {
  int r;
  if (g->comm == NULL) return 0;
  if (op->phase == 0) {
    uvccl__gpu_in_call(&op->gop, "ncclCommRevoke");
    r = NCCL.CommRevoke(g->comm, 0);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      return fail_nccl(op, "ncclCommRevoke", r, g->comm);
    op->phase = 1;
  }
  return poll_comm(op, "ncclCommRevoke", g->comm);
}

/* ncclCommShrink, NCCL_SHRINK_ABORT (what was in flight on the failed
 * communicator stops first), then the child as a split makes it. */
static int issue_shrink(nccl_op_t *op, nccl_group_t *parent) {
  int r;
  nccl_group_t *child = op->target;
  if (op->phase == 0) {
    uvccl__nccl_config_t cfg;
    uvccl__nccl_config_init(&cfg);
    uvccl__gpu_in_call(&op->gop, "ncclCommShrink");
    r = NCCL.CommShrink(parent->comm, op->excl, op->nexcl, &op->newcomm, &cfg,
                        UVCCL__NCCL_SHRINK_ABORT);
    uvccl__gpu_in_call(&op->gop, NULL);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS)
      return fail_nccl(op, "ncclCommShrink", r, parent->comm);
    op->phase = 1;
  }
  r = poll_comm(op, "ncclCommShrink", op->newcomm);
  if (r == UVCCL__GPU_AGAIN) return r;
  if (r != 0) {
    if (op->newcomm != NULL) NCCL.CommAbort(op->newcomm);
    op->newcomm = NULL;
    return r;
  }
  NCCL.CommUserRank(op->newcomm, &op->split_rank);
  NCCL.CommCount(op->newcomm, &op->split_size);
  if (child == NULL) {
    NCCL.CommDestroy(op->newcomm);
    op->newcomm = NULL;
    return 0;
  }
  child->comm = op->newcomm;
  op->newcomm = NULL;
  return make_group_resources(op, child);
}

static int issue_finalize(nccl_op_t *op, nccl_group_t *g) {
  int r;
  if (g->comm != NULL && op->phase == 0) {
    r = NCCL.CommFinalize(g->comm);
    if (r != UVCCL__NCCL_SUCCESS && r != UVCCL__NCCL_IN_PROGRESS) {
      /* Destroy could block on peers now: abort instead. */
      fail_nccl(op, "ncclCommFinalize", r, g->comm);
      NCCL.CommAbort(g->comm);
      g->comm = NULL;
    }
    op->phase = 1;
  }
  if (g->comm != NULL) {
    int st = UVCCL__NCCL_SUCCESS;
    NCCL.CommGetAsyncError(g->comm, &st);
    if (st == UVCCL__NCCL_IN_PROGRESS) return UVCCL__GPU_AGAIN;
    uvccl__gpu_in_call(&op->gop, st != UVCCL__NCCL_SUCCESS
                                     ? "ncclCommAbort" : "ncclCommDestroy");
    if (st != UVCCL__NCCL_SUCCESS) {
      NCCL.CommAbort(g->comm);
    } else {
      NCCL.CommDestroy(g->comm); /* local once finalized */
    }
    uvccl__gpu_in_call(&op->gop, NULL);
    g->comm = NULL;
  }
  free_group_resources(g);
  return 0;
}

static int issue_abort(nccl_op_t *op, nccl_group_t *g) {
  if (op->newcomm != NULL) { /* an abandoned init's or split's (op_done) */
    uvccl__gpu_in_call(&op->gop, "ncclCommAbort");
    NCCL.CommAbort(op->newcomm);
    uvccl__gpu_in_call(&op->gop, NULL);
    op->newcomm = NULL;
    return 0;
  }
  uvccl__gpu_in_call(&op->gop, "ncclCommAbort");
  if (g->comm != NULL) NCCL.CommAbort(g->comm);
  uvccl__gpu_in_call(&op->gop, NULL);
  g->comm = NULL;
  free_group_resources(g);
  return 0;
}

static int issue_stream_order(nccl_op_t *op, nccl_group_t *g, int user_waits) {
  void *ev = NULL;
  void *from = user_waits ? g->stream : op->user_stream;
  void *to = user_waits ? op->user_stream : g->stream;
  int r = CUDA.EventCreateWithFlags(&ev, UVCCL__CUDA_EVENT_DISABLE_TIMING);
  if (r != 0) return fail_cuda(op, "cudaEventCreateWithFlags", r);
  r = CUDA.EventRecord(ev, from);
  if (r == 0) r = CUDA.StreamWaitEvent(to, ev, 0);
  CUDA.EventDestroy(ev); /* released once the wait no longer needs it */
  if (r != 0) return fail_cuda(op, user_waits ? "cudaStreamWaitEvent (user stream)"
                                              : "cudaStreamWaitEvent (group stream)", r);
  return 0;
}

int uvccl__nccl_issue(uvccl__gpu_op_t *gop) {
  nccl_op_t *op = (nccl_op_t *)gop;
  nccl_group_t *g = op->g;
  switch (op->kind) {
  case NOP_CALLS: return issue_calls(op, g);
  case NOP_COMM_INIT: return issue_init(op, g);
  case NOP_UNIQUE_ID: {
    int r = NCCL.GetUniqueId(&g->uid);
    return r == UVCCL__NCCL_SUCCESS ? 0
                                    : fail_nccl(op, "ncclGetUniqueId", r, NULL);
  }
  case NOP_SPLIT: return issue_split(op, g);
  case NOP_CHECK: {
    /* In progress is fine here: another op of the group is enqueueing. */
    int r = g->comm ? poll_comm(op, "asynchronous NCCL error", g->comm) : 0;
    return r == UVCCL__GPU_AGAIN ? 0 : r;
  }
  case NOP_DRAIN: return 0;
  case NOP_FINALIZE: return issue_finalize(op, g);
  case NOP_ABORT: return issue_abort(op, g);
  case NOP_STREAM_WAIT: return issue_stream_order(op, g, 1);
  case NOP_WAIT_STREAM: return issue_stream_order(op, g, 0);
  case NOP_REVOKE: return issue_revoke(op, g);
  case NOP_SHRINK: return issue_shrink(op, g);
  case NOP_GROW_ID: {
    int r;
    if (g->grow_parent == NULL || g->grow_parent->comm == NULL) {
      snprintf(op->gop.msg, sizeof(op->gop.msg), "ncclCommGetUniqueId: the "
               "world it grows from has no communicator");
      return UVCCL_ECLOSING;
    }
    r = NCCL.CommGetUniqueId(g->grow_parent->comm, &g->uid);
    return r == UVCCL__NCCL_SUCCESS
               ? 0
               : fail_nccl(op, "ncclCommGetUniqueId", r, g->grow_parent->comm);
  }
  case NOP_GROW: return issue_grow(op, g);
  }
  return UV_EINVAL;
}
