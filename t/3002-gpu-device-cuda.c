/* The GPU thread on a real CUDA device (skipped without one): queued
 * copies between pinned host memory and the device, exact results and
 * completion order, the GPU-done -> done() latency, and a timeout on a
 * stream blocked with cuStreamWaitValue32 on a host flag, measured from
 * when the blocked op started. The fake-runtime twin is 3002-gpu-device. */
#include "tap.h"
#include "uvccl.h"
#include "cuda/cuda_api.h"
#include "cuda/gpu.h"

#define NOPS 2000
#define CHUNK 256
#define NPING 1000

typedef struct {
  uvccl__gpu_op_t op; /* first */
  void *dst;
  const void *src;
  size_t n;
  volatile uint32_t *wait_flag; /* block the stream on it instead */
  int seq;
  int done_calls;
  uint64_t done_ns;
} cop_t;

static uv_loop_t loop;
static int next_seq, order_bad, ping_left;
static uint64_t ping_lat[NPING];
static uvccl__gpu_client_t *client;

static int cop_issue(uvccl__gpu_op_t *op) {
  cop_t *c = (cop_t *)op;
  int rc;
  if (c->wait_flag != NULL)
    rc = uvccl__cuda.StreamWaitValue32(op->stream, (uintptr_t)c->wait_flag,
                                       1, UVCCL__CU_STREAM_WAIT_VALUE_GEQ);
  else
    rc = uvccl__cuda.MemcpyAsync(c->dst, c->src, c->n,
                                 UVCCL__CUDA_MEMCPY_DEFAULT, op->stream);
  if (rc != 0) {
    snprintf(op->msg, sizeof(op->msg), "issue failed: %d", rc);
    return UVCCL_ECUDA;
  }
  return 0;
}

static void cop_done(uvccl__gpu_op_t *op) {
  cop_t *c = (cop_t *)op;
  c->done_calls++;
  c->done_ns = uvccl__now_ns();
  if (c->seq >= 0) {
    if (c->seq != next_seq) order_bad = 1;
    next_seq = c->seq + 1;
  }
}

static void ping_done(uvccl__gpu_op_t *op) {
  ping_lat[NPING - ping_left] = op->t_done_ns - op->t_gpu_done_ns;
  if (op->status == 0 && --ping_left > 0) uvccl__gpu_submit(client, op);
}

