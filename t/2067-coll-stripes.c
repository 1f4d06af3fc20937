/* Striped TCP (src/cpu/xport/stripe.c): ranks of one kernel told apart
 * by $UVCCL_HOST_ID, so that ranks of different "hosts" talk TCP.
 *
 *   a) 4 ranks on hosts "a b a b", UVCCL_TCP_STRIPES=3 and frames of
 *      8 KiB or more cut (UVCCL_TCP_STRIPE_MIN), the mesh authenticated
 *      (UVCCL_AUTH_TOKEN: every stripe proves the secret too): each rank
 *      holds exactly 2 more sockets per rank of the other host than in
 *      the same world with one connection (b), none more for its own
 *      host's rank; every collective exact at sizes cut unevenly across
 *      the stripes and sizes not cut: allreduce (int32 sum, float32 in
 *      place), broadcast from every root, reduce to every root, allgather,
 *      reduce_scatter, alltoall; two allreduces in flight at once;
 *   b) the same world with UVCCL_TCP_STRIPES=1: the baseline, exact too;
 *   c) 2 ranks on hosts "a b": rank 0 broadcasts 4 MiB and leaves at once;
 *      rank 1 calls the broadcast 300 ms later (its loop running): every
 *      byte arrives (what a rank sent on its stripes before it left is
 *      read to the end before its leave is taken);
 *   d) 2 ranks whose UVCCL_TCP_STRIPES differ (3 and 2): both creations
 *      fail with UV_EINVAL, naming the variable.
 *
 * The binary is also the rank program (UVCCL_T_ROLE=stripes,
 * UVCCL_T_HOSTS the hosts by rank, UVCCL_T_STRIPES the stripes by rank,
 * UVCCL_T_MODE all, leave or mismatch). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXP 4
#include "ranks.h"

#define N ((1u << 20) + 12345) /* int32: pieces of unequal size */

static cbres_t cres;
#define RUN(w, call)                                                           \
  (memset(&cres, 0, sizeof(cres)), (w).data = &cres,                           \
   finish_work(&cres, (call), 30000))

static int32_t v_of(int r, size_t i) { return (int32_t)((i % 1013) + 5 * r); }

/* The sockets this process holds. */
static int sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  char path[300], to[64];
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) {
    ssize_t k;
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    k = readlink(path, to, sizeof(to) - 1);
    if (k > 0) {
      to[k] = '\0';
      n += strncmp(to, "socket:", 7) == 0;
    }
  }
  closedir(d);
  return n;
}

static void check_allreduce(size_t n, const char *name) {
  int32_t *a = calloc(n, 4), *b = calloc(n, 4);
  float *f = calloc(n, 4);
  size_t i, bad = 0, badf = 0;
  uvccl_work_t w = {0};
  int rc, rc2, q;
  for (i = 0; i < n; i++) {
    a[i] = v_of(R, i);
    f[i] = (float)v_of(R, i);
  }
  rc = RUN(w, uvccl_allreduce(&pg, &w, a, b, n, UVCCL_INT32, UVCCL_SUM,
                              on_work));
  rc2 = RUN(w, uvccl_allreduce(&pg, &w, f, f, n, UVCCL_FLOAT32, UVCCL_SUM,
                               on_work));
  for (i = 0; i < n; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, i);
    bad += b[i] != want;
    badf += f[i] != (float)want;
  }
  rep(rc == 0 && rc2 == 0 && bad == 0 && badf == 0, name,
      "%zu elements: int32 sum %s (%zu wrong), float32 in place %s (%zu)", n,
      ename(rc), bad, ename(rc2), badf);
  free(a);
  free(b);
  free(f);
}

static void check_rooted(void) {
  int32_t *b = malloc(N * 4), *out = malloc(N * 4);
  size_t i, bad = 0, badr = 0;
  uvccl_work_t w = {0};
  int root, q, errs = 0;
  for (root = 0; root < P; root++) {
    for (i = 0; i < N; i++) b[i] = R == root ? v_of(root, i) : -1;
    errs += RUN(w, uvccl_broadcast(&pg, &w, b, N, UVCCL_INT32, root,
                                   on_work)) != 0;
    for (i = 0; i < N; i++) bad += b[i] != v_of(root, i);
    for (i = 0; i < N; i++) b[i] = v_of(R, i);
    errs += RUN(w, uvccl_reduce(&pg, &w, b, out, N, UVCCL_INT32, UVCCL_SUM,
                                root, on_work)) != 0;
    if (R == root)
      for (i = 0; i < N; i++) {
        int64_t want = 0;
        for (q = 0; q < P; q++) want += v_of(q, i);
        badr += out[i] != want;
      }
  }
  rep(errs == 0 && bad == 0 && badr == 0, "rooted",
      "broadcast from every root (%zu wrong), reduce to every root (%zu "
      "wrong), %d calls failed", bad, badr, errs);
  free(b);
  free(out);
}

