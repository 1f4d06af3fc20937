/* Ranks of one host talk through shared memory (src/cpu/xport/shm.c):
 *   a) worlds of 2, 3, 4 and 8 processes: every rank reaches every other
 *      through "shm" (uvccl_pg_peer_transport), its inbox is an anonymous
 *      memfd, and allreduce (float32 SUM past the rings' size, int64 MAX,
 *      float64 AVG), broadcast, reduce, allgather, reduce_scatter, alltoall,
 *      gather, scatter and a ring of sends and receives larger than a ring
 *      are exact in every rank;
 *   b) a mixed world: 4 processes, ranks 2 and 3 with $UVCCL_TRANSPORT=tcp:
 *      ranks 0-1 use shared memory, every pair with 2 or 3 TCP, same results;
 *   (c: a rank SIGKILLed in a 16 MiB allreduce over shared memory is
 *      t/2020's scenario b, which checks the transport too)
 *   d) nothing is left in /dev/shm by any of it;
 *   f) a) and b) again in sparse worlds ($UVCCL_MESH_MAX=0: connections
 *      made when first needed, crossing dials included; 2, 3, 8, and 5
 *      with ranks 1 and 4 on TCP), small allreduces and barriers through
 *      the tree ($UVCCL_SMALL_TREE=1): the same results, and after them
 *      every pair reached through the same transport as in a full mesh;
 *   g) a) at 2, 3 and 4 and b) again with single copy on
 *      ($UVCCL_SHM_CMA=1, from 4 KiB): the same results, and every rank
 *      read a frame from each shared-memory peer's memory (its debug log);
 *   h) a) at 2 and 4 with single copy left to UVCCL_SHM_CMA's default,
 *      auto: the same results, and each rank took one decision (once the
 *      figures are in from their thread), the one its figures call for (on exactly when process_vm_readv
 *      reaches 0.8 of memcpy's speed, with more ranks than CPUs too);
 *   (a, b and f set UVCCL_SHM_CMA=0: the rings carry every byte)
 *   j) a) at 2 and b) at 4 (rank 3 on TCP) with the helper thread on
 *      (UVCCL_SHM_HELPER=1, src/cpu/par.c: half of each large copy and
 *      reduction through the rings on a second thread), single copy off:
 *      every rank says it runs it, every result exact;
 *   k) a) at 3 and b) at 4 (rank 3 on TCP, the helper on) with every
 *      collective's output written around the cache ($UVCCL_STREAM_MIN=1:
 *      non-temporal stores, par.c, whatever the size; by default from
 *      8 MiB): every result exact;
 *   e) 3000 barriers, small allreduces and 16 KiB allgathers back to back
 *      at 2 and 3 ranks, default mode:
 *      every one finishes (a lost wake-up or an unread ring would stall
 *      one; such races are timing-dependent: t/2057's sweeps at 3 and 5
 *      ranks found the one fixed in shm_seg.c's publish, this did not).
 *   i) boxes (small collectives and barriers of a world linked through
 *      shared memory, one round, src/cpu/xport/shm.c) at 2, 3, 4 and 8 ranks:
 *      every rank says it takes them; float32 SUM of 1, 7 and 256
 *      elements (the largest a box holds) is bitwise the fold of every
 *      rank's input in rank order, 257 (messages again) within rounding,
 *      and every rank holds the same bits; int32 SUM, int64 MAX and MIN,
 *      bfloat16 PRODUCT exact (16-bit floats folded in float32), float64
 *      AVG within 1e-12, in place and out of place; broadcast from every
 *      root, allgather (in place too), reduce_scatter (int32 exact;
 *      float32 the rank-order fold bitwise) and alltoall at 1, 7, 256 and
 *      257 int32 per part; 64 collectives started before any is waited
 *      for (sizes, broadcasts, barriers, a coalesced one) all exact;
 *      an allgather on the last rank against the others' allreduces, 4 B:
 *      every rank fails with UVCCL_EMISMATCH (parts say what they are);
 *      and at 4 with one rank saying UVCCL_SHM_BOXES=0: no rank takes
 *      boxes (the world agrees), the results are the same.
 * (Hostile bytes in a ring or a box: t/2061.)
 * The test binary is also the rank program (UVCCL_T_ROLE), as in t/2020. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#define MAXP 8
#include "ranks.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#ifndef UVCCL_BUILD_DIR
#define UVCCL_BUILD_DIR "build"
#endif

/* ---- rank side ------------------------------------------------------------ */

/* 1 when rank r runs with $UVCCL_TRANSPORT=tcp ($UVCCL_T_TCP_RANKS="2,3"). */
/* r in the comma-separated list l (NULL: none) */
static int tcp_rank_in(const char *l, int r) {
  char tok[16];
  snprintf(tok, sizeof(tok), "%d", r);
  if (l == NULL || *l == '\0') return 0;
  for (;;) {
    size_t n = strcspn(l, ",");
    if (n == strlen(tok) && strncmp(l, tok, n) == 0) return 1;
    if (l[n] == '\0') return 0;
    l += n + 1;
  }
}

static int tcp_rank(int r) { return tcp_rank_in(getenv("UVCCL_T_TCP_RANKS"), r); }

/* How many of this process's mappings are named `what` in /proc/self/maps. */
static int maps_count(const char *what) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int n = 0;
  if (f == NULL) return -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (strstr(line, what) != NULL) n++;
  fclose(f);
  return n;
}

static int wait_ok(uvccl_work_t *w, cbres_t *c, int rc) {
  return finish_work(c, rc, 30000);
}

static void check_transports(void) {
  int q, bad = 0;
  char first[160] = "";
  for (q = 0; q < P; q++) {
    const char *t = uvccl_pg_peer_transport(&pg, q);
    const char *want = q == R ? "self"
                       : tcp_rank(R) || tcp_rank(q) ? "tcp" : "shm";
    if (strcmp(t, want) != 0) {
      if (bad++ == 0)
        snprintf(first, sizeof(first), "rank %d: %s, expected %s", q, t, want);
    }
  }
  rep(bad == 0, "transport", "%d peers as expected%s%s", P - 1 - bad,
      bad ? "; " : "", first);
}

