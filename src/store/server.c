/* The TCPStore server: one libuv loop, any number of clients, both PyTorch
 * dialects detected per connection.
 *
 * Reads land in one shared buffer (only one read callback runs at a time)
 * and requests are parsed straight out of it; only the tail of a request
 * that is still incomplete is copied into the connection's own buffer, and
 * a connection waiting for a large value reads the rest directly into that
 * buffer. Replies are appended to the connection's output buffer and
 * flushed once per loop iteration from a check handle (as Redis writes
 * before sleeping), so pipelined requests and wake-ups share one write.
 * A client that stops reading its replies has its reads paused once its
 * output passes max_output: it cannot grow the server's memory, and it
 * delays nobody else. */
#include "internal.h"
#include "auth.h"
#include "kv.h"
#include "proto.h"
#include "tls/conn.h"
#include "loop/sendq.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK (64 * 1024)
/* A connection keeps at most this much buffer capacity when idle. */
#define IDLE_BUF_KEEP (64 * 1024)
/* The unparsed tail of a request starts this small and grows by reads. */
#define KEEP_MIN 1024
#define GROW_STEP (16 * 1024)
/* How long a graceful shutdown waits for clients that do not read. */
#define SHUTDOWN_GRACE_MS 2000
#define SHUTDOWN_QUIET_MS 100
#define SHUTDOWN_TICK_MS 25

typedef struct server_s server_t;
typedef struct conn_s conn_t;

struct conn_s {
  uv_tcp_t tcp;
  server_t *srv;
  conn_t *next, *prev;       /* all connections */
  conn_t *flush_next;        /* connections with output to flush */
  int in_flush;
  uvccl_dialect_t dialect;   /* AUTO until the first bytes arrive */
  int validated;             /* modern: VALIDATE seen */
  int closing;
  int paused;                /* reads stopped for backpressure */
  int writing;
  int close_after_flush;
  uint64_t last_read;        /* uv_now of its last bytes (closing server) */
  int lingering;             /* half-closed by a closing server: reading
                              * to the client's end, dropping it */
  uint8_t *in;               /* the unparsed tail of the input */
  size_t in_len, in_cap;
  size_t need;               /* bytes needed before parsing again */
  uvccl__obuf_t out;         /* replies not yet handed to the kernel */
  uvccl__obuf_t wbuf;        /* replies being written by wreq */
  uvccl__wreq_t wreq;
  uvccl__sendq_t sendq;         /* output without SIGPIPE (sendq.c) */
  int parts;                 /* handles still closing (socket, poll) */
  uvccl__kv_waiter_t waiter; /* the connection's pending WAIT */
  /* BARRIER: the key and world size this connection waits for. */
  uint8_t *barrier_key;
  size_t barrier_key_len;
  int64_t barrier_world;
  conn_t *barrier_next;
  char peer[64];
  /* authentication: 0 done or not asked, 1 waiting for the HELLO, 2 for
   * the PROOF */
  int auth;
  uint8_t nc[UVCCL__AUTH_NONCE], ns[UVCCL__AUTH_NONCE];
};

struct server_s {
  uvccl_store_server_t *pub;
  uv_loop_t *loop;
  uv_tcp_t listener;
  uv_check_t flush_check;
  uv_timer_t shutdown_timer;
  int shutdown_timer_closed;
  uint64_t closing_since;    /* uv_now when close began */
  uvccl__kv_t *kv;
  uvccl__proto_limits_t limits;
  size_t max_output;
  size_t max_request;
  conn_t *conns;
  conn_t *flush_head;        /* replies to flush, in request order (after */
  conn_t *flush_tail;        /* each read callback, or in the check phase) */
  conn_t *barrier_waiters;
  uint8_t *rbuf;             /* the shared read buffer */
  int rbuf_busy;
  int closing;
  int handles_open;          /* listener + check + connections */
  uvccl_store_server_close_cb close_cb;
  uvccl_store_server_stats_t st;
  uvccl__auth_key_t auth;
  uvccl__refusals_t refusals; /* their log lines, bounded */
  uvccl__tls_ctx_t *tls;     /* TLS for every client, or NULL */
  uvccl__acceptor_t acceptor; /* new clients (TLS first) */
};

static void conn_close(conn_t *c, const char *why);
static void conn_linger(conn_t *c);
static void conn_process(conn_t *c, const uint8_t *data, size_t len,
                         size_t *used);
static void conn_flush(conn_t *c);
static void server_maybe_done(server_t *s);

/* ---- output ---------------------------------------------------------------- */

/* FIFO, so that the client read first is answered first (the list is
 * flushed after each read callback, and holds that connection and the
 * waiters its requests released; see conn_read). */
static void conn_want_flush(conn_t *c) {
  server_t *s = c->srv;
  if (c->in_flush) return;
  c->in_flush = 1;
  c->flush_next = NULL;
  if (s->flush_tail) s->flush_tail->flush_next = c;
  else s->flush_head = c;
  s->flush_tail = c;
}

static void reply_u8(conn_t *c, uint8_t v) {
  if (uvccl__obuf_u8(&c->out, v) != 0) conn_close(c, "out of memory");
  conn_want_flush(c);
}

static void reply_i64(conn_t *c, int64_t v) {
  if (uvccl__obuf_i64(&c->out, v) != 0) conn_close(c, "out of memory");
  conn_want_flush(c);
}

