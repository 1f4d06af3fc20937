/* No signal deaths: every rank and store process here runs with SIGPIPE at
 * its default action (which kills), and a peer is SIGKILLed in the middle
 * of the survivor's writes, from 1 KiB to 64 MiB:
 *   a) point to point: rank 0 streams messages to rank 1, which is killed
 *      after it has received some; rank 0 must get an error, not die;
 *   b) allreduce at 4 ranks, rank 2 killed (the reproduction);
 *   c) a store client writing large SETs to a server that is killed;
 *   d) a store server writing large GET replies to a client that is
 *      killed: the server lives on and serves the next client.
 * libuv writes with write(), which raises SIGPIPE on a dead connection;
 * uvccl must never use it. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void sigpipe_default(void) {
  sigset_t set;
  signal(SIGPIPE, SIG_DFL);
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
}

static size_t env_size(const char *name) {
  const char *v = getenv(name);
  return v ? (size_t)strtoull(v, NULL, 10) : 0;
}

/* ---- a) point to point ---------------------------------------------------- */
static int role_p2p(void) {
  size_t n = env_size("T_SIZE"), i;
  char *buf = malloc(n);
  int rc = 0, iters = 0;
  memset(buf, 7, n);
  rank_init(20000);
  for (i = 0; i < 100000 && rc == 0; i++) {
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    if (R == 0)
      rc = uvccl_send(&pg, &w, buf, n, 1, 5, on_work);
    else
      rc = uvccl_recv(&pg, &w, buf, n, 0, 5, on_work);
    rc = finish_work(&c, rc, 15000);
    iters++;
    if (R == 1 && iters == 2) val("started", 1); /* the parent kills us */
    if (rc != 0)
      rep(R == 0 && rc < 0, "survived", "after %d messages of %zu B: %s %s",
          iters, n, ename(rc), w.msg);
  }
  if (rc == 0) rep(0, "survived", "no error after %d messages", iters);
  free(buf);
  return rank_destroy();
}

/* ---- b) allreduce ---------------------------------------------------------- */
static int role_allreduce(void) {
  size_t n = env_size("T_SIZE") / 4, i;
  float *s = malloc(n * 4), *r = malloc(n * 4);
  int rc = 0, iters = 0;
  for (i = 0; i < n; i++) s[i] = 1.0f;
  rank_init(20000);
  while (rc == 0 && iters < 100000) {
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, s, r, n, UVCCL_FLOAT32, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 15000);
    iters++;
    if (R == 2 && iters == 2) val("started", 1);
    if (rc != 0)
      rep(rc < 0, "survived", "after %d allreduces of %zu B: %s %s", iters,
          n * 4, ename(rc), w.msg);
  }
  free(s);
  free(r);
  return rank_destroy();
}

/* ---- c) and d) the store ---------------------------------------------------- */
static void on_closed_store(uvccl_store_t *s) { (void)s; }

/* A server on port T_PORT until stdin closes; reports what it survived. */
static int role_server(void) {
  uvccl_store_server_t srv;
  uvccl_store_server_options_t so;
  int rc;
  memset(&so, 0, sizeof(so));
  so.host = "127.0.0.1";
  so.port = (int)env_size("T_PORT");
  so.listen_fd = -1;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  rc = uvccl_store_server_init(&loop, &srv, &so);
  if (rc != 0) {
    rep(0, "serve", "server_init: %s", ename(rc));
    return 1;
  }
  val("listening", srv.port);
  wait_stdin_eof(60000);
  rep(1, "served", "the server process is alive");
  uvccl_store_server_close(&srv, NULL);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  return uv_loop_close(&loop) == 0 ? 0 : 1;
}

/* A client: "set" writes large values until the server dies; "get" asks
 * for a large value over and over (the parent kills it meanwhile). */
static int role_client(const char *mode) {
  uvccl_store_t st;
  uvccl_tcp_store_options_t co;
  size_t n = env_size("T_SIZE");
  char *v = malloc(n);
  int rc = 0, iters = 0;
  memset(v, 'x', n);
  memset(&co, 0, sizeof(co));
  co.host = "127.0.0.1";
  co.port = (int)env_size("T_PORT");
  co.timeout_ms = 20000;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  uvccl_tcp_store_init(&loop, &st, &co);
  while (rc == 0 && iters < 100000) {
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    if (strcmp(mode, "set") == 0 || iters == 0)
      rc = uvccl_store_set(&st, &w, "big", v, n, on_work);
    else
      rc = uvccl_store_get(&st, &w, "big", on_work);
    rc = finish_work(&c, rc, 15000);
    uvccl_work_cleanup(&w);
    iters++;
    if (iters == 2) val("started", 1);
    if (rc != 0)
      rep(rc < 0, "survived", "after %d requests of %zu B: %s %s", iters, n,
          ename(rc), w.msg);
  }
  uvccl_store_close(&st, on_closed_store);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  free(v);
  return uv_loop_close(&loop) == 0 ? 0 : 1;
}

static int rank_main(const char *role) {
  const char *r = getenv("RANK"), *s = getenv("WORLD_SIZE");
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(60);
  unsetenv("UVCCL_SOCKET_IFNAME");
  R = r ? atoi(r) : 0;
  P = s ? atoi(s) : 0;
  if (strcmp(role, "p2p") == 0) return role_p2p();
  if (strcmp(role, "allreduce") == 0) return role_allreduce();
  if (strcmp(role, "server") == 0) return role_server();
  if (strcmp(role, "set") == 0 || strcmp(role, "get") == 0)
    return role_client(role);
  return 2;
}

/* ======================================================================== */
/* Parent side                                                              */
/* ======================================================================== */

/* Pumps until `who` printed "@val R started", then kills it after a random
 * few milliseconds (so the kill lands at varying points of a write). */
