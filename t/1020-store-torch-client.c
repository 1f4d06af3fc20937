/* The real PyTorch (Debian's python3-torch 1.13, the legacy dialect) as a
 * client of our server: every operation 1.13's Python TCPStore has, with
 * exact values; a get released by another process; a wait timeout and what
 * the same client does next; 8 processes adding to one counter at once; a
 * gloo process group that rendezvouses through our server and all_reduces;
 * and keys crossing between PyTorch's client and ours (both dialects).
 *
 * Our server runs on its own loop in its own thread (PyTorch's clients
 * block, our own client runs on the main thread's loop); the server's loop
 * is touched only from that thread: stats and stop go through a uv_async_t.
 * The Python side is t/py/torch_store_client.py, which prints
 * "name=value" lines that are asserted here. */
#define _GNU_SOURCE /* pipe2 */
#include "tap.h"
#include "uvccl.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#ifndef PY
#define PY "/usr/bin/python3" /* Debian's python3-torch; not PATH's python3 */
#endif
#define HELPER UVCCL_SRC_DIR "/t/py/torch_store_client.py"
#define NADDERS 8
#define NADDS 100

#include "child.h"
#include "torch_values.h"

/* Starts the Python helper with the server's port and args... */
static int spawn_helper(child_t *ch, int port, const char *const *args) {
  const char *argv[14];
  char portbuf[16];
  int n = 0;
  snprintf(portbuf, sizeof(portbuf), "%d", port);
  argv[n++] = portbuf;
  while (*args && n < 13) argv[n++] = *args++;
  argv[n] = NULL;
  return spawn_py(ch, HELPER, argv, 0);
}

/* Runs one helper to the end; its exit status and "done" are asserted. */
static void run_py(child_t *ch, int port, const char *what,
                   const char *const *args) {
  int ok1;
  tap_require(spawn_helper(ch, port, args) == 0, "%s: started", what);
  child_finish(ch);
  ok1 = is_int(ch->status, 0, "%s: python exits 0", what);
  ok1 &= ok(field(ch, "done") != NULL, "%s: python ran to the end", what);
  if (!ok1) dump(ch, what);
}

/* Compares a "name=hex" field with bytes. */
#define is_hex(ch, name, bytes, n, ...)                                      \
  do {                                                                       \
    char hx_[2 * 600 + 1];                                                   \
    hex(hx_, (bytes), (n));                                                  \
    is_str(field((ch), (name)), hx_, __VA_ARGS__);                           \
  } while (0)
#define is_field(ch, name, want, ...) is_str(field((ch), (name)), (want), __VA_ARGS__)

/* "2d32" -> -2: a counter's value printed as hex; -1 if unreadable. */
static long unhex_long(const char *h) {
  char txt[32];
  size_t i, n = h ? strlen(h) / 2 : 0;
  if (h == NULL || n == 0 || n >= sizeof(txt)) return -1;
  for (i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
    txt[i] = (char)v;
  }
  txt[n] = '\0';
  return strtol(txt, NULL, 10);
}

/* ---- our server, in its own thread ---------------------------------------- */

enum { SRV_NONE, SRV_STATS, SRV_STOP };

static uv_loop_t sloop;
static uvccl_store_server_t server;
static uv_async_t sasync;
static uv_thread_t sthread;
static uv_mutex_t smu;
static uv_cond_t scond;
static int srv_req, srv_done, srv_started, srv_init_rc, srv_port;
static int srv_loop_close_rc = -1;
static uvccl_store_server_stats_t srv_stats;

static void srv_on_async(uv_async_t *a) {
  int req;
  uv_mutex_lock(&smu);
  req = srv_req;
  srv_req = SRV_NONE;
  if (req != SRV_NONE) uvccl_store_server_stats(&server, &srv_stats);
  if (req == SRV_STOP) {
    uvccl_store_server_close(&server, NULL);
    uv_close((uv_handle_t *)a, NULL);
  }
  if (req != SRV_NONE) {
    srv_done = 1;
    uv_cond_signal(&scond);
  }
  uv_mutex_unlock(&smu);
}

static void srv_thread(void *arg) {
  uvccl_store_server_options_t so = {0};
  int r;
  (void)arg;
  uv_loop_init(&sloop);
  uv_async_init(&sloop, &sasync, srv_on_async);
  so.host = "127.0.0.1";
  so.port = 0;
  so.listen_fd = -1;
  r = uvccl_store_server_init(&sloop, &server, &so);
  uv_mutex_lock(&smu);
  srv_init_rc = r;
  srv_port = r == 0 ? server.port : 0;
  srv_started = 1;
  uv_cond_signal(&scond);
  uv_mutex_unlock(&smu);
  if (r != 0) uv_close((uv_handle_t *)&sasync, NULL);
  uv_run(&sloop, UV_RUN_DEFAULT);
  srv_loop_close_rc = uv_loop_close(&sloop);
}

