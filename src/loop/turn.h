/* Turns on the application's loop: a budget per callback (turn.c). */
#ifndef UVCCL_LOOP_TURN_H
#define UVCCL_LOOP_TURN_H

#include "uvccl.h"

#include <stddef.h>
#include <stdint.h>

/* uvccl shares the application's loop, so every callback it runs there is
 * a turn with a budget: each copy, reduction, send and receive draws on
 * its bytes, and a loop of work that finds it spent stops and leaves the
 * rest for a later turn (the caller makes sure there is one: the socket
 * stays readable or writable, the ring stays marked, the slice stays
 * queued). The budget is bytes, and time too: memory on a shared machine
 * is sometimes ten times slower than usual for a while, so a turn notes
 * the clock when it begins, looks at it again every TURN_CLOCK_EVERY
 * bytes it moves, and is spent once it ran ns_budget. A turn
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

/* What one system call of a turn (a sendmsg, a read) moves at most: a
 * piece that learns from the time its last calls took, so that one call
 * stays near UVCCL__PIECE_TARGET_NS even while the kernel or the memory
 * is several times slower than usual. At 4 ranks on 2 vCPUs a sendmsg of
 * 512 KiB took 2-3.7 ms now and then, and a read of 128 KiB into pages
 * touched for the first time 4-8 ms while the host was slow to back them
 * (bench/RESULTS.md, "Loop responsiveness"); the turn's clock, read
 * between calls, cannot cut a call short. A call that took longer than
 * the target shrinks the piece to what would have fit it (at least
 * UVCCL__PIECE_MIN); one at a rate that would move a whole piece in
 * under half of it doubles it again, up to the caller's largest. */
#define UVCCL__PIECE_TARGET_NS ((uint64_t)1000000)
#define UVCCL__PIECE_MIN ((size_t)16 * 1024)
/* Calls of fewer bytes are not timed, but for a piece cut smaller (see
 * uvccl__piece_timed): a small frame's send has nothing to cut. */
#define UVCCL__PIECE_TIMED ((size_t)64 * 1024)

typedef struct {
  size_t now; /* 0: the caller's largest */
} uvccl__piece_t;

static inline size_t uvccl__piece_get(const uvccl__piece_t *p, size_t max) {
  return p->now == 0 || p->now > max ? max : p->now;
}
void uvccl__piece_learn(uvccl__piece_t *p, size_t max, size_t bytes,
                        uint64_t ns);
/* 1 when a call that may move len bytes is timed: UVCCL__PIECE_TIMED or
 * a whole piece (a piece cut below that must still be timed, or it never
 * grows back: untimed, pieces cut to 16-60 KiB stayed there, and the
 * collectives were 5-35% slower at 4 ranks on 2 vCPUs). */
static inline int uvccl__piece_timed(const uvccl__piece_t *p, size_t max,
                                     size_t len) {
  size_t cur = uvccl__piece_get(p, max);
  return len >= (cur < UVCCL__PIECE_TIMED ? cur : UVCCL__PIECE_TIMED);
}

typedef struct {
  int64_t budget;        /* bytes a turn may move */
  uvccl__piece_t send, read; /* a sendmsg's and a read's (above) */
  int64_t left;          /* what the turn under way still may */
  uint64_t ns_budget;    /* and the time it may take (0: no limit) */
  int64_t clock_at;      /* `left` when the clock is next looked at */
  uint64_t clock0;       /* when it began (ns_budget: the clock's) */
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
/* A system call of the turn under way moved `bytes` in `ns` (uv_hrtime's
 * clock, as the turn's: a clock read costs about 40 ns there, the thread's
 * CPU clock 260 ns, a system call here): its piece learns, and a slow
 * call makes the turn look at its clock at once (it may be spent). */
void uvccl__turn_io(uvccl__turn_t *t, uvccl__piece_t *p, size_t max,
                    size_t bytes, uint64_t ns);
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

#endif
