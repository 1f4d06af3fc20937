/* Hosts: ranks of one kernel told apart by $UVCCL_HOST_ID, and the rings
 * of large collectives in host order (src/cpu/algo/ring.c).
 *
 *   a) 5 ranks on hosts "a b a b a" (scattered): same-host pairs talk
 *      through shared memory, the others TCP; uvccl_pg_peer_host numbers
 *      the hosts 0 1 0 1 0 on every rank; the ring is 0 2 4 1 3 (each host's
 *      ranks together); every ring and chain collective exact: allreduce
 *      int32 and float32 (4 MiB, in place and out of place), reduce_scatter
 *      and reduce_scatterv (uneven), allgather and allgatherv, broadcast
 *      from every root, reduce to every root;
 *   b) 4 ranks placed by host ("a a b b"): the ring is rank order, hosts
 *      0 0 1 1;
 *   c) a) with $UVCCL_RING_ORDER=rank: rank order, the same exact results;
 *   d) 4 ranks on hosts "a b a b": hosts alike, so large allreduces reduce
 *      in each host (rings 0 2 and 1 3), across the hosts (0 1 and 2 3),
 *      and gather back, and allgather(v) and reduce_scatter(v) go across
 *      and within the hosts in two rings, and large broadcasts in two
 *      parts, each down a chain across the hosts of its own; exact (b too); with 4 TCP
 *      connections to each rank of the other host and frames of 8 KiB
 *      or more cut across them (UVCCL_TCP_STRIPES, _STRIPE_MIN);
 *   e) 6 ranks on hosts "a b c a b c" (3 hosts of 2, scattered) in
 *      segments of 64 KiB (UVCCL_SEGMENT): the hierarchical allreduce
 *      crosses the hosts segment by segment (32 crossings of 3 uneven
 *      parts each, every rank's held back by its neighbour's), and the
 *      allgather's crossings held back alike; exact;
 *   h) 6 ranks on hosts "a a a b c b" (hosts of 3, 2 and 1) in 64 KiB
 *      segments: the large allreduce goes through the hosts' leaders
 *      (each host's ranks reduce down a chain to its leader, the leaders
 *      allreduce across, the result goes back up), segment by segment;
 *      exact;
 *   f), g), i), j) as root: 2 hosts of 2, 3 hosts of 2 (64 KiB
 *      segments), hosts of 3 and 1, hosts of 2 and 3 (64 KiB segments),
 *      scattered, each host a network namespace of its own on a bridge
 *      (t/netns.h): ranks of two hosts reach each other only through
 *      their veth addresses; the same checks (skipped without root or
 *      iproute2).
 * Where every host has two ranks or more but not as many (a), j)),
 * allgather(v) and reduce_scatter(v) go through the hosts' leaders too.
 * b) and d) check the hierarchical allreduce's rings, a) and c) that
 * there are none (hosts of 3 and 2 ranks; rank order); every world the
 * hosts' leaders (a), h) and i): hosts of different sizes; none in c)).
 * Small allreduces (1 to 16384 elements) and barriers, exact in every
 * world: through the hosts' leaders but in c) (recursive doubling);
 * small broadcasts and reduces (1000 elements) from and to every root: a
 * tree in each host and one across in b) and d).
 *
 * The binary is also the rank program (UVCCL_T_ROLE=hosts, UVCCL_T_HOSTS
 * the hosts by rank, UVCCL_T_RING the ring expected). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "cpu/algo/algo.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXP 6
#include "ranks.h"
#include "netns.h"

#define N (1u << 20) /* 4 MiB of int32: rings, not the small algorithms */

/* Starts an operation on w and waits for it: its status. */
static cbres_t cres;
#define RUN(w, call)                                                           \
  (memset(&cres, 0, sizeof(cres)), (w).data = &cres,                           \
   finish_work(&cres, (call), 30000))

/* value of element i on rank r */
static int32_t v_of(int r, size_t i) { return (int32_t)((i % 1009) + 7 * r); }