static void check_gathers(void) {
  size_t n = N / 4, i, bad = 0, badr = 0, bada = 0;
  int32_t *in = malloc(n * P * 4), *out = malloc(n * P * 4);
  uvccl_work_t w = {0};
  int q, errs = 0;
  for (i = 0; i < n; i++) in[i] = v_of(R, i);
  errs += RUN(w, uvccl_allgather(&pg, &w, in, out, n, UVCCL_INT32,
                                 on_work)) != 0;
  for (q = 0; q < P; q++)
    for (i = 0; i < n; i++) bad += out[(size_t)q * n + i] != v_of(q, i);
  for (i = 0; i < n * P; i++) in[i] = v_of(R, i);
  errs += RUN(w, uvccl_reduce_scatter(&pg, &w, in, out, n, UVCCL_INT32,
                                      UVCCL_SUM, on_work)) != 0;
  for (i = 0; i < n; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, (size_t)R * n + i);
    badr += out[i] != want;
  }
  /* alltoall: part j of rank r is v_of(r, j * n + i) */
  for (i = 0; i < n * P; i++) in[i] = v_of(R, i);
  errs += RUN(w, uvccl_alltoall(&pg, &w, in, out, n, UVCCL_INT32,
                                on_work)) != 0;
  for (q = 0; q < P; q++)
    for (i = 0; i < n; i++)
      bada += out[(size_t)q * n + i] != v_of(q, (size_t)R * n + i);
  rep(errs == 0 && bad == 0 && badr == 0 && bada == 0, "gathers",
      "%zu int32 a part: allgather (%zu wrong), reduce_scatter (%zu), "
      "alltoall (%zu), %d calls failed", n, bad, badr, bada, errs);
  free(in);
  free(out);
}

/* Two allreduces in flight at once, of different sizes: their pieces
 * share the stripes. */
static void check_overlap(void) {
  size_t n1 = N, n2 = 50000, i, bad = 0;
  int32_t *a = malloc(n1 * 4), *b = malloc(n2 * 4);
  uvccl_work_t w1 = {0}, w2 = {0};
  cbres_t c1 = {0}, c2 = {0};
  int rc1, rc2, q;
  for (i = 0; i < n1; i++) a[i] = v_of(R, i);
  for (i = 0; i < n2; i++) b[i] = v_of(R, i + 7);
  w1.data = &c1;
  w2.data = &c2;
  rc1 = uvccl_allreduce(&pg, &w1, a, a, n1, UVCCL_INT32, UVCCL_SUM, on_work);
  rc2 = uvccl_allreduce(&pg, &w2, b, b, n2, UVCCL_INT32, UVCCL_SUM, on_work);
  rc1 = finish_work(&c1, rc1, 30000);
  rc2 = finish_work(&c2, rc2, 30000);
  for (i = 0; i < n1; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, i);
    bad += a[i] != want;
  }
  for (i = 0; i < n2; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, i + 7);
    bad += b[i] != want;
  }
  rep(rc1 == 0 && rc2 == 0 && bad == 0, "overlap",
      "%s and %s, %zu wrong", ename(rc1), ename(rc2), bad);
  free(a);
  free(b);
}

static void on_timer(uv_timer_t *t) { *(int *)t->data = 1; }

static int rank_leave(void) {
  size_t n = (4u << 20) / 4, i, bad = 0;
  int32_t *b = malloc(n * 4);
  uvccl_work_t w = {0};
  int rc;
  for (i = 0; i < n; i++) b[i] = R == 0 ? v_of(0, i) : -1;
  if (R == 1) {
    /* the loop runs meanwhile: what comes is read, rank 0 leaves */
    uv_timer_t t;
    int fired = 0;
    uv_timer_init(&loop, &t);
    t.data = &fired;
    uv_timer_start(&t, on_timer, 300, 0);
    run_until(&fired, 5000);
    uv_close((uv_handle_t *)&t, NULL);
  }
  rc = RUN(w, uvccl_broadcast(&pg, &w, b, n, UVCCL_INT32, 0, on_work));
  for (i = 0; i < n; i++) bad += b[i] != v_of(0, i);
  rep(rc == 0 && bad == 0, "leave", "broadcast of %zu bytes: %s %s, %zu "
      "wrong", n * 4, ename(rc), w.msg, bad);
  free(b);
  return rank_destroy();
}

static int rank_mismatch(void) {
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int rc;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = 10000;
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  w.data = &c;
  rc = uvccl_pg_init_url(&loop, &pg, "env://", &o, &w, on_work);
  rc = finish_work(&c, rc, 15000);
  rep(rc == UV_EINVAL && strstr(w.msg, "UVCCL_TCP_STRIPES") != NULL,
      "mismatch", "creation: %s: %s", ename(rc), w.msg);
  if (pg.impl_ != NULL) uvccl_pg_destroy(&pg, on_pg_closed);
  run_until(&pg_closed, 5000);
  return 0;
}

