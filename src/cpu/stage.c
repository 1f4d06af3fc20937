/* GPU buffers in the TCP process groups: staged through pinned host memory.
 *
 * A collective handed device memory runs in three steps: the device thread
 * copies the inputs to pinned host buffers (cudaMemcpyAsync on the
 * group's staging stream, completion polled from an event), the ordinary
 * TCP collective runs on those host buffers, and the device thread copies
 * the outputs back. The caller's work completes after the last copy. So
 * GPU data can be reduced across hosts without NCCL, and several processes
 * can share one GPU (NCCL refuses two ranks on one device).
 *
 * Only a process that loaded the GPU side (any uvccl_gpu_* call or an NCCL
 * group) looks at pointers at all: plain CPU programs pay one integer test.
 * Managed memory is host-accessible and is not staged.
 *
 * Pinned buffers come from a per-group pool: allocated on the device thread
 * when none fits (cudaHostAlloc can take milliseconds, so never on the
 * loop), handed back after the copy out, freed with the group.
 *
 * Large allreduces, broadcasts, reduces, allgathers and reduce_scatters go
 * in chunks (the group's stage_chunk, larger where that would make more
 * than STAGE_MAX_CHUNKS: the link waits for the first chunk's copy in and
 * the caller for the last one's copy out, so a chunk stays a small part
 * of the whole, while each costs a collective's start and two device
 * round trips): every chunk's copy in is queued at
 * once on one stream, chunk k's collective starts once its copy is in
 * (at most STAGE_WINDOW collectives in flight, in chunk order, so every
 * rank starts them alike), and its copy out goes on a second stream as
 * soon as it ends. So the copies of one chunk overlap the transfers of the
 * others, in both directions, instead of adding to them. An allgather's
 * output (a reduce_scatter's input) is kept chunk by chunk in the pinned
 * buffer, each chunk's blocks of every rank together, so each chunk's
 * collective sees contiguous memory. */
#include "internal.h"
#include "stage.h"
#include "cuda/cuda_api.h"
#include "cuda/gpu.h"

#include <stdio.h>
#include <string.h>

typedef struct gstage_s gstage_t;

typedef struct pinned_s {
  struct pinned_s *next;
  void *p;
  size_t cap;
} pinned_t;

struct uvccl__stager_s {
  group_t *g;
  int device;
  uvccl__gpu_t *gpu;
  uvccl__gpu_client_t *client;
  void *stream;          /* (gpu) created by the first op: copies in,
                            and every copy of an operation done whole */
  void *stream_out;      /* (gpu) chunks' copies out */
  uv_mutex_t lock;       /* the pool: returned on the loop, taken on the
                            device thread */
  pinned_t *pool;
  int active;            /* stages not yet finished */
  gstage_t *order;       /* stages that have collectives to start, in the
                            order of the calls (order_run) */
  int closing;
  uvccl__gpu_op_t fin;   /* the last op: sync, free the pool and stream */
  void (*closed_cb)(void *arg);
  void *closed_arg;
};

typedef struct {
  void *user;            /* the caller's buffer */
  size_t len;
  int staged;            /* on the device: through host */
  int copy_in, copy_out;
  pinned_t *pin;         /* (gpu, then loop) the staging buffer */
  void *host;            /* what the TCP collective uses */
  int blocks;            /* chunked: the ranks' blocks of count elements
                            it holds (allgather's output, reduce_scatter's
                            input), kept chunk by chunk in host; else 1 */
  int on_device;         /* user is device memory (else host memory,
                            staged only so that a chunk is contiguous) */
} sbuf_t;

/* One chunk of a chunked stage: elements [off, off + n) of count. */
typedef struct {
  gstage_t *st;
  size_t off, n;
  uvccl__gpu_op_t gin, gout;
  uvccl_work_t w;        /* its collective on the host buffers */
  int copied_in;
  int running;           /* its collective is in flight */
} chunk_t;

/* Chunk collectives in flight at once: one moving, the next ready, so the
 * links never wait for a start. */
#define STAGE_WINDOW 2
#define STAGE_MAX_CHUNKS 64

struct gstage_s {
  uvccl__stager_t *sg;
  uvccl_pg_t *pg;
  uvccl_work_t *user;
  uvccl_work_cb cb;
  uvccl_work_t inner;
  uvccl__gpu_op_t gop;
  sbuf_t *b;             /* nb buffers, allocated with the stage */
  int nb;
  /* list-shaped operations: what the TCP call gets (host pointers, the
   * caller's counts copied, since the call starts later) */
  size_t *counts_a, *counts_b;
  void **hostv;          /* allgatherv: receive pointers */
  uvccl_buf_t *hbufs;    /* allreduce_coalesced */
  uvccl_p2p_op_t *hops;  /* p2p_batch: ours; user_ops: the caller's */
  uvccl_p2p_op_t *user_ops;
  size_t nops;
  uvccl__stage_kind_t kind;
  size_t count;
  uvccl_dtype_t dtype;
  uvccl_redop_t op;
  int root;              /* root, peer */
  int tag;
  int phase;             /* 0 copy in, 1 collective, 2 copy out */
  int status;
  int user_done;
  int in_ready;          /* whole: copied in, the collective may start */
  gstage_t *order_next;  /* the stager's order list */
  /* chunked (nchunk > 1) */
  chunk_t *chunks;
  int nchunk;
  int next_coll;         /* the next chunk whose collective starts */
  int colls;             /* chunk collectives in flight */
  int outs_done;         /* chunks whose copy out is over */
  int inflight;          /* device ops and collectives not yet done */
};

static const char *kind_name[] = {
    "allreduce",       "broadcast",  "reduce",          "allgather",
    "reduce_scatter",  "alltoall",   "gather",          "scatter",
    "send",            "recv",       "allgatherv",      "reduce_scatterv",
    "alltoallv",       "allreduce_coalesced",           "p2p_batch"};

