/* A loop embedded in another event loop (uvccl_loop_before_block): two
 * ranks in processes of their own, shared memory between them, each
 * driving its uv loop as asyncio does: poll(2) on uv_backend_fd, then
 * uv_run(UV_RUN_NOWAIT), never uv_run's own blocking iteration.
 *   - with uvccl_loop_before_block called before each poll (and its
 *     timeout used), 300 back-to-back 4 B allreduces are exact and none
 *     was finished by a poll that ran to its timeout (its data came
 *     through the fd: the peer rang the doorbell; a timer of the loop's
 *     own may still expire while one waits, as under load);
 *   - without it (uv_backend_timeout alone, capped at 20 ms), the
 *     pending allreduces are woken by timeouts: the failure it prevents
 *     is real and this test sees it.
 * Rank 1 comes to each allreduce 3 ms late, so rank 0 sleeps for it.
 * Busy polling is off (UVCCL_BUSY_POLL_US=0 is the default where ranks
 * share CPUs; forced off here) so that every wait is a sleep. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#define OPS 300
#define CONTROL_OPS 20

static int free_port(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (struct sockaddr *)&a, sizeof(a));
  getsockname(fd, (struct sockaddr *)&a, &len);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* One blocking step of the host loop: returns 1 if poll timed out. */
static int host_step(uv_loop_t *loop, int arm) {
  struct pollfd p = {.fd = uv_backend_fd(loop), .events = POLLIN};
  int t = arm ? uvccl_loop_before_block(loop) : uv_backend_timeout(loop);
  int rc;
  if (!arm && (t < 0 || t > 20)) t = 20;
  rc = t == 0 ? 1 : poll(&p, 1, t);
  uv_run(loop, UV_RUN_NOWAIT);
  return rc == 0 && t > 0;
}

/* Runs n allreduces of one int64 (rank + 1 + i) one after another;
 * returns how many were finished by the turn after a poll that timed out
 * (their data had come unannounced), or -1 for a wrong value or a
 * failure. */
static int chain(uv_loop_t *loop, uvccl_pg_t *pg, int n, int arm) {
  int i, timeouts = 0;
  for (i = 0; i < n; i++) {
    uvccl_work_t w;
    int64_t v = pg->rank + 1 + i;
    memset(&w, 0, sizeof(w));
    /* rank 1 comes late (busy elsewhere, its loop not running), so that
     * rank 0 has to sleep waiting for its part */
    if (pg->rank == 1) usleep(3000);
    if (uvccl_allreduce(pg, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, NULL) < 0)
      return -1;
    while (!uvccl_work_done(&w))
      if (host_step(loop, arm) && uvccl_work_done(&w)) timeouts++;
    if (w.status != 0 || v != 3 + 2 * i) {
      fprintf(stderr, "allreduce %d: status %d value %lld\n", i, w.status,
              (long long)v);
      return -1;
    }
  }
  return timeouts;
}

static void rank_main(int rank, int port, int out) {
  uv_loop_t loop;
  uvccl_pg_t pg;
  uvccl_work_t w;
  uvccl_pg_options_t o;
  char url[64], line[128];
  int armed, control;
  memset(&o, 0, sizeof(o));
  memset(&w, 0, sizeof(w));
  o.rank = rank;
  o.size = 2;
  o.busy_poll_us = UINT32_MAX;
  uv_loop_init(&loop);
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
  if (uvccl_pg_init_url(&loop, &pg, url, &o, &w, NULL) < 0) _exit(2);
  while (!uvccl_work_done(&w)) host_step(&loop, 1);
  if (w.status != 0) {
    fprintf(stderr, "rank %d init: %s\n", rank, w.msg);
    _exit(3);
  }
  armed = chain(&loop, &pg, OPS, 1);
  control = chain(&loop, &pg, CONTROL_OPS, 0);
  snprintf(line, sizeof(line), "%d %s %d %d\n", rank,
           uvccl_pg_peer_transport(&pg, 1 - rank), armed, control);
  if (write(out, line, strlen(line)) < 0) _exit(4);
  uvccl_pg_destroy(&pg, NULL);
  while (uv_run(&loop, UV_RUN_NOWAIT) != 0) host_step(&loop, 1);
  _exit(0);
}

int main(void) {
  int fds[2], port = free_port(), r, st;
  pid_t pid[2];
  char buf[512];
  ssize_t got = 0, k;
  tap_alarm(120);
  if (pipe(fds) < 0) skip_all("pipe");
  for (r = 0; r < 2; r++) {
    pid[r] = fork();
    if (pid[r] == 0) {
      close(fds[0]);
      rank_main(r, port, fds[1]);
    }
  }
  close(fds[1]);
  while ((k = read(fds[0], buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
    got += k;
  buf[got] = '\0';
  for (r = 0; r < 2; r++) {
    waitpid(pid[r], &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d exited 0 (%d)", r, st);
  }
  for (r = 0; r < 2; r++) {
    char key[16], transport[16];
    int armed = -2, control = -2, rr;
    const char *p = buf;
    snprintf(key, sizeof(key), "%d ", r);
    while (p != NULL && strncmp(p, key, strlen(key)) != 0) {
      p = strchr(p, '\n');
      if (p != NULL) p++;
    }
    if (p == NULL || sscanf(p, "%d %15s %d %d", &rr, transport, &armed,
                            &control) != 4) {
      ok(0, "rank %d reported", r);
      continue;
    }
    is_str(transport, "shm", "rank %d: the peer is on shared memory", r);
    ok(armed == 0, "rank %d: %d exact allreduces, embedded, with "
       "uvccl_loop_before_block: none finished by a poll's timeout (%d "
       "were)", r, OPS, armed);
    if (r == 0)
      ok(control > 0, "rank 0: without it, %d of %d allreduces waited for "
         "a timeout (the doorbell was not armed)", control, CONTROL_OPS);
  }
  return done_testing();
}
