/* The collectives, as schedules (see sched.c). Each builder only says who
 * sends what to whom and what waits for what; the executor does the rest.
 *
 * Choices (P ranks, S bytes; thresholds are per group, see
 * uvccl_pg_options_t):
 *  - allreduce: recursive doubling for S <= small_max (a direct exchange
 *    at P = 2; non-powers of two fold the extra ranks in first, as in
 *    Thakur et al. 2005); a ring reduce-scatter + allgather above, every
 *    chunk cut in segments so the two phases pipeline.
 *  - reduce_scatter: a ring, natively (never P allreduces).
 *  - broadcast: binomial tree for small S, a pipelined chain for large.
 *  - reduce: binomial tree for small S, a pipelined chain for large.
 *  - allgather(v): Bruck (log2 P rounds) for small totals at P > 2, else a
 *    ring, segmented.
 *  - alltoall(v), gather, scatter: every transfer posted at once.
 *  - barrier: dissemination, ceil(log2 P) rounds of empty messages.
 * Tags only need to be unique per (peer, direction) within one operation;
 * each builder numbers its messages explicitly. */
#include "cpu/internal.h"

#include <stdio.h>

#define NONE UINT32_MAX

static int mod(int a, int p) { return ((a % p) + p) % p; }

static uint32_t nseg_for(size_t bytes, size_t segment) {
  size_t n = segment ? (bytes + segment - 1) / segment : 1;
  if (n == 0) n = 1;
  if (n > 65536) n = 65536;
  return (uint32_t)n;
}

/* A NOP that waits for `a` (and later whatever is added). */
static uint32_t join(sched_t *s, uint32_t a) {
  uint32_t j = uvccl__sop_nop(s);
  uvccl__sop_dep(s, a, j);
  return j;
}

/* AVG and PREMUL_SUM: buf[0..n) scaled once, after `last`; returns the
 * op that ends it (last itself for the other reductions). */
static uint32_t then_scale(sched_t *s, char *buf, size_t n, uint32_t last) {
  uint32_t sc;
  if (s->divisor <= 1 && s->scale == 1.0) return last;
  sc = uvccl__sop_scale(s, buf, n);
  uvccl__sop_dep(s, last, sc);
  return sc;
}

static int check_count(size_t count, size_t esize, const void *p) {
  if (esize == 0) return UV_EINVAL;
  if (count > SIZE_MAX / esize / 64) return UV_EINVAL;
  if (count > 0 && p == NULL) return UV_EINVAL;
  return 0;
}

static int check_root(const group_t *g, int root) {
  return root >= 0 && root < g->size ? 0 : UV_EINVAL;
}

/* Segment k of a block of n elements cut in nseg pieces. */
static void seg_range(size_t n, uint32_t nseg, uint32_t k, size_t *off,
                      size_t *len) {
  size_t per = (n + nseg - 1) / nseg;
  size_t a = (size_t)k * per, b = a + per;
  if (a > n) a = n;
  if (b > n) b = n;
  *off = a;
  *len = b - a;
}

/* A transfer of len bytes cut in segment-sized frames (tags 0..n-1): one
 * huge frame per peer moved at half the speed of the segmented rings. Both
 * sides cut the same length the same way. */
static void send_segs(sched_t *s, int to, const void *buf, size_t len) {
  uint32_t n = nseg_for(len, s->g->segment), k;
  size_t o, l;
  for (k = 0; k < n; k++) {
    seg_range(len, n, k, &o, &l);
    uvccl__sop_send(s, to, k, (const char *)buf + o, l);
  }
}

static void recv_segs(sched_t *s, int from, void *buf, size_t len) {
  uint32_t n = nseg_for(len, s->g->segment), k;
  size_t o, l;
  for (k = 0; k < n; k++) {
    seg_range(len, n, k, &o, &l);
    uvccl__sop_recv(s, from, k, (char *)buf + o, l);
  }
}

/* ---- allreduce ------------------------------------------------------------ */

static uint32_t allreduce_rd(sched_t *s, char *buf, size_t n, uint32_t dep0) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, pof2 = 1, rem, newrank, mask, k = 1;
  uint32_t last = dep0, snd, rcv, red, fin;
  char *tmp;
  while (pof2 * 2 <= P) pof2 *= 2;
  rem = P - pof2;
  tmp = uvccl__sched_tmp(s, n);
  if (tmp == NULL) return NONE;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      /* Folds into r + 1, gets the result back at the end. */
      snd = uvccl__sop_send(s, r + 1, 0, buf, n);
      uvccl__sop_dep(s, last, snd);
      rcv = uvccl__sop_recv(s, r + 1, 0xffff, buf, n);
      uvccl__sop_dep(s, snd, rcv);
      return join(s, rcv);
    }
    rcv = uvccl__sop_recv(s, r - 1, 0, tmp, n);
    uvccl__sop_dep(s, last, rcv);
    red = uvccl__sop_reduce(s, buf, tmp, n);
    uvccl__sop_dep(s, rcv, red);
    last = red;
    newrank = r / 2;
  } else {
    newrank = r - rem;
  }
  for (mask = 1; mask < pof2; mask <<= 1, k++) {
    int nd = newrank ^ mask;
    int dst = nd < rem ? nd * 2 + 1 : nd + rem;
    snd = uvccl__sop_send(s, dst, (uint32_t)k, buf, n);
    rcv = uvccl__sop_recv(s, dst, (uint32_t)k, tmp, n);
    uvccl__sop_dep(s, last, snd);
    uvccl__sop_dep(s, last, rcv);
    /* buf may change only once its send has left */
    red = uvccl__sop_reduce(s, buf, tmp, n);
    uvccl__sop_dep(s, rcv, red);
    uvccl__sop_dep(s, snd, red);
    last = red;
  }
  last = then_scale(s, buf, n, last);
  fin = join(s, last);
  if (r < 2 * rem) {
    snd = uvccl__sop_send(s, r - 1, 0xffff, buf, n);
    uvccl__sop_dep(s, last, snd);
    uvccl__sop_dep(s, snd, fin);
  }
  return fin;
}

