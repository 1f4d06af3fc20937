/* uvccl: distributed communication on libuv.
 * Copyright (c) 2026 the uvccl authors. MIT License: see LICENSE.
 *
 * This is the one public header. Everything uvccl does runs on a uv_loop_t
 * that belongs to the caller; uvccl never runs, owns or hides a loop.
 *
 * Conventions (the same as libuv's):
 *  - Handles (stores, servers) and requests (work objects) are allocated by
 *    the caller and must not move while in use.
 *  - Every asynchronous call takes a uvccl_work_t and a callback, and
 *    returns 0 or a negative error code. If it returned 0 the callback runs
 *    exactly once, on the loop thread, never inside the call. If it returned
 *    an error the callback never runs.
 *  - Error codes are negative: libuv's (which are -errno on Unix) pass
 *    through unchanged, uvccl's own live in [-20999, -20000]. Every code has
 *    uvccl_strerror() and uvccl_err_name().
 *  - Nothing here is thread-safe unless it says so: call it from the loop's
 *    thread.
 */
#ifndef UVCCL_H
#define UVCCL_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define UVCCL_EXTERN __attribute__((visibility("default")))
#else
#define UVCCL_EXTERN
#endif

#define UVCCL_VERSION_MAJOR 0
#define UVCCL_VERSION_MINOR 1
#define UVCCL_VERSION_PATCH 0
#define UVCCL_VERSION_STRING "0.1.0"

