/* Work objects: the callback runs exactly once, on the loop, never inside
 * the call; timeouts, cancel, reuse in the callback; the wait helper; and
 * cross-thread completion through the locked queue. Uses the hash store as
 * the simplest owner of works. */
#include "tap.h"
#include "uvccl.h"
#include "loop/internal.h"

static uv_loop_t loop;
static int calls;
static int in_call;
static int called_inside;
static int last_status;

static void count_cb(uvccl_work_t *w, int status) {
  calls++;
  last_status = status;
  if (in_call) called_inside = 1;
}

/* Reuses the work from inside its own callback. */
static uvccl_store_t *reuse_store;
static int reuse_rounds;
static void reuse_cb(uvccl_work_t *w, int status) {
  if (status == 0 && ++reuse_rounds < 100)
    uvccl_store_add(reuse_store, w, "r", 1, reuse_cb);
}

/* Cross-thread: items posted from threads run on the loop, in order. */
#define NTHREADS 4
#define PER_THREAD 10000
typedef struct {
  uvccl__xitem_t item;
  int thread;
  int seq;
} xitem_t;
static uvccl__xqueue_t xq;
static int xseen[NTHREADS];
static int xorder_ok = 1;
static int xtotal;
static uv_thread_t loop_thread;
static int xwrong_thread;

static void xfn(uvccl__xitem_t *it) {
  xitem_t *x = (xitem_t *)it;
  uv_thread_t self = uv_thread_self();
  if (!uv_thread_equal(&self, &loop_thread)) xwrong_thread = 1;
  if (x->seq != xseen[x->thread]) xorder_ok = 0;
  xseen[x->thread] = x->seq + 1;
  ++xtotal;
  free(x);
}

static void poster(void *arg) {
  int t = (int)(intptr_t)arg, i;
  for (i = 0; i < PER_THREAD; i++) {
    xitem_t *x = malloc(sizeof(*x));
    x->item.fn = xfn;
    x->thread = t;
    x->seq = i;
    uvccl__xqueue_post(&xq, &x->item);
  }
}

static int store_closed;
static void on_store_closed(uvccl_store_t *s) { store_closed++; }