/* Two ranks, small: each sends its input and reduces the other's into the
 * result as it arrives: buf = src op (what came), no copy and no scratch;
 * the same orientation as recursive doubling's reduce (own op other's), so
 * the same bits. In place, buf changes only once its send has left. */
static uint32_t allreduce_pair(sched_t *s, const char *src, char *buf,
                               size_t n, uint32_t dep0) {
  int peer = 1 - s->g->rank;
  uint32_t snd = uvccl__sop_send(s, peer, 1, src, n), rcv, fin;
  uvccl__sop_dep(s, dep0, snd);
  rcv = uvccl__sop_recv_red_from(s, peer, 1, buf, src, n);
  uvccl__sop_dep(s, dep0, rcv);
  if (src == buf) uvccl__sop_dep(s, snd, rcv);
  fin = join(s, then_scale(s, buf, n, rcv));
  uvccl__sop_dep(s, snd, fin);
  return fin;
}

/* Binomial reduce into rank 0 (children reduced into buf as they come),
 * then a binomial broadcast back: 2(P - 1) messages in all and about two
 * wake-ups a rank, against recursive doubling's P log2 P messages (see
 * group_t.small_tree). buf holds this rank's input. */
static uint32_t allreduce_tree(sched_t *s, char *buf, size_t n,
                               uint32_t dep0) {
  group_t *g = s->g;
  int P = g->size, vr = g->rank, mask = 1;
  uint32_t end = join(s, dep0), up = NONE, fin, rcv;
  while (mask < P) {
    if ((vr & mask) == 0) {
      if ((vr | mask) < P) {
        rcv = n ? uvccl__sop_recv_red(s, vr | mask, 0, buf, n)
                : uvccl__sop_recv(s, vr | mask, 0, NULL, 0);
        uvccl__sop_dep(s, dep0, rcv);
        uvccl__sop_dep(s, rcv, end);
      }
    } else {
      up = uvccl__sop_send(s, vr & ~mask, 0, buf, n);
      uvccl__sop_dep(s, end, up);
      break;
    }
    mask <<= 1;
  }
  if (up == NONE) end = then_scale(s, buf, n, end); /* once, at the root */
  /* back down: receive (after our own send left) from the parent, pass on
   * to the children */
  fin = uvccl__sop_nop(s);
  rcv = up == NONE ? end : uvccl__sop_recv(s, vr & ~mask, 1, buf, n);
  if (up != NONE) uvccl__sop_dep(s, up, rcv);
  uvccl__sop_dep(s, rcv, fin);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < P && (vr & mask) == 0) {
      uint32_t snd = uvccl__sop_send(s, vr + mask, 1, buf, n);
      uvccl__sop_dep(s, rcv, snd);
      uvccl__sop_dep(s, snd, fin);
    }
  return fin;
}

/* Out of place costs no copy: the first step sends straight from src, and
 * every reducing receive computes buf = src op (what arrived), since each
 * chunk is reduced exactly once per rank. src may equal buf. */
static uint32_t allreduce_ring(sched_t *s, const char *src, char *buf,
                               size_t count, uint32_t dep0) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, st;
  int left = mod(r - 1, P), right = mod(r + 1, P);
  size_t es = s->esize, base = count / (size_t)P, extra = count % (size_t)P;
  size_t maxc = base + (extra ? 1 : 0);
  uint32_t nseg = nseg_for(maxc * es, g->segment), k;
  uint32_t *rs_send, *rs_recv, *ag_recv, *fin_k, fin;
  size_t nsteps = (size_t)(P - 1) * nseg;

  rs_send = uvccl__malloc(nsteps * sizeof(uint32_t));
  rs_recv = uvccl__malloc(nsteps * sizeof(uint32_t));
  ag_recv = uvccl__malloc(nsteps * sizeof(uint32_t));
  fin_k = uvccl__malloc(nseg * sizeof(uint32_t));
  if (!rs_send || !rs_recv || !ag_recv || !fin_k) {
    s->status = UV_ENOMEM;
    fin = NONE;
    goto out;
  }
