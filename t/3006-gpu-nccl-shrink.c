/* Revoke and shrink of NCCL groups, against the fake CUDA runtime and the
 * fake NCCL (t/fake/), several ranks in this process on one loop (as
 * t/3005):
 *   a) 3 ranks; rank 2 dies (its group aborted and gone); ranks 0 and 1
 *      shrink: after the heartbeat timeout (300 ms here) they agree
 *      through the store to leave rank 2 out, ncclCommShrink makes a group
 *      of 2, and its allreduce is right;
 *   b) 2 ranks; rank 0 revokes while its allreduce waits for rank 1: the
 *      work fails with UVCCL_EREVOKED, later calls too; both shrink (nobody
 *      left out) and the new group works;
 *   c) with an older NCCL (2.26: no ncclCommRevoke, no ncclCommShrink; a
 *      child process loads that fake) revoke and shrink say
 *      UVCCL_ENOTSUP;
 *   d) ranks 0 and 2 of 3 shrink excluding rank 1, alive and silent
 *      (uvccl_pg_shrink_excluding), long before its heartbeat timeout. */
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define FAKE_NCCL UVCCL_BUILD_DIR "/fake/libnccl.so.2"
#define FAKE_NCCL_OLD UVCCL_BUILD_DIR "/fake/old/libnccl.so.2"

static uv_loop_t loop_s, *loop = &loop_s;
static uvccl_store_t store;
static uvccl_pg_t pgs[3], shrunk[3];

static int closed;
static void on_closed(uvccl_pg_t *g) {
  (void)g;
  closed++;
}

static void destroy(uvccl_pg_t *g) {
  int before = closed;
  if (g->impl_ == NULL) return;
  uvccl_pg_destroy(g, on_closed);
  while (closed == before) uv_run(loop, UV_RUN_ONCE);
}

static int make_world_hb(int n, const char *prefix, uint64_t hb_ms) {
  uvccl_work_t w[3];
  uvccl_pg_options_t o;
  int r, good;
  memset(&o, 0, sizeof(o));
  o.heartbeat_timeout_ms = hb_ms;
  good = nccl_ranks_start(loop, &store, pgs, w, n, prefix, &o);
  for (r = 0; r < n; r++)
    if (uvccl_work_wait(&w[r]) != 0) {
      note("init rank %d: %s", r, w[r].msg);
      good = 0;
    }
  return good;
}

static int make_world(int n, const char *prefix) {
  return make_world_hb(n, prefix, 300);
}

/* An allreduce of 64 int32 ((global rank + 1) each) on groups g[0..n);
 * 1 if every rank got the sum. */
static int allreduce_ok(uvccl_pg_t *g, int n, int32_t want) {
  uvccl_work_t w[3];
  void *d[3];
  int32_t h[64];
  int r, i, good = 1;
  memset(w, 0, sizeof(w));
  for (r = 0; r < n; r++) {
    int gr = uvccl_pg_global_rank(&g[r], g[r].rank);
    d[r] = dev_on(gr >= 0 ? gr : r, 64 * 4);
    for (i = 0; i < 64; i++) h[i] = gr + 1;
    put(d[r], h, sizeof(h));
    if (uvccl_allreduce(&g[r], &w[r], d[r], d[r], 64, UVCCL_INT32, UVCCL_SUM,
                        NULL) != 0)
      good = 0;
  }
  for (r = 0; r < n; r++) {
    if (uvccl_work_wait(&w[r]) != 0) {
      note("allreduce rank %d: %s", r, w[r].msg);
      good = 0;
      continue;
    }
    get(h, d[r], sizeof(h));
    for (i = 0; i < 64; i++)
      if (h[i] != want) good = 0;
  }
  for (r = 0; r < n; r++) uvccl_gpu_free(d[r]);
  return good;
}

