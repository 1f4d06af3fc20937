/* The TCPStore client on the caller's loop.
 *
 * Requests are pipelined on one connection and replies come back in order,
 * with one exception the protocol forces on us: a WAIT's reply is deferred
 * until its keys exist, so nothing may be sent after a WAIT until its reply
 * (or, after a timeout, the CANCEL_WAIT handshake) is back. get, multi_get
 * and blocking queue_pop are WAIT followed by the read, as PyTorch's client.
 *
 * SET, APPEND, MULTI_SET and QUEUE_PUSH have no reply on the wire. Their
 * works complete only when a later reply proves the server processed them
 * (it answers in order); when a batch ends with such requests, a probe is
 * appended (PING, or GETNUMKEYS in the 1.13 dialect) so the acknowledgement
 * comes at once. A store acknowledges only what it holds.
 *
 * A work that times out or is cancelled while its request is on the wire
 * leaves a placeholder, so its reply is read and dropped and the stream
 * stays in step. A lost connection fails everything pending with
 * UVCCL_ECONNLOST naming the server; the next operation reconnects.
 *
 * Liveness. While a reply is due, the server must send something within
 * the heartbeat timeout; a WAIT may rightly last longer, so while one is
 * on the wire a PING goes out when the connection has been quiet for a
 * quarter of the timeout. Its echo may come before or after the WAIT's
 * one-byte reply (which is 0 or 1), so its nonce starts with 0xA5, which
 * no WAIT reply does; after the WAIT it is the very next reply, since
 * nothing else was sent between. */
#include "internal.h"
#include "auth.h"
#include "tls/conn.h"
#include "loop/sendq.h"
#include "proto.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_BACKOFF_MS 1000
#define OOB_PING_TAG 0xA5u /* first byte of an out-of-band PING's nonce */

enum { ST_IDLE, ST_RESOLVING, ST_CONNECTING, ST_HANDSHAKE, ST_READY,
       ST_CLOSED, ST_AUTH /* proving the secret, before the handshake */ };

/* An entry of the in-flight FIFO. */
typedef struct {
  uvccl_work_t *work;  /* NULL: internal, or abandoned */
  uint8_t op;          /* what the reply answers */
  uint8_t noreply;     /* SET-like: done when a later reply arrives */
  uint8_t probe;       /* internal PING / GETNUMKEYS / init ADD */
  uint8_t cancelling;  /* WAIT whose CANCEL_WAIT was sent */
  uint8_t stop_seen;   /* cancelling: STOP_WAITING came first */
  size_t nkeys;
} inflight_t;

/* Per-work state, allocated for multi-phase or queued operations. */
typedef struct {
  uvccl__op_t op;
  size_t nkeys;
  int block;
  uint8_t *phase2;     /* the request to send once the WAIT is answered */
  size_t phase2_len;
  uint8_t *req;        /* queued: the encoded request not yet sent */
  size_t req_len;
  uint8_t *rewait;     /* blocking queue_pop: the WAIT, to send again */
  size_t rewait_len;
  int in_flight;       /* its current request is on the wire */
  char key[64];        /* for messages */
} opstate_t;

typedef struct {
  uvccl_store_t *store;
  uv_loop_t *loop;
  char *host;
  int port;
  uvccl_dialect_t dialect;
  int dialect_auto;          /* AUTO asked and the server's not yet known */
  uvccl__auth_key_t auth;    /* the secret's key, when there is one */
  uvccl__tls_ctx_t *tls;     /* TLS to the server, or NULL */
  uvccl__tls_hs_t *tls_hs;   /* its connect and handshake under way */
  int got_reply;             /* this connection brought bytes already */
  uint8_t nc[UVCCL__AUTH_NONCE]; /* this connection's nonce */
  int world_size;
  int registered;            /* "init/" added */
  int state;
  uv_tcp_t tcp;
  int tcp_open;
  int tcp_closing;           /* handles of the last connection still
                                closing (the socket, its output's poll):
                                they cannot be reused until closed */
  uvccl__sendq_t sendq;         /* output without SIGPIPE (sendq.c) */
  int sendq_open;
  int connect_when_closed;
  uv_connect_t creq;
  uv_getaddrinfo_t gai;
  uv_timer_t retry;
  struct addrinfo *addrs, *next_addr;
  uint64_t deadline;
  uint64_t backoff_ms;
  int last_err;
  int connect_attempts;
  uvccl__work_list_t queued; /* not yet sent */
  inflight_t *fl;            /* ring */
  size_t fl_head, fl_len, fl_cap;
  int wait_blocked;          /* a WAIT is on the wire */
  uvccl__obuf_t out, wbuf;
  uvccl__wreq_t wreq;
  int writing;
  uint8_t *in;
  size_t in_len, in_cap;
  uint32_t nonce;
  /* liveness */
  uv_timer_t hb;
  uint64_t hb_ms;            /* 0: off */
  uint64_t last_rx;          /* ms: bytes last came (or the connection) */
  uint64_t ping_sent;        /* ms: an out-of-band PING is due (0: none) */
  uint32_t ping_nonce;
  int handles;               /* open handles, for close */
  uvccl_work_t *connect_work; /* uvccl_tcp_store_connect */
  char name[96];             /* "store HOST:PORT" */
} client_t;

static void client_start_connect(client_t *c);
static void client_pump(client_t *c);
static void client_lost(client_t *c, int err, const char *why);
static void client_flush(client_t *c);

/* ---- in-flight FIFO --------------------------------------------------------- */

static inflight_t *fl_at(client_t *c, size_t i) {
  return &c->fl[(c->fl_head + i) % c->fl_cap];
}

static int fl_push(client_t *c, const inflight_t *e) {
  size_t i;
  inflight_t *n;
  if (c->fl_len == c->fl_cap) {
    size_t cap = c->fl_cap ? c->fl_cap * 2 : 64;
    n = uvccl__malloc(cap * sizeof(*n));
    if (n == NULL) return UV_ENOMEM;
    for (i = 0; i < c->fl_len; i++) n[i] = *fl_at(c, i);
    uvccl__free(c->fl);
    c->fl = n;
    c->fl_cap = cap;
    c->fl_head = 0;
  }
  *fl_at(c, c->fl_len++) = *e;
  return 0;
}

