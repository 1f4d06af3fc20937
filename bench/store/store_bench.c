/* uvccl-store-bench: a load generator for any TCPStore server (closed or
 * open loop), ours or PyTorch's.
 *
 * It deliberately does not use uvccl's client: it speaks the wire protocol
 * (both PyTorch dialects) on raw non-blocking sockets with epoll, so that
 * it can load any TCPStore server, and spend as little CPU as possible
 * doing it. On a 2-core machine the load generator and the server compete
 * for the same cores, and a heavyweight client would measure itself.
 * bench/store/run.sh drives it; t/1060 tests it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "uvccl.h"

#define PROG "uvccl-store-bench"

/* The PyTorch default (MASTER_PORT). */
#define DEFAULT_PORT 29500
#define BENCH_DEFAULT_TIMEOUT_MS 5000

static const char usage_text[] =
"usage: " PROG " [options]\n"
"\n"
"options:\n"
"  --host H, --port P  server (default 127.0.0.1:29500)\n"
"  --connections N     concurrent connections, each with one request in\n"
"                      flight (default 1)\n"
"  --threads T         client threads, each with its own epoll (default 1)\n"
"  --duration S        measured seconds (default 5)\n"
"  --warmup S          unmeasured seconds before that (default 1)\n"
"  --op OP             set | get | add | waitget | mix (default add):\n"
"                        set     SET then CHECK of the same key, sent in one\n"
"                                write: SET has no reply, so the CHECK makes\n"
"                                it one round trip\n"
"                        get     GET of a key set during setup\n"
"                        add     ADD +1 (default 1 key: the shared counter\n"
"                                of a rendezvous)\n"
"                        waitget WAIT [key] then GET, as PyTorch's get():\n"
"                                two round trips, counted as one op\n"
"                        mix     50% get, 30% add, 20% set\n"
"  --dialect D         modern (VALIDATE + PING first) | legacy (1.13)\n"
"  --keys K            keys to spread over (add: default 1, else N); data\n"
"                      keys are /bench/<i>, counters /bench/ctr/<i>\n"
"  --value-size B      value bytes for set/get (default 16)\n"
"  --timeout MS        no reply within MS: an error, that connection stops\n"
"                      (default 5000; also bounds connecting)\n"
"  --connect-batch N   connections opened at a time (default 256)\n"
"  --server-pid PID    also report the server's CPU time per op\n"
"  --label NAME        the \"server\" column (default HOST:PORT)\n"
"  --json              one JSON object line instead of the table\n"
"  --no-header         the table row only\n"
"  --rate R            open loop instead: R operations per second in all,\n"
"                      evenly spaced, taking the connections in turn; an\n"
"                      operation due while its connection still waits for\n"
"                      a reply starts after it, and its latency counts\n"
"                      from when it was due\n"
"  --rendezvous N      instead: N connections each ADD a counter; the one\n"
"                      that reaches N SETs \"done\"; all WAIT for \"done\".\n"
"                      Reports ms from the first ADD sent to the last WAIT\n"
"                      answered, over --reps R runs (default 5)\n"
"  Exit status: 0, or 1 if setup failed or no operation completed.\n";

#include "../../tools/cli.h"

/* ------------------------------------------------------------------------ */
/* bench: wire protocol                                                     */

enum { B_SET, B_GET, B_ADD, B_WAITGET, B_MIX, B_RDV };

static const char *const bench_op_names[] = {
  "set", "get", "add", "waitget", "mix", "rendezvous"
};

static const char *const bench_op_desc[] = {
  "SET+CHECK in one write, 1 round trip",
  "GET of a pre-set key, 1 round trip",
  "ADD +1, 1 round trip",
  "WAIT then GET, 2 round trips",
  "50% get, 30% add, 20% set+check",
  "ADD count; last SETs done; all WAIT done",
};

/* The opcodes bench sends; 1.13 numbers them one lower (no VALIDATE). */
typedef struct {
  uint8_t set, get, add, check, wait, getnumkeys;
} wire_ops_t;

static const wire_ops_t wire_modern = { 1, 3, 4, 5, 6, 7 };
static const wire_ops_t wire_legacy = { 0, 2, 3, 4, 5, 6 };

#define WIRE_VALIDATE 0
#define WIRE_PING 13
static const uint8_t wire_magic[4] = { 0xCE, 0xF7, 0x85, 0x3C };

/* Reply shapes. */
enum { R_NONE, R_U8, R_U32, R_I64, R_BYTES };

/* An incremental reply parser: replies may arrive a byte at a time. Values
 * are skipped, not stored: bench only checks their length. */
typedef struct {
  int kind;
  unsigned have;   /* header bytes so far */
  unsigned need;   /* header bytes in total */
  int in_payload;
  uint64_t left;   /* payload bytes still to come */
  uint64_t len;    /* payload length of a BYTES reply */
  uint8_t hdr[8];
} reply_t;

static void reply_expect(reply_t *r, int kind)
{
  r->kind = kind;
  r->have = 0;
  r->in_payload = 0;
  r->left = 0;
  r->len = 0;
  switch (kind) {
  case R_U8: r->need = 1; break;
  case R_U32: r->need = 4; break;
  default: r->need = 8; break;
  }
}

/* Consumes bytes of the reply; *done is set once it is complete. */
static size_t reply_feed(reply_t *r, const uint8_t *p, size_t n, int *done)
{
  size_t used = 0;

  *done = 0;
  if (!r->in_payload) {
    size_t take = r->need - r->have;
    if (take > n)
      take = n;
    memcpy(r->hdr + r->have, p, take);
    r->have += (unsigned) take;
    used = take;
    if (r->have < r->need)
      return used;
    if (r->kind != R_BYTES) {
      *done = 1;
      return used;
    }
    memcpy(&r->len, r->hdr, 8);
    r->left = r->len;
    r->in_payload = 1;
  }
  if ((uint64_t) (n - used) >= r->left) {
    used += (size_t) r->left;
    r->left = 0;
    *done = 1;
  } else {
    r->left -= n - used;
    used = n;
  }
  return used;
}

static int64_t reply_i64(const reply_t *r)
{
  int64_t v;

  memcpy(&v, r->hdr, 8);
  return v;
}

static uint32_t reply_u32(const reply_t *r)
{
  uint32_t v;

  memcpy(&v, r->hdr, 4);
  return v;
}

/* Keys pre-encoded as on the wire (u64 length + bytes), so that building a
 * request is a memcpy. */
typedef struct {
  uint8_t *buf;
  size_t *off;  /* n + 1 offsets into buf */
  uint32_t n;
} keyset_t;

static void keyset_build(keyset_t *ks, const char *prefix, uint32_t n)
{
  char key[512];
  size_t cap = (size_t) n * (strlen(prefix) + 8 + 11);
  size_t pos = 0;
  uint64_t len;
  uint32_t i;

  free(ks->buf);
  free(ks->off);
  ks->buf = xcalloc(cap, 1);
  ks->off = xcalloc((size_t) n + 1, sizeof(size_t));
  ks->n = n;
  for (i = 0; i < n; i++) {
    len = (uint64_t) snprintf(key, sizeof(key), "%s%" PRIu32, prefix, i);
    ks->off[i] = pos;
    memcpy(ks->buf + pos, &len, 8);
    memcpy(ks->buf + pos + 8, key, (size_t) len);
    pos += 8 + (size_t) len;
  }
  ks->off[n] = pos;
}

