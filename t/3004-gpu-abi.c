/* uvccl declares the CUDA and NCCL ABI it uses by hand (so it builds with
 * no CUDA header and loads the libraries at run time). This test holds
 * those declarations against the real headers of the toolkit, where they
 * are (the Makefile adds -I/usr/local/cuda/include and
 * UVCCL_HAVE_CUDA_HEADERS): every constant, the layout of every struct,
 * the NCCL config as NCCL_CONFIG_INITIALIZER makes it; then it loads the
 * real libnccl (which needs no GPU) and checks every symbol resolves, the
 * version, and that ncclGetUniqueId works. No GPU needed: a wrong field
 * here would otherwise show only on a GPU machine. */
#include "tap.h"
#include "uvccl.h"
#include "cuda/cuda_api.h"
#include "nccl/nccl_api.h"

#include <limits.h>
#include <stddef.h>

#ifndef UVCCL_HAVE_CUDA_HEADERS
int main(void) {
  skip_all("no CUDA toolkit headers (/usr/local/cuda/include/nccl.h)");
}
#else
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define SAME(ours, theirs) \
  is_int((long long)(ours), (long long)(theirs), "%s == %s", #ours, #theirs)
#define FIELD(a, b, f) \
  ok(offsetof(a, f) == offsetof(b, f) && \
         sizeof(((a *)0)->f) == sizeof(((b *)0)->f), \
     #a "." #f ": offset %zu, size %zu", offsetof(a, f), sizeof(((a *)0)->f))

static void cuda_constants(void) {
  SAME(UVCCL__CUDA_SUCCESS, cudaSuccess);
  SAME(UVCCL__CUDA_ERR_INVALID_VALUE, cudaErrorInvalidValue);
  SAME(UVCCL__CUDA_ERR_MEMORY_ALLOCATION, cudaErrorMemoryAllocation);
  SAME(UVCCL__CUDA_ERR_INSUFFICIENT_DRIVER, cudaErrorInsufficientDriver);
  SAME(UVCCL__CUDA_ERR_NO_DEVICE, cudaErrorNoDevice);
  SAME(UVCCL__CUDA_ERR_INVALID_DEVICE, cudaErrorInvalidDevice);
  SAME(UVCCL__CUDA_ERR_NOT_READY, cudaErrorNotReady);
  SAME(UVCCL__CUDA_MEMCPY_HOST_TO_HOST, cudaMemcpyHostToHost);
  SAME(UVCCL__CUDA_MEMCPY_HOST_TO_DEVICE, cudaMemcpyHostToDevice);
  SAME(UVCCL__CUDA_MEMCPY_DEVICE_TO_HOST, cudaMemcpyDeviceToHost);
  SAME(UVCCL__CUDA_MEMCPY_DEVICE_TO_DEVICE, cudaMemcpyDeviceToDevice);
  SAME(UVCCL__CUDA_MEMCPY_DEFAULT, cudaMemcpyDefault);
  SAME(UVCCL__CUDA_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
  SAME(UVCCL__CUDA_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
  SAME(UVCCL__CUDA_HOST_ALLOC_PORTABLE, cudaHostAllocPortable);
  SAME(UVCCL__CUDA_HOST_ALLOC_MAPPED, cudaHostAllocMapped);
  SAME(UVCCL__CUDA_MEM_UNREGISTERED, cudaMemoryTypeUnregistered);
  SAME(UVCCL__CUDA_MEM_HOST, cudaMemoryTypeHost);
  SAME(UVCCL__CUDA_MEM_DEVICE, cudaMemoryTypeDevice);
  SAME(UVCCL__CUDA_MEM_MANAGED, cudaMemoryTypeManaged);
  SAME(UVCCL__CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ);
  SAME(sizeof(uvccl__cuda_err_t), sizeof(cudaError_t));
  SAME(sizeof(uvccl__cuda_ptr_attr_t), sizeof(struct cudaPointerAttributes));
  FIELD(uvccl__cuda_ptr_attr_t, struct cudaPointerAttributes, type);
  FIELD(uvccl__cuda_ptr_attr_t, struct cudaPointerAttributes, device);
  FIELD(uvccl__cuda_ptr_attr_t, struct cudaPointerAttributes, devicePointer);
  FIELD(uvccl__cuda_ptr_attr_t, struct cudaPointerAttributes, hostPointer);
  ok(sizeof(struct cudaDeviceProp) <= UVCCL__CUDA_PROP_BUF &&
         offsetof(struct cudaDeviceProp, name) == 0 &&
         sizeof(((struct cudaDeviceProp *)0)->name) == UVCCL__CUDA_PROP_NAME_LEN,
     "cudaDeviceProp (%zu bytes) fits the %d-byte buffer, name first",
     sizeof(struct cudaDeviceProp), UVCCL__CUDA_PROP_BUF);
}

static void nccl_constants(void) {
  SAME(UVCCL__NCCL_SUCCESS, ncclSuccess);
  SAME(UVCCL__NCCL_UNHANDLED_CUDA_ERROR, ncclUnhandledCudaError);
  SAME(UVCCL__NCCL_SYSTEM_ERROR, ncclSystemError);
  SAME(UVCCL__NCCL_INTERNAL_ERROR, ncclInternalError);
  SAME(UVCCL__NCCL_INVALID_ARGUMENT, ncclInvalidArgument);
  SAME(UVCCL__NCCL_INVALID_USAGE, ncclInvalidUsage);
  SAME(UVCCL__NCCL_REMOTE_ERROR, ncclRemoteError);
  SAME(UVCCL__NCCL_IN_PROGRESS, ncclInProgress);
  SAME(UVCCL__NCCL_INT8, ncclInt8);
  SAME(UVCCL__NCCL_UINT8, ncclUint8);
  SAME(UVCCL__NCCL_INT32, ncclInt32);
  SAME(UVCCL__NCCL_UINT32, ncclUint32);
  SAME(UVCCL__NCCL_INT64, ncclInt64);
  SAME(UVCCL__NCCL_UINT64, ncclUint64);
  SAME(UVCCL__NCCL_FLOAT16, ncclFloat16);
  SAME(UVCCL__NCCL_FLOAT32, ncclFloat32);
  SAME(UVCCL__NCCL_FLOAT64, ncclFloat64);
  SAME(UVCCL__NCCL_BFLOAT16, ncclBfloat16);
  SAME(UVCCL__NCCL_SUM, ncclSum);
  SAME(UVCCL__NCCL_PROD, ncclProd);
  SAME(UVCCL__NCCL_MAX, ncclMax);
  SAME(UVCCL__NCCL_MIN, ncclMin);
  SAME(UVCCL__NCCL_AVG, ncclAvg);
  SAME(UVCCL__NCCL_SPLIT_NOCOLOR, NCCL_SPLIT_NOCOLOR);
  SAME(UVCCL__NCCL_SCALAR_HOST_IMMEDIATE, ncclScalarHostImmediate);
  SAME(sizeof(int), sizeof(ncclResult_t));
  SAME(sizeof(int), sizeof(ncclDataType_t));
  SAME(sizeof(int), sizeof(ncclRedOp_t));
  SAME(sizeof(uvccl__nccl_unique_id_t), sizeof(ncclUniqueId));
  SAME(sizeof(uvccl__nccl_comm_t), sizeof(ncclComm_t));
  SAME(sizeof(uvccl__nccl_config_t), sizeof(ncclConfig_t));
  FIELD(uvccl__nccl_config_t, ncclConfig_t, size);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, magic);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, version);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, blocking);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, cgaClusterSize);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, minCTAs);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, maxCTAs);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, netName);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, splitShare);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, trafficClass);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, commName);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, collnetEnable);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, CTAPolicy);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, shrinkShare);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, nvlsCTAs);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, nChannelsPerNetPeer);
  FIELD(uvccl__nccl_config_t, ncclConfig_t, nvlinkCentricSched);
  {
    /* ours = NCCL_CONFIG_INITIALIZER with blocking = 0, except the version
     * it announces (the layout's, 2.28.0, not the patch level) */
    ncclConfig_t want = NCCL_CONFIG_INITIALIZER;
    uvccl__nccl_config_t got;
    want.blocking = 0;
    uvccl__nccl_config_init(&got);
    ok(got.version / 100 == want.version / 100,
       "config version %u is the headers' layout (%u)", got.version,
       want.version);
    got.version = want.version;
    ok(memcmp(&got, &want, sizeof(got)) == 0,
       "uvccl__nccl_config_init() = NCCL_CONFIG_INITIALIZER, blocking 0");
  }
}

