/* GPU buffers in the TCP process groups: every staged collective with
 * device buffers (the fake CUDA runtime, t/fake/cudart.c, stands in for a
 * GPU), ranks sharing one device, in place and out of place, mixed host
 * and device buffers, send/recv with a short message, the refusals, and
 * the pinned staging memory: allocated while in use, all freed with the
 * group; and the loop's turns (src/loop/turn.c) while a staged 8 MiB
 * allreduce runs: no callback moves more than its budget and a step. */
#include "tap.h"
#include "world.h"
#include "fake/fake.h"

#include <stdint.h>
#include <stdlib.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define P 3

static uv_loop_t loop;
static fake_hooks_t fake;

static void *dev_alloc(size_t n) {
  void *p = NULL;
  if (uvccl_gpu_malloc(0, &p, n ? n : 1) != 0) abort();
  return p;
}

static void to_dev(void *d, const void *h, size_t n) {
  if (n && uvccl_gpu_memcpy(d, h, n) != 0) abort();
}

static void from_dev(void *h, const void *d, size_t n) {
  if (n && uvccl_gpu_memcpy(h, d, n) != 0) abort();
}

static float val(int r, size_t i) { return (float)((r + 1) * (int)(i % 13)); }

static void test_allreduce(world_t *W, int base) {
  size_t n = 100003, i;
  float *h = malloc(n * 4);
  void *in[P], *out[P];
  int r, bad = 0, rc;
  for (r = 0; r < P; r++) {
    in[r] = dev_alloc(n * 4);
    out[r] = dev_alloc(n * 4);
    for (i = 0; i < n; i++) h[i] = val(r, i);
    to_dev(in[r], h, n * 4);
    rc = uvccl_allreduce(&W->pg[r], &W->w[r], in[r], out[r], n,
                         UVCCL_FLOAT32, UVCCL_SUM, NULL);
    if (rc != 0) printf("# allreduce start: %s\n", uvccl_strerror(rc));
  }
  is_int(world_wait(W), 0, "device allreduce out of place completes");
  ok(fake.live_allocations() > base, "pinned staging buffers in use (%d > %d)",
     fake.live_allocations(), base);
  for (r = 0; r < P; r++) {
    from_dev(h, out[r], n * 4);
    for (i = 0; i < n; i++)
      if (h[i] != 6.0f * (float)(i % 13)) bad++;
    from_dev(h, in[r], n * 4);
    for (i = 0; i < n; i++)
      if (h[i] != val(r, i)) bad++;
  }
  is_int(bad, 0, "sums exact in device memory, inputs untouched");
  /* in place, MAX on int64; rank 2 passes host memory for its buffer */
  {
    int64_t *hv[P], tmp[1000];
    void *buf[P];
    bad = 0;
    for (r = 0; r < P; r++) {
      hv[r] = malloc(sizeof(tmp));
      for (i = 0; i < 1000; i++) hv[r][i] = (int64_t)((r * 7 + (int)i) % 10);
      buf[r] = r == 2 ? (void *)hv[r] : dev_alloc(sizeof(tmp));
      if (r != 2) to_dev(buf[r], hv[r], sizeof(tmp));
      uvccl_allreduce(&W->pg[r], &W->w[r], buf[r], buf[r], 1000,
                      UVCCL_INT64, UVCCL_MAX, NULL);
    }
    is_int(world_wait(W), 0, "in-place MAX, device and host buffers mixed");
    for (r = 0; r < P; r++) {
      if (r != 2) from_dev(tmp, buf[r], sizeof(tmp));
      else memcpy(tmp, hv[r], sizeof(tmp));
      for (i = 0; i < 1000; i++) {
        int64_t want = 0;
        int q;
        for (q = 0; q < P; q++) {
          int64_t v = (int64_t)((q * 7 + (int)i) % 10);
          if (v > want) want = v;
        }
        if (tmp[i] != want) bad++;
      }
      if (r != 2) uvccl_gpu_free(buf[r]);
      free(hv[r]);
    }
    is_int(bad, 0, "MAX exact on every rank");
  }
  for (r = 0; r < P; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
  free(h);
}

/* broadcast (root 1), reduce (root 2), allgather, reduce_scatter,
 * alltoall, gather (root 0), scatter (root 2): int32, n per block. */
static void test_others(world_t *W) {
  const size_t n = 5000;
  int32_t *h = malloc(n * P * 4), *want = malloc(n * P * 4);
  void *a[P], *b[P];
  int r, bad, rc;
  size_t i;
  for (r = 0; r < P; r++) {
    a[r] = dev_alloc(n * P * 4);
    b[r] = dev_alloc(n * P * 4);
  }
#define FILL(r, f)                                                   \
  do {                                                               \
    for (i = 0; i < n * P; i++) h[i] = (int32_t)(f);                 \
    to_dev(a[r], h, n * P * 4);                                      \
  } while (0)
#define CHECK(dst, cnt, f)                                           \
  do {                                                               \
    from_dev(h, dst, (cnt) * 4);                                     \
    for (i = 0; i < (cnt); i++)                                      \
      if (h[i] != (int32_t)(f)) bad++;                               \
  } while (0)

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, r == 1 ? (int)i * 3 : -1);
    uvccl_broadcast(&W->pg[r], &W->w[r], a[r], n, UVCCL_INT32, 1, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) CHECK(a[r], n, (int)i * 3);
  ok(rc == 0 && bad == 0, "broadcast from rank 1 into device buffers");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, (int)i + r);
    uvccl_reduce(&W->pg[r], &W->w[r], a[r], b[r], n, UVCCL_INT32, UVCCL_SUM,
                 2, NULL);
  }
  rc = world_wait(W);
  CHECK(b[2], n, 3 * (int)i + 3);
  ok(rc == 0 && bad == 0, "reduce to rank 2");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, r * 100000 + (int)i);
    uvccl_allgather(&W->pg[r], &W->w[r], a[r], b[r], n, UVCCL_INT32, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) CHECK(b[r], n * P, (int)(i / n) * 100000 + (int)(i % n));
  ok(rc == 0 && bad == 0, "allgather");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, (int)i + r);
    uvccl_reduce_scatter(&W->pg[r], &W->w[r], a[r], b[r], n, UVCCL_INT32,
                         UVCCL_SUM, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) CHECK(b[r], n, 3 * ((int)(r * n + i)) + 3);
  ok(rc == 0 && bad == 0, "reduce_scatter");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, r * 1000000 + (int)i);
    uvccl_alltoall(&W->pg[r], &W->w[r], a[r], b[r], n, UVCCL_INT32, NULL);
  }
  rc = world_wait(W);
  /* block q of rank r's output is block r of rank q's input */
  for (r = 0; r < P; r++)
    CHECK(b[r], n * P, (int)(i / n) * 1000000 + (int)(r * n + i % n));
  ok(rc == 0 && bad == 0, "alltoall");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, r * 7 + (int)i);
    uvccl_gather(&W->pg[r], &W->w[r], a[r], r == 0 ? b[r] : NULL, n,
                 UVCCL_INT32, 0, NULL);
  }
  rc = world_wait(W);
  CHECK(b[0], n * P, (int)(i / n) * 7 + (int)(i % n));
  ok(rc == 0 && bad == 0, "gather to rank 0");

  bad = 0;
  for (r = 0; r < P; r++) {
    FILL(r, r == 2 ? (int)i * 5 : -1);
    uvccl_scatter(&W->pg[r], &W->w[r], r == 2 ? a[r] : NULL, b[r], n,
                  UVCCL_INT32, 2, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++) CHECK(b[r], n, (int)(r * n + i) * 5);
  ok(rc == 0 && bad == 0, "scatter from rank 2");

  /* send/recv: rank 0 sends 1000 bytes to rank 1, which posts 4096 */
  {
    unsigned char hb[4096];
    for (i = 0; i < 1000; i++) hb[i] = (unsigned char)(i * 7);
    to_dev(a[0], hb, 1000);
    memset(hb, 0xee, sizeof(hb));
    to_dev(b[1], hb, sizeof(hb));
    is_int(uvccl_send(&W->pg[0], &W->w[0], a[0], 1000, 1, 9, NULL), 0,
           "send from device memory");
    is_int(uvccl_recv(&W->pg[1], &W->w[1], b[1], 4096, 0, 9, NULL), 0,
           "recv into device memory");
    rc = world_wait(W);
    from_dev(hb, b[1], sizeof(hb));
    bad = 0;
    for (i = 0; i < 1000; i++)
      if (hb[i] != (unsigned char)(i * 7)) bad++;
    for (; i < sizeof(hb); i++)
      if (hb[i] != 0xee) bad++;
    ok(rc == 0 && bad == 0 && W->w[1].value_len == 1000 &&
           W->w[1].result == 0,
       "1000 bytes arrived, nothing past them written (len %zu, from %d)",
       W->w[1].value_len, (int)W->w[1].result);
    W->w[0] = (uvccl_work_t){0};
    W->w[1] = (uvccl_work_t){0};
  }

  for (r = 0; r < P; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
  free(h);
  free(want);
#undef FILL
#undef CHECK
}

/* The list-shaped operations: uneven allgather into per-rank device
 * buffers, reduce_scatterv, alltoallv, coalesced allreduce, batched p2p. */
static void test_lists(world_t *W) {
  int r, q, bad, rc;
  size_t i;
  /* allgatherv: rank q gives 3q+1 int32 (q + 100 * i); every rank gets
   * them in P separate device buffers */
  {
    size_t counts[P];
    void *in[P], *lists[P][P];
    int32_t h[64];
    bad = 0;
    for (q = 0; q < P; q++) counts[q] = (size_t)(3 * q + 1);
    for (r = 0; r < P; r++) {
      for (i = 0; i < counts[r]; i++) h[i] = (int32_t)(r + 100 * (int)i);
      in[r] = dev_alloc(counts[r] * 4);
      to_dev(in[r], h, counts[r] * 4);
      for (q = 0; q < P; q++) lists[r][q] = dev_alloc(counts[q] * 4);
      rc = uvccl_allgatherv(&W->pg[r], &W->w[r], in[r], counts[r],
                            (void *const *)lists[r], counts, UVCCL_INT32,
                            NULL);
      if (rc != 0) printf("# allgatherv: %s\n", uvccl_strerror(rc));
    }
    rc = world_wait(W);
    for (r = 0; r < P; r++) {
      for (q = 0; q < P; q++) {
        from_dev(h, lists[r][q], counts[q] * 4);
        for (i = 0; i < counts[q]; i++)
          if (h[i] != (int32_t)(q + 100 * (int)i)) bad++;
        uvccl_gpu_free(lists[r][q]);
      }
      uvccl_gpu_free(in[r]);
    }
    ok(rc == 0 && bad == 0, "allgatherv into per-rank device buffers");
  }
  /* reduce_scatterv (blocks 2, 5, 1) and alltoallv (rank r sends r + q + 1
   * to q) */
  {
    size_t rc_counts[P] = {2, 5, 1}, tot = 8, sc[P], rcv[P], so, ro;
    int32_t hs[64], hr[64];
    void *s[P], *d[P];
    bad = 0;
    for (r = 0; r < P; r++) {
      for (i = 0; i < tot; i++) hs[i] = (int32_t)(i * 10 + (size_t)r);
      s[r] = dev_alloc(64 * 4);
      d[r] = dev_alloc(64 * 4);
      to_dev(s[r], hs, tot * 4);
      uvccl_reduce_scatterv(&W->pg[r], &W->w[r], s[r], d[r], rc_counts,
                            UVCCL_INT32, UVCCL_SUM, NULL);
    }
    rc = world_wait(W);
    for (r = 0, so = 0; r < P; so += rc_counts[r], r++) {
      from_dev(hr, d[r], rc_counts[r] * 4);
      for (i = 0; i < rc_counts[r]; i++)
        if (hr[i] != (int32_t)(3 * (so + i) * 10 + 3)) bad++;
    }
    ok(rc == 0 && bad == 0, "reduce_scatterv with device buffers");
    bad = 0;
    for (r = 0; r < P; r++) {
      for (q = 0, so = 0; q < P; q++) {
        sc[q] = (size_t)(r + q + 1);
        rcv[q] = (size_t)(q + r + 1);
        for (i = 0; i < sc[q]; i++) hs[so + i] = (int32_t)(1000 * r + 10 * q + (int)i);
        so += sc[q];
      }
      to_dev(s[r], hs, so * 4);
      uvccl_alltoallv(&W->pg[r], &W->w[r], s[r], sc, d[r], rcv, UVCCL_INT32,
                      NULL);
    }
    rc = world_wait(W);
    for (r = 0; r < P; r++) {
      from_dev(hr, d[r], 64 * 4);
      for (q = 0, ro = 0; q < P; q++) {
        for (i = 0; i < (size_t)(q + r + 1); i++)
          if (hr[ro + i] != (int32_t)(1000 * q + 10 * r + (int)i)) bad++;
        ro += (size_t)(q + r + 1);
      }
      uvccl_gpu_free(s[r]);
      uvccl_gpu_free(d[r]);
    }
    ok(rc == 0 && bad == 0, "alltoallv with device buffers");
  }
  /* coalesced: two device buffers and one host buffer per rank */
  {
    uvccl_buf_t bufs[P][3];
    float h[100], host[P][50];
    bad = 0;
    for (r = 0; r < P; r++) {
      for (i = 0; i < 100; i++) h[i] = (float)(r + 1) * (float)i;
      bufs[r][0].base = dev_alloc(100 * 4);
      bufs[r][0].len = 100 * 4;
      to_dev(bufs[r][0].base, h, 100 * 4);
      bufs[r][1].base = dev_alloc(40 * 4);
      bufs[r][1].len = 40 * 4;
      to_dev(bufs[r][1].base, h, 40 * 4);
      memcpy(host[r], h, sizeof(host[r]));
      bufs[r][2].base = host[r];
      bufs[r][2].len = sizeof(host[r]);
      uvccl_allreduce_coalesced(&W->pg[r], &W->w[r], bufs[r], 3,
                                UVCCL_FLOAT32, UVCCL_SUM, NULL);
    }
    rc = world_wait(W);
    for (r = 0; r < P; r++) {
      from_dev(h, bufs[r][0].base, 100 * 4);
      for (i = 0; i < 100; i++) if (h[i] != 6.0f * (float)i) bad++;
      from_dev(h, bufs[r][1].base, 40 * 4);
      for (i = 0; i < 40; i++) if (h[i] != 6.0f * (float)i) bad++;
      for (i = 0; i < 50; i++) if (host[r][i] != 6.0f * (float)i) bad++;
      uvccl_gpu_free(bufs[r][0].base);
      uvccl_gpu_free(bufs[r][1].base);
    }
    ok(rc == 0 && bad == 0, "coalesced allreduce, device and host buffers");
  }
  /* p2p_batch: a ring, each rank sends 7 + r bytes right and posts 64 from
   * the left; results (received, source) come back in the caller's ops */
  {
    uvccl_p2p_op_t ops[P][2];
    unsigned char hb[64];
    bad = 0;
    for (r = 0; r < P; r++) {
      memset(hb, r + 1, sizeof(hb));
      memset(ops[r], 0, sizeof(ops[r]));
      ops[r][0].is_send = 1;
      ops[r][0].buf = dev_alloc(64);
      to_dev(ops[r][0].buf, hb, 64);
      ops[r][0].len = (size_t)(7 + r);
      ops[r][0].peer = (r + 1) % P;
      ops[r][1].buf = dev_alloc(64);
      memset(hb, 0xee, sizeof(hb));
      to_dev(ops[r][1].buf, hb, 64);
      ops[r][1].len = 64;
      ops[r][1].peer = (r + P - 1) % P;
      uvccl_p2p_batch(&W->pg[r], &W->w[r], ops[r], 2, NULL);
    }
    rc = world_wait(W);
    for (r = 0; r < P; r++) {
      int from = (r + P - 1) % P;
      from_dev(hb, ops[r][1].buf, 64);
      if (ops[r][1].received != (size_t)(7 + from) || ops[r][1].source != from)
        bad++;
      for (i = 0; i < 64; i++)
        if (hb[i] != (i < (size_t)(7 + from) ? from + 1 : 0xee)) bad++;
      uvccl_gpu_free(ops[r][0].buf);
      uvccl_gpu_free(ops[r][1].buf);
    }
    ok(rc == 0 && bad == 0, "p2p_batch with device buffers: lengths, "
       "sources, bytes");
  }
}

/* A world whose turns move 128 KiB (t/2064 checks the host paths). */
static void test_turns(void) {
  world_t W;
  uvccl_pg_options_t o;
  size_t n = (size_t)2 << 20, i; /* 8 MiB of float32 */
  float *h = malloc(n * 4);
  void *buf[P];
  uint64_t max_bytes = 0, cbs = 0;
  int r, bad = 0;
  memset(&o, 0, sizeof(o));
  o.turn_bytes = 128 * 1024;
  o.turn_us = UINT32_MAX;
  o.loop_stats = 1;
  if (!is_int(world_init(&W, &loop, P, &o), 0, "turns: a world of %d", P))
    return;
  for (r = 0; r < P; r++) {
    buf[r] = dev_alloc(n * 4);
    for (i = 0; i < n; i++) h[i] = val(r, i);
    to_dev(buf[r], h, n * 4);
    uvccl_pg_loop_stats(&W.pg[r], NULL, 1);
    if (uvccl_allreduce(&W.pg[r], &W.w[r], buf[r], buf[r], n, UVCCL_FLOAT32,
                        UVCCL_SUM, NULL) != 0)
      bad++;
  }
  is_int(world_wait(&W), 0, "turns: a staged 8 MiB device allreduce completes");
  for (r = 0; r < P; r++) {
    uvccl_loop_stats_t st;
    if (uvccl_pg_loop_stats(&W.pg[r], &st, 0) == 0) {
      if (st.max_bytes > max_bytes) max_bytes = st.max_bytes;
      cbs += st.callbacks;
    }
    from_dev(h, buf[r], n * 4);
    for (i = 0; i < n; i++)
      if (h[i] != 6.0f * (float)(i % 13)) bad++;
    uvccl_gpu_free(buf[r]);
  }
  is_int(bad, 0, "turns: sums exact");
  ok(max_bytes > 0 && max_bytes <= 128 * 1024 + 512 * 1024,
     "turns: at most %llu bytes a callback (budget 128 KiB), %llu callbacks",
     (unsigned long long)max_bytes, (unsigned long long)cbs);
  world_destroy(&W);
  free(h);
}

int main(void) {
  world_t W;
  int n = 0, base;
  tap_alarm(120);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  if (uvccl_gpu_device_count(&n) != 0 || n < 1 ||
      fake_hooks_load(FAKE_CUDART, &fake) != 0)
    skip_all("the fake CUDA runtime is not built (%s)", FAKE_CUDART);
  uv_loop_init(&loop);
  base = fake.live_allocations();
  is_int(world_init(&W, &loop, P, NULL), 0, "world of %d ranks, one device", P);
  test_allreduce(&W, base);
  test_others(&W);
  test_lists(&W);
  world_destroy(&W);
  is_int(fake.live_allocations(), base,
         "destroying the group freed every pinned staging buffer");
  test_turns();
  is_int(uv_loop_close(&loop), 0, "loop closes cleanly");
  done_testing();
}
