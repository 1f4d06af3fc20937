/* Helpers for tests whose ranks are separate processes (t/2020, t/2030).
 * Rank side: the loop, the group, "@check RANK OK NAME | detail" and
 * "@val RANK NAME X" report lines on stdout, waiting on works with a
 * guard timer, and a gate that holds a rank until its parent closes its
 * stdin. Parent side: spawned ranks with captured output, a registry that
 * kills whatever is left at exit, and the parsing of the report lines.
 * Header-only; include after tap.h and uvccl.h, with _GNU_SOURCE. */
#ifndef UVCCL_T_RANKS_H
#define UVCCL_T_RANKS_H

#include <errno.h>
#include <poll.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ======================================================================== */
/* Rank side                                                                */
/* ======================================================================== */

static int R = -1, P = 0;
static uv_loop_t loop;
static uvccl_pg_t pg;
static uv_timer_t guard;
static int guard_fired;

static inline void rep(int okv, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void rep(int okv, const char *name, const char *fmt, ...) {
  va_list ap;
  char d[512];
  size_t i;
  va_start(ap, fmt);
  vsnprintf(d, sizeof(d), fmt, ap);
  va_end(ap);
  for (i = 0; d[i]; i++)
    if (d[i] == '\n') d[i] = ' ';
  printf("@check %d %d %s | %s\n", R, okv ? 1 : 0, name, d);
  fflush(stdout);
}

static inline void val(const char *name, double v) {
  printf("@val %d %s %.6f\n", R, name, v);
  fflush(stdout);
}

typedef struct {
  int done;
  int status;
  double t;
} cbres_t;

static inline void on_work(uvccl_work_t *w, int status) {
  cbres_t *c = w->data;
  c->done = 1;
  c->status = status;
  c->t = now_s();
}

static inline void on_guard(uv_timer_t *t) {
  (void)t;
  guard_fired = 1;
}

/* Runs the loop until *flag is set or ms pass. 1 if the flag was set. */
static inline int run_until(int *flag, uint64_t ms) {
  guard_fired = 0;
  uv_timer_start(&guard, on_guard, ms, 0);
  while (!*flag && !guard_fired) uv_run(&loop, UV_RUN_ONCE);
  uv_timer_stop(&guard);
  return *flag;
}

#define HANG 1 /* a positive "status": the work did not complete in time */

/* Starts (rc from the call), then waits up to ms. */
static inline int finish_work(cbres_t *c, int rc, uint64_t ms) {
  if (rc != 0) return rc;
  if (!run_until(&c->done, ms)) return HANG;
  return c->status;
}

static inline const char *ename(int rc) {
  return rc == HANG ? "HANG" : rc == 0 ? "0" : uvccl_err_name(rc);
}

/* An allgather of n int64 per rank (rank * 1000000 + i) on pg, checked
 * and reported as "allgather". Returns its status. */
static inline int rank_allgather_check(size_t n) {
  int64_t *s = malloc(n * 8), *r = malloc(n * 8 * (size_t)P);
  size_t i, bad = 0;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int q, rc;
  for (i = 0; i < n; i++) s[i] = (int64_t)R * 1000000 + (int64_t)i;
  for (i = 0; i < n * (size_t)P; i++) r[i] = -1;
  w.data = &c;
  rc = uvccl_allgather(&pg, &w, s, r, n, UVCCL_INT64, on_work);
  rc = finish_work(&c, rc, 15000);
  for (q = 0; q < P; q++)
    for (i = 0; i < n; i++)
      if (r[(size_t)q * n + i] != (int64_t)q * 1000000 + (int64_t)i) bad++;
  rep(rc == 0 && bad == 0, "allgather", "%zu int64 each: %s %s; %zu wrong",
      n, ename(rc), w.msg, bad);
  free(s);
  free(r);
  return rc;
}

static inline void walk_cb(uv_handle_t *h, void *arg) {
  char *b = arg;
  size_t l = strlen(b);
  if (l < 200)
    snprintf(b + l, 256 - l, " %s%s", uv_handle_type_name(h->type),
             uv_is_closing(h) ? "(closing)" : "");
}

static int pg_closed;
static inline void on_pg_closed(uvccl_pg_t *p) {
  (void)p;
  pg_closed = 1;
}

/* ---- a rank's group, from env:// ------------------------------------- */
static inline void rank_init(uint64_t timeout_ms) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int rc;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = timeout_ms;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  w.data = &c;
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, on_work);
  rc = finish_work(&c, rc, timeout_ms + 5000);
  rep(rc == 0 && pg.rank == R && pg.size == P, "init",
      "uvccl_pg_init_url(env://): %s %s (rank %d of %d)", ename(rc), w.msg,
      pg.rank, pg.size);
  if (rc != 0) {
    if (pg.impl_ != NULL) uvccl_pg_destroy(&pg, NULL);
    exit(1);
  }
}

