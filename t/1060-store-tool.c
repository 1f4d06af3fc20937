/* The uvccl-store program as a user runs it: `serve` on a free port, every
 * client command from the shell in both dialects with the exact output and
 * exit status, the error a timed-out get prints, a wait released by another
 * process, and the load generator (uvccl-store-bench: closed loop, open
 * loop at a set rate, rendezvous) against that server, its counts checked
 * against the counter
 * it leaves behind; usage errors exit 2; SIGTERM shuts the server down
 * cleanly. Real processes, real sockets, loopback only. */
#define _GNU_SOURCE /* pipe2 */
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "child.h"

#define STORE UVCCL_BUILD_DIR "/bin/uvccl-store"
#define STORE_BENCH UVCCL_BUILD_DIR "/bench/uvccl-store-bench"

static char hostport[64];

/* Runs uvccl-store with args... (NULL-terminated) to the end, or the load
 * generator (bench/store, uvccl-store-bench) when args[0] is "bench"; its
 * output (stdout and stderr together) is left in ch. Returns the exit
 * status. */
static int run(child_t *ch, const char *const *args) {
  const char *argv[32];
  int n = 0;
  if (strcmp(args[0], "bench") == 0) {
    argv[n++] = STORE_BENCH;
    args++;
  } else {
    argv[n++] = STORE;
  }
  while (*args && n < 31) argv[n++] = *args++;
  argv[n] = NULL;
  if (spawn_argv(ch, argv, 0) != 0) return -1;
  return child_finish(ch);
}

/* Runs a client command against the server; returns its exit status and
 * leaves its output in out (truncated to outsz). */
#define CLIENT(out, ...)                                                 \
  client_cmd(out, sizeof(out),                                           \
             (const char *const[]){hostport, __VA_ARGS__, NULL})

static int client_cmd(char *out, size_t outsz, const char *const *args) {
  child_t ch;
  int st = run(&ch, args);
  snprintf(out, outsz, "%s", ch.buf ? ch.buf : "");
  child_free(&ch);
  return st;
}

