/* Revoke and shrink of NCCL groups, through NCCL's own ncclCommRevoke
 * (2.28) and ncclCommShrink (2.27); UVCCL_ENOTSUP where the loaded NCCL
 * lacks them.
 *
 * NCCL does not decide who failed: ncclCommShrink takes the list of ranks
 * to leave out. NCCL groups have no monitor of uvccl's (their data goes
 * through NCCL), so the survivors agree through the store the group was
 * made over, which arbitrates:
 *   1. every survivor sets PREFIX/nccl/shrink/<epoch>/alive/<rank>;
 *   2. each waits until every rank has (but those the caller excludes),
 *      or the heartbeat timeout passed (a rank silent that long is failed,
 *      as for the TCP groups);
 *   3. each proposes the set it saw with compare_set on .../decision; the
 *      first proposal stored is the decision, and every survivor reads the
 *      same one (a survivor left out of it, too late, fails);
 *   4. ncclCommShrink(the others, NCCL_SHRINK_ABORT) makes the new group.
 * Revoke is NCCL's: local to the rank that calls it (each rank revokes). */
#include "nccl_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- revoke ---------------------------------------------------------------- */

int uvccl__nccl_pg_revoke(uvccl_pg_t *pg, const char *reason) {
  nccl_group_t *g = pg ? pg->impl_ : NULL;
  nccl_op_t *op;
  char msg[UVCCL_WORK_MSG_LEN];
  if (g == NULL) return UV_EINVAL;
  if (g->destroying) return UVCCL_ECLOSING;
  if (g->client == NULL || uvccl__nccl.CommRevoke == NULL) {
    LOG_ERROR("nccl", "rank %d/%d: revoke: the loaded NCCL (%d) has no "
              "ncclCommRevoke (2.28 or newer); abort the group instead",
              g->rank, g->size, uvccl__nccl.version);
    return UVCCL_ENOTSUP;
  }
  if (g->revoked) return 0;
  snprintf(msg, sizeof(msg), "revoked by this rank (group rank %d): %.120s",
           g->rank, reason ? reason : "revoked by its application");
  g->revoked = 1;
  snprintf(g->fail_msg, sizeof(g->fail_msg), "%s", msg);
  uvccl__nccl_fail_all_works(g, UVCCL_EREVOKED, msg);
  uvccl__gpu_client_fail_all(g->client, UVCCL_EREVOKED, msg);
  if (g->comm == NULL && !g->ready) return 0; /* nothing made yet */
  op = uvccl__nccl_op_new(g, NOP_REVOKE, "ncclCommRevoke");
  if (op != NULL) op->done_fn = uvccl__nccl_revoke_done;
  if (op == NULL || uvccl__nccl_op_submit(g, op) != 0) {
    LOG_ERROR("nccl", "rank %d/%d: could not queue ncclCommRevoke", g->rank,
              g->size);
    uvccl__nccl_op_free(op);
  }
  return 0;
}

void uvccl__nccl_revoke_done(nccl_op_t *op) {
  if (op->gop.status != 0)
    LOG_WARN("nccl", "rank %d/%d: ncclCommRevoke: %s", op->g->rank,
             op->g->size, op->gop.msg[0] ? op->gop.msg : "failed");
}

/* ---- shrink ---------------------------------------------------------------- */

typedef struct nccl_shrink_s {
  nccl_group_t *g;
  uvccl_pg_t *newpg;
  uvccl_work_t *w;         /* the caller's; NULL once it completed */
  char base[256];          /* PREFIX/nccl/shrink/<epoch> */
  char key[300];
  uvccl_work_t setw, casw;
  uvccl_work_t *chk;       /* one check per rank, per round */
  unsigned char *present;
  unsigned char *excluded; /* left out by the caller: not waited for */
  int npresent, nexcluded, pending; /* store works out */
  uv_timer_t timer;
  int timer_open;
  uint64_t deadline;
  int gone;                /* finished (the state waits for its works) */
  int op_out;              /* the NCCL shrink is on the device thread */
} nshrink_t;

