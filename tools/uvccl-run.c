/* uvccl-run: start a world of N ranks on this host, as
 * `torchrun --standalone --nproc-per-node N` does.
 *
 *   uvccl-run [-n N] [--master-port P] [--tag-output|--no-prefix]
 *             [--keep-going] [--kill R@SECONDS]... [--host-store]
 *             [--respawn[=N]]
 *             [--] PROGRAM [ARGS...]
 *
 * Each rank is a child process (uv_spawn on a libuv loop) with RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
 * MASTER_PORT in its environment. Its stdout and stderr come back through
 * pipes and are printed a whole line at a time with a "[RANK] " prefix, so
 * lines of different ranks never mix.
 *
 * No rank outlives the run: each one leads its own process group (so
 * whatever it starts goes with it), the first failure stops the others
 * (SIGTERM to every group, SIGKILL 5 s later) unless --keep-going says
 * the program survives failures (then --kill can cause one: SIGKILL to a
 * rank at a given moment, to see it done), SIGINT/SIGTERM/SIGHUP are
 * forwarded, and each rank is started through a small trampoline (this
 * binary again) that asks the kernel to SIGKILL it if uvccl-run itself
 * dies without a chance to clean up.
 *
 * With --host-store the world's store is served here, on this process's
 * loop, as torchrun's agent serves its TCPStore: the ranks are told
 * (TORCHELASTIC_USE_AGENT_STORE=True) to use it rather than have rank 0
 * host one, so the store outlives any rank, rank 0 included. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <uv.h>

#include "uvccl.h"
#include "loop/config.h" /* --print-config */

#define PROG "uvccl-run"
#define EXEC_MARK "--uvccl-run-exec-child"
#define MAX_RANKS 1024
#define KILL_GRACE_MS 5000  /* SIGTERM, then SIGKILL this much later */
#define DRAIN_GRACE_MS 1000 /* after SIGKILL, wait this long for EOFs */
#define READ_CHUNK (64 * 1024)
#define MAX_LINE (64 * 1024) /* longer lines are printed in pieces */
#define MAX_KILLS 16

extern char **environ;

static const char usage_text[] =
"usage: " PROG " [options] [--] PROGRAM [ARGS...]\n"
"\n"
"Runs N copies of PROGRAM on this host as the ranks of one world, as\n"
"`torchrun --standalone --nproc-per-node N` does.\n"
"\n"
"options:\n"
"  -n N, --nproc-per-node N  ranks to start (default 1)\n"
"  --master-port P           MASTER_PORT (default: a free port of 127.0.0.1,\n"
"                            below the ephemeral range)\n"
"  --tag-output              prefix every output line with \"[RANK] \"\n"
"                            (the default)\n"
"  --no-prefix               let the ranks write to our stdout and stderr\n"
"                            directly\n"
"  --keep-going              a rank that fails does not stop the others\n"
"                            (for programs that survive failures, such as\n"
"                            uvccl-bench --shrink-on-failure)\n"
"  --kill R@SECONDS          SIGKILL rank R that long after the start, to\n"
"                            see the others survive it (implies\n"
"                            --keep-going; may be repeated)\n"
"  --no-auth                 no job secret (see below)\n"
"  --host-store              serve the world's store here, at MASTER_PORT,\n"
"                            with the job secret, for as long as the run\n"
"                            lasts (ranks get TORCHELASTIC_USE_AGENT_STORE=True\n"
"                            and host none): any rank, rank 0 included, may\n"
"                            then die without taking the store with it.\n"
"                            PyTorch's own TCPStore clients cannot prove the\n"
"                            secret: add --no-auth for PyTorch programs\n"
"  --respawn[=N]             a rank that dies is started again (up to N\n"
"                            times a rank, default 3) into the running\n"
"                            world: it gets UVCCL_JOIN=1 (uvccl programs then\n"
"                            join with uvccl_pg_join), UVCCL_RESPAWN_COUNT and\n"
"                            TORCHELASTIC_RESTART_COUNT; implies --host-store\n"
"                            and --keep-going\n"
"  --print-config[=markdown] every UVCCL_* variable uvccl reads: its value\n"
"                            here (or its default) and what it does; then\n"
"                            exits (status 1 if a value is malformed)\n"
"  -h, --help                this text\n"
"  --                        ends the options (the first argument that is\n"
"                            not an option does too)\n"
"\n"
"Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
"MASTER_ADDR=127.0.0.1, MASTER_PORT, GROUP_RANK=0, GROUP_WORLD_SIZE=1,\n"
"ROLE_RANK and ROLE_WORLD_SIZE on top of this environment, and, unless\n"
"UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE is set already (or --no-auth), a\n"
"random UVCCL_AUTH_TOKEN for this job: the store its rank 0 serves then\n"
"answers only clients that prove they hold it; UVCCL_SMALL_TREE=1\n"
"when there are more than 2 ranks a CPU (small allreduces and barriers\n"
"then go through a tree) and UVCCL_SEGMENT=4194304 when there are more\n"
"ranks than CPUs (fewer pipeline steps, each a context switch), unless\n"
"they are set already. Rank 0 reads\n"
"our stdin; the others read /dev/null. stdout lines go to stdout and\n"
"stderr lines to stderr, whole lines at a time.\n"
"\n"
"If a rank exits non-zero or is killed, the others get SIGTERM, and\n"
"SIGKILL 5 s later (not with --keep-going). SIGINT, SIGTERM and SIGHUP are\n"
"forwarded to every rank (a second one sends SIGKILL); SIGUSR2 is passed on\n"
"(uvccl-bench then dumps its flight recorder to $UVCCL_TRACE_DIR). Exit\n"
"status: 0 when\n"
"every rank exits 0 (ranks killed by --kill aside); else the first failing\n"
"rank's status (128+N for signal N), or 128+N\n"
"when " PROG " was stopped by signal N; 2 for usage errors, 127 when\n"
"PROGRAM is not found.\n";