static void real_nccl(void) {
  char err[256] = "";
  int rc, v = 0;
  uvccl__nccl_unique_id_t id, zero;
  setenv("UVCCL_NCCL", "/usr/local/cuda/lib64/libnccl.so.2", 0);
  rc = uvccl__nccl_api_load(err, sizeof(err));
  if (rc != 0) {
    skip(3, "the real libnccl does not load here: %s", err);
    return;
  }
  ok(1, "real libnccl loads, every symbol of the table resolves");
  is_int(uvccl__nccl.GetVersion(&v), UVCCL__NCCL_SUCCESS, "ncclGetVersion");
  ok(v == uvccl__nccl.version && v >= 21800, "version %d (>= 2.18)", v);
  printf("# NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  /* ncclGetUniqueId works with no GPU (it opens the bootstrap listener);
   * where NCCL_SOCKET_IFNAME finds nothing it may fail: then say so */
  memset(&zero, 0, sizeof(zero));
  memset(&id, 0, sizeof(id));
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  rc = uvccl__nccl.GetUniqueId(&id);
  if (rc == UVCCL__NCCL_SUCCESS)
    ok(memcmp(&id, &zero, sizeof(id)) != 0, "ncclGetUniqueId made an id");
  else
    ok(uvccl__nccl.GetErrorString(rc) != NULL,
       "ncclGetUniqueId: %s (no usable interface here)",
       uvccl__nccl.GetErrorString(rc));
}

int main(void) {
  tap_alarm(60);
  cuda_constants();
  nccl_constants();
  real_nccl();
  done_testing();
}
#endif