/* g: the library's log, read for its single-copy lines (the rest goes
 * to stderr as it would, warnings and errors only). */
static int cma_from[MAXP];

/* h: the decisions of UVCCL_SHM_CMA=auto, and what they said */
static int auto_lines;
static char auto_line[512];

static void cma_sink(uvccl_log_level_t level, const char *component,
                     const char *line, void *arg) {
  const char *m = strstr(line, "first single-copy frame from rank ");
  (void)arg;
  (void)component;
  if (m != NULL) {
    int r = atoi(m + strlen("first single-copy frame from rank "));
    if (r >= 0 && r < MAXP) cma_from[r]++;
  }
  if ((m = strstr(line, "single copy o")) != NULL) {
    auto_lines++;
    snprintf(auto_line, sizeof(auto_line), "%s", m);
  }
  if (level <= UVCCL_LOG_WARN) fprintf(stderr, "%s\n", line);
}

/* h: the figures come from a thread of their own, some milliseconds after
 * the first large frame: 1 MiB allreduces until every rank has decided
 * (every rank runs as many: whether all have is itself agreed) */
static void await_cma_decisions(void) {
  size_t n = (1u << 20) / sizeof(float);
  float *a = calloc(n, sizeof(float));
  int32_t all = 0;
  int it;
  for (it = 0; !all && a != NULL && it < 2000; it++) {
    uvccl_work_t w = {0}, w2 = {0};
    cbres_t c = {0}, c2 = {0};
    int rc;
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, a, a, n, UVCCL_FLOAT32, UVCCL_SUM, on_work);
    if (wait_ok(&w, &c, rc) != 0) break;
    all = auto_lines > 0 || tcp_rank(R);
    w2.data = &c2;
    rc = uvccl_allreduce(&pg, &w2, &all, &all, 1, UVCCL_INT32, UVCCL_MIN,
                         on_work);
    if (wait_ok(&w2, &c2, rc) != 0) break;
  }
  free(a);
}

/* h: one decision, taken at the first large frame, and the one its own
 * figures call for: on exactly when the ratio reaches the bar, 0.8 of
 * memcpy's speed whether or not the ranks outnumber the CPUs (the line
 * still says which). */
static void check_cma_auto(void) {
  double cma = 0, cpy = 0, ratio = 0, need = 0;
  char state[8] = "";
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int over = ncpu > 0 && P > ncpu, n;
  if (tcp_rank(R)) {
    rep(auto_lines == 0, "cma_auto", "no shared-memory peer, %d decisions",
        auto_lines);
    return;
  }
  n = sscanf(auto_line, "single copy %7[a-z]: process_vm_readv copies %lf "
             "GB/s, memcpy %lf (ratio %lf; on from %lf", state, &cma, &cpy,
             &ratio, &need);
  /* the line gives the ratio to 2 decimals: at the bar itself (0.4992
   * prints as 0.50) either decision is the right one */
  rep(auto_lines == 1 && n == 5 && cma > 0 && cpy > 0 &&
          ((strcmp(state, "on") == 0) == (ratio >= need) ||
           (ratio - need < 0.0051 && need - ratio < 0.0051)) &&
          need == 0.8 &&
          (strstr(auto_line, over ? "more ranks than CPUs" : "a CPU a rank") !=
           NULL),
      "cma_auto", "%d decisions: %s", auto_lines, auto_line);
}

static void check_cma(void) {
  int q, want = 0, got = 0;
  char missing[64] = "";
  for (q = 0; q < P; q++) {
    if (q == R || tcp_rank(R) || tcp_rank(q)) continue;
    want++;
    if (cma_from[q] == 1) got++;
    else if (strlen(missing) < 40)
      snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
               " %d", q);
  }
  rep(got == want, "cma", "read frames from %d of %d shared-memory peers' "
      "memory%s%s", got, want, *missing ? "; not from" : "", missing);
}