UVCCL_EXTERN const char *uvccl_version_string(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

#define UVCCL_ERRNO_MAP(XX)                                                    \
  XX(EPROTO, -20001, "protocol violation")                                     \
  XX(ELIMIT, -20002, "size limit exceeded")                                    \
  XX(ENOKEY, -20003, "key not found")                                          \
  XX(ENOTNUM, -20004, "value is not an integer")                               \
  XX(ENOTSUP, -20005, "operation not supported by this store or dialect")      \
  XX(ECLOSING, -20006, "handle is closing")                                    \
  XX(EBUSY, -20007, "work object is already in use")                           \
  XX(EQEMPTY, -20008, "queue is empty")                                        \
  XX(ECONNLOST, -20009, "connection to the store server was lost")             \
  XX(EPEER, -20010, "a peer failed")                                           \
  XX(EABORTED, -20011, "aborted")                                              \
  XX(ENOTMEMBER, -20012, "not a member of the group")                          \
  XX(ENOGPU, -20013, "no GPU available")                                       \
  XX(ENOMEM_STORE, -20014, "store memory limit reached")                      \
  XX(ENCCL, -20015, "NCCL error")                                              \
  XX(ECUDA, -20016, "CUDA error")                                              \
  XX(EREVOKED, -20017, "the group was revoked")                                \
  XX(EMISMATCH, -20018, "ranks called mismatched collectives")              \
  XX(EAUTH, -20019, "authentication failed")                                   \
  XX(ECHECKSUM, -20020, "data arrived corrupted (checksum mismatch)")        \
  XX(ENOQUORUM, -20021, "this side of a divided world is not a quorum")

typedef enum {
#define UVCCL__ERR_ENUM(name, code, msg) UVCCL_##name = (code),
  UVCCL_ERRNO_MAP(UVCCL__ERR_ENUM)
#undef UVCCL__ERR_ENUM
  UVCCL_ERRNO_MIN = -20999,
  UVCCL_ERRNO_MAX = -20000
} uvccl_errno_t;

/* A human-readable message for any code: uvccl's, libuv's or -errno. */
UVCCL_EXTERN const char *uvccl_strerror(int err);
/* The symbolic name ("UVCCL_ENOKEY", "ECONNREFUSED", ...). */
UVCCL_EXTERN const char *uvccl_err_name(int err);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */

/* Levels, most verbose last. The initial level comes from the environment
 * variable UVCCL_LOG (error, warn, info, debug, trace or off; default warn).
 * Lines go to stderr as "uvccl[rank R] LEVEL component: message". */
typedef enum {
  UVCCL_LOG_OFF = 0,
  UVCCL_LOG_ERROR = 1,
  UVCCL_LOG_WARN = 2,
  UVCCL_LOG_INFO = 3,
  UVCCL_LOG_DEBUG = 4,
  UVCCL_LOG_TRACE = 5
} uvccl_log_level_t;

UVCCL_EXTERN void uvccl_log_set_level(uvccl_log_level_t level);
UVCCL_EXTERN uvccl_log_level_t uvccl_log_get_level(void);
/* Tags every following line with a rank (-1 removes the tag). */
UVCCL_EXTERN void uvccl_log_set_rank(int rank);
/* Replaces the sink (NULL restores stderr). The line has no newline. The
 * sink is called from uvccl's own threads too (the liveness monitor, the
 * GPU device threads), possibly at the same time as from the loop's: it
 * must be thread-safe. */
typedef void (*uvccl_log_sink_cb)(uvccl_log_level_t level,
                                  const char *component, const char *line,
                                  void *arg);
UVCCL_EXTERN void uvccl_log_set_sink(uvccl_log_sink_cb cb, void *arg);

/* ------------------------------------------------------------------------ */
/* Work objects                                                             */

/* The future that every asynchronous operation completes. The caller owns
 * the memory; zero it before its first use (uvccl_work_t w = {0}); it must
 * stay valid and unmoved from the call that starts the operation until the
 * callback has run. A work object may be reused for
 * another operation once its callback has run (or, with a NULL callback,
 * once uvccl_work_done() is true); call uvccl_work_cleanup() first if the
 * operation returned values. */
typedef struct uvccl_work_s uvccl_work_t;
typedef void (*uvccl_work_cb)(uvccl_work_t *work, int status);

typedef enum {
  UVCCL_WORK_IDLE = 0,  /* never started, or cleaned up */
  UVCCL_WORK_PENDING,   /* started, not yet completed */
  UVCCL_WORK_SUCCEEDED, /* status == 0 */
  UVCCL_WORK_FAILED,    /* status < 0, an error */
  UVCCL_WORK_TIMED_OUT, /* status == UV_ETIMEDOUT */
  UVCCL_WORK_CANCELLED  /* status == UV_ECANCELED */
} uvccl_work_state_t;

typedef struct {
  void *base;
  size_t len;
} uvccl_buf_t;

/* Private: how the owner of a work reacts to cancel and timeout. */
struct uvccl__work_ops;

#define UVCCL_WORK_MSG_LEN 192

struct uvccl_work_s {
  /* public */
  void *data;
  /* read-only */
  uvccl_work_state_t state;
  int status;           /* 0, or the negative error code */
  const char *op;       /* "store.get", ...: static string */
  char msg[UVCCL_WORK_MSG_LEN]; /* why it failed: which peer, key, op */
  /* Results, by operation (see each call): */
  int64_t result;       /* add, num_keys, delete_key, check, queue_len */
  void *value;          /* get, compare_set, queue_pop: owned by the work */
  size_t value_len;
  uvccl_buf_t *values;  /* multi_get, list_keys: owned by the work */
  size_t nvalues;
  /* in: per-operation timeout of collectives and point-to-point
   * operations; 0 = the group's. Left as set. */
  uint64_t timeout_ms;
  /* in: a label for the flight recorder's entry of the operation started
   * on this work (a training step, a request id; up to 31 bytes are
   * kept), or NULL. Left as set. */
  const char *tag;
  /* private */
  uv_loop_t *loop_;
  uvccl_work_cb cb_;
  uvccl_work_cb inner_cb_;  /* a wrapper (prefix store) may interpose */
  void *inner_data_;
  const struct uvccl__work_ops *ops_;
  void *owner_;
  uvccl_work_t *next_;
  uvccl_work_t *prev_;
  uint64_t timeout_ms_;
  uint64_t started_ms_;
  int flags_;
  int pending_status_;
  uv_timer_t timer_;
  uvccl_work_t *done_next_;  /* per-loop completion order */
  void *priv_[4];
};

/* True when the work is no longer pending (it may be idle). */
UVCCL_EXTERN int uvccl_work_done(const uvccl_work_t *work);
/* Cancels a pending work: its callback runs (on the loop, later) with
 * UV_ECANCELED unless it has already completed. Returns 0, or UV_EINVAL if
 * the work is not pending. */
UVCCL_EXTERN int uvccl_work_cancel(uvccl_work_t *work);
/* Runs the work's loop until the work is done: for code outside any
 * callback (bootstrap, tests, synchronous callers). Must not be called from
 * a callback of the same loop. Returns the work's status. A collective
 * that is already complete is delivered here without a loop turn (with the
 * works that completed before it, in order), and a busy-polling group with
 * shared memory reads its rings here for a few microseconds first; every
 * 16th such wait in a row turns the loop anyway, for its other handles. */
UVCCL_EXTERN int uvccl_work_wait(uvccl_work_t *work);
/* Frees the values an operation returned and makes the work idle. Safe on
 * an idle work. */
UVCCL_EXTERN void uvccl_work_cleanup(uvccl_work_t *work);
UVCCL_EXTERN const char *uvccl_work_state_name(uvccl_work_state_t state);

/* ------------------------------------------------------------------------ */
/* Stores                                                                   */

/* One handle type for every kind of store, so the collectives can
 * bootstrap over any of them: a TCP client (talking to a uvccl or PyTorch
 * TCPStore server), an in-process hash store, a prefix store over another
 * store, or a file store shared by processes on one host.
 *
 * Keys are NUL-terminated strings. Values are byte strings of any content.
 * Operations complete in the order they were started, except that get and
 * wait complete when their keys appear (or time out). */
typedef struct uvccl_store_s uvccl_store_t;
typedef void (*uvccl_store_close_cb)(uvccl_store_t *store);

typedef enum {
  UVCCL_STORE_TCP = 1,
  UVCCL_STORE_HASH,
  UVCCL_STORE_PREFIX,
  UVCCL_STORE_FILE
} uvccl_store_type_t;

struct uvccl__store_vtable;

struct uvccl_store_s {
  /* public */
  void *data;
  /* read-only */
  uvccl_store_type_t type;
  uv_loop_t *loop;
  /* private */
  const struct uvccl__store_vtable *vt_;
  void *impl_;
  uint64_t timeout_ms_;
  int closing_;
  uvccl_store_close_cb close_cb_;
};

/* The default timeout, as PyTorch's Store::kDefaultTimeout. */
#define UVCCL_STORE_DEFAULT_TIMEOUT_MS 300000
/* "No timeout" for uvccl_store_set_timeout and per-call timeouts. */
#define UVCCL_NO_TIMEOUT UINT64_MAX
/* Per-call timeout argument meaning "the store's timeout". */
#define UVCCL_DEFAULT_TIMEOUT 0

/* The timeout of get, wait and every other operation (0 restores the
 * default). */
UVCCL_EXTERN void uvccl_store_set_timeout(uvccl_store_t *store,
                                          uint64_t timeout_ms);
UVCCL_EXTERN uint64_t uvccl_store_get_timeout(const uvccl_store_t *store);

/* Closes any store: pending operations complete with UV_ECANCELED, then
 * close_cb runs (on the loop, later; may be NULL). The memory may be freed
 * in close_cb. A base store must outlive the prefix stores over it. */
UVCCL_EXTERN void uvccl_store_close(uvccl_store_t *store,
                                    uvccl_store_close_cb close_cb);

/* Operations. Results are in the work object (see struct uvccl_work_s).
 * The callback may be NULL (poll uvccl_work_done() or use uvccl_work_wait).
 * Common errors: UV_EINVAL (bad arguments), UVCCL_EBUSY (work pending),
 * UVCCL_ECLOSING (store closing), UVCCL_ENOTSUP (the store or dialect
 * lacks the operation: PyTorch 1.13's dialect has no append, multi_get,
 * multi_set, queues or list_keys; the file store has no queues) at the
 * call; UV_ETIMEDOUT, UVCCL_ECONNLOST, UV_ECONNREFUSED etc. in the
 * callback.
 *
 * Writes (set, append, multi_set, queue_push) complete only once the store
 * holds the data: on a TCP store, when a later reply on the same
 * connection proves the server applied them (the client adds a one-byte
 * probe when nothing else follows), never merely when the bytes left. */

/* Sets key to value (copied before the call returns). */
UVCCL_EXTERN int uvccl_store_set(uvccl_store_t *store, uvccl_work_t *work,
                                 const char *key, const void *value,
                                 size_t len, uvccl_work_cb cb);
/* Waits (up to the store's timeout) until key exists, then returns its
 * value in work->value / work->value_len. */
UVCCL_EXTERN int uvccl_store_get(uvccl_store_t *store, uvccl_work_t *work,
                                 const char *key, uvccl_work_cb cb);
/* Adds delta to the integer stored at key (missing counts as 0, stored as
 * decimal text); the new value is in work->result. UVCCL_ENOTNUM if the
 * value is not a number. */
UVCCL_EXTERN int uvccl_store_add(uvccl_store_t *store, uvccl_work_t *work,
                                 const char *key, int64_t delta,
                                 uvccl_work_cb cb);
/* PyTorch's compare_set: if key holds expected (or is missing and expected
 * is empty) it becomes desired. work->value is the value after the call
 * (for a missing key with non-empty expected: expected, as PyTorch). */
UVCCL_EXTERN int uvccl_store_compare_set(uvccl_store_t *store,
                                         uvccl_work_t *work, const char *key,
                                         const void *expected, size_t elen,
                                         const void *desired, size_t dlen,
                                         uvccl_work_cb cb);
/* work->result = 1 if every key exists now, else 0. Never waits. */
UVCCL_EXTERN int uvccl_store_check(uvccl_store_t *store, uvccl_work_t *work,
                                   const char *const *keys, size_t nkeys,
                                   uvccl_work_cb cb);
/* Completes when every key exists; UV_ETIMEDOUT after timeout_ms
 * (UVCCL_DEFAULT_TIMEOUT: the store's). */
UVCCL_EXTERN int uvccl_store_wait(uvccl_store_t *store, uvccl_work_t *work,
                                  const char *const *keys, size_t nkeys,
                                  uint64_t timeout_ms, uvccl_work_cb cb);
/* work->result = 1 if the key existed and was deleted, else 0. */
UVCCL_EXTERN int uvccl_store_delete_key(uvccl_store_t *store,
                                        uvccl_work_t *work, const char *key,
                                        uvccl_work_cb cb);
/* work->result = the number of keys. */
UVCCL_EXTERN int uvccl_store_num_keys(uvccl_store_t *store,
                                      uvccl_work_t *work, uvccl_work_cb cb);
/* Appends value to key (creating it). */
UVCCL_EXTERN int uvccl_store_append(uvccl_store_t *store, uvccl_work_t *work,
                                    const char *key, const void *value,
                                    size_t len, uvccl_work_cb cb);
/* Waits for every key, then work->values[i] is the value of keys[i]. */
UVCCL_EXTERN int uvccl_store_multi_get(uvccl_store_t *store,
                                       uvccl_work_t *work,
                                       const char *const *keys, size_t nkeys,
                                       uvccl_work_cb cb);
UVCCL_EXTERN int uvccl_store_multi_set(uvccl_store_t *store,
                                       uvccl_work_t *work,
                                       const char *const *keys,
                                       const uvccl_buf_t *values, size_t n,
                                       uvccl_work_cb cb);
/* Queues (newer dialect and in-process stores). */
UVCCL_EXTERN int uvccl_store_queue_push(uvccl_store_t *store,
                                        uvccl_work_t *work, const char *key,
                                        const void *value, size_t len,
                                        uvccl_work_cb cb);
/* Pops the oldest item into work->value. With block, waits (up to the
 * store's timeout) for one; without, fails with UVCCL_EQEMPTY. */
UVCCL_EXTERN int uvccl_store_queue_pop(uvccl_store_t *store,
                                       uvccl_work_t *work, const char *key,
                                       int block, uvccl_work_cb cb);
UVCCL_EXTERN int uvccl_store_queue_len(uvccl_store_t *store,
                                       uvccl_work_t *work, const char *key,
                                       uvccl_work_cb cb);
/* work->values = every key (work->values[i].base is NUL-terminated). */
UVCCL_EXTERN int uvccl_store_list_keys(uvccl_store_t *store,
                                       uvccl_work_t *work, uvccl_work_cb cb);

/* Blocking wrappers for bootstrap code: start the operation, then run the
 * store's loop until it completes (uvccl_work_wait). Not from callbacks. */
UVCCL_EXTERN int uvccl_store_set_sync(uvccl_store_t *store, const char *key,
                                      const void *value, size_t len);
/* *value is malloc'ed (NUL-terminated past len); free() it. */
UVCCL_EXTERN int uvccl_store_get_sync(uvccl_store_t *store, const char *key,
                                      void **value, size_t *len);
UVCCL_EXTERN int uvccl_store_add_sync(uvccl_store_t *store, const char *key,
                                      int64_t delta, int64_t *result);
UVCCL_EXTERN int uvccl_store_wait_sync(uvccl_store_t *store,
                                       const char *const *keys, size_t nkeys,
                                       uint64_t timeout_ms);

/* --- TCP store client ---------------------------------------------------- */

typedef enum {
  UVCCL_DIALECT_AUTO = 0,   /* server side: detect per connection */
  UVCCL_DIALECT_MODERN = 1, /* PyTorch >= 2.1: VALIDATE, PING, queues */
  UVCCL_DIALECT_LEGACY = 2  /* PyTorch 1.13 */
} uvccl_dialect_t;

typedef struct {
  const char *host;         /* name or address; required */
  int port;                 /* required */
  /* AUTO (0, the default): the newer dialect, or PyTorch 1.13's when the
   * server closes the connection at the newer one's opening (as 1.13's
   * server does: a torchrun 1.13 agent's store, say). MODERN, LEGACY:
   * that one only. */
  uvccl_dialect_t dialect;
  uint64_t timeout_ms;      /* store timeout, also the connect deadline;
                               0 = UVCCL_STORE_DEFAULT_TIMEOUT_MS */
  /* As PyTorch's client: if world_size > 0, the first connection adds 1 to
   * the unprefixed key "init/", which a PyTorch master started with
   * wait_for_workers counts to world_size before it goes on. */
  int world_size;
  /* A server that stops answering (stopped, hung, cut off) fails the
   * pending operations after this long with UV_ETIMEDOUT ("the server
   * stopped answering"), instead of at their own timeouts: a reply that
   * is due must come by then, and a long WAIT is watched with PINGs (the
   * newer dialect; the 1.13 dialect has no PING, so only keepalive finds
   * a vanished server there). 0 = $UVCCL_HEARTBEAT_TIMEOUT_MS, else 15 s;
   * UINT64_MAX = off. */
  uint64_t heartbeat_timeout_ms;
  /* Authentication, as the server's options say: the secret (auth_token,
   * else auth_file, else $UVCCL_AUTH_TOKEN, else $UVCCL_AUTH_FILE); with
   * one, every connection proves it and checks that the server holds it
   * too (a server with another secret, or none, fails the operations with
   * UVCCL_EAUTH, saying which). auth_none = 1: none. */
  const char *auth_token;
  const char *auth_file;
  int auth_none;
  /* TLS, as the server's options say (this client's certificate, its key,
   * the CA the server's must verify against; else $UVCCL_TLS_*;
   * tls_none = 1: none). A server whose certificate does not verify, or
   * that refuses this client's, fails the operations with UVCCL_EAUTH. */
  const char *tls_cert;
  const char *tls_key;
  const char *tls_ca;
  int tls_none;
} uvccl_tcp_store_options_t;

/* A client of a TCPStore server (ours or PyTorch's). It connects lazily on
 * the first operation, retrying with backoff until the timeout; a lost
 * connection fails the pending operations with UVCCL_ECONNLOST (naming the
 * server) and the next operation reconnects. Keys are sent as "/" + key,
 * as PyTorch's client does, so both see the same keys. */
UVCCL_EXTERN int uvccl_tcp_store_init(uv_loop_t *loop, uvccl_store_t *store,
                                      const uvccl_tcp_store_options_t *opts);
/* Connects now (and registers under "init/" if world_size was given). */
UVCCL_EXTERN int uvccl_tcp_store_connect(uvccl_store_t *store,
                                         uvccl_work_t *work, uvccl_work_cb cb);

/* --- TCP store server ---------------------------------------------------- */

typedef struct uvccl_store_server_s uvccl_store_server_t;
typedef void (*uvccl_store_server_close_cb)(uvccl_store_server_t *server);

typedef struct {
  const char *host;        /* NULL: "::" dual-stack, falling back to
                              0.0.0.0 */
  int port;                /* 0 picks a free port */
  int listen_fd;           /* >= 0: adopt this bound (listening or not)
                              socket instead of binding; -1 = none */
  int backlog;             /* 0 = somaxconn */
  size_t max_key_len;      /* 0 = 8 KiB, as PyTorch's libuv server */
  size_t max_value_len;    /* 0 = 8 MiB */
  size_t max_keys;         /* per request; 0 = 128 Ki */
  size_t max_memory;       /* keys + values held; 0 = 1 GiB */
  size_t max_output;       /* per connection, before reads pause;
                              0 = 64 MiB; also the largest MULTI_GET
                              reply */
  size_t max_request;      /* one whole request (MULTI_SET, WAIT, ...);
                              0 = 64 MiB, at least one largest SET */
  /* Authentication: clients must prove they hold this secret (a mutual
   * HMAC-SHA-256 challenge over fresh nonces, before any request; the
   * secret never crosses the wire) or are closed, with the reason logged
   * (rate-limited). auth_token: the secret; else auth_file: a file holding
   * it, readable by its owner only; else $UVCCL_AUTH_TOKEN, else the file
   * $UVCCL_AUTH_FILE; else none, and the server is open to anyone, as
   * PyTorch's. auth_none = 1: none, whatever the environment says.
   * PyTorch's clients cannot authenticate: a secured server refuses them. */
  const char *auth_token;
  const char *auth_file;
  int auth_none;
  /* TLS (OpenSSL, 1.2 or later): the server's certificate (PEM, chain
   * after it), its key, and the CA that clients' certificates must verify
   * against (every client presents one: mutual TLS). All three, else
   * $UVCCL_TLS_CERT, $UVCCL_TLS_KEY, $UVCCL_TLS_CA; tls_none = 1: no TLS.
   * A client that does not complete the handshake is closed, logged
   * (rate-limited). PyTorch's clients do not speak TLS. */
  const char *tls_cert;
  const char *tls_key;
  const char *tls_ca;
  int tls_none;
} uvccl_store_server_options_t;

struct uvccl_store_server_s {
  /* public */
  void *data;
  /* read-only */
  uv_loop_t *loop;
  int port;                /* the bound port */
  /* private */
  void *impl_;
  int backend_;
};

/* Starts serving on loop. Fills server->port. Errors: UV_EADDRINUSE and
 * other bind/listen errors, UV_EINVAL. */
UVCCL_EXTERN int uvccl_store_server_init(uv_loop_t *loop,
                                         uvccl_store_server_t *server,
                                         const uvccl_store_server_options_t *o);
/* Graceful shutdown: stops accepting, answers requests already received,
 * closes clients (after at most 2 s for clients that do not read their
 * replies), frees everything, then close_cb (may be NULL). */
UVCCL_EXTERN void uvccl_store_server_close(uvccl_store_server_t *server,
                                           uvccl_store_server_close_cb cb);

typedef struct {
  uint64_t connections;     /* open now */
  uint64_t accepted;        /* since start */
  uint64_t requests;        /* requests answered */
  uint64_t keys;            /* keys held */
  uint64_t memory;          /* bytes of keys and values held */
  uint64_t waiting;         /* connections with a pending WAIT */
  uint64_t protocol_errors; /* connections closed for bad input */
  uint64_t auth_failures;   /* connections closed for failing, or not
                               attempting, authentication */
} uvccl_store_server_stats_t;

UVCCL_EXTERN void uvccl_store_server_stats(const uvccl_store_server_t *server,
                                           uvccl_store_server_stats_t *stats);
/* The bound address (which family "::"-or-0.0.0.0 ended up on, the
 * address of an adopted socket). As uv_tcp_getsockname. */
UVCCL_EXTERN int uvccl_store_server_getsockname(
    const uvccl_store_server_t *server, struct sockaddr *name, int *namelen);

/* --- Other stores -------------------------------------------------------- */

/* An in-process store: a hash map on the loop (PyTorch's HashStore). */
UVCCL_EXTERN int uvccl_hash_store_init(uv_loop_t *loop, uvccl_store_t *store);

/* Every key of base, seen under "prefix/" (PyTorch's PrefixStore). The
 * prefix is copied. base must outlive this store. */
UVCCL_EXTERN int uvccl_prefix_store_init(uvccl_store_t *store,
                                         const char *prefix,
                                         uvccl_store_t *base);

/* A store in a file shared by the processes of one host (PyTorch's
 * FileStore, same file format). File I/O runs on libuv's thread pool;
 * get and wait poll the file. world_size > 0: the last of world_size users
 * to close removes the file (as PyTorch); <= 0: the file stays. */
UVCCL_EXTERN int uvccl_file_store_init(uv_loop_t *loop, uvccl_store_t *store,
                                       const char *path, int world_size);


/* ------------------------------------------------------------------------ */
/* Data types and reduction operations                                      */

typedef enum {
  UVCCL_INT8 = 0,
  UVCCL_UINT8,
  UVCCL_BOOL,       /* one byte, 0 or 1 */
  UVCCL_INT32,
  UVCCL_INT64,
  UVCCL_FLOAT16,    /* IEEE half; reduced in float32, rounded once */
  UVCCL_BFLOAT16,   /* reduced in float32, rounded to nearest even */
  UVCCL_FLOAT32,
  UVCCL_FLOAT64,
  UVCCL_COMPLEX64,  /* pairs of float32 (SUM, AVG, PREMUL_SUM only) */
  UVCCL_COMPLEX128, /* pairs of float64 (SUM, AVG, PREMUL_SUM only) */
  /* One byte each, for data movement only (broadcast, allgather, gather,
   * scatter, alltoall, send/recv): every reduction refuses them, as NCCL
   * does on most GPUs. PyTorch's float8_e4m3fn and float8_e5m2. */
  UVCCL_FLOAT8_E4M3,
  UVCCL_FLOAT8_E5M2,
  UVCCL_DTYPE_COUNT
} uvccl_dtype_t;

/* c10d's ReduceOp. Booleans: SUM and MAX are OR, PRODUCT and MIN are AND.
 * AVG divides the sum by the group size (integers: truncating, as NCCL).
 * PREMUL_SUM needs a factor: see uvccl_pg_premul_sum(). Bitwise ops are
 * for integers and bool only. */
typedef enum {
  UVCCL_SUM = 0,
  UVCCL_AVG,
  UVCCL_PRODUCT,
  UVCCL_MIN,
  UVCCL_MAX,
  UVCCL_BAND,
  UVCCL_BOR,
  UVCCL_BXOR,
  UVCCL_PREMUL_SUM,
  UVCCL_REDOP_COUNT
} uvccl_redop_t;

/* Bytes per element (0 for an invalid dtype). */
UVCCL_EXTERN size_t uvccl_dtype_size(uvccl_dtype_t dtype);
/* "float32", "bfloat16", ...; NULL for an invalid value. */
UVCCL_EXTERN const char *uvccl_dtype_name(uvccl_dtype_t dtype);
UVCCL_EXTERN const char *uvccl_redop_name(uvccl_redop_t op);
/* Parse a name (as above; also "float", "double", "half", "int", "long",
 * "bf16", "fp16", "fp32", "fp64", "prod", "avg", ...). 0 or UV_EINVAL. */
UVCCL_EXTERN int uvccl_dtype_from_name(const char *name, uvccl_dtype_t *out);
UVCCL_EXTERN int uvccl_redop_from_name(const char *name, uvccl_redop_t *out);
/* 0 if op applies to dtype, else UV_EINVAL (bitwise on floats, AVG on
 * bool, MIN/MAX/PRODUCT/bitwise on complex, PREMUL_SUM on integers). */
UVCCL_EXTERN int uvccl_redop_check(uvccl_redop_t op, uvccl_dtype_t dtype);
/* The reduction kernels the collectives use, exposed for tests and
 * benchmarks: dst[i] = dst[i] op src[i] for count elements. AVG and
 * PREMUL_SUM reduce as SUM here (the scaling happens once, at the end of a
 * collective). Returns 0 or UV_EINVAL. */
UVCCL_EXTERN int uvccl_reduce_local(void *dst, const void *src, size_t count,
                                    uvccl_dtype_t dtype, uvccl_redop_t op);
/* buf[i] *= factor for floats and complex (both parts); UV_EINVAL for
 * integers and bool (use uvccl_divide_local). */
UVCCL_EXTERN int uvccl_scale_local(void *buf, size_t count,
                                   uvccl_dtype_t dtype, double factor);
/* buf[i] /= divisor, truncating for integers. */
UVCCL_EXTERN int uvccl_divide_local(void *buf, size_t count,
                                    uvccl_dtype_t dtype, int64_t divisor);

/* ------------------------------------------------------------------------ */
/* Process groups (CPU, over TCP)                                           */

/* A group of ranks that run collectives together. The world group is made
 * from a store (or a URL); subgroups are made from a group and share its
 * connections. Every collective returns a work object whose callback runs
 * on the group's loop. Operations on one group must be started in the same
 * order on every rank (as c10d requires); operations on different groups
 * and point-to-point operations may interleave freely.
 *
 * Buffers are counted in elements of dtype (point-to-point and byte
 * collectives count bytes). Send and receive buffers must stay valid and
 * unmodified until the work completes; sendbuf == recvbuf means in place.
 *
 * GPU buffers in TCP groups: once the GPU side is loaded (any uvccl_gpu_*
 * call or an NCCL group loads it), every collective and point-to-point
 * operation accepts CUDA device memory too, mixed with host memory if need
 * be (one device per group): the device thread copies it to pinned host
 * memory, the operation runs there, and the results are copied back before
 * the work completes (so several processes can share one GPU, and GPU data
 * can be reduced without NCCL). The byte-payload collectives, whose
 * payloads live in host memory, refuse device memory with UV_ENOTSUP. */
typedef struct uvccl_pg_s uvccl_pg_t;
typedef void (*uvccl_pg_close_cb)(uvccl_pg_t *pg);

#define UVCCL_PG_DEFAULT_TIMEOUT_MS 1800000 /* 30 min, as c10d */
#define UVCCL_ANY_SOURCE (-1)

typedef struct {
  int rank;                 /* this process's rank, 0 <= rank < size */
  int size;                 /* world size */
  uint64_t timeout_ms;      /* default per-operation timeout, also the
                               creation deadline; 0 = 30 min */
  const char *prefix;       /* store key prefix; NULL = "uvccl/default" */
  /* Which address peers reach this rank on. host: an address or name to
   * bind and advertise. Else ifname, in NCCL's syntax ("eth0", "eth",
   * "^docker,lo", "=eth0"), else $UVCCL_SOCKET_IFNAME, else the interface
   * that routes to the store's host (loopback only when the store is on
   * loopback: loopback is never advertised to another host). */
  const char *host;
  const char *ifname;
  int family;               /* AF_UNSPEC (0), AF_INET or AF_INET6 */
  /* Spin this long (microseconds) polling for I/O before the loop sleeps
   * while collectives are in flight; 0 = $UVCCL_BUSY_POLL_US, else off.
   * UINT32_MAX forces off. Spinning turns itself off when this host runs
   * more ranks than it has CPUs (it would starve the peers it waits for),
   * unless $UVCCL_BUSY_POLL_FORCE=1. */
  uint32_t busy_poll_us;
  /* Algorithm thresholds (bytes); 0 = defaults. */
  size_t small_max;         /* allreduce/reduce_scatter: latency algorithms
                               at or below this */
  size_t segment;           /* pipelining segment for large messages */
  /* UVCCL_BACKEND_TCP (0): collectives over TCP on host buffers.
   * UVCCL_BACKEND_NCCL: collectives on GPU buffers through NCCL, on the
   * CUDA device `device` (-1 = $LOCAL_RANK, else rank modulo the number of
   * devices). */
  int backend;
  int device;
  /* NCCL groups: 0 (c10d's eager init) makes the communicator during
   * creation, whose work completes when it is ready; 1 completes creation
   * once the NCCL id is exchanged and makes the communicator with the
   * first operation (which waits for it; every rank must run one). */
  int lazy_init;
  /* Liveness: a rank silent this long (stopped, hung, cut off) is
   * declared failed by every survivor, whatever the operations' timeouts.
   * Heartbeats run on a thread of uvccl's, so a rank whose application
   * keeps its loop busy is never declared failed for it. 0 =
   * $UVCCL_HEARTBEAT_TIMEOUT_MS, else 15 s; UINT64_MAX = no heartbeats
   * (failures are then seen when connections break, and at timeouts). */
  uint64_t heartbeat_timeout_ms;
  /* Flight recorder (uvccl_trace_dump): the process's ring holds the last
   * this many operations of all its groups. 0 = $UVCCL_TRACE_BUFFER_SIZE,
   * else 2000; UVCCL_TRACE_OFF: this group's operations are not recorded.
   * The ring is one per process: it grows to the largest size asked. */
  uint32_t trace_buffer_size;
  /* Fingerprint checks: before each collective the members check that they
   * agree on what they call (sequence number, op, dtype, reduce op, root,
   * counts); a mismatch fails it on every member with UVCCL_EMISMATCH and a
   * message naming both sides, instead of a hang or wrong data. Costs one
   * small message to every other member per collective. 1 on, -1 off,
   * 0 = on when $UVCCL_DEBUG is "detail". Subgroups inherit it. */
  int fingerprint_check;
  /* The world's secret: auth_token, else auth_file, else (uvccl_pg_init)
   * the one the store client authenticates with, else $UVCCL_AUTH_TOKEN,
   * else $UVCCL_AUTH_FILE; auth_none = 1: none. Every rank must hold the
   * same. Every mesh connection and liveness link then proves it both ways
   * before anything else (a rank holding another secret, or none, fails
   * creation with UVCCL_EAUTH). uvccl_pg_init_url also secures the store
   * it makes or reaches with it (the embedded server and every rank's
   * client; see the store's auth options). */
  const char *auth_token;
  const char *auth_file;
  int auth_none;
  /* TLS for every mesh connection and liveness link (OpenSSL; 1.2 or
   * later): this rank's certificate (PEM, its chain after it), its key,
   * and the CA that every peer's certificate must verify against (both
   * ends present one: mutual TLS; no host name check). All three, else
   * $UVCCL_TLS_CERT, $UVCCL_TLS_KEY, $UVCCL_TLS_CA; tls_none = 1: no TLS.
   * A peer whose certificate does not verify fails creation with
   * UVCCL_EAUTH. Where the kernel does TLS (kTLS) the data path stays
   * zero-copy; else a relay thread encrypts. */
  const char *tls_cert;
  const char *tls_key;
  const char *tls_ca;
  int tls_none;
  /* What one uvccl callback may do on the loop before it returns to it
   * (see uvccl_pg_loop_stats): move turn_bytes, and run turn_us
   * microseconds (counted once it has moved 64 KiB; the clock guards
   * against memory that is slow for a while, as on a busy shared host).
   * 0 = $UVCCL_TURN_BYTES and $UVCCL_TURN_US, else the defaults below
   * (turn_bytes is at least 64 KiB); turn_us UINT32_MAX: no time limit.
   * Smaller keeps the loop more
   * responsive, at some cost in throughput. The world's values hold for
   * its subgroups. */
  size_t turn_bytes;
  uint32_t turn_us;
  /* Time uvccl's callbacks (uvccl_pg_loop_stats): 1 on, -1 off, 0 =
   * $UVCCL_LOOP_STATS (off unless 1). About 0.5 us a callback. */
  int loop_stats;
  /* Striped TCP: with a rank of another host, this many connections
   * (at most 16), and a frame of tcp_stripe_min bytes or more is cut
   * across them, received straight into place (one TCP stream loses much
   * of a lossy link's rate where round trips are long: 4 moved 3-4x one
   * connection's bytes under 1% loss and 2 ms round trips; on clean links
   * they gain nothing and cost up to a fifth in pipelined broadcasts,
   * bench/RESULTS.md). 0 = $UVCCL_TCP_STRIPES and
   * $UVCCL_TCP_STRIPE_MIN, else 1 (one connection) and 256 KiB. Every
   * rank of the world must have the same count (creation fails with
   * UV_EINVAL, naming both, where two differ). The world's values hold for
   * its subgroups. */
  int tcp_stripes;
  size_t tcp_stripe_min;
  /* GPU buffers (staged through pinned host memory): a collective of at
   * least two chunks of stage_chunk bytes (allreduce, broadcast, reduce:
   * the buffer; allgather, reduce_scatter: the ranks' blocks together)
   * goes chunk by chunk (at most 64, so larger chunks in larger ones),
   * so that the device copies of one chunk overlap the transfers of the
   * others. 0 = $UVCCL_STAGE_CHUNK, else 1 MiB; SIZE_MAX: whole. Every rank must have the same value, and a chunked
   * collective must be staged on every rank (GPU buffers everywhere): a
   * rank with host buffers runs it whole. Subgroups inherit it. */
  size_t stage_chunk;
} uvccl_pg_options_t;

#define UVCCL_TURN_BYTES_DEFAULT ((size_t)512 << 10)
#define UVCCL_TURN_US_DEFAULT 500

#define UVCCL_BACKEND_TCP 0
#define UVCCL_BACKEND_NCCL 1

struct uvccl_pg_s {
  /* public */
  void *data;
  /* read-only */
  uv_loop_t *loop;
  int rank;                 /* in this group; -1 when not a member */
  int size;
  /* private */
  void *impl_;
  int backend_;
};

/* Creates the world group over store (which must outlive creation only:
 * the group does not use it afterwards). Each rank listens, publishes its
 * address in the store, connects to every other rank (full mesh, with
 * retry and backoff), then waits on a store-based barrier. The work
 * completes when the group is ready (or failed; then destroy it). */
UVCCL_EXTERN int uvccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg,
                               uvccl_store_t *store,
                               const uvccl_pg_options_t *opts,
                               uvccl_work_t *work, uvccl_work_cb cb);
