/* The GPU thread of a device and the loops' clients of it (gpu.h).
 *
 * Why a thread: CUDA and NCCL calls can block (communicator init, the first
 * collective, destroy, even cudaEventQuery under the driver's lock), and a
 * loop must never block. One thread per device makes every call for that
 * device, in submission order, which is also NCCL's rule of one thread per
 * communicator.
 *
 * Life of an op: a loop submits it (queue, under gpu->lock); the thread
 * issues it (issue(), then an end event recorded on op->stream) and moves
 * it to the FIFO of its stream; it polls only the oldest op of each stream
 * (stream order implies the rest) and hands the finished op to the
 * submitting loop through the client's xqueue, where done() runs.
 *
 * Locking: gpu->lock guards the queue, the FIFOs, the event pool and the
 * op fields the thread reads while an op is queued or on the GPU. The
 * thread holds it except around CUDA calls and issue(), so a loop can take
 * ops away (fail_all) while the thread is stuck inside the driver. The op
 * being issued is the exception: issue() uses op memory, so it is only
 * marked failed and completed when issue() returns. After a removal the
 * thread sees gpu->epoch changed and discards what it learned unlocked. */
#include "cuda_api.h"
#include "gpu.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* op->state_ (informational; the lists say where an op is). */
enum { OP_IDLE = 0, OP_QUEUED, OP_ON_GPU, OP_COMPLETED };

/* Adaptive polling: after progress, spin (yielding) this long, then sleep
 * on the condvar in doubling steps up to the cap; a submission wakes the
 * thread at once. The spin outlasts a staged chunk's copy (a few MiB at a
 * copy engine's rate) and a small collective: a sleep, once entered, can
 * last far longer than asked (timer slack, a sandboxed kernel), and each
 * staged operation waits for two copies, so a shorter spin added a fixed
 * cost of hundreds of microseconds from 1 MiB up (bench/RESULTS.md,
 * "GPU buffers across hosts"). */
#define SPIN_NS 200000u
#define BACKOFF_MIN_US 50u
#define BACKOFF_MAX_US 1000u

#define WATCHDOG_PERIOD_MAX_MS 1000u

typedef struct {
  void *stream;
  uvccl__gpu_op_t *head, *tail; /* issued ops, oldest first */
} gpu_fifo_t;

struct uvccl__gpu_s {
  int device;
  int refs; /* under registry_lock */
  uvccl__gpu_t *next_gpu;
  uv_thread_t thread;
  uv_mutex_t lock;
  uv_cond_t cond;
  /* Under lock. */
  uvccl__gpu_op_t *queue_head, *queue_tail; /* submitted, not issued */
  gpu_fifo_t *fifos; /* one per stream with ops on the GPU */
  size_t nfifos, fifos_cap;
  /* Free events. The array is as long as the number of events created,
   * so returning one (also from a loop, in fail_all) never allocates. */
  void **free_events;
  size_t nfree_events, events_created;
  size_t outstanding; /* ops in the queue or a FIFO */
  uint64_t epoch;     /* bumped whenever a loop takes ops away */
  uvccl__gpu_op_t *issuing;
  int issuing_fail;   /* fail_all hit the op inside issue() */
  char issuing_msg[sizeof(((uvccl__gpu_op_t *)0)->msg)];
  int sleeping;       /* in a condvar wait: submissions signal */
  int stop;
  int start_status;   /* (gpu) cudaSetDevice failed: every op fails */
  char start_msg[256];
  /* Read by the loops' watchdogs without the lock. */
  atomic_uint_fast64_t heartbeat;   /* bumped every iteration */
  _Atomic(const char *) in_call;    /* the call the thread is in, or NULL */
  atomic_int idle;                  /* waiting for submissions: not stuck */
};

struct uvccl__gpu_client_s {
  uvccl__gpu_t *gpu;
  uv_loop_t *loop;
  uvccl__xqueue_t xq;
  uv_timer_t watchdog;
  /* Loop thread only. */
  size_t pending; /* submitted, done() not yet run */
  uint64_t heartbeat_ms;       /* $UVCCL_GPU_HEARTBEAT_MS */
  uint64_t watchdog_period_ms;
  uint64_t seen_heartbeat;
  uint64_t seen_at_ms;
  uint64_t reported_heartbeat; /* the heartbeat of the last report */
  int reported;
  int closing;
  int close_started;
  int open_handles;
  void (*close_cb)(void *arg);
  void *close_arg;
};

