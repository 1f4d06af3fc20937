/* PyTorch 2.x and uvccl, both ways, on every PyTorch 2.x this machine has:
 * python3 on PATH if its torch is 2.x (the GPU machines), and the Debian
 * roots that tools/torch-root.sh makes (under /opt/uvccl-torch, or
 * UVCCL_TORCH_ROOTS). For each:
 *
 *  - PyTorch's own client against our server: t/run-torch-modern.sh (every
 *    operation that PyTorch's Python TCPStore has, with exact values, and a
 *    2-rank gloo process group bootstrapped through our server); each of
 *    its TAP lines is relayed here.
 *  - Our client, in the newer dialect (our default), against PyTorch's
 *    server, with each backend that build has (libuv, and the poll() one):
 *    every operation with exact values, a get released by another client,
 *    a wait that times out and the connection still in step after it (the
 *    CANCEL_WAIT exchange), init/ registration; and, where that server
 *    lacks an operation (queues and list_keys on the poll() backend), a
 *    clear "connection lost" naming the server and a working next call.
 *
 * A machine with no PyTorch 2.x skips (Debian 12's python3-torch is 1.13:
 * t/1020 and t/1021 cover it). */
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

#include "child.h"
#include "torch_values.h"
#include "loop_helpers.h"

#define RUN_MODERN UVCCL_SRC_DIR "/t/run-torch-modern.sh"
#define TORCH_ROOT_SH UVCCL_SRC_DIR "/tools/torch-root.sh"
#define MAX_ENVS 8

/* ---- where PyTorch 2.x is ----------------------------------------------- */

typedef struct {
  char label[600];   /* for the test descriptions */
  char root[512];    /* a tools/torch-root.sh root, or "" for PATH's python3 */
  char version[64];  /* torch.__version__ */
  int major, minor;
} torch_env_t;

static torch_env_t envs[MAX_ENVS];
static int nenvs;

/* argv to run python3 in env e with args (NULL-terminated) after it. */
static void python_argv(const torch_env_t *e, const char **argv,
                        const char *const *args) {
  int n = 0;
  if (e->root[0]) {
    argv[n++] = TORCH_ROOT_SH;
    argv[n++] = "run";
    argv[n++] = e->root;
    argv[n++] = "python3";
  } else {
    argv[n++] = "/usr/bin/env";
    argv[n++] = getenv("UVCCL_TORCH2_PYTHON") ? getenv("UVCCL_TORCH2_PYTHON")
                                               : "python3";
  }
  while (args && *args && n < 15) argv[n++] = *args++;
  argv[n] = NULL;
}

/* Where env e's python3 sees the repository's Python scripts. */
static const char *script_dir(const torch_env_t *e) {
  return e->root[0] ? "/uvccl" : UVCCL_SRC_DIR "/t";
}

/* Adds the env if its python3 has torch.distributed of version 2 or more. */
static void probe(const char *root) {
  torch_env_t *e = &envs[nenvs];
  const char *argv[16];
  const char *args[] = {"-c",
                        "import torch, torch.distributed; "
                        "print('torch=' + torch.__version__)",
                        NULL};
  child_t ch;
  const char *v;
  if (nenvs == MAX_ENVS) return;
  memset(e, 0, sizeof(*e));
  snprintf(e->root, sizeof(e->root), "%s", root);
  python_argv(e, argv, args);
  if (spawn_argv(&ch, argv, 0) != 0) return;
  child_finish(&ch);
  v = field(&ch, "torch");
  if (ch.status == 0 && v &&
      sscanf(v, "%d.%d", &e->major, &e->minor) == 2 && e->major >= 2) {
    snprintf(e->version, sizeof(e->version), "%.63s", v);
    snprintf(e->label, sizeof(e->label), "torch %.63s (%.511s)", v,
             root[0] ? root : "python3");
    nenvs++;
  }
  child_free(&ch);
}

static void find_envs(void) {
  child_t ch;
  const char *list[] = {TORCH_ROOT_SH, "list", NULL};
  char *p, *eol;

  probe("");
  if (spawn_argv(&ch, list, 0) != 0) return;
  child_finish(&ch);
  for (p = ch.buf; p && *p; p = eol ? eol + 1 : NULL) {
    eol = strchr(p, '\n');
    if (eol) *eol = '\0';
    if (*p == '\0') continue;
    if (geteuid() != 0) {
      note("%s: not root, so no chroot into it", p);
      continue;
    }
    probe(p);
  }
  child_free(&ch);
}

