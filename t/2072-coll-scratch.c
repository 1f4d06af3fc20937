/* A collective's large scratch buffer is kept for the next one (the net's
 * spare, $UVCCL_SCRATCH_KEEP_MS) instead of being mapped, faulted in and
 * unmapped each time. In-process worlds of 3 ranks (t/world.h), over
 * shared memory and over TCP:
 *   a) reduce_scatter of 72 MiB (int32 sums: its scratch is the whole
 *      input, more than a schedule keeps for itself; the ring writes a
 *      third of it on each rank), 4 rounds with new inputs each: exact
 *      every round, whatever the scratch held before; round 1 faults in
 *      the scratch's 72 MiB (3 x 24), rounds 2-4 under a tenth of that;
 *   b) the same with UVCCL_SCRATCH_KEEP_MS=0: exact, and every round
 *      faults the scratch in anew (what a) would see without the spare);
 *   c) reduce of 48 MiB to rank 0 (the others' scratch), twice: exact;
 *   d) UVCCL_SCRATCH_KEEP_MS=300: once the loop has run a second past it
 *      without a collective, the spares are unmapped (the resident set
 *      drops by at least nine tenths of the scratch the reduce_scatter
 *      wrote);
 *   e) the same for a scratch of 24 MiB, which schedules used to keep
 *      for as long as the group lived;
 *   f) two reduce_scatters of 36 MiB in flight together, 3 rounds: both
 *      exact, and rounds 2-3 fault in under a tenth of the scratch they
 *      write (each takes a spare of its own);
 *   g) allreduce_coalesced of two 12 MiB buffers, 3 rounds: exact, and
 *      rounds 2-3 fault in under a tenth of its flat buffer's pages. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define PER ((size_t)6 << 20) /* int32 elements a rank gets: 24 MiB */
#define P 3
#define TOTAL (PER * P)
/* what the ranks' rings write of their scratch: a third each */
#define SCRATCH_PAGES (TOTAL * sizeof(int32_t) / 4096)
#define SCRATCH_MIB ((int)(TOTAL * sizeof(int32_t) >> 20))

static uv_loop_t L;
static int32_t *in[P], *out[P];

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static long resident_mib(void) {
  long size = 0, res = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return -1;
  if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
  fclose(f);
  return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024) / 1024;
}

static int32_t value(int r, size_t k, int round) {
  return (int32_t)((k * 7 + (size_t)r * 13 + (size_t)round * 101) % 100003);
}

static void fill(int round) {
  int r;
  size_t k;
  for (r = 0; r < P; r++)
    for (k = 0; k < TOTAL; k++) in[r][k] = value(r, k, round);
}

/* Elements wrong in the blocks of a reduce_scatter of per elements a
 * rank whose inputs began at element base of in[] (out[] at obase). */
static size_t rs_wrong_at(int round, size_t per, size_t base, size_t obase) {
  size_t k, bad = 0;
  int r, q;
  for (r = 0; r < P; r++)
    for (k = 0; k < per; k++) {
      size_t at = base + (size_t)r * per + k;
      int32_t want = 0;
      for (q = 0; q < P; q++) want += value(q, at, round);
      if (out[r][obase + k] != want) bad++;
    }
  return bad;
}

static size_t rs_wrong(int round) { return rs_wrong_at(round, PER, 0, 0); }

static int rs_post(world_t *W, uvccl_work_t *w, size_t per, size_t base,
                   size_t obase) {
  int r, rc;
  for (r = 0; r < P; r++) {
    rc = uvccl_reduce_scatter(&W->pg[r], &w[r], in[r] + base,
                              out[r] + obase, per, UVCCL_INT32, UVCCL_SUM,
                              NULL);
    if (rc != 0) return rc;
  }
  return 0;
}

static int reduce_scatter_of(world_t *W, size_t per) {
  int rc = rs_post(W, W->w, per, 0, 0);
  return rc != 0 ? rc : world_wait(W);
}

static int reduce_scatter(world_t *W) { return reduce_scatter_of(W, PER); }

static int reduce(world_t *W) {
  int r, rc;
  for (r = 0; r < P; r++) {
    rc = uvccl_reduce(&W->pg[r], &W->w[r], in[r], out[r], TOTAL / 2,
                      UVCCL_INT32, UVCCL_SUM, 0, NULL);
    if (rc != 0) return rc;
  }
  return world_wait(W);
}