/* ---- Registry of device threads --------------------------------------- */

static uv_once_t registry_once = UV_ONCE_INIT;
static uv_mutex_t registry_lock;
static uvccl__gpu_t *registry;

static void registry_init(void) {
  if (uv_mutex_init(&registry_lock) != 0) abort();
}

/* ---- Event pool (under gpu->lock) -------------------------------------- */

static void pool_put_locked(uvccl__gpu_t *gpu, void **ev) {
  if (*ev == NULL) return;
  gpu->free_events[gpu->nfree_events++] = *ev;
  *ev = NULL;
}

/* (gpu, unlocked) An event from the pool, created when the pool is empty:
 * events live as long as the thread, so steady state creates none. */
static int pool_get(uvccl__gpu_t *gpu, void **ev, char *msg, size_t len) {
  void **grown;
  uvccl__cuda_err_t rc;
  uv_mutex_lock(&gpu->lock);
  if (gpu->nfree_events > 0) {
    *ev = gpu->free_events[--gpu->nfree_events];
    uv_mutex_unlock(&gpu->lock);
    return 0;
  }
  uv_mutex_unlock(&gpu->lock);
  atomic_store(&gpu->in_call, "cudaEventCreateWithFlags");
  rc = uvccl__cuda.EventCreateWithFlags(ev,
                                        UVCCL__CUDA_EVENT_DISABLE_TIMING);
  atomic_store(&gpu->in_call, NULL);
  if (rc != UVCCL__CUDA_SUCCESS) {
    (void)uvccl__cuda.GetLastError();
    uvccl__cuda_strerror(msg, len, "cudaEventCreateWithFlags", rc);
    return UVCCL_ECUDA;
  }
  uv_mutex_lock(&gpu->lock);
  grown = uvccl__realloc(gpu->free_events,
                         (gpu->events_created + 1) * sizeof(void *));
  if (grown != NULL) {
    gpu->free_events = grown;
    gpu->events_created++;
  }
  uv_mutex_unlock(&gpu->lock);
  if (grown == NULL) {
    (void)uvccl__cuda.EventDestroy(*ev);
    *ev = NULL;
    snprintf(msg, len, "out of memory for the event pool");
    return UV_ENOMEM;
  }
  return 0;
}

/* ---- FIFOs (under gpu->lock) ------------------------------------------- */

static gpu_fifo_t *fifo_for_locked(uvccl__gpu_t *gpu, void *stream) {
  gpu_fifo_t *grown;
  size_t i;
  for (i = 0; i < gpu->nfifos; i++)
    if (gpu->fifos[i].stream == stream) return &gpu->fifos[i];
  if (gpu->nfifos == gpu->fifos_cap) {
    /* Only when a stream is used for the first time in a while. */
    size_t cap = gpu->fifos_cap ? 2 * gpu->fifos_cap : 4;
    grown = uvccl__realloc(gpu->fifos, cap * sizeof(*grown));
    if (grown == NULL) return NULL;
    gpu->fifos = grown;
    gpu->fifos_cap = cap;
  }
  gpu->fifos[gpu->nfifos].stream = stream;
  gpu->fifos[gpu->nfifos].head = gpu->fifos[gpu->nfifos].tail = NULL;
  return &gpu->fifos[gpu->nfifos++];
}

/* Drops an empty FIFO; the last one takes its place. */
static void fifo_drop_locked(uvccl__gpu_t *gpu, size_t i) {
  gpu->fifos[i] = gpu->fifos[--gpu->nfifos];
}

/* ---- Completion -------------------------------------------------------- */

/* Hands a finished op to its loop. The op must be unlinked from every
 * list: once posted, the loop may run done() and reuse the memory. The GPU
 * thread calls this with gpu->lock held (client_finish_close relies on
 * it); fail_all calls it on the loop thread itself. */
