/* NCCL process groups against the fake CUDA runtime and the fake NCCL
 * (t/fake/): one-rank groups over a HashStore. Every operation with exact
 * results read back from "device" memory, every dtype x reduction NCCL
 * allows and the refusals, subgroups, grouped send/recv to self, barrier
 * and stream ordering, timeouts counted from GPU start, abort, async
 * errors, destroy with pending work, and thousands of queued ops
 * completing in order exactly once. */
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"
#include "nccl/nccl.h" /* uvccl__nccl_debug_block_next */

#include <dlfcn.h>
#include <sys/wait.h>
#include <time.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define FAKE_NCCL UVCCL_BUILD_DIR "/fake/libnccl.so.2"

static uv_loop_t *loop;
static uvccl_store_t store;
static uvccl_pg_t pg;

/* hooks of the fakes, through dlsym */
static int (*f_enqueue)(void *stream, void (*fn)(void *), void *arg);
static int (*f_wait_flag)(void *stream, volatile uint32_t *flag);
static int (*f_stream_create)(void **stream, unsigned flags);
static int (*f_stream_destroy)(void *stream);
static int (*f_stream_sync)(void *stream);
static void (*f_block_next)(volatile uint32_t *flag);
static void (*f_fail_next)(void);
static int (*f_live_comms)(void);

static void *sym(const char *lib, const char *name) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  void *f = h ? dlsym(h, name) : NULL;
  if (f == NULL) {
    printf("Bail out! %s: no %s\n", lib, name);
    exit(1);
  }
  return f;
}

static void load_hooks(void) {
  *(void **)&f_enqueue = sym(FAKE_CUDART, "fake_cuda_enqueue");
  *(void **)&f_wait_flag = sym(FAKE_CUDART, "fake_cuda_stream_wait_flag");
  *(void **)&f_stream_create = sym(FAKE_CUDART, "cudaStreamCreateWithFlags");
  *(void **)&f_stream_destroy = sym(FAKE_CUDART, "cudaStreamDestroy");
  *(void **)&f_stream_sync = sym(FAKE_CUDART, "cudaStreamSynchronize");
  *(void **)&f_block_next = sym(FAKE_NCCL, "fake_nccl_block_next");
  *(void **)&f_fail_next = sym(FAKE_NCCL, "fake_nccl_fail_next_async");
  *(void **)&f_live_comms = sym(FAKE_NCCL, "fake_nccl_live_comms");
}

static void run_for(uint64_t ms) { run_loop_for(loop, ms); }
static void *dev(size_t n) { return dev_on(0, n); }

static int make_group(uvccl_pg_t *g, int rank, int size, const char *prefix) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  int rc;
  memset(&o, 0, sizeof(o));
  o.rank = rank;
  o.size = size;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = -1;
  o.prefix = prefix;
  o.timeout_ms = 5000;
  rc = uvccl_pg_init(loop, g, &store, &o, &w, NULL);
  if (rc != 0) return rc;
  rc = uvccl_work_wait(&w);
  if (rc != 0) note("pg_init: %s", w.msg);
  return rc;
}

static int closed;
static void on_closed(uvccl_pg_t *g) {
  (void)g;
  closed++;
}

static void destroy_group(uvccl_pg_t *g) {
  int before = closed;
  uvccl_pg_destroy(g, on_closed);
  while (closed == before) uv_run(loop, UV_RUN_ONCE);
}

/* ---- values per dtype --------------------------------------------------- */

static uint16_t f2h(float x) { /* exact small integers and halves only */
  uint32_t u;
  uint16_t sign;
  int e;
  memcpy(&u, &x, 4);
  if (x == 0) return 0;
  sign = (uint16_t)((u >> 16) & 0x8000);
  e = (int)((u >> 23) & 0xff) - 127 + 15;
  return sign | (uint16_t)(e << 10) | (uint16_t)((u & 0x7fffff) >> 13);
}
static uint16_t f2bf(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}

/* element i of a test vector, scaled by f, stored as dtype */
static void fill(uvccl_dtype_t dt, void *buf, size_t n, double f) {
  size_t i;
  for (i = 0; i < n; i++) {
    double v = (double)((i % 7) + 1) * f;
    switch (dt) {
    case UVCCL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case UVCCL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case UVCCL_BOOL: ((uint8_t *)buf)[i] = (uint8_t)(i % 2); break;
    case UVCCL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case UVCCL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case UVCCL_FLOAT16: ((uint16_t *)buf)[i] = f2h((float)v); break;
    case UVCCL_BFLOAT16: ((uint16_t *)buf)[i] = f2bf((float)v); break;
    case UVCCL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case UVCCL_FLOAT64: ((double *)buf)[i] = v; break;
    case UVCCL_COMPLEX64:
      ((float *)buf)[2 * i] = (float)v;
      ((float *)buf)[2 * i + 1] = (float)(-v);
      break;
    case UVCCL_COMPLEX128:
      ((double *)buf)[2 * i] = v;
      ((double *)buf)[2 * i + 1] = -v;
      break;
    default: break;
    }
  }
}

static const uvccl_dtype_t all_dtypes[] = {
    UVCCL_INT8,    UVCCL_UINT8,    UVCCL_BOOL,    UVCCL_INT32,
    UVCCL_INT64,   UVCCL_FLOAT16,  UVCCL_BFLOAT16, UVCCL_FLOAT32,
    UVCCL_FLOAT64, UVCCL_COMPLEX64, UVCCL_COMPLEX128};

