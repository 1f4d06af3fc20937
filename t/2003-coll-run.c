/* uvccl-run, the torchrun --standalone of uvccl: the environment each rank
 * gets, prefixed whole lines on stdout and stderr, a failing rank stopping
 * the others quickly (or not, with --keep-going; --kill), signals
 * forwarded, SIGKILL after the grace period, the store served by
 * uvccl-run itself (--host-store) outliving rank 0, dead ranks started
 * again (--respawn),
 * and no process left behind (this test is a child subreaper, so anything
 * uvccl-run orphans would become its child and be seen). */
#define _GNU_SOURCE
#include "tap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#ifndef UVCCL_BUILD_DIR
#define UVCCL_BUILD_DIR "build"
#endif

static char tool[4096];
static char bench[4096], store_tool[4096], portbuf[16];

typedef struct {
  char *out, *err;
  size_t olen, elen;
  int status; /* exit code, or 128 + signal */
  double secs;
} result_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void append(char **b, size_t *len, const char *p, size_t n) {
  *b = realloc(*b, *len + n + 1);
  memcpy(*b + *len, p, n);
  *len += n;
  (*b)[*len] = '\0';
}

/* Starts uvccl-run with args; stdout and stderr on pipes. If
 * signal_after_ready: once stdout has that many lines, send that signal
 * (ready_lines, sig). */