static void post_completion(uvccl__gpu_op_t *op, int status, const char *msg) {
  uvccl__gpu_client_t *c = op->client_;
  int r;
  op->status = status;
  if (status != 0 && msg != NULL && msg != op->msg)
    snprintf(op->msg, sizeof(op->msg), "%s", msg);
  else if (status != 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "%s", uvccl_strerror(status));
  op->state_ = OP_COMPLETED;
  r = uvccl__xqueue_post(&c->xq, &op->xitem_);
  if (r != 0) LOG_ERROR("gpu", "waking the loop failed: %s", uv_strerror(r));
}

/* ---- The GPU thread ------------------------------------------------------ */

void uvccl__gpu_in_call(uvccl__gpu_op_t *op, const char *call) {
  atomic_store(&op->client_->gpu->in_call, call != NULL ? call : "issue");
}

/* (gpu, unlocked) Records the start event (once, for ops with a timeout),
 * calls issue(), and records the end event. 0, UVCCL__GPU_AGAIN, or an
 * error with op->msg set; the events stay in op for the caller. */
static int issue_one(uvccl__gpu_t *gpu, uvccl__gpu_op_t *op) {
  uvccl__cuda_err_t rc;
  int r;
  if (gpu->start_status != 0) { /* cudaSetDevice failed */
    snprintf(op->msg, sizeof(op->msg), "device %d: %.120s", gpu->device,
             gpu->start_msg);
    return gpu->start_status;
  }
  if (op->timeout_ms != 0 && !op->no_event && op->start_ev_ == NULL) {
    r = pool_get(gpu, &op->start_ev_, op->msg, sizeof(op->msg));
    if (r != 0) return r;
    atomic_store(&gpu->in_call, "cudaEventRecord");
    rc = uvccl__cuda.EventRecord(op->start_ev_, op->stream);
    atomic_store(&gpu->in_call, NULL);
    if (rc != UVCCL__CUDA_SUCCESS) {
      (void)uvccl__cuda.GetLastError();
      uvccl__cuda_strerror(op->msg, sizeof(op->msg),
                           "cudaEventRecord (start)", rc);
      return UVCCL_ECUDA;
    }
  }
  atomic_store(&gpu->in_call, "issue");
  r = op->issue(op);
  atomic_store(&gpu->in_call, NULL);
  if (r != 0) return r;
  op->t_issued_ns = uvccl__now_ns();
  if (op->no_event) return 0;
  r = pool_get(gpu, &op->end_ev_, op->msg, sizeof(op->msg));
  if (r != 0) return r;
  atomic_store(&gpu->in_call, "cudaEventRecord");
  rc = uvccl__cuda.EventRecord(op->end_ev_, op->stream);
  atomic_store(&gpu->in_call, NULL);
  if (rc != UVCCL__CUDA_SUCCESS) {
    (void)uvccl__cuda.GetLastError();
    uvccl__cuda_strerror(op->msg, sizeof(op->msg), "cudaEventRecord", rc);
    return UVCCL_ECUDA;
  }
  return 0;
}

/* (gpu, locked) Issues queued ops in order until the queue is empty or an
 * op answers AGAIN (it blocks everything after it, as gpu.h says). Returns
 * how many ops moved on. */
static int issue_queued(uvccl__gpu_t *gpu) {
  uvccl__gpu_op_t *op;
  gpu_fifo_t *fifo;
  int r, moved = 0;
  while ((op = gpu->queue_head) != NULL && !gpu->stop) {
    gpu->issuing = op;
    gpu->issuing_fail = 0;
    uv_mutex_unlock(&gpu->lock);
    r = issue_one(gpu, op);
    uv_mutex_lock(&gpu->lock);
    gpu->issuing = NULL;
    if (r == UVCCL__GPU_AGAIN && !gpu->issuing_fail) break;
    gpu->queue_head = op->next_;
    if (gpu->queue_head == NULL) gpu->queue_tail = NULL;
    op->next_ = NULL;
    moved++;
    fifo = NULL;
    if (r == 0 && !op->no_event && !gpu->issuing_fail) {
      fifo = fifo_for_locked(gpu, op->stream);
      if (fifo == NULL) {
        r = UV_ENOMEM;
        snprintf(op->msg, sizeof(op->msg), "out of memory for stream FIFOs");
      }
    }
    if (fifo != NULL) {
      op->state_ = OP_ON_GPU;
      if (fifo->tail) fifo->tail->next_ = op;
      else fifo->head = op;
      fifo->tail = op;
      continue;
    }
    pool_put_locked(gpu, &op->start_ev_);
    pool_put_locked(gpu, &op->end_ev_);
    gpu->outstanding--;
    if (gpu->issuing_fail) {
      post_completion(op, gpu->issuing_fail, gpu->issuing_msg);
    } else if (r == 0) {
      op->t_gpu_done_ns = op->t_issued_ns;
      post_completion(op, 0, NULL);
    } else {
      if (r > 0) r = UVCCL_ECUDA; /* an unknown positive answer */
      post_completion(op, r, NULL);
    }
  }
  return moved;
}

