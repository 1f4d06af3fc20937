/* uvccl-trace names the culprit. Worlds of 4 separate processes (env://),
 * UVCCL_TRACE_DIR set; every rank runs 3 good allreduces, then rank 2
 * misbehaves in collective #3 while ranks 0, 1 and 3 run an allreduce of
 * 4 float32 (timeout 1 s):
 *   skip   rank 2 never calls it;
 *   op     rank 2 calls a broadcast;
 *   size   rank 2 allreduces 8 elements;
 *   dtype  rank 2 allreduces int32;
 *   root   all broadcast, rank 2 from root 1, the others from root 0;
 *   none   nobody misbehaves.
 * Every rank then dumps (uvccl_trace_dump) and exits 0: no crash, no hang,
 * whatever the mismatch did to the operation. The parent runs
 * `uvccl-trace --json DIR` and `uvccl-trace DIR` and checks the verdict:
 * culprit rank 2 (exit status 0), the right evidence (stuck in #3 and
 * never entered by rank 2, or a mismatch at #3 with rank 2 alone on its
 * side and both descriptions); for "none", no culprit (exit status 1). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "diag/json.h"
#include "verdict.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


/* ---- rank side -------------------------------------------------------------- */

static int rank_main(void) {
  const char *c = getenv("T_CASE");
  float f[8], out[8];
  int32_t ib[4], iout[4];
  uvccl_work_t w;
  cbres_t cb;
  int i, rc, bad = 0;
  rank_join_and_warm_up(60);
  memset(&w, 0, sizeof(w));
  memset(&cb, 0, sizeof(cb));
  w.data = &cb;
  w.timeout_ms = 1000;
  w.tag = "step 3";
  for (i = 0; i < 8; i++) f[i] = (float)R;
  for (i = 0; i < 4; i++) ib[i] = R;
  rc = -1;
  if (strcmp(c, "skip") == 0 && R == 2) {
    run_until(&cb.done, 1500); /* busy elsewhere */
    rc = 0;
  } else if (strcmp(c, "op") == 0 && R == 2) {
    rc = uvccl_broadcast(&pg, &w, f, 4, UVCCL_FLOAT32, 0, on_work);
  } else if (strcmp(c, "size") == 0 && R == 2) {
    rc = uvccl_allreduce(&pg, &w, f, out, 8, UVCCL_FLOAT32, UVCCL_SUM,
                         on_work);
  } else if (strcmp(c, "dtype") == 0 && R == 2) {
    rc = uvccl_allreduce(&pg, &w, ib, iout, 4, UVCCL_INT32, UVCCL_SUM,
                         on_work);
  } else if (strcmp(c, "root") == 0) {
    rc = uvccl_broadcast(&pg, &w, f, 4, UVCCL_FLOAT32, R == 2 ? 1 : 0,
                         on_work);
  } else {
    rc = uvccl_allreduce(&pg, &w, f, out, 4, UVCCL_FLOAT32, UVCCL_SUM,
                         on_work);
  }
  if (!(strcmp(c, "skip") == 0 && R == 2)) {
    rc = finish_work(&cb, rc, 8000);
    rep(rc != HANG, "ended", "collective #3 ended: %s %s", ename(rc), w.msg);
    val("status", rc);
    if (strcmp(c, "none") == 0) {
      for (i = 0; i < 4; i++) bad += out[i] != 6.0f;
      rep(rc == 0 && bad == 0, "values", "#3: %s, %d wrong", ename(rc), bad);
    }
  }
  rc = uvccl_trace_dump(&loop, NULL, "test end");
  rep(rc == 0, "dumped", "uvccl_trace_dump: %s", ename(rc));
  return rank_destroy();
}

/* ---- parent side -------------------------------------------------------------- */