static void reply_bytes(conn_t *c, const void *p, size_t len) {
  if (uvccl__obuf_str(&c->out, p, len) != 0) conn_close(c, "out of memory");
  conn_want_flush(c);
}

static void conn_after_write(uvccl__wreq_t *req, int status) {
  conn_t *c = req->data;
  c->writing = 0;
  c->wbuf.len = 0;
  if (c->wbuf.cap > IDLE_BUF_KEEP) uvccl__obuf_free(&c->wbuf);
  if (c->closing) return; /* the close callback frees the connection */
  if (status < 0) {
    conn_close(c, uv_strerror(status));
    return;
  }
  conn_flush(c);
}

static void conn_resume(conn_t *c);

/* What uv_try_write does with nothing queued, but with sendmsg(): on a
 * socket, write() also passes through the VFS layer (rw_verify_area,
 * fsnotify, the file position lock), which perf puts at ~5% of the
 * server's CPU per operation under load, and raises SIGPIPE when the
 * client has gone. Returns the bytes written, 0 if the socket is full, or
 * a negative libuv error. */
static ssize_t conn_send(conn_t *c, const void *p, size_t len) {
  uv_buf_t b = uv_buf_init((char *)p, (unsigned)len);
  b.len = len;
  return uvccl__sendq_try(&c->sendq, &b, 1);
}

/* Hands pending output to the kernel: a direct send first (the common
 * case writes it all with no request), a queued write for what remains.
 * When the output drains, a connection paused for backpressure resumes and
 * its buffered requests are answered here and now: waiting for the next
 * check phase could wait forever, since a paused connection watches
 * nothing. */
static void conn_flush(conn_t *c) {
  uv_buf_t b;
  ssize_t n;
  int rc;
  uvccl__obuf_t t;

  for (;;) {
    /* Nothing is queued here (one queued write at a time, and none
     * while writing), so a direct send keeps the order. */
    if (c->closing || c->writing) return;
    if (c->out.len > 0) {
      n = conn_send(c, c->out.base, c->out.len);
      if (n < 0) {
        conn_close(c, uv_strerror((int)n));
        return;
      }
      if ((size_t)n < c->out.len) {
        /* Swap buffers: the rest is written from wbuf while new replies
         * collect in out. */
        t = c->wbuf;
        c->wbuf = c->out;
        c->out = t;
        c->out.len = 0;
        b = uv_buf_init((char *)c->wbuf.base + n,
                        (unsigned)(c->wbuf.len - n));
        c->wreq.data = c;
        rc = uvccl__sendq_write(&c->sendq, &c->wreq, &b, 1, conn_after_write);
        if (rc < 0) {
          conn_close(c, uv_strerror(rc));
          return;
        }
        c->writing = 1;
        return;
      }
      c->out.len = 0;
      if (c->out.cap > IDLE_BUF_KEEP) uvccl__obuf_free(&c->out);
    }
    if (!c->paused) break;
    conn_resume(c);
    if (c->out.len == 0) break;
  }
  if (c->close_after_flush && !c->closing && !c->paused) conn_close(c, NULL);
}

static void server_flush(server_t *s) {
  conn_t *c;
  while ((c = s->flush_head) != NULL) {
    s->flush_head = c->flush_next;
    if (s->flush_head == NULL) s->flush_tail = NULL;
    c->in_flush = 0;
    conn_flush(c);
  }
}

/* Replies made outside a read callback (a connection resumed after
 * backpressure, an EOF) go out here, once per loop iteration. */
static void server_flush_cb(uv_check_t *h) { server_flush(h->data); }

/* ---- waits -------------------------------------------------------------- */

static void conn_wake(uvccl__kv_waiter_t *w) {
  conn_t *c = UVCCL__CONTAINER_OF(w, conn_t, waiter);
  if (!c->closing) reply_u8(c, UVCCL__WAIT_STOP_WAITING);
}

static void barrier_release(server_t *s, const uint8_t *k, size_t klen,
                            int64_t count) {
  conn_t **pp = &s->barrier_waiters, *c;
  while ((c = *pp) != NULL) {
    if (c->barrier_key_len == klen && memcmp(c->barrier_key, k, klen) == 0 &&
        count >= c->barrier_world) {
      *pp = c->barrier_next;
      uvccl__free(c->barrier_key);
      c->barrier_key = NULL;
      reply_u8(c, UVCCL__WAIT_STOP_WAITING);
    } else {
      pp = &c->barrier_next;
    }
  }
}

static void barrier_forget(conn_t *c) {
  conn_t **pp = &c->srv->barrier_waiters;
  if (c->barrier_key == NULL) return;
  while (*pp != NULL && *pp != c) pp = &(*pp)->barrier_next;
  if (*pp == c) *pp = c->barrier_next;
  uvccl__free(c->barrier_key);
  c->barrier_key = NULL;
}

/* ---- requests ------------------------------------------------------------ */

static const char *printable_key(const uint8_t *k, size_t len, char *buf,
                                 size_t cap) {
  size_t i, n = len < cap - 1 ? len : cap - 1;
  for (i = 0; i < n; i++) buf[i] = (k[i] >= 32 && k[i] < 127) ? (char)k[i] : '?';
  buf[n] = '\0';
  return buf;
}

static int list_one_key(const void *k, size_t klen, void *arg) {
  conn_t *c = arg;
  return uvccl__obuf_str(&c->out, k, klen);
}