/* ---- --print-config ---------------------------------------------------------- */

/* The values a variable takes, in words. */
static void config_values(const uvccl__cfg_var_t *c, char *buf, size_t len) {
  switch (c->type) {
  case UVCCL__CFG_UINT:
    if (c->max == UINT64_MAX)
      snprintf(buf, len, "%llu or more", (unsigned long long)c->min);
    else
      snprintf(buf, len, "%llu to %llu", (unsigned long long)c->min,
               (unsigned long long)c->max);
    break;
  case UVCCL__CFG_CHOICE: {
    size_t i, o = 0;
    for (i = 0; c->choices[i] != '\0' && o + 3 < len; i++) {
      if (c->choices[i] == '|') {
        buf[o++] = ',';
        buf[o++] = ' ';
      } else {
        buf[o++] = c->choices[i];
      }
    }
    buf[o] = '\0';
    break;
  }
  case UVCCL__CFG_TEXT:
    snprintf(buf, len, "text");
    break;
  case UVCCL__CFG_SECRET:
    snprintf(buf, len, "text (never shown)");
    break;
  }
}

/* The table (src/loop/config.c) as docs/env.md holds it, or each
 * variable's value in this environment. */
static int print_config(int markdown) {
  const uvccl__cfg_var_t *c;
  char values[128], why[128];
  int id, bad = 0;
  if (markdown)
    printf("| variable | values | default | what it does |\n"
           "|---|---|---|---|\n");
  for (id = 0; (c = uvccl__config_var(id)) != NULL; id++) {
    const char *v = getenv(c->name);
    int rc = uvccl__config_check(id, why, sizeof(why));
    config_values(c, values, sizeof(values));
    if (markdown) {
      printf("| `%s` | %s | %s | %s |\n", c->name, values, c->dflt_text,
             c->doc);
    } else if (rc == 0) {
      printf("%-28s %s (default)\n", c->name, c->dflt_text);
    } else if (rc == 1) {
      printf("%-28s %s (set)\n", c->name,
             c->type == UVCCL__CFG_SECRET ? "(not shown)" : v);
    } else {
      printf("%-28s %s (malformed: %s; the default, %s, holds)\n", c->name,
             v, why, c->dflt_text);
      bad = 1;
    }
  }
  if (!markdown) {
    /* a variable of ours the table does not know is a misspelling */
    char **e;
    for (e = environ; *e != NULL; e++) {
      char name[128];
      size_t n = strcspn(*e, "=");
      if (strncmp(*e, "UVCCL_", 6) != 0 || n >= sizeof(name)) continue;
      memcpy(name, *e, n);
      name[n] = '\0';
      if (uvccl__config_find(name) < 0) {
        printf("%-28s unknown: uvccl does not read it\n", name);
        bad = 1;
      }
    }
  }
  return bad;
}

/* ---- state ---------------------------------------------------------------- */

typedef struct rank_s rank_t;

typedef struct {
  uv_pipe_t pipe;
  rank_t *rk;
  int fd;   /* where its lines go: 1 or 2 */
  int open; /* handle initialised and not yet closed */
  int closing; /* uv_close called, its callback not yet run */
  char *buf;
  size_t len, cap;
} stream_t;

struct rank_s {
  int rank;
  uv_process_t proc;
  int pid;      /* also its process group */
  int spawned;  /* proc handle initialised (needs closing) */
  int running;  /* not yet exited */
  int killed;   /* by --kill: its death is not a failure */
  int respawns; /* times restarted (--respawn) */
  int respawn_due; /* dead, to be restarted once its handles closed */
  int proc_open; /* process handle not yet closed */
  stream_t out, err;
  char prefix[24];
  size_t plen;
};

