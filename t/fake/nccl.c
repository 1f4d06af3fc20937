/* A fake NCCL for tests on machines without a GPU: built into
 * $(BUILD)/fake/libnccl.so.2 (linked against the fake cudart) and
 * selected with UVCCL_NCCL. It exports the nccl* functions uvccl loads,
 * with real semantics for communicators of one rank (every collective is
 * a copy, or a scaled copy for PreMulSum, run on the fake GPU in stream
 * order through fake_cuda_enqueue; send/recv to self only inside a group
 * with the matching recv, as NCCL) and of several ranks IN ONE PROCESS,
 * each rank on its own fake device (see "Multi-rank communicators" below:
 * ranks meet in a shared "clique", and each collective is a piece on
 * every rank's stream that waits for its peers' pieces, as a kernel).
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
  int revoked;               /* ncclCommRevoke: in-flight ops end, later
                                collectives are refused */
  volatile uint32_t release; /* set by abort: ends an injected hang */
  /* Several ranks (nranks > 1): under g_lock. */
  struct clique_s *clique;  /* the ranks' shared state (NULL: one rank) */
  int split_busy;           /* a split of this comm waits for its peers */
  int child_pending;        /* made by a split its peers have not all
                               called yet: rank and size still unknown */
  uint64_t ncoll;           /* collectives called: the n-th of each rank
                               meets the n-th of the others, as NCCL */
  uint64_t nsplit;          /* splits called, matched the same way */
  uint64_t *nsend, *nrecv;  /* per peer: p2p matched in call order */
  unique_id_t grow_id;      /* ncclCommGetUniqueId's, until its grow */
  int grow_issued;
  struct {
    int used;
    int dtype;
    double scalar;
  } premul[MAX_PREMUL];
} comm_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast under g_lock whenever a clique changes (a rank joined, a
 * piece arrived or finished, a comm was aborted): every waiter rechecks. */
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static comm_t *g_comms;
static char g_last_error[512];
static int g_fail_next;
static volatile uint32_t *g_block_flag;
static long g_fail_at = -1, g_calls;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_grown; /* ncclCommGrow's comms (fake_nccl_grown_comms) */

