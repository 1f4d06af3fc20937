/* Work objects: the future every asynchronous operation completes.
 *
 * The user's callback is delivered from the close callback of the work's
 * own timer handle (see internal.h): uv_close() never calls back inside the
 * call, runs its callback exactly once within the same loop iteration, and
 * leaves the work holding no handle, so the callback may free or reuse it.
 *
 * Works whose owner keeps their timeout (ops->defer: the process groups)
 * have no handle: a completed one is ready at once, and goes out when the
 * owner's handles drain the loop's completions (uvccl__work_drain, later
 * in the same loop iteration) or when uvccl_work_wait finds it ready, so
 * a collective that completes while the caller waits costs no loop turn. */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static void work_closed(uv_handle_t *h);
static void work_timer_cb(uv_timer_t *t);

static void work_free_values(uvccl_work_t *w) {
  size_t i;
  uvccl__free(w->value);
  w->value = NULL;
  w->value_len = 0;
  if (w->values != NULL) {
    for (i = 0; i < w->nvalues; i++) uvccl__free(w->values[i].base);
    uvccl__free(w->values);
  }
  w->values = NULL;
  w->nvalues = 0;
}

int uvccl__work_start(uvccl_work_t *w, uv_loop_t *loop, const char *op,
                      const struct uvccl__work_ops *ops, void *owner,
                      uint64_t timeout_ms, uvccl_work_cb cb) {
  if (w == NULL || loop == NULL) return UV_EINVAL;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  work_free_values(w);
  w->state = UVCCL_WORK_PENDING;
  w->status = 0;
  w->op = op;
  w->msg[0] = '\0';
  w->result = 0;
  w->loop_ = loop;
  w->cb_ = cb;
  w->ops_ = ops;
  w->owner_ = owner;
  w->next_ = w->prev_ = NULL;
  w->timeout_ms_ = timeout_ms;
  /* The loop's clock only moves when the loop runs: a call made after the
   * caller blocked elsewhere (bootstrap code, another loop, a slow child
   * process) would otherwise start its timeout in the past and time out at
   * once. A coarse clock read. */
  uv_update_time(loop);
  w->started_ms_ = uv_now(loop);
  w->flags_ = 0;
  w->pending_status_ = 0;
  if (ops != NULL && ops->defer != NULL) {
    w->flags_ = UVCCL__WORK_OWNED; /* the owner times it */
    return 0;
  }
  uv_timer_init(loop, &w->timer_);
  w->timer_.data = w;
  if (timeout_ms != 0 && timeout_ms != UVCCL_NO_TIMEOUT)
    uv_timer_start(&w->timer_, work_timer_cb, timeout_ms, 0);
  else
    /* An unstarted timer keeps nothing alive; uvccl_work_wait notices a
     * loop with nothing left that could complete the work. */
    uv_unref((uv_handle_t *)&w->timer_);
  return 0;
}

int uvccl__work_is_live(const uvccl_work_t *w) {
  return w->state == UVCCL_WORK_PENDING &&
         !(w->flags_ & UVCCL__WORK_COMPLETING);
}

/* Callbacks run in the order the works completed. libuv runs close
 * callbacks in reverse order of uv_close within one iteration, so each
 * loop keeps its completing works in a FIFO, and a close callback delivers
 * from the head for as long as the head's timer is closed. The earliest
 * work of a batch closes last, so the whole batch goes out in order then.
 * One FIFO per loop, in a table of the process's: a loop may be run by
 * one thread and then another (never two at once: a binding hands the
 * loop to the thread that waits, see python/uvccl_torch/csrc/loop.h), and
 * its FIFO goes with it. A slot is claimed with a compare-and-swap and
 * given back when its FIFO runs empty, both by the thread running the
 * loop, the only one that touches the FIFO's contents; so a slot found
 * naming the loop stays its own for as long as this thread runs it. */
typedef struct {
  _Atomic(uv_loop_t *) loop;
  uvccl_work_t *head;
  uvccl_work_t *tail;
} done_fifo_t;

#define DONE_FIFOS 64
static done_fifo_t done_fifos[DONE_FIFOS];
static __thread done_fifo_t *fifo_hint; /* this thread's last */

/* The loop's FIFO; with claim, a free slot becomes its FIFO when it has
 * none. NULL: none (too many loops: then unordered). */
static done_fifo_t *done_fifo(uv_loop_t *loop, int claim) {
  int i;
  if (fifo_hint != NULL &&
      atomic_load_explicit(&fifo_hint->loop, memory_order_acquire) == loop)
    return fifo_hint;
  for (i = 0; i < DONE_FIFOS; i++)
    if (atomic_load_explicit(&done_fifos[i].loop, memory_order_acquire) ==
        loop)
      return fifo_hint = &done_fifos[i];
  if (!claim) return NULL;
  for (i = 0; i < DONE_FIFOS; i++) {
    uv_loop_t *none = NULL;
    if (atomic_compare_exchange_strong(&done_fifos[i].loop, &none, loop))
      return fifo_hint = &done_fifos[i];
  }
  return NULL;
}

