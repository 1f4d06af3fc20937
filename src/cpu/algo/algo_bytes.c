/* Byte payloads of different lengths: the C side of c10d's object
 * collectives (broadcast_object_list, all_gather_object, gather_object,
 * scatter_object_list). Each runs in two phases inside one schedule: the
 * lengths travel first, then a glue op allocates the results (owned by the
 * work) and points the second phase's receives at them, and the payloads
 * travel straight into place. A rank's own payload is sent from the
 * caller's buffer, and copied into its result by a copy op that the glue
 * points (a copy op runs in slices: a large payload never holds the loop
 * in one callback). */
#include "cpu/internal.h"

#include <stdio.h>

#define NONE UINT32_MAX

static int mod(int a, int p) { return ((a % p) + p) % p; }

typedef struct {
  uint64_t mylen;
  uint64_t *lens;          /* per rank */
  const void *src;         /* this rank's payload */
  int root;
  uint32_t first2;         /* first op of the second phase */
  int *block;              /* second-phase op -> the rank whose bytes */
  uint32_t nblock;         /* (-1: sends from the caller's buffer) */
  uint32_t own;            /* the copy of src into its result (NONE) */
} bytes_t;

static void bytes_release(sched_t *s) {
  bytes_t *b = s->user;
  if (b == NULL) return;
  uvccl__free(b->lens);
  uvccl__free(b->block);
  uvccl__free(b);
}

static bytes_t *bytes_new(sched_t *s, int P) {
  bytes_t *b = uvccl__calloc(1, sizeof(*b));
  if (b == NULL) return NULL;
  b->lens = uvccl__calloc((size_t)P, sizeof(uint64_t));
  if (b->lens == NULL) {
    uvccl__free(b);
    return NULL;
  }
  b->own = NONE;
  s->sizes_late = 1; /* values' sizes are learned as it runs */
  s->user = b;
  s->release = bytes_release;
  return b;
}

/* The copy of this rank's payload into its result, after `after`; the
 * glue sets where (own_point). */
static void own_copy(sched_t *s, bytes_t *b, uint32_t after) {
  b->own = uvccl__sop_copy(s, NULL, NULL, 0);
  uvccl__sop_dep(s, after, b->own);
}

static void own_point(sched_t *s, bytes_t *b, void *dst) {
  sop_t *op = &s->ops[b->own];
  op->buf = dst;
  op->src = b->src;
  op->len = (size_t)b->mylen;
}

static int block_map(bytes_t *b, sched_t *s, uint32_t op, int rank) {
  uint32_t i = op - b->first2, k;
  int *m;
  if (i >= b->nblock) {
    m = uvccl__realloc(b->block, (i + 1) * sizeof(int));
    if (m == NULL) return UV_ENOMEM;
    for (k = b->nblock; k < i; k++) m[k] = -1;
    b->block = m;
    b->nblock = i + 1;
  }
  b->block[i] = rank;
  (void)s;
  return 0;
}

/* Allocates work->values (n entries with the given lengths). */
static int alloc_values(uvccl_work_t *w, const uint64_t *lens, int n) {
  int i;
  w->values = uvccl__calloc((size_t)n, sizeof(uvccl_buf_t));
  if (w->values == NULL) return UV_ENOMEM;
  w->nvalues = (size_t)n;
  for (i = 0; i < n; i++) {
    if (lens[i] > ((uint64_t)1 << 40)) return UVCCL_ELIMIT;
    w->values[i].base = uvccl__malloc((size_t)lens[i] + 1);
    if (w->values[i].base == NULL) return UV_ENOMEM;
    ((char *)w->values[i].base)[lens[i]] = '\0';
    w->values[i].len = (size_t)lens[i];
  }
  return 0;
}

/* Points every second-phase op at its block's result buffer. */
static void patch_ops(sched_t *s, bytes_t *b) {
  uint32_t i;
  uvccl_work_t *w = s->w;
  for (i = b->first2; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    int blk;
    if (op->type != SOP_SEND && op->type != SOP_RECV) continue;
    if (i - b->first2 >= b->nblock) continue;
    blk = b->block[i - b->first2];
    if (blk < 0) continue; /* sends from the caller's buffer */
    op->buf = w->values[blk].base;
    op->len = w->values[blk].len;
  }
}

/* ---- broadcast_bytes ---------------------------------------------------- */

/* Binomial tree; returns the receive (or dep0 at the root). With map,
 * every op it adds is mapped to block 0 (the root's sends: to the
 * caller's buffer, buf). */
