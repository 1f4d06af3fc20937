/* A monitor's link to another rank's monitor: writing frames (from
 * either thread), its life cycle, reading link frames (hello, heartbeats,
 * failure notices, goodbyes), connecting and accepting, with TLS and
 * authentication, retries and refusals logged at a bounded rate. What a
 * link learns goes up through the monitor's table (monitor.h). */
#include "monitor.h"

/* ---- writing (either thread) --------------------------------------------- */

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

void uvccl__mon_link_send(link_t *k, int kind, uint32_t a, uint32_t b,
                          uint32_t c, const void *payload, size_t plen) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD];
  size_t len = uvccl__lframe_build(buf, kind, a, b, c, payload, plen);
  uv_mutex_lock(&k->l->lock);
  link_write_locked(k, buf, len);
  uv_mutex_unlock(&k->l->lock);
}

/* The application's frame to every rank it has a link to, all under one
 * hold of the lock. One at a time, the first rank told could answer
 * before the last is: told that this rank failed (an abort), it says so
 * back, and this monitor, fencing itself, closes the links the others
 * were still to hear it on. They would see only the connections close. */
void uvccl__mon_send_to_all(uvccl__live_t *l, int kind, const void *payload,
                            size_t plen) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD];
  size_t len = uvccl__lframe_build(buf, kind, 0, 0, 0, payload, plen);
  int r;
  uv_mutex_lock(&l->lock);
  for (r = 0; r < l->size; r++)
    if (l->links[r] != NULL) link_write_locked(l->links[r], buf, len);
  uv_mutex_unlock(&l->lock);
}

/* Publishes (fd >= 0) or withdraws (-1) a link's descriptor. */
void uvccl__mon_link_set_fd(link_t *k, int fd) {
  uv_mutex_lock(&k->l->lock);
  k->fd = fd;
  uv_mutex_unlock(&k->l->lock);
}

/* ---- links: life cycle --------------------------------------------------- */

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
void uvccl__mon_link_close(link_t *k) {
  k->state = LK_DOWN;
  uvccl__mon_link_set_fd(k, -1);
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

link_t *uvccl__mon_link_new(uvccl__live_t *l, int rank) {
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

void uvccl__mon_link_up(link_t *k) {
  uvccl__live_t *l = k->l;
  uv_os_fd_t fd = -1;
  k->state = LK_UP;
  k->last_rx = uvccl__now_ms();
  uv_fileno((uv_handle_t *)&k->tcp, &fd);
  uvccl__tune_socket(fd, l->hb_ms, 1);
  uvccl__mon_link_set_fd(k, fd);
  uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_UP, k->rank, NULL);
}


/* ---- links: reading ------------------------------------------------------ */

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
    if (n == UV_EOF) n = uvccl__eof_cause(&k->tcp);
    k->l->up->link_broken(k, (int)n);
    return;
  }
  k->last_rx = uvccl__now_ms();
  k->rlen += (size_t)n;
  while (k->tcp_open) {
    lf_hdr_t h;
    int whole = uvccl__lframe_next((const unsigned char *)k->rbuf + pos,
                                   k->rlen - pos, &h);
    if (whole < 0) {
      LOG_WARN("live", "rank %d: bad frame on the monitor link from %d: "
               "closing it", k->l->rank, k->rank);
      k->l->up->link_broken(k, UVCCL_EPROTO);
      return;
    }
    if (whole == 0) break;
    on_frame(k, &h, k->rbuf + pos + LF_HDR);
    pos += LF_HDR + h.len;
  }
  if (!k->tcp_open) return;
  memmove(k->rbuf, k->rbuf + pos, k->rlen - pos);
  k->rlen -= pos;
}

/* Refused monitor connections are logged, up to 10 a second. */
static void refusal_log(uvccl__live_t *l, const char *why) {
  int unlogged;
  int log = uvccl__refusals_admit(&l->refusals, uvccl__now_ms(), &unlogged);
  if (unlogged > 0)
    LOG_WARN("live", "rank %d: %d more monitor connections refused in the "
             "last second", l->rank, unlogged);
  if (log)
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
  uvccl__mon_link_up(k);
  uvccl__mon_link_send(k, LF_ACK, 0, 0, 0, NULL, 0);
  return;
bad:
  snprintf(why, sizeof(why), "hello from %u to %u, world %u", h->a, h->b,
           h->c);
  refusal_log(l, why);
  uvccl__mon_link_close(k);
}

