/* bench/gpu/stage_bench.c - what staging GPU buffers through the TCP
 * process groups costs, against cudaMemcpy.
 *
 * For each size: (a) cudaMemcpy device -> pinned host and back, blocking,
 * on the calling thread (uvccl_gpu_memcpy): the floor; (b) an allreduce on
 * a one-rank TCP group with device buffers: the staged path end to end
 * (device thread copy in, the collective, copy out, the callback on the
 * loop), which moves the same bytes. Median of the iterations; GB = 1e9 B,
 * counted once per direction (2 x size per iteration).
 *
 *   make && build/bench/stage_bench [max_bytes]
 *
 * Without a GPU it says so and exits 0 (UVCCL_CUDART may name the fake
 * runtime, build/fake/libcudart.so.13, to exercise it). */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp);
  return v[n / 2];
}

int main(int argc, char **argv) {
  size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)256 << 20;
  int count = 0, rc, it;
  char name[128] = "";
  int drv = 0, rt = 0;
  void *d1 = NULL, *d2 = NULL, *h = NULL;
  uv_loop_t loop;
  uvccl_store_t store;
  uvccl_pg_t pg;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  double t[64];
  size_t n;

  if (uvccl_gpu_device_count(&count) != 0 || count == 0) {
    printf("stage_bench: no CUDA device (%s)\n",
           uvccl_gpu_unavailable_reason() ? uvccl_gpu_unavailable_reason()
                                          : "none found");
    return 0;
  }
  uvccl_gpu_info(0, name, sizeof(name), &drv, &rt);
  if (uvccl_gpu_malloc(0, &d1, max) || uvccl_gpu_malloc(0, &d2, max) ||
      uvccl_gpu_host_alloc(&h, max)) {
    fprintf(stderr, "stage_bench: cannot allocate %zu bytes\n", max);
    return 1;
  }
  uvccl_gpu_memset(d1, 0, max);
  uv_loop_init(&loop);
  uvccl_hash_store_init(&loop, &store);
  memset(&o, 0, sizeof(o));
  o.rank = 0;
  o.size = 1;
  rc = uvccl_pg_init(&loop, &pg, &store, &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) {
    fprintf(stderr, "stage_bench: group: %s\n", uvccl_strerror(rc));
    return 1;
  }
  printf("# stage_bench: device 0 (%s), driver %d, runtime %d\n", name, drv,
         rt);
  printf("# memcpy = cudaMemcpy D2H + H2D (pinned, blocking); staged = "
         "allreduce on a 1-rank TCP group with device buffers\n");
  printf("%12s %6s %12s %12s %10s %10s %8s\n", "bytes", "iters",
         "memcpy_us", "staged_us", "memcpy_GBs", "staged_GBs", "ratio");
  for (n = 4096; n <= max; n *= 4) {
    int iters = n >= ((size_t)64 << 20) ? 10 : n >= ((size_t)4 << 20) ? 20
                                                                      : 64;
    double mc, st;
    for (it = 0; it < iters; it++) {
      uint64_t t0 = uv_hrtime();
      uvccl_gpu_memcpy(h, d1, n);
      uvccl_gpu_memcpy(d2, h, n);
      t[it] = (double)(uv_hrtime() - t0) / 1e3;
    }
    mc = median(t, iters);
    for (it = 0; it < iters + 2; it++) {
      uint64_t t0 = uv_hrtime();
      rc = uvccl_allreduce(&pg, &w, d1, d2, n / 4, UVCCL_FLOAT32, UVCCL_SUM,
                           NULL);
      if (rc == 0) rc = uvccl_work_wait(&w);
      if (rc != 0) {
        fprintf(stderr, "stage_bench: allreduce: %s %s\n",
                uvccl_strerror(rc), w.msg);
        return 1;
      }
      if (it >= 2) t[it - 2] = (double)(uv_hrtime() - t0) / 1e3;
    }
    st = median(t, iters);
    printf("%12zu %6d %12.1f %12.1f %10.2f %10.2f %8.2f\n", n, iters, mc, st,
           2.0 * (double)n / mc / 1e3, 2.0 * (double)n / st / 1e3, st / mc);
  }
  uvccl_pg_destroy(&pg, NULL);
  uvccl_store_close(&store, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  uvccl_gpu_free(d1);
  uvccl_gpu_free(d2);
  uvccl_gpu_host_free(h);
  return 0;
}
