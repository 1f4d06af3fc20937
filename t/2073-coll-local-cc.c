/* TCP between ranks of one host takes UVCCL_TCP_LOCAL_CC's congestion
 * control (src/loop/liveness.c, uvccl__tune_local): a pacing one such as
 * bbr, a common system default, arms a timer every few packets on the
 * loopback. 2 ranks over TCP (UVCCL_TRANSPORT=tcp), on 127.0.0.1:
 *
 *   a) UVCCL_TCP_LOCAL_CC=X, X a built-in algorithm other than the
 *      system's default (reno, or cubic where reno is the default): each
 *      rank's connection to the other has X, the store's connections
 *      (not the ranks' mesh) keep the default; an allreduce is exact;
 *   b) UVCCL_TCP_LOCAL_CC=system: no connection has X;
 *   c) UVCCL_TCP_LOCAL_CC=nosuch: the world is made all the same, its
 *      allreduce exact, and each rank warns once, naming the variable.
 *
 * The binary is also the rank program (UVCCL_T_ROLE=localcc, UVCCL_T_CC
 * the algorithm counted). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"

#include <dirent.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXP 2
#include "ranks.h"

static cbres_t cres;

/* This process's connected TCP sockets, and how many have algorithm cc. */
static void count_cc(const char *cc, int *conns, int *with) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  *conns = *with = 0;
  if (d == NULL) return;
  while ((e = readdir(d)) != NULL) {
    struct sockaddr_storage ss;
    socklen_t l = sizeof(ss), cl;
    char name[32];
    int fd;
    if (e->d_name[0] == '.') continue;
    fd = atoi(e->d_name);
    if (getpeername(fd, (struct sockaddr *)&ss, &l) != 0 ||
        ss.ss_family != AF_INET)
      continue;
    cl = sizeof(name) - 1;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &cl) != 0) continue;
    name[cl] = '\0';
    (*conns)++;
    *with += strcmp(name, cc) == 0;
  }
  closedir(d);
}

static int rank_main(void) {
  const char *cc = getenv("UVCCL_T_CC");
  int32_t a[1000], b[1000];
  uvccl_work_t w = {0};
  int conns, with, rc, i, bad = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  R = atoi(getenv("RANK"));
  P = atoi(getenv("WORLD_SIZE"));
  rank_init(20000);
  count_cc(cc, &conns, &with);
  val("conns", conns);
  val("with", with);
  for (i = 0; i < 1000; i++) a[i] = i + 7 * R;
  memset(&cres, 0, sizeof(cres));
  w.data = &cres;
  rc = finish_work(&cres, uvccl_allreduce(&pg, &w, a, b, 1000, UVCCL_INT32,
                                          UVCCL_SUM, on_work),
                   20000);
  for (i = 0; i < 1000; i++) bad += b[i] != 2 * i + 7;
  rep(rc == 0 && bad == 0, "allreduce", "%s %s, %d wrong", ename(rc), w.msg,
      bad);
  return rank_destroy();
}

static void world(proc_t *ps, const char *local_cc, const char *cc) {
  static char e_local[64], e_cc[64];
  snprintf(e_local, sizeof(e_local), "UVCCL_TCP_LOCAL_CC=%s", local_cc);
  snprintf(e_cc, sizeof(e_cc), "UVCCL_T_CC=%s", cc);
  putenv(e_local);
  putenv(e_cc);
  scenario_failed = 0;
  spawn_world(ps, 2, "localcc", 0);
  finish_all(ps, 2, 60);
}

/* Each rank's "with" count, and whether every rank reported. */
static int withs(proc_t *ps, double *with, double *conns) {
  int r, all = 1;
  for (r = 0; r < 2; r++)
    if (!find_val(ps, 2, r, "with", &with[r]) ||
        !find_val(ps, 2, r, "conns", &conns[r]))
      all = 0;
  return all;
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  proc_t a[2], b[2], c[2];
  double wa[2], ca[2], wb[2], cb[2];
  char def[32] = "", cc[32];
  FILE *f;
  int r, got, warned = 1;
  if (role != NULL && strcmp(role, "localcc") == 0) return rank_main();
  f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
  if (f == NULL || fscanf(f, "%31s", def) != 1) {
    if (f != NULL) fclose(f);
    skip_all("no /proc/sys/net/ipv4/tcp_congestion_control");
  }
  fclose(f);
  parent_init(180);
  signal(SIGPIPE, SIG_IGN);
  plan(9);
  setenv("UVCCL_TRANSPORT", "tcp", 1);
  unsetenv("UVCCL_HOST_ID");
  snprintf(cc, sizeof(cc), "%s", strcmp(def, "reno") == 0 ? "cubic" : "reno");

  world(a, cc, cc);
  agg(a, 2, "init", 3, "a: UVCCL_TCP_LOCAL_CC=%s: the world is made", cc);
  got = withs(a, wa, ca);
  /* one connection to the other rank (the mesh; a stripe or a second
   * connection would be more), while the store's keep the default */
  ok(got && wa[0] >= 1 && wa[1] >= 1 && wa[0] < ca[0] && wa[1] < ca[1],
     "a: each rank's connection to the other has %s, the store's keep %s "
     "(rank 0: %g of %g connections, rank 1: %g of %g)", cc, def, wa[0],
     ca[0], wa[1], ca[1]);
  agg(a, 2, "allreduce", 3, "a: allreduce exact");
  if (scenario_failed) dump_procs(a, 2);
  procs_free(a, 2);

  world(b, "system", cc);
  agg(b, 2, "init", 3, "b: UVCCL_TCP_LOCAL_CC=system: the world is made");
  got = withs(b, wb, cb);
  ok(got && wb[0] == 0 && wb[1] == 0 && cb[0] >= 1 && cb[1] >= 1,
     "b: no connection has %s, every one the system's %s (%g and %g "
     "connections)", cc, def, cb[0], cb[1]);
  agg(b, 2, "allreduce", 3, "b: allreduce exact");
  if (scenario_failed) dump_procs(b, 2);
  procs_free(b, 2);

  world(c, "nosuch", cc);
  agg(c, 2, "init", 3, "c: UVCCL_TCP_LOCAL_CC=nosuch: the world is made");
  agg(c, 2, "allreduce", 3, "c: allreduce exact");
  for (r = 0; r < 2; r++) {
    const char *m = "UVCCL_TCP_LOCAL_CC=nosuch: the kernel refused it";
    const char *p = strstr(c[r].ebuf, m);
    if (p == NULL || strstr(p + 1, m) != NULL) warned = 0;
  }
  ok(warned, "c: each rank warns once, naming the variable");
  if (scenario_failed || !warned) dump_procs(c, 2);
  procs_free(c, 2);
  done_testing();
}
