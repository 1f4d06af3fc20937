/* 1,000 clients rendezvous through one server: each adds to a counter, the
 * one that sees the last value sets a key, and every client waits for it,
 * then reads it: the pattern of a job's start-up. All on one loop, over
 * real TCP connections. */
#include "tap.h"
#include "uvccl.h"

#include <sys/resource.h>

#define N 1000

static uv_loop_t loop;
static uvccl_store_t stores[N];
static uvccl_work_t works[N];
static int added_ok, waited_ok, got_ok, last_count, closed;
static int64_t seen_max;
static const char *go_key[] = {"go"};

static void on_get(uvccl_work_t *w, int status) {
  if (status == 0 && w->value_len == 3 && memcmp(w->value, "yes", 3) == 0)
    got_ok++;
  else
    note("get failed: %s", w->msg);
  uvccl_work_cleanup(w);
}

static void on_wait(uvccl_work_t *w, int status) {
  size_t i = (size_t)(w - works);
  if (status != 0) {
    note("wait failed: %s", w->msg);
    return;
  }
  waited_ok++;
  uvccl_store_get(&stores[i], w, "go", on_get);
}

static void on_set(uvccl_work_t *w, int status) {
  size_t i = (size_t)(w - works);
  if (status != 0) note("set failed: %s", w->msg);
  uvccl_store_wait(&stores[i], w, go_key, 1, UVCCL_DEFAULT_TIMEOUT, on_wait);
}

static void on_add(uvccl_work_t *w, int status) {
  size_t i = (size_t)(w - works);
  if (status != 0) {
    note("add failed: %s", w->msg);
    return;
  }
  added_ok++;
  if (w->result > seen_max) seen_max = w->result;
  if (w->result == N) {
    last_count++;
    uvccl_store_set(&stores[i], w, "go", "yes", 3, on_set);
    return;
  }
  uvccl_store_wait(&stores[i], w, go_key, 1, UVCCL_DEFAULT_TIMEOUT, on_wait);
}

static void on_closed(uvccl_store_t *s) { closed++; }

int main(void) {
  uvccl_store_server_t server;
  uvccl_store_server_options_t so = {0};
  uvccl_store_server_stats_t st;
  struct rlimit rl;
  int i;
  uint64_t t0;

  tap_alarm(120);
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2 * N + 64) skip_all("RLIMIT_NOFILE %lu too low",
                                         (unsigned long)rl.rlim_cur);
  uv_loop_init(&loop);
  so.host = "127.0.0.1";
  so.listen_fd = -1;
  tap_require(uvccl_store_server_init(&loop, &server, &so) == 0, "server");
  t0 = uv_hrtime();
  for (i = 0; i < N; i++) {
    uvccl_tcp_store_options_t o = {0};
    o.host = "127.0.0.1";
    o.port = server.port;
    o.timeout_ms = 60000;
    if (uvccl_tcp_store_init(&loop, &stores[i], &o) != 0 ||
        uvccl_store_add(&stores[i], &works[i], "count", 1, on_add) != 0)
      break;
  }
  is_int(i, N, "%d clients started", N);
  uvccl_store_server_stats(&server, &st);
  while (got_ok + (N - waited_ok) < N || waited_ok < N) {
    if (uv_run(&loop, UV_RUN_ONCE) == 0) break;
    if (got_ok == N) break;
  }
  note("rendezvous of %d clients took %.1f ms", N,
       (uv_hrtime() - t0) / 1e6);
  is_int(added_ok, N, "every add answered");
  is_int(seen_max, N, "the counter reached %d", N);
  is_int(last_count, 1, "exactly one client saw the last value");
  is_int(waited_ok, N, "every wait released");
  is_int(got_ok, N, "every client read the key");
  uvccl_store_server_stats(&server, &st);
  is_int(st.connections, N, "server holds %d connections", N);
  is_int(st.protocol_errors, 0, "no protocol errors");
  is_int(st.waiting, 0, "no waiter left registered");
  for (i = 0; i < N; i++) uvccl_store_close(&stores[i], on_closed);
  while (closed < N) uv_run(&loop, UV_RUN_ONCE);
  /* Let the server see the disconnects. */
  do {
    uv_run(&loop, UV_RUN_NOWAIT);
    uvccl_store_server_stats(&server, &st);
  } while (st.connections > 0);
  is_int(st.connections, 0, "all disconnects seen");
  uvccl_store_server_close(&server, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