/* the group being built on this thread */
typedef struct {
  int send; /* 1 send, 0 recv */
  int peer;
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

static int comm_pending(comm_t *c);

/* ---- checks ------------------------------------------------------------------ */

static int check_comm(comm_t *c, const char *fn) {
  if (c == NULL)
    return set_error(R_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (c->destroyed)
    return set_error(R_INVALID_USAGE, "%s: comm was destroyed", fn);
  if (c->aborted)
    return set_error(R_INVALID_USAGE, "%s: comm was aborted", fn);
  if (c->revoked)
    return set_error(R_INVALID_USAGE, "%s: comm was revoked", fn);
  if (comm_pending(c))
    return set_error(R_INVALID_USAGE, "%s: called while the comm is still "
                     "being made (its peers have not all joined)", fn);
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

static int multi_coll(int kind, const char *fn, const void *send, void *recv,
                      size_t count, int dt, int op, int root, void *comm,
                      void *stream);

/* One rank: a copy. Several: a piece that meets its peers (multi_coll). */
static int coll(int kind, const char *fn, const void *send, void *recv,
                size_t count, int dt, int op, int root, void *comm,
                void *stream);

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

/* ---- Multi-rank communicators ------------------------------------------
 *
 * All ranks live in this process, each on its own fake device and so on
 * its own uvccl device thread and streams. Ranks that init with the same
 * unique id join one clique (a registry keyed by the id bytes). A call
 * never blocks its host thread (uvccl's device thread must keep polling):
 * a collective enqueues a piece on the caller's stream, and that piece,
 * running on the fake GPU, waits for the same collective's pieces of the
 * other ranks, then the last to arrive computes every rank's result, as
 * one kernel spread over the GPUs. A peer that never comes keeps the
 * stream blocked, as a hung NCCL kernel; abort (or destroy) of the
 * waiting rank's comm makes its piece give up. Everything below is under
 * g_lock; waiters sleep on g_cond. */

enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCE_SCATTER };
static const char *const kind_names[] = {"ncclAllReduce", "ncclBroadcast",
                                         "ncclReduce", "ncclAllGather",
                                         "ncclReduceScatter"};

typedef struct piece_s {
  comm_t *comm;
  struct clique_s *q; /* held (a reference) until the piece ran */
  int kind, dtype, op; /* op: OP_SUM..OP_AVG (PreMulSum: SUM, scaled) */
  int root, scale;
  double scalar;       /* PreMulSum: this rank's factor */
  const void *send;
  void *recv;
  size_t count;
  uint64_t seq;
} piece_t;

/* One collective being met: the n-th of every rank. */
typedef struct rdv_s {
  struct rdv_s *next;
  uint64_t seq;
  int arrived, left, done;
  piece_t **pieces; /* by rank */
} rdv_t;

/* One send/recv pair being met: the seq-th from src to dst. */
typedef struct mbox_s {
  struct mbox_s *next;
  int src, dst;
  uint64_t seq;
  const void *sbuf;
  void *rbuf;
  size_t sbytes, rbytes;
  int have_send, have_recv, done;
} mbox_t;

/* One split being met: the n-th of every parent rank. */
typedef struct split_s {
  struct split_s *next;
  uint64_t seq;
  int arrived;
  int *color, *key;
  comm_t **child; /* by parent rank; NULL: NOCOLOR */
} split_t;

typedef struct clique_s {
  struct clique_s *next;
  unique_id_t id;
  int nranks, joined;
  int refs;        /* comms not destroyed + pieces on a stream: freed at 0 */
  comm_t **comms;  /* by rank */
  rdv_t *rdvs;
  mbox_t *mboxes;
  split_t *splits;
  /* ncclCommGrow of this clique: its members that called before the root
   * (by rank, waiting for the id), and the id once the root called */
  comm_t **grow_wait;
  int grow_open, grow_nranks, grow_arrived;
  unique_id_t grow_target;
} clique_t;

static clique_t *g_cliques;
static comm_t *comm_new(int blocking);

static clique_t *clique_new_locked(const unique_id_t *id, int nranks) {
  clique_t *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  q->comms = calloc((size_t)nranks, sizeof(*q->comms));
  if (!q->comms) {
    free(q);
    return NULL;
  }
  q->id = *id;
  q->nranks = nranks;
  q->next = g_cliques;
  g_cliques = q;
  return q;
}

static void clique_unref_locked(clique_t *q) {
  clique_t **pp;
  if (--q->refs > 0) return;
  for (pp = &g_cliques; *pp; pp = &(*pp)->next)
    if (*pp == q) {
      *pp = q->next;
      break;
    }
  /* what hung rendezvous left behind (their pieces gave up) */
  while (q->rdvs) {
    rdv_t *r = q->rdvs;
    q->rdvs = r->next;
    free(r->pieces);
    free(r);
  }
  while (q->mboxes) {
    mbox_t *m = q->mboxes;
    q->mboxes = m->next;
    free(m);
  }
  while (q->splits) {
    split_t *sp = q->splits;
    q->splits = sp->next;
    free(sp->color);
    free(sp->key);
    free(sp->child);
    free(sp);
  }
  free(q->grow_wait);
  free(q->comms);
  free(q);
}

/* A comm's place in its clique: counters for p2p matching. */
static int comm_place_locked(comm_t *c, clique_t *q, int rank) {
  c->nsend = calloc((size_t)q->nranks, sizeof(*c->nsend));
  c->nrecv = calloc((size_t)q->nranks, sizeof(*c->nrecv));
  if (!c->nsend || !c->nrecv) return -1;
  c->rank = rank;
  c->nranks = q->nranks;
  q->comms[rank] = c; /* comms are never freed: the pointer stays valid */
  q->joined++;
  if (!c->destroyed) { /* a child destroyed while its split was pending */
    c->clique = q;
    q->refs++;
  }
  return 0;
}

/* Once every rank joined: as NCCL, two ranks on one device are refused
 * (every comm of the clique reports it through ncclCommGetAsyncError). */
static void clique_check_devices_locked(clique_t *q) {
  int i, j;
  for (i = 0; i < q->nranks; i++)
    for (j = 0; j < i; j++)
      if (q->comms[i]->device == q->comms[j]->device) {
        snprintf(g_last_error, sizeof(g_last_error), "Duplicate GPU "
                 "detected : rank %d and rank %d both on CUDA device %d", j,
                 i, q->comms[i]->device);
        for (i = 0; i < q->nranks; i++)
          q->comms[i]->async_error = R_INVALID_USAGE;
        return;
      }
}

/* Whether a multi-rank comm is still being made (init or split). */
static int comm_pending_locked(const comm_t *c) {
  if (c->child_pending || c->split_busy) return 1;
  return c->clique != NULL && c->clique->joined < c->clique->nranks;
}

static int comm_pending(comm_t *c) {
  int r;
  pthread_mutex_lock(&g_lock);
  r = comm_pending_locked(c);
  pthread_mutex_unlock(&g_lock);
  return r;
}

/* ---- reductions: floats accumulate in float (double for float64),
 * integers in 64 bits, wrapping as the type does. */

static int nccl_dtype_is_float(int dt) {
  return dt == T_FLOAT16 || dt == T_BFLOAT16 || dt == T_FLOAT32 ||
         dt == T_FLOAT64;
}
static int is_signed(int dt) {
  return dt == T_INT8 || dt == T_INT32 || dt == T_INT64;
}

static double load_f(const void *b, size_t i, int dt) {
  const char *p = (const char *)b + i * type_size(dt);
  return scalar_from(p, dt);
}

static void store_f(void *b, size_t i, int dt, double v) {
  char *p = (char *)b + i * type_size(dt);
  switch (dt) {
  case T_FLOAT16: *(uint16_t *)p = float_to_half((float)v); break;
  case T_BFLOAT16: *(uint16_t *)p = float_to_bf16((float)v); break;
  case T_FLOAT32: *(float *)p = (float)v; break;
  case T_FLOAT64: *(double *)p = v; break;
  }
}

static uint64_t load_u(const void *b, size_t i, int dt) {
  const char *p = (const char *)b + i * type_size(dt);
  switch (dt) {
  case T_INT8: return (uint64_t)(int64_t)*(const int8_t *)p;
  case T_UINT8: return *(const uint8_t *)p;
  case T_INT32: return (uint64_t)(int64_t)*(const int32_t *)p;
  case T_UINT32: return *(const uint32_t *)p;
  case T_INT64: return (uint64_t)*(const int64_t *)p;
  case T_UINT64: return *(const uint64_t *)p;
  }
  return 0;
}

static void store_u(void *b, size_t i, int dt, uint64_t v) {
  char *p = (char *)b + i * type_size(dt);
  switch (dt) {
  case T_INT8: case T_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case T_INT32: case T_UINT32: *(uint32_t *)p = (uint32_t)v; break;
  case T_INT64: case T_UINT64: *(uint64_t *)p = v; break;
  }
}

/* out[i] = op over ranks of piece r's send[off + i], for n elements. */
static void reduce_pieces(piece_t **p, int nranks, size_t off, size_t n,
                          void *out) {
  int dt = p[0]->dtype, op = p[0]->op, r;
  size_t i;
  for (i = 0; i < n; i++) {
    if (nccl_dtype_is_float(dt)) {
      double acc = 0, x;
      for (r = 0; r < nranks; r++) {
        x = load_f(p[r]->send, off + i, dt);
        if (p[r]->scale) x *= p[r]->scalar;
        if (dt != T_FLOAT64) x = (float)x;
        if (r == 0) acc = x;
        else if (op == OP_PROD) acc *= x;
        else if (op == OP_MAX) acc = x > acc ? x : acc;
        else if (op == OP_MIN) acc = x < acc ? x : acc;
        else acc += x; /* SUM, AVG, PreMulSum */
        if (dt != T_FLOAT64) acc = (float)acc; /* float accumulation */
      }
      if (op == OP_AVG) acc /= nranks;
      store_f(out, i, dt, acc);
    } else {
      uint64_t acc = 0, x;
      for (r = 0; r < nranks; r++) {
        x = load_u(p[r]->send, off + i, dt);
        if (p[r]->scale)
          x = is_signed(dt) ? (uint64_t)(int64_t)((double)(int64_t)x *
                                                  p[r]->scalar)
                            : (uint64_t)((double)x * p[r]->scalar);
        if (r == 0) acc = x;
        else if (op == OP_PROD) acc *= x;
        else if (op == OP_MAX)
          acc = (is_signed(dt) ? (int64_t)x > (int64_t)acc : x > acc) ? x
                                                                     : acc;
        else if (op == OP_MIN)
          acc = (is_signed(dt) ? (int64_t)x < (int64_t)acc : x < acc) ? x
                                                                     : acc;
        else acc += x;
      }
      if (op == OP_AVG)
        acc = is_signed(dt) ? (uint64_t)((int64_t)acc / nranks)
                            : acc / (uint64_t)nranks;
      store_u(out, i, dt, acc);
    }
  }
}

/* Run by the last piece to arrive: every rank's result. The inputs are
 * read into a temporary first, so in-place calls work. */
static void rdv_compute_locked(rdv_t *r, int nranks) {
  piece_t **p = r->pieces, *p0 = p[0];
  size_t es = type_size(p0->dtype), n = p0->count, total;
  char *tmp;
  int i;
  for (i = 1; i < nranks; i++)
    if (p[i]->kind != p0->kind || p[i]->count != n ||
        p[i]->dtype != p0->dtype || p[i]->root != p0->root ||
        (p0->kind != K_BROADCAST && p0->kind != K_ALLGATHER &&
         p[i]->op != p0->op)) {
      /* Real NCCL would compute garbage or hang; say it loudly. */
      snprintf(g_last_error, sizeof(g_last_error), "fake NCCL: collective "
               "#%llu differs between ranks: rank 0 %s count %zu dtype %d "
               "op %d root %d, rank %d %s count %zu dtype %d op %d root %d",
               (unsigned long long)r->seq, kind_names[p0->kind], n,
               p0->dtype, p0->op, p0->root, i, kind_names[p[i]->kind],
               p[i]->count, p[i]->dtype, p[i]->op, p[i]->root);
      fprintf(stderr, "%s\n", g_last_error);
      for (i = 0; i < nranks; i++) p[i]->comm->async_error = R_INVALID_USAGE;
      return;
    }
  total = p0->kind == K_ALLGATHER || p0->kind == K_REDUCE_SCATTER
              ? n * (size_t)nranks : n;
  tmp = malloc(total * es + 1);
  if (!tmp) abort(); /* a test double: no way to report it */
  switch (p0->kind) {
  case K_ALLREDUCE:
  case K_REDUCE:
  case K_REDUCE_SCATTER:
    reduce_pieces(p, nranks, 0, total, tmp);
    break;
  case K_BROADCAST:
    memcpy(tmp, p[p0->root]->send, n * es);
    break;
  case K_ALLGATHER:
    for (i = 0; i < nranks; i++)
      memcpy(tmp + (size_t)i * n * es, p[i]->send, n * es);
    break;
  }
  for (i = 0; i < nranks; i++) {
    if (p0->kind == K_REDUCE && i != p0->root) continue;
    if (p0->kind == K_REDUCE_SCATTER)
      memcpy(p[i]->recv, tmp + (size_t)i * n * es, n * es);
    else
      memcpy(p[i]->recv, tmp, total * es);
  }
  free(tmp);
}

/* On the fake GPU: meet the peers, then the result is in every buffer. */
static void run_piece(void *arg) {
  piece_t *p = arg;
  comm_t *c = p->comm;
  clique_t *q = p->q;
  rdv_t *r, **pp;
  pthread_mutex_lock(&g_lock);
  for (r = q->rdvs; r && r->seq != p->seq; r = r->next) {}
  if (!r) {
    r = calloc(1, sizeof(*r));
    if (r) r->pieces = calloc((size_t)q->nranks, sizeof(*r->pieces));
    if (!r || !r->pieces) abort();
    r->seq = p->seq;
    r->next = q->rdvs;
    q->rdvs = r;
  }
  r->pieces[c->rank] = p;
  if (++r->arrived == q->nranks) {
    rdv_compute_locked(r, q->nranks);
    r->done = 1;
    pthread_cond_broadcast(&g_cond);
  }
  while (!r->done && !c->destroyed && !c->revoked)
    pthread_cond_wait(&g_cond, &g_lock);
  if (r->done) r->left++;
  else { /* aborted: give up, as the kernel NCCL's abort stops */
    r->pieces[c->rank] = NULL;
    r->arrived--;
  }
  if ((r->done && r->left == q->nranks) || (!r->done && r->arrived == 0)) {
    for (pp = &q->rdvs; *pp != r; pp = &(*pp)->next) {}
    *pp = r->next;
    free(r->pieces);
    free(r);
  }
  clique_unref_locked(q);
  pthread_mutex_unlock(&g_lock);
  free(p);
}

static int multi_coll(int kind, const char *fn, const void *send, void *recv,
                      size_t count, int dt, int op, int root, void *comm,
                      void *stream) {
  comm_t *c = comm;
  piece_t *p;
  int r = check_args(c, fn, dt, count, send, recv), scale = 0, rc;
  double scalar = 1;
  if (r) return r;
  if (root < 0 || root >= c->nranks)
    return set_error(R_INVALID_ARGUMENT, "%s: invalid root %d (nranks %d)",
                     fn, root, c->nranks);
  if (op >= 0 && (r = reduce_op(c, fn, op, dt, &scale, &scalar)) != 0)
    return r;
  p = calloc(1, sizeof(*p));
  if (!p) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  *p = (piece_t){c, NULL, kind, dt, scale ? OP_SUM : op < 0 ? OP_SUM : op,
                 root, scale, scalar, send, recv, count, 0};
  pthread_mutex_lock(&g_lock);
  p->seq = c->ncoll++; /* counted even if it fails below: as NCCL's */
  p->q = c->clique;
  p->q->refs++;        /* the piece uses the clique until it ran */
  pthread_mutex_unlock(&g_lock);
  if (maybe_fail_async(c, stream)) {
    pthread_mutex_lock(&g_lock);
    clique_unref_locked(p->q);
    pthread_mutex_unlock(&g_lock);
    free(p);
    return coll_done(c);
  }
  rc = fake_cuda_enqueue(stream, run_piece, p);
  if (rc != 0) {
    pthread_mutex_lock(&g_lock);
    clique_unref_locked(p->q);
    pthread_mutex_unlock(&g_lock);
    free(p);
    return set_error(R_UNHANDLED_CUDA, "fake NCCL: enqueue on stream "
                     "failed (cuda error %d)", rc);
  }
  return coll_done(c);
}

/* ---- send/recv: the p2p calls of one group on one comm are one piece,
 * as NCCL fuses them into one kernel, so a ring's sends and receives
 * progress together instead of deadlocking in stream order. */

typedef struct {
  int send, peer;
  uint64_t seq;
  const void *sbuf;
  void *rbuf;
  size_t bytes;
  mbox_t *m;
} gop_t;

typedef struct {
  comm_t *comm;
  struct clique_s *q; /* held until the piece ran */
  size_t n;
  gop_t ops[];
} gpiece_t;

static void mbox_drop_locked(clique_t *q, mbox_t *m) {
  mbox_t **pp;
  for (pp = &q->mboxes; *pp != m; pp = &(*pp)->next) {}
  *pp = m->next;
  free(m);
}

static void run_gpiece(void *arg) {
  gpiece_t *g = arg;
  comm_t *c = g->comm;
  clique_t *q = g->q;
  size_t i, ndone;
  pthread_mutex_lock(&g_lock);
  for (i = 0; i < g->n; i++) {
    gop_t *o = &g->ops[i];
    int src = o->send ? c->rank : o->peer, dst = o->send ? o->peer : c->rank;
    mbox_t *m;
    for (m = q->mboxes; m; m = m->next)
      if (m->src == src && m->dst == dst && m->seq == o->seq) break;
    if (!m) {
      m = calloc(1, sizeof(*m));
      if (!m) abort();
      m->src = src;
      m->dst = dst;
      m->seq = o->seq;
      m->next = q->mboxes;
      q->mboxes = m;
    }
    if (o->send) {
      m->sbuf = o->sbuf;
      m->sbytes = o->bytes;
      m->have_send = 1;
    } else {
      m->rbuf = o->rbuf;
      m->rbytes = o->bytes;
      m->have_recv = 1;
    }
    o->m = m;
    if (m->have_send && m->have_recv) {
      if (m->sbytes != m->rbytes) {
        snprintf(g_last_error, sizeof(g_last_error), "fake NCCL: send of "
                 "%zu bytes from rank %d matched with a recv of %zu bytes",
                 m->sbytes, src, m->rbytes);
        fprintf(stderr, "%s\n", g_last_error);
        q->comms[src]->async_error = q->comms[dst]->async_error =
            R_INVALID_USAGE;
      }
      memcpy(m->rbuf, m->sbuf, m->sbytes < m->rbytes ? m->sbytes : m->rbytes);
      m->done = 1;
      pthread_cond_broadcast(&g_cond);
    }
  }
  for (;;) { /* a send waits for its recv too: its buffer is read then */
    for (i = ndone = 0; i < g->n; i++) ndone += g->ops[i].m->done;
    if (ndone == g->n || c->destroyed || c->revoked) break;
    pthread_cond_wait(&g_cond, &g_lock);
  }
  /* Each side holds its mailbox until it leaves: the last one frees it. */
  for (i = 0; i < g->n; i++) {
    mbox_t *m = g->ops[i].m;
    if (g->ops[i].send) m->have_send = m->done ? 2 : 0;
    else m->have_recv = m->done ? 2 : 0;
    if (m->done ? (m->have_send == 2 && m->have_recv == 2)
                : (!m->have_send && !m->have_recv))
      mbox_drop_locked(q, m);
  }
  clique_unref_locked(q);
  pthread_mutex_unlock(&g_lock);
  free(g);
}

/* Launches the multi-rank p2p calls of the group ending on this thread:
 * one piece per comm, matched per peer pair in call order. */
static int group_p2p_multi(p2p_t *ops, size_t n) {
  size_t i, j, k;
  int r = R_SUCCESS, rc;
  for (i = 0; i < n && r == R_SUCCESS; i++) {
    comm_t *c = ops[i].comm;
    gpiece_t *g;
    if (c == NULL) continue; /* taken with an earlier comm */
    for (j = i, k = 0; j < n; j++) k += ops[j].comm == c;
    g = calloc(1, sizeof(*g) + k * sizeof(gop_t));
    if (!g) return set_error(R_SYSTEM, "fake NCCL: out of memory");
    g->comm = c;
    pthread_mutex_lock(&g_lock);
    for (j = i; j < n; j++) {
      p2p_t *o = &ops[j];
      if (o->comm != c) continue;
      g->ops[g->n++] = (gop_t){o->send, o->peer,
                               o->send ? c->nsend[o->peer]++
                                       : c->nrecv[o->peer]++,
                               o->sbuf, o->rbuf, o->bytes, NULL};
      if (j > i) o->comm = NULL;
    }
    g->q = c->clique;
    g->q->refs++;
    pthread_mutex_unlock(&g_lock);
    if (maybe_fail_async(c, ops[i].stream)) rc = -1;
    else rc = fake_cuda_enqueue(ops[i].stream, run_gpiece, g);
    if (rc != 0) {
      pthread_mutex_lock(&g_lock);
      clique_unref_locked(g->q);
      pthread_mutex_unlock(&g_lock);
      free(g);
      if (rc > 0)
        r = set_error(R_UNHANDLED_CUDA, "fake NCCL: enqueue on stream "
                      "failed (cuda error %d)", rc);
    }
  }
  return r;
}

/* ---- init and split ------------------------------------------------------ */

static int multi_init(comm_t **out, int nranks, const unique_id_t *id,
                      int rank, int blocking) {
  clique_t *q;
  comm_t *c = comm_new(blocking);
  int err = 0;
  if (!c) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  pthread_mutex_lock(&g_lock);
  for (q = g_cliques; q; q = q->next)
    if (memcmp(&q->id, id, sizeof(*id)) == 0) break;
  if (!q) q = clique_new_locked(id, nranks);
  if (!q) err = 1;
  else if (q->nranks != nranks) err = 2;
  else if (q->comms[rank] != NULL) err = 3;
  else if (comm_place_locked(c, q, rank) != 0) err = 1;
  if (!err && q->joined == q->nranks) {
    clique_check_devices_locked(q);
    pthread_cond_broadcast(&g_cond);
  }
  /* A blocking init returns when every rank joined, as NCCL's. */
  while (!err && blocking && q->joined < q->nranks && !c->destroyed)
    pthread_cond_wait(&g_cond, &g_lock);
  if (err) c->destroyed = 1; /* never handed out */
  pthread_mutex_unlock(&g_lock);
  if (err == 1) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  if (err == 2)
    return set_error(R_INVALID_USAGE, "ncclCommInitRankConfig: nranks %d "
                     "differs from the %d of the other ranks of this id",
                     nranks, q->nranks);
  if (err == 3)
    return set_error(R_INVALID_USAGE, "ncclCommInitRankConfig: rank %d "
                     "joined twice", rank);
  *out = c;
  if (blocking) return c->async_error;
  make_busy(c);
  return R_IN_PROGRESS;
}

/* Run by the last parent rank to call the split: every child exists now.
 * Colors in order of their first member; ranks by (key, parent rank). */
static void split_finish_locked(clique_t *q, split_t *sp) {
  int n = q->nranks, i, j, k, m;
  int *order = malloc((size_t)n * sizeof(int));
  if (!order) abort();
  for (i = 0; i < n; i++) {
    if (sp->child[i] == NULL || sp->child[i]->clique != NULL ||
        sp->child[i]->nranks != 0)
      continue; /* NOCOLOR, or placed with an earlier color */
    for (j = i, m = 0; j < n; j++)
      if (sp->child[j] && sp->color[j] == sp->color[i]) {
        /* insertion by (key, parent rank) */
        for (k = m; k > 0 && sp->key[order[k - 1]] > sp->key[j]; k--)
          order[k] = order[k - 1];
        order[k] = j;
        m++;
      }
    if (m == 1) { /* a one-rank comm: the one-rank code serves it */
      sp->child[i]->nranks = 1;
      sp->child[i]->rank = 0;
    } else {
      unique_id_t id;
      clique_t *nq;
      memset(&id, 0, sizeof(id));
      snprintf(id.internal, sizeof(id.internal), "fake-nccl-split-%p-%llu-%d",
               (void *)q, (unsigned long long)sp->seq, sp->color[i]);
      nq = clique_new_locked(&id, m);
      if (!nq) abort();
      for (k = 0; k < m; k++)
        if (comm_place_locked(sp->child[order[k]], nq, k) != 0) abort();
    }
    for (k = 0; k < m; k++) sp->child[order[k]]->child_pending = 0;
  }
  for (i = 0; i < n; i++) q->comms[i]->split_busy = 0;
  free(order);
  pthread_cond_broadcast(&g_cond);
}

static int multi_split(comm_t *c, int color, int key, void **newcomm,
                       int blocking) {
  clique_t *q = c->clique;
  comm_t *n = NULL;
  split_t *sp, **pp;
  if (color != -1) {
    n = comm_new(blocking);
    if (!n) return set_error(R_SYSTEM, "fake NCCL: out of memory");
    n->nranks = 0; /* unknown until every parent rank called */
    n->device = c->device;
    n->child_pending = 1;
  }
  pthread_mutex_lock(&g_lock);
  for (sp = q->splits; sp && sp->seq != c->nsplit; sp = sp->next) {}
  if (!sp) {
    sp = calloc(1, sizeof(*sp));
    if (sp) {
      sp->color = calloc((size_t)q->nranks, sizeof(int));
      sp->key = calloc((size_t)q->nranks, sizeof(int));
      sp->child = calloc((size_t)q->nranks, sizeof(comm_t *));
    }
    if (!sp || !sp->color || !sp->key || !sp->child) abort();
    sp->seq = c->nsplit;
    sp->next = q->splits;
    q->splits = sp;
  }
  c->nsplit++;
  c->split_busy = 1;
  sp->color[c->rank] = color;
  sp->key[c->rank] = key;
  sp->child[c->rank] = n;
  if (++sp->arrived == q->nranks) {
    split_finish_locked(q, sp);
    for (pp = &q->splits; *pp != sp; pp = &(*pp)->next) {}
    *pp = sp->next;
    free(sp->color);
    free(sp->key);
    free(sp->child);
    free(sp);
  }
  while (blocking && c->split_busy && !c->destroyed)
    pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  *newcomm = n;
  if (n) make_busy(n);
  return launched(c);
}

/* ---- API ---------------------------------------------------------------------- */

EXPORT int ncclGetVersion(int *v) {
  if (!v) return R_INVALID_ARGUMENT;
#ifdef FAKE_NCCL_NO_SHRINK
  *v = 22605;
#else
  *v = 22902;
#endif
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
  if (!comm) return set_error(R_INVALID_ARGUMENT, "comm is NULL");
  *comm = NULL;
  if (cfg && (cfg->magic != 0xcafebeef || cfg->size < sizeof(*cfg)))
    return set_error(R_INVALID_ARGUMENT, "ncclCommInitRankConfig: config "
                     "not initialized with NCCL_CONFIG_INITIALIZER");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return set_error(R_INVALID_ARGUMENT, "invalid rank %d (nranks %d)", rank,
                     nranks);
  if (nranks > 1)
    return multi_init((comm_t **)comm, nranks, &id, rank,
                      config_blocking(cfg, 1));
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
  pthread_mutex_lock(&g_lock); /* peers' threads change multi-rank state */
  if (c->async_error) *err = c->async_error;
  else if (comm_pending_locked(c)) *err = R_IN_PROGRESS;
  else if (!c->blocking && now_ns() < c->busy_until_ns) *err = R_IN_PROGRESS;
  else *err = R_SUCCESS;
  pthread_mutex_unlock(&g_lock);
  return R_SUCCESS;
}

EXPORT int ncclCommFinalize(void *comm) {
  comm_t *c = comm;
  int r = check_comm(c, "ncclCommFinalize");
  if (r) return r;
  c->finalized = 1;
  return launched(c);
}

/* Destroy and abort: nothing may hang on a gone comm, so a piece of it
 * waiting for peers gives up (NCCL's abort stops its kernels), and its
 * clique goes with its last comm (and the last piece that used it). */
static void comm_gone(comm_t *c, int aborted) {
  pthread_mutex_lock(&g_lock);
  if (aborted) c->aborted = 1;
  if (!c->destroyed) {
    c->destroyed = 1;
    if (c->clique) clique_unref_locked(c->clique);
    c->clique = NULL;
  }
  __atomic_store_n(&c->release, 1, __ATOMIC_SEQ_CST); /* unblocks a hang */
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_lock);
}

EXPORT int ncclCommDestroy(void *comm) {
  if (comm) comm_gone(comm, 0);
  return R_SUCCESS;
}

EXPORT int ncclCommAbort(void *comm) {
  if (comm) comm_gone(comm, 1);
  return R_SUCCESS;
}

#ifndef FAKE_NCCL_NO_SHRINK /* the older NCCL (2.26) variant has neither */
/* ncclCommRevoke: the fake stops what waits for peers (as abort does) but
 * keeps the comm for a shrink or a destroy. */
EXPORT int ncclCommRevoke(void *comm, int flags) {
  comm_t *c = comm;
  if (c == NULL || c->destroyed || c->aborted)
    return set_error(R_INVALID_USAGE, "ncclCommRevoke: no such comm");
  if (flags != 0)
    return set_error(R_INVALID_ARGUMENT, "ncclCommRevoke: flags must be 0");
  pthread_mutex_lock(&g_lock);
  c->revoked = 1;
  __atomic_store_n(&c->release, 1, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_lock);
  return R_SUCCESS;
}

/* ncclCommShrink: the ranks not excluded (every one of them calls it, with
 * the same list) get a comm of their own, in their old order; the
 * excluded ones (dead) never call. Made with the split machinery: the
 * excluded ranks count as having arrived with no color. */
EXPORT int ncclCommShrink(void *comm, int *excl, int nexcl, void **newcomm,
                          config_head_t *cfg, int flags) {
  comm_t *c = comm, *n;
  clique_t *q;
  split_t *sp, **pp;
  int i, blocking;
  if (c == NULL || c->destroyed || c->aborted)
    return set_error(R_INVALID_USAGE, "ncclCommShrink: no such comm");
  if (!newcomm || (nexcl > 0 && !excl) || nexcl < 0 || nexcl >= c->nranks ||
      (flags != 0 && flags != 1))
    return set_error(R_INVALID_ARGUMENT, "ncclCommShrink: bad arguments");
  for (i = 0; i < nexcl; i++)
    if (excl[i] < 0 || excl[i] >= c->nranks || excl[i] == c->rank)
      return set_error(R_INVALID_ARGUMENT, "ncclCommShrink: bad rank %d in "
                       "the exclude list", excl[i]);
  *newcomm = NULL;
  blocking = config_blocking(cfg, c->blocking);
  if (flags == 1) { /* NCCL_SHRINK_ABORT: in-flight ops end first */
    pthread_mutex_lock(&g_lock);
    c->revoked = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
  }
  n = comm_new(blocking);
  if (!n) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  if (c->nranks == 1) {
    *newcomm = n;
    make_busy(n);
    return launched(c);
  }
  q = c->clique;
  n->nranks = 0;
  n->device = c->device;
  n->child_pending = 1;
  pthread_mutex_lock(&g_lock);
  for (sp = q->splits; sp && sp->seq != c->nsplit; sp = sp->next) {}
  if (!sp) {
    sp = calloc(1, sizeof(*sp));
    if (sp) {
      sp->color = calloc((size_t)q->nranks, sizeof(int));
      sp->key = calloc((size_t)q->nranks, sizeof(int));
      sp->child = calloc((size_t)q->nranks, sizeof(comm_t *));
    }
    if (!sp || !sp->color || !sp->key || !sp->child) abort();
    sp->seq = c->nsplit;
    sp->next = q->splits;
    q->splits = sp;
    for (i = 0; i < nexcl; i++) { /* the dead: arrived, no color */
      sp->color[excl[i]] = -1;
      sp->child[excl[i]] = NULL;
      sp->arrived++;
    }
  }
  c->nsplit++;
  c->split_busy = 1;
  sp->color[c->rank] = 0;
  sp->key[c->rank] = c->rank;
  sp->child[c->rank] = n;
  if (++sp->arrived == q->nranks) {
    split_finish_locked(q, sp);
    for (pp = &q->splits; *pp != sp; pp = &(*pp)->next) {}
    *pp = sp->next;
    free(sp->color);
    free(sp->key);
    free(sp->child);
    free(sp);
  }
  while (blocking && c->split_busy && !c->destroyed)
    pthread_cond_wait(&g_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  *newcomm = n;
  make_busy(n);
  c->revoked = 0; /* quiescent again, as NCCL after a shrink */
  return launched(c);
}
#endif

#ifndef FAKE_NCCL_NO_SHRINK
/* ncclCommGetUniqueId: the id of a grow of comm, for its root's
 * ncclCommGrow (single use) and the joiners. */
EXPORT int ncclCommGetUniqueId(void *comm, unique_id_t *id) {
  comm_t *c = comm;
  static unsigned counter;
  if (!id)
    return set_error(R_INVALID_ARGUMENT, "ncclCommGetUniqueId: id is NULL");
  if (c == NULL || c->destroyed || c->aborted)
    return set_error(R_INVALID_USAGE, "ncclCommGetUniqueId: no such comm");
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "fake-nccl-grow-%d-%u",
           (int)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST));
  pthread_mutex_lock(&g_lock);
  c->grow_id = *id;
  c->grow_issued = 1;
  pthread_mutex_unlock(&g_lock);
  return R_SUCCESS;
}

