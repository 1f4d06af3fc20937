/* GPU buffers staged in chunks (src/cpu/stage.c, the group's stage_chunk):
 * with the fake CUDA runtime (t/fake/cudart.c), 3 ranks on one device and
 * 64 KiB chunks. Every chunked collective exact (allreduce out of place
 * and in place, broadcast, reduce, allgather also "in place", reduce_scatter,
 * a host buffer beside a device one; an allgather's own block copied on
 * the device, not through the host, and not at all in place); the overlap
 * itself: with rank 0's copy of its last chunk held back, the first
 * chunk's result is already in another rank's device memory; the order:
 * a whole staged collective called between two chunked ones waits for the
 * first one's last chunk on every rank; a cancelled chunked collective;
 * every pinned buffer freed; a rank with host buffers against the others'
 * chunks: a clear error. */
#include "tap.h"
#include "world.h"
#include "gpu.h"
#include "fake/fake.h"

#include <stdint.h>
#include <stdlib.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define P 3
#define CHUNK ((size_t)64 << 10)

static uv_loop_t loop;
static fake_hooks_t fake;

static void *dev_fill_i32(size_t n, int r, int32_t (*f)(int r, size_t i)) {
  int32_t *h = malloc(n * 4 + 4);
  void *d = dev_on(0, n * 4);
  size_t i;
  for (i = 0; i < n; i++) h[i] = f(r, i);
  put(d, h, n * 4);
  free(h);
  return d;
}

/* Counts the elements of device buffer d (n int32) that differ from f. */
static int dev_bad_i32(const void *d, size_t n, int r,
                       int32_t (*f)(int r, size_t i)) {
  int32_t *h = malloc(n * 4 + 4);
  size_t i;
  int bad = 0;
  get(h, d, n * 4);
  for (i = 0; i < n; i++)
    if (h[i] != f(r, i)) bad++;
  free(h);
  return bad;
}

static int32_t in_val(int r, size_t i) { return (int32_t)((r + 1) * (int)(i % 1009)) - 7; }
static int32_t sum_val(int r, size_t i) {
  int q;
  int32_t s = 0;
  (void)r;
  for (q = 0; q < P; q++) s += in_val(q, i);
  return s;
}
static int32_t bcast_val(int r, size_t i) { (void)r; return (int32_t)(i * 3 + 1); }
static int32_t minus_one(int r, size_t i) { (void)r; (void)i; return -1; }

/* allreduce (out of place and in place), broadcast, reduce */
static void test_flat(world_t *W) {
  size_t n = 100003; /* 7 chunks of 16,384 int32, the last short */
  void *in[P], *out[P];
  int r, bad = 0, rc;
  for (r = 0; r < P; r++) {
    in[r] = dev_fill_i32(n, r, in_val);
    out[r] = dev_fill_i32(n, r, minus_one);
    uvccl_allreduce(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_INT32,
                    UVCCL_SUM, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) {
    bad += dev_bad_i32(out[r], n, r, sum_val);
    bad += dev_bad_i32(in[r], n, r, in_val);
  }
  ok(rc == 0 && bad == 0, "allreduce in 7 chunks, out of place: exact, "
     "inputs untouched (rc %d, %d wrong)", rc, bad);

  bad = 0;
  for (r = 0; r < P; r++)
    uvccl_allreduce(&W->pg[r], &W->w[r], in[r], in[r], n, UVCCL_INT32,
                    UVCCL_SUM, NULL);
  rc = world_wait(W);
  for (r = 0; r < P; r++) bad += dev_bad_i32(in[r], n, r, sum_val);
  ok(rc == 0 && bad == 0, "allreduce in place: exact (%d wrong)", bad);

  bad = 0;
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    in[r] = r == 1 ? dev_fill_i32(n, r, bcast_val) : dev_fill_i32(n, r, minus_one);
    uvccl_broadcast(&W->pg[r], &W->w[r], in[r], n, UVCCL_INT32, 1, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) bad += dev_bad_i32(in[r], n, r, bcast_val);
  ok(rc == 0 && bad == 0, "broadcast from rank 1 in chunks: exact (%d wrong)",
     bad);

  bad = 0;
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    in[r] = dev_fill_i32(n, r, in_val);
    uvccl_reduce(&W->pg[r], &W->w[r], in[r], r == 2 ? out[r] : NULL, n,
                 UVCCL_INT32, UVCCL_SUM, 2, NULL);
  }
  rc = world_wait(W);
  bad += dev_bad_i32(out[2], n, 2, sum_val);
  for (r = 0; r < P; r++) bad += dev_bad_i32(in[r], n, r, in_val);
  ok(rc == 0 && bad == 0, "reduce to rank 2 in chunks: exact (%d wrong)", bad);
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
}