#define CHUNK_OFF(c) ((size_t)(c) * base + ((size_t)(c) < extra ? (size_t)(c) : extra))
#define CHUNK_LEN(c) (base + ((size_t)(c) < extra ? 1 : 0))
  fin = uvccl__sop_nop(s);
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st, P), cr = mod(r - st - 1, P);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)st * nseg + k, i = (uint32_t)st * nseg + k;
      seg_range(CHUNK_LEN(cs), nseg, k, &so, &sl);
      seg_range(CHUNK_LEN(cr), nseg, k, &ro, &rl);
      rs_send[i] = uvccl__sop_send(s, right, tag,
                                   (st == 0 ? src : buf) +
                                       (CHUNK_OFF(cs) + so) * es,
                                   sl * es);
      uvccl__sop_dep(s, st == 0 ? dep0 : rs_recv[i - nseg], rs_send[i]);
      rs_recv[i] = uvccl__sop_recv_red_from(
          s, left, tag, buf + (CHUNK_OFF(cr) + ro) * es,
          src + (CHUNK_OFF(cr) + ro) * es, rl * es);
      uvccl__sop_dep(s, dep0, rs_recv[i]);
    }
  }
  /* The chunk this rank finished reducing: r + 1. Scale it once. */
  for (k = 0; k < nseg; k++) {
    uint32_t last = rs_recv[(uint32_t)(P - 2) * nseg + k];
    size_t o, l;
    int c = mod(r + 1, P);
    seg_range(CHUNK_LEN(c), nseg, k, &o, &l);
    last = then_scale(s, buf + (CHUNK_OFF(c) + o) * es, l * es, last);
    fin_k[k] = last;
    uvccl__sop_dep(s, last, fin);
  }
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r + 1 - st, P), cr = mod(r - st, P);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)(P - 1 + st) * nseg + k,
               i = (uint32_t)st * nseg + k, snd;
      seg_range(CHUNK_LEN(cs), nseg, k, &so, &sl);
      seg_range(CHUNK_LEN(cr), nseg, k, &ro, &rl);
      snd = uvccl__sop_send(s, right, tag, buf + (CHUNK_OFF(cs) + so) * es,
                            sl * es);
      uvccl__sop_dep(s, st == 0 ? fin_k[k] : ag_recv[i - nseg], snd);
      uvccl__sop_dep(s, snd, fin);
      ag_recv[i] = uvccl__sop_recv(s, left, tag,
                                   buf + (CHUNK_OFF(cr) + ro) * es, rl * es);
      /* overwrites a chunk this rank sent at the same reduce step */
      uvccl__sop_dep(s, rs_send[i], ag_recv[i]);
      uvccl__sop_dep(s, ag_recv[i], fin);
    }
  }
#undef CHUNK_OFF
#undef CHUNK_LEN
out:
  uvccl__free(rs_send);
  uvccl__free(rs_recv);
  uvccl__free(ag_recv);
  uvccl__free(fin_k);
  return fin;
}

/* A world collective of n > 0 bytes per part that boxes carry (shm.c). */
static int box_fits(const group_t *g, size_t n) {
  return g->box_ok && n > 0 && n <= UVCCL__SHM_BOX_MAX;
}

/* From src into buf (count elements; src may be buf); returns the op that
 * ends it. */
static uint32_t allreduce_build(sched_t *s, const char *src, char *buf,
                                size_t count, uint32_t dep0) {
  group_t *g = s->g;
  size_t n = count * s->esize;
  if (box_fits(g, n)) {
    /* every rank's part through shared memory, one round (shm.c) */
    uint32_t bx = uvccl__sop_box(s, UVCCL__BOX_REDUCE, -1, src, buf, n);
    uvccl__sop_dep(s, dep0, bx);
    return join(s, then_scale(s, buf, n, bx));
  }
  if (g->size == 2 && count > 0 && n <= g->small_max)
    return allreduce_pair(s, src, buf, n, dep0);
  if (src != buf && count > 0 && (g->size == 1 || n <= g->small_max)) {
    uint32_t cp = uvccl__sop_copy(s, buf, src, n);
    uvccl__sop_dep(s, dep0, cp);
    dep0 = cp;
  }
  if (g->size == 1 || count == 0) {
    uint32_t j = uvccl__sop_nop(s);
    uvccl__sop_dep(s, dep0, j);
    if (count > 0) {
      uint32_t sc = then_scale(s, buf, n, j);
      if (sc != j) return join(s, sc);
    }
    return j;
  }
  if (n <= g->small_max && g->small_tree && g->size > 2)
    return allreduce_tree(s, buf, n, dep0);
  if (n <= g->small_max) return allreduce_rd(s, buf, n, dep0);
  return allreduce_ring(s, src, buf, count, dep0);
}

int uvccl__host_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          void *recvbuf, size_t count, uvccl_dtype_t dtype,
                          uvccl_redop_t op, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), recvbuf)) != 0 ||
      (count > 0 && sendbuf == NULL))
    return rc ? rc : UV_EINVAL;
  s = uvccl__sched_new(g, "allreduce", 0);
  if (s == NULL) return UV_ENOMEM;
  rc = uvccl__sched_set_op(s, dtype, op);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  allreduce_build(s, sendbuf, recvbuf, count, NONE);
  uvccl__sched_stream(s, count * s->esize);
  uvccl__sched_describe(s, -1, count, count, -1);
  return uvccl__sched_start(s, work, cb);
}

static void free_user(sched_t *s) { uvccl__free(s->user); }

int uvccl__host_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                                    const uvccl_buf_t *bufs, size_t nbufs,
                                    uvccl_dtype_t dtype, uvccl_redop_t op,
                                    uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t i, total = 0, off = 0, es = uvccl_dtype_size(dtype);
  uint32_t in, done;
  char *flat;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if (es == 0 || (nbufs > 0 && bufs == NULL)) return UV_EINVAL;
  for (i = 0; i < nbufs; i++) {
    if (bufs[i].len % es != 0 || (bufs[i].len > 0 && bufs[i].base == NULL))
      return UV_EINVAL;
    total += bufs[i].len;
  }
  s = uvccl__sched_new(g, "allreduce_coalesced", 0);
  if (s == NULL) return UV_ENOMEM;
  rc = uvccl__sched_set_op(s, dtype, op);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  /* One flat buffer: one allreduce instead of nbufs small ones. */
  flat = uvccl__malloc(total ? total : 1);
  if (flat == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  s->user = flat;
  s->release = free_user;
  in = uvccl__sop_nop(s);
  for (i = 0; i < nbufs; i++) {
    uvccl__sop_dep(s, uvccl__sop_copy(s, flat + off, bufs[i].base,
                                      bufs[i].len), in);
    off += bufs[i].len;
  }
  done = allreduce_build(s, flat, flat, total / es, in);
  off = 0;
  for (i = 0; i < nbufs; i++) {
    uint32_t c = uvccl__sop_copy(s, bufs[i].base, flat + off, bufs[i].len);
    uvccl__sop_dep(s, done, c);
    off += bufs[i].len;
  }
  uvccl__sched_describe(s, -1, total / es, total / es, -1);
  return uvccl__sched_start(s, work, cb);
}