static void keyset_free(keyset_t *ks)
{
  free(ks->buf);
  free(ks->off);
  memset(ks, 0, sizeof(*ks));
}

/* ------------------------------------------------------------------------ */
/* bench: latency histogram                                                 */

/* Log-linear buckets in the HDR histogram style: 128 sub-buckets per power
 * of two, so any recorded value is off by less than 1%, in 40 KB. */
#define H_SUB_BITS 7
#define H_SUB (1u << H_SUB_BITS)
#define H_MAX_EXP 44  /* 2^45 ns, about 9.8 hours */
#define H_BUCKETS ((H_MAX_EXP - H_SUB_BITS + 2) * H_SUB)

typedef struct {
  uint64_t b[H_BUCKETS];
  uint64_t count;
  uint64_t max;
} hist_t;

static unsigned hist_index(uint64_t v)
{
  unsigned e;

  if (v < H_SUB)
    return (unsigned) v;
  e = 63u - (unsigned) __builtin_clzll(v);
  if (e > H_MAX_EXP) {
    e = H_MAX_EXP;
    v = (UINT64_C(2) << H_MAX_EXP) - 1;
  }
  return (e - H_SUB_BITS + 1) * H_SUB +
         (unsigned) (v >> (e - H_SUB_BITS)) - H_SUB;
}

/* The middle of a bucket's range. */
static uint64_t hist_value(unsigned idx)
{
  unsigned e;
  uint64_t low;

  if (idx < H_SUB)
    return idx;
  e = idx / H_SUB - 1 + H_SUB_BITS;
  low = (uint64_t) (H_SUB + idx % H_SUB) << (e - H_SUB_BITS);
  return low + ((UINT64_C(1) << (e - H_SUB_BITS)) >> 1);
}

static void hist_add(hist_t *h, uint64_t v)
{
  h->b[hist_index(v)]++;
  h->count++;
  if (v > h->max)
    h->max = v;
}

static void hist_merge(hist_t *into, const hist_t *h)
{
  unsigned i;

  for (i = 0; i < H_BUCKETS; i++)
    into->b[i] += h->b[i];
  into->count += h->count;
  if (h->max > into->max)
    into->max = h->max;
}

static uint64_t hist_pct(const hist_t *h, double q)
{
  uint64_t rank;
  uint64_t seen = 0;
  uint64_t v;
  unsigned i;

  if (h->count == 0)
    return 0;
  rank = (uint64_t) (q * (double) h->count + 0.999999);
  if (rank < 1)
    rank = 1;
  for (i = 0; i < H_BUCKETS; i++) {
    seen += h->b[i];
    if (seen >= rank) {
      v = hist_value(i);
      return v < h->max ? v : h->max;
    }
  }
  return h->max;
}

/* ------------------------------------------------------------------------ */
/* bench: connections and workers                                           */

enum { C_CONNECTING, C_HANDSHAKE, C_RETRY, C_READY, C_DEAD };

typedef struct {
  int fd;
  int id;
  int state;
  int out_watch;      /* EPOLLOUT is registered */
  uint8_t *out;
  size_t out_len;
  size_t out_off;
  size_t out_cap;
  reply_t r;
  int op;             /* the operation in flight */
  int step;           /* its round trip: waitget and rendezvous take two */
  uint32_t key;
  uint64_t t_op;      /* when the operation started */
  uint64_t t_req;     /* when its current request was sent */
  uint64_t retry_at;  /* connect: next attempt */
  uint64_t pend_first; /* --rate: the oldest due time not yet started */
  uint32_t pend_n;     /* --rate: due operations waiting for this one */
  int attempts;
  int last_err;       /* connect: errno of the last failure */
  const char *last_what;
  uint64_t rng;
} conn_t;

typedef struct {
  /* options */
  const char *host;
  int port;
  const char *label;
  int nconn;
  int nthreads;
  int op;
  int legacy;
  int json;
  int header;
  double duration;
  double warmup;
  uint32_t nkeys;
  size_t value_size;
  long server_pid;
  uint64_t timeout_ns;
  int timeout_ms;
  int batch;
  int rdv_n;
  int reps;
  double rate;        /* --rate: offered ops/s in all; 0: closed loop */
  /* derived */
  const wire_ops_t *wire;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  keyset_t data;
  keyset_t ctr;
  keyset_t rdv_count;
  keyset_t rdv_done;
  uint8_t *value;
  conn_t *conns;
  /* Fixed before the workers start (the barrier publishes them). */
  uint64_t t_measure;
  uint64_t t_end;
  pthread_barrier_t barrier;
  int running;        /* workers still running (atomic) */
  int errors_shown;   /* atomic */
} bench_t;

typedef struct {
  bench_t *b;
  pthread_t tid;
  conn_t *conns;
  int nconns;
  int ep;
  int active;         /* connections with work left */
  uint64_t ops;
  uint64_t errors;
  uint64_t first_send;
  uint64_t last_done;
  /* --rate: operation k of this worker is due at t0 + k * step_ns, on
   * connection k mod nconns; epoll_pwait2's nanosecond timeout wakes the
   * worker for the next (one system call per wake-up, where a timerfd
   * would take three: the load generator's core is the limit at high
   * rates). */
  double step_ns;
  uint64_t t0;
  uint64_t k;
  uint64_t next_due;
  uint64_t late;      /* due while their connection was still busy */
  hist_t *hist;
  uint8_t rbuf[65536];
} worker_t;

static uint64_t xrand(uint64_t *s)
{
  /* xorshift64*: plenty for picking keys, and cheap. */
  uint64_t x = *s;

  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return (x * UINT64_C(2685821657736338717)) >> 32;
}

static void bench_report_error(bench_t *b, conn_t *c, const char *what,
                               int err)
{
  /* Thousands of dying connections must not flood the terminal. */
  int n = __atomic_add_fetch(&b->errors_shown, 1, __ATOMIC_RELAXED);

  if (n > 5)
    return;
  fprintf(stderr, PROG ": bench: connection %d: %s%s%s%s\n", c->id, what,
          err ? ": " : "", err ? strerror(err) : "",
          n == 5 ? " (further errors not shown)" : "");
}

static void out_need(conn_t *c, size_t n)
{
  size_t cap;

  if (c->out_len + n <= c->out_cap)
    return;
  cap = c->out_cap ? c->out_cap : 256;
  while (cap < c->out_len + n)
    cap *= 2;
  c->out = realloc(c->out, cap);
  if (c->out == NULL)
    fatal("out of memory");
  c->out_cap = cap;
}

static void out_mem(conn_t *c, const void *p, size_t n)
{
  out_need(c, n);
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
}

static void out_u8(conn_t *c, uint8_t v)
{
  out_mem(c, &v, 1);
}

static void out_u64(conn_t *c, uint64_t v)
{
  out_mem(c, &v, 8);  /* host order, as PyTorch (little-endian) */
}

static void out_key(conn_t *c, const keyset_t *ks, uint32_t i)
{
  out_mem(c, ks->buf + ks->off[i], ks->off[i + 1] - ks->off[i]);
}

static void req_set(conn_t *c, const bench_t *b, const keyset_t *ks,
                    uint32_t i, const void *val, size_t len)
{
  out_u8(c, b->wire->set);
  out_key(c, ks, i);
  out_u64(c, len);
  out_mem(c, val, len);
}

