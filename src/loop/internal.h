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

/* ---- Turns on the application's loop (turn.c) ------------------------------
 * uvccl shares the application's loop, so every callback it runs there is
 * a turn with a budget: each copy, reduction, send and receive draws on
 * its bytes, and a loop of work that finds it spent stops and leaves the
 * rest for a later turn (the caller makes sure there is one: the socket
 * stays readable or writable, the ring stays marked, the slice stays
 * queued). The budget is bytes, and time too: memory on a shared machine
 * is sometimes ten times slower than usual for a while, so a turn that
 * has moved TURN_CLOCK_EVERY bytes looks at the clock at every such
 * step, and is spent once it ran ns_budget from the first look. A turn
 * always gets some work done (its first step is never refused), so the
 * work advances by at least a step per turn. With timing on, each turn
 * is timed on the wall clock and on the thread's CPU clock
 * (uvccl_loop_stats_t).
 *
 * A turn entered inside another is part of it. A turn entered with the
 * key of the turn just left, in the same loop iteration, continues it
 * (libuv reads a socket in several callbacks within one of its own: they
 * are one turn). */
typedef enum {
  UVCCL__SITE_READ = 0, /* a TCP connection's input */
  UVCCL__SITE_WRITE,    /* a TCP connection's queued output */
  UVCCL__SITE_RING,     /* shared-memory rings (doorbell, before a sleep) */
  UVCCL__SITE_SPIN,     /* a busy-polling turn */
  UVCCL__SITE_SLICE,    /* slices of local copies and reductions */
  UVCCL__SITE_CALL,     /* an operation started inside the caller's call */
  UVCCL__SITE_TIMER,    /* timeouts, deferred give-backs */
  UVCCL__SITES
} uvccl__site_t;

#define UVCCL__TURN_CLOCK_EVERY ((int64_t)64 * 1024)

typedef struct {
  int64_t budget;        /* bytes a turn may move */
  int64_t left;          /* what the turn under way still may */
  uint64_t ns_budget;    /* and the time it may take (0: no limit) */
  int64_t clock_at;      /* `left` when the clock is next looked at */
  uint64_t clock0;       /* the first look (0: not yet) */
  int late;              /* it ran out of time */
  int depth;             /* 0: no turn under way */
  int timing;
  uint64_t iter;         /* loop iterations (uvccl__turn_tick) */
  /* the turn under way, or the last one while it may still continue */
  int site;
  const void *key;
  uint64_t key_iter;
  int open;              /* left but not yet counted (it may continue) */
  uint64_t t0, c0, t1, c1;
  uvccl_loop_stats_t st;
} uvccl__turn_t;

void uvccl__turn_init(uvccl__turn_t *t, size_t budget, uint64_t ns_budget,
                      int timing);
void uvccl__turn_enter(uvccl__turn_t *t, uvccl__site_t site, const void *key);
void uvccl__turn_leave(uvccl__turn_t *t);
/* A loop iteration begins (a turn left in the last one is over). */
static inline void uvccl__turn_tick(uvccl__turn_t *t) { t->iter++; }
/* Counts n bytes moved in the turn under way. */
static inline void uvccl__turn_charge(uvccl__turn_t *t, size_t n) {
  t->left -= (int64_t)n;
}
int uvccl__turn_clock(uvccl__turn_t *t);
/* 1 when the turn under way has used its budget (never outside a turn). */
static inline int uvccl__turn_spent(uvccl__turn_t *t) {
  if (t->depth == 0) return 0;
  if (t->left <= 0 || t->late) return 1;
  return t->left <= t->clock_at && uvccl__turn_clock(t);
}
/* How many bytes the next step may move: what is left of the budget, at
 * least `step` (so every step gets done), at most want; and all of want
 * when less than a step would be left over (a frame's last bytes are not
 * worth a turn of their own: a 512 KiB segment and its 24-byte header
 * were sent in two turns, which cost TCP a third of its bandwidth). */
static inline size_t uvccl__turn_allow(const uvccl__turn_t *t, size_t want,
                                       size_t step) {
  size_t n;
  if (t == NULL || t->depth == 0) return want;
  n = t->left > (int64_t)step && !t->late ? (size_t)t->left : step;
  return want < n || want - n < step ? want : n;
}
/* The most one step of copying or reducing moves (uvccl__turn_piece), so
 * that a turn reads its clock between steps: memory faulted in for the
 * first time can cost several times the copy itself (bench/RESULTS.md,
 * "Loop responsiveness"). */
