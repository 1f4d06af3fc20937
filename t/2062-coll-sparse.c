/* Sparse worlds: a bootstrap that scales (src/cpu/pg.c's O(log N) store
 * traffic, net.c's lazy connections, live.c's overlay of monitor links).
 *   a) a world of 256 processes on this host (96 under the sanitizers),
 *      created from env:// through uvccl-run: allreduce int64 SUM, a
 *      broadcast from the last rank, an allgather of every rank's id and a
 *      barrier are exact on every rank; no rank but 0 (which serves the
 *      store: a connection per rank, as any TCPStore) holds W sockets, they
 *      hold at most W / 3 on average (a full mesh needs 2 x (W - 1) data
 *      and monitor sockets plus the listeners in every rank), and every
 *      rank exits 0 with nothing on its stderr;
 *   c) a sparse world of 6 whose store is PyTorch 1.13's own TCPStore
 *      server (t/py/torch_store_server.py; no MULTI_GET there: a GET per
 *      neighbour), as under torchrun's agent: the same checks (skipped
 *      without Debian's python3-torch);
 *   d) a sparse world of 4 of which only ranks 0-2 start: creation fails
 *      on each after its 3 s timeout, saying that not every neighbour
 *      published its address and naming rank 3 among them;
 *   b) uvccl__overlay_neighbours' shape, in this process: symmetric, no
 *      self, at most 2 log2 N links, and the overlay connected (its
 *      diameter is at most log2 N + 1) for every N up to 1100.
 * The test binary is also the rank program (UVCCL_T_ROLE), as in t/2060.
 * (Every collective at 2, 3, 5 and 8 sparse ranks: t/2060 f; a rank
 * killed in a sparse world of 8: t/2051 c.) */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#ifndef UVCCL_BUILD_DIR
#define UVCCL_BUILD_DIR "build"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define WORLD 96
#else
#define WORLD 256
#endif
/* a full mesh: 2 x (WORLD - 1) data and monitor sockets, plus listeners */
#define MAX_SOCKETS (WORLD - 1)
#define MEAN_SOCKETS (WORLD / 3)

int uvccl__overlay_neighbours(int rank, int size, int *out, int max);

/* ---- rank side ------------------------------------------------------------ */

static int count_sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  char path[300], link[64];
  int n = 0;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) {
    ssize_t l;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    l = readlink(path, link, sizeof(link) - 1);
    if (l <= 0) continue;
    link[l] = '\0';
    if (strncmp(link, "socket:", 7) == 0) n++;
  }
  closedir(d);
  return n;
}

static int role_world(void) {
  int rc, i, nb = 0;
  rank_init(120000);
  {
    int64_t v = R + 1;
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 60000);
    rep(rc == 0 && v == (int64_t)P * (P + 1) / 2, "allreduce",
        "%s %s: %lld", ename(rc), w.msg, (long long)v);
  }
  {
    int32_t b[1000];
    uvccl_work_t w = {0};
    cbres_t c = {0};
    for (i = 0; i < 1000; i++) b[i] = R == P - 1 ? i * 7 + 1 : -1;
    w.data = &c;
    rc = uvccl_broadcast(&pg, &w, b, 1000, UVCCL_INT32, P - 1, on_work);
    rc = finish_work(&c, rc, 60000);
    for (i = 0; i < 1000 && rc == 0; i++)
      if (b[i] != i * 7 + 1) nb++;
    rep(rc == 0 && nb == 0, "broadcast", "%s %s: %d wrong", ename(rc), w.msg,
        nb);
  }
  {
    int32_t mine = R * 3, *all = calloc((size_t)P, sizeof(int32_t));
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = uvccl_allgather(&pg, &w, &mine, all, 1, UVCCL_INT32, on_work);
    rc = finish_work(&c, rc, 60000);
    nb = 0;
    for (i = 0; i < P && rc == 0; i++)
      if (all[i] != i * 3) nb++;
    rep(rc == 0 && nb == 0, "allgather", "%s %s: %d wrong", ename(rc), w.msg,
        nb);
    free(all);
  }
  {
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = uvccl_barrier(&pg, &w, on_work);
    rc = finish_work(&c, rc, 60000);
    rep(rc == 0, "barrier", "%s %s", ename(rc), w.msg);
  }
  val("sockets", count_sockets());
  return rank_destroy();
}

/* d) creation that cannot complete */
static int role_short(void) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  double t0 = now_s();
  int rc;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = 3000;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  w.data = &c;
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, on_work);
  rc = finish_work(&c, rc, 20000);
  rep(rc == UV_ETIMEDOUT && strstr(w.msg, "not every neighbour published") &&
          strstr(w.msg, "3") && now_s() - t0 < 10,
      "short", "%s after %.1f s: %s", ename(rc), now_s() - t0, w.msg);
  /* Rank 0 serves the store: its destroy keeps the server up until the
   * others' clients are gone, so they time out alike (run the loop) */
  if (pg.impl_ != NULL) {
    uvccl_pg_destroy(&pg, on_pg_closed);
    run_until(&pg_closed, 15000);
  }
  return 0;
}

