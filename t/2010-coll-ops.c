/* Every collective, with exact expected results, on in-process worlds of 1
 * to 8 ranks (real listeners and TCP connections, one loop), through shared
 * memory and again through TCP only: allreduce for
 * every dtype x reduce op at sizes 0, 1, odd and past the small-message
 * threshold (so both the recursive-doubling and the ring algorithms run),
 * then reduce, broadcast, allgather(v), gather, scatter, reduce_scatter(v),
 * alltoall(v), barrier, point-to-point and the byte collectives. */
#include "tap.h"
#include "world.h"

#include <stdlib.h>

static uv_loop_t loop;

/* A small integer as an element of dtype (exact in every dtype). */
static void put(uvccl_dtype_t dt, void *base, size_t i, int v) {
  char *p = (char *)base + i * uvccl_dtype_size(dt);
  switch (dt) {
  case UVCCL_INT8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
  case UVCCL_UINT8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
  case UVCCL_BOOL: { uint8_t x = (uint8_t)(v & 1); memcpy(p, &x, 1); break; }
  case UVCCL_INT32: { int32_t x = v; memcpy(p, &x, 4); break; }
  case UVCCL_INT64: { int64_t x = v; memcpy(p, &x, 8); break; }
  case UVCCL_FLOAT16: { _Float16 x = (_Float16)(float)v; memcpy(p, &x, 2); break; }
  case UVCCL_BFLOAT16: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4);
    uint16_t h = (uint16_t)(u >> 16); memcpy(p, &h, 2); break; }
  case UVCCL_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); break; }
  case UVCCL_FLOAT64: { double x = v; memcpy(p, &x, 8); break; }
  case UVCCL_COMPLEX64: { float x[2] = {(float)v, (float)-v}; memcpy(p, x, 8); break; }
  case UVCCL_COMPLEX128: { double x[2] = {v, -v}; memcpy(p, x, 16); break; }
  default: break;
  }
}

/* Input of rank r at index i for op: small values so that sums and
 * products of 8 ranks stay exact in every dtype. */
static int input(int r, size_t i, uvccl_redop_t op) {
  if (op == UVCCL_PRODUCT) return 1 + (int)((r + i) % 3 == 0);
  return (int)((r * 7 + i * 3) % 5) + 1 + (op == UVCCL_MIN || op == UVCCL_MAX ? r % 3 : 0);
}

static int nbad;
static int check(const void *got, const void *want, size_t n) {
  if (n == 0) return 1;
  if (memcmp(got, want, n) == 0) return 1;
  nbad++;
  return 0;
}

/* want = reduction over ranks of input(r, i) */
static void expected(uvccl_dtype_t dt, uvccl_redop_t op, int P, size_t count,
                     double premul, void *want) {
  size_t es = uvccl_dtype_size(dt), i;
  char *tmp = malloc(count * es + 1);
  uvccl_redop_t base = op == UVCCL_PREMUL_SUM ? UVCCL_SUM : op;
  int r;
  for (i = 0; i < count; i++) put(dt, want, i, input(0, i, op));
  for (r = 1; r < P; r++) {
    for (i = 0; i < count; i++) put(dt, tmp, i, input(r, i, op));
    uvccl_reduce_local(want, tmp, count, dt, base);
  }
  if (op == UVCCL_AVG) uvccl_divide_local(want, count, dt, P);
  if (op == UVCCL_PREMUL_SUM) uvccl_scale_local(want, count, dt, premul);
  free(tmp);
}

static uvccl_redop_t op_for(world_t *W, int r, uvccl_redop_t op) {
  uvccl_redop_t x = op;
  if (op == UVCCL_PREMUL_SUM) uvccl_pg_premul_sum(&W->pg[r], 2.0, &x);
  return x;
}

