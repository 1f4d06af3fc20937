/* bench/chaos: the uvccl rank of the chaos benchmark (bench/chaos/run.sh).
 *
 * Runs collectives in a loop (the same pseudo-random sequence of kinds and
 * sizes on every rank, every result checked), until one fails; then
 * reports when and why, shrinks to the survivors and runs 20 more, checked
 * too. The driver (chaos.py) injects the failure and reads these lines:
 *   @ready RANK PID              after the warm-up
 *   @bad RANK ITER OP            a wrong result (must never appear)
 *   @err RANK T CULPRIT CAUSE | MESSAGE   T: CLOCK_MONOTONIC seconds
 *   @after RANK SIZE OK BAD      the shrunk group: its size, checked runs
 * Its world comes from env:// (RANK, WORLD_SIZE, MASTER_ADDR, ...).
 * Options: --timeout S (operation timeout), --heartbeat S. */
#define _GNU_SOURCE
#include "uvccl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXN ((size_t)1 << 18) /* floats per rank */

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The i-th operation: kind (allreduce, broadcast, allgather, alltoall,
 * reduce_scatter, barrier) and element count, the same everywhere. */
static void pick(unsigned i, int *kind, size_t *n) {
  uint64_t x = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  *kind = (int)(x % 6);
  *n = (size_t)1 << ((x >> 8) % 19); /* 1 .. 256 Ki floats */
}

static float *sb, *rb;

/* Op i on pg (its own ranks and size): 0 or the error; *bad counts wrong
 * values. The values depend on the rank's global rank (the same before
 * and after a shrink) and on i. */
static int run_one(uvccl_pg_t *pg, unsigned i, int *bad, uvccl_work_t *w) {
  int kind, P = pg->size, me = pg->rank, rc, q;
  size_t n, k;
  float want;
  pick(i, &kind, &n);
  if (kind == 3 || kind == 4) n = n / (size_t)P ? n / (size_t)P : 1;
  memset(w, 0, sizeof(*w));
  switch (kind) {
  case 0:
    for (k = 0; k < n; k++) sb[k] = (float)(uvccl_pg_global_rank(pg, me) + 1);
    rc = uvccl_allreduce(pg, w, sb, rb, n, UVCCL_FLOAT32, UVCCL_SUM, NULL);
    break;
  case 1:
    for (k = 0; k < n; k++) rb[k] = me == (int)(i % (unsigned)P) ? (float)i : -1;
    rc = uvccl_broadcast(pg, w, rb, n, UVCCL_FLOAT32, (int)(i % (unsigned)P),
                         NULL);
    break;
  case 2:
    for (k = 0; k < n; k++) sb[k] = (float)(me * 3 + (int)(i % 5));
    rc = uvccl_allgather(pg, w, sb, rb, n, UVCCL_FLOAT32, NULL);
    break;
  case 3:
    for (k = 0; k < n * (size_t)P; k++)
      sb[k] = (float)(me * 100 + (int)(k / n));
    rc = uvccl_alltoall(pg, w, sb, rb, n, UVCCL_FLOAT32, NULL);
    break;
  case 4:
    for (k = 0; k < n * (size_t)P; k++) sb[k] = (float)(me + 1);
    rc = uvccl_reduce_scatter(pg, w, sb, rb, n, UVCCL_FLOAT32, UVCCL_SUM,
                              NULL);
    break;
  default:
    rc = uvccl_barrier(pg, w, NULL);
    n = 0;
  }
  if (rc == 0) rc = uvccl_work_wait(w);
  if (rc != 0) return rc;
  switch (kind) {
  case 0:
    for (want = 0, q = 0; q < P; q++) want += (float)(uvccl_pg_global_rank(pg, q) + 1);
    for (k = 0; k < n; k++) *bad += rb[k] != want;
    break;
  case 1:
    for (k = 0; k < n; k++) *bad += rb[k] != (float)i;
    break;
  case 2:
    for (q = 0; q < P; q++)
      for (k = 0; k < n; k++)
        *bad += rb[(size_t)q * n + k] != (float)(q * 3 + (int)(i % 5));
    break;
  case 3:
    for (q = 0; q < P; q++)
      for (k = 0; k < n; k++) *bad += rb[(size_t)q * n + k] != (float)(q * 100 + me);
    break;
  case 4:
    want = (float)(P * (P + 1) / 2);
    for (k = 0; k < n; k++) *bad += rb[k] != want;
    break;
  }
  return 0;
}

int main(int argc, char **argv) {
  uv_loop_t loop;
  uvccl_pg_t pg, next;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  double timeout_s = 20, hb_s = 0;
  int rc, a, bad = 0, last_bad = 0;
  unsigned i;
  for (a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--timeout") == 0 && a + 1 < argc)
      timeout_s = atof(argv[++a]);
    else if (strcmp(argv[a], "--heartbeat") == 0 && a + 1 < argc)
      hb_s = atof(argv[++a]);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  sb = malloc(MAXN * 8 * sizeof(float));
  rb = malloc(MAXN * 8 * sizeof(float));
  uv_loop_init(&loop);
  memset(&o, 0, sizeof(o));
  o.timeout_ms = (uint64_t)(timeout_s * 1000);
  if (hb_s > 0) o.heartbeat_timeout_ms = (uint64_t)(hb_s * 1000);
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) {
    fprintf(stderr, "init: %s\n", w.msg);
    return 1;
  }
  for (i = 0;; i++) {
    rc = run_one(&pg, i, &bad, &w);
    if (rc != 0) break;
    if (bad != last_bad) {
      printf("@bad %d %u %d\n", pg.rank, i, bad - last_bad);
      last_bad = bad;
    }
    if (i == 20) printf("@ready %d %d\n", pg.rank, (int)getpid());
  }
  {
    uvccl_pg_failure_t f;
    memset(&f, 0, sizeof(f));
    uvccl_pg_get_failure(&pg, &f);
    printf("@err %d %.6f %d %s | %s\n", pg.rank, mono(), f.global_rank,
           uvccl_fail_cause_name(f.cause), w.msg);
  }
  memset(&w, 0, sizeof(w));
  rc = uvccl_pg_shrink(&pg, &next, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc == 0) {
    int ok = 0, b2 = 0;
    unsigned k;
    /* resume at a common iteration */
    int64_t it = i + 1;
    uvccl_work_t wi = {0};
    rc = uvccl_allreduce(&next, &wi, &it, &it, 1, UVCCL_INT64, UVCCL_MAX, NULL);
    if (rc == 0) rc = uvccl_work_wait(&wi);
    for (k = 0; rc == 0 && k < 20; k++) {
      rc = run_one(&next, (unsigned)it + k, &b2, &w);
      if (rc == 0) ok++;
    }
    printf("@after %d %d %d %d\n", pg.rank, next.size, ok, b2);
    uvccl_pg_destroy(&next, NULL);
  } else {
    printf("@after %d 0 0 0 | shrink: %s\n", pg.rank, w.msg);
  }
  uvccl_pg_destroy(&pg, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(sb);
  free(rb);
  return 0;
}
