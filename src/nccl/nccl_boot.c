/* Creation of an NCCL world group over a store: every rank counts itself
 * in (the generation of the prefix), rank 0 makes the NCCL id on the
 * device thread and publishes it at PREFIX/nccl/id/<gen>, the others wait
 * for it, then every rank creates its nonblocking communicator on the
 * device thread (ncclCommInitRankConfig, polled, never blocking).
 *
 * A world made by a grow goes the same way with ncclCommGrow: rank 0 (a
 * member) gets the single-use id from its old world
 * (ncclCommGetUniqueId) and publishes it; the joiners wait for it; the
 * other members need none (their old world carries them). */
#include "nccl_internal.h"
#include "cuda/cuda_api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void uvccl__nccl_boot_fail(nccl_group_t *g, int status, const char *fmt, ...) {
  nccl_boot_t *b = g->boot;
  char msg[UVCCL_WORK_MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  g->failed = 1;
  if (g->fail_msg[0] == '\0')
    snprintf(g->fail_msg, sizeof(g->fail_msg), "%s", msg);
  if (b != NULL && !b->dead) {
    b->dead = 1;
    LOG_ERROR("nccl", "rank %d/%d: creating the group: %s", g->rank, g->size,
              msg);
    if (b->work != NULL && uvccl__work_is_live(b->work)) {
      b->work->owner_ = NULL;
      uvccl__work_fail(b->work, status, "%s", msg);
    }
    b->work = NULL;
  }
  uvccl__nccl_flush_held(g, status, "the group's creation failed");
}

static void boot_step_done(nccl_op_t *op) { uvccl__nccl_boot_step(op->g, op); }

static void boot_submit(nccl_group_t *g, nop_kind_t kind, const char *name) {
  nccl_op_t *op = uvccl__nccl_op_new(g, kind, name);
  int rc;
  if (op != NULL) op->done_fn = boot_step_done;
  rc = op ? uvccl__nccl_op_submit(g, op) : UV_ENOMEM;
  if (rc != 0) {
    uvccl__nccl_op_free(op);
    uvccl__nccl_boot_fail(g, rc, "%s: %s", name, uvccl_strerror(rc));
    return;
  }
  g->creating++;
}

void uvccl__nccl_boot_init(nccl_group_t *g) {
  if (g->grown)
    boot_submit(g, NOP_GROW, "ncclCommGrow");
  else
    boot_submit(g, NOP_COMM_INIT, "ncclCommInitRankConfig");
}

/* A world that owns its store client (made from a URL) watches it for
 * flight recorder dump requests. */
static void trace_watch(nccl_group_t *g) {
  if (g->own_store != NULL && g->twatch == NULL)
    g->twatch = uvccl__trace_watch_start(g->loop, g->rank, g->size,
                                         g->own_store, g->trace_name);
}

/* Every rank knows the id: eager groups make the communicator now; lazy
 * ones are created already (the id is all they need from the store) and
 * make it with their first operation. */
static void id_known(nccl_group_t *g) {
  nccl_boot_t *b = g->boot;
  if (!g->lazy) {
    uvccl__nccl_boot_init(g);
    return;
  }
  g->init_due = 1;
  g->lazy_init = uvccl__nccl_boot_init;
  trace_watch(g);
  LOG_DEBUG("nccl", "rank %d/%d: NCCL id known; the communicator comes "
            "with the first operation (lazy init)", g->rank, g->size);
  if (b->work != NULL && uvccl__work_is_live(b->work)) {
    b->work->owner_ = NULL;
    uvccl__work_complete(b->work, 0);
  }
  b->work = NULL;
}

static void on_id_set(uvccl_work_t *w, int status) {
  nccl_group_t *g = w->data;
  g->creating--;
  if (g->boot->dead || g->destroying) {
    uvccl__nccl_destroy_progress(g);
    return;
  }
  if (status != 0) {
    uvccl__nccl_boot_fail(g, status, "publishing the NCCL id at %s: %s", g->boot->key,
              w->msg);
    uvccl__nccl_destroy_progress(g);
    return;
  }
  id_known(g);
}