static uv_loop_t *loop;
static rank_t *ranks;
static int nranks = 1;
static int prefix_on = 1;
static int keep_going;    /* a failed rank does not stop the others */
static int no_auth;       /* --no-auth: no job secret */
static int host_store;    /* --host-store: the store is served here */
static int max_respawns;  /* --respawn[=N]: restarts allowed a rank */
/* what spawn_rank needs again for a respawn */
static char **g_args, **g_env;
static size_t g_nbase;
static int g_port;
static uvccl_store_server_t store_server;
static int store_open;
static struct {
  int rank;
  uint64_t ms;
  uv_timer_t timer;
} kills[MAX_KILLS];
static int nkills;
static int live;          /* ranks not yet exited */
static int open_streams;  /* pipes not yet closed */
static int stop_sig;      /* signal sent to stop the ranks, 0 = running */
static int user_sig;      /* a signal we received */
static int exit_code;     /* first failure's status */
static int timers_on;
static uv_timer_t kill_timer, drain_timer;
static uv_signal_t sig_handles[4];
/* the last: SIGUSR2, passed on to the ranks (not a stop: programs that
 * called uvccl_trace_signal_start dump their flight recorder) */
static const int sig_nums[4] = {SIGINT, SIGTERM, SIGHUP, SIGUSR2};
static int broken[3];     /* stdout/stderr went away (EPIPE) */
static char *obuf;        /* formatted output */
static size_t ocap;

/* ---- output ---------------------------------------------------------------- */

/* Writes everything (one write() for a line: nothing else writes to fd
 * meanwhile, so lines cannot mix). */
static void write_all(int fd, const char *p, size_t n) {
  while (n > 0 && !broken[fd]) {
    ssize_t w = write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 1000);
    } else {
      broken[fd] = 1; /* EPIPE and the like: drop the rest */
    }
  }
}

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...) {
  char b[1024];
  int n;
  va_list ap;
  memcpy(b, PROG ": ", sizeof(PROG ": ") - 1);
  va_start(ap, fmt);
  n = vsnprintf(b + sizeof(PROG ": ") - 1, sizeof(b) - sizeof(PROG ": "), fmt,
                ap);
  va_end(ap);
  if (n < 0) return;
  n += (int)sizeof(PROG ": ") - 1;
  if ((size_t)n > sizeof(b) - 2) n = (int)sizeof(b) - 2;
  b[n++] = '\n';
  write_all(2, b, (size_t)n);
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (q == NULL) {
    msg("out of memory");
    exit(1);
  }
  return q;
}

/* Prints s->buf[0..n) (whole lines, each ending in '\n', unless final: then
 * a missing last newline is added) with the rank's prefix, in one write. */
static void emit(stream_t *s, size_t n, int final) {
  rank_t *rk = s->rk;
  size_t lines = 0, i, o = 0, need;
  const char *p = s->buf, *end = s->buf + n;
  if (n == 0) return;
  for (i = 0; i < n; i++)
    if (s->buf[i] == '\n') lines++;
  need = n + (lines + 1) * (rk->plen + 1);
  if (need > ocap) {
    ocap = need;
    obuf = xrealloc(obuf, ocap);
  }
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
    memcpy(obuf + o, rk->prefix, rk->plen);
    o += rk->plen;
    memcpy(obuf + o, p, l);
    o += l;
    obuf[o++] = '\n';
    p += l + (nl ? 1 : 0);
  }
  (void)final;
  write_all(s->fd, obuf, o);
}

/* ---- life cycle -------------------------------------------------------------- */

static void check_done(void) {
  int i;
  if (live > 0 || open_streams > 0 || !timers_on) return;
  timers_on = 0;
  uv_close((uv_handle_t *)&kill_timer, NULL);
  uv_close((uv_handle_t *)&drain_timer, NULL);
  for (i = 0; i < 4; i++) uv_close((uv_handle_t *)&sig_handles[i], NULL);
  for (i = 0; i < nkills; i++) uv_close((uv_handle_t *)&kills[i].timer, NULL);
  if (store_open) {
    store_open = 0;
    uvccl_store_server_close(&store_server, NULL);
  }
}

/* Signals every rank's process group (exited ranks too: what they started
 * is still in their group). */
static void signal_all(int sig) {
  int i;
  for (i = 0; i < nranks; i++)
    if (ranks[i].pid > 0) kill(-ranks[i].pid, sig);
}

static void maybe_respawn(rank_t *rk);

static void on_stream_closed(uv_handle_t *h) {
  stream_t *s = (stream_t *)h->data;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
  s->closing = 0;
  open_streams--;
  maybe_respawn(s->rk);
  check_done();
}

static void close_stream(stream_t *s) {
  if (!s->open) return;
  s->open = 0;
  if (!uv_is_closing((uv_handle_t *)&s->pipe)) {
    s->closing = 1;
    uv_close((uv_handle_t *)&s->pipe, on_stream_closed);
  }
}

