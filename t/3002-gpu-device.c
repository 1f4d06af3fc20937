/* The GPU thread and its clients (src/cuda/device.c), against the fake
 * CUDA runtime: thousands of queued copies (done() exactly once, on the
 * loop, in stream order, never inside submit, exact results), timeouts
 * measured from when the work starts on the GPU, fail_all while the GPU is
 * blocked, the heartbeat watchdog, close with ops pending, host-only ops,
 * issue() answering AGAIN, and the GPU-done -> done() latency. */
#include "tap.h"
#include "uvccl.h"
#include "cuda/cuda_api.h"
#include "cuda/gpu.h"
#include "fake/fake.h"

#include <stdint.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define NBULK 5000
#define CHUNK 64

enum { K_COPY, K_WAIT_FLAG, K_WAIT_VALUE, K_HOST, K_AGAIN, K_FAIL, K_STALL };

typedef struct top_s {
  uvccl__gpu_op_t op; /* first */
  int kind;
  void *dst;
  const void *src;
  size_t n;
  volatile uint32_t *flag;
  int again_left;
  int stream_id; /* -1: no order check */
  int seq;
  int issue_calls;
  int issue_order;
  int issue_device;
  int issue_on_loop;
  int done_calls;
  uint64_t done_ns;
  void (*on_done)(struct top_s *t);
} top_t;

static uv_loop_t loop;
static fake_hooks_t fake;
static uv_thread_t loop_thread;
static int in_submit, done_inside_submit, done_off_loop, order_bad;
static int next_seq[4];
static int issue_counter;

static int t_issue(uvccl__gpu_op_t *op) {
  top_t *t = (top_t *)op;
  uv_thread_t self = uv_thread_self();
  int rc = 0;
  t->issue_calls++;
  t->issue_on_loop = uv_thread_equal(&self, &loop_thread);
  t->issue_device = fake.current_device();
  switch (t->kind) {
  case K_AGAIN:
    if (t->again_left > 0) {
      t->again_left--;
      return UVCCL__GPU_AGAIN;
    }
    /* fall through */
  case K_COPY:
    rc = uvccl__cuda.MemcpyAsync(t->dst, t->src, t->n,
                                 UVCCL__CUDA_MEMCPY_DEFAULT, op->stream);
    break;
  case K_WAIT_FLAG:
    rc = fake.stream_wait_flag(op->stream, t->flag);
    break;
  case K_WAIT_VALUE:
    rc = uvccl__cuda.StreamWaitValue32(op->stream, (uintptr_t)t->flag, 1,
                                       UVCCL__CU_STREAM_WAIT_VALUE_GEQ);
    break;
  case K_HOST:
    break;
  case K_STALL: /* blocks inside issue(), as a hung NCCL init would */
    uvccl__gpu_in_call(op, "fakeBlockingCall");
    usleep(700000);
    uvccl__gpu_in_call(op, NULL);
    break;
  case K_FAIL:
    snprintf(op->msg, sizeof(op->msg), "boom");
    return UVCCL_ENCCL;
  }
  t->issue_order = issue_counter++;
  if (rc != 0) {
    snprintf(op->msg, sizeof(op->msg), "CUDA call failed: %d", rc);
    return UVCCL_ECUDA;
  }
  return 0;
}

static void t_done(uvccl__gpu_op_t *op) {
  top_t *t = (top_t *)op;
  uv_thread_t self = uv_thread_self();
  t->done_calls++;
  t->done_ns = uvccl__now_ns();
  if (in_submit) done_inside_submit = 1;
  if (!uv_thread_equal(&self, &loop_thread)) done_off_loop = 1;
  if (t->stream_id >= 0) {
    if (t->seq != next_seq[t->stream_id]) order_bad = 1;
    next_seq[t->stream_id] = t->seq + 1;
  }
  if (t->on_done) t->on_done(t);
}

static void make_op(top_t *t, int kind, void *stream) {
  memset(t, 0, sizeof(*t));
  t->op.issue = t_issue;
  t->op.done = t_done;
  t->op.stream = stream;
  t->kind = kind;
  t->stream_id = -1;
}

