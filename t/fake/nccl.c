/* A fake NCCL for tests on machines without a GPU: built into
 * $(BUILD)/fake/libnccl.so.2 (linked against the fake cudart) and
 * selected with UVCCL_NCCL. It exports the nccl* functions uvccl loads,
 * with real semantics for communicators of ONE rank: every collective is
 * a copy (or a scaled copy for PreMulSum) run on the fake GPU in stream
 * order through fake_cuda_enqueue; send/recv to self only inside a group
 * with the matching recv, as NCCL.
 *
 * Nonblocking communicators (config.blocking = 0) behave as NCCL's:
 * init, split, finalize, a standalone collective and a group end return
 * ncclInProgress, and ncclCommGetAsyncError says ncclInProgress for
 * FAKE_NCCL_INPROGRESS_US (default 300) before ncclSuccess, so callers'
 * polling paths run.
 *
 * Fault injection: fake_nccl_fail_next_async() (or FAKE_NCCL_ASYNC_FAIL_AT=N,
 * the N-th collective call of the process) makes the next collective
 * "hang" on its stream and report ncclRemoteError through
 * ncclCommGetAsyncError; ncclCommAbort releases the hang.
 * fake_nccl_block_next(flag) makes the next one wait on its stream until
 * the test sets *flag (a kernel that started and hangs). Tests reach
 * these hooks with dlsym. */
#define _GNU_SOURCE
#include "fake.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdarg.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
  R_SUCCESS = 0,
  R_UNHANDLED_CUDA = 1,
  R_SYSTEM = 2,
  R_INTERNAL = 3,
  R_INVALID_ARGUMENT = 4,
  R_INVALID_USAGE = 5,
  R_REMOTE = 6,
  R_IN_PROGRESS = 7,
};

enum { T_INT8, T_UINT8, T_INT32, T_UINT32, T_INT64, T_UINT64, T_FLOAT16,
       T_FLOAT32, T_FLOAT64, T_BFLOAT16, T_COUNT };
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_BUILTIN };

#define MAX_PREMUL 64
#define MAX_P2P 4096

typedef struct {
  char internal[128];
} unique_id_t;

/* ncclConfig_v22800 (only the head is read). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} config_head_t;

typedef struct comm_s {
  struct comm_s *next; /* every comm ever made: reachable, never leaked */
  int blocking;
  int rank, nranks;
  int device;
  uint64_t busy_until_ns;   /* nonblocking: "in progress" until then */
  int async_error;
  int aborted, destroyed, finalized;
  volatile uint32_t release; /* set by abort: ends an injected hang */
  struct {
    int used;
    int dtype;
    double scalar;
  } premul[MAX_PREMUL];
} comm_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static comm_t *g_comms;
static char g_last_error[512];
static int g_fail_next;
static volatile uint32_t *g_block_flag;
static long g_fail_at = -1, g_calls;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* the group being built on this thread */
typedef struct {
  int send; /* 1 send, 0 recv */
  comm_t *comm;
  const void *sbuf;
  void *rbuf;
  size_t bytes;
  void *stream;
} p2p_t;
static __thread int t_depth;
static __thread comm_t *t_group_comm;
static __thread p2p_t *t_p2p;
static __thread size_t t_np2p, t_cap;
static __thread int t_group_error;

static void once(void) {
  const char *e = getenv("FAKE_NCCL_ASYNC_FAIL_AT");
  if (e && *e) g_fail_at = atol(e);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t inprogress_ns(void) {
  const char *e = getenv("FAKE_NCCL_INPROGRESS_US");
  long v = e ? atol(e) : 300;
  return (uint64_t)(v < 0 ? 0 : v) * 1000u;
}

static int set_error(int r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int set_error(int r, const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&g_lock);
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&g_lock);
  return r;
}

static void make_busy(comm_t *c) {
  if (!c->blocking) c->busy_until_ns = now_ns() + inprogress_ns();
}

/* What a call on a nonblocking comm answers: in progress for a while. */
static int launched(comm_t *c) {
  if (c->blocking) return R_SUCCESS;
  make_busy(c);
  return R_IN_PROGRESS;
}

static size_t type_size(int dt) {
  switch (dt) {
  case T_INT8: case T_UINT8: return 1;
  case T_FLOAT16: case T_BFLOAT16: return 2;
  case T_INT32: case T_UINT32: case T_FLOAT32: return 4;
  case T_INT64: case T_UINT64: case T_FLOAT64: return 8;
  }
  return 0;
}

