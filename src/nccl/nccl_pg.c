/* NCCL process groups: the life of an op (submit to the device thread,
 * hold until the communicator exists, complete the work on the loop), the
 * async-error watchdog, the group object and its teardown. Above it:
 * creation (nccl_boot.c), subgroups (nccl_subgroup.c), shrink and revoke
 * (nccl_shrink.c), the operations (nccl_ops.c) and the other public calls
 * (nccl_group.c); an op they make tells its own done() through
 * op->done_fn, so nothing here calls up into them.
 *
 * Threads: everything here runs on the group's loop; the NCCL and CUDA
 * calls run on the device thread in the ops' issue() (nccl_exec.c). */
#include "nccl_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void op_done(uvccl__gpu_op_t *gop);
static void watchdog_update(nccl_group_t *g);

/* ---- ops ------------------------------------------------------------------ */

nccl_op_t *uvccl__nccl_op_new(nccl_group_t *g, nop_kind_t kind,
                              const char *name) {
  nccl_op_t *op = uvccl__calloc(1, sizeof(*op));
  if (op == NULL) return NULL;
  op->g = g;
  op->kind = kind;
  op->name = name;
  op->calls = op->inline_calls;
  op->gop.issue = uvccl__nccl_issue;
  op->gop.done = op_done;
  op->gop.data = op;
  op->gop.no_event = kind != NOP_CALLS && kind != NOP_DRAIN;
  op->desc.op = name;
  op->desc.root = -1;
  op->desc.peer = -1;
  return op;
}

void uvccl__nccl_op_free(nccl_op_t *op) {
  if (op == NULL) return;
  if (op->calls != op->inline_calls) uvccl__free(op->calls);
  uvccl__free(op->excl);
  uvccl__free(op);
}

ncall_t *uvccl__nccl_op_calls(nccl_op_t *op, size_t n) {
  if (n > UVCCL__ARRAY_SIZE(op->inline_calls)) {
    op->calls = uvccl__calloc(n, sizeof(ncall_t));
    if (op->calls == NULL) {
      op->calls = op->inline_calls;
      return NULL;
    }
  }
  op->ncalls = n;
  return op->calls;
}

static void list_push(nccl_op_t **head, nccl_op_t **tail, nccl_op_t *op) {
  op->next = NULL;
  op->prev = *tail;
  if (*tail) (*tail)->next = op;
  else *head = op;
  *tail = op;
}

static void list_remove(nccl_op_t **head, nccl_op_t **tail, nccl_op_t *op) {
  if (op->prev) op->prev->next = op->next;
  else *head = op->next;
  if (op->next) op->next->prev = op->prev;
  else *tail = op->prev;
  op->next = op->prev = NULL;
}

static int carries_work(const nccl_op_t *op) {
  return op->kind == NOP_CALLS || op->kind == NOP_STREAM_WAIT ||
         op->kind == NOP_WAIT_STREAM;
}

/* Hands op to the device thread now. */
int uvccl__nccl_op_submit(nccl_group_t *g, nccl_op_t *op) {
  int rc;
  if (op->kind == NOP_CALLS || op->kind == NOP_DRAIN ||
      op->kind == NOP_STREAM_WAIT || op->kind == NOP_WAIT_STREAM)
    op->gop.stream = g->stream; /* ordered after the group's earlier ops */
  list_push(&g->live_head, &g->live_tail, op);
  g->nlive++;
  if (carries_work(op)) g->nwork++;
  rc = uvccl__gpu_submit(g->client, &op->gop);
  if (rc != 0) {
    list_remove(&g->live_head, &g->live_tail, op);
    g->nlive--;
    if (carries_work(op)) g->nwork--;
    return rc;
  }
  watchdog_update(g);
  return 0;
}

static void work_abandon(uvccl_work_t *w, int status) {
  nccl_op_t *op = w->owner_;
  (void)status;
  /* The GPU work cannot be taken back, and every rank must issue the same
   * collectives in the same order, so the op runs on (or stays queued):
   * only the work lets go of it. Its buffers must stay valid until the
   * group's stream passed it (uvccl_nccl_stream_wait, or a later op). */
  if (op == NULL) return;
  op->work = NULL;
  w->owner_ = NULL;
}

const struct uvccl__work_ops uvccl__nccl_work_ops = {work_abandon, NULL, NULL};