static void fl_pop(client_t *c) {
  c->fl_head = (c->fl_head + 1) % c->fl_cap;
  c->fl_len--;
}

/* ---- works ------------------------------------------------------------------ */

static void op_free(opstate_t *o) {
  if (o == NULL) return;
  uvccl__free(o->phase2);
  uvccl__free(o->req);
  uvccl__free(o->rewait);
  uvccl__free(o);
}

static void work_finish(uvccl_work_t *w, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Completes a work and frees its client state. */
static void work_finish(uvccl_work_t *w, int status, const char *fmt, ...) {
  va_list ap;
  /* Format first: the arguments may point into the state freed below. */
  if (fmt != NULL && uvccl__work_is_live(w)) {
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof(w->msg), fmt, ap);
    va_end(ap);
  }
  op_free(w->priv_[0]);
  w->priv_[0] = NULL;
  uvccl__work_complete(w, status);
}

static void client_abandon(uvccl_work_t *w, int status) {
  client_t *c = w->owner_;
  opstate_t *o = w->priv_[0];
  size_t i;
  inflight_t *e;
  uvccl__obuf_t b = {0};

  if (o != NULL && !o->in_flight) {
    uvccl__work_list_remove(&c->queued, w);
  } else {
    for (i = 0; i < c->fl_len; i++) {
      e = fl_at(c, i);
      if (e->work != w) continue;
      e->work = NULL;
      if (e->op == UVCCL__OP_WAIT && !e->cancelling) {
        if (c->dialect == UVCCL_DIALECT_MODERN) {
          /* The server keeps the registration; CANCEL_WAIT drops it and
           * its WAIT_CANCELED reply tells us where the stream is. */
          e->cancelling = 1;
          if (uvccl__obuf_u8(&b, UVCCL__OP_CANCEL_WAIT) == 0 &&
              uvccl__obuf_bytes(&c->out, b.base, b.len) == 0)
            client_flush(c);
          uvccl__obuf_free(&b);
        } else {
          /* 1.13 has no cancel: a stray reply would come later and
           * desynchronise the stream, so drop the connection. */
          client_lost(c, UVCCL_ECONNLOST, "wait abandoned (1.13 dialect)");
        }
      }
      break;
    }
  }
  if (status == UV_ETIMEDOUT && c->state != ST_READY &&
      c->state != ST_CLOSED && o != NULL && !o->in_flight)
    work_finish(w, status,
                "%s: %s '%s' timed out after %llu ms while connecting "
                "(last error: %s)",
                c->name, w->op, o->key, (unsigned long long)w->timeout_ms_,
                c->last_err ? uvccl_strerror(c->last_err) : "none");
  else if (status == UV_ETIMEDOUT)
    work_finish(w, status, "%s: %s '%s': %s after %llu ms", c->name, w->op,
                o ? o->key : "",
                o && (o->phase2 || o->op == UVCCL__OP_WAIT) ? "wait timeout"
                                                             : "timed out",
                (unsigned long long)w->timeout_ms_);
  else
    work_finish(w, status, NULL);
}

static const struct uvccl__work_ops client_work_ops = {client_abandon, NULL, NULL};

/* ---- output ------------------------------------------------------------------ */

static void client_after_write(uvccl__wreq_t *req, int status) {
  client_t *c = req->data;
  c->writing = 0;
  c->wbuf.len = 0;
  if (status < 0) {
    if (status != UV_ECANCELED) client_lost(c, status, uv_strerror(status));
    return;
  }
  client_flush(c);
}

static void client_flush(client_t *c) {
  uv_buf_t b;
  ssize_t n;
  int rc;
  uvccl__obuf_t t;
  if (c->writing || c->out.len == 0 || !c->sendq_open) return;
  if (c->state != ST_READY && c->state != ST_HANDSHAKE && c->state != ST_AUTH)
    return;
  b = uv_buf_init((char *)c->out.base, (unsigned)c->out.len);
  n = uvccl__sendq_try(&c->sendq, &b, 1);
  if (n < 0) {
    client_lost(c, (int)n, uv_strerror((int)n));
    return;
  }
  if ((size_t)n == c->out.len) {
    c->out.len = 0;
    return;
  }
  t = c->wbuf;
  c->wbuf = c->out;
  c->out = t;
  c->out.len = 0;
  b = uv_buf_init((char *)c->wbuf.base + n, (unsigned)(c->wbuf.len - n));
  c->wreq.data = c;
  rc = uvccl__sendq_write(&c->sendq, &c->wreq, &b, 1, client_after_write);
  if (rc < 0) {
    client_lost(c, rc, uv_strerror(rc));
    return;
  }
  c->writing = 1;
}

/* If the newest request on the wire has no reply, adds a probe whose reply
 * acknowledges it. */
static int client_probe_if_needed(client_t *c) {
  inflight_t e = {0};
  int r;
  if (c->fl_len == 0 || !fl_at(c, c->fl_len - 1)->noreply) return 0;
  e.probe = 1;
  if (c->dialect == UVCCL_DIALECT_MODERN) {
    e.op = UVCCL__OP_PING;
    r = uvccl__obuf_u8(&c->out, UVCCL__OP_PING);
    if (r == 0) r = uvccl__obuf_u32(&c->out, c->nonce);
  } else {
    e.op = UVCCL__OP_GETNUMKEYS;
    r = uvccl__obuf_u8(&c->out, (uint8_t)uvccl__proto_opcode(
                                    c->dialect, UVCCL__OP_GETNUMKEYS));
  }
  return r == 0 ? fl_push(c, &e) : r;
}

static int op_has_no_reply(uvccl__op_t op) {
  return op == UVCCL__OP_SET || op == UVCCL__OP_APPEND ||
         op == UVCCL__OP_MULTI_SET || op == UVCCL__OP_QUEUE_PUSH;
}

