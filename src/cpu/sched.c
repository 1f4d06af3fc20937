/* Schedules: every collective is built as a small DAG of operations
 * (send, receive, reducing receive, copy, reduce, scale, glue), then run
 * by this executor. An op starts when the ops it depends on are done;
 * receives with no dependencies are posted at once, so data lands in
 * place as soon as it arrives. Algorithms only describe the DAG, which
 * keeps them short and lets segments of a large message pipeline through
 * a ring or a chain without any per-algorithm state machine.
 *
 * Schedule objects (and their arrays and scratch) are recycled per group,
 * so a steady stream of collectives allocates nothing. */
#include "internal.h"
#include "par.h"

#include <stdio.h>

#define FREE_SCHEDS_MAX 8

static void sched_abandon(uvccl_work_t *w, int status);
static int sched_defer(uvccl_work_t *w);
static void sched_progress(uvccl_work_t *w);
/* The group keeps its works' timeouts (one timer per net, see net_t) and
 * delivers them from its handles: a work holds no handle of its own. */
static const struct uvccl__work_ops sched_work_ops = {sched_abandon,
                                                      sched_defer,
                                                      sched_progress};

static void sched_run(sched_t *s);

sched_t *uvccl__sched_new(group_t *g, const char *name, int p2p) {
  sched_t *s = g->free_scheds;
  g->nsched++;
  if (s != NULL) {
    g->free_scheds = s->free_next;
  } else {
    s = uvccl__calloc(1, sizeof(*s));
    if (s == NULL) {
      g->nsched--;
      return NULL;
    }
  }
  {
    sop_t *ops = s->ops;
    sedge_t *edges = s->edges;
    uint32_t *succ = s->succ;
    uint32_t opcap = s->opcap, edgecap = s->edgecap, succcap = s->succcap;
    char *tmp = s->tmp;
    size_t tmpcap = s->tmpcap;
    memset(s, 0, sizeof(*s));
    s->ops = ops;
    s->edges = edges;
    s->succ = succ;
    s->opcap = opcap;
    s->edgecap = edgecap;
    s->succcap = succcap;
    s->tmp = tmp;
    s->tmpcap = tmpcap;
  }
  s->g = g;
  s->name = name;
  s->p2p = p2p;
  s->esize = 1;
  s->scale = 1.0;
  s->desc.op = name;
  s->desc.p2p = p2p;
  s->desc.root = -1;
  s->desc.peer = -1;
  return s;
}

/* A collective whose output is this large (its group's stream_min,
 * $UVCCL_STREAM_MIN) writes it around the cache (par.h:
 * uvccl__par_memcpy_stream): what arrives from shared memory and the
 * local copies into the user's buffers. Such an output does not fit in
 * the cache anyway, and the plain stores' reads of every line cost
 * memory bandwidth. */
void uvccl__sched_stream(sched_t *s, size_t out_bytes) {
  s->stream = s->g->stream_min > 0 && out_bytes >= s->g->stream_min;
}

void uvccl__sched_describe(sched_t *s, int dtype, uint64_t count_in,
                           uint64_t count_out, int root) {
  if (dtype >= 0) s->desc.dtype = uvccl_dtype_name((uvccl_dtype_t)dtype);
  s->desc.count_in = count_in;
  s->desc.count_out = count_out;
  s->desc.root = root;
}

/* Scratch of UVCCL__BIG_MIN bytes or more is a large buffer (bigmem.c):
 * it goes to the net's spares, for the next collective that needs as
 * much; the slicer unmaps it a few MiB a turn once it has waited there
 * long enough. */
static void tmp_release(net_t *net, char *tmp, size_t cap) {
  if (tmp != NULL) uvccl__net_scratch_put(net, tmp, cap);
}

static void sched_destroy(sched_t *s) {
  uvccl__free(s->fps);
  uvccl__free(s->ops);
  uvccl__free(s->edges);
  uvccl__free(s->succ);
  tmp_release(s->g->net, s->tmp, s->tmpcap);
  uvccl__free(s);
}

/* Back to the group's free list (or freed). Only once libuv holds no
 * write request of it. */
void uvccl__sched_free(sched_t *s) {
  group_t *g = s->g;
  int n = 0;
  sched_t *x;
  if (s->release) s->release(s);
  s->release = NULL;
  s->user = NULL;
  uvccl__free(s->fps); /* debug mode only: not kept with the schedule */
  s->fps = NULL;
  for (x = g->free_scheds; x != NULL; x = x->free_next) n++;
  g->nsched--;
  if (s->tmpcap >= UVCCL__BIG_MIN) {
    /* to the net's spares, which give it back once no collective has
     * needed it for a while; a schedule keeps small scratch only */
    tmp_release(g->net, s->tmp, s->tmpcap);
    s->tmp = NULL;
    s->tmpcap = 0;
  }
  if (n >= FREE_SCHEDS_MAX || g->destroying) {
    sched_destroy(s);
  } else {
    s->free_next = g->free_scheds;
    g->free_scheds = s;
  }
  if (g->destroying && g->nsched == 0 && g->on_sched_gone != NULL)
    g->on_sched_gone(g);
}

/* ---- building ------------------------------------------------------------ */

static uint32_t sop_add(sched_t *s, sop_type_t type) {
  sop_t *op;
  if (s->nops == s->opcap) {
    uint32_t cap = s->opcap ? s->opcap * 2 : 16;
    sop_t *ops = uvccl__realloc(s->ops, cap * sizeof(*ops));
    if (ops == NULL) {
      s->status = UV_ENOMEM;
      return UINT32_MAX;
    }
    s->ops = ops;
    s->opcap = cap;
  }
  op = &s->ops[s->nops];
  memset(op, 0, offsetof(sop_t, hdr));
  op->type = (uint8_t)type;
  op->s = s;
  op->peer = -1;
  return s->nops++;
}

static int world_of(sched_t *s, int grank) {
  return grank >= 0 ? s->g->ranks[grank] : -1;
}

uint32_t uvccl__sop_send(sched_t *s, int grank, uint32_t tag,
                         const void *buf, size_t len) {
  uint32_t i = sop_add(s, SOP_SEND);
  if (i == UINT32_MAX) return i;
  s->ops[i].peer = world_of(s, grank);
  s->ops[i].tag = tag;
  s->ops[i].buf = (char *)buf;
  s->ops[i].len = len;
  s->ops[i].p2p = (uint8_t)s->p2p;
  return i;
}