/* Applies one request. Returns 0, or an error after which the connection
 * is closed (as both PyTorch servers do). */
static int conn_handle(conn_t *c, const uvccl__proto_req_t *q) {
  server_t *s = c->srv;
  uvccl__kv_t *kv = s->kv;
  const uint8_t *k, *v;
  size_t klen, vlen;
  const void *cv;
  size_t cvlen;
  int64_t r64;
  void *item;
  uvccl__proto_iter_t it;
  int r = 0, ready;
  char kb[80];

  s->st.requests++;
  switch (q->op) {
  case UVCCL__OP_VALIDATE:
    if (c->dialect != UVCCL_DIALECT_MODERN || c->validated ||
        q->u32 != UVCCL__MAGIC)
      return UVCCL_EPROTO;
    c->validated = 1;
    return 0;
  case UVCCL__OP_PING:
    if (uvccl__obuf_u32(&c->out, q->u32) != 0) return UV_ENOMEM;
    conn_want_flush(c);
    return 0;
  case UVCCL__OP_SET:
    r = uvccl__kv_set(kv, q->key, q->key_len, q->val, q->val_len);
    break;
  case UVCCL__OP_APPEND:
    r = uvccl__kv_append(kv, q->key, q->key_len, q->val, q->val_len);
    break;
  case UVCCL__OP_ADD:
    r = uvccl__kv_add(kv, q->key, q->key_len, q->i64, &r64);
    if (r == 0) reply_i64(c, r64);
    break;
  case UVCCL__OP_COMPARE_SET:
    /* 1.13's server never wakes waiters on compare_set; the libuv one does. */
    r = uvccl__kv_compare_set(kv, q->key, q->key_len, q->exp, q->exp_len,
                              q->val, q->val_len,
                              c->dialect == UVCCL_DIALECT_MODERN, &cv, &cvlen);
    if (r == 0) reply_bytes(c, cv, cvlen);
    break;
  case UVCCL__OP_GET:
    if (uvccl__kv_get(kv, q->key, q->key_len, &cv, &cvlen)) {
      reply_bytes(c, cv, cvlen);
    } else if (c->dialect == UVCCL_DIALECT_LEGACY) {
      /* 1.13's server closes the connection; its client always waits
       * first, so only raw clients get here. */
      LOG_INFO("store", "%s: GET of missing key '%s' (1.13 dialect: closing)",
               c->peer, printable_key(q->key, q->key_len, kb, sizeof(kb)));
      return UVCCL_ENOKEY;
    } else {
      reply_bytes(c, "", 0);
    }
    break;
  case UVCCL__OP_CHECK:
    ready = 1;
    it = q->keys;
    while (uvccl__proto_iter_next(&it, &k, &klen, NULL, NULL))
      if (!uvccl__kv_exists(kv, k, klen)) ready = 0;
    reply_u8(c, ready ? UVCCL__CHECK_READY : UVCCL__CHECK_NOT_READY);
    break;
  case UVCCL__OP_WAIT:
    uvccl__kv_wait_begin(kv, &c->waiter, conn_wake);
    it = q->keys;
    while (r == 0 && uvccl__proto_iter_next(&it, &k, &klen, NULL, NULL))
      r = uvccl__kv_wait_add_key(kv, &c->waiter, k, klen);
    if (r == 0) r = uvccl__kv_wait_end(kv, &c->waiter);
    else uvccl__kv_wait_cancel(kv, &c->waiter);
    if (r == 1) {
      reply_u8(c, UVCCL__WAIT_STOP_WAITING);
      r = 0;
    }
    break;
  case UVCCL__OP_GETNUMKEYS:
    reply_i64(c, (int64_t)uvccl__kv_num_keys(kv));
    break;
  case UVCCL__OP_DELETE_KEY:
    reply_i64(c, uvccl__kv_delete(kv, q->key, q->key_len));
    break;
  case UVCCL__OP_MULTI_GET: {
    /* Size the reply first: listing one large key many times must not
     * make the server build an unbounded reply. */
    uint64_t total = 0;
    it = q->keys;
    while (uvccl__proto_iter_next(&it, &k, &klen, NULL, NULL))
      if (uvccl__kv_get(kv, k, klen, &cv, &cvlen)) total += cvlen + 8;
    if (total > s->max_output) {
      LOG_WARN("store", "%s: MULTI_GET reply of %llu bytes is over the "
               "%zu-byte output limit; closing", c->peer,
               (unsigned long long)total, s->max_output);
      return UVCCL_ELIMIT;
    }
    it = q->keys;
    while (uvccl__proto_iter_next(&it, &k, &klen, NULL, NULL)) {
      if (!uvccl__kv_get(kv, k, klen, &cv, &cvlen)) {
        cv = "";
        cvlen = 0;
      }
      reply_bytes(c, cv, cvlen);
    }
    break;
  }
  case UVCCL__OP_MULTI_SET:
    it = q->keys;
    while (r == 0 && uvccl__proto_iter_next(&it, &k, &klen, &v, &vlen))
      r = uvccl__kv_set(kv, k, klen, v, vlen);
    break;
  case UVCCL__OP_CANCEL_WAIT:
    uvccl__kv_wait_cancel(kv, &c->waiter);
    barrier_forget(c);
    reply_u8(c, UVCCL__WAIT_CANCELED);
    break;
  case UVCCL__OP_QUEUE_PUSH:
    r = uvccl__kv_queue_push(kv, q->key, q->key_len, q->val, q->val_len);
    break;
  case UVCCL__OP_QUEUE_POP:
    r64 = uvccl__kv_queue_pop(kv, q->key, q->key_len, &item, &vlen);
    if (r64 < 0) {
      r = (int)r64;
      break;
    }
    reply_i64(c, r64);
    if (r64 > 0) {
      reply_bytes(c, item, vlen);
      uvccl__free(item);
    }
    break;
  case UVCCL__OP_QUEUE_LEN:
    reply_i64(c, uvccl__kv_queue_len(kv, q->key, q->key_len));
    break;
  case UVCCL__OP_LIST_KEYS:
    reply_i64(c, (int64_t)uvccl__kv_num_keys(kv));
    r = uvccl__kv_foreach_key(kv, list_one_key, c) != 0 ? UV_ENOMEM : 0;
    break;
  case UVCCL__OP_BARRIER:
    r = uvccl__kv_add(kv, q->key, q->key_len, 1, &r64);
    if (r != 0) break;
    if (r64 >= q->i64) {
      reply_u8(c, UVCCL__WAIT_STOP_WAITING);
      barrier_release(s, q->key, q->key_len, r64);
    } else {
      barrier_forget(c);
      c->barrier_key = uvccl__malloc(q->key_len ? q->key_len : 1);
      if (c->barrier_key == NULL) return UV_ENOMEM;
      memcpy(c->barrier_key, q->key, q->key_len);
      c->barrier_key_len = q->key_len;
      c->barrier_world = q->i64;
      c->barrier_next = s->barrier_waiters;
      s->barrier_waiters = c;
    }
    break;
  case UVCCL__OP_WATCH_KEY:
    /* 1.13's C++ watchKey; nothing in its Python API uses it. */
    LOG_WARN("store", "%s: WATCH_KEY is not supported; closing", c->peer);
    return UVCCL_ENOTSUP;
  default:
    return UVCCL_EPROTO;
  }
  if (r != 0)
    LOG_WARN("store", "%s: %s '%s' failed: %s; closing", c->peer,
             uvccl__op_name(q->op),
             printable_key(q->key ? q->key : (const uint8_t *)"",
                           q->key ? q->key_len : 0, kb, sizeof(kb)),
             uvccl_strerror(r));
  return r;
}

