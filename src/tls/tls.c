/* TLS: contexts, handshakes on the caller's loop, and the relay thread
 * (see tls.h). */
#include "tls.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

struct uvccl__tls_ctx_s {
  SSL_CTX *ssl;
  int refs; /* atomically */
};

/* ---- contexts ----------------------------------------------------------- */

static void ssl_errors(char *buf, size_t len) {
  unsigned long e;
  size_t n = strlen(buf);
  while ((e = ERR_get_error()) != 0 && n + 2 < len) {
    char one[200];
    ERR_error_string_n(e, one, sizeof(one));
    n += (size_t)snprintf(buf + n, len - n, "%s%s",
                          n && buf[n - 1] != ' ' ? "; " : "", one);
  }
}

int uvccl__tls_ctx_new(const char *cert, const char *key, const char *ca,
                       int none, uvccl__tls_ctx_t **out, char *err,
                       size_t errlen) {
  uvccl__tls_ctx_t *c;
  SSL_CTX *s;
  *out = NULL;
  err[0] = '\0';
  if (none) return 0;
  if (cert == NULL && key == NULL && ca == NULL) {
    cert = uvccl__config_text(UVCCL__CFG_TLS_CERT);
    key = uvccl__config_text(UVCCL__CFG_TLS_KEY);
    ca = uvccl__config_text(UVCCL__CFG_TLS_CA);
    if (cert != NULL && *cert == '\0') cert = NULL;
    if (key != NULL && *key == '\0') key = NULL;
    if (ca != NULL && *ca == '\0') ca = NULL;
  }
  if (cert == NULL && key == NULL && ca == NULL) return 0;
  if (cert == NULL || key == NULL || ca == NULL) {
    snprintf(err, errlen, "TLS needs a certificate, its key and a CA to "
             "verify peers (UVCCL_TLS_CERT, UVCCL_TLS_KEY, UVCCL_TLS_CA); "
             "missing: %s%s%s", cert ? "" : "certificate ",
             key ? "" : "key ", ca ? "" : "CA");
    return UV_EINVAL;
  }
  ERR_clear_error();
  s = SSL_CTX_new(TLS_method());
  if (s == NULL) {
    snprintf(err, errlen, "TLS: no context: ");
    ssl_errors(err, errlen);
    return UV_ENOMEM;
  }
  SSL_CTX_set_min_proto_version(s, TLS1_2_VERSION);
  /* No session tickets (with kTLS a ticket after the handshake would be a
   * record the application reads), no renegotiation. */
  SSL_CTX_set_num_tickets(s, 0);
  SSL_CTX_set_options(s, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET
#ifdef SSL_OP_ENABLE_KTLS
                             | SSL_OP_ENABLE_KTLS
#endif
  );
  SSL_CTX_set_mode(s, SSL_MODE_ENABLE_PARTIAL_WRITE |
                          SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  /* AES-128-GCM first: the fastest where the CPU has AES instructions,
   * and strong enough. */
  SSL_CTX_set_ciphersuites(s, "TLS_AES_128_GCM_SHA256:"
                              "TLS_AES_256_GCM_SHA384:"
                              "TLS_CHACHA20_POLY1305_SHA256");
  /* Relayed connections read whole bursts of records per recv, not a
   * header then a body (read-ahead is switched on after the handshake:
   * during it, it would keep OpenSSL from handing the socket to kTLS). */
  SSL_CTX_set_default_read_buffer_len(s, 64 * 1024);
  if (SSL_CTX_use_certificate_chain_file(s, cert) != 1) {
    snprintf(err, errlen, "TLS: the certificate %s: ", cert);
    goto bad;
  }
  if (SSL_CTX_use_PrivateKey_file(s, key, SSL_FILETYPE_PEM) != 1) {
    if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
      ERR_clear_error();
      snprintf(err, errlen, "TLS: the key %s does not match the "
               "certificate %s", key, cert);
      SSL_CTX_free(s);
      return UV_EINVAL;
    }
    snprintf(err, errlen, "TLS: the key %s: ", key);
    goto bad;
  }
  if (SSL_CTX_check_private_key(s) != 1) {
    snprintf(err, errlen, "TLS: the key %s does not match the certificate "
             "%s: ", key, cert);
    goto bad;
  }
  if (SSL_CTX_load_verify_locations(s, ca, NULL) != 1) {
    snprintf(err, errlen, "TLS: the CA %s: ", ca);
    goto bad;
  }
  SSL_CTX_set_verify(s, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     NULL);
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) {
    SSL_CTX_free(s);
    snprintf(err, errlen, "out of memory");
    return UV_ENOMEM;
  }
  c->ssl = s;
  c->refs = 1;
  *out = c;
  return 0;