/* As uvccl_pg_init from a URL:
 *  - "env://": MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torchrun), or
 *    OMPI_COMM_WORLD_RANK/SIZE (mpirun), PMI_RANK/PMI_SIZE, or
 *    SLURM_PROCID/SLURM_NTASKS (srun). Rank 0 hosts the store server.
 *  - "tcp://HOST:PORT": a store server at HOST:PORT (rank 0 starts one
 *    there if none answers and HOST is local).
 *  - "file://PATH": a file store.
 * opts->rank/size override the environment when size > 0. The group owns
 * the store (and server) it made; they close with the group. */
UVCCL_EXTERN int uvccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg,
                                   const char *url,
                                   const uvccl_pg_options_t *opts,
                                   uvccl_work_t *work, uvccl_work_cb cb);
/* Destroys a group: pending work fails with UV_ECANCELED, connections are
 * closed cleanly (half-close, drain, close; never a reset) once no other
 * group uses them; then cb (may be NULL). The memory may be freed in cb.
 * Destroy subgroups before their parent... or not: a parent's connections
 * live until the last group using them is destroyed. */
UVCCL_EXTERN void uvccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb);
/* Fails every pending work of the group (and of every group sharing its
 * connections) with UVCCL_EABORTED at once; the group is unusable after
 * (destroy it). The other ranks learn it at once too, with the reason
 * ("rank 3 ... aborted by its application: reason"). */