/* Parses and applies as many whole requests as data holds; *used is how
 * many bytes were consumed. Stops early when the connection closes or its
 * output passes max_output (reads are then paused). */
/* A refused client: counted, logged (at most 10 lines a second, so a
 * flood of strangers cannot flood the log), closed. */
static void refusal_log(server_t *s, const char *peer, const char *why) {
  int unlogged;
  int log = uvccl__refusals_admit(&s->refusals, uv_now(s->loop), &unlogged);
  s->st.auth_failures++;
  if (unlogged > 0)
    LOG_WARN("store", "(%d more refused connections not logged)", unlogged);
  if (log) LOG_WARN("store", "%s: refused: %s", peer, why);
}

static void auth_log(conn_t *c, const char *why) {
  refusal_log(c->srv, c->peer, why);
}

static void auth_refuse(conn_t *c, const char *why) {
  auth_log(c, why);
  conn_close(c, NULL);
}

/* The authentication exchange (auth.h), before any request. Returns the
 * bytes it used, 0 when it needs more (c->need set), -1 when it closed
 * the connection. */
static ssize_t conn_auth(conn_t *c, const uint8_t *p, size_t len) {
  server_t *s = c->srv;
  uint8_t msg[UVCCL__AUTH_CHALLENGE_LEN], want[UVCCL__AUTH_MAC];
  int r;
  if (c->auth == 3) return -1;
  if (c->auth == 1) {
    r = uvccl__auth_read_hello(p, len, c->nc);
    if (r == UVCCL__AUTH_NEED) {
      c->need = UVCCL__AUTH_HELLO_LEN;
      return 0;
    }
    if (r != 0) {
      /* the magic alone, then close: uvccl's clients without a secret
       * read it as "this server requires authentication" (and a reply
       * never starts with it); others just see the connection close */
      auth_log(c, "no authentication (this server requires a secret: a "
               "PyTorch client, or a uvccl one without "
               "UVCCL_AUTH_TOKEN/UVCCL_AUTH_FILE?)");
      c->auth = 3; /* refused: nothing more is read */
      uv_read_stop((uv_stream_t *)&c->tcp);
      if (uvccl__obuf_bytes(&c->out, UVCCL__AUTH_MAGIC,
                            UVCCL__AUTH_MAGIC_LEN) != 0) {
        conn_close(c, NULL);
        return -1;
      }
      c->close_after_flush = 1;
      conn_want_flush(c);
      return -1;
    }
    if (uvccl__auth_random(c->ns, sizeof(c->ns)) != 0) {
      auth_refuse(c, "no random bytes for a nonce");
      return -1;
    }
    uvccl__auth_challenge(msg, &s->auth, "store", c->nc, c->ns);
    if (uvccl__obuf_bytes(&c->out, msg, sizeof(msg)) != 0) {
      conn_close(c, "out of memory");
      return -1;
    }
    conn_want_flush(c);
    c->auth = 2;
    return UVCCL__AUTH_HELLO_LEN;
  }
  if (len < UVCCL__AUTH_PROOF_LEN) {
    c->need = UVCCL__AUTH_PROOF_LEN;
    return 0;
  }
  uvccl__auth_mac(&s->auth, "client", "store", c->nc, c->ns, want);
  if (!uvccl__auth_equal(p, want, sizeof(want))) {
    auth_refuse(c, "wrong secret (its proof does not match this server's "
                "secret)");
    return -1;
  }
  c->auth = 0;
  LOG_DEBUG("store", "%s: authenticated", c->peer);
  return UVCCL__AUTH_PROOF_LEN;
}

