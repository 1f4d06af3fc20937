/* broadcast and reduce: a binomial tree for small payloads (across hosts
 * alike, one tree within each host and one across the hosts), a pipelined
 * chain in the rings' order for large (a broadcast across hosts alike: a
 * chain across the hosts for each place in a host, each with its part). */
#include "algo.h"

/* ---- broadcast ----------------------------------------------------------- */

/* A binomial tree over the positions of x, rooted at position rp: buf
 * holds the root's bytes once the op returned has run. */
static uint32_t bcast_tree_on(sched_t *s, const ring_t *x, int rp, char *buf,
                              size_t n, uint32_t tag, uint32_t dep0) {
  int P = x->P, vr = mod(x->q - rp, P), mask = 1;
  uint32_t rcv = dep0;
  while (mask < P) {
    if (vr & mask) {
      rcv = uvccl__sop_recv(s, ring_at(x, vr - mask + rp), tag, buf, n);
      uvccl__sop_dep(s, dep0, rcv);
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {
    if (vr + mask < P) {
      uint32_t snd = uvccl__sop_send(s, ring_at(x, vr + mask + rp), tag, buf,
                                     n);
      uvccl__sop_dep(s, rcv, snd);
    }
    mask >>= 1;
  }
  return rcv;
}

/* Hosts alike (ring.c): the root's place in its host (l0) and its host
 * (h0) in the columns; 0 where the hosts are not alike. */
static int root_place(group_t *g, int root, ring_t *in_host, ring_t *column,
                      int *l0) {
  ring_t across;
  const int *cols;
  int L, H, i;
  if (!uvccl__ring_hosts(g, in_host, &across)) return 0;
  L = in_host->P;
  H = across.P;
  cols = uvccl__ring_columns(g);
  for (i = 0; i < L * H && cols[i] != root; i++) {
  }
  *l0 = i / H;
  column->P = H;
  column->R = cols + *l0 * H;
  column->q = across.q;
  column->left = column->right = -1; /* trees only */
  return i / H == in_host->q ? 2 : 1;
}

/* Small, across hosts alike: down the column of the root's place (one
 * message into each host), then within each host from that place:
 * H - 1 messages cross the links whatever the placement, where a tree over
 * the ranks sends up to P - L. Elsewhere a binomial tree over the ranks. */
static void bcast_small(sched_t *s, char *buf, size_t n, int root) {
  group_t *g = s->g;
  ring_t in_host, column, all = {g->size, g->rank, 0, 0, NULL};
  int l0, at = root_place(g, root, &in_host, &column, &l0), i;
  uint32_t got = NONE;
  if (at == 0) {
    bcast_tree_on(s, &all, root, buf, n, 0, NONE);
    return;
  }
  if (at == 2) {
    for (i = 0; i < column.P && column.R[i] != root; i++) {
    }
    got = bcast_tree_on(s, &column, i, buf, n, 0, NONE);
  }
  bcast_tree_on(s, &in_host, l0, buf, n, 1, got);
}

/* The chain follows the ring (ring.c) from the root's position on. */
static int ring_pos_of(const ring_t *x, int grank) {
  int i;
  if (x->R == NULL) return grank;
  for (i = 0; i < x->P && x->R[i] != grank; i++) {
  }
  return i;
}

static void bcast_chain(sched_t *s, char *buf, size_t n, int root) {
  group_t *g = s->g;
  ring_t x;
  int P = g->size, vr;
  uint32_t nseg = chain_nseg(g, n), k;
  uvccl__ring_of(g, &x);
  vr = mod(x.q - ring_pos_of(&x, root), P);
  for (k = 0; k < nseg; k++) {
    size_t o, l;
    uint32_t rcv = NONE;
    seg_range(n, nseg, k, &o, &l);
    if (vr > 0) rcv = uvccl__sop_recv(s, x.left, k, buf + o, l);
    if (vr < P - 1) {
      uint32_t snd = uvccl__sop_send(s, x.right, k, buf + o, l);
      uvccl__sop_dep(s, rcv, snd);
    }
  }
}

/* Large, across hosts alike (L ranks a host, L >= 2): the payload in L
 * parts, part j down the column of place j (a chain across the hosts
 * from the root's host on), and within each host from the rank at place j
 * to the others. In the root's host the root hands part j to place j,
 * which sends it on down its column and to its host's others, and its own
 * place's part to every rank of its host. So every rank of a host carries
 * 1/L of the bytes over a connection of its own, where one chain crosses
 * each link on one: the link still carries each byte once, but a loss
 * slows one of L streams, not the only one, and each rank does 1/L of the
 * TCP work. A directed pair carries each (part, segment) once: tagged so.
 * 0, having added nothing, where the hosts are not alike. */
static int bcast_split(sched_t *s, char *buf, size_t n, int root) {
  group_t *g = s->g;
  ring_t in_host, across;
  const int *cols;
  int L, H, l0, h0, me_l, me_h, last, i, j, m;
  size_t per;
  uint32_t nseg, k;
  if (!uvccl__ring_hosts(g, &in_host, &across)) return 0;
  L = in_host.P;
  H = across.P;
  per = (n + (size_t)L - 1) / (size_t)L;
  if (per < CHAIN_SEG_MIN) return 0;
  cols = uvccl__ring_columns(g);
  for (i = 0; i < L * H && cols[i] != root; i++) {
  }
  l0 = i / H;
  h0 = i % H;
  me_l = in_host.q;
  me_h = across.q;
  last = mod(me_h - h0, H) == H - 1; /* the end of every column */
#define AT(place, host) cols[(place) * H + mod((host), H)]
  nseg = chain_nseg_hops(g, per, H); /* H - 1 hops across, one within */
  for (j = 0; j < L; j++) {
    size_t po, pl;
    seg_range(n, (uint32_t)L, (uint32_t)j, &po, &pl);
    for (k = 0; k < nseg; k++) {
      uint32_t tag = (uint32_t)j * nseg + k, got = NONE, snd;
      size_t o, l;
      char *at;
      seg_range(pl, nseg, k, &o, &l);
      at = buf + po + o;
      if (g->rank == root) {
        /* has it: part j to place j, its own place's part to all */
        for (m = 0; m < L; m++)
          if (m != l0 && (m == j || j == l0))
            uvccl__sop_send(s, AT(m, h0), tag, at, l);
        if (j == l0 && H > 1) uvccl__sop_send(s, AT(j, h0 + 1), tag, at, l);
        continue;
      }
      if (me_h == h0)
        got = uvccl__sop_recv(s, me_l == j || j == l0 ? root : AT(j, h0),
                              tag, at, l);
      else
        got = uvccl__sop_recv(s, me_l == j ? AT(j, me_h - 1) : AT(j, me_h),
                              tag, at, l);
      if (me_l != j) continue;
      if (!last) { /* on down the column */
        snd = uvccl__sop_send(s, AT(j, me_h + 1), tag, at, l);
        uvccl__sop_dep(s, got, snd);
      }
      for (m = 0; m < L; m++) /* and to the host's others */
        if (m != j && (me_h != h0 || m != l0)) {
          snd = uvccl__sop_send(s, AT(m, me_h), tag, at, l);
          uvccl__sop_dep(s, got, snd);
        }
    }
  }
#undef AT
  return 1;
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
  if (uvccl__algo_box_fits(g, n)) {
    /* the root's bytes through shared memory, one round (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_PICK, root, buf, buf, n);
  } else if (g->size > 1) {
    if (n <= g->small_max || g->size == 2)
      bcast_small(s, buf, n, root);
    else if (!bcast_split(s, buf, n, root))
      bcast_chain(s, buf, n, root);
  }
  uvccl__sched_stream(s, n);
  uvccl__sched_describe(s, (int)dtype, count, count, root);
  return uvccl__sched_start(s, work, cb);
}

/* ---- reduce -------------------------------------------------------------- */

/* A binomial tree towards position rp of x: children reduce into w as they
 * arrive, then w goes up. The op returned ends this rank's part (at the
 * root: w holds the tree's whole reduction). */
static uint32_t reduce_tree_on(sched_t *s, const ring_t *x, int rp, char *w,
                               size_t n, uint32_t tag, uint32_t dep0) {
  int P = x->P, vr = mod(x->q - rp, P), mask = 1;
  uint32_t end = join(s, dep0);
  while (mask < P) {
    if ((vr & mask) == 0) {
      int child = vr | mask;
      if (child < P) {
        uint32_t rcv = uvccl__sop_recv_red(s, ring_at(x, child + rp), tag, w,
                                           n);
        uvccl__sop_dep(s, dep0, rcv);
        uvccl__sop_dep(s, rcv, end);
      }
    } else {
      uint32_t snd = uvccl__sop_send(s, ring_at(x, (vr & ~mask) + rp), tag, w,
                                     n);
      uvccl__sop_dep(s, end, snd);
      return snd;
    }
    mask <<= 1;
  }
  return end;
}

static int reduce_build(sched_t *s, const char *sendbuf, char *recvbuf,
                        size_t n, int root) {
  group_t *g = s->g;
  int P = g->size, r = g->rank, vr;
  char *w = r == root ? recvbuf : uvccl__sched_tmp(s, n);
  int scale = s->divisor > 1 || s->scale != 1.0;
  if (w == NULL) return UV_ENOMEM;
  if (n <= g->small_max || P <= 2) {
    ring_t in_host, column, all = {P, r, 0, 0, NULL};
    int l0, at = root_place(g, root, &in_host, &column, &l0), i;
    uint32_t cp = uvccl__sop_copy(s, w, sendbuf, n), end;
    if (at == 0) {
      end = reduce_tree_on(s, &all, root, w, n, 0, cp);
    } else {
      /* across hosts alike: within each host to the root's place, then
       * up the column of that place (H - 1 messages cross the links) */
      end = reduce_tree_on(s, &in_host, l0, w, n, 0, cp);
      if (at == 2) {
        for (i = 0; i < column.P && column.R[i] != root; i++) {
        }
        end = reduce_tree_on(s, &column, i, w, n, 1, end);
      }
    }
    if (scale && r == root) uvccl__sop_dep(s, end, uvccl__sop_scale(s, w, n));
    return 0;
  }
  {
    /* Pipelined chain towards the root (virtual ranks P-1 .. 0), in the
     * ring's order. */
    uint32_t nseg = chain_nseg(g, n), k;
    size_t es = s->esize;
    ring_t x;
    uvccl__ring_of(g, &x);
    vr = mod(x.q - ring_pos_of(&x, root), P);
    for (k = 0; k < nseg; k++) {
      size_t o, l, eo, el;
      uint32_t cp, rcv = NONE;
      seg_range(n / es, nseg, k, &eo, &el);
      o = eo * es;
      l = el * es;
      cp = uvccl__sop_copy(s, w + o, sendbuf + o, l);
      rcv = cp;
      if (vr < P - 1) {
        rcv = uvccl__sop_recv_red(s, x.right, k, w + o, l);
        uvccl__sop_dep(s, cp, rcv);
      }
      if (vr > 0) {
        uint32_t snd = uvccl__sop_send(s, x.left, k, w + o, l);
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
