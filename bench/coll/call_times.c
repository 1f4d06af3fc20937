/* bench/coll/call_times.c - how long the system calls that move a
 * collective's bytes over TCP take, by size, in the thread's CPU time:
 * a library preloaded into the ranks (LD_PRELOAD) that stands between
 * them and libc's sendmsg, write, writev, read and recv.
 *
 * A loop callback over 2 ms at 4 ranks on 2 CPUs is most often one such
 * call (bench/RESULTS.md, "Loop responsiveness"). Whether cutting the
 * calls smaller would shorten it depends on whether a slow call is slow
 * in proportion to its bytes (the kernel's or the memory's work, spread
 * thin) or stalled for a time of its own (the machine): the histograms by
 * size say which. Calls of under CT_MIN bytes asked for are not counted.
 *
 * At exit each process writes CALL_TIMES_OUT/PID.txt (no file without
 * the variable), one line per call and size class:
 *   KIND CLASS CALLS SUM_NS MAX_NS MAX_WALL_NS H0 .. H6
 * H0-H6: calls under 0.25, 0.5, 1, 2, 4, 8 ms of CPU, and 8 ms or more.
 * bench/coll/call_times.py sums them; bench/coll/loop_lag.sh with
 * CALL_TIMES=1 preloads it into every job, a folder per build. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CT_MIN ((size_t)16 * 1024)

enum { K_SEND, K_RECV, KINDS };
static const char *const kind_names[KINDS] = {"send", "recv"};

/* size classes by bytes moved: under 64, 128, 256, 384, 512 KiB, exactly
 * 512 KiB (uvccl's whole send piece), more */
#define CLASSES 7
static const size_t class_top[CLASSES - 1] = {
    64 * 1024, 128 * 1024, 256 * 1024, 384 * 1024, 512 * 1024, 512 * 1024 + 1};
#define BUCKETS 7
static const uint64_t bucket_top[BUCKETS - 1] = {
    250000, 500000, 1000000, 2000000, 4000000, 8000000};

typedef struct {
  uint64_t calls, sum_ns, max_ns, max_wall_ns, hist[BUCKETS];
} cell_t;
static cell_t cells[KINDS][CLASSES];

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void max_store(uint64_t *p, uint64_t v) {
  uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
  }
}

static void note(int kind, ssize_t moved, uint64_t ns, uint64_t wall_ns) {
  cell_t *c;
  int cl = 0, b = 0;
  if (moved <= 0) return;
  while (cl < CLASSES - 1 && (size_t)moved >= class_top[cl]) cl++;
  while (b < BUCKETS - 1 && ns >= bucket_top[b]) b++;
  c = &cells[kind][cl];
  __atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&c->sum_ns, ns, __ATOMIC_RELAXED);
  __atomic_add_fetch(&c->hist[b], 1, __ATOMIC_RELAXED);
  max_store(&c->max_ns, ns);
  max_store(&c->max_wall_ns, wall_ns);
}

/* Each stand-in looks its real call up once and times it when it may
 * move CT_MIN bytes or more. */
#define REAL(name)                                                        \
  static __typeof__(name) *real_##name;                                   \
  if (real_##name == NULL)                                                \
    real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)
#define TIMED(kind, want, call)                                           \
  do {                                                                    \
    uint64_t c0, w0;                                                      \
    ssize_t r_;                                                           \
    if ((want) < CT_MIN) return call;                                     \
    c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);                               \
    w0 = clock_ns(CLOCK_MONOTONIC);                                       \
    r_ = call;                                                            \
    note(kind, r_, clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0,                \
         clock_ns(CLOCK_MONOTONIC) - w0);                                 \
    return r_;                                                            \
  } while (0)

static size_t iov_bytes(const struct iovec *iov, int n) {
  size_t s = 0;
  int i;
  for (i = 0; i < n; i++) s += iov[i].iov_len;
  return s;
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
  REAL(sendmsg);
  TIMED(K_SEND, iov_bytes(m->msg_iov, (int)m->msg_iovlen),
        real_sendmsg(fd, m, flags));
}

ssize_t write(int fd, const void *buf, size_t n) {
  REAL(write);
  TIMED(K_SEND, n, real_write(fd, buf, n));
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
  REAL(writev);
  TIMED(K_SEND, iov_bytes(iov, n), real_writev(fd, iov, n));
}

ssize_t read(int fd, void *buf, size_t n) {
  REAL(read);
  TIMED(K_RECV, n, real_read(fd, buf, n));
}

ssize_t recv(int fd, void *buf, size_t n, int flags) {
  REAL(recv);
  TIMED(K_RECV, n, real_recv(fd, buf, n, flags));
}

__attribute__((destructor)) static void call_times_write(void) {
  const char *dir = getenv("CALL_TIMES_OUT");
  char path[4096];
  FILE *f;
  int k, cl, b;
  if (dir == NULL || *dir == '\0') return;
  snprintf(path, sizeof(path), "%s/%d.txt", dir, (int)getpid());
  f = fopen(path, "w");
  if (f == NULL) return;
  for (k = 0; k < KINDS; k++)
    for (cl = 0; cl < CLASSES; cl++) {
      const cell_t *c = &cells[k][cl];
      if (c->calls == 0) continue;
      fprintf(f, "%s %d %llu %llu %llu %llu", kind_names[k], cl,
              (unsigned long long)c->calls, (unsigned long long)c->sum_ns,
              (unsigned long long)c->max_ns,
              (unsigned long long)c->max_wall_ns);
      for (b = 0; b < BUCKETS; b++)
        fprintf(f, " %llu", (unsigned long long)c->hist[b]);
      fputc('\n', f);
    }
  fclose(f);
}
