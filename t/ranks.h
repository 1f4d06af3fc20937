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
  char name[32];
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
      note("%s (exit %d) %s:", ps[i].name, ps[i].status, k ? "stderr" : "stdout");
      while (b < e) {
        const char *nl = memchr(b, '\n', (size_t)(e - b));
        size_t l = nl ? (size_t)(nl - b) : (size_t)(e - b);
        note("  %.*s", (int)(l > 400 ? 400 : l), b);
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

#endif