/* Puts one work's current request on the wire. */
static int client_send(client_t *c, uvccl_work_t *w, const uint8_t *bytes,
                       size_t len, uvccl__op_t wire_op) {
  opstate_t *o = w->priv_[0];
  inflight_t e = {0};
  int r;
  if (wire_op == UVCCL__OP_WAIT) {
    r = client_probe_if_needed(c);
    if (r != 0) return r;
    c->wait_blocked = 1;
  }
  r = uvccl__obuf_bytes(&c->out, bytes, len);
  if (r != 0) return r;
  e.work = w;
  e.op = (uint8_t)wire_op;
  e.noreply = (uint8_t)op_has_no_reply(wire_op);
  e.nkeys = o ? o->nkeys : 0;
  if (o) o->in_flight = 1;
  return fl_push(c, &e);
}

/* Sends queued works while the connection allows. */
static void client_pump(client_t *c) {
  uvccl_work_t *w;
  opstate_t *o;
  int r;
  if (c->state != ST_READY) return;
  while (!c->wait_blocked && (w = c->queued.head) != NULL) {
    uvccl__work_list_remove(&c->queued, w);
    o = w->priv_[0];
    r = client_send(c, w, o->req, o->req_len,
                    o->phase2 ? UVCCL__OP_WAIT : o->op);
    uvccl__free(o->req);
    o->req = NULL;
    if (r != 0) work_finish(w, r, NULL);
  }
  if (!c->wait_blocked) client_probe_if_needed(c);
  client_flush(c);
}

/* ---- replies ------------------------------------------------------------------ */

static int collect_list(uvccl_work_t *w, const uvccl__proto_reply_t *rep,
                        int strip_slash) {
  uvccl__proto_iter_t it = rep->list;
  const uint8_t *k;
  size_t klen, n = 0;
  int r = uvccl__work_set_values(w, rep->count);
  while (r == 0 && uvccl__proto_iter_next(&it, &k, &klen, NULL, NULL)) {
    if (strip_slash) {
      /* PyTorch's client shows only user keys ("/" + key). */
      if (klen == 0 || k[0] != '/') continue;
      k++;
      klen--;
    }
    r = uvccl__work_set_nth(w, n++, k, klen);
  }
  w->nvalues = n;
  return r;
}

/* Handles the reply to the head entry. */
static void client_on_reply(client_t *c, inflight_t *e,
                            const uvccl__proto_reply_t *rep) {
  uvccl_work_t *w = e->work;
  opstate_t *o = w ? w->priv_[0] : NULL;
  int r = 0;

  if (e->probe) {
    if (e->op == UVCCL__OP_PING && rep->u32 != c->nonce) {
      client_lost(c, UVCCL_EPROTO, "PING answered with the wrong nonce");
      return;
    }
    if (c->state == ST_HANDSHAKE && e->op == UVCCL__OP_PING) {
      c->state = ST_READY;
      c->dialect_auto = 0; /* it answered in the newer dialect */
      c->backoff_ms = 0;
      LOG_DEBUG("store", "%s: connected", c->name);
      if (c->connect_work) {
        uvccl_work_t *cw = c->connect_work;
        c->connect_work = NULL;
        uvccl__work_complete(cw, 0);
      }
    }
    return;
  }
  if (e->op == UVCCL__OP_WAIT) c->wait_blocked = 0;
  if (w == NULL) return; /* abandoned: drop the reply */

  switch (e->op) {
  case UVCCL__OP_WAIT:
    if (o != NULL && o->phase2 != NULL) {
      /* The keys exist: now the read itself, sent at once (it is next). */
      uint8_t *p2 = o->phase2;
      o->phase2 = NULL;
      r = client_send(c, w, p2, o->phase2_len, o->op);
      o->phase2 = p2; /* kept: a blocking pop may have to wait again */
      if (r != 0) work_finish(w, r, NULL);
      return;
    }
    break;
  case UVCCL__OP_CHECK:
    w->result = rep->u8 == UVCCL__CHECK_READY;
    break;
  case UVCCL__OP_GET:
  case UVCCL__OP_COMPARE_SET:
    r = uvccl__work_set_value(w, rep->val, rep->val_len);
    break;
  case UVCCL__OP_ADD:
  case UVCCL__OP_GETNUMKEYS:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_QUEUE_LEN:
    w->result = rep->i64;
    break;
  case UVCCL__OP_QUEUE_POP:
    if (rep->i64 <= 0) {
      if (o != NULL && o->block) {
        /* Another client took the item between our WAIT and POP: wait
         * again rather than fail. */
        o->in_flight = 0;
        o->req = uvccl__malloc(o->rewait_len);
        if (o->req == NULL) {
          r = UV_ENOMEM;
          break;
        }
        memcpy(o->req, o->rewait, o->rewait_len);
        o->req_len = o->rewait_len;
        uvccl__work_list_push(&c->queued, w);
        return;
      }
      work_finish(w, UVCCL_EQEMPTY, "%s: queue '%s' is empty", c->name,
                  o ? o->key : "");
      return;
    }
    r = uvccl__work_set_value(w, rep->val, rep->val_len);
    w->result = rep->i64 - 1;
    break;
  case UVCCL__OP_MULTI_GET:
    r = collect_list(w, rep, 0);
    break;
  case UVCCL__OP_LIST_KEYS:
    r = collect_list(w, rep, 1);
    break;
  default:
    break;
  }
  work_finish(w, r, NULL);
}

/* Parses every complete reply in the input buffer. */
static void client_session(client_t *c);

/* ST_AUTH: the server's CHALLENGE (auth.h). Its MAC checked, the PROOF
 * goes out and the session starts; the bytes used, 0 for more, -1 when
 * the connection was given up. */