static void on_drain_timer(uv_timer_t *t) {
  int i;
  (void)t;
  /* Something outside the groups still holds a pipe: stop waiting. */
  for (i = 0; i < nranks; i++) {
    stream_t *s[2] = {&ranks[i].out, &ranks[i].err};
    int k;
    for (k = 0; k < 2; k++)
      if (s[k]->open) {
        emit(s[k], s[k]->len, 1);
        s[k]->len = 0;
        close_stream(s[k]);
      }
  }
}

static void on_kill_timer(uv_timer_t *t) {
  (void)t;
  if (live > 0)
    msg("%d rank%s still running %d s after SIG%s: sending SIGKILL", live,
        live == 1 ? "" : "s", KILL_GRACE_MS / 1000,
        stop_sig == SIGINT ? "INT" : stop_sig == SIGHUP ? "HUP" : "TERM");
  signal_all(SIGKILL);
  uv_timer_start(&drain_timer, on_drain_timer, DRAIN_GRACE_MS, 0);
}

/* Stops every rank with sig (then SIGKILL after the grace period). */
static void stop_all(int sig) {
  if (stop_sig) return;
  stop_sig = sig;
  signal_all(sig);
  uv_timer_start(&kill_timer, on_kill_timer, KILL_GRACE_MS, 0);
}

static void on_proc_closed(uv_handle_t *h) {
  rank_t *rk = (rank_t *)h->data;
  rk->proc_open = 0;
  maybe_respawn(rk);
  check_done();
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal) {
  rank_t *rk = (rank_t *)p->data;
  rk->running = 0;
  live--;
  uv_close((uv_handle_t *)p, on_proc_closed);
  if ((status != 0 || term_signal != 0) && !stop_sig &&
      rk->respawns < max_respawns) {
    /* --respawn: it comes back into the running world (UVCCL_JOIN=1),
     * once its pipes and process handle are closed */
    if (term_signal)
      msg("rank %d died (signal %d: %s): respawning it (%d of %d)", rk->rank,
          term_signal, strsignal(term_signal), rk->respawns + 1,
          max_respawns);
    else
      msg("rank %d exited with status %d: respawning it (%d of %d)",
          rk->rank, (int)status, rk->respawns + 1, max_respawns);
    rk->respawns++;
    rk->respawn_due = 1;
    live++; /* it is not done: the run waits for it */
    check_done();
    return;
  }
  if (rk->killed && term_signal == SIGKILL) {
    msg("rank %d killed (--kill), as asked", rk->rank);
  } else if ((status != 0 || term_signal != 0) && !stop_sig) {
    if (term_signal)
      msg("rank %d exited with status %d (signal %d: %s)", rk->rank,
          128 + term_signal, term_signal, strsignal(term_signal));
    else
      msg("rank %d exited with status %d", rk->rank, (int)status);
    if (exit_code == 0) {
      exit_code = term_signal ? 128 + term_signal : (int)(status & 0xff);
      if (exit_code == 0) exit_code = 1;
    }
    if (!keep_going) {
      if (live > 0)
        msg("stopping the other %d rank%s", live, live == 1 ? "" : "s");
      stop_all(SIGTERM);
    }
  }
  if (live == 0 && !stop_sig) {
    /* Every rank is done: whatever they left behind in their groups goes,
     * and pipes still held open by something else are given up on. */
    stop_all(SIGTERM);
  }
  check_done();
}

static void on_kill_rank(uv_timer_t *t) {
  rank_t *rk = &ranks[kills[(int)(uintptr_t)t->data].rank];
  if (rk->running && !stop_sig) {
    msg("killing rank %d (--kill)", rk->rank);
    rk->killed = 1;
    kill(-rk->pid, SIGKILL);
  }
}

static void on_signal(uv_signal_t *h, int signum) {
  (void)h;
  if (signum == SIGUSR2) {
    int i;
    msg("got SIGUSR2: passing it on to %d rank%s (flight recorder dumps)",
        live, live == 1 ? "" : "s");
    for (i = 0; i < nranks; i++)
      if (ranks[i].pid > 0 && ranks[i].running) kill(ranks[i].pid, SIGUSR2);
    return;
  }
  if (user_sig) {
    msg("got %s again: sending SIGKILL", strsignal(signum));
    signal_all(SIGKILL);
    return;
  }
  user_sig = signum;
  if (live > 0)
    msg("got signal %d (%s): forwarding it to %d rank%s", signum,
        strsignal(signum), live, live == 1 ? "" : "s");
  if (stop_sig) signal_all(signum);
  else stop_all(signum);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  stream_t *s = (stream_t *)h->data;
  (void)suggested;
  if (s->cap - s->len < READ_CHUNK) {
    s->cap = s->len + READ_CHUNK;
    s->buf = xrealloc(s->buf, s->cap);
  }
  b->base = s->buf + s->len;
  b->len = s->cap - s->len;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b) {
  stream_t *s = (stream_t *)st->data;
  (void)b;
  if (nread > 0) {
    char *last;
    size_t done;
    s->len += (size_t)nread;
    last = memrchr(s->buf, '\n', s->len);
    done = last ? (size_t)(last - s->buf) + 1 : 0;
    if (done == 0 && s->len >= MAX_LINE) done = s->len; /* a huge line */
    if (done > 0) {
      emit(s, done, 0);
      memmove(s->buf, s->buf + done, s->len - done);
      s->len -= done;
    }
  } else if (nread < 0) {
    /* EOF (or an error): the partial last line, then close. */
    emit(s, s->len, 1);
    s->len = 0;
    close_stream(s);
  }
}

