/* NCCL process groups of several ranks, against the fake CUDA runtime and
 * the fake NCCL (t/fake/): N ranks (2, then 3) in this process on one
 * loop, rank r on fake device r (so each has its own device thread), one
 * NCCL group per rank over one hash store. Every collective and p2p
 * operation with exact values read back from every rank's "device"
 * memory, many queued ops completing in order exactly once, subgroups
 * (new_group with a non-member, split by color and key), a collective
 * that one rank never joins (timeout counted from GPU start, then abort
 * of every group returns promptly), a split and a creation that one rank
 * never joins (abort; no communicator left behind), and destroy with
 * nothing pending. */
#include "tap.h"
#include "uvccl.h"
#include "gpu.h"

#include <dlfcn.h>
#include <time.h>

#define FAKE_CUDART UVCCL_BUILD_DIR "/fake/libcudart.so.13"
#define FAKE_NCCL UVCCL_BUILD_DIR "/fake/libnccl.so.2"
#define MAXR 3

static uv_loop_t loop_s, *loop = &loop_s;
static uvccl_store_t store;
static uvccl_pg_t pgs[MAXR];
static int nr; /* ranks of the current world */
static int (*f_live_comms)(void);


static void run_for(uint64_t ms) { run_loop_for(loop, ms); }

/* n bytes of "device" memory on rank r's device */
static void *dev(int r, size_t n) { return dev_on(r, n); }

/* int32 helpers: fill with f(r, i), compare with g(r, i) */
static void *dev_i32(int r, size_t n, int32_t (*f)(int r, size_t i)) {
  int32_t h[512];
  size_t i;
  void *d = dev(r, n * 4);
  if (n > 512) n = 512; /* (callers stay below) */
  for (i = 0; i < n; i++) h[i] = f ? f(r, i) : -777;
  put(d, h, n * 4);
  return d;
}
static int check_i32(const void *d, size_t n, int r,
                     int32_t (*want)(int r, size_t i), const char *what) {
  int32_t h[512];
  size_t i;
  if (n > 512) n = 512;
  get(h, d, n * 4);
  for (i = 0; i < n; i++)
    if (h[i] != want(r, i)) {
      note("%s: rank %d [%zu] = %d, want %d", what, r, i, (int)h[i],
           (int)want(r, i));
      return 0;
    }
  return 1;
}

/* every rank's work must end with want; 1 if they all did */
static int wait_all(uvccl_work_t *w, int n, int want, const char *what) {
  int r, good = 1, rc;
  for (r = 0; r < n; r++) {
    rc = uvccl_work_wait(&w[r]);
    if (rc != want) {
      note("%s: rank %d: %d (%s), want %d", what, r, rc, w[r].msg, want);
      good = 0;
    }
  }
  return good;
}

static int closed;
static void on_closed(uvccl_pg_t *g) {
  (void)g;
  closed++;
}
static void destroy_groups(uvccl_pg_t *g, int n) {
  int r, before = closed, want = 0;
  for (r = 0; r < n; r++)
    if (g[r].impl_ != NULL) {
      uvccl_pg_destroy(&g[r], on_closed);
      want++;
    }
  while (closed < before + want) uv_run(loop, UV_RUN_ONCE);
}

static int make_world(int n, const char *prefix) {
  uvccl_work_t w[MAXR];
  int r, good;
  nr = n;
  good = nccl_ranks_start(loop, &store, pgs, w, n, prefix, NULL);
  good &= wait_all(w, n, 0, "pg_init");
  for (r = 0; r < n; r++)
    good &= pgs[r].rank == r && pgs[r].size == n;
  return good;
}

/* ---- values ----------------------------------------------------------- */

static int32_t v_rank_i(int r, size_t i) { return (int32_t)((r + 1) * (i + 1)); }
static int32_t v_tri(int r, size_t i) { /* sum over ranks of v_rank_i */
  (void)r;
  return (int32_t)((i + 1) * nr * (nr + 1) / 2);
}
static int32_t v_mix(int r, size_t i) {
  return (int32_t)(((int)i + r) % nr * 10 - (int)i);
}
static int32_t v_mix_max(int r, size_t i) {
  (void)r;
  return (int32_t)((nr - 1) * 10 - (int)i);
}
static int32_t v_root_data(int r, size_t i) {
  return r == nr - 1 ? (int32_t)(i * 7 + 3) : -1;
}
static int32_t v_bcast(int r, size_t i) {
  (void)r;
  return (int32_t)(i * 7 + 3);
}
static int32_t v_block(int r, size_t i) { return (int32_t)(r * 100 + i); }

/* ---- tests --------------------------------------------------------------- */