/* 1 if p is device memory (*dev set); 0 otherwise. */
static int device_ptr(const void *p, int *dev) {
  uvccl__cuda_ptr_attr_t a;
  *dev = -1;
  if (p == NULL || uvccl__gpu_device_count() <= 0) return 0;
  memset(&a, 0, sizeof(a));
  if (uvccl__cuda.PointerGetAttributes(&a, p) != UVCCL__CUDA_SUCCESS) {
    (void)uvccl__cuda.GetLastError(); /* plain host memory, older runtimes */
    return 0;
  }
  if (a.type != UVCCL__CUDA_MEM_DEVICE) return 0;
  *dev = a.device;
  return 1;
}

int uvccl__stage_check(const void *a, const void *b, int *device) {
  int da, db, ia, ib;
  *device = -1;
  if (uvccl__gpu_device_count() <= 0) return 0; /* the fast path */
  ia = device_ptr(a, &da);
  ib = device_ptr(b, &db);
  if (!ia && !ib) return 0;
  if (ia && ib && da != db) return UV_EINVAL;
  *device = ia ? da : db;
  return 1;
}

void uvccl__stage_check_more(const void *p, int *state, int *device) {
  int d, r;
  if (*state < 0) return;
  r = uvccl__stage_check(p, NULL, &d);
  if (r < 0 || (r == 1 && *state == 1 && d != *device)) {
    *state = UV_EINVAL;
    return;
  }
  if (r == 1) {
    *state = 1;
    *device = d;
  }
}

/* ---- the device side (runs on the device thread) ------------------------- */

static pinned_t *pool_take(uvccl__stager_t *sg, size_t len) {
  pinned_t **pp, *p;
  uv_mutex_lock(&sg->lock);
  for (pp = &sg->pool; (p = *pp) != NULL; pp = &p->next)
    if (p->cap >= len) {
      *pp = p->next;
      break;
    }
  uv_mutex_unlock(&sg->lock);
  return p;
}

static void pool_give(uvccl__stager_t *sg, pinned_t *p) {
  if (p == NULL) return;
  uv_mutex_lock(&sg->lock);
  p->next = sg->pool;
  sg->pool = p;
  uv_mutex_unlock(&sg->lock);
}

static int cuda_fail(uvccl__gpu_op_t *op, const char *call,
                     uvccl__cuda_err_t e) {
  uvccl__cuda_strerror(op->msg, sizeof(op->msg), call, e);
  return uvccl__cuda_to_uvccl(e);
}

static int ensure_stream(void **stream, uvccl__gpu_op_t *op) {
  uvccl__cuda_err_t e;
  if (*stream != NULL) return 0;
  e = uvccl__cuda.StreamCreateWithFlags(stream,
                                        UVCCL__CUDA_STREAM_NON_BLOCKING);
  if (e != UVCCL__CUDA_SUCCESS) {
    *stream = NULL;
    return cuda_fail(op, "cudaStreamCreateWithFlags", e);
  }
  return 0;
}

/* Gives every staged buffer its pinned memory (b->host). */
static int pin_bufs(gstage_t *st, uvccl__gpu_op_t *op) {
  uvccl__stager_t *sg = st->sg;
  uvccl__cuda_err_t e;
  int i;
  for (i = 0; i < st->nb; i++) {
    sbuf_t *b = &st->b[i];
    if (!b->staged || b->len == 0) continue;
    if (b->pin == NULL) b->pin = pool_take(sg, b->len);
    if (b->pin == NULL) {
      pinned_t *p = uvccl__calloc(1, sizeof(*p));
      if (p == NULL) return UV_ENOMEM;
      uvccl__gpu_in_call(op, "cudaHostAlloc");
      e = uvccl__cuda.HostAlloc(&p->p, b->len,
                                UVCCL__CUDA_HOST_ALLOC_PORTABLE);
      uvccl__gpu_in_call(op, NULL);
      if (e != UVCCL__CUDA_SUCCESS) {
        uvccl__free(p);
        return cuda_fail(op, "cudaHostAlloc", e);
      }
      p->cap = b->len;
      b->pin = p;
    }
    b->host = b->pin->p;
  }
  return 0;
}

static int issue_in(uvccl__gpu_op_t *op) {
  gstage_t *st = op->data;
  uvccl__stager_t *sg = st->sg;
  uvccl__cuda_err_t e;
  int i, rc = ensure_stream(&sg->stream, op);
  if (rc == 0) rc = pin_bufs(st, op);
  if (rc != 0) return rc;
  op->stream = sg->stream;
  for (i = 0; i < st->nb; i++) {
    sbuf_t *b = &st->b[i];
    if (!b->staged || b->len == 0 || !b->copy_in) continue;
    e = uvccl__cuda.MemcpyAsync(b->host, b->user, b->len,
                                UVCCL__CUDA_MEMCPY_DEVICE_TO_HOST, sg->stream);
    if (e != UVCCL__CUDA_SUCCESS) return cuda_fail(op, "cudaMemcpyAsync", e);
  }
  return 0;
}

/* An allgather's own block, on the way out: it is the caller's input,
 * and when both sit on the device it is copied from there (device to
 * device, at the device's own speed) instead of through the host, so only
 * the other ranks' blocks cross the bus: half the copy out at W = 2.
 * NULL where the block comes from the host buffer. */
static const char *own_block_src(const gstage_t *st, const sbuf_t *b,
                                 size_t r, size_t off) {
  const sbuf_t *in = &st->b[0];
  if (st->kind != UVCCL__STAGE_ALLGATHER || b != &st->b[1] ||
      r != (size_t)st->pg->rank || !b->on_device || !in->on_device ||
      in->user == NULL)
    return NULL;
  return (const char *)in->user + off * uvccl_dtype_size(st->dtype);
}

/* Chunk c's bytes of every staged buffer, one way: a buffer of ranks'
 * blocks is P pieces (block r's chunk, at r * count in the caller's
 * buffer, at r * n within the chunk's run in the pinned one). */