/* ---- spawning ------------------------------------------------------------------ */

/* PROGRAM as execvp() would find it; 0, or the errno. */
static int find_program(const char *prog) {
  const char *path, *p;
  char full[PATH_MAX];
  int saw_eacces = 0;
  struct stat sb;
  if (strchr(prog, '/')) {
    if (stat(prog, &sb) != 0) return errno;
    if (S_ISDIR(sb.st_mode)) return EISDIR;
    return access(prog, X_OK) == 0 ? 0 : errno;
  }
  path = getenv("PATH");
  if (path == NULL) path = "/usr/local/bin:/usr/bin:/bin";
  for (p = path;; p++) {
    const char *e = strchr(p, ':');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    int len = n ? snprintf(full, sizeof(full), "%.*s/%s", (int)n, p, prog)
                : snprintf(full, sizeof(full), "%s", prog);
    if (len > 0 && (size_t)len < sizeof(full) && stat(full, &sb) == 0 &&
        !S_ISDIR(sb.st_mode)) {
      if (access(full, X_OK) == 0) return 0;
      saw_eacces = 1;
    }
    if (e == NULL) break;
    p = e;
  }
  return saw_eacces ? EACCES : ENOENT;
}

/* 1 when port (0: any) binds on 127.0.0.1; *got gets the port bound. */
static int port_free(int port, int *got) {
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok = 0;
  if (fd < 0) return 0;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
    *got = ntohs(a.sin_port);
    ok = 1;
  }
  close(fd);
  return ok;
}

/* MASTER_PORT: a free port below the kernel's ephemeral range. The port is
 * only bound by rank 0 later (unless --host-store binds it at once); one from the ephemeral range could be taken
 * meanwhile by another rank's listener or outgoing connection (ports of
 * bind(0) and connect come from that range), and the job would fail. */
static int pick_port(void) {
  int lo = 32768, hi = 60999, i, got = -1;
  uint64_t x = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^
               0x9e3779b97f4a7c15ull;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f != NULL) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  for (i = 0; lo > 20100 && i < 200; i++) {
    int p;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p = 20000 + (int)(x % (uint64_t)(lo - 20000));
    if (port_free(p, &got)) return got;
  }
  return port_free(0, &got) ? got : -1;
}

static const char *const our_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE"};
#define N_OUR_VARS (sizeof(our_vars) / sizeof(our_vars[0]))

static int is_our_var(const char *kv) {
  size_t i;
  for (i = 0; i < N_OUR_VARS; i++) {
    size_t n = strlen(our_vars[i]);
    if (strncmp(kv, our_vars[i], n) == 0 && kv[n] == '=') return 1;
  }
  return 0;
}

