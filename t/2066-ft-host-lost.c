/* A whole host lost: hosts of 2 ranks (a network namespace each, on a
 * bridge, t/netns.h; UVCCL_HOST_ID tells the hosts apart), heartbeat
 * timeout 1 s, every rank running allreduces; then a host goes
 *   a) 3 hosts, host 2 by both its ranks being killed,
 *   b) 3 hosts, host 2 by its link going down (its port on the bridge),
 *   c) 3 hosts, host 0's link down (the cut-off side holds rank 0),
 *   d) 2 hosts, host 0's link down (the sides are halves),
 *   e) b) with UVCCL_SHRINK_QUORUM=0,
 * and every survivor must fail naming the host: uvccl_pg_get_failure says
 * the host and host_lost 1, its message (and every later call's) starts
 * "host 10.213.0.3 (global ranks 4, 5) lost: ", the failed ranks are the
 * host's; the cut-off ranks (every other host lost to them; in a world of
 * two hosts, both sides) say host_lost 2 and "every other host is lost to
 * this rank's". Then all shrink: only one side goes on (split brain), the
 * majority, or on a tie the half holding rank 0; its allreduces are right;
 * the other side's shrink fails with UVCCL_ENOQUORUM saying why, and it
 * exits (never hangs). With the quorum off, both sides go on. Every rank
 * reaches the other hosts' over 3 connections (UVCCL_TCP_STRIPES): a
 * host's ranks killed or its link down fail them all alike. Needs root
 * and iproute2; skips otherwise. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#define MAXP 6
#include "ranks.h"
#include "ft.h"
#include "netns.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOSTS 3 /* the namespaces made; scenario d) uses two */
#define NMAX (2 * HOSTS)
#define CUT_HEAD "every other host is lost to this rank's"

/* What a rank expects (its environment, set by scenario()): the host
 * that goes, and masks of ranks: cut off, going on after the shrink. */
static int lost_host, cut_mask, on_mask;

static int role_host(void) {
  int64_t v[16];
  int iter, rc = 0, i, bad = 0, nf, failed[NMAX], k, cut, on;
  char lost_head[96];
  uvccl_work_t w = {0};
  uvccl_pg_failure_t f;
  uvccl_pg_t next;
  rank_init(30000);
  cut = (cut_mask >> R) & 1;
  on = (on_mask >> R) & 1;
  snprintf(lost_head, sizeof(lost_head),
           "host " NET_PREFIX "%d (global ranks %d, %d) lost: ", lost_host + 1,
           2 * lost_host, 2 * lost_host + 1);
  for (iter = 0; iter < 100000; iter++) {
    cbres_t c = {0};
    for (i = 0; i < 16; i++) v[i] = R + 1;
    memset(&w, 0, sizeof(w));
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, v, v, 16, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 60000);
    if (rc != 0) break;
    for (i = 0; i < 16; i++) bad += v[i] != P * (P + 1) / 2;
    if (iter == 2) val("started", 1);
    sleep_ms(2);
  }
  rep(rc == UVCCL_EPEER && bad == 0, "failed", "after %d: %s %s", iter,
      ename(rc), w.msg);
  /* The host's other rank is declared within moments of the first: the
   * loop runs until the host is known lost (or 5 s); on the cut-off host,
   * until every other host is (they go one by one). */
  for (k = 0; k < 50; k++) {
    int never = 0;
    if (uvccl_pg_get_failure(&pg, &f) == 1 && f.host_lost == (cut ? 2 : 1))
      break;
    run_until(&never, 100);
  }
  nf = uvccl_pg_failed_ranks(&pg, failed, NMAX);
  if (!cut) {
    rep(f.host_lost == 1 && f.host == lost_host && nf == 2 &&
            ((failed[0] == 2 * lost_host && failed[1] == 2 * lost_host + 1) ||
             (failed[0] == 2 * lost_host + 1 && failed[1] == 2 * lost_host)) &&
            strncmp(f.msg, lost_head, strlen(lost_head)) == 0,
        "named", "host_lost %d, host %d, %d failed (%d %d): %s", f.host_lost,
        f.host, nf, nf > 0 ? failed[0] : -1, nf > 1 ? failed[1] : -1, f.msg);
  } else {
    for (bad = 0, i = 0; i < nf; i++) bad += failed[i] / 2 == R / 2;
    rep(f.host_lost == 2 && nf == P - 2 && bad == 0 &&
            strncmp(f.msg, CUT_HEAD, strlen(CUT_HEAD)) == 0,
        "named", "host_lost %d, %d failed: %s", f.host_lost, nf, f.msg);
  }
  /* a later call fails at once, saying the same */
  {
    uvccl_work_t w2 = {0};
    int rc2 = uvccl_allreduce(&pg, &w2, v, v, 16, UVCCL_INT64, UVCCL_SUM,
                              NULL);
    rep(rc2 == UVCCL_EPEER &&
            strstr(w2.msg, cut ? CUT_HEAD : lost_head) != NULL,
        "later", "%s: %s", ename(rc2), w2.msg);
  }
  /* one side goes on without the other */
  memset(&w, 0, sizeof(w));
  rc = uvccl_pg_shrink(&pg, &next, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (on) {
    int kept = cut ? 2 : P - 2; /* with the quorum off: its own host */
    rep(rc == 0 && next.size == kept && w.result == P - kept, "shrink",
        "%s %s: size %d, %lld removed", ename(rc), w.msg,
        rc == 0 ? next.size : -1, (long long)w.result);
    if (rc == 0) rc = ft_check_shrunk(&next, R);
  } else {
    char want[64];
    snprintf(want, sizeof(want), P == 4 ? "a half (2 of 4 ranks) without "
             "the lowest, global 0" : "this side keeps 2 of 6 ranks");
    rep(rc == UVCCL_ENOQUORUM && strstr(w.msg, "no quorum") != NULL &&
            strstr(w.msg, want) != NULL,
        "shrink", "%s %s", ename(rc), w.msg);
  }
  /* Nobody leaves before every side has shrunk: on one kernel a process
   * that exits is seen to (its connections close) even across the cut,
   * which a real cut would hide. */
  wait_stdin_eof(30000);
  if (rc == 0 && next.impl_ != NULL) uvccl_pg_destroy(&next, NULL);
  return rank_destroy();
}