static int chunk_copy(uvccl__gpu_op_t *op, const chunk_t *c, int to_host,
                      void *stream) {
  gstage_t *st = c->st;
  size_t es = uvccl_dtype_size(st->dtype);
  int i;
  for (i = 0; i < st->nb; i++) {
    sbuf_t *b = &st->b[i];
    size_t r, nblk = (size_t)b->blocks;
    int kind = !b->on_device ? UVCCL__CUDA_MEMCPY_DEFAULT
               : to_host     ? UVCCL__CUDA_MEMCPY_DEVICE_TO_HOST
                             : UVCCL__CUDA_MEMCPY_HOST_TO_DEVICE;
    if (!b->staged || b->len == 0 || !(to_host ? b->copy_in : b->copy_out))
      continue;
    if (b->host == NULL) { /* the first chunk's pinning failed */
      snprintf(op->msg, sizeof(op->msg), "no pinned staging memory");
      return UV_ENOMEM;
    }
    for (r = 0; r < nblk; r++) {
      char *u = (char *)b->user + (r * st->count + c->off) * es;
      char *h = (char *)b->host + (nblk * c->off + r * c->n) * es;
      const char *mine = own_block_src(st, b, r, c->off);
      uvccl__cuda_err_t e;
      if (mine == u) continue; /* in place: already there */
      e = mine != NULL ? uvccl__cuda.MemcpyAsync(
                             u, mine, c->n * es,
                             UVCCL__CUDA_MEMCPY_DEVICE_TO_DEVICE, stream)
          : to_host ? uvccl__cuda.MemcpyAsync(h, u, c->n * es, kind, stream)
                    : uvccl__cuda.MemcpyAsync(u, h, c->n * es, kind, stream);
      if (e != UVCCL__CUDA_SUCCESS) return cuda_fail(op, "cudaMemcpyAsync", e);
    }
  }
  return 0;
}

static int issue_chunk_in(uvccl__gpu_op_t *op) {
  chunk_t *c = op->data;
  uvccl__stager_t *sg = c->st->sg;
  int rc = ensure_stream(&sg->stream, op);
  if (rc == 0 && c->off == 0) rc = pin_bufs(c->st, op);
  if (rc != 0) return rc;
  op->stream = sg->stream;
  return chunk_copy(op, c, 1, sg->stream);
}

static int issue_chunk_out(uvccl__gpu_op_t *op) {
  chunk_t *c = op->data;
  uvccl__stager_t *sg = c->st->sg;
  int rc = ensure_stream(&sg->stream_out, op);
  if (rc != 0) return rc;
  op->stream = sg->stream_out;
  return chunk_copy(op, c, 0, sg->stream_out);
}

static int issue_out(uvccl__gpu_op_t *op) {
  gstage_t *st = op->data;
  uvccl__stager_t *sg = st->sg;
  int i;
  op->stream = sg->stream;
  for (i = 0; i < st->nb; i++) {
    sbuf_t *b = &st->b[i];
    size_t n = b->len;
    uvccl__cuda_err_t e;
    if (!b->staged || !b->copy_out || n == 0) continue;
    /* recv: only what arrived */
    if (st->kind == UVCCL__STAGE_RECV && st->inner.value_len < n)
      n = st->inner.value_len;
    if (st->kind == UVCCL__STAGE_P2P_BATCH && st->hops[i].received < n)
      n = st->hops[i].received;
    e = uvccl__cuda.MemcpyAsync(b->user, b->host, n,
                                UVCCL__CUDA_MEMCPY_HOST_TO_DEVICE, sg->stream);
    if (e != UVCCL__CUDA_SUCCESS) return cuda_fail(op, "cudaMemcpyAsync", e);
  }
  return 0;
}

/* The stream's copies are finished when this runs its synchronize: then
 * the pool and the stream go. */
static int issue_fin(uvccl__gpu_op_t *op) {
  uvccl__stager_t *sg = op->data;
  pinned_t *p;
  void **streams[2];
  int i;
  streams[0] = &sg->stream;
  streams[1] = &sg->stream_out;
  for (i = 0; i < 2; i++) {
    if (*streams[i] == NULL) continue;
    uvccl__gpu_in_call(op, "cudaStreamSynchronize");
    (void)uvccl__cuda.StreamSynchronize(*streams[i]);
    (void)uvccl__cuda.StreamDestroy(*streams[i]);
    *streams[i] = NULL;
  }
  uvccl__gpu_in_call(op, "cudaFreeHost");
  while ((p = sg->pool) != NULL) {
    sg->pool = p->next;
    (void)uvccl__cuda.FreeHost(p->p);
    uvccl__free(p);
  }
  uvccl__gpu_in_call(op, NULL);
  return 0;
}

/* ---- the loop side --------------------------------------------------------- */

static void stager_client_closed(void *arg) {
  uvccl__stager_t *sg = arg;
  void (*cb)(void *) = sg->closed_cb;
  void *cbarg = sg->closed_arg;
  uvccl__gpu_release(sg->gpu);
  uv_mutex_destroy(&sg->lock);
  uvccl__free(sg);
  if (cb) cb(cbarg);
}

static void fin_done(uvccl__gpu_op_t *op) {
  uvccl__stager_t *sg = op->data;
  uvccl__gpu_client_close(sg->client, stager_client_closed, sg);
}

static void stager_maybe_close(uvccl__stager_t *sg) {
  if (!sg->closing || sg->active > 0) return;
  memset(&sg->fin, 0, sizeof(sg->fin));
  sg->fin.issue = issue_fin;
  sg->fin.done = fin_done;
  sg->fin.no_event = 1;
  sg->fin.data = sg;
  if (uvccl__gpu_submit(sg->client, &sg->fin) != 0) {
    /* the thread is gone: nothing of ours can be in flight any more */
    issue_fin(&sg->fin);
    uvccl__gpu_client_close(sg->client, stager_client_closed, sg);
  }
}

void uvccl__stager_close(uvccl__stager_t *sg, void (*cb)(void *arg),
                         void *arg) {
  sg->closing = 1;
  sg->closed_cb = cb;
  sg->closed_arg = arg;
  stager_maybe_close(sg);
}

static void order_remove(uvccl__stager_t *sg, gstage_t *st) {
  gstage_t **pp;
  for (pp = &sg->order; *pp != NULL; pp = &(*pp)->order_next)
    if (*pp == st) {
      *pp = st->order_next;
      st->order_next = NULL;
      return;
    }
}