static int role_sweep(void) {
  int q, rc, sparse = getenv("UVCCL_MESH_MAX") != NULL;
  const char *cmav = getenv("UVCCL_SHM_CMA");
  int cma = cmav != NULL && strcmp(cmav, "1") == 0, cma_auto = cmav == NULL;
  if (tcp_rank(R)) setenv("UVCCL_TRANSPORT", "tcp", 1);
  if (cma || cma_auto) {
    uvccl_log_set_sink(cma_sink, NULL);
    uvccl_log_set_level(cma ? UVCCL_LOG_DEBUG : UVCCL_LOG_INFO);
  }
  rank_init(30000);

  /* A full mesh is connected at creation; a sparse world (f) connects
   * when a peer is first needed, so the check waits for the barrier. */
  if (!sparse) check_transports();
  {
    int inbox = maps_count("memfd:uvccl-inbox"), devshm = maps_count("/dev/shm");
    rep(tcp_rank(R) ? inbox == 0 : inbox > 0, "memfd",
        "%d mappings of memfd:uvccl-inbox, %d of /dev/shm files", inbox, devshm);
  }

  /* allreduce float32 SUM, 2^20 elements (4 MiB: more than a ring) */
  {
    size_t n = 1u << 20, i, nb = 0;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    uvccl_work_t w = {0};
    cbres_t c = {0};
    for (i = 0; i < n; i++) a[i] = (float)((R + 1) * (int)(i % 7));
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, a, b, n, UVCCL_FLOAT32, UVCCL_SUM, on_work);
    rc = wait_ok(&w, &c, rc);
    for (i = 0; i < n && rc == 0; i++)
      if (b[i] != (float)(P * (P + 1) / 2 * (int)(i % 7))) nb++;
    rep(rc == 0 && nb == 0, "allreduce_4m", "%s %s, %zu wrong", ename(rc),
        w.msg, nb);
    free(a);
    free(b);
  }
  /* allreduce int64 MAX (33) and float64 AVG (70001, past small_max) */
  {
    int64_t m[33];
    double *d = malloc(70001 * sizeof(double));
    size_t i, nb = 0;
    uvccl_work_t w1 = {0}, w2 = {0};
    cbres_t c1 = {0}, c2 = {0};
    int rc1, rc2;
    for (i = 0; i < 33; i++) m[i] = (int64_t)((R * 13 + (int)i) % P) << 33;
    for (i = 0; i < 70001; i++) d[i] = (double)(R * 2 + (int)(i % 5));
    w1.data = &c1;
    w2.data = &c2;
    rc1 = uvccl_allreduce(&pg, &w1, m, m, 33, UVCCL_INT64, UVCCL_MAX, on_work);
    rc2 = uvccl_allreduce(&pg, &w2, d, d, 70001, UVCCL_FLOAT64, UVCCL_AVG,
                          on_work);
    rc1 = wait_ok(&w1, &c1, rc1);
    rc2 = wait_ok(&w2, &c2, rc2);
    for (i = 0; i < 33 && rc1 == 0; i++)
      if (m[i] != (int64_t)(P - 1) << 33) nb++;
    for (i = 0; i < 70001 && rc2 == 0; i++)
      if (d[i] != (double)(P - 1) + (double)(i % 5)) nb++;
    rep(rc1 == 0 && rc2 == 0 && nb == 0, "allreduce_ops",
        "MAX: %s %s; AVG: %s %s; %zu wrong", ename(rc1), w1.msg, ename(rc2),
        w2.msg, nb);
    free(d);
  }
  /* broadcast 3 MiB from the last rank; reduce SUM to rank 0 */
  {
    size_t n = 3u << 20, i, nb = 0;
    unsigned char *b = malloc(n);
    int32_t v[1000], got[1000];
    uvccl_work_t w1 = {0}, w2 = {0};
    cbres_t c1 = {0}, c2 = {0};
    int rc1, rc2;
    for (i = 0; i < n; i++) b[i] = R == P - 1 ? (unsigned char)(i * 7 + 3) : 0;
    for (i = 0; i < 1000; i++) v[i] = R + (int)i;
    w1.data = &c1;
    w2.data = &c2;
    rc1 = uvccl_broadcast(&pg, &w1, b, n, UVCCL_UINT8, P - 1, on_work);
    rc2 = uvccl_reduce(&pg, &w2, v, got, 1000, UVCCL_INT32, UVCCL_SUM, 0,
                       on_work);
    rc1 = wait_ok(&w1, &c1, rc1);
    rc2 = wait_ok(&w2, &c2, rc2);
    for (i = 0; i < n && rc1 == 0; i++)
      if (b[i] != (unsigned char)(i * 7 + 3)) nb++;
    for (i = 0; i < 1000 && rc2 == 0 && R == 0; i++)
      if (got[i] != P * (P - 1) / 2 + P * (int)i) nb++;
    rep(rc1 == 0 && rc2 == 0 && nb == 0, "bcast_reduce",
        "broadcast: %s %s; reduce: %s %s; %zu wrong", ename(rc1), w1.msg,
        ename(rc2), w2.msg, nb);
    free(b);
  }
  /* allgather int64 (100k per rank) */
  rep(rank_allgather_check(100000) == 0, "allgather",
      "allgather of 100000 int64 per rank");
  /* reduce_scatter float64 SUM, alltoall int32 */
  {
    size_t per = 150000, i, nb = 0;
    double *in = malloc(per * (size_t)P * sizeof(double)),
           *out = malloc(per * sizeof(double));
    int32_t *ta = malloc(4000 * (size_t)P * sizeof(int32_t)),
            *tb = malloc(4000 * (size_t)P * sizeof(int32_t));
    uvccl_work_t w1 = {0}, w2 = {0};
    cbres_t c1 = {0}, c2 = {0};
    int rc1, rc2;
    for (i = 0; i < per * (size_t)P; i++) in[i] = (double)(R + (int)(i % 11));
    for (i = 0; i < 4000 * (size_t)P; i++)
      ta[i] = R * 1000000 + (int)i;
    w1.data = &c1;
    w2.data = &c2;
    rc1 = uvccl_reduce_scatter(&pg, &w1, in, out, per, UVCCL_FLOAT64,
                               UVCCL_SUM, on_work);
    rc2 = uvccl_alltoall(&pg, &w2, ta, tb, 4000, UVCCL_INT32, on_work);
    rc1 = wait_ok(&w1, &c1, rc1);
    rc2 = wait_ok(&w2, &c2, rc2);
    for (i = 0; i < per && rc1 == 0; i++)
      if (out[i] != (double)(P * (P - 1) / 2 +
                             P * (int)((per * (size_t)R + i) % 11)))
        nb++;
    for (q = 0; q < P && rc2 == 0; q++)
      for (i = 0; i < 4000; i++)
        if (tb[(size_t)q * 4000 + i] != q * 1000000 + R * 4000 + (int)i) nb++;
    rep(rc1 == 0 && rc2 == 0 && nb == 0, "rs_alltoall",
        "reduce_scatter: %s %s; alltoall: %s %s; %zu wrong", ename(rc1),
        w1.msg, ename(rc2), w2.msg, nb);
    free(in);
    free(out);
    free(ta);
    free(tb);
  }
  /* gather to rank 1 and scatter from rank 0 (int32, 5000 per rank) */
  {
    size_t n = 5000, i, nb = 0;
    int root = P > 1 ? 1 : 0;
    int32_t *s = malloc(n * sizeof(int32_t)),
            *all = malloc(n * (size_t)P * sizeof(int32_t)),
            *mine = malloc(n * sizeof(int32_t));
    uvccl_work_t w1 = {0}, w2 = {0};
    cbres_t c1 = {0}, c2 = {0};
    int rc1, rc2;
    for (i = 0; i < n; i++) s[i] = R * 100000 + (int)i;
    w1.data = &c1;
    w2.data = &c2;
    rc1 = uvccl_gather(&pg, &w1, s, all, n, UVCCL_INT32, root, on_work);
    rc1 = wait_ok(&w1, &c1, rc1);
    for (q = 0; q < P && rc1 == 0 && R == root; q++)
      for (i = 0; i < n; i++)
        if (all[(size_t)q * n + i] != q * 100000 + (int)i) nb++;
    if (R == 0)
      for (i = 0; i < n * (size_t)P; i++) all[i] = (int)i * 3;
    rc2 = uvccl_scatter(&pg, &w2, all, mine, n, UVCCL_INT32, 0, on_work);
    rc2 = wait_ok(&w2, &c2, rc2);
    for (i = 0; i < n && rc2 == 0; i++)
      if (mine[i] != (int)(((size_t)R * n + i) * 3)) nb++;
    rep(rc1 == 0 && rc2 == 0 && nb == 0, "gather_scatter",
        "gather: %s %s; scatter: %s %s; %zu wrong", ename(rc1), w1.msg,
        ename(rc2), w2.msg, nb);
    free(s);
    free(all);
    free(mine);
  }
  /* point to point: a ring of 2.5 MiB sends (bigger than a ring), tag 7,
   * and a small one with tag 8 behind it */
  if (P > 1) {
    size_t n = (5u << 20) / 2, i, nb = 0;
    unsigned char *sb = malloc(n), *rb = malloc(n);
    int32_t small_s = R * 11, small_r = -1;
    uvccl_work_t ws = {0}, wr = {0}, ws2 = {0}, wr2 = {0};
    cbres_t cs = {0}, cr = {0}, cs2 = {0}, cr2 = {0};
    int rs, rr, rs2, rr2, next = (R + 1) % P, prev = (R + P - 1) % P;
    for (i = 0; i < n; i++) sb[i] = (unsigned char)(R * 31 + i);
    memset(rb, 0, n);
    ws.data = &cs;
    wr.data = &cr;
    ws2.data = &cs2;
    wr2.data = &cr2;
    rr2 = uvccl_recv(&pg, &wr2, &small_r, 4, prev, 8, on_work);
    rr = uvccl_recv(&pg, &wr, rb, n, prev, 7, on_work);
    rs = uvccl_send(&pg, &ws, sb, n, next, 7, on_work);
    rs2 = uvccl_send(&pg, &ws2, &small_s, 4, next, 8, on_work);
    rs = wait_ok(&ws, &cs, rs);
    rr = wait_ok(&wr, &cr, rr);
    rs2 = wait_ok(&ws2, &cs2, rs2);
    rr2 = wait_ok(&wr2, &cr2, rr2);
    for (i = 0; i < n && rr == 0; i++)
      if (rb[i] != (unsigned char)(prev * 31 + i)) nb++;
    rep(rs == 0 && rr == 0 && rs2 == 0 && rr2 == 0 && nb == 0 &&
            small_r == prev * 11,
        "p2p", "send %s, recv %s %s, small %s/%s = %d; %zu wrong", ename(rs),
        ename(rr), wr.msg, ename(rs2), ename(rr2), small_r, nb);
    free(sb);
    free(rb);
  }
  /* alltoall needed every peer; no rank leaves before the barrier */
  if (sparse) check_transports();
  {
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = uvccl_barrier(&pg, &w, on_work);
    rc = wait_ok(&w, &c, rc);
    rep(rc == 0, "barrier", "%s %s", ename(rc), w.msg);
  }
  if (cma) check_cma();
  if (cma_auto) {
    await_cma_decisions();
    check_cma_auto();
  }
  return rank_destroy();
}

