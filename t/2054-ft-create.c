/* Every failure path of group creation ends in an error that says what is
 * wrong, then a clean destroy: never a crash, a hang or a leak (this file
 * runs under AddressSanitizer in CI, and with valgrind by hand).
 * In one process (ranks on one loop, an in-process store):
 *   a) the store is unreachable (tcp:// to a closed port);
 *   b) a rank never comes: the timeout names it;
 *   c) destroyed during creation;
 *   d) sizes disagree (2 vs 3): both sides say so, naming both sizes;
 *   e) two processes claim rank 1: the one refused and rank 0 say so, and
 *      everyone errors within the creation timeout;
 *   f) a rank outside the world: UV_EINVAL, and the log says why;
 *   g) stray connections to a rank's listener during creation (garbage,
 *      a hello with a wrong nonce): refused with a logged reason, and the
 *      group is created all the same;
 *   k) UVCCL_TRANSPORT=udp: uvccl_pg_init fails at once with UV_EINVAL,
 *      the log naming the variable and what it takes (no guess at a
 *      transport).
 *   l) a backend this build does not know (7): uvccl_pg_init and
 *      uvccl_pg_init_url fail at once with UV_EINVAL, no callback; calls
 *      on a group never made (zeroed) are refused, whatever its backend_.
 * In separate processes (env://):
 *   h) WORLD_SIZE 2 vs 3 (the reproduction: a double free then);
 *   i) one rank of 2 whose MASTER_PORT has no store, --timeout-like 2 s
 *      (the other double free);
 *   j) the store's host (rank 0) killed 2 ms and 10 ms into the creation
 *      of 12 ranks: every survivor reports an error and exits 0. */
#define _GNU_SOURCE
#define MAXP 16
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "logcap.h"
#include "ft.h"
#include "inproc.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int init_rank(uvccl_pg_t *gp, uvccl_store_t *st, int rank, int size,
                     const char *prefix, uint64_t timeout, uvccl_work_t *w) {
  uvccl_pg_options_t o;
  memset(&o, 0, sizeof(o));
  o.rank = rank;
  o.size = size;
  o.prefix = prefix;
  o.timeout_ms = timeout;
  o.host = "127.0.0.1";
  return uvccl_pg_init(&L, gp, st, &o, w, NULL);
}