/* ---- ops ------------------------------------------------------------------ */

#define N 37

static void test_allreduce_matrix(void) {
  uvccl_redop_t premul;
  size_t d;
  int op, rc, good = 0, refused = 0, total = 0;
  char hin[N * 16], hout[N * 16], want[N * 16];
  void *din = dev(sizeof(hin)), *dout = dev(sizeof(hout));
  is_int(uvccl_pg_premul_sum(&pg, 2.0, &premul), 0, "premul_sum op made");
  for (d = 0; d < (sizeof(all_dtypes) / sizeof(all_dtypes[0])); d++) {
    uvccl_dtype_t dt = all_dtypes[d];
    size_t es = uvccl_dtype_size(dt);
    for (op = 0; op <= UVCCL_REDOP_COUNT; op++) {
      uvccl_redop_t rop = op == UVCCL_REDOP_COUNT ? premul : (uvccl_redop_t)op;
      uvccl_redop_t base = op == UVCCL_REDOP_COUNT ? UVCCL_PREMUL_SUM : rop;
      int allowed = uvccl_redop_check(base, dt) == 0 && base != UVCCL_BAND &&
                    base != UVCCL_BOR && base != UVCCL_BXOR &&
                    rop != UVCCL_PREMUL_SUM;
      uvccl_work_t w = {0};
      fill(dt, hin, N, 1);
      put(din, hin, N * es);
      memset(hout, 0x55, sizeof(hout));
      put(dout, hout, N * es);
      rc = uvccl_allreduce(&pg, &w, din, dout, N, dt, rop, NULL);
      total++;
      if (!allowed) {
        if (rc == UV_EINVAL) refused++;
        else
          note("%s %s: expected UV_EINVAL, got %d", uvccl_dtype_name(dt),
               uvccl_redop_name(base), rc);
        continue;
      }
      if (rc == 0) rc = uvccl_work_wait(&w);
      get(hout, dout, N * es);
      fill(dt, want, N, base == UVCCL_PREMUL_SUM ? 2.0 : 1.0);
      if (rc == 0 && memcmp(hout, want, N * es) == 0) good++;
      else
        note("%s %s: rc %d (%s), data %s", uvccl_dtype_name(dt),
             uvccl_redop_name(base), rc, w.msg,
             memcmp(hout, want, N * es) ? "wrong" : "ok");
    }
  }
  /* every dtype x (SUM AVG PRODUCT MIN MAX BAND BOR BXOR PREMUL_SUM raw,
   * PREMUL_SUM with a factor) */
  is_int(total, 11 * 10, "allreduce matrix: every dtype x op tried");
  /* allowed: ints 5 each (sum avg prod min max) x4 = 20, bool sum prod min
   * max = 4, floats 6 each x4 = 24, complex sum avg premul = 3 x2 = 6 */
  is_int(good, 54, "allreduce: every allowed dtype x op exact");
  is_int(refused, 110 - 54, "allreduce: the others refused with UV_EINVAL");
  uvccl_gpu_free(din);
  uvccl_gpu_free(dout);
}