uint32_t uvccl__sop_recv(sched_t *s, int grank, uint32_t tag, void *buf,
                         size_t len) {
  uint32_t i = sop_add(s, SOP_RECV);
  if (i == UINT32_MAX) return i;
  s->ops[i].peer = world_of(s, grank);
  s->ops[i].tag = tag;
  s->ops[i].buf = buf;
  s->ops[i].len = len;
  s->ops[i].p2p = (uint8_t)s->p2p;
  return i;
}

uint32_t uvccl__sop_recv_red(sched_t *s, int grank, uint32_t tag, void *buf,
                             size_t len) {
  uint32_t i = uvccl__sop_recv(s, grank, tag, buf, len);
  if (i != UINT32_MAX) s->ops[i].type = SOP_RECV_RED;
  return i;
}

uint32_t uvccl__sop_recv_red_from(sched_t *s, int grank, uint32_t tag,
                                  void *buf, const void *src, size_t len) {
  uint32_t i = uvccl__sop_recv_red(s, grank, tag, buf, len);
  if (i != UINT32_MAX && src != buf) s->ops[i].src = src;
  return i;
}

uint32_t uvccl__sop_copy(sched_t *s, void *dst, const void *src,
                         size_t len) {
  uint32_t i = sop_add(s, SOP_COPY);
  if (i == UINT32_MAX) return i;
  s->ops[i].buf = dst;
  s->ops[i].src = src;
  s->ops[i].len = len;
  return i;
}

uint32_t uvccl__sop_reduce(sched_t *s, void *dst, const void *src,
                           size_t len) {
  uint32_t i = uvccl__sop_copy(s, dst, src, len);
  if (i != UINT32_MAX) s->ops[i].type = SOP_REDUCE;
  return i;
}

uint32_t uvccl__sop_scale(sched_t *s, void *buf, size_t len) {
  uint32_t i = sop_add(s, SOP_SCALE);
  if (i == UINT32_MAX) return i;
  s->ops[i].buf = buf;
  s->ops[i].len = len;
  return i;
}

uint32_t uvccl__sop_call(sched_t *s, int (*fn)(sched_t *, sop_t *)) {
  uint32_t i = sop_add(s, SOP_CALL);
  if (i != UINT32_MAX) s->ops[i].fn = fn;
  return i;
}

uint32_t uvccl__sop_nop(sched_t *s) { return sop_add(s, SOP_NOP); }

uint32_t uvccl__sop_box(sched_t *s, uvccl__box_kind_t kind, int root,
                        const void *src, void *buf, size_t len) {
  uint32_t i = sop_add(s, SOP_BOX);
  if (i == UINT32_MAX) return i;
  s->ops[i].tag = (uint32_t)kind;
  s->ops[i].source = root;
  s->ops[i].src = src;
  s->ops[i].buf = buf;
  s->ops[i].len = len;
  s->nbox++;
  return i;
}

void uvccl__sop_dep(sched_t *s, uint32_t a, uint32_t b) {
  if (a == UINT32_MAX || b == UINT32_MAX) return;
  if (s->nedges == s->edgecap) {
    uint32_t cap = s->edgecap ? s->edgecap * 2 : 16;
    sedge_t *e = uvccl__realloc(s->edges, cap * sizeof(*e));
    if (e == NULL) {
      s->status = UV_ENOMEM;
      return;
    }
    s->edges = e;
    s->edgecap = cap;
  }
  s->edges[s->nedges].from = a;
  s->edges[s->nedges].to = b;
  s->nedges++;
}

void *uvccl__sched_tmp(sched_t *s, size_t len) {
  if (len == 0) len = 1;
  if (len > s->tmpcap) {
    /* (scratch: what it held need not be kept) */
    size_t cap;
    char *t = uvccl__net_scratch_get(s->g->net, len, &cap);
    if (t == NULL) {
      s->status = UV_ENOMEM;
      return NULL;
    }
    tmp_release(s->g->net, s->tmp, s->tmpcap);
    s->tmp = t;
    s->tmpcap = cap;
  }
  return s->tmp;
}

int uvccl__sched_set_op(sched_t *s, uvccl_dtype_t dtype, uvccl_redop_t op) {
  group_t *g = s->g;
  uvccl_redop_t base = op;
  int rc;
  s->scale = 1.0;
  s->divisor = 0;
  if ((int)op >= UVCCL__PREMUL_BASE) {
    int idx = (int)op - UVCCL__PREMUL_BASE;
    if (idx >= g->npremul) return UV_EINVAL;
    base = UVCCL_PREMUL_SUM;
    s->scale = g->premul[idx];
  } else if (op == UVCCL_PREMUL_SUM) {
    return UV_EINVAL; /* needs a factor: uvccl_pg_premul_sum() */
  }
  rc = uvccl_redop_check(base, dtype);
  if (rc != 0) return rc;
  s->red = uvccl__reduce_get(dtype, base);
  s->red3 = uvccl__reduce3_get(dtype, base);
  if (s->red == NULL || s->red3 == NULL) return UV_EINVAL;
  s->dtype = dtype;
  s->op = base;
  s->esize = uvccl_dtype_size(dtype);
  s->desc.dtype = uvccl_dtype_name(dtype);
  s->desc.redop = uvccl_redop_name(base);
  if (base == UVCCL_AVG) s->divisor = g->size;
  return 0;
}

void uvccl__sched_reduce(sched_t *s, void *dst, const void *src, size_t n) {
  if (n == 0) return;
  s->red(dst, src, n / s->esize);
}

void uvccl__sched_reduce_in(sop_t *op, size_t off, const void *in, size_t n) {
  sched_t *s = op->s;
  if (n == 0) return;
  if (op->src != NULL)
    s->red3(op->buf + off, op->src + off, in, n / s->esize);
  else
    s->red(op->buf + off, in, n / s->esize);
}

/* ---- running ------------------------------------------------------------- */

static void ready_push(sched_t *s, uint32_t i) {
  s->ops[i].ready_next = 0;
  if (s->ready_tail) s->ops[s->ready_tail - 1].ready_next = i + 1;
  else s->ready_head = i + 1;
  s->ready_tail = i + 1;
}

static int ready_pop(sched_t *s, uint32_t *i) {
  if (s->ready_head == 0) return 0;
  *i = s->ready_head - 1;
  s->ready_head = s->ops[*i].ready_next;
  if (s->ready_head == 0) s->ready_tail = 0;
  return 1;
}