static void stage_finish(gstage_t *st) {
  uvccl__stager_t *sg = st->sg;
  int i;
  order_remove(sg, st);
  for (i = 0; i < st->nb; i++) pool_give(sg, st->b[i].pin);
  for (i = 0; i < st->nchunk; i++) uvccl_work_cleanup(&st->chunks[i].w);
  uvccl__free(st->chunks);
  uvccl_work_cleanup(&st->inner);
  uvccl__free(st->counts_a);
  uvccl__free(st->counts_b);
  uvccl__free(st->hostv);
  uvccl__free(st->hbufs);
  uvccl__free(st->hops);
  uvccl__free(st);
  sg->active--;
  stager_maybe_close(sg);
}

static void user_complete(gstage_t *st, int status, const char *msg) {
  if (st->user_done) return;
  st->user_done = 1;
  if (!uvccl__work_is_live(st->user)) return; /* timed out or cancelled */
  if (status == 0) {
    size_t k;
    for (k = 0; k < st->nops; k++) {
      st->user_ops[k].received = st->hops[k].received;
      st->user_ops[k].source = st->hops[k].source;
    }
    st->user->result = st->inner.result;
    st->user->value_len = st->inner.value_len;
    uvccl__work_complete(st->user, 0);
  } else {
    uvccl__work_fail(st->user, status, "%s (GPU buffers, staged): %s",
                     kind_name[st->kind], msg && msg[0] ? msg
                                                 : uvccl_strerror(status));
  }
}

static void out_done(uvccl__gpu_op_t *op) {
  gstage_t *st = op->data;
  user_complete(st, op->status, op->msg);
  stage_finish(st);
}

static void copy_out(gstage_t *st) {
  memset(&st->gop, 0, sizeof(st->gop));
  st->gop.issue = issue_out;
  st->gop.done = out_done;
  st->gop.data = st;
  st->phase = 2;
  if (uvccl__gpu_submit(st->sg->client, &st->gop) != 0) {
    user_complete(st, UVCCL_ENOGPU, "the device thread is gone");
    stage_finish(st);
  }
}

static void inner_done(uvccl_work_t *w, int status) {
  gstage_t *st = w->data;
  if (status != 0 || st->user_done) {
    user_complete(st, status, w->msg);
    /* the pinned buffers are free again: no copy of ours is in flight */
    stage_finish(st);
    return;
  }
  copy_out(st);
}

static int start_inner(gstage_t *st) {
  uvccl_pg_t *pg = st->pg;
  uvccl_work_t *w = &st->inner;
  void *a = st->b[0].host, *b = st->nb > 1 ? st->b[1].host : NULL;
  w->data = st;
  w->timeout_ms = st->user->timeout_ms;
  switch (st->kind) {
  case UVCCL__STAGE_ALLREDUCE:
    return uvccl__host_allreduce(pg, w, a, b ? b : a, st->count, st->dtype, st->op,
                           inner_done);
  case UVCCL__STAGE_BROADCAST:
    return uvccl__host_broadcast(pg, w, a, st->count, st->dtype, st->root,
                           inner_done);
  case UVCCL__STAGE_REDUCE:
    return uvccl__host_reduce(pg, w, a, b ? b : a, st->count, st->dtype, st->op,
                        st->root, inner_done);
  case UVCCL__STAGE_ALLGATHER:
    return uvccl__host_allgather(pg, w, a, b, st->count, st->dtype, inner_done);
  case UVCCL__STAGE_REDUCE_SCATTER:
    return uvccl__host_reduce_scatter(pg, w, a, b, st->count, st->dtype, st->op,
                                inner_done);
  case UVCCL__STAGE_ALLTOALL:
    return uvccl__host_alltoall(pg, w, a, b, st->count, st->dtype, inner_done);
  case UVCCL__STAGE_GATHER:
    return uvccl__host_gather(pg, w, a, b, st->count, st->dtype, st->root,
                        inner_done);
  case UVCCL__STAGE_SCATTER:
    return uvccl__host_scatter(pg, w, a, b, st->count, st->dtype, st->root,
                         inner_done);
  case UVCCL__STAGE_SEND:
    return uvccl__host_send(pg, w, a, st->b[0].len, st->root, st->tag, inner_done);
  case UVCCL__STAGE_RECV:
    return uvccl__host_recv(pg, w, a, st->b[0].len, st->root, st->tag, inner_done);
  case UVCCL__STAGE_ALLGATHERV: {
    int i;
    for (i = 1; i < st->nb; i++) st->hostv[i - 1] = st->b[i].host;
    return uvccl__host_allgatherv(pg, w, a, st->count, st->hostv, st->counts_a,
                            st->dtype, inner_done);
  }
  case UVCCL__STAGE_REDUCE_SCATTERV:
    return uvccl__host_reduce_scatterv(pg, w, a, b, st->counts_a, st->dtype,
                                 st->op, inner_done);
  case UVCCL__STAGE_ALLTOALLV:
    return uvccl__host_alltoallv(pg, w, a, st->counts_a, b, st->counts_b,
                           st->dtype, inner_done);
  case UVCCL__STAGE_COALESCED: {
    int i;
    for (i = 0; i < st->nb; i++) st->hbufs[i].base = st->b[i].host;
    return uvccl__host_allreduce_coalesced(pg, w, st->hbufs, (size_t)st->nb,
                                     st->dtype, st->op, inner_done);
  }
  case UVCCL__STAGE_P2P_BATCH: {
    size_t k;
    for (k = 0; k < st->nops; k++) st->hops[k].buf = st->b[k].host;
    return uvccl__host_p2p_batch(pg, w, st->hops, st->nops, inner_done);
  }
  }
  return UV_EINVAL;
}

static void order_run(uvccl__stager_t *sg);

static void in_done(uvccl__gpu_op_t *op) {
  gstage_t *st = op->data;
  uvccl__stager_t *sg = st->sg;
  if (op->status != 0 || st->user_done) {
    user_complete(st, op->status ? op->status : UV_ECANCELED, op->msg);
    stage_finish(st);
  } else {
    st->in_ready = 1;
  }
  order_run(sg);
}

