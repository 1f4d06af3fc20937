/* The CUDA runtime, loaded at run time (dlopen) so that uvccl builds
 * without CUDA headers and starts on machines without a GPU or a driver.
 *
 * Only the few ABI types the library needs are declared here; they match
 * cuda_runtime_api.h / driver_types.h of CUDA 12 and 13 (error codes are an
 * int enum, handles are opaque pointers). Call through uvccl__cuda.X()
 * only after uvccl__gpu_load() (gpu.h) returned 0. */
#ifndef UVCCL_CUDA_CUDA_API_H
#define UVCCL_CUDA_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int uvccl__cuda_err_t; /* enum cudaError */
#define UVCCL__CUDA_SUCCESS 0
#define UVCCL__CUDA_ERR_INVALID_VALUE 1
#define UVCCL__CUDA_ERR_MEMORY_ALLOCATION 2
#define UVCCL__CUDA_ERR_INSUFFICIENT_DRIVER 35
#define UVCCL__CUDA_ERR_NO_DEVICE 100
#define UVCCL__CUDA_ERR_INVALID_DEVICE 101
#define UVCCL__CUDA_ERR_NOT_READY 600

/* enum cudaMemcpyKind */
#define UVCCL__CUDA_MEMCPY_HOST_TO_HOST 0
#define UVCCL__CUDA_MEMCPY_HOST_TO_DEVICE 1
#define UVCCL__CUDA_MEMCPY_DEVICE_TO_HOST 2
#define UVCCL__CUDA_MEMCPY_DEVICE_TO_DEVICE 3
#define UVCCL__CUDA_MEMCPY_DEFAULT 4 /* inferred from the pointers (UVA) */

#define UVCCL__CUDA_EVENT_DISABLE_TIMING 0x2 /* cudaEventDisableTiming */
#define UVCCL__CUDA_STREAM_NON_BLOCKING 0x1  /* cudaStreamNonBlocking */
#define UVCCL__CUDA_HOST_ALLOC_PORTABLE 0x1  /* cudaHostAllocPortable */
#define UVCCL__CUDA_HOST_ALLOC_MAPPED 0x2    /* cudaHostAllocMapped */

/* enum cudaMemoryType, the type field of cudaPointerAttributes. */
#define UVCCL__CUDA_MEM_UNREGISTERED 0
#define UVCCL__CUDA_MEM_HOST 1
#define UVCCL__CUDA_MEM_DEVICE 2
#define UVCCL__CUDA_MEM_MANAGED 3

/* struct cudaPointerAttributes (CUDA >= 11). CUDA 13 appends reserved
 * space that cudaPointerGetAttributes writes too: leaving it out would let
 * the runtime write past the struct (t/3004 checks the size). */
typedef struct {
  int type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8];
} uvccl__cuda_ptr_attr_t;

/* cudaGetDeviceProperties writes a struct cudaDeviceProp whose size grows
 * between releases (about 1 KiB in CUDA 13); we only read the name, its
 * first member, and give the call room to spare. */
#define UVCCL__CUDA_PROP_BUF 4096
#define UVCCL__CUDA_PROP_NAME_LEN 256

/* Driver API, reached through cudaGetDriverEntryPointByVersion. */
#define UVCCL__CU_STREAM_WAIT_VALUE_GEQ 0x0

typedef struct {
  uvccl__cuda_err_t (*GetDeviceCount)(int *count);
  uvccl__cuda_err_t (*SetDevice)(int device);
  uvccl__cuda_err_t (*GetDevice)(int *device);
  const char *(*GetErrorString)(uvccl__cuda_err_t err);
  const char *(*GetErrorName)(uvccl__cuda_err_t err);
  uvccl__cuda_err_t (*GetLastError)(void);
  uvccl__cuda_err_t (*DriverGetVersion)(int *version);
  uvccl__cuda_err_t (*RuntimeGetVersion)(int *version);
  uvccl__cuda_err_t (*Malloc)(void **p, size_t n);
  uvccl__cuda_err_t (*Free)(void *p);
  uvccl__cuda_err_t (*MallocHost)(void **p, size_t n);
  uvccl__cuda_err_t (*HostAlloc)(void **p, size_t n, unsigned flags);
  uvccl__cuda_err_t (*FreeHost)(void *p);
  uvccl__cuda_err_t (*Memcpy)(void *dst, const void *src, size_t n, int kind);
  uvccl__cuda_err_t (*MemcpyAsync)(void *dst, const void *src, size_t n,
                                   int kind, void *stream);
  uvccl__cuda_err_t (*Memset)(void *p, int value, size_t n);
  uvccl__cuda_err_t (*MemsetAsync)(void *p, int value, size_t n, void *stream);
  uvccl__cuda_err_t (*StreamCreateWithFlags)(void **stream, unsigned flags);
  uvccl__cuda_err_t (*StreamDestroy)(void *stream);
  uvccl__cuda_err_t (*StreamSynchronize)(void *stream);
  uvccl__cuda_err_t (*StreamWaitEvent)(void *stream, void *event,
                                       unsigned flags);
  uvccl__cuda_err_t (*EventCreateWithFlags)(void **event, unsigned flags);
  uvccl__cuda_err_t (*EventDestroy)(void *event);
  uvccl__cuda_err_t (*EventRecord)(void *event, void *stream);
  uvccl__cuda_err_t (*EventQuery)(void *event);
  uvccl__cuda_err_t (*EventSynchronize)(void *event);
  uvccl__cuda_err_t (*PointerGetAttributes)(uvccl__cuda_ptr_attr_t *attr,
                                            const void *p);
  uvccl__cuda_err_t (*DeviceGetAttribute)(int *value, int attr, int device);
  uvccl__cuda_err_t (*GetDeviceProperties)(void *prop, int device);
  uvccl__cuda_err_t (*LaunchHostFunc)(void *stream, void (*fn)(void *arg),
                                      void *arg);
  uvccl__cuda_err_t (*GetDriverEntryPointByVersion)(const char *symbol,
                                                    void **fn,
                                                    unsigned cuda_version,
                                                    unsigned long long flags,
                                                    int *status);
  /* Driver: CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t,
   * unsigned). NULL when the driver does not provide it (and always before
   * a device was counted). Tests block a stream on a host flag with it. */
  int (*StreamWaitValue32)(void *stream, unsigned long long addr,
                           uint32_t value, unsigned flags);
} uvccl__cuda_api_t;

/* Filled by uvccl__gpu_load(); read-only afterwards. */
extern uvccl__cuda_api_t uvccl__cuda;

/* The number of devices counted by uvccl__gpu_load(), or 0. */
int uvccl__gpu_device_count(void);

/* Formats "call: <CUDA's text> (<name> <code>)" into buf; returns buf. */
char *uvccl__cuda_strerror(char *buf, size_t len, const char *call,
                           uvccl__cuda_err_t err);
/* The uvccl error for a CUDA error: UV_ENOMEM for allocation failures,
 * UV_EINVAL for bad values or devices, UVCCL_ECUDA otherwise. */
int uvccl__cuda_to_uvccl(uvccl__cuda_err_t err);

#endif