static void group_unlink(group_t *g, sched_t *s) {
  if (s->prev) s->prev->next = s->next;
  else g->pend_head = s->next;
  if (s->next) s->next->prev = s->prev;
  else g->pend_tail = s->prev;
  s->next = s->prev = NULL;
}

static int earlier_pending(sched_t *s) {
  sched_t *x;
  for (x = s->prev; x != NULL; x = x->prev)
    if (!x->p2p) return 1;
  return 0;
}

static void sched_complete(sched_t *s, int status);
static void sched_fail_now(sched_t *s);

/* Barriers wait for every earlier collective of the group. */
static void complete_ordered(group_t *g) {
  sched_t *x;
  for (x = g->pend_head; x != NULL; x = x->next) {
    if (!x->p2p && !(x->ordered && x->finished)) return;
    if (x->ordered && x->finished && !earlier_pending(x)) {
      sched_complete(x, 0);
      return; /* sched_complete rescans */
    }
  }
}

static void sched_complete(sched_t *s, int status) {
  group_t *g = s->g;
  net_t *net = g->net;
  if (s->completed) return;
  s->completed = 1;
  if (status == 0 && s->finish != NULL) {
    int rc = s->finish(s);
    if (rc != 0 && uvccl__work_is_live(s->w)) {
      uvccl__work_fail(s->w, rc, "%s: %s", s->name, uvccl_strerror(rc));
      status = rc;
    }
  }
  if (status == 0) uvccl__work_complete(s->w, 0);
  /* (failures were completed with their message by sched_fail) */
  if (s->fid != 0) {
    uvccl__flight_end(g->fg, s->fid, status, s->w->msg);
    if (status != 0 && status != UV_ECANCELED)
      uvccl__flight_dump_on_error(NULL, s->w->msg);
  }
  group_unlink(g, s);
  if (net->inflight > 0) net->inflight--;
  if (s->big && net->inflight_big > 0 && --net->inflight_big == 0)
    net->local_xport->set_big(net, 0);
  if (net->inflight == 0) uvccl__net_deadline_off(net);
  if (s->nwriting == 0) uvccl__sched_free(s);
  complete_ordered(g);
}

static void sched_maybe_finish(sched_t *s) {
  if (s->completed || s->remaining > 0 || s->finished) return;
  s->finished = 1;
  if (s->ordered && earlier_pending(s)) return;
  sched_complete(s, 0);
}

void uvccl__sched_op_done(sop_t *op) {
  sched_t *s = op->s;
  uint32_t k;
  if (op->type == SOP_SEND && op->writing == 0 && s->nwriting > 0 &&
      op->state == SOP_ACTIVE) {
    s->nwriting--;
  }
  if (s->completed) {
    op->state = SOP_DONE;
    if (s->nwriting == 0 && s->g != NULL) uvccl__sched_free(s);
    return;
  }
  if (s->failing) {
    op->state = SOP_DONE;
    if (s->nwriting == 0) sched_fail_now(s);
    return;
  }
  if (op->state == SOP_DONE) return;
  op->state = SOP_DONE;
  s->remaining--;
  for (k = 0; k < op->nsucc; k++) {
    sop_t *n = &s->ops[s->succ[op->succ_off + k]];
    if (--n->deps == 0) ready_push(s, s->succ[op->succ_off + k]);
  }
  if (!s->running) sched_run(s);
}

void uvccl__sched_send_lost(sop_t *op) {
  sched_t *s = op->s;
  if (op->state == SOP_ACTIVE && s->nwriting > 0) s->nwriting--;
  if (s->completed) {
    op->state = SOP_DONE;
    if (s->nwriting == 0 && s->g != NULL) uvccl__sched_free(s);
    return;
  }
  if (s->failing) {
    op->state = SOP_DONE;
    if (s->nwriting == 0) sched_fail_now(s);
    return;
  }
  /* still ACTIVE: the group's failure will fail the schedule */
}

static void start_op(sched_t *s, sop_t *op) {
  net_t *net = s->g->net;
  int rc;
  op->state = SOP_ACTIVE;
  switch (op->type) {
  case SOP_SEND:
    if (op->peer == net->rank) {
      uvccl__sched_fail(s, UV_EINVAL, "%s: send to self", s->name);
      return;
    }
    rc = uvccl__net_send(net, op, s->p2p ? FRAME_P2P : FRAME_COLL, s->g->gid,
                         s->seq);
    if (rc == 1) {
      /* written at once: done now (counted as a write that ended) */
      s->nwriting++;
      uvccl__net_kick_spin(net);
      break;
    }
    if (rc == 2) return; /* the verdict on the peer fails the schedule */
    if (rc != 0) {
      uvccl__sched_fail(s, UVCCL_EPEER, "%s: rank %d (%s): %s", s->name,
                        s->g->inv[op->peer], uvccl__net_addr(net, op->peer),
                        rc == UVCCL_EPEER ? "not connected"
                                          : uvccl_strerror(rc));
      return;
    }
    s->nwriting++;
    return;
  case SOP_RECV:
  case SOP_RECV_RED:
    if (op->peer >= 0 && op->peer != net->rank) {
      char msg[120];
      rc = uvccl__net_peer_ok(net, op->peer, msg, sizeof(msg));
      /* A rank that finished and left may have sent this before it went
       * (a broadcast's root, done before the others started). */
      if (rc != 0 && uvccl__net_left_early(net, op)) rc = 0;
      if (rc == 1) return; /* the verdict on the peer fails the schedule */
      if (rc != 0) {
        uvccl__sched_fail(s, rc, "%s: %s", s->name, msg);
        return;
      }
    }
    uvccl__net_post_recv(net, op);
    return;
  case SOP_COPY:
  case SOP_REDUCE:
  case SOP_SCALE:
    op->got = 0;
    /* Large, or the turn is spent: later turns do it, in slices. */
    if (op->len > UVCCL__SLICE || uvccl__turn_spent(&net->turn) ||
        !uvccl__sched_slice(op)) {
      uvccl__net_slice_add(net, op); /* on_slice finishes it */
      return;
    }
    break;
  case SOP_BOX: {
    /* A rank already gone (failed, or left cleanly) fails a box
     * collective that still needs its part; one that posted its part
     * before it left does not. (A rank that goes later fails it through
     * sched_needs.) */
    int r;
    for (r = 0; r < net->size; r++) {
      char msg[120];
      if (r == net->rank) continue;
      rc = uvccl__net_peer_ok(net, r, msg, sizeof(msg));
      if (rc >= 0 || !uvccl__shm_box_needs(net, op, r)) continue;
      uvccl__sched_fail(s, rc, "%s: %s", s->name, msg);
      return;
    }
    uvccl__shm_box_start(net, op); /* op_done when every part is in */
    return;
  }
  case SOP_CALL:
    rc = op->fn(s, op);
    if (rc != 0) {
      if (!s->completed)
        uvccl__sched_fail(s, rc, "%s: %s", s->name, uvccl_strerror(rc));
      return;
    }
    break;
  default:
    break;
  }
  uvccl__sched_op_done(op);
}

