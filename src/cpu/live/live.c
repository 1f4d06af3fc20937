/* The monitor of a world: heartbeats and failure notices on links of
 * their own, on a thread of their own (see live.h for why).
 *
 * Threads. Everything below runs on the monitor's thread, except the
 * entry points (uvccl__live_*), which run on the application's loop
 * thread and reach the monitor through its command queue, and the writes
 * of link frames, which either thread makes under `lock`: a notice of the
 * application (abort, revoke) must be on the wire before the call
 * returns. A link's descriptor is published (fd >= 0) under the lock
 * only while the link is up, so no thread ever writes a closed one.
 *
 * Link frames: a 16-byte header (kind, payload length, three words) and
 * at most 512 payload bytes, little-endian like the data frames. */
#include "live.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
  LF_HELLO = 1, /* a = from, b = to, c = world; payload: u64 target nonce */
  LF_ACK,
  LF_HB,
  LF_BYE,
  LF_DEAD,      /* payload: wire_fail_t */
  LF_NOTICE,    /* payload: wire_notice_t */
  /* Worlds with a secret (auth.h): HELLO's payload is followed by the
   * dialer's nonce; CHALLENGE (the listener's nonce and MAC) and PROOF
   * (the dialer's MAC) come before ACK, and the listener acts on the
   * hello only once it is proven. */
  LF_CHALLENGE,
  LF_PROOF
};

#define LF_HDR 16
#define LF_MAX_PAYLOAD 512
#define LINK_PEND_MAX (64u * 1024) /* a peer this far behind is not reading */
#define LINK_MAGIC 0x4b4e4c55u     /* "ULNK", in HELLO's payload */

typedef struct {
  uint8_t kind;
  uint8_t pad;
  uint16_t len;
  uint32_t a, b, c;
} lf_hdr_t;

typedef struct {
  int32_t rank, origin, cause, err;
  char detail[UVCCL__DETAIL_LEN];
} wire_fail_t;

typedef struct {
  int32_t what, rank, origin, cause, err;
  uint32_t gid;
  char detail[UVCCL__DETAIL_LEN];
} wire_notice_t;

typedef struct {
  uint32_t magic;
  uint32_t pad;
  uint64_t nonce;
} wire_hello_t;

enum { LK_CONNECTING = 1, LK_UP, LK_DOWN };

typedef struct link_s {
  uvccl__live_t *l;
  int rank;                /* -1 until an incoming hello names it */
  int state;
  int outgoing;
  uv_tcp_t tcp;
  int tcp_open;
  uv_connect_t creq;
  uv_timer_t timer;        /* connect backoff, then suspicion grace */
  int timer_open;
  struct sockaddr_storage addr;
  uint64_t nonce;          /* outgoing: the target's */
  uvccl__tls_hs_t *tls_hs; /* TLS: the connect and handshake under way */
  int discard_parts;       /* an unnamed incoming link going: handles
                              still closing before it is freed */
  int auth_step;           /* 1 challenge or proof sent, 2 proven */
  lf_hdr_t auth_hdr;       /* the hello, acted on once proven */
  wire_hello_t auth_hello;
  uint8_t auth_nc[UVCCL__AUTH_NONCE], auth_ns[UVCCL__AUTH_NONCE];
  uint64_t deadline;
  uint64_t backoff;
  unsigned char rbuf[LF_HDR + LF_MAX_PAYLOAD];
  size_t rlen;
  uint64_t last_rx;        /* ms */
  int bye;                 /* the peer said goodbye */
  int closing_bye;         /* we said goodbye: wait for its EOF */
  int suspected;
  uvccl__fail_t suspicion;
  /* under l->lock */
  int fd;                  /* >= 0 while writable */
  char *pend;              /* bytes the socket did not take yet */
  size_t pend_len, pend_cap;
  int blocked;             /* pend grew past LINK_PEND_MAX */
  struct link_s *next;     /* every link, for teardown */
} link_t;

struct uvccl__live_s {
  uv_loop_t *app_loop;
  uvccl__xqueue_t appq;    /* events, on the application's loop */
  uvccl__live_cb cb;
  void *arg;
  uv_loop_t loop;          /* the monitor's */
  uvccl__xqueue_t cmdq;    /* commands, on the monitor's loop */
  uv_thread_t thread;
  int thread_started;
  uv_mutex_t lock;
  int rank, size;
  uint64_t nonce;
  uvccl__auth_key_t auth;  /* the world's secret, when it has one */
  uvccl__tls_ctx_t *tls;   /* TLS for every link, or NULL */
  struct live_tls_accept_s *tls_accepts; /* server handshakes under way */
  uint64_t refusal_log_ms; /* rate limit of refusals' log lines */
  int refusals_logged;
  uint64_t hb_ms, period_ms, grace_ms;
  uv_tcp_t listener;
  uv_timer_t tick;
  uv_timer_t susp_timer;   /* the next suspicion due (overlays) */
  uint64_t last_tick;
  link_t **links;          /* by rank (under lock for the app's writes) */
  link_t *all;             /* every link object */
  unsigned char *dead;     /* 1 failed, 2 left */
  /* Overlays (relay): failures and notices are passed on once; a rank
   * with no link to us is suspected until susp_due (ms), then declared. */
  int relay;
  uint64_t *seen;          /* notices already passed on (their keys) */
  int nseen, seencap;
  uvccl__fail_t *susp;
  uint64_t *susp_due;
  int fenced;              /* we were declared failed */
  int closing;
  int app_closed;          /* live_close was called (app thread) */
};

/* ---- commands (application thread -> monitor) ------------------------------- */

enum { CMD_CONNECT = 1, CMD_SUSPECT, CMD_DECLARE, CMD_CLOSE };

typedef struct {
  uvccl__xitem_t item;
  uvccl__live_t *l;
  int kind;
  int rank;
  struct sockaddr_storage addr;
  uint64_t nonce, deadline;
  uvccl__fail_t f;
  int bye;
} cmd_t;

typedef struct {
  uvccl__xitem_t item;
  uvccl__live_t *l;
  uvccl__live_ev_t ev;
} evi_t;

static void declare(uvccl__live_t *l, const uvccl__fail_t *f, int broadcast);
static void link_close(link_t *k);
static void post_ev(uvccl__live_t *l, const uvccl__live_ev_t *ev);

/* ---- small helpers ------------------------------------------------------------ */

