/* What mesh authentication costs a world's creation: each rank reaches
 * one store (rank 0 serves it), then makes and destroys a world over it N
 * times (a fresh prefix each time, so every round is a whole creation:
 * listen, publish, connect the full mesh and the liveness links with
 * their handshakes, the store barrier). Rank 0 prints the median and the
 * 90th percentile of its creation times in ms. With $UVCCL_AUTH_TOKEN set
 * (uvccl-run sets one unless --no-auth) the store and every connection
 * prove it; without, nothing does.
 *
 *   uvccl-run -n 8 [--no-auth] uvccl-create-bench N
 * (bench/auth/run.sh runs it both ways.) */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int closed;
static void on_closed(uvccl_pg_t *pg) { (void)pg; closed = 1; }
static void on_store_closed(uvccl_store_t *s) { (void)s; closed = 1; }
static void on_server_closed(uvccl_store_server_t *s) { (void)s; closed = 1; }

static const char *env(const char *name) {
  const char *v = getenv(name);
  if (v == NULL) {
    fprintf(stderr, "uvccl-create-bench: $%s is not set (run it under "
            "uvccl-run)\n", name);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  uv_loop_t loop;
  uvccl_store_server_t sv;
  uvccl_store_t st;
  uvccl_tcp_store_options_t co;
  int rank = atoi(env("RANK")), size = atoi(env("WORLD_SIZE"));
  int port = atoi(env("MASTER_PORT")), i, n, rc;
  const char *host = env("MASTER_ADDR");
  uint64_t *t;
  if (argc < 2 || (n = atoi(argv[1])) <= 0) {
    fprintf(stderr, "usage: uvccl-create-bench N   (under uvccl-run)\n");
    return 2;
  }
  t = calloc((size_t)n, sizeof(*t));
  uv_loop_init(&loop);
  if (rank == 0) {
    uvccl_store_server_options_t so;
    memset(&so, 0, sizeof(so));
    so.listen_fd = -1;
    so.host = host;
    so.port = port;
    rc = uvccl_store_server_init(&loop, &sv, &so);
    if (rc != 0) {
      fprintf(stderr, "store server: %s\n", uvccl_strerror(rc));
      return 1;
    }
  }
  memset(&co, 0, sizeof(co));
  co.host = host;
  co.port = port;
  co.timeout_ms = 30000;
  rc = uvccl_tcp_store_init(&loop, &st, &co);
  if (rc != 0) {
    fprintf(stderr, "store client: %s\n", uvccl_strerror(rc));
    return 1;
  }
  for (i = 0; i < n; i++) {
    uvccl_pg_t pg;
    uvccl_pg_options_t o;
    uvccl_work_t w = {0};
    char prefix[64];
    uint64_t t0;
    memset(&o, 0, sizeof(o));
    snprintf(prefix, sizeof(prefix), "create-bench/%d", i);
    o.rank = rank;
    o.size = size;
    o.prefix = prefix;
    o.timeout_ms = 60000;
    o.heartbeat_timeout_ms = 0; /* the default: links and heartbeats on */
    t0 = uv_hrtime();
    rc = uvccl_pg_init(&loop, &pg, &st, &o, &w, NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    t[i] = uv_hrtime() - t0;
    if (rc != 0) {
      fprintf(stderr, "rank %d: creation %d: %s: %s\n", rank, i,
              uvccl_err_name(rc), w.msg);
      return 1;
    }
    closed = 0;
    uvccl_pg_destroy(&pg, on_closed);
    while (!closed) uv_run(&loop, UV_RUN_ONCE);
  }
  qsort(t, (size_t)n, sizeof(*t), cmp_u64);
  if (rank == 0)
    printf("%.2f %.2f\n", (double)t[n / 2] / 1e6,
           (double)t[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1] / 1e6);
  closed = 0;
  uvccl_store_close(&st, on_store_closed);
  while (!closed) uv_run(&loop, UV_RUN_ONCE);
  if (rank == 0) {
    closed = 0;
    uvccl_store_server_close(&sv, on_server_closed);
    while (!closed) uv_run(&loop, UV_RUN_ONCE);
  }
  uv_loop_close(&loop);
  free(t);
  return 0;
}
