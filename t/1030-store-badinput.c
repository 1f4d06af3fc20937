/* Bad input against the TCPStore server, from raw TCP clients on
 * 127.0.0.1: garbage, truncated requests, lengths near 2^64, requests over
 * the limits, clients that stall mid-request or never read their replies,
 * thousands of idle or half-sent connections, the memory limit, waits whose
 * client goes away, CANCEL_WAIT and BARRIER, requests pipelined or split
 * byte by byte, clients that half-close, single requests whose size or
 * reply only the product of the limits bounds (MULTI_SET, MULTI_GET), and
 * a shutdown with a client that does not read.
 *
 * Every case checks that the bad connection is closed where it should be,
 * that clients connected before it (one per dialect) still get exact
 * answers, and that a new client can still connect.
 *
 * The server runs on its own loop in its own thread; this thread only
 * talks to it through sockets, and reads its stats through a uv_async_t
 * that snapshots them on the server thread. */
#include "tap.h"
#include "uvccl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

/* The server's limits, small so the tests can reach them. */
#define MAX_KEY 1024
#define MAX_VALUE (1 << 20)
#define MAX_KEYS 1000
#define MAX_MEMORY (64 << 20)
#define MAX_OUTPUT (1 << 20)

/* Generous: only there to turn a hang into a failure. */
#define IO_TIMEOUT_MS 10000

#define MAGIC 0x3C85F7CEu

/* A fatal setup check that prints nothing when it holds. */
#define must(cond, ...)                                                      \
  do {                                                                       \
    if (!(cond)) tap_require(0, __VA_ARGS__);                                \
  } while (0)

static double now_ms(void);

/* ---- The server thread ---------------------------------------------------- */

static uv_loop_t loop;
static uvccl_store_server_t server;
static uv_async_t stop_async, stats_async;
static uv_thread_t server_thread;
static int server_closed; /* server thread; read after the join */
static int port;

static uv_mutex_t st_mu;
static uv_cond_t st_cv;
static uint64_t st_asked, st_answered;   /* under st_mu */
static uvccl_store_server_stats_t st_snap; /* under st_mu */

static void on_stats(uv_async_t *a) {
  (void)a;
  uv_mutex_lock(&st_mu);
  uvccl_store_server_stats(&server, &st_snap);
  st_answered = st_asked;
  uv_cond_broadcast(&st_cv);
  uv_mutex_unlock(&st_mu);
}

static void on_server_closed(uvccl_store_server_t *s) {
  (void)s;
  server_closed = 1;
}

static void on_stop(uv_async_t *a) {
  (void)a;
  uvccl_store_server_close(&server, on_server_closed);
  uv_close((uv_handle_t *)&stats_async, NULL);
  uv_close((uv_handle_t *)&stop_async, NULL);
}

static int server_done; /* under st_mu */

static void server_main(void *arg) {
  (void)arg;
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_mutex_lock(&st_mu);
  server_done = 1;
  uv_cond_broadcast(&st_cv);
  uv_mutex_unlock(&st_mu);
}

/* Whether the server thread finished within the hang timeout. */
static int server_finished(void) {
  int done;
  double end = now_ms() + IO_TIMEOUT_MS;
  uv_mutex_lock(&st_mu);
  while (!server_done && now_ms() < end)
    uv_cond_timedwait(&st_cv, &st_mu, (uint64_t)100 * 1000000);
  done = server_done;
  uv_mutex_unlock(&st_mu);
  return done;
}

/* The server's stats, taken on its thread. */
static uvccl_store_server_stats_t stats(void) {
  uvccl_store_server_stats_t s;
  uint64_t mine;
  uv_mutex_lock(&st_mu);
  mine = ++st_asked;
  uv_mutex_unlock(&st_mu);
  uv_async_send(&stats_async);
  uv_mutex_lock(&st_mu);
  while (st_answered < mine) {
    if (uv_cond_timedwait(&st_cv, &st_mu, (uint64_t)IO_TIMEOUT_MS * 1000000) !=
        0) {
      uv_mutex_unlock(&st_mu);
      tap_require(0, "the server thread answers a stats request");
    }
  }
  s = st_snap;
  uv_mutex_unlock(&st_mu);
  return s;
}

/* ---- Small helpers ----------------------------------------------------------- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Polls the stats until field == want (or the hang timeout); returns the
 * last value seen. */
#define STAT_FIELD_CONNECTIONS 0
#define STAT_FIELD_WAITING 1
static uint64_t wait_stat(int field, uint64_t want) {
  double end = now_ms() + IO_TIMEOUT_MS;
  uint64_t v;
  for (;;) {
    uvccl_store_server_stats_t s = stats();
    v = field == STAT_FIELD_CONNECTIONS ? s.connections : s.waiting;
    if (v == want || now_ms() > end) return v;
    sleep_ms(5);
  }
}

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  if (f == NULL) return -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (sscanf(line, "VmRSS: %ld kB", &v) == 1) break;
  fclose(f);
  return v;
}

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* SIGPIPE raised by the server's writes (the test's own sends use
 * MSG_NOSIGNAL): counted, reported at the end. */
static volatile sig_atomic_t sigpipes;
static void on_sigpipe(int sig) {
  (void)sig;
  sigpipes++;
}

/* ---- Raw sockets -------------------------------------------------------------- */

static int tcp_connect(void) {
  struct sockaddr_in a;
  struct timeval tv = {IO_TIMEOUT_MS / 1000, 0};
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* 0, or -1 (errno) */
static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t r = send(fd, c, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

/* 1: all n bytes; 0: EOF first; -1: error or timeout. */
static int recv_all(int fd, void *p, size_t n) {
  char *c = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, c + got, n - got, 0);
    if (r > 0) got += (size_t)r;
    else if (r == 0) return 0;
    else if (errno != EINTR) return -1;
  }
  return 1;
}

/* Whether the server closes fd (EOF or a reset) within the hang timeout;
 * whatever it sends before is discarded. */
static int expect_closed(int fd) {
  static char sink[65536];
  double end = now_ms() + IO_TIMEOUT_MS;
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    double left = end - now_ms();
    ssize_t n;
    int r;
    if (left <= 0) return 0;
    r = poll(&p, 1, (int)left + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0) {
      if (errno == ECONNRESET) return 1;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 0;
    }
  }
}

static int closed_then_close(int fd) {
  int r = fd >= 0 && expect_closed(fd);
  if (fd >= 0) close(fd);
  return r;
}

