/* Loads the CUDA runtime with dlopen and resolves uvccl__cuda, once per
 * process. Why dlopen: a library linked against libcudart (or the libcuda
 * stub) does not even start where the driver is missing, and the CUDA
 * soname changes with every major release; loading at run time lets one
 * binary run the CPU side everywhere and report why the GPU side cannot. */
#include "cuda_api.h"
#include "gpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

uvccl__cuda_api_t uvccl__cuda;

static uv_once_t load_once = UV_ONCE_INIT;
static int load_status;      /* 0 or UVCCL_ENOGPU, set once */
static char load_reason[512];
static int load_device_count;

int uvccl__gpu_device_count(void) { return load_device_count; }

char *uvccl__cuda_strerror(char *buf, size_t len, const char *call,
                           uvccl__cuda_err_t err) {
  const char *text = NULL, *name = NULL;
  if (uvccl__cuda.GetErrorString) text = uvccl__cuda.GetErrorString(err);
  if (uvccl__cuda.GetErrorName) name = uvccl__cuda.GetErrorName(err);
  snprintf(buf, len, "%s: %s (%s %d)", call, text ? text : "CUDA error",
           name ? name : "cudaError", err);
  return buf;
}

int uvccl__cuda_to_uvccl(uvccl__cuda_err_t err) {
  switch (err) {
  case UVCCL__CUDA_SUCCESS:
    return 0;
  case UVCCL__CUDA_ERR_MEMORY_ALLOCATION:
    return UV_ENOMEM;
  case UVCCL__CUDA_ERR_INVALID_VALUE:
  case UVCCL__CUDA_ERR_INVALID_DEVICE:
    return UV_EINVAL;
  default:
    return UVCCL_ECUDA;
  }
}

#ifndef UVCCL_NO_CUDA
static void *cudart_handle; /* kept open for the life of the process */

/* Where to look when $UVCCL_CUDART is not set: the loader's search path
 * first (ldconfig, LD_LIBRARY_PATH), then the toolkit's default prefix;
 * CUDA 13, then 12 (the runtime ABI we use is the same in both). */
static const char *const cudart_candidates[] = {
    "libcudart.so.13",
    "/usr/local/cuda/lib64/libcudart.so.13",
    "libcudart.so.12",
    "/usr/local/cuda/lib64/libcudart.so.12",
};