/* The least a slice moves (a multiple of every esize). */
#define SLICE_STEP (64u * 1024)

int uvccl__sched_slice(sop_t *op) {
  sched_t *s = op->s;
  uvccl__turn_t *turn = &s->g->net->turn;
  size_t off = (size_t)op->got, n = op->len - off;
  if (n > UVCCL__SLICE) n = UVCCL__SLICE; /* a multiple of every esize */
  if (n > SLICE_STEP) {
    n = uvccl__turn_piece(turn, n, SLICE_STEP);
    n -= n % SLICE_STEP;
  }
  uvccl__turn_charge(turn, n);
  switch (op->type) {
  case SOP_COPY:
    if (op->buf == op->src || n == 0) break;
    if (s->stream && ((uintptr_t)op->buf + n <= (uintptr_t)op->src ||
                      (uintptr_t)op->src + n <= (uintptr_t)op->buf))
      uvccl__par_memcpy_stream(op->buf + off, op->src + off, n);
    else
      memmove(op->buf + off, op->src + off, n);
    break;
  case SOP_REDUCE:
    uvccl__sched_reduce(s, op->buf + off, op->src + off, n);
    break;
  case SOP_SCALE:
    if (s->divisor > 1)
      uvccl_divide_local(op->buf + off, n / s->esize, s->dtype, s->divisor);
    else if (s->scale != 1.0)
      uvccl_scale_local(op->buf + off, n / s->esize, s->dtype, s->scale);
    break;
  default:
    break;
  }
  op->got += n;
  return op->got == op->len;
}

static void sched_run(sched_t *s) {
  uint32_t i;
  s->running = 1;
  while (!s->completed && ready_pop(s, &i)) start_op(s, &s->ops[i]);
  s->running = 0;
  if (!s->completed) sched_maybe_finish(s);
}

/* Striped TCP: each send and receive of a large frame to a rank of
 * another host becomes one op per piece (uvccl__net_stripe_parts), each
 * with the op's predecessors and successors (and a piece after a cut op
 * waits for all of its pieces); a piece goes on whichever of that rank's
 * connections has room (stripe.c) and is matched by its number. The
 * receiver cuts its receive as the sender its send: the pieces depend on
 * the frame's size alone. The pieces sit right after the op they come
 * from, and each op's successors are in order, so the schedule starts
 * them together (the ready queue follows the ops' order): not the first
 * piece of every segment first and the rest after. */
static int edge_order(const void *x, const void *y) {
  const sedge_t *a = x, *b = y;
  if (a->from != b->from) return a->from < b->from ? -1 : 1;
  return a->to < b->to ? -1 : a->to > b->to;
}

static void sched_stripe(sched_t *s) {
  net_t *net = s->g->net;
  uint32_t n0 = s->nops, e0 = s->nedges, i, k, e, pos, extra = 0, total;
  uint32_t *at = NULL, *parts = NULL;
  size_t *piece = NULL;
  sop_t *ops = NULL;
  if (net->lanes_want == 0 || s->p2p || s->sizes_late || n0 == 0) return;
  at = uvccl__malloc(n0 * sizeof(*at));
  parts = uvccl__malloc(n0 * sizeof(*parts));
  piece = uvccl__malloc(n0 * sizeof(*piece));
  if (at == NULL || parts == NULL || piece == NULL) goto nomem;
  for (i = 0; i < n0; i++) {
    sop_t *op = &s->ops[i];
    parts[i] = 1;
    if ((op->type == SOP_SEND || op->type == SOP_RECV ||
         op->type == SOP_RECV_RED) && op->peer >= 0)
      parts[i] = uvccl__net_stripe_parts(net, op->peer, op->len, &piece[i]);
    extra += parts[i] - 1;
  }
  if (extra == 0) goto out;
  total = n0 + extra;
  /* (the array is kept with the schedule: opcap says what it holds) */
  ops = uvccl__malloc((size_t)(total > s->opcap ? total : s->opcap) *
                      sizeof(*ops));
  if (ops == NULL) goto nomem;
  if (s->opcap < total) s->opcap = total;
  for (i = 0, pos = 0; i < n0; i++) {
    const sop_t *op = &s->ops[i];
    at[i] = pos;
    ops[pos++] = *op;
    for (k = 1; k < parts[i]; k++) {
      sop_t *x = &ops[pos++];
      size_t off = (size_t)k * piece[i];
      *x = *op;
      x->piece = (uint16_t)(k + 1);
      x->buf = op->buf + off;
      x->src = op->src != NULL ? op->src + off : NULL;
      x->len = k + 1 < parts[i] ? piece[i] : op->len - off;
    }
    if (parts[i] > 1) {
      ops[at[i]].len = piece[i];
      ops[at[i]].piece = 1;
    }
  }
  uvccl__free(s->ops);
  s->ops = ops;
  s->nops = total;
  /* Every piece of a predecessor before every piece of a successor; but
   * two ops on the same bytes, cut alike (a frame received, then sent on
   * from where it landed), go piece by piece: piece k waits for piece k
   * only, so a piece is passed on as soon as it is in. */
  for (e = 0; e < e0; e++) {
    uint32_t a = s->edges[e].from, b = s->edges[e].to, x, y;
    const sop_t *pa = &s->ops[at[a]], *pb = &s->ops[at[b]];
    int alike = parts[a] > 1 && parts[a] == parts[b] &&
                piece[a] == piece[b] && pa->buf == pb->buf &&
                s->ops[at[a] + parts[a] - 1].len ==
                    s->ops[at[b] + parts[b] - 1].len;
    s->edges[e].from = at[a];
    s->edges[e].to = at[b];
    for (x = 0; x < parts[a]; x++)
      for (y = 0; y < parts[b]; y++)
        if (x + y > 0 && (!alike || x == y))
          uvccl__sop_dep(s, at[a] + x, at[b] + y);
  }
  if (s->status != 0) goto out;
  if (s->nedges > 1)
    qsort(s->edges, s->nedges, sizeof(*s->edges), edge_order);
  goto out;
nomem:
  s->status = UV_ENOMEM;
out:
  uvccl__free(at);
  uvccl__free(parts);
  uvccl__free(piece);
}

