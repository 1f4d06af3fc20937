/* uvccl as a PyTorch backend (python/uvccl_torch), first step: the real
 * PyTorch (Debian's python3-torch 1.13) in WORLD_SIZE processes of
 * t/py/torch_backend.py, env://, init_process_group("uvccl"), at 2 and 4
 * ranks. Each rank checks:
 *   - allreduce of 8 dtypes x SUM, MAX, MIN, PRODUCT against the reduction
 *     computed locally, exactly;
 *   - allreduce of a strided view: its elements reduced, the others kept
 *     (Gloo 1.13 reduces the wrong elements there);
 *   - everything (allreduces of the dtypes Gloo has, broadcast, reduce,
 *     all_gather, all_gather_into_tensor, async allreduce through wait()
 *     and get_future(), barrier, gather, scatter, all_to_all_single even
 *     and with splits, all_reduce_coalesced, send/recv around a ring) equal
 *     to a Gloo group's results on the same inputs in the same job; what
 *     Gloo 1.13 lacks (reduce_scatter, reduce_scatter_tensor, all_to_all)
 *     against the results computed locally;
 *   - recv from any source names each sender; monitored_barrier passes;
 *   - an unsupported dtype is a RuntimeError saying so, not a crash;
 *   - new_group builds a second uvccl group that works;
 *   - destroy_process_group returns.
 * And: a peer SIGKILLed mid-allreduce, abort(); init_method="tcp://..."
 * with no MASTER_ADDR, each rank (as root) in a UTS namespace of its own
 * whose host name does not resolve: rank 0's store server is told as the
 * address on the route to the job's store, not as the host name.
 * Skips where python3-torch or the built extension is missing. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PY "/usr/bin/python3" /* Debian's python3-torch; not PATH's python3 */
#define SCRIPT UVCCL_SRC_DIR "/t/py/torch_backend.py"

static void world(int n) {
  static char e_size[32], e_port[32], e_rank[MAXP][32];
  char *argv[] = {PY, SCRIPT, NULL};
  proc_t ps[MAXP];
  unsigned mask = (1u << n) - 1;
  int r, port = free_port();
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", n);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", port);
  for (r = 0; r < n; r++) {
    const char *env[] = {e_rank[r], e_size, "MASTER_ADDR=127.0.0.1", e_port,
                         "PYTHONWARNINGS=ignore", NULL};
    char name[32];
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r);
    snprintf(name, sizeof(name), "rank %d", r);
    if (spawn(&ps[r], name, argv, env, 0) != 0) note("spawning rank %d", r);
  }
  finish_all(ps, n, 240);
  scenario_failed = 0;
  agg(ps, n, "init", mask, "%d ranks: init_process_group(\"uvccl\", env://)",
      n);
  agg(ps, n, "exact", mask, "%d ranks: 32 allreduces (8 dtypes x SUM MAX MIN "
      "PRODUCT) exact", n);
  agg(ps, n, "strided", mask, "%d ranks: allreduce of a strided view", n);
  agg(ps, n, "same", mask, "%d ranks: every op equal to Gloo's results in "
      "the same job (broadcast, reduce, all_gather, into_tensor, async with "
      "wait and get_future, barrier, gather, scatter, all_to_all_single, "
      "all_reduce_coalesced, send/recv), and reduce_scatter(_tensor), "
      "all_to_all to the local results", n);
  agg(ps, n, "anysource", mask, "%d ranks: recv from any source names the "
      "senders", n);
  agg(ps, n, "monitored", mask, "%d ranks: monitored_barrier", n);
  agg(ps, n, "error", mask, "%d ranks: an unsupported dtype is a "
      "RuntimeError that says so", n);
  agg(ps, n, "premul", mask, "%d ranks: PREMUL_SUM with a number and with a "
      "tensor factor", n);
  agg(ps, n, "sparse", mask, "%d ranks: sparse allreduce equal to Gloo's and "
      "to the dense sum", n);
  agg(ps, n, "gather_coalesced", mask, "%d ranks: all_gather_coalesced of "
      "two shapes, equal to Gloo's", n);
  agg(ps, n, "batch_p2p", mask, "%d ranks: batch_isend_irecv both ways "
      "around the ring", n);
  agg(ps, n, "objects", mask, "%d ranks: all_gather_object, "
      "broadcast_object_list", n);
  agg(ps, n, "timeout", mask, "%d ranks: an allreduce the others never "
      "join times out with a RuntimeError naming who it waited for", n);
  agg(ps, n, "coalesced_into", mask, "%d ranks: all_gather_into_tensor and "
      "reduce_scatter_tensor coalesced (_coalescing_manager; PyTorch 2.1+)",
      n);
  agg(ps, n, "future_result", mask, "%d ranks: Work.get_future_result "
      "SUCCESS (PyTorch 2.6+)", n);
  agg(ps, n, "get_error", mask, "%d ranks: get_error SUCCESS, set_timeout "
      "(PyTorch 2.14+)", n);
  agg(ps, n, "sequence", mask, "%d ranks: c10d's sequence number counts "
      "each collective, as on Gloo's group", n);
  agg(ps, n, "split", mask, "%d ranks: uvccl_torch.split_group into [1, 0] "
      "and [2 ..] (rank 2 of 3 in none), equal to Gloo groups of the same "
      "ranks; PyTorch's own split_group refuses a CPU world (PyTorch 2.14+)",
      n);
  agg(ps, n, "subgroup", mask, "%d ranks: a new_group of uvccl works", n);
  agg(ps, n, "undriven", mask, "%d ranks: an allreduce nobody waits for "
      "ends (the loop thread takes over from the thread that drove the "
      "last one)", n);
  agg(ps, n, "threads", mask, "%d ranks: two threads waiting on two groups "
      "at once, 300 allreduces each, every result right", n);
  agg(ps, n, "destroy", mask, "%d ranks: destroy_process_group", n);
  for (r = 0; r < n; r++)
    if (ps[r].status != 0) scenario_failed = 1;
  ok(!scenario_failed, "%d ranks: every rank exited 0", n);
  if (scenario_failed) dump_procs(ps, n);
  procs_free(ps, n);
}