/* e) many small collectives back to back, default mode: a lost wake-up
 * or an unread ring shows as a work that does not finish */
static int role_stress(void) {
  enum { PER = 16384 / 8 };
  int it, rc = 0, stuck = -1;
  double t0;
  const char *what = "";
  int64_t *g = malloc(sizeof(int64_t) * PER * (size_t)P);
  int64_t *mine = malloc(sizeof(int64_t) * PER);
  rank_init(30000);
  t0 = now_s();
  for (it = 0; it < 3000 && rc == 0; it++) {
    float v[16];
    uvccl_work_t w = {0};
    cbres_t c = {0};
    size_t i;
    w.data = &c;
    switch (it % 3) {
    case 0:
      what = "barrier";
      rc = uvccl_barrier(&pg, &w, on_work);
      break;
    case 1:
      what = "allreduce";
      for (i = 0; i < 16; i++) v[i] = (float)(R + 1);
      rc = uvccl_allreduce(&pg, &w, v, v, 16, UVCCL_FLOAT32, UVCCL_SUM,
                           on_work);
      break;
    default:
      what = "allgather";
      for (i = 0; i < PER; i++) mine[i] = R * 100000 + it;
      rc = uvccl_allgather(&pg, &w, mine, g, PER, UVCCL_INT64, on_work);
      break;
    }
    rc = finish_work(&c, rc, 5000);
    if (rc != 0) stuck = it;
    else if (it % 3 == 1 && v[15] != (float)(P * (P + 1) / 2)) rc = -1;
    else if (it % 3 == 2 && g[(size_t)(P - 1) * PER + PER - 1] !=
                                (P - 1) * 100000 + it)
      rc = -1;
  }
  rep(rc == 0, "stress", "%d collectives in %.2f s; %s%s (%s)", it,
      now_s() - t0, stuck >= 0 ? "stuck at " : "last ", what, ename(rc));
  free(g);
  free(mine);
  return rank_destroy();
}

