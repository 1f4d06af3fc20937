/* The TCP transport's receiving side: each connection's state machine
 * over its read buffer, frames matched against posted receives, early
 * frames held until their receive is posted, and their handing over in
 * slices a turn's worth at a time. */
#include "tcp.h"

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

/* ---- receiving ----------------------------------------------------------- */

/* The least a read in a spent turn takes (see uvccl__turn_allow), and
 * the most one does (less while reads are slow: turn.h's pieces): libuv
 * reads again at once when a read fills its buffer, within the same turn,
 * which looks at its clock between reads (see SENDQ_PIECE in sendq.c). */
#define READ_STEP (64u * 1024)
#define READ_PIECE (128u * 1024)

static size_t read_piece(net_t *net) {
  return uvccl__piece_get(&net->turn.read, READ_PIECE);
}

static size_t read_allow(net_t *net, uint64_t left) {
  size_t n = uvccl__turn_allow(&net->turn, (size_t)left, READ_STEP);
  size_t piece = read_piece(net);
  return n < piece ? n : piece;
}

/* libuv's read follows the buffer at once: a buffer of a piece's worth is
 * timed from here to on_read (turn.h). */
static void read_clock_start(peer_t *p, const uv_buf_t *buf) {
  p->read_c0 = uvccl__piece_timed(&p->net->turn.read, READ_PIECE, buf->len)
                  ? uv_hrtime()
                  : 0;
}

/* libuv reads a socket in a loop of alloc and read callbacks, all one
 * turn (the peer is its key). Once the turn is spent, the next buffer is
 * empty: libuv calls on_read with UV_ENOBUFS and leaves the socket, which
 * is still readable, to the loop's next iteration. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  peer_t *p = h->data;
  uint64_t left = p->rx.cur.len - p->rx.cur_got;
  (void)suggested;
  uvccl__turn_enter(&p->net->turn, UVCCL__SITE_READ, p);
  if (uvccl__turn_spent(&p->net->turn)) {
    buf->base = p->rbuf;
    buf->len = 0;
    p->read_refused = 1;
    return;
  }
  switch (p->rx.rstate) {
  case RS_DIRECT:
    buf->base = p->rx.cur_op->buf + p->rx.cur_got;
    buf->len = read_allow(p->net, left);
    read_clock_start(p, buf);
    return;
  case RS_EARLY:
    buf->base = p->rx.cur_early->data + p->rx.cur_got;
    buf->len = read_allow(p->net, left);
    read_clock_start(p, buf);
    return;
  case RS_REDUCE:
    /* Only this frame's bytes: the reduction consumes them in place. */
    buf->base = p->rbuf + p->rlen;
    buf->len = p->rcap - p->rlen;
    if ((uint64_t)buf->len > left - (p->rlen)) {
      /* rlen bytes of this frame are already buffered */
      buf->len = (size_t)(left - p->rlen);
    }
    /* (each read is reduced at once: a piece, so the turn's clock is read
     * between them) */
    if (buf->len > read_piece(p->net)) buf->len = read_piece(p->net);
    read_clock_start(p, buf);
    return;
  default:
    /* At a frame boundary: read the header and a little more, so a small
     * frame costs one read, but never pull much of a large payload into
     * rbuf, which would cost a second copy to its destination. When the
     * read fills this, libuv reads again at once, straight into place. */
    buf->base = p->rbuf + p->rlen;
    buf->len = p->rcap - p->rlen;
    if (buf->len > UVCCL__HDR_READ) buf->len = UVCCL__HDR_READ;
    return;
  }
}

void uvccl__net_peer_start_read(peer_t *p) {
  if (p->reading || !p->tcp_open) return;
  p->reading = 1;
  uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read);
}

static void op_recv_done(sop_t *op) {
  op->got = op->len;
  op->s->g->net->up->op_done(op);
}

/* ---- early frames ------------------------------------------------------------
 * A frame that arrives before its receive is posted is copied into an early
 * buffer. That is the common case for pipelined collectives (a peer a step
 * ahead), and a large buffer from malloc is fresh pages each time (glibc
 * maps and unmaps it): a page fault per 4 KiB, a large share of a rank's
 * time in a 1 MiB allreduce (bench/notes/shm-history.md). So
 * the net keeps a few freed buffers of EARLY_SPARE_MIN bytes or more for
 * the next frames, EARLY_SPARE_N of them and EARLY_SPARE_BYTES in all,
 * until it closes; smaller ones are malloc's business. */
#define EARLY_SPARE_MIN ((uint64_t)16 * 1024)
#define EARLY_SPARE_N 8u
#define EARLY_SPARE_BYTES ((uint64_t)16 * 1024 * 1024)
/* Small frames (a small collective's, whose peer is a step ahead) are
 * held in buffers of EARLY_SMALL bytes, EARLY_SMALL_N of them kept: no
 * malloc and free for every early 4-byte allreduce. */
#define EARLY_SMALL ((uint64_t)256)
#define EARLY_SMALL_N 16u

static early_t *early_alloc(net_t *net, uint64_t len) {
  early_t **pp, **best = NULL, *st;
  if (len <= EARLY_SMALL) {
    if ((st = net->early_small) != NULL) {
      net->early_small = st->next;
      net->early_small_n--;
    } else {
      st = uvccl__malloc(sizeof(*st) + (size_t)EARLY_SMALL);
      if (st == NULL) return NULL;
    }
    memset(st, 0, sizeof(*st));
    st->cap = EARLY_SMALL;
    return st;
  }
  if (len >= EARLY_SPARE_MIN)
    for (pp = &net->early_spare; *pp != NULL; pp = &(*pp)->next)
      if ((*pp)->cap >= len && (best == NULL || (*pp)->cap < (*best)->cap))
        best = pp;
  if (best != NULL) {
    st = *best;
    *best = st->next;
    net->early_spare_n--;
    net->early_spare_bytes -= st->cap;
  } else if (sizeof(*st) + len >= UVCCL__BIG_MIN) {
    /* (unmapped in slices when it goes: see uvccl__net_early_free) */
    st = uvccl__big_alloc(sizeof(*st) + (size_t)len);
    if (st == NULL) return NULL;
    st->cap = len;
    st->big = 1;
  } else {
    st = uvccl__malloc(sizeof(*st) + (size_t)len);
    if (st == NULL) return NULL;
    st->cap = len;
    st->big = 0;
  }
  {
    uint64_t cap = st->cap;
    uint8_t big = st->big;
    memset(st, 0, sizeof(*st));
    st->cap = cap;
    st->big = big;
  }
  return st;
}