UVCCL_EXTERN void uvccl_pg_abort(uvccl_pg_t *pg, const char *reason);

/* ---- Failures. When a rank fails, every survivor's pending work on the
 * groups that contain it fails with UVCCL_EPEER, and every later call on
 * those groups returns UVCCL_EPEER at once, with the same message in
 * work->msg: the rank that failed FIRST (group and global rank, address),
 * how, and who saw it, for instance
 *   "allreduce: rank 2 (global 2, 10.0.0.3:41234) failed: its process
 *    exited or was killed (connection closed)"
 *   "... failed: no heartbeat for 15.1 s (stopped, hung or unreachable)
 *    [seen by rank 0]"
 * A rank that fails a group because of a peer tells every other rank
 * first, so survivors that hear of it from a third rank still name the
 * right one. uvccl_pg_get_failure() says the same to code. */
typedef enum {
  UVCCL_FAIL_NONE = 0,
  UVCCL_FAIL_EXITED,      /* its process exited or was killed */
  UVCCL_FAIL_RESET,       /* its connection was reset or broke */
  UVCCL_FAIL_HEARTBEAT,   /* silent past the heartbeat timeout: stopped,
                             hung, or cut off by the network */
  UVCCL_FAIL_UNREACHABLE, /* the network gave up on it (TCP timeouts) */
  UVCCL_FAIL_ABORTED,     /* its application aborted (uvccl_pg_abort, or
                             its group creation failed) */
  UVCCL_FAIL_PROTOCOL,    /* it sent something invalid */
  UVCCL_FAIL_TIMEOUT,     /* an operation timed out waiting for it */
  UVCCL_FAIL_REVOKED,     /* the group was revoked (uvccl_pg_revoke) */
  UVCCL_FAIL_LEFT         /* it destroyed the group while needed */
} uvccl_fail_cause_t;

