/* Dumps everywhere, through the world's store. Worlds of 4 separate
 * processes (env://); every rank runs 3 good allreduces, then:
 *   a) --live: ranks 0, 1 and 3 enter allreduce #3 (timeout 60 s) while
 *      rank 2 is busy elsewhere (its loop runs; it has not called it):
 *      a hung job. `uvccl-trace --live 127.0.0.1:PORT --json` asks it,
 *      through its store, to dump now, collects the 4 dumps through the
 *      store and names rank 2 (never entered #3; the others, dumped on
 *      their loops, wait for it); --out wrote the dumps. The job was not
 *      harmed: rank 2 then calls #3 and every rank gets the right sums.
 *   b) a timeout dumps everywhere: ranks 0, 1 and 3 time out in #3
 *      (1 s) with UVCCL_TRACE_DIR set; rank 2, which never called it and
 *      never dumps by itself, writes its dump there too, its reason
 *      saying it was asked through the store because of the timeout,
 *      and destroys its group at once (nothing the watcher read may be
 *      left: a sanitizer run reports a leak); uvccl-trace on the
 *      directory names rank 2;
 *   c) SIGUSR2: `uvccl-run -n 2 uvccl-bench` gets SIGUSR2 mid-run; it
 *      passes it on, both ranks dump to UVCCL_TRACE_DIR (reason "signal
 *      12") and the run still finishes, exit 0. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "diag/json.h"
#include "verdict.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RUN UVCCL_BUILD_DIR "/bin/uvccl-run"
#define BENCH UVCCL_BUILD_DIR "/bin/uvccl-bench"

/* This rank's dump is in UVCCL_TRACE_DIR (renamed into place). */
static int own_dump_written(void) {
  const char *d = getenv("UVCCL_TRACE_DIR");
  char prefix[32];
  DIR *dd = d != NULL ? opendir(d) : NULL;
  struct dirent *de;
  int n = 0;
  if (dd == NULL) return 0;
  snprintf(prefix, sizeof(prefix), "uvccl-trace.%d.", R);
  while ((de = readdir(dd)) != NULL)
    n += strncmp(de->d_name, prefix, strlen(prefix)) == 0 &&
         strstr(de->d_name, ".tmp") == NULL;
  closedir(dd);
  return n > 0;
}

static int rank_main(void) {
  const char *c = getenv("T_CASE");
  float f[4], out[4];
  uvccl_work_t w;
  cbres_t cb;
  int i, rc, bad = 0;
  rank_join_and_warm_up(90);
  memset(&w, 0, sizeof(w));
  memset(&cb, 0, sizeof(cb));
  w.data = &cb;
  w.timeout_ms = strcmp(c, "live") == 0 ? 60000 : 1000;
  for (i = 0; i < 4; i++) f[i] = (float)R;
  if (R == 2) {
    rep(1, "entered", "busy elsewhere");
    if (strcmp(c, "live") == 0) {
      wait_stdin_eof(60000); /* until the parent has its verdict */
    } else {
      /* never calls #3, never dumps by itself; destroys its group as soon
       * as its dump (asked through the store) is written, before its
       * watcher polls again: what the watcher read must not be left
       * behind (a sanitizer run reports a leak otherwise) */
      int t, never = 0;
      for (t = 0; t < 400 && !own_dump_written(); t++) run_until(&never, 10);
      return rank_destroy();
    }
  }
  rc = uvccl_allreduce(&pg, &w, f, out, 4, UVCCL_FLOAT32, UVCCL_SUM, on_work);
  if (R != 2) rep(rc == 0, "entered", "allreduce #3 started: %s", ename(rc));
  rc = finish_work(&cb, rc, 70000);
  if (strcmp(c, "live") == 0) {
    for (i = 0; i < 4; i++) bad += out[i] != 6.0f;
    rep(rc == 0 && bad == 0, "after", "#3 once rank 2 joined: %s %s, %d "
        "wrong", ename(rc), w.msg, bad);
  } else {
    /* its own timeout, or a peer's, heard first */
    rep(rc == UV_ETIMEDOUT ||
            (rc == UVCCL_EPEER && strstr(w.msg, "timed out") != NULL),
        "after", "#3: %s %s", ename(rc), w.msg);
    {
      /* stay a while: the store lives on rank 0, and the others' requests
       * must reach rank 2 through it */
      int never = 0;
      run_until(&never, 2500);
    }
  }
  return rank_destroy();
}

static int count_files(const char *suffix) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  if (d == NULL) return 0;
  while ((de = readdir(d)) != NULL)
    if (strncmp(de->d_name, "uvccl-trace.", 12) == 0 &&
        strstr(de->d_name, suffix) != NULL && strstr(de->d_name, ".tmp") == NULL)
      n++;
  closedir(d);
  return n;
}

