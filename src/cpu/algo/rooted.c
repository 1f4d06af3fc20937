/* broadcast and reduce: a binomial tree for small payloads, a pipelined
 * chain for large. */
#include "algo.h"

/* ---- broadcast ----------------------------------------------------------- */

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
  uint32_t nseg = nseg_for(n, g->segment), k;
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
      bcast_tree(s, buf, n, root, 0, NONE);
    else
      bcast_chain(s, buf, n, root);
  }
  uvccl__sched_stream(s, n);
  uvccl__sched_describe(s, (int)dtype, count, count, root);
  return uvccl__sched_start(s, work, cb);
}

/* ---- reduce -------------------------------------------------------------- */

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
    /* Pipelined chain towards the root (virtual ranks P-1 .. 0), in the
     * ring's order. */
    uint32_t nseg = nseg_for(n, g->segment), k;
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
