/* Socket output that never raises SIGPIPE.
 *
 * libuv writes streams with write()/writev(), and Linux raises SIGPIPE on a
 * write to a socket whose peer has gone (there is no per-socket option on
 * Linux; SO_NOSIGPIPE is BSD's). A library must not kill its host for a
 * peer's death, nor change the process's signal disposition behind its
 * back, so every byte uvccl puts on a TCP connection goes out here, with
 * sendmsg(MSG_NOSIGNAL), and never through uv_write/uv_try_write.
 *
 * Reading stays with libuv. When the socket is full, the rest waits in a
 * FIFO of caller-owned requests, and a uv_poll_t watches for room on a
 * duplicate of the socket's descriptor (made the first time the socket
 * fills, so a connection that never fills costs nothing): epoll refuses
 * the same descriptor twice, but takes a duplicate of it, and libuv's
 * stream keeps its own watcher on the original. */
#include "internal.h"
#include "loop/sendq.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

void uvccl__sendq_init(uvccl__sendq_t *q, uv_loop_t *loop, uv_tcp_t *tcp) {
  memset(q, 0, sizeof(*q));
  q->loop = loop;
  q->tcp = tcp;
  q->dupfd = -1;
}

static int sendq_fd(uvccl__sendq_t *q) {
  uv_os_fd_t fd;
  if (uv_fileno((const uv_handle_t *)q->tcp, &fd) != 0) return -1;
  return fd;
}

/* The least a sendmsg in a spent turn may take (a step worth its system
 * call), and the most one takes (less while calls are slow: turn.h's
 * pieces): a turn larger than that sends in pieces and looks at its clock
 * between them (turn.c). Smaller pieces cost TCP its bandwidth on
 * loopback (each push wakes the receiver; see bench/RESULTS.md). */
#define SENDQ_STEP (64u * 1024)
#define SENDQ_PIECE (512u * 1024)

static size_t sendq_allow(uvccl__sendq_t *q, size_t want) {
  size_t n, piece;
  if (q->turn == NULL) return want;
  n = uvccl__turn_allow(q->turn, want, SENDQ_STEP);
  piece = uvccl__piece_get(&q->turn->send, SENDQ_PIECE);
  return n < piece ? n : piece;
}

/* One sendmsg of up to 16 buffers, at most max bytes; bytes written, 0
 * when full, or -errno. */
static ssize_t sendq_sendv(int fd, const uv_buf_t *bufs, unsigned n, size_t max) {
  struct iovec iov[16];
  struct msghdr mh;
  ssize_t r;
  unsigned i;
  if (n > 16) n = 16;
  for (i = 0; i < n && max > 0; i++) {
    iov[i].iov_base = bufs[i].base;
    iov[i].iov_len = bufs[i].len < max ? bufs[i].len : max;
    max -= iov[i].iov_len;
  }
  n = i;
  memset(&mh, 0, sizeof(mh));
  mh.msg_iov = iov;
  mh.msg_iovlen = n;
  do
    r = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  if (r >= 0) return r;
  if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
  return -errno;
}

/* sendq_sendv, timed when it may move a piece's worth (turn.h). */
static ssize_t sendq_sendv_timed(uvccl__sendq_t *q, int fd,
                                 const uv_buf_t *bufs, unsigned n, size_t max) {
  uint64_t c0;
  ssize_t r;
  if (q->turn == NULL ||
      !uvccl__piece_timed(&q->turn->send, SENDQ_PIECE, max))
    return sendq_sendv(fd, bufs, n, max);
  c0 = uv_hrtime();
  r = sendq_sendv(fd, bufs, n, max);
  if (r > 0)
    uvccl__turn_io(q->turn, &q->turn->send, SENDQ_PIECE, (size_t)r,
                   uv_hrtime() - c0);
  return r;
}

/* Drops the first `done` bytes of bufs[*idx..n). */
static void bufs_advance(uv_buf_t *b, unsigned n, unsigned *idx, size_t done) {
  while (done > 0 && *idx < n) {
    if (done < b[*idx].len) {
      b[*idx].base += done;
      b[*idx].len -= done;
      return;
    }
    done -= b[*idx].len;
    (*idx)++;
  }
}