static int spawn_rank(rank_t *rk, char **args, char **env, size_t nbase,
                      int port) {
  uv_process_options_t po;
  uv_stdio_container_t io[3];
  char vars[N_OUR_VARS][48], again[3][48];
  size_t k;
  int r;

  snprintf(vars[0], sizeof(vars[0]), "RANK=%d", rk->rank);
  snprintf(vars[1], sizeof(vars[1]), "WORLD_SIZE=%d", nranks);
  snprintf(vars[2], sizeof(vars[2]), "LOCAL_RANK=%d", rk->rank);
  snprintf(vars[3], sizeof(vars[3]), "LOCAL_WORLD_SIZE=%d", nranks);
  snprintf(vars[4], sizeof(vars[4]), "MASTER_ADDR=127.0.0.1");
  snprintf(vars[5], sizeof(vars[5]), "MASTER_PORT=%d", port);
  snprintf(vars[6], sizeof(vars[6]), "GROUP_RANK=0");
  snprintf(vars[7], sizeof(vars[7]), "GROUP_WORLD_SIZE=1");
  snprintf(vars[8], sizeof(vars[8]), "ROLE_RANK=%d", rk->rank);
  snprintf(vars[9], sizeof(vars[9]), "ROLE_WORLD_SIZE=%d", nranks);
  for (k = 0; k < N_OUR_VARS; k++) env[nbase + k] = vars[k];
  env[nbase + N_OUR_VARS] = NULL;
  if (rk->respawns > 0) {
    /* a replacement: it joins the running world (uvccl_pg_join) */
    snprintf(again[0], sizeof(again[0]), "UVCCL_JOIN=1");
    snprintf(again[1], sizeof(again[1]), "UVCCL_RESPAWN_COUNT=%d",
             rk->respawns);
    snprintf(again[2], sizeof(again[2]), "TORCHELASTIC_RESTART_COUNT=%d",
             rk->respawns);
    for (k = 0; k < 3; k++) env[nbase + N_OUR_VARS + k] = again[k];
    env[nbase + N_OUR_VARS + 3] = NULL;
  }

  memset(&po, 0, sizeof(po));
  memset(io, 0, sizeof(io));
  if (rk->rank == 0) {
    io[0].flags = UV_INHERIT_FD;
    io[0].data.fd = 0;
  } else {
    io[0].flags = UV_IGNORE; /* /dev/null */
  }
  if (prefix_on) {
    stream_t *s[2] = {&rk->out, &rk->err};
    for (k = 0; k < 2; k++) {
      s[k]->rk = rk;
      s[k]->fd = (int)k + 1;
      uv_pipe_init(loop, &s[k]->pipe, 0);
      s[k]->pipe.data = s[k];
      s[k]->open = 1;
      open_streams++;
      io[k + 1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
      io[k + 1].data.stream = (uv_stream_t *)&s[k]->pipe;
    }
  } else {
    io[1].flags = UV_INHERIT_FD;
    io[1].data.fd = 1;
    io[2].flags = UV_INHERIT_FD;
    io[2].data.fd = 2;
  }
  po.file = args[0];
  po.args = args;
  po.env = env;
  po.exit_cb = on_exit_cb;
  po.stdio = io;
  po.stdio_count = 3;
  po.flags = UV_PROCESS_DETACHED; /* setsid(): its own process group */
  rk->proc.data = rk;
  r = uv_spawn(loop, &rk->proc, &po);
  rk->spawned = 1;
  rk->proc_open = 1;
  if (r != 0) {
    rk->proc_open = 0;
    uv_close((uv_handle_t *)&rk->proc, NULL);
    close_stream(&rk->out);
    close_stream(&rk->err);
    return r;
  }
  rk->pid = rk->proc.pid;
  rk->running = 1;
  live++;
  if (prefix_on) {
    uv_read_start((uv_stream_t *)&rk->out.pipe, on_alloc, on_read);
    uv_read_start((uv_stream_t *)&rk->err.pipe, on_alloc, on_read);
  }
  return 0;
}

/* --respawn: the rank's handles are all closed; start it again. */
static void maybe_respawn(rank_t *rk) {
  int r;
  if (!rk->respawn_due || rk->proc_open || rk->out.open || rk->err.open ||
      rk->out.closing || rk->err.closing)
    return;
  rk->respawn_due = 0;
  live--; /* spawn_rank counts it again */
  if (stop_sig) return;
  if ((r = spawn_rank(rk, g_args, g_env, g_nbase, g_port)) != 0) {
    msg("cannot respawn rank %d: %s", rk->rank, uv_strerror(r));
    if (!exit_code) exit_code = 1;
    stop_all(SIGTERM);
  }
}

/* The trampoline: dies with uvccl-run, then becomes PROGRAM. */
static int exec_child(int argc, char **argv) {
  if (argc < 4) return 127;
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if ((long)getppid() != strtol(argv[2], NULL, 10)) _exit(137);
#endif
  execvp(argv[3], argv + 3);
  fprintf(stderr, PROG ": cannot run %s: %s\n", argv[3], strerror(errno));
  _exit(errno == ENOENT ? 127 : 126);
}

/* ---- command line ---------------------------------------------------------- */

static void usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, PROG ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry '" PROG " --help' for more information.\n");
  exit(2);
}

static int parse_count(const char *opt, const char *v, int min, int max) {
  long x;
  char *end;
  if (v == NULL) usage_error("%s needs a value", opt);
  if (*v < '0' || *v > '9') usage_error("%s: '%s' is not a number", opt, v);
  errno = 0;
  x = strtol(v, &end, 10);
  if (*end != '\0') usage_error("%s: '%s' is not a number", opt, v);
  if (errno || x < min || x > max)
    usage_error("%s: %s is out of range (%d to %d)", opt, v, min, max);
  return (int)x;
}