/* ---- half and bfloat16 ------------------------------------------------ */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f,
           m = h & 0x3ff, u;
  float f;
  if (e == 0) {
    f = (float)m / 16777216.0f; /* 2^-24 */
    return sign ? -f : f;
  }
  if (e == 31) u = sign | 0x7f800000 | (m << 13);
  else u = sign | ((e - 15 + 127) << 23) | (m << 13);
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t float_to_half(float x) {
  uint32_t u, m;
  uint16_t sign, h;
  int32_t e;
  memcpy(&u, &x, 4);
  sign = (uint16_t)((u >> 16) & 0x8000);
  e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  m = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return sign | 0x7c00 | (m ? 0x200 : 0);
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    m |= 0x800000;
    {
      uint32_t shift = (uint32_t)(14 - e), hm = m >> shift,
               rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
      if (rem > half || (rem == half && (hm & 1))) hm++;
      return sign | (uint16_t)hm;
    }
  }
  h = sign | (uint16_t)(e << 10) | (uint16_t)(m >> 13);
  if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) h++;
  return h;
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t float_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static double scalar_from(const void *p, int dt) {
  switch (dt) {
  case T_INT8: return *(const int8_t *)p;
  case T_UINT8: return *(const uint8_t *)p;
  case T_INT32: return *(const int32_t *)p;
  case T_UINT32: return *(const uint32_t *)p;
  case T_INT64: return (double)*(const int64_t *)p;
  case T_UINT64: return (double)*(const uint64_t *)p;
  case T_FLOAT16: return half_to_float(*(const uint16_t *)p);
  case T_BFLOAT16: return bf16_to_float(*(const uint16_t *)p);
  case T_FLOAT32: return *(const float *)p;
  case T_FLOAT64: return *(const double *)p;
  }
  return 0;
}

/* ---- stream work ---------------------------------------------------------- */

typedef struct {
  void *dst;
  const void *src;
  size_t count;
  int dtype;
  int scale; /* multiply by scalar (PreMulSum) */
  double scalar;
} job_t;

static void run_job(void *arg) {
  job_t *j = arg;
  size_t i, es = type_size(j->dtype);
  if (j->dst != j->src) memmove(j->dst, j->src, j->count * es);
  if (j->scale) {
    for (i = 0; i < j->count; i++) {
      char *p = (char *)j->dst + i * es;
      switch (j->dtype) {
      case T_INT8: *(int8_t *)p = (int8_t)(*(int8_t *)p * j->scalar); break;
      case T_UINT8: *(uint8_t *)p = (uint8_t)(*(uint8_t *)p * j->scalar); break;
      case T_INT32: *(int32_t *)p = (int32_t)(*(int32_t *)p * j->scalar); break;
      case T_UINT32: *(uint32_t *)p = (uint32_t)(*(uint32_t *)p * j->scalar); break;
      case T_INT64: *(int64_t *)p = (int64_t)(*(int64_t *)p * j->scalar); break;
      case T_UINT64: *(uint64_t *)p = (uint64_t)(*(uint64_t *)p * j->scalar); break;
      case T_FLOAT16:
        *(uint16_t *)p = float_to_half(half_to_float(*(uint16_t *)p) *
                                       (float)j->scalar);
        break;
      case T_BFLOAT16:
        *(uint16_t *)p = float_to_bf16(bf16_to_float(*(uint16_t *)p) *
                                       (float)j->scalar);
        break;
      case T_FLOAT32: *(float *)p = (float)(*(float *)p * (float)j->scalar); break;
      case T_FLOAT64: *(double *)p *= j->scalar; break;
      }
    }
  }
  free(j);
}

static int enqueue_copy(void *stream, void *dst, const void *src,
                        size_t count, int dtype, int scale, double scalar) {
  job_t *j = calloc(1, sizeof(*j));
  int r;
  if (!j) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  j->dst = dst;
  j->src = src;
  j->count = count;
  j->dtype = dtype;
  j->scale = scale;
  j->scalar = scalar;
  r = fake_cuda_enqueue(stream, run_job, j);
  if (r != 0) {
    free(j);
    return set_error(R_UNHANDLED_CUDA, "fake NCCL: enqueue on stream failed "
                     "(cuda error %d)", r);
  }
  return R_SUCCESS;
}