/* Whether fd has nothing to read right now (no stray reply waiting). */
static int nothing_pending(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* ---- Encoding ----------------------------------------------------------------- */

typedef struct {
  uint8_t *p;
  size_t len, cap;
} buf_t;

static void b_bytes(buf_t *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    b->p = realloc(b->p, cap);
    must(b->p != NULL, "realloc");
    b->cap = cap;
  }
  if (n > 0) memcpy(b->p + b->len, p, n);
  b->len += n;
}
static void b_u8(buf_t *b, uint8_t v) { b_bytes(b, &v, 1); }
static void b_u32(buf_t *b, uint32_t v) { b_bytes(b, &v, 4); }
static void b_u64(buf_t *b, uint64_t v) { b_bytes(b, &v, 8); }
static void b_i64(buf_t *b, int64_t v) { b_bytes(b, &v, 8); }
static void b_blob(buf_t *b, const void *p, size_t n) {
  b_u64(b, n);
  b_bytes(b, p, n);
}
static void b_str(buf_t *b, const char *s) { b_blob(b, s, strlen(s)); }
static void b_fill(buf_t *b, int c, size_t n) {
  while (n > 0) {
    uint8_t chunk[4096];
    size_t m = n < sizeof(chunk) ? n : sizeof(chunk);
    memset(chunk, c, m);
    b_bytes(b, chunk, m);
    n -= m;
  }
}
static void b_reset(buf_t *b) { b->len = 0; }
static void b_free(buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* Opcodes per dialect (notes §1.2 and §2). */
enum {
  Q_SET,
  Q_CAS,
  Q_GET,
  Q_ADD,
  Q_CHECK,
  Q_WAIT,
  Q_NUMKEYS,
  Q_DELETE,
  Q_APPEND,
  Q_MGET,
  Q_MSET,
  Q_CANCEL,
  Q_PING,
  Q_VALIDATE
};
static uint8_t opc(int modern, int q) {
  static const uint8_t m[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0};
  static const uint8_t l[] = {0, 1, 2, 3, 4, 5, 6, 8};
  if (modern) return m[q];
  must(q < (int)sizeof(l), "opcode %d exists in 1.13", q);
  return l[q];
}

static void e_validate(buf_t *b) {
  b_u8(b, 0);
  b_u32(b, MAGIC);
}
static void e_ping(buf_t *b, uint32_t nonce) {
  b_u8(b, 13);
  b_u32(b, nonce);
}
static void e_set(buf_t *b, int m, const char *k, const void *v, size_t n) {
  b_u8(b, opc(m, Q_SET));
  b_str(b, k);
  b_blob(b, v, n);
}
static void e_key(buf_t *b, int m, int q, const char *k) {
  b_u8(b, opc(m, q));
  b_str(b, k);
}
static void e_add(buf_t *b, int m, const char *k, int64_t d) {
  e_key(b, m, Q_ADD, k);
  b_i64(b, d);
}
static void e_keys(buf_t *b, int m, int q, size_t n, const char *const *k) {
  size_t i;
  b_u8(b, opc(m, q));
  b_u64(b, n);
  for (i = 0; i < n; i++) b_str(b, k[i]);
}
static void e_cas(buf_t *b, int m, const char *k, const char *e,
                  const char *d) {
  e_key(b, m, Q_CAS, k);
  b_str(b, e);
  b_str(b, d);
}

/* A modern client: connected, validated and pinged. -1 on failure. */
static int open_modern(void) {
  buf_t b = {0};
  uint32_t echo = 0, nonce = (uint32_t)getpid() ^ (uint32_t)rng();
  int fd = tcp_connect();
  if (fd < 0) return -1;
  e_validate(&b);
  e_ping(&b, nonce);
  if (send_all(fd, b.p, b.len) != 0 || recv_all(fd, &echo, 4) != 1 ||
      echo != nonce) {
    close(fd);
    fd = -1;
  }
  b_free(&b);
  return fd;
}

static int open_client(int modern) {
  return modern ? open_modern() : tcp_connect();
}

/* Round trips. Return 1 on success. */
static int rt_i64(int fd, const buf_t *b, int64_t *out) {
  return send_all(fd, b->p, b->len) == 0 && recv_all(fd, out, 8) == 1;
}
static int rt_u8(int fd, const buf_t *b, uint8_t *out) {
  return send_all(fd, b->p, b->len) == 0 && recv_all(fd, out, 1) == 1;
}
static int rt_add(int fd, int m, const char *k, int64_t d, int64_t *out) {
  buf_t b = {0};
  int r;
  e_add(&b, m, k, d);
  r = rt_i64(fd, &b, out);
  b_free(&b);
  return r;
}
/* Reads a bytes reply (u64 length + bytes) into a malloc'ed buffer. */
static int recv_blob(int fd, uint8_t **v, uint64_t *n) {
  *v = NULL;
  if (recv_all(fd, n, 8) != 1 || *n > (uint64_t)MAX_VALUE) return 0;
  *v = malloc(*n ? *n : 1);
  if (*v == NULL || recv_all(fd, *v, *n) != 1) {
    free(*v);
    *v = NULL;
    return 0;
  }
  return 1;
}
static int rt_get(int fd, int m, const char *k, uint8_t **v, uint64_t *n) {
  buf_t b = {0};
  int r;
  e_key(&b, m, Q_GET, k);
  r = send_all(fd, b.p, b.len) == 0 && recv_blob(fd, v, n);
  b_free(&b);
  return r;
}

/* ---- The well-behaved clients ------------------------------------------------ */

static int good_m = -1, good_l = -1; /* connected first, kept to the end */
static int64_t good_m_n, good_l_n;   /* their counters */

/* A round trip on the good modern client: the server has read whatever
 * was sent to it on other connections before this returns. */
static int sync_server(void) {
  buf_t b = {0};
  uint32_t nonce = (uint32_t)rng(), echo = ~nonce;
  int r;
  e_ping(&b, nonce);
  r = send_all(good_m, b.p, b.len) == 0 && recv_all(good_m, &echo, 4) == 1 &&
      echo == nonce;
  b_free(&b);
  return r;
}

static int64_t num_keys(void) {
  buf_t b = {0};
  int64_t n = -1;
  b_u8(&b, opc(1, Q_NUMKEYS));
  if (!rt_i64(good_m, &b, &n)) n = -1;
  b_free(&b);
  return n;
}

/* CHECK([key]) from the good client: 0 READY, 1 NOT_READY, -1 broken. */
static int check_key(const char *k) {
  buf_t b = {0};
  uint8_t r = 0xff;
  e_keys(&b, 1, Q_CHECK, 1, &k);
  if (!rt_u8(good_m, &b, &r)) r = 0xff;
  b_free(&b);
  return r == 0xff ? -1 : r;
}

static int64_t delete_key(const char *k) {
  buf_t b = {0};
  int64_t r = -1;
  e_key(&b, 1, Q_DELETE, k);
  if (!rt_i64(good_m, &b, &r)) r = -1;
  b_free(&b);
  return r;
}

/* (b): the clients connected before keep getting exact answers, and a new
 * client can connect. */
static void check_service(const char *what) {
  int64_t r1 = -1, r2 = -1;
  int a, b, c, fd;
  a = rt_add(good_m, 1, "good", 1, &r1) && r1 == good_m_n + 1;
  if (a) good_m_n = r1;
  b = rt_add(good_l, 0, "good13", 1, &r2) && r2 == good_l_n + 1;
  if (b) good_l_n = r2;
  fd = open_modern();
  c = fd >= 0;
  if (fd >= 0) close(fd);
  if (!ok(a && b && c, "%s: earlier clients still served, new ones accepted",
          what))
    note("modern add -> %lld (want %lld), 1.13 add -> %lld (want %lld), "
         "new connection %s",
         (long long)r1, (long long)good_m_n + 1, (long long)r2,
         (long long)good_l_n + 1, c ? "ok" : "failed");
}

static uint64_t baseline_conns; /* the good clients */

static void check_back_to_baseline(const char *what) {
  is_int(wait_stat(STAT_FIELD_CONNECTIONS, baseline_conns), baseline_conns,
         "%s: stats.connections back to the baseline", what);
}

/* ---- Pipelining and splitting --------------------------------------------- */

/* A request stream touching every reply shape, and the exact replies. Keys
 * live under pfx. nkeys0 is GETNUMKEYS before the stream. */
static void build_stream(int m, const char *pfx, int64_t nkeys0, buf_t *rq,
                         buf_t *rp) {
  char a[64], n[64], c[64], miss[64];
  const char *ka[2], *kaa[2];
  snprintf(a, sizeof(a), "%sa", pfx);
  snprintf(n, sizeof(n), "%sn", pfx);
  snprintf(c, sizeof(c), "%sc", pfx);
  snprintf(miss, sizeof(miss), "%smissing", pfx);
  ka[0] = a;
  ka[1] = miss;
  kaa[0] = a;
  kaa[1] = a;
  if (m) {
    e_validate(rq);
    e_ping(rq, 0x01020304);
    b_u32(rp, 0x01020304);
  }
  e_set(rq, m, a, "va", 2);
  e_key(rq, m, Q_GET, a);
  b_str(rp, "va");
  e_add(rq, m, n, 5);
  b_i64(rp, 5);
  e_add(rq, m, n, -2);
  b_i64(rp, 3);
  e_keys(rq, m, Q_CHECK, 2, ka);
  b_u8(rp, 1);
  e_keys(rq, m, Q_CHECK, 1, ka);
  b_u8(rp, 0);
  e_keys(rq, m, Q_WAIT, 2, kaa);
  b_u8(rp, 0);
  e_keys(rq, m, Q_WAIT, 0, NULL);
  b_u8(rp, 0);
  b_u8(rq, opc(m, Q_NUMKEYS));
  b_i64(rp, nkeys0 + 2);
  e_cas(rq, m, c, "", "x");
  b_str(rp, "x");
  e_cas(rq, m, c, "nope", "y");
  b_str(rp, "x");
  e_key(rq, m, Q_GET, n);
  b_str(rp, "3");
  e_key(rq, m, Q_DELETE, a);
  b_i64(rp, 1);
  e_key(rq, m, Q_DELETE, a);
  b_i64(rp, 0);
  if (m) {
    const char *nc[2];
    nc[0] = n;
    nc[1] = c;
    e_key(rq, m, Q_GET, miss);
    b_str(rp, "");
    e_keys(rq, m, Q_MGET, 2, nc);
    b_str(rp, "3");
    b_str(rp, "x");
    b_u8(rq, opc(m, Q_CANCEL));
    b_u8(rp, 1);
    e_ping(rq, 0xfeedbeef);
    b_u32(rp, 0xfeedbeef);
  }
  e_add(rq, m, n, 1);
  b_i64(rp, 4);
  e_key(rq, m, Q_DELETE, n);
  b_i64(rp, 1);
  e_key(rq, m, Q_DELETE, c);
  b_i64(rp, 1);
}

static int reply_is(int fd, const buf_t *rp) {
  uint8_t *got = malloc(rp->len);
  int r = got != NULL && recv_all(fd, got, rp->len) == 1 &&
          memcmp(got, rp->p, rp->len) == 0 && nothing_pending(fd);
  free(got);
  return r;
}

static void case_pipelined(int m) {
  const char *d = m ? "modern" : "1.13";
  buf_t rq = {0}, rp = {0};
  size_t i, nsplit = 0, split_ok = 0;
  int fd, r;

  /* All in one write. */
  build_stream(m, m ? "pipe/m/" : "pipe/l/", num_keys(), &rq, &rp);
  fd = tcp_connect();
  r = fd >= 0 && send_all(fd, rq.p, rq.len) == 0 && reply_is(fd, &rp);
  ok(r, "%s: %zu requests bytes pipelined in one write: exact replies (%zu "
        "bytes)",
     d, rq.len, rp.len);
  if (fd >= 0) close(fd);

  /* One byte per write, each one read by the server on its own. */
  b_reset(&rq);
  b_reset(&rp);
  build_stream(m, m ? "byte/m/" : "byte/l/", num_keys(), &rq, &rp);
  fd = tcp_connect();
  r = fd >= 0;
  for (i = 0; r && i < rq.len; i++)
    r = send_all(fd, rq.p + i, 1) == 0 && sync_server();
  r = r && reply_is(fd, &rp);
  ok(r, "%s: the same stream one byte per write (TCP_NODELAY): exact replies",
     d);
  if (fd >= 0) close(fd);

  /* Split in two at every offset. */
  for (i = 1;; i++) {
    char pfx[32];
    snprintf(pfx, sizeof(pfx), "split/%c/%05zu/", m ? 'm' : 'l', i);
    b_reset(&rq);
    b_reset(&rp);
    build_stream(m, pfx, num_keys(), &rq, &rp);
    if (i >= rq.len) break;
    nsplit++;
    fd = tcp_connect();
    r = fd >= 0 && send_all(fd, rq.p, i) == 0 && sync_server() &&
        send_all(fd, rq.p + i, rq.len - i) == 0 && reply_is(fd, &rp);
    if (r) split_ok++;
    else note("%s: split at %zu failed", d, i);
    if (fd >= 0) close(fd);
  }
  is_int(split_ok, nsplit, "%s: the stream split in two at each of %zu offsets",
         d, nsplit);
  b_free(&rq);
  b_free(&rp);
}

/* ---- Garbage and bad handshakes ------------------------------------------- */

/* Sends b on a fresh connection (validated first if modern) and expects the
 * server to close it. */
static int bad_conn(int modern, const buf_t *b) {
  int fd = open_client(modern);
  if (fd < 0) return 0;
  (void)send_all(fd, b->p, b->len); /* may fail: the server may reset */
  return closed_then_close(fd);
}

#define GARBAGE_ROUNDS 16

static void case_garbage(void) {
  buf_t b = {0};
  uint64_t pe0 = stats().protocol_errors, expect = 0;
  int i, n;

  for (n = 0, i = 0; i < GARBAGE_ROUNDS; i++) {
    int j;
    b_reset(&b);
    for (j = 0; j < 4096 / 8; j++) b_u64(&b, rng());
    n += bad_conn(0, &b);
  }
  expect += GARBAGE_ROUNDS;
  is_int(n, GARBAGE_ROUNDS,
         "random 4 KiB on a fresh connection (1.13 dialect): closed (%d "
         "rounds)",
         GARBAGE_ROUNDS);
  for (n = 0, i = 0; i < GARBAGE_ROUNDS; i++) {
    int j;
    b_reset(&b);
    b_u8(&b, i == 0 ? 0x7f : (uint8_t)(0x13 + rng() % (0x100 - 0x13)));
    for (j = 0; j < 4096 / 8; j++) b_u64(&b, rng());
    n += bad_conn(1, &b);
  }
  expect += GARBAGE_ROUNDS;
  is_int(n, GARBAGE_ROUNDS,
         "modern: after VALIDATE, an unknown opcode (0x7f, 0x13..0xff) and "
         "random bytes: closed (%d rounds)",
         GARBAGE_ROUNDS);
  check_service("garbage");

  /* Pure random streams after VALIDATE (any first byte). */
  for (n = 0, i = 0; i < GARBAGE_ROUNDS; i++) {
    int j;
    b_reset(&b);
    for (j = 0; j < 4096 / 8; j++) b_u64(&b, rng());
    n += bad_conn(1, &b);
  }
  expect += GARBAGE_ROUNDS;
  is_int(n, GARBAGE_ROUNDS, "modern: random 4 KiB after VALIDATE: closed");

  b_reset(&b);
  b_u8(&b, 0x09); /* one past 1.13's DELETE_KEY */
  b_fill(&b, 0, 64);
  ok(bad_conn(0, &b), "1.13: opcode 9 (unknown in 1.13): closed");
  b_reset(&b);
  e_ping(&b, 1); /* 13 is PING only in the modern dialect */
  ok(bad_conn(0, &b), "1.13: opcode 13 (PING without VALIDATE): closed");
  b_reset(&b);
  b_u8(&b, 0x13); /* one past BARRIER */
  b_fill(&b, 0, 64);
  ok(bad_conn(1, &b), "modern: opcode 19: closed");
  expect += 3;

  /* Not a VALIDATE first. A wrong magic: the dialect is 1.13 from the
   * first mismatching byte, and 00 is then a SET whose key length is
   * read from the magic and the next request: ~1 GB, over the limit. */
  b_reset(&b);
  b_u8(&b, 0);
  b_u32(&b, MAGIC + 1);
  e_ping(&b, 7);
  ok(bad_conn(0, &b), "00 + wrong magic + PING: closed");
  b_reset(&b);
  b_u8(&b, 0);
  b_u32(&b, 0x3C85F7CEu ^ 0xff000000u);
  b_fill(&b, 0, 16);
  ok(bad_conn(0, &b), "00 + magic with a wrong last byte: closed");
  b_reset(&b);
  e_validate(&b); /* a second VALIDATE on a validated connection */
  ok(bad_conn(1, &b), "modern: VALIDATE twice: closed");
  b_reset(&b);
  b_u8(&b, 0);
  b_u32(&b, 0xdeadbeef);
  ok(bad_conn(1, &b), "modern: a second VALIDATE with a wrong magic: closed");
  expect += 4;

  /* The magic arriving in pieces, then going wrong. */
  {
    static const uint8_t part[] = {0x00, 0xCE, 0xF7};
    int fd = tcp_connect(), r = fd >= 0;
    r = r && send_all(fd, part, sizeof(part)) == 0 && sync_server();
    b_reset(&b);
    b_u8(&b, 0x99);
    b_fill(&b, 0xff, 16);
    r = r && send_all(fd, b.p, b.len) == 0;
    if (!r && fd >= 0) close(fd);
    ok(r && closed_then_close(fd),
       "00 CE F7 (a prefix of VALIDATE), later 99 ...: closed");
    expect++;
  }
  is_int(stats().protocol_errors - pe0, expect,
         "stats.protocol_errors counts every one of them");
  check_service("bad handshakes");
  check_back_to_baseline("garbage");
  b_free(&b);
}

/* ---- Truncated requests ------------------------------------------------------ */

/* Sends b, makes sure the server read it, then disconnects (hard: RST). */
static void send_then_drop(int modern, const buf_t *b, int hard) {
  int fd = open_client(modern);
  if (fd < 0) return;
  (void)send_all(fd, b->p, b->len);
  sync_server();
  if (hard) {
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  close(fd);
}

static void truncated(int modern, const buf_t *b, int hard, const char *key1,
                      const char *key2, const char *what) {
  int64_t nk0 = num_keys();
  uint64_t mem0 = stats().memory;
  const char *d = modern ? "modern" : "1.13";
  int absent;
  send_then_drop(modern, b, hard);
  check_back_to_baseline(what);
  absent = (key1 == NULL || check_key(key1) == 1) &&
           (key2 == NULL || check_key(key2) == 1);
  ok(absent && num_keys() == nk0 && stats().memory == mem0,
     "%s: %s, then disconnect: nothing stored", d, what);
}

static void case_truncated(void) {
  buf_t b = {0};
  int m;
  uint64_t pe0 = stats().protocol_errors;

  for (m = 0; m < 2; m++) {
    const char *k = m ? "trunc/m" : "trunc/l";
    b_reset(&b);
    b_u8(&b, opc(m, Q_SET));
    b_str(&b, k);
    b_u64(&b, 100);
    b_fill(&b, 'x', 10);
    truncated(m, &b, 0, k, NULL, "SET announcing 100 bytes, 10 sent");
    truncated(m, &b, 1, k, NULL, "the same, reset (SO_LINGER 0)");
    b_reset(&b);
    b_u8(&b, opc(m, Q_SET));
    b_str(&b, k);
    b_u64(&b, 900000);
    b_fill(&b, 'y', 500000);
    truncated(m, &b, 0, k, NULL, "SET announcing 900000 bytes, 500000 sent");
    b_reset(&b);
    b_u8(&b, opc(m, Q_ADD));
    b_u8(&b, 5);
    b_u8(&b, 0);
    b_u8(&b, 0);
    truncated(m, &b, 0, NULL, NULL, "ADD cut inside the key length");
    b_reset(&b);
    b_u8(&b, opc(m, Q_ADD));
    b_str(&b, k);
    b_fill(&b, 0, 7);
    truncated(m, &b, 0, k, NULL, "ADD cut inside the delta");
  }
  b_reset(&b);
  b_u8(&b, 0x00);
  b_u8(&b, 0xCE);
  truncated(0, &b, 0, NULL, NULL, "half a VALIDATE");
  b_reset(&b);
  b_u8(&b, opc(1, Q_MSET));
  b_i64(&b, 3);
  b_str(&b, "trunc/ms1");
  b_str(&b, "v1");
  b_str(&b, "trunc/ms2");
  b_str(&b, "v2");
  b_u64(&b, 9);
  truncated(1, &b, 0, "trunc/ms1", "trunc/ms2",
            "MULTI_SET of 3 pairs with 2 complete");
  is_int(stats().protocol_errors - pe0, 0,
         "a disconnect mid-request is not a protocol error");
  check_service("truncated requests");
  b_free(&b);
}

/* ---- Lengths near 2^64 and over the limits --------------------------------- */

static void case_huge_lengths(void) {
  static const uint64_t huge[] = {UINT64_MAX, (uint64_t)1 << 63,
                                  UINT64_MAX - 7, (uint64_t)1 << 32};
  buf_t b = {0};
  uint64_t pe0 = stats().protocol_errors, expect = 0;
  size_t i;
  int m;

  for (m = 0; m < 2; m++) {
    const char *d = m ? "modern" : "1.13";
    for (i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
      uint64_t h = huge[i];
      int nk, nv, nw, nc, ng, na, nl;
      b_reset(&b);
      b_u8(&b, opc(m, Q_SET));
      b_u64(&b, h);
      nk = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_SET));
      b_str(&b, "k");
      b_u64(&b, h);
      nv = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_WAIT));
      b_u64(&b, h);
      nw = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_CHECK));
      b_u64(&b, h);
      nc = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_GET));
      b_u64(&b, h);
      ng = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_ADD));
      b_u64(&b, h);
      na = bad_conn(m, &b);
      b_reset(&b); /* inside a key list */
      b_u8(&b, opc(m, Q_WAIT));
      b_u64(&b, 2);
      b_str(&b, "k");
      b_u64(&b, h);
      nl = bad_conn(m, &b);
      ok(nk && nv && nw && nc && ng && na && nl,
         "%s: length/count 0x%016llx (SET key, SET value, WAIT count, CHECK "
         "count, GET key, ADD key, 2nd key of a WAIT): closed without waiting "
         "for the bytes",
         d, (unsigned long long)h);
      if (!(nk && nv && nw && nc && ng && na && nl))
        note("closed: %d %d %d %d %d %d %d", nk, nv, nw, nc, ng, na, nl);
      expect += 7;
    }
    {
      int nk, nv, nd, ne;
      b_reset(&b);
      b_u8(&b, opc(m, Q_CAS));
      b_u64(&b, UINT64_MAX);
      nk = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_CAS));
      b_str(&b, "k");
      b_u64(&b, UINT64_MAX);
      ne = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_CAS));
      b_str(&b, "k");
      b_str(&b, "e");
      b_u64(&b, UINT64_MAX);
      nv = bad_conn(m, &b);
      b_reset(&b);
      b_u8(&b, opc(m, Q_DELETE));
      b_u64(&b, UINT64_MAX);
      nd = bad_conn(m, &b);
      ok(nk && ne && nv && nd,
         "%s: 2^64-1 as COMPARE_SET key, expected, desired and DELETE key: "
         "closed",
         d);
      expect += 4;
    }
  }
  {
    int a, bb, c, dd, e, f;
    b_reset(&b);
    b_u8(&b, opc(1, Q_MGET));
    b_u64(&b, UINT64_MAX);
    a = bad_conn(1, &b);
    b_reset(&b);
    b_u8(&b, opc(1, Q_MSET));
    b_i64(&b, -1); /* 2^64-1 read as the signed count the client writes */
    bb = bad_conn(1, &b);
    b_reset(&b);
    b_u8(&b, opc(1, Q_MSET));
    b_i64(&b, INT64_MAX);
    c = bad_conn(1, &b);
    b_reset(&b);
    b_u8(&b, opc(1, Q_MSET));
    b_i64(&b, 1);
    b_str(&b, "k");
    b_u64(&b, UINT64_MAX);
    dd = bad_conn(1, &b);
    b_reset(&b);
    b_u8(&b, opc(1, Q_APPEND));
    b_str(&b, "k");
    b_u64(&b, UINT64_MAX);
    e = bad_conn(1, &b);
    b_reset(&b);
    b_u8(&b, 14); /* QUEUE_PUSH */
    b_str(&b, "k");
    b_u64(&b, UINT64_MAX);
    f = bad_conn(1, &b);
    ok(a && bb && c && dd && e && f,
       "modern: MULTI_GET count 2^64-1, MULTI_SET count -1 and 2^63-1, a "
       "MULTI_SET value of 2^64-1, APPEND and QUEUE_PUSH values of 2^64-1: "
       "closed");
    expect += 6;
  }
  is_int(stats().protocol_errors - pe0, expect,
         "stats.protocol_errors counts each of the %llu",
         (unsigned long long)expect);
  is_int(check_key("k"), 1, "and nothing was stored");
  check_service("lengths near 2^64");
  check_back_to_baseline("lengths near 2^64");
  b_free(&b);
}