static void check_allreduce(void) {
  int32_t *a = malloc(N * 4), *b = malloc(N * 4);
  float *f = malloc(N * 4);
  size_t i, bad = 0, badf = 0, badi = 0;
  uvccl_work_t w = {0};
  int rc, rc2, rc3, q;
  for (i = 0; i < N; i++) {
    a[i] = v_of(R, i);
    f[i] = (float)v_of(R, i);
  }
  rc = RUN(w, uvccl_allreduce(&pg, &w, a, b, N, UVCCL_INT32, UVCCL_SUM,
                                   on_work));
  for (i = 0; i < N; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, i);
    if (b[i] != want) bad++;
  }
  rc2 = RUN(w, uvccl_allreduce(&pg, &w, f, f, N, UVCCL_FLOAT32,
                                    UVCCL_SUM, on_work));
  for (i = 0; i < N; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, i);
    if (f[i] != (float)want) badf++;
  }
  rc3 = RUN(w, uvccl_allreduce(&pg, &w, a, a, N, UVCCL_INT32, UVCCL_MAX,
                                    on_work));
  for (i = 0; i < N; i++)
    if (a[i] != v_of(P - 1, i)) badi++;
  rep(rc == 0 && rc2 == 0 && rc3 == 0 && bad == 0 && badf == 0 && badi == 0,
      "allreduce", "int32 sum %s (%zu wrong), float32 in place %s (%zu), "
      "int32 max in place %s (%zu)", ename(rc), bad, ename(rc2), badf,
      ename(rc3), badi);
  free(a);
  free(b);
  free(f);
}

/* "in A... LABEL B...": two rings' ranks, for the checks below. */
static void rings_text(char *out, size_t n, const ring_t *a,
                       const char *label, const ring_t *b) {
  int q;
  size_t l;
  snprintf(out, n, "in");
  for (q = 0; q < a->P; q++) {
    l = strlen(out);
    snprintf(out + l, n - l, " %d", ring_at(a, q));
  }
  l = strlen(out);
  snprintf(out + l, n - l, " %s", label);
  for (q = 0; q < b->P; q++) {
    l = strlen(out);
    snprintf(out + l, n - l, " %d", ring_at(b, q));
  }
}

/* Small allreduces (up to small_max, 64 KiB: through the hosts' leaders
 * where the ranks are on several hosts, else recursive doubling) and
 * barriers between them. */
static void check_small(void) {
  static const size_t counts_small[3] = {1, 1000, 16384};
  int32_t *a = malloc(16384 * 4), *b = malloc(16384 * 4);
  float *f = malloc(16384 * 4);
  size_t i, bad = 0, k;
  uvccl_work_t w = {0};
  int rc = 0, q, brc = 0;
  for (k = 0; k < 3; k++) {
    size_t n = counts_small[k];
    int r1, r2, r3, r4;
    for (i = 0; i < n; i++) {
      a[i] = v_of(R, i);
      f[i] = (float)(P * v_of(R, i));
    }
    r1 = RUN(w, uvccl_allreduce(&pg, &w, a, b, n, UVCCL_INT32, UVCCL_SUM,
                                on_work));
    r4 = RUN(w, uvccl_barrier(&pg, &w, on_work));
    r2 = RUN(w, uvccl_allreduce(&pg, &w, a, a, n, UVCCL_INT32, UVCCL_MAX,
                                on_work));
    /* AVG: scaled once (the values are multiples of P: exact) */
    r3 = RUN(w, uvccl_allreduce(&pg, &w, f, f, n, UVCCL_FLOAT32, UVCCL_AVG,
                                on_work));
    for (i = 0; i < n; i++) {
      int64_t want = 0;
      for (q = 0; q < P; q++) want += v_of(q, i);
      bad += b[i] != want;
      bad += a[i] != v_of(P - 1, i);
      bad += f[i] != (float)want;
    }
    if (rc == 0) rc = r1 ? r1 : r2 ? r2 : r3;
    if (brc == 0) brc = r4;
  }
  rep(rc == 0 && brc == 0 && bad == 0, "small", "1, 1000 and 16384 "
      "elements: int32 sum and max, float32 avg in place: %s (%zu wrong); "
      "barriers %s", ename(rc), bad, ename(brc));
  free(a);
  free(b);
  free(f);
}