int main(void) {
  uvccl_store_t s;
  uvccl_work_t w = {0}, w2 = {0};
  const char *k[] = {"never"};
  uv_thread_t th[NTHREADS];
  int i, r;

  tap_alarm(30);
  uv_loop_init(&loop);
  tap_require(uvccl_hash_store_init(&loop, &s) == 0, "hash store");

  in_call = 1;
  r = uvccl_store_set(&s, &w, "k", "v", 1, count_cb);
  in_call = 0;
  is_int(r, 0, "set started");
  is_int(calls, 0, "callback not run inside the call");
  is_int(w.state, UVCCL_WORK_PENDING, "pending until the loop runs");
  is_int(uvccl_store_set(&s, &w, "k", "v", 1, count_cb), UVCCL_EBUSY,
         "a pending work cannot be started again");
  uv_run(&loop, UV_RUN_NOWAIT);
  is_int(calls, 1, "callback ran once");
  ok(!called_inside, "never inside the call");
  is_int(w.state, UVCCL_WORK_SUCCEEDED, "state succeeded");
  uv_run(&loop, UV_RUN_NOWAIT);
  is_int(calls, 1, "and only once");

  /* Timeout */
  calls = 0;
  is_int(uvccl_store_wait(&s, &w, k, 1, 30, count_cb), 0, "wait started");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(calls, 1, "timeout delivered once");
  is_int(last_status, UV_ETIMEDOUT, "status UV_ETIMEDOUT");
  is_int(w.state, UVCCL_WORK_TIMED_OUT, "state timed out");
  ok(strstr(w.msg, "never") != NULL, "message names the key: %s", w.msg);
  is_str(uvccl_work_state_name(w.state), "timed out", "state name");

  /* A timeout counts from the call, not from when the loop last ran: the
   * loop sits idle for 300 ms, then a wait of 200 ms starts. */
  {
    uint64_t t0;
    struct timespec nap = {0, 300 * 1000000L};
    calls = 0;
    uv_run(&loop, UV_RUN_NOWAIT);
    nanosleep(&nap, NULL);
    t0 = uv_hrtime();
    uvccl_store_wait(&s, &w, k, 1, 200, count_cb);
    uv_run(&loop, UV_RUN_DEFAULT);
    is_int(last_status, UV_ETIMEDOUT, "after an idle loop: times out");
    ok((uv_hrtime() - t0) / 1000000 >= 190,
       "after an idle loop: not before its 200 ms (%llu ms)",
       (unsigned long long)((uv_hrtime() - t0) / 1000000));
  }

  /* Cancel */
  calls = 0;
  uvccl_store_wait(&s, &w, k, 1, 10000, count_cb);
  is_int(uvccl_work_cancel(&w), 0, "cancel a pending wait");
  is_int(calls, 0, "cancel does not call back inside");
  is_int(uvccl_work_cancel(&w), UV_EINVAL, "cancel twice is refused");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(calls, 1, "cancel delivered once");
  is_int(w.state, UVCCL_WORK_CANCELLED, "state cancelled");
  is_int(w.status, UV_ECANCELED, "status UV_ECANCELED");
  /* A cancelled wait no longer holds a registration. */
  uvccl_store_set(&s, &w2, "never", "x", 1, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(calls, 1, "a set after cancel does not call back again");

  /* The wait helper, and a blocking get released later. */
  uvccl_store_get(&s, &w, "later", NULL);
  uvccl_store_set(&s, &w2, "later", "ok", 2, NULL);
  is_int(uvccl_work_wait(&w), 0, "work_wait");
  is_mem(w.value, w.value_len, "ok", "get value");
  ok(((char *)w.value)[w.value_len] == '\0', "values are NUL-terminated");
  uvccl_work_cleanup(&w);
  is_int(w.state, UVCCL_WORK_IDLE, "cleanup makes it idle");
  ok(w.value == NULL, "cleanup frees the value");

  /* A get nobody can ever satisfy, with no timeout: the wait helper fails
   * instead of spinning forever. */
  uvccl_store_set_timeout(&s, UVCCL_NO_TIMEOUT);
  uvccl_store_get(&s, &w, "nobody", NULL);
  is_int(uvccl_work_wait(&w), UVCCL_EABORTED, "deadlocked wait detected");
  uvccl_store_set_timeout(&s, 0);
  is_int(uvccl_store_get_timeout(&s), UVCCL_STORE_DEFAULT_TIMEOUT_MS,
         "timeout 0 restores the default");

  /* Reuse from inside the callback. */
  reuse_store = &s;
  uvccl_store_add(&s, &w, "r", 1, reuse_cb);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(reuse_rounds, 100, "work reused from its own callback");
  is_int(w.result, 100, "and each add saw the previous one");

  /* Argument errors never call back. */
  calls = 0;
  is_int(uvccl_store_set(&s, &w, NULL, "v", 1, count_cb), UV_EINVAL,
         "NULL key");
  is_int(uvccl_store_set(&s, &w, "k", NULL, 3, count_cb), UV_EINVAL,
         "NULL value with a length");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(calls, 0, "no callback after a synchronous error");

  /* Closing fails pending works with UV_ECANCELED. */
  calls = 0;
  uvccl_store_wait(&s, &w, k, 1, 10000, count_cb);
  k[0] = "never2";
  uvccl_store_get(&s, &w2, "never3", count_cb);
  uvccl_store_close(&s, on_store_closed);
  is_int(uvccl_store_set(&s, &w, "k", "v", 1, count_cb), UVCCL_ECLOSING,
         "no new work on a closing store");
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(calls, 2, "pending works called back on close");
  is_int(w2.status, UV_ECANCELED, "with UV_ECANCELED");
  is_int(store_closed, 1, "close callback ran");
  uvccl_work_cleanup(&w);
  uvccl_work_cleanup(&w2);

  /* Cross-thread queue */
  loop_thread = uv_thread_self();
  tap_require(uvccl__xqueue_init(&loop, &xq) == 0, "xqueue init");
  for (i = 0; i < NTHREADS; i++)
    uv_thread_create(&th[i], poster, (void *)(intptr_t)i);
  while (xtotal < NTHREADS * PER_THREAD) uv_run(&loop, UV_RUN_ONCE);
  /* Posters may still be inside uv_async_send: join before closing. */
  for (i = 0; i < NTHREADS; i++) uv_thread_join(&th[i]);
  uvccl__xqueue_close(&xq, NULL, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(xtotal, NTHREADS * PER_THREAD, "every posted item ran");
  ok(xorder_ok, "in posting order per thread");
  ok(!xwrong_thread, "all on the loop thread");
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