/* Builds successor lists (CSR) from the edge list. */
static int sched_link(sched_t *s) {
  uint32_t i, *pos;
  if (s->nedges > s->succcap || s->succ == NULL) {
    /* as large as the edge list may grow: a kept schedule then never
     * allocates here again */
    uint32_t cap = s->edgecap > s->nedges ? s->edgecap : s->nedges;
    uvccl__free(s->succ);
    s->succcap = 0;
    s->succ = uvccl__malloc((cap ? cap : 1) * sizeof(uint32_t));
    if (s->succ == NULL) return UV_ENOMEM;
    s->succcap = cap;
  }
  for (i = 0; i < s->nops; i++) {
    s->ops[i].nsucc = 0;
    s->ops[i].deps = 0;
  }
  for (i = 0; i < s->nedges; i++) {
    s->ops[s->edges[i].from].nsucc++;
    s->ops[s->edges[i].to].deps++;
  }
  {
    uint32_t off = 0;
    for (i = 0; i < s->nops; i++) {
      s->ops[i].succ_off = off;
      off += s->ops[i].nsucc;
      s->ops[i].nsucc = 0;
    }
  }
  pos = s->succ;
  for (i = 0; i < s->nedges; i++) {
    sop_t *a = &s->ops[s->edges[i].from];
    pos[a->succ_off + a->nsucc++] = s->edges[i].to;
  }
  return 0;
}

/* A call refused at once (its group broke, a peer it needs failed): the
 * flight recorder still shows it was made, as failed, under the number it
 * takes (so the ranks' records stay aligned for uvccl-trace). */
static void record_refused(sched_t *s, uvccl_work_t *w, int rc,
                           const char *msg) {
  group_t *g = s->g;
  uint64_t id;
  uint32_t seq;
  if (g->fg == NULL) return;
  s->desc.tag = w->tag;
  /* a collective's number goes with it only where the group is broken:
   * elsewhere the members' numbers must stay in step on the wire */
  if (s->p2p) seq = g->p2p_seq++;
  else if (g->broken) seq = g->seq++;
  else seq = g->seq;
  id = uvccl__flight_begin(g->fg, seq, &s->desc, 1);
  uvccl__flight_end(g->fg, id, rc, msg);
}

/* ---- fingerprint checks -------------------------------------------------- */

/* Compares every member's fingerprint with this rank's: on a mismatch the
 * collective fails on every member (each has them all) with both sides
 * named, before any of its data moves. */
static int fp_compare(sched_t *s, sop_t *op) {
  group_t *g = s->g;
  char why[UVCCL_WORK_MSG_LEN];
  (void)op;
  if (!uvccl__fp_verdict(&s->fps[g->rank], s->fps, g->size, why, sizeof(why)))
    return 0;
  uvccl__sched_fail(s, UVCCL_EMISMATCH, "%s #%u: %s", s->name, s->seq, why);
  return UVCCL_EMISMATCH;
}

/* Before the collective's own steps: send this rank's fingerprint to every
 * other member, receive theirs, compare. O(size) small messages: a
 * debugging aid, as c10d's TORCH_DISTRIBUTED_DEBUG=DETAIL. */
static int fp_prelude(sched_t *s) {
  group_t *g = s->g;
  uint32_t n0 = s->nops, i, cmp;
  uint8_t *has_pred;
  int r;
  s->fps = uvccl__calloc((size_t)g->size, sizeof(*s->fps));
  has_pred = uvccl__calloc(n0 ? n0 : 1, 1);
  if (s->fps == NULL || has_pred == NULL) {
    uvccl__free(has_pred);
    return UV_ENOMEM;
  }
  /* the sequence number it is about to get (uvccl__sched_start) */
  uvccl__fp_make(&s->fps[g->rank], g->seq, s->desc.op, s->desc.dtype,
                 s->desc.redop, s->desc.root, s->desc.count_in,
                 s->desc.count_out);
  for (i = 0; i < s->nedges; i++) has_pred[s->edges[i].to] = 1;
  cmp = uvccl__sop_call(s, fp_compare);
  for (r = 0; r < g->size; r++) {
    uint32_t rcv;
    if (r == g->rank) continue;
    uvccl__sop_send(s, r, UVCCL__FP_TAG, &s->fps[g->rank], sizeof(uvccl__fp_t));
    rcv = uvccl__sop_recv(s, r, UVCCL__FP_TAG, &s->fps[r], sizeof(uvccl__fp_t));
    uvccl__sop_dep(s, rcv, cmp);
  }
  for (i = 0; i < n0; i++)
    if (!has_pred[i]) uvccl__sop_dep(s, cmp, i);
  uvccl__free(has_pred);
  return s->status;
}

/* 1 when one of s's transfers moves more than UVCCL__SPIN_SMALL_MAX
 * bytes (local copies and reductions do not count: they keep the CPU
 * busy whether or not the loop spins). */
static int sched_big(const sched_t *s) {
  uint32_t i;
  for (i = 0; i < s->nops; i++) {
    const sop_t *op = &s->ops[i];
    if ((op->type == SOP_SEND || op->type == SOP_RECV ||
         op->type == SOP_RECV_RED || op->type == SOP_BOX) &&
        op->len > UVCCL__SPIN_SMALL_MAX)
      return 1;
  }
  return 0;
}