/* Asks the server thread to do req and waits until it has. */
static void srv_call(int req, uvccl_store_server_stats_t *st) {
  uv_mutex_lock(&smu);
  srv_req = req;
  srv_done = 0;
  uv_mutex_unlock(&smu);
  uv_async_send(&sasync);
  uv_mutex_lock(&smu);
  while (!srv_done) uv_cond_wait(&scond, &smu);
  if (st) *st = srv_stats;
  uv_mutex_unlock(&smu);
}

static uvccl_store_server_stats_t stats(void) {
  uvccl_store_server_stats_t st;
  srv_call(SRV_STATS, &st);
  return st;
}

/* Polls the server (generously: a noisy machine is slow, never wrong). */
static int poll_waiting(uint64_t want) {
  int i;
  for (i = 0; i < 3000; i++) { /* 60 s */
    if (stats().waiting >= want) return 1;
    sleep_ms(20);
  }
  return 0;
}

static int poll_quiet(void) {
  int i;
  uvccl_store_server_stats_t st;
  for (i = 0; i < 3000; i++) {
    st = stats();
    if (st.connections == 0 && st.waiting == 0) return 1;
    sleep_ms(20);
  }
  return 0;
}

/* ---- our client, on the main thread's loop -------------------------------- */

static uv_loop_t cloop;
static int cclosed;
static void on_cclosed(uvccl_store_t *s) {
  (void)s;
  cclosed++;
}

static void open_client(uvccl_store_t *s, uvccl_dialect_t d) {
  uvccl_tcp_store_options_t o = {0};
  memset(s, 0, sizeof(*s));
  o.host = "127.0.0.1";
  o.port = srv_port;
  o.dialect = d;
  o.timeout_ms = 30000;
  tap_require(uvccl_tcp_store_init(&cloop, s, &o) == 0, "our client init");
}

static void close_client(uvccl_store_t *s) {
  int before = cclosed;
  uvccl_store_close(s, on_cclosed);
  while (cclosed == before) uv_run(&cloop, UV_RUN_ONCE);
}

static int cget(uvccl_store_t *s, uvccl_work_t *w, const char *key) {
  uvccl_work_cleanup(w);
  if (uvccl_store_get(s, w, key, NULL) != 0) return -1;
  return uvccl_work_wait(w);
}

/* ---- the scenarios --------------------------------------------------------- */

static int64_t expected_keys; /* what the store holds, as PyTorch counts */

static void basic_ops(void) {
  child_t ch;
  const char *a[] = {"basic", NULL};
  run_py(&ch, srv_port, "basic", a);
  /* A client built with world_size adds 1 to the unprefixed "init/". */
  is_field(&ch, "num_keys0", "1", "num_keys counts init/ of world_size");
  is_field(&ch, "get_k1", "7631", "set + get");
  is_field(&ch, "get_k1b", "763162", "set overwrites");
  is_field(&ch, "add1", "5", "add on a missing key starts at 0");
  is_field(&ch, "add2", "10", "add again");
  is_field(&ch, "add3", "-2", "add a negative delta");
  is_field(&ch, "add4", "-2", "add 0 reads the counter");
  is_field(&ch, "get_cnt", "2d32", "add stores decimal text (b'-2')");
  is_field(&ch, "cs_create", "6431",
           "compare_set: missing key, empty expected: creates, returns desired");
  is_field(&ch, "get_cs1", "6431", "compare_set: the key was created");
  is_field(&ch, "cs_missing", "657870",
           "compare_set: missing key, non-empty expected: returns expected");
  is_field(&ch, "num_keys_after_cs", "4",
           "compare_set: ... and stores nothing (init/, k1, cnt, cs)");
  is_field(&ch, "cs_swap", "6433", "compare_set: match swaps, returns new");
  is_field(&ch, "get_cs3", "6433", "compare_set: the swap is stored");
  is_field(&ch, "cs_mismatch", "6433",
           "compare_set: mismatch returns the current value");
  is_field(&ch, "get_cs4", "6433", "compare_set: mismatch stores nothing");
  is_field(&ch, "del1", "True", "delete_key of an existing key: True");
  is_field(&ch, "del2", "False", "delete_key of a missing key: False");
  is_field(&ch, "num_keys1", "3", "num_keys exact (init/, cnt, cs)");
  is_hex(&ch, "get_bin", binary, sizeof(binary),
         "binary value with NULs round-trips");
  is_field(&ch, "get_empty", "", "empty value round-trips");
  is_field(&ch, "big_len", "1048576", "1 MiB value: length");
  is_field(&ch, "big_same", "1", "1 MiB value: bytes");
  is_field(&ch, "num_keys2", "6", "num_keys exact (+ bin, empty, big)");
  child_free(&ch);
  expected_keys = 6;
}

