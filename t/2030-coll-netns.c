/* A world whose ranks sit in separate Linux network namespaces, so that
 * nothing can assume loopback: namespaces uvtA<pid>, uvtB<pid>, uvtC<pid>
 * (one rank each) plus uvtS<pid> holding a bridge, every rank namespace
 * joined to the bridge by a veth pair, addresses 10.213.0.1-3/24 (a private
 * range that exists only inside these namespaces; nothing is sent outside
 * them). Rank 0 (10.213.0.1) hosts the store through env://; every rank
 * must pick its veth address on its own (the library picks the interface
 * that routes to the store host), and the collectives must give exact
 * results. Needs root and iproute2; skips otherwise, or when namespaces
 * cannot be made (a container without CAP_SYS_ADMIN). The namespaces are
 * removed at exit, on failure, on the test's alarm and on SIGTERM/SIGINT.
 *
 * The binary is also the rank program (UVCCL_T_ROLE=netns), started with
 * `ip netns exec NS`; it prints "@check RANK OK NAME | detail" lines that
 * the parent turns into TAP. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#define NRANKS 3
#define NET "10.213.0."
#define MASTER_PORT "29500" /* the namespaces are ours: no conflict */
#define MAXP NRANKS
#include "ranks.h"

/* ======================================================================== */
/* Rank side                                                                */
/* ======================================================================== */

static int rank_main(void) {
  const char *r = getenv("RANK"), *s = getenv("WORLD_SIZE");
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int rc, bad_rc = 0;

  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, SIG_DFL);
  alarm(40);
  unsetenv("UVCCL_SOCKET_IFNAME"); /* the route to the store must decide */
  R = r ? atoi(r) : -1;
  P = s ? atoi(s) : 0;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);

  memset(&o, 0, sizeof(o));
  o.timeout_ms = 10000;
  w.data = &c;
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, on_work);
  rc = finish_work(&c, rc, 15000);
  rep(rc == 0 && pg.rank == R && pg.size == P, "init",
      "uvccl_pg_init_url(env://) with MASTER_ADDR=%s: %s %s",
      getenv("MASTER_ADDR"), ename(rc), w.msg);
  if (rc != 0) return 1;

  /* who is where: every address in 10.213.0.0/24, rank q at .q+1 */
  {
    char d[400] = "", want[32];
    int q, okv = 1, selfok;
    for (q = 0; q < P; q++) {
      const char *a = uvccl_pg_peer_address(&pg, q);
      size_t l = strlen(d);
      snprintf(d + l, sizeof(d) - l, "%s%d=%s", q ? " " : "", q, a);
      snprintf(want, sizeof(want), NET "%d:", q + 1);
      if (q != R && strncmp(a, want, strlen(want)) != 0) okv = 0;
    }
    snprintf(want, sizeof(want), NET "%d:", R + 1);
    selfok = strncmp(uvccl_pg_peer_address(&pg, R), want, strlen(want)) == 0;
    rep(okv, "peers", "%s", d);
    rep(selfok, "self", "this rank listens on %s (want %s*)",
        uvccl_pg_peer_address(&pg, R), want);
  }
  /* allreduce, small and 4 MiB */
  {
    size_t sizes[2] = {1000, (4u << 20) / sizeof(float)}, k;
    for (k = 0; k < 2; k++) {
      size_t n = sizes[k], i, bad = 0;
      float *b = malloc(n * sizeof(float));
      uvccl_work_t w2 = {0};
      cbres_t c2 = {0};
      for (i = 0; i < n; i++) b[i] = (float)((int)(i % 1000) + R * 3);
      w2.data = &c2;
      rc = uvccl_allreduce(&pg, &w2, b, b, n, UVCCL_FLOAT32, UVCCL_SUM,
                           on_work);
      rc = finish_work(&c2, rc, 15000);
      for (i = 0; i < n; i++)
        if (b[i] != (float)(P * (int)(i % 1000) + 3 * P * (P - 1) / 2)) bad++;
      rep(rc == 0 && bad == 0, k ? "allreduce_big" : "allreduce_small",
          "%zu floats: %s %s; %zu wrong", n, ename(rc), w2.msg, bad);
      bad_rc |= rc != 0;
      free(b);
    }
  }
  /* allgather */
  bad_rc |= rank_allgather_check(20001) != 0;
  printf("@done %d\n", R);
  fflush(stdout);
  /* Every rank destroys once the parent has seen all of them finish: a rank
   * that leaves first is reported as a failed peer to ranks still inside
   * their last collective (t/2020-coll-procs.t, f), which this test is not
   * about. */
  rep(wait_stdin_eof(20000), "gate", "waited for the parent");
  {
    double t0 = now_s(), t1;
    int done;
    char left[256] = "";
    uvccl_pg_destroy(&pg, on_pg_closed);
    done = run_until(&pg_closed, 8000);
    t1 = now_s();
    uv_close((uv_handle_t *)&guard, NULL);
    while (uv_loop_alive(&loop) && now_s() - t1 < 3.0) {
      uv_run(&loop, UV_RUN_NOWAIT);
      if (uv_loop_alive(&loop)) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
      }
    }
    rc = uv_loop_close(&loop);
    if (rc != 0) uv_walk(&loop, walk_cb, left);
    rep(done && rc == 0, "destroy",
        "destroy %s after %.3f s; uv_loop_close: %s%s", done ? "done" : "HUNG",
        t1 - t0, rc ? uvccl_err_name(rc) : "0", left);
    bad_rc |= !(done && rc == 0);
  }
  return bad_rc;
}

