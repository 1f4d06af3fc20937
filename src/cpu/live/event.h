/* What the monitor tells: a rank's failure, a notice, the events the
 * application's loop receives (live.h), and the monitor's handle. Shared
 * by the monitor's files and the link frames' codec. */
#ifndef UVCCL_CPU_LIVE_EVENT_H
#define UVCCL_CPU_LIVE_EVENT_H

#include <stdint.h>

#define UVCCL__DETAIL_LEN 120

/* Why a rank is declared failed (the public uvccl_fail_cause_t). */
typedef struct {
  int rank;      /* world rank that failed */
  int origin;    /* world rank that saw it happen (may be this one) */
  int via;       /* the rank whose notice told us (origin, or ourselves) */
  int cause;     /* uvccl_fail_cause_t */
  int err;       /* error code (UV_ECONNRESET, UV_ETIMEDOUT, ...) or 0 */
  char detail[UVCCL__DETAIL_LEN]; /* "no heartbeat for 15.2 s", ... */
} uvccl__fail_t;

/* Out-of-band notices that are not deaths, relayed to every live rank. */
enum {
  UVCCL__NOTICE_REVOKE = 1, /* gid revoked by origin, detail = reason */
  UVCCL__NOTICE_GROUP       /* gid failed on origin because of rank */
};

typedef struct {
  int what;      /* UVCCL__NOTICE_* */
  uint32_t gid;
  int rank;      /* the culprit (GROUP), or -1 */
  int origin;    /* who sends it */
  int cause;
  int err;
  char detail[UVCCL__DETAIL_LEN];
} uvccl__notice_t;

typedef enum {
  UVCCL__LIVE_LINK_UP = 1,  /* rank's link is up */
  UVCCL__LIVE_LINK_FAILED,  /* rank's link could not be made (creation) */
  UVCCL__LIVE_DEAD,         /* fail: a rank failed (rank == ours: we were
                               declared failed by the others) */
  UVCCL__LIVE_LEFT,         /* rank said goodbye (destroyed its world) */
  UVCCL__LIVE_NOTICE,       /* notice */
  UVCCL__LIVE_CLOSED,       /* uvccl__live_close finished (last event) */
  UVCCL__LIVE_GROWN         /* uvccl__live_grow is done: rank is the new
                               size (-1: it could not grow) */
} uvccl__live_ev_kind_t;

typedef struct {
  int kind;
  int rank;
  uvccl__fail_t fail;
  uvccl__notice_t notice;
  char msg[UVCCL__DETAIL_LEN]; /* LINK_FAILED: why (fail.err UVCCL_EAUTH:
                                  the link failed authentication) */
} uvccl__live_ev_t;

/* An accepted connection (mesh or monitor) must name itself, and prove
 * the world's secret where there is one, within this; else it is
 * closed. */
#define UVCCL__HANDSHAKE_MS 10000

typedef struct uvccl__live_s uvccl__live_t;
typedef void (*uvccl__live_cb)(void *arg, const uvccl__live_ev_t *ev);

#endif