static size_t client_auth(client_t *c) {
  uint8_t ns[UVCCL__AUTH_NONCE], mac[UVCCL__AUTH_MAC], want[UVCCL__AUTH_MAC];
  int r = uvccl__auth_read_challenge(c->in, c->in_len, ns, mac);
  if (r == UVCCL__AUTH_NEED) return 0;
  if (r != 0) {
    client_lost(c, UVCCL_EAUTH, "authentication failed: the server did not "
                "answer the authentication (a server without a secret, or "
                "not a uvccl server?)");
    return (size_t)-1;
  }
  uvccl__auth_mac(&c->auth, "server", "store", c->nc, ns, want);
  if (!uvccl__auth_equal(mac, want, sizeof(want))) {
    client_lost(c, UVCCL_EAUTH, "authentication failed: the server holds "
                "another secret (its proof does not match ours)");
    return (size_t)-1;
  }
  uvccl__auth_mac(&c->auth, "client", "store", c->nc, ns, want);
  if (uvccl__obuf_bytes(&c->out, want, sizeof(want)) != 0) {
    client_lost(c, UV_ENOMEM, "out of memory");
    return (size_t)-1;
  }
  client_session(c);
  return UVCCL__AUTH_CHALLENGE_LEN;
}

static void client_parse(client_t *c) {
  size_t off = 0, used;
  uvccl__proto_reply_t rep;
  inflight_t e;
  int r;

  if (c->state == ST_AUTH) {
    size_t n = client_auth(c);
    if (n == 0 || n == (size_t)-1) return;
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    if (c->state == ST_CLOSED || c->state == ST_IDLE) return;
  } else if (!c->auth.set && !c->got_reply &&
             c->in_len >= UVCCL__AUTH_MAGIC_LEN &&
             memcmp(c->in, UVCCL__AUTH_MAGIC, UVCCL__AUTH_MAGIC_LEN) == 0) {
    /* a secured server's refusal, the first bytes of the connection (no
     * reply starts with them: as a length they are far over any limit;
     * they come in one 8-byte write) */
    client_lost(c, UVCCL_EAUTH, "authentication failed: the server requires "
                "a secret (set UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE, or the "
                "store's auth options)");
    return;
  }
  if (c->in_len > 0) c->got_reply = 1;
  for (;;) {
    if (c->ping_sent && off < c->in_len &&
        (c->fl_len == 0 || fl_at(c, 0)->op != UVCCL__OP_WAIT ||
         c->in[off] == OOB_PING_TAG)) {
      /* The echo of the liveness PING (see the top of the file). */
      uint32_t echo;
      if (c->in_len - off < 4) break;
      memcpy(&echo, c->in + off, 4);
      if (echo != c->ping_nonce) {
        client_lost(c, UVCCL_EPROTO, "bad reply to PING");
        return;
      }
      off += 4;
      c->ping_sent = 0;
      continue;
    }
    if (c->fl_len == 0) break;
    e = *fl_at(c, 0);
    if (e.noreply) {
      /* A later reply is here or coming; everything before it is done. */
      if (off == c->in_len) break;
      fl_pop(c);
      if (e.work) work_finish(e.work, 0, NULL);
      continue;
    }
    if (off == c->in_len) break;
    if (e.cancelling) {
      /* CANCEL_WAIT answers 1; a 0 first means the wait was released just
       * before the cancel arrived. */
      uint8_t b = c->in[off++];
      if (b == UVCCL__WAIT_CANCELED) {
        fl_pop(c);
        c->wait_blocked = 0;
      } else if (b != UVCCL__WAIT_STOP_WAITING || e.stop_seen) {
        client_lost(c, UVCCL_EPROTO, "bad reply to CANCEL_WAIT");
        return;
      } else {
        fl_at(c, 0)->stop_seen = 1;
      }
      continue;
    }
    r = uvccl__proto_parse_reply((uvccl__op_t)e.op, e.nkeys, c->in + off,
                                 c->in_len - off, SIZE_MAX / 2, &rep, &used);
    if (r == UVCCL__PROTO_NEED_MORE) break;
    if (r < 0) {
      client_lost(c, r, "malformed reply");
      return;
    }
    fl_pop(c);
    client_on_reply(c, &e, &rep);
    off += used;
    if (c->state != ST_READY && c->state != ST_HANDSHAKE) return;
  }
  if (off > 0) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
  }
  client_pump(c);
}

static void client_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  client_t *c = h->data;
  size_t want = c->in_len + 64 * 1024;
  if (c->in_cap < want) {
    uint8_t *n = uvccl__realloc(c->in, want);
    if (n == NULL) {
      *buf = uv_buf_init(NULL, 0);
      return;
    }
    c->in = n;
    c->in_cap = want;
  }
  *buf = uv_buf_init((char *)c->in + c->in_len,
                     (unsigned)(c->in_cap - c->in_len));
}

static void client_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  client_t *c = s->data;
  if (nread != 0) c->last_rx = uvccl__now_ms();
  if (nread < 0) {
    client_lost(c, nread == UV_EOF ? UVCCL_ECONNLOST : (int)nread,
                nread == UV_EOF ? "closed by the server"
                                : uv_strerror((int)nread));
    return;
  }
  c->in_len += (size_t)nread;
  client_parse(c);
}

/* ---- connection ---------------------------------------------------------------- */

static void client_try_next(client_t *c);

/* The heartbeat (see the top of the file). */
static void client_hb_tick(uv_timer_t *t) {
  client_t *c = t->data;
  uint64_t now = uvccl__now_ms(), quiet = now - c->last_rx;
  int waiting;
  char why[128];
  if (c->state != ST_READY && c->state != ST_HANDSHAKE) return;
  if (c->fl_len == 0 && c->ping_sent == 0) return;
  waiting = c->fl_len > 0 && fl_at(c, 0)->op == UVCCL__OP_WAIT;
  if (c->ping_sent && now - c->ping_sent >= c->hb_ms) {
    snprintf(why, sizeof(why), "the server stopped answering (no reply to a "
             "PING for %.1f s: stopped, hung or unreachable)",
             (double)(now - c->ping_sent) / 1000.0);
    client_lost(c, UV_ETIMEDOUT, why);
    return;
  }
  if (!waiting && quiet >= c->hb_ms) {
    snprintf(why, sizeof(why), "the server stopped answering (nothing for "
             "%.1f s while a reply was due: stopped, hung or unreachable)",
             (double)quiet / 1000.0);
    client_lost(c, UV_ETIMEDOUT, why);
    return;
  }
  if (waiting && !c->ping_sent && quiet >= c->hb_ms / 4 &&
      c->dialect == UVCCL_DIALECT_MODERN && c->state == ST_READY) {
    uint32_t rnd = 0;
    uv_random(NULL, NULL, &rnd, sizeof(rnd), 0, NULL);
    c->ping_nonce = (rnd & ~0xffu) | OOB_PING_TAG;
    if (uvccl__obuf_u8(&c->out, UVCCL__OP_PING) == 0 &&
        uvccl__obuf_u32(&c->out, c->ping_nonce) == 0) {
      c->ping_sent = now;
      client_flush(c);
    }
  }
}