static void conn_process(conn_t *c, const uint8_t *data, size_t len,
                         size_t *used) {
  server_t *s = c->srv;
  uvccl__proto_req_t q;
  size_t off = 0, consumed;
  int r;

  *used = 0;
  c->need = 0;
  while (off < len && !c->closing) {
    if (c->out.len + c->wbuf.len > s->max_output) {
      if (!c->paused) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->paused = 1;
        LOG_DEBUG("store", "%s: output backlog, reads paused", c->peer);
      }
      break;
    }
    if (c->auth) {
      ssize_t n = conn_auth(c, data + off, len - off);
      if (n <= 0) break;
      off += (size_t)n;
      continue;
    }
    if (c->dialect == UVCCL_DIALECT_AUTO) {
      r = uvccl__proto_detect(data + off, len - off, &c->dialect);
      if (r == UVCCL__PROTO_NEED_MORE) {
        c->need = 5;
        break;
      }
      LOG_DEBUG("store", "%s: %s dialect", c->peer,
                c->dialect == UVCCL_DIALECT_MODERN ? "modern" : "1.13");
    }
    r = uvccl__proto_parse_request(c->dialect, data + off, len - off,
                                   &s->limits, &q, &consumed);
    if (r == UVCCL__PROTO_NEED_MORE) {
      if (consumed > s->max_request) {
        /* Known to be too big before it is all here: a request that could
         * never be applied is not buffered. */
        s->st.protocol_errors++;
        LOG_WARN("store", "%s: request of at least %zu bytes is over the "
                 "%zu-byte request limit; closing", c->peer, consumed,
                 s->max_request);
        conn_close(c, NULL);
        break;
      }
      c->need = consumed;
      break;
    }
    if (r < 0) {
      s->st.protocol_errors++;
      LOG_WARN("store", "%s: %s (first byte 0x%02x); closing", c->peer,
               r == UVCCL_ELIMIT ? "request over the size limits"
                                 : "unknown or malformed request",
               data[off]);
      conn_close(c, NULL);
      break;
    }
    off += consumed;
    if (c->dialect == UVCCL_DIALECT_MODERN && !c->validated &&
        q.op != UVCCL__OP_VALIDATE) {
      s->st.protocol_errors++;
      LOG_WARN("store", "%s: first request is not VALIDATE; closing", c->peer);
      conn_close(c, NULL);
      break;
    }
    if (conn_handle(c, &q) != 0) {
      s->st.protocol_errors++;
      conn_close(c, NULL);
      break;
    }
  }
  *used = off;
}

/* Keeps the unparsed tail in the connection's buffer. */
static int conn_keep(conn_t *c, const uint8_t *p, size_t len) {
  size_t want;
  uint8_t *nb;
  if (c->in_cap < len) {
    want = len < KEEP_MIN ? KEEP_MIN : len;
    if (want < c->need && c->need - len <= GROW_STEP) want = c->need;
    nb = uvccl__realloc(c->in, want);
    if (nb == NULL) return UV_ENOMEM;
    c->in = nb;
    c->in_cap = want;
  }
  memmove(c->in, p, len);
  c->in_len = len;
  return 0;
}

/* Parses the connection's own buffer and compacts it. */
static void conn_process_buffered(conn_t *c) {
  size_t used;
  if (c->in_len == 0 || c->in_len < c->need) return;
  conn_process(c, c->in, c->in_len, &used);
  if (c->closing) return;
  if (used > 0) {
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
  }
  if (c->in_len == 0 && c->in_cap > IDLE_BUF_KEEP) {
    uvccl__free(c->in);
    c->in = NULL;
    c->in_cap = 0;
  }
}

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  server_t *s = c->srv;
  size_t want;
  uint8_t *nb;

  if (c->in_len == 0 && !s->rbuf_busy) {
    s->rbuf_busy = 1;
    *buf = uv_buf_init((char *)s->rbuf, READ_CHUNK);
    return;
  }
  /* A request is partly buffered: read straight after it, making room for
   * all of it when its size is known (large values are copied once). */
  want = c->in_len + GROW_STEP;
  if (c->need > want) want = c->need;
  if (c->in_cap < want) {
    nb = uvccl__realloc(c->in, want);
    if (nb == NULL) {
      *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
      return;
    }
    c->in = nb;
    c->in_cap = want;
  }
  *buf = uv_buf_init((char *)c->in + c->in_len,
                     (unsigned)(c->in_cap - c->in_len));
}

