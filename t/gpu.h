/* Helpers for the GPU tests (t/3003, t/3005, t/3010): device buffers
 * through uvccl's blocking helpers, running a loop for a while, making
 * NCCL ranks.
 * Header-only; include after tap.h and uvccl.h. */
#ifndef UVCCL_T_GPU_H
#define UVCCL_T_GPU_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void gpu__on_sleep(uv_timer_t *t) { uv_stop(t->loop); }

/* Runs loop for about ms milliseconds. */
static inline void run_loop_for(uv_loop_t *loop, uint64_t ms) {
  uv_timer_t t;
  uv_timer_init(loop, &t);
  uv_timer_start(&t, gpu__on_sleep, ms, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

/* n bytes of device memory on device; bails out of the test if it fails. */
static inline void *dev_on(int device, size_t n) {
  void *p = NULL;
  if (uvccl_gpu_malloc(device, &p, n ? n : 1) != 0) {
    printf("Bail out! uvccl_gpu_malloc on device %d\n", device);
    exit(1);
  }
  return p;
}

static inline void put(void *d, const void *h, size_t n) {
  if (uvccl_gpu_memcpy(d, h, n) != 0) printf("# memcpy to device failed\n");
}

static inline void get(void *h, const void *d, size_t n) {
  if (uvccl_gpu_memcpy(h, d, n) != 0) printf("# memcpy from device failed\n");
}

/* Starts the creation of n NCCL ranks in this process, rank r on device r,
 * through one store: pgs[r] with work w[r]; other options from base (may
 * be NULL; timeout 10 s unless it says). 1 if every call started; the
 * caller waits for w. */
static inline int nccl_ranks_start(uv_loop_t *loop, uvccl_store_t *store,
                                   uvccl_pg_t *pgs, uvccl_work_t *w, int n,
                                   const char *prefix,
                                   const uvccl_pg_options_t *base) {
  uvccl_pg_options_t o;
  int r, good = 1;
  memset(w, 0, sizeof(*w) * (size_t)n);
  for (r = 0; r < n; r++) {
    if (base != NULL)
      o = *base;
    else
      memset(&o, 0, sizeof(o));
    o.rank = r;
    o.size = n;
    o.backend = UVCCL_BACKEND_NCCL;
    o.device = r;
    o.prefix = prefix;
    if (o.timeout_ms == 0) o.timeout_ms = 10000;
    if (uvccl_pg_init(loop, &pgs[r], store, &o, &w[r], NULL) != 0) good = 0;
  }
  return good;
}

/* Runs this test program (self) again in a child with env T_CHILD=old
 * and UVCCL_NCCL=nccl (an older fake, say): what it printed goes to buf.
 * 0, or -1 if it could not run. */
static inline int run_child_with_nccl(const char *self, const char *nccl,
                                      char *buf, size_t len) {
  int p[2], st = 0;
  ssize_t n;
  pid_t pid;
  buf[0] = '\0';
  if (pipe(p) != 0) return -1;
  pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(p[1], 1);
    setenv("UVCCL_NCCL", nccl, 1);
    setenv("T_CHILD", "old", 1);
    execl(self, self, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  n = read(p[0], buf, len - 1);
  if (n > 0) buf[n] = '\0';
  close(p[0]);
  waitpid(pid, &st, 0);
  return 0;
}

#endif