static void fail_set(uvccl__fail_t *f, int rank, int origin, int cause,
                     int err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void fail_set(uvccl__fail_t *f, int rank, int origin, int cause,
                     int err, const char *fmt, ...) {
  va_list ap;
  memset(f, 0, sizeof(*f));
  f->rank = rank;
  f->origin = origin;
  f->via = origin;
  f->cause = cause;
  f->err = err;
  va_start(ap, fmt);
  vsnprintf(f->detail, sizeof(f->detail), fmt, ap);
  va_end(ap);
}

/* ---- writing (either thread) ---------------------------------------------------- */

/* Sends a frame on k, behind whatever the socket did not take before.
 * Caller holds l->lock. */
static void link_write_locked(link_t *k, const void *p, size_t len) {
  ssize_t n;
  if (k->fd < 0) return;
  while (k->pend_len > 0) {
    n = send(k->fd, k->pend, k->pend_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    memmove(k->pend, k->pend + n, k->pend_len - (size_t)n);
    k->pend_len -= (size_t)n;
  }
  n = 0;
  if (k->pend_len == 0) {
    do
      n = send(k->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return; /* read side
                                                              sees it */
      n = 0;
    }
  }
  if ((size_t)n == len) return;
  /* Keep the rest so the stream stays whole; a peer whose monitor does
   * not read for this long is declared failed by the tick. */
  if (k->pend_len + (len - (size_t)n) > LINK_PEND_MAX) {
    k->blocked = 1;
    return;
  }
  if (k->pend_len + len > k->pend_cap) {
    size_t cap = k->pend_cap ? k->pend_cap * 2 : 1024;
    char *b;
    while (cap < k->pend_len + len) cap *= 2;
    b = uvccl__realloc(k->pend, cap);
    if (b == NULL) {
      k->blocked = 1;
      return;
    }
    k->pend = b;
    k->pend_cap = cap;
  }
  memcpy(k->pend + k->pend_len, (const char *)p + n, len - (size_t)n);
  k->pend_len += len - (size_t)n;
}

/* Lays out a frame in buf (LF_HDR + LF_MAX_PAYLOAD bytes); its length. */
static size_t frame_build(unsigned char *buf, int kind, uint32_t a,
                          uint32_t b, uint32_t c, const void *payload,
                          size_t plen) {
  lf_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.kind = (uint8_t)kind;
  h.len = (uint16_t)plen;
  h.a = a;
  h.b = b;
  h.c = c;
  memcpy(buf, &h, LF_HDR);
  if (plen) memcpy(buf + LF_HDR, payload, plen);
  return LF_HDR + plen;
}

static void link_send(link_t *k, int kind, uint32_t a, uint32_t b, uint32_t c,
                      const void *payload, size_t plen) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD];
  size_t len = frame_build(buf, kind, a, b, c, payload, plen);
  uv_mutex_lock(&k->l->lock);
  link_write_locked(k, buf, len);
  uv_mutex_unlock(&k->l->lock);
}

/* The application's frame to every rank it has a link to, all under one
 * hold of the lock. One at a time, the first rank told could answer
 * before the last is: told that this rank failed (an abort), it says so
 * back, and this monitor, fencing itself, closes the links the others
 * were still to hear it on. They would see only the connections close. */
static void send_to_all(uvccl__live_t *l, int kind, const void *payload,
                        size_t plen) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD];
  size_t len = frame_build(buf, kind, 0, 0, 0, payload, plen);
  int r;
  uv_mutex_lock(&l->lock);
  for (r = 0; r < l->size; r++)
    if (l->links[r] != NULL) link_write_locked(l->links[r], buf, len);
  uv_mutex_unlock(&l->lock);
}

static void wire_fail(wire_fail_t *w, const uvccl__fail_t *f) {
  memset(w, 0, sizeof(*w));
  w->rank = f->rank;
  w->origin = f->origin;
  w->cause = f->cause;
  w->err = f->err;
  memcpy(w->detail, f->detail, sizeof(w->detail));
  w->detail[sizeof(w->detail) - 1] = '\0';
}

static void send_dead(link_t *k, const uvccl__fail_t *f) {
  wire_fail_t w;
  wire_fail(&w, f);
  link_send(k, LF_DEAD, 0, 0, 0, &w, sizeof(w));
}

/* Publishes (fd >= 0) or withdraws (-1) a link's descriptor. */
static void link_set_fd(link_t *k, int fd) {
  uv_mutex_lock(&k->l->lock);
  k->fd = fd;
  uv_mutex_unlock(&k->l->lock);
}

/* ---- events (monitor -> application) -------------------------------------------- */

static void on_app_closed(uvccl__live_t *l);

static void ev_run(uvccl__xitem_t *it) {
  evi_t *e = UVCCL__CONTAINER_OF(it, evi_t, item);
  uvccl__live_t *l = e->l;
  uvccl__live_ev_t ev = e->ev;
  uvccl__free(e);
  l->cb(l->arg, &ev);
  if (ev.kind == UVCCL__LIVE_CLOSED) on_app_closed(l);
}

static void post_ev(uvccl__live_t *l, const uvccl__live_ev_t *ev) {
  evi_t *e = uvccl__calloc(1, sizeof(*e));
  if (e == NULL) return; /* out of memory: the collective timeout remains */
  e->l = l;
  e->ev = *ev;
  e->item.fn = ev_run;
  uvccl__xqueue_post(&l->appq, &e->item);
}

static void post_simple(uvccl__live_t *l, int kind, int rank,
                        const char *msg) {
  uvccl__live_ev_t ev;
  memset(&ev, 0, sizeof(ev));
  ev.kind = kind;
  ev.rank = rank;
  if (msg) snprintf(ev.msg, sizeof(ev.msg), "%s", msg);
  post_ev(l, &ev);
}

/* ---- declaring ---------------------------------------------------------------------- */

/* rank failed: tell every other live rank (and rank itself, so that if it
 * is alive after all it knows it was cut off), then the application. */
static void declare(uvccl__live_t *l, const uvccl__fail_t *f, int broadcast) {
  uvccl__live_ev_t ev;
  link_t *k;
  int r;
  if (f->rank < 0 || f->rank >= l->size || f->rank == l->rank) return;
  if (l->dead[f->rank] || l->fenced) return;
  l->dead[f->rank] = 1;
  LOG_DEBUG("live", "rank %d: rank %d failed: %s (seen by %d, told by %d)",
            l->rank, f->rank, f->detail, f->origin, f->via);
  if (broadcast)
    for (r = 0; r < l->size; r++) {
      k = l->links[r];
      if (k != NULL && k->state == LK_UP) send_dead(k, f);
    }
  k = l->links[f->rank];
  if (k != NULL) {
    /* It hears why before it sees us go (if it is alive after all, it
     * must not take our leaving for a failure of ours). */
    if (!broadcast && k->state == LK_UP) send_dead(k, f);
    link_close(k);
  }
  memset(&ev, 0, sizeof(ev));
  ev.kind = UVCCL__LIVE_DEAD;
  ev.rank = f->rank;
  ev.fail = *f;
  post_ev(l, &ev);
}

static void declare_self_dead(uvccl__live_t *l, const uvccl__fail_t *f) {
  uvccl__live_ev_t ev;
  int r;
  if (l->fenced) return;
  l->fenced = 1;
  for (r = 0; r < l->size; r++)
    if (l->links[r] != NULL) link_close(l->links[r]);
  memset(&ev, 0, sizeof(ev));
  ev.kind = UVCCL__LIVE_DEAD;
  ev.rank = l->rank;
  ev.fail = *f;
  post_ev(l, &ev);
}