/* Destroys the group, drains the loop and closes it. */
static inline int rank_destroy(void) {
  double t0 = now_s(), t1, t2;
  int done, rc;
  char left[256] = "";
  uvccl_pg_destroy(&pg, on_pg_closed);
  done = run_until(&pg_closed, 8000);
  t1 = now_s();
  uv_close((uv_handle_t *)&guard, NULL);
  /* Whatever is still closing goes within a moment; nothing may stay. */
  t2 = now_s();
  while (uv_loop_alive(&loop) && now_s() - t2 < 3.0) {
    uv_run(&loop, UV_RUN_NOWAIT);
    if (uv_loop_alive(&loop)) {
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
    }
  }
  rc = uv_loop_close(&loop);
  if (rc != 0) uv_walk(&loop, walk_cb, left);
  rep(done && rc == 0, "destroy",
      "destroy %s after %.3f s; uv_loop_close: %s%s%s", done ? "done" : "HUNG",
      t1 - t0, rc ? uvccl_err_name(rc) : "0", rc ? ", handles left:" : "",
      left);
  return done && rc == 0 ? 0 : 1;
}

/* ---- stdin as an event on the loop: "wait until the parent says so" ----- */
static uv_pipe_t in_pipe;
static int in_eof;
static char in_buf[256];

static inline void in_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
  (void)h;
  (void)s;
  b->base = in_buf;
  b->len = sizeof(in_buf);
}

static inline void in_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  (void)b;
  if (n != 0) {
    in_eof = 1;
    uv_read_stop(s);
  }
}

/* Runs the loop (so the connections, and on rank 0 the store, are served)
 * until the parent writes a line or closes our stdin. */
static inline int wait_stdin_eof(uint64_t ms) {
  int got;
  uv_pipe_init(&loop, &in_pipe, 0);
  if (uv_pipe_open(&in_pipe, 0) != 0) return 0;
  uv_read_start((uv_stream_t *)&in_pipe, in_alloc, in_read);
  got = run_until(&in_eof, ms);
  uv_close((uv_handle_t *)&in_pipe, NULL);
  return got;
}

/* ---- parent side ------------------------------------------------------- */

typedef struct {
  pid_t pid;
  int out, err, in;  /* -1 when closed */
  char *obuf, *ebuf;
  size_t olen, elen;
  int exited;
  int status;        /* exit code, or 128 + signal */
  double t_exit;
  char name[48];
} proc_t;

#ifndef MAXP
#define MAXP 8
#endif
static pid_t live[32];

static inline void live_set(pid_t p, int add) {
  int i;
  for (i = 0; i < 32; i++)
    if (add ? live[i] == 0 : live[i] == p) {
      live[i] = add ? p : 0;
      return;
    }
}

static inline void kill_live(void) {
  int i;
  for (i = 0; i < 32; i++)
    if (live[i] > 0) {
      kill(live[i], SIGKILL);
      waitpid(live[i], NULL, 0);
      live[i] = 0;
    }
}

static inline void append(char **b, size_t *len, const char *p, size_t n) {
  *b = realloc(*b, *len + n + 1);
  memcpy(*b + *len, p, n);
  *len += n;
  (*b)[*len] = '\0';
}

/* Reads what is there (waiting up to ms) and reaps exited processes.
 * Returns the number of processes not yet finished (exited, EOF on both). */
static inline int pump(proc_t *ps, int n, int ms) {
  struct pollfd pf[2 * MAXP];
  int map[2 * MAXP], np = 0, i, left = 0;
  char buf[65536];
  for (i = 0; i < n; i++) {
    if (ps[i].out >= 0) {
      pf[np].fd = ps[i].out;
      pf[np].events = POLLIN;
      map[np++] = 2 * i;
    }
    if (ps[i].err >= 0) {
      pf[np].fd = ps[i].err;
      pf[np].events = POLLIN;
      map[np++] = 2 * i + 1;
    }
  }
  if (np > 0 && poll(pf, (nfds_t)np, ms) > 0) {
    for (i = 0; i < np; i++) {
      proc_t *p = &ps[map[i] / 2];
      int isout = map[i] % 2 == 0;
      ssize_t r;
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      r = read(pf[i].fd, buf, sizeof(buf));
      if (r > 0) {
        if (isout) append(&p->obuf, &p->olen, buf, (size_t)r);
        else append(&p->ebuf, &p->elen, buf, (size_t)r);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(pf[i].fd);
        if (isout) p->out = -1;
        else p->err = -1;
      }
    }
  } else if (np == 0 && ms > 0) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  for (i = 0; i < n; i++) {
    proc_t *p = &ps[i];
    int st;
    if (!p->exited && p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == p->pid) {
      p->exited = 1;
      p->t_exit = now_s();
      p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      live_set(p->pid, 0);
    }
    if (!p->exited || p->out >= 0 || p->err >= 0) left++;
  }
  return left;
}