static void conn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn_t *c = st->data;
  server_t *s = c->srv;
  size_t used;
  int from_shared = buf->base == (char *)s->rbuf;

  if (from_shared) s->rbuf_busy = 0;
  if (c->lingering) {
    if (nread < 0) conn_close(c, NULL); /* its end (or an error): done */
    else c->in_len = 0;                 /* nobody answers this any more */
    return;
  }
  if (nread > 0) c->last_read = uv_now(s->loop);
  if (nread < 0 && c->auth == 2) {
    /* our proof went out, theirs never came: they found it wrong */
    auth_log(c, "left during authentication (it holds another secret)");
    c->auth = 3;
  }
  if (nread == UV_EOF) {
    /* The client finished sending (it may still read): answer what it
     * sent, then close. */
    uv_read_stop(st);
    c->close_after_flush = 1;
    conn_want_flush(c);
    return;
  }
  if (nread < 0) {
    conn_close(c, uv_strerror((int)nread));
    return;
  }
  if (nread == 0 || c->closing) return;
  if (from_shared) {
    conn_process(c, (const uint8_t *)buf->base, (size_t)nread, &used);
    if (!c->closing && used < (size_t)nread &&
        conn_keep(c, (const uint8_t *)buf->base + used,
                  (size_t)nread - used) != 0)
      conn_close(c, "out of memory");
  } else {
    c->in_len += (size_t)nread;
    conn_process_buffered(c);
  }
  /* Answer now: the replies to everything this read brought (pipelined
   * requests share one send) and those of the waiters it released. Holding
   * them to the end of the loop iteration, as this server once did, made
   * the client wait for a whole batch of up to 1,024 reads, and touched
   * each connection twice with a thousand others in between: at 8,000
   * busy connections that cost ~25% more CPU per operation (and the same
   * in throughput), at 1,000 ~15%. */
  server_flush(s);
}

static void conn_resume(conn_t *c) {
  if (!c->paused || c->closing) return;
  c->paused = 0;
  if (!c->close_after_flush)
    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
  c->need = 0;
  conn_process_buffered(c);
}

/* ---- connection life cycle ------------------------------------------------ */

static void server_handle_closed(uv_handle_t *h);

/* The last client of a closing server is gone: its timer and flusher go. */
static void server_stop_timers(server_t *s) {
  if (s->shutdown_timer_closed) return;
  s->shutdown_timer_closed = 1;
  uv_close((uv_handle_t *)&s->shutdown_timer, server_handle_closed);
  uv_close((uv_handle_t *)&s->flush_check, server_handle_closed);
}

static void conn_part_closed(conn_t *c) {
  server_t *s = c->srv;
  if (--c->parts > 0) return;
  uvccl__free(c->in);
  uvccl__obuf_free(&c->out);
  uvccl__obuf_free(&c->wbuf);
  uvccl__free(c);
  s->handles_open--;
  if (s->closing && s->conns == NULL) server_stop_timers(s);
  server_maybe_done(s);
}

static void conn_closed(uv_handle_t *h) { conn_part_closed(h->data); }

static void conn_sendq_closed(uvccl__sendq_t *q) { conn_part_closed(q->data); }

static void conn_close(conn_t *c, const char *why) {
  server_t *s = c->srv;
  conn_t **pp;
  if (c->closing) return;
  c->closing = 1;
  if (why != NULL) LOG_DEBUG("store", "%s: closed: %s", c->peer, why);
  uvccl__kv_wait_cancel(s->kv, &c->waiter);
  barrier_forget(c);
  if (c->in_flush) {
    conn_t *prev = NULL;
    for (pp = &s->flush_head; *pp != c; pp = &(*pp)->flush_next) prev = *pp;
    *pp = c->flush_next;
    if (s->flush_tail == c) s->flush_tail = prev;
    c->in_flush = 0;
  }
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->st.connections--;
  if (uvccl__sendq_close(&c->sendq, conn_sendq_closed)) c->parts++;
  c->parts++;
  uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

/* The server is closing and this client has been quiet: send our end (FIN
 * after the replies), then read until the client's end, dropping what
 * comes. Closing with bytes of its unread would send a reset, and a reset
 * makes the client's kernel drop replies it has not read yet. The shutdown
 * grace bounds the wait. */
static void conn_linger(conn_t *c) {
  if (c->lingering) return;
  c->lingering = 1;
  c->in_len = 0;
  if (uvccl__sendq_shutdown(&c->sendq) < 0 ||
      uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read) != 0)
    conn_close(c, NULL);
}

static void peer_name(uv_tcp_t *t, char *buf, size_t cap) {
  static const char prefix[] = "client ";
  if (cap < sizeof(prefix)) return;
  memcpy(buf, prefix, sizeof(prefix) - 1);
  uvccl__peer_addr(t, buf + sizeof(prefix) - 1, cap - (sizeof(prefix) - 1));
}

/* TLS (tls.h): the handshake runs before the client is a connection
 * (tls/conn.h). */
static void conn_adopt(server_t *s, int fd, const char *peer);

static void on_adopt(void *owner, int fd, const char *from) {
  char peer[80];
  if (from == NULL) {
    conn_adopt(owner, fd, NULL);
    return;
  }
  snprintf(peer, sizeof(peer), "client %s", from); /* as peer_name's */
  conn_adopt(owner, fd, peer);
}

static void on_refused(void *owner, const char *from, const char *why) {
  server_t *s = owner;
  char peer[80];
  snprintf(peer, sizeof(peer), "client %s", from); /* as peer_name's */
  refusal_log(s, peer, why); /* counts it */
}

static void server_on_connection(uv_stream_t *ls, int status) {
  server_t *s = ls->data;
  if (status < 0) {
    LOG_WARN("store", "accept: %s", uv_strerror(status));
    return;
  }
  uvccl__acceptor_incoming(&s->acceptor, ls);
}