void uvccl__net_early_free(net_t *net, early_t *st) {
  if (st->cap == EARLY_SMALL && net->early_small_n < EARLY_SMALL_N) {
    st->next = net->early_small;
    net->early_small = st;
    net->early_small_n++;
    return;
  }
  if (st->cap >= EARLY_SPARE_MIN && net->early_spare_n < EARLY_SPARE_N &&
      net->early_spare_bytes + st->cap <= EARLY_SPARE_BYTES) {
    st->next = net->early_spare;
    net->early_spare = st;
    net->early_spare_n++;
    net->early_spare_bytes += st->cap;
    return;
  }
  if (st->big) uvccl__net_retire_mem(net, st);
  else uvccl__free(st);
}

/* Takes st out of the list (head, tail); 0 when it was not in it. */
static int early_list_unlink(early_t **head, early_t **tail, early_t *st) {
  early_t **pp = head, *prev = NULL;
  while (*pp != NULL && *pp != st) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (*pp == NULL) return 0;
  *pp = st->next;
  if (*tail == st) *tail = prev;
  st->next = NULL;
  return 1;
}

/* Delivers a complete early frame to the receive that claimed it. */
static void early_deliver(net_t *net, early_t *st, sop_t *op) {
  op->source = st->from;
  if (op->type == SOP_RECV_RED)
    net->up->reduce_in(op, 0, st->data, (size_t)st->len);
  else if (st->len > 0)
    memcpy(op->buf, st->data, (size_t)st->len);
  uvccl__turn_charge(&net->turn, (size_t)st->len);
  op->got = st->len;
  if (op->p2p) op->len = (size_t)st->len;
  net->up->op_done(op);
}

/* ---- handing over ----------------------------------------------------------
 * A receive posted for a frame that came first (an early frame) takes
 * its bytes in slices, a turn's worth a loop iteration, from the
 * slicer (a 256 MiB frame must not be copied in one callback); a frame
 * still arriving then goes on straight into the receive's buffer, so only
 * what came early is copied twice. Small frames are delivered at once. */
#define HANDOFF_INLINE ((uint64_t)64 * 1024)
#define HANDOFF_STEP (64u * 1024) /* a multiple of every element size */

static void handoff_start(net_t *net, early_t *st, sop_t *op, uint64_t upto) {
  st->claim = op;
  st->upto = upto;
  st->done = 0;
  st->next = NULL;
  op->handoff = st;
  op->source = st->from;
  if (op->p2p) op->len = (size_t)st->len;
  if (net->handoffs_tail) net->handoffs_tail->next = st;
  else net->handoffs = st;
  net->handoffs_tail = st;
  net->hooks->slicer_start(net);
}

static void handoff_unlink(net_t *net, early_t *st) {
  early_list_unlink(&net->handoffs, &net->handoffs_tail, st);
}

/* The next slice of the head of the hand-overs; 1 when one ended. */
int uvccl__net_handoff_step(net_t *net) {
  early_t *st = net->handoffs;
  sop_t *op = st->claim;
  size_t n = uvccl__turn_piece(&net->turn, (size_t)(st->upto - st->done),
                               HANDOFF_STEP);
  if (n < st->upto - st->done) n -= n % HANDOFF_STEP;
  if (op->type == SOP_RECV_RED)
    net->up->reduce_in(op, (size_t)st->done, st->data + st->done, n);
  else
    memcpy(op->buf + st->done, st->data + st->done, n);
  uvccl__turn_charge(&net->turn, n);
  st->done += n;
  if (st->done < st->upto) return 0;
  handoff_unlink(net, st);
  op->handoff = NULL;
  /* the frame is all here (early) or its rest went straight in: done;
   * else frame_end finishes it */
  if (st->got == st->len) op_recv_done(op);
  uvccl__net_early_free(net, st);
  return 1;
}

/* A complete early frame to op: small, at once; else in slices. */
static void early_give(net_t *net, early_t *st, sop_t *op) {
  if (st->len <= HANDOFF_INLINE && !uvccl__turn_spent(&net->turn)) {
    early_deliver(net, st, op);
    uvccl__net_early_free(net, st);
    return;
  }
  handoff_start(net, st, op, st->len);
}

/* A receive is no longer interested (its work failed). */
static void handoff_drop(net_t *net, sop_t *op) {
  early_t *st = op->handoff;
  handoff_unlink(net, st);
  op->handoff = NULL;
  uvccl__net_early_free(net, st);
}

/* The rx (a socket's or a ring's) whose current frame st is, or NULL. */
static rx_t *early_rx(peer_t *p, early_t *st) {
  if (p->rx.cur_early == st) return &p->rx;
  if (p->srx.cur_early == st) return &p->srx;
  return NULL;
}

void uvccl__net_early_unlink(peer_t *p, early_t *st) {
  if (!early_list_unlink(&p->early_head, &p->early_tail, st)) return;
  p->early_bytes -= st->len;
  if (p->paused && p->early_bytes <= p->net->early_limit / 2) {
    p->paused = 0;
    uvccl__net_peer_start_read(p);
    p->net->local_xport->kick(p); /* its ring too */
  }
}