static void scenario(const char *c, int detail) {
  static char e_case[64], e_dir[320], e_debug[64];
  static const int two[] = {2}, others[] = {0, 1, 3};
  proc_t ps[4];
  char cmd[512], *out = malloc(1 << 20), err[128], lab[64];
  uvccl__json_t *v = NULL;
  const uvccl__json_t *g, *mm, *st;
  int r, okr = 1, rc, good;
  clean_dir();
  snprintf(lab, sizeof(lab), "%s%s", c, detail ? " (fingerprints)" : "");
  snprintf(e_case, sizeof(e_case), "T_CASE=%s", c);
  snprintf(e_dir, sizeof(e_dir), "UVCCL_TRACE_DIR=%s", dir);
  snprintf(e_debug, sizeof(e_debug), "UVCCL_DEBUG=%s", detail ? "detail" : "");
  putenv(e_case);
  putenv(e_dir);
  putenv(e_debug);
  spawn_world(ps, 4, "trace", 0);
  finish_all(ps, 4, 40);
  for (r = 0; r < 4; r++) {
    int okv;
    char det[512];
    find_check(ps, 4, r, "dumped", &okv, det, sizeof(det));
    okr &= ps[r].exited && ps[r].status == 0 && okv == 1;
    find_check(ps, 4, r, "good", &okv, det, sizeof(det));
    okr &= okv == 1;
    if (strcmp(c, "none") == 0) {
      find_check(ps, 4, r, "values", &okv, det, sizeof(det));
      okr &= okv == 1;
    }
  }
  if (!ok(okr, "%s: every rank ran 3 good allreduces, got through #3 "
          "(%s), dumped and exited 0", lab,
          strcmp(c, "none") == 0 ? "with the right sums"
                                 : "an error or not, no crash or hang"))
    dump_procs(ps, 4);
  for (r = 0; r < 4; r++) {
    int okv;
    char det[512];
    find_check(ps, 4, r, "ended", &okv, det, sizeof(det));
    if (okv >= 0 && strcmp(c, "none") != 0) note("%s: rank %d: %s", lab, r, det);
  }
  if (detail && strcmp(c, "none") != 0) {
    /* every member that called #3 fails it, naming both sides */
    int all = 1;
    for (r = 0; r < 4; r++) {
      int okv;
      char det[512];
      double st2 = 0;
      if (strcmp(c, "skip") == 0 && r == 2) continue;
      find_check(ps, 4, r, "ended", &okv, det, sizeof(det));
      if (strcmp(c, "skip") == 0) {
        all &= find_val(ps, 4, r, "status", &st2) &&
               (st2 == UV_ETIMEDOUT || st2 == UVCCL_EPEER);
        /* the ones that timed out wait for a fingerprint */
        if (st2 == UV_ETIMEDOUT)
          all &= strstr(det, "which has not sent its fingerprint") != NULL;
      } else {
        all &= find_val(ps, 4, r, "status", &st2) && st2 == UVCCL_EMISMATCH &&
               strstr(det, "ranks disagree: ") != NULL &&
               strstr(det, r == 2 ? "rank 2 called " : "ranks 0,1,3 called ")
                   != NULL &&
               strstr(det, r == 2 ? "ranks 0,1,3 called " : "rank 2 called ")
                   != NULL;
      }
    }
    ok(all, "%s: %s", lab, strcmp(c, "skip") == 0
       ? "ranks 0, 1, 3 time out waiting for rank 2's fingerprint (or hear "
         "of that timeout)"
       : "every rank fails #3 with UVCCL_EMISMATCH, naming rank 2 against "
         "ranks 0, 1, 3 and both descriptions");
  }
  snprintf(cmd, sizeof(cmd), "%s --json %s", TRACE, dir);
  rc = run_cmd(cmd, out, 1 << 20);
  if (uvccl__json_parse(out, strlen(out), &v, err, sizeof(err)) != 0) {
    diag("uvccl-trace --json said (exit %d): %s: %s", rc, err, out);
    v = NULL;
  }
  g = world_group(v);
  mm = uvccl__json_get(g, "mismatch");
  st = uvccl__json_get(g, "stuck");
  if (strcmp(c, "none") == 0) {
    good = rc == 1 && v != NULL &&
           uvccl__json_len(uvccl__json_get(v, "culprits")) == 0 &&
           mm != NULL && mm->type == UVCCL__J_NULL && st != NULL &&
           st->type == UVCCL__J_NULL &&
           uvccl__json_len(uvccl__json_get(v, "dumps")) == 4;
    ok(good, "%s: 4 dumps, no culprit, nothing stuck, no mismatch, exit "
       "status 1", lab);
  } else if (strcmp(c, "skip") == 0) {
    good = rc == 0 && ranks_are(uvccl__json_get(v, "culprits"), two, 1) &&
           uvccl__json_get_int(st, "seq", -1) == 3 &&
           ranks_are(uvccl__json_get(st, "not_entered"), two, 1) &&
           ranks_are(uvccl__json_get(st, "entered"), others, 3) &&
           strcmp(uvccl__json_get_str(g, "why", ""), "not_entered") == 0 &&
           strcmp(uvccl__json_get_str(uvccl__json_get(st, "called"), "op",
                                      ""), "allreduce") == 0;
    ok(good, "%s: culprit rank 2, which never entered allreduce #3 that "
       "ranks 0, 1, 3 entered; exit status 0", lab);
  } else {
    const uvccl__json_t *a = uvccl__json_get(mm, "a"),
                        *b = uvccl__json_get(mm, "b");
    const uvccl__json_t *ca = uvccl__json_get(a, "called"),
                        *cb2 = uvccl__json_get(b, "called");
    good = rc == 0 && ranks_are(uvccl__json_get(v, "culprits"), two, 1) &&
           uvccl__json_get_int(mm, "seq", -1) == 3 &&
           ranks_are(uvccl__json_get(a, "ranks"), others, 3) &&
           ranks_are(uvccl__json_get(b, "ranks"), two, 1);
    if (strcmp(c, "op") == 0)
      good &= strcmp(uvccl__json_get_str(ca, "op", ""), "allreduce") == 0 &&
              strcmp(uvccl__json_get_str(cb2, "op", ""), "broadcast") == 0;
    else if (strcmp(c, "size") == 0)
      good &= uvccl__json_get_int(ca, "count_in", 0) == 4 &&
              uvccl__json_get_int(cb2, "count_in", 0) == 8;
    else if (strcmp(c, "dtype") == 0)
      good &= strcmp(uvccl__json_get_str(ca, "dtype", ""), "float32") == 0 &&
              strcmp(uvccl__json_get_str(cb2, "dtype", ""), "int32") == 0;
    else if (strcmp(c, "root") == 0)
      good &= uvccl__json_get_int(ca, "root", -1) == 0 &&
              uvccl__json_get_int(cb2, "root", -1) == 1;
    ok(good, "%s: culprit rank 2, alone on its side of the mismatch at #3, "
       "both descriptions right; exit status 0", lab);
  }
  if (!good) diag("exit %d: %s", rc, out);
  /* the text verdict says the same */
  snprintf(cmd, sizeof(cmd), "%s %s", TRACE, dir);
  rc = run_cmd(cmd, out, 1 << 20);
  if (strcmp(c, "none") == 0)
    good = rc == 1 && strstr(out, "verdict: no culprit found") != NULL;
  else
    good = rc == 0 && strstr(out, "verdict: rank 2\n") != NULL &&
           strstr(out, strcmp(c, "skip") == 0 ? "never entered by rank 2"
                                              : "mismatch at collective #3")
               != NULL;
  if (!ok(good, "%s: the text verdict too (exit %d)", lab, rc))
    diag("%s", out);
  else if (!detail && (strcmp(c, "size") == 0 || strcmp(c, "skip") == 0))
    note("%s", out);
  uvccl__json_free(v);
  procs_free(ps, 4);
  free(out);
}