/* (gpu, unlocked) cudaEventQuery, with the heartbeat telling where we
 * are. */
static uvccl__cuda_err_t query(uvccl__gpu_t *gpu, void *ev) {
  uvccl__cuda_err_t rc;
  atomic_store(&gpu->in_call, "cudaEventQuery");
  rc = uvccl__cuda.EventQuery(ev);
  atomic_store(&gpu->in_call, NULL);
  if (rc != UVCCL__CUDA_SUCCESS && rc != UVCCL__CUDA_ERR_NOT_READY)
    (void)uvccl__cuda.GetLastError();
  return rc;
}

/* (gpu, locked) Unlinks the head of fifo i and completes it. */
static void finish_head(uvccl__gpu_t *gpu, size_t i, int status,
                        const char *msg) {
  gpu_fifo_t *fifo = &gpu->fifos[i];
  uvccl__gpu_op_t *op = fifo->head;
  fifo->head = op->next_;
  if (fifo->head == NULL) fifo->tail = NULL;
  op->next_ = NULL;
  pool_put_locked(gpu, &op->start_ev_);
  pool_put_locked(gpu, &op->end_ev_);
  gpu->outstanding--;
  post_completion(op, status, msg);
}

/* (gpu, locked) Polls the oldest op of every stream: its start event
 * (ops with a timeout, until it started) and its end event. Returns how
 * many ops finished. */
static int poll_fifos(uvccl__gpu_t *gpu) {
  uvccl__gpu_op_t *op;
  uvccl__cuda_err_t rc;
  uint64_t epoch, now;
  char msg[sizeof(op->msg)];
  void *ev;
  size_t i = 0;
  int finished = 0;
  while (i < gpu->nfifos) {
    op = gpu->fifos[i].head;
    if (op == NULL) {
      fifo_drop_locked(gpu, i);
      continue;
    }
    epoch = gpu->epoch;
    if (op->start_ev_ != NULL && op->deadline_ns_ == 0) {
      ev = op->start_ev_;
      uv_mutex_unlock(&gpu->lock);
      rc = query(gpu, ev);
      uv_mutex_lock(&gpu->lock);
      if (gpu->epoch != epoch) return finished; /* a loop took ops away */
      /* The timeout runs from here: work queued behind other work on the
       * GPU has not started, so it must not time out yet. */
      if (rc == UVCCL__CUDA_SUCCESS)
        op->deadline_ns_ = uvccl__now_ns() + op->timeout_ms * 1000000u;
      else if (rc != UVCCL__CUDA_ERR_NOT_READY) {
        finish_head(gpu, i, UVCCL_ECUDA,
                    uvccl__cuda_strerror(msg, sizeof(msg),
                                         "cudaEventQuery (start)", rc));
        finished++;
        continue;
      }
    }
    ev = op->end_ev_;
    uv_mutex_unlock(&gpu->lock);
    rc = query(gpu, ev);
    uv_mutex_lock(&gpu->lock);
    if (gpu->epoch != epoch) return finished;
    now = uvccl__now_ns();
    if (rc == UVCCL__CUDA_SUCCESS) {
      op->t_gpu_done_ns = now;
      finish_head(gpu, i, 0, NULL);
      finished++;
      continue; /* the next op of this stream may be done too */
    }
    if (rc != UVCCL__CUDA_ERR_NOT_READY) {
      finish_head(gpu, i, UVCCL_ECUDA,
                  uvccl__cuda_strerror(msg, sizeof(msg), "cudaEventQuery",
                                       rc));
      finished++;
      continue;
    }
    if (op->deadline_ns_ != 0 && now >= op->deadline_ns_) {
      uint64_t started = op->deadline_ns_ - op->timeout_ms * 1000000u;
      snprintf(msg, sizeof(msg),
               "GPU op timed out on device %d: ran %.3f s on the GPU "
               "(timeout %llu ms), submitted %.3f s ago",
               gpu->device, (now - started) / 1e9,
               (unsigned long long)op->timeout_ms,
               (now - op->t_submit_ns) / 1e9);
      LOG_WARN("gpu", "%s", msg);
      finish_head(gpu, i, UV_ETIMEDOUT, msg);
      finished++;
      continue;
    }
    i++;
  }
  return finished;
}

