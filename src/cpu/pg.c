/* Process groups after creation: destruction, failures, subgroups that
 * share the parent's connections, rank translation, split. */
#include "internal.h"
#include "stage.h"
#include "boot/bootenv.h"
#include "store/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* ---- destruction --------------------------------------------------------- */

static void group_finish_close(void *arg) {
  group_t *g = arg;
  uvccl_pg_t *pg = g->pg;
  uvccl_pg_close_cb cb = g->close_cb;
  g->own_store = NULL;   /* freed by their close callbacks */
  g->own_server = NULL;
  uvccl__group_free(g);
  if (pg != NULL) pg->impl_ = NULL;
  if (cb != NULL) cb(pg);
}

static void group_part_closed(group_t *g) {
  if (--g->closing_parts > 0 || g->nsched > 0) return;
  group_finish_close(g);
}

void uvccl__pg_group_sched_gone(group_t *g) {
  if (g->closing_parts == 0 && g->destroying == 2) group_finish_close(g);
}

static void group_part_closed_cb(void *arg) { group_part_closed(arg); }

static void on_net_closed(net_t *net) { group_part_closed(net->closed_arg); }

static void on_own_store_closed(uvccl_store_t *s) {
  group_t *g = s->data;
  uvccl__free(s);
  group_part_closed(g);
}

static void on_own_server_closed(uvccl_store_server_t *s) {
  group_t *g = s->data;
  uvccl__free(s);
  group_part_closed(g);
}

/* A sparse world's embedded store server stays up at destroy until every
 * client has gone (the other ranks may still read addresses from it for
 * their last connections), polled every 10 ms, for at most 30 s. */
#define UVCCL__LINGER_MS 30000
typedef struct {
  uv_timer_t t;
  group_t *g;
  uint64_t deadline;
} linger_t;

static void on_linger_closed(uv_handle_t *h) {
  linger_t *l = h->data;
  group_t *g = l->g;
  uvccl__free(l);
  g->own_server->data = g;
  uvccl_store_server_close(g->own_server, on_own_server_closed);
}

static void on_linger(uv_timer_t *t) {
  linger_t *l = t->data;
  uvccl_store_server_stats_t st;
  uvccl_store_server_stats(l->g->own_server, &st);
  if (st.connections > 0 && uvccl__now_ms() < l->deadline) return;
  if (st.connections > 0)
    LOG_WARN("coll", "rank 0: closing the store server with %llu clients "
             "still connected after %d s", (unsigned long long)st.connections,
             UVCCL__LINGER_MS / 1000);
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, on_linger_closed);
}

static int server_linger(group_t *g) {
  linger_t *l = uvccl__malloc(sizeof(*l));
  if (l == NULL) return UV_ENOMEM;
  l->g = g;
  l->deadline = uvccl__now_ms() + UVCCL__LINGER_MS;
  uv_timer_init(g->net->loop, &l->t);
  l->t.data = l;
  uv_timer_start(&l->t, on_linger, 0, 10);
  return 0;
}

typedef struct {
  uvccl_pg_t *pg;
  uvccl_pg_close_cb cb;
} handle_close_t;

static void handle_close_done(void *arg) {
  handle_close_t *h = arg;
  uvccl_pg_t *pg = h->pg;
  uvccl_pg_close_cb cb = h->cb;
  uvccl__free(h);
  if (cb != NULL) cb(pg);
}

