/* A whole host lost: 3 hosts of 2 ranks (a network namespace each, on a
 * bridge, t/netns.h; UVCCL_HOST_ID tells the hosts apart), heartbeat
 * timeout 1 s, every rank running allreduces; then host 2 (ranks 4 and 5)
 * goes
 *   a) by both its ranks being killed, or
 *   b) by its link going down (its port on the bridge),
 * and every survivor must fail naming the host: uvccl_pg_get_failure says
 * host 2 and host_lost 1, its message (and every later call's) starts
 * "host 10.213.0.3 (global ranks 4, 5) lost: ", the failed ranks are 4
 * and 5; the survivors shrink to the 4 ranks of the other hosts and their
 * allreduces are right. In b) ranks 4 and 5 live on, cut off: they must
 * fail too (never hang), and say that every other host is lost to theirs
 * (host_lost 2). Needs root and iproute2; skips otherwise. */
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

#define HOSTS 3
#define N (2 * HOSTS)
#define LOST 2 /* the host that goes */
#define LOST_HEAD "host " NET_PREFIX "3 (global ranks 4, 5) lost: "
#define CUT_HEAD "every other host is lost to this rank's"

static int on_lost_host(int r) { return r / 2 == LOST; }

static int role_host(void) {
  int64_t v[16];
  int iter, rc = 0, i, bad = 0, nf, failed[N], k;
  uvccl_work_t w = {0};
  uvccl_pg_failure_t f;
  uvccl_pg_t next;
  rank_init(30000);
  for (iter = 0; iter < 100000; iter++) {
    cbres_t c = {0};
    for (i = 0; i < 16; i++) v[i] = R + 1;
    memset(&w, 0, sizeof(w));
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, v, v, 16, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 60000);
    if (rc != 0) break;
    for (i = 0; i < 16; i++) bad += v[i] != N * (N + 1) / 2;
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
    if (uvccl_pg_get_failure(&pg, &f) == 1 &&
        f.host_lost == (on_lost_host(R) ? 2 : 1))
      break;
    run_until(&never, 100);
  }
  nf = uvccl_pg_failed_ranks(&pg, failed, N);
  if (!on_lost_host(R)) {
    rep(f.host_lost == 1 && f.host == LOST && nf == 2 &&
            ((failed[0] == 4 && failed[1] == 5) ||
             (failed[0] == 5 && failed[1] == 4)) &&
            strncmp(f.msg, LOST_HEAD, strlen(LOST_HEAD)) == 0,
        "named", "host_lost %d, host %d, %d failed (%d %d): %s", f.host_lost,
        f.host, nf, nf > 0 ? failed[0] : -1, nf > 1 ? failed[1] : -1, f.msg);
  } else {
    rep(f.host_lost == 2 && nf == 4 &&
            strncmp(f.msg, CUT_HEAD, strlen(CUT_HEAD)) == 0,
        "named", "host_lost %d, %d failed: %s", f.host_lost, nf, f.msg);
  }
  /* a later call fails at once, saying the same */
  {
    uvccl_work_t w2 = {0};
    int rc2 = uvccl_allreduce(&pg, &w2, v, v, 16, UVCCL_INT64, UVCCL_SUM,
                              NULL);
    rep(rc2 == UVCCL_EPEER &&
            strstr(w2.msg, on_lost_host(R) ? CUT_HEAD : LOST_HEAD) != NULL,
        "later", "%s: %s", ename(rc2), w2.msg);
  }
  /* the survivors go on without host 2 */
  memset(&w, 0, sizeof(w));
  rc = uvccl_pg_shrink(&pg, &next, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (!on_lost_host(R)) {
    rep(rc == 0 && next.size == N - 2 && w.result == 2, "shrink",
        "%s %s: size %d, %lld removed", ename(rc), w.msg,
        rc == 0 ? next.size : -1, (long long)w.result);
    if (rc == 0) rc = ft_check_shrunk(&next, R);
  } else {
    rep(1, "shrink", "(cut off) %s %s", ename(rc), w.msg);
  }
  if (rc == 0 && next.impl_ != NULL) uvccl_pg_destroy(&next, NULL);
  return rank_destroy();
}

/* ======================================================================== */

static void ip_do(const char *what, const char *const *args) {
  char out[512];
  if (run_ip(args, out, sizeof(out)) != 0) note("%s: ip failed: %s", what, out);
}

/* 6 tests (a), 7 (b) */
static void scenario(const char *name, int link_down) {
  proc_t ps[N];
  static char e_host[N][32];
  double v;
  int r, started = 0;
  for (r = 0; r < N; r++) {
    const char *extra[] = {"UVCCL_HEARTBEAT_TIMEOUT_MS=1000", e_host[r], NULL};
    snprintf(e_host[r], sizeof(e_host[r]), "UVCCL_HOST_ID=h%d", r / 2);
    ns_spawn_rank_in(&ps[r], r, N, r / 2, "host", extra);
  }
  while (!started) {
    int all = 1;
    pump(ps, N, 10);
    for (r = 0; r < N; r++)
      if (!find_val(ps, N, r, "started", &v)) all = 0;
    if (all) started = 1;
    for (r = 0; r < N; r++)
      if (ps[r].exited) break;
    if (r < N) break;
  }
  if (link_down) {
    const char *a[] = {"-n", ns[HOSTS], "link", "set", "pC", "down", NULL};
    ip_do("link down", a);
  } else {
    kill(ps[4].pid, SIGKILL);
    kill(ps[5].pid, SIGKILL);
  }
  finish_all(ps, N, 60);
  scenario_failed = 0;
  ok(started, "%s: 6 ranks on 3 hosts running allreduces", name);
  agg(ps, N, "failed", 0x0f, "%s: the survivors' allreduces fail (EPEER)",
      name);
  agg(ps, N, "named", link_down ? 0x3f : 0x0f,
      link_down ? "%s: the survivors name host 2 lost (ranks 4 and 5), and "
                  "ranks 4 and 5 every other host lost to theirs"
                : "%s: the survivors name host 2 lost (ranks 4 and 5)",
      name);
  agg(ps, N, "later", 0x0f, "%s: ... and so does every later call", name);
  agg(ps, N, "shrink", 0x0f, "%s: the survivors shrink to the other hosts' "
      "4 ranks", name);
  agg(ps, N, "after", 0x0f, "%s: ... and their allreduces are right", name);
  if (link_down)
    ok(ps[4].status == 0 && ps[5].status == 0,
       "%s: the cut-off ranks finish too, no hang (exit %d %d)", name,
       ps[4].status, ps[5].status);
  if (scenario_failed) dump_procs(ps, N);
  procs_free(ps, N);
  if (link_down) {
    const char *a[] = {"-n", ns[HOSTS], "link", "set", "pC", "up", NULL};
    ip_do("link up", a);
  }
}

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
    return role_host();
  }
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  if (ns_prepare(HOSTS, err, sizeof(err)) != 0) skip_all("%s", err);
  sigpipe_default();
  alarm(240);
  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip_all("cannot build the network namespaces: %s", err);
  }
  plan(6 + 7 + 1);
  scenario("a (both ranks killed)", 0);
  scenario("b (its link down)", 1);
  ns_cleanup();
  ok(!ns_leftovers(), "the namespaces are gone after the cleanup");
  return done_testing();
}