static void on_id_get(uvccl_work_t *w, int status) {
  nccl_group_t *g = w->data;
  g->creating--;
  if (g->boot->dead || g->destroying) {
    uvccl_work_cleanup(w);
    uvccl__nccl_destroy_progress(g);
    return;
  }
  if (status != 0 || w->value_len != sizeof(g->uid)) {
    if (status == 0)
      uvccl__nccl_boot_fail(g, UVCCL_EPROTO, "the NCCL id at %s has %zu bytes, not %zu",
                g->boot->key, w->value_len, sizeof(g->uid));
    else
      uvccl__nccl_boot_fail(g, status, "waiting for rank 0's NCCL id at %s: %s",
                g->boot->key, w->msg);
    uvccl_work_cleanup(w);
    uvccl__nccl_destroy_progress(g);
    return;
  }
  memcpy(&g->uid, w->value, sizeof(g->uid));
  uvccl_work_cleanup(w);
  id_known(g);
}

static void on_count_add(uvccl_work_t *w, int status) {
  nccl_group_t *g = w->data;
  nccl_boot_t *b = g->boot;
  int64_t gen;
  int rc;
  g->creating--;
  if (b->dead || g->destroying) {
    uvccl__nccl_destroy_progress(g);
    return;
  }
  if (status != 0) {
    uvccl__nccl_boot_fail(g, status, "store add %s/nccl/count: %s", b->prefix, w->msg);
    uvccl__nccl_destroy_progress(g);
    return;
  }
  /* Generations let a prefix be reused by a later group of the same
   * size, as the TCP groups do: every member adds one. */
  gen = (w->result - 1) / g->size;
  snprintf(b->key, sizeof(b->key), "%s/nccl/id/%lld", b->prefix,
           (long long)gen);
  if (g->grown && g->grow_parent != NULL) {
    if (g->rank == 0)
      boot_submit(g, NOP_GROW_ID, "ncclCommGetUniqueId");
    else
      id_known(g);
    return;
  }
  if (g->rank == 0) {
    boot_submit(g, NOP_UNIQUE_ID, "ncclGetUniqueId");
    return;
  }
  b->getw.data = g;
  rc = uvccl_store_get(b->store, &b->getw, b->key, on_id_get);
  if (rc != 0) {
    uvccl__nccl_boot_fail(g, rc, "store get %s: %s", b->key, uvccl_strerror(rc));
    return;
  }
  g->creating++;
}

/* done() of the unique-id and init ops. */
void uvccl__nccl_boot_step(nccl_group_t *g, nccl_op_t *op) {
  nccl_boot_t *b = g->boot;
  int st = op->gop.status, rc;
  g->creating--;
  if (b->dead || g->destroying) return;
  if (st != 0) {
    uvccl__nccl_boot_fail(g, st, "rank %d/%d on cuda:%d: %s", g->rank, g->size,
              g->device, op->gop.msg[0] ? op->gop.msg : uvccl_strerror(st));
    return;
  }
  if (op->kind == NOP_UNIQUE_ID || op->kind == NOP_GROW_ID) {
    b->setw.data = g;
    rc = uvccl_store_set(b->store, &b->setw, b->key, &g->uid, sizeof(g->uid),
                         on_id_set);
    if (rc != 0) {
      uvccl__nccl_boot_fail(g, rc, "store set %s: %s", b->key, uvccl_strerror(rc));
      return;
    }
    g->creating++;
    return;
  }
  /* the communicator is ready */
  g->ready = 1;
  g->grow_parent = NULL;
  b->dead = 1;
  trace_watch(g);
  LOG_DEBUG("nccl", "rank %d/%d: NCCL communicator ready on cuda:%d", g->rank,
            g->size, g->device);
  if (b->work != NULL && uvccl__work_is_live(b->work)) {
    b->work->owner_ = NULL;
    uvccl__work_complete(b->work, 0);
  }
  b->work = NULL;
  uvccl__nccl_flush_held(g, 0, NULL);
}

static void boot_abandon(uvccl_work_t *w, int status) {
  nccl_group_t *g = w->owner_;
  char msg[96];
  if (g == NULL || g->boot == NULL) return;
  /* Timed out or cancelled: stop waiting; ops on the GPU thread (an init
   * waiting for peers) are dropped there. */
  g->boot->work = NULL;
  snprintf(msg, sizeof(msg), "creating the NCCL group: %s",
           uvccl_strerror(status));
  uvccl__nccl_boot_fail(g, status, "%s", msg);
  if (g->boot->getw.state == UVCCL_WORK_PENDING)
    uvccl_work_cancel(&g->boot->getw);
  if (g->client != NULL) uvccl__gpu_client_fail_all(g->client, status, msg);
}

static const struct uvccl__work_ops boot_work_ops = {boot_abandon, NULL, NULL};

