/* Reduction kernel throughput: GB/s of output for dst[i] += src[i]
 * (uvccl_reduce_local, SUM), cache-resident (256 KiB of output) and
 * streaming (64 MiB), in every kernel tier this CPU runs, best of 7.
 * memcpy of the same size is the yardstick for "memory-bound".
 *
 * Build (after `make`), from the repository root:
 *   gcc -std=gnu11 -O2 -Iinclude -Isrc -o build/bench-kernels bench/coll/kernels.c build/libuvccl.a -luv -lpthread -lm
 * Run: build/bench-kernels [reps]
 */
#include "coll/reduce.h"
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill(void *p, size_t count, uvccl_dtype_t dt, double v) {
  size_t i;
  for (i = 0; i < count; i++) {
    switch (dt) {
    case UVCCL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case UVCCL_FLOAT64: ((double *)p)[i] = v; break;
    case UVCCL_FLOAT16: ((uint16_t *)p)[i] = uvccl__f32_to_f16((float)v); break;
    case UVCCL_BFLOAT16:
      ((uint16_t *)p)[i] = uvccl__f32_to_bf16((float)v);
      break;
    default: ((int32_t *)p)[i] = (int32_t)(v * 2); break;
    }
  }
}

/* Best time of reps runs, each of enough calls to last >= 20 ms. */
static double gbps(void *dst, const void *src, size_t bytes, uvccl_dtype_t dt,
                   int reps) {
  size_t count = dt == (uvccl_dtype_t)-1 ? 0 : bytes / uvccl_dtype_size(dt);
  double best = 1e30;
  int r, k, calls = 1;
  double t0 = now_s();
  if (dt == (uvccl_dtype_t)-1) memcpy(dst, src, bytes); /* warm up */
  else uvccl_reduce_local(dst, src, count, dt, UVCCL_SUM);
  t0 = now_s() - t0;
  if (t0 < 0.02) calls = (int)(0.02 / (t0 > 1e-7 ? t0 : 1e-7)) + 1;
  for (r = 0; r < reps; r++) {
    double t = now_s();
    for (k = 0; k < calls; k++) {
      if (dt == (uvccl_dtype_t)-1) memcpy(dst, src, bytes);
      else uvccl_reduce_local(dst, src, count, dt, UVCCL_SUM);
    }
    t = (now_s() - t) / calls;
    if (t < best) best = t;
  }
  return (double)bytes / best / 1e9;
}

int main(int argc, char **argv) {
  static const uvccl_dtype_t dts[] = {UVCCL_FLOAT32, UVCCL_FLOAT64,
                                      UVCCL_BFLOAT16, UVCCL_FLOAT16,
                                      UVCCL_INT32};
  static const size_t sizes[] = {256 << 10, 64 << 20};
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  size_t max = sizes[1], s, d;
  int isa;
  char *dst = aligned_alloc(64, max), *src = aligned_alloc(64, max);
  if (dst == NULL || src == NULL || reps < 1) return 1;
  memset(dst, 0, max);
  memset(src, 0, max);
  printf("%-8s %-9s %12s %12s   (GB/s of output, best of %d)\n", "tier",
         "dtype", "256KiB", "64MiB", reps);
  printf("%-8s %-9s", "-", "memcpy");
  for (s = 0; s < 2; s++)
    printf(" %12.1f", gbps(dst, src, sizes[s], (uvccl_dtype_t)-1, reps));
  printf("\n");
  for (isa = UVCCL__ISA_COUNT - 1; isa >= 0; isa--) {
    if (uvccl__reduce_set_isa(isa) != 0) continue;
    for (d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
      printf("%-8s %-9s", uvccl__reduce_isa_name(isa),
             uvccl_dtype_name(dts[d]));
      for (s = 0; s < 2; s++) {
        size_t count = sizes[s] / uvccl_dtype_size(dts[d]);
        fill(dst, count, dts[d], 1.0);
        fill(src, count, dts[d], 0.5); /* sums stay finite and normal */
        printf(" %12.1f", gbps(dst, src, sizes[s], dts[d], reps));
        fflush(stdout);
      }
      printf("\n");
    }
  }
  free(dst);
  free(src);
  return 0;
}