static void gpu_thread(void *arg) {
  uvccl__gpu_t *gpu = arg;
  uvccl__cuda_err_t rc;
  uint64_t spin_start = 0, now;
  unsigned backoff_us = BACKOFF_MIN_US;
  size_t i;
  int progress;

  /* Every thread that calls CUDA must pick its device first, or the
   * runtime makes a context on device 0. It also makes the device's
   * context, which can take a long while: nobody waits for it (ops queue
   * behind it), and if it fails every op fails with its reason. */
  atomic_store(&gpu->in_call, "cudaSetDevice");
  rc = uvccl__cuda.SetDevice(gpu->device);
  atomic_store(&gpu->in_call, NULL);
  uv_mutex_lock(&gpu->lock);
  if (rc != UVCCL__CUDA_SUCCESS) {
    (void)uvccl__cuda.GetLastError();
    uvccl__cuda_strerror(gpu->start_msg, sizeof(gpu->start_msg),
                         "cudaSetDevice", rc);
    gpu->start_status = uvccl__cuda_to_uvccl(rc);
    LOG_ERROR("gpu", "device %d: %s", gpu->device, gpu->start_msg);
  } else {
    LOG_DEBUG("gpu", "device %d: GPU thread running", gpu->device);
  }

  while (!gpu->stop) {
    atomic_fetch_add(&gpu->heartbeat, 1);
    progress = issue_queued(gpu);
    progress += poll_fifos(gpu);
    if (gpu->stop) break;
    if (progress > 0) {
      spin_start = 0;
      backoff_us = BACKOFF_MIN_US;
      continue;
    }
    if (gpu->outstanding == 0) {
      /* Nothing to do: sleep until a submission. The watchdogs know this
       * is not a hang. */
      atomic_store(&gpu->idle, 1);
      gpu->sleeping = 1;
      while (gpu->queue_head == NULL && !gpu->stop)
        uv_cond_wait(&gpu->cond, &gpu->lock);
      gpu->sleeping = 0;
      atomic_store(&gpu->idle, 0);
      spin_start = 0;
      backoff_us = BACKOFF_MIN_US;
      continue;
    }
    now = uvccl__now_ns();
    if (spin_start == 0) spin_start = now;
    if (now - spin_start < SPIN_NS) {
      /* Small ops finish within microseconds; yielding keeps latency low
       * without starving other threads on a busy machine. */
      uv_mutex_unlock(&gpu->lock);
      sched_yield();
      uv_mutex_lock(&gpu->lock);
      continue;
    }
    gpu->sleeping = 1;
    (void)uv_cond_timedwait(&gpu->cond, &gpu->lock,
                            (uint64_t)backoff_us * 1000u);
    gpu->sleeping = 0;
    if (backoff_us < BACKOFF_MAX_US) {
      backoff_us *= 2;
      if (backoff_us > BACKOFF_MAX_US) backoff_us = BACKOFF_MAX_US;
    }
  }
  if (gpu->outstanding != 0)
    LOG_WARN("gpu", "device %d: GPU thread stops with %zu op(s) pending",
             gpu->device, gpu->outstanding);
  uv_mutex_unlock(&gpu->lock);
  /* Events still recorded on a stuck stream may be destroyed: CUDA frees
   * them when the work completes. */
  for (i = 0; i < gpu->nfree_events; i++)
    (void)uvccl__cuda.EventDestroy(gpu->free_events[i]);
  gpu->nfree_events = 0;
  LOG_DEBUG("gpu", "device %d: GPU thread stopped", gpu->device);
}

