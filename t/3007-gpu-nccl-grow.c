/* Grows of NCCL worlds (uvccl_pg_grow, uvccl_pg_join through ncclCommGrow),
 * against the fake CUDA runtime and the fake NCCL (t/fake/), several ranks
 * in this process on one loop (as t/3006), each on its own device:
 *   a) 2 -> 4: two joiners at once, both waiting before the grow opens;
 *      members keep ranks 0 and 1, the joiners take 2 and 3; epoch 1 on
 *      all; allreduce of the four; then the grown world grows again
 *      (4 -> 5, epoch 2, the members agreeing through the grown world's
 *      own key) and its allreduce is right;
 *   b) a member dead before the grow (3 ranks, rank 2 gone): the grow
 *      fails on ranks 0 and 1 and on the joiner by the creation deadline;
 *      the old world is kept: it shrinks to 2, and then grows back to 3
 *      (a grow after a shrink) with a new joiner; allreduce right;
 *   c) with an older NCCL (2.26: no ncclCommGrow; a child process loads
 *      that fake) grow and join say UVCCL_ENOTSUP, naming ncclCommGrow. */
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define FAKE_NCCL UVCCL_BUILD_DIR "/fake/libnccl.so.2"
#define FAKE_NCCL_OLD UVCCL_BUILD_DIR "/fake/old/libnccl.so.2"
#define NMAX 6

static uv_loop_t loop_s, *loop = &loop_s;
static uvccl_store_t store;

/* the fake's count of communicators ncclCommGrow made */
static int grown_comms(void) {
  void *h = dlopen(FAKE_NCCL, RTLD_NOW | RTLD_NOLOAD);
  int (*f)(void) = h ? (int (*)(void))dlsym(h, "fake_nccl_grown_comms") : NULL;
  int n = f ? f() : -1;
  if (h) dlclose(h);
  return n;
}

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

static void opts(uvccl_pg_options_t *o, const char *prefix, int device,
                 uint64_t timeout_ms) {
  memset(o, 0, sizeof(*o));
  o->backend = UVCCL_BACKEND_NCCL;
  o->prefix = prefix;
  o->device = device;
  o->timeout_ms = timeout_ms;
  o->heartbeat_timeout_ms = 300;
}

static int make_world(uvccl_pg_t *pgs, int n, const char *prefix) {
  uvccl_work_t w[NMAX];
  uvccl_pg_options_t o;
  int r, good;
  opts(&o, prefix, 0, 10000);
  good = nccl_ranks_start(loop, &store, pgs, w, n, prefix, &o);
  for (r = 0; r < n; r++)
    if (uvccl_work_wait(&w[r]) != 0) {
      note("init rank %d: %s", r, w[r].msg);
      good = 0;
    }
  return good;
}

/* An allreduce of 64 int32 (group rank + 1 each) over g[0..n), rank r's
 * buffer on device dev[r]; 1 if every rank got 1 + 2 + ... + n. */
static int allreduce_ok(uvccl_pg_t *const *g, const int *dev, int n) {
  uvccl_work_t w[NMAX];
  void *d[NMAX];
  int32_t h[64];
  int r, i, good = 1;
  memset(w, 0, sizeof(w));
  for (r = 0; r < n; r++) {
    d[r] = dev_on(dev[r], sizeof(h));
    for (i = 0; i < 64; i++) h[i] = g[r]->rank + 1;
    put(d[r], h, sizeof(h));
    if (uvccl_allreduce(g[r], &w[r], d[r], d[r], 64, UVCCL_INT32, UVCCL_SUM,
                        NULL) != 0)
      good = 0;
  }
  for (r = 0; r < n; r++) {
    if (uvccl_work_wait(&w[r]) != 0) {
      note("allreduce %d: %s", r, w[r].msg);
      good = 0;
      continue;
    }
    get(h, d[r], sizeof(h));
    for (i = 0; i < 64; i++)
      if (h[i] != n * (n + 1) / 2) good = 0;
  }
  for (r = 0; r < n; r++) uvccl_gpu_free(d[r]);
  return good;
}

/* Starts a grow on members old[0..m) into grown[0..m) and a join on
 * grown[m..m+j) (joiner k on device jdev[k]): joiners first, so they wait
 * for the grow to open. Then waits; returns how many completed with 0,
 * the works in w. */
