/* Our client, in the 1.13 dialect, against the real PyTorch server
 * (Debian's python3-torch 1.13, its legacy single-thread daemon): every
 * operation the 1.13 server has, with exact values; a get released by
 * another client; a wait timeout and the reconnect after it; 1000 adds
 * pipelined on one connection; the operations 1.13 lacks refused at the
 * call; the default dialect (AUTO) finding 1.13's; keys shared with
 * PyTorch's own Python client; and what happens
 * when the server goes away.
 *
 * The server is t/py/torch_store_server.py: it prints its port and serves
 * until its stdin is closed. The Python client is
 * t/py/torch_store_client.py (see t/1020-store-torch-client.c). */
#define _GNU_SOURCE /* pipe2 */
#include "tap.h"
#include "uvccl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#ifndef PY
#define PY "/usr/bin/python3" /* Debian's python3-torch; not PATH's python3 */
#endif
#define CLIENT_PY UVCCL_SRC_DIR "/t/py/torch_store_client.py"
#define SERVER_PY UVCCL_SRC_DIR "/t/py/torch_store_server.py"
#define NPIPE 1000

#include "child.h"
#include "torch_values.h"
#include "loop_helpers.h"

/* ---- the PyTorch server ---------------------------------------------------- */

static child_t srv;
static int port;

static void start_torch_server(void) {
  int i;
  const char *p;
  tap_require(spawn_py(&srv, SERVER_PY, NULL, 1) == 0,
              "PyTorch server started");
  for (i = 0; i < 3000 && field(&srv, "pid") == NULL; i++) { /* 60 s */
    if (!child_drain(&srv, 0)) break;
    if (field(&srv, "pid") == NULL) sleep_ms(20);
  }
  p = field(&srv, "port");
  port = p ? atoi(p) : 0;
  if (port <= 0) dump(&srv, "PyTorch server");
  tap_require(port > 0, "PyTorch 1.13 TCPStore server on 127.0.0.1:%d", port);
}

/* Closes its stdin: it stops and exits. Returns its exit status. */
static int stop_torch_server(void) { return stop_by_eof(&srv, 30000); }

/* ---- our client --------------------------------------------------------- */

static uv_loop_t loop;
static void open_client(uvccl_store_t *s, int world_size) {
  uvccl_tcp_store_options_t o = {0};
  memset(s, 0, sizeof(*s));
  o.host = "127.0.0.1";
  o.port = port;
  o.dialect = UVCCL_DIALECT_LEGACY;
  o.timeout_ms = 20000;
  o.world_size = world_size;
  tap_require(uvccl_tcp_store_init(&loop, s, &o) == 0, "client init");
}

static void close_client(uvccl_store_t *s) { store_close_wait(&loop, s); }

static int run(uvccl_work_t *w) { return uvccl_work_wait(w); }

static void run_for(int ms) { loop_run_for(&loop, ms); }

static int64_t nkeys; /* what the server holds */

static int64_t num_keys(uvccl_store_t *s) {
  uvccl_work_t w = {0};
  uvccl_store_num_keys(s, &w, NULL);
  if (run(&w) != 0) return -1;
  return w.result;
}