/* A new client: accepted from the listener (fd -1), or the plaintext
 * descriptor of one TLS secured. */
static void conn_adopt(server_t *s, int fd, const char *peer) {
  conn_t *c;
  int r;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) {
    LOG_ERROR("store", "accept: out of memory");
    if (fd >= 0) close(fd);
    return;
  }
  c->srv = s;
  r = uvccl__conn_take(s->loop, &c->tcp, (uv_stream_t *)&s->listener, fd);
  c->tcp.data = c;
  uvccl__sendq_init(&c->sendq, s->loop, &c->tcp);
  c->sendq.data = c;
  s->handles_open++;
  if (r != 0) {
    LOG_WARN("store", "accept: %s", uv_strerror(r));
    c->closing = 1;
    c->parts = 1;
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    return;
  }
  if (peer != NULL)
    snprintf(c->peer, sizeof(c->peer), "%.*s", (int)sizeof(c->peer) - 1, peer);
  else peer_name(&c->tcp, c->peer, sizeof(c->peer));
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->st.connections++;
  s->st.accepted++;
  c->auth = s->auth.set ? 1 : 0;
  r = uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read);
  if (r != 0) conn_close(c, uv_strerror(r));
}

/* ---- the server ------------------------------------------------------------ */

static int somaxconn(void) {
  FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
  int v = 4096;
  if (f != NULL) {
    if (fscanf(f, "%d", &v) != 1 || v <= 0) v = 4096;
    fclose(f);
  }
  return v;
}