void uvccl__cpu_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb) {
  group_t *g;
  net_t *net;
  if (pg == NULL || pg->impl_ == NULL) return;
  g = pg->impl_;
  if (g->destroying) return;
  if (g->handles > 1 || g->pg != pg) {
    /* Another handle of a find-or-create group: only this one goes. */
    handle_close_t *h = uvccl__malloc(sizeof(*h));
    g->handles--;
    if (g->pg == pg) g->pg = NULL;
    pg->impl_ = NULL;
    if (h == NULL) return;
    h->pg = pg;
    h->cb = cb;
    uvccl__pg_defer_call(g->net->loop, handle_close_done, h);
    return;
  }
  net = g->net;
  g->destroying = 1;
  g->close_cb = cb;
  g->pg = pg;
  uvccl__pg_boot_cancel(g);
  uvccl__group_fail_all(g, UV_ECANCELED, "the group was destroyed");
  uvccl__shrink_forget_group(g);
  uvccl__group_unregister(g);
  uvccl__net_forget_group(net, g->gid);
  g->closing_parts = 1; /* the net reference */
  if (g->stager != NULL) {
    /* GPU staging: its pinned pool and stream go once its copies end */
    g->closing_parts++;
    uvccl__stager_close(g->stager, group_part_closed_cb, g);
    g->stager = NULL;
  }
  if (g->own_store != NULL) {
    uvccl__trace_watch_stop(net->twatch);
    net->twatch = NULL;
    g->closing_parts++;
    g->own_store->data = g;
    uvccl_store_close(g->own_store, on_own_store_closed);
  }
  if (g->own_server != NULL) {
    g->closing_parts++;
    if (!net->sparse || server_linger(g) != 0) {
      g->own_server->data = g;
      uvccl_store_server_close(g->own_server, on_own_server_closed);
    }
  }
  g->destroying = 2;
  if (net->refs > 1) {
    /* Others still use the connections: this group is done once its
     * schedules are gone; from a callback, never inside this call. */
    net->refs--;
    uvccl__pg_defer_call(net->loop, group_part_closed_cb, g);
    return;
  }
  net->closed_arg = g;
  uvccl__net_release(net, on_net_closed, g);
}

void uvccl__cpu_pg_abort(uvccl_pg_t *pg, const char *reason) {
  group_t *g;
  char msg[160];
  if (pg == NULL || pg->impl_ == NULL) return;
  g = pg->impl_;
  snprintf(msg, sizeof(msg), "aborted: %s", reason ? reason : "by the user");
  uvccl__net_abort(g->net, UVCCL_EABORTED, msg);
}

/* ---- failures ------------------------------------------------------------ */

int uvccl__cpu_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f) {
  const group_t *g;
  int r;
  if (pg == NULL || f == NULL) return UV_EINVAL;
  g = pg->impl_;
  if (g == NULL) return UV_EINVAL;
  memset(f, 0, sizeof(*f));
  f->rank = f->global_rank = f->reporter = f->host = -1;
  if (!g->broken) return 0;
  r = g->culprit.rank;
  f->cause = (uvccl_fail_cause_t)g->culprit.cause;
  f->global_rank = r >= 0 && r < g->net->size ? r : -1;
  f->rank = f->global_rank >= 0 ? g->inv[r] : -1;
  f->reporter = g->culprit.origin;
  f->err = g->broken_err;
  snprintf(f->address, sizeof(f->address), "%s",
           f->global_rank >= 0 ? uvccl__net_addr(g->net, r) : "");
  snprintf(f->msg, sizeof(f->msg), "%s", g->broken_msg);
  if (f->rank >= 0) {
    int h = uvccl__cpu_pg_peer_host(pg, f->rank);
    f->host = h >= 0 ? h : -1;
  }
  f->host_lost = g->net->cut_off ? 2 : uvccl__net_host_lost(g->net, r);
  return 1;
}

int uvccl__cpu_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max) {
  const group_t *g;
  int i, n = 0;
  if (pg == NULL || (ranks == NULL && max > 0)) return UV_EINVAL;
  g = pg->impl_;
  if (g == NULL) return UV_EINVAL;
  for (i = 0; i < g->net->nfailed; i++) {
    int r = g->net->failed[i];
    if (g->inv[r] < 0) continue;
    if (n < max) ranks[n] = g->inv[r];
    n++;
  }
  return n;
}

/* ---- subgroups ----------------------------------------------------------- */

int uvccl__cpu_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg,
                            const int *ranks, int nranks, const char *tag) {
  group_t *p, *g;
  int i, j;
  uint32_t gid;
  if (parent == NULL || pg == NULL || parent->impl_ == NULL || nranks <= 0 ||
      ranks == NULL)
    return UV_EINVAL;
  p = parent->impl_;
  if (p->destroying || p->boot != NULL) return UV_EINVAL;
  for (i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= p->size) return UV_EINVAL;
    for (j = 0; j < i; j++)
      if (ranks[j] == ranks[i]) return UV_EINVAL;
  }
  /* Every rank of the parent calls this in the same order: the counter is
   * the same everywhere, members and non-members alike. */
  gid = uvccl__child_gid(p->gid, ++p->nchildren, 0);
  if (tag != NULL) {
    for (g = p->net->groups; g != NULL; g = g->next) {
      if (g->tag == NULL || strcmp(g->tag, tag) != 0 || g->size != nranks ||
          g->destroying)
        continue;
      for (i = 0; i < nranks; i++)
        if (g->ranks[i] != p->ranks[ranks[i]]) break;
      if (i == nranks) {
        g->handles++;
        pg->loop = p->net->loop;
        pg->rank = g->rank;
        pg->size = g->size;
        pg->impl_ = g;
        pg->backend_ = UVCCL_BACKEND_TCP;
        return 0;
      }
    }
  }
  return uvccl__group_make_child(p, pg, gid, ranks, nranks, tag,
                                 "new_group");
}

