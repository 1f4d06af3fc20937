/* bare_epoll: the "bare epoll loop" reference of bench/store.
 *
 * A single-threaded, level-triggered epoll TCP server that speaks just
 * enough of PyTorch's TCPStore protocol (1.13 and modern dialects, detected
 * per connection from the first bytes) to find request boundaries, and
 * answers every request with a canned reply. It stores NOTHING: keys and
 * values are skipped as they stream past, never copied. What it costs per
 * operation is the floor for any store server built on epoll: accept,
 * epoll_wait, recv, send, and a parser.
 *
 * Canned replies:
 *   SET, APPEND, VALIDATE      nothing (fire-and-forget, as in the protocol)
 *   GET, COMPARE_SET           a value of --value-size bytes of 'v' (16)
 *   ADD                        i64 1
 *   CHECK, WAIT                u8 0 (READY / STOP_WAITING)
 *   GETNUMKEYS, DELETE_KEY     i64 0
 *   WATCH_KEY (1.13)           u8 3 (KEY_CALLBACK_REGISTERED)
 *   PING (modern)              the u32 nonce echoed
 *   CANCEL_WAIT (modern)       u8 1 (WAIT_CANCELED)
 *   anything else              the connection is closed
 *
 * Usage: bare_epoll [--host H] [--port P] [--value-size B]
 * Prints "listening on H:P" once bound; SIGINT/SIGTERM end it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* Field kinds of a request, after its opcode byte. */
enum {
  F_END = 0,
  F_STR,   /* u64 length + bytes (key, value) */
  F_KEYS,  /* u64 count + count x F_STR */
  F_I64,
  F_U32
};

/* Reply kinds. */
enum { R_NONE, R_U8_0, R_U8_1, R_U8_3, R_I64_0, R_I64_1, R_VALUE, R_ECHO };

typedef struct {
  uint8_t valid;
  uint8_t reply;
  uint8_t fields[4];
} op_t;

/* 1.13: 0 SET, 1 COMPARE_SET, 2 GET, 3 ADD, 4 CHECK, 5 WAIT, 6 GETNUMKEYS,
 * 7 WATCH_KEY, 8 DELETE_KEY. */
static const op_t ops_legacy[256] = {
  [0] = { 1, R_NONE, { F_STR, F_STR } },
  [1] = { 1, R_VALUE, { F_STR, F_STR, F_STR } },
  [2] = { 1, R_VALUE, { F_STR } },
  [3] = { 1, R_I64_1, { F_STR, F_I64 } },
  [4] = { 1, R_U8_0, { F_KEYS } },
  [5] = { 1, R_U8_0, { F_KEYS } },
  [6] = { 1, R_I64_0, { F_END } },
  [7] = { 1, R_U8_3, { F_STR } },
  [8] = { 1, R_I64_0, { F_STR } },
};

/* modern: 0 VALIDATE, 1 SET, 2 COMPARE_SET, 3 GET, 4 ADD, 5 CHECK, 6 WAIT,
 * 7 GETNUMKEYS, 8 DELETE_KEY, 9 APPEND, 12 CANCEL_WAIT, 13 PING. */
static const op_t ops_modern[256] = {
  [0] = { 1, R_NONE, { F_U32 } },
  [1] = { 1, R_NONE, { F_STR, F_STR } },
  [2] = { 1, R_VALUE, { F_STR, F_STR, F_STR } },
  [3] = { 1, R_VALUE, { F_STR } },
  [4] = { 1, R_I64_1, { F_STR, F_I64 } },
  [5] = { 1, R_U8_0, { F_KEYS } },
  [6] = { 1, R_U8_0, { F_KEYS } },
  [7] = { 1, R_I64_0, { F_END } },
  [8] = { 1, R_I64_0, { F_STR } },
  [9] = { 1, R_NONE, { F_STR, F_STR } },
  [12] = { 1, R_U8_1, { F_END } },
  [13] = { 1, R_ECHO, { F_U32 } },
};

static const uint8_t magic[4] = { 0xCE, 0xF7, 0x85, 0x3C };

enum { D_UNKNOWN, D_LEGACY, D_MODERN };

typedef struct conn {
  int fd;
  int dialect;
  const op_t *ops;
  /* dialect detection: the first up to 5 bytes */
  uint8_t pre[5];
  unsigned npre;
  /* the request being parsed */
  int in_req;        /* opcode read, fields pending */
  const op_t *op;
  unsigned field;    /* index into op->fields */
  int in_str_body;   /* skipping the bytes of a F_STR */
  uint64_t skip;     /* bytes of that body still to skip */
  uint64_t keys_left;/* F_KEYS: strings still to come */
  int in_keys;
  uint8_t hdr[8];    /* a fixed-size field being assembled */
  unsigned have;
  /* replies not yet sent */
  uint8_t *out;
  size_t out_len;
  size_t out_off;
  size_t out_cap;
  int out_watch;
} conn_t;