static void sh_round(nshrink_t *s);
static void on_round_timer(uv_timer_t *t) { sh_round(t->data); }

static void sh_free_maybe(nshrink_t *s) {
  int i;
  if (!s->gone || s->pending > 0 || s->timer_open || s->op_out) return;
  for (i = 0; i < s->g->size; i++) uvccl_work_cleanup(&s->chk[i]);
  uvccl_work_cleanup(&s->setw);
  uvccl_work_cleanup(&s->casw);
  uvccl__free(s->chk);
  uvccl__free(s->present);
  uvccl__free(s->excluded);
  uvccl__free(s);
}

static void sh_timer_closed(uv_handle_t *h) {
  nshrink_t *s = h->data;
  s->timer_open = 0;
  sh_free_maybe(s);
}

/* Ends the agreement: the caller's work completes (status 0 only once the
 * new group exists: see uvccl__nccl_shrink_done). */
static void sh_end(nshrink_t *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sh_end(nshrink_t *s, int status, const char *fmt, ...) {
  int i;
  if (s->gone) return;
  s->gone = 1;
  if (s->w != NULL && status != 0) {
    char msg[UVCCL_WORK_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    s->w->owner_ = NULL;
    uvccl__work_fail(s->w, status, "%s", msg);
    s->w = NULL;
  }
  uvccl_work_cancel(&s->setw);
  uvccl_work_cancel(&s->casw);
  for (i = 0; i < s->g->size; i++) uvccl_work_cancel(&s->chk[i]);
  if (s->timer_open) {
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, sh_timer_closed);
  }
}

static void sh_abandon(uvccl_work_t *w, int status) {
  nshrink_t *s = w->owner_;
  if (s == NULL) return;
  s->w = NULL;
  if (status == UV_ETIMEDOUT)
    uvccl__work_fail(w, status, "shrink timed out after %llu ms (%d of %d "
                     "ranks had joined)", (unsigned long long)w->timeout_ms_,
                     s->npresent, s->g->size);
  sh_end(s, status, "shrink abandoned");
  sh_free_maybe(s);
}

static const struct uvccl__work_ops sh_ops = {sh_abandon, NULL, NULL};

/* The decision is read: leave out who is not in it. */
static void sh_decided(nshrink_t *s, const char *d, size_t len) {
  nccl_group_t *g = s->g, *c;
  nccl_op_t *op;
  char err[256];
  int i, n = 0, k = 0, me = -1, rc;
  if (len != (size_t)g->size) {
    sh_end(s, UVCCL_EPROTO, "shrink: a bad decision in the store at %s",
           s->key);
    return;
  }
  for (i = 0; i < g->size; i++)
    if (d[i] == '1') {
      if (i == g->rank) me = n;
      n++;
    }
  if (me < 0) {
    sh_end(s, UVCCL_EPEER, "shrink: this rank (group rank %d) was left out: "
           "the others decided without it (it joined too late)", g->rank);
    return;
  }
  op = uvccl__nccl_op_new(g, NOP_SHRINK, "shrink");
  g->nchildren++;
  c = op ? uvccl__nccl_child_new(g, s->newpg, me, n, err, sizeof(err)) : NULL;
  if (c != NULL) snprintf(c->trace_name, sizeof(c->trace_name), "shrink");
  if (op != NULL) op->excl = uvccl__malloc((size_t)g->size * sizeof(int));
  if (c != NULL) c->ranks = uvccl__malloc((size_t)n * sizeof(int));
  if (op == NULL || c == NULL || op->excl == NULL || c->ranks == NULL) {
    if (c != NULL) {
      c->creating = 0;
      c->destroying = 1;
      uvccl__nccl_destroy_progress(c);
    }
    uvccl__nccl_op_free(op);
    sh_end(s, UV_ENOMEM, "shrink: out of memory");
    return;
  }
  for (i = 0; i < g->size; i++) {
    int gr = g->world ? i : g->ranks ? g->ranks[i] : -1;
    if (d[i] == '1') c->ranks[k++] = gr;
    else op->excl[op->nexcl++] = i;
  }
  /* The new group can be shrunk in turn: same store, its own keys. */
  c->store = g->store;
  c->hb_ms = g->hb_ms;
  snprintf(c->prefix, sizeof(c->prefix), "%.180s/s%u", g->prefix,
           g->nshrinks);
  op->target = c;
  op->shrink = s;
  op->done_fn = uvccl__nccl_shrink_done;
  s->newpg->loop = g->loop;
  s->newpg->rank = me;
  s->newpg->size = n;
  s->newpg->impl_ = c;
  s->newpg->backend_ = UVCCL_BACKEND_NCCL;
  s->op_out = 1;
  rc = uvccl__nccl_op_submit(g, op);
  if (rc != 0) {
    s->op_out = 0;
    op->target = NULL;
    uvccl__nccl_op_free(op);
    c->creating--;
    c->failed = 1;
    sh_end(s, rc, "shrink: submitting to the GPU thread: %s",
           uvccl_strerror(rc));
  }
}

static void on_cas(uvccl_work_t *w, int status) {
  nshrink_t *s = w->data;
  s->pending--;
  if (!s->gone) {
    if (status != 0)
      sh_end(s, status, "shrink: the decision at %s: %s", s->key, w->msg);
    else
      sh_decided(s, w->value, w->value_len);
  }
  sh_free_maybe(s);
}

static void sh_decide(nshrink_t *s) {
  char mine[1024];
  int i, rc;
  if (s->g->size >= (int)sizeof(mine)) {
    sh_end(s, UVCCL_ELIMIT, "shrink: groups of %d ranks are too large",
           s->g->size);
    return;
  }
  for (i = 0; i < s->g->size; i++) mine[i] = s->present[i] ? '1' : '0';
  mine[s->g->size] = '\0';
  snprintf(s->key, sizeof(s->key), "%s/decision", s->base);
  s->casw.data = s;
  rc = uvccl_store_compare_set(s->g->store, &s->casw, s->key, "", 0, mine,
                               (size_t)s->g->size, on_cas);
  if (rc != 0) {
    sh_end(s, rc, "shrink: compare_set %s: %s", s->key, uvccl_strerror(rc));
    return;
  }
  s->pending++;
}

static void on_check(uvccl_work_t *w, int status) {
  nshrink_t *s = w->data;
  int r = (int)(w - s->chk);
  s->pending--;
  if (!s->gone && status == 0 && w->result == 1 && !s->present[r]) {
    s->present[r] = 1;
    s->npresent++;
  }
  if (!s->gone && status != 0 && status != UV_ECANCELED)
    sh_end(s, status, "shrink: the store: %s", w->msg);
  if (!s->gone && s->pending == 0) {
    if (s->npresent == s->g->size - s->nexcluded ||
        uvccl__now_ms() >= s->deadline)
      sh_decide(s);
    else
      uv_timer_start(&s->timer, on_round_timer, 20, 0);
  }
  sh_free_maybe(s);
}

/* One round: which ranks have said they are alive? */
static void sh_round(nshrink_t *s) {
  int r, rc;
  for (r = 0; r < s->g->size && !s->gone; r++) {
    char key[300];
    const char *keys[1];
    if (s->present[r] || s->excluded[r]) continue;
    snprintf(key, sizeof(key), "%s/alive/%d", s->base, r);
    keys[0] = key;
    uvccl_work_cleanup(&s->chk[r]);
    s->chk[r].data = s;
    rc = uvccl_store_check(s->g->store, &s->chk[r], keys, 1, on_check);
    if (rc != 0) {
      sh_end(s, rc, "shrink: check %s: %s", key, uvccl_strerror(rc));
      return;
    }
    s->pending++;
  }
}

static void on_alive_set(uvccl_work_t *w, int status) {
  nshrink_t *s = w->data;
  s->pending--;
  if (!s->gone) {
    if (status != 0)
      sh_end(s, status, "shrink: setting %s: %s", s->key, w->msg);
    else
      sh_round(s);
  }
  sh_free_maybe(s);
}

int uvccl__nccl_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                          const int *exclude, int nexclude, uvccl_work_t *w,
                          uvccl_work_cb cb) {
  nccl_group_t *g = pg ? pg->impl_ : NULL;
  nshrink_t *s;
  int rc, i;
  if (g == NULL || newpg == NULL || w == NULL) return UV_EINVAL;
  if (g->destroying) return UVCCL_ECLOSING;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  if (g->client == NULL || uvccl__nccl.CommShrink == NULL) {
    snprintf(w->msg, sizeof(w->msg), "shrink: the loaded NCCL (%d) has no "
             "ncclCommShrink (2.27 or newer)", uvccl__nccl.version);
    return UVCCL_ENOTSUP;
  }
  if (g->store == NULL) {
    snprintf(w->msg, sizeof(w->msg), "shrink: a group made by split or "
             "new_group has no store to agree through: shrink its world");
    return UVCCL_ENOTSUP;
  }
  s = uvccl__calloc(1, sizeof(*s));
  if (s == NULL) return UV_ENOMEM;
  s->chk = uvccl__calloc((size_t)g->size, sizeof(uvccl_work_t));
  s->present = uvccl__calloc((size_t)g->size, 1);
  s->excluded = uvccl__calloc((size_t)g->size, 1);
  if (s->chk == NULL || s->present == NULL || s->excluded == NULL) {
    uvccl__free(s->chk);
    uvccl__free(s->present);
    uvccl__free(s->excluded);
    uvccl__free(s);
    return UV_ENOMEM;
  }
  for (i = 0; i < nexclude; i++)
    if (!s->excluded[exclude[i]]) {
      s->excluded[exclude[i]] = 1;
      s->nexcluded++;
    }
  s->g = g;
  s->newpg = newpg;
  rc = uvccl__work_start(w, g->loop, "shrink", &sh_ops, s,
                         w->timeout_ms ? w->timeout_ms : g->timeout_ms, cb);
  if (rc != 0) {
    uvccl__free(s->chk);
    uvccl__free(s->present);
    uvccl__free(s->excluded);
    uvccl__free(s);
    return rc;
  }
  s->w = w;
  uv_timer_init(g->loop, &s->timer);
  s->timer.data = s;
  s->timer_open = 1;
  s->deadline = uvccl__now_ms() + (g->hb_ms ? g->hb_ms : 15000);
  snprintf(s->base, sizeof(s->base), "%.200s/nccl/shrink/%u", g->prefix,
           ++g->nshrinks);
  snprintf(s->key, sizeof(s->key), "%s/alive/%d", s->base, g->rank);
  s->setw.data = s;
  rc = uvccl_store_set(g->store, &s->setw, s->key, "1", 1, on_alive_set);
  if (rc != 0) {
    sh_end(s, rc, "shrink: set %s: %s", s->key, uvccl_strerror(rc));
    return 0;
  }
  s->pending++;
  return 0;
}