static int submit(uvccl__gpu_client_t *c, top_t *t) {
  int r;
  in_submit = 1;
  r = uvccl__gpu_submit(c, &t->op);
  in_submit = 0;
  return r;
}

static double ms_between(uint64_t a, uint64_t b) { return (b - a) / 1e6; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sets a flag after a delay, from the loop. */
typedef struct {
  uv_timer_t timer;
  volatile uint32_t *flag;
} flag_timer_t;

static void flag_timer_cb(uv_timer_t *h) {
  flag_timer_t *ft = (flag_timer_t *)h;
  *ft->flag = 1;
  uv_close((uv_handle_t *)h, NULL);
}

static void set_flag_later(flag_timer_t *ft, volatile uint32_t *flag,
                           uint64_t ms) {
  ft->flag = flag;
  uv_timer_init(&loop, &ft->timer);
  uv_update_time(&loop);
  uv_timer_start(&ft->timer, flag_timer_cb, ms, 0);
}

/* ---- Cases ---- */

static void bulk(uvccl__gpu_client_t *c, void *s1, void *s2) {
  top_t *ops = calloc(NBULK, sizeof(*ops));
  unsigned char *src = malloc(NBULK * CHUNK), *back = malloc(NBULK * CHUNK);
  uint64_t *lat = malloc(NBULK * sizeof(*lat));
  void *dev = NULL;
  int i, bad_status = 0, not_once = 0, submit_fail = 0, off_thread = 0;
  memset(next_seq, 0, sizeof(next_seq));
  for (i = 0; i < NBULK * CHUNK; i++) src[i] = (unsigned char)(i * 131 + 7);
  tap_require(uvccl_gpu_malloc(0, &dev, NBULK * CHUNK) == 0, "device buffer");
  for (i = 0; i < NBULK; i++) {
    make_op(&ops[i], K_COPY, i % 3 ? s1 : s2);
    ops[i].stream_id = i % 3 ? 0 : 1;
    ops[i].seq = next_seq[ops[i].stream_id + 2]++; /* [2],[3]: counters */
    ops[i].dst = (char *)dev + (size_t)i * CHUNK;
    ops[i].src = src + (size_t)i * CHUNK;
    ops[i].n = CHUNK;
    if (submit(c, &ops[i]) != 0) submit_fail++;
  }
  next_seq[2] = next_seq[3] = 0;
  is_int(submit_fail, 0, "bulk: %d submits accepted", NBULK);
  ok(!done_inside_submit, "bulk: no done() inside submit");
  uv_run(&loop, UV_RUN_DEFAULT);
  for (i = 0; i < NBULK; i++) {
    if (ops[i].done_calls != 1) not_once++;
    if (ops[i].op.status != 0) bad_status++;
    if (ops[i].issue_on_loop || ops[i].issue_device != 0) off_thread++;
    lat[i] = ops[i].op.t_done_ns - ops[i].op.t_gpu_done_ns;
  }
  is_int(not_once, 0, "bulk: every done() ran exactly once");
  is_int(bad_status, 0, "bulk: every status 0");
  ok(!done_off_loop, "bulk: done() on the loop thread");
  ok(!order_bad, "bulk: done() in submission order per stream");
  is_int(off_thread, 0, "bulk: issue() on the GPU thread, device 0 current");
  ok(ops[0].op.t_submit_ns <= ops[0].op.t_issued_ns &&
         ops[0].op.t_issued_ns <= ops[0].op.t_gpu_done_ns &&
         ops[0].op.t_gpu_done_ns <= ops[0].op.t_done_ns,
     "bulk: timestamps in order");
  memset(back, 0, NBULK * CHUNK);
  is_int(uvccl_gpu_memcpy(back, dev, NBULK * CHUNK), 0, "bulk: copy back");
  ok(memcmp(back, src, NBULK * CHUNK) == 0, "bulk: results exact");
  qsort(lat, NBULK, sizeof(*lat), cmp_u64);
  note("GPU done -> done() latency, %d ops in one batch: median %.1f us, p90 %.1f "
       "us, max %.1f us", NBULK, lat[NBULK / 2] / 1e3,
       lat[NBULK * 9 / 10] / 1e3, lat[NBULK - 1] / 1e3);
  uvccl_gpu_free(dev);
  free(ops);
  free(src);
  free(back);
  free(lat);
}


/* One op at a time (the next is submitted from done()), so the latency is
 * that of an idle loop woken by the GPU thread, not of a batch. */
#define NPING 1000
static top_t ping;
static int ping_left;
static uint64_t ping_lat[NPING];
static uvccl__gpu_client_t *ping_client;
static void ping_done(top_t *t) {
  ping_lat[NPING - ping_left] = t->op.t_done_ns - t->op.t_gpu_done_ns;
  if (t->op.status != 0 || --ping_left == 0) return;
  t->on_done = ping_done;
  submit(ping_client, t);
}

static void pingpong(uvccl__gpu_client_t *c, void *s1) {
  static int dst, src = 3;
  make_op(&ping, K_COPY, s1);
  ping.dst = &dst;
  ping.src = &src;
  ping.n = sizeof(int);
  ping.on_done = ping_done;
  ping_left = NPING;
  ping_client = c;
  is_int(submit(c, &ping), 0, "ping-pong: first submit");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(ping_left, 0, "ping-pong: %d ops one after another", NPING);
  qsort(ping_lat, NPING, sizeof(ping_lat[0]), cmp_u64);
  note("one op at a time: GPU done -> done() median %.1f us, p90 %.1f us, "
       "max %.1f us", ping_lat[NPING / 2] / 1e3, ping_lat[NPING * 9 / 10] / 1e3,
       ping_lat[NPING - 1] / 1e3);
}

/* W blocks s1 until a timer releases it at 400 ms; A (timeout 200 ms)
 * waits behind it and then blocks on its own flag: it must time out 200 ms
 * after it started, i.e. not before 600 ms. B (timeout 100 ms) waits
 * behind A and completes fine once A's flag is released. */
static volatile uint32_t *flags;
static flag_timer_t ft1, ft2;
static void release_a_later(top_t *t) { set_flag_later(&ft2, &flags[1], 200); }

static void timeouts(uvccl__gpu_client_t *c, void *s1) {
  top_t w, a, b;
  int dst = 0, src = 42;
  flags[0] = flags[1] = 0;
  make_op(&w, K_WAIT_VALUE, s1);
  w.flag = &flags[0];
  make_op(&a, K_WAIT_FLAG, s1);
  a.flag = &flags[1];
  a.op.timeout_ms = 200;
  a.on_done = release_a_later;
  make_op(&b, K_COPY, s1);
  b.dst = &dst;
  b.src = &src;
  b.n = sizeof(int);
  b.op.timeout_ms = 100;
  ok(uvccl__cuda.StreamWaitValue32 != NULL, "cuStreamWaitValue32 resolved");
  is_int(submit(c, &w), 0, "timeout: submit W (blocks the stream)");
  is_int(submit(c, &a), 0, "timeout: submit A (timeout 200 ms)");
  is_int(submit(c, &b), 0, "timeout: submit B (timeout 100 ms)");
  set_flag_later(&ft1, &flags[0], 400);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(w.op.status, 0, "W completed");
  is_int(a.op.status, UV_ETIMEDOUT, "A timed out");
  ok(strstr(a.op.msg, "timed out on device 0") != NULL, "A's message: %s",
     a.op.msg);
  ok(ms_between(a.op.t_submit_ns, a.done_ns) >= 595,
     "A's timeout ran from its GPU start, not submission (%.0f ms >= 600)",
     ms_between(a.op.t_submit_ns, a.done_ns));
  is_int(b.op.status, 0, "B, queued behind A, did not time out");
  ok(ms_between(b.op.t_submit_ns, b.done_ns) > 100,
     "B completed %.0f ms after submission, beyond its 100 ms timeout",
     ms_between(b.op.t_submit_ns, b.done_ns));
  is_int(dst, 42, "B's copy ran");
  ok(w.done_calls == 1 && a.done_calls == 1 && b.done_calls == 1,
     "timeout: each done() once");
}

/* fail_all while an op is blocked on the GPU, another queued behind it. */
static uvccl__gpu_client_t *abort_client;
static uint64_t fail_all_ns;
static void fail_all_cb(uv_timer_t *h) {
  fail_all_ns = uvccl__now_ns();
  uvccl__gpu_client_fail_all(abort_client, UVCCL_EABORTED, "test abort");
  uv_close((uv_handle_t *)h, NULL);
}

static void fail_all_blocked(uvccl__gpu_client_t *c, void *s2) {
  top_t blocked, behind;
  uv_timer_t t;
  int dst = 0, src = 7;
  flags[2] = 0;
  make_op(&blocked, K_WAIT_FLAG, s2);
  blocked.flag = &flags[2];
  make_op(&behind, K_COPY, s2);
  behind.dst = &dst;
  behind.src = &src;
  behind.n = sizeof(int);
  is_int(submit(c, &blocked), 0, "fail_all: submit a blocked op");
  is_int(submit(c, &behind), 0, "fail_all: submit an op behind it");
  abort_client = c;
  uv_timer_init(&loop, &t);
  uv_timer_start(&t, fail_all_cb, 100, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(blocked.op.status, UVCCL_EABORTED, "blocked op failed");
  is_str(blocked.op.msg, "test abort", "with the reason");
  is_int(behind.op.status, UVCCL_EABORTED, "queued op failed too");
  ok(ms_between(fail_all_ns, blocked.done_ns) < 200,
     "done() ran %.2f ms after fail_all",
     ms_between(fail_all_ns, blocked.done_ns));
  ok(blocked.done_calls == 1 && behind.done_calls == 1,
     "fail_all: each done() once");
  flags[2] = 1; /* let the fake GPU drain the stream */
  uvccl__cuda.StreamSynchronize(s2);
  is_int(dst, 7, "the stream ran on after release (the op was not polled)");
}

static void host_only_and_again(uvccl__gpu_client_t *c, uvccl__gpu_t *gpu1,
                                void *s1, void *s2) {
  top_t host, again, after, failing, host1;
  uvccl__gpu_client_t *c1 = NULL;
  int dst = 0, src = 99;
  make_op(&host, K_HOST, NULL);
  host.op.no_event = 1;
  make_op(&again, K_AGAIN, s1);
  again.again_left = 3;
  again.dst = &dst;
  again.src = &src;
  again.n = sizeof(int);
  make_op(&after, K_HOST, s2);
  make_op(&failing, K_FAIL, s2);
  is_int(submit(c, &host), 0, "submit a host-only op");
  is_int(submit(c, &again), 0, "submit an op that answers AGAIN 3 times");
  is_int(submit(c, &after), 0, "submit an op after it, on another stream");
  is_int(submit(c, &failing), 0, "submit an op whose issue() fails");
  is_int(uvccl__gpu_client_init(&loop, gpu1, &c1), 0, "client of device 1");
  make_op(&host1, K_HOST, NULL);
  host1.op.no_event = 1;
  is_int(submit(c1, &host1), 0, "submit a host-only op on device 1");
  uv_run(&loop, UV_RUN_DEFAULT);
  ok(host.done_calls == 1 && host.op.status == 0, "host-only op done");
  ok(host.issue_device == 0 && !host.issue_on_loop,
     "host-only op issued on the GPU thread of device 0");
  ok(host1.done_calls == 1 && host1.issue_device == 1,
     "device 1's thread has device 1 current");
  is_int(again.issue_calls, 4, "AGAIN: issue() called until it returned 0");
  ok(again.done_calls == 1 && again.op.status == 0, "AGAIN op done");
  is_int(dst, 99, "AGAIN op's copy ran");
  ok(after.issue_order > again.issue_order,
     "the later op was issued only after the AGAIN op finished issuing");
  is_int(failing.op.status, UVCCL_ENCCL, "issue() error reaches done()");
  is_str(failing.op.msg, "boom", "with issue()'s message");
  uvccl__gpu_client_close(c1, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
}

static void heartbeat(uvccl__gpu_client_t *main_client, uvccl__gpu_t *gpu,
                      void *s1) {
  uvccl__gpu_client_t *hc = NULL;
  top_t t;
  int dst = 0, src = 5;
  setenv("UVCCL_GPU_HEARTBEAT_MS", "300", 1);
  is_int(uvccl__gpu_client_init(&loop, gpu, &hc), 0, "client with a 300 ms "
         "heartbeat");
  unsetenv("UVCCL_GPU_HEARTBEAT_MS");
  make_op(&t, K_COPY, s1);
  t.dst = &dst;
  t.src = &src;
  t.n = sizeof(int);
  fake.set_query_delay_us(1500000);
  is_int(submit(hc, &t), 0, "submit while cudaEventQuery stalls for 1.5 s");
  uv_run(&loop, UV_RUN_DEFAULT);
  fake.set_query_delay_us(0);
  is_int(t.op.status, UV_ETIMEDOUT, "watchdog failed the op");
  ok(strstr(t.op.msg, "GPU thread of device 0 stuck in cudaEventQuery for") !=
         NULL,
     "message: %s", t.op.msg);
  ok(ms_between(t.op.t_submit_ns, t.done_ns) < 1400,
     "fired after %.0f ms, while the thread was still stuck",
     ms_between(t.op.t_submit_ns, t.done_ns));

  /* Stuck inside issue(): the op is failed, but done() waits until
   * issue() gave the op memory back. First let the stalled query end:
   * a host-only op on the main client (60 s heartbeat) completes then. */
  make_op(&t, K_HOST, NULL);
  t.op.no_event = 1;
  is_int(submit(main_client, &t), 0, "wait for the GPU thread to come back");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(t.op.status, 0, "it came back");
  make_op(&t, K_STALL, s1);
  is_int(submit(hc, &t), 0, "submit an op whose issue() blocks 0.7 s");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(t.op.status, UV_ETIMEDOUT, "watchdog failed it");
  ok(strstr(t.op.msg, "stuck in fakeBlockingCall") != NULL, "message: %s",
     t.op.msg);
  ok(ms_between(t.op.t_submit_ns, t.done_ns) >= 690,
     "done() only after issue() returned (%.0f ms)",
     ms_between(t.op.t_submit_ns, t.done_ns));
  is_int(t.done_calls, 1, "done() once");
  uvccl__gpu_client_close(hc, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
}

static int closed_calls;
static void closed_cb(void *arg) { closed_calls += arg == &closed_calls; }

static void close_pending(uvccl__gpu_t *gpu, void *s2) {
  uvccl__gpu_client_t *cc = NULL;
  top_t blocked, queued;
  flags[3] = 0;
  is_int(uvccl__gpu_client_init(&loop, gpu, &cc), 0, "another client");
  make_op(&blocked, K_WAIT_FLAG, s2);
  blocked.flag = &flags[3];
  make_op(&queued, K_HOST, s2);
  is_int(submit(cc, &blocked), 0, "submit a blocked op");
  is_int(submit(cc, &queued), 0, "and one behind it");
  uvccl__gpu_client_close(cc, closed_cb, &closed_calls);
  is_int(submit(cc, &queued), UVCCL_ECLOSING, "submit on a closing client");
  is_int(blocked.done_calls + queued.done_calls, 0,
         "no done() inside client_close");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(blocked.op.status, UV_ECANCELED, "close: blocked op cancelled");
  is_int(queued.op.status, UV_ECANCELED, "close: queued op cancelled");
  is_int(closed_calls, 1, "close callback ran once");
  flags[3] = 1;
  uvccl__cuda.StreamSynchronize(s2);
}

int main(void) {
  uvccl__gpu_t *gpu = NULL, *again = NULL, *gpu1 = NULL;
  uvccl__gpu_client_t *c = NULL;
  void *s1 = NULL, *s2 = NULL, *host = NULL;
  char err[256] = "";
  int n = 0;

  tap_alarm(60);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  if (uvccl_gpu_device_count(&n) != 0)
    skip_all("fake CUDA runtime unavailable: %s",
             uvccl_gpu_unavailable_reason());
  tap_require(fake_hooks_load(FAKE_CUDART, &fake) == 0, "fake hooks");
  loop_thread = uv_thread_self();
  uv_loop_init(&loop);

  is_int(uvccl__gpu_acquire(0, &gpu, err, sizeof(err)), 0, "acquire 0");
  is_int(uvccl__gpu_acquire(0, &again, err, sizeof(err)), 0, "acquire 0 again");
  ok(gpu == again, "one thread per device");
  uvccl__gpu_release(again);
  is_int(uvccl__gpu_acquire(1, &gpu1, err, sizeof(err)), 0, "acquire 1");
  is_int(uvccl__gpu_acquire(5, &again, err, sizeof(err)), UV_EINVAL,
         "acquire 5: no such device");
  ok(strstr(err, "no CUDA device 5") != NULL, "message: %s", err);
  is_int(uvccl__gpu_client_init(&loop, gpu, &c), 0, "client");

  tap_require(uvccl__cuda.SetDevice(0) == 0, "select device 0 here");
  tap_require(uvccl__cuda.StreamCreateWithFlags(
                  &s1, UVCCL__CUDA_STREAM_NON_BLOCKING) == 0, "stream 1");
  tap_require(uvccl__cuda.StreamCreateWithFlags(
                  &s2, UVCCL__CUDA_STREAM_NON_BLOCKING) == 0, "stream 2");
  tap_require(uvccl_gpu_host_alloc(&host, 16) == 0, "pinned flags");
  flags = host;

  bulk(c, s1, s2);
  pingpong(c, s1);
  timeouts(c, s1);
  fail_all_blocked(c, s2);
  host_only_and_again(c, gpu1, s1, s2);
  heartbeat(c, gpu, s1);
  close_pending(gpu, s2);

  uvccl__gpu_client_close(c, closed_cb, &closed_calls);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(closed_calls, 2, "client closed");
  uvccl__gpu_release(gpu1);
  /* A device whose cudaSetDevice fails: acquire does not wait for the
   * thread (making a context can take long), so the failure reaches the
   * ops, with its reason. */
  setenv("FAKE_CUDA_FAIL_SETDEVICE", "1", 1);
  {
    top_t t1;
    uvccl__gpu_client_t *cf = NULL;
    is_int(uvccl__gpu_acquire(1, &gpu1, err, sizeof(err)), 0,
           "acquire 1 again: returns at once");
    is_int(uvccl__gpu_client_init(&loop, gpu1, &cf), 0, "its client");
    make_op(&t1, K_HOST, NULL);
    t1.op.no_event = 1;
    is_int(submit(cf, &t1), 0, "submit to it");
    while (t1.done_calls == 0) uv_run(&loop, UV_RUN_ONCE);
    ok(t1.done_calls == 1 && t1.op.status != 0 &&
           strstr(t1.op.msg, "cudaSetDevice") != NULL &&
           t1.issue_calls == 0,
       "its op fails without being issued: %s", t1.op.msg);
    uvccl__gpu_client_close(cf, closed_cb, &closed_calls);
    uv_run(&loop, UV_RUN_DEFAULT);
    uvccl__gpu_release(gpu1);
  }
  unsetenv("FAKE_CUDA_FAIL_SETDEVICE");
  uvccl__gpu_release(gpu);
  uvccl__cuda.StreamDestroy(s1);
  uvccl__cuda.StreamDestroy(s2);
  uvccl_gpu_host_free(host);
  is_int(fake.live_allocations(), 0, "no fake memory left");
  is_int(uv_loop_close(&loop), 0, "uv_loop_close() == 0");
  return done_testing();
}