bad:
  ssl_errors(err, errlen);
  SSL_CTX_free(s);
  return UV_EINVAL;
}

void uvccl__tls_ctx_ref(uvccl__tls_ctx_t *ctx) {
  __atomic_add_fetch(&ctx->refs, 1, __ATOMIC_RELAXED);
}

void uvccl__tls_ctx_unref(uvccl__tls_ctx_t *ctx) {
  if (ctx == NULL) return;
  if (__atomic_sub_fetch(&ctx->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    SSL_CTX_free(ctx->ssl);
    uvccl__free(ctx);
  }
}

static int g_mode; /* 0 unknown, 1 kTLS, 2 relay */

const char *uvccl__tls_mode(void) {
  int m = __atomic_load_n(&g_mode, __ATOMIC_RELAXED);
  return m == 1 ? "kTLS" : m == 2 ? "relay" : "";
}

/* ---- a BIO that never raises SIGPIPE --------------------------------------
 * OpenSSL's socket BIO writes with write(). This one sends with
 * MSG_NOSIGNAL and receives with recv(), and leaves everything else
 * (kTLS set-up included) to the socket BIO's ctrl. */
static BIO_METHOD *g_bio_method;
static pthread_once_t g_bio_once = PTHREAD_ONCE_INIT;

static int nosig_write(BIO *b, const char *buf, int n) {
  int fd = (int)BIO_get_fd(b, NULL);
  ssize_t r;
  BIO_clear_retry_flags(b);
  r = send(fd, buf, (size_t)n, MSG_NOSIGNAL);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_write(b);
  return (int)r;
}

static int nosig_read(BIO *b, char *buf, int n) {
  int fd = (int)BIO_get_fd(b, NULL);
  ssize_t r;
  BIO_clear_retry_flags(b);
  r = recv(fd, buf, (size_t)n, 0);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_read(b);
  if (r == 0) BIO_set_flags(b, BIO_FLAGS_IN_EOF);
  return (int)r;
}

static int nosig_puts(BIO *b, const char *s) {
  return nosig_write(b, s, (int)strlen(s));
}

static void bio_method_init(void) {
  const BIO_METHOD *sock = BIO_s_socket();
  BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOCKET, "uvccl socket");
  if (m == NULL) return;
  BIO_meth_set_write(m, nosig_write);
  BIO_meth_set_read(m, nosig_read);
  BIO_meth_set_puts(m, nosig_puts);
  BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(sock));
  BIO_meth_set_create(m, BIO_meth_get_create(sock));
  BIO_meth_set_destroy(m, BIO_meth_get_destroy(sock));
  g_bio_method = m;
}

static SSL *ssl_new(uvccl__tls_ctx_t *ctx, int fd, int is_server) {
  SSL *ssl;
  BIO *b;
  pthread_once(&g_bio_once, bio_method_init);
  if (g_bio_method == NULL) return NULL;
  ssl = SSL_new(ctx->ssl);
  if (ssl == NULL) return NULL;
  b = BIO_new(g_bio_method);
  if (b == NULL) {
    SSL_free(ssl);
    return NULL;
  }
  BIO_set_fd(b, fd, BIO_NOCLOSE);
  SSL_set_bio(ssl, b, b);
  if (is_server) SSL_set_accept_state(ssl);
  else SSL_set_connect_state(ssl);
  return ssl;
}

/* ---- the relay thread ------------------------------------------------------ */

#define RELAY_BUF (64 * 1024)

typedef struct relay_conn_s {
  uvccl__xitem_t item;
  SSL *ssl;
  int nfd, afd;          /* the TCP socket; the relay's socketpair end */
  uv_poll_t np, ap;
  int nclosing;
  int app_eof, net_eof;  /* read 0 from the app / close_notify or EOF */
  int sent_close, app_shut, dead;
  int ssl_wants;         /* UV_READABLE/UV_WRITABLE OpenSSL waits for */
  int nev, aev;          /* what each poll watches now */
  int caller_fd;         /* the caller's end, to name errors by */
  int wdead;             /* writing to the network failed */
  size_t a2n_off, a2n_len, n2a_off, n2a_len;
  char a2n[RELAY_BUF];   /* plaintext from the app, to encrypt */
  char n2a[RELAY_BUF];   /* plaintext decrypted, for the app */
} relay_conn_t;

