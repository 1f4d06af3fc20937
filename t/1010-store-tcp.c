/* Our client against our server, on one loop, in both dialects: every
 * operation with the values that come back, waits released by other
 * clients, timeouts with CANCEL_WAIT, and a lost connection. */
#include "tap.h"
#include "uvccl.h"

static uv_loop_t loop;
static uvccl_store_server_t server;

static int run(uvccl_work_t *w) { return uvccl_work_wait(w); }

static void open_client(uvccl_store_t *s, uvccl_dialect_t d, uint64_t tmo) {
  uvccl_tcp_store_options_t o = {0};
  o.host = "127.0.0.1";
  o.port = server.port;
  o.dialect = d;
  o.timeout_ms = tmo;
  tap_require(uvccl_tcp_store_init(&loop, s, &o) == 0, "client init");
}

static int closed;
static void on_closed(uvccl_store_t *s) { closed++; }

static void every_op(uvccl_dialect_t d) {
  uvccl_store_t s, s2, base, base2;
  uvccl_work_t w = {0}, w2 = {0};
  const char *name = d == UVCCL_DIALECT_LEGACY ? "1.13" : "modern";
  const char *keys[] = {"a", "b"};
  int modern = d == UVCCL_DIALECT_MODERN;
  char big[100000];
  int64_t nkeys0;

  /* Each dialect in its own namespace on the shared server. */
  open_client(&base, d, 5000);
  open_client(&base2, d, 5000);
  tap_require(uvccl_prefix_store_init(&s, name, &base) == 0, "prefix store");
  tap_require(uvccl_prefix_store_init(&s2, name, &base2) == 0, "prefix store");

  uvccl_store_num_keys(&s, &w, NULL);
  run(&w);
  nkeys0 = w.result; /* the server is shared by both dialects' runs */
  is_int(uvccl_store_set(&s, &w, "a", "va", 2, NULL), 0, "%s: set starts", name);
  is_int(run(&w), 0, "%s: set acknowledged", name);
  is_int(uvccl_store_get(&s, &w, "a", NULL), 0, "%s: get starts", name);
  is_int(run(&w), 0, "%s: get", name);
  is_mem(w.value, w.value_len, "va", "%s: get returns the value", name);
  uvccl_work_cleanup(&w);

  uvccl_store_add(&s, &w, "n", 5, NULL);
  run(&w);
  is_int(w.result, 5, "%s: add on a missing key", name);
  uvccl_store_add(&s, &w, "n", -2, NULL);
  run(&w);
  is_int(w.result, 3, "%s: add again", name);
  uvccl_store_get(&s, &w, "n", NULL);
  run(&w);
  is_mem(w.value, w.value_len, "3", "%s: add stores decimal text", name);

  uvccl_store_compare_set(&s, &w, "cas", "", 0, "x", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "x", "%s: compare_set creates", name);
  uvccl_store_compare_set(&s, &w, "cas", "nope", 4, "y", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "x", "%s: compare_set mismatch keeps", name);
  uvccl_store_compare_set(&s, &w, "cas", "x", 1, "z", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "z", "%s: compare_set swaps", name);
  uvccl_store_compare_set(&s, &w, "missing", "e", 1, "d", 1, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "e", "%s: compare_set missing returns expected",
         name);

  uvccl_store_check(&s, &w, keys, 2, NULL);
  run(&w);
  is_int(w.result, 0, "%s: check with b missing", name);
  uvccl_store_set(&s, &w, "b", "", 0, NULL);
  run(&w);
  uvccl_store_check(&s, &w, keys, 2, NULL);
  run(&w);
  is_int(w.result, 1, "%s: check with both (empty value counts)", name);

  uvccl_store_num_keys(&s, &w, NULL);
  run(&w);
  is_int(w.result, nkeys0 + 4, "%s: num_keys", name);
  uvccl_store_delete_key(&s, &w, "b", NULL);
  run(&w);
  is_int(w.result, 1, "%s: delete existing", name);
  uvccl_store_delete_key(&s, &w, "b", NULL);
  run(&w);
  is_int(w.result, 0, "%s: delete missing", name);

  /* A get that waits, released by another client's set. */
  is_int(uvccl_store_get(&s, &w, "late", NULL), 0, "%s: blocking get", name);
  uvccl_store_set(&s2, &w2, "late", "here", 4, NULL);
  run(&w2);
  is_int(run(&w), 0, "%s: blocking get released", name);
  is_mem(w.value, w.value_len, "here", "%s: blocking get value", name);

  /* A wait that times out, then the stream is still in step. */
  {
    const char *k1[] = {"never"};
    uvccl_store_wait(&s, &w, k1, 1, 100, NULL);
    is_int(run(&w), UV_ETIMEDOUT, "%s: wait times out", name);
    is_int(w.state, UVCCL_WORK_TIMED_OUT, "%s: state timed out", name);
    ok(strstr(w.msg, "never") != NULL, "%s: message names the key: %s", name,
       w.msg);
    uvccl_store_add(&s, &w, "n", 1, NULL);
    is_int(run(&w), 0, "%s: next op after the timeout", name);
    is_int(w.result, 4, "%s: and its reply is its own", name);
  }

  /* Large values, pipelined. */
  memset(big, 'q', sizeof(big));
  uvccl_store_set(&s, &w, "big", big, sizeof(big), NULL);
  uvccl_store_get(&s2, &w2, "big", NULL);
  run(&w);
  is_int(run(&w2), 0, "%s: big get", name);
  is_int(w2.value_len, sizeof(big), "%s: big length", name);
  ok(w2.value && memcmp(w2.value, big, sizeof(big)) == 0, "%s: big bytes",
     name);

  if (modern) {
    const char *mk[] = {"m1", "m2"};
    uvccl_buf_t mv[] = {{"one", 3}, {"two", 3}};
    uvccl_store_append(&s, &w, "ap", "x", 1, NULL);
    run(&w);
    uvccl_store_append(&s, &w, "ap", "yz", 2, NULL);
    run(&w);
    uvccl_store_get(&s, &w, "ap", NULL);
    run(&w);
    is_mem(w.value, w.value_len, "xyz", "append concatenates");
    uvccl_store_multi_set(&s, &w, mk, mv, 2, NULL);
    run(&w);
    uvccl_store_multi_get(&s, &w, mk, 2, NULL);
    is_int(run(&w), 0, "multi_get");
    is_int(w.nvalues, 2, "multi_get count");
    if (w.nvalues == 2) {
      is_mem(w.values[0].base, w.values[0].len, "one", "multi_get 0");
      is_mem(w.values[1].base, w.values[1].len, "two", "multi_get 1");
    }
    uvccl_store_queue_push(&s, &w, "q", "i1", 2, NULL);
    run(&w);
    uvccl_store_queue_push(&s, &w, "q", "i2", 2, NULL);
    run(&w);
    uvccl_store_queue_len(&s, &w, "q", NULL);
    run(&w);
    is_int(w.result, 2, "queue_len");
    uvccl_store_queue_pop(&s, &w, "q", 0, NULL);
    run(&w);
    is_mem(w.value, w.value_len, "i1", "queue_pop is FIFO");
    uvccl_store_queue_pop(&s, &w, "q", 1, NULL);
    run(&w);
    is_mem(w.value, w.value_len, "i2", "queue_pop second");
    uvccl_store_queue_pop(&s, &w, "q", 0, NULL);
    is_int(run(&w), UVCCL_EQEMPTY, "queue_pop empty");
    uvccl_store_queue_pop(&s, &w, "q", 1, NULL);
    uvccl_store_queue_push(&s2, &w2, "q", "i3", 2, NULL);
    run(&w2);
    is_int(run(&w), 0, "blocking queue_pop released by a push");
    is_mem(w.value, w.value_len, "i3", "blocking queue_pop value");
    uvccl_store_list_keys(&s, &w, NULL);
    is_int(run(&w), 0, "list_keys");
    is_int(w.nvalues, 8, "list_keys count");
  } else {
    is_int(uvccl_store_append(&s, &w, "ap", "x", 1, NULL), UVCCL_ENOTSUP,
           "1.13: append not in the dialect");
  }
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&w2);
  {
    int before = closed;
    uvccl_store_close(&s, on_closed);
    uvccl_store_close(&s2, on_closed);
    uvccl_store_close(&base, on_closed);
    uvccl_store_close(&base2, on_closed);
    /* The memory belongs to the store until its close callback. */
    while (closed < before + 4) uv_run(&loop, UV_RUN_ONCE);
  }
}