/* ======================================================================== */
/* Parent side                                                              */
/* ======================================================================== */


static const char *ipbin;
static char ns[4][32];     /* A, B, C, S */
static int ns_made[4];

/* Runs ip with args; output into out (may be NULL). Only fork/exec/wait
 * (so the cleanup may use it from a signal handler). Returns the exit
 * status, or -1. */
static int run_ip(const char *const *args, char *out, size_t outlen) {
  const char *argv[24];
  int n = 0, pfd[2] = {-1, -1}, st = 0;
  size_t len = 0;
  pid_t p;
  argv[n++] = ipbin;
  while (*args && n < 23) argv[n++] = *args++;
  argv[n] = NULL;
  if (out && pipe2(pfd, O_CLOEXEC) != 0) return -1;
  p = fork();
  if (p < 0) return -1;
  if (p == 0) {
    int dn = open("/dev/null", O_RDWR);
    dup2(dn, 0);
    dup2(out ? pfd[1] : dn, 1);
    dup2(out ? pfd[1] : dn, 2);
    execv(ipbin, (char *const *)argv);
    _exit(127);
  }
  if (out) {
    ssize_t r;
    close(pfd[1]);
    while (len + 1 < outlen &&
           ((r = read(pfd[0], out + len, outlen - len - 1)) > 0 ||
            (r < 0 && errno == EINTR)))
      if (r > 0) len += (size_t)r;
    out[len] = '\0';
    close(pfd[0]);
  }
  while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void cleanup(void) {
  int i;
  kill_live();
  for (i = 3; i >= 0; i--)
    if (ns_made[i]) {
      const char *a[] = {"netns", "del", ns[i], NULL};
      run_ip(a, NULL, 0);
      ns_made[i] = 0;
    }
}

static void on_fatal_signal(int sig) {
  static const char m[] = "not ok - test timed out or was stopped; namespaces "
                          "removed\n";
  cleanup();
  if (sig == SIGALRM && write(1, m, sizeof(m) - 1) < 0) { /* nothing */ }
  _exit(sig == SIGALRM ? 3 : 128 + sig);
}

/* Runs one setup step; on failure, says so and returns the error text. */
static int step(char *err, size_t errlen, ...) {
  const char *args[24];
  char out[1024];
  int n = 0, rc;
  va_list ap;
  va_start(ap, errlen);
  while (n < 23 && (args[n] = va_arg(ap, const char *)) != NULL) n++;
  va_end(ap);
  args[n] = NULL;
  rc = run_ip(args, out, sizeof(out));
  if (rc != 0) {
    size_t l;
    int k;
    snprintf(err, errlen, "ip");
    for (k = 0; k < n; k++) {
      l = strlen(err);
      snprintf(err + l, errlen - l, " %s", args[k]);
    }
    l = strlen(err);
    snprintf(err + l, errlen - l, ": %s", out[0] ? out : "failed");
    for (l = 0; err[l]; l++)
      if (err[l] == '\n') err[l] = ' ';
  }
  return rc;
}

static int setup(char *err, size_t errlen) {
  static const char L[3] = {'A', 'B', 'C'};
  char addr[32], port[16];
  int i;
  for (i = 0; i < 4; i++) {
    const char *a[] = {"netns", "del", ns[i], NULL};
    run_ip(a, NULL, 0); /* a leftover of a run with our pid, if any */
    if (step(err, errlen, "netns", "add", ns[i], NULL) != 0) return -1;
    ns_made[i] = 1;
  }
  if (step(err, errlen, "-n", ns[3], "link", "add", "br0", "type", "bridge",
           NULL) ||
      step(err, errlen, "-n", ns[3], "link", "set", "br0", "up", NULL))
    return -1;
  for (i = 0; i < 3; i++) {
    snprintf(port, sizeof(port), "p%c", L[i]);
    snprintf(addr, sizeof(addr), NET "%d/24", i + 1);
    if (step(err, errlen, "-n", ns[i], "link", "add", "eth0", "type", "veth",
             "peer", "name", port, "netns", ns[3], NULL) ||
        step(err, errlen, "-n", ns[3], "link", "set", port, "master", "br0",
             NULL) ||
        step(err, errlen, "-n", ns[3], "link", "set", port, "up", NULL) ||
        step(err, errlen, "-n", ns[i], "addr", "add", addr, "dev", "eth0",
             NULL) ||
        step(err, errlen, "-n", ns[i], "link", "set", "eth0", "up", NULL) ||
        step(err, errlen, "-n", ns[i], "link", "set", "lo", "up", NULL))
      return -1;
  }
  return 0;
}

static int spawn_rank(proc_t *p, int r) {
  char e_rank[32], *argv[6];
  int o[2], e[2], in[2];
  pid_t parent = getpid(), pid;
  memset(p, 0, sizeof(*p));
  p->obuf = calloc(1, 1);
  p->ebuf = calloc(1, 1);
  p->out = p->err = p->in = -1;
  if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC) || pipe2(in, O_CLOEXEC))
    return -errno;
  snprintf(e_rank, sizeof(e_rank), "RANK=%d", r);
  argv[0] = (char *)ipbin;
  argv[1] = "netns";
  argv[2] = "exec";
  argv[3] = ns[r];
  argv[4] = self;
  argv[5] = NULL;
  fflush(stdout);
  pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    setenv("UVCCL_T_ROLE", "netns", 1);
    setenv("RANK", e_rank + 5, 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("MASTER_ADDR", NET "1", 1);
    setenv("MASTER_PORT", MASTER_PORT, 1);
    execv(ipbin, argv); /* ip netns exec execs the program itself */
    _exit(127);
  }
  close(o[1]);
  close(e[1]);
  close(in[0]);
  p->pid = pid;
  live_set(pid, 1);
  snprintf(p->name, sizeof(p->name), "rank %d in %s", r, ns[r]);
  p->out = o[0];
  p->err = e[0];
  p->in = in[1];
  return 0;
}

