/* uvccl_pg_grow, uvccl_pg_reconfigure and uvccl_pg_join: a running world
 * admits new ranks (and lets some go in the same agreement).
 *
 * The agreement runs through the world's store, under the prefix the
 * world was first made with (P), the same for members and joiners:
 *   P/grow/epoch        a counter: the grows so far (the epoch)
 *   P/grow/E/plan       "M J": grow E admits J ranks after M members;
 *                       "M J K r0 ... r(M-1)" where the backend keeps what
 *                       the members have (grow_keep: K its token, then the
 *                       members' ranks in its numbering)
 *   P/grow/open         the last epoch opened
 *   P/grow/E/joined     a counter: each joiner takes the next place
 *   P/grow/E/world      the new world's prefix
 * Members: rank 0 opens epoch E (counter, plan, open); an allreduce (MAX)
 * over the old world then carries E and K from rank 0 to the others, and
 * checks that every member named the same ranks to leave (a hash h and
 * -h: both maxima are each member's own only if all agree). That
 * allreduce is the point every member agrees on (a member dead by then
 * fails it on all of them, and they keep the old world); the ranks that
 * leave (uvccl_pg_reconfigure) are done there. Backends whose collectives take no host memory (NCCL)
 * name a key of the old world's instead: rank 0 sets it to E, the others
 * wait for it. Joiners: wait for an open epoch, take a place with the
 * counter (the (J+1)th finds the epoch full and waits for the next one).
 * Then everyone makes the new world of M + J ranks under P/grow/E/world:
 * members keep their order (those leaving taken out), joiners take M, M+1, ... in the order they
 * took their places. A rank that fails meanwhile fails that creation on
 * everyone, who then keep what they had.
 *
 * The backend makes the new world from the old one where it can (NCCL:
 * ncclCommGrow; CPU groups: the joiners join the members' connections,
 * src/cpu/grow.c), else anew. */
#include "backend.h"
#include "loop/internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX 512

enum {
  S_OPEN_COUNT,  /* rank 0: P/grow/epoch += 1 */
  S_OPEN_PLAN,   /* rank 0: P/grow/E/plan */
  S_OPEN_OPEN,   /* rank 0: P/grow/open */
  S_AGREE,       /* members: allreduce E, K and the leave list's hash */
  S_WAIT_OPEN,   /* joiner: get P/grow/open */
  S_WAIT_PLAN,   /* joiner: get P/grow/E/plan */
  S_CLAIM,       /* joiner: P/grow/E/joined += 1 */
  S_CREATE,      /* everyone: the new world */
  S_UNDO         /* the new world failed: destroying it */
};

typedef struct {
  uv_loop_t *loop;
  uvccl_pg_t *pg; /* members: the world that grows; NULL on a joiner */
  uvccl_pg_t *newpg;
  uvccl_store_t *store;
  const uvccl__backend_t *b;
  uvccl_pg_options_t o;
  char base[KEY_MAX - 80]; /* P */
  char agree_key[KEY_MAX]; /* the backend's (grow_agree_key); "": none */
  char world[KEY_MAX]; /* P/grow/E/world */
  char key[KEY_MAX];
  char val[64];
  char *plan_text;   /* rank 0: the plan written (its tail: grow_keep's) */
  int *ranks;        /* joiners: the members' ranks the plan names */
  unsigned char *leaving; /* members: by old rank, 1 leaves (NULL: none) */
  int njoin, members, rank, size; /* rank: in the new world (-1: leaves) */
  uint64_t epoch;
  int64_t agree[4];  /* rank 0's epoch and keep token, h, -h */
  int64_t agreed[4]; /* their maxima */
  int64_t keep;
  int step;
  int status;
  char msg[UVCCL_WORK_MSG_LEN];
  uvccl_work_t inner;
  uvccl_work_t *outer;
} grow_t;

static void on_inner(uvccl_work_t *w, int status);

static const char *const step_what[] = {
    "opening the grow in the store", "opening the grow in the store",
    "opening the grow in the store",
    "the members' agreement (a member failed: the world stays as it was)",
    "waiting for a grow to open", "reading the grow's plan",
    "taking a place", "making the new world", "making the new world"};