static int grow(uvccl_pg_t *const *old, uvccl_pg_t *const *grown, int m,
                int j, const int *jdev, const char *prefix,
                uint64_t timeout_ms, uvccl_work_t *w) {
  uvccl_pg_options_t o;
  int r, good = 0, rc;
  memset(w, 0, sizeof(*w) * (size_t)(m + j));
  for (r = 0; r < j; r++) {
    opts(&o, prefix, jdev[r], timeout_ms);
    rc = uvccl_pg_join(loop, grown[m + r], &store, &o, &w[m + r], NULL);
    if (rc != 0) note("join %d: %s", r, uvccl_err_name(rc));
  }
  run_loop_for(loop, 30); /* the joiners wait for an open grow */
  for (r = 0; r < m; r++) {
    opts(&o, prefix, 0, timeout_ms);
    rc = uvccl_pg_grow(old[r], grown[r], &store, j, &o, &w[r], NULL);
    if (rc != 0) note("grow %d: %s %s", r, uvccl_err_name(rc), w[r].msg);
  }
  for (r = 0; r < m + j; r++) {
    if (uvccl_work_wait(&w[r]) == 0) good++;
    else note("grow/join %d: %s %s", r, uvccl_err_name(w[r].status), w[r].msg);
  }
  return good;
}

static void test_grow_twice(void) {
  uvccl_pg_t old[2], g4[4], g5[5];
  uvccl_pg_t *po[2], *p4[4], *p5[5];
  uvccl_work_t w[5];
  int jdev[2] = {2, 3}, dev4[4], dev5[5], r, k, good;
  for (r = 0; r < 2; r++) po[r] = &old[r];
  for (r = 0; r < 4; r++) p4[r] = &g4[r];
  for (r = 0; r < 5; r++) p5[r] = &g5[r];
  ok(make_world(old, 2, "growA"), "a: 2 NCCL ranks");
  k = grown_comms();
  good = grow(po, p4, 2, 2, jdev, "growA", 10000, w);
  ok(good == 4, "a: 2 members and 2 joiners (both waiting first) grow to 4");
  ok(grown_comms() - k == 4, "a: all four made by ncclCommGrow (%d)",
     grown_comms() - k);
  for (r = 0, k = 0; r < 4; r++)
    if (g4[r].size == 4 && w[r].result == 1) k++;
  ok(k == 4, "a: a world of 4 everywhere, epoch 1 on all");
  ok(g4[0].rank == 0 && g4[1].rank == 1,
     "a: members keep their ranks (0, 1)");
  ok((g4[2].rank == 2 && g4[3].rank == 3) ||
     (g4[2].rank == 3 && g4[3].rank == 2),
     "a: the joiners take 2 and 3 (%d, %d)", g4[2].rank, g4[3].rank);
  for (r = 0; r < 4; r++) dev4[r] = r < 2 ? r : jdev[r - 2];
  ok(good == 4 && allreduce_ok(p4, dev4, 4),
     "a: allreduce of the four right (1+2+3+4)");
  for (r = 0; r < 2; r++) destroy(&old[r]);
  /* the grown world grows again: its own key for the agreement */
  jdev[0] = 4;
  good = grow(p4, p5, 4, 1, jdev, "growA", 10000, w);
  for (r = 0, k = 0; r < 5; r++)
    if (g5[r].size == 5 && w[r].result == 2) k++;
  ok(good == 5 && k == 5 && g5[4].rank == 4,
     "a: the world of 4 grows to 5, epoch 2, the joiner rank 4");
  for (r = 0; r < 5; r++) dev5[r] = r < 4 ? dev4[r] : 4;
  ok(good == 5 && allreduce_ok(p5, dev5, 5), "a: allreduce of the five right");
  for (r = 0; r < 4; r++) destroy(&g4[r]);
  for (r = 0; r < 5; r++) destroy(&g5[r]);
}