/* The receive a frame is for, or NULL. */
static sop_t *match_frame(peer_t *p, const frame_hdr_t *h, group_t **gp) {
  sop_t *op;
  *gp = NULL;
  if (h->kind == FRAME_COLL) {
    /* (a piece may come on any of the rank's connections: the receives
     * are posted on its first) */
    peer_t *o = p->owner != NULL ? p->owner : p;
    for (op = o->posted.head; op != NULL; op = op->next)
      if (op->tag == h->tag && op->s->seq == h->seq &&
          op->piece == h->piece && op->s->g->gid == h->gid)
        return op;
    return NULL;
  }
  *gp = uvccl__net_group(p->net, h->gid);
  if (*gp == NULL) return NULL;
  for (op = (*gp)->p2p.head; op != NULL; op = op->next)
    if (op->tag == h->tag && (op->peer == -1 || op->peer == p->rank))
      return op;
  return NULL;
}

/* A frame does not fit the receive it matched: fail that receive's
 * operation with a message naming the sender (the caller drops the data). */
static int frame_misfit(peer_t *p, sop_t *op, uint64_t len, uint32_t tag) {
  group_t *g = op->s->g;
  char msg[UVCCL_WORK_MSG_LEN];
  if (op->p2p && len > op->len) {
    snprintf(msg, sizeof(msg), "recv: rank %d (%s) sent %llu bytes with tag "
             "%u, more than the %zu-byte buffer", g->inv[p->rank], p->addrstr,
             (unsigned long long)len, tag, op->len);
    p->net->up->op_fail(op->s, UVCCL_ELIMIT, msg);
    return 1;
  }
  if (!op->p2p && len != op->len) {
    snprintf(msg, sizeof(msg), "%s: rank %d (%s) sent %llu bytes where %zu "
             "were expected (mismatched collective or arguments across "
             "ranks?)", op->s->name, g->inv[p->rank], p->addrstr,
             (unsigned long long)len, op->len);
    p->net->up->op_fail(op->s, UVCCL_EMISMATCH, msg);
    return 1;
  }
  return 0;
}

/* Returns 0 to go on with the buffer, or -1 if the peer went away. */
int uvccl__net_frame_begin(peer_t *p, rx_t *rx, const frame_hdr_t *h) {
  net_t *net = p->net;
  group_t *g;
  sop_t *op;
  early_t *st;

  rx->cur = *h;
  rx->cur_got = 0;
  rx->cur_op = NULL;
  rx->cur_early = NULL;
  op = match_frame(p, h, &g);
  if (op != NULL) {
    sop_list_remove(op->list, op);
    if (frame_misfit(p, op, h->len, h->tag)) {
      rx->rstate = h->len ? RS_DISCARD : RS_HDR;
      return 0;
    }
    if (op->p2p) op->len = (size_t)h->len;
    op->source = p->rank;
    if (h->len == 0) {
      rx->rstate = RS_HDR;
      op_recv_done(op);
      return p->state == PEER_UP ? 0 : -1;
    }
    rx->cur_op = op;
    rx->rstate = op->type == SOP_RECV_RED ? RS_REDUCE : RS_DIRECT;
    return 0;
  }
  /* Nobody waits for it yet. Frames of a group that failed are dropped. */
  g = uvccl__net_group(net, h->gid);
  if (g != NULL && g->broken && h->kind == FRAME_COLL) {
    rx->rstate = h->len ? RS_DISCARD : RS_HDR;
    return 0;
  }
  if (h->len > net->early_limit) {
    net->hooks->peer_fail(net, p, UVCCL_ELIMIT,
                          "frame larger than the early frames' limit");
    return -1;
  }
  st = early_alloc(net, h->len);
  if (st == NULL) {
    net->hooks->peer_fail(net, p, UV_ENOMEM,
                          "out of memory holding an early frame");
    return -1;
  }
  st->kind = h->kind;
  st->piece = h->piece;
  st->gid = h->gid;
  st->seq = h->seq;
  st->tag = h->tag;
  st->from = p->rank;
  st->len = h->len;
  st->arrival = ++net->arrivals;
  if (p->early_tail) p->early_tail->next = st;
  else p->early_head = st;
  p->early_tail = st;
  p->early_bytes += st->len;
  if (h->len == 0) {
    rx->rstate = RS_HDR;
    return 0;
  }
  rx->cur_early = st;
  rx->rstate = RS_EARLY;
  return 0;
}

/* The current frame is complete. */
int uvccl__net_frame_end(peer_t *p, rx_t *rx) {
  sop_t *op = rx->cur_op;
  early_t *st = rx->cur_early;
  rx->rstate = RS_HDR;
  rx->cur_op = NULL;
  rx->cur_early = NULL;
  if (op != NULL) {
    /* Its first bytes came early: done once they are handed over. */
    if (op->handoff != NULL) op->handoff->got = op->handoff->len;
    else op_recv_done(op);
  } else if (st != NULL) {
    st->got = st->len;
    if (st->claim != NULL) {
      uvccl__net_early_unlink(p, st);
      early_give(p->net, st, st->claim);
    } else if (p->early_bytes > p->net->early_limit && !p->paused) {
      /* Early arrivals pile up: stop reading this peer until receives
       * catch up (TCP's flow control then slows the sender). */
      p->paused = 1;
      uvccl__net_peer_stop_read(p);
      LOG_WARN("coll", "rank %d: pausing reads from rank %d: %llu bytes "
               "held early", p->net->rank, p->rank,
               (unsigned long long)p->early_bytes);
    }
  }
  return p->state == PEER_UP ? 0 : -1;
}

/* An unnamed connection is refused: it gets the reason, then a
 * half-close; it is closed when its EOF comes (so the reason is not lost
 * to a reset), or after 2 s. */
static void on_reject_drain_timeout(uv_timer_t *t) {
  uvccl__net_peer_close(t->data);
}

static void on_reject_written(uvccl__wreq_t *req, int status) {
  peer_t *p = req->data;
  if (status == 0 && p->tcp_open && uvccl__sendq_shutdown(&p->sendq) == 0) {
    uv_timer_start(&p->retry, on_reject_drain_timeout, 2000, 0);
    return;
  }
  uvccl__net_peer_close(p);
}