/* ---- checks ------------------------------------------------------------------ */

static int check_comm(comm_t *c, const char *fn) {
  if (c == NULL)
    return set_error(R_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (c->destroyed)
    return set_error(R_INVALID_USAGE, "%s: comm was destroyed", fn);
  if (c->aborted)
    return set_error(R_INVALID_USAGE, "%s: comm was aborted", fn);
  if (!c->blocking && now_ns() < c->busy_until_ns)
    return set_error(R_INVALID_USAGE, "%s: called while the nonblocking "
                     "comm is still in progress (poll "
                     "ncclCommGetAsyncError first)", fn);
  return R_SUCCESS;
}

static int check_args(comm_t *c, const char *fn, int dt, size_t count,
                      const void *a, const void *b) {
  int r = check_comm(c, fn);
  if (r) return r;
  if (dt < 0 || dt >= T_COUNT)
    return set_error(R_INVALID_ARGUMENT, "%s: invalid datatype %d", fn, dt);
  if (count > 0 && (a == NULL || b == NULL))
    return set_error(R_INVALID_ARGUMENT, "%s: NULL buffer", fn);
  if (count > 0 && (fake_cuda_ptr_device(a) < 0 || fake_cuda_ptr_device(b) < 0))
    return set_error(R_INVALID_ARGUMENT, "%s: buffer is not device memory",
                     fn);
  return R_SUCCESS;
}

/* An injected asynchronous failure: the stream hangs until abort. An
 * injected block: the stream waits for the test's flag first (the op has
 * started on the GPU, and hangs there). */
static int maybe_fail_async(comm_t *c, void *stream) {
  int fail;
  volatile uint32_t *block;
  pthread_once(&g_once, once);
  pthread_mutex_lock(&g_lock);
  g_calls++;
  fail = g_fail_next || g_calls == g_fail_at;
  g_fail_next = 0;
  block = g_block_flag;
  g_block_flag = NULL;
  pthread_mutex_unlock(&g_lock);
  if (block != NULL) fake_cuda_stream_wait_flag(stream, block);
  if (!fail) return 0;
  set_error(R_REMOTE, "fake NCCL: injected asynchronous failure (a peer "
            "went away)");
  c->async_error = R_REMOTE;
  fake_cuda_stream_wait_flag(stream, &c->release);
  return 1;
}

/* The end of a collective call: alone, it is launched now; in a group,
 * at ncclGroupEnd. */
static int coll_done(comm_t *c) {
  if (t_depth > 0) {
    t_group_comm = c;
    return R_SUCCESS;
  }
  return launched(c);
}

static int reduce_op(comm_t *c, const char *fn, int op, int dt, int *scale,
                     double *scalar) {
  *scale = 0;
  *scalar = 1;
  if (op >= 0 && op < OP_BUILTIN) return R_SUCCESS; /* one rank: a copy */
  if (op >= OP_BUILTIN && op < OP_BUILTIN + MAX_PREMUL &&
      c->premul[op - OP_BUILTIN].used) {
    if (c->premul[op - OP_BUILTIN].dtype != dt)
      return set_error(R_INVALID_ARGUMENT, "%s: PreMulSum op made for "
                       "datatype %d used with %d", fn,
                       c->premul[op - OP_BUILTIN].dtype, dt);
    *scale = 1;
    *scalar = c->premul[op - OP_BUILTIN].scalar;
    return R_SUCCESS;
  }
  return set_error(R_INVALID_ARGUMENT, "%s: invalid reduction op %d", fn, op);
}

static int one_rank_coll(const char *fn, const void *send, void *recv,
                         size_t count, int dt, int op, int root, void *comm,
                         void *stream) {
  comm_t *c = comm;
  int r = check_args(c, fn, dt, count, send, recv), scale;
  double scalar;
  if (r) return r;
  if (root != 0)
    return set_error(R_INVALID_ARGUMENT, "%s: invalid root %d (nranks 1)",
                     fn, root);
  if (op >= 0 && (r = reduce_op(c, fn, op, dt, &scale, &scalar)) != 0)
    return r;
  if (op < 0) scale = 0, scalar = 1;
  if (maybe_fail_async(c, stream)) return coll_done(c);
  if (count > 0 &&
      (r = enqueue_copy(stream, recv, send, count, dt, scale, scalar)) != 0)
    return r;
  return coll_done(c);
}

/* ---- API ---------------------------------------------------------------------- */

EXPORT int ncclGetVersion(int *v) {
  if (!v) return R_INVALID_ARGUMENT;
  *v = 22809;
  return R_SUCCESS;
}

EXPORT int ncclGetUniqueId(unique_id_t *id) {
  static unsigned counter;
  if (!id) return R_INVALID_ARGUMENT;
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "fake-nccl-id-%d-%u",
           (int)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST));
  return R_SUCCESS;
}

