/* The C library's own figures for bench/bindings: back-to-back allreduces,
 * each started from the previous one's callback under uv_run (as a server
 * runs them), so the bindings' overhead per call is what they add to
 * this. env:// (run it with uvccl-run). Prints, for each size, a line
 *   c SIZE_BYTES ITERS US_PER_OP BUSBW_GBPS
 * on rank 0. Usage: uvccl-bindings-chain [sizes...] (default 4 1M 16M). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "uvccl.h"

static uv_loop_t loop;
static uvccl_pg_t pg;
static uvccl_work_t work;
static float *buf;
static size_t count;
static int left, iters, sizes_i, nsizes;
static size_t sizes[16];
static uint64_t t0;
static int failed;

static void next_size(void);

static void one_done(uvccl_work_t *w, int status) {
  if (status < 0) {
    fprintf(stderr, "allreduce: %s\n", w->msg);
    failed = 1;
    return;
  }
  if (left-- > 0) {
    uvccl_allreduce(&pg, &work, buf, buf, count, UVCCL_FLOAT32, UVCCL_SUM,
                    one_done);
    return;
  }
  {
    double us = (double)(uv_hrtime() - t0) / 1e3 / iters;
    double bytes = (double)count * 4;
    double busbw = bytes * 2.0 * (pg.size - 1) / pg.size / (us * 1e3);
    if (pg.rank == 0)
      printf("c %zu %d %.2f %.3f\n", count * 4, iters, us, busbw);
    fflush(stdout);
  }
  next_size();
}

static void warm_done(uvccl_work_t *w, int status) {
  if (status < 0) {
    fprintf(stderr, "allreduce: %s\n", w->msg);
    failed = 1;
    return;
  }
  if (left-- > 0) {
    uvccl_allreduce(&pg, &work, buf, buf, count, UVCCL_FLOAT32, UVCCL_SUM,
                    warm_done);
    return;
  }
  left = iters - 1;
  t0 = uv_hrtime();
  uvccl_allreduce(&pg, &work, buf, buf, count, UVCCL_FLOAT32, UVCCL_SUM,
                  one_done);
}

static void next_size(void) {
  size_t bytes;
  if (sizes_i == nsizes) {
    uvccl_pg_destroy(&pg, NULL);
    return;
  }
  bytes = sizes[sizes_i++];
  count = bytes / 4 ? bytes / 4 : 1;
  free(buf);
  buf = calloc(count, 4);
  /* about a second of each, as the Python side does */
  iters = bytes <= 4096 ? 20000 : bytes <= (2u << 20) ? 400 : 30;
  left = iters / 10;
  uvccl_allreduce(&pg, &work, buf, buf, count, UVCCL_FLOAT32, UVCCL_SUM,
                  warm_done);
}

static void ready(uvccl_work_t *w, int status) {
  if (status < 0) {
    fprintf(stderr, "init: %s\n", w->msg);
    failed = 1;
    return;
  }
  next_size();
}

static size_t parse_size(const char *s) {
  char *end;
  size_t v = strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  return v;
}

int main(int argc, char **argv) {
  int i;
  static uvccl_work_t init;
  for (i = 1; i < argc && nsizes < 16; i++) sizes[nsizes++] = parse_size(argv[i]);
  if (nsizes == 0) {
    sizes[0] = 4;
    sizes[1] = 1 << 20;
    sizes[2] = 16 << 20;
    nsizes = 3;
  }
  uv_loop_init(&loop);
  if (uvccl_pg_init_url(&loop, &pg, "env://", NULL, &init, ready) < 0) return 1;
  uv_run(&loop, UV_RUN_DEFAULT);
  free(buf);
  uv_loop_close(&loop);
  return failed;
}