static void peer_reject(peer_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sends p->reject as a REJECT frame, then closes (on_reject_written). */
static void send_reject(peer_t *p) {
  frame_hdr_t h;
  size_t n = strlen(p->reject);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_REJECT;
  h.len = n;
  uvccl__frame_encode(p->reject_buf, &h);
  memcpy(p->reject_buf + UVCCL__FRAME_HDR, p->reject, n);
  p->state = PEER_CLOSING;
  if (uvccl__net_peer_write_ctl(p, &p->hello_req, p->reject_buf,
                                UVCCL__FRAME_HDR + n, on_reject_written) != 0)
    uvccl__net_peer_close(p);
}

static void peer_reject(peer_t *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->reject, sizeof(p->reject), fmt, ap);
  va_end(ap);
  LOG_WARN("coll", "rank %d: refusing the connection from %s: %s",
           p->net->rank, p->addrstr, p->reject);
  send_reject(p);
}

/* A misconfigured world (sizes differ, a rank claimed twice): this rank's
 * creation fails with the same words the other side is sent. */
static void net_misconfigured(net_t *net, const char *msg) {
  if (net->mesh_cb != NULL)
    uvccl__net_creation_failed(net, strncmp(msg, "authentication failed", 21)
                                 ? UV_EINVAL : UVCCL_EAUTH,
                        "process group creation failed: %s", msg);
  else
    LOG_WARN("coll", "rank %d: %s", net->rank, msg);
}

/* What both ends' MACs cover besides the nonces: who dials whom, the
 * listener it means, the world, the dialer's address. A proof made for
 * one connection opens no other. */
static void mesh_purpose(const hello_t *h, char *buf, size_t len) {
  snprintf(buf, len, "mesh %u>%u %016llx %u %s", h->from, h->to,
           (unsigned long long)h->to_nonce, h->world, h->addr);
}

/* The acceptor refuses a connection over authentication: the connector
 * is told why (a rank holding another secret then fails with these
 * words), this side logs it, rate-limited, and carries on. */
static void auth_refuse(peer_t *p, const char *why) {
  uvccl__net_refusal_log(p->net, p->addrstr, why);
  snprintf(p->reject, sizeof(p->reject), "authentication failed: %s", why);
  send_reject(p);
}

/* A hello whose sender is known (proven, or no secret in this world):
 * checked against this rank and world, then the connection is adopted. */
