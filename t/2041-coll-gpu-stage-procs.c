/* GPU buffers staged through the TCP groups, ranks as separate processes
 * sharing one device: uvccl-bench --gpu under uvccl-run, every op, each
 * result checked by the bench itself (device buffers copied back and
 * compared). The fake CUDA runtime stands in for the GPU here; with
 * UVCCL_TEST_REAL_GPU=1 (on a machine with one) the real one is used. */
#include "tap.h"
#include "uvccl.h"

#include <stdlib.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"

static void run(int n, const char *extra, const char *what) {
  char cmd[1024], line[512];
  FILE *f;
  int rows = 0, bad = 0, status;
  snprintf(cmd, sizeof(cmd),
           "%s/bin/uvccl-run -n %d %s/bin/uvccl-bench --gpu --op all -b 4 "
           "-e 1M -f 16 --budget 0.01 --timeout 60 %s 2>&1",
           UVCCL_BUILD_DIR, n, UVCCL_BUILD_DIR, extra);
  f = popen(cmd, "r");
  if (f == NULL) {
    ok(0, "%s: popen", what);
    return;
  }
  while (fgets(line, sizeof(line), f) != NULL) {
    char op[32], okw[8];
    int w;
    unsigned long long sz;
    if (sscanf(line, "[0] %31s %d %llu %*d %*f %*f %*s %*s %7s", op, &w, &sz,
               okw) == 4) {
      rows++;
      if (strcmp(okw, "yes") != 0) {
        bad++;
        printf("# %s", line);
      }
    } else if (strstr(line, "rror") != NULL || strstr(line, "FAIL") != NULL) {
      printf("# %s", line);
    }
  }
  status = pclose(f);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: every rank exits 0",
     what);
  ok(rows >= 9 * 3 && bad == 0, "%s: %d rows checked, %d wrong", what, rows,
     bad);
}

int main(void) {
  int count = 0;
  tap_alarm(240);
  if (getenv("UVCCL_TEST_REAL_GPU") == NULL)
    setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  if (uvccl_gpu_device_count(&count) != 0 || count < 1)
    skip_all("no CUDA runtime for the test (%s)",
             uvccl_gpu_unavailable_reason());
  run(2, "", "2 ranks on one device");
  run(3, "--inplace", "3 ranks on one device, allreduce in place");
  done_testing();
}