static void every_op(uvccl_store_t *s, uvccl_store_t *s2) {
  uvccl_work_t w = {0}, w2 = {0};
  const char *ka[] = {"a", "e"};
  const char *kam[] = {"a", "nope"};

  /* set / get */
  is_int(uvccl_store_set(s, &w, "a", "va", 2, NULL), 0, "set starts");
  is_int(run(&w), 0, "set acknowledged by the PyTorch server");
  is_int(uvccl_store_get(s, &w, "a", NULL), 0, "get starts");
  is_int(run(&w), 0, "get");
  is_mem(w.value, w.value_len, "va", "get returns the value");
  uvccl_store_set(s2, &w2, "a", "vb", 2, NULL);
  run(&w2);
  uvccl_store_get(s, &w, "a", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "vb", "set from another client overwrites");
  uvccl_store_set(s, &w, "e", "", 0, NULL);
  run(&w);
  uvccl_store_get(s2, &w2, "e", NULL);
  is_int(run(&w2), 0, "get of an empty value");
  is_int(w2.value_len, 0, "empty value has length 0");
  uvccl_store_set(s, &w, "bin", binary, sizeof(binary), NULL);
  run(&w);
  uvccl_store_get(s2, &w2, "bin", NULL);
  run(&w2);
  ok(w2.value_len == sizeof(binary) &&
         memcmp(w2.value, binary, sizeof(binary)) == 0,
     "binary value with NULs");
  nkeys += 3;

  /* a get that waits until another client sets the key */
  is_int(uvccl_store_get(s, &w, "late", NULL), 0, "blocking get starts");
  run_for(300);
  ok(!uvccl_work_done(&w), "the get waits while the key is missing");
  uvccl_store_set(s2, &w2, "late", "here", 4, NULL);
  is_int(run(&w2), 0, "another client sets the key");
  is_int(run(&w), 0, "the blocked get is released");
  is_mem(w.value, w.value_len, "here", "with the value");
  nkeys += 1;

  /* add */
  uvccl_store_add(s, &w, "n", 5, NULL);
  is_int(run(&w), 0, "add");
  is_int(w.result, 5, "add on a missing key starts at 0");
  uvccl_store_add(s2, &w, "n", -7, NULL);
  run(&w);
  is_int(w.result, -2, "add a negative delta");
  uvccl_store_add(s, &w, "n", 0, NULL);
  run(&w);
  is_int(w.result, -2, "add 0 reads");
  uvccl_store_get(s, &w, "n", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "-2", "add stores decimal text");
  uvccl_store_add(s, &w, "big64", INT64_C(1) << 40, NULL);
  run(&w);
  is_int(w.result, INT64_C(1) << 40, "add of a 64-bit delta");
  nkeys += 2;

  /* compare_set, the four rows */
  uvccl_store_compare_set(s, &w, "cs", "", 0, "d1", 2, NULL);
  is_int(run(&w), 0, "compare_set");
  is_mem(w.value, w.value_len, "d1",
         "compare_set: missing, empty expected: creates, returns desired");
  uvccl_store_compare_set(s, &w, "cs_missing", "exp", 3, "d2", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "exp",
         "compare_set: missing, non-empty expected: returns expected");
  uvccl_store_compare_set(s, &w, "cs", "d1", 2, "d3", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "d3", "compare_set: match swaps");
  uvccl_store_compare_set(s, &w, "cs", "zz", 2, "d4", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "d3", "compare_set: mismatch returns current");
  uvccl_store_get(s2, &w2, "cs", NULL);
  run(&w2);
  is_mem(w2.value, w2.value_len, "d3", "compare_set: the stored value");
  nkeys += 1;

  /* check (the 1.13 server has CHECK though its Python API has not) */
  {
    const char *miss[] = {"cs_missing"};
    uvccl_store_check(s, &w, miss, 1, NULL);
    is_int(run(&w), 0, "check");
    is_int(w.result, 0,
           "check: compare_set on a missing key with expected stored nothing");
  }
  uvccl_store_check(s, &w, ka, 2, NULL);
  run(&w);
  is_int(w.result, 1, "check: all present (an empty value counts)");
  uvccl_store_check(s, &w, kam, 2, NULL);
  run(&w);
  is_int(w.result, 0, "check: one missing");

  /* delete_key */
  uvccl_store_set(s, &w, "del", "x", 1, NULL);
  run(&w);
  uvccl_store_delete_key(s, &w, "del", NULL);
  is_int(run(&w), 0, "delete_key");
  is_int(w.result, 1, "delete_key of an existing key: 1");
  uvccl_store_delete_key(s, &w, "del", NULL);
  run(&w);
  is_int(w.result, 0, "delete_key of a missing key: 0");

  /* num_keys */
  is_int(num_keys(s), nkeys, "num_keys exact");

  /* 1 MiB value, set by one client, read by the other */
  uvccl_store_set(s, &w, "big", big, BIG_LEN, NULL);
  uvccl_store_get(s2, &w2, "big", NULL);
  is_int(run(&w), 0, "1 MiB set");
  is_int(run(&w2), 0, "1 MiB get");
  ok(w2.value_len == BIG_LEN && memcmp(w2.value, big, BIG_LEN) == 0,
     "1 MiB value: exact bytes");
  nkeys += 1;

  /* A wait that times out. 1.13 has no CANCEL_WAIT, so our client drops
   * the connection (else the server's late answer would desynchronise it)
   * and the next operation reconnects. */
  {
    const char *never[] = {"never"};
    is_int(uvccl_store_wait(s, &w, never, 1, 300, NULL), 0, "wait starts");
    is_int(run(&w), UV_ETIMEDOUT, "wait on a missing key times out");
    is_int(w.state, UVCCL_WORK_TIMED_OUT, "state: timed out");
    ok(strstr(w.msg, "never") != NULL, "the message names the key: %s",
       w.msg);
    uvccl_store_add(s, &w, "n", 10, NULL);
    is_int(run(&w), 0, "the next operation works (reconnected)");
    is_int(w.result, 8, "with its own reply");
    uvccl_store_set(s2, &w2, "never", "now", 3, NULL);
    run(&w2);
    uvccl_store_add(s, &w, "n", 1, NULL);
    run(&w);
    is_int(w.result, 9, "no stray reply after the key appears");
    uvccl_store_wait(s, &w, never, 1, UVCCL_DEFAULT_TIMEOUT, NULL);
    is_int(run(&w), 0, "wait on an existing key returns at once");
    nkeys += 1;
  }
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&w2);
}