static void hello_accept(peer_t *p, hello_t *hello) {
  net_t *net = p->net;
  frame_hdr_t ack;
  char why[256];

  if (hello->to_nonce != net->nonce || hello->to != (uint32_t)net->rank) {
    /* Not meant for this process: an address left in a reused store, or a
     * process of another world. Nothing of ours is wrong. */
    peer_reject(p, "stale or foreign connection: rank %d (%s) is not the "
                "process it dialed (rank %u)", net->rank, net->selfstr,
                hello->to);
    return;
  }
  if (hello->from < (uint32_t)net->size && net->fails[hello->from].rank >= 0) {
    /* A rank declared failed stays out (a joiner of a grow that failed,
     * dialing late): refused, and nothing of this world's is wrong. */
    peer_reject(p, "rank %u (%s) was declared failed: %s", hello->from,
                hello->addr, net->fails[hello->from].detail);
    return;
  }
  if (hello->world != (uint32_t)net->size) {
    snprintf(why, sizeof(why), "world size mismatch: rank %d (%s) was "
             "started with a world of %d, rank %u (%s) with %u", net->rank,
             net->selfstr, net->size, hello->from, hello->addr, hello->world);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  if (hello->from >= (uint32_t)net->size) {
    snprintf(why, sizeof(why), "a process (%s) claims rank %u, outside the "
             "world of %d", hello->addr, hello->from, net->size);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  if (uvccl__hello_stripes(hello) != net->stripes) {
    snprintf(why, sizeof(why), "UVCCL_TCP_STRIPES differs: rank %d (%s) "
             "has %d, rank %u (%s) %d (every rank must have the same)",
             net->rank, net->selfstr, net->stripes, hello->from, hello->addr,
             uvccl__hello_stripes(hello));
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  if (uvccl__hello_lane(hello) > 0) {
    const char *no = uvccl__net_lane_accept(p, (int)hello->from,
                                            uvccl__hello_lane(hello));
    if (no != NULL) peer_reject(p, "%s", no);
    return;
  }
  if (net->sparse && (int)hello->from != net->rank &&
      net->peers[hello->from] != NULL) {
    peer_t *q = net->peers[hello->from];
    if (q->state == PEER_NONE ||
        (q->outgoing && q->state == PEER_CONNECTING &&
         (int)hello->from > net->rank)) {
      uvccl__net_pending_unlink(p);
      uv_timer_stop(&p->retry);
      uvccl__net_peer_takeover(p, q);
      goto adopt;
    }
    if (q->outgoing && (int)hello->from < net->rank &&
        (q->state == PEER_CONNECTING || q->state == PEER_UP)) {
      /* Both dialed: ours (the higher rank's) wins. */
      frame_hdr_t x;
      memset(&x, 0, sizeof(x));
      x.kind = FRAME_CROSSED;
      uvccl__frame_encode(p->reject_buf, &x);
      p->state = PEER_CLOSING;
      if (uvccl__net_peer_write_ctl(p, &p->hello_req, p->reject_buf,
                                    UVCCL__FRAME_HDR, on_reject_written) != 0)
        uvccl__net_peer_close(p);
      return;
    }
  }
  if ((int)hello->from == net->rank || net->peers[hello->from] != NULL) {
    snprintf(why, sizeof(why), "two processes claim rank %u: %s and %s",
             hello->from,
             (int)hello->from == net->rank ? net->selfstr
                                           : net->addrs[hello->from],
             hello->addr);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  uvccl__net_pending_unlink(p);
  uv_timer_stop(&p->retry); /* the handshake deadline */
adopt:
  p->rank = (int)hello->from;
  net->peers[p->rank] = p;
  snprintf(net->addrs[p->rank], sizeof(net->addrs[p->rank]), "%s",
           hello->addr);
  memset(&ack, 0, sizeof(ack));
  ack.kind = FRAME_HELLO_ACK;
  uvccl__frame_encode(p->hello_buf, &ack);
  if (uvccl__net_peer_write_ctl(p, &p->hello_req, p->hello_buf,
                                UVCCL__FRAME_HDR, NULL) != 0) {
    net->hooks->peer_fail(net, p, UV_EPIPE, "sending hello ack failed");
    return;
  }
  uvccl__net_peer_up(p);
}

/* Acceptor, world with a secret: the connector's HELLO carried its nonce;
 * answer with ours and our MAC, and act on nothing until its PROOF. */
static void auth_challenge(peer_t *p, const hello_t *hello,
                           const uint8_t *nc) {
  frame_hdr_t h;
  char purpose[160];
  p->auth_hello = *hello;
  memcpy(p->auth_nc, nc, UVCCL__AUTH_NONCE);
  if (uvccl__auth_random(p->auth_ns, sizeof(p->auth_ns)) != 0) {
    uvccl__net_peer_close(p);
    return;
  }
  mesh_purpose(hello, purpose, sizeof(purpose));
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_CHALLENGE;
  h.len = UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC;
  uvccl__frame_encode(p->auth_buf, &h);
  memcpy(p->auth_buf + UVCCL__FRAME_HDR, p->auth_ns, UVCCL__AUTH_NONCE);
  uvccl__auth_mac(&p->net->auth, "server", purpose, p->auth_nc, p->auth_ns,
                  p->auth_buf + UVCCL__FRAME_HDR + UVCCL__AUTH_NONCE);
  p->auth_step = 1;
  if (uvccl__net_peer_write_ctl(p, &p->auth_req, p->auth_buf,
                                sizeof(p->auth_buf), NULL) != 0)
    uvccl__net_peer_close(p);
}

/* Acceptor: the connector's PROOF. */
static void auth_proof(peer_t *p, const uint8_t *mac) {
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[160];
  mesh_purpose(&p->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&p->net->auth, "client", purpose, p->auth_nc, p->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, mac, sizeof(want))) {
    auth_refuse(p, "wrong proof (the connecting process holds another "
                "secret)");
    return;
  }
  p->auth_step = 2;
  hello_accept(p, &p->auth_hello);
}

/* Connector: the acceptor's CHALLENGE. Its MAC proves it holds the
 * secret; ours goes back. */
static void auth_answer(peer_t *p, const unsigned char *payload) {
  net_t *net = p->net;
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[160];
  frame_hdr_t h;
  memcpy(p->auth_ns, payload, UVCCL__AUTH_NONCE);
  mesh_purpose(&p->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&net->auth, "server", purpose, p->auth_nc, p->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, payload + UVCCL__AUTH_NONCE, sizeof(want))) {
    uvccl__net_creation_failed(
        net, UVCCL_EAUTH,
        "process group creation failed: "
        "rank %d (%s) failed authentication: it holds "
        "another secret (every rank of a world must hold "
        "the same UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)",
        p->rank, p->addrstr);
    net->hooks->peer_fail(net, p, UVCCL_EAUTH, "failed authentication");
    return;
  }
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_PROOF;
  h.len = UVCCL__AUTH_MAC;
  uvccl__frame_encode(p->auth_buf, &h);
  uvccl__auth_mac(&net->auth, "client", purpose, p->auth_nc, p->auth_ns,
                  p->auth_buf + UVCCL__FRAME_HDR);
  p->auth_step = 2;
  if (uvccl__net_peer_write_ctl(p, &p->auth_req, p->auth_buf,
                     UVCCL__FRAME_HDR + UVCCL__AUTH_MAC, NULL) != 0)
    net->hooks->peer_fail(net, p, UV_EPIPE, "sending the proof failed");
}

/* The handshake's frames. Without a secret: HELLO, then HELLO_ACK (or
 * REJECT). With one: HELLO (+ nonce), CHALLENGE, PROOF, HELLO_ACK. */
static void handle_hello(peer_t *p, const frame_hdr_t *h,
                         const unsigned char *payload) {
  net_t *net = p->net;
  hello_t hello;
  hello_verdict_t hv;
  const unsigned char *nonce;
  int offered;

  if (p->outgoing && p->state == PEER_CONNECTING) {
    if (h->kind == FRAME_CHALLENGE && net->auth.set && p->auth_step == 0 &&
        h->len == UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC) {
      auth_answer(p, payload);
      return;
    }
    if (h->kind == FRAME_HELLO_ACK && h->len == 0 &&
        (!net->auth.set || p->auth_step == 2)) {
      if (p->owner != NULL) uvccl__net_lane_up(p);
      else uvccl__net_peer_up(p);
      return;
    }
    if (h->kind == FRAME_HELLO_ACK && net->auth.set) {
      uvccl__net_creation_failed(net, UVCCL_EAUTH,
                                 "process group creation failed: "
                                 "rank %d (%s) accepted the connection without "
                                 "proving the world's secret",
                                 p->rank, p->addrstr);
      net->hooks->peer_fail(net, p, UVCCL_EAUTH, "did not authenticate");
      return;
    }
  }
  if (!p->outgoing && p->rank < 0 && p->auth_step == 1 &&
      h->kind == FRAME_PROOF && h->len == UVCCL__AUTH_MAC) {
    auth_proof(p, payload);
    return;
  }
  hv = uvccl__frame_hello_parse(h, payload, &hello, &offered, &nonce);
  if (h->kind != FRAME_HELLO || p->outgoing || p->rank >= 0 ||
      p->auth_step != 0 || hv == UVCCL__HELLO_BAD_SIZE) {
    if (net->auth.set && p->rank < 0)
      auth_refuse(p, "not the handshake (a stray or hostile connection)");
    else
      net->hooks->peer_fail(net, p, UVCCL_EPROTO,
                            "unexpected handshake frame");
    return;
  }
  if (hv == UVCCL__HELLO_BAD_MAGIC) {
    if (net->auth.set) {
      auth_refuse(p, "not a uvccl peer");
      return;
    }
    net->hooks->peer_fail(net, p, UVCCL_EPROTO, "bad hello");
    return;
  }
  if (hv == UVCCL__HELLO_BAD_VERSION) {
    peer_reject(p, "wire version %u, rank %d speaks %d", hello.version,
                net->rank, UVCCL__WIRE_VERSION);
    return;
  }
  if (net->auth.set) {
    if (!offered) {
      auth_refuse(p, "no secret offered (this world requires one: "
                  "UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)");
      return;
    }
    auth_challenge(p, &hello, nonce);
    return;
  }
  if (offered) {
    char why[256];
    snprintf(why, sizeof(why), "authentication failed: rank %u holds a "
             "secret, rank %d none (every rank must hold the same "
             "UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)", hello.from, net->rank);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  hello_accept(p, &hello);
}

/* What a frame may be on this connection now (frame.c decides). */
static void frame_context(const peer_t *p, frame_ctx_t *ctx) {
  ctx->up = p->state == PEER_UP;
  ctx->outgoing = p->outgoing;
  ctx->sparse = p->net->sparse;
  ctx->creating = p->net->mesh_cb != NULL;
  ctx->world = p->net->size;
  ctx->shm_info = sizeof(uvccl__shm_info_t);
}

/* Consumes what the read buffer holds. */
static void process_rbuf(peer_t *p) {
  size_t pos = 0;
  frame_hdr_t h;

  while (p->state == PEER_UP || p->state == PEER_CONNECTING) {
    size_t avail = p->rlen - pos;
    if (p->rx.rstate == RS_HDR) {
      frame_ctx_t ctx;
      uint64_t need;
      const char *why;
      frame_verdict_t v;
      if (avail < UVCCL__FRAME_HDR) break;
      uvccl__frame_decode(&h, (unsigned char *)p->rbuf + pos);
      frame_context(p, &ctx);
      v = uvccl__frame_classify(&h, &ctx, &need, &why);
      if (v == UVCCL__FRAME_BAD) {
        p->net->hooks->peer_fail(p->net, p, UVCCL_EPROTO, why);
        return;
      }
      if (avail < UVCCL__FRAME_HDR + need) break;
      if (p->owner != NULL && v != UVCCL__FRAME_DATA &&
          v != UVCCL__FRAME_HANDSHAKE && v != UVCCL__FRAME_REJECTED &&
          v != UVCCL__FRAME_LEAVING) {
        /* A lane carries data and goodbyes only. */
        p->net->hooks->peer_fail(p->net, p, UVCCL_EPROTO,
                                 "a control frame on a stripe connection");
        return;
      }
      switch (v) {
      case UVCCL__FRAME_HANDSHAKE:
        pos += UVCCL__FRAME_HDR;
        handle_hello(p, &h, (unsigned char *)p->rbuf + pos);
        /* A failed handshake may have dropped the buffer's contents. */
        if (p->state != PEER_UP && p->state != PEER_CONNECTING) return;
        pos += (size_t)h.len;
        continue;
      case UVCCL__FRAME_REJECTED:
        uvccl__frame_reject_text(&h, (unsigned char *)p->rbuf + pos +
                                         UVCCL__FRAME_HDR,
                                 avail - UVCCL__FRAME_HDR, p->reject,
                                 sizeof(p->reject));
        uvccl__net_creation_failed(p->net,
                            strncmp(p->reject, "authentication failed", 21)
                                ? UV_EINVAL : UVCCL_EAUTH,
                            "process group creation failed: rank %d (%s) "
                            "%s: %s", p->rank, p->addrstr,
                            p->state == PEER_UP ? "gave up"
                                                : "refused the connection",
                            p->reject);
        p->net->hooks->peer_fail(p->net, p, UV_ECONNREFUSED, "refused");
        return;
      case UVCCL__FRAME_CROSSED:
        uvccl__net_peer_crossed(p);
        return;
      case UVCCL__FRAME_AGREE: {
        net_t *net = p->net;
        pos += UVCCL__FRAME_HDR;
        if (net->on_agree != NULL)
          net->on_agree(net, p->rank, &h, (unsigned char *)p->rbuf + pos);
        pos += (size_t)h.len;
        continue;
      }
      case UVCCL__FRAME_SHM_OFFER:
        pos += UVCCL__FRAME_HDR;
        p->net->local_xport->on_frame(p, &h, (unsigned char *)p->rbuf + pos);
        if (p->state != PEER_UP) return;
        pos += (size_t)h.len;
        continue;
      case UVCCL__FRAME_LEAVING:
        /* What it sent through shared memory before leaving is read
         * first (it was in the ring before the goodbye left). */
        p->net->local_xport->drain(p);
        if (p->state != PEER_UP) return;
        p->left = 1;
        pos += UVCCL__FRAME_HDR;
        continue;
      case UVCCL__FRAME_DATA:
      default:
        pos += UVCCL__FRAME_HDR;
        if (uvccl__net_frame_begin(p, &p->rx, &h) != 0) return;
        continue;
      }
    }
    if (avail == 0) break;
    if (p->rx.rstate == RS_REDUCE) {
      sop_t *op = p->rx.cur_op;
      size_t es = op->s->esize ? op->s->esize : 1;
      uint64_t left = p->rx.cur.len - p->rx.cur_got;
      size_t take = avail < left ? avail : (size_t)left;
      size_t whole = take - take % es;
      if (whole == 0) break; /* a partial element: wait for the rest */
      if (((uintptr_t)(p->rbuf + pos)) % 8 != 0) {
        /* Kernels need aligned input: shift the bytes down first. */
        memmove(p->rbuf, p->rbuf + pos, avail);
        p->rlen = avail;
        pos = 0;
      }
      p->net->up->reduce_in(op, (size_t)p->rx.cur_got, p->rbuf + pos, whole);
      pos += whole;
      p->rx.cur_got += whole;
      if (p->rx.cur_got == p->rx.cur.len &&
          uvccl__net_frame_end(p, &p->rx) != 0)
        return;
      continue;
    }
    {
      uint64_t left = p->rx.cur.len - p->rx.cur_got;
      size_t take = avail < left ? avail : (size_t)left;
      if (p->rx.rstate == RS_DIRECT)
        memcpy(p->rx.cur_op->buf + p->rx.cur_got, p->rbuf + pos, take);
      else if (p->rx.rstate == RS_EARLY)
        memcpy(p->rx.cur_early->data + p->rx.cur_got, p->rbuf + pos, take);
      pos += take;
      p->rx.cur_got += take;
      if (p->rx.cur_got == p->rx.cur.len) {
        if (p->rx.rstate == RS_DISCARD) {
          p->rx.rstate = RS_HDR;
        } else if (uvccl__net_frame_end(p, &p->rx) != 0) {
          return;
        }
      }
    }
  }
  if (pos > 0 && p->rbuf != NULL) {
    memmove(p->rbuf, p->rbuf + pos, p->rlen - pos);
    p->rlen -= pos;
  }
}

static void peer_read(peer_t *p, ssize_t n);

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  peer_t *p = s->data;
  net_t *net = p->net;
  (void)buf;
  if (n == UV_ENOBUFS && p->read_refused) {
    p->read_refused = 0; /* the turn was spent: the loop comes back */
  } else {
    if (n > 0) uvccl__turn_charge(&net->turn, (size_t)n);
    if (p->read_c0 != 0 && n > 0)
      uvccl__turn_io(&net->turn, &net->turn.read, READ_PIECE, (size_t)n,
                     uv_hrtime() - p->read_c0);
    p->read_c0 = 0;
    peer_read(p, n);
  }
  uvccl__turn_leave(&net->turn); /* net outlives p's callbacks */
}

static void peer_read(peer_t *p, ssize_t n) {
  net_t *net = p->net;
  uv_stream_t *s = (uv_stream_t *)&p->tcp;
  if (n == 0) return;
  if (n < 0) {
    p->reading = 0;
    uv_read_stop(s);
    if (n == UV_EOF) n = uvccl__eof_cause(&p->tcp);
    if (n == UV_EOF) p->eof = 1;
    if (net->closing || p->state == PEER_CLOSING) {
      uvccl__net_peer_close(p);
      return;
    }
    if (p->state == PEER_DEAD) return;
    /* Frames it put in our inbox before it went are still delivered. */
    if (n == UV_EOF) p->net->local_xport->drain(p);
    if (p->state == PEER_DEAD) return;
    if (net->tls != NULL) {
      /* The TLS session may say why (a refused certificate arrives as an
       * alert after a TLS 1.3 client's handshake). */
      char why[200];
      uv_os_fd_t fd;
      if (uv_fileno((uv_handle_t *)&p->tcp, &fd) == 0 &&
          uvccl__tls_conn_error(fd, why, sizeof(why))) {
        int refused = strstr(why, "alert") != NULL;
        if (refused && p->state == PEER_CONNECTING)
          uvccl__net_creation_failed(net, UVCCL_EAUTH, "process group creation "
                              "failed: rank %d (%s) refused this rank's TLS "
                              "certificate: %s", p->rank, p->addrstr, why);
        net->hooks->peer_fail(net, p, refused ? UVCCL_EAUTH : UVCCL_EPEER,
                              why);
        return;
      }
    }
    net->hooks->peer_fail(net, p, n == UV_EOF ? UVCCL_EPEER : (int)n,
                          n == UV_EOF ? "closed the connection"
                          : "connection failed");
    return;
  }
  if (net->closing || p->state == PEER_CLOSING || p->state == PEER_DEAD) {
    /* Draining before close: whatever arrives is dropped. */
    if (p->rx.rstate == RS_HDR || p->rx.rstate == RS_REDUCE) p->rlen = 0;
    p->rx.rstate = RS_HDR;
    p->rlen = 0;
    p->rx.cur_op = NULL;
    return;
  }
  net->hooks->kick_spin(net);
  switch (p->rx.rstate) {
  case RS_DIRECT:
  case RS_EARLY:
    p->rx.cur_got += (uint64_t)n;
    if (p->rx.cur_got == p->rx.cur.len) {
      if (uvccl__net_frame_end(p, &p->rx) != 0) return;
    }
    return;
  default:
    p->rlen += (size_t)n;
    process_rbuf(p);
    return;
  }
}

/* ---- posting receives ---------------------------------------------------- */

static early_t *early_find(peer_t *p, uint8_t kind, uint32_t gid,
                           uint32_t seq, uint32_t tag) {
  early_t *st;
  for (st = p->early_head; st != NULL; st = st->next)
    if (st->kind == kind && st->gid == gid && st->tag == tag &&
        st->claim == NULL && (kind == FRAME_P2P || st->seq == seq) &&
        st->piece == 0)
      return st;
  return NULL;
}

/* A collective receive's early frame: on the rank's first connection, or
 * (a piece) on any of its connections; *holder: the one it came on. */
static early_t *early_find_coll(peer_t *o, const sop_t *op, peer_t **holder) {
  uint32_t gid = op->s->g->gid, seq = op->s->seq;
  int i;
  for (i = -1; i < (op->piece > 0 ? o->nlanes : 0); i++) {
    peer_t *c = i < 0 ? o : o->lanes[i];
    early_t *st;
    if (c == NULL) continue;
    for (st = c->early_head; st != NULL; st = st->next)
      if (st->kind == FRAME_COLL && st->gid == gid && st->tag == op->tag &&
          st->seq == seq && st->piece == op->piece && st->claim == NULL) {
        *holder = c;
        return st;
      }
  }
  return NULL;
}

/* Hands an early frame to op: small and all here, now; large, in slices
 * (see "handing over"); still arriving, what came so far in slices, the
 * rest straight into op's buffer. */
static void early_take(net_t *net, peer_t *p, early_t *st, sop_t *op) {
  rx_t *rx;
  if (frame_misfit(p, op, st->len, st->tag)) return;
  if (st->got < st->len) {
    size_t es = op->type == SOP_RECV_RED && op->s->esize ? op->s->esize : 1;
    rx = early_rx(p, st);
    /* (a reduction goes on at an element's start only) */
    if (rx == NULL || rx->cur_got % es != 0) {
      st->claim = op; /* frame_end delivers it */
      return;
    }
    uvccl__net_early_unlink(p, st);
    rx->cur_early = NULL;
    rx->cur_op = op;
    rx->rstate = op->type == SOP_RECV_RED ? RS_REDUCE : RS_DIRECT;
    handoff_start(net, st, op, rx->cur_got);
    return;
  }
  uvccl__net_early_unlink(p, st);
  early_give(net, st, op);
}

void uvccl__net_post_recv(net_t *net, sop_t *op) {
  group_t *g = op->s->g;
  peer_t *p;
  early_t *st;

  if (op->p2p) {
    if (op->peer >= 0) {
      p = net->peers[op->peer];
      st = p ? early_find(p, FRAME_P2P, g->gid, 0, op->tag) : NULL;
      if (st != NULL) {
        early_take(net, p, st, op);
        return;
      }
    } else {
      /* Any source: the earliest early frame with this tag wins. */
      early_t *best = NULL;
      peer_t *bestp = NULL;
      int r;
      for (r = 0; r < net->size; r++) {
        p = net->peers[r];
        if (p == NULL || g->inv[r] < 0) continue;
        st = early_find(p, FRAME_P2P, g->gid, 0, op->tag);
        if (st != NULL && (best == NULL || st->arrival < best->arrival)) {
          best = st;
          bestp = p;
        }
      }
      if (best != NULL) {
        early_take(net, bestp, best, op);
        return;
      }
    }
    sop_list_push(&g->p2p, op);
    return;
  }
  p = net->peers[op->peer];
  if (p == NULL)
    p = uvccl__net_peer_need(net, op->peer); /* sparse: it will dial */
  if (p == NULL) {
    net->up->op_fail(op->s, UV_ENOMEM, "out of memory");
    return;
  }
  {
    peer_t *holder = p;
    st = early_find_coll(p, op, &holder);
    if (st != NULL) {
      early_take(net, holder, st, op);
      return;
    }
  }
  sop_list_push(&p->posted, op);
}

int uvccl__net_left_early(net_t *net, const sop_t *op) {
  peer_t *p;
  if (op->peer < 0 || !uvccl__net_left_cleanly(net, op->peer)) return 0;
  if (op->handoff != NULL)
    /* posted, its whole frame here and being handed over in slices */
    return op->handoff->got == op->handoff->len;
  p = net->peers[op->peer];
  if (op->p2p)
    return early_find(p, FRAME_P2P, op->s->g->gid, 0, op->tag) != NULL;
  {
    peer_t *holder;
    return early_find_coll(p, op, &holder) != NULL;
  }
}

size_t uvccl__net_queued(net_t *net, int r) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (p == NULL || !p->sendq_open) return 0;
  return uvccl__sendq_queued(&p->sendq);
}

int uvccl__net_orphan(net_t *net, sop_t *op) {
  peer_t *p = op->peer >= 0 && op->peer < net->size ? net->peers[op->peer]
                                                     : NULL;
  int rc;
  if (!op->writing) return 0;
  if (p != NULL && (op->list == &p->waitq || op->list == &p->stripeq)) {
    sop_list_remove(op->list, op); /* never started: nothing to copy */
    op->writing = 0;
    return 0;
  }
  if (op->via != NULL) p = op->via; /* (a piece: the connection it took) */
  if (p != NULL && (op->list == &p->shm_sendq || p->cma_op == op))
    rc = p->net->local_xport->orphan(p, op);
  else
    rc = p != NULL && p->sendq_open ? uvccl__sendq_orphan(&p->sendq, &op->wreq)
                                 : UV_ENOENT;
  if (rc == 0) {
    op->writing = 0;
    return 0;
  }
  if (p != NULL && p->state == PEER_UP) {
    /* No copy could be made: the frame cannot be finished, so the
     * connection goes (the rank is then declared failed). */
    net->hooks->peer_fail(net, p, rc, "a send could not be detached");
  }
  return rc;
}

/* op is no longer p's business: 1 when it was mid-transfer. */
static int unpost_from(peer_t *p, sop_t *op) {
  early_t *st;
  if (p->rx.cur_op == op) {
    /* Mid-transfer: the rest of the frame is read and dropped, so the
     * stream stays in step and the user's buffer is not touched. */
    p->rx.cur_op = NULL;
    p->rx.rstate = RS_DISCARD;
    return 1;
  }
  if (p->srx.cur_op == op) { /* the same, in the shared-memory ring */
    p->srx.cur_op = NULL;
    p->srx.rstate = RS_DISCARD;
    return 1;
  }
  for (st = p->early_head; st != NULL; st = st->next)
    if (st->claim == op) st->claim = NULL;
  return 0;
}

int uvccl__net_unpost(net_t *net, sop_t *op) {
  int r, i, rc = 0;
  if (op->handoff != NULL) {
    handoff_drop(net, op);
    rc = 1;
  }
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (p == NULL) continue;
    if (unpost_from(p, op)) return 1;
    for (i = 0; p->lanes != NULL && i < net->stripes - 1; i++)
      if (p->lanes[i] != NULL && unpost_from(p->lanes[i], op)) return 1;
  }
  if (op->list != NULL) sop_list_remove(op->list, op);
  return rc;
}