EXPORT const char *ncclGetErrorString(int r) {
  switch (r) {
  case R_SUCCESS: return "no error";
  case R_UNHANDLED_CUDA: return "unhandled cuda error";
  case R_SYSTEM: return "unhandled system error";
  case R_INTERNAL: return "internal error";
  case R_INVALID_ARGUMENT: return "invalid argument";
  case R_INVALID_USAGE: return "invalid usage";
  case R_REMOTE: return "remote process exited or there was a network error";
  case R_IN_PROGRESS: return "NCCL operation in progress";
  }
  return "unknown result code";
}

EXPORT const char *ncclGetLastError(void *comm) {
  (void)comm;
  return g_last_error; /* not cleared, as NCCL's */
}

static comm_t *comm_new(int blocking) {
  comm_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->blocking = blocking;
  c->nranks = 1;
  c->device = fake_cuda_current_device();
  pthread_mutex_lock(&g_lock);
  c->next = g_comms;
  g_comms = c;
  pthread_mutex_unlock(&g_lock);
  return c;
}

static int config_blocking(const config_head_t *cfg, int dflt) {
  const char *e = getenv("NCCL_COMM_BLOCKING");
  if (e && *e) return atoi(e) != 0;
  if (cfg && cfg->blocking != INT_MIN) return cfg->blocking != 0;
  return dflt;
}

EXPORT int ncclCommInitRankConfig(void **comm, int nranks, unique_id_t id,
                                  int rank, config_head_t *cfg) {
  comm_t *c;
  (void)id;
  if (!comm) return set_error(R_INVALID_ARGUMENT, "comm is NULL");
  *comm = NULL;
  if (cfg && (cfg->magic != 0xcafebeef || cfg->size < sizeof(*cfg)))
    return set_error(R_INVALID_ARGUMENT, "ncclCommInitRankConfig: config "
                     "not initialized with NCCL_CONFIG_INITIALIZER");
  if (nranks != 1)
    return set_error(R_INVALID_USAGE, "fake NCCL: only one-rank "
                     "communicators are supported (nranks=%d)", nranks);
  if (rank != 0)
    return set_error(R_INVALID_ARGUMENT, "invalid rank %d (nranks 1)", rank);
  c = comm_new(config_blocking(cfg, 1));
  if (!c) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  *comm = c;
  return launched(c);
}