/* ---- chunks, the loop side ------------------------------------------------- */

static void chunk_pump(gstage_t *st);
static void chunk_coll_done(uvccl_work_t *w, int status);

/* Chunk c's collective, on its part of the host buffers. */
static int chunk_start(chunk_t *c) {
  gstage_t *st = c->st;
  size_t es = uvccl_dtype_size(st->dtype), P = (size_t)st->pg->size;
  char *h0 = st->b[0].host, *h1 = st->nb > 1 ? st->b[1].host : NULL;
  uvccl_pg_t *pg = st->pg;
  uvccl_work_t *w = &c->w;
  char *a = h0 + c->off * es, *b = h1 ? h1 + c->off * es : a;
  w->data = c;
  w->timeout_ms = st->user->timeout_ms;
  switch (st->kind) {
  case UVCCL__STAGE_ALLREDUCE:
    return uvccl__host_allreduce(pg, w, a, b, c->n, st->dtype, st->op,
                                 chunk_coll_done);
  case UVCCL__STAGE_BROADCAST:
    return uvccl__host_broadcast(pg, w, a, c->n, st->dtype, st->root,
                                 chunk_coll_done);
  case UVCCL__STAGE_REDUCE:
    return uvccl__host_reduce(pg, w, a, b, c->n, st->dtype, st->op, st->root,
                              chunk_coll_done);
  case UVCCL__STAGE_ALLGATHER:
    return uvccl__host_allgather(pg, w, a, h1 + P * c->off * es, c->n,
                                 st->dtype, chunk_coll_done);
  case UVCCL__STAGE_REDUCE_SCATTER:
    return uvccl__host_reduce_scatter(pg, w, h0 + P * c->off * es, b, c->n,
                                      st->dtype, st->op, chunk_coll_done);
  default:
    return UV_EINVAL;
  }
}

static void chunk_in_done(uvccl__gpu_op_t *op) {
  chunk_t *c = op->data;
  gstage_t *st = c->st;
  st->inflight--;
  if (op->status != 0) user_complete(st, op->status, op->msg);
  else c->copied_in = 1;
  chunk_pump(st);
}

static void chunk_out_done(uvccl__gpu_op_t *op) {
  chunk_t *c = op->data;
  gstage_t *st = c->st;
  st->inflight--;
  if (op->status != 0) user_complete(st, op->status, op->msg);
  else st->outs_done++;
  chunk_pump(st);
}

static int chunk_has_out(const gstage_t *st) {
  int i;
  for (i = 0; i < st->nb; i++)
    if (st->b[i].staged && st->b[i].copy_out && st->b[i].len > 0) return 1;
  return 0;
}

static void chunk_coll_done(uvccl_work_t *w, int status) {
  chunk_t *c = w->data;
  gstage_t *st = c->st;
  st->inflight--;
  st->colls--;
  c->running = 0;
  if (status != 0) {
    user_complete(st, status, w->msg);
  } else if (st->user_done) {
    /* abandoned: the buffers only wait for what is in flight */
  } else if (!chunk_has_out(st)) {
    st->outs_done++;
  } else {
    memset(&c->gout, 0, sizeof(c->gout));
    c->gout.issue = issue_chunk_out;
    c->gout.done = chunk_out_done;
    c->gout.data = c;
    if (uvccl__gpu_submit(st->sg->client, &c->gout) != 0)
      user_complete(st, UVCCL_ENOGPU, "the device thread is gone");
    else
      st->inflight++;
  }
  chunk_pump(st);
}

/* Starts the collectives whose chunk is in, in chunk order, at most
 * STAGE_WINDOW at once (st is the first of the order list). */
static void chunk_starts(gstage_t *st) {
  while (!st->user_done && st->next_coll < st->nchunk &&
         st->colls < STAGE_WINDOW && st->chunks[st->next_coll].copied_in) {
    chunk_t *c = &st->chunks[st->next_coll++];
    int rc = chunk_start(c);
    if (rc != 0) {
      /* a broken group's refusal says why it broke (c->w.msg) */
      char msg[UVCCL_WORK_MSG_LEN];
      snprintf(msg, sizeof(msg), "a chunk refused: %.160s",
               c->w.msg[0] ? c->w.msg : uvccl_strerror(rc));
      user_complete(st, rc, msg);
      break;
    }
    c->running = 1;
    st->colls++;
    st->inflight++;
  }
}

/* After each event of a chunked stage: it ends once nothing is in flight
 * (every chunk copied out, or it failed or was abandoned); else what may
 * start, starts. */
static void chunk_pump(gstage_t *st) {
  uvccl__stager_t *sg = st->sg;
  if (st->inflight == 0 && (st->user_done || st->outs_done == st->nchunk)) {
    if (!st->user_done) user_complete(st, 0, NULL);
    stage_finish(st);
  }
  order_run(sg);
}

/* The stages start their collectives in the order of the calls, the same
 * on every rank, whenever their copies come in: a stage leaves the list
 * once its last collective started, or once it failed or was abandoned. */
static void order_run(uvccl__stager_t *sg) {
  gstage_t *st;
  int rc;
  while ((st = sg->order) != NULL) {
    if (!st->user_done && st->nchunk > 1) {
      chunk_starts(st);
      if (!st->user_done && st->next_coll < st->nchunk) return;
    }
    if (st->user_done || st->nchunk > 1) {
      sg->order = st->order_next;
      st->order_next = NULL;
      if (st->user_done &&
          (st->nchunk > 1 ? st->inflight == 0 : st->in_ready))
        stage_finish(st);
      continue;
    }
    if (!st->in_ready) return;
    sg->order = st->order_next;
    st->order_next = NULL;
    st->phase = 1;
    if ((rc = start_inner(st)) != 0) {
      user_complete(st, rc, "starting the collective on the host buffers");
      stage_finish(st);
    }
  }
}