static struct {
  uv_loop_t loop;
  uvccl__xqueue_t q;
  uv_thread_t thread;
  int ok;
} g_relay;
static pthread_once_t g_relay_once = PTHREAD_ONCE_INIT;

/* Why relayed connections ended, by the caller's descriptor, for the
 * caller to say (with TLS 1.3 a client finishes its handshake before the
 * server has checked its certificate: a refusal then arrives as an alert
 * on the open connection, and the caller sees only its end close). */
#define RELAY_ERRS 16
static struct {
  uv_mutex_t lock;
  struct {
    int fd;
    char msg[200];
  } e[RELAY_ERRS];
  unsigned next;
} g_errs;

static void relay_note_error(relay_conn_t *c) {
  char msg[200] = "";
  ssl_errors(msg, sizeof(msg));
  if (msg[0] == '\0') return;
  uv_mutex_lock(&g_errs.lock);
  g_errs.e[g_errs.next % RELAY_ERRS].fd = c->caller_fd;
  snprintf(g_errs.e[g_errs.next % RELAY_ERRS].msg,
           sizeof(g_errs.e[0].msg), "%s", msg);
  g_errs.next++;
  uv_mutex_unlock(&g_errs.lock);
}

int uvccl__tls_conn_error(int fd, char *buf, size_t len) {
  unsigned i;
  int found = 0;
  if (!g_relay.ok) return 0;
  uv_mutex_lock(&g_errs.lock);
  for (i = 0; i < RELAY_ERRS; i++)
    if (g_errs.e[i].fd == fd && g_errs.e[i].msg[0] != '\0') {
      snprintf(buf, len, "%s", g_errs.e[i].msg);
      g_errs.e[i].msg[0] = '\0';
      found = 1;
    }
  uv_mutex_unlock(&g_errs.lock);
  return found;
}

static void relay_thread(void *arg) {
  (void)arg;
  uv_run(&g_relay.loop, UV_RUN_DEFAULT); /* the queue's handle: forever */
}

static void relay_init(void) {
  if (uv_mutex_init(&g_errs.lock) != 0) return;
  if (uv_loop_init(&g_relay.loop) != 0) return;
  if (uvccl__xqueue_init(&g_relay.loop, &g_relay.q) != 0) return;
  if (uv_thread_create(&g_relay.thread, relay_thread, NULL) != 0) return;
  g_relay.ok = 1;
}

static void relay_conn_closed(uv_handle_t *h) {
  relay_conn_t *c = h->data;
  if (--c->nclosing == 0) {
    SSL_free(c->ssl);
    close(c->nfd);
    close(c->afd);
    uvccl__free(c);
  }
}

static void relay_close(relay_conn_t *c) {
  if (c->dead) return;
  c->dead = 1;
  c->nclosing = 2;
  uv_close((uv_handle_t *)&c->np, relay_conn_closed);
  uv_close((uv_handle_t *)&c->ap, relay_conn_closed);
}

static void relay_on_poll(uv_poll_t *h, int status, int events);

/* Moves bytes both ways until nothing moves, then polls for what would
 * let more move. */