static int server_bind(server_t *s, const uvccl_store_server_options_t *o) {
  struct sockaddr_storage ss;
  struct addrinfo hints, *res = NULL, *ai;
  uv_getaddrinfo_t gai;
  char port[16];
  int r;

  if (o->listen_fd >= 0) return uv_tcp_open(&s->listener, o->listen_fd);
  if (o->host == NULL || *o->host == '\0') {
    /* Dual-stack "::" first, as PyTorch's libuv server; IPv4 otherwise. */
    uv_ip6_addr("::", o->port, (struct sockaddr_in6 *)&ss);
    r = uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
    if (r == 0) return 0;
    if (r == UV_EADDRINUSE) return r;
    uv_ip4_addr("0.0.0.0", o->port, (struct sockaddr_in *)&ss);
    return uv_tcp_bind(&s->listener, (struct sockaddr *)&ss, 0);
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  snprintf(port, sizeof(port), "%d", o->port);
  /* Synchronous (no callback): init is a setup step. */
  r = uv_getaddrinfo(s->loop, &gai, NULL, o->host, port, &hints);
  if (r != 0) return r;
  res = gai.addrinfo;
  r = UV_EADDRNOTAVAIL;
  for (ai = res; ai != NULL; ai = ai->ai_next) {
    r = uv_tcp_bind(&s->listener, ai->ai_addr, 0);
    if (r == 0) break;
  }
  uv_freeaddrinfo(res);
  return r;
}

static void server_handle_closed(uv_handle_t *h) {
  server_t *s = h->data;
  s->handles_open--;
  server_maybe_done(s);
}

static void server_maybe_done(server_t *s) {
  uvccl_store_server_t *pub = s->pub;
  uvccl_store_server_close_cb cb;
  if (!s->closing || s->handles_open > 0) return;
  cb = s->close_cb;
  uvccl__kv_free(s->kv);
  uvccl__free(s->rbuf);
  uvccl__tls_ctx_unref(s->tls);
  uvccl__free(s);
  if (pub == NULL) return;
  pub->impl_ = NULL;
  if (cb != NULL) cb(pub);
}

int uvccl_store_server_init(uv_loop_t *loop, uvccl_store_server_t *pub,
                            const uvccl_store_server_options_t *o) {
  uvccl_store_server_options_t def;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  server_t *s;
  int r;

  if (loop == NULL || pub == NULL) return UV_EINVAL;
  if (o == NULL) {
    memset(&def, 0, sizeof(def));
    def.listen_fd = -1;
    o = &def;
  }
  if (o->port < 0 || o->port > 65535) return UV_EINVAL;
  s = uvccl__calloc(1, sizeof(*s));
  if (s == NULL) return UV_ENOMEM;
  s->pub = pub;
  s->loop = loop;
  s->limits.max_key_len = o->max_key_len ? o->max_key_len : 8 * 1024;
  s->limits.max_value_len = o->max_value_len ? o->max_value_len : 8 << 20;
  s->limits.max_keys = o->max_keys ? o->max_keys : 128 * 1024;
  s->max_output = o->max_output ? o->max_output : 64 << 20;
  s->max_request = o->max_request ? o->max_request : (size_t)64 << 20;
  /* A single SET of the largest value always fits. */
  if (s->max_request < s->limits.max_value_len + s->limits.max_key_len + 64)
    s->max_request = s->limits.max_value_len + s->limits.max_key_len + 64;
  {
    char err[256];
    r = uvccl__auth_key_from_opts(&s->auth, o->auth_token, o->auth_file,
                                  o->auth_none, err, sizeof(err));
    if (r == 0)
      r = uvccl__tls_ctx_new(o->tls_cert, o->tls_key, o->tls_ca, o->tls_none,
                             &s->tls, err, sizeof(err));
    if (r != 0) {
      LOG_ERROR("store", "server: %s", err);
      uvccl__free(s);
      return r;
    }
  }
  s->kv = uvccl__kv_new(o->max_memory ? o->max_memory : (size_t)1 << 30);
  s->rbuf = uvccl__malloc(READ_CHUNK);
  if (s->kv == NULL || s->rbuf == NULL) {
    r = UV_ENOMEM;
    goto fail_alloc;
  }
  uvccl__acceptor_init(&s->acceptor, s->tls, 0, 0, on_adopt, on_refused, s);
  r = uv_tcp_init(loop, &s->listener);
  if (r != 0) goto fail_alloc;
  s->listener.data = s;
  s->handles_open = 1;
  r = server_bind(s, o);
  if (r != 0) goto fail_listener;
  r = uv_listen((uv_stream_t *)&s->listener,
                o->backlog > 0 ? o->backlog : somaxconn(),
                server_on_connection);
  if (r != 0) goto fail_listener;
  r = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
  if (r != 0) goto fail_listener;
  pub->port = ntohs(ss.ss_family == AF_INET6
                        ? ((struct sockaddr_in6 *)&ss)->sin6_port
                        : ((struct sockaddr_in *)&ss)->sin_port);
  uv_check_init(loop, &s->flush_check);
  s->flush_check.data = s;
  uv_check_start(&s->flush_check, server_flush_cb);
  uv_unref((uv_handle_t *)&s->flush_check);
  s->handles_open++;
  uv_timer_init(loop, &s->shutdown_timer);
  s->shutdown_timer.data = s;
  uv_unref((uv_handle_t *)&s->shutdown_timer);
  s->handles_open++;
  pub->loop = loop;
  pub->impl_ = s;
  LOG_INFO("store", "server listening on port %d%s%s", pub->port,
           s->auth.set ? " (clients must authenticate)" : "",
           s->tls ? " (TLS)" : "");
  return 0;

fail_listener:
  /* The listener is closed through the loop, which frees the server
   * memory once it has run; the caller's struct is not touched again. */
  s->closing = 1;
  s->close_cb = NULL;
  s->pub = NULL;
  pub->impl_ = NULL;
  uv_close((uv_handle_t *)&s->listener, server_handle_closed);
  return r;
fail_alloc:
  uvccl__kv_free(s->kv);
  uvccl__free(s->rbuf);
  uvccl__tls_ctx_unref(s->tls);
  uvccl__free(s);
  return r;
}

/* While closing, every SHUTDOWN_TICK_MS: a client quiet for SHUTDOWN_QUIET_MS
 * with its replies out is let go (conn_linger); after SHUTDOWN_GRACE_MS
 * every client is closed. Until then requests already on their way are
 * still answered: a rank whose store host finished first may be a moment
 * behind (its wait at the group's creation barrier sent, not yet read),
 * and stopping at once would leave it without its answer. */
static void server_shutdown_tick(uv_timer_t *t) {
  server_t *s = t->data;
  conn_t *c, *next;
  uint64_t now = uv_now(s->loop);
  if (now - s->closing_since >= SHUTDOWN_GRACE_MS) {
    LOG_INFO("store", "shutdown: closing the clients still connected after "
             "%d ms", SHUTDOWN_GRACE_MS);
    while ((c = s->conns) != NULL) conn_close(c, "shutdown deadline");
    return;
  }
  for (c = s->conns; c != NULL; c = next) {
    next = c->next;
    if (!c->lingering && !c->writing && c->out.len == 0 && !c->in_flush &&
        now - c->last_read >= SHUTDOWN_QUIET_MS)
      conn_linger(c);
  }
}

void uvccl_store_server_close(uvccl_store_server_t *pub,
                              uvccl_store_server_close_cb cb) {
  server_t *s = pub ? pub->impl_ : NULL;
  conn_t *c;
  if (s == NULL || s->closing) return;
  s->closing = 1;
  s->close_cb = cb;
  s->closing_since = uv_now(s->loop);
  uv_close((uv_handle_t *)&s->listener, server_handle_closed);
  uvccl__acceptor_cancel(&s->acceptor);
  /* No new clients; the ones there are keep being answered a moment. */
  LOG_DEBUG("store", "server closing: %d clients", (int)s->st.connections);
  for (c = s->conns; c != NULL; c = c->next) {
    c->last_read = s->closing_since;
    conn_flush(c);
  }
  if (s->conns == NULL)
    server_stop_timers(s);
  else
    uv_timer_start(&s->shutdown_timer, server_shutdown_tick, SHUTDOWN_TICK_MS,
                   SHUTDOWN_TICK_MS);
}

void uvccl_store_server_stats(const uvccl_store_server_t *pub,
                              uvccl_store_server_stats_t *st) {
  const server_t *s = pub ? pub->impl_ : NULL;
  uvccl__kv_stats_t ks;
  memset(st, 0, sizeof(*st));
  if (s == NULL) return;
  *st = s->st;
  uvccl__kv_stats(s->kv, &ks);
  st->keys = ks.keys;
  st->memory = ks.memory;
  st->waiting = ks.waiters;
}

int uvccl_store_server_getsockname(const uvccl_store_server_t *pub,
                                   struct sockaddr *name, int *namelen) {
  const server_t *s = pub ? pub->impl_ : NULL;
  if (s == NULL || name == NULL || namelen == NULL) return UV_EINVAL;
  return uv_tcp_getsockname(&s->listener, name, namelen);
}