int uvccl__sched_start(sched_t *s, uvccl_work_t *w, uvccl_work_cb cb) {
  group_t *g = s->g;
  net_t *net = g->net;
  uint64_t timeout;
  uint32_t i;
  int rc;

  if (s->status != 0) {
    rc = s->status;
    uvccl__sched_free(s);
    return rc;
  }
  if (g->broken && (!s->p2p || g->broken_err == UVCCL_EREVOKED ||
                    net->fenced)) {
    /* Every later call repeats why the group failed. */
    rc = g->broken_err ? g->broken_err : UVCCL_EPEER;
    if (w->state != UVCCL_WORK_PENDING)
      snprintf(w->msg, sizeof(w->msg), "%s: %.170s", s->name, g->broken_msg);
    record_refused(s, w, rc, g->broken_msg);
    uvccl__sched_free(s);
    return rc;
  }
  for (i = 0; i < s->nops; i++) {
    char msg[UVCCL_WORK_MSG_LEN - 32];
    sop_t *op = &s->ops[i];
    if ((op->type == SOP_SEND || op->type == SOP_RECV ||
         op->type == SOP_RECV_RED) &&
        op->peer >= 0 &&
        (rc = uvccl__net_peer_ok(net, op->peer, msg, sizeof(msg))) < 0 &&
        /* a receive from a rank that left cleanly is judged when it
         * starts: what that rank sent before leaving may be here */
        (op->type == SOP_SEND || !uvccl__net_left_cleanly(net, op->peer))) {
      if (w->state != UVCCL_WORK_PENDING)
        snprintf(w->msg, sizeof(w->msg), "%s: %s", s->name, msg);
      record_refused(s, w, rc, msg);
      uvccl__sched_free(s);
      return rc;
    }
  }
  if (g->fp_check && !s->p2p && g->size > 1) {
    rc = fp_prelude(s);
    if (rc != 0) {
      uvccl__sched_free(s);
      return rc;
    }
  }
  sched_stripe(s);
  rc = s->status != 0 ? s->status : sched_link(s);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  timeout = w->timeout_ms ? w->timeout_ms : g->timeout_ms;
  rc = uvccl__work_start(w, net->loop, s->name, &sched_work_ops, s, timeout,
                         cb);
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  uvccl__net_deadline(net, uvccl__work_deadline(w));
  if (!s->p2p) s->seq = g->seq++;
  if (g->fg != NULL) {
    s->desc.tag = w->tag;
    s->fid = uvccl__flight_begin(g->fg, s->p2p ? g->p2p_seq++ : s->seq,
                                 &s->desc, 1);
  }
  s->w = w;
  s->remaining = s->nops;
  /* Box collectives are numbered when they are sure to run, in the order
   * of the calls (the same on every rank) */
  if (s->nbox > 0)
    for (i = 0; i < s->nops; i++)
      if (s->ops[i].type == SOP_BOX) s->ops[i].slot_t = g->box_seq++;
  s->prev = g->pend_tail;
  s->next = NULL;
  if (g->pend_tail) g->pend_tail->next = s;
  else g->pend_head = s;
  g->pend_tail = s;
  net->inflight++;
  s->big = sched_big(s);
  if (s->big && net->inflight_big++ == 0) net->local_xport->set_big(net, 1);
  uvccl__net_kick_spin(net);
  for (i = 0; i < s->nops; i++)
    if (s->ops[i].deps == 0) ready_push(s, i);
  /* What the first steps move, inside the caller's call, is a turn too. */
  uvccl__turn_enter(&net->turn, UVCCL__SITE_CALL, NULL);
  sched_run(s);
  uvccl__turn_leave(&net->turn);
  return 0;
}

/* ---- failing ------------------------------------------------------------- */

/* Detaches every op still in flight. Sends whose bytes libuv still holds
 * (the user's buffer) force that connection closed: nothing may read the
 * buffer once the work has completed. */
static void sched_detach(sched_t *s, int status) {
  (void)status;
  net_t *net = s->g->net;
  uint32_t i;
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->state != SOP_ACTIVE) continue;
    if (op->type == SOP_COPY || op->type == SOP_REDUCE ||
        op->type == SOP_SCALE) {
      uvccl__net_slice_remove(net, op);
      op->state = SOP_DONE;
    } else if (op->type == SOP_RECV || op->type == SOP_RECV_RED) {
      uvccl__net_unpost(net, op);
      op->state = SOP_DONE;
    } else if (op->type == SOP_BOX) {
      uvccl__shm_box_remove(net, op);
      op->state = SOP_DONE;
    } else if (op->type == SOP_SEND && op->writing) {
      /* The rest of the frame goes from a copy: the connection stays in
       * step, and the caller has its buffer back with the work. */
      if (uvccl__net_orphan(net, op) == 0) {
        op->state = SOP_DONE;
        if (s->nwriting > 0) s->nwriting--;
      }
    }
  }
}

static void sched_break_group(sched_t *s, const char *msg) {
  group_t *g = s->g;
  if (s->p2p || g->broken) return;
  g->broken = 1;
  g->broken_err = s->fail_status ? s->fail_status : UVCCL_EPEER;
  snprintf(g->broken_msg, sizeof(g->broken_msg), "%s", msg);
  g->broken_head = 0;
  uvccl__flight_group_broken(g->fg, g->broken_err, msg);
  uvccl__net_forget_group(g->net, g->gid);
}

/* This rank gives up on g for a reason of its own (a timeout, a cancel):
 * the other members hear it at once rather than at their own timeouts. */
static void sched_tell_group(sched_t *s, int culprit, int cause,
                             const char *detail, int err) {
  uvccl__notice_t n;
  if (s->p2p) return;
  memset(&n, 0, sizeof(n));
  n.what = UVCCL__NOTICE_GROUP;
  n.gid = s->g->gid;
  n.rank = culprit;
  n.origin = s->g->net->rank;
  n.cause = cause;
  n.err = err;
  snprintf(n.detail, sizeof(n.detail), "%.119s", detail);
  uvccl__net_notify(s->g->net, &n);
}

/* Completes a failed schedule. Its sends are all back from libuv by now
 * (or their connections were closed), so the caller's buffers are free. */
static void sched_fail_now(sched_t *s) {
  s->failing = 0;
  if (uvccl__work_is_live(s->w))
    uvccl__work_fail(s->w, s->fail_status, "%s", s->fail_msg);
  s->status = s->fail_status;
  sched_complete(s, s->fail_status);
}

/* Detaches what can be detached at once (receives, sliced local ops). */
static void sched_detach_soft(sched_t *s) {
  net_t *net = s->g->net;
  uint32_t i;
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->state != SOP_ACTIVE) continue;
    if (op->type == SOP_COPY || op->type == SOP_REDUCE ||
        op->type == SOP_SCALE) {
      uvccl__net_slice_remove(net, op);
      op->state = SOP_DONE;
    } else if (op->type == SOP_RECV || op->type == SOP_RECV_RED) {
      uvccl__net_unpost(net, op);
      op->state = SOP_DONE;
    } else if (op->type == SOP_BOX) {
      uvccl__shm_box_remove(net, op);
      op->state = SOP_DONE;
    }
  }
}