static void finish(grow_t *g) {
  uvccl_work_t *w = g->outer;
  uvccl_work_cleanup(&g->inner);
  uvccl__free(g->plan_text);
  uvccl__free(g->ranks);
  uvccl__free(g->leaving);
  if (w != NULL) {
    w->owner_ = NULL;
    if (g->status != 0) {
      uvccl__work_fail(w, g->status, "%s", g->msg);
    } else {
      w->result = (int64_t)g->epoch;
      uvccl__work_complete(w, 0);
    }
  }
  uvccl__free(g);
}

static void on_undone(uvccl_pg_t *pg) {
  grow_t *g = pg->data;
  finish(g);
}

static void fail(grow_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(grow_t *g, int status, const char *fmt, ...) {
  va_list ap;
  g->status = status;
  va_start(ap, fmt);
  vsnprintf(g->msg, sizeof(g->msg), fmt, ap);
  va_end(ap);
  if (g->step == S_CREATE && g->newpg->impl_ != NULL) {
    /* a creation that failed is destroyed here: newpg needs nothing */
    g->step = S_UNDO;
    g->newpg->data = g;
    uvccl_pg_destroy(g->newpg, on_undone);
    return;
  }
  finish(g);
}

/* Starts the next step's inner work; an error at the call ends it. */
static void step(grow_t *g, int next) {
  int rc = 0;
  g->step = next;
  g->inner.data = g;
  switch (next) {
  case S_OPEN_COUNT:
    snprintf(g->key, sizeof(g->key), "%s/grow/epoch", g->base);
    rc = uvccl_store_add(g->store, &g->inner, g->key, 1, on_inner);
    break;
  case S_OPEN_PLAN:
    snprintf(g->key, sizeof(g->key), "%s/grow/%" PRIu64 "/plan", g->base,
             g->epoch);
    rc = uvccl_store_set(g->store, &g->inner, g->key, g->plan_text,
                         strlen(g->plan_text), on_inner);
    break;
  case S_OPEN_OPEN:
    snprintf(g->key, sizeof(g->key), "%s/grow/open", g->base);
    snprintf(g->val, sizeof(g->val), "%" PRIu64, g->epoch);
    rc = uvccl_store_set(g->store, &g->inner, g->key, g->val, strlen(g->val),
                         on_inner);
    break;
  case S_AGREE:
    if (g->agree_key[0] == '\0') {
      g->agree[0] = g->pg->rank == 0 ? (int64_t)g->epoch : 0;
      g->agree[1] = g->pg->rank == 0 ? g->keep : 0;
      rc = uvccl_allreduce(g->pg, &g->inner, g->agree, g->agreed, 4,
                           UVCCL_INT64, UVCCL_MAX, on_inner);
    } else if (g->rank == 0) {
      snprintf(g->val, sizeof(g->val), "%" PRIu64, g->epoch);
      rc = uvccl_store_set(g->store, &g->inner, g->agree_key, g->val,
                           strlen(g->val), on_inner);
    } else {
      rc = uvccl_store_get(g->store, &g->inner, g->agree_key, on_inner);
    }
    break;
  case S_WAIT_OPEN:
    snprintf(g->key, sizeof(g->key), "%s/grow/open", g->base);
    rc = uvccl_store_get(g->store, &g->inner, g->key, on_inner);
    break;
  case S_WAIT_PLAN:
    snprintf(g->key, sizeof(g->key), "%s/grow/%" PRIu64 "/plan", g->base,
             g->epoch);
    rc = uvccl_store_get(g->store, &g->inner, g->key, on_inner);
    break;
  case S_CLAIM:
    snprintf(g->key, sizeof(g->key), "%s/grow/%" PRIu64 "/joined", g->base,
             g->epoch);
    rc = uvccl_store_add(g->store, &g->inner, g->key, 1, on_inner);
    break;
  case S_CREATE: {
    uvccl_pg_options_t o = g->o;
    snprintf(g->world, sizeof(g->world), "%s/grow/%" PRIu64 "/world",
             g->base, g->epoch);
    uvccl__grow_plan_t plan;
    o.prefix = g->world;
    o.rank = g->rank;
    o.size = g->size;
    memset(g->newpg, 0, sizeof(*g->newpg));
    plan.epoch = g->epoch;
    plan.members = g->members;
    plan.njoin = g->njoin;
    plan.keep = g->keep;
    plan.ranks = g->ranks;
    plan.leaving = g->leaving;
    if (g->b->grow_init != NULL)
      rc = g->b->grow_init(g->loop, g->pg, g->newpg, g->store, &o, &plan,
                           &g->inner, on_inner);
    else
      rc = uvccl_pg_init(g->loop, g->newpg, g->store, &o, &g->inner,
                         on_inner);
    break;
  }
  }
  if (rc != 0) {
    /* refused at the call: a member the old world already knows failed
     * is named, as a work's failure would */
    uvccl_pg_failure_t f;
    if (g->pg != NULL && uvccl_pg_get_failure(g->pg, &f) == 1 &&
        f.global_rank >= 0)
      fail(g, rc, "grow: %s: rank %d failed (%s)", step_what[next],
           f.rank >= 0 ? f.rank : f.global_rank,
           uvccl_fail_cause_name(f.cause));
    else
      fail(g, rc, "grow: %s: %s", step_what[next], uvccl_strerror(rc));
  }
}

/* "M J" or "M J K r0 ... r(M-1)" (the members' ranks: distinct, below
 * K). */
static int parse_plan(grow_t *g, const char *v, size_t len) {
  char *buf, *p, *end;
  long long k;
  int i, n, m, j, rc = -1;
  buf = uvccl__malloc(len + 1);
  if (buf == NULL || len == 0) goto out;
  memcpy(buf, v, len);
  buf[len] = '\0';
  if (sscanf(buf, "%d %d%n", &m, &j, &n) != 2 || m <= 0 || j <= 0 ||
      j > 65536 || m > 65536)
    goto out;
  g->members = m;
  g->njoin = j;
  g->keep = 0;
  p = buf + n;
  while (*p == ' ') p++;
  if (*p == '\0') {
    rc = 0;
    goto out;
  }
  k = strtoll(p, &end, 10);
  if (end == p || k < m || k > 65536) goto out;
  uvccl__free(g->ranks);
  g->ranks = uvccl__malloc((size_t)m * sizeof(int));
  if (g->ranks == NULL) goto out;
  for (i = 0; i < m; i++) {
    long r;
    p = end;
    r = strtol(p, &end, 10);
    if (end == p || r < 0 || r >= k || (i > 0 && r <= g->ranks[i - 1]))
      goto out; /* the members keep their order: ascending */
    g->ranks[i] = (int)r;
  }
  while (*end == ' ') end++;
  if (*end != '\0') goto out;
  g->keep = k;
  rc = 0;
out:
  uvccl__free(buf);
  return rc;
}

/* An epoch from the store (the last opened, or the members' agreement). */
static int parse_epoch(grow_t *g, const char *key, const uvccl_work_t *w) {
  char buf[32];
  size_t n = w->value_len < sizeof(buf) - 1 ? w->value_len : sizeof(buf) - 1;
  memcpy(buf, w->value, n);
  buf[n] = '\0';
  g->epoch = strtoull(buf, NULL, 10);
  if (g->epoch == 0) {
    fail(g, UVCCL_EPROTO, "grow: %s holds '%s', not an epoch", key, buf);
    return -1;
  }
  return 0;
}

static void on_inner(uvccl_work_t *w, int status) {
  grow_t *g = w->data;
  char wmsg[UVCCL_WORK_MSG_LEN];
  snprintf(wmsg, sizeof(wmsg), "%s", w->msg[0] ? w->msg
                                                : uvccl_strerror(status));
  if (g->outer == NULL && g->step != S_CREATE) {
    g->status = UV_ECANCELED;
    finish(g);
    return;
  }
  if (status != 0) {
    fail(g, status, "grow: %s: %s", step_what[g->step], wmsg);
    return;
  }
  switch (g->step) {
  case S_OPEN_COUNT:
    g->epoch = (uint64_t)w->result;
    step(g, S_OPEN_PLAN);
    break;
  case S_OPEN_PLAN:
    step(g, S_OPEN_OPEN);
    break;
  case S_OPEN_OPEN:
    step(g, S_AGREE);
    break;
  case S_AGREE:
    if (g->agree_key[0] != '\0' && g->rank != 0 &&
        parse_epoch(g, g->agree_key, w) != 0)
      return;
    if (g->agree_key[0] == '\0') {
      g->epoch = (uint64_t)g->agreed[0];
      g->keep = g->agreed[1];
      if (g->agreed[2] != g->agree[2] || g->agreed[3] != g->agree[3]) {
        fail(g, UV_EINVAL, "reconfigure: the members named different ranks "
             "to leave (every member must pass the same list); the world "
             "stays as it was");
        return;
      }
    }
    if (g->rank < 0) {
      /* this rank leaves: it is in no new world */
      g->newpg->loop = g->loop;
      g->newpg->rank = -1;
      g->newpg->size = g->size;
      g->newpg->impl_ = NULL;
      finish(g);
      return;
    }
    step(g, S_CREATE);
    break;
  case S_WAIT_OPEN:
    if (parse_epoch(g, g->key, w) != 0) return;
    step(g, S_WAIT_PLAN);
    break;
  case S_WAIT_PLAN:
    if (parse_plan(g, w->value, w->value_len) != 0) {
      fail(g, UVCCL_EPROTO, "grow: %s is not a plan", g->key);
      return;
    }
    step(g, S_CLAIM);
    break;
  case S_CLAIM:
    if (w->result > g->njoin) {
      /* this epoch is full: the next one */
      g->epoch++;
      step(g, S_WAIT_PLAN);
      return;
    }
    g->rank = g->members + (int)w->result - 1;
    g->size = g->members + g->njoin;
    step(g, S_CREATE);
    break;
  case S_CREATE:
    if (g->outer == NULL) { /* cancelled meanwhile: undo it */
      fail(g, UV_ECANCELED, "grow cancelled");
      return;
    }
    finish(g);
    break;
  }
}

static void on_abandon(uvccl_work_t *w, int status) {
  grow_t *g = w->owner_;
  (void)status;
  if (g == NULL) return;
  g->outer = NULL;
  if (uvccl__work_is_live(&g->inner)) uvccl_work_cancel(&g->inner);
}

static const struct uvccl__work_ops grow_ops = {on_abandon, NULL, NULL};

static grow_t *grow_new(uv_loop_t *loop, uvccl_pg_t *newpg,
                        uvccl_store_t *store, const uvccl_pg_options_t *opts,
                        const uvccl__backend_t *b) {
  grow_t *g = uvccl__calloc(1, sizeof(*g));
  const char *p;
  if (g == NULL) return NULL;
  g->b = b;
  g->loop = loop;
  g->newpg = newpg;
  g->store = store;
  if (opts != NULL) g->o = *opts;
  p = g->o.prefix != NULL ? g->o.prefix : "uvccl/default";
  snprintf(g->base, sizeof(g->base), "%s", p);
  g->o.prefix = NULL;
  return g;
}

/* FNV-1a over the leave list, as 63 bits (so -h is exact). */
static int64_t leave_hash(const unsigned char *leaving, int n) {
  uint64_t h = 1469598103934665603ull;
  int i;
  for (i = 0; leaving != NULL && i < n; i++)
    if (leaving[i]) h = (h ^ (uint64_t)i) * 1099511628211ull;
  return (int64_t)(h >> 1);
}

int uvccl_pg_reconfigure(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                         uvccl_store_t *store, const int *leave, int nleave,
                         int njoin, const uvccl_pg_options_t *opts,
                         uvccl_work_t *work, uvccl_work_cb cb) {
  const uvccl__backend_t *b;
  grow_t *g;
  int rc, i, m;
  if (pg == NULL || pg->loop == NULL || pg->rank < 0 || newpg == NULL ||
      newpg == pg || store == NULL || work == NULL || njoin < 1 ||
      nleave < 0 || nleave >= pg->size || (nleave > 0 && leave == NULL) ||
      njoin > 65536 - pg->size)
    return UV_EINVAL;
  if (opts != NULL && opts->prefix != NULL &&
      strlen(opts->prefix) >= KEY_MAX - 80)
    return UV_EINVAL;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  b = uvccl__backend_of(pg);
  if (b->grow_check != NULL &&
      (rc = b->grow_check(pg, work->msg, sizeof(work->msg))) != 0)
    return rc;
  if (nleave > 0 && b->grow_agree_key != NULL) {
    snprintf(work->msg, sizeof(work->msg), "reconfigure: %s groups cannot "
             "let ranks leave as they grow (uvccl_pg_shrink_excluding, then "
             "uvccl_pg_grow)", b->name);
    return UVCCL_ENOTSUP;
  }
  g = grow_new(pg->loop, newpg, store, opts, b);
  if (g == NULL) return UV_ENOMEM;
  if (nleave > 0) {
    g->leaving = uvccl__calloc((size_t)pg->size, 1);
    if (g->leaving == NULL) {
      uvccl__free(g);
      return UV_ENOMEM;
    }
    for (i = 0; i < nleave; i++) {
      if (leave[i] < 0 || leave[i] >= pg->size || g->leaving[leave[i]]) {
        uvccl__free(g->leaving);
        uvccl__free(g);
        return UV_EINVAL; /* outside the world, or named twice */
      }
      g->leaving[leave[i]] = 1;
    }
  }
  g->o.backend = pg->backend_; /* the new world is of the old one's kind */
  if (b->grow_agree_key != NULL)
    b->grow_agree_key(pg, g->agree_key, sizeof(g->agree_key));
  g->agree[2] = leave_hash(g->leaving, pg->size);
  g->agree[3] = -g->agree[2];
  g->pg = pg;
  g->njoin = njoin;
  g->members = pg->size - nleave;
  /* members keep their order, the ones leaving taken out */
  for (m = 0, i = 0; i < pg->rank; i++)
    m += g->leaving == NULL || !g->leaving[i];
  g->rank = g->leaving != NULL && g->leaving[pg->rank] ? -1 : m;
  g->size = g->members + njoin;
  if (pg->rank == 0) {
    char *ranks = NULL;
    size_t n;
    if (b->grow_keep != NULL)
      g->keep = b->grow_keep(pg, g->leaving, njoin, &ranks);
    if (g->keep <= 0) g->keep = 0;
    n = 64 + (ranks != NULL ? strlen(ranks) : 0);
    g->plan_text = uvccl__malloc(n);
    if (g->plan_text == NULL) {
      uvccl__free(ranks);
      uvccl__free(g->leaving);
      uvccl__free(g);
      return UV_ENOMEM;
    }
    if (g->keep > 0)
      snprintf(g->plan_text, n, "%d %d %lld%s", g->members, g->njoin,
               (long long)g->keep, ranks != NULL ? ranks : "");
    else
      snprintf(g->plan_text, n, "%d %d", g->members, g->njoin);
    uvccl__free(ranks);
  }
  rc = uvccl__work_start(work, pg->loop, nleave > 0 ? "reconfigure" : "grow",
                         &grow_ops, g, 0, cb);
  if (rc != 0) {
    uvccl__free(g->plan_text);
    uvccl__free(g->leaving);
    uvccl__free(g);
    return rc;
  }
  g->outer = work;
  step(g, pg->rank == 0 ? S_OPEN_COUNT : S_AGREE);
  return 0;
}

int uvccl_pg_grow(uvccl_pg_t *pg, uvccl_pg_t *newpg, uvccl_store_t *store,
                  int njoin, const uvccl_pg_options_t *opts,
                  uvccl_work_t *work, uvccl_work_cb cb) {
  return uvccl_pg_reconfigure(pg, newpg, store, NULL, 0, njoin, opts, work,
                              cb);
}

int uvccl_pg_join(uv_loop_t *loop, uvccl_pg_t *newpg, uvccl_store_t *store,
                  const uvccl_pg_options_t *opts, uvccl_work_t *work,
                  uvccl_work_cb cb) {
  const uvccl__backend_t *b;
  grow_t *g;
  int rc;
  if (loop == NULL || newpg == NULL || store == NULL || work == NULL)
    return UV_EINVAL;
  if (opts != NULL && opts->prefix != NULL &&
      strlen(opts->prefix) >= KEY_MAX - 80)
    return UV_EINVAL;
  if ((b = uvccl__backend_for(opts)) == NULL) return UV_EINVAL;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  if (b->grow_check != NULL &&
      (rc = b->grow_check(NULL, work->msg, sizeof(work->msg))) != 0)
    return rc;
  g = grow_new(loop, newpg, store, opts, b);
  if (g == NULL) return UV_ENOMEM;
  rc = uvccl__work_start(work, loop, "join", &grow_ops, g, 0, cb);
  if (rc != 0) {
    uvccl__free(g);
    return rc;
  }
  g->outer = work;
  step(g, S_WAIT_OPEN);
  return 0;
}