#define UVCCL__TURN_PIECE ((size_t)128 * 1024)
static inline size_t uvccl__turn_piece(const uvccl__turn_t *t, size_t want,
                                       size_t step) {
  size_t n = uvccl__turn_allow(t, want, step);
  return n > UVCCL__TURN_PIECE && want - UVCCL__TURN_PIECE >= step
             ? UVCCL__TURN_PIECE
             : n;
}
/* The counters (the turn left last is counted first); reset zeroes them. */
void uvccl__turn_stats(uvccl__turn_t *t, uvccl_loop_stats_t *out, int reset);

/* ---- Socket output without SIGPIPE (sendq.c) ------------------------------
 * Every write uvccl makes to a TCP connection goes through here (sendmsg
 * with MSG_NOSIGNAL), never through uv_write/uv_try_write, which use
 * write() and so raise SIGPIPE when the peer has gone. Reading stays with
 * the uv_tcp_t. Requests are caller-allocated; their buffers must stay
 * valid until cb runs (from the loop, never inside uvccl__sendq_write). */
#define UVCCL__WREQ_BUFS 4
typedef struct uvccl__wreq_s {
  struct uvccl__wreq_s *next;
  uv_buf_t bufs[UVCCL__WREQ_BUFS];
  unsigned nbufs, idx;
  size_t left;                     /* bytes not yet written */
  void (*cb)(struct uvccl__wreq_s *req, int status);
  void *data;
} uvccl__wreq_t;

typedef struct uvccl__sendq_s {
  uv_loop_t *loop;
  uv_tcp_t *tcp;
  int dupfd;                       /* -1 until the socket first fills */
  uv_poll_t poll;
  int poll_open;
  uvccl__wreq_t *head, *tail;
  size_t queued;                   /* bytes queued, not yet written */
  int err;                         /* sticky write error */
  int closing;
  void (*close_cb)(struct uvccl__sendq_s *q);
  void *data;
  /* The owner's turns (NULL: none): a write callback is a turn, and no
   * sendmsg takes more than its budget allows. */
  uvccl__turn_t *turn;
} uvccl__sendq_t;

/* tcp must be connected (or accepted) and stay open while q is used. */
void uvccl__sendq_init(uvccl__sendq_t *q, uv_loop_t *loop, uv_tcp_t *tcp);
/* Writes what the socket takes now, only when nothing is queued: the
 * bytes written (0 when full or when requests are queued), or a negative
 * error (UV_EPIPE, UV_ECONNRESET, ...). */
ssize_t uvccl__sendq_try(uvccl__sendq_t *q, const uv_buf_t *bufs, unsigned n);
/* Queues bufs behind what is queued; cb(req, 0) once written, or an error
 * (UV_ECANCELED when q closes first). 0, or an error (cb never runs). */
int uvccl__sendq_write(uvccl__sendq_t *q, uvccl__wreq_t *req, const uv_buf_t *bufs,
                    unsigned n, void (*cb)(uvccl__wreq_t *req, int status));
size_t uvccl__sendq_queued(const uvccl__sendq_t *q);
/* The queued req no longer owns its buffers: what is left of it goes out
 * from a copy, and req's callback never runs. 0, UV_ENOENT (not queued)
 * or UV_ENOMEM. */
int uvccl__sendq_orphan(uvccl__sendq_t *q, uvccl__wreq_t *req);
/* Stops writing: queued requests fail with UV_ECANCELED. Returns 1 when cb
 * will run (later, from the loop, once q's handle closed; q's memory must
 * last until then), 0 when q held no handle (cb never runs). Call before
 * closing the tcp handle. */
int uvccl__sendq_close(uvccl__sendq_t *q, void (*cb)(uvccl__sendq_t *q));
/* shutdown(SHUT_WR) of the socket: the caller makes sure nothing is
 * queued first. */
int uvccl__sendq_shutdown(uvccl__sendq_t *q);

/* ---- Liveness helpers (liveness.c) ----------------------------------------- */
/* The heartbeat timeout for an option value: 0 = the environment's
 * UVCCL_HEARTBEAT_TIMEOUT_MS (config.c), else its default; UINT64_MAX =
 * off (0). */
uint64_t uvccl__heartbeat_timeout(uint64_t opt);
/* Keepalive (and with user_timeout, TCP_USER_TIMEOUT) for a connection
 * whose peer must be found gone within about timeout_ms (0: leave the
 * socket alone). */
void uvccl__tune_socket(int fd, uint64_t timeout_ms, int user_timeout);
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