/* i: boxes */
static uint16_t to_bf16(float f) { /* round to nearest even (no NaNs here) */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float box_in(int r, size_t i) {
  return 0.1f * (float)(r + 1) + 1e-3f * (float)i + 1e-7f * (float)(r * r);
}

static int wait_all(cbres_t *c, int *rc, int n) {
  int k, bad = 0;
  for (k = 0; k < n; k++) {
    int x = finish_work(&c[k], rc[k], 20000);
    if (x != 0) bad = x;
  }
  return bad;
}

static int role_boxes(void) {
  const char *want = getenv("UVCCL_T_BOXES");
  int boxes = want != NULL && strcmp(want, "1") == 0;
  static const size_t sizes[4] = {1, 7, 256, 257};
  float in[257], out[257], fold[257], all[257 * MAXP];
  int k, r, rc = 0, bits = 1, same = 1, other = 1, burst = 1;
  size_t i;
  rank_init(30000);
  for (k = 0; k < 4 && rc == 0; k++) {
    size_t n = sizes[k];
    uvccl_work_t w = {0};
    cbres_t c = {0};
    for (i = 0; i < n; i++) {
      in[i] = box_in(R, i);
      fold[i] = box_in(0, i);
      for (r = 1; r < P; r++) fold[i] += box_in(r, i);
    }
    w.data = &c;
    /* in place for odd k */
    if (k % 2) memcpy(out, in, n * sizeof(float));
    rc = finish_work(&c, uvccl_allreduce(&pg, &w, k % 2 ? out : in, out, n,
                                         UVCCL_FLOAT32, UVCCL_SUM, on_work),
                     20000);
    for (i = 0; i < n && rc == 0; i++) {
      if (n <= 256 && boxes && memcmp(&out[i], &fold[i], 4) != 0) bits = 0;
      if (out[i] - fold[i] > 1e-5f || fold[i] - out[i] > 1e-5f) bits = 0;
    }
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    if (rc == 0)
      rc = finish_work(&c, uvccl_allgather(&pg, &w, out, all, n, UVCCL_INT32,
                                           on_work), 20000);
    for (r = 1; r < P && rc == 0; r++)
      if (memcmp(all, all + (size_t)r * n, n * 4) != 0) same = 0;
  }
  rep(rc == 0 && bits && same, "box_f32",
      "float32 SUM of 1, 7, 256, 257: %s%s (%s)",
      bits ? (boxes ? "the rank-order fold, bitwise, to 256" : "within 1e-5")
           : "WRONG",
      same ? "; the same bits on every rank" : "; DIFFERENT bits", ename(rc));
  {
    /* other types and reductions, 5 elements, in place */
    int32_t a32[5];
    int64_t mx[5], mn[5];
    double avg[5];
    uint16_t bf[5];
    uvccl_work_t w[5];
    cbres_t c[5];
    int rcs[5];
    memset(w, 0, sizeof(w));
    memset(c, 0, sizeof(c));
    for (i = 0; i < 5; i++) {
      a32[i] = R * 1000 + (int32_t)i;
      mx[i] = mn[i] = (int64_t)((R * 7919 + (int)i * 31) % 101) - 50;
      avg[i] = (double)(R + 1) * 0.5 + (double)i;
      /* 1, 1.5 or 2: a product of 8 still fits a float32 exactly */
      bf[i] = to_bf16(1.0f + 0.5f * (float)((R + (int)i) % 3));
    }
    for (k = 0; k < 5; k++) w[k].data = &c[k];
    rcs[0] = uvccl_allreduce(&pg, &w[0], a32, a32, 5, UVCCL_INT32, UVCCL_SUM,
                             on_work);
    rcs[1] = uvccl_allreduce(&pg, &w[1], mx, mx, 5, UVCCL_INT64, UVCCL_MAX,
                             on_work);
    rcs[2] = uvccl_allreduce(&pg, &w[2], mn, mn, 5, UVCCL_INT64, UVCCL_MIN,
                             on_work);
    rcs[3] = uvccl_allreduce(&pg, &w[3], avg, avg, 5, UVCCL_FLOAT64,
                             UVCCL_AVG, on_work);
    rcs[4] = uvccl_allreduce(&pg, &w[4], bf, bf, 5, UVCCL_BFLOAT16,
                             UVCCL_PRODUCT, on_work);
    rc = wait_all(c, rcs, 5);
    for (i = 0; i < 5 && rc == 0; i++) {
      int64_t s32 = 0, emx = -1000, emn = 1000;
      double eavg = 0, eprod = 1;
      for (r = 0; r < P; r++) {
        int64_t v = (int64_t)((r * 7919 + (int)i * 31) % 101) - 50;
        s32 += r * 1000 + (int64_t)i;
        if (v > emx) emx = v;
        if (v < emn) emn = v;
        eavg += (double)(r + 1) * 0.5 + (double)i;
        eprod *= 1.0 + 0.5 * (double)((r + (int)i) % 3);
      }
      if (a32[i] != s32 || mx[i] != emx || mn[i] != emn ||
          avg[i] - eavg / P > 1e-12 || eavg / P - avg[i] > 1e-12 ||
          bf[i] != to_bf16((float)eprod))
        other = 0;
    }
    rep(rc == 0 && other, "box_types", "int32 SUM, int64 MAX and MIN, "
        "float64 AVG (within 1e-12), bfloat16 PRODUCT: %s (%s)", other ? "exact" : "WRONG",
        ename(rc));
  }
  {
    /* broadcast (every root, in place), allgather (out of place and in
     * place), reduce_scatter (int32 SUM; float32 SUM: the rank-order fold
     * bitwise where boxes carry it) and alltoall, at 1, 7, 256 int32 per
     * part (256: the most a box holds) and 257 (messages again) */
    static int32_t a[257 * MAXP], b[257 * MAXP];
    static float fa[257 * MAXP], fb[257];
    int kinds = 1, bad_step = -1;
    for (k = 0; k < 4 && rc == 0; k++) {
      size_t n = sizes[k], j;
      int root;
      for (root = 0; root < P && rc == 0; root++) {
        uvccl_work_t w = {0};
        cbres_t c = {0};
        w.data = &c;
        for (i = 0; i < n; i++) a[i] = R == root ? root * 1000 + (int)i : -1;
        rc = finish_work(&c, uvccl_broadcast(&pg, &w, a, n, UVCCL_INT32, root,
                                             on_work), 20000);
        for (i = 0; i < n && rc == 0; i++)
          if (a[i] != root * 1000 + (int)i) kinds = 0, bad_step = bad_step < 0 ? 0 : bad_step;
      }
      for (j = 0; j < 2 && rc == 0; j++) {
        uvccl_work_t w = {0};
        cbres_t c = {0};
        int32_t *src = j ? b + (size_t)R * n : a;
        w.data = &c;
        memset(b, 0xff, sizeof(b));
        for (i = 0; i < n; i++) src[i] = R * 1000 + (int)i;
        rc = finish_work(&c, uvccl_allgather(&pg, &w, src, b, n, UVCCL_INT32,
                                             on_work), 20000);
        for (r = 0; r < P && rc == 0; r++)
          for (i = 0; i < n; i++)
            if (b[(size_t)r * n + i] != r * 1000 + (int)i)
              kinds = 0, bad_step = bad_step < 0 ? 1 : bad_step;
      }
      if (rc == 0) {
        uvccl_work_t w = {0};
        cbres_t c = {0};
        w.data = &c;
        for (j = 0; j < (size_t)P * n; j++) a[j] = R * 100000 + (int)j;
        rc = finish_work(&c, uvccl_reduce_scatter(&pg, &w, a, b, n,
                                                  UVCCL_INT32, UVCCL_SUM,
                                                  on_work), 20000);
        for (i = 0; i < n && rc == 0; i++) {
          int32_t e = 0;
          for (r = 0; r < P; r++) e += r * 100000 + (int)((size_t)R * n + i);
          if (b[i] != e) kinds = 0, bad_step = bad_step < 0 ? 2 : bad_step;
        }
      }
      if (rc == 0) {
        uvccl_work_t w = {0};
        cbres_t c = {0};
        w.data = &c;
        for (j = 0; j < (size_t)P * n; j++) fa[j] = box_in(R, j);
        rc = finish_work(&c, uvccl_reduce_scatter(&pg, &w, fa, fb, n,
                                                  UVCCL_FLOAT32, UVCCL_SUM,
                                                  on_work), 20000);
        for (i = 0; i < n && rc == 0; i++) {
          size_t at = (size_t)R * n + i;
          float e = box_in(0, at);
          for (r = 1; r < P; r++) e += box_in(r, at);
          if (n <= 256 && boxes && memcmp(&fb[i], &e, 4) != 0)
            kinds = 0, bad_step = bad_step < 0 ? 3 : bad_step;
          if (fb[i] - e > 1e-4f || e - fb[i] > 1e-4f) kinds = 0, bad_step = bad_step < 0 ? 3 : bad_step;
        }
      }
      if (rc == 0) {
        uvccl_work_t w = {0};
        cbres_t c = {0};
        w.data = &c;
        for (r = 0; r < P; r++)
          for (i = 0; i < n; i++)
            a[(size_t)r * n + i] = R * 10000 + r * 100 + (int)i;
        rc = finish_work(&c, uvccl_alltoall(&pg, &w, a, b, n, UVCCL_INT32,
                                            on_work), 20000);
        for (r = 0; r < P && rc == 0; r++)
          for (i = 0; i < n; i++)
            if (b[(size_t)r * n + i] != r * 10000 + R * 100 + (int)i)
              kinds = 0, bad_step = bad_step < 0 ? 4 : bad_step;
      }
    }
    /* (a wrong result stops nothing: every rank runs the same sequence) */
    rep(rc == 0 && kinds, "box_kinds", "broadcast from every root, "
        "allgather (in place too), reduce_scatter (int32; float32 %s), "
        "alltoall of 1, 7, 256, 257 int32: %s%s (%s)",
        boxes ? "the rank-order fold, bitwise, to 256" : "within 1e-4",
        kinds ? "exact" : "WRONG at ",
        kinds ? "" : (const char *[]){"broadcast", "allgather",
                                      "reduce_scatter int32",
                                      "reduce_scatter float32",
                                      "alltoall"}[bad_step < 0 ? 0 : bad_step],
        ename(rc));
  }
  {
    /* 64 started before any is waited for */
    enum { B = 64 };
    static int32_t v[B][300];
    static int32_t cb1[3], cb2[4];
    uvccl_buf_t bufs[2] = {{(char *)cb1, sizeof(cb1)}, {(char *)cb2,
                                                        sizeof(cb2)}};
    uvccl_work_t w[B];
    cbres_t c[B];
    int rcs[B];
    memset(w, 0, sizeof(w));
    memset(c, 0, sizeof(c));
    for (i = 0; i < 3; i++) cb1[i] = R + 1;
    for (i = 0; i < 4; i++) cb2[i] = 10 * (R + 1);
    for (k = 0; k < B; k++) {
      size_t n = (size_t)(1 + (k * 37) % 300), j;
      w[k].data = &c[k];
      for (j = 0; j < n; j++) v[k][j] = R + k + (int)j;
      if (k % 9 == 4)
        rcs[k] = uvccl_barrier(&pg, &w[k], on_work);
      else if (k % 9 == 7)
        rcs[k] = uvccl_broadcast(&pg, &w[k], v[k], n, UVCCL_INT32, k % P,
                                 on_work);
      else if (k == 33)
        rcs[k] = uvccl_allreduce_coalesced(&pg, &w[k], bufs, 2, UVCCL_INT32,
                                           UVCCL_SUM, on_work);
      else
        rcs[k] = uvccl_allreduce(&pg, &w[k], v[k], v[k], n, UVCCL_INT32,
                                 UVCCL_SUM, on_work);
    }
    rc = wait_all(c, rcs, B);
    for (k = 0; k < B && rc == 0; k++) {
      size_t n = (size_t)(1 + (k * 37) % 300), j;
      if (k % 9 == 4 || k == 33) continue;
      for (j = 0; j < n; j++)
        if (v[k][j] != (k % 9 == 7 ? k % P + k + (int)j
                                   : P * (k + (int)j) + P * (P - 1) / 2))
          burst = 0;
    }
    for (i = 0; i < 3; i++)
      if (cb1[i] != P * (P + 1) / 2) burst = 0;
    for (i = 0; i < 4; i++)
      if (cb2[i] != 10 * P * (P + 1) / 2) burst = 0;
    rep(rc == 0 && burst, "box_burst", "64 collectives started at once "
        "(allreduces of 4 B to 1.2 KiB, broadcasts, barriers, a coalesced "
        "one): %s (%s)",
        burst ? "exact" : "WRONG", ename(rc));
  }
  if (boxes) {
    /* the last rank calls an allgather where the others allreduce, both
     * 4 B: parts matched by number only would reduce the allgather's in */
    int32_t x = R + 1, y[MAXP];
    uvccl_work_t w = {0};
    cbres_t c = {0};
    w.data = &c;
    rc = finish_work(&c, R == P - 1
                             ? uvccl_allgather(&pg, &w, &x, y, 1, UVCCL_INT32,
                                               on_work)
                             : uvccl_allreduce(&pg, &w, &x, &x, 1, UVCCL_INT32,
                                               UVCCL_SUM, on_work),
                     20000);
    /* each rank says so itself, or relays the first that did */
    rep(rc == UVCCL_EMISMATCH && strstr(w.msg, "box collective") != NULL,
        "box_mismatch", "an allgather against allreduces of 4 B: %s (%s)",
        ename(rc), w.msg);
  }
  return rank_destroy();
}

static int rank_main(const char *role) {
  const char *r = getenv("RANK"), *s = getenv("WORLD_SIZE");
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, SIG_DFL);
  alarm(60);
  unsetenv("UVCCL_SOCKET_IFNAME");
  R = r ? atoi(r) : -1;
  P = s ? atoi(s) : 0;
  if (strcmp(role, "sweep") == 0) return role_sweep();
  if (strcmp(role, "stress") == 0) return role_stress();
  if (strcmp(role, "boxes") == 0) return role_boxes();
  fprintf(stderr, "unknown role %s\n", role);
  return 2;
}