static void test_unreachable(void) {
  uvccl_pg_t gp;
  uvccl_work_t w = {0};
  uvccl_pg_options_t o;
  char url[128];
  int rc, port = free_port();
  double t0 = now_s();
  memset(&o, 0, sizeof(o));
  o.timeout_ms = 500;
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=1&world_size=2", port);
  rc = uvccl_pg_init_url(&L, &gp, url, &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  ok(rc < 0 && strstr(w.msg, "store") != NULL &&
         strstr(w.msg, "never answered") != NULL && now_s() - t0 < 5,
     "a: unreachable store: %s after %.2f s: %s", uvccl_err_name(rc),
     now_s() - t0, w.msg);
  ok(destroy_all(&gp, 1), "a: destroy after the failed creation completes");
}

static void test_missing(void) {
  uvccl_store_t st;
  uvccl_pg_t gp[1];
  uvccl_work_t w[1] = {{0}};
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp[0], &st, 0, 3, "missing", 400, &w[0]);
  wait_all(w, 1, 5000);
  ok(w[0].status == UV_ETIMEDOUT && strstr(w[0].msg, "ranks 1, 2") != NULL,
     "b: ranks 1 and 2 never come: %s", w[0].msg);
  ok(destroy_all(gp, 1), "b: destroy completes");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_destroy_during(void) {
  uvccl_store_t st;
  uvccl_pg_t gp[2];
  uvccl_work_t w[2] = {{0}};
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp[0], &st, 0, 2, "during", 5000, &w[0]);
  init_rank(&gp[1], &st, 1, 2, "during", 5000, &w[1]);
  uv_run(&L, UV_RUN_NOWAIT);
  ok(destroy_all(gp, 2), "c: destroy during creation completes");
  ok(w[0].state != UVCCL_WORK_PENDING && w[1].state != UVCCL_WORK_PENDING &&
         (w[0].status == UV_ECANCELED || w[0].status == 0) &&
         (w[1].status == UV_ECANCELED || w[1].status == 0),
     "c: creation works completed (%s, %s)", uvccl_err_name(w[0].status),
     uvccl_err_name(w[1].status));
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_bad_transport(void) {
  uvccl_store_t st;
  uvccl_pg_t gp;
  uvccl_work_t w = {0};
  int rc;
  uvccl_hash_store_init(&L, &st);
  setenv("UVCCL_TRANSPORT", "udp", 1);
  logcap_start();
  rc = init_rank(&gp, &st, 0, 2, "transport", 5000, &w);
  logcap_stop();
  unsetenv("UVCCL_TRANSPORT");
  ok(rc == UV_EINVAL && w.state == UVCCL_WORK_IDLE &&
         strstr(logbuf, "UVCCL_TRANSPORT=udp is not one of auto, shm, tcp") !=
             NULL,
     "k: UVCCL_TRANSPORT=udp: uvccl_pg_init fails at once (%s), no "
     "callback; the log names the variable: %s", uvccl_err_name(rc), logbuf);
  ok(strstr(logbuf, "holds") == NULL, "k: and says no default holds");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_bad_backend(void) {
  uvccl_store_t st;
  uvccl_pg_t gp, zero;
  uvccl_work_t w = {0}, w2 = {0};
  uvccl_pg_options_t o;
  uvccl_pg_failure_t f;
  int rc, rc2;
  uvccl_hash_store_init(&L, &st);
  memset(&o, 0, sizeof(o));
  o.rank = 0;
  o.size = 2;
  o.backend = 7;
  rc = uvccl_pg_init(&L, &gp, &st, &o, &w, NULL);
  rc2 = uvccl_pg_init_url(&L, &gp, "tcp://127.0.0.1:1?rank=0&world_size=2",
                          &o, &w2, NULL);
  ok(rc == UV_EINVAL && rc2 == UV_EINVAL && w.state == UVCCL_WORK_IDLE &&
         w2.state == UVCCL_WORK_IDLE,
     "l: backend 7: uvccl_pg_init %s, uvccl_pg_init_url %s, no callback",
     uvccl_err_name(rc), uvccl_err_name(rc2));
  memset(&zero, 0, sizeof(zero));
  rc = uvccl_pg_get_failure(&zero, &f);
  zero.backend_ = 7;
  rc2 = uvccl_allreduce(&zero, &w, &f, &f, 1, UVCCL_FLOAT32, UVCCL_SUM, NULL);
  ok(rc == UV_EINVAL && rc2 == UV_EINVAL &&
         uvccl_pg_global_rank(&zero, 0) == -1 &&
         strcmp(uvccl_pg_peer_transport(&zero, 0), "?") == 0,
     "l: a group never made is refused (get_failure %s, allreduce with "
     "backend_ 7 %s)", uvccl_err_name(rc), uvccl_err_name(rc2));
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_size_mismatch(void) {
  uvccl_store_t st;
  uvccl_pg_t gp[2];
  uvccl_work_t w[2] = {{0}};
  double t0 = now_s();
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp[0], &st, 0, 2, "mismatch", 5000, &w[0]);
  init_rank(&gp[1], &st, 1, 3, "mismatch", 5000, &w[1]);
  wait_all(w, 2, 8000);
  ok(w[0].status != 0 && w[1].status != 0 && now_s() - t0 < 4,
     "d: sizes 2 vs 3: both fail fast (%.2f s)", now_s() - t0);
  ok(strstr(w[0].msg, "world size mismatch") && strstr(w[0].msg, "2") &&
         strstr(w[0].msg, "3"),
     "d: rank 0 says: %s", w[0].msg);
  ok(strstr(w[1].msg, "world size mismatch") != NULL,
     "d: rank 1 says: %s", w[1].msg);
  ok(destroy_all(gp, 2), "d: destroy completes");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_duplicate(void) {
  uvccl_store_t st;
  uvccl_pg_t gp[3];
  uvccl_work_t w[3] = {{0}};
  double t0 = now_s();
  int i, named = 0, all_failed = 1;
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp[0], &st, 0, 3, "dup", 3000, &w[0]);
  init_rank(&gp[1], &st, 1, 3, "dup", 3000, &w[1]);
  init_rank(&gp[2], &st, 1, 3, "dup", 3000, &w[2]);
  wait_all(w, 3, 8000);
  for (i = 0; i < 3; i++) {
    if (w[i].status == 0) all_failed = 0;
    if (strstr(w[i].msg, "two processes claim rank 1")) named++;
    note("d: %d: %s %s", i, uvccl_err_name(w[i].status), w[i].msg);
  }
  ok(all_failed && now_s() - t0 < 4.5,
     "e: rank 1 claimed twice: all three fail within the timeout (%.2f s)",
     now_s() - t0);
  ok(named >= 2, "e: rank 0 and the refused one say two processes claim "
     "rank 1 (%d of 3 say so)", named);
  ok(destroy_all(gp, 3), "e: destroy completes");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_outside(void) {
  uvccl_store_t st;
  uvccl_pg_t gp;
  uvccl_work_t w = {0};
  int rc;
  uvccl_hash_store_init(&L, &st);
  logcap_start();
  rc = init_rank(&gp, &st, 5, 4, "outside", 1000, &w);
  logcap_stop();
  ok(rc == UV_EINVAL && strstr(logbuf, "rank 5 is outside a world of 4"),
     "f: rank 5 of 4: %s, log: %.100s", uvccl_err_name(rc), logbuf);
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

/* Connects to host:port and sends bytes; returns what came back within
 * 1 s (or "") and whether the connection was then closed. */
static int poke(const char *hostport, const void *bytes, size_t n, char *reply,
                size_t rlen) {
  char host[64];
  int port, fd, closed = 0;
  struct sockaddr_in a;
  size_t got = 0;
  double t0;
  if (sscanf(hostport, "%63[^ ] %d", host, &port) != 2) return -1;
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, host, &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  if (send(fd, bytes, n, MSG_NOSIGNAL) != (ssize_t)n) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  reply[0] = '\0';
  t0 = now_s();
  while (now_s() - t0 < 1.0 && !closed) {
    ssize_t r;
    uv_run(&L, UV_RUN_NOWAIT);
    r = recv(fd, reply + got, rlen - 1 - got, 0);
    if (r > 0) got += (size_t)r;
    else if (r == 0) closed = 1;
    else sleep_ms(1);
  }
  reply[got] = '\0';
  close(fd);
  return closed;
}

static void test_stray(void) {
  uvccl_store_t st;
  uvccl_pg_t gp[2];
  uvccl_work_t w[2] = {{0}};
  uvccl_work_t g = {0};
  unsigned char garbage[64], hello[24 + 96];
  char reply[512], addr[128];
  int closed, rc;
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp[0], &st, 0, 2, "stray", 10000, &w[0]);
  run_ms(50);
  rc = uvccl_store_get(&st, &g, "stray/addr/0", NULL);
  if (rc == 0) uvccl_work_wait(&g);
  snprintf(addr, sizeof(addr), "%.*s", (int)g.value_len, (char *)g.value);
  uvccl_work_cleanup(&g);
  memset(garbage, 0xab, sizeof(garbage));
  logcap_start();
  closed = poke(addr, garbage, sizeof(garbage), reply, sizeof(reply));
  ok(closed == 1 && strstr(logbuf, "not a uvccl peer") != NULL,
     "g: garbage to rank 0's listener: closed, logged: %.80s", logbuf);
  /* a well-formed hello from "rank 1" with a wrong nonce */
  memset(hello, 0, sizeof(hello));
  hello[0] = 1;                            /* FRAME_HELLO */
  hello[16] = 96;                          /* len */
  {
    uint32_t magic = 0x4c435655u, ver = 2, from = 1, to = 0, world = 2;
    uint64_t nonce = 12345;
    memcpy(hello + 24, &magic, 4);
    memcpy(hello + 28, &ver, 4);
    memcpy(hello + 32, &from, 4);
    memcpy(hello + 36, &to, 4);
    memcpy(hello + 40, &nonce, 8);
    memcpy(hello + 48, &world, 4);
    snprintf((char *)hello + 56, 64, "10.9.9.9:1");
  }
  logbuf[0] = '\0';
  closed = poke(addr, hello, sizeof(hello), reply, sizeof(reply));
  logcap_stop();
  ok(closed == 1 && strstr(reply + 24, "stale or foreign") != NULL &&
         strstr(logbuf, "stale or foreign") != NULL,
     "g: a hello with a wrong nonce is refused with the reason: %.80s",
     reply + 24);
  init_rank(&gp[1], &st, 1, 2, "stray", 10000, &w[1]);
  wait_all(w, 2, 10000);
  ok(w[0].status == 0 && w[1].status == 0,
     "g: the group is created all the same (%s, %s)",
     uvccl_err_name(w[0].status), uvccl_err_name(w[1].status));
  ok(destroy_all(gp, 2), "g: destroy completes");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

/* ---- separate processes ---------------------------------------------------- */

static int role_create(void) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  int rc;
  double t0 = now_s();
  memset(&o, 0, sizeof(o));
  o.timeout_ms = (uint64_t)ft_env_int("T_TIMEOUT_MS", 3000);
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  val("started", 1);
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  rep(1, "created", "%s after %.2f s: %s", ename(rc), now_s() - t0, w.msg);
  if (pg.impl_ != NULL) {
    uvccl_pg_destroy(&pg, on_pg_closed);
    run_until(&pg_closed, 8000);
  }
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&loop);
  rep(rc == 0, "closed", "uv_loop_close %s", ename(rc));
  return 0;
}

static void spawn_rank(proc_t *p, int rank, int size, int port) {
  char e_rank[32], e_size[32], e_port[32];
  char *argv[] = {self, NULL};
  const char *env[] = {"UVCCL_T_ROLE=create", e_rank, e_size, e_port,
                       "MASTER_ADDR=127.0.0.1", NULL};
  char name[32];
  snprintf(e_rank, sizeof(e_rank), "RANK=%d", rank);
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", size);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", port);
  snprintf(name, sizeof(name), "rank %d", rank);
  spawn(p, name, argv, env, 0);
}

static void test_procs_mismatch(void) {
  proc_t ps[2];
  int port = free_port(), okv0, okv1;
  char d0[512], d1[512];
  setenv("T_TIMEOUT_MS", "5000", 1);
  spawn_rank(&ps[0], 0, 2, port);
  spawn_rank(&ps[1], 1, 3, port);
  finish_all(ps, 2, 30);
  find_check(ps, 2, 0, "created", &okv0, d0, sizeof(d0));
  find_check(ps, 2, 1, "created", &okv1, d1, sizeof(d1));
  ok(ps[0].status == 0 && ps[1].status == 0 &&
         strstr(d0, "world size mismatch") && strstr(d1, "world size mismatch"),
     "h: WORLD_SIZE 2 vs 3: both say so and exit 0 (%d, %d)", ps[0].status,
     ps[1].status);
  if (ps[0].status || ps[1].status || !strstr(d0, "mismatch"))
    dump_procs(ps, 2);
  procs_free(ps, 2);
}

static void test_procs_nostore(void) {
  proc_t ps[1];
  int okv;
  char d[512];
  setenv("T_TIMEOUT_MS", "2000", 1);
  spawn_rank(&ps[0], 1, 2, free_port());
  finish_all(ps, 1, 30);
  find_check(ps, 1, 1, "created", &okv, d, sizeof(d));
  ok(ps[0].status == 0 && strstr(d, "never answered") != NULL,
     "i: rank 1 of 2, no store at MASTER_PORT: %s (exit %d)", d,
     ps[0].status);
  find_check(ps, 1, 1, "closed", &okv, d, sizeof(d));
  ok(okv == 1, "i: ... and its loop closes clean");
  procs_free(ps, 1);
}

static void test_procs_store_host_killed(int delay_ms) {
  proc_t ps[12];
  int port = free_port(), r, errs = 0, good = 1;
  double v;
  memset(ps, 0, sizeof(ps)); /* rank 0 starts last: nothing to read yet */
  ps[0].out = ps[0].err = ps[0].in = -1;
  setenv("T_TIMEOUT_MS", "8000", 1);
  /* The others first (they wait for the store), then rank 0, killed a
   * moment after it starts: the world is then mid-creation. */
  for (r = 1; r < 12; r++) spawn_rank(&ps[r], r, 12, port);
  for (r = 1; r < 12; r++)
    while (!find_val(ps, 12, r, "started", &v) && !ps[r].exited)
      pump(ps, 12, 5);
  spawn_rank(&ps[0], 0, 12, port);
  while (!find_val(ps, 12, 0, "started", &v) && !ps[0].exited)
    pump(ps, 12, 1);
  sleep_ms(delay_ms);
  kill(ps[0].pid, SIGKILL);
  finish_all(ps, 12, 40);
  for (r = 1; r < 12; r++) {
    int okv;
    char d[512];
    find_check(ps, 12, r, "created", &okv, d, sizeof(d));
    if (okv == 1 && strstr(d, " 0 after") == NULL) errs++;
    if (ps[r].status != 0 || okv != 1) {
      diag("rank %d: exit %d: %s", r, ps[r].status, d);
      good = 0;
    }
    find_check(ps, 12, r, "closed", &okv, d, sizeof(d));
    if (okv != 1) good = 0;
  }
  /* At 2 ms the world is surely mid-creation; later it may be done. */
  ok(good && (errs > 0 || delay_ms > 2), "j: store host killed %d ms into the creation of 12 "
     "ranks: every survivor reports (%d errors), closes clean and exits 0",
     delay_ms, errs);
  if (!good || getenv("T_VERBOSE")) dump_procs(ps, 12);
  procs_free(ps, 12);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE"), *only;
  if (role != NULL && *role) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    sigpipe_default();
    alarm(60);
    R = ft_env_int("RANK", -1);
    return role_create();
  }
  parent_init(300);
  sigpipe_default();
  unsetenv("UVCCL_SOCKET_IFNAME");
  uv_loop_init(&L);
  only = getenv("UVCCL_T_ONLY");
  if (only == NULL || *only == '\0') {
    only = NULL;
    plan(2 + 2 + 2 + 4 + 3 + 1 + 4 + 1 + 2 + 2 + 2 + 2 + 1);
  }
  if (!only || strchr(only, 'a')) test_unreachable();
  if (!only || strchr(only, 'b')) test_missing();
  if (!only || strchr(only, 'c')) test_destroy_during();
  if (!only || strchr(only, 'd')) test_size_mismatch();
  if (!only || strchr(only, 'e')) test_duplicate();
  if (!only || strchr(only, 'f')) test_outside();
  if (!only || strchr(only, 'g')) test_stray();
  if (!only || strchr(only, 'k')) test_bad_transport();
  if (!only || strchr(only, 'l')) test_bad_backend();
  if (!only || strchr(only, 'h')) test_procs_mismatch();
  if (!only || strchr(only, 'i')) test_procs_nostore();
  if (!only || strchr(only, 'j')) {
    test_procs_store_host_killed(2);
    test_procs_store_host_killed(10);
  }
  uv_run(&L, UV_RUN_DEFAULT);
  ok(uv_loop_close(&L) == 0, "nothing left on the loop");
  return done_testing();
}