/* ======================================================================== */

static void ip_do(const char *what, const char *const *args) {
  char out[512];
  if (run_ip(args, out, sizeof(out)) != 0) note("%s: ip failed: %s", what, out);
}

typedef struct {
  const char *name;
  int hosts, lost, link_down, quorum_off;
} scenario_t;

/* 5 tests, and 2 more with a link down */
static void scenario(const scenario_t *sc) {
  proc_t ps[NMAX];
  static char e_host[NMAX][32], e_exp[NMAX][64];
  const char *name = sc->name;
  int n = 2 * sc->hosts, r, started = 0, lost = sc->lost;
  unsigned all = (1u << n) - 1, gone = 3u << (2 * lost), cut = 0, on;
  char port[8];
  double v;
  /* Who is cut off: a host whose every other host is lost to it. With
   * three, the lost one; with two, both. Who goes on: the majority; of
   * two halves, the one with rank 0; everyone with the quorum off. */
  if (sc->link_down) cut = sc->hosts == 2 ? all : gone;
  on = sc->quorum_off ? all : sc->hosts == 2 ? 3u : all & ~gone;
  if (!sc->link_down) on &= ~gone;
  for (r = 0; r < n; r++) {
    const char *extra[] = {"UVCCL_HEARTBEAT_TIMEOUT_MS=1000", e_host[r],
                           e_exp[r],
                           sc->quorum_off ? "UVCCL_SHRINK_QUORUM=0" : NULL,
                           NULL};
    snprintf(e_host[r], sizeof(e_host[r]), "UVCCL_HOST_ID=h%d", r / 2);
    snprintf(e_exp[r], sizeof(e_exp[r]), "UVCCL_T_EXPECT=%d,%u,%u", lost, cut,
             on);
    ns_spawn_rank_in(&ps[r], r, n, r / 2, "host", extra);
  }
  while (!started) {
    int ready = 1;
    pump(ps, n, 10);
    for (r = 0; r < n; r++)
      if (!find_val(ps, n, r, "started", &v)) ready = 0;
    if (ready) started = 1;
    for (r = 0; r < n; r++)
      if (ps[r].exited) break;
    if (r < n) break;
  }
  snprintf(port, sizeof(port), "p%c", 'A' + lost);
  if (sc->link_down) {
    const char *a[] = {"-n", ns[HOSTS], "link", "set", port, "down", NULL};
    ip_do("link down", a);
  } else {
    kill(ps[2 * lost].pid, SIGKILL);
    kill(ps[2 * lost + 1].pid, SIGKILL);
  }
  {
    unsigned running = sc->link_down ? all : all & ~gone;
    int t, okv;
    char det[8];
    for (t = 0; t < 6000; t++) {
      int shrunk = 1;
      pump(ps, n, 10);
      for (r = 0; r < n; r++)
        if ((running >> r) & 1) {
          find_check(ps, n, r, "shrink", &okv, det, sizeof(det));
          if (okv < 0 && !ps[r].exited) shrunk = 0;
        }
      if (shrunk) break;
    }
    for (r = 0; r < n; r++)
      if (ps[r].in >= 0) {
        close(ps[r].in);
        ps[r].in = -1;
      }
  }
  finish_all(ps, n, 60);
  scenario_failed = 0;
  ok(started, "%s: %d ranks on %d hosts running allreduces", name, n,
     sc->hosts);
  agg(ps, n, "failed", sc->link_down ? all : all & ~gone,
      "%s: every live rank's allreduces fail (EPEER)", name);
  agg(ps, n, "named", sc->link_down ? all : all & ~gone,
      "%s: each names the host lost (host_lost 1), or every other host lost "
      "to its own (host_lost 2)", name);
  agg(ps, n, "later", sc->link_down ? all : all & ~gone,
      "%s: ... and so does every later call", name);
  agg(ps, n, "shrink", sc->link_down ? all : all & ~gone,
      sc->quorum_off ? "%s: with the quorum off, each side shrinks to itself"
                     : "%s: one side shrinks to its %d ranks; the other's "
                       "shrink is refused (UVCCL_ENOQUORUM, saying why)",
      name, n - 2);
  agg(ps, n, "after", on, "%s: ... and the allreduces of the side(s) that "
      "went on are right", name);
  if (sc->link_down) {
    int code = 0;
    for (r = 0; r < n; r++) code |= ps[r].status;
    ok(code == 0, "%s: the cut-off ranks finish too, no hang", name);
  }
  if (scenario_failed) dump_procs(ps, n);
  procs_free(ps, n);
  if (sc->link_down) {
    const char *a[] = {"-n", ns[HOSTS], "link", "set", port, "up", NULL};
    ip_do("link up", a);
  }
}

