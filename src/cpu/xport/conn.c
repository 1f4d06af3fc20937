/* The TCP transport's connections: one listener per process, accepting
 * (with refusals logged at a bounded rate), the server side of TLS,
 * dialing with retries, the hello that names a connection's rank, and the
 * lazy connections of sparse worlds. */
#include "tcp.h"

/* ---- listening and accepting --------------------------------------------- */

static void on_handshake_timeout(uv_timer_t *t) {
  peer_t *p = t->data;
  char why[64];
  if (p->rank >= 0 || p->state != PEER_CONNECTING) return;
  snprintf(why, sizeof(why), "no handshake within %d s",
           UVCCL__HANDSHAKE_MS / 1000);
  uvccl__net_refusal_log(p->net, p->addrstr, why);
  uvccl__net_peer_close(p);
}

static void peer_adopt(void *owner, int fd, const char *from);

static void on_refused(void *owner, const char *from, const char *why) {
  uvccl__net_refusal_log(owner, from, why);
}

static void on_connection(uv_stream_t *server, int status) {
  net_t *net = server->data;
  if (status < 0) {
    LOG_WARN("coll", "accept failed: %s", uvccl_strerror(status));
    return;
  }
  uvccl__acceptor_incoming(&net->acceptor, server);
}

/* A new incoming connection: accepted from the listener (fd -1), or the
 * plaintext descriptor of one TLS secured. */