static void test_member_dead(void) {
  uvccl_pg_t old[3], g3[3], two[2], back[3];
  uvccl_pg_t *po[2], *p3[3], *ptwo[2], *pback[3];
  uvccl_work_t w[3], sw[2];
  int jdev[1] = {3}, devb[3] = {0, 1, 4}, r, k, good;
  double t0;
  for (r = 0; r < 2; r++) po[r] = &old[r];
  for (r = 0; r < 3; r++) p3[r] = &g3[r];
  ok(make_world(old, 3, "growB"), "b: 3 NCCL ranks");
  uvccl_pg_abort(&old[2], "test: rank 2 dies");
  destroy(&old[2]);
  t0 = now_s();
  good = grow(po, p3, 2, 1, jdev, "growB", 1500, w);
  for (r = 0, k = 0; r < 3; r++)
    if (w[r].status != 0 && w[r].msg[0] != '\0' && g3[r].impl_ == NULL) k++;
  ok(good == 0 && k == 3, "b: rank 2 dead: the grow fails on both members "
     "and the joiner after %.1f s, nothing left to destroy", now_s() - t0);
  note("b: rank 0 says: %s", w[0].msg);
  /* the old world is kept: shrink it, then grow it back */
  memset(sw, 0, sizeof(sw));
  for (r = 0; r < 2; r++)
    if (uvccl_pg_shrink(&old[r], &two[r], &sw[r], NULL) != 0) good = -1;
  for (r = 0, k = 0; r < 2; r++)
    if (uvccl_work_wait(&sw[r]) == 0 && two[r].size == 2) k++;
  ok(good == 0 && k == 2, "b: the members still hold the old world: it "
     "shrinks to 2");
  for (r = 0; r < 2; r++) ptwo[r] = &two[r];
  for (r = 0; r < 3; r++) pback[r] = &back[r];
  jdev[0] = 4;
  good = grow(ptwo, pback, 2, 1, jdev, "growB", 10000, w);
  ok(good == 3 && back[2].rank == 2 && back[0].size == 3,
     "b: the shrunk world grows back to 3 (epoch %lld)",
     (long long)w[0].result);
  ok(good == 3 && allreduce_ok(pback, devb, 3),
     "b: allreduce of the world grown back right");
  for (r = 0; r < 3; r++) destroy(&back[r]);
  for (r = 0; r < 2; r++) {
    destroy(&two[r]);
    destroy(&old[r]);
  }
}

/* c) in a child with the older fake: one rank grows, one joins. */
static int child_old(void) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0}, wg = {0}, wj = {0};
  uvccl_pg_t pg, next, joined;
  int rc1, rc2;
  uv_loop_init(loop);
  uvccl_hash_store_init(loop, &store);
  opts(&o, "old", 0, 5000);
  o.rank = 0;
  o.size = 1;
  if (uvccl_pg_init(loop, &pg, &store, &o, &w, NULL) != 0 ||
      uvccl_work_wait(&w) != 0)
    return 3;
  rc1 = uvccl_pg_grow(&pg, &next, &store, 1, &o, &wg, NULL);
  rc2 = uvccl_pg_join(loop, &joined, &store, &o, &wj, NULL);
  printf("%d %d %s|%s\n", rc1, rc2, wg.msg, wj.msg);
  fflush(stdout);
  uvccl_pg_destroy(&pg, NULL);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}

static void test_old_nccl(const char *self) {
  int rc1 = 0, rc2 = 0;
  char buf[600] = "";
  if (run_child_with_nccl(self, FAKE_NCCL_OLD, buf, sizeof(buf)) != 0) return;
  sscanf(buf, "%d %d", &rc1, &rc2);
  ok(rc1 == UVCCL_ENOTSUP && strstr(buf, "ncclCommGrow (2.29") != NULL,
     "c: older NCCL: grow says UVCCL_ENOTSUP, why: %.150s", buf);
  ok(rc2 == UVCCL_ENOTSUP, "c: ... and join too (%s)", uvccl_err_name(rc2));
}

int main(int argc, char **argv) {
  (void)argc;
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  if (getenv("UVCCL_NCCL") == NULL || getenv("T_CHILD") == NULL)
    setenv("UVCCL_NCCL", FAKE_NCCL, 1);
  setenv("FAKE_CUDA_DEVICES", "6", 1);
  setenv("UVCCL_NCCL_WATCHDOG_MS", "20", 1);
  if (getenv("T_CHILD") != NULL) return child_old();
  tap_alarm(120);
  is_int(uv_loop_init(loop), 0, "loop");
  is_int(uvccl_hash_store_init(loop, &store), 0, "hash store");
  test_grow_twice();
  test_member_dead();
  test_old_nccl(argv[0]);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(loop), 0, "loop closed: no handle left");
  return done_testing();
}