static int any_failed;

static void agg_ns(proc_t *ps, const char *name, const char *desc) {
  char det[512];
  int r, okv, all = 1;
  for (r = 0; r < NRANKS; r++) {
    find_check(ps, NRANKS, r, name, &okv, det, sizeof(det));
    if (okv != 1) all = 0;
  }
  ok(all, "%s", desc);
  for (r = 0; r < NRANKS; r++) {
    find_check(ps, NRANKS, r, name, &okv, det, sizeof(det));
    if (all && okv == 1 && strcmp(name, "peers") != 0) continue;
    note("  rank %d (%s): %s%s", r, ns[r],
         okv < 0 ? "no report" : okv ? "" : "FAILED: ", det);
  }
  if (!all) any_failed = 1;
}

int main(void) {
  static const char *cands[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip",
                                "/bin/ip", NULL};
  proc_t ps[NRANKS];
  char err[1024] = "";
  const char *role = getenv("UVCCL_T_ROLE");
  ssize_t l;
  int i, k;
  double t0;

  if (role != NULL && strcmp(role, "netns") == 0) return rank_main();

  if (geteuid() != 0) skip_all("network namespaces need root");
  for (k = 0; cands[k]; k++)
    if (access(cands[k], X_OK) == 0) {
      ipbin = cands[k];
      break;
    }
  if (ipbin == NULL)
    skip_all("no ip command (iproute2; tools/deps.sh installs it)");
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  snprintf(ns[0], sizeof(ns[0]), "uvtA%d", (int)getpid());
  snprintf(ns[1], sizeof(ns[1]), "uvtB%d", (int)getpid());
  snprintf(ns[2], sizeof(ns[2]), "uvtC%d", (int)getpid());
  snprintf(ns[3], sizeof(ns[3]), "uvtS%d", (int)getpid());

  /* From the first namespace on, every way out removes them. */
  atexit(cleanup);
  signal(SIGALRM, on_fatal_signal);
  signal(SIGTERM, on_fatal_signal);
  signal(SIGINT, on_fatal_signal);
  signal(SIGHUP, on_fatal_signal);
  signal(SIGPIPE, SIG_IGN);
  alarm(60);

  if (setup(err, sizeof(err)) != 0) {
    cleanup();
    skip_all("cannot build the network namespaces: %s", err);
  }
  plan(10);
  note("namespaces %s %s %s (ranks 0-2, " NET "1-3/24) on a bridge in %s",
       ns[0], ns[1], ns[2], ns[3]);
  ok(1, "3 network namespaces joined by veth pairs to a bridge");

  t0 = now_s();
  for (i = 0; i < NRANKS; i++)
    if (spawn_rank(&ps[i], i) != 0) note("spawning rank %d failed", i);
  /* all ranks done with their collectives, or one of them gone */
  while (now_s() - t0 < 30) {
    int done = 0, gone = 0;
    pump(ps, NRANKS, 50);
    for (i = 0; i < NRANKS; i++) {
      if (strstr(ps[i].obuf, "@done ") != NULL) done++;
      if (ps[i].exited) gone++;
    }
    if (done == NRANKS || gone > 0) break;
  }
  for (i = 0; i < NRANKS; i++) {
    close(ps[i].in);
    ps[i].in = -1;
  }
  while (pump(ps, NRANKS, 50) > 0)
    if (now_s() - t0 > 45)
      for (i = 0; i < NRANKS; i++)
        if (!ps[i].exited) kill(ps[i].pid, SIGKILL);
  note("world in %.2f s", now_s() - t0);

  agg_ns(ps, "init",
      "every rank creates the group over env:// (store on " NET "1)");
  agg_ns(ps, "peers",
      "every rank reaches peer q at " NET "q+1 (its veth address, not "
      "loopback)");
  agg_ns(ps, "self", "every rank picked its own veth address to listen on");
  agg_ns(ps, "allreduce_small", "allreduce float32 SUM (1000) exact everywhere");
  agg_ns(ps, "allreduce_big", "allreduce float32 SUM (4 MiB) exact everywhere");
  agg_ns(ps, "allgather", "allgather int64 exact everywhere");
  agg_ns(ps, "destroy", "destroy completes and uv_loop_close returns 0");
  if (!ok(ps[0].status == 0 && ps[1].status == 0 && ps[2].status == 0,
          "every rank exits 0 (exit %d, %d, %d)", ps[0].status, ps[1].status,
          ps[2].status))
    any_failed = 1;
  if (any_failed) dump_procs(ps, NRANKS);
  procs_free(ps, NRANKS);

  cleanup();
  {
    const char *a[] = {"netns", "list", NULL};
    char out[8192];
    int left = 0;
    run_ip(a, out, sizeof(out));
    for (i = 0; i < 4; i++) {
      struct stat st;
      char path[192];
      snprintf(path, sizeof(path), "/run/netns/%s", ns[i]);
      if (stat(path, &st) == 0) left++;
      {
        /* "uvtA123" must not prefix-match "uvtA1234": whole words only */
        const char *p = out;
        size_t nl = strlen(ns[i]);
        while ((p = strstr(p, ns[i])) != NULL) {
          if (p[nl] == ' ' || p[nl] == '\n' || p[nl] == '\0') left++;
          p += nl;
        }
      }
    }
    ok(left == 0, "the namespaces are gone after the cleanup");
  }
  return done_testing();
}