/* n takes its place in the grown clique of id (made by whoever comes
 * first, as an init's). 0, or 2 (other nranks), 3 (place taken), 1. */
static int grow_place_locked(comm_t *n, const unique_id_t *id, int nranks,
                             int rank) {
  clique_t *q;
  for (q = g_cliques; q; q = q->next)
    if (memcmp(&q->id, id, sizeof(*id)) == 0) break;
  if (!q) q = clique_new_locked(id, nranks);
  if (!q) return 1;
  if (q->nranks != nranks) return 2;
  if (q->comms[rank] != NULL) return 3;
  n->child_pending = 0;
  if (comm_place_locked(n, q, rank) != 0) return 1;
  if (q->joined == q->nranks) clique_check_devices_locked(q);
  pthread_cond_broadcast(&g_cond);
  return 0;
}

/* ncclCommGrow (2.29): members pass their comm and rank -1 (their rank
 * stays), the root (rank 0) with the id its comm gave, the others
 * without; new ranks pass no comm, the id and their rank. The members
 * that call before the root wait for its id. */
EXPORT int ncclCommGrow(void *comm, int nranks, const unique_id_t *id,
                        int rank, void **newcomm, config_head_t *cfg) {
  comm_t *c = comm, *n;
  clique_t *q;
  int blocking, err = 0, i;
  if (!newcomm)
    return set_error(R_INVALID_ARGUMENT, "ncclCommGrow: newcomm is NULL");
  *newcomm = NULL;
  if (cfg && (cfg->magic != 0xcafebeef || cfg->size < sizeof(*cfg)))
    return set_error(R_INVALID_ARGUMENT, "ncclCommGrow: config not "
                     "initialized with NCCL_CONFIG_INITIALIZER");
  if (c != NULL) {
    if (c->destroyed || c->aborted)
      return set_error(R_INVALID_USAGE, "ncclCommGrow: no such comm");
    if (rank != -1 || nranks <= c->nranks)
      return set_error(R_INVALID_ARGUMENT, "ncclCommGrow: a member passes "
                       "rank -1 and more than its %d ranks (rank %d, "
                       "nranks %d)", c->nranks, rank, nranks);
    if (c->nranks == 1 && id == NULL)
      return set_error(R_INVALID_ARGUMENT, "ncclCommGrow: the root passes "
                       "the id");
    blocking = config_blocking(cfg, c->blocking);
  } else {
    if (id == NULL || rank < 0 || rank >= nranks)
      return set_error(R_INVALID_ARGUMENT, "ncclCommGrow: a new rank passes "
                       "the id and its rank (rank %d, nranks %d)", rank,
                       nranks);
    blocking = config_blocking(cfg, 1);
  }
  n = comm_new(blocking);
  if (!n) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  n->nranks = 0;
  n->child_pending = 1;
  if (c != NULL) n->device = c->device;
  pthread_mutex_lock(&g_lock);
  q = c != NULL ? c->clique : NULL;
  if (c == NULL) {
    err = grow_place_locked(n, id, nranks, rank);
  } else if (id != NULL) { /* the root */
    if (!c->grow_issued || memcmp(&c->grow_id, id, sizeof(*id)) != 0) {
      err = 4;
    } else {
      c->grow_issued = 0; /* single use */
      err = grow_place_locked(n, id, nranks, c->rank);
      if (!err && q != NULL) {
        q->grow_open = 1;
        q->grow_target = *id;
        q->grow_nranks = nranks;
        for (i = 0; q->grow_wait && i < q->nranks; i++)
          if (q->grow_wait[i] != NULL) {
            if (grow_place_locked(q->grow_wait[i], id, nranks, i) != 0)
              q->grow_wait[i]->async_error = R_INVALID_USAGE;
            q->grow_wait[i] = NULL;
          }
      }
    }
  } else if (q->grow_open) {
    err = grow_place_locked(n, &q->grow_target, q->grow_nranks, c->rank);
  } else {
    if (!q->grow_wait)
      q->grow_wait = calloc((size_t)q->nranks, sizeof(*q->grow_wait));
    if (!q->grow_wait) err = 1;
    else q->grow_wait[c->rank] = n;
  }
  if (!err && q != NULL && ++q->grow_arrived == q->nranks) {
    q->grow_open = 0; /* every member called: the next grow is another */
    q->grow_arrived = 0;
  }
  while (!err && blocking && comm_pending_locked(n) && !n->destroyed)
    pthread_cond_wait(&g_cond, &g_lock);
  if (err) n->destroyed = 1; /* never handed out */
  pthread_mutex_unlock(&g_lock);
  if (err == 1) return set_error(R_SYSTEM, "fake NCCL: out of memory");
  if (err == 2)
    return set_error(R_INVALID_USAGE, "ncclCommGrow: nranks %d differs from "
                     "the other ranks' of this id", nranks);
  if (err == 3)
    return set_error(R_INVALID_USAGE, "ncclCommGrow: rank %d joined twice",
                     c != NULL ? c->rank : rank);
  if (err == 4)
    return set_error(R_INVALID_USAGE, "ncclCommGrow: the id is not this "
                     "comm's (ncclCommGetUniqueId), or was used already");
  *newcomm = n;
  __atomic_add_fetch(&g_grown, 1, __ATOMIC_SEQ_CST);
  if (blocking) return n->async_error;
  make_busy(n);
  return R_IN_PROGRESS;
}
#endif

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
  if (c->nranks > 1)
    return multi_split(c, color, key, newcomm,
                       config_blocking(cfg, c->blocking));
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