/* ---- parent side -------------------------------------------------------------- */

static void scenario_world(void) {
  proc_t p;
  char tool[4096], nstr[8];
  char *argv[] = {tool, "-n", nstr, "--", self, NULL};
  const char *env[] = {"UVCCL_T_ROLE=world", NULL};
  static const char *checks[] = {"init", "allreduce", "broadcast",
                                 "allgather", "barrier", "destroy"};
  double t0 = now_s(), v, most = 0, sum = 0;
  int r, k, bad[6] = {0}, nosock = 0, most_r = -1;
  char det[512];
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(nstr, sizeof(nstr), "%d", WORLD);
  unsetenv("UVCCL_MESH_MAX");
  unsetenv("UVCCL_TRANSPORT");
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "a: uvccl-run starts");
    return;
  }
  finish_all(&p, 1, 240);
  note("a: W=%d in %.2f s", WORLD, now_s() - t0);
  for (r = 0; r < WORLD; r++) {
    for (k = 0; k < 6; k++) {
      int okv;
      find_check(&p, 1, r, checks[k], &okv, det, sizeof(det));
      if (okv != 1 && bad[k]++ == 0)
        diag("rank %d %s: %s", r, checks[k], okv < 0 ? "(no report)" : det);
    }
    if (!find_val(&p, 1, r, "sockets", &v)) {
      nosock++;
    } else if (r > 0) { /* rank 0 serves the store: a socket per rank */
      sum += v;
      if (v > most) {
        most = v;
        most_r = r;
      }
    }
  }
  for (k = 0; k < 6; k++)
    is_int(bad[k], 0, "a: W=%d: %s right on every rank", WORLD, checks[k]);
  v = sum / (WORLD - 1 - nosock > 0 ? WORLD - 1 - nosock : 1);
  ok(nosock == 0 && most <= MAX_SOCKETS && v <= MEAN_SOCKETS,
     "a: W=%d: not a full mesh: at most %d sockets in a rank (most: %.0f, "
     "rank %d), at most %d on average (%.1f; rank 0, which serves the "
     "store, aside); %d ranks did not say", WORLD,
     MAX_SOCKETS, most, most_r, MEAN_SOCKETS, v, nosock);
  is_int(p.status, 0, "a: every rank exits 0");
  ok(p.elen == 0 || (strcasestr(p.ebuf, "warn") == NULL &&
                     strcasestr(p.ebuf, "error") == NULL),
     "a: no warning or error on any rank's stderr");
  if (p.status != 0) dump_procs(&p, 1);
  procs_free(&p, 1);
}

#ifndef UVCCL_SRC_DIR
#define UVCCL_SRC_DIR "."
#endif

static void scenario_torch_store(void) {
  proc_t srv, p;
  char tool[4096], portarg[16], *port;
  char *sargv[] = {(char *)"/usr/bin/python3",
                   (char *)UVCCL_SRC_DIR "/t/py/torch_store_server.py", NULL};
  char *argv[] = {tool, "--no-auth", "--master-port", portarg, "-n", "6",
                  "--", self, NULL};
  const char *env[] = {"UVCCL_T_ROLE=world", "UVCCL_MESH_MAX=0",
                       "TORCHELASTIC_USE_AGENT_STORE=True", NULL};
  static const char *checks[] = {"init", "allreduce", "broadcast",
                                 "allgather", "barrier", "destroy"};
  double t0 = now_s();
  int r, k, bad = 0, okv;
  char det[512];
  if (access("/usr/bin/python3", X_OK) != 0 ||
      system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    skip(1, "c: no python3-torch (Debian's) here");
    return;
  }
  if (spawn(&srv, "torch-store", sargv, NULL, 1) != 0) {
    ok(0, "c: the PyTorch store server starts");
    return;
  }
  while (now_s() - t0 < 60 && (srv.obuf == NULL ||
                               strstr(srv.obuf, "pid=") == NULL))
    if (pump(&srv, 1, 100) == 0) break;
  port = srv.obuf ? strstr(srv.obuf, "port=") : NULL;
  if (port == NULL) {
    ok(0, "c: the PyTorch store server says its port");
    dump_procs(&srv, 1);
    kill(srv.pid, SIGKILL);
    finish_all(&srv, 1, 5);
    procs_free(&srv, 1);
    return;
  }
  snprintf(portarg, sizeof(portarg), "%d", atoi(port + 5));
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "c: uvccl-run starts");
  } else {
    finish_all(&p, 1, 120);
    for (r = 0; r < 6; r++)
      for (k = 0; k < 6; k++) {
        find_check(&p, 1, r, checks[k], &okv, det, sizeof(det));
        if (okv != 1 && bad++ == 0)
          diag("rank %d %s: %s", r, checks[k],
               okv < 0 ? "(no report)" : det);
      }
    ok(bad == 0 && p.status == 0, "c: a sparse world of 6 over PyTorch "
       "1.13's TCPStore server: created, every result right, exit 0 (%d "
       "bad checks, exit %d)", bad, p.status);
    if (bad || p.status != 0) dump_procs(&p, 1);
    procs_free(&p, 1);
  }
  close(srv.in);
  srv.in = -1;
  finish_all(&srv, 1, 30);
  procs_free(&srv, 1);
}