void uvccl__nccl_fail_work(nccl_op_t *op, int status, const char *msg) {
  uvccl_work_t *w = op->work;
  op->work = NULL;
  if (w == NULL) return;
  w->owner_ = NULL;
  if (uvccl__work_is_live(w))
    uvccl__work_fail(w, status, "%s", msg);
}

int uvccl__nccl_group_check(uvccl_pg_t *pg, uvccl_work_t *work,
                            nccl_group_t **out) {
  nccl_group_t *g;
  if (pg == NULL || work == NULL || pg->impl_ == NULL) return UV_EINVAL;
  g = pg->impl_;
  if (g->destroying) return UVCCL_ECLOSING;
  if (g->aborted) return UVCCL_EABORTED;
  if (g->revoked) {
    if (work->state != UVCCL_WORK_PENDING)
      snprintf(work->msg, sizeof(work->msg), "%s", g->fail_msg);
    return UVCCL_EREVOKED;
  }
  if (g->failed || g->broken) {
    LOG_ERROR("nccl", "rank %d/%d: the group failed earlier (%s); destroy "
              "it", g->rank, g->size, g->failed ? "creation" : "NCCL error");
    return UVCCL_ENCCL;
  }
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  *out = g;
  return 0;
}

/* A lazy group's first operation brings its communicator. */
static void init_if_due(nccl_group_t *g) {
  if (!g->init_due || g->lazy_init == NULL) return;
  g->init_due = 0;
  g->lazy_init(g);
}

void uvccl__nccl_op_hold(nccl_group_t *g, nccl_op_t *op) {
  list_push(&g->held_head, &g->held_tail, op);
  init_if_due(g);
}

/* The group's flight recorder record, at its first operation (a split's
 * child learns its rank and size only when the split is done). Global
 * ranks are known for the world and new_group's groups; a split's are
 * recorded as -1. */
static void trace_register(nccl_group_t *g) {
  int *r, i;
  if (g->fg_tried || g->rank < 0 || g->size <= 0) return;
  g->fg_tried = 1;
  r = uvccl__malloc((size_t)g->size * sizeof(int));
  if (r == NULL) return;
  for (i = 0; i < g->size; i++)
    r[i] = g->world ? i : g->ranks != NULL ? g->ranks[i] : -1;
  g->fg = uvccl__flight_group_add(
      "nccl", g->trace_name[0] ? g->trace_name : "nccl",
      g->trace_gid ? g->trace_gid : 1, g->rank, g->size, r, g->trace_size,
      g->loop, NULL, NULL);
  uvccl__free(r);
}

/* A collective or point-to-point op: queued until the GPU thread issues
 * it (nccl_exec.c marks it started). */
static void trace_begin(nccl_group_t *g, nccl_op_t *op, uvccl_work_t *work) {
  op->seq = op->desc.p2p ? g->p2p_seq++ : g->seq++;
  if (g->fp_check && !op->desc.p2p && g->size > 1) {
    /* compared on the GPU thread before the op's own calls */
    op->fp = 1;
    uvccl__fp_make(&op->fp_mine, op->seq, op->desc.op, op->desc.dtype,
                   op->desc.redop, op->desc.root, op->desc.count_in,
                   op->desc.count_out);
  }
  trace_register(g);
  if (g->fg == NULL) return;
  op->desc.tag = work->tag;
  op->fid = uvccl__flight_begin(g->fg, op->seq, &op->desc, 0);
}

int uvccl__nccl_op_start(nccl_group_t *g, nccl_op_t *op, uvccl_work_t *work,
                         uvccl_work_cb cb) {
  uint64_t t;
  int rc = uvccl__work_start(work, g->loop, op->name, &uvccl__nccl_work_ops, op, 0,
                             cb);
  if (rc != 0) {
    uvccl__nccl_op_free(op);
    return rc;
  }
  op->work = work;
  if (op->kind == NOP_CALLS) trace_begin(g, op, work);
  /* The timeout runs from when the op starts on the GPU (device layer),
   * not from now: work queued behind other work does not time out. */
  t = work->timeout_ms ? work->timeout_ms : g->timeout_ms;
  op->gop.timeout_ms = t == UVCCL_NO_TIMEOUT ? 0 : t;
  if (!g->ready) {
    list_push(&g->held_head, &g->held_tail, op);
    init_if_due(g);
    return 0;
  }
  rc = uvccl__nccl_op_submit(g, op);
  if (rc != 0) {
    char msg[96];
    snprintf(msg, sizeof(msg), "%s: submitting to the GPU thread: %s",
             op->name, uvccl_strerror(rc));
    uvccl__nccl_fail_work(op, rc, msg);
    uvccl__nccl_op_free(op);
  }
  return 0;
}