static void check_reduce_scatter(void) {
  size_t counts[MAXP], total = 0, off = 0, i, bad = 0, badv = 0, bada = 0;
  size_t per = N / 8;
  int32_t *in, *out;
  uvccl_work_t w = {0};
  int rc, rc2, rc3, q;
  for (q = 0; q < P; q++) {
    counts[q] = per + (size_t)q * 1000 + 3;
    total += counts[q];
  }
  in = malloc(total * 4 > per * P * 4 ? total * 4 : per * P * 4);
  out = malloc((per + P * 1000 + 3) * 4);
  for (i = 0; i < per * (size_t)P; i++) in[i] = v_of(R, i);
  rc = RUN(w, uvccl_reduce_scatter(&pg, &w, in, out, per, UVCCL_INT32,
                                        UVCCL_SUM, on_work));
  for (i = 0; i < per; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, (size_t)R * per + i);
    if (out[i] != want) bad++;
  }
  for (i = 0; i < total; i++) in[i] = v_of(R, i);
  for (q = 0; q < R; q++) off += counts[q];
  rc2 = RUN(w, uvccl_reduce_scatterv(&pg, &w, in, out, counts,
                                          UVCCL_INT32, UVCCL_SUM, on_work));
  for (i = 0; i < counts[R]; i++) {
    int64_t want = 0;
    for (q = 0; q < P; q++) want += v_of(q, off + i);
    if (out[i] != want) badv++;
  }
  /* AVG: scaled once, where each block ends (multiples of P: exact) */
  {
    float *fin = malloc(per * (size_t)P * 4), *fout = malloc(per * 4);
    for (i = 0; i < per * (size_t)P; i++) fin[i] = (float)(P * v_of(R, i));
    rc3 = RUN(w, uvccl_reduce_scatter(&pg, &w, fin, fout, per, UVCCL_FLOAT32,
                                      UVCCL_AVG, on_work));
    for (i = 0; i < per; i++) {
      int64_t want = 0;
      for (q = 0; q < P; q++) want += v_of(q, (size_t)R * per + i);
      if (fout[i] != (float)want) bada++;
    }
    free(fin);
    free(fout);
  }
  rep(rc == 0 && rc2 == 0 && rc3 == 0 && bad == 0 && badv == 0 && bada == 0,
      "reduce_scatter", "even %s (%zu wrong), v %s (%zu wrong), avg %s "
      "(%zu wrong)", ename(rc), bad, ename(rc2), badv, ename(rc3), bada);
  free(in);
  free(out);
}

static void check_allgather(void) {
  size_t per = N / 4, counts[MAXP], total = 0, i, bad = 0, badv = 0, off;
  int32_t *mine = malloc((per + MAXP * 777) * 4), *all;
  uvccl_work_t w = {0};
  int rc, rc2, q;
  for (q = 0; q < P; q++) {
    counts[q] = per + (size_t)q * 777;
    total += counts[q];
  }
  all = malloc((total > per * P ? total : per * P) * 4);
  for (i = 0; i < per; i++) mine[i] = v_of(R, i);
  rc = RUN(w, uvccl_allgather(&pg, &w, mine, all, per, UVCCL_INT32,
                                   on_work));
  for (q = 0; q < P; q++)
    for (i = 0; i < per; i++)
      if (all[(size_t)q * per + i] != v_of(q, i)) bad++;
  for (i = 0; i < counts[R]; i++) mine[i] = v_of(R, i + 5);
  {
    void *bufs[MAXP];
    for (q = 0, off = 0; q < P; off += counts[q], q++) bufs[q] = all + off;
    rc2 = RUN(w, uvccl_allgatherv(&pg, &w, mine, counts[R], bufs, counts,
                                  UVCCL_INT32, on_work));
  }
  for (q = 0, off = 0; q < P; off += counts[q], q++)
    for (i = 0; i < counts[q]; i++)
      if (all[off + i] != v_of(q, i + 5)) badv++;
  rep(rc == 0 && rc2 == 0 && bad == 0 && badv == 0, "allgather",
      "even %s (%zu wrong), v %s (%zu wrong)", ename(rc), bad, ename(rc2),
      badv);
  free(mine);
  free(all);
}