static int rank_main(void) {
  const char *hosts = getenv("UVCCL_T_HOSTS"), *st = getenv("UVCCL_T_STRIPES"),
             *mode = getenv("UVCCL_T_MODE");
  char id[16], n[8];
  setvbuf(stdout, NULL, _IOLBF, 0);
  R = atoi(getenv("RANK"));
  P = atoi(getenv("WORLD_SIZE"));
  snprintf(id, sizeof(id), "host-%c", hosts[2 * R]);
  setenv("UVCCL_HOST_ID", id, 1);
  snprintf(n, sizeof(n), "%c", st[2 * R]);
  setenv("UVCCL_TCP_STRIPES", n, 1);
  setenv("UVCCL_TCP_STRIPE_MIN", "8192", 1);
  if (strcmp(mode, "mismatch") == 0) return rank_mismatch();
  rank_init(20000);
  if (strcmp(mode, "leave") == 0) return rank_leave();
  val("sockets", sockets());
  check_allreduce(N, "allreduce");
  check_allreduce(1000, "allreduce_small"); /* 4000 B: not cut */
  check_rooted();
  check_gathers();
  check_overlap();
  return rank_destroy();
}

static void world(proc_t *ps, const char *name, const char *hosts,
                  const char *stripes, const char *mode, int n) {
  static char e_hosts[64], e_st[64], e_mode[64];
  snprintf(e_hosts, sizeof(e_hosts), "UVCCL_T_HOSTS=%s", hosts);
  snprintf(e_st, sizeof(e_st), "UVCCL_T_STRIPES=%s", stripes);
  snprintf(e_mode, sizeof(e_mode), "UVCCL_T_MODE=%s", mode);
  putenv(e_hosts);
  putenv(e_st);
  putenv(e_mode);
  scenario_failed = 0;
  spawn_world(ps, n, "stripes", 0);
  finish_all(ps, n, 90);
  (void)name;
}

static void world_checks(proc_t *ps, const char *name, int n) {
  unsigned all = (1u << n) - 1;
  agg(ps, n, "init", all, "%s: the world is made", name);
  agg(ps, n, "allreduce", all, "%s: allreduce of %u int32 (cut unevenly) "
      "exact", name, N);
  agg(ps, n, "allreduce_small", all, "%s: allreduce of 1000 int32 (not cut) "
      "exact", name);
  agg(ps, n, "rooted", all, "%s: broadcast from and reduce to every root "
      "exact", name);
  agg(ps, n, "gathers", all, "%s: allgather, reduce_scatter, alltoall exact",
      name);
  agg(ps, n, "overlap", all, "%s: two allreduces in flight at once exact",
      name);
  agg(ps, n, "destroy", all, "%s: destroy, loop closed", name);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  proc_t a[MAXP], b[MAXP], c[2], d[2];
  double sa[MAXP], sb[MAXP];
  char det[128] = "";
  int r, ok = 1;
  if (role != NULL && strcmp(role, "stripes") == 0) return rank_main();
  parent_init(300);
  signal(SIGPIPE, SIG_IGN);
  plan(18);
  unsetenv("UVCCL_TRANSPORT");
  unsetenv("UVCCL_MESH_MAX");
  setenv("UVCCL_AUTH_TOKEN", "stripes-test-secret", 1);
  world(a, "a", "a b a b", "3 3 3 3", "all", 4);
  world_checks(a, "a (3 stripes, authenticated)", 4);
  if (scenario_failed) dump_procs(a, 4);
  unsetenv("UVCCL_AUTH_TOKEN");
  world(b, "b", "a b a b", "1 1 1 1", "all", 4);
  world_checks(b, "b (1 connection)", 4);
  if (scenario_failed) dump_procs(b, 4);
  for (r = 0; r < 4; r++) {
    size_t l = strlen(det);
    int h1 = find_val(a, 4, r, "sockets", &sa[r]),
        h2 = find_val(b, 4, r, "sockets", &sb[r]);
    /* two ranks of the other host, 2 more connections to each */
    if (!h1 || !h2 || sa[r] - sb[r] != 4) ok = 0;
    snprintf(det + l, sizeof(det) - l, "%srank %d %g-%g", r ? ", " : "", r,
             h1 ? sa[r] : -1.0, h2 ? sb[r] : -1.0);
  }
  ok(ok, "a vs b: 3 stripes hold 2 more sockets per rank of the other "
      "host, none for the same host's (%s)", det);
  procs_free(a, 4);
  procs_free(b, 4);

  world(c, "c", "a b", "3 3", "leave", 2);
  agg(c, 2, "leave", 3, "c: a broadcast whose root left before the other "
      "called it arrives whole over the stripes");
  agg(c, 2, "destroy", 3, "c: destroy, loop closed");
  if (scenario_failed) dump_procs(c, 2);
  procs_free(c, 2);

  world(d, "d", "a b", "3 2", "mismatch", 2);
  agg(d, 2, "mismatch", 3, "d: UVCCL_TCP_STRIPES 3 and 2: both creations "
      "fail with UV_EINVAL, naming the variable");
  if (scenario_failed) dump_procs(d, 2);
  procs_free(d, 2);
  return done_testing();
}