void uvccl__sched_fail(sched_t *s, int err, const char *fmt, ...) {
  va_list ap;
  uint32_t i;
  if (s->completed || s->failing) return;
  va_start(ap, fmt);
  vsnprintf(s->fail_msg, sizeof(s->fail_msg), fmt, ap);
  va_end(ap);
  s->fail_status = err;
  sched_detach_soft(s);
  if (err == UVCCL_EMISMATCH && !s->p2p && !s->g->broken)
    /* The members that saw nothing wrong hear why at once, rather than
     * "left the group" when this rank moves on. */
    sched_tell_group(s, -1, UVCCL_FAIL_PROTOCOL, s->fail_msg, err);
  /* Sends still queued go on from copies (see sched_detach). */
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->type == SOP_SEND && op->state == SOP_ACTIVE && op->writing &&
        uvccl__net_orphan(s->g->net, op) == 0) {
      op->state = SOP_DONE;
      if (s->nwriting > 0) s->nwriting--;
    }
  }
  sched_break_group(s, s->fail_msg);
  if (s->nwriting == 0) {
    sched_fail_now(s);
    return;
  }
  /* A send could not be detached: its connection was closed, which gives
   * the buffer back through its callback (or the work's timeout). */
  s->failing = 1;
}

/* "30 s", "1.5 s", "250 ms" */
static void fmt_duration(uint64_t ms, char *buf, size_t len) {
  if (ms < 1000)
    snprintf(buf, len, "%llu ms", (unsigned long long)ms);
  else if (ms % 1000 == 0)
    snprintf(buf, len, "%llu s", (unsigned long long)(ms / 1000));
  else
    snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
}

/* Why a schedule is stuck, as far as this rank can know: the peers whose
 * messages have not (fully) arrived, with the step (the message's tag in
 * the schedule) and how much of it came; else the peers still taking
 * what it sends; else its own local steps. */
static void timeout_why(sched_t *s, char *buf, size_t len) {
  net_t *net = s->g->net;
  size_t off = 0;
  int peers[4], n = 0, more = 0, k;
  uint32_t i;
  buf[0] = '\0';
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->state == SOP_ACTIVE && op->type == SOP_BOX) {
      int r;
      for (r = 0; r < net->size && n < 4 && off < len; r++) {
        if (r == net->rank || !uvccl__shm_box_needs(net, op, r)) continue;
        n++;
        off += (size_t)snprintf(
            buf + off, len - off, "%srank %d (%s), which has not sent its "
            "part of box collective %llu through shared memory (0 of %zu "
            "bytes arrived)", n > 1 ? "; " : "waiting for ", s->g->inv[r],
            uvccl__net_addr(net, r), (unsigned long long)op->slot_t,
            op->len);
      }
      if (n > 0) return;
      continue;
    }
    if (op->state != SOP_ACTIVE ||
        (op->type != SOP_RECV && op->type != SOP_RECV_RED))
      continue;
    for (k = 0; k < n && peers[k] != op->peer; k++) {
    }
    if (k < n) continue;
    if (n == 4) {
      more++;
      continue;
    }
    peers[n++] = op->peer;
    if (op->peer < 0) {
      off += (size_t)snprintf(buf + off, len - off, "%sa message from any "
                              "rank (tag %u)", n > 1 ? "; " : "waiting for ",
                              op->tag);
    } else {
      char step[32];
      if (s->p2p)
        snprintf(step, sizeof(step), "tag %u", op->tag);
      else if (op->tag == 0xffff) /* the algorithms' "final result" */
        snprintf(step, sizeof(step), "the result");
      else if (op->tag == UVCCL__FP_TAG)
        snprintf(step, sizeof(step), "its fingerprint");
      else
        snprintf(step, sizeof(step), "step %u", op->tag);
      off += (size_t)snprintf(
          buf + off, len - off, "%srank %d (%s), which has not sent %s "
          "(%llu of %zu bytes arrived)", n > 1 ? "; " : "waiting for ",
          s->g->inv[op->peer], uvccl__net_addr(net, op->peer), step,
          (unsigned long long)op->got, op->len);
    }
    if (off >= len) return;
  }
  if (more > 0) {
    snprintf(buf + off, len - off, "; and %d more rank%s", more,
             more > 1 ? "s" : "");
    return;
  }
  if (n > 0) return;
  for (i = 0; i < s->nops; i++) {
    const sop_t *op = &s->ops[i];
    if (op->state != SOP_ACTIVE || op->type != SOP_SEND) continue;
    snprintf(buf, len, "waiting for rank %d (%s) to take step %u of %zu "
             "bytes (it is not reading)", s->g->inv[op->peer],
             uvccl__net_addr(net, op->peer), op->tag, op->len);
    return;
  }
  snprintf(buf, len, "no peer is awaited (its own steps are still running)");
}

static int sched_defer(uvccl_work_t *w) {
  sched_t *s = w->owner_;
  return uvccl__net_defer_works(s->g->net);
}

/* The caller waits (uvccl_work_wait) and the group spins on shared
 * memory: look at the rings here for a few microseconds rather than turn
 * the loop (a turn is a system call, most of a small collective's time);
 * the loop then runs as usual for everything else. */
#define PROGRESS_NS 5000
static void sched_progress(uvccl_work_t *w) {
  sched_t *s = w->owner_;
  net_t *net = s->g->net;
  uint64_t until = 0;
  uint32_t i;
  /* the clock from the 32nd look on: most waits end before (a clock read
   * is a sizeable part of a small collective here); at every look where
   * a look that finds nothing yields the CPU (net.c, oversubscribed) */
  for (i = 1; uvccl__work_is_live(w); i++) {
    if (!uvccl__net_poll_fast(net)) return;
    if ((i & 31) == 0 || uvccl__net_spin_yielding(net)) {
      uint64_t now = uv_hrtime();
      if (until == 0) until = now + PROGRESS_NS;
      else if (now > until) return;
    }
  }
}

/* The net's deadline timer: the works past their deadline time out (as
 * their own timers would have), and the timer is set for the next. */
static void sched_expire(net_t *net) {
  uint64_t now = uv_now(net->loop), next = 0;
  group_t *g;
again:
  for (g = net->groups; g != NULL; g = g->next) {
    sched_t *x;
    for (x = g->pend_head; x != NULL; x = x->next) {
      uint64_t due;
      if (x->w == NULL || !uvccl__work_is_live(x->w)) continue;
      due = uvccl__work_deadline(x->w);
      if (due == 0) continue;
      if (due <= now) {
        uvccl__work_expire(x->w); /* may unlink x, even end the group */
        goto again;
      }
      if (next == 0 || due < next) next = due;
    }
  }
  if (next != 0) uvccl__net_deadline(net, next);
}

