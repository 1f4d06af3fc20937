/* The flight recorder on NCCL groups, against the fake CUDA runtime and
 * the fake NCCL (t/fake/): three ranks in this process (devices 0..2).
 *   a) allreduce, broadcast (root 1) and a send/recv: every rank's record
 *      of the world (backend "nccl", the prefix as its name, gid 1, ranks)
 *      and its entries: sequence numbers (collectives and point-to-point
 *      apart), op, dtype, reduce op, counts, root, peer, the caller's tag,
 *      completed with times; last completed numbers;
 *   b) a subgroup of ranks 0 and 2 (new_group "pair"): its own record, the
 *      same gid on both, its ranks;
 *   c) a hang: ranks 0 and 2 enter an allreduce rank 1 never calls; while
 *      it waits the dump says started (issued on the GPU thread), then
 *      timed_out with ETIMEDOUT; uvccl-trace on that dump names rank 1,
 *      which never entered it;
 *   d) fingerprint checks (the fingerprint_check option) on another world:
 *      a good allreduce passes; when rank 2 allreduces 8 elements and the
 *      others 4, all three fail with UVCCL_EMISMATCH naming both sides,
 *      and the next good allreduce works (the communicator is intact). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"
#include "diag/json.h"
#include "dump.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define FAKE_NCCL UVCCL_BUILD_DIR "/fake/libnccl.so.2"
#define TRACE UVCCL_BUILD_DIR "/bin/uvccl-trace"
#define N 3

static uv_loop_t *loop;
static uvccl_store_t store;
static uvccl_pg_t pgs[N], sub[N], fpg[N];

static uvccl__json_t *dump_now(void) {
  char *text = NULL, err[128];
  size_t len = 0;
  uvccl__json_t *j = NULL;
  if (uvccl_trace_json(loop, "test", &text, &len) != 0) return NULL;
  if (uvccl__json_parse(text, len, &j, err, sizeof(err)) != 0) {
    diag("parse: %s", err);
    j = NULL;
  }
  free(text);
  return j;
}

static int wait_all(uvccl_work_t *w, int n, int want) {
  int r, good = 1, rc;
  for (r = 0; r < n; r++) {
    rc = uvccl_work_wait(&w[r]);
    if (rc != want) {
      note("rank %d: %s %s", r, uvccl_err_name(rc), w[r].msg);
      good = 0;
    }
  }
  return good;
}

static int closed;
static void on_closed(uvccl_pg_t *g) {
  (void)g;
  closed++;
}

int main(void) {
  uvccl_work_t w[N];
  void *a[N], *b[N];
  uvccl__json_t *d;
  int r, good;
  tap_alarm(120);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("UVCCL_NCCL", FAKE_NCCL, 1);
  setenv("FAKE_CUDA_DEVICES", "3", 1);
  setenv("UVCCL_NCCL_WATCHDOG_MS", "20", 1);
  if (access(FAKE_NCCL, R_OK) != 0) skip_all("no fake NCCL built");
  loop = uv_default_loop();
  plan(15);
  uvccl_hash_store_init(loop, &store);
  good = nccl_ranks_start(loop, &store, pgs, w, N, "ncclfr", NULL) &&
         wait_all(w, N, 0);
  if (!ok(good, "3 NCCL ranks (fakes)")) return done_testing();
  for (r = 0; r < N; r++) {
    a[r] = dev_on(r, 64);
    b[r] = dev_on(r, 64);
  }

  /* ---- a) ---- */
  memset(w, 0, sizeof(w));
  for (r = 0; r < N; r++) {
    w[r].tag = r == 0 ? "step-a" : NULL;
    uvccl_allreduce(&pgs[r], &w[r], a[r], b[r], 4, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  }
  good = wait_all(w, N, 0);
  for (r = 0; r < N; r++) {
    w[r].tag = NULL;
    uvccl_broadcast(&pgs[r], &w[r], a[r], 8, UVCCL_FLOAT32, 1, NULL);
  }
  good &= wait_all(w, N, 0);
  uvccl_send(&pgs[0], &w[0], a[0], 16, 1, 0, NULL);
  uvccl_recv(&pgs[1], &w[1], b[1], 16, 0, 0, NULL);
  good &= wait_all(w, 2, 0);
  ok(good, "a: allreduce, broadcast, send/recv ran");
  d = dump_now();
  {
    int recs = 1, ents = 1;
    for (r = 0; r < N; r++) {
      const uvccl__json_t *g = find_group(d, "ncclfr", r), *rk, *e;
      rk = uvccl__json_get(g, "ranks");
      recs &= g != NULL && str_is(g, "backend", "nccl") &&
              uvccl__json_get_int(g, "gid", 0) == 1 &&
              uvccl__json_get_int(g, "size", 0) == N &&
              uvccl__json_len(rk) == N &&
              uvccl__json_int(uvccl__json_at(rk, 2), -1) == 2 &&
              str_is(g, "state", "ok") &&
              uvccl__json_get_int(uvccl__json_get(uvccl__json_get(g, "last"),
                                                  "collective"),
                                  "completed", -1) == 1;
      e = find_entry(d, g, "collective", 0);
      ents &= str_is(e, "op", "allreduce") && str_is(e, "dtype", "int32") &&
              str_is(e, "redop", "sum") &&
              uvccl__json_get_int(e, "count_in", 0) == 4 &&
              uvccl__json_get_int(e, "count_out", 0) == 4 &&
              str_is(e, "state", "completed") &&
              uvccl__json_get_int(e, "ended_ns", 0) >=
                  uvccl__json_get_int(e, "started_ns", -1) &&
              uvccl__json_get_int(e, "started_ns", 0) >=
                  uvccl__json_get_int(e, "queued_ns", -1) &&
              str_is(e, "tag", r == 0 ? "step-a" : NULL);
      e = find_entry(d, g, "collective", 1);
      ents &= str_is(e, "op", "broadcast") && str_is(e, "dtype", "float32") &&
              uvccl__json_get_int(e, "root", -1) == 1 &&
              uvccl__json_get_int(e, "count_in", 0) == 8 &&
              str_is(e, "state", "completed");
    }
    ok(recs, "a: each rank's record of the world: nccl, \"ncclfr\", gid 1, "
       "ranks 0..2, ok, last completed collective #1");
    ok(ents, "a: #0 allreduce int32 sum 4 -> 4 (rank 0's tag \"step-a\"), "
       "#1 broadcast float32 root 1 count 8, both completed, times in order");
    {
      const uvccl__json_t *s0 =
          find_entry(d, find_group(d, "ncclfr", 0), "p2p", 0);
      const uvccl__json_t *s1 =
          find_entry(d, find_group(d, "ncclfr", 1), "p2p", 0);
      ok(str_is(s0, "op", "send") && uvccl__json_get_int(s0, "peer", -1) == 1 &&
             uvccl__json_get_int(s0, "count_in", 0) == 16 &&
             str_is(s1, "op", "recv") &&
             uvccl__json_get_int(s1, "peer", -1) == 0 &&
             str_is(s1, "state", "completed") &&
             find_entry(d, find_group(d, "ncclfr", 2), "p2p", 0) == NULL,
         "a: point-to-point counted apart: p2p #0 send to 1 (16 B) on rank 0, "
         "recv from 0 on rank 1, none on rank 2");
    }
  }
  uvccl__json_free(d);

  /* ---- b) ---- */
  {
    static const int members[] = {0, 2};
    int rc0 = 0;
    for (r = 0; r < N; r++) {
      int rc = uvccl_pg_new_group(&pgs[r], &sub[r], members, 2, "pair");
      if (r == 1 ? rc != UVCCL_ENOTMEMBER : rc != 0) rc0 = 1;
    }
    memset(w, 0, sizeof(w));
    uvccl_allreduce(&sub[0], &w[0], a[0], b[0], 2, UVCCL_FLOAT32, UVCCL_MAX,
                    NULL);
    uvccl_allreduce(&sub[2], &w[2], a[2], b[2], 2, UVCCL_FLOAT32, UVCCL_MAX,
                    NULL);
    good = rc0 == 0 && uvccl_work_wait(&w[0]) == 0 &&
           uvccl_work_wait(&w[2]) == 0;
    d = dump_now();
    {
      const uvccl__json_t *g0 = find_group(d, "pair", 0),
                          *g1 = find_group(d, "pair", 1);
      const uvccl__json_t *e = find_entry(d, g0, "collective", 0);
      const uvccl__json_t *rk = uvccl__json_get(g1, "ranks");
      ok(good && g0 != NULL && g1 != NULL &&
             uvccl__json_get_int(g0, "gid", 0) ==
                 uvccl__json_get_int(g1, "gid", -1) &&
             uvccl__json_get_int(g0, "gid", 1) != 1 &&
             uvccl__json_int(uvccl__json_at(rk, 0), -1) == 0 &&
             uvccl__json_int(uvccl__json_at(rk, 1), -1) == 2 &&
             str_is(e, "op", "allreduce") && str_is(e, "redop", "max"),
         "b: new_group \"pair\" of ranks 0 and 2: its own record on both, "
         "the same gid (not the world's), ranks [0,2], its allreduce max");
    }
    uvccl__json_free(d);
    closed = 0;
    uvccl_pg_destroy(&sub[0], on_closed);
    uvccl_pg_destroy(&sub[2], on_closed);
    while (closed < 2) uv_run(loop, UV_RUN_ONCE);
  }

  /* ---- d) ---- */
  {
    uvccl_pg_options_t o;
    int32_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[4];
    int all = 1;
    memset(&o, 0, sizeof(o));
    o.fingerprint_check = 1;
    good = nccl_ranks_start(loop, &store, fpg, w, N, "ncclfp", &o) &&
           wait_all(w, N, 0);
    for (r = 0; r < N; r++) put(a[r], h, sizeof(h));
    memset(w, 0, sizeof(w));
    for (r = 0; r < N; r++)
      uvccl_allreduce(&fpg[r], &w[r], a[r], b[r], 4, UVCCL_INT32, UVCCL_SUM,
                      NULL);
    good &= wait_all(w, N, 0);
    get(got, b[1], sizeof(got));
    ok(good && got[0] == 3 && got[3] == 12, "d: with fingerprint checks a "
       "good allreduce passes, sums right (%d %d)", (int)got[0], (int)got[3]);
    memset(w, 0, sizeof(w));
    for (r = 0; r < N; r++)
      uvccl_allreduce(&fpg[r], &w[r], a[r], b[r], r == 2 ? 8 : 4,
                      UVCCL_INT32, UVCCL_SUM, NULL);
    for (r = 0; r < N; r++) {
      int rc = uvccl_work_wait(&w[r]);
      int named = strstr(w[r].msg, "ranks disagree") != NULL &&
                  strstr(w[r].msg, r == 2 ? "rank 2 called allreduce int32 "
                                            "sum, 8 -> 8"
                                          : "ranks 0,1 called allreduce int32 "
                                            "sum, 4 -> 4") != NULL;
      if (rc != UVCCL_EMISMATCH || !named) {
        note("rank %d: %s %s", r, uvccl_err_name(rc), w[r].msg);
        all = 0;
      }
    }
    ok(all, "d: rank 2 allreduces 8 elements, the others 4: all three fail "
       "with UVCCL_EMISMATCH, naming both sides: %s", w[0].msg);
    memset(w, 0, sizeof(w));
    for (r = 0; r < N; r++)
      uvccl_allreduce(&fpg[r], &w[r], a[r], b[r], 4, UVCCL_INT32, UVCCL_SUM,
                      NULL);
    ok(wait_all(w, N, 0), "d: the next good allreduce works");
    closed = 0;
    for (r = 0; r < N; r++) uvccl_pg_destroy(&fpg[r], on_closed);
    while (closed < N) uv_run(loop, UV_RUN_ONCE);
  }

  /* ---- c) ---- */
  {
    char dir[] = "/tmp/uvccl-t4004.XXXXXX", path[300], cmd[700], out[8192];
    const uvccl__json_t *e0, *e2;
    FILE *f;
    int rc;
    memset(w, 0, sizeof(w));
    w[0].timeout_ms = w[2].timeout_ms = 400;
    uvccl_allreduce(&pgs[0], &w[0], a[0], b[0], 4, UVCCL_INT32, UVCCL_SUM,
                    NULL);
    uvccl_allreduce(&pgs[2], &w[2], a[2], b[2], 4, UVCCL_INT32, UVCCL_SUM,
                    NULL);
    run_loop_for(loop, 100);
    d = dump_now();
    e0 = find_entry(d, find_group(d, "ncclfr", 0), "collective", 2);
    e2 = find_entry(d, find_group(d, "ncclfr", 2), "collective", 2);
    ok(str_is(e0, "state", "started") && str_is(e2, "state", "started") &&
           str_is(e0, "ended_ns", NULL) &&
           find_entry(d, find_group(d, "ncclfr", 1), "collective", 2) == NULL,
       "c: ranks 0 and 2 are in allreduce #2 (started: issued on the GPU "
       "thread), rank 1 has no #2");
    uvccl__json_free(d);
    rc = uvccl_work_wait(&w[0]);
    ok(rc == UV_ETIMEDOUT && uvccl_work_wait(&w[2]) == UV_ETIMEDOUT,
       "c: both time out: %s", w[0].msg);
    d = dump_now();
    e0 = find_entry(d, find_group(d, "ncclfr", 0), "collective", 2);
    ok(str_is(e0, "state", "timed_out") && str_is(e0, "error", "ETIMEDOUT"),
       "c: then the entry says timed_out, ETIMEDOUT");
    uvccl__json_free(d);
    if (mkdtemp(dir) == NULL) skip_all("mkdtemp failed");
    snprintf(path, sizeof(path), "%s/uvccl-trace.0.%d.json", dir, getpid());
    is_int(uvccl_trace_dump(loop, path, "test"), 0, "c: uvccl_trace_dump");
    snprintf(cmd, sizeof(cmd), "%s --json %s", TRACE, dir);
    f = popen(cmd, "r");
    out[0] = '\0';
    if (f != NULL) {
      size_t n = fread(out, 1, sizeof(out) - 1, f);
      out[n] = '\0';
      rc = pclose(f);
    } else {
      rc = -1;
    }
    {
      uvccl__json_t *v = NULL;
      char err[128];
      const uvccl__json_t *gs, *g = NULL, *st;
      size_t i;
      if (uvccl__json_parse(out, strlen(out), &v, err, sizeof(err)) != 0)
        v = NULL;
      gs = uvccl__json_get(v, "groups");
      for (i = 0; i < uvccl__json_len(gs); i++)
        if (str_is(uvccl__json_at(gs, i), "name", "ncclfr"))
          g = uvccl__json_at(gs, i);
      st = uvccl__json_get(g, "stuck");
      if (!ok(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 &&
                  uvccl__json_get_int(st, "seq", -1) == 2 &&
                  uvccl__json_len(uvccl__json_get(st, "not_entered")) == 1 &&
                  uvccl__json_int(uvccl__json_at(
                                      uvccl__json_get(st, "not_entered"), 0),
                                  -1) == 1 &&
                  uvccl__json_len(uvccl__json_get(g, "culprits")) == 1 &&
                  uvccl__json_int(
                      uvccl__json_at(uvccl__json_get(g, "culprits"), 0),
                      -1) == 1,
              "c: uvccl-trace on the dump: the NCCL world is stuck in #2, "
              "which rank 1 never entered: culprit rank 1"))
        diag("%s", out);
      uvccl__json_free(v);
    }
    unlink(path);
    rmdir(dir);
  }
  closed = 0;
  for (r = 0; r < N; r++) uvccl_pg_destroy(&pgs[r], on_closed);
  while (closed < N) uv_run(loop, UV_RUN_ONCE);
  for (r = 0; r < N; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  ok(1, "every group destroyed");
  return done_testing();
}