/* The integer after "\"name\":" in a JSON line, or -1. */
static long long json_int(const char *s, const char *name) {
  char pat[64];
  const char *p;
  snprintf(pat, sizeof(pat), "\"%s\":", name);
  p = s ? strstr(s, pat) : NULL;
  return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

int main(void) {
  child_t srv, ch;
  char out[4096];
  const char *p;
  long long ops, ctr, late;
  int port = 0, st, i;

  tap_alarm(120);
  atexit(kill_children);
  plan(52);

  /* serve: port 0 picks a free port and prints it. */
  tap_require(spawn_argv(&srv, (const char *const[]){STORE, "serve", "--host",
                                                      "127.0.0.1", "--port",
                                                      "0", "--quiet", NULL},
                         0) == 0,
              "serve started");
  for (i = 0; i < 500 && port == 0; i++) {
    child_drain(&srv, 0);
    p = srv.buf ? strstr(srv.buf, "listening on 127.0.0.1:") : NULL;
    if (p && strchr(p, '\n'))
      port = atoi(p + strlen("listening on 127.0.0.1:"));
    else
      sleep_ms(10);
  }
  tap_require(port > 0, "serve prints 'listening on 127.0.0.1:PORT' (%d)",
              port);
  snprintf(hostport, sizeof(hostport), "127.0.0.1:%d", port);

  /* Client commands, modern dialect (the default). */
  is_int(CLIENT(out, "set", "k", "v"), 0, "set exits 0");
  is_str(out, "", "set prints nothing");
  is_int(CLIENT(out, "get", "k"), 0, "get exits 0");
  is_str(out, "v\n", "get prints the value");
  CLIENT(out, "add", "ctr", "5");
  is_str(out, "5\n", "add 5 prints 5");
  CLIENT(out, "add", "ctr", "-2");
  is_str(out, "3\n", "add -2 prints 3");
  is_int(CLIENT(out, "check", "k"), 0, "check of a key that exists exits 0");
  is_str(out, "ready\n", "... and prints ready");
  is_int(CLIENT(out, "check", "nokey"), 1, "check of a missing key exits 1");
  is_str(out, "not ready\n", "... and prints not ready");
  CLIENT(out, "compare-set", "k", "v", "w");
  is_str(out, "w\n", "compare-set with the right expected value swaps");
  CLIENT(out, "compare-set", "k", "x", "y");
  is_str(out, "w\n", "compare-set with a wrong one leaves the value");
  CLIENT(out, "num-keys");
  is_str(out, "2\n", "num-keys counts k and ctr");
  is_int(CLIENT(out, "list"), 0, "list exits 0");
  ok(strstr(out, "k\n") && strstr(out, "ctr\n") && strlen(out) == 6,
     "list prints k and ctr, one per line ('%s')", out);
  CLIENT(out, "queue-push", "q", "a");
  CLIENT(out, "queue-push", "q", "b");
  CLIENT(out, "queue-len", "q");
  is_str(out, "2\n", "queue-len after two pushes");
  CLIENT(out, "queue-pop", "q");
  is_str(out, "a\n", "queue-pop is first in, first out");
  CLIENT(out, "delete", "k");
  is_str(out, "1\n", "delete of a key that exists prints 1");
  CLIENT(out, "delete", "k");
  is_str(out, "0\n", "delete again prints 0");

  /* A get that times out names the key, the server and the timeout. */
  st = CLIENT(out, "--timeout", "200", "get", "missing");
  is_int(st, 1, "get of a key that never comes exits 1");
  ok(strstr(out, "get 'missing'") && strstr(out, hostport) &&
         strstr(out, "timeout"),
     "... saying which key, which server and why: %s", out);

  /* The 1.13 dialect: keys cross between the dialects; it has no list. */
  is_int(CLIENT(out, "--legacy", "set", "lk", "lv"), 0, "legacy set exits 0");
  CLIENT(out, "get", "lk");
  is_str(out, "lv\n", "a modern get sees the legacy set");
  CLIENT(out, "--legacy", "add", "ctr", "1");
  is_str(out, "4\n", "legacy add on the same counter");
  st = CLIENT(out, "--legacy", "list");
  is_int(st, 1, "list in the legacy dialect exits 1");
  ok(strstr(out, "not supported") != NULL, "... not supported: %s", out);

  /* wait is released by a set from another process. */
  {
    const char *wargv[] = {STORE, hostport, "--timeout", "20000", "wait",
                           "w1",  "w2",     NULL};
    tap_require(spawn_argv(&ch, wargv, 0) == 0, "wait started");
    sleep_ms(200);
    child_drain(&ch, 0);
    ok(kill(ch.pid, 0) == 0 && ch.len == 0, "wait w1 w2 is still waiting");
    CLIENT(out, "set", "w1", "1");
    sleep_ms(100);
    ok(kill(ch.pid, 0) == 0, "... after w1 alone");
    CLIENT(out, "set", "w2", "2");
    is_int(child_finish(&ch), 0, "... and returns 0 once w2 is set too");
    child_free(&ch);
  }

  /* bench, closed loop: every ADD it counts reached the counter. */
  for (i = 0; i < 2; i++) {
    const char *dialect = i ? "legacy" : "modern";
    char portbuf[16];
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    st = run(&ch, (const char *const[]){"bench", "--port", portbuf,
                                        "--dialect", dialect, "--op", "add",
                                        "--connections", "8", "--duration",
                                        "0.3", "--warmup", "0.1", "--json",
                                        NULL});
    ops = json_int(ch.buf, "ops");
    is_int(st, 0, "bench %s closed loop exits 0", dialect);
    ok(ops > 0, "... completed %lld ADDs", ops);
    is_int(json_int(ch.buf, "errors"), 0, "... with no errors");
    child_free(&ch);
    CLIENT(out, "add", "bench/ctr/0", "0");
    ctr = strtoll(out, NULL, 10);
    ok(ctr >= ops, "... the counter (%lld) holds at least them", ctr);
    CLIENT(out, "delete", "bench/ctr/0");
  }

  /* bench, open loop: 2,000 ops/s offered for 0.5 s is 1,000 operations
   * due in the window, whatever the machine's speed (a closed loop would
   * do tens of thousands). Those completed in the window may be a few
   * more or fewer, as latency at its two ends differs; a machine busy
   * with other tests may leave more of them late. */
  {
    char portbuf[16];
    snprintf(portbuf, sizeof(portbuf), "%d", port);
    st = run(&ch, (const char *const[]){"bench", "--port", portbuf, "--op",
                                        "get", "--connections", "10",
                                        "--rate", "2000", "--duration", "0.5",
                                        "--warmup", "0.1", "--json", NULL});
    ops = json_int(ch.buf, "ops");
    late = json_int(ch.buf, "late_ops");
    is_int(st, 0, "bench --rate exits 0");
    ok(ops >= 500 && ops <= 1100,
       "... completed %lld GETs, about the 1,000 due", ops);
    ok(late >= 0, "... reports late operations (%lld)", late);
    ok(strstr(ch.buf, "\"offered_per_s\":2000.0") != NULL,
       "... and the offered rate");
    is_int(json_int(ch.buf, "errors"), 0, "... with no errors");
    child_free(&ch);

    st = run(&ch, (const char *const[]){"bench", "--port", portbuf,
                                        "--rendezvous", "16", "--reps", "2",
                                        "--json", NULL});
    is_int(st, 0, "bench --rendezvous 16 exits 0");
    is_int(json_int(ch.buf, "errors"), 0, "... with no errors");
    child_free(&ch);
  }

  /* Usage errors exit 2 and say what is wrong. */
  st = run(&ch, (const char *const[]){"bench", "--rate", "0", NULL});
  is_int(st, 2, "bench --rate 0 exits 2");
  ok(strstr(ch.buf, "invalid --rate '0'") != NULL, "... saying why: %s",
     ch.buf);
  child_free(&ch);
  st = run(&ch, (const char *const[]){"bench", "--rate", "10",
                                      "--rendezvous", "4", NULL});
  is_int(st, 2, "bench --rate with --rendezvous exits 2");
  child_free(&ch);
  st = run(&ch, (const char *const[]){hostport, "frobnicate", NULL});
  is_int(st, 2, "an unknown command exits 2");
  child_free(&ch);

  /* SIGTERM: a graceful shutdown, exit 0. */
  kill(srv.pid, SIGTERM);
  is_int(child_finish(&srv), 0, "serve exits 0 on SIGTERM");
  child_free(&srv);
  return done_testing();
}