static void case_limits(void) {
  buf_t b = {0};
  uint64_t pe0 = stats().protocol_errors, expect = 0;
  int m;
  char *bigkey = malloc(MAX_KEY + 2);
  uint8_t *v = NULL;
  uint64_t vn = 0;

  memset(bigkey, 'K', MAX_KEY + 1);
  bigkey[MAX_KEY + 1] = '\0';
  for (m = 0; m < 2; m++) {
    const char *d = m ? "modern" : "1.13";
    b_reset(&b);
    b_u8(&b, opc(m, Q_SET));
    b_u64(&b, MAX_KEY + 1);
    ok(bad_conn(m, &b), "%s: SET key length max_key_len+1, header only: closed",
       d);
    b_reset(&b);
    e_set(&b, m, bigkey, "v", 1);
    ok(bad_conn(m, &b), "%s: SET with a whole key of max_key_len+1: closed", d);
    b_reset(&b);
    b_u8(&b, opc(m, Q_SET));
    b_str(&b, "lim/v");
    b_u64(&b, MAX_VALUE + 1);
    ok(bad_conn(m, &b),
       "%s: SET value length max_value_len+1, header only: closed", d);
    b_reset(&b);
    b_u8(&b, opc(m, Q_WAIT));
    b_u64(&b, MAX_KEYS + 1);
    ok(bad_conn(m, &b), "%s: WAIT of max_keys+1 keys: closed", d);
    b_reset(&b);
    b_u8(&b, opc(m, Q_CHECK));
    b_u64(&b, 2);
    b_str(&b, "k");
    b_u64(&b, MAX_KEY + 1);
    ok(bad_conn(m, &b), "%s: CHECK whose 2nd key is over max_key_len: closed",
       d);
    b_reset(&b);
    e_key(&b, m, Q_GET, bigkey);
    ok(bad_conn(m, &b), "%s: GET of a key over max_key_len: closed", d);
    expect += 6;
  }
  b_reset(&b);
  b_u8(&b, opc(1, Q_MSET));
  b_i64(&b, MAX_KEYS + 1);
  ok(bad_conn(1, &b), "modern: MULTI_SET of max_keys+1 pairs: closed");
  b_reset(&b);
  e_cas(&b, 1, "lim/c", "", "");
  b.len -= 8;
  b_u64(&b, MAX_VALUE + 1);
  ok(bad_conn(1, &b), "modern: COMPARE_SET desired over max_value_len: closed");
  expect += 2;
  is_int(stats().protocol_errors - pe0, expect,
         "stats.protocol_errors counts each of them");
  is_int(check_key("lim/v"), 1, "nothing stored");

  /* At the limits exactly: accepted. */
  bigkey[MAX_KEY] = '\0';
  for (m = 0; m < 2; m++) {
    const char *d = m ? "modern" : "1.13";
    int fd = open_client(m), r;
    uint8_t *big = malloc(MAX_VALUE);
    size_t i;
    for (i = 0; i < MAX_VALUE; i++) big[i] = (uint8_t)(i * 7 + m);
    b_reset(&b);
    e_set(&b, m, bigkey, "at-limit", 8);
    e_set(&b, m, "lim/v", big, MAX_VALUE);
    r = fd >= 0 && send_all(fd, b.p, b.len) == 0 &&
        rt_get(fd, m, bigkey, &v, &vn);
    ok(r && vn == 8 && memcmp(v, "at-limit", 8) == 0,
       "%s: a key of exactly max_key_len is stored", d);
    free(v);
    v = NULL;
    r = fd >= 0 && rt_get(fd, m, "lim/v", &v, &vn);
    ok(r && vn == MAX_VALUE && memcmp(v, big, MAX_VALUE) == 0,
       "%s: a value of exactly max_value_len is stored and read back", d);
    free(v);
    v = NULL;
    {
      /* A CHECK of exactly max_keys keys. */
      uint8_t rr = 0xff;
      b_reset(&b);
      b_u8(&b, opc(m, Q_CHECK));
      b_u64(&b, MAX_KEYS);
      for (i = 0; i < MAX_KEYS; i++) b_str(&b, i == 0 ? "lim/v" : "good");
      ok(fd >= 0 && rt_u8(fd, &b, &rr) && rr == 0,
         "%s: CHECK of exactly max_keys keys answered (READY)", d);
    }
    if (fd >= 0) close(fd);
    free(big);
    is_int(delete_key(bigkey), 1, "%s: delete the long key", d);
    is_int(delete_key("lim/v"), 1, "%s: delete the big value", d);
  }
  check_service("limits");
  check_back_to_baseline("limits");
  free(bigkey);
  b_free(&b);
}