/* prove shows a test's stderr but not its TAP comments: a failure here
 * involves processes in another root, so what they printed goes there. */
static void dump_stderr(const child_t *ch, const char *what) {
  fprintf(stderr, "# output of %s (exit %d):\n%s\n", what, ch->status,
          ch->buf ? ch->buf : "");
}

/* ---- PyTorch's client, our server --------------------------------------- */

/* Relays each TAP line of the run, prefixed with the env. */
static void their_client(const torch_env_t *e) {
  child_t ch;
  const char *argv[] = {"/bin/bash", RUN_MODERN, NULL};
  char *p, *eol, *copy;
  int n = 0, bad = 0;

  if (e->root[0]) setenv("TORCH_ROOT", e->root, 1);
  else {
    unsetenv("TORCH_ROOT");
    setenv("PYTHON", getenv("UVCCL_TORCH2_PYTHON") ? getenv("UVCCL_TORCH2_PYTHON")
                                                   : "python3", 1);
  }
  setenv("UVCCL_STORE", UVCCL_BUILD_DIR "/bin/uvccl-store", 1);
  tap_require(spawn_argv(&ch, argv, 0) == 0, "run-torch-modern.sh started");
  child_finish(&ch);
  copy = strdup(ch.buf);
  for (p = copy; p && *p; p = eol ? eol + 1 : NULL) {
    char *desc, *why;
    int good;
    eol = strchr(p, '\n');
    if (eol) *eol = '\0';
    if (strncmp(p, "ok ", 3) == 0) good = 1;
    else if (strncmp(p, "not ok ", 7) == 0) good = 0;
    else continue;
    desc = strstr(p, " - ");
    desc = desc ? desc + 3 : p;
    n++;
    if (!good) bad++;
    if ((why = strstr(desc, " # SKIP ")) != NULL) {
      *why = '\0';
      skip(1, "%s, their client: %s: %s", e->label, desc, why + 8);
    } else
      ok(good, "%s, their client: %s", e->label, desc);
  }
  if (!is_int(ch.status, 0, "%s, their client: the run exits 0", e->label) ||
      bad)
    dump_stderr(&ch, "run-torch-modern.sh");
  ok(n >= 40, "%s, their client: %d checks ran", e->label, n);
  free(copy);
  child_free(&ch);
  unsetenv("TORCH_ROOT");
  unsetenv("PYTHON");
}

/* ---- our client, PyTorch's server --------------------------------------- */

static child_t srv;
static int port;
static uv_loop_t loop;
static char ns[64]; /* this run's key prefix */

/* Returns 1 if the server runs, 0 if the build lacks that backend. */
static int start_server(const torch_env_t *e, const char *backend) {
  const char *argv[16];
  char script[600];
  const char *args[] = {script, backend, NULL};
  const char *p;
  int i;
  snprintf(script, sizeof(script), "%s/py/torch_store_server.py",
           script_dir(e));
  python_argv(e, argv, args);
  tap_require(spawn_argv(&srv, argv, 1) == 0, "PyTorch server started");
  for (i = 0; i < 3000 && field(&srv, "pid") == NULL; i++) { /* 60 s */
    if (!child_drain(&srv, 0)) break;
    if (field(&srv, "pid") == NULL) sleep_ms(20);
  }
  if (field(&srv, "unavailable")) {
    child_finish(&srv);
    child_free(&srv);
    return 0;
  }
  p = field(&srv, "port");
  port = p ? atoi(p) : 0;
  if (port <= 0) dump_stderr(&srv, "PyTorch server");
  tap_require(port > 0, "%s: PyTorch's %s server on 127.0.0.1:%d", e->label,
              strcmp(backend, "libuv") ? "poll()" : "libuv", port);
  is_str(field(&srv, "backend"), strcmp(backend, "libuv") ? "poll" : "libuv",
         "%s: the server runs the backend asked for", e->label);
  return 1;
}

static int stop_server(void) {
  int r = stop_by_eof(&srv, 30000);
  child_free(&srv);
  return r;
}

static void open_client(uvccl_store_t *s, int world_size) {
  uvccl_tcp_store_options_t o = {0};
  memset(s, 0, sizeof(*s));
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 20000;
  o.world_size = world_size;
  tap_require(uvccl_tcp_store_init(&loop, s, &o) == 0, "client init");
}

static void close_client(uvccl_store_t *s) { store_close_wait(&loop, s); }

static int run(uvccl_work_t *w) { return uvccl_work_wait(w); }