ssize_t uvccl__sendq_try(uvccl__sendq_t *q, const uv_buf_t *bufs, unsigned n) {
  uv_buf_t b[16];
  size_t left = 0, done = 0;
  unsigned i, idx = 0;
  int fd;
  if (q->err != 0) return q->err;
  if (q->head != NULL) return 0; /* keep the order */
  fd = sendq_fd(q);
  if (fd < 0) return UV_EBADF;
  if (n == 1 && q->turn == NULL) {
    /* send() rather than a one-entry sendmsg: the store's common case */
    ssize_t r;
    do
      r = send(fd, bufs[0].base, bufs[0].len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r >= 0) return r;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
  }
  if (n > 16) n = 16;
  for (i = 0; i < n; i++) {
    b[i] = bufs[i];
    left += bufs[i].len;
  }
  /* pieces while the socket takes them and the turn lasts */
  while (left > 0) {
    size_t max = sendq_allow(q, left);
    ssize_t r = sendq_sendv_timed(q, fd, b + idx, n - idx, max);
    if (r < 0) return done > 0 ? (ssize_t)done : r; /* (seen again later) */
    if (r == 0) break;
    if (q->turn != NULL) uvccl__turn_charge(q->turn, (size_t)r);
    done += (size_t)r;
    left -= (size_t)r;
    bufs_advance(b, n, &idx, (size_t)r);
    if ((size_t)r < max || (q->turn != NULL && uvccl__turn_spent(q->turn)))
      break;
  }
  return (ssize_t)done;
}

/* Drops the first `done` bytes of req's buffers. 1 when all are gone. */
static int req_advance(uvccl__wreq_t *req, size_t done) {
  bufs_advance(req->bufs, req->nbufs, &req->idx, done);
  while (req->idx < req->nbufs && req->bufs[req->idx].len == 0) req->idx++;
  return req->idx == req->nbufs;
}

static void sendq_fail_all(uvccl__sendq_t *q, int err) {
  uvccl__wreq_t *r;
  while ((r = q->head) != NULL) {
    q->head = r->next;
    if (q->head == NULL) q->tail = NULL;
    q->queued -= r->left;
    r->left = 0;
    if (r->cb != NULL) r->cb(r, err); /* may free r */
  }
}

static void sendq_on_poll(uv_poll_t *h, int status, int events) {
  uvccl__sendq_t *q = h->data;
  int fd = q->dupfd;
  (void)events;
  if (status < 0) {
    /* libuv reports EPOLLERR (a reset, say) as UV_EBADF: the socket's own
     * error says what happened. */
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr != 0)
      status = -soerr;
    else if (status == UV_EBADF)
      status = UV_ECONNRESET;
    q->err = status;
    uv_poll_stop(h);
    sendq_fail_all(q, status);
    return;
  }
  if (q->turn != NULL) uvccl__turn_enter(q->turn, UVCCL__SITE_WRITE, NULL);
  while (q->head != NULL) {
    uvccl__wreq_t *r = q->head;
    ssize_t n;
    /* The turn is over: the socket is still writable, so the loop comes
     * back for the rest at its next iteration. */
    if (q->turn != NULL && uvccl__turn_spent(q->turn)) goto out;
    n = sendq_sendv_timed(q, fd, r->bufs + r->idx, r->nbufs - r->idx,
                          sendq_allow(q, r->left));
    if (n < 0) {
      q->err = (int)n;
      uv_poll_stop(h);
      sendq_fail_all(q, (int)n);
      goto out;
    }
    if (n == 0) goto out; /* full again: wait */
    if (q->turn != NULL) uvccl__turn_charge(q->turn, (size_t)n);
    q->queued -= (size_t)n;
    r->left -= (size_t)n;
    if (!req_advance(r, (size_t)n)) continue;
    q->head = r->next;
    if (q->head == NULL) q->tail = NULL;
    if (r->cb != NULL) r->cb(r, 0); /* may free r, queue more, or close q */
    if (q->closing) goto out;
  }
  uv_poll_stop(h);