/* float8 moves (as bytes) and never reduces. */
static void test_float8(void) {
  unsigned char h[256], out[256];
  void *a = dev(sizeof(h)), *b = dev(sizeof(h));
  uvccl_work_t w = {0};
  int i, d, rc;
  for (i = 0; i < 256; i++) h[i] = (unsigned char)(255 - i);
  for (d = UVCCL_FLOAT8_E4M3; d <= UVCCL_FLOAT8_E5M2; d++) {
    put(a, h, sizeof(h));
    memset(out, 0, sizeof(out));
    put(b, out, sizeof(out));
    rc = uvccl_allgather(&pg, &w, a, b, 256, (uvccl_dtype_t)d, NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    get(out, b, sizeof(out));
    ok(rc == 0 && memcmp(out, h, sizeof(h)) == 0,
       "%s allgather: every byte exact", uvccl_dtype_name((uvccl_dtype_t)d));
    is_int(uvccl_allreduce(&pg, &w, a, b, 256, (uvccl_dtype_t)d, UVCCL_MAX,
                           NULL),
           UV_EINVAL, "%s allreduce refused",
           uvccl_dtype_name((uvccl_dtype_t)d));
  }
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_bool_inplace_and_simple_ops(void) {
  int32_t h[4 * N], out[4 * N];
  void *a = dev(sizeof(h)), *b = dev(sizeof(h));
  uvccl_work_t w = {0};
  size_t i;
  size_t counts[1] = {N};
  void *bufs[1];
  for (i = 0; i < 4 * N; i++) h[i] = (int32_t)(i * 3 + 1);
  /* in place */
  put(a, h, N * 4);
  is_int(uvccl_allreduce(&pg, &w, a, a, N, UVCCL_INT32, UVCCL_SUM, NULL), 0,
         "allreduce in place: started");
  is_int(uvccl_work_wait(&w), 0, "allreduce in place: done");
  get(out, a, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "allreduce in place: data");
  /* broadcast */
  put(a, h, N * 4);
  is_int(uvccl_broadcast(&pg, &w, a, N, UVCCL_INT32, 0, NULL), 0,
         "broadcast: started");
  is_int(uvccl_work_wait(&w), 0, "broadcast: done");
  get(out, a, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "broadcast: data");
  is_int(uvccl_broadcast(&pg, &w, a, N, UVCCL_INT32, 1, NULL), UV_EINVAL,
         "broadcast: root 1 refused");
  /* reduce */
  put(a, h, N * 4);
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_reduce(&pg, &w, a, b, N, UVCCL_INT32, UVCCL_MAX, 0, NULL), 0,
         "reduce: started");
  is_int(uvccl_work_wait(&w), 0, "reduce: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "reduce: data");
  /* allgather */
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_allgather(&pg, &w, a, b, N, UVCCL_INT32, NULL), 0,
         "allgather: started");
  is_int(uvccl_work_wait(&w), 0, "allgather: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "allgather: data");
  /* allgatherv */
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  bufs[0] = b;
  is_int(uvccl_allgatherv(&pg, &w, a, N, bufs, counts, UVCCL_INT32, NULL), 0,
         "allgatherv: started");
  is_int(uvccl_work_wait(&w), 0, "allgatherv: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "allgatherv: data");
  is_int(uvccl_allgatherv(&pg, &w, a, N - 1, bufs, counts, UVCCL_INT32, NULL),
         UV_EINVAL, "allgatherv: sendcount != recvcounts[rank] refused");
  /* gather / scatter */
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_gather(&pg, &w, a, b, N, UVCCL_INT32, 0, NULL), 0,
         "gather: started");
  is_int(uvccl_work_wait(&w), 0, "gather: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "gather: data");
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_scatter(&pg, &w, a, b, N, UVCCL_INT32, 0, NULL), 0,
         "scatter: started");
  is_int(uvccl_work_wait(&w), 0, "scatter: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "scatter: data");
  /* alltoall(v) */
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_alltoall(&pg, &w, a, b, N, UVCCL_INT32, NULL), 0,
         "alltoall: started");
  is_int(uvccl_work_wait(&w), 0, "alltoall: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "alltoall: data");
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_alltoallv(&pg, &w, a, counts, b, counts, UVCCL_INT32, NULL), 0,
         "alltoallv: started");
  is_int(uvccl_work_wait(&w), 0, "alltoallv: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "alltoallv: data");
  is_int(uvccl_alltoall(&pg, &w, a, a, N, UVCCL_INT32, NULL), UV_EINVAL,
         "alltoall: in place refused");
  /* reduce_scatter(v) */
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_reduce_scatter(&pg, &w, a, b, N, UVCCL_INT32, UVCCL_SUM, NULL),
         0, "reduce_scatter: started");
  is_int(uvccl_work_wait(&w), 0, "reduce_scatter: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "reduce_scatter: data");
  memset(out, 0, sizeof(out));
  put(b, out, N * 4);
  is_int(uvccl_reduce_scatterv(&pg, &w, a, b, counts, UVCCL_INT32,
                               UVCCL_MIN, NULL),
         0, "reduce_scatterv: started");
  is_int(uvccl_work_wait(&w), 0, "reduce_scatterv: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "reduce_scatterv: data");
  /* bool SUM is OR (MAX), PRODUCT is AND (MIN): one rank, a copy */
  {
    uint8_t bb[N], bo[N];
    fill(UVCCL_BOOL, bb, N, 1);
    put(a, bb, N);
    is_int(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_BOOL, UVCCL_PRODUCT, NULL),
           0, "bool PRODUCT: started");
    is_int(uvccl_work_wait(&w), 0, "bool PRODUCT: done");
    get(bo, b, N);
    ok(memcmp(bo, bb, N) == 0, "bool PRODUCT: data");
  }
  /* coalesced, with a PREMUL_SUM factor */
  {
    float f[3][5], g[3][5];
    void *d3[3];
    uvccl_buf_t bl[3];
    uvccl_redop_t half;
    int k, j, same = 1;
    is_int(uvccl_pg_premul_sum(&pg, 0.5, &half), 0, "premul 0.5");
    for (k = 0; k < 3; k++) {
      for (j = 0; j < 5; j++) f[k][j] = (float)(k * 10 + j);
      d3[k] = dev(sizeof(f[k]));
      put(d3[k], f[k], sizeof(f[k]));
      bl[k].base = d3[k];
      bl[k].len = (size_t)(k + 3) * sizeof(float); /* 3, 4, 5 elements */
    }
    is_int(uvccl_allreduce_coalesced(&pg, &w, bl, 3, UVCCL_FLOAT32, half,
                                     NULL),
           0, "allreduce_coalesced: started");
    is_int(uvccl_work_wait(&w), 0, "allreduce_coalesced: done");
    for (k = 0; k < 3; k++) {
      get(g[k], d3[k], sizeof(g[k]));
      for (j = 0; j < 5; j++) {
        float want_v = j < k + 3 ? f[k][j] * 0.5f : f[k][j];
        if (g[k][j] != want_v) same = 0;
      }
      uvccl_gpu_free(d3[k]);
    }
    ok(same, "allreduce_coalesced: each buffer scaled, only its length");
    bl[0].len = 3;
    is_int(uvccl_allreduce_coalesced(&pg, &w, bl, 1, UVCCL_FLOAT32, UVCCL_SUM,
                                     NULL),
           UV_EINVAL, "allreduce_coalesced: partial element refused");
  }
  /* refusals */
  is_int(uvccl_monitored_barrier(&pg, &w, 0, NULL), UV_ENOTSUP,
         "monitored_barrier: ENOTSUP");
  is_int(uvccl_broadcast_bytes(&pg, &w, "x", 1, 0, NULL), UV_ENOTSUP,
         "broadcast_bytes: ENOTSUP");
  is_int(uvccl_allgather_bytes(&pg, &w, "x", 1, NULL), UV_ENOTSUP,
         "allgather_bytes: ENOTSUP");
  is_int(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_FLOAT32, UVCCL_PREMUL_SUM,
                         NULL),
         UV_EINVAL, "PREMUL_SUM without a factor refused");
  is_int(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_FLOAT32,
                         (uvccl_redop_t)0x1ff, NULL),
         UV_EINVAL, "unknown PREMUL_SUM id refused");
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_p2p(void) {
  char s1[64], s2[16], r1[64], r2[16], z[16];
  void *ds1 = dev(64), *ds2 = dev(16), *dr1 = dev(64), *dr2 = dev(16);
  uvccl_work_t w = {0};
  uvccl_p2p_op_t ops[4];
  memset(s1, 'a', sizeof(s1));
  memset(s2, 'b', sizeof(s2));
  memset(r1, 0, sizeof(r1));
  memset(r2, 0, sizeof(r2));
  put(ds1, s1, 64);
  put(ds2, s2, 16);
  put(dr1, r1, 64);
  put(dr2, r2, 16);
  is_int(uvccl_send(&pg, &w, ds1, 64, 0, 7, NULL), UV_EINVAL,
         "send to self alone refused");
  is_int(uvccl_recv(&pg, &w, dr1, 64, UVCCL_ANY_SOURCE, 7, NULL), UV_ENOTSUP,
         "recv from any source: ENOTSUP");
  memset(ops, 0, sizeof(ops));
  ops[0] = (uvccl_p2p_op_t){1, ds1, 64, 0, 1, 0, 0};
  ops[1] = (uvccl_p2p_op_t){1, ds2, 16, 0, 2, 0, 0};
  ops[2] = (uvccl_p2p_op_t){0, dr1, 64, 0, 1, 0, 0};
  ops[3] = (uvccl_p2p_op_t){0, dr2, 16, 0, 2, 0, 0};
  is_int(uvccl_p2p_batch(&pg, &w, ops, 4, NULL), 0, "p2p_batch to self: started");
  is_int(uvccl_work_wait(&w), 0, "p2p_batch to self: done");
  get(r1, dr1, 64);
  get(r2, dr2, 16);
  ok(memcmp(r1, s1, 64) == 0 && memcmp(r2, s2, 16) == 0,
     "p2p_batch to self: matched in order, data arrived");
  ok(ops[2].received == 64 && ops[2].source == 0 && ops[3].received == 16,
     "p2p_batch: received and source filled");
  ops[3].len = 8;
  memset(z, 0, sizeof(z));
  put(dr1, z, 16); /* the failed group must not copy into it */
  is_int(uvccl_p2p_batch(&pg, &w, ops, 4, NULL), 0,
         "p2p_batch with mismatched lengths: started");
  is_int(uvccl_work_wait(&w), UVCCL_ENCCL,
         "p2p_batch with mismatched lengths: UVCCL_ENCCL");
  ok(strstr(w.msg, "ncclGroupEnd") != NULL, "message names the call: %s",
     w.msg);
  /* A group refused at ncclGroupEnd launched nothing (the buffers are
   * freed below at once): a barrier behind it on the stream sees them
   * untouched. */
  is_int(uvccl_barrier(&pg, &w, NULL), 0, "barrier after the failed group");
  is_int(uvccl_work_wait(&w), 0, "barrier done");
  get(r1, dr1, 16);
  ok(memcmp(r1, z, 16) == 0, "the failed group copied nothing");
  uvccl_gpu_free(ds1);
  uvccl_gpu_free(ds2);
  uvccl_gpu_free(dr1);
  uvccl_gpu_free(dr2);
}

/* ---- ordering, completion --------------------------------------------------- */

static int order_next, order_bad, order_calls;
static void on_ordered(uvccl_work_t *w, int status) {
  int idx = (int)(intptr_t)w->data;
  order_calls++;
  if (status != 0 || idx != order_next) order_bad++;
  order_next++;
}

static void test_many_in_order(void) {
  enum { M = 2000 };
  uvccl_work_t *ws = calloc(M, sizeof(*ws));
  int32_t *h = malloc(M * sizeof(int32_t)), *o = malloc(M * sizeof(int32_t));
  void *a = dev(M * 4), *b = dev(M * 4);
  int i, started = 0;
  double t0;
  for (i = 0; i < M; i++) h[i] = i * 5 + 3;
  put(a, h, M * 4);
  order_next = order_bad = order_calls = 0;
  t0 = now_s();
  for (i = 0; i < M; i++) {
    ws[i].data = (void *)(intptr_t)i;
    if (uvccl_allreduce(&pg, &ws[i], (int32_t *)a + i, (int32_t *)b + i, 1,
                        UVCCL_INT32, UVCCL_SUM, on_ordered) == 0)
      started++;
  }
  is_int(started, M, "2000 allreduces queued");
  while (order_calls < M) uv_run(loop, UV_RUN_ONCE);
  run_for(20);
  note("2000 queued allreduces completed in %.3f s", now_s() - t0);
  is_int(order_calls, M, "every callback ran exactly once");
  is_int(order_bad, 0, "in submission order, all succeeded");
  get(o, b, M * 4);
  ok(memcmp(o, h, M * 4) == 0, "every result in place");
  free(ws);
  free(h);
  free(o);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static int ev_seq, ev_allreduce, ev_barrier, ev_wait;
static void on_seq_ar(uvccl_work_t *w, int s) { (void)w; (void)s; ev_allreduce = ++ev_seq; }
static void on_seq_bar(uvccl_work_t *w, int s) { (void)w; (void)s; ev_barrier = ++ev_seq; }
static void on_seq_wait(uvccl_work_t *w, int s) { (void)w; (void)s; ev_wait = ++ev_seq; }

typedef struct {
  const int32_t *dbuf;
  int32_t seen;
  volatile int ran;
} probe_t;
static void probe_fn(void *arg) {
  probe_t *p = arg;
  p->seen = *p->dbuf; /* fake device memory is host memory */
  p->ran = 1;
}

static void test_stream_order_and_barrier(void) {
  volatile uint32_t flag = 0, uflag = 0;
  void *user = NULL;
  void *a = dev(64), *b = dev(64);
  int32_t v = 42, zero = 0;
  uvccl_work_t w1 = {0}, w2 = {0}, w3 = {0}, w4 = {0};
  probe_t probe = {b, -1, 0};
  int i;
  is_int(f_stream_create(&user, 1), 0, "user stream made");
  put(a, &v, 4);
  put(b, &zero, 4);
  /* the allreduce hangs on the GPU until flag; barrier after it */
  f_block_next(&flag);
  ev_seq = ev_allreduce = ev_barrier = ev_wait = 0;
  is_int(uvccl_allreduce(&pg, &w1, a, b, 1, UVCCL_INT32, UVCCL_SUM,
                         on_seq_ar),
         0, "blocked allreduce started");
  is_int(uvccl_barrier(&pg, &w2, on_seq_bar), 0, "barrier started");
  is_int(uvccl_nccl_stream_wait(&pg, &w3, user, on_seq_wait), 0,
         "stream_wait started");
  for (i = 0; i < 500 && ev_wait == 0; i++) run_for(10);
  ok(ev_wait > 0 && ev_allreduce == 0 && ev_barrier == 0,
     "stream_wait's callback ran while the GPU is still blocked (host never "
     "waits)");
  is_int(f_enqueue(user, probe_fn, &probe), 0, "probe queued on user stream");
  run_for(50);
  ok(!probe.ran, "user stream waits for the group's stream");
  flag = 1;
  while (ev_barrier == 0) uv_run(loop, UV_RUN_ONCE);
  ok(ev_allreduce > 0 && ev_allreduce < ev_barrier,
     "barrier completes after the earlier allreduce");
  f_stream_sync(user);
  ok(probe.ran && probe.seen == 42,
     "user stream's later work saw the allreduce result (%d)", probe.seen);
  /* the other direction: the group waits for the user's stream */
  f_wait_flag(user, &uflag);
  v = 7;
  put(a, &v, 4);
  is_int(uvccl_nccl_wait_stream(&pg, &w4, user, NULL), 0,
         "wait_stream started");
  is_int(uvccl_work_wait(&w4), 0, "wait_stream done at once");
  ev_allreduce = 0;
  is_int(uvccl_allreduce(&pg, &w1, a, b, 1, UVCCL_INT32, UVCCL_SUM,
                         on_seq_ar),
         0, "allreduce after wait_stream started");
  run_for(100);
  is_int(ev_allreduce, 0, "allreduce waits for the user's stream");
  uflag = 1;
  is_int(uvccl_work_wait(&w1), 0, "allreduce done once the user's stream is");
  get(&v, b, 4);
  is_int(v, 7, "allreduce result");
  f_stream_destroy(user);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_timeouts(void) {
  volatile uint32_t flag = 0;
  void *a = dev(64), *b = dev(64);
  uvccl_work_t w1 = {0}, w2 = {0};
  double t0;
  f_block_next(&flag);
  w1.timeout_ms = 200;
  w2.timeout_ms = 100;
  t0 = now_s();
  is_int(uvccl_allreduce(&pg, &w1, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "blocked op with 200 ms timeout started");
  is_int(uvccl_allreduce(&pg, &w2, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "op with 100 ms timeout queued behind it");
  is_int(uvccl_work_wait(&w1), UV_ETIMEDOUT, "blocked op timed out");
  ok(now_s() - t0 >= 0.19 && now_s() - t0 < 3, "after about 200 ms (%.3f s)",
     now_s() - t0);
  ok(strstr(w1.msg, "allreduce") != NULL, "message names the op: %s", w1.msg);
  run_for(200);
  ok(!uvccl_work_done(&w2),
     "queued op has not timed out: its clock starts on the GPU");
  flag = 1;
  is_int(uvccl_work_wait(&w2), 0, "queued op completes once the GPU frees");
  /* the library's own hook (cuStreamWaitValue32), as t/3010 uses it */
  {
    static volatile uint32_t hook_flag = 0;
    uvccl__nccl_debug_block_next((void *)&hook_flag);
    w1.timeout_ms = 100;
    is_int(uvccl_barrier(&pg, &w1, NULL), 0, "barrier blocked by the hook");
    is_int(uvccl_work_wait(&w1), UV_ETIMEDOUT, "hook: barrier timed out");
    hook_flag = 1;
    w1.timeout_ms = 0;
    is_int(uvccl_barrier(&pg, &w1, NULL), 0, "next barrier");
    is_int(uvccl_work_wait(&w1), 0, "next barrier completes");
  }
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static int cancel_calls, cancel_status;
static void on_cancel_cb(uvccl_work_t *w, int status) {
  (void)w;
  cancel_calls++;
  cancel_status = status;
}

/* Cancel lets go of the work, not of the GPU op; the group's default
 * timeout applies when the work has none. */
static void test_cancel_and_group_timeout(void) {
  static volatile uint32_t flag = 0;
  void *a = dev(64), *b = dev(64);
  uvccl_work_t w = {0}, w2 = {0};
  f_block_next(&flag);
  is_int(uvccl_allreduce(&pg, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM,
                         on_cancel_cb),
         0, "blocked op started");
  is_int(uvccl_work_cancel(&w), 0, "cancel");
  run_for(50);
  ok(cancel_calls == 1 && cancel_status == UV_ECANCELED,
     "callback once, UV_ECANCELED");
  is_int(uvccl_allreduce(&pg, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "the work is reusable while the old op still runs");
  flag = 1;
  is_int(uvccl_work_wait(&w), 0, "the new op completes after the old one");
  run_for(20);
  is_int(cancel_calls, 1, "no second callback for the cancelled op");
  /* the group's default timeout */
  flag = 0;
  uvccl_pg_set_timeout(&pg, 150);
  f_block_next(&flag);
  is_int(uvccl_barrier(&pg, &w2, NULL), 0, "blocked barrier");
  is_int(uvccl_work_wait(&w2), UV_ETIMEDOUT, "times out after the group's "
         "default");
  flag = 1;
  uvccl_pg_set_timeout(&pg, 0);
  is_int(uvccl_barrier(&pg, &w2, NULL), 0, "next barrier");
  is_int(uvccl_work_wait(&w2), 0, "completes");
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_subgroups(void) {
  uvccl_pg_t sub, sub2, sp, nsp;
  uvccl_work_t w = {0};
  int one = 0, rc;
  int32_t v = 9, out = 0;
  void *a = dev(4), *b = dev(4);
  put(a, &v, 4);
  is_int(uvccl_pg_new_group(&pg, &sub, &one, 1, "t"), 0, "new_group {0}");
  is_int(sub.rank, 0, "member: rank 0");
  is_int(uvccl_pg_global_rank(&sub, 0), 0, "global rank of 0");
  is_int(uvccl_pg_group_rank(&sub, 0), 0, "group rank of 0");
  /* usable at once: the op waits behind the split */
  is_int(uvccl_allreduce(&sub, &w, a, b, 1, UVCCL_INT32, UVCCL_SUM, NULL), 0,
         "allreduce on the subgroup at once");
  is_int(uvccl_work_wait(&w), 0, "subgroup allreduce done");
  get(&out, b, 4);
  is_int(out, 9, "subgroup allreduce result");
  is_int(uvccl_pg_new_group(&pg, &sub2, &one, 1, "t"), 0,
         "same tag: find-or-create");
  ok(sub2.impl_ == sub.impl_, "the same group");
  one = 1;
  is_int(uvccl_pg_new_group(&pg, &sub2, &one, 1, NULL), UV_EINVAL,
         "rank outside the parent refused");
  rc = uvccl_pg_split(&pg, &sp, 0, 0, &w, NULL);
  is_int(rc, 0, "split color 0 started");
  is_int(uvccl_work_wait(&w), 0, "split done");
  ok(sp.rank == 0 && sp.size == 1, "split: rank %d size %d", sp.rank, sp.size);
  v = 11;
  put(a, &v, 4);
  is_int(uvccl_broadcast(&sp, &w, a, 1, UVCCL_INT32, 0, NULL), 0,
         "broadcast on the split group");
  is_int(uvccl_work_wait(&w), 0, "broadcast on split done");
  is_int(uvccl_pg_split(&pg, &nsp, -1, 0, &w, NULL), 0, "split color -1");
  is_int(uvccl_work_wait(&w), UVCCL_ENOTMEMBER, "not a member");
  ok(nsp.rank == -1, "rank -1");
  destroy_group(&sub2);
  destroy_group(&sub);
  destroy_group(&sp);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_abort(void) {
  /* static: the fake GPU may read it after this function returned */
  static volatile uint32_t flag = 0;
  uvccl_pg_t g;
  uvccl_work_t w = {0}, w2 = {0};
  void *a = dev(16), *b = dev(16);
  double t0;
  is_int(make_group(&g, 0, 1, "abort"), 0, "group for abort");
  f_block_next(&flag);
  is_int(uvccl_allreduce(&g, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "blocked op started");
  is_int(uvccl_barrier(&g, &w2, NULL), 0, "barrier queued behind it");
  run_for(50);
  t0 = now_s();
  uvccl_pg_abort(&g, "test");
  is_int(uvccl_work_wait(&w), UVCCL_EABORTED, "blocked op: EABORTED");
  is_int(uvccl_work_wait(&w2), UVCCL_EABORTED, "queued op: EABORTED");
  ok(now_s() - t0 < 1.0, "promptly (%.3f s)", now_s() - t0);
  is_int(uvccl_barrier(&g, &w, NULL), UVCCL_EABORTED,
         "later ops refused after abort");
  destroy_group(&g);
  flag = 1; /* abort does not free a wait NCCL does not own */
  run_for(100); /* the released copy still reads a and b */
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_async_error(void) {
  uvccl_pg_t g;
  uvccl_work_t w = {0};
  void *a = dev(16), *b = dev(16);
  is_int(make_group(&g, 0, 1, "asyncerr"), 0, "group for async error");
  f_fail_next();
  is_int(uvccl_allreduce(&g, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "op started");
  is_int(uvccl_work_wait(&w), UVCCL_ENCCL, "op failed: UVCCL_ENCCL");
  ok(strstr(w.msg, "injected") != NULL, "message has NCCL's text: %s", w.msg);
  is_int(uvccl_barrier(&g, &w, NULL), UVCCL_ENCCL, "later ops refused");
  destroy_group(&g); /* aborts the broken communicator: frees the hang */
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_destroy_pending(void) {
  volatile uint32_t flag = 0;
  uvccl_pg_t g;
  uvccl_work_t w = {0};
  void *a = dev(16), *b = dev(16);
  int before;
  is_int(make_group(&g, 0, 1, "destroy"), 0, "group for destroy");
  f_block_next(&flag);
  is_int(uvccl_allreduce(&g, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "blocked op started");
  before = closed;
  uvccl_pg_destroy(&g, on_closed);
  is_int(uvccl_work_wait(&w), UV_ECANCELED, "pending op: UV_ECANCELED");
  run_for(50);
  is_int(closed, before, "close waits for the GPU to pass the op");
  flag = 1;
  while (closed == before) uv_run(loop, UV_RUN_ONCE);
  ok(1, "closed once the op finished on the GPU");
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

/* The fake NCCL accepts several ranks in one process, each on its own
 * device (t/3005). Here, with one fake device, two ranks cannot work: a
 * rank alone waits for its peer until its creation times out, and two
 * ranks on one device are refused as NCCL refuses them ("Duplicate GPU")
 * or, when the device thread is busy polling one rank's init, time out. */
static void test_two_ranks_refused(void) {
  uvccl_pg_t g, g1;
  uvccl_pg_options_t o;
  uvccl_work_t w0 = {0}, w1 = {0};
  int before, rc0, rc1, live0 = f_live_comms();
  memset(&o, 0, sizeof(o));
  o.size = 2;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = -1;
  o.prefix = "two";
  o.timeout_ms = 200;
  is_int(uvccl_pg_init(loop, &g, &store, &o, &w0, NULL), 0, "rank 0 of 2 "
         "alone starts");
  is_int(uvccl_work_wait(&w0), UV_ETIMEDOUT, "its peer never joins: "
         "UV_ETIMEDOUT");
  destroy_group(&g);
  is_int(f_live_comms(), live0, "the communicator it was making is gone");
  /* both ranks in this process: rank 1 gets rank 0's id from the store */
  o.prefix = "pair";
  o.timeout_ms = 300;
  o.rank = 1;
  is_int(uvccl_pg_init(loop, &g1, &store, &o, &w1, NULL), 0, "rank 1 starts");
  run_for(50);
  ok(!uvccl_work_done(&w1), "rank 1 waits for rank 0's id");
  o.rank = 0;
  is_int(uvccl_pg_init(loop, &g, &store, &o, &w0, NULL), 0, "rank 0 starts");
  rc1 = uvccl_work_wait(&w1);
  rc0 = uvccl_work_wait(&w0);
  ok((rc0 == UVCCL_ENCCL || rc0 == UV_ETIMEDOUT) &&
     (rc1 == UVCCL_ENCCL || rc1 == UV_ETIMEDOUT),
     "two ranks on one device fail: rank 0 %s, rank 1 %s",
     uvccl_err_name(rc0), uvccl_err_name(rc1));
  ok((rc0 != UVCCL_ENCCL || strstr(w0.msg, "Duplicate GPU")) &&
     (rc1 != UVCCL_ENCCL || strstr(w1.msg, "Duplicate GPU")),
     "messages: %s / %s", w0.msg, w1.msg);
  destroy_group(&g);
  destroy_group(&g1);
  is_int(f_live_comms(), live0, "no communicator left");
  /* destroyed while waiting for the id */
  o.rank = 1;
  o.prefix = "lonely";
  is_int(uvccl_pg_init(loop, &g1, &store, &o, &w1, NULL), 0,
         "a rank 1 alone starts");
  run_for(30);
  before = closed;
  uvccl_pg_destroy(&g1, on_closed);
  is_int(uvccl_work_wait(&w1), UV_ECANCELED, "destroy during creation: "
         "UV_ECANCELED");
  while (closed == before) uv_run(loop, UV_RUN_ONCE);
  ok(1, "and the close callback ran");
}

/* In a child: no CUDA runtime at all. */
static void no_gpu_child(int fd) {
  uvccl_pg_t g;
  uvccl_work_t w = {0};
  uvccl_pg_options_t o;
  int rc, res[2];
  setenv("UVCCL_CUDART", "/nonexistent/libcudart.so.13", 1);
  memset(&o, 0, sizeof(o));
  o.size = 1;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = -1;
  rc = uvccl_pg_init(loop, &g, &store, &o, &w, NULL);
  res[0] = rc;
  res[1] = rc == 0 ? uvccl_work_wait(&w) : rc;
  if (write(fd, res, sizeof(res)) != sizeof(res)) _exit(3);
  if (write(fd, w.msg, sizeof(w.msg)) != sizeof(w.msg)) _exit(3);
  _exit(0);
}

static void test_no_gpu(void) {
  int fds[2], res[2] = {1, 1}, st;
  char msg[UVCCL_WORK_MSG_LEN] = "";
  pid_t pid;
  if (pipe(fds) != 0) abort();
  fflush(stdout);
  pid = fork();
  if (pid == 0) no_gpu_child(fds[1]);
  close(fds[1]);
  if (read(fds[0], res, sizeof(res)) != sizeof(res) ||
      read(fds[0], msg, sizeof(msg)) != sizeof(msg))
    note("no result from the child");
  close(fds[0]);
  waitpid(pid, &st, 0);
  is_int(res[0], 0, "no GPU: pg_init starts");
  is_int(res[1], UVCCL_ENOGPU, "no GPU: the work fails with UVCCL_ENOGPU");
  ok(strstr(msg, "nonexistent") != NULL, "with the reason: %s", msg);
}

static void test_init_url(void) {
  uvccl_pg_t g;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  char url[128], path[64];
  int32_t v = 3, out = 0;
  void *a = dev(4), *b = dev(4);
  snprintf(path, sizeof(path), "/tmp/uvccl-3003-%d", (int)getpid());
  snprintf(url, sizeof(url), "file://%s", path);
  unlink(path);
  memset(&o, 0, sizeof(o));
  o.size = 1;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = -1;
  is_int(uvccl_pg_init_url(loop, &g, url, &o, &w, NULL), 0,
         "init_url file://: started");
  is_int(uvccl_work_wait(&w), 0, "init_url: group ready");
  put(a, &v, 4);
  is_int(uvccl_allreduce(&g, &w, a, b, 1, UVCCL_INT32, UVCCL_SUM, NULL), 0,
         "allreduce on it");
  is_int(uvccl_work_wait(&w), 0, "done");
  get(&out, b, 4);
  is_int(out, 3, "result");
  destroy_group(&g); /* closes the file store it made */
  ok(access(path, F_OK) != 0, "the group's file store closed (file removed)");
  is_int(uvccl_pg_init_url(loop, &g, "bogus://x", &o, &w, NULL), UV_EINVAL,
         "unknown scheme refused");
  /* env://: rank 0 hosts the store server itself */
  {
    uvccl_store_server_t srv;
    uvccl_store_server_options_t so;
    char port[16];
    memset(&so, 0, sizeof(so));
    so.host = "127.0.0.1";
    so.listen_fd = -1;
    if (uvccl_store_server_init(loop, &srv, &so) == 0) {
      snprintf(port, sizeof(port), "%d", srv.port); /* a free port */
      uvccl_store_server_close(&srv, NULL);
      uv_run(loop, UV_RUN_NOWAIT);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", "1", 1);
      memset(&o, 0, sizeof(o));
      o.backend = UVCCL_BACKEND_NCCL;
      o.device = -1;
      is_int(uvccl_pg_init_url(loop, &g, "env://", &o, &w, NULL), 0,
             "init_url env://: started");
      is_int(uvccl_work_wait(&w), 0, "env://: group ready (%s)", w.msg);
      is_int(uvccl_barrier(&g, &w, NULL), 0, "barrier on it");
      is_int(uvccl_work_wait(&w), 0, "done");
      destroy_group(&g); /* and its store server */
      unsetenv("MASTER_ADDR");
      unsetenv("MASTER_PORT");
      unsetenv("RANK");
      unsetenv("WORLD_SIZE");
    } else {
      skip(4, "no loopback store server");
    }
  }
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

int main(void) {
  int live;
  tap_alarm(120);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("UVCCL_NCCL", FAKE_NCCL, 1);
  setenv("UVCCL_NCCL_WATCHDOG_MS", "20", 1);
  loop = uv_default_loop();
  is_int(uvccl_hash_store_init(loop, &store), 0, "hash store");
  test_no_gpu();
  is_int(make_group(&pg, 0, 1, NULL), 0, "one-rank NCCL group created");
  load_hooks();
  ok(pg.rank == 0 && pg.size == 1, "rank 0 of 1");
  is_int(uvccl_pg_global_rank(&pg, 0), 0, "global_rank");
  test_allreduce_matrix();
  test_bool_inplace_and_simple_ops();
  test_float8();
  test_p2p();
  test_many_in_order();
  test_stream_order_and_barrier();
  test_timeouts();
  test_cancel_and_group_timeout();
  test_subgroups();
  test_abort();
  test_async_error();
  test_destroy_pending();
  test_two_ranks_refused();
  test_init_url();
  destroy_group(&pg);
  live = f_live_comms();
  is_int(live, 0, "every fake communicator destroyed or aborted");
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return done_testing();
}