static void peer_adopt(void *owner, int fd, const char *from) {
  net_t *net = owner;
  peer_t *p;
  int rc;
  p = uvccl__net_peer_new(net, -1);
  if (p == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  rc = uvccl__conn_take(net->loop, &p->tcp, (uv_stream_t *)&net->listener,
                        fd);
  p->tcp.data = p;
  p->tcp_open = 1;
  if (rc != 0) {
    uvccl__net_peer_close(p);
    return;
  }
  uvccl__net_peer_sendq_open(p);
  if (from != NULL) {
    snprintf(p->addrstr, sizeof(p->addrstr), "%s", from);
  } else {
    uvccl__peer_addr(&p->tcp, p->addrstr, sizeof(p->addrstr));
  }
  p->state = PEER_CONNECTING;
  p->next_pending = net->pending;
  net->pending = p;
  /* A connection that has not named itself (and proven the secret, where
   * there is one) by then is closed: strays never pile up. */
  uv_timer_start(&p->retry, on_handshake_timeout, UVCCL__HANDSHAKE_MS, 0);
  p->net->hooks->start_read(p);
}


int uvccl__net_listen_tcp(net_t *net, const struct sockaddr *addr,
                          uint64_t hb_ms, char *err, size_t errlen) {
  int rc, len = sizeof(net->self);
  uvccl__acceptor_init(&net->acceptor, net->tls, hb_ms, 0, peer_adopt,
                       on_refused, net);
  uv_tcp_init(net->loop, &net->listener);
  net->listener.data = net;
  net->listener_open = 1;
  rc = uv_tcp_bind(&net->listener, addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&net->listener, 4096,
                              on_connection);
  if (rc == 0)
    rc = uv_tcp_getsockname(&net->listener, (struct sockaddr *)&net->self,
                            &len);
  if (rc != 0) {
    snprintf(err, errlen, "listening on %s: %s", "the chosen address",
             uvccl_strerror(rc));
    return rc;
  }
  uvccl__addr_fmt((struct sockaddr *)&net->self, net->selfstr,
                  sizeof(net->selfstr));
  net->hb_ms = hb_ms;
  rc = net->local_xport->net_init(net, err, errlen);
  if (rc != 0) return rc;
  return 0;
}

/* ---- connecting ---------------------------------------------------------- */

static void connect_start(peer_t *p);

static void on_retry_timer(uv_timer_t *t) {
  peer_t *p = t->data;
  if (p->net->closing || p->state != PEER_CONNECTING) return;
  connect_start(p);
}

static void on_retry_closed(uv_handle_t *h) {
  peer_t *p = h->data;
  net_t *net = p->net;
  net->nclosing--;
  if (net->closing) {
    uvccl__net_maybe_closed(net);
    return;
  }
  if (p->state == PEER_CONNECTING)
    uv_timer_start(&p->retry, on_retry_timer, p->backoff_ms, 0);
}

static void peer_connected(peer_t *p);

static void on_connect(uv_connect_t *req, int status) {
  peer_t *p = req->data;
  net_t *net = p->net;

  if (net->closing || p->state != PEER_CONNECTING) return;
  status = uvccl__dial_status(&p->tcp, status);
  if (status < 0) {
    /* Until the deadline, a refused or unreachable peer is one that has
     * not started listening yet: try again with backoff (10 ms .. 1 s). */
    if (uvccl__now_ms() < p->retry.timeout && status != UV_ECANCELED) {
      uvccl__backoff_next(&p->backoff_ms, 1000);
      p->tcp_open = 0;
      net->nclosing++;
      uv_close((uv_handle_t *)&p->tcp, on_retry_closed);
      return;
    }
    net->hooks->peer_fail(net, p, status, "connect failed");
    return;
  }
  peer_connected(p);
}

/* TLS: the connect and the handshake are done (or failed). */
static void on_tls_connected(void *arg, int status, int fd, const char *msg) {
  peer_t *p = arg;
  net_t *net = p->net;
  p->tls_hs = NULL;
  if (net->closing || p->state != PEER_CONNECTING) {
    if (fd >= 0) close(fd);
    return;
  }
  if (status == UVCCL_EAUTH) {
    uvccl__net_creation_failed(net, UVCCL_EAUTH,
                               "process group creation failed: "
                               "rank %d (%s): %s",
                               p->rank, p->addrstr, msg);
    net->hooks->peer_fail(net, p, UVCCL_EAUTH, msg);
    return;
  }
  if (status < 0) {
    if (uvccl__now_ms() < p->retry.timeout) {
      uvccl__backoff_next(&p->backoff_ms, 1000);
      uv_timer_start(&p->retry, on_retry_timer, p->backoff_ms, 0);
      return;
    }
    net->hooks->peer_fail(net, p, status, msg);
    return;
  }
  uv_tcp_init(net->loop, &p->tcp);
  p->tcp.data = p;
  if (uv_tcp_open(&p->tcp, fd) != 0) {
    close(fd);
    p->tcp_open = 1;
    net->hooks->peer_fail(net, p, UV_EIO, "adopting the TLS connection");
    return;
  }
  p->tcp_open = 1;
  peer_connected(p);
}

/* The connection is made: hello. */
static void peer_connected(peer_t *p) {
  net_t *net = p->net;
  frame_hdr_t h;
  hello_t hello;
  int rc;

  uv_tcp_nodelay(&p->tcp, 1);
  uvccl__net_peer_sendq_open(p);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_HELLO;
  h.len = sizeof(hello);
  if (net->auth.set) {
    if (uvccl__auth_random(p->auth_nc, sizeof(p->auth_nc)) != 0) {
      net->hooks->peer_fail(net, p, UVCCL_EAUTH, "no random nonce");
      return;
    }
    h.len += UVCCL__AUTH_NONCE; /* the nonce follows the hello */
  }
  memset(&hello, 0, sizeof(hello));
  hello.magic = UVCCL__HELLO_MAGIC;
  hello.version = UVCCL__WIRE_VERSION;
  hello.from = (uint32_t)net->rank;
  hello.to = (uint32_t)p->rank;
  hello.to_nonce = p->nonce;
  hello.world = (uint32_t)net->size;
  hello.lanes = uvccl__hello_lanes(p->lane, net->stripes);
  snprintf(hello.addr, sizeof(hello.addr), "%s", net->selfstr);
  uvccl__frame_encode(p->hello_buf, &h);
  memcpy(p->hello_buf + UVCCL__FRAME_HDR, &hello, sizeof(hello));
  if (net->auth.set) {
    memcpy(p->hello_buf + UVCCL__FRAME_HDR + sizeof(hello), p->auth_nc,
           UVCCL__AUTH_NONCE);
    p->auth_hello = hello;
  }
  p->net->hooks->start_read(p);
  rc = uvccl__net_peer_write_ctl(p, &p->hello_req, p->hello_buf,
                      UVCCL__FRAME_HDR + (size_t)h.len, NULL);
  if (rc != 0) net->hooks->peer_fail(net, p, rc, "sending hello failed");
}

static void connect_start(peer_t *p) {
  int rc;
  if (p->net->tls != NULL) {
    rc = uvccl__tls_connect(p->net->tls, p->net->loop,
                            (struct sockaddr *)&p->addr, p->net->hb_ms, 0,
                            on_tls_connected, p, &p->tls_hs);
    if (rc != 0) p->net->hooks->peer_fail(p->net, p, rc, "connect failed");
    return;
  }
  uv_tcp_init(p->net->loop, &p->tcp);
  p->tcp.data = p;
  p->tcp_open = 1;
  p->creq.data = p;
  rc = uv_tcp_connect(&p->creq, &p->tcp, (struct sockaddr *)&p->addr,
                      on_connect);
  if (rc != 0) p->net->hooks->peer_fail(p->net, p, rc, "connect failed");
}

/* A lane's dial (stripe.c), as a rank's. */
void uvccl__net_peer_connect(peer_t *p) { connect_start(p); }

int uvccl__net_connect(net_t *net, int rank, const struct sockaddr *addr,
                       uint64_t nonce, int live_port, uint64_t deadline_ms) {
  peer_t *p;
  if (rank < 0 || rank >= net->size || net->peers[rank] != NULL)
    return UV_EINVAL;
  if (net->live != NULL) {
    struct sockaddr_storage la;
    memcpy(&la, addr, addr->sa_family == AF_INET6
                          ? sizeof(struct sockaddr_in6)
                          : sizeof(struct sockaddr_in));
    if (la.ss_family == AF_INET6)
      ((struct sockaddr_in6 *)&la)->sin6_port = htons((uint16_t)live_port);
    else
      ((struct sockaddr_in *)&la)->sin_port = htons((uint16_t)live_port);
    uvccl__live_connect(net->live, rank, (struct sockaddr *)&la, nonce,
                        deadline_ms);
  }
  p = uvccl__net_peer_new(net, rank);
  if (p == NULL) return UV_ENOMEM;
  p->outgoing = 1;
  p->nonce = nonce;
  p->state = PEER_CONNECTING;
  memcpy(&p->addr, addr,
         addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                     : sizeof(struct sockaddr_in));
  uvccl__addr_fmt(addr, p->addrstr, sizeof(p->addrstr));
  /* The retry timer's due time doubles as the connect deadline. */
  p->retry.timeout = deadline_ms;
  net->peers[rank] = p;
  connect_start(p);
  return 0;
}

/* ---- sparse worlds: lazy connections ------------------------------------------
 * A world above UVCCL_MESH_MAX ranks connects nothing at creation: a
 * schedule's first send to a rank dials it (the address comes from the
 * book, which holds the overlay neighbours' from creation, or else from
 * the store through net->lookup), and a receive
 * from a rank not yet connected waits on a placeholder for the sender's
 * dial. A ring then costs two connections per rank, not N - 1.
 *
 * Two ranks may dial each other at once. The higher rank's connection
 * wins: the lower one adopts it (uvccl__net_peer_takeover moves what waited on its
 * own attempt over) and the higher one refuses the lower's with
 * FRAME_CROSSED, after which the lower waits for the higher's dial. */

int uvccl__net_set_sparse(net_t *net) {
  net->book = uvccl__calloc((size_t)net->size, sizeof(*net->book));
  if (net->book == NULL) return UV_ENOMEM;
  net->sparse = 1;
  return 0;
}

int uvccl__net_book(net_t *net, int rank, const struct sockaddr *addr,
                    uint64_t nonce, int live_port) {
  net_book_t *b;
  if (net->book == NULL || rank < 0 || rank >= net->size) return UV_EINVAL;
  b = &net->book[rank];
  memset(&b->addr, 0, sizeof(b->addr));
  memcpy(&b->addr, addr, addr->sa_family == AF_INET6
                             ? sizeof(struct sockaddr_in6)
                             : sizeof(struct sockaddr_in));
  b->nonce = nonce;
  b->live_port = live_port;
  return 0;
}

int uvccl__overlay_neighbours(int rank, int size, int *out, int max) {
  int n = 0, d, s, j, k, seen;
  for (d = 1; d < size; d *= 2)
    for (s = -1; s <= 1; s += 2) {
      j = ((rank + s * d) % size + size) % size;
      if (j == rank) continue;
      for (seen = 0, k = 0; k < n; k++) seen |= out[k] == j;
      if (!seen && n < max) out[n++] = j;
    }
  return n;
}

void uvccl__net_link_overlay(net_t *net, uint64_t deadline_ms) {
  int nb[128], n, i;
  if (net->live == NULL || net->book == NULL) return;
  n = uvccl__overlay_neighbours(net->rank, net->size, nb, 128);
  net->want_links = n;
  for (i = 0; i < n; i++) {
    net_book_t *b = &net->book[nb[i]];
    struct sockaddr_storage la = b->addr;
    if (nb[i] > net->rank) continue; /* the higher rank dials */
    if (la.ss_family == AF_INET6)
      ((struct sockaddr_in6 *)&la)->sin6_port = htons((uint16_t)b->live_port);
    else
      ((struct sockaddr_in *)&la)->sin_port = htons((uint16_t)b->live_port);
    uvccl__live_connect(net->live, nb[i], (struct sockaddr *)&la, b->nonce,
                        deadline_ms);
  }
  uvccl__net_check_ready(net);
}

void uvccl__net_set_lookup(net_t *net, int (*start)(void *, int),
                           void (*close)(void *), void *arg) {
  net->lookup = start;
  net->lookup_close = close;
  net->lookup_arg = arg;
}

static int booked(const net_t *net, int r) {
  return net->book != NULL && net->book[r].addr.ss_family != 0;
}

/* A placeholder for rank r (sparse worlds): receives post on it, sends
 * queue on it, until a connection to r is up. */
peer_t *uvccl__net_peer_need(net_t *net, int r) {
  peer_t *p = net->peers[r];
  if (p != NULL || !net->sparse) return p;
  p = uvccl__net_peer_new(net, r);
  if (p == NULL) return NULL;
  p->state = PEER_NONE;
  if (booked(net, r))
    uvccl__addr_fmt((struct sockaddr *)&net->book[r].addr, p->addrstr,
                    sizeof(p->addrstr));
  else
    snprintf(p->addrstr, sizeof(p->addrstr), "?");
  net->peers[r] = p;
  return p;
}

/* Dials a placeholder's rank. A refused connect is retried briefly (the
 * monitor reports a dead rank meanwhile). */
#define UVCCL__DIAL_MS 10000
static void peer_dial_booked(peer_t *p) {
  net_t *net = p->net;
  p->nonce = net->book[p->rank].nonce;
  memcpy(&p->addr, &net->book[p->rank].addr, sizeof(p->addr));
  uvccl__addr_fmt((struct sockaddr *)&p->addr, p->addrstr,
                  sizeof(p->addrstr));
  p->retry.timeout = uvccl__now_ms() + UVCCL__DIAL_MS;
  LOG_DEBUG("coll", "rank %d: dialing rank %d (%s)", net->rank, p->rank,
            p->addrstr);
  connect_start(p);
}

void uvccl__net_peer_dial(peer_t *p) {
  net_t *net = p->net;
  int rc;
  if (p->state != PEER_NONE || net->closing) return;
  p->outgoing = 1;
  p->state = PEER_CONNECTING;
  if (booked(net, p->rank)) {
    peer_dial_booked(p);
    return;
  }
  /* Where it is comes from the store first. */
  p->looking = 1;
  rc = net->lookup != NULL ? net->lookup(net->lookup_arg, p->rank)
                           : UV_EINVAL;
  if (rc != 0) {
    p->looking = 0;
    net->hooks->peer_fail(net, p, rc, "its address could not be read from "
                          "the store");
  }
}

void uvccl__net_lookup_done(net_t *net, int r, int status, const char *why) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (p == NULL || !p->looking || net->closing) return;
  p->looking = 0;
  if (p->state != PEER_CONNECTING) return;
  if (status != 0) {
    net->hooks->peer_fail(net, p, status, why);
    return;
  }
  peer_dial_booked(p);
}

