/* A fake CUDA runtime for tests on machines without a GPU: built into
 * $(BUILD)/fake/libcudart.so.13 and selected with UVCCL_CUDART. It
 * exports the cuda* functions uvccl loads (same names and ABI), plus the
 * test hooks in fake.h.
 *
 * The model: FAKE_CUDA_DEVICES devices (default 1; 0 makes
 * cudaGetDeviceCount fail with cudaErrorNoDevice, FAKE_CUDA_NO_DRIVER=1
 * with cudaErrorInsufficientDriver). "Device memory" is malloc'd host
 * memory kept in a registry, so pointer attributes know it. Every stream,
 * the per-device default stream (NULL) included, is an in-order queue run
 * by its own worker thread, the "GPU": async copies, memsets, event
 * records, waits and host functions run there in stream order. The legacy
 * default stream does not synchronize with other streams here. */
#define _GNU_SOURCE
#include "fake.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
  E_SUCCESS = 0,
  E_INVALID_VALUE = 1,
  E_MEMORY_ALLOCATION = 2,
  E_INSUFFICIENT_DRIVER = 35,
  E_NO_DEVICE = 100,
  E_INVALID_DEVICE = 101,
  E_INVALID_HANDLE = 400,
  E_NOT_FOUND = 500,
  E_NOT_READY = 600,
};

/* ---- Global state ------------------------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast when any event completes (cross-stream waits, synchronize). */
static pthread_cond_t g_event_cond = PTHREAD_COND_INITIALIZER;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static int g_ndevices;
static int g_init_error;
static volatile unsigned g_query_delay_us;
/* FAKE_CUDA_COPY_MBPS: async copies take the time a copy engine of that
 * rate would (0: instant), so that staging's overlap shows on a CPU. */
static double g_copy_us_per_byte;
/* fake_cuda_stall_copy: the next async copy from g_stall_src waits. */
static const void *g_stall_src;
static volatile uint32_t *g_stall_flag;
/* Bytes copied by kind (cudaMemcpyKind 0-4), for fake_cuda_copied. */
static uint64_t g_copied[5];
static __thread int t_device;
static __thread int t_last_error;

static void init_once(void) {
  const char *n = getenv("FAKE_CUDA_DEVICES");
  const char *nd = getenv("FAKE_CUDA_NO_DRIVER");
  const char *rate = getenv("FAKE_CUDA_COPY_MBPS");
  g_ndevices = n ? atoi(n) : 1;
  if (rate && atof(rate) > 0) g_copy_us_per_byte = 1.0 / atof(rate);
  if (nd && atoi(nd)) g_init_error = E_INSUFFICIENT_DRIVER;
  else if (g_ndevices <= 0) g_init_error = E_NO_DEVICE;
}

static int init(void) {
  pthread_once(&g_init_once, init_once);
  return g_init_error;
}

static int fail(int err) {
  if (err != E_SUCCESS && err != E_NOT_READY) t_last_error = err;
  return err;
}

/* ---- Memory registry --------------------------------------------------- */

typedef struct alloc_s {
  struct alloc_s *next;
  char *p;
  size_t n;
  int device; /* -1: pinned host memory */
} alloc_t;
static alloc_t *g_allocs;

static alloc_t *find_alloc_locked(const void *p) {
  alloc_t *a;
  for (a = g_allocs; a; a = a->next)
    if ((const char *)p >= a->p && (const char *)p < a->p + (a->n ? a->n : 1))
      return a;
  return NULL;
}

/* A copy's kind must say where its pointers are, as a real runtime's
 * does (only cudaMemcpyDefault infers it): a copy given the wrong kind
 * fails here instead of passing unseen. Counts the bytes of those that
 * pass. */
static int copy_kind_ok(void *dst, const void *src, size_t n, int kind) {
  alloc_t *a;
  int dd, sd, ok;
  pthread_mutex_lock(&g_lock);
  a = find_alloc_locked(dst);
  dd = a != NULL && a->device >= 0;
  a = find_alloc_locked(src);
  sd = a != NULL && a->device >= 0;
  switch (kind) {
  case 0: ok = !dd && !sd; break;
  case 1: ok = dd && !sd; break;
  case 2: ok = !dd && sd; break;
  case 3: ok = dd && sd; break;
  case 4: ok = 1; break;
  default: ok = 0;
  }
  if (ok) g_copied[kind] += n;
  pthread_mutex_unlock(&g_lock);
  return ok;
}

