/* Group objects: making, registering on their net, freeing, and the
 * subgroups every member makes alike without talking (new_group, split,
 * shrink), and what every operation checks of its group first. Below
 * pg.c (creation over a store, destroy, the API) and shrink.c. */
#include "internal.h"

#include <stdio.h>

group_t *uvccl__group_new(net_t *net, int rank, int size) {
  group_t *g = uvccl__calloc(1, sizeof(*g));
  int i;
  if (g == NULL) return NULL;
  g->ranks = uvccl__malloc((size_t)size * sizeof(int));
  g->inv = uvccl__malloc((size_t)net->size * sizeof(int));
  if (g->ranks == NULL || g->inv == NULL) {
    uvccl__free(g->ranks);
    uvccl__free(g->inv);
    uvccl__free(g);
    return NULL;
  }
  for (i = 0; i < net->size; i++) g->inv[i] = -1;
  g->culprit.rank = -1;
  g->net = net;
  g->rank = rank;
  g->size = size;
  g->handles = 1;
  net->refs++;
  return g;
}

/* A pending operation's peers it still waits for (the flight recorder
 * asks on the group's loop thread): the group ranks its active receives
 * expect. */
static int group_waiting(void *ctx, uint64_t id, int *ranks, int max) {
  group_t *g = ctx;
  sched_t *s;
  uint32_t i;
  int n = 0, k;
  for (s = g->pend_head; s != NULL; s = s->next) {
    if (s->fid != id) continue;
    for (i = 0; i < s->nops && n < max; i++) {
      sop_t *op = &s->ops[i];
      int r;
      if (op->state == SOP_ACTIVE && op->type == SOP_BOX) {
        /* every rank whose part has not come */
        for (r = 0; r < g->net->size && n < max; r++)
          if (r != g->net->rank && uvccl__shm_box_needs(g->net, op, r))
            ranks[n++] = g->inv[r];
        continue;
      }
      if (op->state != SOP_ACTIVE ||
          (op->type != SOP_RECV && op->type != SOP_RECV_RED))
        continue;
      r = op->peer >= 0 ? g->inv[op->peer] : -1; /* -1: any source */
      for (k = 0; k < n && ranks[k] != r; k++) {
      }
      if (k == n) ranks[n++] = r;
    }
    break;
  }
  return n;
}

void uvccl__group_register(group_t *g) {
  g->next = g->net->groups;
  g->net->groups = g;
  g->fg = uvccl__flight_group_add("tcp", g->trace_name, g->gid, g->rank,
                                  g->size, g->ranks, g->trace_size,
                                  g->net->loop, group_waiting, g);
}

void uvccl__group_unregister(group_t *g) {
  group_t **pp;
  uvccl__flight_group_remove(g->fg);
  g->fg = NULL;
  for (pp = &g->net->groups; *pp != NULL; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      return;
    }
}

void uvccl__group_free(group_t *g) {
  sched_t *s, *next;
  for (s = g->free_scheds; s != NULL; s = next) {
    next = s->free_next;
    uvccl__free(s->ops);
    uvccl__free(s->edges);
    uvccl__free(s->succ);
    if (s->tmpcap >= UVCCL__BIG_MIN) uvccl__big_free(s->tmp);
    else uvccl__free(s->tmp);
    uvccl__free(s);
  }
  uvccl__free(g->ranks);
  uvccl__free(g->inv);
  uvccl__free(g->ring);
  uvccl__free(g->hier);
  uvccl__free(g->lead);
  uvccl__free(g->premul);
  uvccl__free(g->tag);
  uvccl__free(g->own_store);
  uvccl__free(g->own_server);
  uvccl__free(g);
}

uint32_t uvccl__child_gid(uint32_t parent, uint32_t n, int color) {
  /* A 32-bit mix of (parent, counter, color): every member computes the
   * same id without talking to anyone. */
  uint64_t x = ((uint64_t)parent << 32) ^ ((uint64_t)n * 0x9e3779b97f4a7c15ull) ^
               ((uint64_t)(uint32_t)color * 0xc2b2ae3d27d4eb4full);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x < 2 ? (uint32_t)x + 2 : (uint32_t)x;
}

int uvccl__group_make_child(group_t *parent, uvccl_pg_t *pg, uint32_t gid,
                            const int *ranks, int n, const char *tag,
                            const char *kind) {
  net_t *net = parent->net;
  group_t *g;
  int i, me = -1;
  for (i = 0; i < n; i++)
    if (ranks[i] == parent->rank) me = i;
  if (me < 0) {
    pg->loop = net->loop;
    pg->rank = -1;
    pg->size = n;
    pg->impl_ = NULL;
    return UVCCL_ENOTMEMBER;
  }
  if (uvccl__net_group(net, gid) != NULL) return UV_EEXIST;
  g = uvccl__group_new(net, me, n);
  if (g == NULL) return UV_ENOMEM;
  for (i = 0; i < n; i++) {
    g->ranks[i] = parent->ranks[ranks[i]];
    g->inv[g->ranks[i]] = i;
  }
  g->gid = gid;
  g->pg = pg;
  g->on_sched_gone = parent->on_sched_gone;
  g->timeout_ms = parent->timeout_ms;
  g->busy_us = parent->busy_us;
  g->small_max = parent->small_max;
  g->small_tree = parent->small_tree;
  g->segment = parent->segment;
  g->stage_chunk = parent->stage_chunk;
  g->stream_min = parent->stream_min;
  if (tag != NULL) g->tag = uvccl__strdup(tag);
  g->trace_size = parent->trace_size;
  g->fp_check = parent->fp_check;
  snprintf(g->trace_name, sizeof(g->trace_name), "%s",
           tag != NULL ? tag : kind);
  uvccl__group_register(g);
  pg->loop = net->loop;
  pg->rank = me;
  pg->size = n;
  pg->impl_ = g;
  pg->backend_ = UVCCL_BACKEND_TCP;
  uvccl__net_group_born(net, g);
  return 0;
}

/* ---- what every operation checks first ------------------------------------ */

int uvccl__pg_world(const group_t *g, int grank) {
  return grank >= 0 && grank < g->size ? g->ranks[grank] : -1;
}

/* The group behind pg, if an operation may start on it now. */
int uvccl__pg_check(uvccl_pg_t *pg, uvccl_work_t *w, group_t **gp) {
  group_t *g;
  if (pg == NULL || w == NULL) return UV_EINVAL;
  g = pg->impl_;
  if (g == NULL) return pg->rank < 0 ? UVCCL_ENOTMEMBER : UV_EINVAL;
  if (g->destroying) return UVCCL_ECLOSING;
  if (g->boot != NULL) return UV_EINVAL; /* still being created */
  if (g->net->aborted) return UVCCL_EABORTED;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  *gp = g;
  return 0;
}