/* --kill R@SECONDS */
static void parse_kill(const char *v) {
  char *end;
  double sec;
  long r;
  if (v == NULL) usage_error("--kill needs a value: RANK@SECONDS");
  if (nkills == MAX_KILLS) usage_error("at most %d --kill options", MAX_KILLS);
  errno = 0;
  r = strtol(v, &end, 10);
  if (end == v || *end != '@' || errno || r < 0 || r >= MAX_RANKS)
    usage_error("--kill: '%s' is not RANK@SECONDS", v);
  v = end + 1;
  sec = strtod(v, &end);
  if (end == v || *end != '\0' || !(sec >= 0 && sec <= 86400))
    usage_error("--kill: '%s' is not a number of seconds in [0, 86400]", v);
  kills[nkills].rank = (int)r;
  kills[nkills].ms = (uint64_t)(sec * 1000.0 + 0.5);
  nkills++;
}

/* "--name VALUE" or "--name=VALUE" (names: '-' or '_' alike). */
static int opt_val(int argc, char **argv, int *i, const char *name,
                   const char **val) {
  const char *a = argv[*i], *n = name;
  while (*n && (*a == *n || (*a == '_' && *n == '-'))) {
    a++;
    n++;
  }
  if (*n) return 0;
  if (*a == '=') {
    *val = a + 1;
    return 1;
  }
  if (*a != '\0') return 0;
  *val = *i + 1 < argc ? argv[++*i] : NULL;
  return 1;
}