/* ---- links: life cycle ---------------------------------------------------------- */

static void on_discard_closed(uv_handle_t *h) {
  link_t *k = h->data, **pp;
  if (--k->discard_parts > 0) return;
  for (pp = &k->l->all; *pp != NULL; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  uvccl__free(k->pend);
  uvccl__free(k);
}

/* The link's socket closes (its memory stays until the monitor goes,
 * but for incoming connections that never became a rank's link: nothing
 * refers to those, and strays must not pile up). */
static void link_close(link_t *k) {
  k->state = LK_DOWN;
  link_set_fd(k, -1);
  if (k->timer_open) uv_timer_stop(&k->timer);
  if (k->rank < 0 && !k->outgoing && !k->l->closing && !k->discard_parts) {
    /* Freed once both handles closed (callers may still read k until
     * they return). */
    if (k->tcp_open) {
      k->tcp_open = 0;
      k->discard_parts++;
      k->tcp.data = k;
      uv_close((uv_handle_t *)&k->tcp, on_discard_closed);
    }
    if (k->timer_open) {
      k->timer_open = 0;
      k->discard_parts++;
      uv_close((uv_handle_t *)&k->timer, on_discard_closed);
    }
    return;
  }
  if (k->tcp_open) {
    k->tcp_open = 0;
    uv_close((uv_handle_t *)&k->tcp, NULL);
  }
}

static link_t *link_new(uvccl__live_t *l, int rank) {
  link_t *k = uvccl__calloc(1, sizeof(*k));
  if (k == NULL) return NULL;
  k->l = l;
  k->rank = rank;
  k->fd = -1;
  uv_timer_init(&l->loop, &k->timer);
  k->timer.data = k;
  k->timer_open = 1;
  k->next = l->all;
  l->all = k;
  return k;
}

static void link_up(link_t *k) {
  uvccl__live_t *l = k->l;
  uv_os_fd_t fd = -1;
  k->state = LK_UP;
  k->last_rx = uvccl__now_ms();
  uv_fileno((uv_handle_t *)&k->tcp, &fd);
  uvccl__tune_socket(fd, l->hb_ms, 1);
  link_set_fd(k, fd);
  post_simple(l, UVCCL__LIVE_LINK_UP, k->rank, NULL);
}

/* The link to k->rank broke (EOF, reset, timeout). */
static void connect_retry(link_t *k);

static void link_broken(link_t *k, int err) {
  uvccl__live_t *l = k->l;
  int r = k->rank, was_up = k->state == LK_UP;
  uvccl__fail_t f;
  if (k->outgoing && k->state == LK_CONNECTING && !l->closing) {
    /* Refused by the other monitor (its rank is misconfigured, or not
     * ready): try again until the deadline; the data connection reports
     * the reason meanwhile. */
    connect_retry(k);
    return;
  }
  link_close(k);
  if (r < 0 || l->closing || l->fenced) return;
  if (k->closing_bye) return;
  if (k->bye || (k->suspected && k->suspicion.cause == UVCCL_FAIL_LEFT)) {
    /* It said goodbye (on the link, or on its data connection: a process
     * may exit before its monitor's goodbye leaves). */
    if (!l->dead[r]) {
      l->dead[r] = 2;
      post_simple(l, UVCCL__LIVE_LEFT, r, NULL);
    }
    return;
  }
  if (!was_up) return;
  if (k->suspected)
    f = k->suspicion;
  else if (err == UV_EOF)
    fail_set(&f, r, l->rank, UVCCL_FAIL_EXITED, err,
             "its process exited or was killed (connection closed)");
  else if (err == UV_ETIMEDOUT || err == UV_EHOSTUNREACH ||
           err == UV_ENETUNREACH)
    fail_set(&f, r, l->rank, UVCCL_FAIL_UNREACHABLE, err, "unreachable: %s",
             uvccl_strerror(err));
  else if (err == UV_ECONNRESET || err == UV_EPIPE)
    fail_set(&f, r, l->rank, UVCCL_FAIL_RESET, err, "connection reset (its "
             "process was killed, or the network reset it)");
  else
    fail_set(&f, r, l->rank, UVCCL_FAIL_RESET, err, "connection lost: %s",
             uvccl_strerror(err));
  declare(l, &f, 1);
}

/* ---- links: reading ----------------------------------------------------------------- */

static void on_frame(link_t *k, const lf_hdr_t *h, const unsigned char *p);

static void link_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b) {
  link_t *k = h->data;
  (void)sz;
  b->base = (char *)k->rbuf + k->rlen;
  b->len = sizeof(k->rbuf) - k->rlen;
}

static void link_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  link_t *k = s->data;
  size_t pos = 0;
  (void)b;
  if (n == 0) return;
  if (n < 0) {
    link_broken(k, (int)n);
    return;
  }
  k->last_rx = uvccl__now_ms();
  k->rlen += (size_t)n;
  while (k->tcp_open && k->rlen - pos >= LF_HDR) {
    lf_hdr_t h;
    memcpy(&h, k->rbuf + pos, LF_HDR);
    if (h.len > LF_MAX_PAYLOAD) {
      LOG_WARN("live", "rank %d: bad frame on the monitor link from %d: "
               "closing it", k->l->rank, k->rank);
      link_broken(k, UVCCL_EPROTO);
      return;
    }
    if (k->rlen - pos < LF_HDR + (size_t)h.len) break;
    on_frame(k, &h, k->rbuf + pos + LF_HDR);
    pos += LF_HDR + h.len;
  }
  if (!k->tcp_open) return;
  memmove(k->rbuf, k->rbuf + pos, k->rlen - pos);
  k->rlen -= pos;
}

/* Refused monitor connections are logged, up to 10 a second. */
static void refusal_log(uvccl__live_t *l, const char *why) {
  uint64_t now = uvccl__now_ms();
  if (now - l->refusal_log_ms >= 1000) {
    if (l->refusals_logged > 10)
      LOG_WARN("live", "rank %d: %d more monitor connections refused in the "
               "last second", l->rank, l->refusals_logged - 10);
    l->refusal_log_ms = now;
    l->refusals_logged = 0;
  }
  if (++l->refusals_logged <= 10)
    LOG_WARN("live", "rank %d: refusing a monitor connection: %s", l->rank,
             why);
}

/* What both MACs cover besides the nonces (see net.c's mesh_purpose). */
static void link_purpose(const lf_hdr_t *h, const wire_hello_t *hw,
                         char *buf, size_t len) {
  snprintf(buf, len, "live %u>%u %016llx %u", h->a, h->b,
           (unsigned long long)hw->nonce, h->c);
}

/* A hello whose sender is known (proven, or no secret): checked, then
 * the link is this rank's. */
