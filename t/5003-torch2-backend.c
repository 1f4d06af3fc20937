/* The uvccl backend on PyTorch 2.x (c10d's Backend API), in each Debian
 * root tools/torch-root.sh made with what building it takes
 * (TORCH_ROOT_DEV=1: libtorch-dev and g++ inside; trixie has PyTorch 2.6):
 * t/run-torch2-backend.sh builds libuvccl and the extension inside the
 * root, then runs t/py/torch_backend.py (every operation against Gloo in
 * the same job, errors, a timeout, split_group) at 2, 3 and 4 ranks, a
 * peer killed mid-allreduce and abort() at 3, init through tcp:// with no
 * MASTER_ADDR on a host whose name does not resolve at 2, shrink_group
 * (one rank killed, one excluded alive) at 4, a rank killed during
 * FSDP2 steps at 3, c10d's reconfigure API (a 4th process joins with
 * enable_reconfigure, handles as a set and as a list, one leaves) at 4,
 * DDP at 2, the elastic DDP example under uvccl-run --respawn (a rank
 * killed, the survivors shrink, its replacement joins), what runs on
 * top (functional collectives, DTensor, FSDP2, compiled DDP, DETAIL)
 * against Gloo at 2 and 4, and pip install ./python with the root's pip,
 * offline; its TAP lines
 * are relayed here.
 * Skips where no such root exists (CI's fresh machines; Debian 12's own
 * python3-torch is 1.13, which t/5001 and t/5002 cover) or when not root
 * (chroot). */
#define _GNU_SOURCE
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROOTS UVCCL_SRC_DIR "/tools/torch-root.sh list"
#define RUN UVCCL_SRC_DIR "/t/run-torch2-backend.sh"

int main(void) {
  char roots[8][512], line[512], path[1024];
  int n = 0, i;
  FILE *f;
  tap_alarm(1200);
  if (geteuid() != 0) skip_all("not root: no chroot into a PyTorch 2.x root");
  f = popen(ROOTS " 2>/dev/null", "r");
  while (f != NULL && n < 8 && fgets(line, sizeof(line), f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    snprintf(path, sizeof(path),
             "%s/usr/include/torch/csrc/distributed/c10d/Backend.hpp", line);
    if (access(path, R_OK) != 0) continue;
    snprintf(path, sizeof(path), "%s/usr/bin/g++", line);
    if (access(path, X_OK) != 0) continue;
    memcpy(roots[n++], line, sizeof(roots[0]));
  }
  if (f != NULL) pclose(f);
  if (n == 0)
    skip_all("no PyTorch 2.x root with libtorch-dev (TORCH_ROOT_DEV=1 "
             "tools/torch-root.sh create trixie makes one)");
  plan(15 * n);
  for (i = 0; i < n; i++) {
    char cmd[8192];
    int seen = 0, rc;
    snprintf(cmd, sizeof(cmd), RUN " %s 2>&1", roots[i]);
    f = popen(cmd, "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
      char *d;
      line[strcspn(line, "\n")] = '\0';
      if (strncmp(line, "ok ", 3) == 0 || strncmp(line, "not ok ", 7) == 0) {
        int good = line[0] == 'o';
        d = strstr(line, " - ");
        ok(good, "%s: %s", roots[i], d ? d + 3 : line);
        seen++;
      } else if (line[0] != '1') {
        note("%s", line);
      }
    }
    rc = f != NULL ? pclose(f) : -1;
    for (; seen < 15; seen++)
      ok(0, "%s: the run ended early (status %d)", roots[i], rc);
  }
  return done_testing();
}