/* Keys PyTorch set, read by our client; keys our client sets, read by
 * PyTorch. Our client prefixes "/" as PyTorch's does. */
static void cross_visibility(void) {
  uvccl_store_t s;
  uvccl_work_t w = {0};
  const char *present[] = {"cs", "cnt", "bin"};
  const char *absent[] = {"cs", "cs_missing"};
  int d;
  child_t ch;
  const char *a[] = {"get", "c_legacy", "c_modern", "c_big", NULL};

  for (d = 0; d < 2; d++) {
    uvccl_dialect_t dl = d ? UVCCL_DIALECT_MODERN : UVCCL_DIALECT_LEGACY;
    const char *dn = d ? "modern" : "legacy";
    open_client(&s, dl);
    is_int(cget(&s, &w, "cs"), 0, "our %s client: get a key PyTorch set", dn);
    is_mem(w.value, w.value_len, "d3", "our %s client: its value", dn);
    cget(&s, &w, "cnt");
    is_mem(w.value, w.value_len, "-2", "our %s client: PyTorch's counter", dn);
    cget(&s, &w, "bin");
    ok(w.value_len == sizeof(binary) &&
           memcmp(w.value, binary, sizeof(binary)) == 0,
       "our %s client: PyTorch's binary value", dn);
    cget(&s, &w, "empty");
    is_int(w.value_len, 0, "our %s client: PyTorch's empty value", dn);
    cget(&s, &w, "big");
    ok(w.value_len == BIG_LEN && memcmp(w.value, big, BIG_LEN) == 0,
       "our %s client: PyTorch's 1 MiB value", dn);
    uvccl_work_cleanup(&w);
    uvccl_store_check(&s, &w, present, 3, NULL);
    uvccl_work_wait(&w);
    is_int(w.result, 1, "our %s client: check sees PyTorch's keys", dn);
    uvccl_store_check(&s, &w, absent, 2, NULL);
    uvccl_work_wait(&w);
    is_int(w.result, 0,
           "our %s client: check: compare_set on a missing key stored nothing",
           dn);
    uvccl_store_num_keys(&s, &w, NULL);
    uvccl_work_wait(&w);
    is_int(w.result, expected_keys, "our %s client: the same num_keys", dn);
    if (dl == UVCCL_DIALECT_LEGACY) {
      is_int(uvccl_store_set_sync(&s, "c_legacy", binary, sizeof(binary)), 0,
             "our legacy client: set a binary value");
      expected_keys += 1;
    } else {
      is_int(uvccl_store_set_sync(&s, "c_modern", "from C", 6), 0,
             "our modern client: set");
      is_int(uvccl_store_set_sync(&s, "c_big", big, BIG_LEN), 0,
             "our modern client: set 1 MiB");
      expected_keys += 2;
      /* list_keys shows user keys only, without the "/" (init/ hidden). */
      uvccl_store_list_keys(&s, &w, NULL);
      if (is_int(uvccl_work_wait(&w), 0, "our modern client: list_keys")) {
        size_t i;
        int seen = 0;
        for (i = 0; i < w.nvalues; i++) {
          const char *k = w.values[i].base;
          if (!strcmp(k, "cnt") || !strcmp(k, "cs") || !strcmp(k, "bin") ||
              !strcmp(k, "empty") || !strcmp(k, "big") ||
              !strcmp(k, "c_legacy") || !strcmp(k, "c_modern") ||
              !strcmp(k, "c_big"))
            seen++;
        }
        is_int(w.nvalues, 8, "list_keys: count (init/ hidden)");
        is_int(seen, 8, "list_keys: the keys PyTorch and we set");
      }
      uvccl_work_cleanup(&w);
    }
    close_client(&s);
  }
  run_py(&ch, srv_port, "python get of our keys", a);
  is_hex(&ch, "value_c_legacy", binary, sizeof(binary),
         "PyTorch gets the binary value our legacy client set");
  is_hex(&ch, "value_c_modern", "from C", 6,
         "PyTorch gets the value our modern client set");
  is_field(&ch, "len_c_big", "1048576",
           "PyTorch gets our 1 MiB value: length");
  is_field(&ch, "is_big_c_big", "1", "PyTorch gets our 1 MiB value: bytes");
  child_free(&ch);
}

