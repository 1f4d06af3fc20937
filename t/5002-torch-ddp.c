/* DDP through the uvccl backend, launched by torchrun: `torchrun
 * --nproc_per_node 4` (Debian's python3-torch 1.13) runs t/py/torch_ddp.py,
 * whose default group is uvccl's (env:// from torchrun's TCPStore). A small
 * MLP and a small convolutional network train 100 steps on synthetic data
 * with DDP over uvccl, then again from the same initial parameters with
 * DDP over a Gloo group of the same ranks. Each rank checks:
 *   - after the uvccl run every parameter is equal on every rank, exactly;
 *   - every step's loss and the final parameters are within 1e-4 of the
 *     Gloo run's (they differ only in the order the sums are added);
 *   - destroy_process_group returns; torchrun exits 0.
 * torchrun 1.13 on Python 3.11 cannot parse its default --redirects/--tee
 * ("0": Python 3.11 no longer iterates IntFlag's zero member), so the test
 * passes "--redirects 1 --tee 1" (stdout to a log file and the console).
 * Skips where python3-torch, torchrun or the built extension is missing. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PY "/usr/bin/python3"
#define TORCHRUN "/usr/bin/torchrun"
#define SCRIPT UVCCL_SRC_DIR "/t/py/torch_ddp.py"

int main(void) {
  static char port_arg[32], logdir[] = "/tmp/uvccl-t5002-XXXXXX";
  const char *env[] = {"PYTHONWARNINGS=ignore", "DDP_STEPS=100",
                       "DDP_MODELS=mlp,cnn", "DDP_BACKENDS=uvccl,gloo",
                       "OMP_NUM_THREADS=1", NULL};
  char *argv[] = {TORCHRUN, "--nproc_per_node", "4", "--master_addr",
                  "127.0.0.1", port_arg, "--redirects", "1", "--tee", "1",
                  "--log_dir", logdir, SCRIPT, NULL};
  proc_t p;
  glob_t g;
  int have;
  unsigned all4 = 0xf;
  tap_alarm(600);
  if (system(PY " -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    skip_all("no python3-torch");
  if (access(TORCHRUN, X_OK) != 0) skip_all("no torchrun (python3-torch)");
  have = glob(UVCCL_SRC_DIR "/python/uvccl_torch/_C*.so", 0, NULL, &g) == 0;
  if (have) globfree(&g);
  if (!have)
    skip_all("the extension is not built (make builds it where "
             "libtorch-dev is installed)");
  if (mkdtemp(logdir) == NULL) skip_all("mkdtemp failed");
  atexit(kill_live);
  plan(7);
  snprintf(port_arg, sizeof(port_arg), "--master_port=%d", free_port());
  if (spawn(&p, "torchrun", argv, env, 0) != 0) note("spawning torchrun");
  finish_all(&p, 1, 400);
  scenario_failed = 0;
  agg(&p, 1, "init", all4, "torchrun --nproc_per_node 4: every rank's "
      "init_process_group(\"uvccl\") through torchrun's env://");
  agg(&p, 1, "mlp-equal", all4, "MLP, 100 DDP steps over uvccl: parameters "
      "equal on every rank");
  agg(&p, 1, "mlp-gloo", all4, "MLP: losses and parameters match the Gloo "
      "run's within 1e-4");
  agg(&p, 1, "cnn-equal", all4, "CNN, 100 DDP steps over uvccl: parameters "
      "equal on every rank");
  agg(&p, 1, "cnn-gloo", all4, "CNN: losses and parameters match the Gloo "
      "run's within 1e-4");
  agg(&p, 1, "destroy", all4, "destroy_process_group on every rank");
  ok(p.status == 0, "torchrun exited 0 (status %d)", p.status);
  if (scenario_failed || p.status != 0) dump_procs(&p, 1);
  procs_free(&p, 1);
  {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", logdir);
    if (system(cmd) != 0) note("could not remove %s", logdir);
  }
  return done_testing();
}