static void sop_list_move(sop_list_t *dst, sop_list_t *src) {
  sop_t *op;
  while ((op = src->head) != NULL) {
    sop_list_remove(src, op);
    sop_list_push(dst, op);
  }
}

/* The connection p (incoming, just named) replaces q, this rank's own
 * attempt or placeholder for the same rank: what waits moves over, q
 * goes quietly. */
void uvccl__net_peer_takeover(peer_t *p, peer_t *q) {
  net_t *net = p->net;
  sop_list_move(&p->posted, &q->posted);
  sop_list_move(&p->waitq, &q->waitq);
  p->ctlq = q->ctlq;
  p->ctlq_tail = q->ctlq_tail;
  q->ctlq = q->ctlq_tail = NULL;
  if (q->tls_hs != NULL) {
    uvccl__tls_cancel(q->tls_hs);
    q->tls_hs = NULL;
  }
  net->peers[q->rank] = NULL;
  LOG_DEBUG("coll", "rank %d: rank %d's dial wins over ours", net->rank,
            q->rank);
  /* Its handles may be closing already (a crossed attempt): its memory
   * stays until the net goes, like a named peer's. */
  q->state = PEER_CLOSING;
  q->next_pending = net->retired;
  net->retired = q;
  uv_timer_stop(&q->retry);
  uvccl__net_peer_close_tcp(q);
  if (q->retry_open) {
    q->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&q->retry, uvccl__net_on_peer_closed);
  }
}

static void on_crossed_timeout(uv_timer_t *t) {
  peer_t *p = t->data;
  if (p->state != PEER_CONNECTING || !p->crossed) return;
  p->net->hooks->peer_fail(p->net, p, UV_ETIMEDOUT, "it refused our connection "
                           "as crossed but never connected back");
}

/* Our dial met the other side's (it is the higher rank): wait for its. */
void uvccl__net_peer_crossed(peer_t *p) {
  p->crossed = 1;
  uvccl__net_peer_close_tcp(p);
  uv_timer_start(&p->retry, on_crossed_timeout, UVCCL__DIAL_MS, 0);
}


void uvccl__net_peer_ready(peer_t *p) {
  net_t *net = p->net;
  sop_t *op;
  while ((op = p->waitq.head) != NULL && p->state == PEER_UP) {
    sop_list_remove(&p->waitq, op);
    uvccl__net_send_waited(net, p, op);
  }
}