/* CHECK and WAIT on one key. */
static void req_keys1(conn_t *c, uint8_t op, const keyset_t *ks, uint32_t i)
{
  out_u8(c, op);
  out_u64(c, 1);
  out_key(c, ks, i);
}

static void req_get(conn_t *c, const bench_t *b, uint32_t i)
{
  out_u8(c, b->wire->get);
  out_key(c, &b->data, i);
}

static void req_add(conn_t *c, const bench_t *b, const keyset_t *ks,
                    uint32_t i, int64_t delta)
{
  out_u8(c, b->wire->add);
  out_key(c, ks, i);
  out_mem(c, &delta, 8);
}

static void req_handshake(conn_t *c, const bench_t *b)
{
  uint32_t nonce = (uint32_t) getpid() + (uint32_t) c->id;

  c->out_len = c->out_off = 0;
  if (b->legacy) {
    /* 1.13 has no handshake: a GETNUMKEYS round trip proves the server
     * accepted us and speaks the dialect. */
    out_u8(c, b->wire->getnumkeys);
    reply_expect(&c->r, R_I64);
  } else {
    out_u8(c, WIRE_VALIDATE);
    out_mem(c, wire_magic, 4);
    out_u8(c, WIRE_PING);
    out_mem(c, &nonce, 4);
    reply_expect(&c->r, R_U32);
  }
}

/* Sends what is pending; registers for EPOLLOUT only while the socket is
 * full, so the common case costs one send() and no epoll_ctl. */
static int conn_flush(int ep, conn_t *c)
{
  struct epoll_event ev;
  ssize_t n;

  while (c->out_off < c->out_len) {
    n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
             MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t) n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c->out_watch) {
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.ptr = c;
        if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) != 0)
          return -errno;
        c->out_watch = 1;
      }
      return 0;
    }
    return n < 0 ? -errno : -EIO;
  }
  if (c->out_watch) {
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) != 0)
      return -errno;
    c->out_watch = 0;
  }
  return 0;
}

static void w_fail(worker_t *w, conn_t *c, const char *what, int err)
{
  bench_report_error(w->b, c, what, err);
  w->errors++;
  close(c->fd);  /* also leaves the epoll set */
  c->fd = -1;
  c->state = C_DEAD;
  c->r.kind = R_NONE;
  w->active--;
}

static void w_send(worker_t *w, conn_t *c, uint64_t now)
{
  int rc;

  c->t_req = now;
  rc = conn_flush(w->ep, c);
  if (rc < 0)
    w_fail(w, c, "send", -rc);
}

static void w_start_op(worker_t *w, conn_t *c, uint64_t now, uint64_t t_op)
{
  bench_t *b = w->b;
  int op = b->op;
  uint32_t r;

  if (op == B_MIX) {
    r = (uint32_t) (xrand(&c->rng) % 10);
    op = r < 5 ? B_GET : r < 8 ? B_ADD : B_SET;
  }
  c->op = op;
  c->step = 0;
  c->t_op = t_op;
  c->key = b->nkeys > 1 ? (uint32_t) (xrand(&c->rng) % b->nkeys) : 0;
  c->out_len = c->out_off = 0;
  switch (op) {
  case B_SET:
    req_set(c, b, &b->data, c->key, b->value, b->value_size);
    req_keys1(c, b->wire->check, &b->data, c->key);
    reply_expect(&c->r, R_U8);
    break;
  case B_GET:
    req_get(c, b, c->key);
    reply_expect(&c->r, R_BYTES);
    break;
  case B_ADD:
    req_add(c, b, &b->ctr, c->key, 1);
    reply_expect(&c->r, R_I64);
    break;
  case B_WAITGET:
    req_keys1(c, b->wire->wait, &b->data, c->key);
    reply_expect(&c->r, R_U8);
    break;
  case B_RDV:
    req_add(c, b, &b->rdv_count, 0, 1);
    reply_expect(&c->r, R_I64);
    break;
  }
  w_send(w, c, now);
}

/* A reply is complete: check it, record the op, start the next one. */
static void w_reply(worker_t *w, conn_t *c)
{
  bench_t *b = w->b;
  uint64_t now = now_ns();
  uint64_t t_op;
  int bad = 0;

  switch (c->op) {
  case B_SET:
    bad = c->r.hdr[0] != 0;  /* the key was just set: READY */
    break;
  case B_GET:
    bad = c->r.len != b->value_size;
    break;
  case B_ADD:
    break;
  case B_WAITGET:
    if (c->step == 0) {
      if (c->r.hdr[0] != 0) {
        w_fail(w, c, "WAIT answered other than STOP_WAITING", 0);
        return;
      }
      c->step = 1;
      c->out_len = c->out_off = 0;
      req_get(c, b, c->key);
      reply_expect(&c->r, R_BYTES);
      w_send(w, c, now);
      return;
    }
    bad = c->r.len != b->value_size;
    break;
  case B_RDV:
    if (c->step == 0) {
      c->step = 1;
      c->out_len = c->out_off = 0;
      if (reply_i64(&c->r) == b->rdv_n)
        req_set(c, b, &b->rdv_done, 0, "1", 1);
      req_keys1(c, b->wire->wait, &b->rdv_done, 0);
      reply_expect(&c->r, R_U8);
      w_send(w, c, now);
      return;
    }
    if (c->r.hdr[0] != 0)
      w_fail(w, c, "WAIT answered other than STOP_WAITING", 0);
    else {
      c->r.kind = R_NONE;
      w->last_done = now;
      w->active--;
    }
    return;
  }
  if (bad) {
    /* Wrong but well-formed: the stream is still in sync. */
    bench_report_error(b, c, "unexpected reply value", 0);
    w->errors++;
  }
  if (now >= b->t_measure && now < b->t_end) {
    hist_add(w->hist, now - c->t_op);
    w->ops++;
  }
  if (now >= b->t_end) {
    c->r.kind = R_NONE;
    return;
  }
  if (b->rate > 0) {
    /* Open loop: the next operation waits for its due time, unless it is
     * already due (then it counts from that time, not from now). */
    if (c->pend_n == 0) {
      c->r.kind = R_NONE;
      return;
    }
    t_op = c->pend_first;
    c->pend_first += (uint64_t) (w->step_ns * w->nconns);
    c->pend_n--;
    w_start_op(w, c, now, t_op);
    return;
  }
  w_start_op(w, c, now, now);
}

/* --rate: starts every operation due by now. An operation due on a
 * connection still waiting for its previous reply queues behind it and
 * counts from its due time, so a slow server shows in the latency instead
 * of slowing the offered load (no coordinated omission). */
static void w_rate_tick(worker_t *w, uint64_t now)
{
  bench_t *b = w->b;
  conn_t *c;

  while (w->next_due <= now && w->next_due < b->t_end) {
    c = &w->conns[w->k % (uint64_t) w->nconns];
    if (c->state == C_READY) {
      if (c->r.kind == R_NONE)
        w_start_op(w, c, now, w->next_due);
      else {
        if (c->pend_n++ == 0)
          c->pend_first = w->next_due;
        w->late++;
      }
    }
    w->k++;
    w->next_due = w->t0 + (uint64_t) (w->step_ns * (double) w->k);
  }
}