out:
  /* (q may be closing, but its memory lasts until its close callback) */
  if (q->turn != NULL) uvccl__turn_leave(q->turn);
}

int uvccl__sendq_write(uvccl__sendq_t *q, uvccl__wreq_t *req, const uv_buf_t *bufs,
                    unsigned n, void (*cb)(uvccl__wreq_t *req, int status)) {
  unsigned i;
  int rc;
  if (q->err != 0) return q->err;
  if (q->closing) return UV_ECANCELED;
  if (n > UVCCL__WREQ_BUFS) return UV_EINVAL;
  if (!q->poll_open) {
    int fd = sendq_fd(q);
    if (fd < 0) return UV_EBADF;
    q->dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (q->dupfd < 0) return -errno;
    rc = uv_poll_init_socket(q->loop, &q->poll, q->dupfd);
    if (rc != 0) {
      close(q->dupfd);
      q->dupfd = -1;
      return rc;
    }
    q->poll.data = q;
    q->poll_open = 1;
  }
  req->next = NULL;
  req->cb = cb;
  req->nbufs = n;
  req->idx = 0;
  req->left = 0;
  for (i = 0; i < n; i++) {
    req->bufs[i] = bufs[i];
    req->left += bufs[i].len;
  }
  if (q->tail) q->tail->next = req;
  else q->head = req;
  q->tail = req;
  q->queued += req->left;
  return uv_poll_start(&q->poll, UV_WRITABLE, sendq_on_poll);
}

size_t uvccl__sendq_queued(const uvccl__sendq_t *q) { return q->queued; }

static void sendq_poll_closed(uv_handle_t *h) {
  uvccl__sendq_t *q = h->data;
  void (*cb)(uvccl__sendq_t *) = q->close_cb;
  sendq_fail_all(q, UV_ECANCELED);
  if (cb != NULL) cb(q);
}

int uvccl__sendq_close(uvccl__sendq_t *q, void (*cb)(uvccl__sendq_t *q)) {
  if (q->closing) return 0;
  q->closing = 1;
  if (!q->poll_open) return 0;
  q->close_cb = cb;
  q->poll_open = 0;
  /* uv_close takes the duplicate out of epoll at once, so it can be
   * closed now; the requests still queued fail from the close callback. */
  uv_close((uv_handle_t *)&q->poll, sendq_poll_closed);
  close(q->dupfd);
  q->dupfd = -1;
  return 1;
}

int uvccl__sendq_shutdown(uvccl__sendq_t *q) {
  int fd = sendq_fd(q);
  if (fd < 0) return UV_EBADF;
  return shutdown(fd, SHUT_WR) == 0 ? 0 : -errno;
}

/* ---- orphans ------------------------------------------------------------ */

typedef struct {
  uvccl__wreq_t req;
  char data[];
} orphan_t;

static void orphan_done(uvccl__wreq_t *req, int status) {
  (void)status;
  uvccl__free(UVCCL__CONTAINER_OF(req, orphan_t, req));
}

int uvccl__sendq_orphan(uvccl__sendq_t *q, uvccl__wreq_t *req) {
  uvccl__wreq_t **pp, *prev = NULL;
  orphan_t *o;
  size_t off = 0;
  unsigned i;
  for (pp = &q->head; *pp != NULL && *pp != req; pp = &(*pp)->next)
    prev = *pp;
  if (*pp == NULL) return UV_ENOENT;
  o = uvccl__malloc(sizeof(*o) + (req->left ? req->left : 1));
  if (o == NULL) return UV_ENOMEM;
  for (i = req->idx; i < req->nbufs; i++) {
    if (req->bufs[i].len) memcpy(o->data + off, req->bufs[i].base, req->bufs[i].len);
    off += req->bufs[i].len;
  }
  memset(&o->req, 0, sizeof(o->req));
  o->req.bufs[0] = uv_buf_init(o->data, 0);
  o->req.bufs[0].len = off;
  o->req.nbufs = 1;
  o->req.left = off;
  o->req.cb = orphan_done;
  o->req.next = req->next;
  *pp = &o->req;
  if (q->tail == req) q->tail = &o->req;
  (void)prev;
  req->next = NULL;
  return 0;
}
