/* bench/coll/cma_copy.c - what a single copy through process_vm_readv
 * costs on this machine next to memcpy: the question behind
 * UVCCL_SHM_CMA (src/cpu/xport/shm.c) and Open MPI vader's single copy.
 *
 * A child holds a source buffer; the parent reads it with
 * process_vm_readv in steps (as uvccl's receiver does, 1 MiB), then
 * copies its own buffer of the same size with memcpy; best of 5 rounds
 * of enough repetitions to take about 0.2 s each.
 *
 *   cc -O2 -o build/bench/cma_copy bench/coll/cma_copy.c
 *   build/bench/cma_copy [SIZE_BYTES...]   (default 256K 1M 4M 16M 64M) */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STEP (1u << 20)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int read_remote(pid_t pid, char *dst, const char *src, size_t n) {
  size_t off;
  for (off = 0; off < n; off += STEP) {
    size_t k = n - off < STEP ? n - off : STEP;
    struct iovec l = {dst + off, k}, r = {(void *)(src + off), k};
    if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)k) return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const size_t dflt[] = {256u << 10, 1u << 20, 4u << 20, 16u << 20,
                                64u << 20};
  size_t nsizes = argc > 1 ? (size_t)(argc - 1) : 5, i, maxn = 0;
  size_t *sizes = calloc(nsizes, sizeof(*sizes));
  char *src, *dst, *own;
  pid_t child;
  for (i = 0; i < nsizes; i++) {
    sizes[i] = argc > 1 ? strtoull(argv[i + 1], NULL, 10) : dflt[i];
    if (sizes[i] > maxn) maxn = sizes[i];
  }
  src = malloc(maxn);
  dst = malloc(maxn);
  own = malloc(maxn);
  if (src == NULL || dst == NULL || own == NULL) return 1;
  memset(src, 1, maxn);
  memset(dst, 2, maxn);
  memset(own, 3, maxn);
  child = fork();
  if (child == 0) {
    /* its own copy of src (written after the fork: not shared pages) */
    memset(src, 4, maxn);
    pause();
    _exit(0);
  }
  usleep(100000);
  printf("| size | process_vm_readv GB/s | memcpy GB/s | ratio |\n");
  printf("|---:|---:|---:|---:|\n");
  for (i = 0; i < nsizes; i++) {
    size_t n = sizes[i];
    int reps = (int)(200e6 / (double)n) + 1, k, round;
    double best_c = 0, best_m = 0;
    for (round = 0; round < 5; round++) {
      double t0 = now_s(), t1, t2;
      for (k = 0; k < reps; k++)
        if (read_remote(child, dst, src, n) != 0) {
          fprintf(stderr, "process_vm_readv: %s\n", strerror(errno));
          kill(child, SIGKILL);
          return 1;
        }
      t1 = now_s();
      for (k = 0; k < reps; k++) {
        memcpy(dst, own, n);
        __asm__ volatile("" ::: "memory");
      }
      t2 = now_s();
      if ((double)n * reps / (t1 - t0) > best_c) best_c = (double)n * reps / (t1 - t0);
      if ((double)n * reps / (t2 - t1) > best_m) best_m = (double)n * reps / (t2 - t1);
    }
    printf("| %zu | %.2f | %.2f | %.2f |\n", n, best_c / 1e9, best_m / 1e9,
           best_c / best_m);
  }
  if (dst[0] != 4 && dst[0] != 3) fprintf(stderr, "unexpected byte\n");
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  return 0;
}