/* "exited", "reset", "heartbeat", ... */
UVCCL_EXTERN const char *uvccl_fail_cause_name(uvccl_fail_cause_t cause);

typedef struct {
  uvccl_fail_cause_t cause;
  int rank;           /* group rank of the culprit (-1: not a member) */
  int global_rank;    /* its world rank (-1: none, e.g. a timeout) */
  int reporter;       /* world rank that saw it (this rank, or the rank
                         whose notice told us) */
  int err;            /* the error code operations fail with */
  char address[64];   /* "host:port" of the culprit */
  char msg[UVCCL_WORK_MSG_LEN]; /* what every failing work says */
  int host;           /* the culprit's host (uvccl_pg_peer_host; -1: not
                         known) */
  int host_lost;      /* 1: every rank of that host failed (the host is
                         lost; msg then starts "host ADDR (global ranks
                         ...) lost: "), or, on a rank that every other
                         host failed, 2: this rank's host is likelier cut
                         off (msg: "every other host is lost to this
                         rank's ...") */
} uvccl_pg_failure_t;

/* 1 with *f filled when the group has failed or was revoked, 0 when it
 * is healthy, UV_EINVAL for bad arguments. */
UVCCL_EXTERN int uvccl_pg_get_failure(const uvccl_pg_t *pg,
                                      uvccl_pg_failure_t *f);
/* The group ranks this rank knows to have failed, in the order it
 * learned of them (the first is the culprit). Returns their number, which
 * may exceed max (only max are written). */
UVCCL_EXTERN int uvccl_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks,
                                       int max);
/* MPIX_Comm_revoke: not collective. Every pending and future operation
 * on the group fails, here and on every other rank, with UVCCL_EREVOKED
 * ("revoked by rank R: reason"). Other groups sharing the connections are
 * untouched. The group can then only be shrunk or destroyed. NCCL groups:
 * ncclCommRevoke (NCCL 2.28+, else UVCCL_ENOTSUP), which is local to the
 * rank that calls it: every rank revokes. */
