/* Socket output that never raises SIGPIPE (sendq.c). */
#ifndef UVCCL_LOOP_SENDQ_H
#define UVCCL_LOOP_SENDQ_H

#include "uvccl.h"
#include "loop/turn.h"

#include <sys/types.h>

/* Every write uvccl makes to a TCP connection goes through here (sendmsg
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

#endif