static void test_allreduce(world_t *W) {
  int P = W->n, r, d, o, rc;
  /* 70001 takes the ring for every dtype; the last size and 1 run out of
   * place (the input must come back untouched). */
  size_t sizes[] = {0, 1, 33, 40000, 70001, 70001}, si, i;
  int combos = 0, okc = 0;
  for (d = 0; d < UVCCL_DTYPE_COUNT; d++)
    for (o = 0; o < UVCCL_REDOP_COUNT; o++) {
      uvccl_dtype_t dt = (uvccl_dtype_t)d;
      uvccl_redop_t op = (uvccl_redop_t)o;
      size_t es = uvccl_dtype_size(dt);
      if (uvccl_redop_check(op, dt) != 0) {
        uvccl_work_t w = {0};
        char b[16] = {0};
        if (op != UVCCL_PREMUL_SUM) {
          rc = uvccl_allreduce(&W->pg[0], &w, b, b, 1, dt, op, NULL);
          if (rc != UV_EINVAL) {
            nbad++;
            printf("# %s/%s accepted\n", uvccl_dtype_name(dt), uvccl_redop_name(op));
          }
        }
        continue;
      }
      for (si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t n = sizes[si];
        int oop = si == 1 || si == 5;
        char *buf[WORLD_MAX], *in[WORLD_MAX], *want = malloc(n * es + 1);
        int good = 1;
        combos++;
        expected(dt, op, P, n, 2.0, want);
        for (r = 0; r < P; r++) {
          buf[r] = malloc(n * es + 1);
          in[r] = oop ? malloc(n * es + 1) : buf[r];
          for (i = 0; i < n; i++) put(dt, in[r], i, input(r, i, op));
          rc = uvccl_allreduce(&W->pg[r], &W->w[r], in[r], buf[r], n, dt,
                               op_for(W, r, op), NULL);
          if (rc != 0) { good = 0; printf("# start: %s\n", uvccl_strerror(rc)); }
        }
        rc = world_wait(W);
        if (rc != 0) { good = 0; printf("# %s\n", W->w[0].msg); }
        for (r = 0; r < P; r++) {
          if (!check(buf[r], want, n * es)) {
            good = 0;
            printf("# P=%d %s %s n=%zu rank %d differs\n", P,
                   uvccl_dtype_name(dt), uvccl_redop_name(op), n, r);
          }
          if (oop) {
            for (i = 0; i < n && good; i++) {
              char one[16];
              put(dt, one, 0, input(r, i, op));
              if (memcmp(one, in[r] + i * es, es) != 0) {
                good = 0;
                printf("# P=%d %s %s n=%zu rank %d: input changed\n", P,
                       uvccl_dtype_name(dt), uvccl_redop_name(op), n, r);
              }
            }
            free(in[r]);
          }
          free(buf[r]);
        }
        free(want);
        okc += good;
      }
    }
  is_int(okc, combos, "P=%d: allreduce, every dtype x op at 0/1/33/40000/70001 elements, in and out of place (%d cases)", P, combos);
}

/* Out of place, AVG on float32 at a size that takes the ring. */
static void test_allreduce_oop(world_t *W) {
  int P = W->n, r;
  size_t n = 100003, i;
  float *in[WORLD_MAX], *out[WORLD_MAX];
  int bad = 0;
  for (r = 0; r < P; r++) {
    in[r] = malloc(n * 4);
    out[r] = malloc(n * 4);
    for (i = 0; i < n; i++) in[r][i] = (float)(r + 1) * (float)(i % 11);
    uvccl_allreduce(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_FLOAT32,
                    UVCCL_AVG, NULL);
  }
  is_int(world_wait(W), 0, "P=%d: out-of-place AVG allreduce", P);
  for (r = 0; r < P; r++) {
    for (i = 0; i < n; i++) {
      float want = (float)(P * (P + 1) / 2) * (float)(i % 11) / (float)P;
      if (out[r][i] != want || in[r][i] != (float)(r + 1) * (float)(i % 11)) bad++;
    }
    free(in[r]);
    free(out[r]);
  }
  is_int(bad, 0, "P=%d: AVG values exact, inputs untouched", P);
}

