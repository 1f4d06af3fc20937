/* allreduce and allreduce_coalesced: recursive doubling, boxes, or a
 * segmented ring reduce-scatter + allgather (see algo.h). */
#include "algo.h"

/* ---- allreduce ----------------------------------------------------------- */

/* Recursive doubling over the ring x's positions (the whole group, or the
 * hosts' leaders): log2 P rounds, the ranks past a power of two folded
 * into their neighbours first and given the result last. */
static uint32_t allreduce_rd(sched_t *s, const ring_t *x, char *buf, size_t n,
                             uint32_t dep0) {
  int P = x->P, r = x->q, pof2 = 1, rem, newrank, mask, k = 1;
  uint32_t last = dep0, snd, rcv, red, fin;
  char *tmp;
  while (pof2 * 2 <= P) pof2 *= 2;
  rem = P - pof2;
  tmp = uvccl__sched_tmp(s, n);
  if (tmp == NULL) return NONE;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      /* Folds into r + 1, gets the result back at the end. */
      snd = uvccl__sop_send(s, ring_at(x, r + 1), 0, buf, n);
      uvccl__sop_dep(s, last, snd);
      rcv = uvccl__sop_recv(s, ring_at(x, r + 1), 0xffff, buf, n);
      uvccl__sop_dep(s, snd, rcv);
      return join(s, rcv);
    }
    rcv = uvccl__sop_recv(s, ring_at(x, r - 1), 0, tmp, n);
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
    int dst = ring_at(x, nd < rem ? nd * 2 + 1 : nd + rem);
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
    snd = uvccl__sop_send(s, ring_at(x, r - 1), 0xffff, buf, n);
    uvccl__sop_dep(s, last, snd);
    uvccl__sop_dep(s, snd, fin);
  }
  return fin;
}

/* Across hosts, small: each host's ranks hand their inputs to its leader
 * (its first rank in the ring) through shared memory, the leaders run
 * recursive doubling across the hosts, and each hands the result back.
 * Only the leaders touch the network: H log2 H messages cross the links
 * where recursive doubling over all sends P log2 P, and on a host whose
 * CPUs are shared the ranks that wait on the network are fewer. The
 * leader reduces its members' inputs as they come, as the tree does; every
 * rank gets the leaders' bits. Hosts of any sizes; NONE where the ranks
 * are not on several hosts, one with two ranks or more (n may be 0: a
 * barrier). */