static void relay_pump(relay_conn_t *c) {
  int progress, nev = 0, aev = 0, e;
  ssize_t r;
  do {
    progress = 0;
    c->ssl_wants = 0;
    /* app -> network */
    if (c->a2n_off == c->a2n_len && !c->app_eof) {
      r = recv(c->afd, c->a2n, sizeof(c->a2n), 0);
      if (r > 0) {
        c->a2n_off = 0;
        c->a2n_len = (size_t)r;
        progress = 1;
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK &&
                            errno != EINTR)) {
        c->app_eof = 1;
        progress = 1;
      }
    }
    if (c->a2n_off < c->a2n_len && !c->sent_close && !c->wdead) {
      ERR_clear_error();
      e = SSL_write(c->ssl, c->a2n + c->a2n_off,
                    (int)(c->a2n_len - c->a2n_off));
      if (e > 0) {
        c->a2n_off += (size_t)e;
        progress = 1;
      } else {
        e = SSL_get_error(c->ssl, e);
        if (e == SSL_ERROR_WANT_WRITE) c->ssl_wants |= UV_WRITABLE;
        else if (e == SSL_ERROR_WANT_READ) c->ssl_wants |= UV_READABLE;
        else {
          /* The network side failed. What the peer sent before it went
           * (an alert saying why, say) is read below, then the app sees
           * EOF. */
          relay_note_error(c);
          c->wdead = 1;
          progress = 1;
        }
      }
    }
    if (c->app_eof && c->a2n_off == c->a2n_len && !c->sent_close) {
      ERR_clear_error();
      SSL_shutdown(c->ssl); /* close_notify (best effort) */
      shutdown(c->nfd, SHUT_WR);
      c->sent_close = 1;
      progress = 1;
    }
    /* network -> app */
    if (c->n2a_off == c->n2a_len && !c->net_eof) {
      ERR_clear_error();
      e = SSL_read(c->ssl, c->n2a, (int)sizeof(c->n2a));
      if (e > 0) {
        c->n2a_off = 0;
        c->n2a_len = (size_t)e;
        progress = 1;
      } else {
        e = SSL_get_error(c->ssl, e);
        if (e == SSL_ERROR_WANT_READ) c->ssl_wants |= UV_READABLE;
        else if (e == SSL_ERROR_WANT_WRITE) c->ssl_wants |= UV_WRITABLE;
        else if (e == SSL_ERROR_ZERO_RETURN || e == SSL_ERROR_SYSCALL) {
          /* close_notify, or the connection ended without one (a peer
           * that died): EOF for the app either way. */
          c->net_eof = 1;
          progress = 1;
        } else {
          relay_note_error(c); /* an alert: a refused certificate, ... */
          relay_close(c);
          return;
        }
      }
    }
    if (c->n2a_off < c->n2a_len) {
      r = send(c->afd, c->n2a + c->n2a_off, c->n2a_len - c->n2a_off,
               MSG_NOSIGNAL);
      if (r > 0) {
        c->n2a_off += (size_t)r;
        progress = 1;
      } else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                 errno != EINTR) {
        relay_close(c); /* the app closed its end */
        return;
      }
    }
    if (c->net_eof && c->n2a_off == c->n2a_len && !c->app_shut) {
      shutdown(c->afd, SHUT_WR);
      c->app_shut = 1;
      progress = 1;
    }
    if (c->wdead && (c->net_eof || c->ssl_wants)) {
      relay_close(c); /* read what there was to read: done */
      return;
    }
  } while (progress);
  if (c->sent_close && c->app_shut) {
    relay_close(c);
    return;
  }
  nev = c->ssl_wants;
  if (c->n2a_off == c->n2a_len && !c->net_eof) nev |= UV_READABLE;
  if (c->a2n_off == c->a2n_len && !c->app_eof) aev |= UV_READABLE;
  if (c->n2a_off < c->n2a_len) aev |= UV_WRITABLE;
  /* Each change is an epoll_ctl: only when the interest changes. */
  if (nev != c->nev) {
    if (nev) uv_poll_start(&c->np, nev, relay_on_poll);
    else uv_poll_stop(&c->np);
    c->nev = nev;
  }
  if (aev != c->aev) {
    if (aev) uv_poll_start(&c->ap, aev, relay_on_poll);
    else uv_poll_stop(&c->ap);
    c->aev = aev;
  }
}

static void relay_on_poll(uv_poll_t *h, int status, int events) {
  relay_conn_t *c = h->data;
  (void)status;
  (void)events;
  if (!c->dead) relay_pump(c);
}

static void relay_adopt(uvccl__xitem_t *item) {
  relay_conn_t *c = (relay_conn_t *)item;
  uv_poll_init_socket(&g_relay.loop, &c->np, c->nfd);
  uv_poll_init_socket(&g_relay.loop, &c->ap, c->afd);
  c->np.data = c->ap.data = c;
  relay_pump(c);
}

/* ---- handshakes on the caller's loop --------------------------------------- */

