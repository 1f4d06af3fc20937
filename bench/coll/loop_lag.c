/* How responsive a loop stays while it runs large collectives: every rank
 * runs a 1 ms uv_timer beside back-to-back allreduces and records how late
 * each tick fires (the loop's lag: what a server sharing the loop would add
 * to its own requests). Prints p50/p99/max lag and the allreduce time.
 *
 *   build/bin/uvccl-run -n 2 build/bench/loop_lag [MiB] [iterations]
 *
 * (`make bench-coll-lag` builds and runs it with 256 MiB.) */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uv_loop_t loop;
static uv_timer_t tick;
static uint64_t expected_ns;
static double *lags;
static size_t nlags, caplags;

static void on_tick(uv_timer_t *t) {
  uint64_t now = uv_hrtime();
  (void)t;
  if (expected_ns) {
    double lag = now > expected_ns ? (double)(now - expected_ns) / 1e6 : 0;
    if (nlags == caplags) {
      caplags = caplags ? caplags * 2 : 4096;
      lags = realloc(lags, caplags * sizeof(double));
    }
    lags[nlags++] = lag;
  }
  expected_ns = now + 1000000;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 256;
  int iters = argc > 2 ? atoi(argv[2]) : 4, i;
  size_t n = mib * 1024 * 1024 / 4, k;
  float *buf = malloc(n * 4);
  uvccl_pg_t pg;
  uvccl_work_t w = {0};
  uvccl_pg_options_t o;
  double total_ms = 0, worst = 0;
  int rc, bad = 0;

  memset(&o, 0, sizeof(o));
  uv_loop_init(&loop);
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) {
    fprintf(stderr, "group: %s %s\n", uvccl_strerror(rc), w.msg);
    return 1;
  }
  for (k = 0; k < n; k++) buf[k] = (float)(pg.rank + 1);
  uv_timer_init(&loop, &tick);
  for (i = 0; i < iters; i++) {
    uint64_t t0;
    double ms;
    uvccl_barrier(&pg, &w, NULL);
    uvccl_work_wait(&w);
    expected_ns = 0;
    uv_timer_start(&tick, on_tick, 1, 1);
    t0 = uv_hrtime();
    rc = uvccl_allreduce(&pg, &w, buf, buf, n, UVCCL_FLOAT32,
                         i > 0 ? UVCCL_MAX : UVCCL_SUM, NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    ms = (double)(uv_hrtime() - t0) / 1e6;
    uv_timer_stop(&tick);
    if (rc != 0) {
      fprintf(stderr, "allreduce: %s\n", w.msg);
      return 1;
    }
    total_ms += ms;
    if (ms > worst) worst = ms;
  }
  /* SUM once, then MAX: the values stay exact */
  for (k = 0; k < n; k += 4099) {
    float want = (float)(pg.size * (pg.size + 1) / 2);
    if (buf[k] != want) bad++;
  }
  qsort(lags, nlags, sizeof(double), cmp);
  if (pg.rank == 0) {
    printf("loop lag during %d x %zu MiB float32 allreduce, world %d:\n",
           iters, mib, pg.size);
    printf("  allreduce: mean %.1f ms, worst %.1f ms (busbw %.2f GB/s)\n",
           total_ms / iters, worst,
           (double)n * 4 * 2 * (pg.size - 1) / pg.size /
               (total_ms / iters / 1e3) / 1e9);
    if (nlags > 0)
      printf("  lag over %zu ticks: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n",
             nlags, lags[nlags / 2], lags[(size_t)((double)nlags * 0.99)],
             lags[nlags - 1]);
    printf("  values %s\n", bad ? "WRONG" : "exact");
  }
  uv_close((uv_handle_t *)&tick, NULL);
  uvccl_pg_destroy(&pg, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  free(buf);
  free(lags);
  return uv_loop_close(&loop) == 0 && bad == 0 ? 0 : 1;
}