/* ---- reduce_scatter --------------------------------------------------------- */

/* Ring where rank r finishes with block r: at step t it sends block
 * r - t - 1 and reduces block r - t - 2 into its working copy. */
static int reduce_scatter_build(sched_t *s, const char *sendbuf, char *recvbuf,
                                const size_t *counts) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, st, c;
  int left = mod(r - 1, P), right = mod(r + 1, P);
  size_t es = s->esize, maxc = 0, total = 0, *off;
  uint32_t nseg, k, *prev;
  char *work;

  off = uvccl__malloc((size_t)P * sizeof(size_t));
  if (off == NULL) return UV_ENOMEM;
  for (c = 0; c < P; c++) {
    off[c] = total;
    total += counts[c];
    if (counts[c] > maxc) maxc = counts[c];
  }
  if (P == 1) {
    uint32_t cp = uvccl__sop_copy(s, recvbuf, sendbuf, counts[0] * es);
    if (s->divisor > 1 || s->scale != 1.0)
      uvccl__sop_dep(s, cp, uvccl__sop_scale(s, recvbuf, counts[0] * es));
    uvccl__free(off);
    return 0;
  }
  nseg = nseg_for(maxc * es, g->segment);
  work = uvccl__sched_tmp(s, total * es);
  prev = uvccl__malloc(nseg * sizeof(uint32_t));
  if (work == NULL || prev == NULL) {
    uvccl__free(off);
    uvccl__free(prev);
    return UV_ENOMEM;
  }
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st - 1, P), cr = mod(r - st - 2, P);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)st * nseg + k, snd, rcv;
      const char *src;
      char *dst;
      seg_range(counts[cs], nseg, k, &so, &sl);
      seg_range(counts[cr], nseg, k, &ro, &rl);
      src = st == 0 ? sendbuf + (off[cs] + so) * es
                    : work + (off[cs] + so) * es;
      snd = uvccl__sop_send(s, right, tag, src, sl * es);
      if (st > 0) uvccl__sop_dep(s, prev[k], snd);
      dst = cr == r ? recvbuf + ro * es : work + (off[cr] + ro) * es;
      /* each block is reduced once per rank: dst = own input op arrival */
      rcv = uvccl__sop_recv_red_from(s, left, tag, dst,
                                     sendbuf + (off[cr] + ro) * es, rl * es);
      if (cr == r && (s->divisor > 1 || s->scale != 1.0))
        uvccl__sop_dep(s, rcv, uvccl__sop_scale(s, dst, rl * es));
      prev[k] = rcv;
    }
  }
  uvccl__free(prev);
  uvccl__free(off);
  return 0;
}

static int reduce_scatter_common(uvccl_pg_t *pg, uvccl_work_t *work,
                                 const void *sendbuf, void *recvbuf,
                                 const size_t *counts, size_t even,
                                 uvccl_dtype_t dtype, uvccl_redop_t op,
                                 uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t *c = NULL, total = 0;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  c = uvccl__malloc((size_t)g->size * sizeof(size_t));
  if (c == NULL) return UV_ENOMEM;
  for (i = 0; i < g->size; i++) {
    c[i] = counts ? counts[i] : even;
    total += c[i];
  }
  if ((rc = check_count(total, uvccl_dtype_size(dtype), sendbuf)) != 0 ||
      (c[g->rank] > 0 && recvbuf == NULL)) {
    uvccl__free(c);
    return rc ? rc : UV_EINVAL;
  }
  s = uvccl__sched_new(g, "reduce_scatter", 0);
  if (s == NULL) {
    uvccl__free(c);
    return UV_ENOMEM;
  }
  rc = uvccl__sched_set_op(s, dtype, op);
  if (rc == 0 && counts == NULL && box_fits(g, even * s->esize)) {
    /* every rank's blocks through shared memory, one round (shm.c) */
    size_t n = even * s->esize;
    uint32_t bx = uvccl__sop_box(s, UVCCL__BOX_REDUCE_SCATTER, -1, sendbuf,
                                 recvbuf, n);
    then_scale(s, recvbuf, n, bx);
  } else if (rc == 0) {
    rc = reduce_scatter_build(s, sendbuf, recvbuf, c);
  }
  uvccl__sched_describe(s, -1, total, c[g->rank], -1);
  uvccl__free(c);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                               const void *sendbuf, void *recvbuf, size_t count,
                               uvccl_dtype_t dtype, uvccl_redop_t op,
                               uvccl_work_cb cb) {
  return reduce_scatter_common(pg, work, sendbuf, recvbuf, NULL, count, dtype,
                               op, cb);
}

int uvccl__host_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, uvccl_dtype_t dtype,
                                uvccl_redop_t op, uvccl_work_cb cb) {
  if (recvcounts == NULL) return UV_EINVAL;
  return reduce_scatter_common(pg, work, sendbuf, recvbuf, recvcounts, 0,
                               dtype, op, cb);
}

/* ---- broadcast ------------------------------------------------------------------ */