static void lost_connection(void) {
  uvccl_store_t s;
  uvccl_work_t w = {0};
  uvccl_store_server_t srv2;
  uvccl_store_server_options_t so = {0};
  const char *k[] = {"x"};
  uvccl_tcp_store_options_t o = {0};
  int port;

  so.host = "127.0.0.1";
  so.listen_fd = -1;
  is_int(uvccl_store_server_init(&loop, &srv2, &so), 0, "second server");
  port = srv2.port;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 2000;
  uvccl_tcp_store_init(&loop, &s, &o);
  uvccl_tcp_store_connect(&s, &w, NULL);
  is_int(run(&w), 0, "connected");
  uvccl_store_wait(&s, &w, k, 1, UVCCL_DEFAULT_TIMEOUT, NULL);
  {
    uvccl_store_server_stats_t st;
    do {
      uv_run(&loop, UV_RUN_ONCE);
      uvccl_store_server_stats(&srv2, &st);
    } while (st.waiting == 0);
  }
  uvccl_store_server_close(&srv2, NULL);
  is_int(run(&w), UVCCL_ECONNLOST, "server gone: pending wait fails");
  ok(strstr(w.msg, "127.0.0.1") != NULL, "message names the server: %s",
     w.msg);
  uvccl_store_add(&s, &w, "x", 1, NULL);
  is_int(run(&w), UV_ETIMEDOUT, "reconnect keeps failing until the timeout");
  ok(strstr(w.msg, "connecting (last error: connection refused)") != NULL,
     "the message says why: %s", w.msg);
  uvccl_store_close(&s, on_closed);
  while (closed < 9) uv_run(&loop, UV_RUN_ONCE);
}

int main(void) {
  uvccl_store_server_options_t so = {0};
  tap_alarm(60);
  uv_loop_init(&loop);
  so.host = "127.0.0.1";
  so.listen_fd = -1;
  tap_require(uvccl_store_server_init(&loop, &server, &so) == 0,
              "server on port %d", server.port);
  every_op(UVCCL_DIALECT_MODERN);
  every_op(UVCCL_DIALECT_LEGACY);
  lost_connection();
  uvccl_store_server_close(&server, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(closed, 9, "every store closed");
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