/* ---- GET of a missing key ---------------------------------------------------- */

static void case_get_missing(void) {
  buf_t b = {0};
  int fd;
  uint8_t *v = NULL;
  uint64_t n = 99;
  e_key(&b, 0, Q_GET, "missing/l");
  ok(bad_conn(0, &b), "1.13: GET of a missing key closes the connection "
                      "(as PyTorch 1.13's server)");
  fd = open_modern();
  ok(fd >= 0 && rt_get(fd, 1, "missing/m", &v, &n) && n == 0,
     "modern: GET of a missing key answers an empty value");
  free(v);
  ok(fd >= 0 && rt_get(fd, 1, "missing/m", &v, &n) && n == 0,
     "modern: and the connection stays usable");
  free(v);
  if (fd >= 0) close(fd);
  check_service("GET of a missing key");
  b_free(&b);
}

/* ---- Waits whose client goes away; CANCEL_WAIT -------------------------- */

static void case_waits(void) {
  buf_t b = {0};
  uint64_t w0 = stats().waiting;
  int m, hard, fd;
  uint8_t r[4];

  for (m = 0; m < 2; m++) {
    for (hard = 0; hard < 2; hard++) {
      const char *d = m ? "modern" : "1.13";
      char k[64];
      snprintf(k, sizeof(k), "wd/%d/%d", m, hard);
      fd = open_client(m);
      b_reset(&b);
      e_keys(&b, m, Q_WAIT, 1, (const char *const[]){k});
      send_all(fd, b.p, b.len);
      is_int(wait_stat(STAT_FIELD_WAITING, w0 + 1), w0 + 1,
             "%s: WAIT registered (stats.waiting)", d);
      if (hard) {
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      }
      close(fd);
      if (!hard) {
        is_int(wait_stat(STAT_FIELD_WAITING, w0), w0,
               "%s: the waiter disconnects: stats.waiting back", d);
      }
      /* With a reset, the SET may well reach the server first: the wake
       * then writes to a dead connection. */
      b_reset(&b);
      e_set(&b, 1, k, "v", 1);
      send_all(good_m, b.p, b.len);
      ok(check_key(k) == 0, "%s: the key set after the waiter left%s", d,
         hard ? " (reset)" : "");
      is_int(wait_stat(STAT_FIELD_WAITING, w0), w0, "%s: no waiter left%s", d,
             hard ? " (reset)" : "");
      check_service(hard ? "waiter reset" : "waiter gone");
    }
  }
  check_back_to_baseline("waits");

  /* CANCEL_WAIT with nothing released: 01 only, and the wait stays
   * cancelled when the key appears later. */
  fd = open_modern();
  b_reset(&b);
  e_keys(&b, 1, Q_WAIT, 1, (const char *const[]){"cw/1"});
  send_all(fd, b.p, b.len);
  wait_stat(STAT_FIELD_WAITING, w0 + 1);
  b_reset(&b);
  b_u8(&b, opc(1, Q_CANCEL));
  e_ping(&b, 0x11223344);
  ok(send_all(fd, b.p, b.len) == 0 && recv_all(fd, r, 1) == 1 && r[0] == 1,
     "CANCEL_WAIT of a pending WAIT: WAIT_CANCELED");
  ok(recv_all(fd, r, 4) == 1 && memcmp(r, "\x44\x33\x22\x11", 4) == 0,
     "and only that byte (the next reply is the PING's)");
  is_int(wait_stat(STAT_FIELD_WAITING, w0), w0,
         "stats.waiting back after CANCEL_WAIT");
  b_reset(&b);
  e_set(&b, 1, "cw/1", "v", 1);
  send_all(good_m, b.p, b.len);
  sync_server();
  b_reset(&b);
  e_ping(&b, 0x55667788);
  ok(send_all(fd, b.p, b.len) == 0 && recv_all(fd, r, 4) == 1 &&
         memcmp(r, "\x88\x77\x66\x55", 4) == 0,
     "the key set later wakes nobody on the cancelled connection");
  /* CANCEL_WAIT with no WAIT at all. */
  b_reset(&b);
  b_u8(&b, opc(1, Q_CANCEL));
  ok(rt_u8(fd, &b, r) && r[0] == 1, "CANCEL_WAIT with no WAIT: 01");
  /* The race: released, then cancelled: 00 then 01. */
  b_reset(&b);
  e_keys(&b, 1, Q_WAIT, 1, (const char *const[]){"cw/2"});
  send_all(fd, b.p, b.len);
  wait_stat(STAT_FIELD_WAITING, w0 + 1);
  b_reset(&b);
  e_set(&b, 1, "cw/2", "v", 1);
  send_all(good_m, b.p, b.len);
  sync_server();
  b_reset(&b);
  b_u8(&b, opc(1, Q_CANCEL));
  ok(send_all(fd, b.p, b.len) == 0 && recv_all(fd, r, 2) == 1 && r[0] == 0 &&
         r[1] == 1,
     "WAIT released by another client's SET, then CANCEL_WAIT: 00 then 01");
  sync_server();
  ok(nothing_pending(fd), "and nothing more");
  close(fd);
  check_service("CANCEL_WAIT");
  b_free(&b);
}

