/* The culprit, named everywhere. Worlds of 4 separate processes (env://),
 * SIGPIPE at its default action; rank 2 is SIGKILLed at a random moment
 * while every rank runs one kind of collective over and over:
 *   a) each collective kind (allreduce, broadcast, allgather,
 *      reduce_scatter, alltoall, barrier), small and large;
 *   b) the same with a cascade: rank 1 aborts and exits as soon as its
 *      own operation fails (an application dying of the error), so ranks
 *      0 and 3 see rank 1 go too, and must still name rank 2.
 *   c) worlds of 8 that are sparse ($UVCCL_MESH_MAX=0): connections made
 *      when first needed, and monitors linked in an overlay (rank 2's to
 *      0, 1, 3, 4, 6: ranks 5 and 7 learn of it through the others); small
 *      allreduces and barriers through the tree ($UVCCL_SMALL_TREE=1).
 * Every survivor checks: its work failed with UVCCL_EPEER and a message
 * naming "rank 2 (global 2" and how (exited, or its connections reset);
 * uvccl_pg_get_failure() says global rank 2, cause "exited" or "reset",
 * and the same
 * message; uvccl_pg_failed_ranks() starts with 2; a later call fails at
 * once with the same message; destroy completes; exit status 0. Results of
 * the operations before the kill are checked too. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank_main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(90);
  unsetenv("UVCCL_SOCKET_IFNAME");
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  rank_init(30000);
  ft_rank();
  return rank_destroy();
}

/* ======================================================================== */

static int checks_for(proc_t *ps, int n, int r, const char *op, size_t size,
                      int cascade) {
  char det[512];
  double v;
  int okv, all = 1;
  find_check(ps, n, r, "failed", &okv, det, sizeof(det));
  all &= okv == 1 && strstr(det, "UVCCL_EPEER") != NULL &&
         strstr(det, "rank 2 (global 2,") != NULL &&
         (strstr(det, "exited or was killed") != NULL ||
          strstr(det, "connection reset (its process was killed") != NULL);
  if (!all) diag("rank %d failed: %s", r, det);
  find_check(ps, n, r, "fail_api", &okv, det, sizeof(det));
  if (okv != 1 || !find_val(ps, n, r, "culprit", &v) || v != 2 ||
      !find_val(ps, n, r, "cause", &v) ||
      (v != UVCCL_FAIL_EXITED && v != UVCCL_FAIL_RESET) ||
      !find_val(ps, n, r, "first_failed", &v) || v != 2) {
    diag("rank %d fail_api: %s", r, det);
    all = 0;
  }
  find_check(ps, n, r, "later", &okv, det, sizeof(det));
  if (okv != 1) {
    diag("rank %d later: %s", r, det);
    all = 0;
  }
  find_check(ps, n, r, "ops", &okv, det, sizeof(det));
  if (okv != 1) {
    diag("rank %d ops: %s", r, det);
    all = 0;
  }
  find_check(ps, n, r, "destroy", &okv, det, sizeof(det));
  if (okv != 1) {
    diag("rank %d destroy: %s", r, det);
    all = 0;
  }
  if (ps[r].status != 0) {
    diag("rank %d exit status %d", r, ps[r].status);
    all = 0;
  }
  (void)op;
  (void)size;
  (void)cascade;
  return all;
}

static void scenario_n(const char *op, size_t size, int cascade, int n) {
  proc_t ps[8];
  static char e_op[64], e_size[64], e_start[32], e_casc[32];
  static char e_mesh[32] = "UVCCL_MESH_MAX=0";
  static char e_tree[32] = "UVCCL_SMALL_TREE=1";
  double t0, v;
  int killed = 0, r, good = 1;
  /* 8 ranks: a sparse world (lazy connections; the monitors' overlay
   * links rank 2 to 0, 1, 3, 4 and 6 only: 5 and 7 hear through them),
   * small allreduces and barriers through the tree (as uvccl-run sets on
   * an oversubscribed host) */
  if (n > 4) {
    putenv(e_mesh);
    putenv(e_tree);
  } else {
    unsetenv("UVCCL_MESH_MAX");
    unsetenv("UVCCL_SMALL_TREE");
  }
  snprintf(e_op, sizeof(e_op), "T_OP=%s", op);
  snprintf(e_size, sizeof(e_size), "T_SIZE=%zu", size);
  snprintf(e_start, sizeof(e_start), "T_START=2");
  snprintf(e_casc, sizeof(e_casc), "T_CASCADE=%d", cascade ? 1 : -1);
  putenv(e_op);
  putenv(e_size);
  putenv(e_start);
  putenv(e_casc);
  spawn_world(ps, n, "ft", 0);
  t0 = now_s();
  while (now_s() - t0 < 30 && !ps[2].exited) {
    pump(ps, n, 10);
    if (find_val(ps, n, 2, "started", &v)) {
      sleep_ms(rand() % 20);
      kill(ps[2].pid, SIGKILL);
      killed = 1;
      break;
    }
  }
  finish_all(ps, n, 60);
  for (r = 0; r < n; r++) {
    if (r == 2 || (cascade && r == 1)) continue;
    if (!checks_for(ps, n, r, op, size, cascade)) good = 0;
  }
  ok(killed && good, "%s%s%s %zu B: rank 2 killed; ranks %s name rank 2 "
     "(message, get_failure, failed_ranks, later calls), exit 0",
     n > 4 ? "sparse world of 8: " : "", cascade ? "cascade: " : "", op,
     size, n > 4 ? (cascade ? "0, 3-7" : "0, 1, 3-7")
                 : cascade ? "0 and 3" : "0, 1, 3");
  if (!killed || !good) dump_procs(ps, n);
  procs_free(ps, n);
}

static void scenario(const char *op, size_t size, int cascade) {
  scenario_n(op, size, cascade, 4);
}

int main(void) {
  static const char *ops[] = {"allreduce", "broadcast", "allgather",
                              "reduce_scatter", "alltoall", "barrier"};
  const char *role = getenv("UVCCL_T_ROLE");
  size_t i;
  if (role != NULL && *role) return rank_main();
  parent_init(600);
  srand((unsigned)getpid());
  sigpipe_default();
  plan(6 * 2 + 3 + 4);
  for (i = 0; i < 6; i++) {
    scenario(ops[i], 256, 0);
    if (strcmp(ops[i], "barrier") != 0) scenario(ops[i], 4 << 20, 0);
    else scenario(ops[i], 0, 1);
  }
  scenario("allreduce", 16 << 20, 1);
  scenario("allgather", 1 << 20, 1);
  scenario("broadcast", 4096, 1);
  scenario_n("allreduce", 256, 0, 8);
  scenario_n("alltoall", 1 << 20, 0, 8);
  scenario_n("broadcast", 4096, 1, 8);
  scenario_n("barrier", 0, 1, 8);
  return done_testing();
}
