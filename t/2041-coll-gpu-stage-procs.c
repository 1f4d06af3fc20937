/* GPU buffers staged through the TCP groups, ranks as separate processes
 * sharing one device: uvccl-bench --gpu under uvccl-run, every op, each
 * result checked by the bench itself (device buffers copied back and
 * compared), whole and in chunks (UVCCL_STAGE_CHUNK). On a machine with
 * a GPU the real CUDA runtime is used;
 * elsewhere the fake one (t/fake/cudart.c) stands in. */
#include "tap.h"
#include "uvccl.h"

#include <stdlib.h>
#include <sys/wait.h>

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

/* 1 if the real CUDA runtime sees a device: asked in a child, since what
 * the runtime loads stays loaded for the process. */
static int real_gpu(void) {
  int status, count = 0;
  pid_t pid;
  fflush(stdout);
  pid = fork();
  if (pid == 0)
    _exit(uvccl_gpu_device_count(&count) == 0 && count > 0 ? 0 : 1);
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
  int count = 0;
  tap_alarm(240);
  /* a real GPU where there is one (UVCCL_CUDART unset), else the fake */
  if (getenv("UVCCL_CUDART") == NULL && !real_gpu())
    setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  else
    printf("# the real CUDA runtime\n");
  if (uvccl_gpu_device_count(&count) != 0 || count < 1)
    skip_all("no CUDA runtime for the test (%s)",
             uvccl_gpu_unavailable_reason());
  run(2, "", "2 ranks on one device");
  run(3, "--inplace", "3 ranks on one device, allreduce in place");
  /* 64 KiB chunks: from 64 KiB up, every cut collective in chunks */
  setenv("UVCCL_STAGE_CHUNK", "65536", 1);
  run(3, "", "3 ranks, staged in 64 KiB chunks");
  unsetenv("UVCCL_STAGE_CHUNK");
  done_testing();
}
