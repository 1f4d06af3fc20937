/* Loading CUDA at run time: the reason given when it cannot be used (no
 * library, no driver, no device, CUDA=no builds), the error codes, and,
 * against the fake runtime (t/fake/cudart.c), the blocking helpers: count,
 * info, allocation, copies, pointer queries. The load state is per
 * process, so each case runs in a forked child. */
#include "tap.h"
#include "uvccl.h"

#include <sys/wait.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"

/* Runs fn in a child that continues the TAP numbering; the parent picks
 * up the child's counts. */
static void run_case(const char *what, void (*fn)(void)) {
  int fds[2], status, counts[2] = {0, 0};
  pid_t pid;
  fflush(stdout);
  if (pipe(fds) != 0) abort();
  pid = fork();
  if (pid == 0) {
    close(fds[0]);
    fn();
    fflush(stdout);
    counts[0] = tap__n;
    counts[1] = tap__failed;
    if (write(fds[1], counts, sizeof(counts)) != sizeof(counts)) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  if (read(fds[0], counts, sizeof(counts)) == sizeof(counts)) {
    tap__n = counts[0];
    tap__failed = counts[1];
  }
  close(fds[0]);
  waitpid(pid, &status, 0);
  ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child exited", what);
}

static int contains(const char *s, const char *sub) {
  return s != NULL && sub != NULL && strstr(s, sub) != NULL;
}

/* Every entry point reports UVCCL_ENOGPU and the same reason. */
static void check_unavailable(const char *expect_in_reason) {
  int n = 7, dev = 7;
  void *p = NULL;
  const char *reason;
  is_int(uvccl_gpu_device_count(&n), UVCCL_ENOGPU, "device_count: ENOGPU");
  is_int(n, 0, "count is 0");
  reason = uvccl_gpu_unavailable_reason();
  ok(contains(reason, expect_in_reason), "reason says '%s': %s",
     expect_in_reason, reason ? reason : "(null)");
  is_int(uvccl_gpu_info(0, NULL, 0, NULL, NULL), UVCCL_ENOGPU, "info: ENOGPU");
  is_int(uvccl_gpu_malloc(0, &p, 16), UVCCL_ENOGPU, "malloc: ENOGPU");
  ok(p == NULL, "no pointer");
  is_int(uvccl_gpu_host_alloc(&p, 16), UVCCL_ENOGPU, "host_alloc: ENOGPU");
  is_int(uvccl_gpu_memcpy(&n, &dev, sizeof(n)), UVCCL_ENOGPU,
         "memcpy: ENOGPU");
  is_int(uvccl_gpu_ptr_device(&n, &dev), UVCCL_ENOGPU, "ptr_device: ENOGPU");
  is_int(dev, -1, "ptr_device: device -1");
}

static void case_real(void) {
  int n = 0, drv = 0, rt = 0, r;
  char name[256] = "";
  unsetenv("UVCCL_CUDART");
  r = uvccl_gpu_device_count(&n);
  if (r == 0) {
    note("real CUDA: %d device(s)", n);
    ok(n > 0, "real CUDA: devices counted");
    is_int(uvccl_gpu_info(0, name, sizeof(name), &drv, &rt), 0, "info(0)");
    note("device 0: %s, driver %d, runtime %d", name, drv, rt);
    ok(uvccl_gpu_unavailable_reason() == NULL, "no reason when available");
    return;
  }
  note("real CUDA unavailable: %s", uvccl_gpu_unavailable_reason());
#ifdef UVCCL_NO_CUDA
  check_unavailable("built without CUDA (CUDA=no)");
#else
  /* No library, or (this machine) a library without a driver. */
  if (contains(uvccl_gpu_unavailable_reason(), "cannot load"))
    check_unavailable("libcudart");
  else
    check_unavailable("cudaGetDeviceCount: ");
#endif
}

static void case_missing_path(void) {
  setenv("UVCCL_CUDART", "/nonexistent/libcudart.so.13", 1);
#ifdef UVCCL_NO_CUDA
  check_unavailable("CUDA=no");
#else
  check_unavailable("UVCCL_CUDART=/nonexistent/libcudart.so.13");
#endif
}

static void case_fake_no_driver(void) {
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("FAKE_CUDA_NO_DRIVER", "1", 1);
#ifdef UVCCL_NO_CUDA
  check_unavailable("CUDA=no");
#else
  check_unavailable("CUDA driver version is insufficient");
#endif
}

static void case_fake_no_device(void) {
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("FAKE_CUDA_DEVICES", "0", 1);
#ifdef UVCCL_NO_CUDA
  check_unavailable("CUDA=no");
#else
  check_unavailable("cudaErrorNoDevice");
#endif
}

#ifndef UVCCL_NO_CUDA
static char last_log[256];
static void capture_log(uvccl_log_level_t level, const char *component,
                        const char *line, void *arg) {
  snprintf(last_log, sizeof(last_log), "%s: %s", component, line);
}

static void case_fake(void) {
  int n = 0, drv = 0, rt = 0, dev = 9, i;
  char name[64] = "";
  unsigned char src[4096], back[4096];
  void *d = NULL, *h = NULL;
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  is_int(uvccl_gpu_device_count(&n), 0, "fake: device_count");
  is_int(n, 2, "fake: 2 devices (FAKE_CUDA_DEVICES)");
  ok(uvccl_gpu_unavailable_reason() == NULL, "no reason when available");
  is_int(uvccl_gpu_info(1, name, sizeof(name), &drv, &rt), 0, "info(1)");
  is_str(name, "Fake CUDA Device 1", "device name");
  is_int(drv, 13000, "driver version");
  is_int(rt, 13000, "runtime version");
  is_int(uvccl_gpu_info(1, name, 5, NULL, NULL), 0, "info: short buffer");
  is_str(name, "Fake", "name truncated to namelen");
  is_int(uvccl_gpu_info(2, name, sizeof(name), NULL, NULL), UV_EINVAL,
         "info(2): no such device");
  is_int(uvccl_gpu_malloc(-1, &d, 16), UV_EINVAL, "malloc(-1): EINVAL");

  for (i = 0; i < (int)sizeof(src); i++) src[i] = (unsigned char)(i * 7 + 3);
  is_int(uvccl_gpu_malloc(1, &d, sizeof(src)), 0, "malloc on device 1");
  is_int(uvccl_gpu_host_alloc(&h, sizeof(src)), 0, "pinned host_alloc");
  is_int(uvccl_gpu_memcpy(d, src, sizeof(src)), 0, "memcpy host -> device");
  is_int(uvccl_gpu_memcpy(h, d, sizeof(src)), 0, "memcpy device -> pinned");
  memset(back, 0, sizeof(back));
  is_int(uvccl_gpu_memcpy(back, h, sizeof(src)), 0, "memcpy pinned -> host");
  ok(memcmp(back, src, sizeof(src)) == 0, "round trip: exact bytes");
  is_int(uvccl_gpu_memset(d, 0xab, 100), 0, "memset");
  is_int(uvccl_gpu_memcpy(back, d, 101), 0, "memcpy back");
  ok(back[0] == 0xab && back[99] == 0xab && back[100] == src[100],
     "memset wrote exactly n bytes");
  is_int(uvccl_gpu_memcpy(back, d, 0), 0, "memcpy of 0 bytes");

  is_int(uvccl_gpu_ptr_device(d, &dev), 1, "ptr_device: device memory");
  is_int(dev, 1, "ptr_device: on device 1");
  is_int(uvccl_gpu_ptr_device((char *)d + 100, &dev), 1,
         "ptr_device: inside an allocation");
  is_int(uvccl_gpu_ptr_device(h, &dev), 0, "ptr_device: pinned host is not");
  is_int(dev, -1, "ptr_device: device -1 for host memory");
  is_int(uvccl_gpu_ptr_device(src, NULL), 0, "ptr_device: stack memory");

  is_int(uvccl_gpu_free(d), 0, "free");
  is_int(uvccl_gpu_host_free(h), 0, "host_free");
  is_int(uvccl_gpu_free(NULL), 0, "free(NULL)");
  uvccl_log_set_sink(capture_log, NULL);
  is_int(uvccl_gpu_free(src), UV_EINVAL, "free of a non-device pointer");
  uvccl_log_set_sink(NULL, NULL);
  ok(strstr(last_log, "cudaFree: invalid argument") != NULL,
     "the log says which call failed: %s", last_log);
}
#endif

int main(void) {
  tap_alarm(60);
  is_str(uvccl_err_name(UVCCL_ENOGPU), "UVCCL_ENOGPU", "err_name ENOGPU");
  is_str(uvccl_err_name(UVCCL_ECUDA), "UVCCL_ECUDA", "err_name ECUDA");
  is_str(uvccl_err_name(UVCCL_ENCCL), "UVCCL_ENCCL", "err_name ENCCL");
  is_str(uvccl_strerror(UVCCL_ENOGPU), "no GPU available", "strerror ENOGPU");
  is_str(uvccl_strerror(UVCCL_ECUDA), "CUDA error", "strerror ECUDA");
  is_str(uvccl_strerror(UVCCL_ENCCL), "NCCL error", "strerror ENCCL");

  run_case("real libcudart", case_real);
  run_case("UVCCL_CUDART=/nonexistent", case_missing_path);
  run_case("fake without a driver", case_fake_no_driver);
  run_case("fake with no device", case_fake_no_device);
#ifdef UVCCL_NO_CUDA
  note("built with CUDA=no: the fake is not loaded");
#else
  run_case("fake runtime", case_fake);
#endif
  return done_testing();
}