static void bcast_tree(sched_t *s, char *buf, size_t n, int root,
                       uint32_t tag, uint32_t dep0) {
  group_t *g = s->g;
  int P = g->size, vr = mod(g->rank - root, P), mask = 1;
  uint32_t rcv = dep0;
  while (mask < P) {
    if (vr & mask) {
      rcv = uvccl__sop_recv(s, mod(vr - mask + root, P), tag, buf, n);
      uvccl__sop_dep(s, dep0, rcv);
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {
    if (vr + mask < P) {
      uint32_t snd = uvccl__sop_send(s, mod(vr + mask + root, P), tag, buf, n);
      uvccl__sop_dep(s, rcv, snd);
    }
    mask >>= 1;
  }
}

static void bcast_chain(sched_t *s, char *buf, size_t n, int root) {
  group_t *g = s->g;
  int P = g->size, vr = mod(g->rank - root, P);
  uint32_t nseg = nseg_for(n, g->segment), k;
  for (k = 0; k < nseg; k++) {
    size_t o, l;
    uint32_t rcv = NONE;
    seg_range(n, nseg, k, &o, &l);
    if (vr > 0) rcv = uvccl__sop_recv(s, mod(g->rank - 1, P), k, buf + o, l);
    if (vr < P - 1) {
      uint32_t snd = uvccl__sop_send(s, mod(g->rank + 1, P), k, buf + o, l);
      uvccl__sop_dep(s, rcv, snd);
    }
  }
}

int uvccl__host_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                          size_t count, uvccl_dtype_t dtype, int root,
                          uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t n;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), buf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  s = uvccl__sched_new(g, "broadcast", 0);
  if (s == NULL) return UV_ENOMEM;
  n = count * uvccl_dtype_size(dtype);
  if (box_fits(g, n)) {
    /* the root's bytes through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_PICK, root, buf, buf, n);
  } else if (g->size > 1) {
    if (n <= g->small_max || g->size == 2)
      bcast_tree(s, buf, n, root, 0, NONE);
    else
      bcast_chain(s, buf, n, root);
  }
  uvccl__sched_stream(s, n);
  uvccl__sched_describe(s, (int)dtype, count, count, root);
  return uvccl__sched_start(s, work, cb);
}

/* ---- reduce --------------------------------------------------------------------- */

static int reduce_build(sched_t *s, const char *sendbuf, char *recvbuf,
                        size_t n, int root) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, vr = mod(r - root, P);
  char *w = r == root ? recvbuf : uvccl__sched_tmp(s, n);
  int scale = s->divisor > 1 || s->scale != 1.0;
  if (w == NULL) return UV_ENOMEM;
  if (n <= g->small_max || P <= 2) {
    /* Binomial tree: children reduce into w as they arrive. */
    uint32_t cp = uvccl__sop_copy(s, w, sendbuf, n), end = join(s, cp);
    int mask = 1;
    while (mask < P) {
      if ((vr & mask) == 0) {
        int child = vr | mask;
        if (child < P) {
          uint32_t rcv = uvccl__sop_recv_red(s, mod(child + root, P), 0, w, n);
          uvccl__sop_dep(s, cp, rcv);
          uvccl__sop_dep(s, rcv, end);
        }
      } else {
        uint32_t snd = uvccl__sop_send(s, mod((vr & ~mask) + root, P), 0, w, n);
        uvccl__sop_dep(s, end, snd);
        return 0;
      }
      mask <<= 1;
    }
    if (scale) uvccl__sop_dep(s, end, uvccl__sop_scale(s, w, n));
    return 0;
  }
  {
    /* Pipelined chain towards the root (virtual ranks P-1 .. 0). */
    uint32_t nseg = nseg_for(n, g->segment), k;
    size_t es = s->esize;
    for (k = 0; k < nseg; k++) {
      size_t o, l, eo, el;
      uint32_t cp, rcv = NONE;
      seg_range(n / es, nseg, k, &eo, &el);
      o = eo * es;
      l = el * es;
      cp = uvccl__sop_copy(s, w + o, sendbuf + o, l);
      rcv = cp;
      if (vr < P - 1) {
        rcv = uvccl__sop_recv_red(s, mod(r + 1, P), k, w + o, l);
        uvccl__sop_dep(s, cp, rcv);
      }
      if (vr > 0) {
        uint32_t snd = uvccl__sop_send(s, mod(r - 1, P), k, w + o, l);
        uvccl__sop_dep(s, rcv, snd);
      } else if (scale) {
        uvccl__sop_dep(s, rcv, uvccl__sop_scale(s, w + o, l));
      }
    }
  }
  return 0;
}

int uvccl__host_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype,
                       uvccl_redop_t op, int root, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), sendbuf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  if (g->rank == root && count > 0 && recvbuf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "reduce", 0);
  if (s == NULL) return UV_ENOMEM;
  rc = uvccl__sched_set_op(s, dtype, op);
  if (rc == 0 && count > 0)
    rc = reduce_build(s, sendbuf, recvbuf, count * s->esize, root);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  uvccl__sched_describe(s, -1, count, g->rank == root ? count : 0, root);
  return uvccl__sched_start(s, work, cb);
}

/* ---- allgather ------------------------------------------------------------------- */

/* Ring: at step t, block r - t goes right and block r - t - 1 comes from
 * the left, straight into its place. Used by split and the bytes
 * collectives too (lens in bytes). */
/* Bruck's allgather for small totals: ceil(log2 P) rounds instead of the
 * ring's P - 1. After round k rank r holds blocks r .. r + 2^(k+1) - 1;
 * in round k it passes the (at most 2^k) blocks it holds to r - 2^k and
 * gets the next ones from r + 2^k. Blocks land straight in place (each
 * block its own message, tagged with its index: one peer per round), so
 * no rotation or scratch copy is needed. */