struct uvccl__tls_hs_s {
  uvccl__tls_ctx_t *ctx;
  uv_loop_t *loop;
  int fd;
  int is_server;
  int connecting;
  SSL *ssl;
  uv_poll_t poll;
  uv_timer_t timer;
  int nclosing;
  int finished;
  int draining;           /* failed: reading to EOF before closing */
  uint64_t hb_ms;
  int user_timeout;
  uvccl__tls_cb cb;
  void *arg;
  int status;
  int out_fd;
  char msg[256];
};

static void hs_on_poll(uv_poll_t *h, int status, int events);
static void hs_on_timer(uv_timer_t *t);

static void hs_closed(uv_handle_t *h) {
  uvccl__tls_hs_t *hs = h->data;
  if (--hs->nclosing > 0) return;
  if (hs->ssl != NULL) SSL_free(hs->ssl);
  if (hs->fd >= 0) close(hs->fd);
  uvccl__tls_ctx_unref(hs->ctx);
  uvccl__free(hs);
}

static void hs_release(uvccl__tls_hs_t *hs) {
  hs->nclosing = 2;
  uv_close((uv_handle_t *)&hs->poll, hs_closed);
  uv_close((uv_handle_t *)&hs->timer, hs_closed);
}

/* Ends the handshake: the callback (unless cancelled), then the handles. */
static void hs_finish(uvccl__tls_hs_t *hs, int status, int fd,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void hs_finish(uvccl__tls_hs_t *hs, int status, int fd,
                      const char *fmt, ...) {
  va_list ap;
  if (hs->finished) return;
  hs->finished = 1;
  uv_poll_stop(&hs->poll);
  uv_timer_stop(&hs->timer);
  hs->msg[0] = '\0';
  if (fmt != NULL) {
    va_start(ap, fmt);
    vsnprintf(hs->msg, sizeof(hs->msg), fmt, ap);
    va_end(ap);
  }
  if (hs->cb != NULL) hs->cb(hs->arg, status, fd, hs->msg);
  if (status != 0 && status != UV_ECANCELED && hs->fd >= 0 &&
      !hs->connecting) {
    /* A failed handshake: OpenSSL's alert is on its way. Closing with
     * unread bytes (the peer's first request, say) would reset the
     * connection and the peer could lose the alert, and with it the
     * reason; so half-close and read to the end first (a second at
     * most). */
    shutdown(hs->fd, SHUT_WR);
    hs->draining = 1;
    uv_poll_start(&hs->poll, UV_READABLE, hs_on_poll);
    uv_timer_start(&hs->timer, hs_on_timer, 1000, 0);
    return;
  }
  hs_release(hs);
}

/* The handshake is done: hand over the connection. */
static void hs_done(uvccl__tls_hs_t *hs) {
  int sp[2];
  relay_conn_t *c;
  uvccl__tune_socket(hs->fd, hs->hb_ms, hs->user_timeout);
  /* (an OpenSSL built without kTLS, as Node's, says 0 here) */
  if (BIO_get_ktls_send(SSL_get_wbio(hs->ssl)) &&
      BIO_get_ktls_recv(SSL_get_rbio(hs->ssl))) {
    /* The kernel carries TLS from here: the TCP socket is the plaintext
     * descriptor. */
    int fd = hs->fd;
    if (__atomic_exchange_n(&g_mode, 1, __ATOMIC_RELAXED) != 1)
      LOG_INFO("tls", "the kernel carries TLS (kTLS): the data path is the "
               "plain one");
    hs->fd = -1;
    hs_finish(hs, 0, fd, NULL);
    return;
  }
  pthread_once(&g_relay_once, relay_init);
  c = g_relay.ok ? uvccl__calloc(1, sizeof(*c)) : NULL;
  if (c == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK |
                                           SOCK_CLOEXEC, 0, sp) != 0) {
    uvccl__free(c);
    hs_finish(hs, UV_ENOMEM, -1, "TLS: no relay for the connection");
    return;
  }
  if (__atomic_exchange_n(&g_mode, 2, __ATOMIC_RELAXED) != 2)
    LOG_INFO("tls", "no kernel TLS here (no tls module, or OpenSSL without "
             "kTLS): a relay thread encrypts");
  c->ssl = hs->ssl;
  SSL_set_read_ahead(c->ssl, 1);
  c->nfd = hs->fd;
  c->afd = sp[0];
  c->caller_fd = sp[1];
  hs->ssl = NULL;
  hs->fd = -1;
  c->item.fn = relay_adopt;
  if (uvccl__xqueue_post(&g_relay.q, &c->item) != 0) {
    SSL_free(c->ssl);
    close(c->nfd);
    close(sp[0]);
    close(sp[1]);
    uvccl__free(c);
    hs_finish(hs, UV_EIO, -1, "TLS: the relay did not take the connection");
    return;
  }
  hs_finish(hs, 0, sp[1], NULL);
}