static void run_for(int ms) { loop_run_for(&loop, ms); }

/* This run's key for name (the server is fresh, but a prefix keeps the
 * descriptions honest about what is ours). */
static const char *k(const char *name) {
  static char buf[4][128];
  static int i;
  i = (i + 1) % 4;
  snprintf(buf[i], sizeof(buf[i]), "%s%s", ns, name);
  return buf[i];
}

static int64_t num_keys(uvccl_store_t *s) {
  uvccl_work_t w = {0};
  uvccl_store_num_keys(s, &w, NULL);
  if (run(&w) != 0) return -1;
  return w.result;
}

/* An operation that server lacks: it drops the connection; we say so,
 * naming the server, and the next call reconnects. */
static void lacking(uvccl_store_t *s, uvccl_work_t *w, const char *what,
                    const char *L, int64_t nkeys) {
  int r = w->state == UVCCL_WORK_IDLE || !uvccl_work_done(w) ? run(w)
                                                               : w->status;
  is_int(r, UVCCL_ECONNLOST, "%s: %s: the server lacks it and hangs up (%s)",
         L, what, uvccl_err_name(r));
  ok(strstr(w->msg, "127.0.0.1") != NULL, "%s: %s: the error names the "
     "server: %s", L, what, w->msg);
  is_int(num_keys(s), nkeys, "%s: after %s the next call reconnects", L,
         what);
}

