/* Reduction kernel throughput: GB/s of output for dst[i] += src[i]
 * (uvccl_reduce_local, SUM), cache-resident (256 KiB of output) and
 * streaming (64 MiB), in every kernel tier this CPU runs, best of 7.
 * memcpy of the same size is the yardstick for "memory-bound".
 *
 * Build (after `make`), from the repository root:
 *   gcc -std=gnu11 -O2 -Iinclude -Isrc -o build/bench-kernels bench/coll/kernels.c build/libuvccl.a -luv -lpthread -lm
 * Run: build/bench-kernels [reps]
 */
#include "reduce/reduce.h"
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

/* Results, 2026-11-21, git main with these files, gcc 12.2 (the command
 * above), on this project's build box: a 2-vCPU KVM guest that
 * /proc/cpuinfo calls "Intel(R) Xeon(R) Processor" (AVX-512 F/BW/DQ/VL
 * with FP16 and BF16; 48 KiB L1d, 2 MiB L2 per core), shared with other
 * jobs. The quietest of 4 runs (highest memcpy); between runs cells move
 * by about 10%, the odd streaming cell by up to 50%.
 *
 * tier     dtype           256KiB        64MiB   (GB/s of output, best of 9)
 * -        memcpy            45.4         15.6
 * avx512   float32           47.5         14.7
 * avx512   float64           44.6         14.8
 * avx512   bfloat16          22.6         11.9
 * avx512   float16           27.5         13.1
 * avx512   int32             48.6         14.3
 * avx2     float32           45.9         13.9
 * avx2     float64           48.6         14.9
 * avx2     bfloat16          18.5         12.8
 * avx2     float16           25.6         14.0
 * avx2     int32             46.0         13.9
 * generic  float32           38.8         14.1
 * generic  float64           39.6         14.4
 * generic  bfloat16           3.4          2.8
 * generic  float16            0.7          0.7
 * generic  int32             35.3          7.1
 *
 * Reading: float32/float64/int32 run at memcpy speed both in L2 and from
 * DRAM (add moves 3 bytes per byte of output: ~45 GB/s of traffic when
 * streaming), so they are memory-bound as they should be. The halfs are
 * compute-bound in cache (about half of float32 in bytes, the same in
 * elements per second) but keep up with memory when streaming, thanks to
 * the prefetch in their loops. The portable tier only runs on CPUs
 * without AVX2/F16C: there the halfs' bit-level conversions cost 30-40
 * instructions per element (float16 at 0.7 GB/s).
 */