/* allgather, "in place" too, and reduce_scatter: the ranks' blocks */
static void test_blocks(world_t *W) {
  size_t n = 30001, i; /* 6 chunks of 5,461 a rank */
  void *in[P], *out[P];
  int32_t *h = malloc(n * P * 4), *host_out = malloc(n * 4);
  int r, q, bad = 0, rc;
  uint64_t h2d, d2d;
  for (r = 0; r < P; r++) {
    in[r] = dev_fill_i32(n, r, in_val);
    out[r] = dev_on(0, n * P * 4);
  }
  h2d = fake.copied(1);
  d2d = fake.copied(3);
  for (r = 0; r < P; r++)
    uvccl_allgather(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_INT32, NULL);
  rc = world_wait(W);
  /* the own block goes device to device, only the others' cross */
  is_int((int)(fake.copied(1) - h2d), P * (P - 1) * (int)n * 4,
         "allgather in chunks: the other ranks' blocks copied to the device");
  is_int((int)(fake.copied(3) - d2d), P * (int)n * 4,
         "allgather in chunks: each rank's own block copied on the device");
  for (r = 0; r < P; r++) {
    get(h, out[r], n * P * 4);
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        if (h[(size_t)q * n + i] != in_val(q, i)) bad++;
  }
  ok(rc == 0 && bad == 0, "allgather in chunks: every rank's block in place "
     "(%d wrong)", bad);

  /* in place: each rank's input is its own block of the output */
  bad = 0;
  for (r = 0; r < P; r++) {
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        h[(size_t)q * n + i] = q == r ? in_val(r, i) : -1;
    put(out[r], h, n * P * 4);
  }
  h2d = fake.copied(1);
  d2d = fake.copied(3);
  for (r = 0; r < P; r++)
    uvccl_allgather(&W->pg[r], &W->w[r], (char *)out[r] + (size_t)r * n * 4,
                    out[r], n, UVCCL_INT32, NULL);
  rc = world_wait(W);
  is_int((int)(fake.copied(1) - h2d), P * (P - 1) * (int)n * 4,
         "allgather in place in chunks: the other ranks' blocks copied in");
  is_int((int)(fake.copied(3) - d2d), 0,
         "allgather in place in chunks: the own block not copied at all");
  for (r = 0; r < P; r++) {
    get(h, out[r], n * P * 4);
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        if (h[(size_t)q * n + i] != in_val(q, i)) bad++;
  }
  ok(rc == 0 && bad == 0, "allgather in place in chunks (%d wrong)", bad);

  /* reduce_scatter: rank r's input block q is in_val(r, q * n + i) */
  bad = 0;
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    in[r] = dev_fill_i32(n * P, r, in_val);
    /* rank 1 receives into host memory */
    uvccl_reduce_scatter(&W->pg[r], &W->w[r], in[r],
                         r == 1 ? (void *)host_out : out[r], n, UVCCL_INT32,
                         UVCCL_SUM, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) {
    if (r == 1) memcpy(h, host_out, n * 4);
    else get(h, out[r], n * 4);
    for (i = 0; i < n; i++)
      if (h[i] != sum_val(0, (size_t)r * n + i)) bad++;
    bad += dev_bad_i32(in[r], n * P, r, in_val);
  }
  ok(rc == 0 && bad == 0, "reduce_scatter in chunks (rank 1 into host "
     "memory): exact, inputs untouched (%d wrong)", bad);
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
  free(h);
  free(host_out);
}