/* The communicator exists (or never will): release the held ops. */
void uvccl__nccl_flush_held(nccl_group_t *g, int status, const char *msg) {
  while (g->held_head != NULL) {
    nccl_op_t *op = g->held_head;
    int rc = status;
    list_remove(&g->held_head, &g->held_tail, op);
    if (rc == 0 && (rc = uvccl__nccl_op_submit(g, op)) == 0) continue;
    if ((op->kind == NOP_SPLIT || op->kind == NOP_SHRINK) &&
        op->target != NULL) {
      /* a child waiting for this parent */
      nccl_group_t *c = op->target;
      c->creating--;
      c->failed = 1;
      uvccl__nccl_flush_held(c, rc, "the parent group failed");
      uvccl__nccl_destroy_progress(c);
    }
    if (op->work != NULL) {
      char m[UVCCL_WORK_MSG_LEN];
      snprintf(m, sizeof(m), "%s (group rank %d/%d): %s", op->name, g->rank,
               g->size, msg ? msg : uvccl_strerror(rc));
      uvccl__nccl_fail_work(op, rc, m);
    }
    uvccl__nccl_op_free(op);
  }
}

/* Fails every work of the group now (live ops run on, detached). */
void uvccl__nccl_fail_all_works(nccl_group_t *g, int status, const char *msg) {
  nccl_op_t *op;
  char m[UVCCL_WORK_MSG_LEN];
  for (op = g->live_head; op != NULL; op = op->next) {
    if (op->work == NULL) continue;
    snprintf(m, sizeof(m), "%s (group rank %d/%d): %s", op->name, g->rank,
             g->size, msg);
    uvccl__nccl_fail_work(op, status, m);
  }
  uvccl__nccl_flush_held(g, status, msg);
}

/* An asynchronous NCCL error: the communicator is unusable (only abort
 * helps), so every pending work fails and later ops are refused. */
static void group_break(nccl_group_t *g, int status, const char *msg) {
  if (g->broken) return;
  g->broken = 1;
  uvccl__flight_group_broken(g->fg, status, msg);
  if (g->fail_msg[0] == '\0')
    snprintf(g->fail_msg, sizeof(g->fail_msg), "%s", msg);
  LOG_ERROR("nccl", "rank %d/%d (cuda:%d): %s; failing the pending work",
            g->rank, g->size, g->device, msg);
  uvccl__nccl_fail_all_works(g, status, msg);
  if (g->client != NULL) uvccl__gpu_client_fail_all(g->client, status, msg);
}

/* ---- the watchdog: async errors of communicators with work in flight ---- */

static void watchdog_tick(uv_timer_t *t) {
  nccl_group_t *g = t->data;
  nccl_op_t *op;
  if (g->nwork == 0 || g->broken || g->destroying) {
    uv_timer_stop(t);
    return;
  }
  if (g->checking || !g->ready) return;
  op = uvccl__nccl_op_new(g, NOP_CHECK, "check");
  if (op == NULL) return;
  if (uvccl__nccl_op_submit(g, op) != 0) {
    uvccl__nccl_op_free(op);
    return;
  }
  g->checking = 1;
}

static uint64_t watchdog_period_ms(void) {
  uint64_t ms;
  uvccl__config_uint(UVCCL__CFG_NCCL_WATCHDOG_MS, &ms);
  return ms;
}

static void watchdog_update(nccl_group_t *g) {
  if (!g->watchdog_init || g->nwork == 0 || uv_is_active((uv_handle_t *)&g->watchdog))
    return;
  uint64_t p = watchdog_period_ms();
  uv_timer_start(&g->watchdog, watchdog_tick, p, p);
}

/* ---- op completion ---------------------------------------------------------- */