UVCCL_EXTERN int uvccl_pg_revoke(uvccl_pg_t *pg, const char *reason);
/* MPIX_Comm_shrink / ncclCommShrink: collective over the surviving ranks
 * of pg. They agree on who failed (the agreement tolerates failures
 * during it) and *newpg becomes a group of the others, ranks renumbered
 * in their old order, sharing the live connections (no new sockets, no
 * store). Works on failed, revoked and healthy groups alike (a healthy
 * group's shrink keeps everyone). work->result is the number of ranks
 * removed. Subgroups of pg can be made again from *newpg. pg stays
 * unusable: destroy it. Across hosts, one side of a cut link goes on,
 * never both: a shrink that leaves out ranks of other hosts gone silent
 * (alive across the cut, perhaps) succeeds only on a side that keeps a
 * majority of the ranks kept or silent, or the half with the lowest of
 * them; the other side fails with UVCCL_ENOQUORUM (docs/failures.md;
 * UVCCL_SHRINK_QUORUM=0 turns the rule off; TCP groups only). NCCL
 * groups: ncclCommShrink (NCCL 2.27+, else UVCCL_ENOTSUP); NCCL does not
 * say who failed, so the survivors agree
 * through the store the group was made over (it must still be open): a
 * rank that has not joined within the heartbeat timeout is left out.
 * Groups made by split or new_group cannot be shrunk (no store): shrink
 * the world, then make them again. */
UVCCL_EXTERN int uvccl_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                                 uvccl_work_t *work, uvccl_work_cb cb);
/* uvccl_pg_shrink that also leaves out the group ranks in exclude
 * (c10d's shrink_group, ncclCommShrink's exclude list), failed or not:
 * only the others call it, each with the same list, and nobody waits for
 * the excluded. Ranks that failed are left out as well, so work->result
 * (the number removed) may exceed nexclude: compare it. UV_EINVAL (with
 * work->msg) for a rank outside the group or this rank itself. */
UVCCL_EXTERN int uvccl_pg_shrink_excluding(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                                           const int *exclude, int nexclude,
                                           uvccl_work_t *work,
                                           uvccl_work_cb cb);

/* Subgroup with the given parent ranks (in that order: group rank i is
 * parent rank ranks[i]). Every rank of the parent must call it, in the
 * same order. A non-member gets UVCCL_ENOTMEMBER (and pg->rank == -1;
 * nothing to destroy). No store, no new sockets: returns 0 and the group
 * is usable at once. tag (may be NULL): find-or-create, the same tag and
 * ranks give the existing group (then *pg becomes another handle of it,
 * destroyed separately). */
UVCCL_EXTERN int uvccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg,
                                    const int *ranks, int nranks,
                                    const char *tag);
/* c10d's split: ranks with the same color form a group, ordered by key
 * (ties by parent rank); color < 0 joins none (the work completes with
 * UVCCL_ENOTMEMBER). Collective over the parent (an allgather). */
UVCCL_EXTERN int uvccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg,
                                int color, int key, uvccl_work_t *work,
                                uvccl_work_cb cb);
/* Rank translation: -1 if not in the group. */
UVCCL_EXTERN int uvccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank);
UVCCL_EXTERN int uvccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank);
/* "host:port" the rank is reached at ("[v6]:port"), for messages. */
UVCCL_EXTERN const char *uvccl_pg_peer_address(const uvccl_pg_t *pg,
                                               int group_rank);
/* How frames to and from the rank travel: "shm" (shared memory: a rank of
 * this host; $UVCCL_TRANSPORT=tcp turns it off), "tcp", "self", "nccl",
 * or "?" (no such rank, or its connection is down). */
UVCCL_EXTERN const char *uvccl_pg_peer_transport(const uvccl_pg_t *pg,
                                                 int group_rank);
/* The host the rank runs on, as a number: 0, 1, ... in the order of each
 * host's lowest group rank. Ranks of one kernel share a host unless their
 * $UVCCL_HOST_ID differ (network namespaces standing for hosts). Large
 * collectives' rings and chains visit each host's ranks one after another
 * ($UVCCL_RING_ORDER). UV_EINVAL: no such rank; UVCCL_ENOTSUP: not known
 * (NCCL groups, and worlds above UVCCL_MESH_MAX ranks, which connect
 * lazily). */
UVCCL_EXTERN int uvccl_pg_peer_host(const uvccl_pg_t *pg, int group_rank);
UVCCL_EXTERN void uvccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms);
UVCCL_EXTERN void uvccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us);
/* A PREMUL_SUM with this factor: *op is an operation id valid in this
 * group for the group's lifetime (as ncclRedOpCreatePreMulSum). */
UVCCL_EXTERN int uvccl_pg_premul_sum(uvccl_pg_t *pg, double factor,
                                     uvccl_redop_t *op);

/* ---- How long uvccl holds the loop. Every callback uvccl runs on a TCP
 * group's loop (reading and writing its connections and shared-memory
 * rings, slices of local copies and reductions, the start of an operation
 * inside your call) moves at most about turn_bytes and runs about turn_us
 * (uvccl_pg_options_t), then returns to the loop, which comes back for the
 * rest, so your timers and sockets are served between them whatever the
 * collectives' sizes.
 * These counters say what those callbacks did, per world (subgroups
 * share their world's); your own callbacks (the works') are not counted.
 * Times are kept with loop_stats on (an option, or $UVCCL_LOOP_STATS=1):
 * each callback is then timed on the wall clock and on the loop thread's
 * CPU clock, whose difference is the time the operating system ran
 * something else (more ranks than CPUs). */
#define UVCCL_LOOP_HIST 8 /* under 0.1, 0.25, 0.5, 1, 2, 5, 10 ms; more */
typedef struct {
  uint64_t callbacks;       /* uvccl callbacks run on the loop */
  uint64_t bytes;           /* bytes they moved (copied, reduced, sent,
                               received), all together */
  uint64_t max_bytes;       /* the most one callback moved */
  int timed;                /* loop_stats on: the times below are kept */
  uint64_t wall_ns;         /* wall-clock time in them, all together */
  uint64_t cpu_ns;          /* the loop thread's CPU time in them */
  uint64_t max_wall_ns;     /* the longest callback, wall clock */
  uint64_t max_cpu_ns;      /* the longest, in CPU time */
  const char *max_wall_site; /* what the longest did ("read", "write",
                               "ring", "spin", "slice", "call", ...) */
  const char *max_cpu_site;
  uint64_t wall_hist[UVCCL_LOOP_HIST]; /* callbacks by wall time */
  uint64_t cpu_hist[UVCCL_LOOP_HIST];  /* callbacks by CPU time */
} uvccl_loop_stats_t;
/* Fills *stats; reset = 1 starts the counts anew afterwards. UV_EINVAL
 * for a group that is not a TCP group or is being destroyed. */
UVCCL_EXTERN int uvccl_pg_loop_stats(uvccl_pg_t *pg, uvccl_loop_stats_t *stats,
                                     int reset);

/* ---- A loop embedded in another event loop (asyncio, a GUI toolkit's):
 * the host watches uv_backend_fd(loop) for readability and calls
 * uv_run(loop, UV_RUN_NOWAIT) when it is readable or a timer is due. Call
 * this right before the host blocks, and block at most the milliseconds
 * it returns (-1: no limit; 0: do not block, turn again). It does what
 * uv_run's prepare phase does before a blocking poll: peers on shared
 * memory are told to ring this loop's doorbell (a readable backend fd)
 * when they write, which they do not while the loop is awake. Without it,
 * an embedded loop may sleep through their messages until its next timer.
 * UV_EINVAL for a NULL loop. */
UVCCL_EXTERN int uvccl_loop_before_block(uv_loop_t *loop);

/* ---- Collectives. Common errors at the call: UV_EINVAL (bad buffer,
 * count, root, dtype, op/dtype mismatch), UVCCL_EBUSY, UVCCL_ECLOSING,
 * UVCCL_EPEER (a peer already failed). In the callback: UVCCL_EPEER (the
 * message names the peer rank and address), UV_ETIMEDOUT, UVCCL_EABORTED,
 * UV_ECANCELED. */

UVCCL_EXTERN int uvccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work,
                                 void *buf, size_t count,
                                 uvccl_dtype_t dtype, int root,
                                 uvccl_work_cb cb);
UVCCL_EXTERN int uvccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work,
                                 const void *sendbuf, void *recvbuf,
                                 size_t count, uvccl_dtype_t dtype,
                                 uvccl_redop_t op, uvccl_work_cb cb);
/* Many buffers (lengths in bytes, multiples of the element size), reduced
 * in place as one operation. */
UVCCL_EXTERN int uvccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                                           const uvccl_buf_t *bufs,
                                           size_t nbufs, uvccl_dtype_t dtype,
                                           uvccl_redop_t op, uvccl_work_cb cb);
/* recvbuf is used at root only (may be NULL elsewhere). */
UVCCL_EXTERN int uvccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work,
                              const void *sendbuf, void *recvbuf,
                              size_t count, uvccl_dtype_t dtype,
                              uvccl_redop_t op, int root, uvccl_work_cb cb);
/* recvbuf holds size * count elements, rank i's at i * count. */
UVCCL_EXTERN int uvccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work,
                                 const void *sendbuf, void *recvbuf,
                                 size_t count, uvccl_dtype_t dtype,
                                 uvccl_work_cb cb);
/* Uneven: rank i contributes recvcounts[i] elements (sendcount must equal
 * recvcounts[rank]); recvbufs[i] receives them (a list, or pointers into
 * one buffer). */