EXPORT int ncclCommInitRank(void **comm, int nranks, unique_id_t id,
                            int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

EXPORT int ncclCommGetAsyncError(void *comm, int *err) {
  comm_t *c = comm;
  if (!c || !err) return R_INVALID_ARGUMENT;
  if (c->async_error) *err = c->async_error;
  else if (!c->blocking && now_ns() < c->busy_until_ns) *err = R_IN_PROGRESS;
  else *err = R_SUCCESS;
  return R_SUCCESS;
}

EXPORT int ncclCommFinalize(void *comm) {
  comm_t *c = comm;
  int r = check_comm(c, "ncclCommFinalize");
  if (r) return r;
  c->finalized = 1;
  return launched(c);
}

EXPORT int ncclCommDestroy(void *comm) {
  comm_t *c = comm;
  if (!c) return R_SUCCESS;
  c->destroyed = 1;
  c->release = 1; /* nothing may hang on a destroyed comm */
  return R_SUCCESS;
}

EXPORT int ncclCommAbort(void *comm) {
  comm_t *c = comm;
  if (!c) return R_SUCCESS;
  c->aborted = 1;
  c->destroyed = 1;
  __atomic_store_n(&c->release, 1, __ATOMIC_SEQ_CST); /* unblocks a hang */
  return R_SUCCESS;
}

EXPORT int ncclCommSplit(void *comm, int color, int key, void **newcomm,
                         config_head_t *cfg) {
  comm_t *c = comm, *n;
  int r = check_comm(c, "ncclCommSplit");
  (void)key;
  if (r) return r;
  if (!newcomm) return set_error(R_INVALID_ARGUMENT, "newcomm is NULL");
  *newcomm = NULL;
  if (color < -1)
    return set_error(R_INVALID_ARGUMENT, "ncclCommSplit: invalid color %d",
                     color);
  if (color != -1) { /* NCCL_SPLIT_NOCOLOR: no communicator */
    n = comm_new(config_blocking(cfg, c->blocking));
    if (!n) return set_error(R_SYSTEM, "fake NCCL: out of memory");
    *newcomm = n;
    make_busy(n);
  }
  return launched(c);
}

EXPORT int ncclCommCount(const void *comm, int *count) {
  if (!comm || !count) return R_INVALID_ARGUMENT;
  *count = ((const comm_t *)comm)->nranks;
  return R_SUCCESS;
}

EXPORT int ncclCommUserRank(const void *comm, int *rank) {
  if (!comm || !rank) return R_INVALID_ARGUMENT;
  *rank = ((const comm_t *)comm)->rank;
  return R_SUCCESS;
}

EXPORT int ncclCommCuDevice(const void *comm, int *dev) {
  if (!comm || !dev) return R_INVALID_ARGUMENT;
  *dev = ((const comm_t *)comm)->device;
  return R_SUCCESS;
}

EXPORT int ncclRedOpCreatePreMulSum(int *op, void *scalar, int dt,
                                    int residence, void *comm) {
  comm_t *c = comm;
  int r = check_comm(c, "ncclRedOpCreatePreMulSum"), i;
  if (r) return r;
  if (!op || !scalar || dt < 0 || dt >= T_COUNT || residence != 1)
    return set_error(R_INVALID_ARGUMENT, "ncclRedOpCreatePreMulSum: bad "
                     "argument (the fake supports ncclScalarHostImmediate)");
  for (i = 0; i < MAX_PREMUL; i++)
    if (!c->premul[i].used) {
      c->premul[i].used = 1;
      c->premul[i].dtype = dt;
      c->premul[i].scalar = scalar_from(scalar, dt);
      *op = OP_BUILTIN + i;
      return R_SUCCESS;
    }
  return set_error(R_INTERNAL, "fake NCCL: too many PreMulSum ops");
}

EXPORT int ncclRedOpDestroy(int op, void *comm) {
  comm_t *c = comm;
  if (!c || op < OP_BUILTIN || op >= OP_BUILTIN + MAX_PREMUL ||
      !c->premul[op - OP_BUILTIN].used)
    return set_error(R_INVALID_ARGUMENT, "ncclRedOpDestroy: op %d was not "
                     "created on this comm", op);
  c->premul[op - OP_BUILTIN].used = 0;
  return R_SUCCESS;
}

EXPORT int ncclAllReduce(const void *send, void *recv, size_t count, int dt,
                         int op, void *comm, void *stream) {
  return one_rank_coll("ncclAllReduce", send, recv, count, dt, op, 0, comm,
                       stream);
}

EXPORT int ncclBroadcast(const void *send, void *recv, size_t count, int dt,
                         int root, void *comm, void *stream) {
  return one_rank_coll("ncclBroadcast", send, recv, count, dt, -1, root,
                       comm, stream);
}

EXPORT int ncclReduce(const void *send, void *recv, size_t count, int dt,
                      int op, int root, void *comm, void *stream) {
  return one_rank_coll("ncclReduce", send, recv, count, dt, op, root, comm,
                       stream);
}

EXPORT int ncclAllGather(const void *send, void *recv, size_t count, int dt,
                         void *comm, void *stream) {
  return one_rank_coll("ncclAllGather", send, recv, count, dt, -1, 0, comm,
                       stream);
}

EXPORT int ncclReduceScatter(const void *send, void *recv, size_t count,
                             int dt, int op, void *comm, void *stream) {
  return one_rank_coll("ncclReduceScatter", send, recv, count, dt, op, 0,
                       comm, stream);
}

static int p2p_add(int is_send, const char *fn, const void *sbuf, void *rbuf,
                   size_t count, int dt, int peer, void *comm,
                   void *stream) {
  comm_t *c = comm;
  const void *buf = is_send ? sbuf : rbuf;
  int r = check_args(c, fn, dt, count, buf, buf);
  if (r) return r;
  if (peer != 0)
    return set_error(R_INVALID_ARGUMENT, "%s: invalid peer %d (nranks 1)", fn,
                     peer);
  if (t_depth == 0)
    return set_error(R_INVALID_USAGE, "%s: Trying to %s self without a "
                     "matching %s (outside a group)", fn,
                     is_send ? "send to" : "recv from",
                     is_send ? "recv" : "send");
  if (t_np2p == t_cap) {
    size_t cap = t_cap ? 2 * t_cap : 16;
    p2p_t *n = cap <= MAX_P2P ? realloc(t_p2p, cap * sizeof(*n)) : NULL;
    if (!n) return set_error(R_SYSTEM, "fake NCCL: too many p2p ops");
    t_p2p = n;
    t_cap = cap;
  }
  t_p2p[t_np2p++] = (p2p_t){is_send, c, sbuf, rbuf, count * type_size(dt),
                            stream};
  t_group_comm = c;
  return R_SUCCESS;
}

EXPORT int ncclSend(const void *buf, size_t count, int dt, int peer,
                    void *comm, void *stream) {
  return p2p_add(1, "ncclSend", buf, NULL, count, dt, peer, comm, stream);
}

EXPORT int ncclRecv(void *buf, size_t count, int dt, int peer, void *comm,
                    void *stream) {
  return p2p_add(0, "ncclRecv", NULL, buf, count, dt, peer, comm, stream);
}

EXPORT int ncclGroupStart(void) {
  t_depth++;
  return R_SUCCESS;
}

/* Matches the group's sends to self with its receives, in order. */
static int group_p2p(void) {
  size_t i, j = 0;
  int r = R_SUCCESS;
  for (i = 0; i < t_np2p && r == R_SUCCESS; i++) {
    if (!t_p2p[i].send) continue;
    while (j < t_np2p && t_p2p[j].send) j++;
    if (j == t_np2p) {
      r = set_error(R_INVALID_USAGE, "ncclSend: Trying to send to self "
                    "without a matching recv");
      break;
    }
    if (t_p2p[j].bytes != t_p2p[i].bytes) {
      r = set_error(R_INVALID_USAGE, "fake NCCL: send of %zu bytes matched "
                    "with a recv of %zu bytes", t_p2p[i].bytes,
                    t_p2p[j].bytes);
      break;
    }
    if (t_p2p[i].bytes > 0 && !maybe_fail_async(t_p2p[j].comm,
                                                 t_p2p[j].stream))
      r = enqueue_copy(t_p2p[j].stream, t_p2p[j].rbuf, t_p2p[i].sbuf,
                       t_p2p[i].bytes, T_UINT8, 0, 1);
    j++;
  }
  if (r == R_SUCCESS) {
    for (; j < t_np2p; j++)
      if (!t_p2p[j].send) {
        r = set_error(R_INVALID_USAGE, "ncclRecv: Trying to recv from self "
                      "without a matching send");
        break;
      }
  }
  t_np2p = 0;
  return r;
}

EXPORT int ncclGroupEnd(void) {
  comm_t *c;
  int r;
  if (t_depth == 0)
    return set_error(R_INVALID_USAGE, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return R_SUCCESS;
  r = group_p2p();
  c = t_group_comm;
  t_group_comm = NULL;
  if (t_group_error) {
    r = t_group_error;
    t_group_error = 0;
  }
  if (r != R_SUCCESS || c == NULL) return r;
  return launched(c);
}

/* ---- test hooks ------------------------------------------------------------------ */

/* The next collective or grouped send/recv fails asynchronously. */
EXPORT void fake_nccl_fail_next_async(void) {
  pthread_mutex_lock(&g_lock);
  g_fail_next = 1;
  pthread_mutex_unlock(&g_lock);
}

/* The next collective or grouped send/recv waits on the GPU (after it
 * started) until *flag != 0. */
EXPORT void fake_nccl_block_next(volatile uint32_t *flag) {
  pthread_mutex_lock(&g_lock);
  g_block_flag = flag;
  pthread_mutex_unlock(&g_lock);
}

/* Communicators alive (made, neither destroyed nor aborted). */
EXPORT int fake_nccl_live_comms(void) {
  comm_t *c;
  int n = 0;
  pthread_mutex_lock(&g_lock);
  for (c = g_comms; c; c = c->next)
    if (!c->destroyed) n++;
  pthread_mutex_unlock(&g_lock);
  return n;
}
