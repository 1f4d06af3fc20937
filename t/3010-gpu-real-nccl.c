/* NCCL process groups on a REAL GPU with the real libnccl: a one-rank
 * communicator (NCCL refuses two ranks on one GPU). Every operation with
 * exact results, grouped send/recv to self, stream ordering, a timeout
 * and an abort provoked by a stream blocked on a host flag
 * (cuStreamWaitValue32 from cudaGetDriverEntryPointByVersion, through the
 * library's test hook), and thousands of queued ops completing in order
 * exactly once. Skips where there is no CUDA device. Several processes
 * sharing the GPU are not for NCCL (2.28 says "Duplicate GPU detected"):
 * not tested. */
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"
#include "cuda/cuda_api.h"
#include "nccl/nccl.h"
#include "nccl/nccl_api.h"

#include <time.h>

static uv_loop_t *loop;
static uvccl_store_t store;
static uvccl_pg_t pg;


static void run_for(uint64_t ms) { run_loop_for(loop, ms); }

static void *dev(size_t n) { return dev_on(0, n); }

static int make_group(uvccl_pg_t *g, const char *prefix) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  int rc;
  memset(&o, 0, sizeof(o));
  o.rank = 0;
  o.size = 1;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = 0;
  o.prefix = prefix;
  o.timeout_ms = 60000;
  rc = uvccl_pg_init(loop, g, &store, &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) note("pg_init: %s", w.msg);
  return rc;
}

static int closed;
static void on_closed(uvccl_pg_t *g) { (void)g; closed++; }
static void destroy_group(uvccl_pg_t *g) {
  int before = closed;
  uvccl_pg_destroy(g, on_closed);
  while (closed == before) uv_run(loop, UV_RUN_ONCE);
}

#define N 1000