/* A get that waits for a key a second PyTorch process sets 0.5 s later. */
static void blocking_get(void) {
  child_t getter, setter;
  const char *ga[] = {"getwait", "late", "60", NULL};
  const char *sa[] = {"setlater", "late", "released", "0.5", NULL};
  int ok1;
  tap_require(spawn_helper(&getter, srv_port, ga) == 0, "getter started");
  /* Start the setter only once the getter's WAIT is registered, so the
   * get really blocks however slowly Python starts. */
  ok1 = ok(poll_waiting(1), "the getter's get waits on the server");
  tap_require(spawn_helper(&setter, srv_port, sa) == 0, "setter started");
  child_finish(&setter);
  child_finish(&getter);
  if (!is_int(setter.status, 0, "setter exits 0")) dump(&setter, "setter");
  if (!is_int(getter.status, 0, "getter exits 0") || !ok1)
    dump(&getter, "getter");
  is_hex(&getter, "value", "released", 8,
         "the blocked get returns the value set by another process");
  child_free(&getter);
  child_free(&setter);
  expected_keys += 1;
}

/* wait() with a timeout on a missing key, then the same client goes on.
 *
 * 1.13's client times out on the socket (SO_RCVTIMEO) and sends no
 * CANCEL_WAIT, so the server keeps its registration. Our server drops a
 * connection's old registration when it sends a new WAIT (every get does),
 * so as long as the awaited key is not set before the client's next
 * request, the same client keeps working, and setting the key later sends
 * it nothing. (1.13's own server keeps both registrations: the later set
 * sends a stray byte and the client's next get fails with "Socket
 * Timeout".) If the key IS set between the timeout and the next request,
 * the server must answer the WAIT still registered, and the 1.13 client
 * reads that byte as the answer to its next WAIT: that is inherent in the
 * 1.13 protocol and no server can avoid it, so it is not tested. */
static void wait_timeout(void) {
  child_t ch;
  const char *a[] = {"waittimeout", NULL};
  const char *msg;
  run_py(&ch, srv_port, "wait timeout", a);
  is_field(&ch, "wait_raised", "1", "wait on a missing key raises");
  is_field(&ch, "wait_exc", "RuntimeError", "as a RuntimeError");
  msg = field(&ch, "wait_msg");
  ok(msg && strstr(msg, "Timeout"), "with a timeout message: %s",
     msg ? msg : "(none)");
  is_field(&ch, "wait_waited", "1", "after waiting the timeout");
  is_hex(&ch, "get_after", "e1", 2, "the same client: next get works");
  is_hex(&ch, "get_after2", "e2", 2,
         "the same client: still in step after the awaited key is set");
  is_hex(&ch, "get_missing_now", "m1", 2,
         "the same client: gets the formerly awaited key");
  is_field(&ch, "wait_now", "1", "the same client: wait on it returns");
  child_free(&ch);
  expected_keys += 3; /* wt_exist, wt_missing, wt_exist2 */
}

/* 8 PyTorch processes add 1 to one counter 100 times each, all at once. */
static void parallel_adders(void) {
  child_t ch[NADDERS];
  const char *a[] = {"adder", "ctr", "100", NULL};
  static char seen[NADDERS * NADDS + 1];
  uvccl_store_t s;
  int i, started = 0, bad_order = 0, bad_value = 0, total = 0, dup = 0;
  int64_t v = 0;

  for (i = 0; i < NADDERS; i++)
    tap_require(spawn_helper(&ch[i], srv_port, a) == 0, "adder %d started", i);
  open_client(&s, UVCCL_DIALECT_LEGACY);
  /* Release them together once all are connected and waiting. */
  for (i = 0; i < 1500 && v < NADDERS; i++) { /* 90 s */
    if (uvccl_store_add_sync(&s, "adders_started", 0, &v) != 0) break;
    if (v < NADDERS) sleep_ms(60);
  }
  started = v == NADDERS;
  ok(started, "all %d adders connected (add 0 reads the counter: %lld)",
     NADDERS, (long long)v);
  is_int(uvccl_store_set_sync(&s, "adders_go", "go", 2), 0,
         "our client releases them");
  for (i = 0; i < NADDERS; i++) {
    const char *adds, *p;
    long prev = 0;
    int n = 0;
    child_finish(&ch[i]);
    if (!is_int(ch[i].status, 0, "adder %d exits 0", i)) dump(&ch[i], "adder");
    adds = field(&ch[i], "adds");
    for (p = adds; p && *p;) {
      char *e;
      long x = strtol(p, &e, 10);
      if (e == p) break;
      if (x <= prev) bad_order++;
      if (x < 1 || x > NADDERS * NADDS) bad_value++;
      else if (seen[x]++) dup++;
      prev = x;
      n++;
      total++;
      p = *e == ',' ? e + 1 : e;
    }
    is_int(n, NADDS, "adder %d: %d results", i, NADDS);
    /* Its get after its adds sees at least its own last result. */
    ok(unhex_long(field(&ch[i], "final_seen")) >= prev,
       "adder %d: a later get sees at least its own last add (%ld)", i, prev);
    child_free(&ch[i]);
  }
  is_int(total, NADDERS * NADDS, "every add answered");
  is_int(bad_order, 0, "each process sees its results strictly increase");
  is_int(bad_value + dup, 0,
         "the results are exactly 1..%d, each once (adds are atomic)",
         NADDERS * NADDS);
  is_int(uvccl_store_add_sync(&s, "ctr", 0, &v), 0, "our client reads ctr");
  is_int(v, NADDERS * NADDS, "final counter is exact");
  close_client(&s);
  expected_keys += 3; /* adders_started, adders_go, ctr */
}