static void check_rooted(size_t n, const char *name) {
  int32_t *b = malloc(n * 4), *out = malloc(n * 4);
  float *f = malloc(n * 4), *fo = malloc(n * 4);
  uvccl_work_t w = {0};
  size_t i, bad = 0, badr = 0;
  int root, rcs = 0, q;
  char errs[400] = "";
  for (root = 0; root < P; root++) {
    int rc, rc2;
    for (i = 0; i < n; i++) b[i] = R == root ? v_of(root, i) : -1;
    rc = RUN(w, uvccl_broadcast(&pg, &w, b, n, UVCCL_INT32, root,
                                     on_work));
    if (rc != 0) {
      size_t l = strlen(errs);
      snprintf(errs + l, sizeof(errs) - l, " broadcast from %d: %s", root,
               ename(rc));
      rcs++;
    }
    for (i = 0; i < n; i++)
      if (b[i] != v_of(root, i)) bad++;
    for (i = 0; i < n; i++) {
      b[i] = v_of(R, i);
      f[i] = (float)(P * v_of(R, i)); /* AVG exact: multiples of P */
    }
    rc = RUN(w, uvccl_reduce(&pg, &w, b, out, n, UVCCL_INT32, UVCCL_SUM,
                                  root, on_work));
    rc2 = RUN(w, uvccl_reduce(&pg, &w, f, fo, n, UVCCL_FLOAT32, UVCCL_AVG,
                              root, on_work));
    if (rc != 0 || rc2 != 0) {
      size_t l = strlen(errs);
      snprintf(errs + l, sizeof(errs) - l, " reduce to %d: %s %s", root,
               ename(rc ? rc : rc2), w.msg);
      rcs++;
    }
    if (R == root)
      for (i = 0; i < n; i++) {
        int64_t want = 0;
        for (q = 0; q < P; q++) want += v_of(q, i);
        if (out[i] != want || fo[i] != (float)want) badr++;
      }
  }
  rep(rcs == 0 && bad == 0 && badr == 0, name,
      "%zu int32: broadcast from every root (%zu wrong), reduce (sum, and "
      "avg of float32) to every root (%zu wrong), %d calls failed%s", n, bad,
      badr, rcs, errs);
  free(b);
  free(out);
  free(f);
  free(fo);
}

static int rank_main(void) {
  const char *hosts = getenv("UVCCL_T_HOSTS"), *want = getenv("UVCCL_T_RING");
  char id[8], d[256] = "", ring[64] = "";
  ring_t x;
  int q, bad = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  R = atoi(getenv("RANK"));
  P = atoi(getenv("WORLD_SIZE"));
  /* "a b a b a": this rank's host is the R-th letter */
  snprintf(id, sizeof(id), "host-%c", hosts[2 * R]);
  setenv("UVCCL_HOST_ID", id, 1);
  rank_init(20000);

  for (q = 0; q < P; q++) {
    const char *t = uvccl_pg_peer_transport(&pg, q);
    const char *exp = q == R ? "self"
                      : hosts[2 * q] == hosts[2 * R] ? "shm" : "tcp";
    int h = uvccl_pg_peer_host(&pg, q), hw = 0, k;
    size_t l = strlen(d);
    /* expected: hosts numbered by first appearance */
    for (k = 0; k < q; k++) {
      int j;
      if (hosts[2 * k] == hosts[2 * q]) break;
      for (j = 0; j < k && hosts[2 * j] != hosts[2 * k]; j++) {
      }
      if (j == k) hw++;
    }
    if (k < q) hw = uvccl_pg_peer_host(&pg, k);
    snprintf(d + l, sizeof(d) - l, "%s%d=%s/host %d", q ? " " : "", q, t, h);
    if (strcmp(t, exp) != 0 || h != hw) bad++;
  }
  rep(bad == 0, "hosts", "%s", d);
  rep(uvccl_pg_peer_host(&pg, P) == UV_EINVAL &&
          uvccl_pg_peer_host(&pg, -1) == UV_EINVAL,
      "host_einval", "no such rank: UV_EINVAL");

  uvccl__ring_of(pg.impl_, &x);
  for (q = 0; q < P; q++) {
    size_t l = strlen(ring);
    snprintf(ring + l, sizeof(ring) - l, "%s%d", q ? " " : "", ring_at(&x, q));
  }
  rep(strcmp(ring, want) == 0 && ring_at(&x, x.q) == R, "ring",
      "ring %s (want %s), this rank at position %d", ring, want, x.q);

  /* hosts alike: the allreduce's rings in the host and across */
  {
    const char *order = getenv("UVCCL_RING_ORDER");
    char seen[MAXP], got[64] = "none", exp[64] = "none";
    int nh = 0, L = -1, alike = 1, k, me_l = 0;
    ring_t in_host, across;
    for (q = 0; q < P; q++) {
      int cnt = 0;
      for (k = 0; k < nh && seen[k] != hosts[2 * q]; k++) {
      }
      if (k < nh) continue;
      seen[nh++] = hosts[2 * q];
      for (k = 0; k < P; k++) cnt += hosts[2 * k] == hosts[2 * q];
      if (L < 0) L = cnt;
      if (cnt != L) alike = 0;
    }
    if (alike && L >= 2 && nh >= 2 && (order == NULL || !strcmp(order, "host"))) {
      size_t l;
      snprintf(exp, sizeof(exp), "in");
      for (q = 0; q < P; q++)
        if (hosts[2 * q] == hosts[2 * R]) {
          if (q == R) me_l = (int)(strlen(exp) - 2) / 2;
          l = strlen(exp);
          snprintf(exp + l, sizeof(exp) - l, " %d", q);
        }
      l = strlen(exp);
      snprintf(exp + l, sizeof(exp) - l, " across");
      for (k = 0; k < nh; k++) {
        int idx = 0;
        for (q = 0; q < P; q++)
          if (hosts[2 * q] == seen[k] && idx++ == me_l) {
            l = strlen(exp);
            snprintf(exp + l, sizeof(exp) - l, " %d", q);
          }
      }
    }
    if (uvccl__ring_hosts(pg.impl_, &in_host, &across))
      rings_text(got, sizeof(got), &in_host, "across", &across);
    rep(strcmp(got, exp) == 0, "hier", "%s (want %s)", got, exp);
  }

  /* hosts of any sizes: this rank's host from its leader, and the
   * leaders (the runs of the ring, which is in host order) */
  {
    const char *order = getenv("UVCCL_RING_ORDER");
    char got[64] = "none", exp[64] = "none", in[32] = "", lead[32] = "";
    int nh = 0, big = 0, start = 0, k;
    ring_t in_host, leaders;
    for (q = 1; q <= P; q++) {
      size_t l;
      if (q < P && hosts[2 * ring_at(&x, q)] == hosts[2 * ring_at(&x, q - 1)])
        continue;
      l = strlen(lead);
      snprintf(lead + l, sizeof(lead) - l, " %d", ring_at(&x, start));
      if (hosts[2 * ring_at(&x, start)] == hosts[2 * R])
        for (k = start; k < q; k++) {
          l = strlen(in);
          snprintf(in + l, sizeof(in) - l, " %d", ring_at(&x, k));
        }
      big |= q - start >= 2;
      nh++;
      start = q;
    }
    if (nh >= 2 && big && (order == NULL || !strcmp(order, "host")))
      snprintf(exp, sizeof(exp), "in%s leaders%s", in, lead);
    if (uvccl__ring_leaders(pg.impl_, &in_host, &leaders)) {
      rings_text(got, sizeof(got), &in_host, "leaders", &leaders);
      if (ring_at(&in_host, in_host.q) != R ||
          ring_at(&leaders, leaders.q) != ring_at(&in_host, 0))
        snprintf(got, sizeof(got), "this rank misplaced");
    }
    rep(strcmp(got, exp) == 0, "lead", "%s (want %s)", got, exp);
  }

  check_allreduce();
  check_small();
  check_reduce_scatter();
  check_allgather();
  check_rooted(N + 12345, "rooted"); /* uneven segments (chain_nseg) */
  check_rooted(1000, "rooted_small");
  return rank_destroy();
}