static void test_reduce_bcast(world_t *W) {
  int P = W->n, r, root, bad = 0, rc = 0;
  /* 1000003: a chain cut in many uneven segments (chain_nseg) */
  size_t sizes[] = {1, 5, 70000, 1000003}, si, i;
  for (si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
    for (root = 0; root < P; root += (P > 2 ? P - 1 : 1)) {
      size_t n = sizes[si];
      int32_t *in[WORLD_MAX], *out[WORLD_MAX];
      for (r = 0; r < P; r++) {
        in[r] = malloc(n * 4);
        out[r] = calloc(n, 4);
        for (i = 0; i < n; i++) in[r][i] = (int32_t)(r * 3 + (int)i);
        uvccl_reduce(&W->pg[r], &W->w[r], in[r], r == root ? out[r] : NULL,
                     n, UVCCL_INT32, UVCCL_MAX, root, NULL);
      }
      rc |= world_wait(W);
      for (i = 0; i < n; i++)
        if (out[root][i] != (int32_t)((P - 1) * 3 + (int)i)) bad++;
      /* broadcast root's result back out */
      for (r = 0; r < P; r++)
        uvccl_broadcast(&W->pg[r], &W->w[r], out[r], n, UVCCL_INT32, root, NULL);
      rc |= world_wait(W);
      for (r = 0; r < P; r++) {
        for (i = 0; i < n; i++)
          if (out[r][i] != (int32_t)((P - 1) * 3 + (int)i)) bad++;
        free(in[r]);
        free(out[r]);
      }
    }
  is_int(rc, 0, "P=%d: reduce + broadcast complete", P);
  is_int(bad, 0, "P=%d: reduce MAX at root, broadcast from root: exact", P);
}

static void test_allgather(world_t *W) {
  int P = W->n, r, q, bad = 0, rc;
  size_t n = 3001, i;
  int64_t *in[WORLD_MAX], *out[WORLD_MAX];
  /* 5 elements: Bruck's rounds (P > 2); 3001: the ring */
  for (r = 0; r < P; r++) {
    in[r] = malloc(8 * 4099 + 1); /* also the uneven case below */
    out[r] = malloc(n * 8 * (size_t)P);
  }
  for (n = 5; n <= 3001; n += 2996) {
    for (r = 0; r < P; r++) {
      for (i = 0; i < n; i++) in[r][i] = (int64_t)r * 1000000 + (int64_t)i;
      uvccl_allgather(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_INT64,
                      NULL);
    }
    rc = world_wait(W);
    for (r = 0; r < P; r++)
      for (q = 0; q < P; q++)
        for (i = 0; i < n; i++)
          if (out[r][(size_t)q * n + i] != (int64_t)q * 1000000 + (int64_t)i)
            bad++;
    is_int(rc, 0, "P=%d: allgather of %zu", P, n);
    is_int(bad, 0, "P=%d: allgather blocks in rank order (%zu)", P, n);
  }
  n = 3001;
  /* uneven, into separate buffers; rank 1 contributes nothing */
  {
    size_t counts[WORLD_MAX];
    uint8_t *lists[WORLD_MAX][WORLD_MAX];
    bad = 0;
    for (q = 0; q < P; q++) counts[q] = q == 1 ? 0 : (size_t)(q * 4099 + 1);
    for (r = 0; r < P; r++) {
      for (i = 0; i < counts[r]; i++) ((uint8_t *)in[r])[i] = (uint8_t)(r + i);
      for (q = 0; q < P; q++) lists[r][q] = malloc(counts[q] + 1);
      uvccl_allgatherv(&W->pg[r], &W->w[r], in[r], counts[r],
                       (void *const *)lists[r], counts, UVCCL_UINT8, NULL);
    }
    is_int(world_wait(W), 0, "P=%d: uneven allgather into a list", P);
    for (r = 0; r < P; r++)
      for (q = 0; q < P; q++) {
        for (i = 0; i < counts[q]; i++)
          if (lists[r][q][i] != (uint8_t)(q + i)) bad++;
        free(lists[r][q]);
      }
    is_int(bad, 0, "P=%d: uneven allgather values", P);
  }
  for (r = 0; r < P; r++) {
    free(in[r]);
    free(out[r]);
  }
}


static void test_gather_scatter(world_t *W) {
  int P = W->n, r, q, root = P - 1, bad = 0, rc;
  size_t n = 1027, i;
  uint16_t *in[WORLD_MAX], *all = malloc(n * 2 * (size_t)P), *out[WORLD_MAX];
  for (r = 0; r < P; r++) {
    in[r] = malloc(n * 2);
    out[r] = malloc(n * 2);
    for (i = 0; i < n; i++) in[r][i] = (uint16_t)(r * 100 + i);
    uvccl_gather(&W->pg[r], &W->w[r], in[r], r == root ? all : NULL, n,
                 UVCCL_FLOAT16, root, NULL);
  }
  rc = world_wait(W);
  for (q = 0; q < P; q++)
    for (i = 0; i < n; i++)
      if (all[(size_t)q * n + i] != (uint16_t)(q * 100 + i)) bad++;
  /* scatter it back: block q to rank q */
  for (r = 0; r < P; r++)
    uvccl_scatter(&W->pg[r], &W->w[r], r == root ? all : NULL, out[r], n,
                  UVCCL_BFLOAT16, root, NULL);
  rc |= world_wait(W);
  for (r = 0; r < P; r++) {
    for (i = 0; i < n; i++)
      if (out[r][i] != (uint16_t)(r * 100 + i)) bad++;
    free(in[r]);
    free(out[r]);
  }
  free(all);
  is_int(rc, 0, "P=%d: gather + scatter complete", P);
  is_int(bad, 0, "P=%d: gather at root, scatter from root: exact", P);
}

static void test_reduce_scatter(world_t *W) {
  int P = W->n, r, q, bad = 0, rc;
  size_t counts[] = {1, 17, 30000}, ci, i;
  for (ci = 0; ci < 3; ci++) {
    size_t n = counts[ci];
    double *in[WORLD_MAX], *out[WORLD_MAX];
    for (r = 0; r < P; r++) {
      in[r] = malloc(n * 8 * (size_t)P);
      out[r] = malloc(n * 8);
      for (i = 0; i < n * (size_t)P; i++) in[r][i] = (double)(r + 1) + (double)i;
      uvccl_reduce_scatter(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_FLOAT64,
                           UVCCL_SUM, NULL);
    }
    rc = world_wait(W);
    if (rc) printf("# %s\n", W->w[0].msg);
    for (r = 0; r < P; r++) {
      for (i = 0; i < n; i++) {
        double idx = (double)((size_t)r * n + i);
        if (out[r][i] != (double)(P * (P + 1) / 2) + (double)P * idx) bad++;
      }
      free(in[r]);
      free(out[r]);
    }
    is_int(rc, 0, "P=%d: reduce_scatter %zu per rank", P, n);
  }
  is_int(bad, 0, "P=%d: reduce_scatter blocks exact", P);
  /* uneven, with AVG on int32 */
  {
    size_t rc_[WORLD_MAX], total = 0;
    int32_t *in[WORLD_MAX], *out[WORLD_MAX];
    bad = 0;
    for (q = 0; q < P; q++) total += rc_[q] = (size_t)(q % 3) * 1000 + 3;
    for (r = 0; r < P; r++) {
      in[r] = malloc(total * 4);
      out[r] = malloc(rc_[r] * 4);
      for (i = 0; i < total; i++) in[r][i] = (int32_t)(r * 2 + (int)i);
      uvccl_reduce_scatterv(&W->pg[r], &W->w[r], in[r], out[r], rc_,
                            UVCCL_INT32, UVCCL_AVG, NULL);
    }
    is_int(world_wait(W), 0, "P=%d: uneven reduce_scatter AVG", P);
    for (r = 0; r < P; r++) {
      size_t off = 0;
      for (q = 0; q < r; q++) off += rc_[q];
      for (i = 0; i < rc_[r]; i++) {
        int64_t sum = (int64_t)P * (int64_t)(off + i) + (int64_t)P * (P - 1);
        if (out[r][i] != (int32_t)(sum / P)) bad++;
      }
      free(in[r]);
      free(out[r]);
    }
    is_int(bad, 0, "P=%d: uneven reduce_scatter values (truncating AVG)", P);
  }
}

static void test_alltoall(world_t *W) {
  int P = W->n, r, q, bad = 0, rc;
  size_t n = 513, i;
  int32_t *in[WORLD_MAX], *out[WORLD_MAX];
  for (r = 0; r < P; r++) {
    in[r] = malloc(n * 4 * (size_t)P);
    out[r] = malloc(n * 4 * (size_t)P);
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++) in[r][(size_t)q * n + i] = r * 1000000 + q * 1000 + (int)i;
    uvccl_alltoall(&W->pg[r], &W->w[r], in[r], out[r], n, UVCCL_INT32, NULL);
  }
  rc = world_wait(W);
  for (r = 0; r < P; r++)
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        if (out[r][(size_t)q * n + i] != q * 1000000 + r * 1000 + (int)i) bad++;
  is_int(rc, 0, "P=%d: alltoall", P);
  is_int(bad, 0, "P=%d: alltoall blocks exact", P);
  /* alltoallv: rank r sends (r + q) % 3 * 100 elements to q */
  {
    size_t sc[WORLD_MAX][WORLD_MAX], rcn[WORLD_MAX][WORLD_MAX];
    bad = 0;
    for (r = 0; r < P; r++)
      for (q = 0; q < P; q++) {
        sc[r][q] = (size_t)((r + 2 * q) % 3) * 100;
        rcn[q][r] = sc[r][q];
      }
    for (r = 0; r < P; r++) {
      size_t off = 0;
      for (q = 0; q < P; q++) {
        for (i = 0; i < sc[r][q]; i++) in[r][off + i] = r * 1000 + q * 10 + (int)(i % 7);
        off += sc[r][q];
      }
      uvccl_alltoallv(&W->pg[r], &W->w[r], in[r], sc[r], out[r], rcn[r],
                      UVCCL_INT32, NULL);
    }
    is_int(world_wait(W), 0, "P=%d: alltoallv", P);
    for (r = 0; r < P; r++) {
      size_t off = 0;
      for (q = 0; q < P; q++) {
        for (i = 0; i < rcn[r][q]; i++)
          if (out[r][off + i] != q * 1000 + r * 10 + (int)(i % 7)) bad++;
        off += rcn[r][q];
      }
    }
    is_int(bad, 0, "P=%d: alltoallv split sizes exact", P);
  }
  for (r = 0; r < P; r++) {
    free(in[r]);
    free(out[r]);
  }
}

