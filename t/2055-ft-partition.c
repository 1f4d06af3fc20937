/* A partition: 4 ranks in network namespaces on a bridge (t/netns.h),
 * heartbeat timeout 1 s, operation timeout 30 s, every rank running
 * allreduces; then rank 2 is cut off
 *   a) by its link going down (its port on the bridge), or
 *   b) by its packets being dropped both ways (blackhole routes: no reset,
 *      no error, just silence),
 * and the survivors must fail within a few heartbeat timeouts naming rank
 * 2, shrink to the other 3 and go on with right results; rank 2 itself
 * must fail too (never hang), whatever it names. Needs root and iproute2;
 * skips otherwise. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#define MAXP 4
#include "ranks.h"
#include "ft.h"
#include "netns.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 4

static int role_part(void) {
  int64_t v[16];
  int iter = 0, rc = 0, i, bad = 0;
  uvccl_work_t w = {0};
  uvccl_pg_t next;
  double t_fail;
  rank_init(30000);
  for (iter = 0; iter < 100000; iter++) {
    cbres_t c = {0};
    for (i = 0; i < 16; i++) v[i] = R + 1;
    memset(&w, 0, sizeof(w));
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, v, v, 16, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 60000);
    if (rc != 0) break;
    for (i = 0; i < 16; i++) bad += v[i] != 10;
    if (iter == 2) val("started", 1);
    sleep_ms(2);
  }
  t_fail = now_s();
  printf("@val %d fail_t %.6f\n", R, t_fail);
  rep(rc < 0 && bad == 0, "failed", "after %d: %s %s", iter, ename(rc), w.msg);
  /* the survivors go on without rank 2 */
  memset(&w, 0, sizeof(w));
  rc = uvccl_pg_shrink(&pg, &next, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (R != 2) {
    rep(rc == 0 && next.size == 3, "shrink", "%s %s: size %d", ename(rc),
        w.msg, rc == 0 ? next.size : -1);
    if (rc == 0) rc = ft_check_shrunk(&next, R);
  } else {
    rep(1, "shrink", "(the cut-off rank) %s %s", ename(rc), w.msg);
  }
  if (rc == 0 && next.impl_ != NULL) uvccl_pg_destroy(&next, NULL);
  return rank_destroy();
}

/* ======================================================================== */

static void ip_do(const char *what, const char *const *args) {
  char out[512];
  if (run_ip(args, out, sizeof(out)) != 0) note("%s: ip failed: %s", what, out);
}

static void blackhole(int add) {
  int r, q;
  for (r = 0; r < N; r++)
    for (q = 0; q < N; q++) {
      char dst[32];
      if (q == r || (r != 2 && q != 2)) continue;
      snprintf(dst, sizeof(dst), NET_PREFIX "%d/32", q + 1);
      {
        const char *a[] = {"-n", ns[r], "route", add ? "add" : "del",
                           "blackhole", dst, NULL};
        ip_do("blackhole", a);
      }
    }
}

static void scenario(const char *name, int drops) {
  proc_t ps[N];
  const char *extra[] = {"UVCCL_HEARTBEAT_TIMEOUT_MS=1000", NULL};
  double t_cut = 0, v, worst = 0;
  int r, started = 0, named = 1, okv;
  char det[512];
  for (r = 0; r < N; r++) ns_spawn_rank(&ps[r], r, "part", extra);
  while (!started && now_s() > 0) {
    int all = 1;
    pump(ps, N, 10);
    for (r = 0; r < N; r++)
      if (!find_val(ps, N, r, "started", &v)) all = 0;
    if (all) started = 1;
    for (r = 0; r < N; r++)
      if (ps[r].exited) break;
    if (r < N) break;
  }
  t_cut = now_s();
  if (drops) {
    blackhole(1);
  } else {
    const char *a[] = {"-n", ns[N], "link", "set", "pC", "down", NULL};
    ip_do("link down", a);
  }
  finish_all(ps, N, 60);
  for (r = 0; r < N; r++) {
    if (r == 2) continue;
    find_check(ps, N, r, "failed", &okv, det, sizeof(det));
    if (okv != 1 || strstr(det, "rank 2 (global 2") == NULL) {
      diag("rank %d: %s", r, det);
      named = 0;
    }
    if (find_val(ps, N, r, "fail_t", &v) && v - t_cut > worst)
      worst = v - t_cut;
  }
  ok(started && named, "%s: ranks 0, 1, 3 fail naming rank 2", name);
  note("%s: the last survivor knew %.2f s after the cut", name, worst);
  ok(started && worst > 0 && worst < 6.0,
     "%s: ... within a few heartbeat timeouts (1 s), not the 30 s operation "
     "timeout", name);
  find_check(ps, N, 2, "failed", &okv, det, sizeof(det));
  ok(okv == 1, "%s: rank 2 fails too, no hang: %s", name, det);
  scenario_failed = 0;
  agg(ps, N, "shrink", 0xb, "%s: the survivors shrink to 3", name);
  agg(ps, N, "after", 0xb, "%s: ... and their allreduces are right", name);
  ok(ps[0].status == 0 && ps[1].status == 0 && ps[3].status == 0 &&
         ps[2].status == 0,
     "%s: every rank exits 0 (%d %d %d %d)", name, ps[0].status,
     ps[1].status, ps[2].status, ps[3].status);
  if (!named || scenario_failed) dump_procs(ps, N);
  procs_free(ps, N);
  if (drops) {
    blackhole(0);
  } else {
    const char *a[] = {"-n", ns[N], "link", "set", "pC", "up", NULL};
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
    return role_part();
  }
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary (/proc/self/exe)");
  self[l] = '\0';
  if (ns_prepare(N, err, sizeof(err)) != 0) skip_all("%s", err);
  sigpipe_default();
  alarm(240);
  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip_all("cannot build the network namespaces: %s", err);
  }
  plan(6 * 2 + 1);
  scenario("a (link down)", 0);
  scenario("b (packets dropped)", 1);
  ns_cleanup();
  ok(!ns_leftovers(), "the namespaces are gone after the cleanup");
  return done_testing();
}