static void report_world(proc_t *ps, int n, const char *name,
                         const char *hosts, const char *ring);

static void world(const char *name, const char *hosts, const char *ring,
                  int n, const char *order) {
  proc_t ps[MAXP];
  static char e_hosts[64], e_ring[64];
  snprintf(e_hosts, sizeof(e_hosts), "UVCCL_T_HOSTS=%s", hosts);
  snprintf(e_ring, sizeof(e_ring), "UVCCL_T_RING=%s", ring);
  putenv(e_hosts);
  putenv(e_ring);
  if (order != NULL) setenv("UVCCL_RING_ORDER", order, 1);
  scenario_failed = 0;
  spawn_world(ps, n, "hosts", 0);
  unsetenv("UVCCL_RING_ORDER");
  report_world(ps, n, name, hosts, ring);
}

/* The world's 13 tests, once its ranks have ended. */
static void report_world(proc_t *ps, int n, const char *name,
                         const char *hosts, const char *ring) {
  unsigned all = (1u << n) - 1;
  finish_all(ps, n, 90);
  agg(ps, n, "init", all, "%s: %d ranks on hosts \"%s\" make their world", name,
      n, hosts);
  agg(ps, n, "hosts", all, "%s: shared memory within a host, TCP between; "
      "uvccl_pg_peer_host numbers the hosts by their first rank", name);
  agg(ps, n, "host_einval", all, "%s: uvccl_pg_peer_host of no such rank: "
      "UV_EINVAL", name);
  agg(ps, n, "ring", all, "%s: the ring is %s on every rank", name, ring);
  agg(ps, n, "hier", all, "%s: the hierarchical allreduce's rings (in the "
      "host, across the hosts) where the hosts have as many ranks each, else "
      "none", name);
  agg(ps, n, "lead", all, "%s: each host's ranks from its leader, and the "
      "hosts' leaders, where there are two hosts or more and one has two "
      "ranks or more, else none", name);
  agg(ps, n, "allreduce", all, "%s: allreduce int32 and float32, in and out "
      "of place, exact", name);
  agg(ps, n, "small", all, "%s: small allreduces (sum, max, avg) exact, "
      "barriers between them", name);
  agg(ps, n, "reduce_scatter", all, "%s: reduce_scatter (sum, avg) and "
      "reduce_scatterv exact", name);
  agg(ps, n, "allgather", all, "%s: allgather and allgatherv exact", name);
  agg(ps, n, "rooted", all, "%s: broadcast from and reduce to every root "
      "exact", name);
  agg(ps, n, "rooted_small", all, "%s: small broadcast from and reduce to "
      "every root exact", name);
  agg(ps, n, "destroy", all, "%s: destroy, loop closed", name);
  if (scenario_failed) dump_procs(ps, n);
  procs_free(ps, n);
}