static int allgather_bruck(sched_t *s, const void *sendbuf, void *const *bufs,
                           const size_t *lens) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, d, i;
  uint32_t *have = uvccl__malloc((size_t)P * sizeof(uint32_t));
  if (have == NULL) return UV_ENOMEM;
  for (i = 0; i < P; i++) have[i] = NONE;
  for (d = 1; d < P; d *= 2) {
    int to = mod(r - d, P), from = mod(r + d, P);
    int cnt = d < P - d ? d : P - d;
    uint32_t *got = uvccl__malloc((size_t)cnt * sizeof(uint32_t));
    if (got == NULL) {
      uvccl__free(have);
      return UV_ENOMEM;
    }
    for (i = 0; i < cnt; i++) {
      int b = mod(r + i, P), nb = mod(from + i, P);
      const char *src = b == r ? sendbuf : bufs[b];
      uint32_t snd = uvccl__sop_send(s, to, (uint32_t)b, src, lens[b]);
      uvccl__sop_dep(s, have[b], snd);
      got[i] = uvccl__sop_recv(s, from, (uint32_t)nb, bufs[nb], lens[nb]);
    }
    /* blocks received in this round are forwarded only in later ones */
    for (i = 0; i < cnt; i++) have[mod(from + i, P)] = got[i];
    uvccl__free(got);
  }
  uvccl__free(have);
  return 0;
}

int uvccl__allgather_build(sched_t *s, const void *sendbuf, void *const *bufs,
                           const size_t *lens) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, st, c;
  int left = mod(r - 1, P), right = mod(r + 1, P);
  size_t maxl = 0, total = 0;
  uint32_t nseg, k, *prev;
  if (sendbuf != bufs[r] && lens[r] > 0)
    uvccl__sop_copy(s, bufs[r], sendbuf, lens[r]);
  if (P == 1) return 0;
  for (c = 0; c < P; c++) {
    if (lens[c] > maxl) maxl = lens[c];
    total += lens[c];
  }
  if (P > 2 && total <= g->small_max)
    return allgather_bruck(s, sendbuf, bufs, lens);
  nseg = nseg_for(maxl, g->segment);
  prev = uvccl__malloc(nseg * sizeof(uint32_t));
  if (prev == NULL) return UV_ENOMEM;
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st, P), cr = mod(r - st - 1, P);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = (uint32_t)st * nseg + k, snd, rcv;
      const char *src;
      seg_range(lens[cs], nseg, k, &so, &sl);
      seg_range(lens[cr], nseg, k, &ro, &rl);
      src = st == 0 ? (const char *)sendbuf + so : (const char *)bufs[cs] + so;
      snd = uvccl__sop_send(s, right, tag, src, sl);
      if (st > 0) uvccl__sop_dep(s, prev[k], snd);
      rcv = uvccl__sop_recv(s, left, tag, (char *)bufs[cr] + ro, rl);
      prev[k] = rcv;
    }
  }
  uvccl__free(prev);
  return 0;
}

static int allgather_common(uvccl_pg_t *pg, uvccl_work_t *work,
                            const void *sendbuf, size_t sendcount,
                            void *recvbuf, void *const *recvbufs,
                            const size_t *recvcounts, uvccl_dtype_t dtype,
                            uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t es = uvccl_dtype_size(dtype), total = 0;
  void **bufs;
  size_t *lens;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if (es == 0) return UV_EINVAL;
  if (recvcounts != NULL && recvcounts[g->rank] != sendcount) return UV_EINVAL;
  if (sendcount > 0 && sendbuf == NULL) return UV_EINVAL;
  bufs = uvccl__malloc((size_t)g->size * sizeof(void *));
  lens = uvccl__malloc((size_t)g->size * sizeof(size_t));
  if (bufs == NULL || lens == NULL) {
    uvccl__free(bufs);
    uvccl__free(lens);
    return UV_ENOMEM;
  }
  for (i = 0; i < g->size; i++) {
    size_t c = recvcounts ? recvcounts[i] : sendcount;
    lens[i] = c * es;
    bufs[i] = recvbufs ? recvbufs[i] : (char *)recvbuf + total * es;
    total += c;
    if (lens[i] > 0 && bufs[i] == NULL) rc = UV_EINVAL;
  }
  if (rc == 0) rc = check_count(total, es, total ? (void *)1 : NULL);
  s = rc == 0 ? uvccl__sched_new(g, "allgather", 0) : NULL;
  if (rc == 0 && s == NULL) rc = UV_ENOMEM;
  if (rc == 0 && recvbufs == NULL && recvcounts == NULL &&
      box_fits(g, sendcount * es)) {
    /* every rank's part through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_CONCAT, -1, sendbuf, recvbuf, sendcount * es);
  } else if (rc == 0) {
    rc = uvccl__allgather_build(s, sendbuf, bufs, lens);
  }
  if (rc == 0) {
    uvccl__sched_stream(s, total * es);
    uvccl__sched_describe(s, (int)dtype, sendcount, total, -1);
  }
  uvccl__free(bufs);
  uvccl__free(lens);
  if (rc != 0) {
    if (s) uvccl__sched_free(s);
    return rc;
  }
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          void *recvbuf, size_t count, uvccl_dtype_t dtype,
                          uvccl_work_cb cb) {
  if (count > 0 && recvbuf == NULL) return UV_EINVAL;
  return allgather_common(pg, work, sendbuf, count, recvbuf, NULL, NULL,
                          dtype, cb);
}

int uvccl__host_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                           size_t sendcount, void *const *recvbufs,
                           const size_t *recvcounts, uvccl_dtype_t dtype,
                           uvccl_work_cb cb) {
  if (recvbufs == NULL || recvcounts == NULL) return UV_EINVAL;
  return allgather_common(pg, work, sendbuf, sendcount, NULL, recvbufs,
                          recvcounts, dtype, cb);
}

/* ---- gather / scatter --------------------------------------------------------------- */

int uvccl__host_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                       uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t n;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), sendbuf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  if (g->rank == root && count > 0 && recvbuf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "gather", 0);
  if (s == NULL) return UV_ENOMEM;
  n = count * uvccl_dtype_size(dtype);
  if (g->rank == root) {
    for (i = 0; i < g->size; i++) {
      char *dst = (char *)recvbuf + (size_t)i * n;
      if (i == root) {
        if (n) uvccl__sop_copy(s, dst, sendbuf, n);
      } else {
        recv_segs(s, i, dst, n);
      }
    }
  } else {
    send_segs(s, root, sendbuf, n);
  }
  uvccl__sched_describe(s, (int)dtype, count,
                        g->rank == root ? count * (size_t)g->size : 0, root);
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                        void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                        uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t n;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if ((rc = check_count(count, uvccl_dtype_size(dtype), recvbuf)) != 0 ||
      (rc = check_root(g, root)) != 0)
    return rc;
  if (g->rank == root && count > 0 && sendbuf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "scatter", 0);
  if (s == NULL) return UV_ENOMEM;
  n = count * uvccl_dtype_size(dtype);
  if (g->rank == root) {
    for (i = 1; i <= g->size; i++) {
      int d = mod(root + i, g->size);
      const char *src = (const char *)sendbuf + (size_t)d * n;
      if (d == root) {
        if (n) uvccl__sop_copy(s, recvbuf, src, n);
      } else {
        send_segs(s, d, src, n);
      }
    }
  } else {
    recv_segs(s, root, recvbuf, n);
  }
  uvccl__sched_describe(s, (int)dtype,
                        g->rank == root ? count * (size_t)g->size : 0, count,
                        root);
  return uvccl__sched_start(s, work, cb);
}