static void our_client(const torch_env_t *e, const char *backend) {
  uvccl_store_t s, s2;
  uvccl_work_t w = {0}, w2 = {0};
  char L[700];
  int64_t nkeys = 0;
  int libuv = strcmp(backend, "libuv") == 0;
  int has_queues = libuv && (e->major > 2 || e->minor >= 8);

  snprintf(L, sizeof(L), "%s, %s server", e->label,
           libuv ? "libuv" : "poll()");
  if (!start_server(e, backend)) {
    skip(1, "%s: this build has no %s backend", e->label, backend);
    return;
  }
  snprintf(ns, sizeof(ns), "t1022_%d/", (int)getpid());
  open_client(&s, 0);
  open_client(&s2, 0);

  /* set / get */
  uvccl_store_set(&s, &w, k("a"), "va", 2, NULL);
  if (!is_int(run(&w), 0, "%s: set (after VALIDATE and PING)", L))
    fprintf(stderr, "# %s: set: %s\n", L, w.msg);
  uvccl_store_get(&s2, &w2, k("a"), NULL);
  if (!is_int(run(&w2), 0, "%s: get from another client", L))
    fprintf(stderr, "# %s: get: %s\n", L, w2.msg);
  is_mem(w2.value, w2.value_len, "va", "%s: get returns the value", L);
  uvccl_store_set(&s2, &w2, k("a"), "vb", 2, NULL);
  run(&w2);
  uvccl_store_get(&s, &w, k("a"), NULL);
  run(&w);
  is_mem(w.value, w.value_len, "vb", "%s: set overwrites", L);
  uvccl_store_set(&s, &w, k("e"), "", 0, NULL);
  run(&w);
  uvccl_store_get(&s2, &w2, k("e"), NULL);
  is_int(run(&w2), 0, "%s: get of an empty value", L);
  is_int(w2.value_len, 0, "%s: an empty value has length 0", L);
  uvccl_store_set(&s, &w, k("bin"), binary, sizeof(binary), NULL);
  run(&w);
  uvccl_store_get(&s2, &w2, k("bin"), NULL);
  run(&w2);
  ok(w2.value_len == sizeof(binary) &&
         memcmp(w2.value, binary, sizeof(binary)) == 0,
     "%s: a binary value with NULs", L);
  uvccl_store_set(&s, &w, k("big"), big, BIG_LEN, NULL);
  uvccl_store_get(&s2, &w2, k("big"), NULL);
  is_int(run(&w), 0, "%s: 1 MiB set", L);
  is_int(run(&w2), 0, "%s: 1 MiB get", L);
  ok(w2.value_len == BIG_LEN && memcmp(w2.value, big, BIG_LEN) == 0,
     "%s: 1 MiB value: exact bytes", L);
  nkeys += 4;

  /* a get that waits until another client sets the key */
  uvccl_store_get(&s, &w, k("late"), NULL);
  run_for(300);
  ok(!uvccl_work_done(&w), "%s: a get waits while the key is missing", L);
  uvccl_store_set(&s2, &w2, k("late"), "here", 4, NULL);
  run(&w2);
  is_int(run(&w), 0, "%s: the waiting get is released by another's set", L);
  is_mem(w.value, w.value_len, "here", "%s: with the value", L);
  nkeys += 1;

  /* add */
  uvccl_store_add(&s, &w, k("n"), 5, NULL);
  run(&w);
  is_int(w.result, 5, "%s: add on a missing key starts at 0", L);
  uvccl_store_add(&s2, &w, k("n"), -7, NULL);
  run(&w);
  is_int(w.result, -2, "%s: add a negative delta", L);
  uvccl_store_add(&s, &w, k("n"), INT64_C(1) << 40, NULL);
  run(&w);
  is_int(w.result, (INT64_C(1) << 40) - 2, "%s: add a 64-bit delta", L);
  uvccl_store_get(&s, &w, k("n"), NULL);
  run(&w);
  is_mem(w.value, w.value_len, "1099511627774",
         "%s: add stores decimal text", L);
  nkeys += 1;

  /* compare_set, the four rows */
  uvccl_store_compare_set(&s, &w, k("cs"), "", 0, "d1", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "d1",
         "%s: compare_set: missing, empty expected: creates", L);
  uvccl_store_compare_set(&s, &w, k("csm"), "exp", 3, "d2", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "exp",
         "%s: compare_set: missing, non-empty expected: returns expected", L);
  uvccl_store_compare_set(&s, &w, k("cs"), "d1", 2, "d3", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "d3", "%s: compare_set: match swaps", L);
  uvccl_store_compare_set(&s, &w, k("cs"), "zz", 2, "d4", 2, NULL);
  run(&w);
  is_mem(w.value, w.value_len, "d3",
         "%s: compare_set: mismatch returns the current value", L);
  nkeys += 1;

  /* check */
  {
    const char *all[] = {k("a"), k("e")};
    const char *one[] = {k("a"), k("csm")};
    uvccl_store_check(&s, &w, all, 2, NULL);
    run(&w);
    is_int(w.result, 1, "%s: check: all present (an empty value counts)", L);
    uvccl_store_check(&s, &w, one, 2, NULL);
    run(&w);
    is_int(w.result, 0, "%s: check: one missing", L);
  }

  /* delete_key */
  uvccl_store_set(&s, &w, k("del"), "x", 1, NULL);
  run(&w);
  uvccl_store_delete_key(&s, &w, k("del"), NULL);
  run(&w);
  is_int(w.result, 1, "%s: delete_key of an existing key: 1", L);
  uvccl_store_delete_key(&s, &w, k("del"), NULL);
  run(&w);
  is_int(w.result, 0, "%s: delete_key of a missing key: 0", L);

  /* append */
  uvccl_store_append(&s, &w, k("ap"), "x", 1, NULL);
  is_int(run(&w), 0, "%s: append creates the key", L);
  uvccl_store_append(&s2, &w, k("ap"), "y\0z", 3, NULL);
  run(&w);
  uvccl_store_get(&s, &w, k("ap"), NULL);
  run(&w);
  ok(w.value_len == 4 && memcmp(w.value, "xy\0z", 4) == 0,
     "%s: append concatenates", L);
  nkeys += 1;

  /* multi_set / multi_get */
  {
    const char *mk[] = {k("m1"), k("m2"), k("m3")};
    uvccl_buf_t mv[3];
    mv[0].base = "one";
    mv[0].len = 3;
    mv[1].base = "";
    mv[1].len = 0;
    mv[2].base = (char *)binary;
    mv[2].len = sizeof(binary);
    uvccl_store_multi_set(&s, &w, mk, mv, 3, NULL);
    is_int(run(&w), 0, "%s: multi_set", L);
    uvccl_store_multi_get(&s2, &w2, mk, 3, NULL);
    is_int(run(&w2), 0, "%s: multi_get", L);
    ok(w2.nvalues == 3 && w2.values[0].len == 3 &&
           memcmp(w2.values[0].base, "one", 3) == 0 && w2.values[1].len == 0 &&
           w2.values[2].len == sizeof(binary) &&
           memcmp(w2.values[2].base, binary, sizeof(binary)) == 0,
       "%s: multi_get returns every value, in order", L);
    nkeys += 3;
  }

  /* A wait that times out: CANCEL_WAIT keeps the connection in step. */
  {
    const char *never[] = {k("wt")};
    uvccl_store_wait(&s, &w, never, 1, 500, NULL);
    is_int(run(&w), UV_ETIMEDOUT, "%s: a wait on a missing key times out", L);
    uvccl_store_get(&s, &w, k("a"), NULL);
    is_int(run(&w), 0, "%s: the same client, next call", L);
    is_mem(w.value, w.value_len, "vb",
           "%s: gets its own reply (in step after CANCEL_WAIT)", L);
    uvccl_store_set(&s2, &w2, k("wt"), "w", 1, NULL);
    run(&w2);
    uvccl_store_add(&s, &w, k("n"), 0, NULL);
    run(&w);
    is_int(w.result, (INT64_C(1) << 40) - 2,
           "%s: no late answer to the cancelled wait arrives", L);
    uvccl_store_wait(&s, &w, never, 1, 5000, NULL);
    is_int(run(&w), 0, "%s: a wait on a present key returns", L);
    nkeys += 1;
  }

  is_int(num_keys(&s), nkeys, "%s: num_keys exact", L);

  /* queues */
  if (has_queues) {
    uvccl_store_queue_len(&s, &w, k("q"), NULL);
    run(&w);
    is_int(w.result, 0, "%s: queue_len of a missing queue", L);
    uvccl_store_queue_push(&s, &w, k("q"), "i1", 2, NULL);
    run(&w);
    uvccl_store_queue_push(&s2, &w, k("q"), "i2", 2, NULL);
    run(&w);
    uvccl_store_queue_len(&s, &w, k("q"), NULL);
    run(&w);
    is_int(w.result, 2, "%s: queue_len after 2 pushes", L);
    is_int(num_keys(&s), nkeys, "%s: queues are not counted as keys", L);
    uvccl_store_queue_pop(&s, &w, k("q"), 0, NULL);
    run(&w);
    is_mem(w.value, w.value_len, "i1", "%s: queue_pop is FIFO", L);
    uvccl_store_queue_pop(&s, &w, k("q"), 0, NULL);
    run(&w);
    is_mem(w.value, w.value_len, "i2", "%s: ... second item", L);
    uvccl_store_queue_pop(&s, &w, k("q"), 0, NULL);
    is_int(run(&w), UVCCL_EQEMPTY,
           "%s: a non-blocking pop of an empty queue: UVCCL_EQEMPTY", L);
    uvccl_store_queue_pop(&s, &w, k("q"), 1, NULL);
    run_for(300);
    ok(!uvccl_work_done(&w), "%s: a blocking pop waits", L);
    uvccl_store_queue_push(&s2, &w2, k("q"), "i3", 2, NULL);
    run(&w2);
    is_int(run(&w), 0, "%s: and is released by another's push", L);
    is_mem(w.value, w.value_len, "i3", "%s: with the item", L);
  } else {
    uvccl_store_queue_push(&s, &w, k("q"), "i1", 2, NULL);
    lacking(&s, &w, "queue_push", L, nkeys);
  }

  /* list_keys */
  uvccl_store_list_keys(&s, &w, NULL);
  if (run(&w) == 0) {
    size_t i, mine = 0;
    int init_seen = 0;
    for (i = 0; i < w.nvalues; i++) {
      if (strncmp(w.values[i].base, ns, strlen(ns)) == 0) mine++;
      if (strncmp(w.values[i].base, "init/", 5) == 0) init_seen = 1;
    }
    is_int((int64_t)mine, nkeys, "%s: list_keys: every key we set", L);
    ok(!init_seen, "%s: list_keys: without init/", L);
  } else {
    lacking(&s, &w, "list_keys", L, nkeys);
  }

  /* init/: a client with world_size registers as PyTorch's does */
  {
    uvccl_store_t a;
    open_client(&a, 2);
    uvccl_tcp_store_connect(&a, &w, NULL);
    is_int(run(&w), 0, "%s: a client with world_size connects", L);
    is_int(num_keys(&a), nkeys + 1, "%s: and adds init/", L);
    close_client(&a);
  }

  close_client(&s);
  close_client(&s2);
  is_int(stop_server(), 0, "%s: PyTorch's server exits 0", L);
}

int main(void) {
  int i;
  tap_alarm(600);
  find_envs();
  if (nenvs == 0)
    skip_all("no PyTorch 2.x here (tools/torch-root.sh create makes one)");
  make_values();
  tap_require(uv_loop_init(&loop) == 0, "loop");
  for (i = 0; i < nenvs; i++) {
    note("%s", envs[i].label);
    their_client(&envs[i]);
    our_client(&envs[i], "libuv");
    our_client(&envs[i], "legacy");
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  kill_children();
  return done_testing();
}