/* Many operations in flight at once; the barrier completes after them. */
static int order_log[64 * WORLD_MAX], order_n;
static void log_cb(uvccl_work_t *w, int status) {
  (void)status;
  order_log[order_n++] = (int)(intptr_t)w->data;
}

static void test_inflight(world_t *W) {
  int P = W->n, r, k, bad = 0, K = 12;
  static uvccl_work_t ws[WORLD_MAX][16];
  static float bufs[WORLD_MAX][12][2000];
  size_t i;
  order_n = 0;
  memset(ws, 0, sizeof(ws));
  for (r = 0; r < P; r++) {
    for (k = 0; k < K; k++) {
      for (i = 0; i < 2000; i++) bufs[r][k][i] = (float)(r + k);
      ws[r][k].data = (void *)(intptr_t)(r * 1000 + k);
      uvccl_allreduce(&W->pg[r], &ws[r][k], bufs[r][k], bufs[r][k],
                      k % 2 ? 2000 : 7, UVCCL_FLOAT32, UVCCL_SUM, log_cb);
    }
    ws[r][K].data = (void *)(intptr_t)(r * 1000 + 100);
    uvccl_barrier(&W->pg[r], &ws[r][K], log_cb);
  }
  while (order_n < P * (K + 1)) uv_run(W->loop, UV_RUN_ONCE);
  for (r = 0; r < P; r++) {
    for (k = 0; k <= K; k++)
      if (ws[r][k].status != 0) bad++;
    for (k = 0; k < K; k++)
      for (i = 0; i < (k % 2 ? 2000u : 7u); i++)
        if (bufs[r][k][i] != (float)(P * (P - 1) / 2 + P * k)) bad++;
  }
  {
    /* on every rank, the barrier's callback comes after all K of its
     * allreduces' callbacks */
    int early = 0, seen[WORLD_MAX] = {0};
    for (k = 0; k < order_n; k++) {
      int rr = order_log[k] / 1000, kk = order_log[k] % 1000;
      if (kk == 100 && seen[rr] != K) early++;
      if (kk != 100) seen[rr]++;
    }
    is_int(early, 0, "P=%d: barrier completes after earlier operations", P);
  }
  is_int(bad, 0, "P=%d: %d allreduces in flight at once, exact", P, K);
}