static int do_alloc(void **p, size_t n, int device) {
  alloc_t *a;
  int r = init();
  if (r) return fail(r);
  if (!p) return fail(E_INVALID_VALUE);
  a = calloc(1, sizeof(*a));
  if (!a) return fail(E_MEMORY_ALLOCATION);
  a->p = malloc(n ? n : 1);
  if (!a->p) {
    free(a);
    return fail(E_MEMORY_ALLOCATION);
  }
  a->n = n;
  a->device = device;
  pthread_mutex_lock(&g_lock);
  a->next = g_allocs;
  g_allocs = a;
  pthread_mutex_unlock(&g_lock);
  *p = a->p;
  return E_SUCCESS;
}

static int do_free(void *p, int host) {
  alloc_t **pp, *a = NULL;
  if (!p) return E_SUCCESS;
  pthread_mutex_lock(&g_lock);
  for (pp = &g_allocs; *pp; pp = &(*pp)->next)
    if ((*pp)->p == p && ((*pp)->device < 0) == host) {
      a = *pp;
      *pp = a->next;
      break;
    }
  pthread_mutex_unlock(&g_lock);
  if (!a) return fail(E_INVALID_VALUE);
  free(a->p);
  free(a);
  return E_SUCCESS;
}

/* ---- Events ------------------------------------------------------------ */

/* CUDA semantics: a query reflects the latest record; an event never
 * recorded counts as complete. Records complete in their stream's order,
 * and an older record finishing late must not complete a newer one. */
typedef struct {
  uint64_t recorded; /* records issued */
  uint64_t done;     /* highest record executed */
  int refs;          /* the handle + queued items that point here */
  unsigned flags;
} event_t;

static void event_unref_locked(event_t *e) {
  if (--e->refs == 0) free(e);
}

/* ---- Streams ----------------------------------------------------------- */

enum { IT_FN, IT_RECORD, IT_WAIT_EVENT, IT_WAIT_VALUE, IT_COPY, IT_SET,
       IT_QUIT };

typedef struct item_s {
  struct item_s *next;
  int type;
  void (*fn)(void *);
  void *arg;
  event_t *event;
  uint64_t seq;
  volatile uint32_t *addr;
  uint32_t value;
  void *dst;
  const void *src;
  size_t n;
  int byte;
} item_t;

typedef struct stream_s {
  int device;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  item_t *head, *tail;
  int busy; /* the worker holds an item */
} stream_t;

static stream_t *g_default_streams[64];

static void run_item(item_t *it) {
  switch (it->type) {
  case IT_FN:
    it->fn(it->arg);
    break;
  case IT_COPY:
    memmove(it->dst, it->src, it->n);
    if (g_copy_us_per_byte > 0 && it->n > 0)
      usleep((useconds_t)((double)it->n * g_copy_us_per_byte));
    break;
  case IT_SET:
    memset(it->dst, it->byte, it->n);
    break;
  case IT_RECORD:
    pthread_mutex_lock(&g_lock);
    if (it->seq > it->event->done) it->event->done = it->seq;
    event_unref_locked(it->event);
    pthread_cond_broadcast(&g_event_cond);
    pthread_mutex_unlock(&g_lock);
    break;
  case IT_WAIT_EVENT:
    pthread_mutex_lock(&g_lock);
    while (it->event->done < it->seq)
      pthread_cond_wait(&g_event_cond, &g_lock);
    event_unref_locked(it->event);
    pthread_mutex_unlock(&g_lock);
    break;
  case IT_WAIT_VALUE:
    /* As CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0. */
    while ((int32_t)(*it->addr - it->value) < 0) usleep(50);
    break;
  }
}