static void run_ex(result_t *res, const char *const *args, int ready_lines,
                   int sig) {
  int op[2], ep[2], st = 0, lines = 0, sent = 0;
  const char *argv[32];
  int n = 0;
  pid_t p;
  double t0 = now_s();

  memset(res, 0, sizeof(*res));
  res->out = calloc(1, 1);
  res->err = calloc(1, 1);
  argv[n++] = tool;
  while (*args && n < 31) argv[n++] = *args++;
  argv[n] = NULL;
  if (pipe2(op, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
    res->status = -1;
    return;
  }
  fflush(stdout);
  p = fork();
  if (p == 0) {
    int dn = open("/dev/null", O_RDONLY);
    dup2(dn, 0);
    dup2(op[1], 1);
    dup2(ep[1], 2);
    execv(tool, (char *const *)argv);
    _exit(127);
  }
  close(op[1]);
  close(ep[1]);
  {
    struct pollfd pf[2] = {{op[0], POLLIN, 0}, {ep[0], POLLIN, 0}};
    int open_n = 2;
    while (open_n > 0) {
      char b[65536];
      int k;
      if (poll(pf, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (k = 0; k < 2; k++) {
        ssize_t r;
        if (pf[k].fd < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
          continue;
        r = read(pf[k].fd, b, sizeof(b));
        if (r <= 0) {
          close(pf[k].fd);
          pf[k].fd = -1;
          open_n--;
          continue;
        }
        if (k == 0) {
          ssize_t i;
          for (i = 0; i < r; i++) lines += b[i] == '\n';
          append(&res->out, &res->olen, b, (size_t)r);
        } else {
          append(&res->err, &res->elen, b, (size_t)r);
        }
      }
      if (sig && !sent && lines >= ready_lines) {
        usleep(300000); /* let the ranks get past their echo */
        kill(p, sig);
        sent = 1;
      }
    }
  }
  while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
  }
  res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  res->secs = now_s() - t0;
}

static void run(result_t *res, const char *const *args) {
  run_ex(res, args, 0, 0);
}

static void res_free(result_t *res) {
  free(res->out);
  free(res->err);
}

static void show(const result_t *res) {
  note("exit %d after %.2f s; stdout:\n%s\n# stderr:\n%s", res->status,
       res->secs, res->out, res->err);
}

static int has_line(const char *buf, const char *line) {
  size_t n = strlen(line);
  const char *p = buf;
  while ((p = strstr(p, line)) != NULL) {
    if ((p == buf || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
      return 1;
    p += n;
  }
  return 0;
}

static int count_lines(const char *buf) {
  int n = 0;
  for (; *buf; buf++) n += *buf == '\n';
  return n;
}

/* Kills our children (the orphans we adopted), found through /proc. */
static void kill_children(void) {
  DIR *d = opendir("/proc");
  struct dirent *de;
  if (d == NULL) return;
  while ((de = readdir(d)) != NULL) {
    char path[300], buf[512], *rp;
    FILE *f;
    int ppid = -1;
    if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
    snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
    if ((f = fopen(path, "r")) == NULL) continue;
    if (fgets(buf, sizeof(buf), f) && (rp = strrchr(buf, ')')) != NULL &&
        sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == (int)getpid()) {
      note("left behind: pid %s %.*s", de->d_name,
           (int)(rp - strchr(buf, '(')), strchr(buf, '('));
      kill(atoi(de->d_name), SIGKILL);
    }
    fclose(f);
  }
  closedir(d);
}

/* Every orphan uvccl-run left would be our child now (subreaper): reap
 * what is dead; 1 if nothing is left within 3 s, else kill what is. */
static int no_leftovers(void) {
  double t0 = now_s();
  int st;
  for (;;) {
    pid_t r = waitpid(-1, &st, WNOHANG);
    if (r > 0) continue;
    if (r < 0 && errno == ECHILD) return 1;
    if (now_s() - t0 > 3) break;
    usleep(20000);
  }
  kill_children();
  while (waitpid(-1, &st, 0) > 0) {
  }
  return 0;
}

static void test_env(void) {
  result_t r;
  const char *args[] = {
      "-n", "3", "/bin/sh", "-c",
      "echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK p=$MASTER_PORT "
      "a=$MASTER_ADDR\"; echo \"lw=$LOCAL_WORLD_SIZE\"",
      NULL};
  int i, port = -1, same = 1;
  run(&r, args);
  if (!is_int(r.status, 0, "-n 3: exit 0")) show(&r);
  for (i = 0; i < 3; i++) {
    char want[128], *p;
    int got_port = -1;
    snprintf(want, sizeof(want), "[%d] r=%d w=3 l=%d p=", i, i, i);
    p = strstr(r.out, want);
    ok(p && (p == r.out || p[-1] == '\n'), "rank %d: prefixed line with "
       "RANK, WORLD_SIZE, LOCAL_RANK", i);
    if (p && sscanf(p + strlen(want), "%d a=127.0.0.1\n", &got_port) == 1) {
      if (port < 0) port = got_port;
      if (port != got_port) same = 0;
    }
    snprintf(want, sizeof(want), "[%d] lw=3", i);
    ok(has_line(r.out, want), "rank %d: LOCAL_WORLD_SIZE", i);
  }
  ok(port > 0 && port < 65536 && same, "one MASTER_PORT for all (%d)", port);
  ok(strstr(r.out, "a=127.0.0.1\n") != NULL, "MASTER_ADDR=127.0.0.1");
  is_int(count_lines(r.out), 6, "6 lines on stdout");
  is_int((int)r.elen, 0, "nothing on stderr");
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
}

static void test_streams(void) {
  result_t r;
  const char *a1[] = {"-n", "2", "--master-port", "23456", "--", "/bin/sh",
                      "-c",
                      "echo out$RANK; echo err$RANK >&2; "
                      "echo \"p=$MASTER_PORT\"; printf 'tail%s' $RANK; "
                      "printf 'etail' >&2",
                      NULL};
  const char *a2[] = {"/bin/echo", "-n", "hi", NULL};
  const char *a3[] = {"-n", "1", "--no-prefix", "/bin/sh", "-c",
                      "echo plain; echo perr >&2", NULL};
  run(&r, a1);
  if (!is_int(r.status, 0, "two ranks: exit 0")) show(&r);
  ok(has_line(r.out, "[0] out0") && has_line(r.out, "[1] out1"),
     "stdout lines prefixed, on stdout");
  ok(has_line(r.err, "[0] err0") && has_line(r.err, "[1] err1"),
     "stderr lines prefixed, on stderr");
  ok(!strstr(r.out, "err") && !strstr(r.err, "out"), "streams not mixed");
  ok(has_line(r.out, "[0] p=23456") && has_line(r.out, "[1] p=23456"),
     "--master-port sets MASTER_PORT");
  ok(has_line(r.out, "[0] tail0") && has_line(r.out, "[1] tail1"),
     "partial last stdout line flushed with a newline");
  ok(has_line(r.err, "[0] etail") && has_line(r.err, "[1] etail"),
     "partial last stderr line flushed");
  res_free(&r);

  run(&r, a2);
  ok(r.status == 0 && strcmp(r.out, "[0] hi\n") == 0,
     "default -n 1; PROGRAM's options are its own");
  res_free(&r);

  run(&r, a3);
  ok(r.status == 0 && strcmp(r.out, "plain\n") == 0 &&
         strcmp(r.err, "perr\n") == 0,
     "--no-prefix: output as is");
  res_free(&r);
  ok(no_leftovers(), "nothing left behind");
}

/* Many ranks printing many lines at once: every line arrives whole, with
 * its own rank's prefix, in order per rank. */
static void test_no_interleave(void) {
  result_t r;
  const char *args[] = {
      "-n", "4", "/bin/sh", "-c",
      "i=0; while [ $i -lt 1500 ]; do "
      "echo \"$RANK:$i:xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
      "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; "
      "i=$((i+1)); done",
      NULL};
  int next[4] = {0, 0, 0, 0}, bad = 0;
  char *p, *save = NULL;
  run(&r, args);
  is_int(r.status, 0, "4 ranks x 1500 lines: exit 0");
  for (p = strtok_r(r.out, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
    int pr = -1, rk = -1, i = -1, n = 0;
    if (sscanf(p, "[%d] %d:%d:%n", &pr, &rk, &i, &n) != 3 || pr != rk ||
        rk < 0 || rk > 3 || i != next[rk] || strlen(p + n) != 117 ||
        strspn(p + n, "x") != 117) {
      if (bad++ < 3) note("bad line: '%.80s'", p);
      continue;
    }
    next[rk]++;
  }
  ok(bad == 0 && next[0] == 1500 && next[1] == 1500 && next[2] == 1500 &&
         next[3] == 1500,
     "every line whole and in order (%d bad; %d %d %d %d)", bad, next[0],
     next[1], next[2], next[3]);
  res_free(&r);
}

static void test_failure(void) {
  result_t r;
  const char *args[] = {
      "-n", "3", "/bin/sh", "-c",
      "sleep 30 & echo \"bg=$!\"; "
      "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 30",
      NULL};
  const char *a2[] = {"-n", "2", "/bin/sh", "-c",
                      "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 30",
                      NULL};
  run(&r, args);
  ok(r.status != 0, "a failing rank: non-zero exit (%d)", r.status);
  is_int(r.status, 3, "exit status is the failing rank's");
  ok(r.secs < 10, "quickly: %.2f s (the others would sleep 30 s)", r.secs);
  ok(strstr(r.err, "uvccl-run: rank 1 exited with status 3") != NULL,
     "stderr names the rank and status");
  if (r.status != 3) show(&r);
  ok(no_leftovers(), "nothing left behind (background sleeps included)");
  res_free(&r);

  run(&r, a2);
  ok(r.status == 137 && r.secs < 10 &&
         strstr(r.err, "rank 1 exited with status 137 (signal 9") != NULL,
     "a rank killed by a signal: named with the signal (%d, %.2f s)",
     r.status, r.secs);
  if (r.status != 137) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
}

/* --keep-going: a failing rank leaves the others running; --kill R@S
 * kills a rank on purpose, which does not count as a failure. */
static void test_keep_going(void) {
  result_t r;
  const char *kg[] = {"--keep-going", "-n", "3", "/bin/sh", "-c",
                      "if [ $RANK = 1 ]; then exit 3; fi; sleep 0.5; "
                      "echo done $RANK", NULL};
  const char *kl[] = {"-n", "3", "--kill", "1@0.3", "/bin/sh", "-c",
                      "echo ready; sleep 1; echo done $RANK", NULL};
  run(&r, kg);
  ok(r.status == 3 && has_line(r.out, "[0] done 0") &&
         has_line(r.out, "[2] done 2") &&
         strstr(r.err, "rank 1 exited with status 3") != NULL &&
         strstr(r.err, "stopping") == NULL,
     "--keep-going: rank 1 fails, ranks 0 and 2 finish; exit status 3 (%d)",
     r.status);
  if (r.status != 3) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
  run(&r, kl);
  ok(r.status == 0 && has_line(r.out, "[0] done 0") &&
         has_line(r.out, "[2] done 2") && !has_line(r.out, "[1] done 1") &&
         strstr(r.err, "killing rank 1 (--kill)") != NULL &&
         strstr(r.err, "rank 1 killed (--kill), as asked") != NULL,
     "--kill 1@0.3: rank 1 killed, the others finish, exit status 0 (%d)",
     r.status);
  if (r.status != 0) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
}

/* --host-store: the store is uvccl-run's, so it outlives rank 0. Rank 0
 * writes a key and is killed; the others read it after its death, and a
 * client without the job secret is refused. Then a uvccl world forms
 * through it (its ranks host none), and a taken --master-port is a clear
 * error. */
static void test_host_store(void) {
  static const char script[] =
      "A=127.0.0.1:$MASTER_PORT; echo agent=$TORCHELASTIC_USE_AGENT_STORE; "
      "\"$T_STORE\" $A set key$RANK v$RANK >/dev/null || exit 3; "
      "if [ $RANK = 0 ]; then sleep 30; fi; sleep 3; "
      "echo key0=$(\"$T_STORE\" $A get key0); "
      "if env -u UVCCL_AUTH_TOKEN \"$T_STORE\" $A --timeout 3000 get key0 "
      ">/dev/null 2>&1; then echo stranger read it; "
      "else echo stranger refused; fi";
  const char *hs[] = {"--host-store", "-n", "3", "--kill", "0@1",
                      "/bin/sh", "-c", script, NULL};
  const char *world[] = {"--host-store", "-n", "3", bench, "--op",
                         "allreduce", "-b", "4", "-e", "4096", NULL};
  const char *taken[] = {"--host-store", "--master-port", portbuf, "-n",
                         "2", "/bin/sh", "-c", "echo ran", NULL};
  result_t r;
  int i, fd;
  struct sockaddr_in a;
  socklen_t alen = sizeof(a);
  setenv("T_STORE", store_tool, 1);
  run(&r, hs);
  ok(r.status == 0 && strstr(r.err, "rank 0 killed (--kill)") != NULL,
     "--host-store: rank 0 killed, exit status 0 (%d)", r.status);
  for (i = 1; i < 3; i++) {
    char want[64];
    snprintf(want, sizeof(want), "[%d] key0=v0", i);
    ok(has_line(r.out, want), "rank %d reads rank 0's key after its death",
       i);
    snprintf(want, sizeof(want), "[%d] stranger refused", i);
    ok(has_line(r.out, want), "rank %d: a client without the secret is "
       "refused", i);
  }
  ok(has_line(r.out, "[1] agent=True"), "ranks are told to use the agent's "
     "store (TORCHELASTIC_USE_AGENT_STORE=True)");
  if (r.status != 0 || !has_line(r.out, "[1] key0=v0")) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);

  run(&r, world);
  ok(r.status == 0 && strstr(r.out, "[0] allreduce ") != NULL &&
         strstr(r.out, " no\n") == NULL,
     "--host-store: a uvccl world of 3 forms through it and checks its "
     "results (exit %d)", r.status);
  if (r.status != 0) show(&r);
  res_free(&r);

  /* a port someone holds */
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      listen(fd, 1) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &alen) == 0) {
    snprintf(portbuf, sizeof(portbuf), "%d", ntohs(a.sin_port));
    run(&r, taken);
    ok(r.status == 1 && strstr(r.err, "cannot serve the store") != NULL &&
           strstr(r.out, "ran") == NULL,
       "--host-store on a taken port: exit 1, no rank started (%d)",
       r.status);
    if (r.status != 1) show(&r);
    res_free(&r);
  } else {
    ok(0, "cannot hold a port for the test");
  }
  if (fd >= 0) close(fd);
}

/* --respawn: a rank that dies is started again, told that it joins; one
 * that keeps failing is given up after N restarts. */
static void test_respawn(void) {
  const char *once[] = {"-n", "3", "--respawn=2", "--kill", "1@0.5",
                        "/bin/sh", "-c",
                        "echo start $RANK join=$UVCCL_JOIN "
                        "count=$UVCCL_RESPAWN_COUNT "
                        "te=$TORCHELASTIC_RESTART_COUNT "
                        "agent=$TORCHELASTIC_USE_AGENT_STORE; sleep 1.5; "
                        "echo done $RANK", NULL};
  const char *always[] = {"-n", "2", "--respawn=2", "/bin/sh", "-c",
                          "echo start $RANK count=$UVCCL_RESPAWN_COUNT; "
                          "if [ $RANK = 1 ]; then exit 3; fi; sleep 0.5",
                          NULL};
  result_t r;
  run(&r, once);
  ok(r.status == 0 && has_line(r.out, "[1] start 1 join= count= te= "
                                      "agent=True") &&
         has_line(r.out, "[1] start 1 join=1 count=1 te=1 agent=True") &&
         has_line(r.out, "[1] done 1") && has_line(r.out, "[0] done 0") &&
         strstr(r.err, "rank 1 died (signal 9: Killed): respawning it (1 of "
                       "2)") != NULL,
     "--respawn=2: rank 1 killed, started again with UVCCL_JOIN=1 and its "
     "count, finishes; exit status 0 (%d)", r.status);
  if (r.status != 0 || !has_line(r.out, "[1] done 1")) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
  run(&r, always);
  ok(r.status == 3 && has_line(r.out, "[1] start 1 count=2") &&
         !has_line(r.out, "[1] start 1 count=3") &&
         strstr(r.err, "respawning it (2 of 2)") != NULL &&
         strstr(r.err, "rank 1 exited with status 3\n") != NULL,
     "--respawn=2: a rank that always fails runs 3 times, then its status "
     "is the run's (%d)", r.status);
  if (r.status != 3) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
}

static void test_signals(void) {
  result_t r;
  const char *a1[] = {"-n", "2", "/bin/sh", "-c",
                      "echo ready; sleep 30; echo not-reached", NULL};
  const char *a3[] = {"-n", "2", "/bin/sh", "-c", "echo ready; exec sleep 30",
                      NULL};
  /* Rank 1 fails only once rank 0 ignores SIGTERM: on a busy machine
   * rank 0's shell may not have reached its trap yet when rank 1 exits. */
  char flag[64], script[256];
  const char *a2[] = {"-n", "2", "/bin/sh", "-c", script, NULL};
  snprintf(flag, sizeof(flag), "/tmp/uvccl-t2003-%ld.ready", (long)getpid());
  snprintf(script, sizeof(script),
           "if [ $RANK = 1 ]; then while [ ! -e %s ]; do sleep 0.01; done; "
           "echo ready; exit 1; fi; trap '' TERM; echo ready; : > %s; "
           "sleep 30",
           flag, flag);
  unlink(flag);
  run_ex(&r, a1, 2, SIGTERM);
  ok(r.status == 128 + SIGTERM && !strstr(r.err, "SIGKILL") &&
         !strstr(r.out, "not-reached"),
     "SIGTERM to uvccl-run is forwarded: exit %d after %.2f s", r.status,
     r.secs);
  ok(strstr(r.err, "forwarding") != NULL, "and it says so");
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);

  /* exec: a shell that catches SIGINT itself (dash -c does) is not what
   * is tested here. */
  run_ex(&r, a3, 2, SIGINT);
  ok(r.status == 128 + SIGINT && !strstr(r.err, "SIGKILL"),
     "SIGINT forwarded: exit %d after %.2f s", r.status, r.secs);
  if (r.status != 128 + SIGINT || strstr(r.err, "SIGKILL")) show(&r);
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);

  /* A rank that ignores SIGTERM gets SIGKILL 5 s later. */
  run(&r, a2);
  ok(r.status == 1 && r.secs > 4 && r.secs < 12,
     "SIGTERM ignored: SIGKILL after the grace period (exit %d after "
     "%.2f s)", r.status, r.secs);
  ok(strstr(r.err, "SIGKILL") != NULL, "and it says so");
  ok(no_leftovers(), "nothing left behind");
  res_free(&r);
  unlink(flag);
}

static void test_usage(void) {
  result_t r;
  const char *h[] = {"-h", NULL};
  const char *none[] = {NULL};
  const char *bad_n[] = {"-n", "0", "true", NULL};
  const char *bad_n2[] = {"-n", "3x", "true", NULL};
  const char *bad_opt[] = {"--frobnicate", "true", NULL};
  const char *missing[] = {"-n", "2", "/nonexistent/prog", NULL};
  const char *missing2[] = {"uvccl-no-such-command", NULL};
  const char *kill_out[] = {"-n", "2", "--kill", "2@1", "true", NULL};
  const char *kill_bad[] = {"--kill", "1", "true", NULL};
  const char *kill_bad2[] = {"--kill=1@soon", "true", NULL};

  run(&r, h);
  ok(r.status == 0 && strstr(r.out, "usage: uvccl-run") &&
         strstr(r.out, "--master-port"),
     "-h prints the usage");
  res_free(&r);
  run(&r, none);
  ok(r.status == 2 && strstr(r.err, "no PROGRAM"), "no PROGRAM: exit 2");
  res_free(&r);
  run(&r, bad_n);
  ok(r.status == 2 && strstr(r.err, "-n"), "-n 0: exit 2");
  res_free(&r);
  run(&r, bad_n2);
  ok(r.status == 2, "-n 3x: exit 2");
  res_free(&r);
  run(&r, bad_opt);
  ok(r.status == 2 && strstr(r.err, "--frobnicate"), "unknown option: exit 2");
  res_free(&r);
  run(&r, missing);
  ok(r.status == 127 && strstr(r.err, "/nonexistent/prog"),
     "missing program: exit 127");
  res_free(&r);
  run(&r, kill_out);
  ok(r.status == 2 && strstr(r.err, "rank 2 is outside a world of 2"),
     "--kill of a rank outside the world: exit 2");
  res_free(&r);
  run(&r, kill_bad);
  ok(r.status == 2 && strstr(r.err, "RANK@SECONDS"), "--kill 1: exit 2");
  res_free(&r);
  run(&r, kill_bad2);
  ok(r.status == 2 && strstr(r.err, "seconds"), "--kill=1@soon: exit 2");
  res_free(&r);
  run(&r, missing2);
  ok(r.status == 127 && strstr(r.err, "command not found"),
     "command not in PATH: exit 127");
  res_free(&r);
}

int main(void) {
  const char *bd = getenv("UVCCL_BUILD_DIR");
  tap_alarm(120);
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run",
           bd && *bd ? bd : UVCCL_BUILD_DIR);
  if (access(tool, X_OK) != 0) skip_all("%s not built", tool);
  snprintf(bench, sizeof(bench), "%s/bin/uvccl-bench",
           bd && *bd ? bd : UVCCL_BUILD_DIR);
  snprintf(store_tool, sizeof(store_tool), "%s/bin/uvccl-store",
           bd && *bd ? bd : UVCCL_BUILD_DIR);
  if (access("/bin/sh", X_OK) != 0) skip_all("no /bin/sh");
  /* Orphans of uvccl-run become our children: no_leftovers() sees them. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  signal(SIGPIPE, SIG_IGN);

  test_env();
  test_streams();
  test_no_interleave();
  test_failure();
  test_keep_going();
  test_host_store();
  test_respawn();
  test_signals();
  test_usage();
  return done_testing();
}