#define SYM(field, name, required)                                           \
  { #name, offsetof(uvccl__cuda_api_t, field), required }
static const struct {
  const char *name;
  size_t offset;
  int required;
} cudart_symbols[] = {
    SYM(GetDeviceCount, cudaGetDeviceCount, 1),
    SYM(SetDevice, cudaSetDevice, 1),
    SYM(GetDevice, cudaGetDevice, 1),
    SYM(GetErrorString, cudaGetErrorString, 1),
    SYM(GetErrorName, cudaGetErrorName, 1),
    SYM(GetLastError, cudaGetLastError, 1),
    SYM(DriverGetVersion, cudaDriverGetVersion, 1),
    SYM(RuntimeGetVersion, cudaRuntimeGetVersion, 1),
    SYM(Malloc, cudaMalloc, 1),
    SYM(Free, cudaFree, 1),
    SYM(MallocHost, cudaMallocHost, 1),
    SYM(HostAlloc, cudaHostAlloc, 1),
    SYM(FreeHost, cudaFreeHost, 1),
    SYM(Memcpy, cudaMemcpy, 1),
    SYM(MemcpyAsync, cudaMemcpyAsync, 1),
    SYM(Memset, cudaMemset, 1),
    SYM(MemsetAsync, cudaMemsetAsync, 1),
    SYM(StreamCreateWithFlags, cudaStreamCreateWithFlags, 1),
    SYM(StreamDestroy, cudaStreamDestroy, 1),
    SYM(StreamSynchronize, cudaStreamSynchronize, 1),
    SYM(StreamWaitEvent, cudaStreamWaitEvent, 1),
    SYM(EventCreateWithFlags, cudaEventCreateWithFlags, 1),
    SYM(EventDestroy, cudaEventDestroy, 1),
    SYM(EventRecord, cudaEventRecord, 1),
    SYM(EventQuery, cudaEventQuery, 1),
    SYM(EventSynchronize, cudaEventSynchronize, 1),
    SYM(PointerGetAttributes, cudaPointerGetAttributes, 1),
    SYM(DeviceGetAttribute, cudaDeviceGetAttribute, 1),
    SYM(LaunchHostFunc, cudaLaunchHostFunc, 1),
    SYM(GetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion, 0),
};
#undef SYM

static int open_cudart(const char **path) {
  const char *env = uvccl__config_text(UVCCL__CFG_CUDART);
  char first_error[256] = "";
  size_t i;
  if (env != NULL && env[0] != '\0') {
    *path = env;
    cudart_handle = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (cudart_handle == NULL) {
      snprintf(load_reason, sizeof(load_reason),
               "cannot load the CUDA runtime from UVCCL_CUDART=%s: %s", env,
               dlerror());
      return -1;
    }
    return 0;
  }
  for (i = 0; i < UVCCL__ARRAY_SIZE(cudart_candidates); i++) {
    *path = cudart_candidates[i];
    cudart_handle = dlopen(*path, RTLD_NOW | RTLD_LOCAL);
    if (cudart_handle != NULL) return 0;
    /* The first failure is the informative one (the preferred name). */
    if (first_error[0] == '\0')
      snprintf(first_error, sizeof(first_error), "%s", dlerror());
  }
  snprintf(load_reason, sizeof(load_reason),
           "cannot load the CUDA runtime (libcudart.so.13 or .12; set "
           "UVCCL_CUDART to its path): %s",
           first_error);
  return -1;
}

static int resolve_symbols(const char *path) {
  size_t i;
  void *sym;
  for (i = 0; i < UVCCL__ARRAY_SIZE(cudart_symbols); i++) {
    sym = dlsym(cudart_handle, cudart_symbols[i].name);
    if (sym == NULL && cudart_symbols[i].required) {
      snprintf(load_reason, sizeof(load_reason), "%s has no %s: too old?",
               path, cudart_symbols[i].name);
      return -1;
    }
    /* POSIX guarantees function pointers round-trip through void *. */
    memcpy((char *)&uvccl__cuda + cudart_symbols[i].offset, &sym,
           sizeof(sym));
  }
  /* CUDA 12 exports the current struct layout as _v2 (the plain name is
   * the CUDA 11 layout, kept for old binaries); CUDA 13 dropped the
   * suffix. */
  sym = dlsym(cudart_handle, "cudaGetDeviceProperties_v2");
  if (sym == NULL) sym = dlsym(cudart_handle, "cudaGetDeviceProperties");
  if (sym == NULL) {
    snprintf(load_reason, sizeof(load_reason),
             "%s has no cudaGetDeviceProperties", path);
    return -1;
  }
  memcpy(&uvccl__cuda.GetDeviceProperties, &sym, sizeof(sym));
  return 0;
}

/* Driver functions the runtime lacks, without linking libcuda. */
static void resolve_driver_entry_points(void) {
  void *fn = NULL;
  int status = 0;
  if (uvccl__cuda.GetDriverEntryPointByVersion == NULL) return;
  if (uvccl__cuda.GetDriverEntryPointByVersion("cuStreamWaitValue32", &fn,
                                               12000, 0, &status) == 0 &&
      fn != NULL)
    memcpy(&uvccl__cuda.StreamWaitValue32, &fn, sizeof(fn));
  else
    (void)uvccl__cuda.GetLastError(); /* not sticky; keep it clean */
}

static void load(void) {
  const char *path = NULL;
  char why[256];
  int rc, n = 0;
  load_status = UVCCL_ENOGPU;
  if (open_cudart(&path) != 0 || resolve_symbols(path) != 0) goto fail;
  rc = uvccl__cuda.GetDeviceCount(&n);
  if (rc != UVCCL__CUDA_SUCCESS) {
    snprintf(load_reason, sizeof(load_reason), "%s (runtime %s)",
             uvccl__cuda_strerror(why, sizeof(why), "cudaGetDeviceCount", rc),
             path);
    goto fail;
  }
  if (n <= 0) {
    snprintf(load_reason, sizeof(load_reason),
             "cudaGetDeviceCount: no CUDA device (runtime %s)", path);
    goto fail;
  }
  resolve_driver_entry_points();
  load_device_count = n;
  load_status = 0;
  LOG_DEBUG("gpu", "loaded %s: %d device(s)", path, n);
  return;
fail:
  /* Keep the table empty so that nothing calls into a half-loaded
   * library; the handle stays open (dlclose of CUDA is not safe). */
  memset(&uvccl__cuda, 0, sizeof(uvccl__cuda));
  LOG_DEBUG("gpu", "GPU unavailable: %s", load_reason);
}
#else
static void load(void) {
  load_status = UVCCL_ENOGPU;
  snprintf(load_reason, sizeof(load_reason), "built without CUDA (CUDA=no)");
}
#endif

int uvccl__gpu_load(char *err, size_t errlen) {
  uv_once(&load_once, load);
  if (load_status != 0 && err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", load_reason);
  return load_status;
}

const char *uvccl_gpu_unavailable_reason(void) {
  uv_once(&load_once, load);
  return load_status == 0 ? NULL : load_reason;
}

int uvccl_gpu_device_count(int *count) {
  int r = uvccl__gpu_load(NULL, 0);
  if (count != NULL) *count = r == 0 ? load_device_count : 0;
  return r;
}