/* 1000 adds issued at once on one connection, then waited for. */
static void pipelined(uvccl_store_t *s) {
  static uvccl_work_t ws[NPIPE];
  static char seen[NPIPE + 1];
  int i, started = 0, failed = 0, order = 0, bad = 0;
  int64_t prev = 0, v = 0;
  memset(ws, 0, sizeof(ws));
  for (i = 0; i < NPIPE; i++)
    started += uvccl_store_add(s, &ws[i], "pipe", 1, NULL) == 0;
  is_int(started, NPIPE, "%d adds started at once", NPIPE);
  for (i = 0; i < NPIPE; i++) {
    if (run(&ws[i]) != 0) {
      failed++;
      continue;
    }
    if (ws[i].result <= prev) order++;
    if (ws[i].result < 1 || ws[i].result > NPIPE) bad++;
    else if (seen[ws[i].result]++) bad++;
    prev = ws[i].result;
  }
  is_int(failed, 0, "every pipelined add succeeded");
  is_int(order, 0, "their results come back in order");
  is_int(bad, 0, "the results are exactly 1..%d", NPIPE);
  is_int(uvccl_store_add_sync(s, "pipe", 0, &v), 0, "read the counter");
  is_int(v, NPIPE, "final value exact");
  nkeys += 1;
}

static int cb_ran;
static void count_cb(uvccl_work_t *w, int status) {
  (void)w;
  (void)status;
  cb_ran++;
}

/* What the 1.13 dialect lacks is refused at the call. */
static void unsupported(uvccl_store_t *s) {
  uvccl_work_t w = {0};
  const char *k[] = {"a"};
  uvccl_buf_t v[] = {{"x", 1}};
  is_int(uvccl_store_append(s, &w, "a", "x", 1, count_cb), UVCCL_ENOTSUP,
         "append: UVCCL_ENOTSUP");
  is_int(uvccl_store_multi_get(s, &w, k, 1, count_cb), UVCCL_ENOTSUP,
         "multi_get: UVCCL_ENOTSUP");
  is_int(uvccl_store_multi_set(s, &w, k, v, 1, count_cb), UVCCL_ENOTSUP,
         "multi_set: UVCCL_ENOTSUP");
  is_int(uvccl_store_queue_push(s, &w, "q", "x", 1, count_cb), UVCCL_ENOTSUP,
         "queue_push: UVCCL_ENOTSUP");
  is_int(uvccl_store_queue_pop(s, &w, "q", 0, count_cb), UVCCL_ENOTSUP,
         "queue_pop: UVCCL_ENOTSUP");
  is_int(uvccl_store_queue_len(s, &w, "q", count_cb), UVCCL_ENOTSUP,
         "queue_len: UVCCL_ENOTSUP");
  is_int(uvccl_store_list_keys(s, &w, count_cb), UVCCL_ENOTSUP,
         "list_keys: UVCCL_ENOTSUP");
  uv_run(&loop, UV_RUN_NOWAIT);
  is_int(cb_ran, 0, "no callback ran for a refused call");
  is_int(w.state, UVCCL_WORK_IDLE, "the work stays idle");
  is_int(num_keys(s), nkeys, "the connection is still fine");
}