static void on_hello(link_t *k, const lf_hdr_t *h, const unsigned char *p) {
  uvccl__live_t *l = k->l;
  wire_hello_t hw;
  size_t want = sizeof(hw) + (l->auth.set ? UVCCL__AUTH_NONCE : 0);
  char purpose[96];
  int rc = uvccl__lframe_hello(h, p, want, &hw);
  if (rc == -1) {
    refusal_log(l, l->auth.set ? "no secret offered, or not a uvccl monitor"
                               : "not a uvccl monitor");
    uvccl__mon_link_close(k);
    return;
  }
  if (rc != 0) {
    refusal_log(l, "not a uvccl monitor");
    uvccl__mon_link_close(k);
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
    uvccl__mon_link_close(k);
    return;
  }
  {
    uint8_t c[UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC];
    link_purpose(h, &hw, purpose, sizeof(purpose));
    memcpy(c, k->auth_ns, UVCCL__AUTH_NONCE);
    uvccl__auth_mac(&l->auth, "server", purpose, k->auth_nc, k->auth_ns,
                    c + UVCCL__AUTH_NONCE);
    k->auth_step = 1;
    uvccl__mon_link_send(k, LF_CHALLENGE, 0, 0, 0, c, sizeof(c));
  }
}

/* Listener: the dialer's PROOF. */
static void on_proof(link_t *k, const lf_hdr_t *h, const unsigned char *p) {
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[96];
  if (h->len != UVCCL__AUTH_MAC) {
    refusal_log(k->l, "a malformed proof");
    uvccl__mon_link_close(k);
    return;
  }
  link_purpose(&k->auth_hdr, &k->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&k->l->auth, "client", purpose, k->auth_nc, k->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, p, sizeof(want))) {
    refusal_log(k->l, "authentication failed: wrong proof (another "
                "secret)");
    uvccl__mon_link_close(k);
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
  uvccl__mon_link_send(k, LF_PROOF, 0, 0, 0, want, sizeof(want));
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
      uvccl__mon_link_send(k, LF_NOTICE, h->a, h->b, h->c, p, h->len);
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
      uvccl__mon_link_close(k);
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
        uvccl__mon_link_close(k);
        memset(&ev, 0, sizeof(ev));
        ev.kind = UVCCL__LIVE_LINK_FAILED;
        ev.rank = k->rank;
        ev.fail.err = UVCCL_EAUTH;
        snprintf(ev.msg, sizeof(ev.msg), "%s", msg);
        l->up->post(l, &ev);
      }
    } else if (h->kind == LF_ACK && k->outgoing &&
               (!l->auth.set || k->auth_step == 2)) {
      uvccl__mon_link_up(k);
    } else {
      uvccl__mon_link_close(k);
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
    uvccl__fail_t f;
    if (uvccl__lframe_dead(h, p, k->rank, &f) != 0) return;
    if (f.rank == l->rank) {
      l->up->declare_self_dead(l, &f);
      return;
    }
    /* In a full mesh the sender told everyone; no need to relay (a rank
     * it could not tell finds out for itself: the failed rank's links
     * break). An overlay passes it on, once (declaring ignores
     * repeats). */
    l->up->declare(l, &f, l->relay);
    return;
  }
  case LF_NOTICE: {
    wire_notice_t w;
    uvccl__live_ev_t ev;
    if (uvccl__lframe_notice(h, p, &w) != 0) return;
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
    l->up->post(l, &ev);
    return;
  }
  default:
    return; /* unknown kinds are skipped: newer peers may add some */
  }
}

/* ---- links: connecting --------------------------------------------------- */

static void on_retry(uv_timer_t *t) {
  link_t *k = t->data;
  if (k->l->closing || k->state != LK_CONNECTING) return;
  uvccl__mon_connect_start(k);
}

static void on_retry_closed(uv_handle_t *h) {
  link_t *k = h->data;
  if (k->l->closing || k->state != LK_CONNECTING) return;
  uv_timer_start(&k->timer, on_retry, k->backoff, 0);
}

/* Closes the socket and connects again after a backoff, until the
 * deadline; then the link failed. */
void uvccl__mon_connect_retry(link_t *k) {
  uvccl__live_t *l = k->l;
  uvccl__mon_link_set_fd(k, -1);
  k->rlen = 0;
  if (uvccl__now_ms() < k->deadline) {
    uvccl__backoff_next(&k->backoff, 1000);
    if (k->tcp_open) {
      k->tcp_open = 0;
      uv_close((uv_handle_t *)&k->tcp, on_retry_closed);
    } else {
      uv_timer_start(&k->timer, on_retry, k->backoff, 0); /* TLS */
    }
    return;
  }
  uvccl__mon_link_close(k);
  uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank,
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
    uvccl__mon_link_close(k);
    memset(&ev, 0, sizeof(ev));
    ev.kind = UVCCL__LIVE_LINK_FAILED;
    ev.rank = k->rank;
    ev.fail.err = status == UVCCL_EAUTH ? UVCCL_EAUTH : 0;
    snprintf(ev.msg, sizeof(ev.msg), "the monitor of rank %d: %s", k->rank,
             msg);
    l->up->post(l, &ev);
    return;
  }
  if (status < 0) {
    uvccl__mon_connect_retry(k);
    return;
  }
  uv_tcp_init(&l->loop, &k->tcp);
  k->tcp.data = k;
  k->tcp_open = 1;
  if (uv_tcp_open(&k->tcp, fd) != 0) {
    close(fd);
    uvccl__mon_link_close(k);
    uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank,
                "adopting the TLS connection failed");
    return;
  }
  link_connected(k);
}