/* ---- Head-of-line blocking --------------------------------------------------- */

static void case_head_of_line(void) {
  buf_t b = {0};
  int s1, s2, s3, s4, i, good_ok = 0;
  int64_t r = 0;
  uint8_t *v = NULL;
  uint64_t vn = 0;
  uint32_t echo = 0;
  uint8_t *pat = malloc(900000);

  for (i = 0; i < 900000; i++) pat[i] = (uint8_t)(i * 13);
  s1 = tcp_connect(); /* 1.13 ADD: the opcode alone, as 1.13's client */
  send_all(s1, "\x03", 1);
  s2 = open_modern(); /* modern ADD: opcode and half the key length */
  send_all(s2, "\x04\x06\x00\x00", 4);
  s3 = tcp_connect(); /* the first byte of a VALIDATE */
  send_all(s3, "\x00", 1);
  s4 = open_modern(); /* half of a large SET */
  b_u8(&b, opc(1, Q_SET));
  b_str(&b, "hol/big");
  b_u64(&b, 900000);
  b_bytes(&b, pat, 450000);
  send_all(s4, b.p, b.len);

  for (i = 1; i <= 1000; i++)
    if (rt_add(good_m, 1, "hol/good", 1, &r) && r == i) good_ok++;
  is_int(good_ok, 1000,
         "1000 ADD round trips of another client complete while 4 clients "
         "stall mid-request");
  is_int(wait_stat(STAT_FIELD_CONNECTIONS, baseline_conns + 4),
         baseline_conns + 4, "stats.connections counts the stalled ones");

  b_reset(&b);
  b_str(&b, "hol/s1");
  b_i64(&b, 7);
  ok(rt_i64(s1, &b, &r) && r == 7, "the 1.13 staller finishes: its ADD -> 7");
  b_reset(&b);
  b_bytes(&b, "\x00\x00\x00\x00\x00", 5);
  b_bytes(&b, "hol/s2", 6);
  b_i64(&b, 11);
  ok(rt_i64(s2, &b, &r) && r == 11, "the modern staller finishes: ADD -> 11");
  b_reset(&b);
  b_u32(&b, MAGIC);
  e_ping(&b, 0xabcdef01);
  ok(send_all(s3, b.p, b.len) == 0 && recv_all(s3, &echo, 4) == 1 &&
         echo == 0xabcdef01,
     "the VALIDATE staller finishes: modern dialect, PING echoed");
  ok(send_all(s4, pat + 450000, 900000 - 450000) == 0 &&
         rt_get(good_m, 1, "hol/big", &v, &vn) && vn == 900000 &&
         memcmp(v, pat, 900000) == 0,
     "the large SET finishes: the value is exact");
  free(v);
  is_int(delete_key("hol/big"), 1, "delete it");
  close(s1);
  close(s2);
  close(s3);
  close(s4);
  check_service("head of line");
  check_back_to_baseline("head of line");
  free(pat);
  b_free(&b);
}

/* ---- Clients that do not read their replies ------------------------------ */

#define FLOOD_N 200000
#define FLOOD_VALUE 2048