/* The default dialect (AUTO) against the 1.13 server: the newer
 * dialect's opening closes the connection, the client speaks 1.13's on a
 * new one; what was queued before goes out relabelled (values exact), what
 * 1.13 lacks fails with UVCCL_ENOTSUP. This is how uvccl groups made from
 * env:// under torchrun 1.13 reach its agent's store. */
static void auto_dialect(uvccl_store_t *s) {
  uvccl_store_t a;
  uvccl_tcp_store_options_t o = {0};
  uvccl_work_t w1 = {0}, w2 = {0}, w3 = {0}, w4 = {0}, w5 = {0}, w6 = {0};
  const char *k[] = {"auto/a"};

  memset(&a, 0, sizeof(a));
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 20000;
  tap_require(uvccl_tcp_store_init(&loop, &a, &o) == 0, "AUTO client init");
  /* all queued before the first connection */
  is_int(uvccl_store_set(&a, &w1, "auto/a", "v1", 2, NULL), 0, "auto: set");
  is_int(uvccl_store_add(&a, &w2, "auto/n", 5, NULL), 0, "auto: add");
  is_int(uvccl_store_get(&a, &w3, "auto/a", NULL), 0, "auto: get");
  is_int(uvccl_store_multi_get(&a, &w4, k, 1, NULL), 0,
         "auto: multi_get accepted before the dialect is known");
  is_int(run(&w3), 0, "auto: the get completes in the 1.13 dialect");
  ok(w3.value_len == 2 && memcmp(w3.value, "v1", 2) == 0,
     "auto: the value set before the fallback comes back");
  is_int(w1.status, 0, "auto: the set completed");
  ok(w2.status == 0 && w2.result == 5, "auto: add returned 5");
  is_int(run(&w4), UVCCL_ENOTSUP, "auto: the queued multi_get fails with "
         "UVCCL_ENOTSUP: %s", w4.msg);
  ok(strstr(w4.msg, "1.13") != NULL, "auto: its message says why");
  is_int(uvccl_store_append(&a, &w5, "auto/a", "x", 1, NULL), UVCCL_ENOTSUP,
         "auto: after the fallback, append is refused at the call");
  uvccl_store_get(s, &w6, "auto/a", NULL);
  is_int(run(&w6), 0, "auto: a 1.13 client sees the key");
  ok(w6.value_len == 2 && memcmp(w6.value, "v1", 2) == 0, "auto: same value");
  nkeys += 2;
  uvccl_work_cleanup(&w3);
  uvccl_work_cleanup(&w6);
  close_client(&a);
}

/* init/ as PyTorch's client: world_size adds 1 to the unprefixed key. */
static void init_key(void) {
  uvccl_store_t a, b;
  uvccl_work_t w = {0};
  open_client(&a, 2);
  open_client(&b, 2);
  uvccl_tcp_store_connect(&a, &w, NULL);
  is_int(run(&w), 0, "a client with world_size connects");
  is_int(num_keys(&a), nkeys + 1, "and adds init/");
  uvccl_tcp_store_connect(&b, &w, NULL);
  run(&w);
  is_int(num_keys(&b), nkeys + 1, "a second one counts on the same key");
  nkeys += 1;
  close_client(&a);
  close_client(&b);
}

