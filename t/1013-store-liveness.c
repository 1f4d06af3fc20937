/* A store server that stops answering is found within the client's
 * heartbeat timeout (1 s here), not at the operation's timeout (30 s):
 *   a) the server process is SIGSTOPped while the client waits for a key
 *      (a WAIT on the wire): the PINGs go unanswered;
 *   b) stopped while a reply is due (a CHECK);
 *   c) a WAIT on a live server that lasts 3 heartbeat timeouts succeeds
 *      (the PINGs are answered meanwhile, their echoes told apart from the
 *      WAIT's reply);
 *   d) the server stopped for a third of the timeout during a WAIT, then
 *      continued: no error, the value arrives;
 *   e) the same long WAIT in the 1.13 dialect (no PING there) succeeds.
 * The server is a separate process (so SIGSTOP stops only it). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int role_server(void) {
  uvccl_store_server_t srv;
  uvccl_store_server_options_t so;
  memset(&so, 0, sizeof(so));
  so.host = "127.0.0.1";
  so.listen_fd = -1;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  if (uvccl_store_server_init(&loop, &srv, &so) != 0) return 1;
  printf("@val 0 port %d\n", srv.port);
  fflush(stdout);
  wait_stdin_eof(120000);
  uvccl_store_server_close(&srv, NULL);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  return uv_loop_close(&loop) == 0 ? 0 : 1;
}

/* ======================================================================== */

static uv_loop_t L;
static proc_t srvp;
static int port;

static void start_server(void) {
  char *argv[] = {self, NULL};
  const char *env[] = {"UVCCL_T_ROLE=server", NULL};
  double v = 0;
  spawn(&srvp, "server", argv, env, 1);
  while (!find_val(&srvp, 1, 0, "port", &v) && !srvp.exited) pump(&srvp, 1, 10);
  port = (int)v;
}

static void stop_server(void) {
  close(srvp.in);
  srvp.in = -1;
  finish_all(&srvp, 1, 10);
  procs_free(&srvp, 1);
}

static void client(uvccl_store_t *st, uvccl_dialect_t d) {
  uvccl_tcp_store_options_t co;
  memset(&co, 0, sizeof(co));
  co.host = "127.0.0.1";
  co.port = port;
  co.dialect = d;
  co.timeout_ms = 30000;
  co.heartbeat_timeout_ms = 1000;
  uvccl_tcp_store_init(&L, st, &co);
}

static void closed(uvccl_store_t *s) { (void)s; }

/* Runs L until w is done or ms pass (SIGCONTs the server at cont_ms if
 * >= 0, sets key "k" through setter at set_ms if >= 0). */
static double run(uvccl_work_t *w, int ms, int cont_ms, uvccl_store_t *setter,
                  int set_ms) {
  double t0 = now_s();
  uvccl_work_t sw = {0};
  int set = 0, cont = 0;
  while (!uvccl_work_done(w) && (now_s() - t0) * 1000 < ms) {
    uv_run(&L, UV_RUN_NOWAIT);
    if (!cont && cont_ms >= 0 && (now_s() - t0) * 1000 >= cont_ms) {
      kill(srvp.pid, SIGCONT);
      cont = 1;
    }
    if (!set && set_ms >= 0 && (now_s() - t0) * 1000 >= set_ms) {
      uvccl_store_set(setter, &sw, "k", "v", 1, NULL);
      set = 1;
    }
    sleep_ms(1);
  }
  if (set) {
    while (!uvccl_work_done(&sw)) uv_run(&L, UV_RUN_ONCE);
    uvccl_work_cleanup(&sw);
  }
  return now_s() - t0;
}

static void test_stopped(int during_wait) {
  uvccl_store_t st;
  uvccl_work_t w = {0}, c = {0};
  const char *keys[] = {"k"};
  double el;
  int rc;
  start_server();
  client(&st, UVCCL_DIALECT_MODERN);
  rc = uvccl_store_check(&st, &c, keys, 1, NULL); /* connected first */
  if (rc == 0) uvccl_work_wait(&c);
  kill(srvp.pid, SIGSTOP);
  if (during_wait)
    rc = uvccl_store_get(&st, &w, "missing", NULL);
  else
    rc = uvccl_store_check(&st, &w, keys, 1, NULL);
  el = rc == 0 ? run(&w, 20000, -1, NULL, -1) : 0;
  kill(srvp.pid, SIGCONT);
  ok(rc == 0 && w.status == UV_ETIMEDOUT &&
         strstr(w.msg, "stopped answering") != NULL && el < 4.0,
     "%s: server stopped while %s: %s after %.2f s: %s",
     during_wait ? "a" : "b", during_wait ? "a WAIT is on the wire"
                                          : "a reply is due",
     uvccl_err_name(w.status), el, w.msg);
  uvccl_work_cleanup(&w);
  uvccl_store_close(&st, closed);
  uv_run(&L, UV_RUN_DEFAULT);
  stop_server();
}

static void test_long_wait(const char *name, uvccl_dialect_t d, int stop_ms) {
  uvccl_store_t st, setter;
  uvccl_work_t w = {0};
  double el;
  int rc;
  start_server();
  client(&st, d);
  client(&setter, d);
  rc = uvccl_store_get(&st, &w, "k", NULL);
  if (stop_ms > 0) {
    sleep_ms(300);
    kill(srvp.pid, SIGSTOP);
  }
  el = run(&w, 20000, stop_ms > 0 ? 300 + stop_ms : -1, &setter, 3000);
  ok(rc == 0 && w.status == 0 && w.value_len == 1 &&
         memcmp(w.value, "v", 1) == 0,
     "%s: %s after %.2f s (%s)", name, uvccl_err_name(w.status), el, w.msg);
  uvccl_work_cleanup(&w);
  uvccl_store_close(&st, closed);
  uvccl_store_close(&setter, closed);
  uv_run(&L, UV_RUN_DEFAULT);
  stop_server();
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && *role) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(150);
    return role_server();
  }
  parent_init(120);
  sigpipe_default();
  uv_loop_init(&L);
  plan(6);
  test_stopped(1);
  test_stopped(0);
  test_long_wait("c: a 3 s WAIT on a live server (1 s heartbeat)",
                 UVCCL_DIALECT_MODERN, 0);
  test_long_wait("d: the server stopped 0.33 s during a WAIT, then "
                 "continued", UVCCL_DIALECT_MODERN, 330);
  test_long_wait("e: a 3 s WAIT in the 1.13 dialect", UVCCL_DIALECT_LEGACY,
                 0);
  ok(uv_loop_close(&L) == 0, "nothing left on the loop");
  return done_testing();
}