static int ep;
static size_t value_size = 16;
static uint8_t *value_reply;  /* u64 length + value_size bytes of 'v' */
static volatile sig_atomic_t stop;
static uint8_t rbuf[65536];

static void on_signal(int sig)
{
  (void) sig;
  stop = 1;
}

static void out_add(conn_t *c, const void *p, size_t n)
{
  if (c->out_len + n > c->out_cap) {
    size_t cap = c->out_cap ? c->out_cap : 64;
    while (cap < c->out_len + n)
      cap *= 2;
    c->out = realloc(c->out, cap);
    if (c->out == NULL) {
      perror("realloc");
      exit(1);
    }
    c->out_cap = cap;
  }
  memcpy(c->out + c->out_len, p, n);
  c->out_len += n;
}

static void reply(conn_t *c)
{
  static const uint8_t zero8[8] = { 0 };
  static const uint8_t one8[8] = { 1 };
  uint8_t b;

  switch (c->op->reply) {
  case R_NONE: break;
  case R_U8_0: b = 0; out_add(c, &b, 1); break;
  case R_U8_1: b = 1; out_add(c, &b, 1); break;
  case R_U8_3: b = 3; out_add(c, &b, 1); break;
  case R_I64_0: out_add(c, zero8, 8); break;
  case R_I64_1: out_add(c, one8, 8); break;
  case R_VALUE: out_add(c, value_reply, 8 + value_size); break;
  case R_ECHO: out_add(c, c->hdr, 4); break;
  }
}

/* Moves to the next field; replies when the request is complete. */
static void next_field(conn_t *c)
{
  c->have = 0;
  c->field++;
  if (c->field >= 4 || c->op->fields[c->field] == F_END) {
    reply(c);
    c->in_req = 0;
  }
}

/* One string of the current field is done (a key of a F_KEYS list, or a
 * F_STR field). */
static void str_done(conn_t *c)
{
  if (c->in_keys && --c->keys_left > 0)
    return;  /* the next key's length follows */
  c->in_keys = 0;
  next_field(c);
}

/* Consumes request bytes; returns -1 if the connection must be closed. */
static int feed(conn_t *c, const uint8_t *p, size_t n)
{
  size_t i = 0;
  unsigned need;
  size_t take;
  uint64_t v;
  int kind;

  while (i < n) {
    if (!c->in_req) {
      c->op = &c->ops[p[i++]];
      if (!c->op->valid)
        return -1;
      c->field = 0;
      c->have = 0;
      c->in_str_body = 0;
      c->in_keys = 0;
      if (c->op->fields[0] == F_END)
        reply(c);
      else
        c->in_req = 1;
      continue;
    }
    if (c->in_str_body) {
      take = n - i < c->skip ? n - i : (size_t) c->skip;
      i += take;
      c->skip -= take;
      if (c->skip > 0)
        break;
      c->in_str_body = 0;
      str_done(c);
      continue;
    }
    kind = c->in_keys ? F_STR : c->op->fields[c->field];
    need = kind == F_U32 ? 4 : 8;
    take = n - i < need - c->have ? n - i : need - c->have;
    memcpy(c->hdr + c->have, p + i, take);
    c->have += (unsigned) take;
    i += take;
    if (c->have < need)
      break;
    c->have = 0;
    memcpy(&v, c->hdr, 8);
    switch (kind) {
    case F_STR:
      /* A length this large can only be garbage (1.13 would OOM). */
      if (v > (UINT64_C(1) << 40))
        return -1;
      if (v == 0) {
        str_done(c);
      } else {
        c->skip = v;
        c->in_str_body = 1;
      }
      break;
    case F_KEYS:
      if (v > (UINT64_C(1) << 32))
        return -1;
      if (v == 0) {
        next_field(c);
      } else {
        c->keys_left = v;
        c->in_keys = 1;
      }
      break;
    default: /* F_I64, F_U32: the value itself does not matter */
      next_field(c);
      break;
    }
  }
  return 0;
}

/* Sorts out the dialect from the first bytes: modern iff 00 CE F7 85 3C.
 * Returns how many bytes of p it took into c->pre (all of them while
 * undecided). */
static size_t detect(conn_t *c, const uint8_t *p, size_t n)
{
  size_t take = 0;

  while (c->npre < 5 && take < n) {
    c->pre[c->npre++] = p[take++];
    if (c->pre[0] != 0)
      break;
  }
  if (c->pre[0] != 0) {
    c->dialect = D_LEGACY;
    c->ops = ops_legacy;
  } else if (c->npre < 5) {
    return take;
  } else if (memcmp(c->pre + 1, magic, 4) == 0) {
    c->dialect = D_MODERN;
    c->ops = ops_modern;
  } else {
    c->dialect = D_LEGACY;
    c->ops = ops_legacy;
  }
  return take;
}

