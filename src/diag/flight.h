/* The flight recorder: what every group of this process did last, for the
 * question "my job is stuck: which rank, in which collective, and why?".
 *
 * One ring of entries per process (UVCCL_TRACE_BUFFER_SIZE, default 2000;
 * 0 turns it off), one entry per collective or point-to-point operation of
 * any group, TCP or NCCL: what it was (op, dtype, counts, root or peer,
 * reduce op, the caller's tag), its sequence number in its group
 * (collectives and point-to-point counted apart, as c10d does), and how
 * far it got (queued, started, completed, failed, timed out, cancelled,
 * with times and the error). Groups register themselves (name, id, ranks)
 * and keep per-group counters of the last sequence numbers enqueued,
 * started and completed, which outlive the ring's wrap-around.
 *
 * Recording is a mutex, a clock read and a few stores per event, from any
 * thread; dumps (flight_json.c) copy under the mutex and format outside
 * it. Layering: below the operations (coll/, gpu/), beside the loop core;
 * it calls nothing above it: callers pass names as static strings. */
#ifndef UVCCL_DIAG_FLIGHT_H
#define UVCCL_DIAG_FLIGHT_H

#include "uvccl.h"

#include <stdint.h>

typedef struct uvccl__fgroup_s uvccl__fgroup_t;

/* Entry states, in the order an operation goes through them. */
enum {
  UVCCL__FL_QUEUED = 0,
  UVCCL__FL_STARTED,
  UVCCL__FL_COMPLETED,
  UVCCL__FL_FAILED,
  UVCCL__FL_TIMED_OUT,
  UVCCL__FL_CANCELLED
};

/* What an operation is, as its group's code knows it at the call. */
typedef struct {
  const char *op;        /* "allreduce": static */
  const char *dtype;     /* uvccl_dtype_name(), or NULL */
  const char *redop;     /* uvccl_redop_name(), or NULL */
  int p2p;               /* counted apart from the collectives */
  int root;              /* group rank, or -1 */
  int peer;              /* group rank (send, recv), or -1 */
  uint64_t count_in;     /* elements (bytes for the byte collectives) */
  uint64_t count_out;
  const char *tag;       /* the caller's (work->tag), copied; or NULL */
} uvccl__fdesc_t;

/* A pending operation's peers it still waits for (group ranks), asked at
 * dump time on the group's own loop thread: fills up to max, returns how
 * many. */
typedef int (*uvccl__fwaiting_fn)(void *ctx, uint64_t id, int *ranks,
                                  int max);

/* Registers a group. backend "tcp" or "nccl"; name a description every
 * member shares ("uvccl/default", a new_group tag, "split", "shrink");
 * ranks: group rank -> global rank (copied); ring_size: the group option
 * (0: the environment's or the default; UVCCL_TRACE_OFF: record nothing
 * for this group). Returns NULL when recording is off for it (every call
 * below accepts NULL and does nothing). */
uvccl__fgroup_t *uvccl__flight_group_add(const char *backend,
                                         const char *name, uint32_t gid,
                                         int rank, int size, const int *ranks,
                                         uint32_t ring_size, uv_loop_t *loop,
                                         uvccl__fwaiting_fn waiting,
                                         void *ctx);
/* The group broke (every later call fails): kept for the dump. */
void uvccl__flight_group_broken(uvccl__fgroup_t *fg, int err, const char *msg);
/* The group is gone: its record stays (marked destroyed) for later dumps
 * until newer destroyed groups push it out. */
void uvccl__flight_group_remove(uvccl__fgroup_t *fg);

/* Records an operation: returns its id (0 when not recorded). seq is the
 * group's sequence number of this kind (collective or p2p). started: it
 * starts at once (TCP) rather than when a device gets to it (NCCL). */
uint64_t uvccl__flight_begin(uvccl__fgroup_t *fg, uint32_t seq,
                             const uvccl__fdesc_t *d, int started);
void uvccl__flight_started(uvccl__fgroup_t *fg, uint64_t id);
/* How it ended: status 0, UV_ETIMEDOUT, UV_ECANCELED or an error; msg the
 * work's message (may be NULL or empty). */
void uvccl__flight_end(uvccl__fgroup_t *fg, uint64_t id, int status,
                       const char *msg);

/* ---- dumps (flight_json.c) ------------------------------------------------ */
/* The dump as JSON (format: docs/trace-format.md), malloc'ed. loop: the
 * caller's loop thread, whose groups' pending operations also say which
 * peers they wait for (NULL: none asked). */
int uvccl__flight_json(uv_loop_t *loop, const char *reason, char **out,
                       size_t *len);
/* UVCCL_TRACE_DIR set: dumps there (uvccl-trace.RANK.PID.json), at most
 * every 200 ms; loop may be NULL. */
void uvccl__flight_dump_on_error(uv_loop_t *loop, const char *reason);

/* ---- what the dump code reads (flight.c's state) ------------------------- */
#define UVCCL__FL_TAG 32
#define UVCCL__FL_MSG 160
#define UVCCL__FL_NAME 64

typedef struct {
  uint64_t id;            /* 0: empty slot */
  uint64_t guid;          /* the group record's id */
  uint32_t seq;
  uint8_t p2p;
  uint8_t state;
  const char *op, *dtype, *redop;
  int root, peer;
  uint64_t count_in, count_out;
  uint64_t t_queued, t_started, t_done; /* monotonic ns; 0: not yet */
  int err;
  char tag[UVCCL__FL_TAG];
  char msg[UVCCL__FL_MSG];
} uvccl__fentry_t;

struct uvccl__fgroup_s {
  uint64_t guid;          /* process-unique */
  char backend[8];
  char name[UVCCL__FL_NAME];
  uint32_t gid;
  int rank, size;
  int *ranks;             /* global */
  uv_loop_t *loop;
  uvccl__fwaiting_fn waiting;
  void *ctx;
  int broken, broken_err;
  char broken_msg[UVCCL__FL_MSG];
  int destroyed;
  /* last sequence numbers (+1; 0: none yet), collectives and p2p */
  uint64_t enq[2], started[2], done[2];
  uvccl__fgroup_t *next;
};

/* A consistent copy of the recorder (groups and entries, oldest first),
 * for the dump code; uvccl__flight_snapshot_free() releases it. */
typedef struct {
  uvccl__fgroup_t *groups; /* array of ngroups (ranks copied; next unused) */
  int ngroups;
  uvccl__fentry_t *entries;
  size_t nentries;
  size_t capacity;        /* the ring's size */
  uint64_t recorded;      /* entries ever recorded */
} uvccl__fsnap_t;

int uvccl__flight_snapshot(uvccl__fsnap_t *s);
void uvccl__flight_snapshot_free(uvccl__fsnap_t *s);

#endif