static void order_push(uvccl__stager_t *sg, gstage_t *st) {
  gstage_t **pp = &sg->order;
  while (*pp != NULL) pp = &(*pp)->order_next;
  st->order_next = NULL;
  *pp = st;
}

/* Cuts the stage in chunks where it is large enough (the same on every
 * rank: the cut follows from the kind, the count, the element size, the
 * group's size and stage_chunk). 0, or UV_ENOMEM. */
static int chunk_plan(gstage_t *st) {
  group_t *g = st->pg->impl_;
  size_t es = uvccl_dtype_size(st->dtype), P = (size_t)st->pg->size;
  size_t per, nchunk, k;
  int blocked = 0, i;
  switch (st->kind) {
  case UVCCL__STAGE_ALLGATHER:
  case UVCCL__STAGE_REDUCE_SCATTER:
    if (st->nb != 2) return 0; /* one buffer for both: taken whole */
    blocked = 1;
    break;
  case UVCCL__STAGE_ALLREDUCE:
  case UVCCL__STAGE_BROADCAST:
  case UVCCL__STAGE_REDUCE:
    break;
  default:
    return 0;
  }
  if (g->stage_chunk == 0 || es == 0) return 0;
  per = g->stage_chunk / (es * (blocked ? P : 1));
  if (per == 0) per = 1;
  if (st->count <= per) return 0;
  nchunk = (st->count + per - 1) / per;
  if (nchunk > STAGE_MAX_CHUNKS) {
    per = (st->count + STAGE_MAX_CHUNKS - 1) / STAGE_MAX_CHUNKS;
    nchunk = (st->count + per - 1) / per;
  }
  st->chunks = uvccl__calloc(nchunk, sizeof(chunk_t));
  if (st->chunks == NULL) return UV_ENOMEM;
  st->nchunk = (int)nchunk;
  for (k = 0; k < nchunk; k++) {
    chunk_t *c = &st->chunks[k];
    c->st = st;
    c->off = k * per;
    c->n = st->count - c->off < per ? st->count - c->off : per;
  }
  if (blocked) {
    /* the ranks' blocks go chunk by chunk through pinned memory, even
     * from host memory: each chunk's collective needs them together */
    st->b[st->kind == UVCCL__STAGE_ALLGATHER ? 1 : 0].blocks = (int)P;
    for (i = 0; i < st->nb; i++)
      if (st->b[i].len > 0 && st->b[i].user != NULL) {
        st->b[i].staged = 1;
        st->b[i].host = NULL;
      }
  }
  return 0;
}

/* Queues every chunk's copy in; the collectives follow (chunk_pump). */
static int chunk_go(gstage_t *st) {
  int k;
  for (k = 0; k < st->nchunk; k++) {
    chunk_t *c = &st->chunks[k];
    memset(&c->gin, 0, sizeof(c->gin));
    c->gin.issue = issue_chunk_in;
    c->gin.done = chunk_in_done;
    c->gin.data = c;
    if (uvccl__gpu_submit(st->sg->client, &c->gin) != 0) {
      if (k == 0) return UVCCL_ENOGPU;
      /* the earlier chunks are queued: the stage ends once they are back */
      user_complete(st, UVCCL_ENOGPU, "the device thread is gone");
      break;
    }
    st->inflight++;
  }
  return 0;
}

/* Timeout or cancel of the caller's work: it completes now; the stage
 * lives on until its copies and collective are over (buffers in use). */
static void stage_abandon(uvccl_work_t *w, int status) {
  gstage_t *st = w->owner_;
  int k;
  st->user_done = 1;
  if (st->phase == 1) uvccl_work_cancel(&st->inner);
  for (k = 0; k < st->nchunk; k++)
    if (st->chunks[k].running) uvccl_work_cancel(&st->chunks[k].w);
  (void)status;
}

static const struct uvccl__work_ops stage_ops = {stage_abandon, NULL, NULL};

static int stager_get(uvccl_pg_t *pg, int device, uvccl__stager_t **out) {
  group_t *g = pg->impl_;
  uvccl__stager_t *sg = g->stager;
  char err[160];
  int rc;
  if (sg != NULL) {
    if (sg->device != device) {
      LOG_ERROR("coll", "group rank %d: GPU buffers on device %d, but this "
                "group stages through device %d", g->rank, device, sg->device);
      return UV_ENOTSUP;
    }
    *out = sg;
    return 0;
  }
  sg = uvccl__calloc(1, sizeof(*sg));
  if (sg == NULL) return UV_ENOMEM;
  rc = uvccl__gpu_acquire(device, &sg->gpu, err, sizeof(err));
  if (rc != 0) {
    LOG_ERROR("coll", "GPU staging: %s", err);
    uvccl__free(sg);
    return rc;
  }
  rc = uvccl__gpu_client_init(pg->loop, sg->gpu, &sg->client);
  if (rc != 0) {
    uvccl__gpu_release(sg->gpu);
    uvccl__free(sg);
    return rc;
  }
  uv_mutex_init(&sg->lock);
  sg->g = g;
  sg->device = device;
  g->stager = sg;
  *out = sg;
  return 0;
}

/* A stage for kind with nb buffers (to be filled in), or NULL with *rc. */
static gstage_t *stage_new(uvccl_pg_t *pg, uvccl__stage_kind_t kind,
                           int device, int nb, int *rc) {
  group_t *g = pg->impl_;
  uvccl__stager_t *sg;
  gstage_t *st;
  *rc = UV_EINVAL;
  if (g == NULL || device < 0 || nb < 1) return NULL;
  *rc = UVCCL_ECLOSING;
  if (g->destroying) return NULL;
  if ((*rc = stager_get(pg, device, &sg)) != 0) return NULL;
  *rc = UV_ENOMEM;
  st = uvccl__calloc(1, sizeof(*st) + (size_t)nb * sizeof(sbuf_t));
  if (st == NULL) return NULL;
  st->b = (sbuf_t *)(st + 1);
  st->nb = nb;
  st->sg = sg;
  st->pg = pg;
  st->kind = kind;
  *rc = 0;
  return st;
}