/* ---- alltoall ------------------------------------------------------------------------ */

static int alltoall_common(uvccl_pg_t *pg, uvccl_work_t *work,
                           const void *sendbuf, const size_t *scounts,
                           void *recvbuf, const size_t *rcounts, size_t even,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t es = uvccl_dtype_size(dtype), *soff, *roff, st = 0, rt = 0;
  int rc = uvccl__pg_check(pg, work, &g), i, P;
  if (rc != 0) return rc;
  if (es == 0) return UV_EINVAL;
  P = g->size;
  soff = uvccl__malloc((size_t)(P + 1) * sizeof(size_t));
  roff = uvccl__malloc((size_t)(P + 1) * sizeof(size_t));
  if (soff == NULL || roff == NULL) {
    uvccl__free(soff);
    uvccl__free(roff);
    return UV_ENOMEM;
  }
  for (i = 0; i < P; i++) {
    soff[i] = st;
    roff[i] = rt;
    st += scounts ? scounts[i] : even;
    rt += rcounts ? rcounts[i] : even;
  }
  soff[P] = st;
  roff[P] = rt;
  if ((rc = check_count(st, es, sendbuf)) != 0 ||
      (rc = check_count(rt, es, recvbuf)) != 0 ||
      (rt > 0 && sendbuf == recvbuf)) {
    uvccl__free(soff);
    uvccl__free(roff);
    return rc ? rc : UV_EINVAL;
  }
  s = uvccl__sched_new(g, "alltoall", 0);
  if (s == NULL) {
    uvccl__free(soff);
    uvccl__free(roff);
    return UV_ENOMEM;
  }
  if (scounts == NULL && rcounts == NULL && box_fits(g, even * es)) {
    /* every rank's blocks through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_ALLTOALL, -1, sendbuf, recvbuf, even * es);
    P = 0; /* no messages */
  }
  /* Pairwise order (r+1, r+2, ...) spreads the load over the peers. */
  for (i = 0; i < P; i++) {
    int to = mod(g->rank + i, P), from = mod(g->rank - i, P);
    size_t sl = (soff[to + 1] - soff[to]) * es,
           rl = (roff[from + 1] - roff[from]) * es;
    if (i == 0) {
      if (sl != rl) rc = UV_EINVAL;
      else if (sl) uvccl__sop_copy(s, (char *)recvbuf + roff[from] * es,
                                   (const char *)sendbuf + soff[to] * es, sl);
      continue;
    }
    /* segmented: 64 MiB at W=2 went from 35-41 ms to 17-20 ms */
    send_segs(s, to, (const char *)sendbuf + soff[to] * es, sl);
    recv_segs(s, from, (char *)recvbuf + roff[from] * es, rl);
  }
  uvccl__free(soff);
  uvccl__free(roff);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  uvccl__sched_describe(s, (int)dtype, st, rt, -1);
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                         void *recvbuf, size_t count, uvccl_dtype_t dtype,
                         uvccl_work_cb cb) {
  return alltoall_common(pg, work, sendbuf, NULL, recvbuf, NULL, count, dtype,
                         cb);
}

int uvccl__host_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          const size_t *sendcounts, void *recvbuf,
                          const size_t *recvcounts, uvccl_dtype_t dtype,
                          uvccl_work_cb cb) {
  if (sendcounts == NULL || recvcounts == NULL) return UV_EINVAL;
  return alltoall_common(pg, work, sendbuf, sendcounts, recvbuf, recvcounts, 0,
                         dtype, cb);
}

/* ---- barriers --------------------------------------------------------------------------- */