static void test_dead_rank(void) {
  uvccl_work_t w[2];
  double t0;
  int r, good = 1;
  ok(make_world(3, "shrinkA"), "a: 3 NCCL ranks");
  ok(allreduce_ok(pgs, 3, 1 + 2 + 3), "a: allreduce of 3 right");
  uvccl_pg_abort(&pgs[2], "test: rank 2 dies");
  destroy(&pgs[2]);
  memset(w, 0, sizeof(w));
  t0 = now_s();
  for (r = 0; r < 2; r++)
    if (uvccl_pg_shrink(&pgs[r], &shrunk[r], &w[r], NULL) != 0) good = 0;
  for (r = 0; r < 2; r++)
    if (uvccl_work_wait(&w[r]) != 0 || w[r].result != 1 ||
        shrunk[r].size != 2 || shrunk[r].rank != r) {
      note("shrink rank %d: %s (%s), result %lld, size %d rank %d", r,
           uvccl_err_name(w[r].status), w[r].msg, (long long)w[r].result,
           shrunk[r].size, shrunk[r].rank);
      good = 0;
    }
  ok(good, "a: ranks 0 and 1 shrink to 2 after %.2f s (rank 2 left out)",
     now_s() - t0);
  ok(good && uvccl_pg_global_rank(&shrunk[1], 1) == 1,
     "a: the new group's ranks map to global 0 and 1");
  ok(good && allreduce_ok(shrunk, 2, 1 + 2),
     "a: allreduce of the shrunk group right");
  for (r = 0; r < 2; r++) {
    destroy(&shrunk[r]);
    uvccl_pg_abort(&pgs[r], "test: old group");
    destroy(&pgs[r]);
  }
}

static void test_revoke(void) {
  uvccl_work_t w = {0}, w2 = {0}, ws[2];
  void *d = dev_on(0, 64 * 4);
  int r, rc, good = 1;
  ok(make_world(2, "revokeB"), "b: 2 NCCL ranks");
  rc = uvccl_allreduce(&pgs[0], &w, d, d, 64, UVCCL_INT32, UVCCL_SUM, NULL);
  run_loop_for(loop, 50); /* rank 1 never joins it */
  ok(rc == 0 && !uvccl_work_done(&w), "b: rank 0's allreduce waits for rank 1");
  ok(uvccl_pg_revoke(&pgs[0], "testing revoke") == 0, "b: rank 0 revokes");
  rc = uvccl_work_wait(&w);
  ok(rc == UVCCL_EREVOKED && strstr(w.msg, "testing revoke") != NULL,
     "b: the pending allreduce fails: %s %s", uvccl_err_name(rc), w.msg);
  rc = uvccl_allreduce(&pgs[0], &w2, d, d, 64, UVCCL_INT32, UVCCL_SUM, NULL);
  ok(rc == UVCCL_EREVOKED && strstr(w2.msg, "testing revoke") != NULL,
     "b: a later call fails at once: %s %s", uvccl_err_name(rc), w2.msg);
  ok(uvccl_pg_revoke(&pgs[1], "testing revoke") == 0, "b: rank 1 revokes");
  memset(ws, 0, sizeof(ws));
  for (r = 0; r < 2; r++)
    if (uvccl_pg_shrink(&pgs[r], &shrunk[r], &ws[r], NULL) != 0) good = 0;
  for (r = 0; r < 2; r++)
    if (uvccl_work_wait(&ws[r]) != 0 || ws[r].result != 0 ||
        shrunk[r].size != 2) {
      note("shrink rank %d: %s", r, ws[r].msg);
      good = 0;
    }
  ok(good, "b: both shrink the revoked group, nobody left out");
  ok(good && allreduce_ok(shrunk, 2, 1 + 2), "b: the new group's allreduce "
     "is right");
  uvccl_gpu_free(d);
  for (r = 0; r < 2; r++) {
    destroy(&shrunk[r]);
    uvccl_pg_abort(&pgs[r], "test: old group");
    destroy(&pgs[r]);
  }
}

/* d) uvccl_pg_shrink_excluding: ranks 0 and 2 leave out rank 1, alive and
 * not shrinking, with a heartbeat timeout (60 s) far beyond the works'
 * (5 s): they must not wait for its alive key. */
