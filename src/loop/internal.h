/* Loop core internals: work life cycle, logging, time, cross-thread queue.
 * Not installed. Internal non-static names use the uvccl__ prefix. */
#ifndef UVCCL_LOOP_INTERNAL_H
#define UVCCL_LOOP_INTERNAL_H

#include "uvccl.h"
#include "config.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#define UVCCL__CONTAINER_OF(ptr, type, member)                                \
  ((type *)((char *)(ptr)-offsetof(type, member)))
#define UVCCL__ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- Work life cycle ------------------------------------------------------
 *
 * A work is started by its owner (a store, a group) with uvccl__work_start()
 * and finished with uvccl__work_complete() or uvccl__work_fail(). Completion
 * closes the work's timer handle; the user's callback runs from that
 * handle's close callback. That gives three guarantees for free: the
 * callback never runs inside the call that completed the work, it runs
 * exactly once, and when it runs the work holds no libuv handle, so the
 * caller may free or reuse it right there.
 *
 * When a pending work times out or is cancelled, ops->abandon() tells the
 * owner to forget it (unlink it from its queues; if a reply is still due on
 * the wire, the owner keeps a placeholder so the stream stays in step). */
struct uvccl__work_ops {
  void (*abandon)(uvccl_work_t *work, int status);
  /* Owners that keep a work's timeout and delivery themselves (the
   * process groups: one timer and one pair of handles per group rather
   * than a timer per work, so a work that completes is done without a
   * handle to close, and uvccl_work_wait can return without a loop turn).
   * defer: the work completed; the owner arranges uvccl__work_drain on
   * the loop soon (0), or cannot (nonzero: closing; the work then goes
   * out through a handle of its own, as others do). The owner calls
   * uvccl__work_expire at the deadline. progress (may be NULL): moves the
   * work along without the loop, briefly (uvccl_work_wait calls it). */
  int (*defer)(uvccl_work_t *work);
  void (*progress)(uvccl_work_t *work);
};

/* flags_ */
#define UVCCL__WORK_COMPLETING 0x1
#define UVCCL__WORK_CLOSED 0x2 /* timer closed, callback due */
#define UVCCL__WORK_QUEUED 0x4 /* in its loop's completion FIFO */
#define UVCCL__WORK_OWNED 0x8  /* ops->defer: no timer of its own */

/* Returns 0, UVCCL_EBUSY if the work is pending, UV_EINVAL for bad args.
 * timeout_ms: 0 or UVCCL_NO_TIMEOUT = none. Frees leftover values of a
 * previous operation. */
int uvccl__work_start(uvccl_work_t *work, uv_loop_t *loop, const char *op,
                      const struct uvccl__work_ops *ops, void *owner,
                      uint64_t timeout_ms, uvccl_work_cb cb);
/* Completes a pending work with status (first call wins; later ones are
 * ignored). Safe to call from inside the owner's own call paths. */