int uvccl__host_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  s = uvccl__sched_new(g, "barrier", 0);
  if (s == NULL) return UV_ENOMEM;
  s->ordered = 1;
  if (g->box_ok) {
    /* every rank's (empty) part through shared memory (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_REDUCE, -1, NULL, NULL, 0);
    return uvccl__sched_start(s, work, cb);
  }
  if (g->small_tree && g->size > 2) {
    /* (group_t.small_tree) an empty allreduce: up the tree, down again */
    allreduce_tree(s, NULL, 0, NONE);
    return uvccl__sched_start(s, work, cb);
  }
  uvccl__barrier_build(s, 0, NONE);
  return uvccl__sched_start(s, work, cb);
}

uint32_t uvccl__barrier_build(sched_t *s, uint32_t tag0, uint32_t after) {
  group_t *g = s->g;
  uint32_t last = after, k = 0;
  int dist;
  /* Dissemination: round k talks to rank +- 2^k. */
  for (dist = 1; dist < g->size; dist <<= 1, k++) {
    uint32_t snd = uvccl__sop_send(s, mod(g->rank + dist, g->size), tag0 + k,
                                   NULL, 0);
    uint32_t rcv = uvccl__sop_recv(s, mod(g->rank - dist, g->size), tag0 + k,
                                   NULL, 0);
    uint32_t j = uvccl__sop_nop(s);
    uvccl__sop_dep(s, last, snd);
    uvccl__sop_dep(s, last, rcv);
    uvccl__sop_dep(s, snd, j);
    uvccl__sop_dep(s, rcv, j);
    last = j;
  }
  return last;
}

int uvccl__host_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all,
                                  uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  s = uvccl__sched_new(g, "monitored_barrier", 0);
  if (s == NULL) return UV_ENOMEM;
  s->ordered = 1;
  s->list_waiting = wait_all ? 2 : 1;
  if (g->rank == 0) {
    uint32_t all = uvccl__sop_nop(s);
    for (i = 1; i < g->size; i++)
      uvccl__sop_dep(s, uvccl__sop_recv(s, i, 0, NULL, 0), all);
    for (i = 1; i < g->size; i++)
      uvccl__sop_dep(s, all, uvccl__sop_send(s, i, 1, NULL, 0));
  } else {
    uvccl__sop_send(s, 0, 0, NULL, 0);
    uvccl__sop_recv(s, 0, 1, NULL, 0);
  }
  return uvccl__sched_start(s, work, cb);
}

/* ---- point to point ----------------------------------------------------------------------- */

static int p2p_finish(sched_t *s) {
  group_t *g = s->g;
  uvccl_p2p_op_t *ops = s->user;
  uint32_t i;
  if (ops == NULL) {
    sop_t *op = &s->ops[0];
    if (op->type == SOP_RECV) {
      s->w->result = op->source >= 0 ? g->inv[op->source] : -1;
      s->w->value_len = op->len;
    }
    return 0;
  }
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->type != SOP_RECV) continue;
    ops[i].received = op->len;
    ops[i].source = op->source >= 0 ? g->inv[op->source] : -1;
  }
  return 0;
}

static int p2p_peer_ok(group_t *g, int peer, int any_ok) {
  if (peer == UVCCL_ANY_SOURCE) return any_ok ? 0 : UV_EINVAL;
  if (peer < 0 || peer >= g->size || peer == g->rank) return UV_EINVAL;
  return 0;
}

int uvccl__host_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                     size_t len, int dst, int tag, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = p2p_peer_ok(g, dst, 0)) != 0 || (len > 0 && buf == NULL))
    return rc ? rc : UV_EINVAL;
  s = uvccl__sched_new(g, "send", 1);
  if (s == NULL) return UV_ENOMEM;
  uvccl__sop_send(s, dst, (uint32_t)tag, buf, len);
  uvccl__sched_describe(s, -1, len, 0, -1);
  s->desc.peer = dst;
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
                     int src, int tag, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = p2p_peer_ok(g, src, 1)) != 0 || (len > 0 && buf == NULL))
    return rc ? rc : UV_EINVAL;
  s = uvccl__sched_new(g, "recv", 1);
  if (s == NULL) return UV_ENOMEM;
  uvccl__sop_recv(s, src, (uint32_t)tag, buf, len);
  s->finish = p2p_finish;
  uvccl__sched_describe(s, -1, 0, len, -1);
  s->desc.peer = src;
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops,
                          size_t nops, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t i;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if (nops > 0 && ops == NULL) return UV_EINVAL;
  for (i = 0; i < nops; i++) {
    rc = p2p_peer_ok(g, ops[i].peer, !ops[i].is_send);
    if (rc != 0 || (ops[i].len > 0 && ops[i].buf == NULL)) return UV_EINVAL;
  }
  s = uvccl__sched_new(g, "p2p_batch", 1);
  if (s == NULL) return UV_ENOMEM;
  for (i = 0; i < nops; i++) {
    if (ops[i].is_send)
      uvccl__sop_send(s, ops[i].peer, (uint32_t)ops[i].tag, ops[i].buf,
                      ops[i].len);
    else
      uvccl__sop_recv(s, ops[i].peer, (uint32_t)ops[i].tag, ops[i].buf,
                      ops[i].len);
  }
  s->user = ops;
  s->finish = p2p_finish;
  {
    uint64_t in = 0, out = 0;
    for (i = 0; i < nops; i++) {
      if (ops[i].is_send) in += ops[i].len;
      else out += ops[i].len;
    }
    uvccl__sched_describe(s, -1, in, out, -1);
  }
  return uvccl__sched_start(s, work, cb);
}