static void test_exclude(void) {
  uvccl_work_t w[3];
  uvccl_pg_t two[2];
  int excl = 1, r, k, good = 1;
  ok(make_world_hb(3, "excludeD", 60000), "d: 3 NCCL ranks");
  memset(w, 0, sizeof(w));
  for (k = 0; k < 2; k++) {
    r = k == 0 ? 0 : 2;
    w[k].timeout_ms = 5000;
    if (uvccl_pg_shrink_excluding(&pgs[r], &two[k], &excl, 1, &w[k], NULL) != 0)
      good = 0;
  }
  for (k = 0; k < 2; k++)
    if (uvccl_work_wait(&w[k]) != 0 || w[k].result != 1 || two[k].size != 2 ||
        two[k].rank != k) {
      note("shrink %d: %s (%s), result %lld, size %d rank %d", k,
           uvccl_err_name(w[k].status), w[k].msg, (long long)w[k].result,
           two[k].size, two[k].rank);
      good = 0;
    }
  ok(good, "d: ranks 0 and 2 shrink without rank 1 (alive, not calling)");
  ok(good && uvccl_pg_global_rank(&two[1], 1) == 2 && allreduce_ok(two, 2, 1 + 3),
     "d: the new group is global ranks 0 and 2; its allreduce is right");
  for (k = 0; k < 2; k++)
    if (good) destroy(&two[k]);
  for (r = 0; r < 3; r++) {
    uvccl_pg_abort(&pgs[r], "test: old group");
    destroy(&pgs[r]);
  }
}

/* c) in a child with the older fake: one rank, revoke and shrink. */
static int child_old(void) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0}, ws = {0};
  uvccl_pg_t pg, next;
  int rc1, rc2;
  uv_loop_init(loop);
  uvccl_hash_store_init(loop, &store);
  memset(&o, 0, sizeof(o));
  o.rank = 0;
  o.size = 1;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = 0;
  if (uvccl_pg_init(loop, &pg, &store, &o, &w, NULL) != 0 ||
      uvccl_work_wait(&w) != 0)
    return 3;
  rc1 = uvccl_pg_revoke(&pg, "x");
  rc2 = uvccl_pg_shrink(&pg, &next, &ws, NULL);
  printf("%d %d %s\n", rc1, rc2, ws.msg);
  fflush(stdout);
  uvccl_pg_destroy(&pg, NULL);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}

static void test_old_nccl(const char *self) {
  int rc1 = 0, rc2 = 0;
  char buf[512] = "";
  if (run_child_with_nccl(self, FAKE_NCCL_OLD, buf, sizeof(buf)) != 0) return;
  sscanf(buf, "%d %d", &rc1, &rc2);
  ok(rc1 == UVCCL_ENOTSUP, "c: older NCCL: revoke says UVCCL_ENOTSUP (%s)",
     uvccl_err_name(rc1));
  ok(rc2 == UVCCL_ENOTSUP && strstr(buf, "ncclCommShrink") != NULL,
     "c: ... and shrink too, saying why: %.100s", buf);
}

int main(int argc, char **argv) {
  (void)argc;
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  if (getenv("UVCCL_NCCL") == NULL || getenv("T_CHILD") == NULL)
    setenv("UVCCL_NCCL", FAKE_NCCL, 1);
  setenv("FAKE_CUDA_DEVICES", "3", 1);
  setenv("UVCCL_NCCL_WATCHDOG_MS", "20", 1);
  if (getenv("T_CHILD") != NULL) return child_old();
  tap_alarm(120);
  is_int(uv_loop_init(loop), 0, "loop");
  is_int(uvccl_hash_store_init(loop, &store), 0, "hash store");
  test_dead_rank();
  test_revoke();
  test_exclude();
  test_old_nccl(argv[0]);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(loop), 0, "loop closed: no handle left");
  return done_testing();
}
