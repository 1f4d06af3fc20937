/* The public blocking GPU helpers (uvccl.h, "GPU"): device count and
 * info, allocation, copies. They are for setup code and tests: they call
 * CUDA on the calling thread and wait, which the loop-side API never does.
 * Every entry loads CUDA first, so without a GPU they all report
 * UVCCL_ENOGPU and uvccl_gpu_unavailable_reason() says why. */
#include "cuda_api.h"
#include "gpu.h"

#include <stdio.h>
#include <string.h>

/* Maps a failed CUDA call to a uvccl code and logs what failed, since the
 * blocking helpers have no work object to carry a message. */
static int cuda_failed(const char *call, uvccl__cuda_err_t rc) {
  char msg[256];
  (void)uvccl__cuda.GetLastError(); /* clear the non-sticky error */
  LOG_ERROR("gpu", "%s", uvccl__cuda_strerror(msg, sizeof(msg), call, rc));
  return uvccl__cuda_to_uvccl(rc);
}

static int check_device(int device) {
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (device < 0 || device >= uvccl__gpu_device_count()) return UV_EINVAL;
  return 0;
}

int uvccl_gpu_info(int device, char *name, size_t namelen,
                   int *driver_version, int *runtime_version) {
  char prop[UVCCL__CUDA_PROP_BUF];
  uvccl__cuda_err_t rc;
  int r = check_device(device);
  if (r != 0) return r;
  if (name != NULL && namelen > 0) {
    memset(prop, 0, sizeof(prop));
    rc = uvccl__cuda.GetDeviceProperties(prop, device);
    if (rc != UVCCL__CUDA_SUCCESS)
      return cuda_failed("cudaGetDeviceProperties", rc);
    prop[UVCCL__CUDA_PROP_NAME_LEN - 1] = '\0';
    snprintf(name, namelen, "%s", prop);
  }
  if (driver_version != NULL) {
    rc = uvccl__cuda.DriverGetVersion(driver_version);
    if (rc != UVCCL__CUDA_SUCCESS)
      return cuda_failed("cudaDriverGetVersion", rc);
  }
  if (runtime_version != NULL) {
    rc = uvccl__cuda.RuntimeGetVersion(runtime_version);
    if (rc != UVCCL__CUDA_SUCCESS)
      return cuda_failed("cudaRuntimeGetVersion", rc);
  }
  return 0;
}

int uvccl_gpu_malloc(int device, void **p, size_t n) {
  uvccl__cuda_err_t rc;
  int r = check_device(device);
  if (r != 0) return r;
  if (p == NULL) return UV_EINVAL;
  *p = NULL;
  /* cudaMalloc allocates on the calling thread's current device. */
  rc = uvccl__cuda.SetDevice(device);
  if (rc != UVCCL__CUDA_SUCCESS) return cuda_failed("cudaSetDevice", rc);
  rc = uvccl__cuda.Malloc(p, n);
  if (rc != UVCCL__CUDA_SUCCESS) return cuda_failed("cudaMalloc", rc);
  return 0;
}

int uvccl_gpu_free(void *p) {
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (p == NULL) return 0;
  rc = uvccl__cuda.Free(p);
  return rc == UVCCL__CUDA_SUCCESS ? 0 : cuda_failed("cudaFree", rc);
}

int uvccl_gpu_host_alloc(void **p, size_t n) {
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (p == NULL) return UV_EINVAL;
  *p = NULL;
  /* Portable: pinned for every device, not just the current one. */
  rc = uvccl__cuda.HostAlloc(p, n, UVCCL__CUDA_HOST_ALLOC_PORTABLE);
  return rc == UVCCL__CUDA_SUCCESS ? 0 : cuda_failed("cudaHostAlloc", rc);
}

int uvccl_gpu_host_free(void *p) {
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (p == NULL) return 0;
  rc = uvccl__cuda.FreeHost(p);
  return rc == UVCCL__CUDA_SUCCESS ? 0 : cuda_failed("cudaFreeHost", rc);
}

int uvccl_gpu_memcpy(void *dst, const void *src, size_t n) {
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (n == 0) return 0;
  if (dst == NULL || src == NULL) return UV_EINVAL;
  rc = uvccl__cuda.Memcpy(dst, src, n, UVCCL__CUDA_MEMCPY_DEFAULT);
  return rc == UVCCL__CUDA_SUCCESS ? 0 : cuda_failed("cudaMemcpy", rc);
}

int uvccl_gpu_memset(void *p, int value, size_t n) {
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (r != 0) return r;
  if (n == 0) return 0;
  if (p == NULL) return UV_EINVAL;
  rc = uvccl__cuda.Memset(p, value, n);
  return rc == UVCCL__CUDA_SUCCESS ? 0 : cuda_failed("cudaMemset", rc);
}

int uvccl_gpu_ptr_device(const void *p, int *device) {
  uvccl__cuda_ptr_attr_t attr;
  uvccl__cuda_err_t rc;
  int r = uvccl__gpu_load(NULL, 0);
  if (device != NULL) *device = -1;
  if (r != 0) return r;
  memset(&attr, 0, sizeof(attr));
  rc = uvccl__cuda.PointerGetAttributes(&attr, p);
  if (rc != UVCCL__CUDA_SUCCESS) {
    /* Older runtimes fail for plain host memory: that is "not device". */
    (void)uvccl__cuda.GetLastError();
    return 0;
  }
  if (attr.type != UVCCL__CUDA_MEM_DEVICE &&
      attr.type != UVCCL__CUDA_MEM_MANAGED)
    return 0;
  if (device != NULL) *device = attr.device;
  return 1;
}