static void test_ops(void) {
  float h[4 * N], out[4 * N];
  void *a = dev(sizeof(h)), *b = dev(sizeof(h));
  uvccl_work_t w = {0};
  uvccl_redop_t premul;
  size_t counts[1] = {N}, i;
  void *bufs[1] = {b};
  int ok_all;
  for (i = 0; i < 4 * N; i++) h[i] = (float)(i % 97) + 0.5f;
  put(a, h, N * 4);
#define RUN(call, what)                                                      \
  do {                                                                       \
    memset(out, 0, sizeof(out));                                             \
    put(b, out, N * 4);                                                      \
    is_int(call, 0, what ": started");                                       \
    is_int(uvccl_work_wait(&w), 0, what ": done");                           \
    get(out, b, N * 4);                                                      \
  } while (0)
  RUN(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_FLOAT32, UVCCL_SUM, NULL),
      "allreduce");
  ok(memcmp(out, h, N * 4) == 0, "allreduce: exact");
  RUN(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_FLOAT32, UVCCL_AVG, NULL),
      "allreduce AVG");
  ok(memcmp(out, h, N * 4) == 0, "allreduce AVG (one rank): exact");
  is_int(uvccl_pg_premul_sum(&pg, 2.0, &premul), 0, "premul op");
  RUN(uvccl_allreduce(&pg, &w, a, b, N, UVCCL_FLOAT32, premul, NULL),
      "allreduce PREMUL_SUM(2)");
  for (ok_all = 1, i = 0; i < N; i++)
    if (out[i] != 2 * h[i]) ok_all = 0;
  ok(ok_all, "PREMUL_SUM: exact doubling");
  RUN(uvccl_reduce(&pg, &w, a, b, N, UVCCL_FLOAT32, UVCCL_MAX, 0, NULL),
      "reduce");
  ok(memcmp(out, h, N * 4) == 0, "reduce: exact");
  RUN(uvccl_allgather(&pg, &w, a, b, N, UVCCL_FLOAT32, NULL), "allgather");
  ok(memcmp(out, h, N * 4) == 0, "allgather: exact");
  RUN(uvccl_allgatherv(&pg, &w, a, N, bufs, counts, UVCCL_FLOAT32, NULL),
      "allgatherv");
  ok(memcmp(out, h, N * 4) == 0, "allgatherv: exact");
  RUN(uvccl_reduce_scatter(&pg, &w, a, b, N, UVCCL_FLOAT32, UVCCL_SUM, NULL),
      "reduce_scatter");
  ok(memcmp(out, h, N * 4) == 0, "reduce_scatter: exact");
  RUN(uvccl_reduce_scatterv(&pg, &w, a, b, counts, UVCCL_FLOAT32, UVCCL_SUM,
                            NULL),
      "reduce_scatterv");
  ok(memcmp(out, h, N * 4) == 0, "reduce_scatterv: exact");
  RUN(uvccl_gather(&pg, &w, a, b, N, UVCCL_FLOAT32, 0, NULL), "gather");
  ok(memcmp(out, h, N * 4) == 0, "gather: exact");
  RUN(uvccl_scatter(&pg, &w, a, b, N, UVCCL_FLOAT32, 0, NULL), "scatter");
  ok(memcmp(out, h, N * 4) == 0, "scatter: exact");
  RUN(uvccl_alltoall(&pg, &w, a, b, N, UVCCL_FLOAT32, NULL), "alltoall");
  ok(memcmp(out, h, N * 4) == 0, "alltoall: exact");
  RUN(uvccl_alltoallv(&pg, &w, a, counts, b, counts, UVCCL_FLOAT32, NULL),
      "alltoallv");
  ok(memcmp(out, h, N * 4) == 0, "alltoallv: exact");
  put(b, h, N * 4);
  is_int(uvccl_broadcast(&pg, &w, b, N, UVCCL_FLOAT32, 0, NULL), 0,
         "broadcast: started");
  is_int(uvccl_work_wait(&w), 0, "broadcast: done");
  get(out, b, N * 4);
  ok(memcmp(out, h, N * 4) == 0, "broadcast: exact");
  is_int(uvccl_barrier(&pg, &w, NULL), 0, "barrier: started");
  is_int(uvccl_work_wait(&w), 0, "barrier: done");
  /* every dtype NCCL has, SUM and MAX, int and float */
  {
    static const uvccl_dtype_t dts[] = {UVCCL_INT8,     UVCCL_UINT8,
                                        UVCCL_BOOL,     UVCCL_INT32,
                                        UVCCL_INT64,    UVCCL_FLOAT16,
                                        UVCCL_BFLOAT16, UVCCL_FLOAT64,
                                        UVCCL_COMPLEX64, UVCCL_COMPLEX128};
    unsigned char hb[N * 16], ob[N * 16];
    size_t d;
    int good = 0;
    for (i = 0; i < sizeof(hb); i++) hb[i] = (unsigned char)(i % 2 ? 0 : 1);
    /* small values: 0/1 bytes are valid in every type's pattern here */
    for (d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
      size_t es = uvccl_dtype_size(dts[d]);
      void *x = dev(N * es), *y = dev(N * es);
      put(x, hb, N * es);
      if (uvccl_allreduce(&pg, &w, x, y, N, dts[d], UVCCL_SUM, NULL) == 0 &&
          uvccl_work_wait(&w) == 0) {
        get(ob, y, N * es);
        if (memcmp(ob, hb, N * es) == 0) good++;
        else note("%s SUM: wrong data", uvccl_dtype_name(dts[d]));
      } else {
        note("%s SUM: %s", uvccl_dtype_name(dts[d]), w.msg);
      }
      uvccl_gpu_free(x);
      uvccl_gpu_free(y);
    }
    is_int(good, 10, "SUM on every dtype: exact (one rank: a copy)");
  }
  /* grouped send/recv to self */
  {
    uvccl_p2p_op_t ops[2];
    memset(ops, 0, sizeof(ops));
    memset(out, 0, sizeof(out));
    put(b, out, N * 4);
    ops[0] = (uvccl_p2p_op_t){1, a, N * 4, 0, 0, 0, 0};
    ops[1] = (uvccl_p2p_op_t){0, b, N * 4, 0, 0, 0, 0};
    is_int(uvccl_p2p_batch(&pg, &w, ops, 2, NULL), 0, "send/recv to self");
    is_int(uvccl_work_wait(&w), 0, "send/recv to self: done");
    get(out, b, N * 4);
    ok(memcmp(out, h, N * 4) == 0, "send/recv to self: exact");
  }
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static int order_next, order_bad, order_calls;
static void on_ordered(uvccl_work_t *w, int status) {
  if (status != 0 || (int)(intptr_t)w->data != order_next) order_bad++;
  order_next++;
  order_calls++;
}