static void set_nonblock(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void case_flood(void) {
  buf_t b = {0}, one = {0};
  uint8_t val[FLOOD_VALUE], *v = NULL;
  uint64_t vn = 0, req0, req1, sent = 0;
  size_t i, off = 0, total;
  long rss0, rss_max;
  int fd, j, same;

  for (i = 0; i < sizeof(val); i++) val[i] = (uint8_t)(i ^ 0x5a);
  b_reset(&b);
  e_set(&b, 1, "flood/v", val, sizeof(val));
  send_all(good_m, b.p, b.len);
  ok(rt_get(good_m, 1, "flood/v", &v, &vn) && vn == sizeof(val),
     "flood: the value is set");
  free(v);
  v = NULL;

  e_key(&one, 1, Q_GET, "flood/v");
  b_reset(&b);
  for (i = 0; i < 4096; i++) b_bytes(&b, one.p, one.len);
  fd = open_modern();
  tap_require(fd >= 0, "flooder connects");
  set_nonblock(fd);
  rss0 = rss_kb();
  req0 = stats().requests;
  total = (size_t)FLOOD_N * one.len;
  /* Write until everything is sent, or the socket stays full. */
  while (off < total) {
    size_t chunk = b.len - (off % b.len);
    ssize_t n;
    if (chunk > total - off) chunk = total - off;
    n = send(fd, b.p + (off % b.len), chunk, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, 1000) == 0) break; /* full: the server stopped reading */
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  sent = off / one.len;
  note("flood: %llu GETs of a %d-byte value sent (%s)",
       (unsigned long long)sent, FLOOD_VALUE,
       off == total ? "all of them" : "the socket stayed full");
  /* Let the server get as far as it will. */
  rss_max = rss_kb();
  for (same = 0, j = 0; same < 5 && j < 500; j++) {
    long r;
    req1 = stats().requests;
    sleep_ms(20);
    r = rss_kb();
    if (r > rss_max) rss_max = r;
    same = stats().requests == req1 ? same + 1 : 0;
  }
  req1 = stats().requests - req0;
  note("flood: %llu answered, RSS %ld -> %ld kB", (unsigned long long)req1,
       rss0, rss_max);
  ok(rss_max - rss0 < 128 * 1024,
     "flood: RSS grows by less than 128 MiB (%ld kB; unbounded replies "
     "would be %llu MiB)",
     rss_max - rss0, (unsigned long long)sent * (FLOOD_VALUE + 8) >> 20);
  ok(req1 < sent, "flood: the server stopped answering (reads paused): "
                  "%llu of %llu answered",
     (unsigned long long)req1, (unsigned long long)sent);
  check_service("flood, flooder still connected");
  close(fd); /* with unread replies: a reset */
  check_back_to_baseline("flood");

  /* A client that floods, then reads: every reply exact, in order,
   * through the pauses and resumes. */
  {
    const size_t nreq = 20000, rlen = 8 + FLOOD_VALUE;
    size_t sent_b = 0, got = 0, good = 0, want_b;
    uint8_t *rb = malloc(rlen * 64);
    size_t rb_len = 0;
    double end = now_ms() + 60000;
    int broken = 0;
    fd = open_modern();
    tap_require(fd >= 0, "second flooder connects");
    set_nonblock(fd);
    want_b = nreq * one.len;
    while (got < nreq && !broken && now_ms() < end) {
      struct pollfd p = {fd, POLLIN | (sent_b < want_b ? POLLOUT : 0), 0};
      if (poll(&p, 1, 1000) < 0 && errno != EINTR) break;
      if (p.revents & POLLOUT) {
        size_t chunk = b.len - (sent_b % b.len);
        ssize_t n;
        if (chunk > want_b - sent_b) chunk = want_b - sent_b;
        n = send(fd, b.p + (sent_b % b.len), chunk, MSG_NOSIGNAL);
        if (n > 0) sent_b += (size_t)n;
      }
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = recv(fd, rb + rb_len, rlen * 64 - rb_len, 0);
        if (n <= 0) {
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) broken = 1;
          continue;
        }
        rb_len += (size_t)n;
        for (i = 0; i + rlen <= rb_len; i += rlen, got++) {
          uint64_t len;
          memcpy(&len, rb + i, 8);
          if (len == FLOOD_VALUE && memcmp(rb + i + 8, val, FLOOD_VALUE) == 0)
            good++;
        }
        memmove(rb, rb + i, rb_len - i);
        rb_len -= i;
      }
    }
    is_int(good, nreq,
           "flood then read: all %zu replies (%zu MiB) exact and in order",
           nreq, nreq * rlen >> 20);
    free(rb);
    close(fd);
  }
  is_int(delete_key("flood/v"), 1, "delete the flood value");
  check_service("flood then read");
  check_back_to_baseline("flood then read");
  b_free(&b);
  b_free(&one);
}

/* ---- Many connections ---------------------------------------------------------- */

static void case_many(int nconn) {
  int *idle = malloc(sizeof(int) * (size_t)nconn);
  int *part = malloc(sizeof(int) * (size_t)nconn);
  int i, nidle = 0, npart = 0;
  int64_t nk0 = num_keys();
  buf_t b = {0};
  char k[64];

  for (i = 0; i < nconn; i++) {
    idle[i] = tcp_connect();
    if (idle[i] >= 0) nidle++;
  }
  for (i = 0; i < nconn; i++) {
    part[i] = tcp_connect();
    if (part[i] < 0) continue;
    b_reset(&b);
    snprintf(k, sizeof(k), "many/%d", i);
    switch (i % 4) {
    case 0: /* 1.13 ADD, the opcode alone */
      b_u8(&b, opc(0, Q_ADD));
      break;
    case 1: /* modern SET, the value still missing */
      e_validate(&b);
      b_u8(&b, opc(1, Q_SET));
      b_str(&b, k);
      b_u64(&b, 64);
      b_fill(&b, 'p', 10);
      break;
    case 2: /* a VALIDATE prefix */
      b_u8(&b, 0);
      b_u8(&b, 0xCE);
      break;
    default: /* 1.13 WAIT, the key list unfinished */
      b_u8(&b, opc(0, Q_WAIT));
      b_u64(&b, 2);
      b_str(&b, k);
      break;
    }
    if (send_all(part[i], b.p, b.len) == 0) npart++;
  }
  is_int(nidle + npart, 2 * nconn, "%d idle and %d half-request connections",
         nconn, nconn);
  is_int(wait_stat(STAT_FIELD_CONNECTIONS, baseline_conns + 2 * (uint64_t)nconn),
         baseline_conns + 2 * (uint64_t)nconn, "stats.connections reflects them");
  check_service("many connections");
  is_int(num_keys(), nk0, "the half requests stored nothing");
  for (i = 0; i < nconn; i++) {
    if (idle[i] >= 0) close(idle[i]);
    if (part[i] >= 0) close(part[i]);
  }
  check_back_to_baseline("many connections closed");
  is_int(stats().waiting, 0, "no waiter left");
  check_service("after many connections");
  free(idle);
  free(part);
  b_free(&b);
}

/* ---- The memory limit ------------------------------------------------------------ */

#define MEM_VALUE (512 * 1024)

static void fill_value(uint8_t *p, int i) {
  size_t j;
  for (j = 0; j < MEM_VALUE; j += 8) {
    uint64_t x = ((uint64_t)i << 32) | j;
    memcpy(p + j, &x, 8);
  }
}

static void case_memory(void) {
  uint8_t *val = malloc(MEM_VALUE), *v = NULL;
  uint64_t vn = 0, pe0 = stats().protocol_errors;
  buf_t b = {0};
  char k[64];
  int fd = open_modern(), i, acked = 0, intact = 0, closed_at = -1;
  uvccl_store_server_stats_t s;

  for (i = 0; i < 1000 && fd >= 0; i++) {
    snprintf(k, sizeof(k), "mem/%d", i);
    fill_value(val, i);
    b_reset(&b);
    e_set(&b, 1, k, val, MEM_VALUE);
    if (send_all(fd, b.p, b.len) != 0) {
      closed_at = i;
      break;
    }
    if (!rt_get(fd, 1, k, &v, &vn)) {
      closed_at = i;
      break;
    }
    if (vn == MEM_VALUE && memcmp(v, val, MEM_VALUE) == 0) acked++;
    free(v);
    v = NULL;
  }
  ok(closed_at > 0 && acked == closed_at,
     "SETs of %d KiB until the connection is closed at the memory limit: "
     "closed after %d acknowledged",
     MEM_VALUE >> 10, acked);
  if (fd >= 0) close(fd);
  s = stats();
  ok(s.memory <= MAX_MEMORY, "stats.memory %llu <= max_memory",
     (unsigned long long)s.memory);
  is_int(s.protocol_errors - pe0, 1, "counted in stats.protocol_errors");
  for (i = 0; i < acked; i++) {
    snprintf(k, sizeof(k), "mem/%d", i);
    fill_value(val, i);
    if (rt_get(good_m, 1, k, &v, &vn) && vn == MEM_VALUE &&
        memcmp(v, val, MEM_VALUE) == 0)
      intact++;
    free(v);
    v = NULL;
  }
  is_int(intact, acked, "nothing acknowledged is lost: all %d values exact",
         acked);
  snprintf(k, sizeof(k), "mem/%d", closed_at);
  is_int(check_key(k), 1, "the refused SET stored nothing");
  check_service("memory limit");
  for (i = 0; i < acked; i++) {
    snprintf(k, sizeof(k), "mem/%d", i);
    if (delete_key(k) != 1) break;
  }
  is_int(i, acked, "delete them all");
  fd = open_modern();
  fill_value(val, 7);
  b_reset(&b);
  e_set(&b, 1, "mem/again", val, MEM_VALUE);
  ok(fd >= 0 && send_all(fd, b.p, b.len) == 0 &&
         rt_get(fd, 1, "mem/again", &v, &vn) && vn == MEM_VALUE &&
         memcmp(v, val, MEM_VALUE) == 0,
     "room again after the deletes");
  free(v);
  if (fd >= 0) close(fd);
  is_int(delete_key("mem/again"), 1, "delete it");
  check_back_to_baseline("memory limit");
  free(val);
  b_free(&b);
}