static void hello_accept(link_t *k, const lf_hdr_t *h,
                         const wire_hello_t *hw) {
  uvccl__live_t *l = k->l;
  int from = (int)h->a;
  char why[128];
  if (hw->nonce != l->nonce || h->b != (uint32_t)l->rank ||
      h->c != (uint32_t)l->size || from < 0 || from >= l->size ||
      from == l->rank)
    goto bad;
  if ((l->links[from] != NULL && l->links[from]->state != LK_DOWN) ||
      l->dead[from])
    goto bad;
  uv_timer_stop(&k->timer); /* the handshake deadline */
  k->rank = from;
  uv_mutex_lock(&l->lock);
  l->links[from] = k;
  uv_mutex_unlock(&l->lock);
  link_up(k);
  link_send(k, LF_ACK, 0, 0, 0, NULL, 0);
  return;
bad:
  snprintf(why, sizeof(why), "hello from %u to %u, world %u", h->a, h->b,
           h->c);
  refusal_log(l, why);
  link_close(k);
}

static void on_hello(link_t *k, const lf_hdr_t *h, const unsigned char *p) {
  uvccl__live_t *l = k->l;
  wire_hello_t hw;
  size_t want = sizeof(hw) + (l->auth.set ? UVCCL__AUTH_NONCE : 0);
  char purpose[96];
  if (h->len != want) {
    refusal_log(l, l->auth.set ? "no secret offered, or not a uvccl monitor"
                               : "not a uvccl monitor");
    link_close(k);
    return;
  }
  memcpy(&hw, p, sizeof(hw));
  if (hw.magic != LINK_MAGIC) {
    refusal_log(l, "not a uvccl monitor");
    link_close(k);
    return;
  }
  if (!l->auth.set) {
    hello_accept(k, h, &hw);
    return;
  }
  /* Challenge it; nothing in the hello counts until it is proven. */
  k->auth_hdr = *h;
  k->auth_hello = hw;
  memcpy(k->auth_nc, p + sizeof(hw), UVCCL__AUTH_NONCE);
  if (uvccl__auth_random(k->auth_ns, sizeof(k->auth_ns)) != 0) {
    link_close(k);
    return;
  }
  {
    uint8_t c[UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC];
    link_purpose(h, &hw, purpose, sizeof(purpose));
    memcpy(c, k->auth_ns, UVCCL__AUTH_NONCE);
    uvccl__auth_mac(&l->auth, "server", purpose, k->auth_nc, k->auth_ns,
                    c + UVCCL__AUTH_NONCE);
    k->auth_step = 1;
    link_send(k, LF_CHALLENGE, 0, 0, 0, c, sizeof(c));
  }
}

/* Listener: the dialer's PROOF. */
static void on_proof(link_t *k, const lf_hdr_t *h, const unsigned char *p) {
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[96];
  if (h->len != UVCCL__AUTH_MAC) {
    refusal_log(k->l, "a malformed proof");
    link_close(k);
    return;
  }
  link_purpose(&k->auth_hdr, &k->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&k->l->auth, "client", purpose, k->auth_nc, k->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, p, sizeof(want))) {
    refusal_log(k->l, "authentication failed: wrong proof (another "
                "secret)");
    link_close(k);
    return;
  }
  k->auth_step = 2;
  hello_accept(k, &k->auth_hdr, &k->auth_hello);
}

/* Dialer: the listener's CHALLENGE; 0, or -1 when it did not prove the
 * secret. */
static int on_challenge(link_t *k, const lf_hdr_t *h,
                        const unsigned char *p) {
  uvccl__live_t *l = k->l;
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[96];
  if (h->len != UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC) return -1;
  memcpy(k->auth_ns, p, UVCCL__AUTH_NONCE);
  link_purpose(&k->auth_hdr, &k->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&l->auth, "server", purpose, k->auth_nc, k->auth_ns, want);
  if (!uvccl__auth_equal(want, p + UVCCL__AUTH_NONCE, sizeof(want)))
    return -1;
  uvccl__auth_mac(&l->auth, "client", purpose, k->auth_nc, k->auth_ns, want);
  k->auth_step = 2;
  link_send(k, LF_PROOF, 0, 0, 0, want, sizeof(want));
  return 0;
}

/* Overlays: 1 the first time a notice arrives (it is then passed on to
 * every other link), 0 for a repeat or our own coming back. */
static int notice_first(uvccl__live_t *l, const wire_notice_t *w,
                        const lf_hdr_t *h, const unsigned char *p,
                        link_t *from) {
  uint64_t key = 1469598103934665603ull;
  int32_t parts[4];
  int i, r;
  parts[0] = w->what;
  parts[1] = (int32_t)w->gid;
  parts[2] = w->origin;
  parts[3] = w->rank;
  for (i = 0; i < 16; i++) {
    key ^= ((const unsigned char *)parts)[i];
    key *= 1099511628211ull;
  }
  if (w->origin == l->rank) return 0;
  for (i = 0; i < l->nseen; i++)
    if (l->seen[i] == key) return 0;
  if (l->nseen == l->seencap) {
    int cap = l->seencap ? 2 * l->seencap : 16;
    uint64_t *n = uvccl__realloc(l->seen, (size_t)cap * sizeof(*n));
    if (n == NULL) return 1; /* delivered, not remembered */
    l->seen = n;
    l->seencap = cap;
  }
  l->seen[l->nseen++] = key;
  for (r = 0; r < l->size; r++) {
    link_t *k = l->links[r];
    if (k != NULL && k != from && k->state == LK_UP)
      link_send(k, LF_NOTICE, h->a, h->b, h->c, p, h->len);
  }
  return 1;
}

