/* Store operations per second through uvccl's client, to compare a server
 * with TLS and one without: C clients on one loop, each a closed loop of
 * SET then GET of its own 64-byte key for S seconds (after 0.3 s of
 * warm-up). TLS as $UVCCL_TLS_* say (none when unset). Prints ops/s.
 *
 *   uvccl-tls-store-bench HOST PORT CLIENTS SECONDS
 * (bench/tls/run.sh starts the servers and runs it both ways.) */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uvccl_store_t st;
  uvccl_work_t w;
  char key[32];
  char val[64];
  int phase; /* 0 set, 1 get */
} cl_t;

static uint64_t ops, t_start, t_end;
static int stopping, failed, inflight;

static void on_op(uvccl_work_t *w, int status);

static void next(cl_t *c) {
  int rc;
  if (stopping) return;
  uvccl_work_cleanup(&c->w);
  memset(&c->w, 0, sizeof(c->w));
  c->w.data = c;
  rc = c->phase == 0 ? uvccl_store_set(&c->st, &c->w, c->key, c->val,
                                       sizeof(c->val), on_op)
                     : uvccl_store_get(&c->st, &c->w, c->key, on_op);
  if (rc != 0) failed = rc;
  else inflight++;
}

static void on_op(uvccl_work_t *w, int status) {
  cl_t *c = w->data;
  uint64_t now = uv_hrtime();
  inflight--;
  if (status != 0) {
    fprintf(stderr, "store op failed: %s\n", w->msg);
    failed = status;
    stopping = 1;
    return;
  }
  if (now >= t_start && now < t_end) ops++;
  if (now >= t_end) stopping = 1;
  c->phase ^= 1;
  next(c);
}

static int nclosed;
static void on_closed(uvccl_store_t *s) { (void)s; nclosed++; }

int main(int argc, char **argv) {
  uv_loop_t loop;
  cl_t *cs;
  int n, i;
  double secs;
  if (argc < 5) {
    fprintf(stderr, "usage: uvccl-tls-store-bench HOST PORT CLIENTS "
            "SECONDS\n");
    return 2;
  }
  n = atoi(argv[3]);
  secs = atof(argv[4]);
  cs = calloc((size_t)n, sizeof(*cs));
  uv_loop_init(&loop);
  for (i = 0; i < n; i++) {
    uvccl_tcp_store_options_t o;
    memset(&o, 0, sizeof(o));
    o.host = argv[1];
    o.port = atoi(argv[2]);
    o.timeout_ms = 10000;
    o.auth_none = 1;
    if (uvccl_tcp_store_init(&loop, &cs[i].st, &o) != 0) return 1;
    snprintf(cs[i].key, sizeof(cs[i].key), "bench/%d", i);
    memset(cs[i].val, 'v', sizeof(cs[i].val));
  }
  t_start = uv_hrtime() + 300000000ull;
  t_end = t_start + (uint64_t)(secs * 1e9);
  for (i = 0; i < n; i++) next(&cs[i]);
  while (!stopping || inflight > 0) uv_run(&loop, UV_RUN_ONCE);
  for (i = 0; i < n; i++) {
    uvccl_work_cleanup(&cs[i].w);
    uvccl_store_close(&cs[i].st, on_closed);
  }
  while (nclosed < n) uv_run(&loop, UV_RUN_ONCE);
  if (failed) return 1;
  printf("%.0f\n", (double)ops / secs);
  free(cs);
  return 0;
}