/* ---- Half-close ------------------------------------------------------------------- */

/* A client that sends its requests and shuts down its side (as `nc -N`
 * does), then reads. PyTorch 1.13's server answers each request before it
 * reads on, so it answers them all. The ADDs are 32 bytes each, so 2048 of
 * them are exactly 64 KiB: a read that fills the server's buffer, and the
 * EOF right behind it. */
static void case_half_close(void) {
  static const int counts[] = {1, 1000, 2048, 10000};
  buf_t b = {0};
  int fd, i, n, exact;
  int64_t r = 0;
  char k[32];

  for (n = 0; n < (int)(sizeof(counts) / sizeof(counts[0])); n++) {
    int count = counts[n];
    snprintf(k, sizeof(k), "half/%010d", n); /* 15 bytes: 32-byte ADDs */
    b_reset(&b);
    for (i = 0; i < count; i++) e_add(&b, 0, k, 1);
    fd = tcp_connect();
    send_all(fd, b.p, b.len);
    shutdown(fd, SHUT_WR);
    for (exact = 0, i = 1; i <= count; i++) {
      if (recv_all(fd, &r, 8) != 1) break;
      if (r == i) exact++;
    }
    ok(exact == count,
       "%d pipelined ADDs (%zu bytes) then shutdown(SHUT_WR): every reply "
       "arrives (%d of %d)",
       count, b.len, exact, count);
    close(fd);
    delete_key(k);
  }

  /* Fire and forget: SETs, then close() at once (a process that sets and
   * exits). Every one is applied. 2048 SETs of 32 bytes: 64 KiB. */
  for (n = 0; n < 2; n++) {
    int count = n ? 2048 : 1000, stored = 0;
    b_reset(&b);
    for (i = 0; i < count; i++) {
      snprintf(k, sizeof(k), "ff/%d/%05d", n, i); /* 10 bytes */
      e_set(&b, 1, k, "vvvvv", 5);
    }
    fd = open_modern();
    send_all(fd, b.p, b.len);
    close(fd);
    check_back_to_baseline("fire and forget");
    for (i = 0; i < count; i++) {
      snprintf(k, sizeof(k), "ff/%d/%05d", n, i);
      if (delete_key(k) == 1) stored++;
    }
    is_int(stored, count, "%d SETs (%zu bytes) then close(): all applied",
           count, b.len);
  }
  check_service("half-close");
  b_free(&b);
}

/* ---- Requests whose size is only bounded by the limits' product ------- */

/* One MULTI_SET announces max_keys pairs of up to max_value_len bytes: up
 * to ~1 GiB here, ~1 TiB with the default limits. Nothing that large can
 * ever be stored (max_memory is 64 MiB), so the server has to refuse it
 * before buffering it, not after. */
#define MSET_SEND (192u << 20)

static void case_huge_multi_set(void) {
  buf_t b = {0};
  uint8_t *val = malloc(MAX_VALUE);
  size_t sent = 0;
  long rss0 = rss_kb(), rss1;
  int fd = open_modern(), i, send_failed = 0, closed;
  char k[32];

  memset(val, 'm', MAX_VALUE);
  b_u8(&b, opc(1, Q_MSET));
  b_i64(&b, MAX_KEYS);
  send_failed = fd < 0 || send_all(fd, b.p, b.len) != 0;
  for (i = 0; !send_failed && sent < MSET_SEND; i++) {
    b_reset(&b);
    snprintf(k, sizeof(k), "mset/%04d", i);
    b_str(&b, k);
    b_u64(&b, MAX_VALUE);
    send_failed = send_all(fd, b.p, b.len) != 0 ||
                  send_all(fd, val, MAX_VALUE) != 0;
    if (!send_failed) sent += MAX_VALUE;
  }
  sync_server();
  rss1 = rss_kb();
  closed = send_failed || expect_closed(fd);
  note("one MULTI_SET of %d x %d KiB: %zu MiB sent, %s; server RSS %ld -> "
       "%ld kB",
       MAX_KEYS, MAX_VALUE >> 10, sent >> 20,
       closed ? "connection closed" : "connection still open", rss0, rss1);
  ok(closed && sent < MSET_SEND,
     "a MULTI_SET bigger than max_memory is refused before it is all sent "
     "(%zu of %u MiB went through)",
     sent >> 20, MSET_SEND >> 20);
  ok(rss1 - rss0 < 128 * 1024,
     "and the server did not buffer it (RSS +%ld kB, < 128 MiB)",
     rss1 - rss0);
  if (fd >= 0) close(fd);
  is_int(check_key("mset/0000"), 1, "nothing of it stored");
  check_service("huge MULTI_SET");
  check_back_to_baseline("huge MULTI_SET");
  free(val);
  b_free(&b);
}

/* One MULTI_GET of max_keys copies of a large key: an 11 KB request whose
 * reply is 1000 times the value. max_output has to hold for it too:
 * either the reply is produced as the client reads it, or the request is
 * refused; it must not sit whole in the server's memory. */
#define AMP_VALUE (256 * 1024)

static void case_multi_get_amplification(void) {
  buf_t b = {0};
  uint8_t *val = malloc(AMP_VALUE), *got = malloc(AMP_VALUE);
  long rss0, rss1;
  int fd, i, closed = 0, exact = 0;
  uint64_t n;

  for (i = 0; i < AMP_VALUE; i++) val[i] = (uint8_t)(i * 31);
  e_set(&b, 1, "amp", val, AMP_VALUE);
  send_all(good_m, b.p, b.len);
  ok(check_key("amp") == 0, "MULTI_GET amplification: the value is set");
  fd = open_modern();
  b_reset(&b);
  b_u8(&b, opc(1, Q_MGET));
  b_u64(&b, MAX_KEYS);
  for (i = 0; i < MAX_KEYS; i++) b_str(&b, "amp");
  rss0 = rss_kb();
  send_all(fd, b.p, b.len);
  sync_server();
  sync_server();
  rss1 = rss_kb();
  note("MULTI_GET of %d x %d KiB (%zu-byte request, %d MiB reply): server RSS "
       "%ld -> %ld kB",
       MAX_KEYS, AMP_VALUE >> 10, b.len, (MAX_KEYS * (AMP_VALUE + 8)) >> 20,
       rss0, rss1);
  ok(rss1 - rss0 < 128 * 1024,
     "the reply is not buffered whole (RSS +%ld kB, < 128 MiB; max_output is "
     "%d KiB)",
     rss1 - rss0, MAX_OUTPUT >> 10);
  /* Either refused (closed) or answered in full. */
  for (i = 0; i < MAX_KEYS; i++) {
    int r = recv_all(fd, &n, 8);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) {
      closed = 1;
      break;
    }
    if (r < 0 || n != AMP_VALUE || recv_all(fd, got, AMP_VALUE) != 1) break;
    if (memcmp(got, val, AMP_VALUE) == 0) exact++;
  }
  ok((closed && exact == i) || exact == MAX_KEYS,
     "the MULTI_GET is refused or answered exactly (%d values exact%s)", exact,
     closed ? ", then closed" : "");
  close(fd);
  is_int(delete_key("amp"), 1, "delete the value");
  check_service("MULTI_GET amplification");
  check_back_to_baseline("MULTI_GET amplification");
  free(val);
  free(got);
  b_free(&b);
}

/* ---- More semantics under bad input ------------------------------------- */