static void make(cop_t *c, void *stream, void *dst, const void *src,
                 size_t n) {
  memset(c, 0, sizeof(*c));
  c->op.issue = cop_issue;
  c->op.done = cop_done;
  c->op.stream = stream;
  c->dst = dst;
  c->src = src;
  c->n = n;
  c->seq = -1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static volatile uint32_t *flag;
static void release_cb(uv_timer_t *t) {
  *flag = 1;
  uv_close((uv_handle_t *)t, NULL);
}

int main(void) {
  uvccl__gpu_t *gpu = NULL;
  cop_t *ops, ping, blocked, behind;
  unsigned char *src = NULL, *back = NULL;
  void *dev = NULL, *stream = NULL, *host = NULL;
  char err[256] = "", name[256] = "";
  uv_timer_t release;
  int n = 0, i, bad = 0, x = 0;

  tap_alarm(60);
  unsetenv("UVCCL_CUDART"); /* the real runtime */
  if (uvccl_gpu_device_count(&n) != 0)
    skip_all("no CUDA device (%s)", uvccl_gpu_unavailable_reason());
  uvccl_gpu_info(0, name, sizeof(name), NULL, NULL);
  note("device 0: %s (%d device(s))", name, n);
  uv_loop_init(&loop);
  tap_require(uvccl__gpu_acquire(0, &gpu, err, sizeof(err)) == 0,
              "acquire device 0: %s", err);
  tap_require(uvccl__gpu_client_init(&loop, gpu, &client) == 0, "client");
  tap_require(uvccl__cuda.SetDevice(0) == 0 &&
                  uvccl__cuda.StreamCreateWithFlags(
                      &stream, UVCCL__CUDA_STREAM_NON_BLOCKING) == 0,
              "stream");
  tap_require(uvccl_gpu_host_alloc((void **)&src, NOPS * CHUNK) == 0 &&
                  uvccl_gpu_host_alloc((void **)&back, NOPS * CHUNK) == 0 &&
                  uvccl_gpu_host_alloc(&host, 64) == 0 &&
                  uvccl_gpu_malloc(0, &dev, NOPS * CHUNK) == 0,
              "buffers");
  flag = host;
  *flag = 0;

  /* Host -> device in NOPS ops, then device -> host in one. */
  ops = calloc(NOPS + 1, sizeof(*ops));
  for (i = 0; i < NOPS * CHUNK; i++) src[i] = (unsigned char)(i * 29 + 1);
  memset(back, 0, NOPS * CHUNK);
  for (i = 0; i < NOPS; i++) {
    make(&ops[i], stream, (char *)dev + (size_t)i * CHUNK,
         src + (size_t)i * CHUNK, CHUNK);
    ops[i].seq = i;
    if (uvccl__gpu_submit(client, &ops[i].op) != 0) bad++;
  }
  make(&ops[NOPS], stream, back, dev, NOPS * CHUNK);
  ops[NOPS].seq = NOPS;
  if (uvccl__gpu_submit(client, &ops[NOPS].op) != 0) bad++;
  is_int(bad, 0, "%d copies submitted", NOPS + 1);
  uv_run(&loop, UV_RUN_DEFAULT);
  for (i = 0, bad = 0; i <= NOPS; i++)
    if (ops[i].done_calls != 1 || ops[i].op.status != 0) bad++;
  is_int(bad, 0, "every done() once, status 0");
  ok(!order_bad, "done() in stream order");
  ok(memcmp(back, src, NOPS * CHUNK) == 0, "round trip through the GPU: exact");

  make(&ping, stream, &x, dev, sizeof(x));
  ping.op.done = ping_done;
  ping_left = NPING;
  is_int(uvccl__gpu_submit(client, &ping.op), 0, "ping-pong");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(ping_left, 0, "%d ops one after another", NPING);
  qsort(ping_lat, NPING, sizeof(ping_lat[0]), cmp_u64);
  note("GPU done -> done(), one op at a time: median %.1f us, p90 %.1f us",
       ping_lat[NPING / 2] / 1e3, ping_lat[NPING * 9 / 10] / 1e3);

  if (uvccl__cuda.StreamWaitValue32 == NULL) {
    skip(4, "cuStreamWaitValue32 not available from this driver");
  } else {
    /* blocked: waits for the flag, times out 200 ms after it started;
     * behind (timeout 100 ms) has not started then, and completes once
     * the flag is set at 500 ms. */
    make(&blocked, stream, NULL, NULL, 0);
    blocked.wait_flag = flag;
    blocked.op.timeout_ms = 200;
    make(&behind, stream, back, dev, CHUNK);
    behind.op.timeout_ms = 100;
    uvccl__gpu_submit(client, &blocked.op);
    uvccl__gpu_submit(client, &behind.op);
    uv_timer_init(&loop, &release);
    uv_timer_start(&release, release_cb, 500, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    is_int(blocked.op.status, UV_ETIMEDOUT, "blocked op timed out");
    ok((blocked.done_ns - blocked.op.t_submit_ns) / 1e6 >= 195,
       "after %.0f ms", (blocked.done_ns - blocked.op.t_submit_ns) / 1e6);
    is_int(behind.op.status, 0, "the op behind it did not time out");
    ok((behind.done_ns - behind.op.t_submit_ns) / 1e6 >= 450,
       "it completed after the release (%.0f ms)",
       (behind.done_ns - behind.op.t_submit_ns) / 1e6);
  }

  uvccl__gpu_client_close(client, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uvccl__cuda.StreamSynchronize(stream);
  uvccl__cuda.StreamDestroy(stream);
  uvccl__gpu_release(gpu);
  uvccl_gpu_free(dev);
  uvccl_gpu_host_free(src);
  uvccl_gpu_host_free(back);
  uvccl_gpu_host_free(host);
  free(ops);
  is_int(uv_loop_close(&loop), 0, "uv_loop_close() == 0");
  return done_testing();
}