/* Frees the client once closed and nothing is outstanding. */
static void client_maybe_free(client_t *c) {
  uvccl_store_t *s = c->store;
  if (c->state != ST_CLOSED || c->handles > 0) return;
  if (c->addrs) uv_freeaddrinfo(c->addrs);
  uvccl__free(c->host);
  uvccl__free(c->fl);
  uvccl__free(c->in);
  uvccl__obuf_free(&c->out);
  uvccl__obuf_free(&c->wbuf);
  uvccl__tls_ctx_unref(c->tls);
  uvccl__free(c);
  uvccl__store_closed(s);
}

static void conn_part_closed(client_t *c, int conn_part) {
  c->handles--;
  if (conn_part) c->tcp_closing--;
  if (c->state == ST_CLOSED) {
    client_maybe_free(c);
    return;
  }
  if (conn_part && c->tcp_closing == 0 && c->connect_when_closed) {
    c->connect_when_closed = 0;
    client_try_next(c);
  }
}

static void tcp_closed(uv_handle_t *h) {
  client_t *c = h->data;
  conn_part_closed(c, h == (uv_handle_t *)&c->tcp);
}

static void sendq_closed(uvccl__sendq_t *q) { conn_part_closed(q->data, 1); }

static void client_drop_tcp(client_t *c) {
  if (!c->tcp_open) return;
  c->tcp_open = 0;
  if (c->sendq_open) {
    c->sendq_open = 0;
    c->writing = 0;
    c->wbuf.len = 0;
    if (uvccl__sendq_close(&c->sendq, sendq_closed)) {
      c->handles++;
      c->tcp_closing++;
    }
  }
  c->tcp_closing++;
  uv_close((uv_handle_t *)&c->tcp, tcp_closed);
}

/* Fails everything pending with err and closes the connection. */
/* AUTO fell back to the 1.13 dialect: the queued requests were encoded in
 * the newer one. Only the opcode byte differs between the dialects; an
 * operation 1.13 lacks fails with UVCCL_ENOTSUP. */
static int relabel(uint8_t *req, size_t len) {
  int code;
  if (req == NULL || len == 0) return 0;
  code = uvccl__proto_opcode(UVCCL_DIALECT_LEGACY, (uvccl__op_t)req[0]);
  if (code < 0) return UVCCL_ENOTSUP;
  req[0] = (uint8_t)code;
  return 0;
}

static void requeue_legacy(client_t *c) {
  uvccl_work_t *w, *next;
  for (w = c->queued.head; w != NULL; w = next) {
    opstate_t *o = w->priv_[0];
    next = w->next_;
    if (o != NULL && (relabel(o->req, o->req_len) != 0 ||
                      relabel(o->phase2, o->phase2_len) != 0 ||
                      relabel(o->rewait, o->rewait_len) != 0)) {
      uvccl__work_list_remove(&c->queued, w);
      work_finish(w, UVCCL_ENOTSUP, "%s: %s: the server speaks PyTorch "
                  "1.13's dialect, which lacks it", c->name, w->op);
    }
  }
}

static void client_lost(client_t *c, int err, const char *why) {
  uvccl_work_t *w;
  inflight_t e;
  int st = c->state;
  int code = err == UV_ECONNRESET || err == UV_EPIPE || err == UV_EOF
                 ? UVCCL_ECONNLOST
                 : err;

  char tls_why[200];
  if (st == ST_CLOSED || st == ST_IDLE) return;
  if (c->tls != NULL && c->tcp_open) {
    /* With TLS 1.3 a refused certificate arrives as an alert after the
     * client's handshake: the TLS session says so. */
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 &&
        uvccl__tls_conn_error(fd, tls_why, sizeof(tls_why)) &&
        strstr(tls_why, "alert") != NULL) {
      code = UVCCL_EAUTH;
      why = tls_why;
    }
  }
  if (st == ST_AUTH && code == UVCCL_ECONNLOST) {
    /* (a server with another secret is found out by its own proof, which
     * comes first: this one does not speak the exchange at all) */
    code = UVCCL_EAUTH;
    why = "authentication failed: the server closed the connection at our "
          "authentication (a server without a secret, or PyTorch's?)";
  }
  c->state = ST_IDLE;
  c->wait_blocked = 0;
  c->ping_sent = 0;
  uv_timer_stop(&c->hb);
  c->in_len = 0;
  c->out.len = 0;
  client_drop_tcp(c);
  if (st == ST_HANDSHAKE && c->dialect_auto &&
      (err == UV_EOF || err == UV_ECONNRESET || err == UV_EPIPE)) {
    /* AUTO: the newer dialect's opening (VALIDATE, then PING) broke the
     * connection before the PING came back: a PyTorch 1.13 server closes a
     * connection whose request it does not know. Speak the 1.13 dialect on
     * a new connection; nothing queued has been sent, nothing fails. */
    LOG_INFO("store", "%s: the server does not know the newer dialect (%s):"
             " using PyTorch 1.13's", c->name, why);
    c->dialect = UVCCL_DIALECT_LEGACY;
    c->dialect_auto = 0;
    c->registered = 0;
    while (c->fl_len > 0) fl_pop(c); /* the probes: no works */
    requeue_legacy(c);
    client_start_connect(c);
    return;
  }
  LOG_INFO("store", "%s: connection lost: %s", c->name, why);
  while (c->fl_len > 0) {
    e = *fl_at(c, 0);
    fl_pop(c);
    if (e.work)
      work_finish(e.work, code, "%s: connection lost during %s: %s", c->name,
                  e.work->op, why);
  }
  while ((w = uvccl__work_list_pop(&c->queued)) != NULL)
    work_finish(w, code, "%s: connection lost before %s was sent: %s", c->name,
                w->op, why);
  if (c->connect_work) {
    w = c->connect_work;
    c->connect_work = NULL;
    uvccl__work_fail(w, code, "%s: %s", c->name, why);
  }
}