/* done() of the NCCL shrink (on the old group's client). */
void uvccl__nccl_shrink_done(nccl_op_t *op) {
  nccl_group_t *c = op->target;
  nshrink_t *s = op->shrink;
  int st = op->gop.status;
  if (c != NULL) {
    c->creating--;
    if (st == 0) {
      c->ready = 1;
      uvccl__nccl_flush_held(c, 0, NULL);
    } else {
      c->failed = 1;
      uvccl__nccl_flush_held(c, st, op->gop.msg);
    }
    uvccl__nccl_destroy_progress(c);
  }
  if (s == NULL) return;
  s->op_out = 0;
  if (s->w != NULL) {
    uvccl_work_t *w = s->w;
    s->w = NULL;
    w->owner_ = NULL;
    if (st == 0) {
      w->result = op->nexcl;
      LOG_INFO("nccl", "rank %d/%d: shrunk to %d ranks (%d left out)",
               op->g->rank, op->g->size, op->g->size - op->nexcl, op->nexcl);
      uvccl__work_complete(w, 0);
    } else {
      uvccl__work_fail(w, st, "shrink: %.160s",
                       op->gop.msg[0] ? op->gop.msg : uvccl_strerror(st));
    }
  }
  sh_end(s, 0, "done");
  sh_free_maybe(s);
}