uint32_t uvccl__algo_allreduce_hosts(sched_t *s, char *buf, size_t n,
                                     uint32_t dep0) {
  group_t *g = s->g;
  ring_t in_host, across;
  uint32_t got, fin, rcv, snd;
  int i;
  if (!uvccl__ring_leaders(g, &in_host, &across)) return NONE;
  if (in_host.q != 0) { /* a member: its input up, the result back */
    int leader = ring_at(&in_host, 0);
    snd = uvccl__sop_send(s, leader, 0, buf, n);
    uvccl__sop_dep(s, dep0, snd);
    rcv = uvccl__sop_recv(s, leader, 0xfffe, buf, n);
    uvccl__sop_dep(s, snd, rcv);
    return join(s, rcv);
  }
  /* The leaders' pairs all cross hosts, the members' stay in one: their
   * tags cannot meet. */
  got = join(s, dep0);
  for (i = 1; i < in_host.P; i++) {
    int m = ring_at(&in_host, i);
    rcv = n ? uvccl__sop_recv_red(s, m, 0, buf, n)
            : uvccl__sop_recv(s, m, 0, NULL, 0);
    uvccl__sop_dep(s, dep0, rcv);
    uvccl__sop_dep(s, rcv, got);
  }
  got = allreduce_rd(s, &across, buf, n, got);
  if (got == NONE) return NONE;
  fin = uvccl__sop_nop(s);
  uvccl__sop_dep(s, got, fin);
  for (i = 1; i < in_host.P; i++) {
    snd = uvccl__sop_send(s, ring_at(&in_host, i), 0xfffe, buf, n);
    uvccl__sop_dep(s, got, snd);
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
uint32_t uvccl__algo_allreduce_tree(sched_t *s, char *buf, size_t n,
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

/* The tags a crossing of one segment of a chunk of len elements takes
 * (crossings go segment by segment, each its tags apart), or 0 where the
 * chunk crosses whole: a segment that would not give every host a part,
 * or tags that would not fit. */
static uint32_t cross_stride(size_t len, uint32_t nseg, int H, size_t es,
                             size_t segment) {
  size_t o, l;
  uint64_t stride;
  seg_range(len, nseg, nseg - 1, &o, &l);
  if (nseg < 2 || l < (size_t)H) return 0;
  seg_range(len, nseg, 0, &o, &l); /* the longest */
  stride = 2u * (uint64_t)(H - 1) *
           nseg_for((l + (size_t)H - 1) / (size_t)H * es, segment);
  return stride * nseg < (1u << 30) ? (uint32_t)stride : 0;
}

/* Out of place costs no copy: the first step sends straight from src, and
 * every reducing receive computes buf = src op (what arrived), since each
 * chunk is reduced exactly once per rank. src may equal buf.
 *
 * Over the ring x (the whole group, or a host's ranks). With cross (the
 * ranks of every host at this rank's place in its host), the chunk this
 * rank finished reducing within its host is allreduced across the hosts
 * on that ring (segment by segment where each segment gives every host a
 * part) before the allgather spreads it in the host again: each
 * host's link then carries 2(H-1)/H of the buffer each way, where one
 * ring over all ranks carries 2(P-1)/P. The two rings share no pair of
 * ranks (one stays in a host, the other leaves it), so their tags cannot
 * meet. */
static uint32_t allreduce_ring_on(sched_t *s, const ring_t *xr,
                                  const ring_t *cross, const char *src,
                                  char *buf, size_t count, uint32_t dep0,
                                  uint32_t tag0) {
  group_t *g = s->g;
  ring_t x = *xr;
  int P = x.P, r, st, left, right;
  size_t es = s->esize, base = count / (size_t)P, extra = count % (size_t)P;
  size_t maxc = base + (extra ? 1 : 0);
  uint32_t nseg = nseg_for(maxc * es, g->segment), k;
  uint32_t *rs_send, *rs_recv, *ag_recv, *fin_k, *gate = NULL, fin, stride;
  size_t nsteps = (size_t)(P - 1) * nseg;

  /* Chunks are numbered by ring position (any numbering every rank
   * shares would do): r is this rank's position. */
  r = x.q;
  left = x.left;
  right = x.right;

  rs_send = uvccl__malloc(nsteps * sizeof(uint32_t));
  rs_recv = uvccl__malloc(nsteps * sizeof(uint32_t));
  ag_recv = uvccl__malloc(nsteps * sizeof(uint32_t));
  fin_k = uvccl__malloc(nseg * sizeof(uint32_t));
  if (!rs_send || !rs_recv || !ag_recv || !fin_k) {
    s->status = UV_ENOMEM;
    fin = NONE;
    goto out;
  }
#define CHUNK_OFF(c) \
  ((size_t)(c)*base + ((size_t)(c) < extra ? (size_t)(c) : extra))
#define CHUNK_LEN(c) (base + ((size_t)(c) < extra ? 1 : 0))
  fin = uvccl__sop_nop(s);
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st, P), cr = mod(r - st - 1, P);
    for (k = 0; k < nseg; k++) {
      size_t so, sl, ro, rl;
      uint32_t tag = tag0 + (uint32_t)st * nseg + k,
               i = (uint32_t)st * nseg + k;
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
  /* The chunk this rank finished reducing: r + 1. Across the hosts, then
   * (scaled there once); else scale it once here. */
  stride = cross != NULL ? cross_stride(CHUNK_LEN(mod(r + 1, P)), nseg,
                                        cross->P, es, g->segment)
                          : 0;
  if (cross != NULL && stride == 0) {
    int c = mod(r + 1, P);
    uint32_t all = uvccl__sop_nop(s), across;
    for (k = 0; k < nseg; k++)
      uvccl__sop_dep(s, rs_recv[(uint32_t)(P - 2) * nseg + k], all);
    across = CHUNK_LEN(c) == 0
                 ? all
                 : allreduce_ring_on(s, cross, NULL, buf + CHUNK_OFF(c) * es,
                                     buf + CHUNK_OFF(c) * es, CHUNK_LEN(c),
                                     all, 0);
    if (across == NONE) {
      fin = NONE;
      goto out;
    }
    for (k = 0; k < nseg; k++) {
      fin_k[k] = across;
    }
    uvccl__sop_dep(s, across, fin);
  } else if (cross != NULL) {
    /* Segment by segment: segment k crosses the hosts once this rank has
     * reduced it within its host, and goes round the host again once it
     * has crossed, so the host's copies overlap the link. Each crossing
     * is a ring of its own (tags apart), gated on the left neighbour's
     * crossing of segment k - CROSS_AHEAD: the L connections leaving a
     * host then move alike, where each alone would finish when its TCP's
     * share of the link let it, the last alone at its share. */
    int c = mod(r + 1, P);
    gate = uvccl__malloc(nseg * sizeof(uint32_t));
    if (gate == NULL) {
      s->status = UV_ENOMEM;
      fin = NONE;
      goto out;
    }
    for (k = 0; k < nseg; k++) {
      size_t o, l;
      seg_range(CHUNK_LEN(c), nseg, k, &o, &l);
      gate[k] = join(s, rs_recv[(uint32_t)(P - 2) * nseg + k]);
      fin_k[k] = allreduce_ring_on(s, cross, NULL,
                                   buf + (CHUNK_OFF(c) + o) * es,
                                   buf + (CHUNK_OFF(c) + o) * es, l, gate[k],
                                   k * stride);
      if (fin_k[k] == NONE) {
        fin = NONE;
        goto out;
      }
      uvccl__sop_dep(s, fin_k[k], fin);
    }
  }
  for (k = 0; cross == NULL && k < nseg; k++) {
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
      uint32_t tag = tag0 + (uint32_t)(P - 1 + st) * nseg + k,
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
  for (k = CROSS_AHEAD; gate != NULL && k < nseg; k++)
    uvccl__sop_dep(s, ag_recv[k - CROSS_AHEAD], gate[k]);
#undef CHUNK_OFF
#undef CHUNK_LEN
out:
  uvccl__free(gate);
  uvccl__free(rs_send);
  uvccl__free(rs_recv);
  uvccl__free(ag_recv);
  uvccl__free(fin_k);
  return fin;
}

/* Hosts of different sizes, large: segment by segment, each host's ranks
 * reduce down a chain to its leader (shared memory), the leaders allreduce
 * the segment across the hosts in a ring of their own (uvccl__ring_leaders),
 * and the segment goes back up the chain from the leader. Each host's link
 * then carries 2(H-1)/H of the buffer each way, where one ring over all
 * ranks carries 2(P-1)/P: 1.5 times as much for hosts of 3 and 1, 1.7 for
 * hosts of 4 and 3 (a shrink leaves such worlds). The chains
 * stay in a host and the leaders' rings leave it, so their tags cannot
 * meet; every rank gets its leader's bits. Where the segments' crossings
 * would not fit their tags, the buffer goes in one piece. */
static uint32_t allreduce_leaders(sched_t *s, const ring_t *in_host,
                                  const ring_t *leaders, const char *src,
                                  char *buf, size_t count, uint32_t dep0) {
  group_t *g = s->g;
  int L = in_host->P, i = in_host->q, H = leaders->P;
  int down = i > 0 ? ring_at(in_host, i - 1) : -1;
  int up = i < L - 1 ? ring_at(in_host, i + 1) : -1;
  size_t es = s->esize;
  uint32_t nseg = nseg_for(count * es, g->segment), k, stride, fin;
  stride = cross_stride(count, nseg, H, es, g->segment);
  if (stride == 0) nseg = 1;
  fin = uvccl__sop_nop(s);
  for (k = 0; k < nseg; k++) {
    size_t o, l;
    uint32_t in = dep0, red_snd = NONE, done, rcv, snd;
    const char *mine = src;
    seg_range(count, nseg, k, &o, &l);
    o *= es;
    if (up >= 0) { /* the chain's part from above, onto this rank's */
      in = uvccl__sop_recv_red_from(s, up, k, buf + o, src + o, l * es);
      uvccl__sop_dep(s, dep0, in);
      mine = buf;
    }
    if (down >= 0) {
      red_snd = uvccl__sop_send(s, down, k, mine + o, l * es);
      uvccl__sop_dep(s, in, red_snd);
      /* the result comes back into buf once this rank's part has left */
      rcv = uvccl__sop_recv(s, down, nseg + k, buf + o, l * es);
      uvccl__sop_dep(s, red_snd, rcv);
      done = rcv;
    } else {
      done = allreduce_ring_on(s, leaders, NULL, mine + o, buf + o, l, in,
                               k * stride);
      if (done == NONE) return NONE;
    }
    uvccl__sop_dep(s, done, fin);
    if (up >= 0) {
      snd = uvccl__sop_send(s, up, nseg + k, buf + o, l * es);
      uvccl__sop_dep(s, done, snd);
      uvccl__sop_dep(s, snd, fin);
    }
  }
  return fin;
}

/* A world collective of n > 0 bytes per part that boxes carry (shm_box.c). */
int uvccl__algo_box_fits(const group_t *g, size_t n) {
  return g->box_ok && n > 0 && n <= UVCCL__SHM_BOX_MAX;
}

/* From src into buf (count elements; src may be buf); returns the op that
 * ends it. */
static uint32_t allreduce_build(sched_t *s, const char *src, char *buf,
                                size_t count, uint32_t dep0) {
  group_t *g = s->g;
  size_t n = count * s->esize;
  if (uvccl__algo_box_fits(g, n)) {
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
    return uvccl__algo_allreduce_tree(s, buf, n, dep0);
  if (n <= g->small_max) {
    ring_t x = {g->size, g->rank, 0, 0, NULL};
    uint32_t h = uvccl__algo_allreduce_hosts(s, buf, n, dep0);
    return h != NONE ? h : allreduce_rd(s, &x, buf, n, dep0);
  }
  {
    ring_t x, in_host, across;
    if (uvccl__ring_hosts(g, &in_host, &across) &&
        count >= (size_t)g->size)
      return allreduce_ring_on(s, &in_host, &across, src, buf, count, dep0,
                               0);
    if (uvccl__ring_leaders(g, &in_host, &across) &&
        count >= (size_t)g->size)
      return allreduce_leaders(s, &in_host, &across, src, buf, count, dep0);
    uvccl__ring_of(g, &x);
    return allreduce_ring_on(s, &x, NULL, src, buf, count, dep0, 0);
  }
}

int uvccl__host_allreduce(uvccl_pg_t *pg, uvccl_work_t *work,
                          const void *sendbuf, void *recvbuf, size_t count,
                          uvccl_dtype_t dtype, uvccl_redop_t op,
                          uvccl_work_cb cb) {
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

/* The flat buffer: a large one comes from the net's spares and goes
 * back to them (sched.c says why). */
static void free_flat(sched_t *s) {
  uvccl__net_scratch_put(s->g->net, s->user, s->user_cap);
  s->user_cap = 0;
}

static char *flat_alloc(sched_t *s, size_t len) {
  char *p = uvccl__net_scratch_get(s->g->net, len, &s->user_cap);
  if (p == NULL) return NULL;
  s->user = p;
  s->release = free_flat;
  return p;
}

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
  flat = flat_alloc(s, total);
  if (flat == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
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