/* The work timed out or was cancelled. */
static void sched_abandon(uvccl_work_t *w, int status) {
  sched_t *s = w->owner_;
  net_t *net = s->g->net;
  uint32_t i;
  int waiting = -1;
  if (s->completed) return;
  if (s->failing) {
    sched_detach(s, status);
    if (uvccl__work_is_live(w))
      uvccl__work_fail(w, s->fail_status, "%s", s->fail_msg);
    s->failing = 0;
    sched_complete(s, s->fail_status);
    return;
  }
  for (i = 0; i < s->nops && waiting < 0; i++) {
    sop_t *op = &s->ops[i];
    if (op->state == SOP_ACTIVE &&
        (op->type == SOP_RECV || op->type == SOP_RECV_RED)) {
      waiting = op->peer;
    } else if (op->state == SOP_ACTIVE && op->type == SOP_BOX) {
      int r;
      for (r = 0; r < net->size && waiting < 0; r++)
        if (r != net->rank && uvccl__shm_box_needs(net, op, r)) waiting = r;
    }
  }
  if (status == UV_ETIMEDOUT && s->list_waiting && waiting >= 0) {
    char list[UVCCL_WORK_MSG_LEN];
    size_t off = 0;
    int n = 0;
    list[0] = '\0';
    for (i = 0; i < s->nops && off < sizeof(list) - 32; i++) {
      sop_t *op = &s->ops[i];
      if (op->state != SOP_ACTIVE || op->type != SOP_RECV) continue;
      if (n > 0 && s->list_waiting < 2) break;
      off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d (%s)",
                              n ? ", " : "", s->g->inv[op->peer],
                              uvccl__net_addr(net, op->peer));
      n++;
    }
    uvccl__work_fail(w, status, "%s (group \"%s\") timed out after %llu ms: "
                     "rank%s %s did not arrive", s->name, s->g->trace_name,
                     (unsigned long long)w->timeout_ms_, n > 1 ? "s" : "",
                     list);
  } else if (status == UV_ETIMEDOUT) {
    char why[UVCCL_WORK_MSG_LEN], dur[32];
    timeout_why(s, why, sizeof(why));
    fmt_duration(w->timeout_ms_, dur, sizeof(dur));
    if (s->p2p)
      uvccl__work_fail(w, status, "%s (group \"%s\") timed out after %s: "
                       "%s", s->name, s->g->trace_name, dur, why);
    else
      uvccl__work_fail(w, status, "%s #%u (group \"%s\") timed out after "
                       "%s: %s", s->name, s->seq, s->g->trace_name, dur, why);
  }
  if (status == UV_ETIMEDOUT) {
    /* everyone dumps (through the store), not only this rank */
    const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
    if (dir != NULL && *dir != '\0')
      uvccl__trace_watch_request(net->twatch, w->msg);
  }
  s->status = status;
  s->fail_status = status;
  sched_detach(s, status);
  if (!s->p2p && !s->g->broken) {
    sched_tell_group(s, status == UV_ETIMEDOUT ? waiting : -1,
                     status == UV_ETIMEDOUT ? UVCCL_FAIL_TIMEOUT
                                            : UVCCL_FAIL_ABORTED,
                     w->msg[0] ? w->msg : "cancelled by its application",
                     UVCCL_EPEER);
  }
  sched_break_group(s, w->msg[0] ? w->msg : "an operation was cancelled");
  if (!uvccl__work_is_live(w)) {
    sched_complete(s, status);
    return;
  }
  uvccl__work_fail(w, status, "%s cancelled", s->name);
  sched_complete(s, status);
}

static int sched_needs(sched_t *s, int world_rank) {
  uint32_t i;
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->state == SOP_DONE) continue;
    if (op->type == SOP_BOX) {
      /* every rank's part, until it is here */
      if (op->state == SOP_WAITING ||
          uvccl__shm_box_needs(s->g->net, op, world_rank))
        return 1;
      continue;
    }
    if ((op->type == SOP_SEND || op->type == SOP_RECV ||
         op->type == SOP_RECV_RED) &&
        op->peer == world_rank &&
        /* a frame the rank sent before it left is no reason to fail
         * (early, or being handed over to a posted receive) */
        !(op->type != SOP_SEND && uvccl__net_left_early(s->g->net, op)))
      return 1;
  }
  return 0;
}

static void fail_matching(group_t *g, int world_rank, int err,
                          const char *msg) {
  for (;;) {
    sched_t *s;
    for (s = g->pend_head; s != NULL; s = s->next)
      if (!s->completed && !s->failing &&
          (world_rank < 0 || sched_needs(s, world_rank)))
        break;
    if (s == NULL) return;
    uvccl__sched_fail(s, err, "%s: %s", s->name, msg);
  }
}

void uvccl__group_fail_all(group_t *g, int err, const char *msg) {
  fail_matching(g, -1, err, msg);
}

void uvccl__group_fail_peer(group_t *g, int world_rank, int err,
                            const char *msg) {
  fail_matching(g, world_rank, err, msg);
}

void uvccl__group_break(group_t *g, int err, const uvccl__fail_t *culprit,
                        const char *msg) {
  if (!g->broken) {
    g->broken = 1;
    g->broken_err = err;
    snprintf(g->broken_msg, sizeof(g->broken_msg), "%s", msg);
    g->broken_head = 0;
    uvccl__flight_group_broken(g->fg, err, msg);
    if (culprit != NULL) g->culprit = *culprit;
    else g->culprit.rank = -1;
    uvccl__net_forget_group(g->net, g->gid);
  }
  fail_matching(g, -1, err, msg);
}

/* ---- the transport's upcalls -------------------------------------------- */

static void up_op_fail(sched_t *s, int err, const char *msg) {
  uvccl__sched_fail(s, err, "%s", msg);
}

const net_upcalls_t uvccl__sched_upcalls = {
    uvccl__sched_op_done,    uvccl__sched_send_lost, up_op_fail,
    uvccl__sched_reduce_in,  uvccl__sched_slice,     uvccl__group_fail_all,
    uvccl__group_fail_peer,  uvccl__group_break,     sched_expire};