/* world() with host k a network namespace of its own (t/netns.h). */
static void ns_world(const char *name, const char *hosts, const char *ring,
                     int n, const char *more) {
  proc_t ps[MAXP];
  static char e_hosts[64], e_ring[64];
  int r;
  snprintf(e_hosts, sizeof(e_hosts), "UVCCL_T_HOSTS=%s", hosts);
  snprintf(e_ring, sizeof(e_ring), "UVCCL_T_RING=%s", ring);
  scenario_failed = 0;
  for (r = 0; r < n; r++) {
    const char *extra[] = {e_hosts, e_ring, more, NULL};
    if (ns_spawn_rank_in(&ps[r], r, n, hosts[2 * r] - 'a', "hosts", extra))
      note("spawning rank %d in its namespace failed", r);
  }
  report_world(ps, n, name, hosts, ring);
}

#define NS_TESTS 52

static void ns_worlds(void) {
  char err[512];
  if (ns_prepare(3, err, sizeof(err)) != 0) {
    skip(NS_TESTS, "%s", err);
    return;
  }
  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip(NS_TESTS, "cannot build the network namespaces: %s", err);
    return;
  }
  ns_world("f (netns: 2 hosts of 2, scattered)", "a b a b", "0 2 1 3", 4,
           NULL);
  ns_world("g (netns: 3 hosts of 2, scattered, 64 KiB segments)",
           "a b c a b c", "0 3 1 4 2 5", 6, "UVCCL_SEGMENT=65536");
  ns_world("i (netns: hosts of 3 and 1, scattered)", "a b a a", "0 2 3 1", 4,
           NULL);
  ns_world("j (netns: hosts of 2 and 3, scattered, 64 KiB segments)",
           "a b a b b", "0 2 1 3 4", 5, "UVCCL_SEGMENT=65536");
  ns_cleanup();
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && strcmp(role, "hosts") == 0) return rank_main();
  parent_init(300);
  signal(SIGPIPE, SIG_IGN);
  plan(78 + NS_TESTS);
  unsetenv("UVCCL_TRANSPORT");
  unsetenv("UVCCL_MESH_MAX");
  world("a (scattered)", "a b a b a", "0 2 4 1 3", 5, NULL);
  world("b (by host)", "a a b b", "0 1 2 3", 4, NULL);
  world("c (scattered, UVCCL_RING_ORDER=rank)", "a b a b a", "0 1 2 3 4", 5,
        "rank");
  setenv("UVCCL_TCP_STRIPES", "4", 1);
  setenv("UVCCL_TCP_STRIPE_MIN", "8192", 1);
  world("d (2 hosts of 2, scattered, striped)", "a b a b", "0 2 1 3", 4, NULL);
  unsetenv("UVCCL_TCP_STRIPES");
  unsetenv("UVCCL_TCP_STRIPE_MIN");
  setenv("UVCCL_SEGMENT", "65536", 1);
  world("e (3 hosts of 2, scattered, 64 KiB segments)", "a b c a b c",
        "0 3 1 4 2 5", 6, NULL);
  world("h (hosts of 3, 2 and 1, 64 KiB segments)", "a a a b c b",
        "0 1 2 3 5 4", 6, NULL);
  unsetenv("UVCCL_SEGMENT");
  ns_worlds();
  return done_testing();
}