/* 1 while f is still loop's (a callback delivered from it may have
 * emptied it in a drain of its own, and another loop's thread may have
 * claimed it since). */
static int done_fifo_mine(done_fifo_t *f, uv_loop_t *loop) {
  return atomic_load_explicit(&f->loop, memory_order_acquire) == loop;
}

/* An empty FIFO of loop's gives its slot back. */
static void done_fifo_release(done_fifo_t *f, uv_loop_t *loop) {
  if (done_fifo_mine(f, loop) && f->head == NULL)
    atomic_store_explicit(&f->loop, NULL, memory_order_release);
}

void uvccl__work_complete(uvccl_work_t *w, int status) {
  done_fifo_t *f;
  if (!uvccl__work_is_live(w)) return;
  w->flags_ |= UVCCL__WORK_COMPLETING;
  w->pending_status_ = status;
  w->done_next_ = NULL;
  f = done_fifo(w->loop_, 1);
  if (f != NULL) {
    if (f->tail) f->tail->done_next_ = w;
    else f->head = w;
    f->tail = w;
    w->flags_ |= UVCCL__WORK_QUEUED;
  }
  if (w->flags_ & UVCCL__WORK_OWNED) {
    /* Nothing to close: ready now, delivered by the owner's drain. */
    if (f != NULL) {
      w->flags_ |= UVCCL__WORK_CLOSED;
      if (w->ops_->defer(w) == 0) return;
      w->flags_ &= ~UVCCL__WORK_CLOSED;
    }
    /* No FIFO, or the owner is closing: a handle of its own after all. */
    uv_timer_init(w->loop_, &w->timer_);
    w->timer_.data = w;
    uv_close((uv_handle_t *)&w->timer_, work_closed);
    return;
  }
  uv_timer_stop(&w->timer_);
  uv_close((uv_handle_t *)&w->timer_, work_closed);
}

static void work_deliver(uvccl_work_t *w);

static void fifo_drain(done_fifo_t *f, uv_loop_t *loop) {
  while (done_fifo_mine(f, loop) && f->head != NULL &&
         (f->head->flags_ & UVCCL__WORK_CLOSED)) {
    uvccl_work_t *x = f->head;
    f->head = x->done_next_;
    if (f->head == NULL) f->tail = NULL;
    work_deliver(x); /* may free x, or start new works on this loop */
  }
  done_fifo_release(f, loop);
}

void uvccl__work_drain(uv_loop_t *loop) {
  done_fifo_t *f = done_fifo(loop, 0);
  if (f != NULL) fifo_drain(f, loop);
}

void uvccl__work_fail(uvccl_work_t *w, int status, const char *fmt, ...) {
  va_list ap;
  if (!uvccl__work_is_live(w)) return;
  va_start(ap, fmt);
  vsnprintf(w->msg, sizeof(w->msg), fmt, ap);
  va_end(ap);
  uvccl__work_complete(w, status);
}

static void work_closed(uv_handle_t *h) {
  uvccl_work_t *w = h->data;
  done_fifo_t *f;
  w->flags_ |= UVCCL__WORK_CLOSED;
  f = (w->flags_ & UVCCL__WORK_QUEUED) ? done_fifo(w->loop_, 0) : NULL;
  if (f == NULL) {
    work_deliver(w);
    return;
  }
  fifo_drain(f, w->loop_);
}

static void work_deliver(uvccl_work_t *w) {
  int status = w->pending_status_;

  w->status = status;
  if (status == 0)
    w->state = UVCCL_WORK_SUCCEEDED;
  else if (status == UV_ETIMEDOUT)
    w->state = UVCCL_WORK_TIMED_OUT;
  else if (status == UV_ECANCELED)
    w->state = UVCCL_WORK_CANCELLED;
  else
    w->state = UVCCL_WORK_FAILED;
  if (status != 0 && w->msg[0] == '\0')
    snprintf(w->msg, sizeof(w->msg), "%s: %s", w->op ? w->op : "work",
             uvccl_strerror(status));
  w->flags_ &= ~(UVCCL__WORK_COMPLETING | UVCCL__WORK_CLOSED |
                 UVCCL__WORK_QUEUED | UVCCL__WORK_OWNED);
  if (w->cb_ != NULL) w->cb_(w, status);
}

/* The owner forgets the work first (and may fail it with a message that
 * names the key or peer); the generic message is only a fallback. */
