/* barrier (dissemination, or through the hosts' leaders) and
 * monitored_barrier. */
#include "algo.h"

/* ---- barriers ------------------------------------------------------------ */

int uvccl__host_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  s = uvccl__sched_new(g, "barrier", 0);
  if (s == NULL) return UV_ENOMEM;
  s->ordered = 1;
  if (g->box_ok) {
    /* every rank's (empty) part through shared memory (shm.c) */
    uvccl__sop_box(s, UVCCL__BOX_REDUCE, -1, NULL, NULL, 0);
    return uvccl__sched_start(s, work, cb);
  }
  if (uvccl__algo_allreduce_hosts(s, NULL, 0, NONE) != NONE) {
    /* across hosts alike: an empty allreduce through the hosts' leaders */
    return uvccl__sched_start(s, work, cb);
  }
  if (g->small_tree && g->size > 2) {
    /* (group_t.small_tree) an empty allreduce: up the tree, down again */
    uvccl__algo_allreduce_tree(s, NULL, 0, NONE);
    return uvccl__sched_start(s, work, cb);
  }
  uvccl__barrier_build(s, 0, NONE);
  return uvccl__sched_start(s, work, cb);
}

/* Round k of a barrier of P ranks: pairs exchange (rank XOR 2^k) where P
 * is a power of two, else dissemination (sends to rank + 2^k, hears from
 * rank - 2^k). Both take log2 P rounds; pairs wait on the peer they
 * woke, dissemination on another one, which costs a wake-up more where
 * ranks share CPUs (bench/RESULTS.md, "Across hosts", 2026-11-28
 * evening). */
uint32_t uvccl__barrier_build(sched_t *s, uint32_t tag0, uint32_t after) {
  group_t *g = s->g;
  uint32_t last = after, k = 0;
  int dist, pairs = (g->size & (g->size - 1)) == 0;
  for (dist = 1; dist < g->size; dist <<= 1, k++) {
    int to = pairs ? g->rank ^ dist : mod(g->rank + dist, g->size);
    int from = pairs ? g->rank ^ dist : mod(g->rank - dist, g->size);
    uint32_t snd = uvccl__sop_send(s, to, tag0 + k, NULL, 0);
    uint32_t rcv = uvccl__sop_recv(s, from, tag0 + k, NULL, 0);
    uint32_t j = uvccl__sop_nop(s);
    uvccl__sop_dep(s, last, snd);
    uvccl__sop_dep(s, last, rcv);
    uvccl__sop_dep(s, snd, j);
    uvccl__sop_dep(s, rcv, j);
    last = j;
  }
  return last;
}

int uvccl__host_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work,
                                  int wait_all, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g), i;
  if (rc != 0) return rc;
  s = uvccl__sched_new(g, "monitored_barrier", 0);
  if (s == NULL) return UV_ENOMEM;
  s->ordered = 1;
  s->list_waiting = wait_all ? 2 : 1;
  if (g->rank == 0) {
    uint32_t all = uvccl__sop_nop(s);
    for (i = 1; i < g->size; i++)
      uvccl__sop_dep(s, uvccl__sop_recv(s, i, 0, NULL, 0), all);
    for (i = 1; i < g->size; i++)
      uvccl__sop_dep(s, all, uvccl__sop_send(s, i, 1, NULL, 0));
  } else {
    uvccl__sop_send(s, 0, 0, NULL, 0);
    uvccl__sop_recv(s, 0, 1, NULL, 0);
  }
  return uvccl__sched_start(s, work, cb);
}