static int all_reported(proc_t *ps, const char *name) {
  int r, okv, n = 0;
  char det[256];
  for (r = 0; r < 4; r++) {
    find_check(ps, 4, r, name, &okv, det, sizeof(det));
    n += okv == 1;
  }
  return n == 4;
}

static void live_scenario(void) {
  static char e_case[64], e_dir[320], e_poll[64];
  static const int two[] = {2}, others[] = {0, 1, 3};
  proc_t ps[4];
  char cmd[768], *out = malloc(1 << 20), err[128];
  uvccl__json_t *v = NULL;
  const uvccl__json_t *g, *st, *ws;
  double t0;
  int rc, good, r, waits = 0;
  size_t i;
  clean_dir();
  snprintf(e_case, sizeof(e_case), "T_CASE=live");
  snprintf(e_dir, sizeof(e_dir), "UVCCL_TRACE_DIR=");
  snprintf(e_poll, sizeof(e_poll), "UVCCL_TRACE_POLL_MS=200");
  putenv(e_case);
  putenv(e_dir);
  putenv(e_poll);
  spawn_world(ps, 4, "live", 1u << 2);
  t0 = now_s();
  while (!all_reported(ps, "entered") && now_s() - t0 < 30) pump(ps, 4, 20);
  ok(all_reported(ps, "entered"), "a: ranks 0, 1, 3 are in allreduce #3, "
     "rank 2 is busy elsewhere: the job hangs");
  sleep_ms(200);
  pump(ps, 4, 0);
  snprintf(cmd, sizeof(cmd), "%s --live 127.0.0.1:%d --timeout 10 --out %s "
           "--json", TRACE, world_port, dir);
  t0 = now_s();
  rc = run_cmd(cmd, out, 1 << 20);
  note("a: uvccl-trace --live took %.2f s", now_s() - t0);
  if (uvccl__json_parse(out, strlen(out), &v, err, sizeof(err)) != 0) {
    diag("uvccl-trace --live said (exit %d): %s: %s", rc, err, out);
    v = NULL;
  }
  g = world_group(v);
  st = uvccl__json_get(g, "stuck");
  ws = uvccl__json_get(st, "waiting");
  for (i = 0; i < uvccl__json_len(ws); i++)
    waits += uvccl__json_len(uvccl__json_get(uvccl__json_at(ws, i), "for")) > 0;
  good = rc == 0 && uvccl__json_len(uvccl__json_get(v, "dumps")) == 4 &&
         ranks_are(uvccl__json_get(v, "culprits"), two, 1) &&
         uvccl__json_get_int(st, "seq", -1) == 3 &&
         ranks_are(uvccl__json_get(st, "not_entered"), two, 1) &&
         ranks_are(uvccl__json_get(st, "entered"), others, 3) &&
         uvccl__json_len(ws) == 3 && waits == 3;
  if (!ok(good, "a: --live collected 4 dumps through the store and names "
          "rank 2, never in #3; ranks 0, 1, 3 are waiting and say for whom "
          "(exit 0)"))
    diag("exit %d: %s", rc, out);
  ok(count_files(".live.json") == 4, "a: --out wrote the 4 dumps");
  for (r = 0; r < 4; r++) ok(!ps[r].exited, "a: rank %d still runs", r);
  /* let rank 2 go on: the job finishes */
  close(ps[2].in);
  ps[2].in = -1;
  finish_all(ps, 4, 60);
  for (r = 0, good = 1; r < 4; r++) {
    int okv;
    char det[512];
    find_check(ps, 4, r, "after", &okv, det, sizeof(det));
    good &= okv == 1 && ps[r].exited && ps[r].status == 0;
  }
  if (!ok(good, "a: then rank 2 joins: every rank gets the right sums of #3 "
          "and exits 0"))
    dump_procs(ps, 4);
  uvccl__json_free(v);
  procs_free(ps, 4);
  free(out);
}