static void conn_close(conn_t *c)
{
  close(c->fd);  /* also leaves the epoll set */
  free(c->out);
  free(c);
}

/* Sends pending replies; watches EPOLLOUT only while the socket is full.
 * Returns -1 if the connection is gone. */
static int flush(conn_t *c)
{
  struct epoll_event ev;
  ssize_t k;

  while (c->out_off < c->out_len) {
    k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
             MSG_NOSIGNAL);
    if (k > 0) {
      c->out_off += (size_t) k;
      continue;
    }
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c->out_watch) {
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.ptr = c;
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->out_watch = 1;
      }
      return 0;
    }
    return -1;
  }
  c->out_len = c->out_off = 0;
  if (c->out_watch) {
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->out_watch = 0;
  }
  return 0;
}

static void on_readable(conn_t *c)
{
  const uint8_t *p;
  size_t left;
  size_t used;
  ssize_t n;

  for (;;) {
    n = recv(c->fd, rbuf, sizeof(rbuf), 0);
    if (n == 0) {
      conn_close(c);
      return;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      conn_close(c);
      return;
    }
    p = rbuf;
    left = (size_t) n;
    if (c->dialect == D_UNKNOWN) {
      used = detect(c, p, left);
      p += used;
      left -= used;
      if (c->dialect == D_UNKNOWN)
        break;
      if (feed(c, c->pre, c->npre) != 0) {
        conn_close(c);
        return;
      }
    }
    if (feed(c, p, left) != 0) {
      conn_close(c);
      return;
    }
    /* A short read drained the socket: level-triggered epoll says when
     * more arrives, so skip the recv() that would only say EAGAIN. */
    if ((size_t) n < sizeof(rbuf))
      break;
  }
  if (c->out_len > c->out_off && flush(c) != 0)
    conn_close(c);
}

static void on_accept(int lfd)
{
  struct epoll_event ev;
  conn_t *c;
  int one = 1;
  int fd;

  for (;;) {
    fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        perror("accept4");  /* EMFILE and the like: try again later */
      return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
      close(fd);
      return;
    }
    c->fd = fd;
    ev.events = EPOLLIN;
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
      perror("epoll_ctl");
      close(fd);
      free(c);
    }
  }
}

static void usage(void)
{
  fprintf(stderr, "usage: bare_epoll [--host H] [--port P] [--value-size B]\n");
  exit(2);
}

int main(int argc, char **argv)
{
  static struct epoll_event evs[1024];
  static int listen_tag;  /* its address marks the listening socket */
  const char *host = "127.0.0.1";
  struct sockaddr_in sa;
  struct epoll_event ev;
  struct sigaction act;
  struct rlimit rl;
  socklen_t slen;
  int port = 0;
  int one = 1;
  int lfd;
  int n;
  int i;

  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--host") == 0 && i + 1 < argc)
      host = argv[++i];
    else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
      port = atoi(argv[++i]);
    else if (strcmp(argv[i], "--value-size") == 0 && i + 1 < argc)
      value_size = (size_t) strtoull(argv[++i], NULL, 10);
    else
      usage();
  }
  value_reply = malloc(8 + value_size);
  if (value_reply == NULL)
    return 1;
  {
    uint64_t len = value_size;
    memcpy(value_reply, &len, 8);
    memset(value_reply + 8, 'v', value_size);
  }

  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  memset(&act, 0, sizeof(act));
  act.sa_handler = on_signal;
  sigaction(SIGINT, &act, NULL);
  sigaction(SIGTERM, &act, NULL);
  signal(SIGPIPE, SIG_IGN);

  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t) port);
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    fprintf(stderr, "bare_epoll: --host must be an IPv4 address\n");
    return 2;
  }
  lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (lfd < 0) {
    perror("socket");
    return 1;
  }
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) != 0 ||
      listen(lfd, 65535) != 0) {  /* the kernel caps it at somaxconn */
    perror("bind/listen");
    return 1;
  }
  slen = sizeof(sa);
  getsockname(lfd, (struct sockaddr *) &sa, &slen);
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    perror("epoll_create1");
    return 1;
  }
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_tag;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  printf("listening on %s:%d\n", host, ntohs(sa.sin_port));
  fflush(stdout);

  while (!stop) {
    n = epoll_wait(ep, evs, 1024, -1);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      perror("epoll_wait");
      return 1;
    }
    for (i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      if (evs[i].data.ptr == &listen_tag) {
        on_accept(lfd);
        continue;
      }
      if (evs[i].events & EPOLLOUT) {
        if (flush(c) != 0) {
          conn_close(c);
          continue;
        }
      }
      if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        on_readable(c);
    }
  }
  return 0;
}