static inline void dump_procs(proc_t *ps, int n) {
  int i;
  for (i = 0; i < n; i++) {
    int k;
    for (k = 0; k < 2; k++) {
      const char *b = k ? ps[i].ebuf : ps[i].obuf, *e = b + (k ? ps[i].elen : ps[i].olen);
      diag("%s (exit %d) %s:", ps[i].name, ps[i].status, k ? "stderr" : "stdout");
      while (b < e) {
        const char *nl = memchr(b, '\n', (size_t)(e - b));
        size_t l = nl ? (size_t)(nl - b) : (size_t)(e - b);
        diag("  %.*s", (int)(l > 400 ? 400 : l), b);
        b += l + 1;
      }
    }
  }
}

static inline void procs_free(proc_t *ps, int n) {
  int i;
  for (i = 0; i < n; i++) {
    free(ps[i].obuf);
    free(ps[i].ebuf);
  }
}

/* Finds "@check RANK OK NAME | detail" in any output. *okv = -1 if none. */
static inline void find_check(proc_t *ps, int n, int rank, const char *name, int *okv,
                       char *detail, size_t dlen) {
  int i;
  *okv = -1;
  detail[0] = '\0';
  for (i = 0; i < n; i++) {
    const char *b = ps[i].obuf, *e = b + ps[i].olen;
    while (b < e) {
      const char *nl = memchr(b, '\n', (size_t)(e - b));
      size_t l = nl ? (size_t)(nl - b) : (size_t)(e - b);
      const char *c = memmem(b, l, "@check ", 7);
      if (c != NULL) {
        int rr, ok1, off = 0;
        char nm[64];
        if (sscanf(c, "@check %d %d %63s |%n", &rr, &ok1, nm, &off) == 3 &&
            off > 0 && rr == rank && strcmp(nm, name) == 0) {
          size_t dl = l - (size_t)(c + off - b);
          if (*okv != 0) *okv = ok1; /* any failure wins */
          if (*okv == ok1)
            snprintf(detail, dlen, "%.*s", (int)dl, c + off);
        }
      }
      b += l + 1;
    }
  }
}

static inline int find_val(proc_t *ps, int n, int rank, const char *name, double *v) {
  int i;
  for (i = 0; i < n; i++) {
    const char *b = ps[i].obuf, *e = b + ps[i].olen;
    while (b < e) {
      const char *nl = memchr(b, '\n', (size_t)(e - b));
      size_t l = nl ? (size_t)(nl - b) : (size_t)(e - b);
      const char *c = memmem(b, l, "@val ", 5);
      int rr;
      char nm[64];
      double x;
      if (c && sscanf(c, "@val %d %63s %lf", &rr, nm, &x) == 3 &&
          rr == rank && strcmp(nm, name) == 0) {
        *v = x;
        return 1;
      }
      b += l + 1;
    }
  }
  return 0;
}


/* ---- spawning ranks (the test binary re-executed with UVCCL_T_ROLE) ---- */
static char self[4096];

/* The parent's start: the alarm, this binary's path (ranks are this binary
 * again), and no rank left running when it exits. */
static inline void parent_init(unsigned alarm_s) {
  ssize_t l;
  tap_alarm(alarm_s);
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  atexit(kill_live);
}

/* argv[0] is executed; env: "K=V" entries added to our environment. */
static inline int spawn(proc_t *p, const char *name, char *const *argv,
                 const char *const *env, int with_stdin) {
  int o[2], e[2], in[2] = {-1, -1};
  pid_t parent = getpid(), pid;
  memset(p, 0, sizeof(*p));
  snprintf(p->name, sizeof(p->name), "%s", name);
  p->out = p->err = p->in = -1;
  p->obuf = calloc(1, 1);
  p->ebuf = calloc(1, 1);
  if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC)) return -errno;
  if (with_stdin && pipe2(in, O_CLOEXEC)) return -errno;
  fflush(stdout);
  pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    int fd0 = with_stdin ? in[0] : open("/dev/null", O_RDONLY);
    dup2(fd0, 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    for (; env && *env; env++) putenv((char *)*env);
    execv(argv[0], argv);
    _exit(127);
  }
  close(o[1]);
  close(e[1]);
  if (with_stdin) {
    close(in[0]);
    p->in = in[1];
  }
  p->pid = pid;
  p->out = o[0];
  p->err = e[0];
  live_set(pid, 1);
  return 0;
}