/* ---- Acquire / release ------------------------------------------------- */

static void gpu_free(uvccl__gpu_t *gpu) {
  uv_mutex_destroy(&gpu->lock);
  uv_cond_destroy(&gpu->cond);
  uvccl__free(gpu->free_events);
  uvccl__free(gpu->fifos);
  uvccl__free(gpu);
}

static int gpu_start(int device, uvccl__gpu_t **out, char *err,
                     size_t errlen) {
  uvccl__gpu_t *gpu = uvccl__calloc(1, sizeof(*gpu));
  int r;
  if (gpu == NULL) return UV_ENOMEM;
  gpu->device = device;
  gpu->refs = 1;
  atomic_init(&gpu->heartbeat, 0);
  atomic_init(&gpu->in_call, NULL);
  atomic_init(&gpu->idle, 0);
  if (uv_mutex_init(&gpu->lock) != 0) {
    uvccl__free(gpu);
    return UV_ENOMEM;
  }
  if (uv_cond_init(&gpu->cond) != 0) {
    uv_mutex_destroy(&gpu->lock);
    uvccl__free(gpu);
    return UV_ENOMEM;
  }
  r = uv_thread_create(&gpu->thread, gpu_thread, gpu);
  if (r != 0) {
    if (err && errlen) snprintf(err, errlen, "GPU thread: %s", uv_strerror(r));
    gpu_free(gpu);
    return r;
  }
  /* Not waiting for the thread's cudaSetDevice: making the context can
   * take long, and this runs on a loop (acquire checked the device). */
  *out = gpu;
  return 0;
}

int uvccl__gpu_acquire(int device, uvccl__gpu_t **out, char *err,
                       size_t errlen) {
  uvccl__gpu_t *gpu;
  int r, n;
  if (out == NULL) return UV_EINVAL;
  *out = NULL;
  r = uvccl__gpu_load(err, errlen);
  if (r != 0) return r;
  n = uvccl__gpu_device_count();
  if (device < 0 || device >= n) {
    if (err && errlen)
      snprintf(err, errlen, "no CUDA device %d (%d device%s)", device, n,
               n == 1 ? "" : "s");
    return UV_EINVAL;
  }
  uv_once(&registry_once, registry_init);
  uv_mutex_lock(&registry_lock);
  for (gpu = registry; gpu != NULL; gpu = gpu->next_gpu)
    if (gpu->device == device) break;
  if (gpu != NULL) {
    gpu->refs++;
    r = 0;
  } else {
    r = gpu_start(device, &gpu, err, errlen);
    if (r == 0) {
      gpu->next_gpu = registry;
      registry = gpu;
    }
  }
  uv_mutex_unlock(&registry_lock);
  if (r == 0) *out = gpu;
  return r;
}

void uvccl__gpu_release(uvccl__gpu_t *gpu) {
  uvccl__gpu_t **pp;
  if (gpu == NULL) return;
  uv_mutex_lock(&registry_lock);
  if (--gpu->refs > 0) {
    uv_mutex_unlock(&registry_lock);
    return;
  }
  for (pp = &registry; *pp != NULL; pp = &(*pp)->next_gpu)
    if (*pp == gpu) {
      *pp = gpu->next_gpu;
      break;
    }
  uv_mutex_unlock(&registry_lock);
  uv_mutex_lock(&gpu->lock);
  gpu->stop = 1;
  uv_cond_signal(&gpu->cond);
  uv_mutex_unlock(&gpu->lock);
  uv_thread_join(&gpu->thread);
  gpu_free(gpu);
}

/* ---- Clients (loop side) ----------------------------------------------- */

static void client_finish_close(uvccl__gpu_client_t *c);

