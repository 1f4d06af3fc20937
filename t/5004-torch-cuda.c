/* The uvccl backend on CUDA tensors: t/run-torch-cuda.sh (every operation
 * on CUDA tensors against the same on CPU tensors, at 1 rank through a
 * uvccl NCCL group and 2-3 ranks sharing a GPU through staging; the
 * transport the ranks agree on; the caller's stream ordering the inputs),
 * its TAP lines relayed here. Needs a python3 ($UVCCL_TORCH_PYTHON, else
 * PATH's) whose PyTorch has CUDA and sees a GPU, and the extension built
 * for it (tools/torch-ext.sh); skips without them (Debian's PyTorch has no
 * CUDA: CI skips; tools/gpu-check.sh runs it on a GPU machine). */
#define _GNU_SOURCE
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define RUN UVCCL_SRC_DIR "/t/run-torch-cuda.sh"

int main(void) {
  char cmd[4096], line[1024], *lines[256];
  int n = 0, i, rc;
  const char *py = getenv("UVCCL_TORCH_PYTHON");
  FILE *f;
  tap_alarm(900);
  snprintf(cmd, sizeof(cmd), "PYTHON='%s' " RUN " 2>&1",
           py && *py ? py : "python3");
  f = popen(cmd, "r");
  if (f == NULL) skip_all("cannot run " RUN);
  while (n < 256 && fgets(line, sizeof(line), f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    lines[n++] = strdup(line);
  }
  rc = pclose(f);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2)
    skip_all("%s", n > 0 ? lines[n - 1] : "no CUDA PyTorch");
  plan(5);
  int seen = 0;
  for (i = 0; i < n; i++) {
    char *d = strstr(lines[i], " - ");
    if (strncmp(lines[i], "ok ", 3) == 0 && strstr(lines[i], "# SKIP")) {
      skip(1, "%s", strstr(lines[i], "# SKIP") + 7);
      seen++;
    } else if (strncmp(lines[i], "ok ", 3) == 0 ||
               strncmp(lines[i], "not ok ", 7) == 0) {
      ok(lines[i][0] == 'o', "%s", d ? d + 3 : lines[i]);
      seen++;
    } else if (lines[i][0] != '1') {
      note("%s", lines[i]);
    }
    free(lines[i]);
  }
  for (; seen < 5; seen++) ok(0, "the run ended early (status %d)", rc);
  return done_testing();
}