static void w_readable(worker_t *w, conn_t *c)
{
  size_t off;
  ssize_t n;
  int done;

  for (;;) {
    n = recv(c->fd, w->rbuf, sizeof(w->rbuf), 0);
    if (n == 0) {
      w_fail(w, c, "connection closed by the server", 0);
      return;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        w_fail(w, c, "recv", errno);
      return;
    }
    off = 0;
    while (off < (size_t) n) {
      if (c->r.kind == R_NONE) {
        w_fail(w, c, "unexpected bytes from the server", 0);
        return;
      }
      off += reply_feed(&c->r, w->rbuf + off, (size_t) n - off, &done);
      if (!done)
        continue;
      /* One request in flight: nothing may follow its reply. */
      if (off < (size_t) n) {
        w_fail(w, c, "unexpected bytes after a reply", 0);
        return;
      }
      w_reply(w, c);
      if (c->state != C_READY)
        return;
    }
    /* A short read drained the socket; skip the recv() that would only
     * say EAGAIN (level-triggered epoll tells us if more arrives). */
    if ((size_t) n < sizeof(w->rbuf))
      return;
  }
}

static void w_scan_timeouts(worker_t *w, uint64_t now)
{
  bench_t *b = w->b;
  conn_t *c;
  char what[64];
  int i;

  for (i = 0; i < w->nconns; i++) {
    c = &w->conns[i];
    if (c->state == C_READY && c->r.kind != R_NONE &&
        now - c->t_req > b->timeout_ns) {
      snprintf(what, sizeof(what), "no reply within %d ms", b->timeout_ms);
      w_fail(w, c, what, 0);
    }
  }
}

/* epoll_wait with a timeout in nanoseconds: epoll_pwait2 (Linux 5.11),
 * or where the kernel lacks it, whole milliseconds rounded down, which
 * spins through the last one (the load generator has a core of its own). */
static int rate_wait(int ep, struct epoll_event *ev, int max, uint64_t ns)
{
  static int no_pwait2;
  struct timespec ts;
  int n;

  if (!no_pwait2) {
    ts.tv_sec = (time_t) (ns / 1000000000u);
    ts.tv_nsec = (long) (ns % 1000000000u);
    n = epoll_pwait2(ep, ev, max, &ts, NULL);
    if (n >= 0 || errno != ENOSYS)
      return n;
    __atomic_store_n(&no_pwait2, 1, __ATOMIC_RELAXED);
  }
  return epoll_wait(ep, ev, max, (int) (ns / 1000000u));
}

