/* NCCL group overhead on one GPU (a one-rank communicator): what uvccl's
 * loop + device-thread machinery costs on top of calling NCCL directly.
 *
 *  - completion latency: for one op at a time, the time from the device
 *    thread seeing the end event complete to done() on the loop
 *    (t_gpu_done_ns -> t_done_ns of the op), and the whole round trip
 *    (call -> callback);
 *  - per-operation overhead: K small allreduces queued back to back,
 *    wall time / K, against K ncclAllReduce calls in a loop on this
 *    thread followed by one cudaStreamSynchronize (the nccl-tests way).
 *
 * Prints a table; exits 0 with "no CUDA device" where there is none. See
 * README.md for the build line. */
#include "uvccl.h"
#include "cuda/cuda_api.h"
#include "nccl/nccl.h"
#include "nccl/nccl_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uv_loop_t *loop;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return v[(int)(p * (n - 1))];
}

static int done_count;
static void on_done(uvccl_work_t *w, int status) {
  (void)w;
  if (status != 0) fprintf(stderr, "op failed: %s\n", w->msg);
  done_count++;
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000, n = 0, i, rc;
  size_t sizes[] = {4, 4096, 1 << 20};
  size_t si;
  char name[256] = "", err[256] = "";
  int drv = 0, rt = 0;
  uvccl_store_t store;
  uvccl_pg_t pg;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0}, *ws;
  void *a, *b;
  if (iters < 10) iters = 10;
  if (uvccl_gpu_device_count(&n) != 0 || n <= 0) {
    printf("no CUDA device (%s)\n", uvccl_gpu_unavailable_reason()
                                        ? uvccl_gpu_unavailable_reason()
                                        : "none counted");
    return 0;
  }
  if (uvccl__nccl_api_load(err, sizeof(err)) != 0) {
    printf("no NCCL (%s)\n", err);
    return 0;
  }
  uvccl_gpu_info(0, name, sizeof(name), &drv, &rt);
  printf("# %s, driver %d, CUDA %d, NCCL %d, %d iterations\n", name, drv, rt,
         uvccl__nccl.version, iters);
  loop = uv_default_loop();
  uvccl_hash_store_init(loop, &store);
  memset(&o, 0, sizeof(o));
  o.size = 1;
  o.backend = UVCCL_BACKEND_NCCL;
  o.device = 0;
  rc = uvccl_pg_init(loop, &pg, &store, &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) {
    fprintf(stderr, "pg_init: %s\n", w.msg);
    return 1;
  }
  ws = calloc((size_t)iters, sizeof(*ws));
  uvccl_gpu_malloc(0, &a, 1 << 20);
  uvccl_gpu_malloc(0, &b, 1 << 20);

  printf("%-10s %12s %12s %12s %12s %12s %12s\n", "bytes", "cb_lat_p50",
         "cb_lat_p99", "rtt_p50", "uvccl/op", "nccl/op", "overhead");
  printf("%-10s %12s %12s %12s %12s %12s %12s\n", "", "(us)", "(us)", "(us)",
         "(us)", "(us)", "(us)");
  for (si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
    size_t count = sizes[si] / 4;
    double *lat = calloc((size_t)iters, sizeof(double));
    double *rtt = calloc((size_t)iters, sizeof(double));
    double t0, per_uvccl, per_nccl;
    uint64_t times[4];
    /* 1. one at a time: event seen -> callback, and the round trip */
    for (i = 0; i < iters; i++) {
      t0 = now_us();
      uvccl_allreduce(&pg, &w, a, b, count, UVCCL_FLOAT32, UVCCL_SUM, NULL);
      uvccl_work_wait(&w);
      rtt[i] = now_us() - t0;
      uvccl__nccl_pg_times(&pg, times);
      lat[i] = (times[3] - times[2]) / 1e3;
    }
    /* 2. back to back through uvccl */
    done_count = 0;
    t0 = now_us();
    for (i = 0; i < iters; i++)
      uvccl_allreduce(&pg, &ws[i], a, b, count, UVCCL_FLOAT32, UVCCL_SUM,
                      on_done);
    while (done_count < iters) uv_run(loop, UV_RUN_ONCE);
    per_uvccl = (now_us() - t0) / iters;
    /* 3. back to back, NCCL directly on this thread (blocking comm) */
    {
      uvccl__nccl_unique_id_t id;
      uvccl__nccl_config_t cfg;
      uvccl__nccl_comm_t comm = NULL;
      void *s = NULL;
      int st = 0;
      uvccl__cuda.SetDevice(0);
      uvccl__cuda.StreamCreateWithFlags(&s, UVCCL__CUDA_STREAM_NON_BLOCKING);
      uvccl__nccl_config_init(&cfg);
      cfg.blocking = 1;
      uvccl__nccl.GetUniqueId(&id);
      st = uvccl__nccl.CommInitRankConfig(&comm, 1, id, 0, &cfg);
      if (st != 0) {
        fprintf(stderr, "direct ncclCommInitRankConfig: %d\n", st);
        return 1;
      }
      for (i = 0; i < 10; i++)
        uvccl__nccl.AllReduce(a, b, count, UVCCL__NCCL_FLOAT32,
                              UVCCL__NCCL_SUM, comm, s);
      uvccl__cuda.StreamSynchronize(s);
      t0 = now_us();
      for (i = 0; i < iters; i++)
        uvccl__nccl.AllReduce(a, b, count, UVCCL__NCCL_FLOAT32,
                              UVCCL__NCCL_SUM, comm, s);
      uvccl__cuda.StreamSynchronize(s);
      per_nccl = (now_us() - t0) / iters;
      uvccl__nccl.CommDestroy(comm);
      uvccl__cuda.StreamDestroy(s);
    }
    printf("%-10zu %12.1f %12.1f %12.1f %12.2f %12.2f %12.2f\n", sizes[si],
           pct(lat, iters, 0.5), pct(lat, iters, 0.99), pct(rtt, iters, 0.5),
           per_uvccl, per_nccl, per_uvccl - per_nccl);
    free(lat);
    free(rtt);
  }
  uvccl_pg_destroy(&pg, NULL);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  uvccl_gpu_free(a);
  uvccl_gpu_free(b);
  free(ws);
  return 0;
}