static void scenario_short(void) {
  proc_t ps[3];
  static char e_port[32], e_rank[3][16];
  char *argv[] = {self, NULL};
  int r, okv, good = 1;
  char det[512];
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", free_port());
  for (r = 0; r < 3; r++) {
    const char *env[] = {"UVCCL_T_ROLE=short", e_rank[r], "WORLD_SIZE=4",
                         "MASTER_ADDR=127.0.0.1", e_port, "UVCCL_MESH_MAX=0",
                         NULL};
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r);
    if (spawn(&ps[r], "rank", argv, env, 0) != 0) good = 0;
  }
  finish_all(ps, 3, 60);
  for (r = 0; r < 3; r++) {
    find_check(ps, 3, r, "short", &okv, det, sizeof(det));
    if (okv != 1) {
      diag("rank %d: %s", r, okv < 0 ? "(no report)" : det);
      good = 0;
    }
  }
  ok(good, "d: a sparse world of 4, rank 3 never started: ranks 0-2 fail "
     "creation after 3 s, naming rank 3 among the neighbours that did not "
     "publish");
  if (!good) dump_procs(ps, 3);
  procs_free(ps, 3);
}

static void test_overlay(void) {
  int n, bad = 0, worst_deg = 0, worst_diam = 0;
  int *nb = malloc(64 * sizeof(int)), *dist = malloc(1100 * sizeof(int));
  int *queue = malloc(1100 * sizeof(int));
  char first[200] = "";
  for (n = 2; n <= 1100 && !bad; n++) {
    int r, logn = 0, diam = 0, head, tail, i;
    while ((1 << logn) < n) logn++;
    for (r = 0; r < n && !bad; r++) {
      int k = uvccl__overlay_neighbours(r, n, nb, 64), j;
      if (k > 2 * logn) {
        bad = 1;
        snprintf(first, sizeof(first), "N=%d rank %d: %d links", n, r, k);
      }
      if (k > worst_deg) worst_deg = k;
      for (i = 0; i < k && !bad; i++) {
        int back[64], kb, found = 0;
        j = nb[i];
        if (j == r || j < 0 || j >= n) {
          bad = 1;
          snprintf(first, sizeof(first), "N=%d rank %d: neighbour %d", n, r, j);
          break;
        }
        kb = uvccl__overlay_neighbours(j, n, back, 64);
        while (kb-- > 0) found |= back[kb] == r;
        if (!found) {
          bad = 1;
          snprintf(first, sizeof(first), "N=%d: %d links to %d, not back", n,
                   r, j);
        }
      }
    }
    /* breadth-first from rank 0 (the overlay is vertex-transitive) */
    for (i = 0; i < n; i++) dist[i] = -1;
    dist[0] = 0;
    head = tail = 0;
    queue[tail++] = 0;
    while (head < tail) {
      int u = queue[head++], k = uvccl__overlay_neighbours(u, n, nb, 64);
      for (i = 0; i < k; i++)
        if (dist[nb[i]] < 0) {
          dist[nb[i]] = dist[u] + 1;
          if (dist[nb[i]] > diam) diam = dist[nb[i]];
          queue[tail++] = nb[i];
        }
    }
    if (!bad && (tail != n || diam > logn + 1)) {
      bad = 1;
      snprintf(first, sizeof(first), "N=%d: %d of %d reached, diameter %d",
               n, tail, n, diam);
    }
    if (diam > worst_diam) worst_diam = diam;
  }
  ok(!bad, "b: the overlay for N = 2..1100: symmetric, at most 2 log2 N "
     "links, connected, diameter <= log2 N + 1 (most links %d, largest "
     "diameter %d)%s%s", worst_deg, worst_diam, bad ? ": " : "", first);
  free(nb);
  free(dist);
  free(queue);
}

int main(int argc, char **argv) {
  const char *role = getenv("UVCCL_T_ROLE");
  (void)argc;
  (void)argv;
  if (role != NULL && *role) {
    const char *r = getenv("RANK"), *s = getenv("WORLD_SIZE");
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(200);
    unsetenv("UVCCL_SOCKET_IFNAME");
    R = r ? atoi(r) : -1;
    P = s ? atoi(s) : 0;
    if (strcmp(role, "short") == 0) return role_short();
    return role_world();
  }
  parent_init(400);
  signal(SIGPIPE, SIG_IGN);
  test_overlay();
  scenario_world();
  scenario_torch_store();
  scenario_short();
  return done_testing();
}