static void client_connect_failed(client_t *c, int err);

static void client_connected(client_t *c);

static void client_on_connect(uv_connect_t *req, int status) {
  client_t *c = req->data;
  if (c->state != ST_CONNECTING) return; /* closing */
  c->got_reply = 0;
  status = uvccl__dial_status(&c->tcp, status);
  if (status < 0) {
    c->last_err = status;
    client_drop_tcp(c);
    client_try_next(c);
    return;
  }
  client_connected(c);
}

/* TLS (tls.h): the connect and the handshake are done, or failed. */
static void client_on_tls(void *arg, int status, int fd, const char *msg) {
  client_t *c = arg;
  c->tls_hs = NULL;
  if (c->state != ST_CONNECTING) { /* closing */
    if (fd >= 0) close(fd);
    return;
  }
  c->got_reply = 0;
  if (status == UVCCL_EAUTH) {
    client_lost(c, UVCCL_EAUTH, msg);
    return;
  }
  if (status < 0) {
    c->last_err = status;
    client_try_next(c);
    return;
  }
  uv_tcp_init(c->loop, &c->tcp);
  c->tcp.data = c;
  c->tcp_open = 1;
  c->handles++;
  if (uv_tcp_open(&c->tcp, fd) != 0) {
    close(fd);
    c->last_err = UV_EIO;
    client_drop_tcp(c);
    client_try_next(c);
    return;
  }
  client_connected(c);
}

/* The connection is made (plain, or TLS's plaintext end). */
static void client_connected(client_t *c) {
  uv_tcp_nodelay(&c->tcp, 1);
  {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
      uvccl__tune_socket(fd, c->hb_ms, 0);
  }
  c->last_rx = uvccl__now_ms();
  c->ping_sent = 0;
  if (c->hb_ms > 0) {
    uint64_t p = c->hb_ms / 4 ? c->hb_ms / 4 : 1;
    uv_timer_start(&c->hb, client_hb_tick, p, p);
  }
  uvccl__sendq_init(&c->sendq, c->loop, &c->tcp);
  c->sendq.data = c;
  c->sendq_open = 1;
  uv_read_start((uv_stream_t *)&c->tcp, client_alloc, client_read);
  if (c->auth.set) {
    /* the secret first: nothing else goes out before the server proved
     * it holds it too */
    uint8_t hello[UVCCL__AUTH_HELLO_LEN];
    if (uvccl__auth_random(c->nc, sizeof(c->nc)) != 0) {
      client_lost(c, UV_EIO, "no random bytes for a nonce");
      return;
    }
    uvccl__auth_hello(hello, c->nc);
    c->state = ST_AUTH;
    if (uvccl__obuf_bytes(&c->out, hello, sizeof(hello)) != 0) {
      client_lost(c, UV_ENOMEM, "out of memory");
      return;
    }
    client_flush(c);
    return;
  }
  client_session(c);
}

/* The session on a connection (authenticated if need be): the newer
 * dialect's opening, or nothing in 1.13's; "init/"; then the queued
 * operations. */
static void client_session(client_t *c) {
  uvccl__store_req_t q = {0};
  inflight_t e = {0};
  c->state = ST_HANDSHAKE;
  if (c->dialect == UVCCL_DIALECT_MODERN) {
    /* VALIDATE (no reply), then PING: its echo proves the round trip. */
    uvccl__obuf_u8(&c->out, UVCCL__OP_VALIDATE);
    uvccl__obuf_u32(&c->out, UVCCL__MAGIC);
    uvccl__obuf_u8(&c->out, UVCCL__OP_PING);
    uvccl__obuf_u32(&c->out, c->nonce);
    e.probe = 1;
    e.op = UVCCL__OP_PING;
    fl_push(c, &e);
  } else {
    c->state = ST_READY;
  }
  if (c->world_size > 0 && !c->registered) {
    /* As PyTorch's client: "init/" is not prefixed. */
    const char *k = "init/";
    q.op = UVCCL__OP_ADD;
    q.key = k;
    q.delta = 1;
    if (uvccl__proto_encode_request(&c->out, c->dialect, &q, NULL) == 0) {
      memset(&e, 0, sizeof(e));
      e.probe = 1;
      e.op = UVCCL__OP_ADD;
      fl_push(c, &e);
      c->registered = 1;
    }
  }
  client_flush(c);
  if (c->state == ST_READY) {
    if (c->connect_work) {
      uvccl_work_t *cw = c->connect_work;
      c->connect_work = NULL;
      uvccl__work_complete(cw, 0);
    }
    client_pump(c);
  }
}

static void client_try_next(client_t *c) {
  int r;
  if (c->tcp_closing) {
    /* The previous connection's handle is still closing. */
    c->connect_when_closed = 1;
    return;
  }
  while (c->next_addr != NULL) {
    struct addrinfo *ai = c->next_addr;
    c->next_addr = ai->ai_next;
    if (c->tls != NULL) {
      c->state = ST_CONNECTING;
      r = uvccl__tls_connect(c->tls, c->loop, ai->ai_addr, c->hb_ms, 0,
                             client_on_tls, c, &c->tls_hs);
      if (r == 0) return;
      c->last_err = r;
      continue;
    }
    uv_tcp_init(c->loop, &c->tcp);
    c->tcp.data = c;
    c->tcp_open = 1;
    c->handles++;
    c->creq.data = c;
    c->state = ST_CONNECTING;
    r = uv_tcp_connect(&c->creq, &c->tcp, ai->ai_addr, client_on_connect);
    if (r == 0) return;
    c->last_err = r;
    client_drop_tcp(c);
  }
  client_connect_failed(c, c->last_err);
}

static void client_retry_cb(uv_timer_t *t) {
  client_t *c = t->data;
  if (c->state == ST_RESOLVING) client_start_connect(c);
}