/* Runs the loop until pred() or about 20 s; 1 if pred() held. */
static int run_until(int (*pred)(void *), void *arg) {
  uint64_t end = uv_hrtime() + (uint64_t)20e9;
  while (!pred(arg)) {
    if (uv_hrtime() > end) return 0;
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_sleep(1);
  }
  return 1;
}

typedef struct {
  void *dev;
  size_t n;
} probe_t;

/* the first chunk of rank 1's output holds its sums */
static int first_chunk_out(void *arg) {
  probe_t *p = arg;
  return dev_bad_i32(p->dev, p->n, 1, sum_val) == 0;
}

static void test_overlap(world_t *W) {
  size_t per = CHUNK / 4, n = per * 8;
  void *in[P], *out[P];
  volatile uint32_t go = 0;
  probe_t pr;
  int r, bad = 0, rc, seen;
  for (r = 0; r < P; r++) {
    in[r] = dev_fill_i32(n, r, in_val);
    out[r] = dev_fill_i32(n, r, minus_one);
  }
  /* rank 0's copy in of its last chunk waits for go */
  fake.stall_copy((char *)in[0] + 7 * per * 4, &go);
  for (r = 0; r < P; r++)
    uvccl_allreduce(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_INT32,
                    UVCCL_SUM, NULL);
  pr.dev = out[1];
  pr.n = per;
  seen = run_until(first_chunk_out, &pr);
  run_loop_for(&loop, 100);
  for (r = 0; r < P; r++)
    if (uvccl_work_done(&W->w[r])) seen = 0;
  ok(seen, "overlap: rank 1 has the first chunk's sums in device memory "
     "while rank 0's last chunk is held (no rank done 100 ms later)");
  go = 1;
  rc = world_wait(W);
  for (r = 0; r < P; r++) bad += dev_bad_i32(out[r], n, r, sum_val);
  ok(rc == 0 && bad == 0, "overlap: then all 8 chunks exact (%d wrong)", bad);
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
}

/* A chunked allreduce, a whole one, a chunked one, called together: the
 * stages start their collectives in the order of the calls on every rank,
 * however their copies come in. */
static void test_order(world_t *W) {
  size_t per = CHUNK / 4, n = per * 4, small = 1000;
  void *a[P], *b[P], *c[P];
  uvccl_work_t wb[P], wc[P];
  volatile uint32_t go = 0;
  int r, bad = 0, rc = 0, early = 0;
  memset(wb, 0, sizeof(wb));
  memset(wc, 0, sizeof(wc));
  for (r = 0; r < P; r++) {
    a[r] = dev_fill_i32(n, r, in_val);
    b[r] = dev_fill_i32(small, r, in_val);
    c[r] = dev_fill_i32(n, r, in_val);
  }
  fake.stall_copy((char *)a[0] + 3 * per * 4, &go);
  for (r = 0; r < P; r++) {
    uvccl_allreduce(&W->pg[r], &W->w[r], a[r], a[r], n, UVCCL_INT32,
                    UVCCL_SUM, NULL);
    uvccl_allreduce(&W->pg[r], &wb[r], b[r], b[r], small, UVCCL_INT32,
                    UVCCL_SUM, NULL);
    uvccl_allreduce(&W->pg[r], &wc[r], c[r], c[r], n, UVCCL_INT32,
                    UVCCL_SUM, NULL);
  }
  run_loop_for(&loop, 300);
  for (r = 0; r < P; r++)
    if (uvccl_work_done(&wb[r]) || uvccl_work_done(&wc[r])) early++;
  ok(early == 0, "order: with rank 0's first call held at its last chunk, "
     "neither later call ended anywhere (%d did)", early);
  go = 1;
  rc = world_wait(W);
  for (r = 0; r < P; r++) {
    while (!uvccl_work_done(&wb[r]) || !uvccl_work_done(&wc[r]))
      uv_run(&loop, UV_RUN_ONCE);
    if (wb[r].status != 0 || wc[r].status != 0) rc = -1;
    bad += dev_bad_i32(a[r], n, r, sum_val);
    bad += dev_bad_i32(b[r], small, r, sum_val);
    bad += dev_bad_i32(c[r], n, r, sum_val);
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
    uvccl_gpu_free(c[r]);
  }
  ok(rc == 0 && bad == 0, "order: then all three exact on every rank "
     "(%d wrong)", bad);
}