UVCCL_EXTERN int uvccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work,
                                  const void *sendbuf, size_t sendcount,
                                  void *const *recvbufs,
                                  const size_t *recvcounts,
                                  uvccl_dtype_t dtype, uvccl_work_cb cb);
/* recvbuf (size * count elements) at root only. */
UVCCL_EXTERN int uvccl_gather(uvccl_pg_t *pg, uvccl_work_t *work,
                              const void *sendbuf, void *recvbuf,
                              size_t count, uvccl_dtype_t dtype, int root,
                              uvccl_work_cb cb);
/* sendbuf (size * count elements) at root only. */
UVCCL_EXTERN int uvccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                               const void *sendbuf, void *recvbuf,
                               size_t count, uvccl_dtype_t dtype, int root,
                               uvccl_work_cb cb);
/* sendbuf: size * count elements; recvbuf gets the reduction of block
 * `rank` (count elements). */
UVCCL_EXTERN int uvccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                                      const void *sendbuf, void *recvbuf,
                                      size_t count, uvccl_dtype_t dtype,
                                      uvccl_redop_t op, uvccl_work_cb cb);
/* Uneven: block i has recvcounts[i] elements, blocks contiguous. */
UVCCL_EXTERN int uvccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                       const void *sendbuf, void *recvbuf,
                                       const size_t *recvcounts,
                                       uvccl_dtype_t dtype, uvccl_redop_t op,
                                       uvccl_work_cb cb);
/* count elements to and from every rank; blocks contiguous, in rank
 * order. Not in place. */
UVCCL_EXTERN int uvccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *sendbuf, void *recvbuf,
                                size_t count, uvccl_dtype_t dtype,
                                uvccl_work_cb cb);
/* Split sizes (c10d's all_to_all_single): sendcounts[i] elements go to
 * rank i, recvcounts[i] come from it; blocks contiguous in rank order. */
UVCCL_EXTERN int uvccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work,
                                 const void *sendbuf,
                                 const size_t *sendcounts, void *recvbuf,
                                 const size_t *recvcounts,
                                 uvccl_dtype_t dtype, uvccl_work_cb cb);
/* Completes once every rank has started it, and after every operation
 * started earlier on this group has completed here. */
UVCCL_EXTERN int uvccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work,
                               uvccl_work_cb cb);
/* c10d's monitored_barrier: rank 0 collects every rank within the timeout
 * (work->timeout_ms, else the group's); on failure its message names the
 * rank that did not arrive (all of them with wait_all). */
UVCCL_EXTERN int uvccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work,
                                         int wait_all, uvccl_work_cb cb);

/* ---- Point to point (bytes). Messages from one rank with one tag arrive
 * in the order they were sent. recv: len is the capacity; the message may
 * be shorter (work->value_len = its length) but not longer (UVCCL_ELIMIT).
 * src may be UVCCL_ANY_SOURCE; work->result = the sender's group rank. */
UVCCL_EXTERN int uvccl_send(uvccl_pg_t *pg, uvccl_work_t *work,
                            const void *buf, size_t len, int dst, int tag,
                            uvccl_work_cb cb);
UVCCL_EXTERN int uvccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                            size_t len, int src, int tag, uvccl_work_cb cb);

typedef struct {
  int is_send;
  void *buf;
  size_t len;
  int peer;                 /* recv: may be UVCCL_ANY_SOURCE */
  int tag;
  size_t received;          /* out (recv) */
  int source;               /* out (recv) */
} uvccl_p2p_op_t;

/* c10d's batch_isend_irecv: every op started at once, one work. ops must
 * stay valid until it completes. */
UVCCL_EXTERN int uvccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work,
                                 uvccl_p2p_op_t *ops, size_t nops,
                                 uvccl_work_cb cb);

/* ---- Elastic worlds: growing. A running world admits njoin new ranks
 * (replacements for ranks it lost, or more): every member of pg (a world,
 * or the world a shrink made) calls uvccl_pg_grow; each newcomer calls
 * uvccl_pg_join. Both need a client of the world's store (the one it was
 * made over; for env:// worlds, uvccl_tcp_store_init to MASTER_ADDR and
 * MASTER_PORT, which must outlive rank 0 if rank 0 is to be replaced: see
 * uvccl-run --host-store) and opts with the prefix the world was first
 * made with, the same on all of them, plus what a creation takes (timeout,
 * backend, addresses). On success newpg is the new world of pg->size +
 * njoin ranks: members keep their ranks, joiners take the ranks after
 * them in the order they arrived; work->result is the grow's epoch (1,
 * 2, ... per store prefix), the same on every rank. Members agree first
 * (a collective over pg): a member dead by then fails it on all of them,
 * as a rank dying while the new world is made fails that on everyone;
 * each then keeps what it had (pg on members) and newpg needs no destroy.
 * A joiner that finds every place of the open grow taken waits for the
 * next grow. Each step has its own time limit (the store's, opts's
 * creation timeout); a cancelled grow destroys newpg itself, so its memory
 * must stay until the loop has run on.
 * CPU groups keep the members' connections: the joiners connect to them
 * and to each other, and take the global ranks after the largest the
 * world had (uvccl_pg_global_rank; members keep theirs). A subgroup, a
 * sparse world, or a world whose failed ranks would outnumber its live
 * ones is made anew instead (global ranks 0 .. size-1), as every grow is
 * with UVCCL_GROW=anew (docs/elastic.md). NCCL groups grow through ncclCommGrow, the members agreeing through the
 * store instead of a collective; UVCCL_ENOTSUP at the call (work->msg says
 * why) where the loaded NCCL is older than 2.29 (docs/elastic.md). */
UVCCL_EXTERN int uvccl_pg_grow(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                               uvccl_store_t *store, int njoin,
                               const uvccl_pg_options_t *opts,
                               uvccl_work_t *work, uvccl_work_cb cb);
/* A grow in which ranks also leave, in the same agreement (a general
 * reconfigure): every member of pg calls it with the same leave list
 * (nleave of pg's ranks, live ones: a dead rank is a shrink's), and
 * njoin newcomers call uvccl_pg_join as for a grow. The new world has
 * pg->size - nleave + njoin ranks: the members that stay keep their
 * order, renumbered from 0; the joiners follow. A rank that leaves
 * completes at the agreement with newpg->rank == -1 (nothing to
 * destroy); the rest as uvccl_pg_grow. Members that name different
 * lists all fail with UV_EINVAL at the agreement and keep pg. NCCL
 * groups: UVCCL_ENOTSUP where nleave > 0 (shrink, then grow).
 * uvccl_pg_grow is this call with no one leaving. */
UVCCL_EXTERN int uvccl_pg_reconfigure(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                                      uvccl_store_t *store, const int *leave,
                                      int nleave, int njoin,
                                      const uvccl_pg_options_t *opts,
                                      uvccl_work_t *work, uvccl_work_cb cb);
UVCCL_EXTERN int uvccl_pg_join(uv_loop_t *loop, uvccl_pg_t *newpg,
                               uvccl_store_t *store,
                               const uvccl_pg_options_t *opts,
                               uvccl_work_t *work, uvccl_work_cb cb);

/* ---- State transfer: brings ranks up to date (a joiner gets a model's
 * parameters and optimizer state from a member). root sends its bufs to
 * the group ranks in to[0..nto); each of those receives into its own
 * bufs, which must have the same count and lengths. Only root and the
 * ranks in to call it, each with the same root, to (in the same order)
 * and tag; to must not hold root or a rank twice.
 *
 * The bytes go in chunks of UVCCL_TRANSFER_CHUNK along a chain (root ->
 * to[0] -> to[1] ...), several in flight on each link, so each link
 * carries them once and a receiver forwards chunk k while chunk k+1
 * arrives; every chunk is checksummed (CRC-32C) by the root as it goes
 * out and by every receiver as it lands. Before any byte moves the root
 * checks every receiver's buffer lengths; a difference fails the transfer
 * on all of them with UVCCL_EMISMATCH, naming the rank and buffer. A
 * receiver whose bytes do not match the root's checksums fails with
 * UVCCL_ECHECKSUM naming the buffer, and so does the root (it completes
 * only once every receiver has confirmed its bytes: work->msg names the
 * first rank that did not). A peer that fails is UVCCL_EPEER, as for any
 * operation. Buffers are host memory. It is point-to-point traffic under
 * tag: no other message between these ranks may use that tag until it
 * completes. At most UVCCL_TRANSFER_MAX_BUFS buffers. */
#define UVCCL_TRANSFER_CHUNK (1u << 20)
#define UVCCL_TRANSFER_MAX_BUFS 65536
UVCCL_EXTERN int uvccl_pg_transfer(uvccl_pg_t *pg, uvccl_work_t *work,
                                   const uvccl_buf_t *bufs, size_t nbufs,
                                   int root, const int *to, int nto, int tag,
                                   uvccl_work_cb cb);