static int coll(int kind, const char *fn, const void *send, void *recv,
                size_t count, int dt, int op, int root, void *comm,
                void *stream) {
  comm_t *c = comm;
  if (c && c->nranks > 1)
    return multi_coll(kind, fn, send, recv, count, dt, op, root, comm,
                      stream);
  return one_rank_coll(fn, send, recv, count, dt, op, root, comm, stream);
}

EXPORT int ncclAllReduce(const void *send, void *recv, size_t count, int dt,
                         int op, void *comm, void *stream) {
  return coll(K_ALLREDUCE, "ncclAllReduce", send, recv, count, dt, op, 0, comm,
                       stream);
}

EXPORT int ncclBroadcast(const void *send, void *recv, size_t count, int dt,
                         int root, void *comm, void *stream) {
  return coll(K_BROADCAST, "ncclBroadcast", send, recv, count, dt, -1, root,
                       comm, stream);
}

EXPORT int ncclReduce(const void *send, void *recv, size_t count, int dt,
                      int op, int root, void *comm, void *stream) {
  return coll(K_REDUCE, "ncclReduce", send, recv, count, dt, op, root, comm,
                       stream);
}

EXPORT int ncclAllGather(const void *send, void *recv, size_t count, int dt,
                         void *comm, void *stream) {
  return coll(K_ALLGATHER, "ncclAllGather", send, recv, count, dt, -1, 0, comm,
                       stream);
}

