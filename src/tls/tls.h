/* TLS for uvccl's connections (OpenSSL), when a job asks for it
 * (certificate, key and CA files: $UVCCL_TLS_CERT, $UVCCL_TLS_KEY,
 * $UVCCL_TLS_CA, or the options).
 *
 * Both ends present a certificate and verify the other's against the CA
 * (mutual TLS, 1.2 or later); no host name check: a job's ranks dial
 * addresses, and the CA is the job's.
 *
 * How it fits under code written for plain sockets: the TCP connection
 * and the handshake are made here, on the caller's loop; then the caller
 * gets a descriptor it uses as it would the TCP socket (uv_tcp_open,
 * uvccl__wq, reads into its buffers):
 *  - where the kernel and OpenSSL do TLS (kTLS), the TCP socket itself:
 *    the kernel encrypts and decrypts, the data path is unchanged;
 *  - else one end of a socketpair, whose other end a relay thread (one
 *    per process, started with the first TLS connection) pumps through
 *    OpenSSL to and from the TCP socket. A half-close travels as TLS
 *    close_notify and back as EOF.
 * Nothing here writes with write(): sends use MSG_NOSIGNAL, so no
 * SIGPIPE, whatever the peer does. */
#ifndef UVCCL_TLS_TLS_H
#define UVCCL_TLS_TLS_H

#include "loop/internal.h"

#include <sys/socket.h>

/* A handshake not done within this fails (UV_ETIMEDOUT). */
#define UVCCL__TLS_HANDSHAKE_MS 10000

typedef struct uvccl__tls_ctx_s uvccl__tls_ctx_t;
typedef struct uvccl__tls_hs_s uvccl__tls_hs_t;

/* The TLS configuration the options name (cert, key and ca all given), else
 * the environment's ($UVCCL_TLS_CERT, $UVCCL_TLS_KEY, $UVCCL_TLS_CA);
 * none = 1: no TLS. 0 with *out NULL when TLS is not asked for, 0 with a
 * context (one reference), or UV_EINVAL with err saying what is wrong (a
 * file missing or unreadable, a key that does not match its certificate,
 * one of the three missing). */
int uvccl__tls_ctx_new(const char *cert, const char *key, const char *ca,
                       int none, uvccl__tls_ctx_t **out, char *err,
                       size_t errlen);
void uvccl__tls_ctx_ref(uvccl__tls_ctx_t *ctx);
void uvccl__tls_ctx_unref(uvccl__tls_ctx_t *ctx);
/* "kTLS" or "relay": how this process's connections are carried (known
 * after the first handshake; "" before). */
const char *uvccl__tls_mode(void);

/* status 0: fd is the connection's plaintext descriptor, now the
 * caller's. Else an error (UV_ECONNREFUSED and the like from the connect,
 * UVCCL_EAUTH when a certificate did not verify, UV_ETIMEDOUT, UVCCL_EPROTO)
 * and msg says why. Runs on the loop, never inside the starting call. */
typedef void (*uvccl__tls_cb)(void *arg, int status, int fd,
                              const char *msg);

/* Connects to addr and makes the client's handshake. hb_ms and
 * user_timeout tune the TCP socket as uvccl__tune_socket does. */
int uvccl__tls_connect(uvccl__tls_ctx_t *ctx, uv_loop_t *loop,
                       const struct sockaddr *addr, uint64_t hb_ms,
                       int user_timeout, uvccl__tls_cb cb, void *arg,
                       uvccl__tls_hs_t **out);
/* The server's handshake on an accepted TCP socket fd (taken over: closed
 * on failure). */
int uvccl__tls_accept(uvccl__tls_ctx_t *ctx, uv_loop_t *loop, int fd,
                      uint64_t hb_ms, int user_timeout, uvccl__tls_cb cb,
                      void *arg, uvccl__tls_hs_t **out);
/* Stops a handshake under way: its callback never runs, its socket is
 * closed, its memory goes once its handles closed. */
void uvccl__tls_cancel(uvccl__tls_hs_t *hs);

/* Why the TLS session of the connection whose plaintext descriptor is fd
 * ended, when it ended on an error (a TLS alert: the peer refused this
 * end's certificate, say): 1 and the reason in buf, once; else 0. Ask
 * before closing fd. */
int uvccl__tls_conn_error(int fd, char *buf, size_t len);

/* Accepts the connection waiting on server (a listening uv_tcp_t: call
 * from its connection callback) and makes the server's handshake on it,
 * on the server's loop, as uvccl__tls_accept; peer (may be NULL) gets its
 * address, "host:port". */
int uvccl__tls_accept_from(uvccl__tls_ctx_t *ctx, uv_stream_t *server,
                           uint64_t hb_ms, int user_timeout,
                           uvccl__tls_cb cb, void *arg, char *peer,
                           size_t peerlen, uvccl__tls_hs_t **out);

#endif
