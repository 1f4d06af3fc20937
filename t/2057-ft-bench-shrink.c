/* uvccl-bench --shrink-on-failure, started by uvccl-run --kill (which
 * SIGKILLs a rank at a given moment and lets the others go on):
 *   a) 4 ranks, rank 2 killed 1 s in, while five collective kinds sweep
 *      their sizes: one line "shrunk to 3 ranks after losing rank 2
 *      (exited)" (or "(reset)"), rows of W=4 before it and W=3 after it,
 *      every result checked ("yes"), exit status 0;
 *   b) 5 ranks, rank 0 (which prints the table and hosts the store) killed
 *      first, then rank 3: two shrink lines in order, the new rank 0
 *      (world rank 1) carries the table on, rows of W=3 at the end;
 *   c) without --kill, --keep-going on a healthy world changes nothing:
 *      all 22 rows (allgather, reduce_scatter and alltoall skip 4 B), W=3;
 *   d) --elastic under uvccl-run --respawn, 4 ranks, rank 2 killed: the
 *      others shrink to 3, uvccl-run starts it again, it joins, "grew to 4
 *      ranks (rank 3 joined)", rows of W=4 after, every result checked;
 *   e) the same with rank 0 killed: the store is uvccl-run's, so rank 0 is
 *      replaced like any other;
 *   f) bench/elastic/cycles.c: the last of 4 ranks killed and replaced ten
 *      times in a row, every allreduce checked, descriptors flat.
 * c runs first and times the sweep on this machine: the kills of a and b
 * are placed at fractions of that time, so they land mid-sweep on a slow
 * machine and a fast one alike. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const ops[] = {"allreduce", "broadcast", "allgather",
                                  "reduce_scatter", "alltoall", NULL};

typedef struct {
  int rows, bad_rows, shrinks, w_first, w_last, grows;
  int shrink_w[4], shrink_lost[4], grew_w[4], grew_joined[4];
  int order_ok; /* rows of W=n before the first shrink line, and so on */
} table_t;

/* Reads uvccl-run's prefixed stdout: "[R] row" and "[R] shrunk to ...". */
static void parse(const char *out, int n, table_t *t) {
  const char *b = out;
  int want_w = n;
  memset(t, 0, sizeof(*t));
  t->order_ok = 1;
  t->w_first = -1;
  while (*b) {
    const char *nl = strchr(b, '\n'), *l = b;
    char line[512];
    size_t len = nl ? (size_t)(nl - b) : strlen(b);
    int i, w, lost;
    snprintf(line, sizeof(line), "%.*s", (int)(len < 511 ? len : 511), b);
    b += len + (nl ? 1 : 0);
    if (line[0] == '[') {
      char *e = strchr(line, ']');
      if (e == NULL) continue;
      l = e + 2 <= line + strlen(line) ? e + 2 : e + 1;
    } else {
      l = line;
    }
    if (sscanf(l, "shrunk to %d ranks after losing rank %d", &w, &lost) == 2) {
      if (t->shrinks < 4) {
        t->shrink_w[t->shrinks] = w;
        t->shrink_lost[t->shrinks] = lost;
      }
      t->shrinks++;
      want_w = w;
      if (strstr(l, "(exited)") == NULL && strstr(l, "(reset)") == NULL)
        t->order_ok = 0;
      continue;
    }
    if (sscanf(l, "grew to %d ranks (rank %d joined)", &w, &lost) == 2) {
      if (t->grows < 4) {
        t->grew_w[t->grows] = w;
        t->grew_joined[t->grows] = lost;
      }
      t->grows++;
      want_w = w;
      continue;
    }
    for (i = 0; ops[i]; i++) {
      size_t ol = strlen(ops[i]);
      char ok_col[16];
      unsigned long size;
      if (strncmp(l, ops[i], ol) != 0 || l[ol] != ' ') continue;
      if (sscanf(l + ol, "%d %lu %*d %*f %*f %*f %*f %15s", &w, &size,
                 ok_col) != 3)
        break;
      t->rows++;
      if (strcmp(ok_col, "yes") != 0) t->bad_rows++;
      if (t->w_first < 0) t->w_first = w;
      t->w_last = w;
      if (w != want_w) t->order_ok = 0;
      break;
    }
  }
}

static int elastic; /* run_bench: --respawn and --elastic */