#define C 5

static void test_allreduce(void) {
  uvccl_work_t w[MAXR];
  void *in[MAXR], *out[MAXR];
  uvccl_redop_t pre[MAXR];
  int r, good;
  memset(w, 0, sizeof(w));
  for (r = 0; r < nr; r++) {
    in[r] = dev_i32(r, C, v_rank_i);
    out[r] = dev_i32(r, C, NULL);
    uvccl_allreduce(&pgs[r], &w[r], in[r], out[r], C, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  }
  good = wait_all(w, nr, 0, "allreduce sum");
  for (r = 0; r < nr; r++) good &= check_i32(out[r], C, r, v_tri, "sum");
  ok(good, "%d ranks: allreduce SUM int32", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(in[r]);
    in[r] = dev_i32(r, C, v_mix);
    uvccl_allreduce(&pgs[r], &w[r], in[r], in[r], C, UVCCL_INT32, UVCCL_MAX,
                    NULL);
  }
  good = wait_all(w, nr, 0, "allreduce max");
  for (r = 0; r < nr; r++) good &= check_i32(in[r], C, r, v_mix_max, "max");
  ok(good, "%d ranks: allreduce MAX int32 in place", nr);
  /* floats: AVG, and PREMUL_SUM with a factor per rank */
  for (r = 0; r < nr; r++) {
    float h[C];
    size_t i;
    for (i = 0; i < C; i++) h[i] = (float)((r + 1) * (i + 1));
    put(in[r], h, sizeof(h));
    uvccl_allreduce(&pgs[r], &w[r], in[r], out[r], C, UVCCL_FLOAT32,
                    UVCCL_AVG, NULL);
  }
  good = wait_all(w, nr, 0, "allreduce avg");
  for (r = 0; r < nr; r++) {
    float h[C];
    size_t i;
    get(h, out[r], sizeof(h));
    for (i = 0; i < C; i++)
      if (h[i] != (float)(i + 1) * (float)(nr + 1) / 2.0f) {
        note("avg: rank %d [%zu] = %g", r, i, h[i]);
        good = 0;
      }
  }
  ok(good, "%d ranks: allreduce AVG float32", nr);
  for (r = 0; r < nr; r++) {
    is_int(uvccl_pg_premul_sum(&pgs[r], 0.5 * (r + 1), &pre[r]), 0,
           "rank %d: premul_sum op (factor %.1f)", r, 0.5 * (r + 1));
    uvccl_allreduce(&pgs[r], &w[r], in[r], out[r], C, UVCCL_FLOAT32, pre[r],
                    NULL);
  }
  good = wait_all(w, nr, 0, "premul");
  for (r = 0; r < nr; r++) {
    float h[C], want;
    size_t i;
    int q;
    get(h, out[r], sizeof(h));
    for (i = 0; i < C; i++) {
      for (want = 0, q = 0; q < nr; q++)
        want += 0.5f * (q + 1) * (float)((q + 1) * (i + 1));
      if (h[i] != want) {
        note("premul: rank %d [%zu] = %g, want %g", r, i, h[i], want);
        good = 0;
      }
    }
  }
  ok(good, "%d ranks: allreduce PREMUL_SUM, each rank's own factor", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
}

static void test_rooted(void) {
  uvccl_work_t w[MAXR];
  void *a[MAXR], *b[MAXR];
  int r, good, root = 1;
  memset(w, 0, sizeof(w));
  for (r = 0; r < nr; r++) {
    a[r] = dev_i32(r, C, v_root_data);
    uvccl_broadcast(&pgs[r], &w[r], a[r], C, UVCCL_INT32, nr - 1, NULL);
  }
  good = wait_all(w, nr, 0, "broadcast");
  for (r = 0; r < nr; r++) good &= check_i32(a[r], C, r, v_bcast, "bcast");
  ok(good, "%d ranks: broadcast from root %d", nr, nr - 1);
  for (r = 0; r < nr; r++) {
    a[r] = (uvccl_gpu_free(a[r]), dev_i32(r, C, v_rank_i));
    b[r] = r == root ? dev_i32(r, C, NULL) : NULL;
    uvccl_reduce(&pgs[r], &w[r], a[r], b[r], C, UVCCL_INT32, UVCCL_SUM, root,
                 NULL);
  }
  good = wait_all(w, nr, 0, "reduce");
  good &= check_i32(b[root], C, root, v_tri, "reduce");
  for (r = 0; r < nr; r++)
    good &= check_i32(a[r], C, r, v_rank_i, "reduce input untouched");
  ok(good, "%d ranks: reduce to root %d", nr, root);
  uvccl_gpu_free(b[root]);
  for (r = 0; r < nr; r++) uvccl_gpu_free(a[r]);
}

static int32_t v_gathered(int r, size_t i) {
  (void)r;
  return (int32_t)((i / C) * 100 + i % C);
}
static int32_t v_rs_in(int r, size_t i) { return (int32_t)((r + 1) * (i + 1)); }
static int32_t v_rs_out(int r, size_t i) {
  return (int32_t)((r * C + i + 1) * nr * (nr + 1) / 2);
}

static void test_gathers(void) {
  uvccl_work_t w[MAXR];
  void *a[MAXR], *b[MAXR];
  int r, good;
  memset(w, 0, sizeof(w));
  for (r = 0; r < nr; r++) {
    a[r] = dev_i32(r, C, v_block);
    b[r] = dev_i32(r, C * nr, NULL);
    uvccl_allgather(&pgs[r], &w[r], a[r], b[r], C, UVCCL_INT32, NULL);
  }
  good = wait_all(w, nr, 0, "allgather");
  for (r = 0; r < nr; r++)
    good &= check_i32(b[r], C * nr, r, v_gathered, "allgather");
  ok(good, "%d ranks: allgather", nr);
  /* gather to the last rank */
  for (r = 0; r < nr; r++) {
    put(b[r], (int32_t[1]){-5}, 4);
    uvccl_gather(&pgs[r], &w[r], a[r], r == nr - 1 ? b[r] : NULL, C,
                 UVCCL_INT32, nr - 1, NULL);
  }
  good = wait_all(w, nr, 0, "gather");
  good &= check_i32(b[nr - 1], C * nr, nr - 1, v_gathered, "gather");
  ok(good, "%d ranks: gather to root %d", nr, nr - 1);
  /* and back: the gathered blocks scattered from the same root */
  for (r = 0; r < nr; r++) {
    put(a[r], (int32_t[C]){-1, -1, -1, -1, -1}, C * 4);
    uvccl_scatter(&pgs[r], &w[r], r == nr - 1 ? b[r] : NULL, a[r], C,
                  UVCCL_INT32, nr - 1, NULL);
  }
  good = wait_all(w, nr, 0, "scatter");
  for (r = 0; r < nr; r++) good &= check_i32(a[r], C, r, v_block, "scatter");
  ok(good, "%d ranks: scatter from root %d", nr, nr - 1);
  /* reduce_scatter: block r of the sum to rank r */
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(b[r]);
    b[r] = dev_i32(r, C * nr, v_rs_in);
    uvccl_reduce_scatter(&pgs[r], &w[r], b[r], a[r], C, UVCCL_INT32,
                         UVCCL_SUM, NULL);
  }
  good = wait_all(w, nr, 0, "reduce_scatter");
  for (r = 0; r < nr; r++) good &= check_i32(a[r], C, r, v_rs_out, "rs");
  ok(good, "%d ranks: reduce_scatter", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
}

/* uneven: rank i has i + 1 elements */
static size_t off_of(int i) { return (size_t)i * (i + 1) / 2; }
static int32_t v_gv(int r, size_t i) {
  int q = 0;
  (void)r;
  while (off_of(q + 1) <= i) q++;
  return (int32_t)(q * 100 + (i - off_of(q)));
}
static int32_t v_rsv_out(int r, size_t i) {
  return (int32_t)((off_of(r) + i + 1) * nr * (nr + 1) / 2);
}

static void test_uneven(void) {
  uvccl_work_t w[MAXR];
  void *a[MAXR], *b[MAXR], *bufs[MAXR][MAXR];
  size_t counts[MAXR], total = off_of(nr);
  int r, i, good;
  memset(w, 0, sizeof(w));
  for (i = 0; i < nr; i++) counts[i] = (size_t)i + 1;
  for (r = 0; r < nr; r++) {
    a[r] = dev_i32(r, counts[r], v_block);
    b[r] = dev_i32(r, total, NULL);
    for (i = 0; i < nr; i++) bufs[r][i] = (int32_t *)b[r] + off_of(i);
    uvccl_allgatherv(&pgs[r], &w[r], a[r], counts[r], bufs[r], counts,
                     UVCCL_INT32, NULL);
  }
  good = wait_all(w, nr, 0, "allgatherv");
  for (r = 0; r < nr; r++) good &= check_i32(b[r], total, r, v_gv, "agv");
  ok(good, "%d ranks: allgatherv, rank i gives i + 1 elements", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(b[r]);
    uvccl_gpu_free(a[r]);
    b[r] = dev_i32(r, total, v_rs_in);
    a[r] = dev_i32(r, counts[r], NULL);
    uvccl_reduce_scatterv(&pgs[r], &w[r], b[r], a[r], counts, UVCCL_INT32,
                          UVCCL_SUM, NULL);
  }
  good = wait_all(w, nr, 0, "reduce_scatterv");
  for (r = 0; r < nr; r++)
    good &= check_i32(a[r], counts[r], r, v_rsv_out, "rsv");
  ok(good, "%d ranks: reduce_scatterv, block i of i + 1 elements", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
}

/* alltoall: element e of the block rank s sends to rank d */
static int32_t a2a_val(int s, int d, size_t e) {
  return (int32_t)(s * 100 + d * 10 + (int)e);
}
static size_t a2av_cnt(int s, int d) { return (size_t)((s + 2 * d) % 3 + 1); }

static void test_alltoall(void) {
  uvccl_work_t w[MAXR];
  void *a[MAXR], *b[MAXR];
  int32_t h[64];
  size_t sc[MAXR][MAXR], rc[MAXR][MAXR], n, e;
  int r, j, good;
  memset(w, 0, sizeof(w));
  for (r = 0; r < nr; r++) {
    for (j = 0, n = 0; j < nr; j++)
      for (e = 0; e < 2; e++) h[n++] = a2a_val(r, j, e);
    a[r] = dev(r, n * 4);
    put(a[r], h, n * 4);
    b[r] = dev_i32(r, n, NULL);
    uvccl_alltoall(&pgs[r], &w[r], a[r], b[r], 2, UVCCL_INT32, NULL);
  }
  good = wait_all(w, nr, 0, "alltoall");
  for (r = 0; r < nr; r++) {
    get(h, b[r], (size_t)nr * 2 * 4);
    for (j = 0, n = 0; j < nr; j++)
      for (e = 0; e < 2; e++, n++)
        if (h[n] != a2a_val(j, r, e)) {
          note("alltoall: rank %d from %d [%zu] = %d", r, j, e, (int)h[n]);
          good = 0;
        }
  }
  ok(good, "%d ranks: alltoall", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
    for (j = 0, n = 0; j < nr; j++) {
      sc[r][j] = a2av_cnt(r, j);
      rc[r][j] = a2av_cnt(j, r);
      for (e = 0; e < sc[r][j]; e++) h[n++] = a2a_val(r, j, e);
    }
    a[r] = dev(r, n * 4);
    put(a[r], h, n * 4);
    b[r] = dev_i32(r, 32, NULL);
    uvccl_alltoallv(&pgs[r], &w[r], a[r], sc[r], b[r], rc[r], UVCCL_INT32,
                    NULL);
  }
  good = wait_all(w, nr, 0, "alltoallv");
  for (r = 0; r < nr; r++) {
    get(h, b[r], 32 * 4);
    for (j = 0, n = 0; j < nr; j++)
      for (e = 0; e < rc[r][j]; e++, n++)
        if (h[n] != a2a_val(j, r, e)) {
          note("alltoallv: rank %d from %d [%zu] = %d", r, j, e, (int)h[n]);
          good = 0;
        }
  }
  ok(good, "%d ranks: alltoallv, uneven blocks", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
}

static void test_p2p(void) {
  uvccl_work_t w[MAXR];
  uvccl_p2p_op_t ops[MAXR][2];
  void *s[MAXR], *d[MAXR];
  char h[32], want[32];
  int r, good;
  memset(w, 0, sizeof(w));
  for (r = 0; r < nr; r++) {
    memset(h, 'a' + r, sizeof(h));
    s[r] = dev(r, sizeof(h));
    put(s[r], h, sizeof(h));
    d[r] = dev(r, sizeof(h));
  }
  /* rank 0 sends 20 bytes to the last rank; the others take no part */
  is_int(uvccl_send(&pgs[0], &w[0], s[0], 20, nr - 1, 0, NULL), 0, "send");
  is_int(uvccl_recv(&pgs[nr - 1], &w[nr - 1], d[nr - 1], 20, 0, 0, NULL), 0,
         "recv");
  is_int(uvccl_work_wait(&w[0]), 0, "send done");
  is_int(uvccl_work_wait(&w[nr - 1]), 0, "recv done");
  get(h, d[nr - 1], 20);
  memset(want, 'a', 20);
  ok(memcmp(h, want, 20) == 0, "%d ranks: send/recv 0 -> %d", nr, nr - 1);
  /* the other way, recv posted first */
  is_int(uvccl_recv(&pgs[0], &w[0], d[0], 8, nr - 1, 0, NULL), 0, "recv");
  run_for(20);
  ok(!uvccl_work_done(&w[0]), "recv waits for its send");
  is_int(uvccl_send(&pgs[nr - 1], &w[nr - 1], s[nr - 1], 8, 0, 0, NULL), 0,
         "send");
  good = wait_all(w, 1, 0, "recv") && uvccl_work_wait(&w[nr - 1]) == 0;
  get(h, d[0], 8);
  memset(want, 'a' + nr - 1, 8);
  ok(good && memcmp(h, want, 8) == 0, "%d ranks: send/recv %d -> 0", nr,
     nr - 1);
  /* p2p_batch ring: send to the next, receive from the previous */
  for (r = 0; r < nr; r++) {
    ops[r][0] = (uvccl_p2p_op_t){1, s[r], 32, (r + 1) % nr, 0, 0, 0};
    ops[r][1] = (uvccl_p2p_op_t){0, d[r], 32, (r + nr - 1) % nr, 0, 0, 0};
    is_int(uvccl_p2p_batch(&pgs[r], &w[r], ops[r], 2, NULL), 0,
           "rank %d: ring batch", r);
  }
  good = wait_all(w, nr, 0, "ring");
  for (r = 0; r < nr; r++) {
    get(h, d[r], 32);
    memset(want, 'a' + (r + nr - 1) % nr, 32);
    good &= memcmp(h, want, 32) == 0;
  }
  ok(good, "%d ranks: p2p_batch ring", nr);
  /* barrier */
  for (r = 0; r < nr; r++) uvccl_barrier(&pgs[r], &w[r], NULL);
  ok(wait_all(w, nr, 0, "barrier"), "%d ranks: barrier", nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(s[r]);
    uvccl_gpu_free(d[r]);
  }
}

/* ---- many queued ops -------------------------------------------------------- */

#define MANY 300
static int many_seen[MAXR][MANY], many_next[MAXR], many_bad;

static void on_many(uvccl_work_t *w, int status) {
  int r = (int)((intptr_t)w->data / MANY), i = (int)((intptr_t)w->data % MANY);
  if (status != 0 || i != many_next[r]) many_bad++;
  many_next[r] = i + 1;
  many_seen[r][i]++;
}

static int32_t v_many_in(int r, size_t i) { return (int32_t)(i * (r + 1)); }
static int32_t v_many_out(int r, size_t i) {
  (void)r;
  return (int32_t)(i * nr * (nr + 1) / 2);
}

static void test_many(void) {
  uvccl_work_t *w = calloc((size_t)nr * MANY, sizeof(*w));
  void *in[MAXR] = {0}, *out[MAXR] = {0};
  int r, i, good = 1;
  double t0 = now_s();
  memset(many_seen, 0, sizeof(many_seen));
  memset(many_next, 0, sizeof(many_next));
  many_bad = 0;
  for (r = 0; r < nr; r++) {
    in[r] = dev_i32(r, MANY, NULL);
    out[r] = dev_i32(r, MANY, NULL);
  }
  {
    int32_t h[MANY];
    for (r = 0; r < nr; r++) {
      for (i = 0; i < MANY; i++) h[i] = v_many_in(r, (size_t)i);
      put(in[r], h, sizeof(h));
    }
  }
  /* rank by rank: each rank queues all of its ops before the next starts */
  for (r = 0; r < nr; r++)
    for (i = 0; i < MANY; i++) {
      uvccl_work_t *x = &w[r * MANY + i];
      x->data = (void *)(intptr_t)(r * MANY + i);
      if (uvccl_allreduce(&pgs[r], x, (int32_t *)in[r] + i,
                          (int32_t *)out[r] + i, 1, UVCCL_INT32, UVCCL_SUM,
                          on_many) != 0)
        good = 0;
    }
  for (r = 0; r < nr; r++) uvccl_work_wait(&w[r * MANY + MANY - 1]);
  run_for(10);
  for (r = 0; r < nr; r++)
    for (i = 0; i < MANY; i++) good &= many_seen[r][i] == 1;
  ok(good && many_bad == 0, "%d ranks x %d queued allreduces: each callback "
     "once, in order", nr, MANY);
  good = 1;
  {
    int32_t h[MANY];
    for (r = 0; r < nr; r++) {
      get(h, out[r], sizeof(h));
      for (i = 0; i < MANY; i++) good &= h[i] == v_many_out(r, (size_t)i);
    }
  }
  ok(good, "and every result is right");
  note("%d x %d allreduces in %.3f s", nr, MANY, now_s() - t0);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
  free(w);
}

/* ---- subgroups ------------------------------------------------------------------ */

static void test_subgroups(void) {
  uvccl_pg_t sub[MAXR], sp[MAXR];
  uvccl_work_t w[MAXR];
  int members[2] = {nr - 1, 0}; /* reversed: group rank 0 is the last rank */
  int nm = nr == 2 ? 1 : 2;     /* two ranks: a one-rank subgroup {1} */
  int r, rc, good = 1;
  void *a[MAXR], *b[MAXR];
  memset(w, 0, sizeof(w));
  memset(sub, 0, sizeof(sub));
  memset(sp, 0, sizeof(sp));
  for (r = 0; r < nr; r++) {
    int want = r == nr - 1 ? 0 : (nm == 2 && r == 0) ? 1 : -1;
    rc = uvccl_pg_new_group(&pgs[r], &sub[r], members, nm, NULL);
    if (want < 0)
      good &= rc == UVCCL_ENOTMEMBER && sub[r].rank == -1;
    else
      good &= rc == 0 && sub[r].rank == want && sub[r].size == nm;
    if (!good) note("new_group: rank %d: rc %d rank %d", r, rc, sub[r].rank);
  }
  ok(good, "%d ranks: new_group of %d: members placed, the others "
     "UVCCL_ENOTMEMBER", nr, nm);
  /* usable at once: the ops wait for the split, which every rank made */
  for (r = 0; r < nr; r++) {
    a[r] = dev_i32(r, C, v_rank_i);
    b[r] = dev_i32(r, C, NULL);
  }
  good = 1;
  for (r = 0; r < nr; r++)
    if (sub[r].impl_ != NULL)
      good &= uvccl_allreduce(&sub[r], &w[r], a[r], b[r], C, UVCCL_INT32,
                              UVCCL_SUM, NULL) == 0;
  for (r = 0; r < nr; r++)
    if (sub[r].impl_ != NULL) {
      int32_t h[C], q;
      size_t i;
      good &= uvccl_work_wait(&w[r]) == 0;
      get(h, b[r], sizeof(h));
      for (i = 0; i < C; i++) {
        int32_t want = 0;
        for (q = 0; q < nm; q++) want += v_rank_i(members[q], i);
        good &= h[i] == want;
      }
    }
  ok(good, "%d ranks: allreduce on the subgroup", nr);
  /* the parent still works after the split, the non-member included */
  for (r = 0; r < nr; r++)
    uvccl_allreduce(&pgs[r], &w[r], a[r], b[r], C, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  good = wait_all(w, nr, 0, "parent after split");
  for (r = 0; r < nr; r++) good &= check_i32(b[r], C, r, v_tri, "parent");
  ok(good, "%d ranks: the parent after new_group", nr);
  destroy_groups(sub, nr);
  /* split: the last rank opts out when there are 3; the others form one
   * group ordered by key = -rank (reversed) */
  for (r = 0; r < nr; r++) {
    int color = nr == 3 && r == 1 ? -1 : 7;
    is_int(uvccl_pg_split(&pgs[r], &sp[r], color, -r, &w[r], NULL), 0,
           "rank %d: split color %d started", r, color);
  }
  good = 1;
  for (r = 0; r < nr; r++) {
    int opt_out = nr == 3 && r == 1;
    rc = uvccl_work_wait(&w[r]);
    if (opt_out) good &= rc == UVCCL_ENOTMEMBER;
    else
      good &= rc == 0 && sp[r].size == (nr == 3 ? 2 : 2) &&
              sp[r].rank == (r == 0 ? 1 : 0);
    if (!good) note("split: rank %d: %d (%s) rank %d size %d", r, rc, w[r].msg,
                    sp[r].rank, sp[r].size);
  }
  ok(good, "%d ranks: split by color, ordered by key", nr);
  for (r = 0; r < nr; r++)
    if (sp[r].impl_ != NULL) {
      int32_t v = 1000 + r;
      put(a[r], &v, 4);
      uvccl_broadcast(&sp[r], &w[r], a[r], 1, UVCCL_INT32, 0, NULL);
    }
  good = 1;
  for (r = 0; r < nr; r++)
    if (sp[r].impl_ != NULL) {
      int32_t v = 0;
      good &= uvccl_work_wait(&w[r]) == 0;
      get(&v, a[r], 4);
      good &= v == 1000 + nr - 1; /* split rank 0 is the last rank */
    }
  ok(good, "%d ranks: broadcast from split rank 0 (parent rank %d)", nr,
     nr - 1);
  destroy_groups(sp, nr);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
}

/* ---- a rank that never joins: timeout, then abort ------------------------- */

static void test_timeout_abort(void) {
  uvccl_work_t w1[MAXR], w2[MAXR];
  void *a[MAXR], *b[MAXR];
  int r, good = 1;
  double t0, dt;
  memset(w1, 0, sizeof(w1));
  memset(w2, 0, sizeof(w2));
  for (r = 0; r < nr; r++) {
    a[r] = dev_i32(r, C, v_rank_i);
    b[r] = dev_i32(r, C, NULL);
  }
  t0 = now_s();
  /* the last rank never calls it: the others' kernels wait for it */
  for (r = 0; r < nr - 1; r++) {
    w1[r].timeout_ms = 300;
    w2[r].timeout_ms = 150;
    good &= uvccl_allreduce(&pgs[r], &w1[r], a[r], b[r], C, UVCCL_INT32,
                            UVCCL_SUM, NULL) == 0;
    good &= uvccl_allreduce(&pgs[r], &w2[r], a[r], b[r], C, UVCCL_INT32,
                            UVCCL_SUM, NULL) == 0;
  }
  ok(good, "%d ranks: %d ranks queue two allreduces", nr, nr - 1);
  good = wait_all(w1, nr - 1, UV_ETIMEDOUT, "timeout");
  dt = now_s() - t0;
  ok(good, "%d ranks: the first times out (UV_ETIMEDOUT): %s", nr, w1[0].msg);
  ok(dt >= 0.29 && dt < 3, "after about 300 ms (%.3f s)", dt);
  run_for(250);
  good = 1;
  for (r = 0; r < nr - 1; r++) good &= !uvccl_work_done(&w2[r]);
  ok(good, "the second (150 ms) has not timed out: its clock starts on the "
     "GPU, and the GPU is stuck in the first");
  t0 = now_s();
  for (r = 0; r < nr; r++) uvccl_pg_abort(&pgs[r], "test: a rank is missing");
  good = wait_all(w2, nr - 1, UVCCL_EABORTED, "abort");
  ok(good, "abort fails the queued op with UVCCL_EABORTED");
  destroy_groups(pgs, nr);
  dt = now_s() - t0;
  ok(dt < 2, "abort and destroy of every group return promptly (%.3f s)", dt);
  for (r = 0; r < nr; r++) {
    uvccl_gpu_free(a[r]);
    uvccl_gpu_free(b[r]);
  }
  is_int(f_live_comms(), 0, "every fake communicator aborted");
}

/* A split that one rank never calls: the others wait (in progress) until
 * their parents are aborted; the child communicators NCCL was making go
 * with the child groups. */
static void test_split_abandoned(void) {
  uvccl_pg_t sp[MAXR];
  uvccl_work_t w[MAXR];
  int r, good = 1;
  memset(w, 0, sizeof(w));
  memset(sp, 0, sizeof(sp));
  for (r = 0; r < nr - 1; r++)
    good &= uvccl_pg_split(&pgs[r], &sp[r], 0, r, &w[r], NULL) == 0;
  run_for(100);
  for (r = 0; r < nr - 1; r++) good &= !uvccl_work_done(&w[r]);
  ok(good, "%d ranks: a split the last rank never calls stays pending", nr);
  for (r = 0; r < nr; r++) uvccl_pg_abort(&pgs[r], "test: split abandoned");
  good = 1;
  for (r = 0; r < nr - 1; r++) good &= uvccl_work_wait(&w[r]) != 0;
  ok(good, "abort fails it: %s", w[0].msg);
  destroy_groups(sp, nr);
  destroy_groups(pgs, nr);
  is_int(f_live_comms(), 0, "every fake communicator gone, the pending "
         "children included");
}

/* A creation the last rank never joins: the others' inits wait for it
 * (in progress) until they are aborted; the communicators NCCL was
 * making go too. */
static void test_init_abandoned(int n) {
  uvccl_work_t w[MAXR];
  uvccl_pg_options_t o;
  int r, good = 1;
  memset(w, 0, sizeof(w));
  for (r = 0; r < n - 1; r++) {
    memset(&o, 0, sizeof(o));
    o.rank = r;
    o.size = n;
    o.backend = UVCCL_BACKEND_NCCL;
    o.device = r;
    o.prefix = "partial";
    good &= uvccl_pg_init(loop, &pgs[r], &store, &o, &w[r], NULL) == 0;
  }
  run_for(100);
  for (r = 0; r < n - 1; r++) good &= !uvccl_work_done(&w[r]);
  ok(good, "%d ranks: without the last, creation stays pending", n);
  for (r = 0; r < n - 1; r++) uvccl_pg_abort(&pgs[r], "test: rank missing");
  good = wait_all(w, n - 1, UVCCL_EABORTED, "abort during creation");
  ok(good, "abort during creation: UVCCL_EABORTED (%s)", w[0].msg);
  destroy_groups(pgs, n - 1);
  is_int(f_live_comms(), 0, "the communicators being made are gone");
}

static void run_world(int n) {
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "world%d", n);
  ok(make_world(n, prefix), "%d ranks: every rank's NCCL group created", n);
  if (f_live_comms == NULL) { /* the fake is loaded by now */
    void *h = dlopen(FAKE_NCCL, RTLD_NOW | RTLD_NOLOAD);
    *(void **)&f_live_comms = h ? dlsym(h, "fake_nccl_live_comms") : NULL;
    tap_require(f_live_comms != NULL, "the fake NCCL is loaded");
  }
  test_allreduce();
  test_rooted();
  test_gathers();
  test_uneven();
  test_alltoall();
  test_p2p();
  test_many();
  test_subgroups();
  /* destroy with nothing pending */
  destroy_groups(pgs, n);
  is_int(f_live_comms(), 0, "%d ranks: destroyed, no communicator left", n);
}

/* Lazy init: creation completes once the id is known, with no
 * communicator yet; the first operation brings it; a lazy group that never
 * ran anything is destroyed without one. */
static void test_lazy(int n) {
  uvccl_work_t w[MAXR];
  uvccl_pg_options_t o;
  void *in[MAXR], *out[MAXR];
  int r, good, base = f_live_comms ? f_live_comms() : 0;
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "lazy%d", n);
  nr = n;
  memset(&o, 0, sizeof(o));
  o.lazy_init = 1;
  good = nccl_ranks_start(loop, &store, pgs, w, n, prefix, &o);
  good &= wait_all(w, n, 0, "lazy pg_init");
  ok(good, "%d ranks, lazy init: creation completes", n);
  if (f_live_comms)
    is_int(f_live_comms(), base, "lazy init: no communicator before the "
           "first operation");
  for (r = 0; r < n; r++) {
    in[r] = dev_i32(r, C, v_rank_i);
    out[r] = dev_i32(r, C, NULL);
    uvccl_allreduce(&pgs[r], &w[r], in[r], out[r], C, UVCCL_INT32, UVCCL_SUM,
                    NULL);
  }
  good = wait_all(w, n, 0, "lazy allreduce");
  for (r = 0; r < n; r++) good &= check_i32(out[r], C, r, v_tri, "lazy sum");
  ok(good, "lazy init: the first allreduce makes the communicator, exact");
  if (f_live_comms)
    is_int(f_live_comms(), base + n, "lazy init: %d communicators now", n);
  for (r = 0; r < n; r++) {
    uvccl_gpu_free(in[r]);
    uvccl_gpu_free(out[r]);
  }
  destroy_groups(pgs, n);
  /* never used: nothing to make, nothing to tear down */
  snprintf(prefix, sizeof(prefix), "lazyidle%d", n);
  good = 1;
  for (r = 0; r < n; r++) {
    memset(&o, 0, sizeof(o));
    o.rank = r;
    o.size = n;
    o.backend = UVCCL_BACKEND_NCCL;
    o.device = r;
    o.prefix = prefix;
    o.timeout_ms = 10000;
    o.lazy_init = 1;
    if (uvccl_pg_init(loop, &pgs[r], &store, &o, &w[r], NULL) != 0) good = 0;
  }
  good &= wait_all(w, n, 0, "lazy idle pg_init");
  destroy_groups(pgs, n);
  ok(good, "lazy group never used: created and destroyed");
  if (f_live_comms)
    is_int(f_live_comms(), base, "lazy group never used: no communicator");
}

int main(void) {
  tap_alarm(120);
  setenv("UVCCL_CUDART", FAKE_CUDART, 1);
  setenv("UVCCL_NCCL", FAKE_NCCL, 1);
  setenv("FAKE_CUDA_DEVICES", "3", 1);
  setenv("UVCCL_NCCL_WATCHDOG_MS", "20", 1);
  is_int(uv_loop_init(loop), 0, "loop");
  is_int(uvccl_hash_store_init(loop, &store), 0, "hash store");
  run_world(2);
  run_world(3);
  test_lazy(2);
  test_lazy(3);
  /* a collective that one rank never joins */
  ok(make_world(2, "lost2"), "2 ranks again");
  test_timeout_abort();
  ok(make_world(3, "lost3"), "3 ranks again");
  test_timeout_abort();
  ok(make_world(3, "split3"), "3 ranks again");
  test_split_abandoned();
  test_init_abandoned(3);
  uvccl_store_close(&store, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(loop), 0, "loop closed: no handle left");
  return done_testing();
}