static void test_many(void) {
  enum { M = 5000 };
  uvccl_work_t *ws = calloc(M, sizeof(*ws));
  int32_t *h = malloc(M * 4), *o = malloc(M * 4);
  void *a = dev(M * 4), *b = dev(M * 4);
  int i, started = 0;
  double t0;
  for (i = 0; i < M; i++) h[i] = i * 3 - 7;
  put(a, h, M * 4);
  order_next = order_bad = order_calls = 0;
  t0 = now_s();
  for (i = 0; i < M; i++) {
    ws[i].data = (void *)(intptr_t)i;
    started += uvccl_allreduce(&pg, &ws[i], (int32_t *)a + i,
                               (int32_t *)b + i, 1, UVCCL_INT32, UVCCL_SUM,
                               on_ordered) == 0;
  }
  is_int(started, M, "5000 allreduces queued");
  while (order_calls < M) uv_run(loop, UV_RUN_ONCE);
  note("5000 queued allreduces: %.1f us each", (now_s() - t0) * 1e6 / M);
  run_for(20);
  is_int(order_calls, M, "every callback exactly once");
  is_int(order_bad, 0, "in order, all succeeded");
  get(o, b, M * 4);
  ok(memcmp(o, h, M * 4) == 0, "every result exact");
  free(ws);
  free(h);
  free(o);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_timeout_and_abort(void) {
  volatile uint32_t *flag = NULL;
  void *p = NULL, *a = dev(64), *b = dev(64);
  uvccl_work_t w = {0}, w2 = {0};
  uvccl_pg_t g;
  double t0;
  if (uvccl__cuda.StreamWaitValue32 == NULL ||
      uvccl__cuda.HostAlloc(&p, 64, UVCCL__CUDA_HOST_ALLOC_PORTABLE |
                                        UVCCL__CUDA_HOST_ALLOC_MAPPED) != 0) {
    skip(9, "no cuStreamWaitValue32 or mapped pinned memory");
    return;
  }
  flag = p;
  *flag = 0;
  /* timeout: the allreduce starts, then hangs on the flag */
  uvccl__nccl_debug_block_next(p);
  w.timeout_ms = 300;
  t0 = now_s();
  is_int(uvccl_allreduce(&pg, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "blocked allreduce started");
  is_int(uvccl_work_wait(&w), UV_ETIMEDOUT, "timed out");
  ok(now_s() - t0 >= 0.29 && now_s() - t0 < 5, "after about 300 ms (%.3f s)",
     now_s() - t0);
  *flag = 1;
  w.timeout_ms = 0;
  is_int(uvccl_barrier(&pg, &w, NULL), 0, "barrier after release");
  is_int(uvccl_work_wait(&w), 0, "the stream moves again");
  /* abort: a separate group, blocked, aborted */
  *flag = 0;
  if (make_group(&g, "abort") != 0) {
    skip(4, "second group failed");
    *flag = 1;
    return;
  }
  uvccl__nccl_debug_block_next(p);
  is_int(uvccl_allreduce(&g, &w, a, b, 4, UVCCL_FLOAT32, UVCCL_SUM, NULL), 0,
         "blocked op on group 2");
  is_int(uvccl_barrier(&g, &w2, NULL), 0, "barrier queued behind it");
  run_for(100);
  t0 = now_s();
  uvccl_pg_abort(&g, "test");
  is_int(uvccl_work_wait(&w), UVCCL_EABORTED, "blocked op: EABORTED");
  ok(now_s() - t0 < 1.0, "promptly (%.3f s)", now_s() - t0);
  *flag = 1; /* ncclCommAbort does not release a wait it does not own */
  uvccl_work_wait(&w2);
  destroy_group(&g);
  run_for(100); /* the released op may still be reading a and b */
  uvccl__cuda.FreeHost(p);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

static void test_stream_wait(void) {
  void *s = NULL, *a = dev(4), *b = dev(4);
  int32_t v = 5, out = 0;
  uvccl_work_t w = {0};
  if (uvccl__cuda.StreamCreateWithFlags(&s, UVCCL__CUDA_STREAM_NON_BLOCKING)) {
    skip(3, "no stream");
    return;
  }
  put(a, &v, 4);
  is_int(uvccl_allreduce(&pg, &w, a, b, 1, UVCCL_INT32, UVCCL_SUM, NULL), 0,
         "allreduce");
  uvccl_work_wait(&w);
  is_int(uvccl_nccl_stream_wait(&pg, &w, s, NULL), 0, "stream_wait");
  is_int(uvccl_work_wait(&w), 0, "stream_wait done");
  uvccl__cuda.MemcpyAsync(&out, b, 4, UVCCL__CUDA_MEMCPY_DEFAULT, s);
  uvccl__cuda.StreamSynchronize(s);
  is_int(out, 5, "copy on the user's stream sees the result");
  uvccl__cuda.StreamDestroy(s);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
}

int main(void) {
  int n = 0, drv = 0, rt = 0;
  char name[256] = "", err[256] = "";
  tap_alarm(300);
  if (uvccl_gpu_device_count(&n) != 0 || n <= 0)
    skip_all("no CUDA device");
  if (uvccl__nccl_api_load(err, sizeof(err)) != 0)
    skip_all("no NCCL: %s", err);
  uvccl_gpu_info(0, name, sizeof(name), &drv, &rt);
  note("device 0: %s; driver %d; CUDA runtime %d; NCCL %d", name, drv, rt,
       uvccl__nccl.version);
  loop = uv_default_loop();
  is_int(uvccl_hash_store_init(loop, &store), 0, "hash store");
  if (make_group(&pg, NULL) != 0) {
    ok(0, "one-rank NCCL group created");
    return done_testing();
  }
  ok(1, "one-rank NCCL group created");
  test_ops();
  test_stream_wait();
  test_many();
  test_timeout_and_abort();
  destroy_group(&pg);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return done_testing();
}