static void on_connect(uv_connect_t *req, int status) {
  link_t *k = req->data;
  uvccl__live_t *l = k->l;
  if (l->closing || k->state != LK_CONNECTING) return;
  status = uvccl__dial_status(&k->tcp, status);
  if (status < 0) {
    if (uvccl__now_ms() < k->deadline && status != UV_ECANCELED) {
      uvccl__mon_connect_retry(k);
      return;
    }
    {
      char msg[UVCCL__DETAIL_LEN];
      snprintf(msg, sizeof(msg), "connecting to the monitor of rank %d: %s",
               k->rank, uvccl_strerror(status));
      uvccl__mon_link_close(k);
      uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
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
    if (uv_fileno((uv_handle_t *)&k->tcp, &fd) == 0)
      uvccl__mon_link_set_fd(k, fd);
  }
  memset(&hw, 0, sizeof(hw));
  hw.magic = LINK_MAGIC;
  hw.nonce = k->nonce;
  k->auth_step = 0;
  if (l->auth.set) {
    unsigned char b[sizeof(hw) + UVCCL__AUTH_NONCE];
    if (uvccl__auth_random(k->auth_nc, sizeof(k->auth_nc)) != 0) {
      uvccl__mon_link_close(k);
      uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_FAILED, k->rank,
                             "no random nonce");
      return;
    }
    memset(&k->auth_hdr, 0, sizeof(k->auth_hdr));
    k->auth_hdr.a = (uint32_t)l->rank;
    k->auth_hdr.b = (uint32_t)k->rank;
    k->auth_hdr.c = (uint32_t)l->size;
    k->auth_hello = hw;
    memcpy(b, &hw, sizeof(hw));
    memcpy(b + sizeof(hw), k->auth_nc, UVCCL__AUTH_NONCE);
    uvccl__mon_link_send(k, LF_HELLO, (uint32_t)l->rank, (uint32_t)k->rank,
              (uint32_t)l->size, b, sizeof(b));
  } else {
    uvccl__mon_link_send(k, LF_HELLO, (uint32_t)l->rank, (uint32_t)k->rank,
              (uint32_t)l->size, &hw, sizeof(hw));
  }
  uv_read_start((uv_stream_t *)&k->tcp, link_alloc, link_read);
}

void uvccl__mon_connect_start(link_t *k) {
  int rc;
  if (k->l->tls != NULL) {
    rc = uvccl__tls_connect(k->l->tls, &k->l->loop,
                            (struct sockaddr *)&k->addr, k->l->hb_ms, 1,
                            on_tls_connected, k, &k->tls_hs);
    if (rc != 0) {
      char msg[UVCCL__DETAIL_LEN];
      snprintf(msg, sizeof(msg), "connecting to the monitor of rank %d: %s",
               k->rank, uvccl_strerror(rc));
      uvccl__mon_link_close(k);
      uvccl__mon_post_simple(k->l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
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
    uvccl__mon_link_close(k);
    uvccl__mon_post_simple(k->l, UVCCL__LIVE_LINK_FAILED, k->rank, msg);
  }
}

static void on_handshake_timeout(uv_timer_t *t) {
  link_t *k = t->data;
  if (k->rank >= 0 || k->state != LK_CONNECTING) return;
  refusal_log(k->l, "no handshake in time");
  uvccl__mon_link_close(k);
}



/* A TLS handshake failed: the link never existed. */
void uvccl__mon_on_refused(void *owner, const char *from, const char *why) {
  refusal_log(owner, why);
}

void uvccl__mon_on_connection(uv_stream_t *server, int status) {
  uvccl__live_t *l = server->data;
  if (status < 0 || l->closing) return;
  uvccl__acceptor_incoming(&l->acceptor, server);
}

/* A new incoming link: accepted from the listener (fd -1), or the
 * plaintext descriptor of one TLS secured. */
void uvccl__mon_link_adopt(void *owner, int fd, const char *from) {
  uvccl__live_t *l = owner;
  link_t *k;
  int rc;
  if (fd >= 0 && l->closing) { /* its handshake ended after the close */
    close(fd);
    return;
  }
  k = uvccl__mon_link_new(l, -1);
  if (k == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  rc = uvccl__conn_take(&l->loop, &k->tcp, (uv_stream_t *)&l->listener, fd);
  k->tcp.data = k;
  k->tcp_open = 1;
  if (rc != 0) {
    uvccl__mon_link_close(k);
    return;
  }
  k->state = LK_CONNECTING;
  {
    uv_os_fd_t sfd;
    if (uv_fileno((uv_handle_t *)&k->tcp, &sfd) == 0)
      uvccl__mon_link_set_fd(k, sfd);
  }
  /* One that has not named itself (and proven the secret) by then goes. */
  uv_timer_start(&k->timer, on_handshake_timeout, UVCCL__HANDSHAKE_MS, 0);
  uv_read_start((uv_stream_t *)&k->tcp, link_alloc, link_read);
}