/* Every address failed: back off and retry until the deadline. */
static void client_connect_failed(client_t *c, int err) {
  uint64_t now = uvccl__now_ms(), delay;
  uvccl_work_t *w;

  c->connect_attempts++;
  if (now < c->deadline) {
    uvccl__backoff_next(&c->backoff_ms, MAX_BACKOFF_MS);
    /* Jitter spreads thousands of clients retrying against one server. */
    delay = c->backoff_ms / 2 + (uint64_t)(rand() % (int)(c->backoff_ms / 2 + 1));
    if (now + delay > c->deadline) delay = c->deadline - now;
    LOG_DEBUG("store", "%s: connect failed (%s), retrying in %llu ms", c->name,
              uvccl_strerror(err), (unsigned long long)delay);
    c->state = ST_RESOLVING;
    uv_timer_start(&c->retry, client_retry_cb, delay, 0);
    return;
  }
  c->state = ST_IDLE;
  c->backoff_ms = 0;
  if (c->addrs) {
    uv_freeaddrinfo(c->addrs);
    c->addrs = c->next_addr = NULL;
  }
  while ((w = uvccl__work_list_pop(&c->queued)) != NULL)
    work_finish(w, err, "%s: could not connect after %d attempts: %s", c->name,
                c->connect_attempts, uvccl_strerror(err));
  if (c->connect_work) {
    w = c->connect_work;
    c->connect_work = NULL;
    uvccl__work_fail(w, err, "%s: could not connect after %d attempts: %s",
                     c->name, c->connect_attempts, uvccl_strerror(err));
  }
}

static void client_on_resolved(uv_getaddrinfo_t *req, int status,
                               struct addrinfo *res) {
  client_t *c = req->data;
  c->handles--;
  if (c->state == ST_CLOSED) {
    if (res) uv_freeaddrinfo(res);
    client_maybe_free(c);
    return;
  }
  if (status < 0) {
    c->last_err = status;
    client_connect_failed(c, status);
    return;
  }
  if (c->addrs) uv_freeaddrinfo(c->addrs);
  c->addrs = c->next_addr = res;
  client_try_next(c);
}

static void client_start_connect(client_t *c) {
  struct addrinfo hints;
  char port[16];
  int r;

  if (c->state == ST_IDLE) {
    uint64_t t = c->store->timeout_ms_;
    c->deadline = t == UVCCL_NO_TIMEOUT ? UINT64_MAX : uvccl__now_ms() + t;
    c->connect_attempts = 0;
  }
  c->state = ST_RESOLVING;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  snprintf(port, sizeof(port), "%d", c->port);
  c->gai.data = c;
  r = uv_getaddrinfo(c->loop, &c->gai, client_on_resolved, c->host, port,
                     &hints);
  if (r != 0) {
    client_connect_failed(c, r);
    return;
  }
  c->handles++;
}

/* ---- the store interface ----------------------------------------------------------- */

static int tcp_submit(uvccl_store_t *s, uvccl_work_t *w,
                      const uvccl__store_req_t *q, uvccl_work_cb cb) {
  client_t *c = s->impl_;
  uvccl__obuf_t b = {0}, b2 = {0};
  uvccl__store_req_t wq = {0};
  opstate_t *o;
  int r, two_phase;
  const char *k;

  if (uvccl__proto_opcode(c->dialect, q->op) < 0) return UVCCL_ENOTSUP;
  if (q->op == UVCCL__OP_MULTI_GET && q->nkeys == 0) return UV_EINVAL;
  two_phase = q->op == UVCCL__OP_GET || q->op == UVCCL__OP_MULTI_GET ||
              (q->op == UVCCL__OP_QUEUE_POP && q->block);
  o = uvccl__calloc(1, sizeof(*o));
  if (o == NULL) return UV_ENOMEM;
  o->op = q->op;
  o->nkeys = q->nkeys;
  o->block = q->block;
  k = q->key ? q->key : (q->nkeys ? q->keys[0] : "");
  snprintf(o->key, sizeof(o->key), "%s%s", k,
           q->key == NULL && q->nkeys > 1 ? ", ..." : "");
  if (two_phase) {
    wq.op = UVCCL__OP_WAIT;
    wq.keys = q->key ? &q->key : q->keys;
    wq.nkeys = q->key ? 1 : q->nkeys;
    r = uvccl__proto_encode_request(&b, c->dialect, &wq, "/");
    if (r == 0) r = uvccl__proto_encode_request(&b2, c->dialect, q, "/");
    o->phase2 = b2.base;
    o->phase2_len = b2.len;
    if (r == 0 && q->op == UVCCL__OP_QUEUE_POP) {
      o->rewait = uvccl__malloc(b.len);
      if (o->rewait == NULL) r = UV_ENOMEM;
      else memcpy(o->rewait, b.base, b.len);
      o->rewait_len = b.len;
    }
  } else {
    r = uvccl__proto_encode_request(&b, c->dialect, q, "/");
  }
  if (r != 0) {
    uvccl__obuf_free(&b);
    op_free(o);
    return r;
  }
  o->req = b.base;
  o->req_len = b.len;
  r = uvccl__work_start(w, s->loop, uvccl__op_name(q->op), &client_work_ops,
                        c, q->timeout_ms, cb);
  if (r != 0) {
    op_free(o);
    return r;
  }
  w->priv_[0] = o;
  uvccl__work_list_push(&c->queued, w);
  if (c->state == ST_IDLE) {
    client_start_connect(c);
  } else if (c->state == ST_RESOLVING || c->state == ST_CONNECTING) {
    /* Joining a connect cycle already under way: it keeps retrying for as
     * long as this work may wait, not just for the works that started it. */
    uint64_t d = uvccl__now_ms() + q->timeout_ms;
    if (q->timeout_ms != UVCCL_NO_TIMEOUT && d > c->deadline) c->deadline = d;
    else if (q->timeout_ms == UVCCL_NO_TIMEOUT) c->deadline = UINT64_MAX;
  } else {
    client_pump(c);
  }
  return 0;
}