/* ---- parent side -------------------------------------------------------------- */

static int devshm_entries(void) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  int n = 0;
  if (d == NULL) return 0;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* cma: 0 rings only, 1 single copy from 4 KiB, 2 auto (the default) */
static void scenario_sweep(int n, const char *tcp_ranks, int sparse, int cma) {
  proc_t p;
  char tool[4096], nstr[8], tag[64];
  char *argv[] = {tool, "-n", nstr, "--", self, NULL};
  static char e_tcp[64];
  /* cma: 0 off, 1 on, 2 auto; 3 off with the helper thread on (j); 4
   * off, every output written with non-temporal stores (k), 5 the same
   * with the helper on */
  const char *env[] = {"UVCCL_T_ROLE=sweep", e_tcp,
                       "UVCCL_SMALL_TREE=1",
                       cma == 1 ? "UVCCL_SHM_CMA=1"
                       : cma == 2 ? "UVCCL_T_NONE="
                                  : "UVCCL_SHM_CMA=0",
                       cma == 1 ? "UVCCL_SHM_CMA_MIN=4096"
                       : cma == 3 || cma == 5 ? "UVCCL_SHM_HELPER=1"
                                              : "UVCCL_T_NONE=",
                       cma == 3 ? "UVCCL_LOG=info" : "UVCCL_T_NONE=",
                       cma >= 4 ? "UVCCL_STREAM_MIN=1" : "UVCCL_T_NONE=",
                       sparse ? "UVCCL_MESH_MAX=0" : NULL, NULL};
  unsigned all = (1u << n) - 1;
  double t0 = now_s();
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(nstr, sizeof(nstr), "%d", n);
  snprintf(e_tcp, sizeof(e_tcp), "UVCCL_T_TCP_RANKS=%s",
           tcp_ranks ? tcp_ranks : "");
  snprintf(tag, sizeof(tag), "%s%s W=%d",
           cma == 1   ? "g: single copy, "
           : cma == 2 ? "h: single copy auto, "
           : cma == 3 ? "j: helper thread, "
           : cma == 4 ? "k: streaming stores, "
           : cma == 5 ? "k: streaming stores and the helper, "
                      : "",
           sparse ? "f: sparse" : tcp_ranks ? "b: mixed" : "a:", n);
  scenario_failed = 0;
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "%s uvccl-run starts", tag);
    return;
  }
  finish_all(&p, 1, 90);
  note("%s in %.2f s", tag, now_s() - t0);
  agg(&p, 1, "transport", all,
      tcp_ranks ? "%s: pairs without rank %s through shm, the others through "
                  "tcp"
                : "%s: every pair of ranks through shm",
      tag, tcp_ranks ? tcp_ranks : "");
  agg(&p, 1, "memfd", all, "%s: inboxes are anonymous memfds", tag);
  agg(&p, 1, "allreduce_4m", all, "%s: allreduce float32 SUM, 4 MiB, exact",
      tag);
  agg(&p, 1, "allreduce_ops", all,
      "%s: allreduce int64 MAX and float64 AVG (70001), exact", tag);
  agg(&p, 1, "bcast_reduce", all,
      "%s: broadcast 3 MiB from the last rank, reduce to rank 0, exact", tag);
  agg(&p, 1, "allgather", all, "%s: allgather int64, exact", tag);
  agg(&p, 1, "rs_alltoall", all, "%s: reduce_scatter float64, alltoall int32",
      tag);
  agg(&p, 1, "gather_scatter", all, "%s: gather and scatter int32, exact", tag);
  agg(&p, 1, "p2p", all,
      "%s: a ring of 2.5 MiB sends and small ones behind them", tag);
  agg(&p, 1, "barrier", all, "%s: barrier", tag);
  agg(&p, 1, "destroy", all, "%s: destroy completes in every rank", tag);
  if (cma == 2)
    agg(&p, 1, "cma_auto", all, "%s: one decision a rank, as its own figures "
        "call for", tag);
  if (cma == 1)
    agg(&p, 1, "cma", all, "%s: every rank read a frame from each "
        "shared-memory peer's memory", tag);
  if (cma == 3) {
    /* the ranks on shared memory (a TCP-only rank moves nothing there) */
    int r, said = 0, want = 0;
    for (r = 0; r < n; r++) {
      char line[80];
      snprintf(line, sizeof(line), "rank %d: a helper thread takes half", r);
      if (strstr(p.ebuf, line) != NULL) said++;
      if (!tcp_rank_in(tcp_ranks, r)) want++;
    }
    if (!ok(said == want, "%s: %d of the %d ranks on shared memory run the "
            "helper", tag, said, want))
      scenario_failed = 1;
  }
  if (!is_int(p.status, 0, "%s: every rank exits 0", tag)) scenario_failed = 1;
  if (!ok(strcasestr(p.ebuf, "warn") == NULL &&
              strcasestr(p.ebuf, "error") == NULL,
          "%s: no warning or error on any rank's stderr", tag))
    scenario_failed = 1;
  if (scenario_failed) dump_procs(&p, 1);
  procs_free(&p, 1);
}