static int world(world_t *W, const char *transport, const char *keep) {
  if (strcmp(transport, "tcp") == 0) setenv("UVCCL_TRANSPORT", "tcp", 1);
  else unsetenv("UVCCL_TRANSPORT");
  if (keep != NULL) setenv("UVCCL_SCRATCH_KEEP_MS", keep, 1);
  else unsetenv("UVCCL_SCRATCH_KEEP_MS");
  uv_loop_init(&L);
  return world_init(W, &L, P, NULL);
}

static void world_end(world_t *W, const char *what) {
  world_destroy(W);
  is_int(uv_loop_close(&L), 0, "%s: the loop closes cleanly", what);
  unsetenv("UVCCL_TRANSPORT");
  unsetenv("UVCCL_SCRATCH_KEEP_MS");
}

/* a (keep NULL: the default) and b (keep "0") */
static void scenario_rounds(const char *transport, const char *keep) {
  world_t W;
  const char *sc = keep == NULL ? "a" : "b";
  long f0, first = 0, most = 0, least = -1;
  int round;
  if (!is_int(world(&W, transport, keep), 0, "%s: a world of 3 over %s", sc,
              transport))
    return;
  for (round = 1; round <= 4; round++) {
    int rc, r;
    long f;
    fill(round);
    for (r = 0; r < P; r++) memset(out[r], 0xff, PER * sizeof(int32_t));
    f0 = minflt();
    rc = reduce_scatter(&W);
    f = minflt() - f0;
    if (!is_int(rc, 0, "%s: round %d over %s: reduce_scatter completes", sc,
                round, transport))
      break;
    is_int((int)rs_wrong(round), 0,
           "%s: round %d over %s: every element of both ranks' blocks exact",
           sc, round, transport);
    if (round == 1) {
      first = f;
      continue;
    }
    if (f > most) most = f;
    if (least < 0 || f < least) least = f;
  }
  ok(first >= (long)SCRATCH_PAGES,
     "%s: over %s, round 1 faulted in %ld pages (the scratch written: %zu)",
     sc, transport, first, (size_t)SCRATCH_PAGES);
  if (keep == NULL)
    ok(most < (long)SCRATCH_PAGES / 10,
       "a: over %s, rounds 2-4 faulted in at most %ld pages", transport,
       most);
  else
    ok(least >= (long)SCRATCH_PAGES,
       "b: over %s, kept for 0 ms: each of rounds 2-4 faulted in %ld pages "
       "or more", transport, least);
  world_end(&W, sc);
}

static void scenario_reduce(const char *transport) {
  world_t W;
  int round;
  if (!is_int(world(&W, transport, NULL), 0, "c: a world of 3 over %s",
              transport))
    return;
  for (round = 1; round <= 2; round++) {
    size_t k, bad = 0;
    fill(round + 10);
    memset(out[0], 0xff, TOTAL / 2 * sizeof(int32_t));
    if (!is_int(reduce(&W), 0, "c: round %d over %s: reduce completes", round,
                transport))
      break;
    for (k = 0; k < TOTAL / 2; k++)
      if (out[0][k] != value(0, k, round + 10) + value(1, k, round + 10) +
                           value(2, k, round + 10))
        bad++;
    is_int((int)bad, 0, "c: round %d over %s: rank 0's sum exact", round,
           transport);
  }
  world_end(&W, "c");
}

static void on_idle_timer(uv_timer_t *t) { (void)t; }

/* d (per PER: more scratch than a schedule used to keep for itself) and
 * e (per PER / 3: less, which a schedule used to keep for good) */
static void scenario_release(const char *sc, size_t per) {
  world_t W;
  uv_timer_t tick;
  long before, after, f;
  int mib = (int)((size_t)P * per * sizeof(int32_t) >> 20);
  uint64_t t0;
  if (!is_int(world(&W, "shm", "300"), 0, "%s: a world of 3, kept 300 ms",
              sc))
    return;
  fill(5);
  f = minflt();
  if (!is_int(reduce_scatter_of(&W, per), 0, "%s: reduce_scatter of %d MiB "
              "completes", sc, mib))
    return;
  f = (minflt() - f) * (sysconf(_SC_PAGESIZE) / 1024) / 1024;
  is_int((int)rs_wrong_at(5, per, 0, 0), 0, "%s: exact", sc);
  before = resident_mib();
  uv_timer_init(&L, &tick);
  uv_timer_start(&tick, on_idle_timer, 20, 20);
  t0 = uv_now(&L);
  while (uv_now(&L) - t0 < 1300) uv_run(&L, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&L, UV_RUN_NOWAIT);
  after = resident_mib();
  ok(f >= mib && before - after >= mib * 9 / 10,
     "%s: 1.3 s without a collective: resident %ld MiB -> %ld MiB (the "
     "reduce_scatter faulted in %ld MiB, the scratch it wrote %d MiB)", sc,
     before, after, f, mib);
  world_end(&W, sc);
}