static void hs_step(uvccl__tls_hs_t *hs) {
  int r, e;
  ERR_clear_error();
  r = SSL_do_handshake(hs->ssl);
  if (r == 1) {
    hs_done(hs);
    return;
  }
  e = SSL_get_error(hs->ssl, r);
  if (e == SSL_ERROR_WANT_READ) {
    uv_poll_start(&hs->poll, UV_READABLE, hs_on_poll);
    return;
  }
  if (e == SSL_ERROR_WANT_WRITE) {
    uv_poll_start(&hs->poll, UV_WRITABLE, hs_on_poll);
    return;
  }
  {
    long v = SSL_get_verify_result(hs->ssl);
    char why[300] = "";
    if (v != X509_V_OK) {
      hs_finish(hs, UVCCL_EAUTH, -1, "TLS: the %s's certificate did not "
                "verify: %s", hs->is_server ? "client" : "server",
                X509_verify_cert_error_string(v));
      return;
    }
    ssl_errors(why, sizeof(why));
    if (strstr(why, "certificate") != NULL || strstr(why, "alert") != NULL)
      hs_finish(hs, UVCCL_EAUTH, -1, "TLS handshake refused: %s", why);
    else
      hs_finish(hs, e == SSL_ERROR_SYSCALL ? UV_ECONNRESET : UVCCL_EPROTO,
                -1, "TLS handshake failed: %s",
                why[0] ? why : "the connection closed");
  }
}

static int self_connected(int fd) {
  struct sockaddr_storage a, b;
  socklen_t al = sizeof(a), bl = sizeof(b);
  if (getsockname(fd, (struct sockaddr *)&a, &al) != 0 ||
      getpeername(fd, (struct sockaddr *)&b, &bl) != 0)
    return 0;
  return al == bl && memcmp(&a, &b, al) == 0;
}