static void op_done(uvccl__gpu_op_t *gop) {
  nccl_op_t *op = gop->data;
  nccl_group_t *g = op->g;
  int st = gop->status;
  list_remove(&g->live_head, &g->live_tail, op);
  g->nlive--;
  if (carries_work(op)) g->nwork--;
  g->last_times[0] = gop->t_submit_ns;
  g->last_times[1] = gop->t_issued_ns;
  g->last_times[2] = gop->t_gpu_done_ns;
  g->last_times[3] = gop->t_done_ns;
  if (op->newcomm != NULL) {
    /* An init or split taken off the device thread (timeout, cancel,
     * abort) while NCCL was still making the communicator: it goes back
     * to the device thread to be aborted there, in order, instead of
     * leaking (the device thread no longer touches a removed op). */
    nccl_op_t *ab = uvccl__nccl_op_new(g, NOP_ABORT, "ncclCommAbort");
    if (ab != NULL) {
      ab->newcomm = op->newcomm;
      if (uvccl__nccl_op_submit(g, ab) != 0) uvccl__nccl_op_free(ab);
    }
    op->newcomm = NULL;
  }
  switch (op->kind) {
  case NOP_CALLS:
  case NOP_STREAM_WAIT:
  case NOP_WAIT_STREAM:
    if (op->fid != 0) {
      uvccl__flight_end(g->fg, op->fid, st, gop->msg);
      if (st != 0 && st != UV_ECANCELED)
        uvccl__flight_dump_on_error(NULL, gop->msg[0] ? gop->msg
                                                      : uvccl_strerror(st));
    }
    if (st == UV_ETIMEDOUT) {
      const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
      if (dir != NULL && *dir != '\0' && op->fid != 0)
        /* every rank of the world dumps (through its store) */
        uvccl__trace_watch_request(g->twatch, gop->msg);
      g->had_timeout = 1;
      LOG_ERROR("nccl", "rank %d/%d: %s timed out on cuda:%d (%s); the "
                "communicator may be stuck: abort the group", g->rank,
                g->size, op->name, g->device, gop->msg);
    }
    if (op->work != NULL) {
      uvccl_work_t *w = op->work;
      if (st == 0) {
        if (op->p2p != NULL) {
          size_t i;
          for (i = 0; i < op->ncalls; i++) {
            op->p2p[i].received = op->p2p[i].is_send ? 0 : op->p2p[i].len;
            op->p2p[i].source = op->p2p[i].is_send ? -1 : op->p2p[i].peer;
          }
        }
        if (strcmp(op->name, "recv") == 0) {
          w->value_len = op->recv_len;
          w->result = op->recv_src;
        }
        op->work = NULL;
        w->owner_ = NULL;
        uvccl__work_complete(w, 0);
      } else {
        char m[UVCCL_WORK_MSG_LEN];
        snprintf(m, sizeof(m), "%s (group rank %d/%d, cuda:%d): %s",
                 op->name, g->rank, g->size, g->device,
                 gop->msg[0] ? gop->msg : uvccl_strerror(st));
        uvccl__nccl_fail_work(op, st, m);
      }
    }
    if (st == UVCCL_ENCCL && op->async_failed) group_break(g, st, gop->msg);
    break;
  case NOP_CHECK:
    g->checking = 0;
    if (st != 0 && !g->aborted && !g->destroying) group_break(g, UVCCL_ENCCL, gop->msg);
    break;
  case NOP_UNIQUE_ID:
  case NOP_COMM_INIT:
  case NOP_GROW_ID:
  case NOP_GROW:
  case NOP_SPLIT:
  case NOP_SHRINK:
  case NOP_REVOKE:
    /* the layer that made it (creation, subgroups, shrink) takes it */
    if (op->done_fn != NULL) op->done_fn(op);
    break;
  case NOP_DRAIN:
  case NOP_FINALIZE:
  case NOP_ABORT:
    if (st != 0 && st != UV_ECANCELED && st != UVCCL_EABORTED)
      LOG_WARN("nccl", "rank %d/%d: %s: %s", g->rank, g->size, op->name,
               gop->msg[0] ? gop->msg : uvccl_strerror(st));
    break;
  }
  uvccl__nccl_op_free(op);
  uvccl__nccl_destroy_progress(g);
}

/* ---- creation ------------------------------------------------------------------ */

nccl_group_t *uvccl__nccl_group_new(uv_loop_t *loop, uvccl_pg_t *pg, int rank,
                               int size, int device) {
  nccl_group_t *g = uvccl__calloc(1, sizeof(*g));
  if (g == NULL) return NULL;
  g->pg = pg;
  g->loop = loop;
  g->rank = rank;
  g->size = size;
  g->device = device;
  g->handles = 1;
  g->timeout_ms = UVCCL_PG_DEFAULT_TIMEOUT_MS;
  snprintf(g->addr, sizeof(g->addr), "cuda:%d", device);
  uv_timer_init(loop, &g->watchdog);
  g->watchdog.data = g;
  g->watchdog_init = 1;
  return g;
}