/* f: two reduce_scatters in flight together, each with its own scratch */
static void scenario_together(void) {
  world_t W;
  uvccl_work_t w2[P];
  size_t per = PER / 2;
  long most = 0;
  int round, r;
  memset(w2, 0, sizeof(w2));
  if (!is_int(world(&W, "shm", NULL), 0, "f: a world of 3"))
    return;
  for (round = 1; round <= 3; round++) {
    long f = minflt();
    int rc;
    fill(round + 20);
    rc = rs_post(&W, W.w, per, 0, 0);
    if (rc == 0) rc = rs_post(&W, w2, per, TOTAL / 2, per);
    if (rc == 0) rc = world_wait(&W);
    for (r = 0; rc == 0 && r < P; r++) {
      while (!uvccl_work_done(&w2[r])) uv_run(&L, UV_RUN_ONCE);
      rc = w2[r].status;
    }
    f = minflt() - f;
    if (!is_int(rc, 0, "f: round %d: both complete", round)) break;
    is_int((int)(rs_wrong_at(round + 20, per, 0, 0) +
                 rs_wrong_at(round + 20, per, TOTAL / 2, per)),
           0, "f: round %d: both exact", round);
    if (round > 1 && f > most) most = f;
  }
  ok(most < (long)SCRATCH_PAGES / 10,
     "f: rounds 2-3 faulted in at most %ld pages (their scratch written: "
     "%zu)", most, (size_t)SCRATCH_PAGES);
  world_end(&W, "f");
}

/* g: allreduce_coalesced of two buffers of 12 MiB (its flat buffer of
 * 24 MiB from the spares too) */
static void scenario_coalesced(void) {
  world_t W;
  size_t half = (size_t)3 << 20, k; /* int32 elements */
  long most = 0;
  int round, r, q;
  if (!is_int(world(&W, "shm", NULL), 0, "g: a world of 3")) return;
  for (round = 1; round <= 3; round++) {
    size_t bad = 0;
    long f;
    int rc = 0;
    fill(round + 30);
    f = minflt();
    for (r = 0; rc == 0 && r < P; r++) {
      uvccl_buf_t b[2] = {{in[r], half * sizeof(int32_t)},
                          {in[r] + half, half * sizeof(int32_t)}};
      rc = uvccl_allreduce_coalesced(&W.pg[r], &W.w[r], b, 2, UVCCL_INT32,
                                     UVCCL_SUM, NULL);
    }
    if (rc == 0) rc = world_wait(&W);
    f = minflt() - f;
    if (!is_int(rc, 0, "g: round %d: completes", round)) break;
    for (r = 0; r < P; r++)
      for (k = 0; k < 2 * half; k++) {
        int32_t want = 0;
        for (q = 0; q < P; q++) want += value(q, k, round + 30);
        if (in[r][k] != want) bad++;
      }
    is_int((int)bad, 0, "g: round %d: every element of every rank exact",
           round);
    if (round > 1 && f > most) most = f;
  }
  ok(most < (long)(P * 2 * half * sizeof(int32_t) / 4096 / 10),
     "g: rounds 2-3 faulted in at most %ld pages (the flat buffers: %zu)",
     most, (size_t)(P * 2 * half * sizeof(int32_t) / 4096));
  world_end(&W, "g");
}

int main(void) {
  static const char *const transports[2] = {"shm", "tcp"};
  int t, r;
  tap_alarm(600);
  for (r = 0; r < P; r++) {
    in[r] = malloc(TOTAL * sizeof(int32_t));
    out[r] = malloc(TOTAL / 2 * sizeof(int32_t));
    if (in[r] == NULL || out[r] == NULL) {
      printf("1..0 # SKIP no memory for the buffers\n");
      return 0;
    }
    memset(out[r], 0, TOTAL / 2 * sizeof(int32_t));
  }
  for (t = 0; t < 2; t++) {
    scenario_rounds(transports[t], NULL);
    scenario_rounds(transports[t], "0");
    scenario_reduce(transports[t]);
  }
  scenario_release("d", PER);
  scenario_release("e", PER / 3);
  scenario_together();
  scenario_coalesced();
  for (r = 0; r < P; r++) {
    free(in[r]);
    free(out[r]);
  }
  return done_testing();
}