static void on_frame(link_t *k, const lf_hdr_t *h, const unsigned char *p) {
  uvccl__live_t *l = k->l;
  if (k->rank < 0) {
    if (h->kind == LF_HELLO && k->auth_step == 0) on_hello(k, h, p);
    else if (h->kind == LF_PROOF && k->auth_step == 1) on_proof(k, h, p);
    else {
      refusal_log(l, "not the handshake");
      link_close(k);
    }
    return;
  }
  if (k->state == LK_CONNECTING) {
    if (h->kind == LF_CHALLENGE && k->outgoing && l->auth.set &&
        k->auth_step == 0) {
      if (on_challenge(k, h, p) != 0) {
        char msg[UVCCL__DETAIL_LEN];
        uvccl__live_ev_t ev;
        snprintf(msg, sizeof(msg), "the monitor of rank %d failed "
                 "authentication (it holds another secret)", k->rank);
        link_close(k);
        memset(&ev, 0, sizeof(ev));
        ev.kind = UVCCL__LIVE_LINK_FAILED;
        ev.rank = k->rank;
        ev.fail.err = UVCCL_EAUTH;
        snprintf(ev.msg, sizeof(ev.msg), "%s", msg);
        post_ev(l, &ev);
      }
    } else if (h->kind == LF_ACK && k->outgoing &&
               (!l->auth.set || k->auth_step == 2)) {
      link_up(k);
    } else {
      link_close(k);
    }
    return;
  }
  switch (h->kind) {
  case LF_HB:
    return;
  case LF_BYE:
    k->bye = 1;
    return;
  case LF_DEAD: {
    wire_fail_t w;
    uvccl__fail_t f;
    if (h->len != sizeof(w)) return;
    memcpy(&w, p, sizeof(w));
    w.detail[sizeof(w.detail) - 1] = '\0';
    memset(&f, 0, sizeof(f));
    f.rank = w.rank;
    f.origin = w.origin;
    f.via = k->rank;
    f.cause = w.cause;
    f.err = w.err;
    memcpy(f.detail, w.detail, sizeof(f.detail));
    if (f.rank == l->rank) {
      declare_self_dead(l, &f);
      return;
    }
    /* In a full mesh the sender told everyone; no need to relay (a rank
     * it could not tell finds out for itself: the failed rank's links
     * break). An overlay passes it on, once (declare ignores repeats). */
    declare(l, &f, l->relay);
    return;
  }
  case LF_NOTICE: {
    wire_notice_t w;
    uvccl__live_ev_t ev;
    if (h->len != sizeof(w)) return;
    memcpy(&w, p, sizeof(w));
    w.detail[sizeof(w.detail) - 1] = '\0';
    if (l->relay && !notice_first(l, &w, h, p, k)) return;
    memset(&ev, 0, sizeof(ev));
    ev.kind = UVCCL__LIVE_NOTICE;
    ev.rank = k->rank;
    ev.notice.what = w.what;
    ev.notice.gid = w.gid;
    ev.notice.rank = w.rank;
    ev.notice.origin = w.origin;
    ev.notice.cause = w.cause;
    ev.notice.err = w.err;
    memcpy(ev.notice.detail, w.detail, sizeof(w.detail));
    post_ev(l, &ev);
    return;
  }
  default:
    return; /* unknown kinds are skipped: newer peers may add some */
  }
}

/* ---- links: connecting -------------------------------------------------------------- */

static void connect_start(link_t *k);

static void on_retry(uv_timer_t *t) {
  link_t *k = t->data;
  if (k->l->closing || k->state != LK_CONNECTING) return;
  connect_start(k);
}

static void on_retry_closed(uv_handle_t *h) {
  link_t *k = h->data;
  if (k->l->closing || k->state != LK_CONNECTING) return;
  uv_timer_start(&k->timer, on_retry, k->backoff, 0);
}

/* Closes the socket and connects again after a backoff, until the
 * deadline; then the link failed. */
static void connect_retry(link_t *k) {
  uvccl__live_t *l = k->l;
  link_set_fd(k, -1);
  k->rlen = 0;
  if (uvccl__now_ms() < k->deadline) {
    k->backoff = k->backoff ? k->backoff * 2 : 10;
    if (k->backoff > 1000) k->backoff = 1000;
    if (k->tcp_open) {
      k->tcp_open = 0;
      uv_close((uv_handle_t *)&k->tcp, on_retry_closed);
    } else {
      uv_timer_start(&k->timer, on_retry, k->backoff, 0); /* TLS */
    }
    return;
  }
  link_close(k);
  post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank,
              "the monitor of that rank refused the link until the deadline");
}

static void link_connected(link_t *k);

/* TLS: the connect and the handshake are done (or failed). */
static void on_tls_connected(void *arg, int status, int fd, const char *msg) {
  link_t *k = arg;
  uvccl__live_t *l = k->l;
  k->tls_hs = NULL;
  if (l->closing || k->state != LK_CONNECTING) {
    if (fd >= 0) close(fd);
    return;
  }
  if (status == UVCCL_EAUTH || (status < 0 && uvccl__now_ms() >= k->deadline)) {
    uvccl__live_ev_t ev;
    link_close(k);
    memset(&ev, 0, sizeof(ev));
    ev.kind = UVCCL__LIVE_LINK_FAILED;
    ev.rank = k->rank;
    ev.fail.err = status == UVCCL_EAUTH ? UVCCL_EAUTH : 0;
    snprintf(ev.msg, sizeof(ev.msg), "the monitor of rank %d: %s", k->rank,
             msg);
    post_ev(l, &ev);
    return;
  }
  if (status < 0) {
    connect_retry(k);
    return;
  }
  uv_tcp_init(&l->loop, &k->tcp);
  k->tcp.data = k;
  k->tcp_open = 1;
  if (uv_tcp_open(&k->tcp, fd) != 0) {
    close(fd);
    link_close(k);
    post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank,
                "adopting the TLS connection failed");
    return;
  }
  link_connected(k);
}

static void on_connect(uv_connect_t *req, int status) {
  link_t *k = req->data;
  uvccl__live_t *l = k->l;
  if (l->closing || k->state != LK_CONNECTING) return;
  if (status == 0 && uvccl__tcp_is_self(&k->tcp)) status = UV_ECONNREFUSED;
  if (status < 0) {
    if (uvccl__now_ms() < k->deadline && status != UV_ECANCELED) {
      connect_retry(k);
      return;
    }
    {
      char msg[UVCCL__DETAIL_LEN];
      snprintf(msg, sizeof(msg), "connecting to the monitor of rank %d: %s",
               k->rank, uvccl_strerror(status));
      link_close(k);
      post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
    }
    return;
  }
  link_connected(k);
}

/* The connection is made: hello. */
static void link_connected(link_t *k) {
  uvccl__live_t *l = k->l;
  wire_hello_t hw;
  uv_tcp_nodelay(&k->tcp, 1);
  {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&k->tcp, &fd) == 0) link_set_fd(k, fd);
  }
  memset(&hw, 0, sizeof(hw));
  hw.magic = LINK_MAGIC;
  hw.nonce = k->nonce;
  k->auth_step = 0;
  if (l->auth.set) {
    unsigned char b[sizeof(hw) + UVCCL__AUTH_NONCE];
    if (uvccl__auth_random(k->auth_nc, sizeof(k->auth_nc)) != 0) {
      link_close(k);
      post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank, "no random nonce");
      return;
    }
    memset(&k->auth_hdr, 0, sizeof(k->auth_hdr));
    k->auth_hdr.a = (uint32_t)l->rank;
    k->auth_hdr.b = (uint32_t)k->rank;
    k->auth_hdr.c = (uint32_t)l->size;
    k->auth_hello = hw;
    memcpy(b, &hw, sizeof(hw));
    memcpy(b + sizeof(hw), k->auth_nc, UVCCL__AUTH_NONCE);
    link_send(k, LF_HELLO, (uint32_t)l->rank, (uint32_t)k->rank,
              (uint32_t)l->size, b, sizeof(b));
  } else {
    link_send(k, LF_HELLO, (uint32_t)l->rank, (uint32_t)k->rank,
              (uint32_t)l->size, &hw, sizeof(hw));
  }
  uv_read_start((uv_stream_t *)&k->tcp, link_alloc, link_read);
}