static void stage_buf(gstage_t *st, int i, void *p, size_t len, int in,
                      int out) {
  sbuf_t *b = &st->b[i];
  int dev;
  b->user = p;
  b->len = len;
  b->copy_in = in;
  b->copy_out = out;
  b->staged = device_ptr(p, &dev);
  b->on_device = b->staged;
  b->blocks = 1;
  b->host = b->staged ? NULL : p;
}

static void stage_drop(gstage_t *st) {
  uvccl__free(st->chunks);
  uvccl__free(st->counts_a);
  uvccl__free(st->counts_b);
  uvccl__free(st->hostv);
  uvccl__free(st->hbufs);
  uvccl__free(st->hops);
  uvccl__free(st);
}

/* Starts the filled stage on work. On an error st is freed. */
static int stage_go(gstage_t *st, uvccl_work_t *work, uvccl_work_cb cb) {
  group_t *g = st->pg->impl_;
  uint64_t timeout;
  int rc;
  if (work == NULL) {
    stage_drop(st);
    return UV_EINVAL;
  }
  st->user = work;
  st->cb = cb;
  timeout = work->timeout_ms ? work->timeout_ms : g->timeout_ms;
  if ((rc = chunk_plan(st)) != 0) {
    stage_drop(st);
    return rc;
  }
  rc = uvccl__work_start(work, st->pg->loop, kind_name[st->kind], &stage_ops,
                         st, timeout, cb);
  if (rc != 0) {
    stage_drop(st);
    return rc;
  }
  if (st->nchunk > 1) {
    rc = chunk_go(st);
  } else {
    memset(&st->gop, 0, sizeof(st->gop));
    st->gop.issue = issue_in;
    st->gop.done = in_done;
    st->gop.data = st;
    rc = uvccl__gpu_submit(st->sg->client, &st->gop);
  }
  if (rc != 0) {
    /* the work was started: it fails through its callback */
    uvccl__work_fail(work, rc, "%s: the device thread refused the copy",
                     kind_name[st->kind]);
    stage_drop(st);
    return 0;
  }
  st->sg->active++;
  order_push(st->sg, st);
  return 0;
}

int uvccl__stage_start(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb,
                       const uvccl__stage_args_t *a) {
  int rc, i;
  gstage_t *st = stage_new(pg, a->kind, a->device, a->nb, &rc);
  if (st == NULL) return rc;
  st->count = a->count;
  st->dtype = a->dtype;
  st->op = a->op;
  st->root = a->root;
  st->tag = a->tag;
  for (i = 0; i < a->nb; i++)
    stage_buf(st, i, a->buf[i], a->len[i], a->in[i], a->out[i]);
  return stage_go(st, work, cb);
}

/* ---- the collectives' entry points ------------------------------------------ */

static int start_args(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb,
                      uvccl__stage_args_t *a, size_t count,
                      uvccl_dtype_t dtype) {
  size_t es = uvccl_dtype_size(dtype);
  if (es == 0 || count > SIZE_MAX / es / 64 || pg->impl_ == NULL)
    return UV_EINVAL;
  a->count = count;
  a->dtype = dtype;
  return uvccl__stage_start(pg, work, cb, a);
}

/* in-or-out pair: send (in) and recv (out), merged when the same buffer
 * in place (allreduce, reduce); an allgather's input may be the start of
 * its output (rank 0 in place), each then staged on its own */
static void pair(uvccl__stage_args_t *a, void *send, size_t slen, int sin,
                 void *recv, size_t rlen, int rout) {
  int merge = a->kind == UVCCL__STAGE_ALLREDUCE ||
              a->kind == UVCCL__STAGE_REDUCE;
  a->buf[0] = send;
  a->len[0] = slen;
  a->in[0] = sin;
  if (merge && send == recv && recv != NULL) {
    a->nb = 1;
    a->out[0] = rout;
    return;
  }
  a->nb = 2;
  a->buf[1] = recv;
  a->len[1] = rlen;
  a->out[1] = rout;
}

int uvccl__stage_coll(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                      uvccl__stage_kind_t kind, const void *sendbuf,
                      void *recvbuf, size_t count, uvccl_dtype_t dtype,
                      uvccl_redop_t op, int root, uvccl_work_cb cb) {
  uvccl__stage_args_t a;
  size_t n = count * uvccl_dtype_size(dtype), P = (size_t)pg->size;
  int me = pg->rank, isroot = me == root;
  void *s = (void *)sendbuf;
  memset(&a, 0, sizeof(a));
  a.kind = kind;
  a.device = device;
  a.op = op;
  a.root = root;
  switch (kind) {
  case UVCCL__STAGE_ALLREDUCE:
    pair(&a, s, n, 1, recvbuf, n, 1);
    break;
  case UVCCL__STAGE_BROADCAST:
    a.nb = 1;
    a.buf[0] = recvbuf;
    a.len[0] = n;
    a.in[0] = isroot;
    a.out[0] = !isroot;
    break;
  case UVCCL__STAGE_REDUCE:
    pair(&a, s, n, 1, isroot ? recvbuf : NULL, isroot ? n : 0, isroot);
    break;
  case UVCCL__STAGE_ALLGATHER:
    pair(&a, s, n, 1, recvbuf, n * P, 1);
    break;
  case UVCCL__STAGE_REDUCE_SCATTER:
    pair(&a, s, n * P, 1, recvbuf, n, 1);
    break;
  case UVCCL__STAGE_ALLTOALL:
    pair(&a, s, n * P, 1, recvbuf, n * P, 1);
    break;
  case UVCCL__STAGE_GATHER:
    pair(&a, s, n, 1, isroot ? recvbuf : NULL, isroot ? n * P : 0, isroot);
    break;
  case UVCCL__STAGE_SCATTER:
    pair(&a, isroot ? s : NULL, isroot ? n * P : 0, isroot, recvbuf, n, 1);
    break;
  default:
    return UV_EINVAL;
  }
  return start_args(pg, work, cb, &a, count, dtype);
}

