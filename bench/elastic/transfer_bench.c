/* uvccl-transfer-bench: how fast uvccl_pg_transfer brings ranks up to
 * date, against what the same bytes cost otherwise, in one run:
 *   - transfer: rank 0's SIZE bytes (in BUFS buffers, as a model's
 *     tensors are) to every other rank, along the chain, checksummed;
 *   - broadcast: the same bytes as one uvccl_broadcast from rank 0 (what
 *     one would use without a transfer call: no checksum, no check of the
 *     receivers' buffers, every rank of the group taking part);
 *   - send: the same bytes as one uvccl_send from rank 0 to rank 1 (the
 *     transport's point-to-point rate, no checksum, one receiver);
 *   - memcpy: the same bytes copied once in this process (the memory's
 *     rate, the physical limit of any of it on one host).
 * Each is started from the previous one's callback under uv_run, as a
 * server would drive it. Run under uvccl-run (env://):
 *
 *   uvccl-run -n 3 build/bench/uvccl-transfer-bench [--size 256M]
 *       [--bufs 64] [--iters 5]
 *
 * Rank 0 prints one line per measurement: the best and median of the
 * iterations, in GB/s of payload (SIZE / time). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>

#include "uvccl.h"
#include "../../tools/size_arg.h"

static uv_loop_t *loop;
static uvccl_pg_t pg;
static uvccl_work_t work;
static int failed;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_done(uvccl_work_t *w, int status) {
  if (status != 0) {
    fprintf(stderr, "rank %d: %s: %s\n", pg.rank, uvccl_strerror(status),
            w->msg);
    failed = 1;
  }
  *(int *)w->data = 1;
}

/* Runs the loop until the work's callback ran. */
static int wait_cb(int rc) {
  int done = 0;
  if (rc != 0) {
    fprintf(stderr, "rank %d: %s\n", pg.rank, uvccl_strerror(rc));
    return rc;
  }
  work.data = &done;
  while (!done) uv_run(loop, UV_RUN_ONCE);
  return failed ? -1 : 0;
}

static int barrier(void) {
  int done = 0, rc = uvccl_barrier(&pg, &work, on_done);
  if (rc != 0) return rc;
  work.data = &done;
  while (!done) uv_run(loop, UV_RUN_ONCE);
  return failed ? -1 : 0;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n, size_t size) {
  qsort(t, (size_t)n, sizeof(*t), cmp_d);
  printf("%-10s W=%d %8.1f MiB  best %7.2f GB/s  median %7.2f GB/s  "
         "(%.1f ms)\n", what, pg.size, (double)size / (1 << 20),
         (double)size / t[0] / 1e9, (double)size / t[n / 2] / 1e9,
         t[n / 2] * 1e3);
  fflush(stdout);
}

int main(int argc, char **argv) {
  size_t size = 256u << 20, nbufs = 64, per, b, i;
  int iters = 5, it, *to, k, rc;
  double *t;
  unsigned char *mem, *copy;
  uvccl_buf_t *bufs;
  for (k = 1; k < argc; k++) {
    if (strcmp(argv[k], "--size") == 0 && k + 1 < argc) {
      uint64_t v;
      if (parse_size_arg(argv[++k], (uint64_t)1 << 40, &v) != 0 || v == 0) {
        fprintf(stderr, "--size: bad size\n");
        return 2;
      }
      size = (size_t)v;
    } else if (strcmp(argv[k], "--bufs") == 0 && k + 1 < argc) {
      nbufs = (size_t)atol(argv[++k]);
    } else if (strcmp(argv[k], "--iters") == 0 && k + 1 < argc) {
      iters = atoi(argv[++k]);
    } else {
      fprintf(stderr, "usage: %s [--size BYTES] [--bufs N] [--iters N]\n",
              argv[0]);
      return 2;
    }
  }
  if (nbufs < 1 || nbufs > UVCCL_TRANSFER_MAX_BUFS || iters < 1) return 2;
  loop = uv_default_loop();
  memset(&work, 0, sizeof(work));
  if ((rc = wait_cb(uvccl_pg_init_url(loop, &pg, "env://", NULL, &work,
                                      on_done))) != 0)
    return 1;
  if (pg.size < 2) {
    fprintf(stderr, "run it with 2 ranks or more\n");
    return 2;
  }
  mem = malloc(size);
  copy = malloc(size);
  bufs = calloc(nbufs, sizeof(*bufs));
  to = calloc((size_t)pg.size, sizeof(int));
  t = calloc((size_t)iters, sizeof(double));
  if (!mem || !copy || !bufs || !to || !t) return 1;
  for (i = 0; i < size; i++) mem[i] = (unsigned char)(pg.rank ? 0 : i * 7);
  memset(copy, 1, size);
  per = size / nbufs;
  for (b = 0; b < nbufs; b++) {
    bufs[b].base = mem + b * per;
    bufs[b].len = b + 1 < nbufs ? per : size - b * per;
  }
  for (k = 1; k < pg.size; k++) to[k - 1] = k;
  if (pg.rank == 0)
    printf("# uvccl-transfer-bench: %zu bytes in %zu buffers, %d "
           "iterations, rank 0 -> 1 .. %d\n", size, nbufs, iters,
           pg.size - 1);

  for (it = 0; it < iters; it++) { /* transfer */
    double t0;
    if (barrier() != 0) return 1;
    t0 = now_s();
    if (wait_cb(uvccl_pg_transfer(&pg, &work, bufs, nbufs, 0, to,
                                  pg.size - 1, 11, on_done)) != 0)
      return 1;
    t[it] = now_s() - t0;
  }
  if (pg.rank != 0)
    for (i = 0; i < size; i++)
      if (mem[i] != (unsigned char)(i * 7)) {
        fprintf(stderr, "rank %d: byte %zu wrong\n", pg.rank, i);
        return 1;
      }
  if (barrier() != 0) return 1;
  if (pg.rank == 0) report("transfer", t, iters, size);

  for (it = 0; it < iters; it++) { /* broadcast */
    double t0;
    if (barrier() != 0) return 1;
    t0 = now_s();
    if (wait_cb(uvccl_broadcast(&pg, &work, pg.rank == 0 ? mem : copy, size,
                                UVCCL_UINT8, 0, on_done)) != 0)
      return 1;
    if (barrier() != 0) return 1; /* the root's part ends before others' */
    t[it] = now_s() - t0;
  }
  if (pg.rank == 0) report("broadcast", t, iters, size);

  for (it = 0; it < iters; it++) { /* send */
    double t0;
    if (barrier() != 0) return 1;
    t0 = now_s();
    if (pg.rank == 0)
      rc = wait_cb(uvccl_send(&pg, &work, mem, size, 1, 12, on_done));
    else if (pg.rank == 1)
      rc = wait_cb(uvccl_recv(&pg, &work, copy, size, 0, 12, on_done));
    else
      rc = 0;
    if (rc != 0) return 1;
    t[it] = now_s() - t0;
    if (barrier() != 0) return 1; /* rank 0's send ends when written */
    if (pg.rank == 0) t[it] = now_s() - t0;
  }
  if (pg.rank == 0) report("send", t, iters, size);

  for (it = 0; it < iters; it++) { /* memcpy */
    double t0 = now_s();
    memcpy(copy, mem, size);
    t[it] = now_s() - t0;
    if (copy[size / 2] != mem[size / 2]) return 1;
  }
  if (pg.rank == 0) report("memcpy", t, iters, size);

  uvccl_pg_destroy(&pg, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  free(mem);
  free(copy);
  free(bufs);
  free(to);
  free(t);
  return 0;
}