int uvccl__cpu_pg_global_rank(const uvccl_pg_t *pg, int group_rank) {
  const group_t *g = pg ? pg->impl_ : NULL;
  return g ? uvccl__pg_world(g, group_rank) : -1;
}

int uvccl__cpu_pg_group_rank(const uvccl_pg_t *pg, int global_rank) {
  const group_t *g = pg ? pg->impl_ : NULL;
  if (g == NULL || global_rank < 0 || global_rank >= g->net->size) return -1;
  return g->inv[global_rank];
}

const char *uvccl__cpu_pg_peer_address(const uvccl_pg_t *pg, int group_rank) {
  const group_t *g = pg ? pg->impl_ : NULL;
  int r;
  if (g == NULL) return "?";
  r = uvccl__pg_world(g, group_rank);
  return r < 0 ? "?" : uvccl__net_addr(g->net, r);
}

const char *uvccl__cpu_pg_peer_transport(const uvccl_pg_t *pg, int group_rank) {
  const group_t *g;
  int r;
  if (pg == NULL) return "?";
  g = pg->impl_;
  if (g == NULL) return "?";
  r = uvccl__pg_world(g, group_rank);
  return r < 0 ? "?" : uvccl__net_transport(g->net, r);
}

/* Hosts numbered in the order of their lowest group rank, as the rings
 * visit them (algo/ring.c). */
int uvccl__cpu_pg_peer_host(const uvccl_pg_t *pg, int group_rank) {
  const group_t *g = pg ? pg->impl_ : NULL;
  const net_t *net;
  uint64_t h;
  int i, j, n = 0;
  if (g == NULL || group_rank < 0 || group_rank >= g->size) return UV_EINVAL;
  net = g->net;
  if (g->size == 1) return 0;
  if (net->sparse || g->boot != NULL) return UVCCL_ENOTSUP;
  h = net->hosts[g->ranks[group_rank]];
  if (h == 0) return UVCCL_ENOTSUP;
  for (i = 0; i < group_rank; i++) {
    uint64_t hi = net->hosts[g->ranks[i]];
    if (hi == h) return uvccl__cpu_pg_peer_host(pg, i);
    for (j = 0; j < i && net->hosts[g->ranks[j]] != hi; j++) {
    }
    if (j == i) n++; /* the first rank of another host */
  }
  return n;
}

void uvccl__cpu_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms) {
  group_t *g = pg ? pg->impl_ : NULL;
  if (g) g->timeout_ms = timeout_ms ? timeout_ms : UVCCL_PG_DEFAULT_TIMEOUT_MS;
}

void uvccl__cpu_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us) {
  group_t *g = pg ? pg->impl_ : NULL;
  if (g) g->busy_us = us == UINT32_MAX ? 0 : us;
}

int uvccl__cpu_pg_loop_stats(uvccl_pg_t *pg, uvccl_loop_stats_t *stats,
                        int reset) {
  group_t *g;
  if (pg == NULL || (g = pg->impl_) == NULL ||
      g->net == NULL || g->net->closing)
    return UV_EINVAL;
  uvccl__turn_stats(&g->net->turn, stats, reset);
  return 0;
}

int uvccl__cpu_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t *op) {
  group_t *g = pg ? pg->impl_ : NULL;
  double *p;
  if (g == NULL || op == NULL) return UV_EINVAL;
  p = uvccl__realloc(g->premul, (size_t)(g->npremul + 1) * sizeof(double));
  if (p == NULL) return UV_ENOMEM;
  g->premul = p;
  p[g->npremul] = factor;
  *op = (uvccl_redop_t)(UVCCL__PREMUL_BASE + g->npremul++);
  return 0;
}

/* ---- split: an allgather of (color, key), then a subgroup ---------------- */