static void *worker_main(void *arg)
{
  worker_t *w = arg;
  bench_t *b = w->b;
  struct epoll_event ev[256];
  uint64_t now;
  uint64_t next_scan;
  uint64_t until;
  conn_t *c;
  int tmo;
  int n;
  int i;

  pthread_barrier_wait(&b->barrier);
  now = now_ns();
  w->first_send = now;
  w->active = 0;
  for (i = 0; i < w->nconns; i++)
    if (w->conns[i].state == C_READY)
      w->active++;
  if (b->rate > 0) {
    /* Timeouts wake up to 50 us late by default (timer slack, per
     * thread), which would count as latency. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    w->t0 = now;
    w->next_due = now;
    w->k = 0;
    w_rate_tick(w, now);
  } else
    for (i = 0; i < w->nconns; i++)
      if (w->conns[i].state == C_READY)
        w_start_op(w, &w->conns[i], now, now);
  next_scan = now + 100000000u;
  while (w->active > 0) {
    now = now_ns();
    if (now >= b->t_end)
      break;
    if (now >= next_scan) {
      w_scan_timeouts(w, now);
      next_scan = now + 100000000u;
    }
    until = b->t_end < next_scan ? b->t_end : next_scan;
    if (b->rate > 0) {
      if (w->next_due < until)
        until = w->next_due;
      n = rate_wait(w->ep, ev, 256, until > now ? until - now : 0);
    } else {
      tmo = (int) ((until - now + 999999) / 1000000);
      n = epoll_wait(w->ep, ev, 256, tmo);
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fprintf(stderr, PROG ": bench: epoll_wait: %s\n", strerror(errno));
      break;
    }
    for (i = 0; i < n; i++) {
      c = ev[i].data.ptr;
      if (c->state != C_READY)
        continue;
      if ((ev[i].events & EPOLLOUT) && c->out_off < c->out_len) {
        int rc = conn_flush(w->ep, c);
        if (rc < 0) {
          w_fail(w, c, "send", -rc);
          continue;
        }
      }
      if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        w_readable(w, c);
    }
    if (b->rate > 0)
      w_rate_tick(w, now_ns());
  }
  /* A rendezvous that ran out of time: whoever is still waiting failed. */
  if (b->op == B_RDV)
    for (i = 0; i < w->nconns; i++) {
      c = &w->conns[i];
      if (c->state == C_READY && c->r.kind != R_NONE)
        w_fail(w, c, "rendezvous not complete within the timeout", 0);
    }
  __atomic_sub_fetch(&b->running, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* bench: connecting                                                        */

static int conn_retryable(int err)
{
  /* A server that is starting, a full accept queue (RST with
   * tcp_abort_on_overflow) or ports in TIME_WAIT: all pass. */
  return err == ECONNREFUSED || err == EAGAIN || err == ECONNRESET ||
         err == ETIMEDOUT || err == EADDRNOTAVAIL || err == EPIPE ||
         err == EINTR;
}

static void conn_schedule_retry(conn_t *c, int err, const char *what,
                                uint64_t now)
{
  int ms;

  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  c->state = C_RETRY;
  c->last_err = err;
  c->last_what = what;
  c->attempts++;
  ms = c->attempts < 20 ? 5 * c->attempts : 100;
  c->retry_at = now + (uint64_t) ms * 1000000u;
}

/* Starts a connect; 0, or -errno for a failure not worth retrying. */
static int conn_open(bench_t *b, conn_t *c, int ep, uint64_t now)
{
  struct epoll_event ev;
  int one = 1;
  int fd;
  int err;

  fd = socket(b->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
              0);
  if (fd < 0)
    return -errno;
  /* One small request at a time: Nagle would only add latency. */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  c->fd = fd;
  c->out_watch = 0;
  if (connect(fd, (struct sockaddr *) &b->addr, b->addrlen) != 0 &&
      errno != EINPROGRESS) {
    err = errno;
    if (!conn_retryable(err))
      return -err;
    conn_schedule_retry(c, err, "connect", now);
    return 0;
  }
  c->state = C_CONNECTING;
  ev.events = EPOLLOUT;
  ev.data.ptr = c;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
    return -errno;
  return 0;
}

/* Advances one connection of the current batch. Returns 1 when it is
 * ready, 0 while in progress, -errno on a fatal error. */
static int conn_event(bench_t *b, conn_t *c, int ep, uint32_t events,
                      uint64_t now)
{
  struct epoll_event ev;
  uint8_t buf[64];
  socklen_t len;
  ssize_t n;
  size_t off;
  int err = 0;
  int done;
  int rc;

  if (c->state == C_CONNECTING) {
    len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
      err = errno;
    if (err != 0) {
      if (!conn_retryable(err))
        return -err;
      conn_schedule_retry(c, err, "connect", now);
      return 0;
    }
    req_handshake(c, b);
    c->state = C_HANDSHAKE;
    c->t_req = now;
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) != 0)
      return -errno;
    rc = conn_flush(ep, c);
    if (rc < 0) {
      if (!conn_retryable(-rc))
        return rc;
      conn_schedule_retry(c, -rc, "handshake send", now);
    }
    return 0;
  }
  if (c->state != C_HANDSHAKE)
    return 0;
  if ((events & EPOLLOUT) && c->out_off < c->out_len) {
    rc = conn_flush(ep, c);
    if (rc < 0) {
      if (!conn_retryable(-rc))
        return rc;
      conn_schedule_retry(c, -rc, "handshake send", now);
      return 0;
    }
  }
  if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
    return 0;
  n = recv(c->fd, buf, sizeof(buf), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return 0;
  if (n <= 0) {
    err = n == 0 ? ECONNRESET : errno;
    if (!conn_retryable(err))
      return -err;
    conn_schedule_retry(c, err,
                        "connection closed during the handshake", now);
    return 0;
  }
  off = reply_feed(&c->r, buf, (size_t) n, &done);
  if (!done)
    return 0;
  if (off < (size_t) n)
    return -EPROTO;
  if (!b->legacy &&
      reply_u32(&c->r) != (uint32_t) getpid() + (uint32_t) c->id)
    return -EPROTO;
  c->r.kind = R_NONE;
  c->state = C_READY;
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  return 1;
}

/* Opens every connection, in batches that each complete before the next
 * starts: thousands of simultaneous SYNs overflow the accept queue, and a
 * dropped final ACK only recovers after a one-second retransmit. */
static int bench_connect(bench_t *b)
{
  struct epoll_event ev[256];
  uint64_t deadline;
  uint64_t now;
  conn_t *c;
  int pending;
  int start;
  int end;
  int ep;
  int rc;
  int n;
  int i;

  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    fprintf(stderr, PROG ": bench: epoll_create1: %s\n", strerror(errno));
    return -1;
  }
  for (start = 0; start < b->nconn; start = end) {
    end = start + b->batch < b->nconn ? start + b->batch : b->nconn;
    now = now_ns();
    deadline = now + b->timeout_ns;
    pending = end - start;
    for (i = start; i < end; i++) {
      c = &b->conns[i];
      rc = conn_open(b, c, ep, now);
      if (rc < 0)
        goto fatal;
    }
    while (pending > 0) {
      now = now_ns();
      if (now >= deadline) {
        for (i = start; i < end; i++)
          if (b->conns[i].state != C_READY)
            break;
        c = &b->conns[i];
        fprintf(stderr, PROG ": bench: cannot connect to %s:%d (connection "
                "%d) within %d ms: ", b->host, b->port, c->id,
                b->timeout_ms);
        if (c->state == C_HANDSHAKE)
          fprintf(stderr, "no answer to the %s\n", b->legacy
                  ? "first request (not a 1.13 server? try --dialect modern)"
                  : "VALIDATE+PING handshake (a 1.13 server? try "
                    "--dialect legacy)");
        else if (c->last_what != NULL)
          fprintf(stderr, "%s%s%s%s\n", c->last_what,
                  c->last_err ? ": " : "",
                  c->last_err ? strerror(c->last_err) : "",
                  c->last_err == ECONNRESET && !b->legacy
                      ? " (a 1.13 server? try --dialect legacy)" : "");
        else
          fprintf(stderr, "no answer\n");
        goto fail;
      }
      n = epoll_wait(ep, ev, 256, 5);
      if (n < 0 && errno != EINTR) {
        fprintf(stderr, PROG ": bench: epoll_wait: %s\n", strerror(errno));
        goto fail;
      }
      now = now_ns();
      for (i = 0; i < n; i++) {
        c = ev[i].data.ptr;
        rc = conn_event(b, c, ep, ev[i].events, now);
        if (rc < 0)
          goto fatal;
        pending -= rc;
      }
      for (i = start; i < end; i++) {
        c = &b->conns[i];
        if (c->state == C_RETRY && now >= c->retry_at) {
          rc = conn_open(b, c, ep, now);
          if (rc < 0)
            goto fatal;
        }
      }
    }
  }
  close(ep);
  return 0;

fatal:
  fprintf(stderr, PROG ": bench: connection %d to %s:%d: %s\n", c->id,
          b->host, b->port,
          rc == -EPROTO ? "unexpected handshake reply (wrong --dialect?)"
                        : strerror(-rc));
fail:
  close(ep);
  return -1;
}

/* ------------------------------------------------------------------------ */
/* bench: setup, run, report                                                */

static int wait_fd(int fd, short events, uint64_t deadline)
{
  struct pollfd p;
  uint64_t now;
  int rc;

  for (;;) {
    now = now_ns();
    if (now >= deadline)
      return -ETIMEDOUT;
    p.fd = fd;
    p.events = events;
    p.revents = 0;
    rc = poll(&p, 1, (int) ((deadline - now + 999999) / 1000000));
    if (rc > 0)
      return 0;
    if (rc < 0 && errno != EINTR)
      return -errno;
  }
}

static int sync_send(conn_t *c, uint64_t deadline)
{
  ssize_t n;
  int rc;

  while (c->out_off < c->out_len) {
    n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
             MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += (size_t) n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return -errno;
    rc = wait_fd(c->fd, POLLOUT, deadline);
    if (rc < 0)
      return rc;
  }
  c->out_len = c->out_off = 0;
  return 0;
}

static int sync_reply(conn_t *c, uint64_t deadline)
{
  uint8_t buf[4096];
  size_t off = 0;
  ssize_t n = 0;
  int done = 0;
  int rc;

  while (!done) {
    rc = wait_fd(c->fd, POLLIN, deadline);
    if (rc < 0)
      return rc;
    n = recv(c->fd, buf, sizeof(buf), 0);
    if (n == 0)
      return -ECONNRESET;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
        continue;
      return -errno;
    }
    off = reply_feed(&c->r, buf, (size_t) n, &done);
  }
  if (off < (size_t) n)
    return -EPROTO;
  c->r.kind = R_NONE;
  return 0;
}

/* Sets every data key on the first connection, then a GETNUMKEYS round
 * trip: SET has no reply, so that is how we know the server holds them. A
 * GET of a missing key would close a 1.13 connection, and a WAIT block. */
static int bench_populate(bench_t *b)
{
  conn_t *c = &b->conns[0];
  uint64_t deadline;
  uint32_t i;
  int rc;

  c->out_len = c->out_off = 0;
  for (i = 0; i < b->nkeys; i++) {
    req_set(c, b, &b->data, i, b->value, b->value_size);
    if (c->out_len >= 65536 || i + 1 == b->nkeys) {
      rc = sync_send(c, now_ns() + b->timeout_ns);
      if (rc < 0)
        goto fail;
    }
  }
  out_u8(c, b->wire->getnumkeys);
  reply_expect(&c->r, R_I64);
  deadline = now_ns() + b->timeout_ns;
  rc = sync_send(c, deadline);
  if (rc == 0)
    rc = sync_reply(c, deadline);
  if (rc == 0)
    return 0;
fail:
  fprintf(stderr, PROG ": bench: setting %" PRIu32 " keys: %s\n", b->nkeys,
          rc == -ETIMEDOUT ? "no reply within the timeout"
          : rc == -ECONNRESET ? "connection closed by the server"
          : strerror(-rc));
  return -1;
}

/* CPU time of a whole process (all its threads) from /proc/PID/stat
 * (utime + stime), in ns but counted in clock ticks (10 ms). */