/* PyTorch's Python client and ours on the same PyTorch server. */
static void with_python(uvccl_store_t *s) {
  child_t ch;
  char hx[2 * sizeof(binary) + 1];
  char portbuf[16];
  void *v = NULL;
  size_t len = 0;

  snprintf(portbuf, sizeof(portbuf), "%d", port);
  hex(hx, binary, sizeof(binary));
  {
    const char *args[] = {portbuf, "set", "from_py", hx, NULL};
    tap_require(spawn_py(&ch, CLIENT_PY, args, 0) == 0, "python set started");
    child_finish(&ch);
    if (!is_int(ch.status, 0, "python set exits 0")) dump(&ch, "python set");
    child_free(&ch);
  }
  is_int(uvccl_store_get_sync(s, "from_py", &v, &len), 0,
         "we get what PyTorch's client set");
  ok(len == sizeof(binary) && v && memcmp(v, binary, len) == 0,
     "the exact bytes");
  free(v);
  is_int(uvccl_store_set_sync(s, "from_c", "hello\0world", 11), 0, "we set");
  is_int(uvccl_store_set_sync(s, "from_c_big", big, BIG_LEN), 0,
         "we set 1 MiB");
  nkeys += 3;
  {
    const char *args[] = {portbuf, "get", "from_c", "from_c_big", NULL};
    tap_require(spawn_py(&ch, CLIENT_PY, args, 0) == 0, "python get started");
    child_finish(&ch);
    if (!is_int(ch.status, 0, "python get exits 0")) dump(&ch, "python get");
    is_str(field(&ch, "value_from_c"), "68656c6c6f00776f726c64",
           "PyTorch's client gets what we set");
    is_str(field(&ch, "len_from_c_big"), "1048576",
           "PyTorch's client gets our 1 MiB value: length");
    is_str(field(&ch, "is_big_from_c_big"), "1", "... and bytes");
    child_free(&ch);
  }
  is_int(num_keys(s), nkeys, "num_keys exact");
}

/* The server goes away: a pending wait fails with UVCCL_ECONNLOST, and the
 * next operation fails to reconnect, each naming the server. */
static void server_gone(uvccl_store_t *s, uvccl_store_t *s2) {
  uvccl_work_t w = {0}, w2 = {0};
  const char *k[] = {"forever"};
  uint64_t t0, elapsed_ms;
  int r;
  /* s2 is connected: the WAIT is written at once, and nobody sets the
   * key, so it stays pending until the server goes away. */
  uvccl_store_wait(s2, &w2, k, 1, UVCCL_DEFAULT_TIMEOUT, NULL);
  run_for(200);
  ok(!uvccl_work_done(&w2), "a wait is pending on the PyTorch server");
  is_int(stop_torch_server(), 0, "PyTorch server stops when stdin closes");
  is_int(run(&w2), UVCCL_ECONNLOST, "the pending wait fails: connection lost");
  ok(strstr(w2.msg, "127.0.0.1") != NULL, "naming the server: %s", w2.msg);
  uvccl_store_set_timeout(s, 1500);
  uvccl_store_add(s, &w, "n", 1, NULL);
  r = run(&w);
  ok(r == UVCCL_ECONNLOST || r == UV_ECONNREFUSED || r == UV_ETIMEDOUT,
     "the next operation fails: %s", uvccl_err_name(r));
  ok(strstr(w.msg, "127.0.0.1") != NULL, "naming the server: %s", w.msg);
  /* The next one gets a connect cycle of its own: it retries for its own
   * timeout (1500 ms) before it fails. (A lower bound on the time cannot
   * be broken by a slow machine.) */
  t0 = uv_hrtime();
  uvccl_store_add(s, &w, "n", 1, NULL);
  r = run(&w);
  elapsed_ms = (uv_hrtime() - t0) / 1000000;
  ok(r == UV_ECONNREFUSED || r == UV_ETIMEDOUT,
     "and the one after (reconnecting): %s", uvccl_err_name(r));
  ok(elapsed_ms >= 1000,
     "it retried for its own timeout, not a previous operation's: failed "
     "after %llu ms of 1500", (unsigned long long)elapsed_ms);
  ok(strstr(w.msg, "127.0.0.1") != NULL &&
         strstr(w.msg, "connection refused") != NULL,
     "naming the server and why: %s", w.msg);
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&w2);
}

int main(void) {
  uvccl_store_t s, s2;

  tap_alarm(120);
  if (system(PY " -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    skip_all("no python3-torch");
  atexit(kill_children);
  make_values();
  uv_loop_init(&loop);
  start_torch_server();
  open_client(&s, 0);
  open_client(&s2, 0);
  is_int(num_keys(&s), 0, "a fresh PyTorch server holds no keys");

  every_op(&s, &s2);
  pipelined(&s);
  unsupported(&s);
  auto_dialect(&s);
  init_key();
  with_python(&s);
  server_gone(&s, &s2);

  close_client(&s);
  close_client(&s2);
  if (srv.status != 0) dump(&srv, "PyTorch server");
  child_free(&srv);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