static void work_abandon(uvccl_work_t *w, int status) {
  if (w->ops_ != NULL && w->ops_->abandon != NULL) w->ops_->abandon(w, status);
  if (status == UV_ETIMEDOUT)
    uvccl__work_fail(w, status, "%s timed out after %llu ms",
                     w->op ? w->op : "work",
                     (unsigned long long)w->timeout_ms_);
  else
    uvccl__work_fail(w, status, "%s cancelled", w->op ? w->op : "work");
}

static void work_timer_cb(uv_timer_t *t) {
  work_abandon(t->data, UV_ETIMEDOUT);
}

uint64_t uvccl__work_deadline(const uvccl_work_t *w) {
  if (w->timeout_ms_ == 0 || w->timeout_ms_ == UVCCL_NO_TIMEOUT) return 0;
  return w->started_ms_ + w->timeout_ms_;
}

void uvccl__work_expire(uvccl_work_t *w) {
  if (uvccl__work_is_live(w)) work_abandon(w, UV_ETIMEDOUT);
}

int uvccl_work_cancel(uvccl_work_t *w) {
  if (w == NULL || !uvccl__work_is_live(w)) return UV_EINVAL;
  work_abandon(w, UV_ECANCELED);
  return 0;
}

int uvccl_work_done(const uvccl_work_t *w) {
  return w->state != UVCCL_WORK_PENDING;
}

/* An owner-kept work that is ready: delivered here (with any completed
 * before it), no loop turn needed. */
static void wait_drain(uvccl_work_t *w) {
  if ((w->flags_ & (UVCCL__WORK_OWNED | UVCCL__WORK_CLOSED)) ==
      (UVCCL__WORK_OWNED | UVCCL__WORK_CLOSED))
    uvccl__work_drain(w->loop_);
}

/* Waits that ended without a loop turn, in a row (this thread): every
 * FAST_WAITS_MAX-th turns the loop all the same, so that its signals,
 * timers and sockets are served however fast the collectives are. */
#define FAST_WAITS_MAX 16
static __thread unsigned fast_waits;

int uvccl_work_wait(uvccl_work_t *w) {
  if (w->state == UVCCL_WORK_IDLE) return UV_EINVAL;
  while (!uvccl_work_done(w)) {
    if (fast_waits < FAST_WAITS_MAX) {
      wait_drain(w);
      if (uvccl_work_done(w)) {
        fast_waits++;
        break;
      }
      if (uvccl__work_is_live(w) && w->ops_ != NULL &&
          w->ops_->progress != NULL) {
        w->ops_->progress(w);
        wait_drain(w);
        if (uvccl_work_done(w)) {
          fast_waits++;
          break;
        }
      }
    }
    fast_waits = 0;
    if (uv_run(w->loop_, UV_RUN_ONCE) == 0 && !uvccl_work_done(w) &&
        uvccl__work_is_live(w)) {
      /* Nothing left on the loop can ever complete this work (for example
       * an in-process get with no timeout that nobody will set). Failing is
       * better than spinning forever. */
      if (w->ops_ != NULL && w->ops_->abandon != NULL)
        w->ops_->abandon(w, UVCCL_EABORTED);
      uvccl__work_fail(w, UVCCL_EABORTED,
                       "%s can never complete: nothing left on the loop",
                       w->op ? w->op : "work");
    }
  }
  return w->status;
}

void uvccl_work_cleanup(uvccl_work_t *w) {
  if (w == NULL || w->state == UVCCL_WORK_PENDING) return;
  work_free_values(w);
  w->state = UVCCL_WORK_IDLE;
}

const char *uvccl_work_state_name(uvccl_work_state_t s) {
  switch (s) {
  case UVCCL_WORK_IDLE: return "idle";
  case UVCCL_WORK_PENDING: return "pending";
  case UVCCL_WORK_SUCCEEDED: return "succeeded";
  case UVCCL_WORK_FAILED: return "failed";
  case UVCCL_WORK_TIMED_OUT: return "timed out";
  case UVCCL_WORK_CANCELLED: return "cancelled";
  }
  return "unknown";
}

/* ---- intrusive lists ---------------------------------------------------- */

void uvccl__work_list_push(uvccl__work_list_t *l, uvccl_work_t *w) {
  w->next_ = NULL;
  w->prev_ = l->tail;
  if (l->tail) l->tail->next_ = w;
  else l->head = w;
  l->tail = w;
  l->len++;
}

void uvccl__work_list_remove(uvccl__work_list_t *l, uvccl_work_t *w) {
  if (w->prev_) w->prev_->next_ = w->next_;
  else l->head = w->next_;
  if (w->next_) w->next_->prev_ = w->prev_;
  else l->tail = w->prev_;
  w->next_ = w->prev_ = NULL;
  l->len--;
}

uvccl_work_t *uvccl__work_list_pop(uvccl__work_list_t *l) {
  uvccl_work_t *w = l->head;
  if (w != NULL) uvccl__work_list_remove(l, w);
  return w;
}
