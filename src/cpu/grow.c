/* Grows of CPU worlds (src/pg/grow.c's backend entries): whether a grow
 * keeps the members' connections, and the grown world's shape.
 *
 * Keeping them. The joiners take the net's next numbers (N, N + 1, ...
 * for a net of N: the failed ranks' numbers stay fenced, and no live
 * rank's number changes), so the members' connections, shared-memory
 * rings and monitor links stay as they are, and only the joiners
 * connect: to every member and to each other, as a creation's ranks do
 * (xport/grow.c grows the members' net, create.c makes both sides).
 * Rank 0 decides it (grow_keep) and writes the members' numbers into the
 * plan; the others learn it with the epoch. It needs a full mesh
 * (sparse worlds and worlds of one make theirs anew), a group that holds
 * every live rank of its net in ascending order (a shrunk world, a grown
 * one: not a subgroup), and a net with no more failed numbers than live
 * ranks once grown (ranks that leave in the same agreement, through
 * uvccl_pg_reconfigure, count as gone: their connections stay until they
 * destroy their world): beyond that the grow makes the world anew, so a net's
 * arrays stay within twice its live ranks however many cycles of
 * shrink and grow it goes through. UVCCL_GROW=anew always makes it
 * anew. */
#include "internal.h"
#include "pg/backend.h"
#include "loop/config.h"

#include <stdio.h>

int64_t uvccl__cpu_pg_grow_keep(const uvccl_pg_t *pg,
                                const unsigned char *leaving, int njoin,
                                char **ranks) {
  group_t *g = pg->impl_;
  net_t *net;
  int i, mode, last = -1, stay = 0;
  size_t n, off = 0;
  *ranks = NULL;
  uvccl__config_choice(UVCCL__CFG_GROW, &mode);
  if (g == NULL || mode != 0) return 0;
  net = g->net;
  if (net->sparse || net->live == NULL || net->aborted || net->fenced ||
      net->closing || net->mesh_cb != NULL || net->grown_cb != NULL ||
      g->boot != NULL || g->broken)
    return 0;
  for (i = 0; i < g->size; i++) stay += leaving == NULL || !leaving[i];
  if ((int64_t)net->size + njoin > 2 * ((int64_t)stay + njoin) ||
      (int64_t)net->size + njoin > 65536)
    return 0;
  for (i = 0; i < g->size; i++) {
    int r = g->ranks[i];
    peer_t *p = net->peers[r];
    if (r <= last) return 0; /* not ascending */
    last = r;
    if (r != net->rank && (p == NULL || p->state != PEER_UP)) return 0;
  }
  for (i = 0; i < net->size; i++) {
    peer_t *p = net->peers[i];
    /* A live rank outside the group; not one a shrink decided had failed,
     * whose verdict may reach this rank only after the shrink did. */
    if (i != net->rank && p != NULL && p->state == PEER_UP &&
        g->inv[i] < 0 && !uvccl__agree_declared(net, i))
      return 0;
  }
  n = (size_t)g->size * 7 + 1;
  *ranks = uvccl__malloc(n);
  if (*ranks == NULL) return 0;
  for (i = 0; i < g->size; i++)
    if (leaving == NULL || !leaving[i])
      off += (size_t)snprintf(*ranks + off, n - off, " %d", g->ranks[i]);
  return net->size;
}

/* The grown world's id: the same on members and joiners, from its prefix
 * (which names the epoch) alone. */
static uint32_t grown_gid(const char *prefix) {
  uint32_t h = 2166136261u;
  for (; *prefix; prefix++) h = (h ^ (unsigned char)*prefix) * 16777619u;
  return uvccl__child_gid(h, 0x47524f57u, 0);
}

int uvccl__cpu_pg_grow_init(uv_loop_t *loop, uvccl_pg_t *parent,
                            uvccl_pg_t *pg, uvccl_store_t *store,
                            const uvccl_pg_options_t *o,
                            const uvccl__grow_plan_t *plan, uvccl_work_t *w,
                            uvccl_work_cb cb) {
  uvccl__grow_shape_t sh;
  int *ranks, i, rc, m = plan->members, n = plan->members + plan->njoin;
  if (plan->keep <= 0) return uvccl__cpu_pg_init(loop, pg, store, o, w, cb);
  if (o->size != n || o->rank < 0 || o->rank >= n) return UV_EINVAL;
  ranks = uvccl__malloc((size_t)n * sizeof(int));
  if (ranks == NULL) return UV_ENOMEM;
  if (parent != NULL) {
    group_t *g = parent->impl_;
    int stay = 0;
    for (i = 0; g != NULL && i < g->size; i++)
      if (plan->leaving == NULL || !plan->leaving[i])
        ranks[stay++] = g->ranks[i];
    if (g == NULL || stay != m || g->net->size != plan->keep) {
      /* rank 0 saw another world: never on members of one group */
      snprintf(w->msg, sizeof(w->msg), "grow: rank 0's plan (%d members, a "
               "net of %lld) is not this member's world", m,
               (long long)plan->keep);
      uvccl__free(ranks);
      return UVCCL_EPROTO;
    }
    sh.net_rank = g->net->rank;
  } else {
    if (plan->ranks == NULL || o->rank < m) {
      uvccl__free(ranks);
      return UV_EINVAL;
    }
    for (i = 0; i < m; i++) ranks[i] = plan->ranks[i];
    sh.net_rank = (int)plan->keep + o->rank - m;
  }
  for (i = m; i < n; i++) ranks[i] = (int)plan->keep + i - m;
  sh.net_size = (int)plan->keep + plan->njoin;
  sh.ranks = ranks;
  sh.size = n;
  sh.members = m;
  sh.gid = grown_gid(o->prefix != NULL ? o->prefix : "");
  rc = uvccl__cpu_pg_init_grown(loop, parent, pg, store, o, &sh, w, cb);
  uvccl__free(ranks);
  return rc;
}