static void run_bench(proc_t *p, int n, const char *kills) {
  static char run[4096], bench[4096], nbuf[16];
  char *argv[32];
  char *k = strdup(kills ? kills : ""), *tok, *save = NULL;
  int a = 0;
  snprintf(run, sizeof(run), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(bench, sizeof(bench), "%s/bin/uvccl-bench", UVCCL_BUILD_DIR);
  snprintf(nbuf, sizeof(nbuf), "%d", n);
  argv[a++] = run;
  argv[a++] = (char *)"-n";
  argv[a++] = nbuf;
  argv[a++] = (char *)"--keep-going";
  if (elastic) argv[a++] = (char *)"--respawn";
  for (tok = strtok_r(k, " ", &save); tok && a < 16;
       tok = strtok_r(NULL, " ", &save)) {
    argv[a++] = (char *)"--kill";
    argv[a++] = tok;
  }
  argv[a++] = bench;
  argv[a++] = (char *)"--op";
  argv[a++] = (char *)"allreduce,broadcast,allgather,reduce_scatter,alltoall";
  argv[a++] = (char *)"-b";
  argv[a++] = (char *)"4";
  argv[a++] = (char *)"-e";
  argv[a++] = (char *)"1M";
  argv[a++] = (char *)"-f";
  argv[a++] = (char *)"16";
  argv[a++] = (char *)"--budget";
  argv[a++] = (char *)"0.15";
  /* the usual warm-up, without the first size's settling time: the kills
   * are placed at fractions of c's sweep */
  argv[a++] = (char *)"-w";
  argv[a++] = (char *)"20";
  argv[a++] = (char *)"--heartbeat";
  argv[a++] = (char *)"3";
  argv[a++] = (char *)(elastic ? "--elastic" : "--shrink-on-failure");
  argv[a] = NULL;
  if (spawn(p, "uvccl-run", argv, NULL, 0) != 0)
    printf("# cannot start %s\n", run);
  finish_all(p, 1, 90);
  free(k);
}

static void show(proc_t *p) { dump_procs(p, 1); }

static void test_one_kill(double sweep_s) {
  proc_t p;
  table_t t;
  char k[64];
  snprintf(k, sizeof(k), "2@%.3f", 0.4 * sweep_s);
  run_bench(&p, 4, k);
  parse(p.obuf, 4, &t);
  is_int(p.status, 0, "a: rank 2 killed: uvccl-run exits 0");
  ok(strstr(p.ebuf, "killing rank 2 (--kill)") != NULL,
     "a: uvccl-run says it killed rank 2");
  ok(t.shrinks == 1 && t.shrink_w[0] == 3 && t.shrink_lost[0] == 2,
     "a: one line 'shrunk to 3 ranks after losing rank 2' (%d shrinks)",
     t.shrinks);
  ok(t.rows >= 20 && t.bad_rows == 0,
     "a: every result checked: %d rows, %d not 'yes'", t.rows, t.bad_rows);
  ok(t.order_ok && t.w_first == 4 && t.w_last == 3,
     "a: rows of W=4 before the shrink line, W=3 after it (cause exited or "
     "reset)");
  if (p.status != 0 || t.shrinks != 1 || t.bad_rows || !t.order_ok) show(&p);
  procs_free(&p, 1);
}

static void test_two_kills(double sweep_s) {
  proc_t p;
  table_t t;
  char k[64];
  /* rank 0 must have printed its first row (W=5) before it goes: the
   * sweep of c is W=3's, shorter than this one (W=5, 4, then 3) */
  snprintf(k, sizeof(k), "0@%.3f 3@%.3f", 0.45 * sweep_s, 0.8 * sweep_s);
  run_bench(&p, 5, k);
  parse(p.obuf, 5, &t);
  is_int(p.status, 0, "b: ranks 0 and 3 killed: uvccl-run exits 0");
  ok(t.shrinks == 2 && t.shrink_w[0] == 4 && t.shrink_lost[0] == 0 &&
         t.shrink_w[1] == 3 && t.shrink_lost[1] == 3,
     "b: 'shrunk to 4 ... rank 0', then 'shrunk to 3 ... rank 3' (%d "
     "shrinks)", t.shrinks);
  ok(strstr(p.obuf, "[1] shrunk to 4 ranks") != NULL,
     "b: world rank 1, the new rank 0, carries the table on");
  /* On a loaded machine both kills may land before the first row of W=5
   * (5 ranks on few CPUs): the rows then start at W=3; the order is what
   * matters (rows of W=n only between the shrink lines that say n). */
  ok(t.rows >= 20 && t.bad_rows == 0 && t.order_ok && t.w_first >= 3 &&
         t.w_first <= 5 && t.w_last == 3,
     "b: %d rows, %d not 'yes', W from 5 down to 3 in order (first W=%d)",
     t.rows, t.bad_rows, t.w_first);
  if (p.status != 0 || t.shrinks != 2 || t.bad_rows || !t.order_ok ||
      t.rows < 20 || t.w_last != 3)
    show(&p);
  procs_free(&p, 1);
}

/* --elastic under uvccl-run --respawn: the killed rank comes back. */
static void test_elastic(double sweep_s, int victim, const char *what) {
  proc_t p;
  table_t t;
  char k[64], line[64];
  elastic = 1;
  snprintf(k, sizeof(k), "%d@%.3f", victim, 0.45 * sweep_s);
  run_bench(&p, 4, k);
  elastic = 0;
  parse(p.obuf, 4, &t);
  ok(p.status == 0 && strstr(p.ebuf, "respawning it (1 of 3)") != NULL,
     "%s: rank %d killed and respawned: uvccl-run exits 0 (%d)", what,
     victim, p.status);
  ok(t.shrinks == 1 && t.shrink_w[0] == 3 && t.shrink_lost[0] == victim &&
         t.grows == 1 && t.grew_w[0] == 4 && t.grew_joined[0] == 3,
     "%s: 'shrunk to 3 ranks after losing rank %d', then 'grew to 4 ranks "
     "(rank 3 joined)' (%d shrinks, %d grows)", what, victim, t.shrinks,
     t.grows);
  snprintf(line, sizeof(line), "[%d] grew to 4 ranks", victim == 0 ? 1 : 0);
  ok(strstr(p.obuf, line) != NULL, "%s: world rank %d, rank 0 of the new "
     "world, says so", what, victim == 0 ? 1 : 0);
  ok(t.rows >= 20 && t.bad_rows == 0 && t.order_ok && t.w_first == 4 &&
         t.w_last == 4,
     "%s: %d rows, %d not 'yes', W=4 before and after (last W=%d)", what,
     t.rows, t.bad_rows, t.w_last);
  if (p.status != 0 || t.shrinks != 1 || t.grows != 1 || t.bad_rows ||
      !t.order_ok || t.rows < 20 || t.w_last != 4)
    show(&p);
  procs_free(&p, 1);
}

/* The descriptor count of rank 0's line "cycle N: world of 4, ..., D open
 * descriptors" that starts at l (-1: none). */
static int fds_of(const char *l) {
  const char *end = l ? strstr(l, " open descriptors") : NULL, *p = end;
  const char *nl = l ? strchr(l, '\n') : NULL;
  if (end == NULL || (nl != NULL && nl < end)) return -1;
  while (p > l && p[-1] >= '0' && p[-1] <= '9') p--;
  return p < end ? atoi(p) : -1;
}

/* bench/elastic/cycles.c under uvccl-run --respawn=10: the last of 4 ranks
 * killed ten times in a row, each time the others shrink and grow back
 * with its replacement, every allreduce checked. */
static void test_cycles(void) {
  static char run[4096], cyc[4096];
  char *argv[] = {run, (char *)"-n", (char *)"4", (char *)"--respawn=10",
                  cyc, (char *)"--cycles", (char *)"10", NULL};
  proc_t p;
  int fds1 = -1, fds10 = -1;
  snprintf(run, sizeof(run), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(cyc, sizeof(cyc), "%s/bench/uvccl-elastic-cycles",
           UVCCL_BUILD_DIR);
  if (access(cyc, X_OK) != 0) {
    skip(2, "%s not built", cyc);
    return;
  }
  if (spawn(&p, "uvccl-run", argv, NULL, 0) != 0)
    printf("# cannot start %s\n", run);
  finish_all(&p, 1, 120);
  ok(p.status == 0 &&
         strstr(p.obuf, "10 cycles: death to a grown world") != NULL &&
         strstr(p.obuf, "every result right") != NULL &&
         strstr(p.ebuf, "respawning it (10 of 10)") != NULL,
     "f: the last rank killed ten times in a row, replaced each time, every "
     "allreduce right (exit %d)", p.status);
  fds1 = fds_of(strstr(p.obuf, "cycle 1: world of 4"));
  fds10 = fds_of(strstr(p.obuf, "cycle 10: world of 4"));
  ok(fds1 > 0 && fds10 > 0 && fds10 <= fds1 + 4,
     "f: rank 0's open descriptors stay flat (%d after cycle 1, %d after "
     "cycle 10)", fds1, fds10);
  if (p.status != 0 || fds10 <= 0) show(&p);
  procs_free(&p, 1);
}

/* Returns how long the sweep took. */
static double test_no_kill(void) {
  proc_t p;
  table_t t;
  double t0 = now_s(), secs;
  run_bench(&p, 3, NULL);
  secs = now_s() - t0;
  parse(p.obuf, 3, &t);
  ok(p.status == 0 && t.shrinks == 0 && t.rows == 22 && t.bad_rows == 0 &&
         t.w_first == 3 && t.w_last == 3,
     "c: no failure: exit %d, %d shrinks, %d rows of W=3, %d not 'yes'",
     p.status, t.shrinks, t.rows, t.bad_rows);
  if (p.status != 0 || t.rows != 22) show(&p);
  procs_free(&p, 1);
  note("the sweep took %.2f s", secs);
  return secs;
}

int main(void) {
  char path[4096];
  double sweep;
  tap_alarm(300);
  snprintf(path, sizeof(path), "%s/bin/uvccl-bench", UVCCL_BUILD_DIR);
  if (access(path, X_OK) != 0) skip_all("%s not built", path);
  atexit(kill_live);
  plan(1 + 5 + 4 + 4 + 4 + 2);
  sweep = test_no_kill();
  test_one_kill(sweep);
  test_two_kills(sweep);
  test_elastic(sweep, 2, "d: --elastic");
  test_elastic(sweep, 0, "e: --elastic, rank 0");
  test_cycles();
  return done_testing();
}