typedef struct {
  uvccl_pg_t *pg;
  int32_t mine[2];
  int32_t *all;     /* size pairs */
  uint32_t counter;
} split_t;

static int split_finish(sched_t *s) {
  split_t *sp = s->user;
  group_t *p = s->g;
  int color = sp->all[2 * p->rank], n = 0, i, j, rc;
  int *ranks;
  if (color < 0) {
    sp->pg->rank = -1;
    sp->pg->impl_ = NULL;
    return UVCCL_ENOTMEMBER;
  }
  ranks = uvccl__malloc((size_t)p->size * sizeof(int));
  if (ranks == NULL) return UV_ENOMEM;
  for (i = 0; i < p->size; i++)
    if (sp->all[2 * i] == color) ranks[n++] = i;
  /* order by key, then parent rank (insertion sort: stable) */
  for (i = 1; i < n; i++) {
    int r = ranks[i];
    for (j = i - 1; j >= 0 && sp->all[2 * ranks[j] + 1] > sp->all[2 * r + 1];
         j--)
      ranks[j + 1] = ranks[j];
    ranks[j + 1] = r;
  }
  rc = uvccl__group_make_child(p, sp->pg,
                               uvccl__child_gid(p->gid, sp->counter, color),
                               ranks, n, NULL, "split");
  uvccl__free(ranks);
  return rc;
}

static void split_release(sched_t *s) {
  split_t *sp = s->user;
  if (sp == NULL) return;
  uvccl__free(sp->all);
  uvccl__free(sp);
}

int uvccl__allgather_build(sched_t *s, const void *sendbuf, void *const *bufs,
                           const size_t *lens);

/* After the allgather, a barrier of the parent (dissemination, tags of its
 * own) before the subgroup is made. Why: a member that dies during the
 * allgather may have sent its part to some ranks and not to others, so the
 * allgather can end here and fail there. A rank whose allgather ended then
 * waits in this barrier for the ranks whose allgather failed, and fails
 * with them once it learns of the death (the parent's pending schedules
 * fail with it), instead of making a subgroup its peers never make and
 * waiting there until its timeout. (A death inside the barrier itself can
 * still split the outcome; that window is one message wide.) */
static void split_confirm(sched_t *s) {
  uint32_t built = s->nops, join, i;
  if (s->g->size < 2) return;
  join = uvccl__sop_nop(s);
  for (i = 0; i < built; i++) uvccl__sop_dep(s, i, join);
  uvccl__barrier_build(s, 0xffff0000u, join);
}

int uvccl__cpu_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int key,
                   uvccl_work_t *work, uvccl_work_cb cb) {
  group_t *p;
  sched_t *s;
  split_t *sp;
  void **bufs;
  size_t *lens;
  int rc, i;
  if (pg == NULL) return UV_EINVAL;
  rc = uvccl__pg_check(parent, work, &p);
  if (rc != 0) return rc;
  s = uvccl__sched_new(p, "split", 0);
  sp = uvccl__calloc(1, sizeof(*sp));
  bufs = uvccl__malloc((size_t)p->size * sizeof(void *));
  lens = uvccl__malloc((size_t)p->size * sizeof(size_t));
  if (sp) sp->all = uvccl__malloc((size_t)p->size * 2 * sizeof(int32_t));
  if (s == NULL || sp == NULL || sp->all == NULL || bufs == NULL ||
      lens == NULL) {
    if (sp) uvccl__free(sp->all);
    uvccl__free(sp);
    uvccl__free(bufs);
    uvccl__free(lens);
    if (s) uvccl__sched_free(s);
    return UV_ENOMEM;
  }
  sp->pg = pg;
  sp->mine[0] = color < 0 ? -1 : color;
  sp->mine[1] = key;
  sp->counter = ++p->nchildren;
  for (i = 0; i < p->size; i++) {
    bufs[i] = sp->all + 2 * i;
    lens[i] = 2 * sizeof(int32_t);
  }
  s->user = sp;
  s->release = split_release;
  s->finish = split_finish;
  rc = uvccl__allgather_build(s, sp->mine, bufs, lens);
  uvccl__free(bufs);
  uvccl__free(lens);
  if (rc == 0) split_confirm(s); /* out of memory: sched_start says so */
  if (rc != 0) {
    uvccl__sched_free(s);
    return rc;
  }
  return uvccl__sched_start(s, work, cb);
}