int main(void) {
  static const char *cases[] = {"none", "skip", "op", "size", "dtype",
                                "root"};
  const char *role = getenv("UVCCL_T_ROLE");
  char out[4096];
  size_t i;
  int rc;
  if (role != NULL && *role) return rank_main();
  parent_init(300);
  snprintf(dir, sizeof(dir), "/tmp/uvccl-t4002.XXXXXX");
  if (mkdtemp(dir) == NULL) skip_all("mkdtemp failed");
  plan(6 * 3 * 2 + 5 + 4);
  for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) scenario(cases[i], 0);
  for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) scenario(cases[i], 1);
  /* errors: no dumps, a file that is not a dump, usage */
  clean_dir();
  ok(run_cmd(TRACE " /tmp/uvccl-t4002-none 2>&1", out, sizeof(out)) == 2,
     "a path that does not exist: exit status 2");
  {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", TRACE, dir);
    ok(run_cmd(cmd, out, sizeof(out)) == 2 && strstr(out, "no dumps") != NULL,
       "an empty directory: exit status 2, \"no dumps\": %s", out);
    snprintf(cmd, sizeof(cmd), "echo '{\"format\":\"x\"}' > %s/uvccl-trace.9.1."
             "json && %s %s 2>&1", dir, TRACE, dir);
    ok(run_cmd(cmd, out, sizeof(out)) == 2 &&
           strstr(out, "not a uvccl flight recorder dump") != NULL,
       "a file that is not a dump: exit status 2, says so: %s", out);
    /* a lying dump: sequence numbers 0 and 4e9 and beyond 32 bits; the
     * analyzer looks at the numbers recorded, never at the range between
     * (it used to walk it: billions of steps) */
    clean_dir();
    {
      static const char lie[] =
          "{\"format\":\"uvccl-flight-recorder\",\"version\":1,"
          "\"rank\":0,\"groups\":[{\"id\":1,\"gid\":1,\"name\":\"w\","
          "\"rank\":0,\"size\":2,\"ranks\":[0,1]},{\"id\":2,\"gid\":1,"
          "\"name\":\"w\",\"rank\":1,\"size\":2,\"ranks\":[0,1]}],"
          "\"entries\":[{\"group\":1,\"seq\":0,\"kind\":\"collective\","
          "\"op\":\"allreduce\"},{\"group\":2,\"seq\":4000000000,"
          "\"kind\":\"collective\",\"op\":\"broadcast\"},{\"group\":1,"
          "\"seq\":9000000000000000000,\"kind\":\"collective\","
          "\"op\":\"barrier\"}]}";
      char path[600];
      FILE *f;
      snprintf(path, sizeof(path), "%s/uvccl-trace.0.1.json", dir);
      f = fopen(path, "w");
      if (f != NULL) {
        fputs(lie, f);
        fclose(f);
      }
      snprintf(cmd, sizeof(cmd), "timeout 60 %s %s 2>&1", TRACE, dir);
      rc = run_cmd(cmd, out, sizeof(out));
      ok((rc == 0 || rc == 1) && strstr(out, "verdict:") != NULL,
         "a dump with sequence numbers 0 and 4e9 (and one beyond 32 bits): "
         "a verdict at once (exit %d)", rc);
    }
  }
  clean_dir();
  rmdir(dir);
  return done_testing();
}