static int kill_when_started(proc_t *ps, int n, int who, int rank) {
  double t0 = now_s(), v;
  while (now_s() - t0 < 20) {
    pump(ps, n, 20);
    if (find_val(ps, n, rank, "started", &v)) {
      sleep_ms(rand() % 15);
      kill(ps[who].pid, SIGKILL);
      return 1;
    }
    if (ps[who].exited) break;
  }
  return 0;
}

static const size_t sizes[] = {1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static void scenario_p2p(size_t size) {
  proc_t ps[2];
  static char e_size[64];
  int killed;
  snprintf(e_size, sizeof(e_size), "T_SIZE=%zu", size);
  putenv(e_size);
  scenario_failed = 0;
  spawn_world(ps, 2, "p2p", 0);
  killed = kill_when_started(ps, 2, 1, 1);
  finish_all(ps, 2, 30);
  ok(killed, "a %zu B: rank 1 was killed mid-stream", size);
  agg(ps, 2, "survived", 0x1, "a %zu B: rank 0's send fails with an error",
      size);
  if (!ok(ps[0].status == 0,
          "a %zu B: rank 0 exits 0, not by a signal (status %d%s)", size,
          ps[0].status, ps[0].status == 128 + SIGPIPE ? ": SIGPIPE" : ""))
    scenario_failed = 1;
  if (scenario_failed) dump_procs(ps, 2);
  procs_free(ps, 2);
}

static void scenario_allreduce(size_t size) {
  proc_t ps[4];
  static char e_size[64];
  int killed;
  snprintf(e_size, sizeof(e_size), "T_SIZE=%zu", size);
  putenv(e_size);
  scenario_failed = 0;
  spawn_world(ps, 4, "allreduce", 0);
  killed = kill_when_started(ps, 4, 2, 2);
  finish_all(ps, 4, 30);
  ok(killed, "b %zu B: rank 2 of 4 was killed during allreduces", size);
  agg(ps, 4, "survived", 0xb, "b %zu B: ranks 0, 1, 3 get an error", size);
  if (!ok(ps[0].status == 0 && ps[1].status == 0 && ps[3].status == 0,
          "b %zu B: no survivor dies of a signal (exit %d, %d, %d)", size,
          ps[0].status, ps[1].status, ps[3].status))
    scenario_failed = 1;
  if (scenario_failed) dump_procs(ps, 4);
  procs_free(ps, 4);
}

static void scenario_store(const char *mode, size_t size) {
  proc_t ps[2];
  static char e_size[64], e_port[64], e_role[64], e_role2[64];
  char *argv[] = {self, NULL};
  double v;
  int killed, port = free_port(), victim = strcmp(mode, "set") == 0 ? 0 : 1;
  snprintf(e_size, sizeof(e_size), "T_SIZE=%zu", size);
  snprintf(e_port, sizeof(e_port), "T_PORT=%d", port);
  snprintf(e_role, sizeof(e_role), "UVCCL_T_ROLE=server");
  snprintf(e_role2, sizeof(e_role2), "UVCCL_T_ROLE=%s", mode);
  scenario_failed = 0;
  {
    const char *env[] = {e_role, e_port, e_size, NULL};
    spawn(&ps[0], "server", argv, env, 1);
  }
  while (!find_val(ps, 1, 0, "listening", &v) && !ps[0].exited) pump(ps, 1, 20);
  {
    const char *env[] = {e_role2, e_port, e_size, NULL};
    spawn(&ps[1], "client", argv, env, 0);
  }
  /* c) kill the server while the client writes; d) the client while the
   * server writes its replies. */
  killed = kill_when_started(ps, 2, victim, 0);
  if (victim == 1) {
    sleep_ms(100);
    close(ps[0].in); /* the server may stop now */
    ps[0].in = -1;
  }
  finish_all(ps, 2, 30);
  ok(killed, "%c %zu B: the %s was killed mid-%s", victim ? 'd' : 'c', size,
     victim ? "client" : "server", mode);
  if (victim == 0) {
    agg(ps, 2, "survived", 0x1, "c %zu B: the client's set fails with an error",
        size);
    if (!ok(ps[1].status == 0, "c %zu B: the client exits 0 (status %d%s)",
            size, ps[1].status,
            ps[1].status == 128 + SIGPIPE ? ": SIGPIPE" : ""))
      scenario_failed = 1;
  } else {
    agg(ps, 2, "served", 0x1, "d %zu B: the server lives on", size);
    if (!ok(ps[0].status == 0, "d %zu B: the server exits 0 (status %d%s)",
            size, ps[0].status,
            ps[0].status == 128 + SIGPIPE ? ": SIGPIPE" : ""))
      scenario_failed = 1;
  }
  if (scenario_failed) dump_procs(ps, 2);
  procs_free(ps, 2);
}

#define TRIALS 3 /* the kill lands at a random point each time */

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  size_t i;
  int k;
  if (role != NULL && *role) return rank_main(role);
  parent_init(600);
  srand((unsigned)getpid());
  /* The parent too: nothing here may depend on SIGPIPE being ignored. */
  sigpipe_default();
  plan(TRIALS * ((int)NSIZES * 3 + 2 * 3 + 3 * 3 + 3 * 3));
  for (k = 0; k < TRIALS; k++) {
    for (i = 0; i < NSIZES; i++) scenario_p2p(sizes[i]);
    scenario_allreduce(1 << 20);
    scenario_allreduce(16 << 20);
    scenario_store("set", 64 << 10);
    scenario_store("set", 1 << 20);
    scenario_store("set", 8 << 20);
    scenario_store("get", 64 << 10);
    scenario_store("get", 1 << 20);
    scenario_store("get", 8 << 20);
  }
  return done_testing();
}