/* (loop) A finished op, from the xqueue: done() runs here, once. */
static void op_completed(uvccl__xitem_t *item) {
  uvccl__gpu_op_t *op = UVCCL__CONTAINER_OF(item, uvccl__gpu_op_t, xitem_);
  uvccl__gpu_client_t *c = op->client_;
  op->state_ = OP_IDLE;
  op->t_done_ns = uvccl__now_ns();
  if (--c->pending == 0) uv_timer_stop(&c->watchdog);
  op->done(op); /* may free or resubmit op, or close c */
  if (c->closing && c->pending == 0) client_finish_close(c);
}

static void watchdog_cb(uv_timer_t *t) {
  uvccl__gpu_client_t *c = t->data;
  uvccl__gpu_t *gpu = c->gpu;
  uint64_t hb = atomic_load(&gpu->heartbeat), now = uv_now(c->loop);
  const char *call;
  char reason[160];
  if (hb != c->seen_heartbeat || atomic_load(&gpu->idle)) {
    c->seen_heartbeat = hb;
    c->seen_at_ms = now;
    return;
  }
  if (c->pending == 0 || now - c->seen_at_ms < c->heartbeat_ms) return;
  /* Once per hang: ops failed inside issue() stay pending until it
   * returns, and failing them again would change nothing. */
  if (c->reported && c->reported_heartbeat == hb) return;
  c->reported = 1;
  c->reported_heartbeat = hb;
  call = atomic_load(&gpu->in_call);
  snprintf(reason, sizeof(reason), "GPU thread of device %d stuck in %s for "
           "%.1f s", gpu->device, call ? call : "(no CUDA call)",
           (now - c->seen_at_ms) / 1e3);
  LOG_ERROR("gpu", "%s: failing %zu pending op(s)", reason, c->pending);
  uvccl__gpu_client_fail_all(c, UV_ETIMEDOUT, reason);
}

static uint64_t heartbeat_threshold_ms(void) {
  uint64_t ms;
  uvccl__config_uint(UVCCL__CFG_GPU_HEARTBEAT_MS, &ms);
  return ms;
}

int uvccl__gpu_client_init(uv_loop_t *loop, uvccl__gpu_t *gpu,
                           uvccl__gpu_client_t **out) {
  uvccl__gpu_client_t *c;
  int r;
  if (loop == NULL || gpu == NULL || out == NULL) return UV_EINVAL;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return UV_ENOMEM;
  c->gpu = gpu;
  c->loop = loop;
  c->heartbeat_ms = heartbeat_threshold_ms();
  /* Checked a few times per threshold, so a hang is reported within about
   * 1.25 thresholds, but at least once a second. */
  c->watchdog_period_ms = c->heartbeat_ms / 4 + 1;
  if (c->watchdog_period_ms > WATCHDOG_PERIOD_MAX_MS)
    c->watchdog_period_ms = WATCHDOG_PERIOD_MAX_MS;
  r = uvccl__xqueue_init(loop, &c->xq);
  if (r != 0) {
    uvccl__free(c);
    return r;
  }
  /* The async handle alone must not keep the loop running; the watchdog
   * timer does that while ops are pending. */
  uv_unref((uv_handle_t *)&c->xq.async);
  uv_timer_init(loop, &c->watchdog);
  c->watchdog.data = c;
  *out = c;
  return 0;
}

static void client_handle_closed(void *arg) {
  uvccl__gpu_client_t *c = arg;
  if (--c->open_handles > 0) return;
  if (c->close_cb) c->close_cb(c->close_arg);
  uvccl__free(c);
}

static void watchdog_closed(uv_handle_t *h) {
  client_handle_closed(h->data);
}

static void client_finish_close(uvccl__gpu_client_t *c) {
  if (c->close_started) return;
  c->close_started = 1;
  /* uvccl__xqueue_post() wakes the loop after releasing the queue's lock,
   * so the last done() can run before the GPU thread's uv_async_send()
   * returns. The thread posts only while holding gpu->lock: taking it
   * once here waits for that send to finish before the handle goes. */
  uv_mutex_lock(&c->gpu->lock);
  uv_mutex_unlock(&c->gpu->lock);
  c->open_handles = 2;
  uv_close((uv_handle_t *)&c->watchdog, watchdog_closed);
  uvccl__xqueue_close(&c->xq, client_handle_closed, c);
}