static int proc_stat_cpu_ns(long pid, uint64_t *ns)
{
  char path[64];
  char buf[2048];
  unsigned long long ut;
  unsigned long long st;
  const char *p;
  ssize_t n;
  int field;
  int fd;

  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  /* The command name may contain spaces and parentheses: skip past the
   * last ')', after which come field 3 (state) onwards. */
  p = strrchr(buf, ')');
  if (p == NULL)
    return -1;
  p += 2;
  for (field = 3; field < 14; field++) {
    p = strchr(p, ' ');
    if (p == NULL)
      return -1;
    p++;
  }
  if (sscanf(p, "%llu %llu", &ut, &st) != 2)
    return -1;
  *ns = (uint64_t) (ut + st) * (1000000000u / (uint64_t) sysconf(_SC_CLK_TCK));
  return 0;
}

/* CPU time of a process, all its threads, in nanoseconds: the sum of the
 * run times in /proc/PID/task/TID/schedstat (the server of PyTorch 1.13
 * runs in a thread of its own). A server under a light load uses a tenth
 * of a second of CPU or so in a measurement, which the 10 ms ticks of
 * /proc/PID/stat would count to within 10%; they are the fallback where
 * schedstat is missing. The servers measured keep their threads: the run
 * time of one that exits mid-window would be lost. */
static int proc_cpu_ns(long pid, uint64_t *ns)
{
  char path[320];
  char buf[128];
  unsigned long long run;
  uint64_t sum = 0;
  struct dirent *de;
  DIR *d;
  ssize_t n;
  int fd;
  int found = 0;

  snprintf(path, sizeof(path), "/proc/%ld/task", pid);
  d = opendir(path);
  if (d == NULL)
    return proc_stat_cpu_ns(pid, ns);
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "/proc/%ld/task/%s/schedstat", pid,
             de->d_name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;  /* the thread just exited */
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
      continue;
    buf[n] = '\0';
    if (sscanf(buf, "%llu", &run) != 1)
      continue;
    sum += run;
    found = 1;
  }
  closedir(d);
  if (!found)
    return proc_stat_cpu_ns(pid, ns);
  *ns = sum;
  return 0;
}

static uint64_t self_cpu_ns(void)
{
  struct rusage ru;

  if (getrusage(RUSAGE_SELF, &ru) != 0)
    return 0;
  return ((uint64_t) ru.ru_utime.tv_sec + (uint64_t) ru.ru_stime.tv_sec) *
             1000000000u +
         ((uint64_t) ru.ru_utime.tv_usec + (uint64_t) ru.ru_stime.tv_usec) *
             1000u;
}

/* Sleeps until t, or until every worker has stopped. */
static void sleep_until(bench_t *b, uint64_t t)
{
  struct timespec ts;
  uint64_t now;
  uint64_t step;

  for (;;) {
    now = now_ns();
    if (now >= t || __atomic_load_n(&b->running, __ATOMIC_ACQUIRE) == 0)
      return;
    step = t - now < 10000000u ? t - now : 10000000u;
    ts.tv_sec = 0;
    ts.tv_nsec = (long) step;
    nanosleep(&ts, NULL);
  }
}

static worker_t *bench_workers(bench_t *b)
{
  struct epoll_event ev;
  worker_t *ws = xcalloc((size_t) b->nthreads, sizeof(worker_t));
  worker_t *w;
  int lo;
  int hi;
  int t;
  int i;

  for (t = 0; t < b->nthreads; t++) {
    w = &ws[t];
    lo = (int) ((int64_t) b->nconn * t / b->nthreads);
    hi = (int) ((int64_t) b->nconn * (t + 1) / b->nthreads);
    w->b = b;
    w->conns = b->conns + lo;
    w->nconns = hi - lo;
    w->hist = xcalloc(1, sizeof(hist_t));
    w->ep = epoll_create1(EPOLL_CLOEXEC);
    if (w->ep < 0)
      fatal("bench: epoll_create1: %s", strerror(errno));
    for (i = 0; i < w->nconns; i++) {
      ev.events = EPOLLIN;
      ev.data.ptr = &w->conns[i];
      if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->conns[i].fd, &ev) != 0)
        fatal("bench: epoll_ctl: %s", strerror(errno));
    }
    if (b->rate > 0)
      /* Each worker offers its share of the rate over its connections. */
      w->step_ns = 1e9 / (b->rate * w->nconns / b->nconn);
  }
  return ws;
}

/* Starts the workers; they begin together at the barrier. */
static void bench_start(bench_t *b, worker_t *ws)
{
  int t;
  int rc;

  pthread_barrier_init(&b->barrier, NULL, (unsigned) b->nthreads + 1);
  b->running = b->nthreads;
  for (t = 0; t < b->nthreads; t++) {
    ws[t].ops = 0;
    ws[t].last_done = 0;
    rc = pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]);
    if (rc != 0)
      fatal("bench: pthread_create: %s", strerror(rc));
  }
}

static void bench_join(bench_t *b, worker_t *ws)
{
  int t;

  for (t = 0; t < b->nthreads; t++)
    pthread_join(ws[t].tid, NULL);
  pthread_barrier_destroy(&b->barrier);
}