EXPORT int ncclReduceScatter(const void *send, void *recv, size_t count,
                             int dt, int op, void *comm, void *stream) {
  return coll(K_REDUCE_SCATTER, "ncclReduceScatter", send, recv, count, dt, op, 0,
                       comm, stream);
}

EXPORT int ncclGroupStart(void);
EXPORT int ncclGroupEnd(void);

static int p2p_add(int is_send, const char *fn, const void *sbuf, void *rbuf,
                   size_t count, int dt, int peer, void *comm,
                   void *stream) {
  comm_t *c = comm;
  const void *buf = is_send ? sbuf : rbuf;
  int r = check_args(c, fn, dt, count, buf, buf);
  if (r) return r;
  if (c->nranks > 1 && (peer < 0 || peer >= c->nranks))
    return set_error(R_INVALID_ARGUMENT, "%s: invalid peer %d (nranks %d)",
                     fn, peer, c->nranks);
  if (c->nranks > 1 && t_depth == 0) { /* an implicit group, as NCCL's */
    ncclGroupStart();
    r = p2p_add(is_send, fn, sbuf, rbuf, count, dt, peer, comm, stream);
    return r ? (ncclGroupEnd(), r) : ncclGroupEnd();
  }
  if (c->nranks == 1 && peer != 0)
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
  t_p2p[t_np2p++] = (p2p_t){is_send, peer, c, sbuf, rbuf,
                            count * type_size(dt), stream};
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

/* Matches the group's sends to self with its receives, in order. As
 * NCCL, the whole group is checked before any of it is launched: a group
 * that fails at ncclGroupEnd leaves nothing on the stream (the caller may
 * free its buffers at once). */
static int group_p2p(void) {
  size_t i, j, pass;
  int r = R_SUCCESS;
  for (pass = 0; pass < 2 && r == R_SUCCESS; pass++) {
    for (i = 0, j = 0; i < t_np2p && r == R_SUCCESS; i++) {
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
      if (pass == 1 && t_p2p[i].bytes > 0 &&
          !maybe_fail_async(t_p2p[j].comm, t_p2p[j].stream))
        r = enqueue_copy(t_p2p[j].stream, t_p2p[j].rbuf, t_p2p[i].sbuf,
                         t_p2p[i].bytes, T_UINT8, 0, 1);
      j++;
    }
    if (pass == 0 && r == R_SUCCESS) {
      for (; j < t_np2p; j++)
        if (!t_p2p[j].send) {
          r = set_error(R_INVALID_USAGE, "ncclRecv: Trying to recv from self "
                        "without a matching send");
          break;
        }
    }
  }
  t_np2p = 0;
  return r;
}

/* The group's p2p calls: one-rank comms (send to self) here, the others
 * through group_p2p_multi. */
static int group_p2p_split(void) {
  p2p_t *multi = NULL;
  size_t i, k = 0, nm = 0;
  int r, rm = R_SUCCESS;
  for (i = 0; i < t_np2p; i++) nm += t_p2p[i].comm->nranks > 1;
  if (nm > 0) {
    multi = malloc(nm * sizeof(*multi));
    if (!multi) {
      t_np2p = 0;
      return set_error(R_SYSTEM, "fake NCCL: out of memory");
    }
    for (i = 0, nm = 0; i < t_np2p; i++) {
      if (t_p2p[i].comm->nranks > 1) multi[nm++] = t_p2p[i];
      else t_p2p[k++] = t_p2p[i];
    }
    t_np2p = k;
    rm = group_p2p_multi(multi, nm);
    free(multi);
  }
  r = group_p2p();
  return r ? r : rm;
}

EXPORT int ncclGroupEnd(void) {
  comm_t *c;
  int r;
  if (t_depth == 0)
    return set_error(R_INVALID_USAGE, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return R_SUCCESS;
  r = group_p2p_split();
  /* The list is per thread, and device threads come and go: free it at
   * the end of every group so that none leaks with its thread. */
  free(t_p2p);
  t_p2p = NULL;
  t_cap = 0;
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

/* Calls of ncclCommGrow that made a communicator: a test sees a grow went
 * through it (not through a new init). */
EXPORT int fake_nccl_grown_comms(void) {
  return __atomic_load_n(&g_grown, __ATOMIC_SEQ_CST);
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
