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
 *
 * Two worlds in turn:
 *   a) the three ranks share the host's PID namespace: every pair talks
 *      through shared memory (one host, whatever the network namespaces);
 *   b) rank 2 runs in a PID namespace of its own (`unshare --pid`, as a
 *      container would): it cannot reach the others' memory (nor they its:
 *      the process ID it offers names another process here, whose memory
 *      fails the cookie check), so it talks TCP over the bridge to ranks 0
 *      and 1, which keep shared memory between them: a mixed world, same
 *      exact results.
 *
 * The binary is also the rank program (UVCCL_T_ROLE=netns), started with
 * `ip netns exec NS`; it prints "@check RANK OK NAME | detail" lines that
 * the parent turns into TAP. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "cpu/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#define NRANKS 3
#define MAXP NRANKS
#include "ranks.h"
#include "netns.h"
#define NET NET_PREFIX
#define UNSHARE "/usr/bin/unshare"

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

  /* which transport reaches whom (b: rank $UVCCL_T_ALONE has its own PID
   * namespace) */
  {
    const char *a = getenv("UVCCL_T_ALONE");
    int alone = a != NULL && *a ? atoi(a) : -1, q, bad = 0;
    char d[200] = "";
    for (q = 0; q < P; q++) {
      const char *t = uvccl_pg_peer_transport(&pg, q);
      const char *want = q == R ? "self"
                         : q == alone || R == alone ? "tcp" : "shm";
      size_t l = strlen(d);
      snprintf(d + l, sizeof(d) - l, "%s%d=%s", q ? " " : "", q, t);
      if (strcmp(t, want) != 0) bad++;
    }
    rep(bad == 0, "transport", "%s", d);
  }

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
  /* Busy polling's count of the ranks that share this rank's CPUs: the
   * kernel decides (its boot id), not the addresses, which differ here */
  {
    group_t *g = pg.impl_;
    int here = uvccl__net_local_ranks(g->net);
    rep(here == P, "cpus", "%d ranks counted on this kernel (want %d)", here,
        P);
  }
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


static int any_failed;

static void agg_ns(proc_t *ps, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void agg_ns(proc_t *ps, const char *name, const char *fmt, ...) {
  char det[512], desc[256];
  int r, okv, all = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(desc, sizeof(desc), fmt, ap);
  va_end(ap);
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

/* One world of NRANKS ranks, one a namespace; b (alone): rank 2 in a PID
 * namespace of its own. 10 tests. */
static void run_world(int alone) {
  proc_t ps[NRANKS];
  const char *tag = alone ? "b: " : "a: ";
  static char e_alone[] = "UVCCL_T_ALONE=2", e_pidns[] = "UVCCL_T_PIDNS=1",
              e_none[] = "UVCCL_T_ALONE=";
  const char *extra[] = {e_alone, e_pidns, NULL};
  const char *extra_all[] = {e_alone, NULL}, *extra_none[] = {e_none, NULL};
  int i;
  double t0;
  any_failed = 0;
  t0 = now_s();
  for (i = 0; i < NRANKS; i++)
    if (ns_spawn_rank(&ps[i], i, "netns",
                      !alone ? extra_none : i == 2 ? extra : extra_all) != 0)
      note("spawning rank %d failed", i);
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
  note("%sworld in %.2f s", tag, now_s() - t0);

  agg_ns(ps, "init",
         "%severy rank creates the group over env:// (store on " NET "1)",
         tag);
  agg_ns(ps, "transport",
         alone ? "%sranks 0 and 1 through shared memory, rank 2 (its own PID "
                 "namespace) through TCP"
               : "%severy pair through shared memory (one host, one PID "
                 "namespace)", tag);
  agg_ns(ps, "peers",
         "%severy rank reaches peer q at " NET "q+1 (its veth address, not "
         "loopback)", tag);
  agg_ns(ps, "self", "%severy rank picked its own veth address to listen on",
         tag);
  agg_ns(ps, "allreduce_small",
         "%sallreduce float32 SUM (1000) exact everywhere", tag);
  agg_ns(ps, "allreduce_big",
         "%sallreduce float32 SUM (4 MiB) exact everywhere", tag);
  agg_ns(ps, "allgather", "%sallgather int64 exact everywhere", tag);
  agg_ns(ps, "cpus", "%severy rank counts all three as sharing its CPUs "
         "(one kernel, whatever the namespaces)", tag);
  agg_ns(ps, "destroy", "%sdestroy completes and uv_loop_close returns 0",
         tag);
  if (!ok(ps[0].status == 0 && ps[1].status == 0 && ps[2].status == 0,
          "%severy rank exits 0 (exit %d, %d, %d)", tag, ps[0].status,
          ps[1].status, ps[2].status))
    any_failed = 1;
  if (any_failed) dump_procs(ps, NRANKS);
  procs_free(ps, NRANKS);
}

int main(void) {
  char err[1024] = "";
  const char *role = getenv("UVCCL_T_ROLE");
  ssize_t l;

  if (role != NULL && strcmp(role, "netns") == 0) {
    /* b: this rank moves into a PID namespace of its own first */
    const char *pidns = getenv("UVCCL_T_PIDNS");
    if (pidns != NULL && strcmp(pidns, "1") == 0) {
      char *argv2[] = {"unshare", "--pid", "--fork", "--kill-child", self,
                       NULL};
      l = readlink("/proc/self/exe", self, sizeof(self) - 1);
      if (l <= 0) return 127;
      self[l] = '\0';
      setenv("UVCCL_T_PIDNS", "2", 1);
      execv(UNSHARE, argv2);
      printf("@check %s 0 init | cannot exec " UNSHARE ": %s\n",
             getenv("RANK"), strerror(errno));
      return 127;
    }
    return rank_main();
  }

  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  if (ns_prepare(NRANKS, err, sizeof(err)) != 0) skip_all("%s", err);
  signal(SIGPIPE, SIG_IGN);
  alarm(60);

  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip_all("cannot build the network namespaces: %s", err);
  }
  plan(22);
  note("namespaces %s %s %s (ranks 0-2, " NET "1-3/24) on a bridge in %s",
       ns[0], ns[1], ns[2], ns[3]);
  ok(1, "3 network namespaces joined by veth pairs to a bridge");

  run_world(0);
  if (access(UNSHARE, X_OK) == 0)
    run_world(1);
  else
    skip(9, "b: no " UNSHARE " (util-linux) to give a rank its own PID "
         "namespace");

  ns_cleanup();
  ok(!ns_leftovers(), "the namespaces are gone after the cleanup");
  return done_testing();
}