static int pick_device(const uvccl_pg_options_t *o, char *err, size_t errlen) {
  const char *lr;
  int n = uvccl__gpu_device_count(), d;
  if (o->device >= 0) d = o->device;
  else if ((lr = getenv("LOCAL_RANK")) != NULL && lr[0] != '\0')
    d = atoi(lr);
  else d = n > 0 ? o->rank % n : 0;
  if (n <= 0 || d < 0 || d >= n) {
    snprintf(err, errlen, "no CUDA device %d (%d device%s)", d, n,
             n == 1 ? "" : "s");
    return -1;
  }
  return d;
}

int uvccl__nccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
                        const uvccl_pg_options_t *o, uvccl_work_t *work,
                        uvccl_work_cb cb) {
  return uvccl__nccl_boot_start(loop, pg, store, o, work, cb, 0, NULL);
}

int uvccl__nccl_boot_start(uv_loop_t *loop, uvccl_pg_t *pg,
                           uvccl_store_t *store, const uvccl_pg_options_t *o,
                           uvccl_work_t *work, uvccl_work_cb cb, int grown,
                           nccl_group_t *parent) {
  nccl_group_t *g;
  nccl_boot_t *b;
  char err[256];
  int rc, device;
  if (loop == NULL || pg == NULL || store == NULL || o == NULL ||
      work == NULL || o->size <= 0 || o->rank < 0 || o->rank >= o->size)
    return UV_EINVAL;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  err[0] = '\0';
  rc = uvccl__gpu_load(err, sizeof(err));
  if (rc == 0) rc = uvccl__nccl_api_load(err, sizeof(err));
  device = rc == 0 ? pick_device(o, err, sizeof(err)) : -1;
  if (rc == 0 && device < 0) rc = UVCCL_ENOGPU;
  g = uvccl__nccl_group_new(loop, pg, o->rank, o->size, device < 0 ? 0 : device);
  b = g ? uvccl__calloc(1, sizeof(*b)) : NULL;
  if (b == NULL) {
    if (g) uvccl__nccl_group_discard(g);
    return UV_ENOMEM;
  }
  g->boot = b;
  g->world = 1;
  /* a grow needs its old world now: never lazy */
  g->lazy = o->lazy_init != 0 && !grown;
  g->grown = grown;
  g->grow_parent = parent;
  if (o->timeout_ms) g->timeout_ms = o->timeout_ms;
  b->store = store;
  b->work = work;
  snprintf(b->prefix, sizeof(b->prefix), "%s",
           o->prefix ? o->prefix : "uvccl/default");
  g->store = store; /* for shrink's agreement */
  snprintf(g->prefix, sizeof(g->prefix), "%s", b->prefix);
  snprintf(g->trace_name, sizeof(g->trace_name), "%.63s", b->prefix);
  g->trace_gid = 1;
  g->trace_size = o->trace_buffer_size;
  if (o->fingerprint_check != 0) {
    g->fp_check = o->fingerprint_check > 0;
  } else {
    int debug; /* off|info|detail */
    uvccl__config_choice(UVCCL__CFG_DEBUG, &debug);
    g->fp_check = debug == 2;
  }
  g->hb_ms = uvccl__heartbeat_timeout(o->heartbeat_timeout_ms);
  pg->loop = loop;
  pg->rank = o->rank;
  pg->size = o->size;
  pg->impl_ = g;
  pg->backend_ = UVCCL_BACKEND_NCCL;
  rc = rc != 0 ? rc : uvccl__nccl_group_attach(g, err, sizeof(err));
  uvccl__work_start(work, loop, "pg.init", &boot_work_ops, g, g->timeout_ms,
                    cb);
  if (rc != 0) {
    /* The reason goes to the work: the caller sees why there is no GPU. */
    uvccl__nccl_boot_fail(g, rc, "no NCCL group on this machine: %s",
              err[0] ? err : uvccl_strerror(rc));
    return 0;
  }
  LOG_DEBUG("nccl", "rank %d/%d: creating an NCCL group on cuda:%d (NCCL %d)",
            o->rank, o->size, g->device, uvccl__nccl.version);
  snprintf(b->key, sizeof(b->key), "%s/nccl/count", b->prefix);
  b->addw.data = g;
  rc = uvccl_store_add(store, &b->addw, b->key, 1, on_count_add);
  if (rc != 0) {
    uvccl__nccl_boot_fail(g, rc, "store add %s: %s", b->key, uvccl_strerror(rc));
    return 0;
  }
  g->creating++;
  return 0;
}