int main(int argc, char **argv) {
  int i, k, port = 0, r, nprog;
  const char *v, *token = NULL;
  char exe[PATH_MAX], ppid[32];
  size_t exelen = sizeof(exe), nbase = 0, ne;
  char **args, **env;

  if (argc >= 2 && strcmp(argv[1], EXEC_MARK) == 0)
    return exec_child(argc, argv);

  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0') break;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf(PROG " (uvccl) %s\n", uvccl_version_string());
      return 0;
    } else if (strcmp(a, "-n") == 0) {
      nranks = parse_count("-n", i + 1 < argc ? argv[++i] : NULL, 1,
                           MAX_RANKS);
    } else if (strncmp(a, "-n", 2) == 0 && a[2] >= '0' && a[2] <= '9') {
      nranks = parse_count("-n", a + 2, 1, MAX_RANKS);
    } else if (opt_val(argc, argv, &i, "--nproc-per-node", &v)) {
      nranks = parse_count("--nproc-per-node", v, 1, MAX_RANKS);
    } else if (opt_val(argc, argv, &i, "--master-port", &v)) {
      port = parse_count("--master-port", v, 1, 65535);
    } else if (strcmp(a, "--tag-output") == 0) {
      prefix_on = 1;
    } else if (strcmp(a, "--no-prefix") == 0) {
      prefix_on = 0;
    } else if (strcmp(a, "--keep-going") == 0) {
      keep_going = 1;
    } else if (strcmp(a, "--no-auth") == 0) {
      no_auth = 1;
    } else if (strcmp(a, "--host-store") == 0) {
      host_store = 1;
    } else if (strcmp(a, "--respawn") == 0) {
      max_respawns = 3;
      host_store = keep_going = 1;
    } else if (strncmp(a, "--respawn=", 10) == 0) {
      max_respawns = parse_count("--respawn", a + 10, 1, 1000000);
      host_store = keep_going = 1;
    } else if (strcmp(a, "--print-config") == 0) {
      return print_config(0);
    } else if (strcmp(a, "--print-config=markdown") == 0) {
      return print_config(1);
    } else if (opt_val(argc, argv, &i, "--kill", &v)) {
      parse_kill(v);
      keep_going = 1;
    } else {
      usage_error("unknown option '%s'", a);
    }
  }
  if (i >= argc) usage_error("no PROGRAM to run");
  for (k = 0; k < nkills; k++)
    if (kills[k].rank >= nranks)
      usage_error("--kill: rank %d is outside a world of %d", kills[k].rank,
                  nranks);
  nprog = argc - i;

  if ((r = find_program(argv[i])) != 0) {
    msg("%s: %s", argv[i], r == ENOENT ? "command not found" : strerror(r));
    return r == ENOENT ? 127 : 126;
  }
  if (port == 0 && (port = pick_port()) <= 0) {
    msg("cannot find a free port on 127.0.0.1: %s", strerror(errno));
    return 1;
  }
  if ((r = uv_exepath(exe, &exelen)) != 0) {
    msg("cannot find my own executable: %s", uv_strerror(r));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  /* Trampoline argv: exe MARK ppid PROGRAM ARGS... */
  snprintf(ppid, sizeof(ppid), "%ld", (long)getpid());
  args = xrealloc(NULL, sizeof(*args) * (size_t)(nprog + 4));
  args[0] = exe;
  args[1] = (char *)EXEC_MARK;
  args[2] = ppid;
  for (k = 0; k < nprog; k++) args[3 + k] = argv[i + k];
  args[3 + nprog] = NULL;

  for (ne = 0; environ && environ[ne]; ne++) {
  }
  env = xrealloc(NULL, sizeof(*env) * (ne + N_OUR_VARS + 9));
  for (ne = 0; environ && environ[ne]; ne++)
    if (!is_our_var(environ[ne])) env[nbase++] = environ[ne];
  /* A secret per job (its ranks' store answers only them), unless the
   * caller chose one or none */
  if (!no_auth && getenv("UVCCL_AUTH_TOKEN") == NULL &&
      getenv("UVCCL_AUTH_FILE") == NULL) {
    static char tokvar[32 + 64 + 1];
    unsigned char rnd[32];
    size_t b;
    if ((r = uv_random(NULL, NULL, rnd, sizeof(rnd), 0, NULL)) != 0) {
      msg("cannot make a job secret: %s", uv_strerror(r));
      return 1;
    }
    b = (size_t)snprintf(tokvar, sizeof(tokvar), "UVCCL_AUTH_TOKEN=");
    for (k = 0; k < (int)sizeof(rnd); k++)
      b += (size_t)snprintf(tokvar + b, sizeof(tokvar) - b, "%02x", rnd[k]);
    env[nbase++] = tokvar;
    token = tokvar + sizeof("UVCCL_AUTH_TOKEN=") - 1;
  }
  if (host_store) env[nbase++] = (char *)"TORCHELASTIC_USE_AGENT_STORE=True";

  /* Many more ranks than CPUs: every wake-up is a context switch, so small
   * allreduces and barriers go through a tree (about two wake-ups a rank,
   * not log2 N), unless the caller chose; every rank gets the same. */
  if (getenv("UVCCL_SMALL_TREE") == NULL) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0 && nranks > 2 * ncpu)
      env[nbase++] = (char *)"UVCCL_SMALL_TREE=1";
  }
  /* More ranks than CPUs: a pipeline's every segment handed on is a
   * context switch, so large collectives go in 4 MiB segments rather than
   * 512 KiB (4 ranks on 2 cores: broadcast and allreduce of 1-4 MiB went
   * about 1.5-3x faster, bench/RESULTS.md); every rank gets the same. */
  if (getenv("UVCCL_SEGMENT") == NULL) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0 && nranks > ncpu)
      env[nbase++] = (char *)"UVCCL_SEGMENT=4194304";
  }

  loop = uv_default_loop();
  if (host_store) {
    /* The secret and TLS the ranks get: ours if we made one, else what
     * the environment names (the server reads it as the ranks do). */
    uvccl_store_server_options_t so;
    memset(&so, 0, sizeof(so));
    so.host = "127.0.0.1";
    so.port = port;
    so.listen_fd = -1;
    so.auth_token = token;
    so.auth_none = no_auth;
    if ((r = uvccl_store_server_init(loop, &store_server, &so)) != 0) {
      msg("cannot serve the store on 127.0.0.1:%d: %s", port,
          uvccl_strerror(r));
      uv_loop_close(loop);
      free(args);
      free(env);
      return 1;
    }
    store_open = 1;
  }

  uv_timer_init(loop, &kill_timer);
  uv_timer_init(loop, &drain_timer);
  for (k = 0; k < 4; k++) {
    uv_signal_init(loop, &sig_handles[k]);
    uv_signal_start(&sig_handles[k], on_signal, sig_nums[k]);
  }
  for (k = 0; k < nkills; k++) {
    uv_timer_init(loop, &kills[k].timer);
    kills[k].timer.data = (void *)(uintptr_t)k;
  }
  timers_on = 1;
  g_args = args;
  g_env = env;
  g_nbase = nbase;
  g_port = port;
  ranks = xrealloc(NULL, sizeof(*ranks) * (size_t)nranks);
  memset(ranks, 0, sizeof(*ranks) * (size_t)nranks);
  for (k = 0; k < nranks; k++) {
    rank_t *rk = &ranks[k];
    rk->rank = k;
    snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ", k);
    rk->plen = strlen(rk->prefix);
    if (stop_sig) break; /* a signal arrived meanwhile */
    if ((r = spawn_rank(rk, args, env, nbase, port)) != 0) {
      msg("cannot start rank %d: %s", k, uv_strerror(r));
      if (!exit_code) exit_code = 1;
      stop_all(SIGTERM);
      break;
    }
  }
  if (live == 0) stop_all(SIGTERM); /* nothing started: let it wind down */
  for (k = 0; k < nkills && !stop_sig; k++)
    uv_timer_start(&kills[k].timer, on_kill_rank, kills[k].ms, 0);
  check_done();
  uv_run(loop, UV_RUN_DEFAULT);
  if (uv_loop_close(loop) != 0) msg("warning: handles left open at exit");
  free(ranks);
  free(args);
  free(env);
  free(obuf);
  if (exit_code) return exit_code;
  if (user_sig) return 128 + user_sig;
  return 0;
}