static void *stream_worker(void *arg) {
  stream_t *s = arg;
  item_t *it;
  int quit = 0;
  while (!quit) {
    pthread_mutex_lock(&s->lock);
    while (!s->head) pthread_cond_wait(&s->cond, &s->lock);
    it = s->head;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    if (it->type == IT_QUIT) quit = 1;
    else run_item(it);
    pthread_mutex_lock(&s->lock);
    /* Unlinked only after it ran, so that "queue empty" means "idle". */
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    s->busy = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    free(it);
  }
  /* cudaStreamDestroy returns at once; the stream goes when drained. */
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
  return NULL;
}

static stream_t *stream_new(int device) {
  stream_t *s = calloc(1, sizeof(*s));
  pthread_attr_t attr;
  if (!s) return NULL;
  s->device = device;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&s->thread, &attr, stream_worker, s) != 0) {
    pthread_attr_destroy(&attr);
    free(s);
    return NULL;
  }
  pthread_attr_destroy(&attr);
  return s;
}

/* NULL is the current device's default stream, made on first use. */
static stream_t *resolve_stream(void *handle) {
  stream_t *s;
  if (handle) return handle;
  if (init() || t_device < 0 || t_device >= g_ndevices || t_device >= 64)
    return NULL;
  pthread_mutex_lock(&g_lock);
  s = g_default_streams[t_device];
  if (!s) s = g_default_streams[t_device] = stream_new(t_device);
  pthread_mutex_unlock(&g_lock);
  return s;
}

static int push(void *handle, item_t *proto) {
  stream_t *s = resolve_stream(handle);
  item_t *it;
  if (!s) return fail(init() ? init() : E_INVALID_HANDLE);
  it = malloc(sizeof(*it));
  if (!it) return fail(E_MEMORY_ALLOCATION);
  *it = *proto;
  it->next = NULL;
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = it;
  else s->head = it;
  s->tail = it;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return E_SUCCESS;
}

/* ---- Exported runtime API ---------------------------------------------- */

EXPORT int cudaGetDeviceCount(int *count) {
  int r = init();
  if (!count) return fail(E_INVALID_VALUE);
  *count = r ? 0 : g_ndevices;
  return fail(r);
}

EXPORT int cudaSetDevice(int device) {
  int r = init();
  if (r) return fail(r);
  if (device < 0 || device >= g_ndevices) return fail(E_INVALID_DEVICE);
  {
    /* FAKE_CUDA_FAIL_SETDEVICE=N: device N cannot be made current (a
     * context that fails to come up) */
    const char *f = getenv("FAKE_CUDA_FAIL_SETDEVICE");
    if (f != NULL && *f != '\0' && atoi(f) == device)
      return fail(E_INVALID_DEVICE);
  }
  t_device = device;
  return E_SUCCESS;
}

EXPORT int cudaGetDevice(int *device) {
  int r = init();
  if (r) return fail(r);
  if (!device) return fail(E_INVALID_VALUE);
  *device = t_device;
  return E_SUCCESS;
}

EXPORT const char *cudaGetErrorName(int err) {
  switch (err) {
  case E_SUCCESS: return "cudaSuccess";
  case E_INVALID_VALUE: return "cudaErrorInvalidValue";
  case E_MEMORY_ALLOCATION: return "cudaErrorMemoryAllocation";
  case E_INSUFFICIENT_DRIVER: return "cudaErrorInsufficientDriver";
  case E_NO_DEVICE: return "cudaErrorNoDevice";
  case E_INVALID_DEVICE: return "cudaErrorInvalidDevice";
  case E_INVALID_HANDLE: return "cudaErrorInvalidResourceHandle";
  case E_NOT_FOUND: return "cudaErrorSymbolNotFound";
  case E_NOT_READY: return "cudaErrorNotReady";
  default: return "cudaErrorUnknown";
  }
}

EXPORT const char *cudaGetErrorString(int err) {
  switch (err) {
  case E_SUCCESS: return "no error";
  case E_INVALID_VALUE: return "invalid argument";
  case E_MEMORY_ALLOCATION: return "out of memory";
  case E_INSUFFICIENT_DRIVER:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case E_NO_DEVICE: return "no CUDA-capable device is detected";
  case E_INVALID_DEVICE: return "invalid device ordinal";
  case E_INVALID_HANDLE: return "invalid resource handle";
  case E_NOT_FOUND: return "named symbol not found";
  case E_NOT_READY: return "device not ready";
  default: return "unknown error";
  }
}