void uvccl__gpu_client_close(uvccl__gpu_client_t *c, void (*cb)(void *arg),
                             void *arg) {
  if (c == NULL || c->closing) return;
  c->closing = 1;
  c->close_cb = cb;
  c->close_arg = arg;
  uvccl__gpu_client_fail_all(c, UV_ECANCELED, "GPU client closed");
  /* An op inside issue() completes when issue() returns; close after. */
  if (c->pending == 0) client_finish_close(c);
}

int uvccl__gpu_submit(uvccl__gpu_client_t *c, uvccl__gpu_op_t *op) {
  uvccl__gpu_t *gpu;
  if (c == NULL || op == NULL || op->issue == NULL || op->done == NULL)
    return UV_EINVAL;
  if (c->closing) return UVCCL_ECLOSING;
  gpu = c->gpu;
  op->client_ = c;
  op->next_ = NULL;
  op->start_ev_ = op->end_ev_ = NULL;
  op->deadline_ns_ = 0;
  op->status = 0;
  op->msg[0] = '\0';
  op->t_submit_ns = uvccl__now_ns();
  op->t_issued_ns = op->t_gpu_done_ns = op->t_done_ns = 0;
  op->xitem_.fn = op_completed;
  op->state_ = OP_QUEUED;
  uv_mutex_lock(&gpu->lock);
  if (gpu->queue_tail) gpu->queue_tail->next_ = op;
  else gpu->queue_head = op;
  gpu->queue_tail = op;
  gpu->outstanding++;
  if (gpu->sleeping) uv_cond_signal(&gpu->cond);
  uv_mutex_unlock(&gpu->lock);
  if (c->pending++ == 0) {
    c->seen_heartbeat = atomic_load(&gpu->heartbeat);
    c->seen_at_ms = uv_now(c->loop);
    uv_timer_start(&c->watchdog, watchdog_cb, c->watchdog_period_ms,
                   c->watchdog_period_ms);
  }
  return 0;
}

/* (locked) Moves c's ops from list *head (through next_) to *out. */
static void take_client_ops(uvccl__gpu_t *gpu, uvccl__gpu_client_t *c,
                            uvccl__gpu_op_t **head, uvccl__gpu_op_t **tail,
                            uvccl__gpu_op_t ***out) {
  uvccl__gpu_op_t **pp = head, *op, *prev = NULL;
  while ((op = *pp) != NULL) {
    if (op->client_ != c || op == gpu->issuing) {
      prev = op;
      pp = &op->next_;
      continue;
    }
    *pp = op->next_;
    if (*tail == op) *tail = prev;
    op->next_ = NULL;
    pool_put_locked(gpu, &op->start_ev_);
    pool_put_locked(gpu, &op->end_ev_);
    gpu->outstanding--;
    **out = op;
    *out = &op->next_;
  }
}

void uvccl__gpu_client_fail_all(uvccl__gpu_client_t *c, int err,
                                const char *reason) {
  uvccl__gpu_t *gpu;
  uvccl__gpu_op_t *failed = NULL, **tailp = &failed, *op, *next;
  size_t i;
  if (c == NULL) return;
  gpu = c->gpu;
  uv_mutex_lock(&gpu->lock);
  for (i = 0; i < gpu->nfifos; i++)
    take_client_ops(gpu, c, &gpu->fifos[i].head, &gpu->fifos[i].tail,
                    &tailp);
  take_client_ops(gpu, c, &gpu->queue_head, &gpu->queue_tail, &tailp);
  if (gpu->issuing != NULL && gpu->issuing->client_ == c &&
      !gpu->issuing_fail) {
    gpu->issuing_fail = err;
    snprintf(gpu->issuing_msg, sizeof(gpu->issuing_msg), "%s", reason);
  }
  gpu->epoch++;
  uv_mutex_unlock(&gpu->lock);
  /* Through the xqueue, after completions already posted: done() never
   * runs inside this call, and runs in the order ops finished. */
  for (op = failed; op != NULL; op = next) {
    next = op->next_;
    op->next_ = NULL;
    op->t_gpu_done_ns = 0;
    post_completion(op, err, reason);
  }
}