/* Cancelled while rank 0's copy is held: the callers' works end
 * cancelled; the stage lives on until its copies are back. */
static void test_cancel(int base) {
  world_t W;
  uvccl_pg_options_t o;
  size_t per = CHUNK / 4, n = per * 4;
  void *a[P];
  volatile uint32_t go = 0;
  int r, cancelled = 0;
  memset(&o, 0, sizeof(o));
  o.stage_chunk = CHUNK;
  if (!is_int(world_init(&W, &loop, P, &o), 0, "cancel: a world of %d", P))
    return;
  for (r = 0; r < P; r++) a[r] = dev_fill_i32(n, r, in_val);
  fake.stall_copy((char *)a[0] + 2 * per * 4, &go);
  for (r = 0; r < P; r++)
    uvccl_allreduce(&W.pg[r], &W.w[r], a[r], a[r], n, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  run_loop_for(&loop, 100);
  for (r = 0; r < P; r++) uvccl_work_cancel(&W.w[r]);
  world_wait(&W);
  for (r = 0; r < P; r++)
    if (W.w[r].state == UVCCL_WORK_CANCELLED) cancelled++;
  is_int(cancelled, P, "cancel: every rank's chunked allreduce ends "
         "cancelled");
  go = 1;
  world_destroy(&W);
  for (r = 0; r < P; r++) uvccl_gpu_free(a[r]);
  is_int(fake.live_allocations(), base,
         "cancel: once destroyed, every pinned buffer is freed");
}

/* A rank with host buffers runs the collective whole, which the others'
 * chunks do not match: a clear error on every rank at once, no hang. */
static void test_mixed(void) {
  world_t W;
  uvccl_pg_options_t o;
  size_t n = 100003;
  void *a[P];
  int r, failed = 0;
  memset(&o, 0, sizeof(o));
  o.stage_chunk = CHUNK;
  if (!is_int(world_init(&W, &loop, P, &o), 0, "mixed: a world of %d", P))
    return;
  for (r = 0; r < P; r++) {
    a[r] = r == 2 ? calloc(n, 4) : dev_fill_i32(n, r, in_val);
    uvccl_allreduce(&W.pg[r], &W.w[r], a[r], a[r], n, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  }
  world_wait(&W);
  for (r = 0; r < P; r++) {
    if (W.w[r].status != 0 && W.w[r].status != UV_ETIMEDOUT &&
        strstr(W.w[r].msg, "mismatched") != NULL)
      failed++;
    else
      diag("rank %d: %s %s", r, uvccl_err_name(W.w[r].status), W.w[r].msg);
  }
  is_int(failed, P, "mixed: rank 2's host buffers against the others' "
         "chunks fail every rank with a mismatch, before any timeout");
  world_destroy(&W);
  for (r = 0; r < P; r++) {
    if (r == 2) free(a[r]);
    else uvccl_gpu_free(a[r]);
  }
}

int main(void) {
  world_t W;
  uvccl_pg_options_t o;
  int n = 0, base;
  tap_alarm(120);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  if (uvccl_gpu_device_count(&n) != 0 || n < 1 ||
      fake_hooks_load(FAKE_CUDART, &fake) != 0)
    skip_all("the fake CUDA runtime is not built (%s)", FAKE_CUDART);
  uv_loop_init(&loop);
  base = fake.live_allocations();
  memset(&o, 0, sizeof(o));
  o.stage_chunk = CHUNK;
  is_int(world_init(&W, &loop, P, &o), 0,
         "world of %d ranks, one device, 64 KiB stage chunks", P);
  test_flat(&W);
  test_blocks(&W);
  test_overlap(&W);
  test_order(&W);
  world_destroy(&W);
  is_int(fake.live_allocations(), base,
         "destroying the group freed every pinned staging buffer");
  test_cancel(base);
  test_mixed();
  is_int(uv_loop_close(&loop), 0, "loop closes cleanly");
  done_testing();
}