/* Every rank reaches every other through `want` ("shm" or "tcp"). */
static void check_transport(world_t *W, const char *want) {
  int r, q, bad = 0;
  for (r = 0; r < W->n; r++)
    for (q = 0; q < W->n; q++) {
      const char *t = uvccl_pg_peer_transport(&W->pg[r], q);
      if (strcmp(t, q == r ? "self" : want) != 0) {
        if (bad++ == 0) diag("rank %d -> rank %d: %s", r, q, t);
      }
    }
  is_int(bad, 0, "P=%d: every pair of ranks talks through %s", W->n, want);
}

/* A barrier ends on no rank before every rank entered it: each rank in
 * turn enters last, after the others' loop has run a while. */
static void test_barrier_waits(world_t *W) {
  int P = W->n, r, late, i, early = 0, rc = 0;
  if (P < 2) return;
  for (late = 0; late < P; late++) {
    for (r = 0; r < P; r++)
      if (r != late) uvccl_barrier(&W->pg[r], &W->w[r], NULL);
    for (i = 0; i < 300; i++) uv_run(W->loop, UV_RUN_NOWAIT);
    for (r = 0; r < P; r++)
      if (r != late) early += uvccl_work_done(&W->w[r]);
    uvccl_barrier(&W->pg[late], &W->w[late], NULL);
    rc |= world_wait(W);
  }
  is_int(early + (rc != 0), 0, "P=%d: a barrier ends on no rank before its "
         "last rank enters it (each rank last in turn)", P);
}

int main(void) {
  world_t W;
  int P, t;
  /* The whole matrix twice: through shared memory (ranks of one process
   * are ranks of one host), then with $UVCCL_TRANSPORT=tcp. */
  static const char *const transports[] = {"shm", "tcp"};
  tap_alarm(600);
  uv_loop_init(&loop);
  for (t = 0; t < 2; t++)
  for (P = 1; P <= 8; P++) {
    setenv("UVCCL_TRANSPORT", transports[t], 1);
    is_int(world_init(&W, &loop, P, NULL), 0, "world of %d ranks (%s)", P,
           transports[t]);
    check_transport(&W, transports[t]);
    nbad = 0;
    test_allreduce(&W);
    is_int(nbad, 0, "P=%d: invalid dtype/op pairs refused at the call", P);
    test_allreduce_oop(&W);
    test_reduce_bcast(&W);
    test_allgather(&W);
    test_gather_scatter(&W);
    test_reduce_scatter(&W);
    test_alltoall(&W);
    test_inflight(&W);
    test_barrier_waits(&W);
    world_destroy(&W);
  }
  is_int(uv_loop_close(&loop), 0, "loop closes cleanly");
  done_testing();
}
