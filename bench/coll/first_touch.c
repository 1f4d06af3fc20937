/* bench/coll/first_touch.c - what touching newly mapped memory costs the
 * thread that touches it, in steps of a loop turn's size: the question
 * behind a collective's scratch kept for the next one
 * (UVCCL_SCRATCH_KEEP_MS, src/cpu/sched.c) and behind callbacks that took
 * milliseconds of CPU on virtual machines (bench/RESULTS.md).
 *
 * Maps SIZE_GIB of anonymous memory and writes one byte a page, 128 KiB
 * (a turn's step) at a time, reading the thread's CPU clock and the wall
 * clock around each step. Run it twice: on a guest whose host takes freed
 * memory back (virtio-balloon free page reporting), the first run's
 * touches are the host's to back again.
 *
 *   cc -O2 -o build/bench/first_touch bench/coll/first_touch.c
 *   build/bench/first_touch [SIZE_GIB]   (default 4) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define STEP ((size_t)128 * 1024)

static double ns(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  size_t gib = argc > 1 ? strtoul(argv[1], NULL, 10) : 4, n = gib << 30, o, k;
  double worst = 0, worst_wall = 0, total = 0;
  long over1 = 0, over2 = 0, steps = 0;
  char *p;
  if (gib == 0) {
    fprintf(stderr, "usage: %s [SIZE_GIB]\n", argv[0]);
    return 2;
  }
  p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
           0);
  if (p == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  for (o = 0; o < n; o += STEP) {
    double c0 = ns(CLOCK_THREAD_CPUTIME_ID), w0 = ns(CLOCK_MONOTONIC), c, w;
    for (k = 0; k < STEP; k += 4096) p[o + k] = 1;
    c = ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    w = ns(CLOCK_MONOTONIC) - w0;
    total += c;
    steps++;
    if (c > worst) worst = c;
    if (w > worst_wall) worst_wall = w;
    over1 += c > 1e6;
    over2 += c > 2e6;
  }
  printf("%zu GiB in 128 KiB steps: %ld steps, CPU %.0f ms in all, %.1f us a "
         "step, longest %.2f ms (wall %.2f), over 1 ms %ld, over 2 ms %ld\n",
         gib, steps, total / 1e6, total / (double)steps / 1e3, worst / 1e6,
         worst_wall / 1e6, over1, over2);
  munmap(p, n);
  return 0;
}