static void hs_on_poll(uv_poll_t *h, int status, int events) {
  uvccl__tls_hs_t *hs = h->data;
  (void)events;
  if (hs->draining) {
    char buf[4096];
    ssize_t r;
    while ((r = recv(hs->fd, buf, sizeof(buf), 0)) > 0) {
    }
    if (r == 0 || status < 0 ||
        (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      hs->draining = 0;
      uv_timer_stop(&hs->timer);
      hs_release(hs);
    }
    return;
  }
  if (hs->finished) return;
  if (hs->connecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (status < 0) err = -status;
    else if (getsockopt(hs->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
      err = errno;
    if (err == 0 && self_connected(hs->fd)) err = ECONNREFUSED;
    if (err != 0) {
      hs_finish(hs, -err, -1, "connect: %s", strerror(err));
      return;
    }
    hs->connecting = 0;
    {
      int one = 1;
      setsockopt(hs->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
  }
  hs_step(hs);
}

static void hs_on_timer(uv_timer_t *t) {
  uvccl__tls_hs_t *hs = t->data;
  if (hs->draining) { /* the peer kept its end open: close anyway */
    hs->draining = 0;
    uv_poll_stop(&hs->poll);
    hs_release(hs);
    return;
  }
  if (hs->status != 0) { /* an error found at the start */
    hs_finish(hs, hs->status, -1, "%s", hs->msg);
    return;
  }
  hs_finish(hs, UV_ETIMEDOUT, -1, "TLS handshake: no answer within %d s",
            UVCCL__TLS_HANDSHAKE_MS / 1000);
}

static uvccl__tls_hs_t *hs_new(uvccl__tls_ctx_t *ctx, uv_loop_t *loop,
                               int fd, int is_server, uint64_t hb_ms,
                               int user_timeout, uvccl__tls_cb cb,
                               void *arg) {
  uvccl__tls_hs_t *hs = uvccl__calloc(1, sizeof(*hs));
  if (hs == NULL) return NULL;
  hs->ssl = ssl_new(ctx, fd, is_server);
  if (hs->ssl == NULL || uv_poll_init_socket(loop, &hs->poll, fd) != 0) {
    if (hs->ssl) SSL_free(hs->ssl);
    uvccl__free(hs);
    return NULL;
  }
  uvccl__tls_ctx_ref(ctx);
  hs->ctx = ctx;
  hs->loop = loop;
  hs->fd = fd;
  hs->is_server = is_server;
  hs->hb_ms = hb_ms;
  hs->user_timeout = user_timeout;
  hs->cb = cb;
  hs->arg = arg;
  hs->poll.data = hs;
  uv_timer_init(loop, &hs->timer);
  hs->timer.data = hs;
  uv_timer_start(&hs->timer, hs_on_timer, UVCCL__TLS_HANDSHAKE_MS, 0);
  return hs;
}

int uvccl__tls_connect(uvccl__tls_ctx_t *ctx, uv_loop_t *loop,
                       const struct sockaddr *addr, uint64_t hb_ms,
                       int user_timeout, uvccl__tls_cb cb, void *arg,
                       uvccl__tls_hs_t **out) {
  uvccl__tls_hs_t *hs;
  socklen_t alen = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                               : sizeof(struct sockaddr_in);
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  0);
  if (fd < 0) return -errno;
  hs = hs_new(ctx, loop, fd, 0, hb_ms, user_timeout, cb, arg);
  if (hs == NULL) {
    close(fd);
    return UV_ENOMEM;
  }
  hs->connecting = 1;
  if (connect(fd, addr, alen) != 0 && errno != EINPROGRESS) {
    /* Reported from the loop, as every outcome is. */
    hs->status = -errno;
    snprintf(hs->msg, sizeof(hs->msg), "connect: %s", strerror(errno));
    uv_timer_start(&hs->timer, hs_on_timer, 0, 0);
  } else {
    uv_poll_start(&hs->poll, UV_WRITABLE, hs_on_poll);
  }
  *out = hs;
  return 0;
}

int uvccl__tls_accept(uvccl__tls_ctx_t *ctx, uv_loop_t *loop, int fd,
                      uint64_t hb_ms, int user_timeout, uvccl__tls_cb cb,
                      void *arg, uvccl__tls_hs_t **out) {
  uvccl__tls_hs_t *hs;
  int one = 1;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  hs = hs_new(ctx, loop, fd, 1, hb_ms, user_timeout, cb, arg);
  if (hs == NULL) {
    close(fd);
    return UV_ENOMEM;
  }
  /* The client speaks first. */
  uv_poll_start(&hs->poll, UV_READABLE, hs_on_poll);
  *out = hs;
  return 0;
}

void uvccl__tls_cancel(uvccl__tls_hs_t *hs) {
  if (hs == NULL || hs->finished) return;
  hs->cb = NULL;
  hs_finish(hs, UV_ECANCELED, -1, NULL);
}

static void on_tmp_closed(uv_handle_t *h) { uvccl__free(h); }

int uvccl__tls_accept_from(uvccl__tls_ctx_t *ctx, uv_stream_t *server,
                           uint64_t hb_ms, int user_timeout,
                           uvccl__tls_cb cb, void *arg, char *peer,
                           size_t peerlen, uvccl__tls_hs_t **out) {
  /* libuv accepts only into a handle, and a handle's descriptor cannot be
   * taken back: accept into a scratch one, keep a duplicate of its
   * descriptor, close the scratch one. */
  uv_tcp_t *tmp = uvccl__calloc(1, sizeof(*tmp));
  uv_os_fd_t sfd;
  int fd = -1, rc;
  if (tmp == NULL) return UV_ENOMEM;
  uv_tcp_init(server->loop, tmp);
  rc = uv_accept(server, (uv_stream_t *)tmp);
  if (rc == 0) rc = uv_fileno((uv_handle_t *)tmp, &sfd);
  if (rc == 0 && (fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0)) < 0) rc = -errno;
  if (rc == 0 && peer != NULL) uvccl__peer_addr(tmp, peer, peerlen);
  uv_close((uv_handle_t *)tmp, on_tmp_closed);
  if (rc != 0) return rc;
  return uvccl__tls_accept(ctx, server->loop, fd, hb_ms, user_timeout, cb,
                           arg, out);
}
