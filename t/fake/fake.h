/* Test-only hooks of the fake CUDA runtime (t/fake/cudart.c, built into
 * $(BUILD)/fake/libcudart.so.13). The fake simulates FAKE_CUDA_DEVICES
 * devices (default 1) on the host: "device memory" is malloc'd memory,
 * and every stream is an in-order queue run by a fake-GPU worker thread.
 * Tests and the fake NCCL (t/fake/nccl.c) call these to put host work on a
 * stream, stall a stream, and provoke the failure paths. */
#ifndef UVCCL_T_FAKE_FAKE_H
#define UVCCL_T_FAKE_FAKE_H

#include <stdint.h>

/* fn(arg) runs on the fake GPU in stream order (stream NULL: the default
 * stream of the current device). 0, or a cudaError_t value. */
int fake_cuda_enqueue(void *stream, void (*fn)(void *arg), void *arg);
/* The stream stalls at this point until *flag != 0 (as cuStreamWaitValue32
 * with CU_STREAM_WAIT_VALUE_GEQ 1). 0, or a cudaError_t value. */
int fake_cuda_stream_wait_flag(void *stream, volatile uint32_t *flag);
/* The device of a fake device pointer (anywhere inside an allocation), or
 * -1 when p is not fake device memory. */
int fake_cuda_ptr_device(const void *p);
/* Makes every cudaEventQuery sleep us microseconds first (0: no delay), to
 * make the GPU thread look stuck to the heartbeat watchdog. */
void fake_cuda_set_query_delay_us(unsigned us);
/* The next cudaMemcpyAsync from src waits on its stream until *flag != 0
 * (one copy, then the hook is spent). 0, or a cudaError_t value. */
int fake_cuda_stall_copy(const void *src, volatile uint32_t *flag);
/* FAKE_CUDA_COPY_MBPS=R (environment): every async copy takes as long as
 * R MB/s would (each stream its own engine), so that what staging
 * overlaps shows on a machine without a GPU. */

/* Extras. */
/* The device current on the calling thread (cudaSetDevice). */
int fake_cuda_current_device(void);
/* Number of live fake allocations (device + pinned), to check for leaks. */
int fake_cuda_live_allocations(void);
/* Bytes copied so far with cudaMemcpyKind kind (0 host to host, 1 host to
 * device, 2 device to host, 3 device to device, 4 inferred). A copy whose
 * kind disagrees with where its pointers are fails (cudaErrorInvalidValue)
 * and is not counted. */
uint64_t fake_cuda_copied(int kind);

/* Tests do not link the fake (uvccl dlopens it); they reach these hooks
 * through the copy uvccl loaded: fake_hooks_load(path, &h) after the first
 * GPU call, then h.enqueue(...). 0, or -1 if the fake is not loaded. */
#include <dlfcn.h>
#include <string.h>

typedef struct {
  int (*enqueue)(void *stream, void (*fn)(void *arg), void *arg);
  int (*stream_wait_flag)(void *stream, volatile uint32_t *flag);
  int (*ptr_device)(const void *p);
  void (*set_query_delay_us)(unsigned us);
  int (*current_device)(void);
  int (*live_allocations)(void);
  int (*stall_copy)(const void *src, volatile uint32_t *flag);
  uint64_t (*copied)(int kind);
} fake_hooks_t;

static inline int fake_hooks_load(const char *path, fake_hooks_t *h) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  void *syms[8];
  static const char *const names[8] = {
      "fake_cuda_enqueue",           "fake_cuda_stream_wait_flag",
      "fake_cuda_ptr_device",        "fake_cuda_set_query_delay_us",
      "fake_cuda_current_device",    "fake_cuda_live_allocations",
      "fake_cuda_stall_copy",        "fake_cuda_copied"};
  int i;
  if (lib == NULL) return -1;
  for (i = 0; i < 8; i++)
    if ((syms[i] = dlsym(lib, names[i])) == NULL) return -1;
  dlclose(lib); /* drops only the reference taken here */
  memcpy(h, syms, sizeof(*h));
  return 0;
}

#endif