/* init_process_group("gloo", "tcp://...") for 2 ranks through our server,
 * then all_reduce and all_gather. */
static void process_group(void) {
  child_t ch[2];
  const char *a0[] = {"pg", "0", "2", NULL};
  const char *a1[] = {"pg", "1", "2", NULL};
  int i;
  tap_require(spawn_helper(&ch[0], srv_port, a0) == 0, "rank 0 started");
  tap_require(spawn_helper(&ch[1], srv_port, a1) == 0, "rank 1 started");
  for (i = 0; i < 2; i++) {
    char r[16];
    child_finish(&ch[i]);
    if (!is_int(ch[i].status, 0, "rank %d exits 0", i) ||
        !ok(field(&ch[i], "done") != NULL, "rank %d ran to the end", i))
      dump(&ch[i], "rank");
    snprintf(r, sizeof(r), "%d", i);
    is_field(&ch[i], "rank", r, "rank %d: init_process_group gave its rank", i);
    is_field(&ch[i], "world_size", "2", "rank %d: world size", i);
    is_field(&ch[i], "all_reduce", "3,30,2", "rank %d: all_reduce sums", i);
    is_field(&ch[i], "all_gather", "0,7", "rank %d: all_gather", i);
    child_free(&ch[i]);
  }
}

int main(void) {
  uvccl_store_server_stats_t st;
  uvccl_store_t s;
  uvccl_work_t w = {0};

  tap_alarm(120);
  if (system(PY " -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    skip_all("no python3-torch");
  atexit(kill_children);
  make_values();
  uv_mutex_init(&smu);
  uv_cond_init(&scond);
  uv_loop_init(&cloop);
  tap_require(uv_thread_create(&sthread, srv_thread, NULL) == 0,
              "server thread");
  uv_mutex_lock(&smu);
  while (!srv_started) uv_cond_wait(&scond, &smu);
  uv_mutex_unlock(&smu);
  tap_require(srv_init_rc == 0, "our server on 127.0.0.1:%d", srv_port);

  basic_ops();
  cross_visibility();
  blocking_get();
  wait_timeout();
  parallel_adders();

  ok(poll_quiet(), "every PyTorch client disconnected, no wait left");
  st = stats();
  is_int(st.keys, expected_keys, "server holds exactly the keys set");
  open_client(&s, UVCCL_DIALECT_LEGACY);
  uvccl_store_num_keys(&s, &w, NULL);
  uvccl_work_wait(&w);
  is_int(w.result, expected_keys, "num_keys exact after everything");
  close_client(&s);

  process_group();

  ok(poll_quiet(), "all disconnected after the process group");
  st = stats();
  is_int(st.protocol_errors, 0, "no protocol errors on the server");
  is_int(st.waiting, 0, "no wait registered");
  note("server: %llu connections accepted, %llu requests, %llu keys",
       (unsigned long long)st.accepted, (unsigned long long)st.requests,
       (unsigned long long)st.keys);
  ok(st.keys > (uint64_t)expected_keys, "the process group left its keys");

  srv_call(SRV_STOP, NULL);
  uv_thread_join(&sthread);
  is_int(srv_loop_close_rc, 0, "server loop closes clean");
  uv_run(&cloop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&cloop), 0, "client loop closes clean");
  uv_mutex_destroy(&smu);
  uv_cond_destroy(&scond);
  return done_testing();
}