EXPORT int cudaGetLastError(void) {
  int e = t_last_error;
  t_last_error = 0;
  return e;
}

EXPORT int cudaDriverGetVersion(int *v) {
  if (!v) return fail(E_INVALID_VALUE);
  *v = 13000;
  return E_SUCCESS;
}

EXPORT int cudaRuntimeGetVersion(int *v) {
  if (!v) return fail(E_INVALID_VALUE);
  *v = 13000;
  return E_SUCCESS;
}

EXPORT int cudaMalloc(void **p, size_t n) { return do_alloc(p, n, t_device); }
EXPORT int cudaFree(void *p) { return do_free(p, 0); }
EXPORT int cudaMallocHost(void **p, size_t n) { return do_alloc(p, n, -1); }
EXPORT int cudaHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  return do_alloc(p, n, -1);
}
EXPORT int cudaFreeHost(void *p) { return do_free(p, 1); }

EXPORT int cudaStreamSynchronize(void *stream);

EXPORT int cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  int r = init();
  if (r) return fail(r);
  if (n && (!dst || !src)) return fail(E_INVALID_VALUE);
  if (!copy_kind_ok(dst, src, n, kind)) return fail(E_INVALID_VALUE);
  /* Synchronous with the default stream, as the legacy stream is. */
  r = cudaStreamSynchronize(NULL);
  if (r) return r;
  memmove(dst, src, n);
  return E_SUCCESS;
}

EXPORT int cudaMemset(void *p, int value, size_t n) {
  int r = init();
  if (r) return fail(r);
  if (n && !p) return fail(E_INVALID_VALUE);
  r = cudaStreamSynchronize(NULL);
  if (r) return r;
  memset(p, value, n);
  return E_SUCCESS;
}

EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                           void *stream) {
  item_t it = {.type = IT_COPY, .dst = dst, .src = src, .n = n};
  volatile uint32_t *stall = NULL;
  if (n && (!dst || !src)) return fail(E_INVALID_VALUE);
  if (!copy_kind_ok(dst, src, n, kind)) return fail(E_INVALID_VALUE);
  pthread_mutex_lock(&g_lock);
  if (g_stall_src != NULL && src == g_stall_src) {
    stall = g_stall_flag;
    g_stall_src = NULL;
  }
  pthread_mutex_unlock(&g_lock);
  if (stall != NULL) {
    item_t w = {.type = IT_WAIT_VALUE, .addr = stall, .value = 1};
    int r = push(stream, &w);
    if (r) return r;
  }
  return push(stream, &it);
}

EXPORT int cudaMemsetAsync(void *p, int value, size_t n, void *stream) {
  item_t it = {.type = IT_SET, .dst = p, .byte = value, .n = n};
  if (n && !p) return fail(E_INVALID_VALUE);
  return push(stream, &it);
}

EXPORT int cudaStreamCreateWithFlags(void **stream, unsigned flags) {
  stream_t *s;
  int r = init();
  (void)flags;
  if (r) return fail(r);
  if (!stream) return fail(E_INVALID_VALUE);
  s = stream_new(t_device);
  if (!s) return fail(E_MEMORY_ALLOCATION);
  *stream = s;
  return E_SUCCESS;
}

EXPORT int cudaStreamDestroy(void *stream) {
  item_t it = {.type = IT_QUIT};
  if (!stream) return fail(E_INVALID_HANDLE);
  return push(stream, &it);
}

static void set_flag(void *arg) {
  pthread_mutex_lock(&g_lock);
  *(int *)arg = 1;
  pthread_cond_broadcast(&g_event_cond);
  pthread_mutex_unlock(&g_lock);
}