/* ---- Byte payloads of different lengths (the C side of c10d's object
 * collectives). Results are owned by the work (uvccl_work_cleanup). */
/* Root's bytes arrive in work->value / value_len everywhere (root too). */
UVCCL_EXTERN int uvccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                       const void *buf, size_t len, int root,
                                       uvccl_work_cb cb);
/* work->values[i] is rank i's bytes (nvalues == size). */
UVCCL_EXTERN int uvccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                       const void *buf, size_t len,
                                       uvccl_work_cb cb);
/* At root, work->values[i] is rank i's bytes; elsewhere nothing. */
UVCCL_EXTERN int uvccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                    const void *buf, size_t len, int root,
                                    uvccl_work_cb cb);
/* Root passes size buffers (others NULL, 0); each rank's bytes arrive in
 * work->value. */
UVCCL_EXTERN int uvccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                                     const uvccl_buf_t *bufs, size_t nbufs,
                                     int root, uvccl_work_cb cb);

/* ------------------------------------------------------------------------ */
/* Flight recorder                                                          */

/* Every process records the last operations of all its groups, TCP and
 * NCCL (UVCCL_TRACE_BUFFER_SIZE entries, default 2000; 0 turns it off):
 * group, sequence number (collectives and point-to-point counted apart),
 * op, dtype, counts, root or peer, reduce op, work->tag, state (queued,
 * started, completed, failed, timed_out, cancelled) with its times and
 * error, and, for a pending TCP operation, the peers it still waits for.
 * A dump is one JSON document (format "uvccl-flight-recorder", version 1:
 * docs/trace-format.md). With UVCCL_TRACE_DIR set, every rank dumps there
 * by itself when one of its operations times out or fails because of a
 * peer (uvccl-trace.RANK.PID.json, at most every 200 ms). */
#define UVCCL_TRACE_OFF UINT32_MAX

/* Writes a dump to path (NULL: $UVCCL_TRACE_DIR/uvccl-trace.RANK.PID.json,
 * the directory made if missing; UV_EINVAL when that is unset), through a
 * temporary file renamed into place. loop: the loop the caller runs on, or NULL; pending operations of
 * the groups on that loop also list the peers they wait for. reason is
 * written into the dump ("requested" when NULL). Thread-safe; returns 0 or
 * an error (the file's). */
UVCCL_EXTERN int uvccl_trace_dump(uv_loop_t *loop, const char *path,
                                  const char *reason);
/* The same document in *json (malloc'ed, NUL-terminated; free() it). */
UVCCL_EXTERN int uvccl_trace_json(uv_loop_t *loop, const char *reason,
                                  char **json, size_t *len);
/* Dumps whenever signal signum arrives, if the application wants that
 * (uvccl never installs a handler by itself): starts handle, the caller's
 * uv_signal_t, on loop; every delivery writes a dump to $UVCCL_TRACE_DIR
 * (the current directory when unset) from the loop. The handle does not
 * keep the loop alive; close it with uv_close() as any handle. Returns 0
 * or libuv's error. uvccl-bench does it for SIGUSR2; uvccl-run passes
 * SIGUSR2 on to its ranks. */
UVCCL_EXTERN int uvccl_trace_signal_start(uv_loop_t *loop,
                                          uv_signal_t *handle, int signum);

/* ------------------------------------------------------------------------ */
/* GPU                                                                      */

/* CUDA is loaded at run time (libcudart.so.13 or .12; $UVCCL_CUDART names
 * another file), never linked: the same binary runs where there is no GPU
 * or no driver, and then every GPU entry point returns UVCCL_ENOGPU. The
 * first GPU call loads it, once per process (thread-safe).
 *
 * The helpers below are blocking and for setup code and tests, not for
 * hot paths: they call CUDA on the calling thread and wait for it. They
 * return 0 or a negative code: UVCCL_ENOGPU (no usable CUDA), UV_EINVAL,
 * UV_ENOMEM (allocation failed) or UVCCL_ECUDA (any other CUDA error; the
 * log, UVCCL_LOG=error, says which call and why). */

/* The number of CUDA devices: 0 with *count set, or UVCCL_ENOGPU (then
 * *count is 0). */
UVCCL_EXTERN int uvccl_gpu_device_count(int *count);
/* Why the GPU side is unavailable ("cannot load the CUDA runtime ...",
 * "cudaGetDeviceCount: CUDA driver version is insufficient ...",
 * "built without CUDA (CUDA=no)"), or NULL when it is available. */
UVCCL_EXTERN const char *uvccl_gpu_unavailable_reason(void);
/* The device's name (truncated to namelen) and the CUDA versions as CUDA
 * encodes them (13000 = 13.0). Any output may be NULL. */
UVCCL_EXTERN int uvccl_gpu_info(int device, char *name, size_t namelen,
                                int *driver_version, int *runtime_version);
/* n bytes of memory on device (makes device current on this thread). */
UVCCL_EXTERN int uvccl_gpu_malloc(int device, void **p, size_t n);
UVCCL_EXTERN int uvccl_gpu_free(void *p);
/* n bytes of pinned (page-locked) host memory, usable by every device. */
UVCCL_EXTERN int uvccl_gpu_host_alloc(void **p, size_t n);
UVCCL_EXTERN int uvccl_gpu_host_free(void *p);
/* A synchronous copy in any direction (host or device, either side). */
UVCCL_EXTERN int uvccl_gpu_memcpy(void *dst, const void *src, size_t n);
/* Sets n bytes of device memory at p to (unsigned char)value, and waits. */
UVCCL_EXTERN int uvccl_gpu_memset(void *p, int value, size_t n);
/* 1 with *device set if p is device (or managed) memory, 0 if not (then
 * *device is -1), or UVCCL_ENOGPU. device may be NULL. */
UVCCL_EXTERN int uvccl_gpu_ptr_device(const void *p, int *device);

/* ---- NCCL process groups (uvccl_pg_init with backend UVCCL_BACKEND_NCCL)
 *
 * The same process-group API on CUDA device buffers, through NCCL (loaded
 * at run time: $UVCCL_NCCL, else libnccl.so.2). Creation: rank 0 makes
 * the NCCL id and publishes it in the store under PREFIX/nccl/id/<gen>;
 * the communicator is nonblocking, so neither the loop nor the device
 * thread ever waits for peers. Failures: UVCCL_ENOGPU (no GPU or no NCCL:
 * the work's message says why) or UVCCL_ENCCL (NCCL's error string and
 * ncclGetLastError). uvccl_pg_init_url works as for TCP groups (env://
 * also takes the device from LOCAL_RANK, or mpirun's/srun's local rank).
 * Every operation runs on the group's own CUDA stream, in call order; its
 * callback runs on the loop once the GPU finished it. Timeouts
 * (work->timeout_ms, else the group's) count from when the operation
 * starts on the GPU. Cancel and timeout release the work, not the GPU:
 * buffers must stay valid until the stream passed the operation. After
 * a timeout or an NCCL error, abort the group (then destroy it).
 * Asynchronous NCCL errors (a peer died) are polled every
 * $UVCCL_NCCL_WATCHDOG_MS (default 100) while operations are pending;
 * they fail the pending work with UVCCL_ENCCL and later calls too.
 * Differences from the TCP groups:
 *  - send/recv: tags are accepted but not compared (NCCL matches messages
 *    per peer in call order); no UVCCL_ANY_SOURCE (UV_ENOTSUP); a receive
 *    must post the exact length sent; send/recv to oneself only inside
 *    uvccl_p2p_batch (with the matching receive).
 *  - reductions: no BAND/BOR/BXOR (UV_EINVAL); bool SUM is OR (MAX),
 *    PRODUCT is AND (MIN); AVG is ncclAvg; PREMUL_SUM is NCCL's PreMulSum.
 *  - monitored_barrier and the *_bytes collectives: UV_ENOTSUP (use a TCP
 *    group).
 *  - split: NCCL groups by color and orders by key (ncclCommSplit);
 *    rank translation of such groups is unknown (-1) except for oneself.
 *  - uvccl_pg_peer_address names this rank's device ("cuda:N") only. */

/* The CUDA stream cuda_stream (a cudaStream_t; NULL = the legacy default
 * stream) waits for everything started on pg so far: work queued on it
 * later runs after those collectives. cb runs on the loop once the
 * dependency is in place (the host never waits for the GPU). */
UVCCL_EXTERN int uvccl_nccl_stream_wait(uvccl_pg_t *pg, uvccl_work_t *work,
                                        void *cuda_stream, uvccl_work_cb cb);
/* The other direction: operations started on pg after this call wait for
 * the work already queued on cuda_stream (e.g. the kernel that filled the
 * send buffer). */
UVCCL_EXTERN int uvccl_nccl_wait_stream(uvccl_pg_t *pg, uvccl_work_t *work,
                                        void *cuda_stream, uvccl_work_cb cb);

#ifdef __cplusplus
}
#endif
#endif /* UVCCL_H */