static const scenario_t scenarios[] = {
    {"a (host 2's ranks killed)", 3, 2, 0, 0},
    {"b (host 2's link down)", 3, 2, 1, 0},
    {"c (host 0's link down: a minority holding rank 0)", 3, 0, 1, 0},
    {"d (2 hosts, host 0's link down: halves)", 2, 0, 1, 0},
    {"e (b, UVCCL_SHRINK_QUORUM=0)", 3, 2, 1, 1},
};

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  char err[1024] = "";
  ssize_t l;
  if (role != NULL && *role) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    sigpipe_default();
    alarm(60);
    R = ft_env_int("RANK", -1);
    P = ft_env_int("WORLD_SIZE", 0);
    if (getenv("UVCCL_T_EXPECT") == NULL ||
        sscanf(getenv("UVCCL_T_EXPECT"), "%d,%d,%d", &lost_host, &cut_mask,
               &on_mask) != 3)
      return 2;
    return role_host();
  }
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  if (ns_prepare(HOSTS, err, sizeof(err)) != 0) skip_all("%s", err);
  sigpipe_default();
  alarm(480);
  setenv("UVCCL_TCP_STRIPES", "3", 1); /* (every rank's) */
  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip_all("cannot build the network namespaces: %s", err);
  }
  {
    size_t i, tests = 1;
    for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
      tests += 6 + (size_t)scenarios[i].link_down;
    plan((int)tests);
    for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
      scenario(&scenarios[i]);
  }
  ns_cleanup();
  ok(!ns_leftovers(), "the namespaces are gone after the cleanup");
  return done_testing();
}