static uint32_t tree(sched_t *s, bytes_t *b, void *buf, size_t n, int root,
                     uint32_t tag, uint32_t dep0, int map) {
  group_t *g = s->g;
  int P = g->size, vr = mod(g->rank - root, P), mask = 1;
  uint32_t rcv = dep0;
  while (mask < P) {
    if (vr & mask) {
      rcv = uvccl__sop_recv(s, mod(vr - mask + root, P), tag, buf, n);
      uvccl__sop_dep(s, dep0, rcv);
      if (map && block_map(b, s, rcv, 0) != 0) s->status = UV_ENOMEM;
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {
    if (vr + mask < P) {
      uint32_t snd = uvccl__sop_send(s, mod(vr + mask + root, P), tag, buf, n);
      uvccl__sop_dep(s, rcv, snd);
      if (map && block_map(b, s, snd, vr == 0 ? -1 : 0) != 0)
        s->status = UV_ENOMEM;
    }
    mask >>= 1;
  }
  return rcv;
}

static int bcast_alloc(sched_t *s, sop_t *op) {
  bytes_t *b = s->user;
  int rc = alloc_values(s->w, &b->mylen, 1);
  (void)op;
  if (rc != 0) return rc;
  if (b->own != NONE) own_point(s, b, s->w->values[0].base);
  patch_ops(s, b);
  return 0;
}

/* The single value moves from values[0] to value/value_len. */
static int bcast_finish(sched_t *s) {
  uvccl_work_t *w = s->w;
  w->value = w->values[0].base;
  w->value_len = w->values[0].len;
  uvccl__free(w->values);
  w->values = NULL;
  w->nvalues = 0;
  return 0;
}

int uvccl__host_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                                size_t len, int root, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  bytes_t *b;
  uint32_t got, call;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if (root < 0 || root >= g->size) return UV_EINVAL;
  if (g->rank == root && len > 0 && buf == NULL) return UV_EINVAL;
  s = uvccl__sched_new(g, "broadcast_bytes", 0);
  if (s != NULL) uvccl__sched_describe(s, -1, len, 0, root);
  if (s == NULL) return UV_ENOMEM;
  b = bytes_new(s, 1);
  if (b == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  b->root = root;
  b->src = buf;
  b->mylen = g->rank == root ? len : 0;
  got = tree(s, b, &b->mylen, sizeof(b->mylen), root, 0, NONE, 0);
  call = uvccl__sop_call(s, bcast_alloc);
  uvccl__sop_dep(s, got, call);
  if (g->rank == root) own_copy(s, b, call);
  b->first2 = s->nops;
  /* (the root sends from the caller's buffer) */
  tree(s, b, g->rank == root ? (void *)buf : NULL, g->rank == root ? len : 0,
       root, 1, call, 1);
  s->finish = bcast_finish;
  return uvccl__sched_start(s, work, cb);
}

/* ---- allgather_bytes ------------------------------------------------------ */

/* Once every length is known: the result buffers, this rank's own bytes
 * in place, and the receives pointed at them (allgather and gather). */
static int values_alloc(sched_t *s, sop_t *op) {
  bytes_t *b = s->user;
  int rc = alloc_values(s->w, b->lens, s->g->size);
  (void)op;
  if (rc != 0) return rc;
  if (b->own != NONE) own_point(s, b, s->w->values[s->g->rank].base);
  patch_ops(s, b);
  return 0;
}

int uvccl__host_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                                size_t len, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  bytes_t *b;
  int rc = uvccl__pg_check(pg, work, &g), P, r, st;
  uint32_t call, prev = NONE;
  if (rc != 0) return rc;
  if (len > 0 && buf == NULL) return UV_EINVAL;
  P = g->size;
  r = g->rank;
  s = uvccl__sched_new(g, "allgather_bytes", 0);
  if (s != NULL) uvccl__sched_describe(s, -1, len, 0, -1);
  if (s == NULL) return UV_ENOMEM;
  b = bytes_new(s, P);
  if (b == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  b->src = buf;
  b->mylen = len;
  b->lens[r] = len;
  call = uvccl__sop_call(s, values_alloc);
  /* Phase 1: a ring of the lengths. */
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st, P), cr = mod(r - st - 1, P);
    uint32_t snd = uvccl__sop_send(s, mod(r + 1, P), (uint32_t)st,
                                   &b->lens[cs], 8);
    uint32_t rcv = uvccl__sop_recv(s, mod(r - 1, P), (uint32_t)st,
                                   &b->lens[cr], 8);
    uvccl__sop_dep(s, prev, snd);
    uvccl__sop_dep(s, rcv, call);
    prev = rcv;
  }
  own_copy(s, b, call);
  /* Phase 2: the same ring with the payloads (ours from the caller's
   * buffer). */
  b->first2 = s->nops;
  prev = call;
  for (st = 0; st < P - 1; st++) {
    int cs = mod(r - st, P), cr = mod(r - st - 1, P);
    uint32_t tag = (uint32_t)(P + st);
    uint32_t snd = cs == r ? uvccl__sop_send(s, mod(r + 1, P), tag, buf, len)
                           : uvccl__sop_send(s, mod(r + 1, P), tag, NULL, 0);
    uint32_t rcv = uvccl__sop_recv(s, mod(r - 1, P), tag, NULL, 0);
    uvccl__sop_dep(s, prev, snd);
    uvccl__sop_dep(s, call, snd);
    uvccl__sop_dep(s, call, rcv);
    if (block_map(b, s, snd, cs == r ? -1 : cs) || block_map(b, s, rcv, cr))
      s->status = UV_ENOMEM;
    prev = rcv;
  }
  return uvccl__sched_start(s, work, cb);
}