static void scenario_stress(int n) {
  proc_t p;
  char tool[4096], nstr[8];
  char *argv[] = {tool, "-n", nstr, "--", self, NULL};
  const char *env[] = {"UVCCL_T_ROLE=stress", NULL};
  double t0 = now_s();
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(nstr, sizeof(nstr), "%d", n);
  scenario_failed = 0;
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "e: uvccl-run starts");
    return;
  }
  finish_all(&p, 1, 60);
  note("e: W=%d stress in %.2f s", n, now_s() - t0);
  agg(&p, 1, "stress", (1u << n) - 1, "e: W=%d: 3000 barriers, small allreduces "
      "and 16 KiB allgathers back to back, each done within 5 s, exact", n);
  if (!is_int(p.status, 0, "e: W=%d: every rank exits 0", n))
    scenario_failed = 1;
  if (scenario_failed) dump_procs(&p, 1);
  procs_free(&p, 1);
}

/* i: boxes at n ranks; off_rank >= 0 says UVCCL_SHM_BOXES=0 there */
static void scenario_boxes(int n, int off_rank) {
  proc_t p;
  char tool[4096], nstr[8], tag[64];
  char *argv[] = {tool, "-n", nstr, "--", "/bin/sh", "-c",
                  "[ \"$RANK\" = \"$UVCCL_T_OFF\" ] && "
                  "export UVCCL_SHM_BOXES=0; exec \"$0\"", self, NULL};
  static char e_off[32], e_want[32];
  const char *env[] = {"UVCCL_T_ROLE=boxes", "UVCCL_LOG=info", e_off, e_want,
                       "UVCCL_SHM_CMA=0", NULL};
  unsigned all = (1u << n) - 1;
  int r, said = 0;
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-run", UVCCL_BUILD_DIR);
  snprintf(nstr, sizeof(nstr), "%d", n);
  snprintf(e_off, sizeof(e_off), "UVCCL_T_OFF=%d", off_rank);
  snprintf(e_want, sizeof(e_want), "UVCCL_T_BOXES=%d", off_rank < 0);
  snprintf(tag, sizeof(tag), "i: W=%d%s", n,
           off_rank >= 0 ? ", one rank without boxes" : "");
  scenario_failed = 0;
  if (spawn(&p, "uvccl-run", argv, env, 0) != 0) {
    ok(0, "%s uvccl-run starts", tag);
    return;
  }
  finish_all(&p, 1, 90);
  for (r = 0; r < n; r++) {
    char line[96];
    snprintf(line, sizeof(line), "rank %d: small collectives and barriers of "
             "%d ranks through shared-memory boxes", r, n);
    if (strstr(p.ebuf, line) != NULL) said++;
  }
  if (!ok(said == (off_rank < 0 ? n : 0), "%s: %d of %d ranks take boxes "
          "(%s)", tag, said, n, off_rank < 0 ? "all" : "none: they agree"))
    scenario_failed = 1;
  agg(&p, 1, "box_f32", all, "%s: float32 SUM, exact as said, the same bits "
      "everywhere", tag);
  agg(&p, 1, "box_types", all, "%s: int32, int64, float64 AVG, bfloat16 "
      "PRODUCT, exact", tag);
  agg(&p, 1, "box_kinds", all, "%s: broadcast, allgather, reduce_scatter, "
      "alltoall, exact", tag);
  agg(&p, 1, "box_burst", all, "%s: 64 collectives started at once, exact",
      tag);
  if (off_rank < 0)
    agg(&p, 1, "box_mismatch", all, "%s: an allgather against the others' "
        "allreduces fails every rank with UVCCL_EMISMATCH", tag);
  agg(&p, 1, "destroy", all, "%s: destroy completes in every rank", tag);
  if (!is_int(p.status, 0, "%s: every rank exits 0", tag)) scenario_failed = 1;
  if (scenario_failed) dump_procs(&p, 1);
  procs_free(&p, 1);
}

