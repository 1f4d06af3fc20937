/* Liveness: worlds of 4 processes (env://) with a short heartbeat timeout
 * (UVCCL_HEARTBEAT_TIMEOUT_MS) and a long operation timeout (30 s), so
 * only the heartbeat can explain a quick error:
 *   a) rank 2 SIGSTOPped during allreduces, for good: every survivor fails
 *      within a few heartbeat timeouts, naming rank 2 and the heartbeat;
 *      continued afterwards, rank 2 learns it was declared failed;
 *   b) rank 2 stopped for 0.7 of the timeout, then continued: no
 *      error, every result right;
 *   c) rank 1's application computes (its loop blocked) for 2.5 heartbeat
 *      timeouts between collectives, again and again: never declared
 *      failed, every result right;
 *   d) the world idle (no operation in flight) when rank 2 stops: every
 *      survivor's group reports the failure by itself, and the next call
 *      fails at once naming rank 2. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double mono_s(void) { return now_s(); }

static int role_ft(void) {
  int rc;
  rank_init(30000);
  rc = ft_rank();
  printf("@val %d end %.6f\n", R, mono_s());
  if (rc != 0) {
    /* A rank that was cut off says so; the others name rank 2. */
    uvccl_pg_failure_t f;
    uvccl_pg_get_failure(&pg, &f);
    printf("@val %d cause %d\n", R, (int)f.cause);
  }
  return rank_destroy();
}

/* d) nothing in flight: wait (running the loop) until the group reports
 * a failure or 20 s pass, then try an operation. */
static int role_idle(void) {
  uvccl_pg_failure_t f;
  double t0;
  int g = 0;
  rank_init(30000);
  val("started", 1);
  t0 = now_s();
  while (now_s() - t0 < 20) {
    uv_run(&loop, UV_RUN_NOWAIT);
    g = uvccl_pg_get_failure(&pg, &f);
    if (g == 1) break;
    sleep_ms(5);
  }
  printf("@val %d end %.6f\n", R, mono_s());
  rep(g == 1 && f.global_rank == 2 && f.cause == UVCCL_FAIL_HEARTBEAT,
      "idle_failure", "get_failure %d: global %d cause %s: %s", g,
      f.global_rank, uvccl_fail_cause_name(f.cause), f.msg);
  {
    float x = 1, y = 0;
    uvccl_work_t w = {0};
    int rc = uvccl_allreduce(&pg, &w, &x, &y, 1, UVCCL_FLOAT32, UVCCL_SUM,
                             NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    rep(rc == UVCCL_EPEER && strstr(w.msg, "rank 2 (global 2") != NULL &&
            strstr(w.msg, "no heartbeat") != NULL,
        "later", "%s: %s", ename(rc), w.msg);
  }
  return rank_destroy();
}

static int rank_main(const char *role) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(90);
  unsetenv("UVCCL_SOCKET_IFNAME");
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  if (strcmp(role, "idle") == 0) return role_idle();
  return role_ft();
}

/* ======================================================================== */