static void client_close(uvccl_store_t *s) {
  client_t *c = s->impl_;
  uvccl_work_t *w;
  inflight_t e;

  int resolving = c->state == ST_RESOLVING;
  c->state = ST_CLOSED;
  while (c->fl_len > 0) {
    e = *fl_at(c, 0);
    fl_pop(c);
    if (e.work) work_finish(e.work, UV_ECANCELED, "%s: store closed", c->name);
  }
  while ((w = uvccl__work_list_pop(&c->queued)) != NULL)
    work_finish(w, UV_ECANCELED, "%s: store closed", c->name);
  if (c->connect_work) {
    w = c->connect_work;
    c->connect_work = NULL;
    uvccl__work_fail(w, UV_ECANCELED, "%s: store closed", c->name);
  }
  if (c->addrs) uv_freeaddrinfo(c->addrs);
  c->addrs = c->next_addr = NULL;
  if (resolving) uv_cancel((uv_req_t *)&c->gai);
  if (c->tls_hs != NULL) {
    uvccl__tls_cancel(c->tls_hs);
    c->tls_hs = NULL;
  }
  client_drop_tcp(c);
  uv_close((uv_handle_t *)&c->retry, tcp_closed);
  uv_close((uv_handle_t *)&c->hb, tcp_closed);
}

static const struct uvccl__store_vtable tcp_vtable = {tcp_submit,
                                                      client_close};

int uvccl_tcp_store_init(uv_loop_t *loop, uvccl_store_t *s,
                         const uvccl_tcp_store_options_t *o) {
  client_t *c;
  if (loop == NULL || s == NULL || o == NULL || o->host == NULL ||
      o->port <= 0 || o->port > 65535)
    return UV_EINVAL;
  if (o->dialect != UVCCL_DIALECT_AUTO && o->dialect != UVCCL_DIALECT_MODERN &&
      o->dialect != UVCCL_DIALECT_LEGACY)
    return UV_EINVAL;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return UV_ENOMEM;
  c->host = uvccl__strdup(o->host);
  if (c->host == NULL) {
    uvccl__free(c);
    return UV_ENOMEM;
  }
  c->store = s;
  c->loop = loop;
  c->port = o->port;
  c->dialect = o->dialect == UVCCL_DIALECT_LEGACY ? UVCCL_DIALECT_LEGACY
                                                  : UVCCL_DIALECT_MODERN;
  c->dialect_auto = o->dialect == UVCCL_DIALECT_AUTO;
  {
    char err[256];
    int r = uvccl__auth_key_from_opts(&c->auth, o->auth_token, o->auth_file,
                                      o->auth_none, err, sizeof(err));
    if (r == 0)
      r = uvccl__tls_ctx_new(o->tls_cert, o->tls_key, o->tls_ca,
                             o->tls_none, &c->tls, err, sizeof(err));
    if (r != 0) {
      LOG_ERROR("store", "client: %s", err);
      uvccl__free(c->host);
      uvccl__free(c);
      return r;
    }
  }
  c->world_size = o->world_size;
  c->nonce = (uint32_t)getpid();
  c->state = ST_IDLE;
  snprintf(c->name, sizeof(c->name), "store %s:%d", o->host, o->port);
  uv_timer_init(loop, &c->retry);
  c->retry.data = c;
  uv_timer_init(loop, &c->hb);
  c->hb.data = c;
  c->hb_ms = uvccl__heartbeat_timeout(o->heartbeat_timeout_ms);
  c->handles = 2;
  uvccl__store_init_common(s, loop, UVCCL_STORE_TCP, &tcp_vtable, c);
  if (o->timeout_ms) s->timeout_ms_ = o->timeout_ms;
  return 0;
}

static void connect_abandon(uvccl_work_t *w, int status) {
  client_t *c = w->owner_;
  if (c->connect_work == w) c->connect_work = NULL;
}

static const struct uvccl__work_ops connect_ops = {connect_abandon, NULL, NULL};

int uvccl_tcp_store_connect(uvccl_store_t *s, uvccl_work_t *w,
                            uvccl_work_cb cb) {
  client_t *c;
  int r;
  if (s == NULL || s->type != UVCCL_STORE_TCP || s->impl_ == NULL)
    return UV_EINVAL;
  if (s->closing_) return UVCCL_ECLOSING;
  c = s->impl_;
  if (c->connect_work != NULL) return UVCCL_EBUSY;
  r = uvccl__work_start(w, s->loop, "store.connect", &connect_ops, c,
                        s->timeout_ms_, cb);
  if (r != 0) return r;
  if (c->state == ST_READY) {
    uvccl__work_complete(w, 0);
    return 0;
  }
  c->connect_work = w;
  if (c->state == ST_IDLE) client_start_connect(c);
  return 0;
}

/* "store HOST:PORT", "file store PATH", ...: for messages. */
const char *uvccl__store_describe(const uvccl_store_t *s) {
  while (s != NULL && s->type == UVCCL_STORE_PREFIX)
    s = uvccl__prefix_store_base(s);
  if (s == NULL) return "store";
  switch (s->type) {
  case UVCCL_STORE_TCP:
    return s->impl_ ? ((const client_t *)s->impl_)->name : "TCP store";
  case UVCCL_STORE_FILE:
    return "file store";
  case UVCCL_STORE_HASH:
    return "in-process store";
  default:
    return "store";
  }
}

/* The server host of a TCP store (through prefix stores), or NULL. */
int uvccl__store_auth_key(const uvccl_store_t *s, uvccl__auth_key_t *k) {
  while (s != NULL && s->type == UVCCL_STORE_PREFIX)
    s = uvccl__prefix_store_base(s);
  if (s == NULL || s->type != UVCCL_STORE_TCP || s->impl_ == NULL ||
      !((const client_t *)s->impl_)->auth.set)
    return 0;
  *k = ((const client_t *)s->impl_)->auth;
  return 1;
}

const char *uvccl__store_host(const uvccl_store_t *s) {
  while (s != NULL && s->type == UVCCL_STORE_PREFIX)
    s = uvccl__prefix_store_base(s);
  if (s == NULL || s->type != UVCCL_STORE_TCP || s->impl_ == NULL)
    return NULL;
  return ((const client_t *)s->impl_)->host;
}
