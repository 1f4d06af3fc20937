/* Helpers for the GPU tests (t/3003, t/3005, t/3010): device buffers
 * through uvccl's blocking helpers, and running a loop for a while.
 * Header-only; include after tap.h and uvccl.h. */
#ifndef UVCCL_T_GPU_H
#define UVCCL_T_GPU_H

#include <stdint.h>
#include <time.h>

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void gpu__on_sleep(uv_timer_t *t) { uv_stop(t->loop); }

/* Runs loop for about ms milliseconds. */
static inline void run_loop_for(uv_loop_t *loop, uint64_t ms) {
  uv_timer_t t;
  uv_timer_init(loop, &t);
  uv_timer_start(&t, gpu__on_sleep, ms, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

/* n bytes of device memory on device; bails out of the test if it fails. */
static inline void *dev_on(int device, size_t n) {
  void *p = NULL;
  if (uvccl_gpu_malloc(device, &p, n ? n : 1) != 0) {
    printf("Bail out! uvccl_gpu_malloc on device %d\n", device);
    exit(1);
  }
  return p;
}

static inline void put(void *d, const void *h, size_t n) {
  if (uvccl_gpu_memcpy(d, h, n) != 0) printf("# memcpy to device failed\n");
}

static inline void get(void *h, const void *d, size_t n) {
  if (uvccl_gpu_memcpy(h, d, n) != 0) printf("# memcpy from device failed\n");
}

#endif