/* ---- gather_bytes / scatter_bytes ---------------------------------------------- */


int uvccl__host_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                             size_t len, int root, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  bytes_t *b;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  if (root < 0 || root >= g->size || (len > 0 && buf == NULL))
    return UV_EINVAL;
  s = uvccl__sched_new(g, "gather_bytes", 0);
  if (s != NULL) uvccl__sched_describe(s, -1, len, 0, root);
  if (s == NULL) return UV_ENOMEM;
  b = bytes_new(s, g->size);
  if (b == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  b->src = buf;
  b->mylen = len;
  b->root = root;
  b->lens[g->rank] = len;
  if (g->rank != root) {
    uvccl__sop_send(s, root, 0, &b->mylen, 8);
    uvccl__sop_send(s, root, 1, buf, len);
    return uvccl__sched_start(s, work, cb);
  }
  {
    uint32_t call = uvccl__sop_call(s, values_alloc);
    for (i = 0; i < g->size; i++)
      if (i != root)
        uvccl__sop_dep(s, uvccl__sop_recv(s, i, 0, &b->lens[i], 8), call);
    own_copy(s, b, call);
    b->first2 = s->nops;
    for (i = 0; i < g->size; i++) {
      uint32_t rcv;
      if (i == root) continue;
      rcv = uvccl__sop_recv(s, i, 1, NULL, 0);
      uvccl__sop_dep(s, call, rcv);
      if (block_map(b, s, rcv, i) != 0) s->status = UV_ENOMEM;
    }
  }
  return uvccl__sched_start(s, work, cb);
}

static int scatter_alloc(sched_t *s, sop_t *op) {
  bytes_t *b = s->user;
  uvccl_work_t *w = s->w;
  (void)op;
  if (b->mylen > ((uint64_t)1 << 40)) return UVCCL_ELIMIT;
  w->value = uvccl__malloc((size_t)b->mylen + 1);
  if (w->value == NULL) return UV_ENOMEM;
  ((char *)w->value)[b->mylen] = '\0';
  w->value_len = (size_t)b->mylen;
  if (s->g->rank == b->root) {
    own_point(s, b, w->value);
  } else {
    s->ops[b->first2].buf = w->value;
    s->ops[b->first2].len = w->value_len;
  }
  return 0;
}

int uvccl__host_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                              const uvccl_buf_t *bufs, size_t nbufs, int root,
                              uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  bytes_t *b;
  int rc = uvccl__pg_check(pg, work, &g), i;
  uint32_t call;
  if (rc != 0) return rc;
  if (root < 0 || root >= g->size) return UV_EINVAL;
  if (g->rank == root) {
    if (bufs == NULL || nbufs != (size_t)g->size) return UV_EINVAL;
    for (i = 0; i < g->size; i++)
      if (bufs[i].len > 0 && bufs[i].base == NULL) return UV_EINVAL;
  }
  s = uvccl__sched_new(g, "scatter_bytes", 0);
  if (s == NULL) return UV_ENOMEM;
  if (g->rank == root) {
    uint64_t total = 0;
    for (i = 0; i < g->size; i++) total += bufs[i].len;
    uvccl__sched_describe(s, -1, total, 0, root);
  } else {
    uvccl__sched_describe(s, -1, 0, 0, root);
  }
  b = bytes_new(s, g->size);
  if (b == NULL) {
    uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  b->root = root;
  call = uvccl__sop_call(s, scatter_alloc);
  if (g->rank == root) {
    for (i = 0; i < g->size; i++) {
      b->lens[i] = bufs[i].len;
      if (i == root) continue;
      uvccl__sop_send(s, i, 0, &b->lens[i], 8);
      uvccl__sop_send(s, i, 1, bufs[i].base, bufs[i].len);
    }
    b->mylen = bufs[root].len;
    b->src = bufs[root].base;
    own_copy(s, b, call);
  } else {
    uint32_t rcv = uvccl__sop_recv(s, root, 0, &b->mylen, 8);
    uvccl__sop_dep(s, rcv, call);
    b->first2 = s->nops;
    uvccl__sop_dep(s, call, uvccl__sop_recv(s, root, 1, NULL, 0));
  }
  return uvccl__sched_start(s, work, cb);
}