static void everywhere(void) {
  static char e_case[64], e_dir[320], e_poll[64];
  static const int two[] = {2};
  proc_t ps[4];
  char cmd[768], *out = malloc(1 << 20), path[600], err[128];
  uvccl__json_t *v = NULL;
  DIR *d;
  struct dirent *de;
  int rc, good, r, found2 = 0;
  clean_dir();
  snprintf(e_case, sizeof(e_case), "T_CASE=timeout");
  snprintf(e_dir, sizeof(e_dir), "UVCCL_TRACE_DIR=%s", dir);
  snprintf(e_poll, sizeof(e_poll), "UVCCL_TRACE_POLL_MS=200");
  putenv(e_case);
  putenv(e_dir);
  putenv(e_poll);
  spawn_world(ps, 4, "live", 0);
  finish_all(ps, 4, 60);
  for (r = 0, good = 1; r < 4; r++) {
    int okv;
    char det[512];
    find_check(ps, 4, r, r == 2 ? "entered" : "after", &okv, det, sizeof(det));
    good &= okv == 1 && ps[r].exited && ps[r].status == 0;
  }
  if (!ok(good, "b: ranks 0, 1, 3 time out in #3 (or hear of it); every "
          "rank exits 0"))
    dump_procs(ps, 4);
  d = opendir(dir);
  while (d != NULL && (de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "uvccl-trace.2.", 14) != 0 ||
        strstr(de->d_name, ".tmp") != NULL)
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    {
      FILE *f = fopen(path, "rb");
      size_t n = f ? fread(out, 1, (1 << 20) - 1, f) : 0;
      uvccl__json_t *j = NULL;
      if (f) fclose(f);
      out[n] = '\0';
      if (uvccl__json_parse(out, n, &j, err, sizeof(err)) == 0) {
        const char *why = uvccl__json_get_str(j, "reason", "");
        found2 = strstr(why, "requested through the store") != NULL &&
                 strstr(why, "timed out") != NULL;
        if (!found2) diag("rank 2's reason: %s", why);
      }
      uvccl__json_free(j);
    }
  }
  if (d) closedir(d);
  ok(found2, "b: rank 2, which never timed out or dumped by itself, dumped "
     "too: asked through the store because of the timeout");
  snprintf(cmd, sizeof(cmd), "%s --json %s", TRACE, dir);
  rc = run_cmd(cmd, out, 1 << 20);
  if (uvccl__json_parse(out, strlen(out), &v, err, sizeof(err)) != 0) v = NULL;
  good = rc == 0 && uvccl__json_len(uvccl__json_get(v, "dumps")) == 4 &&
         ranks_are(uvccl__json_get(v, "culprits"), two, 1);
  if (!ok(good, "b: uvccl-trace on the directory: 4 dumps, culprit rank 2"))
    diag("exit %d: %s", rc, out);
  uvccl__json_free(v);
  procs_free(ps, 4);
  free(out);
}

static void usr2(void) {
  static char e_dir[320];
  proc_t p;
  char *argv[] = {RUN, "-n", "2", BENCH, "--op", "allreduce", "-b", "4",
                  "-e", "4", "-n", "600000", NULL};
  const char *env[] = {e_dir, NULL};
  DIR *d;
  struct dirent *de;
  char path[600], buf[65536];
  int n = 0, reasons = 0;
  double t0;
  clean_dir();
  snprintf(e_dir, sizeof(e_dir), "UVCCL_TRACE_DIR=%s", dir);
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "c: spawning uvccl-run");
    return;
  }
  /* once the ranks run their sweep (the table's header is out) */
  t0 = now_s();
  while (strstr(p.obuf, "op ") == NULL && now_s() - t0 < 20 && !p.exited)
    pump(&p, 1, 50);
  /* (600,000 small allreduces take 0.7 s or more: still running) */
  sleep_ms(100);
  kill(p.pid, SIGUSR2);
  finish_all(&p, 1, 60);
  d = opendir(dir);
  while (d != NULL && (de = readdir(d)) != NULL) {
    FILE *f;
    size_t len;
    if (strncmp(de->d_name, "uvccl-trace.", 12) != 0 ||
        strstr(de->d_name, ".tmp") != NULL)
      continue;
    n++;
    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
    f = fopen(path, "rb");
    len = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) fclose(f);
    buf[len] = '\0';
    reasons += strstr(buf, "\"reason\":\"signal 12\"") != NULL;
  }
  if (d) closedir(d);
  if (!ok(p.exited && p.status == 0 && n == 2 && reasons == 2,
          "c: SIGUSR2 to uvccl-run: both uvccl-bench ranks dumped (reason "
          "\"signal 12\"), and the run finished, exit 0 (%d dumps, exit %d)",
          n, p.status))
    dump_procs(&p, 1);
  procs_free(&p, 1);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && *role) return rank_main();
  parent_init(300);
  snprintf(dir, sizeof(dir), "/tmp/uvccl-t4003.XXXXXX");
  if (mkdtemp(dir) == NULL) skip_all("mkdtemp failed");
  plan(12);
  live_scenario();
  everywhere();
  usr2();
  clean_dir();
  rmdir(dir);
  return done_testing();
}