static void case_misc(void) {
  buf_t b = {0};
  int m, fd, fd2, fd3;
  uint8_t r8[4];
  uint8_t *v = NULL;
  uint64_t vn = 0;
  static const char bin[] = {'b', 0, (char)0xff, '\n', 0};

  /* ADD on a value that is not a number: closed (both PyTorch servers),
   * and the value is untouched. */
  for (m = 0; m < 2; m++) {
    const char *k = m ? "nan/m" : "nan/l";
    b_reset(&b);
    e_set(&b, 1, k, "abc", 3);
    send_all(good_m, b.p, b.len);
    b_reset(&b);
    e_add(&b, m, k, 1);
    ok(bad_conn(m, &b), "%s: ADD on a non-numeric value: closed",
       m ? "modern" : "1.13");
    ok(rt_get(good_m, 1, k, &v, &vn) && vn == 3 && memcmp(v, "abc", 3) == 0,
       "%s: and the value is untouched", m ? "modern" : "1.13");
    free(v);
    v = NULL;
    delete_key(k);
  }

  /* Binary and empty keys are keys like any other. */
  for (m = 0; m < 2; m++) {
    fd = open_client(m);
    b_reset(&b);
    b_u8(&b, opc(m, Q_SET));
    b_blob(&b, bin, sizeof(bin));
    b_str(&b, "binary");
    b_u8(&b, opc(m, Q_SET));
    b_str(&b, "");
    b_str(&b, "empty");
    b_u8(&b, opc(m, Q_GET));
    b_blob(&b, bin, sizeof(bin));
    b_u8(&b, opc(m, Q_GET));
    b_str(&b, "");
    ok(fd >= 0 && send_all(fd, b.p, b.len) == 0 && recv_blob(fd, &v, &vn) &&
           vn == 6 && memcmp(v, "binary", 6) == 0,
       "%s: a key with NUL and 0xff bytes", m ? "modern" : "1.13");
    free(v);
    v = NULL;
    ok(fd >= 0 && recv_blob(fd, &v, &vn) && vn == 5 &&
           memcmp(v, "empty", 5) == 0,
       "%s: the empty key", m ? "modern" : "1.13");
    free(v);
    v = NULL;
    b_reset(&b);
    b_u8(&b, opc(m, Q_DELETE));
    b_blob(&b, bin, sizeof(bin));
    b_u8(&b, opc(m, Q_DELETE));
    b_str(&b, "");
    ok(fd >= 0 && send_all(fd, b.p, b.len) == 0 && recv_all(fd, r8, 1) == 1 &&
           recv_all(fd, &vn, 7) == 1 && recv_all(fd, &vn, 8) == 1 && vn == 1,
       "%s: both deleted", m ? "modern" : "1.13");
    if (fd >= 0) close(fd);
  }

  /* BARRIER (18): a waiter that leaves still counted, never written to; a
   * cancelled one never released. */
  fd = open_modern();
  b_reset(&b);
  e_key(&b, 1, Q_GET, "bar/1");
  b.p[0] = 18;
  b_i64(&b, 2);
  send_all(fd, b.p, b.len);
  sync_server();
  close(fd);
  check_back_to_baseline("BARRIER waiter gone");
  fd = open_modern();
  ok(fd >= 0 && rt_u8(fd, &b, r8) && r8[0] == 0,
     "BARRIER: the second arrival is released although the first left");
  if (fd >= 0) close(fd);
  fd = open_modern();
  fd2 = open_modern();
  fd3 = open_modern();
  b_reset(&b);
  e_key(&b, 1, Q_GET, "bar/2");
  b.p[0] = 18;
  b_i64(&b, 3);
  send_all(fd, b.p, b.len);
  sync_server();
  {
    buf_t c = {0};
    b_u8(&c, opc(1, Q_CANCEL));
    ok(rt_u8(fd, &c, r8) && r8[0] == 1, "BARRIER then CANCEL_WAIT: 01");
    b_free(&c);
  }
  send_all(fd2, b.p, b.len);
  ok(rt_u8(fd3, &b, r8) && r8[0] == 0,
     "BARRIER: the third arrival releases (count 3)");
  ok(recv_all(fd2, r8, 1) == 1 && r8[0] == 0, "and the second");
  sync_server();
  ok(nothing_pending(fd), "but not the cancelled one");
  close(fd);
  close(fd2);
  close(fd3);
  delete_key("bar/1");
  delete_key("bar/2");
  check_service("misc");
  b_free(&b);
}

/* ---- Shutdown with bad clients connected ----------------------------------- */

/* Stops the server while a client floods without reading, one stalls
 * mid-request, one waits, and one idles: the server must still finish. */
static void case_shutdown(void) {
  buf_t b = {0}, one = {0};
  int flood = open_modern(), stall = tcp_connect(), waiter = open_modern(),
      idle = tcp_connect(), finished, i;
  int64_t r;

  b_reset(&b);
  b_fill(&b, 'z', 64 * 1024);
  {
    buf_t sb = {0};
    e_set(&sb, 1, "shut/v", b.p, b.len);
    send_all(good_m, sb.p, sb.len);
    b_free(&sb);
  }
  e_key(&one, 1, Q_GET, "shut/v");
  b_reset(&b);
  for (i = 0; i < 4096; i++) b_bytes(&b, one.p, one.len);
  set_nonblock(flood);
  for (i = 0; i < 64; i++) /* 64 x 4096 GETs of 64 KiB: far past max_output */
    if (send(flood, b.p, b.len, MSG_NOSIGNAL) <= 0) break;
  send_all(stall, "\x03", 1);
  b_reset(&b);
  e_keys(&b, 1, Q_WAIT, 1, (const char *const[]){"shut/never"});
  send_all(waiter, b.p, b.len);
  ok(rt_add(good_m, 1, "good", 1, &r) && r == ++good_m_n,
     "shutdown: the good client is served with bad clients connected");
  is_int(wait_stat(STAT_FIELD_WAITING, 1), 1, "shutdown: the waiter waits");

  uv_async_send(&stop_async);
  /* The non-reading client is still connected and still not reading. */
  ok(closed_then_close(stall), "shutdown: the stalled client is closed");
  ok(closed_then_close(waiter), "shutdown: the waiting client is closed");
  ok(closed_then_close(idle), "shutdown: the idle client is closed");
  ok(closed_then_close(good_m), "shutdown: the good modern client is closed");
  ok(closed_then_close(good_l), "shutdown: the good 1.13 client is closed");
  finished = server_finished();
  ok(finished, "the server finishes shutting down while a client does not "
               "read its replies");
  if (!finished) {
    note("the server is stuck; closing the non-reading client unsticks it");
    close(flood);
    flood = -1;
    ok(server_finished(), "it finishes once that client is gone");
  }
  if (flood >= 0) close(flood);
  b_free(&b);
  b_free(&one);
}

/* ---- main ------------------------------------------------------------------------- */

int main(void) {
  uvccl_store_server_options_t so;
  struct rlimit rl = {0, 0};
  int nconn = 1000, r;

  tap_alarm(120);
  signal(SIGPIPE, on_sigpipe);
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 8192) {
    rl.rlim_cur = rl.rlim_max < 8192 ? rl.rlim_max : 8192;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  /* Both ends of every connection live in this process. */
  if (rl.rlim_cur < (rlim_t)(4 * nconn + 200))
    nconn = rl.rlim_cur > 400 ? (int)((rl.rlim_cur - 200) / 4) : 50;
  if (nconn < 1000) note("RLIMIT_NOFILE %llu: %d connections of each kind",
                         (unsigned long long)rl.rlim_cur, nconn);

  uv_mutex_init(&st_mu);
  uv_cond_init(&st_cv);
  tap_require(uv_loop_init(&loop) == 0, "loop");
  memset(&so, 0, sizeof(so));
  so.host = "127.0.0.1";
  so.listen_fd = -1;
  so.max_key_len = MAX_KEY;
  so.max_value_len = MAX_VALUE;
  so.max_keys = MAX_KEYS;
  so.max_memory = MAX_MEMORY;
  so.max_output = MAX_OUTPUT;
  /* Every bad connection logs a warning; keep the TAP output readable
   * unless UVCCL_LOG asks for more. */
  if (getenv("UVCCL_LOG") == NULL) uvccl_log_set_level(UVCCL_LOG_ERROR);
  r = uvccl_store_server_init(&loop, &server, &so);
  tap_require(r == 0, "server init: %s", uvccl_strerror(r));
  port = server.port;
  uv_async_init(&loop, &stop_async, on_stop);
  uv_async_init(&loop, &stats_async, on_stats);
  tap_require(uv_thread_create(&server_thread, server_main, NULL) == 0,
              "server thread");

  good_m = open_modern();
  good_l = tcp_connect();
  tap_require(good_m >= 0 && good_l >= 0, "the good clients connect");
  baseline_conns = wait_stat(STAT_FIELD_CONNECTIONS, 2);
  tap_require(baseline_conns == 2, "both are counted");
  check_service("start");

  case_pipelined(1);
  case_pipelined(0);
  case_garbage();
  case_truncated();
  case_huge_lengths();
  case_limits();
  case_get_missing();
  case_waits();
  case_head_of_line();
  case_flood();
  case_many(nconn);
  case_memory();
  case_half_close();
  case_huge_multi_set();
  case_multi_get_amplification();
  case_misc();

  {
    uvccl_store_server_stats_t s = stats();
    is_int(s.waiting, 0, "end: no waiter left");
    /* The last case's connections close asynchronously: wait for them. */
    is_int(wait_stat(STAT_FIELD_CONNECTIONS, baseline_conns), baseline_conns,
           "end: only the good clients");
    ok(s.memory < 1 << 20, "end: stats.memory back down (%llu bytes)",
       (unsigned long long)s.memory);
    note("end: %llu accepted, %llu requests, %llu protocol errors, %d SIGPIPE",
         (unsigned long long)s.accepted, (unsigned long long)s.requests,
         (unsigned long long)s.protocol_errors, (int)sigpipes);
  }
  case_shutdown();
  r = uv_thread_join(&server_thread);
  is_int(r, 0, "server thread joined");
  ok(server_closed, "server close callback ran");
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  uv_cond_destroy(&st_cv);
  uv_mutex_destroy(&st_mu);
  return done_testing();
}