/* A peer SIGKILLed mid-allreduce: each survivor's RuntimeError names it.
 * Or (abort) rank 0 aborts the group: the others' RuntimeErrors carry its
 * reason at once. */
static void killed(int n, int abort) {
  static char e_size[32], e_port[32], e_rank[MAXP][32];
  char *argv[] = {PY, SCRIPT, NULL};
  proc_t ps[MAXP];
  unsigned mask = abort ? (1u << n) - 1 : (1u << (n - 1)) - 1; /* survivors */
  int r, port = free_port(), good;
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", n);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", port);
  for (r = 0; r < n; r++) {
    const char *env[] = {e_rank[r], e_size, "MASTER_ADDR=127.0.0.1", e_port,
                         "PYTHONWARNINGS=ignore",
                         abort ? "T_SCENARIO=abort" : "T_SCENARIO=kill", NULL};
    char name[32];
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r);
    snprintf(name, sizeof(name), "rank %d", r);
    if (spawn(&ps[r], name, argv, env, 0) != 0) note("spawning rank %d", r);
  }
  finish_all(ps, n, 120);
  scenario_failed = 0;
  if (abort)
    agg(ps, n, "aborted", mask, "%d ranks, rank 0 calls abort() from a "
        "timer thread while it waits in a recv: its recv and the others' "
        "allreduce fail at once with its reason", n);
  else
    agg(ps, n, "killed", mask, "%d ranks, rank %d SIGKILLed mid-allreduce: "
        "every survivor's RuntimeError names it", n, n - 1);
  if (!abort)
    agg(ps, n, "failed_state", mask, "%d ranks: then get_future_result "
        "COMM_ERROR and get_error COMM_ERROR (where PyTorch has them)", n);
  agg(ps, n, "destroy", mask, "%d ranks: the survivors destroy their group",
      n);
  good = 1;
  for (r = 0; r < (abort ? n : n - 1); r++)
    if (ps[r].status != 0) good = 0;
  ok(good, "%d ranks: every survivor exited 0", n);
  if (scenario_failed || !good) dump_procs(ps, n);
  procs_free(ps, n);
}

/* init_method="tcp://127.0.0.1:PORT", no MASTER_ADDR, a host name that
 * does not resolve (unshare --uts, where this runs as root). */
static void tcpinit(int n) {
  static char e_size[32], e_port[32], e_rank[MAXP][32], e_host[MAXP][64];
  char *ns_argv[] = {"/usr/bin/unshare", "--uts", PY, SCRIPT, NULL};
  char *argv[] = {PY, SCRIPT, NULL};
  int as_root = geteuid() == 0 && access(ns_argv[0], X_OK) == 0;
  proc_t ps[MAXP];
  unsigned mask = (1u << n) - 1;
  int r, port = free_port();
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", n);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", port);
  for (r = 0; r < n; r++) {
    const char *env[] = {e_rank[r], e_size, e_port, "PYTHONWARNINGS=ignore",
                         "T_SCENARIO=tcpinit", as_root ? e_host[r] : NULL,
                         NULL};
    char name[32];
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r);
    snprintf(e_host[r], sizeof(e_host[r]), "T_HOSTNAME=uvccl-nowhere-%d-%d",
             (int)getpid(), r);
    snprintf(name, sizeof(name), "rank %d", r);
    if (spawn(&ps[r], name, as_root ? ns_argv : argv, env, 0) != 0)
      note("spawning rank %d", r);
  }
  finish_all(ps, n, 120);
  scenario_failed = 0;
  if (as_root)
    agg(ps, n, "premise", mask, "%d ranks: each one's host name does not "
        "resolve", n);
  else
    skip(1, "not root: the host name stays (it resolves)");
  agg(ps, n, "told", mask, "%d ranks: the store server is told as "
      "127.0.0.1, the route to the job's store", n);
  agg(ps, n, "tcpinit", mask, "%d ranks: init through tcp:// with no "
      "MASTER_ADDR, an allreduce", n);
  agg(ps, n, "destroy", mask, "%d ranks: destroy_process_group", n);
  for (r = 0; r < n; r++)
    if (ps[r].status != 0) scenario_failed = 1;
  ok(!scenario_failed, "%d ranks: every rank exited 0", n);
  if (scenario_failed) dump_procs(ps, n);
  procs_free(ps, n);
}

int main(void) {
  glob_t g;
  int have;
  tap_alarm(600);
  if (system(PY " -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    skip_all("no python3-torch");
  have = glob(UVCCL_SRC_DIR "/python/uvccl_torch/_C*.so", 0, NULL, &g) == 0;
  if (have) globfree(&g);
  if (!have)
    skip_all("the extension is not built (make builds it where "
             "libtorch-dev is installed)");
  atexit(kill_live);
  plan(2 * 23 + 4 + 3 + 5);
  world(2);
  world(4);
  killed(3, 0);
  killed(3, 1);
  tcpinit(2);
  return done_testing();
}
