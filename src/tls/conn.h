/* One connection life cycle for the store's server and client, the mesh
 * and the liveness monitor: a listener's incoming connections (the TLS
 * handshake first where the listener has a context), taking an accepted
 * connection into a handle, refusals logged at a bounded rate, and the
 * backoff of a dial that found nobody listening. What each does with a
 * connection once it has one (its hello, its handshake timeout, its
 * authentication) stays its own. */
#ifndef UVCCL_TLS_CONN_H
#define UVCCL_TLS_CONN_H

#include "tls.h"

/* ---- incoming connections ------------------------------------------------ */

/* A connection for the owner: fd -1 when it waits on the listener (plain
 * TCP: uvccl__conn_take accepts it), else the plaintext descriptor of one
 * whose TLS handshake is over, now the owner's; from: its address, NULL
 * when not known yet. */
typedef void (*uvccl__adopt_cb)(void *owner, int fd, const char *from);
/* A TLS handshake failed: from (may be "") and why. */
typedef void (*uvccl__refused_cb)(void *owner, const char *from,
                                  const char *why);

typedef struct uvccl__accept_hs_s uvccl__accept_hs_t;

typedef struct {
  uvccl__tls_ctx_t *tls;   /* NULL: plain TCP */
  uint64_t hb_ms;          /* socket tuning, as uvccl__tune_socket */
  int user_timeout;
  uvccl__adopt_cb adopt;
  uvccl__refused_cb refused;
  void *owner;
  uvccl__accept_hs_t *hs;  /* TLS handshakes under way */
} uvccl__acceptor_t;

void uvccl__acceptor_init(uvccl__acceptor_t *a, uvccl__tls_ctx_t *tls,
                          uint64_t hb_ms, int user_timeout,
                          uvccl__adopt_cb adopt, uvccl__refused_cb refused,
                          void *owner);
/* From the listener's connection callback (status >= 0): a plain
 * connection goes to adopt at once; a TLS one once its handshake is over,
 * or to refused. */
void uvccl__acceptor_incoming(uvccl__acceptor_t *a, uv_stream_t *listener);
/* Stops the handshakes under way: their callbacks never run. */
void uvccl__acceptor_cancel(uvccl__acceptor_t *a);

/* Takes a connection into tcp (initialized here, on loop): accepted from
 * listener when fd < 0, else opened on fd; Nagle off. tcp is initialized
 * whatever the outcome (the caller closes it); on an error fd is closed. */
int uvccl__conn_take(uv_loop_t *loop, uv_tcp_t *tcp, uv_stream_t *listener,
                     int fd);

/* ---- refusals, logged at a bounded rate ---------------------------------- */

/* Up to this many refusals a second are logged, so that a flood of them
 * cannot flood the log. */
#define UVCCL__REFUSALS_PER_S 10

typedef struct {
  uint64_t since_ms;  /* the second being counted began */
  int count;          /* refusals in it */
} uvccl__refusals_t;

/* One more refusal at now_ms: 1 when it is to be logged. *unlogged: the
 * refusals of the second that just ended that were not (say so when
 * above 0). */
int uvccl__refusals_admit(uvccl__refusals_t *r, uint64_t now_ms,
                          int *unlogged);

/* ---- dialing --------------------------------------------------------------- */

/* The next wait before dialing again one that was not listening yet:
 * 10 ms, then twice the last, up to cap_ms; *ms holds the last (0: none
 * yet). */
uint64_t uvccl__backoff_next(uint64_t *ms, uint64_t cap_ms);

/* A dial's outcome: status, or UV_ECONNREFUSED where the connection met
 * itself: dialing a local port nobody listens on can (TCP simultaneous
 * open, the kernel picking the destination port as the source port); it
 * is then no peer at all, and a client would read its own request as the
 * answer. */
int uvccl__dial_status(const uv_tcp_t *tcp, int status);

#endif