static void set_env(const char *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_env(const char *k, const char *fmt, ...) {
  char v[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof(v), fmt, ap);
  va_end(ap);
  setenv(k, v, 1);
}

static int wait_started(proc_t *ps, int n, int who) {
  double t0 = now_s(), v;
  while (now_s() - t0 < 30 && !ps[who].exited) {
    pump(ps, n, 10);
    if (find_val(ps, n, who, "started", &v)) return 1;
  }
  return 0;
}

static int all_ok(proc_t *ps, int n, unsigned mask, const char *name) {
  int r, okv, all = 1;
  char det[512];
  for (r = 0; r < n; r++) {
    if (!(mask & (1u << r))) continue;
    find_check(ps, n, r, name, &okv, det, sizeof(det));
    if (okv != 1) {
      diag("rank %d %s: %s", r, name, okv < 0 ? "no report" : det);
      all = 0;
    }
  }
  return all;
}

/* Did any rank report NAME (pass or fail)? */
static int any_check(proc_t *ps, int n, const char *name) {
  int r, okv;
  char det[512];
  for (r = 0; r < n; r++) {
    find_check(ps, n, r, name, &okv, det, sizeof(det));
    if (okv >= 0) {
      diag("rank %d %s: %s", r, name, det);
      return 1;
    }
  }
  return 0;
}

#define HB_MS 1000

static void scenario_stop_forever(void) {
  proc_t ps[4];
  double t_stop = 0, v, worst = 0;
  int r, named = 1, started;
  char det[512];
  set_env("UVCCL_HEARTBEAT_TIMEOUT_MS", "%d", HB_MS);
  set_env("T_OP", "allreduce");
  set_env("T_SIZE", "65536");
  set_env("T_START", "2");
  set_env("T_ITERS", "0");
  spawn_world(ps, 4, "ft", 0);
  started = wait_started(ps, 4, 2);
  if (started) {
    sleep_ms(50);
    t_stop = now_s();
    kill(ps[2].pid, SIGSTOP);
    if (getenv("T_DEBUG")) {
      char path[64], st[256] = "";
      FILE *f;
      sleep_ms(100);
      snprintf(path, sizeof(path), "/proc/%d/stat", (int)ps[2].pid);
      f = fopen(path, "r");
      if (f) { if (!fgets(st, sizeof(st), f)) st[0] = 0; fclose(f); }
      note("stopped at %.6f: %.60s", t_stop, st);

    }
  }
  /* Survivors: wait for them (they fail, destroy, exit). */
  while (now_s() - t_stop < 40) {
    pump(ps, 4, 20);
    if (ps[0].exited && ps[1].exited && ps[3].exited) break;
  }
  kill(ps[2].pid, SIGCONT);
  if (getenv("T_DEBUG")) note("continued at %.6f", now_s());
  finish_all(ps, 4, 40);
  for (r = 0; r < 4; r++) {
    int okv;
    if (r == 2) continue;
    find_check(ps, 4, r, "failed", &okv, det, sizeof(det));
    if (okv != 1 || strstr(det, "rank 2 (global 2,") == NULL ||
        strstr(det, "no heartbeat") == NULL) {
      named = 0;
      diag("rank %d: %s", r, det);
    }
    if (find_val(ps, 4, r, "end", &v) && v - t_stop > worst) worst = v - t_stop;
    if (!find_val(ps, 4, r, "cause", &v) || v != UVCCL_FAIL_HEARTBEAT)
      named = 0;
  }
  ok(started && named, "a: rank 2 stopped: ranks 0, 1, 3 fail naming rank 2 "
     "and its heartbeat (cause heartbeat)");
  note("a: slowest survivor failed %.2f s after the stop (heartbeat timeout "
       "%.1f s, operation timeout 30 s)", worst, HB_MS / 1000.0);
  ok(started && worst > 0 && worst < 5.0 * HB_MS / 1000.0,
     "a: every survivor knew within 5 heartbeat timeouts (not the 30 s "
     "operation timeout)");
  ok(all_ok(ps, 4, 0xb, "destroy") && ps[0].status == 0 &&
         ps[1].status == 0 && ps[3].status == 0,
     "a: survivors destroy cleanly and exit 0");
  {
    int okv;
    find_check(ps, 4, 2, "failed", &okv, det, sizeof(det));
    if (!ok(okv == 1 && strstr(det, "declared failed") != NULL,
            "a: rank 2, continued, learns it was declared failed"))
      named = 0;
  }
  if (!named) dump_procs(ps, 4);
  procs_free(ps, 4);
}

static void scenario_stop_briefly(void) {
  proc_t ps[4];
  int started;
  set_env("UVCCL_HEARTBEAT_TIMEOUT_MS", "%d", 2 * HB_MS);
  set_env("T_OP", "allreduce");
  set_env("T_SIZE", "65536");
  set_env("T_START", "2");
  set_env("T_ITERS", "400");
  spawn_world(ps, 4, "ft", 0);
  started = wait_started(ps, 4, 2);
  if (started) {
    kill(ps[2].pid, SIGSTOP);
    sleep_ms(2 * HB_MS * 7 / 10);
    kill(ps[2].pid, SIGCONT);
  }
  finish_all(ps, 4, 60);
  ok(started && all_ok(ps, 4, 0xf, "ops") && !any_check(ps, 4, "failed"),
     "b: rank 2 stopped for 0.7 of the timeout, then continued: 400 "
     "allreduces everywhere, all right, no error");
  ok(all_ok(ps, 4, 0xf, "destroy") && ps[0].status == 0 && ps[1].status == 0 &&
         ps[2].status == 0 && ps[3].status == 0,
     "b: every rank destroys cleanly and exits 0");
  procs_free(ps, 4);
}

static void scenario_busy(void) {
  proc_t ps[4];
  set_env("UVCCL_HEARTBEAT_TIMEOUT_MS", "%d", HB_MS);
  set_env("T_OP", "allreduce");
  set_env("T_SIZE", "4096");
  set_env("T_START", "-1");
  set_env("T_ITERS", "12");
  set_env("T_BUSY_MS", "%d", 5 * HB_MS / 2);
  set_env("T_BUSY_RANKS", "1");
  set_env("T_BUSY_EVERY", "4");
  spawn_world(ps, 4, "ft", 0);
  finish_all(ps, 4, 60);
  unsetenv("T_BUSY_MS");
  ok(all_ok(ps, 4, 0xf, "ops") && !any_check(ps, 4, "failed"),
     "c: rank 1 blocks its loop for 2.5 heartbeat timeouts between "
     "collectives (3 times): never declared failed, every result right");
  ok(all_ok(ps, 4, 0xf, "destroy") && ps[0].status == 0 && ps[1].status == 0 &&
         ps[2].status == 0 && ps[3].status == 0,
     "c: every rank destroys cleanly and exits 0");
  procs_free(ps, 4);
}

static void scenario_idle(void) {
  proc_t ps[4];
  double t_stop = 0, v, worst = 0;
  int r, started;
  set_env("UVCCL_HEARTBEAT_TIMEOUT_MS", "%d", HB_MS);
  spawn_world(ps, 4, "idle", 0);
  started = wait_started(ps, 4, 2);
  if (started) {
    sleep_ms(100);
    t_stop = now_s();
    kill(ps[2].pid, SIGSTOP);
  }
  while (now_s() - t_stop < 40) {
    pump(ps, 4, 20);
    if (ps[0].exited && ps[1].exited && ps[3].exited) break;
  }
  kill(ps[2].pid, SIGKILL);
  kill(ps[2].pid, SIGCONT);
  finish_all(ps, 4, 30);
  for (r = 0; r < 4; r++)
    if (r != 2 && find_val(ps, 4, r, "end", &v) && v - t_stop > worst)
      worst = v - t_stop;
  ok(started && all_ok(ps, 4, 0xb, "idle_failure"),
     "d: idle world, rank 2 stopped: every survivor's group reports it "
     "(global rank 2, cause heartbeat)");
  note("d: slowest survivor knew %.2f s after the stop", worst);
  ok(all_ok(ps, 4, 0xb, "later"),
     "d: the next allreduce fails at once, naming rank 2's heartbeat");
  ok(all_ok(ps, 4, 0xb, "destroy") && ps[0].status == 0 &&
         ps[1].status == 0 && ps[3].status == 0,
     "d: survivors destroy cleanly and exit 0");
  if (!all_ok(ps, 4, 0xb, "idle_failure")) dump_procs(ps, 4);
  procs_free(ps, 4);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && *role) return rank_main(role);
  parent_init(600);
  sigpipe_default();
  plan(4 + 2 + 2 + 3);
  scenario_stop_forever();
  scenario_stop_briefly();
  scenario_busy();
  scenario_idle();
  return done_testing();
}