int uvccl__stage_p2p(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                     int is_send, void *buf, size_t len, int peer, int tag,
                     uvccl_work_cb cb) {
  uvccl__stage_args_t a;
  memset(&a, 0, sizeof(a));
  a.kind = is_send ? UVCCL__STAGE_SEND : UVCCL__STAGE_RECV;
  a.device = device;
  a.nb = 1;
  a.buf[0] = buf;
  a.len[0] = len;
  a.in[0] = is_send;
  a.out[0] = !is_send;
  a.root = peer;
  a.tag = tag;
  return start_args(pg, work, cb, &a, len, UVCCL_UINT8);
}

/* ---- list-shaped operations ------------------------------------------------- */

static size_t *copy_counts(const size_t *c, int n, size_t *sum) {
  size_t *r = uvccl__malloc((size_t)n * sizeof(size_t));
  int i;
  *sum = 0;
  if (r == NULL) return NULL;
  for (i = 0; i < n; i++) {
    r[i] = c[i];
    *sum += c[i];
  }
  return r;
}

int uvccl__stage_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                            const void *sendbuf, size_t sendcount,
                            void *const *recvbufs, const size_t *recvcounts,
                            uvccl_dtype_t dtype, uvccl_work_cb cb) {
  size_t es = uvccl_dtype_size(dtype), sum;
  int P = pg->size, i, rc;
  gstage_t *st;
  if (es == 0 || recvbufs == NULL || recvcounts == NULL) return UV_EINVAL;
  st = stage_new(pg, UVCCL__STAGE_ALLGATHERV, device, P + 1, &rc);
  if (st == NULL) return rc;
  st->dtype = dtype;
  st->count = sendcount;
  st->counts_a = copy_counts(recvcounts, P, &sum);
  st->hostv = uvccl__calloc((size_t)P, sizeof(void *));
  if (st->counts_a == NULL || st->hostv == NULL) {
    stage_drop(st);
    return UV_ENOMEM;
  }
  stage_buf(st, 0, (void *)sendbuf, sendcount * es, 1, 0);
  for (i = 0; i < P; i++)
    stage_buf(st, i + 1, recvbufs[i], recvcounts[i] * es, 0, 1);
  return stage_go(st, work, cb);
}

int uvccl__stage_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                 int device, const void *sendbuf,
                                 void *recvbuf, const size_t *recvcounts,
                                 uvccl_dtype_t dtype, uvccl_redop_t op,
                                 uvccl_work_cb cb) {
  size_t es = uvccl_dtype_size(dtype), sum;
  int rc;
  gstage_t *st;
  if (es == 0 || recvcounts == NULL || pg->rank < 0) return UV_EINVAL;
  st = stage_new(pg, UVCCL__STAGE_REDUCE_SCATTERV, device, 2, &rc);
  if (st == NULL) return rc;
  st->dtype = dtype;
  st->op = op;
  if ((st->counts_a = copy_counts(recvcounts, pg->size, &sum)) == NULL) {
    stage_drop(st);
    return UV_ENOMEM;
  }
  stage_buf(st, 0, (void *)sendbuf, sum * es, 1, 0);
  stage_buf(st, 1, recvbuf, recvcounts[pg->rank] * es, 0, 1);
  return stage_go(st, work, cb);
}

int uvccl__stage_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           const void *sendbuf, const size_t *sendcounts,
                           void *recvbuf, const size_t *recvcounts,
                           uvccl_dtype_t dtype, uvccl_work_cb cb) {
  size_t es = uvccl_dtype_size(dtype), ssum, rsum;
  int rc;
  gstage_t *st;
  if (es == 0 || sendcounts == NULL || recvcounts == NULL) return UV_EINVAL;
  st = stage_new(pg, UVCCL__STAGE_ALLTOALLV, device, 2, &rc);
  if (st == NULL) return rc;
  st->dtype = dtype;
  st->counts_a = copy_counts(sendcounts, pg->size, &ssum);
  st->counts_b = copy_counts(recvcounts, pg->size, &rsum);
  if (st->counts_a == NULL || st->counts_b == NULL) {
    stage_drop(st);
    return UV_ENOMEM;
  }
  stage_buf(st, 0, (void *)sendbuf, ssum * es, 1, 0);
  stage_buf(st, 1, recvbuf, rsum * es, 0, 1);
  return stage_go(st, work, cb);
}

int uvccl__stage_coalesced(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           const uvccl_buf_t *bufs, size_t nbufs,
                           uvccl_dtype_t dtype, uvccl_redop_t op,
                           uvccl_work_cb cb) {
  size_t k;
  int rc;
  gstage_t *st;
  if (bufs == NULL || nbufs == 0 || nbufs > INT32_MAX) return UV_EINVAL;
  st = stage_new(pg, UVCCL__STAGE_COALESCED, device, (int)nbufs, &rc);
  if (st == NULL) return rc;
  st->dtype = dtype;
  st->op = op;
  if ((st->hbufs = uvccl__calloc(nbufs, sizeof(uvccl_buf_t))) == NULL) {
    stage_drop(st);
    return UV_ENOMEM;
  }
  for (k = 0; k < nbufs; k++) {
    st->hbufs[k].len = bufs[k].len;
    stage_buf(st, (int)k, bufs[k].base, bufs[k].len, 1, 1);
  }
  return stage_go(st, work, cb);
}

int uvccl__stage_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, int device,
                           uvccl_p2p_op_t *ops, size_t nops,
                           uvccl_work_cb cb) {
  size_t k;
  int rc;
  gstage_t *st;
  if (ops == NULL || nops == 0 || nops > INT32_MAX) return UV_EINVAL;
  st = stage_new(pg, UVCCL__STAGE_P2P_BATCH, device, (int)nops, &rc);
  if (st == NULL) return rc;
  if ((st->hops = uvccl__calloc(nops, sizeof(uvccl_p2p_op_t))) == NULL) {
    stage_drop(st);
    return UV_ENOMEM;
  }
  st->user_ops = ops;
  st->nops = nops;
  for (k = 0; k < nops; k++) {
    st->hops[k] = ops[k];
    stage_buf(st, (int)k, ops[k].buf, ops[k].len, ops[k].is_send,
              !ops[k].is_send);
  }
  return stage_go(st, work, cb);
}