static void connect_start(link_t *k) {
  int rc;
  if (k->l->tls != NULL) {
    rc = uvccl__tls_connect(k->l->tls, &k->l->loop,
                            (struct sockaddr *)&k->addr, k->l->hb_ms, 1,
                            on_tls_connected, k, &k->tls_hs);
    if (rc != 0) {
      char msg[UVCCL__DETAIL_LEN];
      snprintf(msg, sizeof(msg), "connecting to the monitor of rank %d: %s",
               k->rank, uvccl_strerror(rc));
      link_close(k);
      post_simple(k->l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
    }
    return;
  }
  uv_tcp_init(&k->l->loop, &k->tcp);
  k->tcp.data = k;
  k->tcp_open = 1;
  k->creq.data = k;
  rc = uv_tcp_connect(&k->creq, &k->tcp, (struct sockaddr *)&k->addr,
                      on_connect);
  if (rc != 0) {
    char msg[UVCCL__DETAIL_LEN];
    snprintf(msg, sizeof(msg), "connecting to the monitor of rank %d: %s",
             k->rank, uvccl_strerror(rc));
    link_close(k);
    post_simple(k->l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
  }
}

static void on_handshake_timeout(uv_timer_t *t) {
  link_t *k = t->data;
  if (k->rank >= 0 || k->state != LK_CONNECTING) return;
  refusal_log(k->l, "no handshake in time");
  link_close(k);
}

/* TLS: the server's handshake runs before the link exists. */
typedef struct live_tls_accept_s {
  uvccl__live_t *l;
  uvccl__tls_hs_t *hs;
  struct live_tls_accept_s *next;
} live_tls_accept_t;

static void link_adopt(uvccl__live_t *l, int fd);

static void on_tls_accepted(void *arg, int status, int fd, const char *msg) {
  live_tls_accept_t *a = arg, **pp;
  uvccl__live_t *l = a->l;
  for (pp = &l->tls_accepts; *pp != NULL; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      break;
    }
  uvccl__free(a);
  if (status != 0) {
    refusal_log(l, msg);
    return;
  }
  if (l->closing) {
    close(fd);
    return;
  }
  link_adopt(l, fd);
}

static void tls_accept(uvccl__live_t *l, uv_stream_t *server) {
  live_tls_accept_t *a = uvccl__calloc(1, sizeof(*a));
  if (a == NULL) return;
  a->l = l;
  if (uvccl__tls_accept_from(l->tls, server, l->hb_ms, 1, on_tls_accepted,
                             a, NULL, 0, &a->hs) != 0) {
    uvccl__free(a);
    return;
  }
  a->next = l->tls_accepts;
  l->tls_accepts = a;
}

static void on_connection(uv_stream_t *server, int status) {
  uvccl__live_t *l = server->data;
  if (status < 0 || l->closing) return;
  if (l->tls != NULL) tls_accept(l, server);
  else link_adopt(l, -1);
}

/* A new incoming link: accepted from the listener (fd -1), or the
 * plaintext descriptor of one TLS secured. */
static void link_adopt(uvccl__live_t *l, int fd) {
  link_t *k;
  k = link_new(l, -1);
  if (k == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  uv_tcp_init(&l->loop, &k->tcp);
  k->tcp.data = k;
  k->tcp_open = 1;
  if (fd >= 0 ? uv_tcp_open(&k->tcp, fd) != 0
              : uv_accept((uv_stream_t *)&l->listener,
                          (uv_stream_t *)&k->tcp) != 0) {
    if (fd >= 0) close(fd);
    link_close(k);
    return;
  }
  uv_tcp_nodelay(&k->tcp, 1);
  k->state = LK_CONNECTING;
  {
    uv_os_fd_t sfd;
    if (uv_fileno((uv_handle_t *)&k->tcp, &sfd) == 0) link_set_fd(k, sfd);
  }
  /* One that has not named itself (and proven the secret) by then goes. */
  uv_timer_start(&k->timer, on_handshake_timeout, UVCCL__HANDSHAKE_MS, 0);
  uv_read_start((uv_stream_t *)&k->tcp, link_alloc, link_read);
}

/* ---- the tick: heartbeats out, silence checked ------------------------------------------ */

/* Overlays: suspicions of ranks without a link that are due. */
static void on_susp(uv_timer_t *t) {
  uvccl__live_t *l = t->data;
  uint64_t now = uvccl__now_ms(), next = 0;
  int r;
  if (l->closing || l->fenced) return;
  for (r = 0; r < l->size; r++) {
    if (l->susp_due[r] == 0) continue;
    if (now >= l->susp_due[r]) {
      l->susp_due[r] = 0;
      if (!l->dead[r]) declare(l, &l->susp[r], 1);
    } else if (next == 0 || l->susp_due[r] < next) {
      next = l->susp_due[r];
    }
  }
  if (next != 0) uv_timer_start(&l->susp_timer, on_susp, next - now, 0);
}

static void on_tick(uv_timer_t *t) {
  uvccl__live_t *l = t->data;
  uint64_t now = uvccl__now_ms();
  int r, stalled;
  if (l->closing || l->fenced) return;
  /* If this thread itself did not run for a while (the process was
   * stopped, or starved), the silence it sees is its own: start afresh. */
  stalled = now - l->last_tick > 2 * l->period_ms;
  if (stalled)
    LOG_DEBUG("live", "rank %d: the monitor did not run for %llu ms: "
              "silence restarts from now", l->rank,
              (unsigned long long)(now - l->last_tick));
  l->last_tick = now;
  for (r = 0; r < l->size; r++) {
    link_t *k = l->links[r];
    int blocked;
    if (k == NULL || k->state != LK_UP) continue;
    if (stalled) k->last_rx = now;
    link_send(k, LF_HB, 0, 0, 0, NULL, 0);
    uv_mutex_lock(&l->lock);
    blocked = k->blocked;
    uv_mutex_unlock(&l->lock);
    if (blocked) {
      uvccl__fail_t f;
      fail_set(&f, r, l->rank, UVCCL_FAIL_HEARTBEAT, UV_ETIMEDOUT,
               "its monitor stopped reading (stopped or hung)");
      declare(l, &f, 1);
    } else if (l->hb_ms > 0 && now - k->last_rx > l->hb_ms + l->period_ms) {
      /* Silence is counted from the last heartbeat, which came up to a
       * period before the rank stopped: one period more, so a rank
       * stopped for less than the timeout is never declared failed, and
       * one stopped for good is, within the timeout plus two periods. */
      uvccl__fail_t f;
      fail_set(&f, r, l->rank, UVCCL_FAIL_HEARTBEAT, UV_ETIMEDOUT,
               "no heartbeat for %.1f s (stopped, hung or unreachable)",
               (double)(now - k->last_rx) / 1000.0);
      declare(l, &f, 1);
    }
  }
}

/* ---- commands ------------------------------------------------------------------------ */

static void on_grace(uv_timer_t *t) {
  link_t *k = t->data;
  uvccl__live_t *l = k->l;
  if (!k->suspected || k->rank < 0 || l->dead[k->rank]) return;
  if (k->suspicion.cause == UVCCL_FAIL_LEFT) {
    l->dead[k->rank] = 2;
    post_simple(l, UVCCL__LIVE_LEFT, k->rank, NULL);
    return;
  }
  /* The link is still up although the data connection broke: the rank is
   * alive but cut off from us; it is declared failed all the same. */
  declare(l, &k->suspicion, 1);
}

static void close_all(uvccl__live_t *l, int bye);

static void cmd_run(uvccl__xitem_t *it) {
  cmd_t *c = UVCCL__CONTAINER_OF(it, cmd_t, item);
  uvccl__live_t *l = c->l;
  link_t *k;
  switch (c->kind) {
  case CMD_CONNECT:
    if (l->closing || c->rank < 0 || c->rank >= l->size ||
        l->links[c->rank] != NULL)
      break;
    k = link_new(l, c->rank);
    if (k == NULL) {
      post_simple(l, UVCCL__LIVE_LINK_FAILED, c->rank, "out of memory");
      break;
    }
    k->outgoing = 1;
    k->state = LK_CONNECTING;
    k->nonce = c->nonce;
    k->deadline = c->deadline;
    memcpy(&k->addr, &c->addr, sizeof(k->addr));
    uv_mutex_lock(&l->lock);
    l->links[c->rank] = k;
    uv_mutex_unlock(&l->lock);
    connect_start(k);
    break;
  case CMD_SUSPECT:
    if (l->closing || l->fenced) break;
    if (l->dead[c->rank] == 2) {
      /* already gone cleanly: the data connection may say so now */
      post_simple(l, UVCCL__LIVE_LEFT, c->rank, NULL);
      break;
    }
    if (l->dead[c->rank]) break;
    k = l->links[c->rank];
    if ((k == NULL || k->state != LK_UP) && l->relay &&
        c->f.cause != UVCCL_FAIL_LEFT) {
      /* No link to it (an overlay): what failed first may still be on
       * its way through the others; wait a grace period for it. */
      if (l->susp_due[c->rank] == 0) {
        l->susp[c->rank] = c->f;
        l->susp_due[c->rank] = uvccl__now_ms() + l->grace_ms;
        if (!uv_is_active((uv_handle_t *)&l->susp_timer))
          uv_timer_start(&l->susp_timer, on_susp, l->grace_ms, 0);
      }
      break;
    }
    if (k == NULL || k->state != LK_UP) {
      if (c->f.cause == UVCCL_FAIL_LEFT) {
        l->dead[c->rank] = 2;
        post_simple(l, UVCCL__LIVE_LEFT, c->rank, NULL);
      } else {
        declare(l, &c->f, 1);
      }
      break;
    }
    if (k->suspected) break;
    k->suspected = 1;
    k->suspicion = c->f;
    uv_timer_start(&k->timer, on_grace, l->grace_ms, 0);
    break;
  case CMD_DECLARE:
    if (!l->closing) declare(l, &c->f, 1);
    break;
  case CMD_CLOSE:
    close_all(l, c->bye);
    break;
  }
  uvccl__free(c);
}

static int post_cmd(uvccl__live_t *l, cmd_t *c) {
  c->l = l;
  c->item.fn = cmd_run;
  return uvccl__xqueue_post(&l->cmdq, &c->item);
}

/* ---- teardown ----------------------------------------------------------------------- */

static void on_bye_timeout(uv_timer_t *t) { link_close(t->data); }

static void close_all(uvccl__live_t *l, int bye) {
  link_t *k;
  if (l->closing) return;
  l->closing = 1;
  uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
  uv_close((uv_handle_t *)&l->listener, NULL);
  while (l->tls_accepts != NULL) {
    live_tls_accept_t *a = l->tls_accepts;
    l->tls_accepts = a->next;
    uvccl__tls_cancel(a->hs);
    uvccl__free(a);
  }
  for (k = l->all; k != NULL; k = k->next)
    if (k->tls_hs != NULL) {
      uvccl__tls_cancel(k->tls_hs);
      k->tls_hs = NULL;
    }
  for (k = l->all; k != NULL; k = k->next) {
    if (k->state == LK_UP && bye && k->tcp_open) {
      uv_os_fd_t fd;
      /* Goodbye (already written by uvccl__live_bye), then half-close and
       * wait for the peer's EOF (closing with unread data would reset the
       * connection, and the peer could lose the goodbye). */
      if (uv_fileno((uv_handle_t *)&k->tcp, &fd) == 0) shutdown(fd, SHUT_WR);
      link_set_fd(k, -1);
      k->closing_bye = 1;
      uv_timer_start(&k->timer, on_bye_timeout, 1000, 0);
      continue;
    }
    link_close(k);
  }
  for (k = l->all; k != NULL; k = k->next)
    if (k->timer_open && !k->closing_bye) {
      k->timer_open = 0;
      uv_close((uv_handle_t *)&k->timer, NULL);
    }
  uvccl__xqueue_close(&l->cmdq, NULL, NULL);
}

static void thread_main(void *arg) {
  uvccl__live_t *l = arg;
  link_t *k;
  uv_run(&l->loop, UV_RUN_DEFAULT);
  /* Links that waited for a goodbye's EOF closed their timers last. */
  for (k = l->all; k != NULL; k = k->next)
    if (k->timer_open) {
      k->timer_open = 0;
      uv_close((uv_handle_t *)&k->timer, NULL);
    }
  uv_run(&l->loop, UV_RUN_DEFAULT);
  post_simple(l, UVCCL__LIVE_CLOSED, -1, NULL);
}

/* ---- entry points (application thread) -------------------------------------------------- */

static void live_free(void *arg) {
  uvccl__live_t *l = arg;
  link_t *k, *next;
  for (k = l->all; k != NULL; k = next) {
    next = k->next;
    uvccl__free(k->pend);
    uvccl__free(k);
  }
  uv_mutex_destroy(&l->lock);
  uvccl__tls_ctx_unref(l->tls);
  uvccl__free(l->links);
  uvccl__free(l->dead);
  uvccl__free(l->seen);
  uvccl__free(l->susp);
  uvccl__free(l->susp_due);
  uvccl__free(l);
}

uvccl__live_t *uvccl__live_new(uv_loop_t *app_loop, int rank, int size,
                               const struct sockaddr *addr, uint64_t nonce,
                               const uvccl__auth_key_t *auth,
                               uvccl__tls_ctx_t *tls,
                               uint64_t hb_timeout_ms, int relay,
                               uvccl__live_cb cb,
                               void *arg, int *port, char *err,
                               size_t errlen, int *status) {
  uvccl__live_t *l = uvccl__calloc(1, sizeof(*l));
  struct sockaddr_storage ss;
  int rc, len = sizeof(ss);
  if (l == NULL) {
    snprintf(err, errlen, "out of memory");
    *status = UV_ENOMEM;
    return NULL;
  }
  l->app_loop = app_loop;
  l->cb = cb;
  l->arg = arg;
  l->rank = rank;
  l->size = size;
  l->nonce = nonce;
  if (auth != NULL) l->auth = *auth;
  if (tls != NULL) {
    uvccl__tls_ctx_ref(tls);
    l->tls = tls;
  }
  l->hb_ms = hb_timeout_ms;
  l->relay = relay;
  l->period_ms = hb_timeout_ms ? hb_timeout_ms / 10 : 1000;
  if (l->period_ms < 20) l->period_ms = 20;
  l->grace_ms = hb_timeout_ms ? hb_timeout_ms / 4 : 1000;
  if (l->grace_ms > 1000) l->grace_ms = 1000;
  if (l->grace_ms < 100) l->grace_ms = 100;
  l->links = uvccl__calloc((size_t)size, sizeof(link_t *));
  l->dead = uvccl__calloc((size_t)size, 1);
  if (relay) {
    l->susp = uvccl__calloc((size_t)size, sizeof(*l->susp));
    l->susp_due = uvccl__calloc((size_t)size, sizeof(*l->susp_due));
  }
  if (l->links == NULL || l->dead == NULL ||
      (relay && (l->susp == NULL || l->susp_due == NULL)) ||
      uv_mutex_init(&l->lock) != 0) {
    uvccl__free(l->links);
    uvccl__free(l->dead);
    uvccl__free(l->susp);
    uvccl__free(l->susp_due);
    uvccl__free(l);
    snprintf(err, errlen, "out of memory");
    *status = UV_ENOMEM;
    return NULL;
  }
  rc = uv_loop_init(&l->loop);
  if (rc == 0) rc = uvccl__xqueue_init(&l->loop, &l->cmdq);
  if (rc != 0) {
    snprintf(err, errlen, "starting the monitor's loop: %s",
             uvccl_strerror(rc));
    uv_loop_close(&l->loop);
    live_free(l);
    *status = rc;
    return NULL;
  }
  uv_tcp_init(&l->loop, &l->listener);
  l->listener.data = l;
  uv_timer_init(&l->loop, &l->tick);
  l->tick.data = l;
  uv_timer_init(&l->loop, &l->susp_timer);
  l->susp_timer.data = l;
  memcpy(&ss, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in));
  if (ss.ss_family == AF_INET6) ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
  else ((struct sockaddr_in *)&ss)->sin_port = 0;
  rc = uv_tcp_bind(&l->listener, (struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&l->listener, 4096, on_connection);
  if (rc == 0)
    rc = uv_tcp_getsockname(&l->listener, (struct sockaddr *)&ss, &len);
  if (rc == 0) rc = uvccl__xqueue_init(app_loop, &l->appq);
  if (rc != 0) {
    snprintf(err, errlen, "the monitor's listener: %s", uvccl_strerror(rc));
    uv_close((uv_handle_t *)&l->listener, NULL);
    uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
    uvccl__xqueue_close(&l->cmdq, NULL, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
    live_free(l);
    *status = rc;
    return NULL;
  }
  *port = ntohs(ss.ss_family == AF_INET6
                    ? ((struct sockaddr_in6 *)&ss)->sin6_port
                    : ((struct sockaddr_in *)&ss)->sin_port);
  l->last_tick = uvccl__now_ms(); /* a stop before the first tick counts */
  uv_timer_start(&l->tick, on_tick, l->period_ms, l->period_ms);
  rc = uv_thread_create(&l->thread, thread_main, l);
  if (rc != 0) {
    snprintf(err, errlen, "starting the monitor's thread: %s",
             uvccl_strerror(rc));
    uv_close((uv_handle_t *)&l->listener, NULL);
    uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
    uvccl__xqueue_close(&l->cmdq, NULL, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
    uvccl__xqueue_close(&l->appq, live_free, l);
    *status = rc;
    return NULL;
  }
  l->thread_started = 1;
  return l;
}

void uvccl__live_connect(uvccl__live_t *l, int rank,
                         const struct sockaddr *addr, uint64_t nonce,
                         uint64_t deadline_ms) {
  cmd_t *c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL || l->app_closed) {
    uvccl__free(c);
    return;
  }
  c->kind = CMD_CONNECT;
  c->rank = rank;
  memcpy(&c->addr, addr, addr->sa_family == AF_INET6
                             ? sizeof(struct sockaddr_in6)
                             : sizeof(struct sockaddr_in));
  c->nonce = nonce;
  c->deadline = deadline_ms;
  post_cmd(l, c);
}

static void post_fail_cmd(uvccl__live_t *l, int kind, int rank, int cause,
                          int err, const char *detail) {
  cmd_t *c;
  if (l == NULL || l->app_closed || rank < 0 || rank >= l->size) return;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return;
  c->kind = kind;
  c->rank = rank;
  fail_set(&c->f, rank, l->rank, cause, err, "%s", detail ? detail : "");
  post_cmd(l, c);
}

void uvccl__live_suspect(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail) {
  post_fail_cmd(l, CMD_SUSPECT, rank, cause, err, detail);
}

void uvccl__live_declare(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail) {
  post_fail_cmd(l, CMD_DECLARE, rank, cause, err, detail);
}

void uvccl__live_fail_self(uvccl__live_t *l, int cause, int err,
                           const char *detail) {
  uvccl__fail_t f;
  wire_fail_t w;
  if (l == NULL || l->app_closed) return;
  fail_set(&f, l->rank, l->rank, cause, err, "%s", detail);
  wire_fail(&w, &f);
  send_to_all(l, LF_DEAD, &w, sizeof(w));
}

void uvccl__live_bye(uvccl__live_t *l) {
  if (l == NULL || l->app_closed) return;
  send_to_all(l, LF_BYE, NULL, 0);
}

void uvccl__live_notify(uvccl__live_t *l, const uvccl__notice_t *n) {
  wire_notice_t w;
  if (l == NULL || l->app_closed) return;
  memset(&w, 0, sizeof(w));
  w.what = n->what;
  w.gid = n->gid;
  w.rank = n->rank;
  w.origin = n->origin;
  w.cause = n->cause;
  w.err = n->err;
  memcpy(w.detail, n->detail, sizeof(w.detail));
  w.detail[sizeof(w.detail) - 1] = '\0';
  send_to_all(l, LF_NOTICE, &w, sizeof(w));
}

/* The monitor's CLOSED event: the thread is done; join it, then let the
 * event queue go (its close callback frees everything). */
static void on_app_closed(uvccl__live_t *l) {
  uv_thread_join(&l->thread);
  uv_loop_close(&l->loop);
  uvccl__xqueue_close(&l->appq, live_free, l);
}

void uvccl__live_close(uvccl__live_t *l, int bye) {
  cmd_t *c;
  if (l == NULL || l->app_closed) return;
  l->app_closed = 1;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) {
    /* Out of memory with nothing to ask the thread with: it is left
     * running rather than stopped unsafely. */
    LOG_ERROR("live", "rank %d: out of memory closing the monitor", l->rank);
    return;
  }
  c->kind = CMD_CLOSE;
  c->bye = bye;
  post_cmd(l, c);
}
