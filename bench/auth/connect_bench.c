/* What store authentication costs a connection: N times, a new client
 * connects to a store server at HOST:PORT, sets a key and waits for the
 * acknowledgement (a GET of it), then closes; the time of each round
 * (connect, the authentication exchange if any, the session's opening,
 * two requests). Prints the median and the 99th percentile in us.
 *
 *   uvccl-auth-bench HOST PORT N [SECRET]
 * (bench/auth/run.sh starts the servers and runs it both ways.) */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int closed;
static void on_closed(uvccl_store_t *s) { (void)s; closed = 1; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  uv_loop_t loop;
  int i, n;
  uint64_t *t;
  if (argc < 4) {
    fprintf(stderr, "usage: uvccl-auth-bench HOST PORT N [SECRET]\n");
    return 2;
  }
  n = atoi(argv[3]);
  t = calloc((size_t)n, sizeof(*t));
  uv_loop_init(&loop);
  for (i = 0; i < n; i++) {
    uvccl_store_t s;
    uvccl_tcp_store_options_t o;
    uvccl_work_t w = {0}, g = {0};
    uint64_t t0 = uv_hrtime();
    int rc;
    memset(&o, 0, sizeof(o));
    memset(&s, 0, sizeof(s));
    o.host = argv[1];
    o.port = atoi(argv[2]);
    o.auth_token = argc > 4 ? argv[4] : NULL;
    o.auth_none = argc <= 4;
    if ((rc = uvccl_tcp_store_init(&loop, &s, &o)) != 0 ||
        (rc = uvccl_store_set(&s, &w, "bench/k", "v", 1, NULL)) != 0 ||
        (rc = uvccl_work_wait(&w)) != 0 ||
        (rc = uvccl_store_get(&s, &g, "bench/k", NULL)) != 0 ||
        (rc = uvccl_work_wait(&g)) != 0) {
      fprintf(stderr, "round %d: %s %s %s\n", i, uvccl_strerror(rc), w.msg,
              g.msg);
      return 1;
    }
    t[i] = uv_hrtime() - t0;
    uvccl_work_cleanup(&g);
    closed = 0;
    uvccl_store_close(&s, on_closed);
    while (!closed) uv_run(&loop, UV_RUN_ONCE);
  }
  qsort(t, (size_t)n, sizeof(*t), cmp_u64);
  printf("%.1f %.1f\n", (double)t[n / 2] / 1e3, (double)t[n * 99 / 100] / 1e3);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(t);
  return 0;
}