/* Waits for everything to finish; after secs, kills what is left. */
static inline void finish_all(proc_t *ps, int n, double secs) {
  double t0 = now_s();
  int i, killed = 0;
  while (pump(ps, n, 50) > 0) {
    if (!killed && now_s() - t0 > secs) {
      for (i = 0; i < n; i++)
        if (!ps[i].exited) {
          note("%s still running after %.0f s: killing it", ps[i].name, secs);
          kill(ps[i].pid, SIGKILL);
        }
      killed = 1;
    }
  }
  for (i = 0; i < n; i++)
    if (ps[i].in >= 0) {
      close(ps[i].in);
      ps[i].in = -1;
    }
}

static int scenario_failed;

/* One TAP line: every rank in mask reported NAME as passed. */
static inline int agg(proc_t *ps, int n, const char *name, unsigned mask,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline int agg(proc_t *ps, int n, const char *name, unsigned mask,
               const char *fmt, ...) {
  char desc[256], det[512];
  int r, okv, all = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(desc, sizeof(desc), fmt, ap);
  va_end(ap);
  for (r = 0; r < 16; r++) {
    if (!(mask & (1u << r))) continue;
    find_check(ps, n, r, name, &okv, det, sizeof(det));
    if (okv != 1) all = 0;
  }
  ok(all, "%s", desc);
  for (r = 0; r < 16; r++) {
    if (!(mask & (1u << r))) continue;
    find_check(ps, n, r, name, &okv, det, sizeof(det));
    if (okv == 1 && all && getenv("UVCCL_T_SHOW") == NULL) continue;
    (all ? note : diag)("  rank %d: %s%s", r,
                        okv < 0 ? "no report" : okv ? "ok:" : "FAILED:", det);
  }
  if (!all) scenario_failed = 1;
  return all;
}

/* A free port for a test's store, below the kernel's ephemeral range:
 * ports handed out by bind(0) and connect come from that range, so one
 * picked here cannot be taken by a rank's listener between this choice
 * and the store's bind (it was, once in a while, in CI). Random from
 * 20000 up to the range's start, checked by binding; else any free one. */
static inline int port_bindable(int port) {
  struct sockaddr_in a;
  socklen_t l = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), got = 0;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &l) == 0)
    got = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return got;
}

static inline int free_port(void) {
  /* its own generator: the tests' rand() sequences stay as they were */
  static uint64_t x;
  int lo = 32768, hi = 60999, i, p;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f != NULL) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  if (x == 0)
    x = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ 0x9e3779b97f4a7c15ull;
  for (i = 0; lo > 20100 && i < 200; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p = 20000 + (int)(x % (uint64_t)(lo - 20000));
    if (port_bindable(p) == p) return p;
  }
  return port_bindable(0);
}

/* Starts n ranks of role directly (no launcher). stdin_mask: ranks whose
 * stdin is a pipe we hold. */
static int world_port __attribute__((unused)); /* the last world's store */
static inline void spawn_world(proc_t *ps, int n, const char *role,
                        unsigned stdin_mask) {
  static char e_role[64], e_size[32], e_port[32], e_rank[MAXP][32];
  int r, port = free_port();
  world_port = port;
  char *argv[] = {self, NULL};
  snprintf(e_role, sizeof(e_role), "UVCCL_T_ROLE=%s", role);
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", n);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", port);
  for (r = 0; r < n; r++) {
    const char *env[] = {e_role, e_rank[r], e_size, "MASTER_ADDR=127.0.0.1",
                         e_port, NULL};
    char name[32];
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r);
    snprintf(name, sizeof(name), "rank %d", r);
    if (spawn(&ps[r], name, argv, env, (stdin_mask >> r) & 1) != 0)
      note("spawning rank %d failed", r);
  }
}

/* ---- TCP reset counting (in a private network namespace) ---------------- */
static int isolated __attribute__((unused));

static inline int isolate_net(char *why, size_t wl) {
  int orig, fd, up = 0;
  struct ifreq ifr;
  if (geteuid() != 0) {
    snprintf(why, wl, "not root");
    return 0;
  }
  orig = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (orig < 0) {
    snprintf(why, wl, "/proc/self/ns/net: %s", strerror(errno));
    return 0;
  }
  if (unshare(CLONE_NEWNET) != 0) {
    snprintf(why, wl, "unshare(CLONE_NEWNET): %s", strerror(errno));
    close(orig);
    return 0;
  }
  fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
  if (fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) == 0) up = 1;
  }
  if (fd >= 0) close(fd);
  if (!up) {
    snprintf(why, wl, "bringing lo up in a new namespace: %s", strerror(errno));
    if (setns(orig, CLONE_NEWNET) != 0) {
      printf("Bail out! cannot return to the original network namespace\n");
      exit(1);
    }
  }
  close(orig);
  return up;
}


#endif