EXPORT int cudaStreamSynchronize(void *stream) {
  int reached = 0, r;
  item_t it = {.type = IT_FN, .fn = set_flag, .arg = &reached};
  r = push(stream, &it);
  if (r) return r;
  pthread_mutex_lock(&g_lock);
  while (!reached) pthread_cond_wait(&g_event_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  return E_SUCCESS;
}

EXPORT int cudaEventCreateWithFlags(void **event, unsigned flags) {
  event_t *e;
  int r = init();
  if (r) return fail(r);
  if (!event) return fail(E_INVALID_VALUE);
  e = calloc(1, sizeof(*e));
  if (!e) return fail(E_MEMORY_ALLOCATION);
  e->refs = 1;
  e->flags = flags;
  *event = e;
  return E_SUCCESS;
}

EXPORT int cudaEventDestroy(void *event) {
  if (!event) return fail(E_INVALID_HANDLE);
  pthread_mutex_lock(&g_lock);
  event_unref_locked(event); /* queued records keep it alive */
  pthread_mutex_unlock(&g_lock);
  return E_SUCCESS;
}

EXPORT int cudaEventRecord(void *event, void *stream) {
  event_t *e = event;
  item_t it = {.type = IT_RECORD, .event = e};
  int r;
  if (!e) return fail(E_INVALID_HANDLE);
  if (!resolve_stream(stream)) return fail(E_INVALID_HANDLE);
  pthread_mutex_lock(&g_lock);
  it.seq = ++e->recorded;
  e->refs++;
  pthread_mutex_unlock(&g_lock);
  r = push(stream, &it);
  if (r) {
    pthread_mutex_lock(&g_lock);
    e->recorded--;
    event_unref_locked(e);
    pthread_mutex_unlock(&g_lock);
  }
  return r;
}

EXPORT int cudaEventQuery(void *event) {
  event_t *e = event;
  int done;
  unsigned delay = g_query_delay_us;
  if (!e) return fail(E_INVALID_HANDLE);
  if (delay) usleep(delay);
  pthread_mutex_lock(&g_lock);
  done = e->done >= e->recorded;
  pthread_mutex_unlock(&g_lock);
  return done ? E_SUCCESS : E_NOT_READY;
}

EXPORT int cudaEventSynchronize(void *event) {
  event_t *e = event;
  if (!e) return fail(E_INVALID_HANDLE);
  pthread_mutex_lock(&g_lock);
  while (e->done < e->recorded) pthread_cond_wait(&g_event_cond, &g_lock);
  pthread_mutex_unlock(&g_lock);
  return E_SUCCESS;
}

EXPORT int cudaStreamWaitEvent(void *stream, void *event, unsigned flags) {
  event_t *e = event;
  item_t it = {.type = IT_WAIT_EVENT, .event = e};
  int r;
  (void)flags;
  if (!e) return fail(E_INVALID_HANDLE);
  pthread_mutex_lock(&g_lock);
  it.seq = e->recorded; /* waits for the latest record at call time */
  e->refs++;
  pthread_mutex_unlock(&g_lock);
  r = push(stream, &it);
  if (r) {
    pthread_mutex_lock(&g_lock);
    event_unref_locked(e);
    pthread_mutex_unlock(&g_lock);
  }
  return r;
}

typedef struct {
  int type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8]; /* as CUDA 13: the real call writes all 88 bytes */
} ptr_attr_t;

EXPORT int cudaPointerGetAttributes(ptr_attr_t *attr, const void *p) {
  alloc_t *a;
  int r = init();
  if (r) return fail(r);
  if (!attr) return fail(E_INVALID_VALUE);
  memset(attr, 0, sizeof(*attr));
  attr->device = -1;
  pthread_mutex_lock(&g_lock);
  a = find_alloc_locked(p);
  if (a && a->device >= 0) {
    attr->type = 2;
    attr->device = a->device;
    attr->devicePointer = (void *)p;
  } else if (a) {
    attr->type = 1;
    attr->device = t_device;
    attr->devicePointer = attr->hostPointer = (void *)p;
  } else {
    attr->hostPointer = (void *)p;
  }
  pthread_mutex_unlock(&g_lock);
  return E_SUCCESS;
}