static void group_free(nccl_group_t *g) {
  tagged_t *t = g->tagged;
  if (g->tag_entry != NULL) { /* the parent forgets us */
    g->tag_entry->g = NULL;
    g->tag_entry->gone = 1;
  }
  while (t != NULL) {
    tagged_t *n = t->next;
    if (t->g != NULL) t->g->tag_entry = NULL; /* children outlive us */
    uvccl__free(t->tag);
    uvccl__free(t->ranks);
    uvccl__free(t);
    t = n;
  }
  uvccl__flight_group_remove(g->fg);
  uvccl__free(g->premul);
  uvccl__free(g->ranks);
  uvccl__free(g->boot);
  uvccl__free(g);
}

static void group_closed(uv_handle_t *h);

/* A group that never got a client: freed from its timer's close. */
void uvccl__nccl_group_discard(nccl_group_t *g) {
  g->pg = NULL;
  g->close_cb = NULL;
  uv_close((uv_handle_t *)&g->watchdog, group_closed);
}

/* The device thread and this loop's client of it. */
int uvccl__nccl_group_attach(nccl_group_t *g, char *err, size_t errlen) {
  int rc = uvccl__gpu_acquire(g->device, &g->gpu, err, errlen);
  if (rc != 0) return rc;
  rc = uvccl__gpu_client_init(g->loop, g->gpu, &g->client);
  if (rc != 0) {
    snprintf(err, errlen, "connecting to the GPU thread of cuda:%d: %s",
             g->device, uvccl_strerror(rc));
    uvccl__gpu_release(g->gpu);
    g->gpu = NULL;
    g->client = NULL;
  }
  return rc;
}

/* ---- destroy and abort ---------------------------------------------------------- */

static void group_closed(uv_handle_t *h) {
  nccl_group_t *g = h->data;
  uvccl_pg_t *pg = g->pg;
  uvccl_pg_close_cb cb = g->close_cb;
  group_free(g);
  if (pg != NULL) pg->impl_ = NULL;
  if (cb != NULL) cb(pg);
}

static void part_closed(nccl_group_t *g) {
  if (--g->closing_parts == 0)
    uv_close((uv_handle_t *)&g->watchdog, group_closed);
}

static void own_store_closed(uvccl_store_t *s) {
  nccl_group_t *g = s->data;
  uvccl__free(s);
  part_closed(g);
}

static void own_server_closed(uvccl_store_server_t *s) {
  nccl_group_t *g = s->data;
  uvccl__free(s);
  part_closed(g);
}

static void client_closed(void *arg) {
  nccl_group_t *g = arg;
  if (g->gpu != NULL) uvccl__gpu_release(g->gpu);
  g->gpu = NULL;
  g->client = NULL;
  /* the store and server a URL made live as long as the group */
  g->closing_parts = 1;
  if (g->own_store != NULL) {
    uvccl__trace_watch_stop(g->twatch);
    g->twatch = NULL;
    g->closing_parts++;
    g->own_store->data = g;
    uvccl_store_close(g->own_store, own_store_closed);
    g->own_store = NULL;
  }
  if (g->own_server != NULL) {
    g->closing_parts++;
    g->own_server->data = g;
    uvccl_store_server_close(g->own_server, own_server_closed);
    g->own_server = NULL;
  }
  part_closed(g);
}

void uvccl__nccl_destroy_progress(nccl_group_t *g) {
  if (!g->destroying || g->creating > 0 || g->nlive > 0) return;
  if (g->dstate == 0) {
    g->dstate = 1;
    if (g->client != NULL &&
        (g->comm != NULL || g->stream != NULL || g->scratch != NULL)) {
      /* Finalize flushes and syncs with peers; after a timeout or an
       * error the stream may never drain, so abort instead. */
      int abort = g->broken || g->had_timeout || g->aborted;
      nccl_op_t *op = uvccl__nccl_op_new(
          g, abort ? NOP_ABORT : NOP_FINALIZE,
          abort ? "ncclCommAbort" : "ncclCommFinalize");
      if (op != NULL && uvccl__nccl_op_submit(g, op) == 0) return;
      uvccl__nccl_op_free(op);
    }
  }
  if (g->dstate == 1) {
    g->dstate = 2;
    uv_timer_stop(&g->watchdog);
    if (g->client != NULL)
      uvccl__gpu_client_close(g->client, client_closed, g);
    else
      client_closed(g);
  }
}