int main(int argc, char **argv) {
  const char *role = getenv("UVCCL_T_ROLE");
  const char *only = getenv("UVCCL_T_ONLY");
  int shm0;
  double t0 = now_s();
  (void)argc;
  (void)argv;
  if (role != NULL && *role) return rank_main(role);
  parent_init(400);
  signal(SIGPIPE, SIG_IGN);
  if (only != NULL && *only == '\0') only = NULL;
  unsetenv("UVCCL_TRANSPORT");
  shm0 = devshm_entries();
  if (!only || strchr(only, 'a')) {
    scenario_sweep(2, NULL, 0, 0);
    scenario_sweep(3, NULL, 0, 0);
    scenario_sweep(4, NULL, 0, 0);
    scenario_sweep(8, NULL, 0, 0);
  }
  if (!only || strchr(only, 'b')) scenario_sweep(4, "2,3", 0, 0);
  if (!only || strchr(only, 'f')) {
    /* sparse worlds: lazy connections, the monitors' overlay */
    scenario_sweep(2, NULL, 1, 0);
    scenario_sweep(3, NULL, 1, 0);
    scenario_sweep(8, NULL, 1, 0);
    scenario_sweep(5, "1,4", 1, 0);
  }
  if (!only || strchr(only, 'g')) {
    scenario_sweep(2, NULL, 0, 1);
    scenario_sweep(3, NULL, 0, 1);
    scenario_sweep(4, NULL, 0, 1);
    scenario_sweep(4, "2,3", 0, 1);
  }
  if (!only || strchr(only, 'h')) {
    scenario_sweep(2, NULL, 0, 2);
    scenario_sweep(4, NULL, 0, 2);
  }
  if (!only || strchr(only, 'j')) {
    scenario_sweep(2, NULL, 0, 3);
    scenario_sweep(4, "3", 0, 3);
  }
  if (!only || strchr(only, 'k')) {
    scenario_sweep(3, NULL, 0, 4);
    scenario_sweep(4, "3", 0, 5);
  }
  if (!only || strchr(only, 'i')) {
    scenario_boxes(2, -1);
    scenario_boxes(3, -1);
    scenario_boxes(4, -1);
    scenario_boxes(8, -1);
    scenario_boxes(4, 2);
  }
  if (!only || strchr(only, 'e')) {
    scenario_stress(2);
    scenario_stress(3);
  }
  if (!only || strchr(only, 'd'))
    is_int(devshm_entries(), shm0, "d: /dev/shm holds as many entries as "
                                   "before (no segment left behind)");
  note("total %.2f s", now_s() - t0);
  return done_testing();
}