static void json_str(FILE *f, const char *s)
{
  fputc('"', f);
  for (; *s != '\0'; s++) {
    unsigned char ch = (unsigned char) *s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static int bench_run_load(bench_t *b)
{
  worker_t *ws;
  hist_t *h = xcalloc(1, sizeof(hist_t));
  uint64_t srv0 = 0;
  uint64_t srv1 = 0;
  uint64_t cli0;
  uint64_t cli1;
  uint64_t t0;
  uint64_t t_stop;
  uint64_t ops = 0;
  uint64_t errors = 0;
  uint64_t late = 0;
  int srv_ok;
  double secs;
  double p[5];
  double maxus;
  double rate;
  int t;

  ws = bench_workers(b);
  t0 = now_ns();
  b->t_measure = t0 + (uint64_t) (b->warmup * 1e9);
  b->t_end = b->t_measure + (uint64_t) (b->duration * 1e9);
  bench_start(b, ws);
  pthread_barrier_wait(&b->barrier);

  sleep_until(b, b->t_measure);
  srv_ok = b->server_pid > 0 && proc_cpu_ns(b->server_pid, &srv0) == 0;
  cli0 = self_cpu_ns();
  sleep_until(b, b->t_end);
  if (srv_ok)
    srv_ok = proc_cpu_ns(b->server_pid, &srv1) == 0;
  cli1 = self_cpu_ns();
  /* If every connection died the window ended early: rates are over the
   * time that was actually measured. */
  t_stop = now_ns();
  if (t_stop > b->t_end)
    t_stop = b->t_end;
  bench_join(b, ws);

  for (t = 0; t < b->nthreads; t++) {
    hist_merge(h, ws[t].hist);
    ops += ws[t].ops;
    errors += ws[t].errors;
    late += ws[t].late;
    free(ws[t].hist);
    close(ws[t].ep);
  }
  free(ws);
  secs = t_stop > b->t_measure ? (t_stop - b->t_measure) / 1e9 : 0;
  rate = secs > 0 ? ops / secs : 0;
  p[0] = hist_pct(h, 0.50) / 1e3;
  p[1] = hist_pct(h, 0.90) / 1e3;
  p[2] = hist_pct(h, 0.99) / 1e3;
  p[3] = hist_pct(h, 0.999) / 1e3;
  maxus = h->max / 1e3;
  free(h);

  if (b->json) {
    printf("{\"server\":");
    json_str(stdout, b->label);
    printf(",\"op\":\"%s\",\"op_desc\":\"%s\",\"dialect\":\"%s\","
           "\"connections\":%d,\"threads\":%d,\"keys\":%" PRIu32
           ",\"value_size\":%zu,\"duration_s\":%.3f,\"ops\":%" PRIu64
           ",\"ops_per_s\":%.1f,\"p50_us\":%.1f,\"p90_us\":%.1f,"
           "\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,"
           "\"errors\":%" PRIu64 ",\"client_cpu_s\":%.3f",
           bench_op_names[b->op], bench_op_desc[b->op],
           b->legacy ? "legacy" : "modern", b->nconn, b->nthreads, b->nkeys,
           b->value_size, secs, ops, rate, p[0], p[1], p[2], p[3], maxus,
           errors, (cli1 - cli0) / 1e9);
    if (srv_ok)
      printf(",\"server_cpu_s\":%.3f,\"server_cpu_us_per_op\":%.3f",
             (srv1 - srv0) / 1e9,
             ops ? (srv1 - srv0) / 1e3 / (double) ops : 0.0);
    if (b->rate > 0)
      printf(",\"offered_per_s\":%.1f,\"late_ops\":%" PRIu64, b->rate, late);
    printf("}\n");
  } else {
    if (b->header) {
      printf("# %s: %s; %d key%s, %zu B values, %d thread%s, %.1f s after "
             "%.1f s warm-up; latency in us\n",
             bench_op_names[b->op], bench_op_desc[b->op], (int) b->nkeys,
             b->nkeys > 1 ? "s" : "", b->value_size, b->nthreads,
             b->nthreads > 1 ? "s" : "", secs, b->warmup);
      printf("%-22s %-8s %-7s %6s %10s %8s %8s %8s %8s %9s %7s %7s",
             "server", "op", "dialect", "conns", "ops/s", "p50", "p90", "p99",
             "p999", "max", "errors", "cli_cpu");
      if (srv_ok)
        printf(" %7s %9s", "srv_cpu", "srv_us/op");
      printf("\n");
    }
    printf("%-22s %-8s %-7s %6d %10.0f %8.1f %8.1f %8.1f %8.1f %9.1f %7"
           PRIu64 " %7.2f", b->label, bench_op_names[b->op],
           b->legacy ? "legacy" : "modern", b->nconn, rate, p[0], p[1], p[2],
           p[3], maxus, errors, (cli1 - cli0) / 1e9);
    if (srv_ok)
      printf(" %7.2f %9.2f", (srv1 - srv0) / 1e9,
             ops ? (srv1 - srv0) / 1e3 / (double) ops : 0.0);
    printf("\n");
    if (b->rate > 0)
      printf("# open loop: %.0f ops/s offered; %" PRIu64 " operations fell "
             "due while their connection was still busy\n", b->rate, late);
  }
  fflush(stdout);
  if (b->server_pid > 0 && !srv_ok)
    fprintf(stderr, PROG ": bench: could not read /proc/%ld/stat\n",
            b->server_pid);
  if (ops == 0) {
    fprintf(stderr, PROG ": bench: no operation completed\n");
    return 1;
  }
  return 0;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *) a;
  double y = *(const double *) b;

  return x < y ? -1 : x > y;
}

static int bench_run_rendezvous(bench_t *b)
{
  worker_t *ws;
  double *ms = xcalloc((size_t) b->reps, sizeof(double));
  double *sorted = xcalloc((size_t) b->reps, sizeof(double));
  char prefix[128];
  double median;
  uint64_t errors = 0;
  uint64_t first;
  uint64_t last;
  uint64_t tag;
  int done = 0;
  int rep;
  int t;
  int i;

  /* Fresh keys for every run, so a server reused across runs (or one that
   * another bench ran against) starts each rendezvous from zero. */
  tag = now_ns() ^ ((uint64_t) getpid() << 32);
  ws = bench_workers(b);
  for (rep = 0; rep < b->reps; rep++) {
    snprintf(prefix, sizeof(prefix), "/rdv/%016" PRIx64 "-%d/count", tag,
             rep);
    keyset_build(&b->rdv_count, prefix, 1);
    snprintf(prefix, sizeof(prefix), "/rdv/%016" PRIx64 "-%d/done", tag,
             rep);
    keyset_build(&b->rdv_done, prefix, 1);
    b->t_measure = 0;
    b->t_end = now_ns() + b->timeout_ns;
    bench_start(b, ws);
    pthread_barrier_wait(&b->barrier);
    bench_join(b, ws);
    first = UINT64_MAX;
    last = 0;
    for (t = 0; t < b->nthreads; t++) {
      errors += ws[t].errors;
      ws[t].errors = 0;
      if (ws[t].nconns == 0)
        continue;
      if (ws[t].first_send < first)
        first = ws[t].first_send;
      if (ws[t].last_done > last)
        last = ws[t].last_done;
    }
    if (errors != 0)
      break;  /* connections died: the next run would be smaller */
    ms[done++] = (last - first) / 1e6;
  }
  for (t = 0; t < b->nthreads; t++) {
    free(ws[t].hist);
    close(ws[t].ep);
  }
  free(ws);
  memcpy(sorted, ms, (size_t) done * sizeof(double));
  qsort(sorted, (size_t) done, sizeof(double), cmp_double);
  median = done ? (sorted[(done - 1) / 2] + sorted[done / 2]) / 2 : 0.0;

  if (b->json) {
    printf("{\"server\":");
    json_str(stdout, b->label);
    printf(",\"op\":\"rendezvous\",\"op_desc\":\"%s\",\"dialect\":\"%s\","
           "\"connections\":%d,\"threads\":%d,\"reps\":%d,\"ms\":[",
           bench_op_desc[B_RDV], b->legacy ? "legacy" : "modern", b->nconn,
           b->nthreads, done);
    for (i = 0; i < done; i++)
      printf("%s%.3f", i ? "," : "", ms[i]);
    printf("],\"median_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
           "\"errors\":%" PRIu64 "}\n",
           median, done ? sorted[0] : 0.0, done ? sorted[done - 1] : 0.0,
           errors);
  } else {
    if (b->header) {
      printf("# rendezvous: %d connections ADD a counter, the one reaching "
             "%d SETs done, all WAIT done;\n# ms from the first ADD sent to "
             "the last WAIT answered, over %d runs\n", b->rdv_n, b->rdv_n,
             b->reps);
      printf("%-22s %-7s %6s %5s %10s %10s %10s %7s\n", "server", "dialect",
             "conns", "runs", "median_ms", "min_ms", "max_ms", "errors");
    }
    printf("%-22s %-7s %6d %5d %10.3f %10.3f %10.3f %7" PRIu64 "\n",
           b->label, b->legacy ? "legacy" : "modern", b->nconn, done, median,
           done ? sorted[0] : 0.0, done ? sorted[done - 1] : 0.0, errors);
  }
  fflush(stdout);
  free(ms);
  free(sorted);
  keyset_free(&b->rdv_count);
  keyset_free(&b->rdv_done);
  return done == 0 ? 1 : 0;
}

static int cmd_bench(int argc, char **argv)
{
  static bench_t bench;
  bench_t *b = &bench;
  struct addrinfo hints;
  struct addrinfo *ai = NULL;
  struct rlimit rl;
  char hostbuf[256];
  char label[300];
  char portstr[16];
  const char *v;
  const char *dialect = "modern";
  const char *op = "add";
  int64_t keys = -1;
  uint64_t dummy;
  int status;
  int rc;
  int i;

  b->host = "127.0.0.1";
  b->port = DEFAULT_PORT;
  b->nconn = 1;
  b->nthreads = 1;
  b->duration = 5;
  b->warmup = 1;
  b->value_size = 16;
  b->timeout_ms = BENCH_DEFAULT_TIMEOUT_MS;
  b->batch = 256;
  b->reps = 5;
  b->header = 1;
  for (i = 1; i < argc; i++) {
    if (opt_value(argc, argv, &i, "--host", &v))
      b->host = v;
    else if (opt_value(argc, argv, &i, "--port", &v))
      b->port = (int) arg_int("port", v, 1, 65535);
    else if (opt_value(argc, argv, &i, "--connections", &v))
      b->nconn = (int) arg_int("connection count", v, 1, 1000000);
    else if (opt_value(argc, argv, &i, "--threads", &v))
      b->nthreads = (int) arg_int("thread count", v, 1, 1024);
    else if (opt_value(argc, argv, &i, "--duration", &v))
      b->duration = arg_seconds("duration", v, 0.01, 86400);
    else if (opt_value(argc, argv, &i, "--warmup", &v))
      b->warmup = arg_seconds("warm-up", v, 0, 86400);
    else if (opt_value(argc, argv, &i, "--op", &v))
      op = v;
    else if (opt_value(argc, argv, &i, "--dialect", &v))
      dialect = v;
    else if (opt_value(argc, argv, &i, "--keys", &v))
      keys = arg_int("key count", v, 1, 1 << 22);
    else if (opt_value(argc, argv, &i, "--value-size", &v))
      b->value_size = (size_t) arg_size("value size", v, 64u << 20);
    else if (opt_value(argc, argv, &i, "--timeout", &v))
      b->timeout_ms = (int) arg_int("timeout", v, 1, 3600000);
    else if (opt_value(argc, argv, &i, "--connect-batch", &v))
      b->batch = (int) arg_int("batch size", v, 1, 1000000);
    else if (opt_value(argc, argv, &i, "--server-pid", &v))
      b->server_pid = (long) arg_int("pid", v, 1, INT_MAX);
    else if (opt_value(argc, argv, &i, "--label", &v))
      b->label = v;
    else if (opt_value(argc, argv, &i, "--rendezvous", &v))
      b->rdv_n = (int) arg_int("rendezvous size", v, 1, 1000000);
    else if (opt_value(argc, argv, &i, "--rate", &v)) {
      char *end;
      errno = 0;
      b->rate = strtod(v, &end);
      if (errno != 0 || end == v || *end != '\0' || !(b->rate > 0) ||
          b->rate > 1e9)
        usage_error("bench: invalid --rate '%s' (ops/s, more than 0)", v);
    } else if (opt_value(argc, argv, &i, "--reps", &v))
      b->reps = (int) arg_int("repetitions", v, 1, 100000);
    else if (strcmp(argv[i], "--json") == 0)
      b->json = 1;
    else if (strcmp(argv[i], "--no-header") == 0)
      b->header = 0;
    else
      usage_error("bench: unknown argument '%s'", argv[i]);
  }

  for (i = 0; i < B_RDV; i++)
    if (strcmp(op, bench_op_names[i]) == 0)
      break;
  if (i == B_RDV)
    usage_error("bench: unknown --op '%s' (set, get, add, waitget, mix)", op);
  b->op = i;
  if (strcmp(dialect, "modern") == 0)
    b->legacy = 0;
  else if (strcmp(dialect, "legacy") == 0)
    b->legacy = 1;
  else
    usage_error("bench: unknown --dialect '%s' (modern, legacy)", dialect);
  b->wire = b->legacy ? &wire_legacy : &wire_modern;
  if (b->rdv_n > 0 && b->rate > 0)
    usage_error("bench: --rate and --rendezvous do not go together");
  if (b->rdv_n > 0) {
    b->op = B_RDV;
    b->nconn = b->rdv_n;
  }
  if (b->nthreads > b->nconn)
    b->nthreads = b->nconn;
  if (keys < 0)
    keys = b->op == B_ADD ? 1 : b->nconn;
  b->nkeys = (uint32_t) keys;
  b->timeout_ns = (uint64_t) b->timeout_ms * 1000000u;

  /* Accept a bracketed IPv6 literal as well as a bare one. */
  v = b->host;
  if (v[0] == '[' && strlen(v) >= 2 && strlen(v) < sizeof(hostbuf) &&
      v[strlen(v) - 1] == ']') {
    memcpy(hostbuf, v + 1, strlen(v) - 2);
    hostbuf[strlen(v) - 2] = '\0';
    b->host = hostbuf;
  }
  if (b->label == NULL) {
    snprintf(label, sizeof(label), strchr(b->host, ':') ? "[%s]:%d" : "%s:%d",
             b->host, b->port);
    b->label = label;
  }

  raise_nofile();
  signal(SIGPIPE, SIG_IGN);
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      (uint64_t) b->nconn + 16 > (uint64_t) rl.rlim_cur)
    fatal("bench: %d connections need more file descriptors than the "
          "limit of %llu (ulimit -n)", b->nconn,
          (unsigned long long) rl.rlim_cur);
  if (b->server_pid > 0 && proc_cpu_ns(b->server_pid, &dummy) != 0)
    fatal("bench: --server-pid %ld: cannot read /proc/%ld/stat",
          b->server_pid, b->server_pid);

  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(portstr, sizeof(portstr), "%d", b->port);
  rc = getaddrinfo(b->host, portstr, &hints, &ai);
  if (rc != 0)
    fatal("bench: cannot resolve '%s': %s", b->host, gai_strerror(rc));
  memcpy(&b->addr, ai->ai_addr, ai->ai_addrlen);
  b->addrlen = ai->ai_addrlen;
  freeaddrinfo(ai);

  b->value = xcalloc(b->value_size ? b->value_size : 1, 1);
  memset(b->value, 'v', b->value_size);
  if (b->op != B_ADD && b->op != B_RDV)
    keyset_build(&b->data, "/bench/", b->nkeys);
  if (b->op == B_ADD || b->op == B_MIX)
    keyset_build(&b->ctr, "/bench/ctr/", b->nkeys);
  b->conns = xcalloc((size_t) b->nconn, sizeof(conn_t));
  for (i = 0; i < b->nconn; i++) {
    b->conns[i].fd = -1;
    b->conns[i].id = i;
    b->conns[i].rng = UINT64_C(0x9E3779B97F4A7C15) * (uint64_t) (i + 1) ^
                      now_ns();
    if (b->conns[i].rng == 0)
      b->conns[i].rng = 1;
  }

  status = 1;
  if (bench_connect(b) != 0)
    goto out;
  if ((b->op == B_GET || b->op == B_WAITGET || b->op == B_MIX) &&
      bench_populate(b) != 0)
    goto out;
  if (b->op == B_RDV)
    status = bench_run_rendezvous(b);
  else
    status = bench_run_load(b);

out:
  for (i = 0; i < b->nconn; i++) {
    if (b->conns[i].fd >= 0)
      close(b->conns[i].fd);
    free(b->conns[i].out);
  }
  free(b->conns);
  free(b->value);
  keyset_free(&b->data);
  keyset_free(&b->ctr);
  return status;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
  int i;

  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
      printf(PROG " %s\n", uvccl_version_string());
      return 0;
    }
  }
  return cmd_bench(argc, argv);
}