EXPORT int cudaDeviceGetAttribute(int *value, int attr, int device) {
  int r = init();
  (void)attr;
  if (r) return fail(r);
  if (!value) return fail(E_INVALID_VALUE);
  if (device < 0 || device >= g_ndevices) return fail(E_INVALID_DEVICE);
  *value = 0;
  return E_SUCCESS;
}

/* The real struct cudaDeviceProp starts with char name[256]; fill only
 * that (callers pass a buffer at least that big). */
EXPORT int cudaGetDeviceProperties(void *prop, int device) {
  int r = init();
  if (r) return fail(r);
  if (!prop) return fail(E_INVALID_VALUE);
  if (device < 0 || device >= g_ndevices) return fail(E_INVALID_DEVICE);
  memset(prop, 0, 256);
  snprintf(prop, 256, "Fake CUDA Device %d", device);
  return E_SUCCESS;
}

EXPORT int cudaLaunchHostFunc(void *stream, void (*fn)(void *), void *arg) {
  item_t it = {.type = IT_FN, .fn = fn, .arg = arg};
  if (!fn) return fail(E_INVALID_VALUE);
  return push(stream, &it);
}

/* Driver API: CUresult cuStreamWaitValue32(CUstream, CUdeviceptr,
 * cuuint32_t, unsigned). Host pointers double as device pointers here. */
static int fake_cuStreamWaitValue32(void *stream, unsigned long long addr,
                                    uint32_t value, unsigned flags) {
  item_t it = {.type = IT_WAIT_VALUE,
               .addr = (volatile uint32_t *)(uintptr_t)addr,
               .value = value};
  (void)flags;
  return push(stream, &it) ? 1 /* CUDA_ERROR_INVALID_VALUE */ : 0;
}

EXPORT int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                            unsigned version,
                                            unsigned long long flags,
                                            int *status) {
  (void)version;
  (void)flags;
  if (!symbol || !fn) return fail(E_INVALID_VALUE);
  if (strcmp(symbol, "cuStreamWaitValue32") == 0) {
    *fn = (void *)fake_cuStreamWaitValue32;
    if (status) *status = 0; /* cudaDriverEntryPointSuccess */
    return E_SUCCESS;
  }
  *fn = NULL;
  if (status) *status = 1; /* cudaDriverEntryPointSymbolNotFound */
  return E_SUCCESS;
}

/* ---- Test hooks (fake.h) ----------------------------------------------- */

EXPORT int fake_cuda_enqueue(void *stream, void (*fn)(void *arg), void *arg) {
  return cudaLaunchHostFunc(stream, fn, arg);
}

EXPORT int fake_cuda_stream_wait_flag(void *stream, volatile uint32_t *flag) {
  item_t it = {.type = IT_WAIT_VALUE, .addr = flag, .value = 1};
  if (!flag) return fail(E_INVALID_VALUE);
  return push(stream, &it);
}

EXPORT int fake_cuda_stall_copy(const void *src, volatile uint32_t *flag) {
  if (!src || !flag) return fail(E_INVALID_VALUE);
  pthread_mutex_lock(&g_lock);
  g_stall_src = src;
  g_stall_flag = flag;
  pthread_mutex_unlock(&g_lock);
  return E_SUCCESS;
}

EXPORT int fake_cuda_ptr_device(const void *p) {
  alloc_t *a;
  int d = -1;
  pthread_mutex_lock(&g_lock);
  a = find_alloc_locked(p);
  if (a) d = a->device;
  pthread_mutex_unlock(&g_lock);
  return d;
}

EXPORT void fake_cuda_set_query_delay_us(unsigned us) {
  g_query_delay_us = us;
}

EXPORT int fake_cuda_current_device(void) { return t_device; }

EXPORT uint64_t fake_cuda_copied(int kind) {
  uint64_t n;
  if (kind < 0 || kind > 4) return 0;
  pthread_mutex_lock(&g_lock);
  n = g_copied[kind];
  pthread_mutex_unlock(&g_lock);
  return n;
}

EXPORT int fake_cuda_live_allocations(void) {
  alloc_t *a;
  int n = 0;
  pthread_mutex_lock(&g_lock);
  for (a = g_allocs; a; a = a->next) n++;
  pthread_mutex_unlock(&g_lock);
  return n;
}
