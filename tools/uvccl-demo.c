/* uvccl-demo: a real multi-process world on this host, through a store
 * server embedded in this process.
 *
 *   uvccl-demo [-n WORKERS] [--ops N]
 *
 * The parent serves the store on its loop and spawns WORKERS copies of
 * itself. Each worker connects, adds 1 to a counter; the one that sees the
 * last value publishes "go"; everyone waits for "go" (the rendezvous), then
 * runs a short closed-loop load (add, set, get) and reports its timings
 * back through the store, where the parent reads and prints them. */
#include "uvccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uv_loop_t *loop;

static uint64_t now_us(void) { return uv_hrtime() / 1000; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int die(const char *what, uvccl_work_t *w, int r) {
  fprintf(stderr, "uvccl-demo: %s: %s\n", what,
          w && w->msg[0] ? w->msg : uvccl_strerror(r));
  exit(1);
}

/* ---- worker ------------------------------------------------------------ */

static int worker(int rank, int world, int port, int nops) {
  uvccl_store_t s;
  uvccl_tcp_store_options_t o = {0};
  uvccl_work_t w = {0};
  const char *go[] = {"demo/go"};
  uint64_t t0, t_conn, t_rdv, t_load, *lat;
  char key[64], val[64], report[256];
  int i, r;

  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 30000;
  if ((r = uvccl_tcp_store_init(loop, &s, &o)) != 0) die("init", NULL, r);
  t0 = now_us();
  uvccl_tcp_store_connect(&s, &w, NULL);
  if ((r = uvccl_work_wait(&w)) != 0) die("connect", &w, r);
  t_conn = now_us() - t0;

  t0 = now_us();
  uvccl_store_add(&s, &w, "demo/count", 1, NULL);
  if ((r = uvccl_work_wait(&w)) != 0) die("add", &w, r);
  if (w.result == world) {
    uvccl_store_set(&s, &w, "demo/go", "1", 1, NULL);
    if ((r = uvccl_work_wait(&w)) != 0) die("set", &w, r);
  }
  uvccl_store_wait(&s, &w, go, 1, UVCCL_DEFAULT_TIMEOUT, NULL);
  if ((r = uvccl_work_wait(&w)) != 0) die("wait", &w, r);
  t_rdv = now_us() - t0;

  /* One request outstanding at a time, as a PyTorch rank uses its store. */
  lat = malloc(sizeof(*lat) * (size_t)nops);
  snprintf(key, sizeof(key), "demo/w%d", rank);
  t0 = now_us();
  for (i = 0; i < nops; i++) {
    uint64_t t1 = now_us();
    switch (i % 3) {
    case 0:
      r = uvccl_store_add(&s, &w, "demo/ops", 1, NULL);
      break;
    case 1:
      snprintf(val, sizeof(val), "%d", i);
      r = uvccl_store_set(&s, &w, key, val, strlen(val), NULL);
      break;
    default:
      r = uvccl_store_get(&s, &w, key, NULL);
      break;
    }
    if (r == 0) r = uvccl_work_wait(&w);
    if (r != 0) die("load", &w, r);
    lat[i] = now_us() - t1;
  }
  t_load = now_us() - t0;
  qsort(lat, (size_t)nops, sizeof(*lat), cmp_u64);
  snprintf(report, sizeof(report), "%llu %llu %d %llu %llu %llu",
           (unsigned long long)t_conn, (unsigned long long)t_rdv, nops,
           (unsigned long long)t_load, (unsigned long long)lat[nops / 2],
           (unsigned long long)lat[(size_t)nops * 99 / 100]);
  free(lat);
  snprintf(key, sizeof(key), "demo/report/%d", rank);
  uvccl_store_set(&s, &w, key, report, strlen(report), NULL);
  if ((r = uvccl_work_wait(&w)) != 0) die("report", &w, r);
  uvccl_work_cleanup(&w);
  uvccl_store_close(&s, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}

/* ---- parent -------------------------------------------------------------- */

static int exited, failed;

static void on_exit_cb(uv_process_t *p, int64_t status, int sig) {
  exited++;
  if (status != 0 || sig != 0) failed++;
  uv_close((uv_handle_t *)p, (uv_close_cb)free);
}

static void on_server_closed(uvccl_store_server_t *s) { (void)s; }

int main(int argc, char **argv) {
  int n = 4, nops = 3000, i, r;
  uvccl_store_server_t server;
  uvccl_store_server_options_t so = {0};
  uvccl_store_server_stats_t st;
  uvccl_store_t s;
  uvccl_tcp_store_options_t o = {0};
  uvccl_work_t w = {0};
  char exe[4096], nbuf[16], pbuf[16], rbuf[16], obuf[16];
  size_t exelen = sizeof(exe);
  uint64_t t0, t_all;
  double tot_ops = 0;

  loop = uv_default_loop();
  if (argc >= 6 && strcmp(argv[1], "--worker") == 0)
    return worker(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) n = atoi(argv[++i]);
    else if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc) nops = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: uvccl-demo [-n WORKERS] [--ops N]\n");
      return 2;
    }
  }
  if (n < 1 || n > 512 || nops < 3) {
    fprintf(stderr, "uvccl-demo: -n must be 1..512 and --ops >= 3\n");
    return 2;
  }

  so.host = "127.0.0.1";
  so.listen_fd = -1;
  if ((r = uvccl_store_server_init(loop, &server, &so)) != 0)
    die("server", NULL, r);
  printf("uvccl %s demo: store server embedded in pid %d on 127.0.0.1:%d\n",
         uvccl_version_string(), (int)getpid(), server.port);
  printf("spawning %d worker processes: rendezvous (add + wait), then %d "
         "store ops each (add/set/get, one in flight)\n\n", n, nops);
  uv_exepath(exe, &exelen);
  snprintf(nbuf, sizeof(nbuf), "%d", n);
  snprintf(pbuf, sizeof(pbuf), "%d", server.port);
  snprintf(obuf, sizeof(obuf), "%d", nops);
  t0 = now_us();
  for (i = 0; i < n; i++) {
    uv_process_options_t po = {0};
    uv_stdio_container_t io[3];
    uv_process_t *p = malloc(sizeof(*p));
    char *args[] = {exe, "--worker", rbuf, nbuf, pbuf, obuf, NULL};
    snprintf(rbuf, sizeof(rbuf), "%d", i);
    io[0].flags = UV_IGNORE;
    io[1].flags = UV_INHERIT_FD;
    io[1].data.fd = 1;
    io[2].flags = UV_INHERIT_FD;
    io[2].data.fd = 2;
    po.file = exe;
    po.args = args;
    po.exit_cb = on_exit_cb;
    po.stdio = io;
    po.stdio_count = 3;
    if ((r = uv_spawn(loop, p, &po)) != 0) die("spawn", NULL, r);
  }
  while (exited < n) uv_run(loop, UV_RUN_ONCE);
  t_all = now_us() - t0;
  if (failed) {
    fprintf(stderr, "uvccl-demo: %d worker(s) failed\n", failed);
    return 1;
  }

  o.host = "127.0.0.1";
  o.port = server.port;
  uvccl_tcp_store_init(loop, &s, &o);
  printf("%-6s %11s %14s %8s %10s %8s %8s\n", "worker", "connect_ms",
         "rendezvous_ms", "ops", "ops/s", "p50_us", "p99_us");
  for (i = 0; i < n; i++) {
    char key[64];
    unsigned long long c, rv, lt, p50, p99;
    int ops;
    snprintf(key, sizeof(key), "demo/report/%d", i);
    uvccl_store_get(&s, &w, key, NULL);
    if ((r = uvccl_work_wait(&w)) != 0) die("read report", &w, r);
    if (sscanf(w.value, "%llu %llu %d %llu %llu %llu", &c, &rv, &ops, &lt,
               &p50, &p99) != 6)
      die("bad report", NULL, UVCCL_EPROTO);
    tot_ops += ops / (lt / 1e6);
    printf("%-6d %11.2f %14.2f %8d %10.0f %8llu %8llu\n", i, c / 1e3, rv / 1e3,
           ops, ops / (lt / 1e6), p50, p99);
  }
  uvccl_store_add(&s, &w, "demo/ops", 0, NULL);
  uvccl_work_wait(&w);
  printf("\nall %d workers: %.0f ops/s together; shared counter demo/ops = "
         "%lld (expected %d)\n", n, tot_ops, (long long)w.result,
         n * ((nops + 2) / 3));
  uvccl_store_server_stats(&server, &st);
  printf("server: %llu connections accepted, %llu requests, %llu keys, "
         "%llu bytes held, %llu protocol errors; world ran in %.1f ms\n",
         (unsigned long long)st.accepted, (unsigned long long)st.requests,
         (unsigned long long)st.keys, (unsigned long long)st.memory,
         (unsigned long long)st.protocol_errors, t_all / 1e3);
  r = w.result == n * ((nops + 2) / 3) ? 0 : 1;
  uvccl_work_cleanup(&w);
  uvccl_store_close(&s, NULL);
  uvccl_store_server_close(&server, on_server_closed);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return r;
}