void uvccl__work_complete(uvccl_work_t *work, int status);
/* As complete, with a message for work->msg (printf format). */
void uvccl__work_fail(uvccl_work_t *work, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* True while the work is pending and not yet completing. */
int uvccl__work_is_live(const uvccl_work_t *work);
/* Delivers the loop's completed works, in order, up to the first that is
 * not ready (one still closing its handle). */
void uvccl__work_drain(uv_loop_t *loop);
/* The deadline of an owner-kept work (ops->defer): its loop time in ms,
 * 0 for none; and its expiry (as its own timer would). */
uint64_t uvccl__work_deadline(const uvccl_work_t *work);
void uvccl__work_expire(uvccl_work_t *work);

/* ---- Doubly linked lists of works (through next_/prev_) ---------------- */
typedef struct {
  uvccl_work_t *head;
  uvccl_work_t *tail;
  size_t len;
} uvccl__work_list_t;

void uvccl__work_list_push(uvccl__work_list_t *l, uvccl_work_t *w);
void uvccl__work_list_remove(uvccl__work_list_t *l, uvccl_work_t *w);
uvccl_work_t *uvccl__work_list_pop(uvccl__work_list_t *l);

/* ---- Logging ------------------------------------------------------------- */
extern int uvccl__log_level; /* -1 until read from UVCCL_LOG */
int uvccl__log_enabled(uvccl_log_level_t level);
void uvccl__log(uvccl_log_level_t level, const char *component,
                const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define UVCCL__LOG(level, comp, ...)                                         \
  do {                                                                       \
    if (uvccl__log_enabled(level)) uvccl__log(level, comp, __VA_ARGS__);     \
  } while (0)
#define LOG_ERROR(comp, ...) UVCCL__LOG(UVCCL_LOG_ERROR, comp, __VA_ARGS__)
#define LOG_WARN(comp, ...) UVCCL__LOG(UVCCL_LOG_WARN, comp, __VA_ARGS__)
#define LOG_INFO(comp, ...) UVCCL__LOG(UVCCL_LOG_INFO, comp, __VA_ARGS__)
#define LOG_DEBUG(comp, ...) UVCCL__LOG(UVCCL_LOG_DEBUG, comp, __VA_ARGS__)
#define LOG_TRACE(comp, ...) UVCCL__LOG(UVCCL_LOG_TRACE, comp, __VA_ARGS__)

/* ---- Time ---------------------------------------------------------------- */
uint64_t uvccl__now_ms(void); /* monotonic */
uint64_t uvccl__now_ns(void);

/* ---- Cross-thread completion queue ---------------------------------------
 * One uv_async_t per queue; any thread posts items, the loop thread drains
 * them all in one callback (uv_async_send coalesces, so one wake-up may
 * carry many items). Items are caller-allocated and intrusive. */
typedef struct uvccl__xitem_s {
  struct uvccl__xitem_s *next;
  void (*fn)(struct uvccl__xitem_s *item); /* runs on the loop thread */
} uvccl__xitem_t;

typedef struct {
  uv_async_t async;
  uv_mutex_t lock;
  uvccl__xitem_t *head;
  uvccl__xitem_t *tail;
  uint64_t posted;  /* under lock */
  uint64_t drained; /* loop thread only */
  void (*close_cb)(void *arg);
  void *close_arg;
} uvccl__xqueue_t;

int uvccl__xqueue_init(uv_loop_t *loop, uvccl__xqueue_t *q);
/* Thread-safe. Returns 0 or the uv_async_send error. */
int uvccl__xqueue_post(uvccl__xqueue_t *q, uvccl__xitem_t *item);
/* Drains what is left, then closes; close_cb(arg) runs once closed. */
void uvccl__xqueue_close(uvccl__xqueue_t *q, void (*close_cb)(void *arg),
                         void *arg);

/* ---- Liveness helpers (liveness.c) ----------------------------------------- */
/* The heartbeat timeout for an option value: 0 = the environment's
 * UVCCL_HEARTBEAT_TIMEOUT_MS (config.c), else its default; UINT64_MAX =
 * off (0). */
uint64_t uvccl__heartbeat_timeout(uint64_t opt);
/* Keepalive (and with user_timeout, TCP_USER_TIMEOUT) for a connection
 * whose peer must be found gone within about timeout_ms (0: leave the
 * socket alone). */
void uvccl__tune_socket(int fd, uint64_t timeout_ms, int user_timeout);
/* A connection between ranks: where both its ends are one address (one
 * host), the congestion control of UVCCL_TCP_LOCAL_CC (congestion.c). */
void uvccl__tune_local(int fd);
/* What a read's UV_EOF on tcp means: UV_EOF when the peer closed it (its
 * kernel said so: the process exited), UV_ETIMEDOUT when this side's
 * kernel gave up on it (a timeout, or a reset, whose error another call
 * took first: a socket's error is reported once, then reads return 0). */
int uvccl__eof_cause(const uv_tcp_t *tcp);
/* "ip:port" or "[ip6]:port" for messages ("?" for another family). */
void uvccl__addr_fmt(const struct sockaddr *sa, char *buf, size_t len);
/* The connection's peer the same way; "?:0" when it is already gone. */
void uvccl__peer_addr(const uv_tcp_t *tcp, char *buf, size_t len);

/* ---- Allocation ---------------------------------------------------------- */
/* Large buffers (bigmem.c): mapped on their own, so that one no longer
 * needed can be retired to a list and unmapped a few MiB at a time, in
 * the turns of its owner (a 256 MiB buffer takes milliseconds to unmap).
 * Worth it from UVCCL__BIG_MIN bytes. */
#define UVCCL__BIG_MIN ((size_t)1 << 20)
typedef struct {
  struct uvccl__bighdr_s *head;
  size_t bytes;                    /* still mapped */
} uvccl__big_list_t;
void *uvccl__big_alloc(size_t len);      /* NULL: out of memory */
void uvccl__big_free(void *p);           /* unmapped now */
void uvccl__big_retire(uvccl__big_list_t *l, void *p);
/* Unmaps about max bytes of what l holds; returns how many. */
size_t uvccl__big_reap(uvccl__big_list_t *l, size_t max);
void uvccl__big_reap_all(uvccl__big_list_t *l);

void *uvccl__malloc(size_t n);
void *uvccl__calloc(size_t n, size_t m);
void *uvccl__realloc(void *p, size_t n);
void uvccl__free(void *p);
char *uvccl__strdup(const char *s);

#endif
