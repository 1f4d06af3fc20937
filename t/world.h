/* In-process worlds for the collective tests: N ranks, each a real process
 * group with its own listener and TCP connections, all on one loop,
 * bootstrapped through one in-process hash store. Header-only. */
#ifndef UVCCL_T_WORLD_H
#define UVCCL_T_WORLD_H

#include "uvccl.h"

#include <stdio.h>
#include <string.h>

#define WORLD_MAX 16

typedef struct {
  uv_loop_t *loop;
  uvccl_store_t store;
  uvccl_pg_t pg[WORLD_MAX];
  uvccl_work_t w[WORLD_MAX];
  int n;
  int closed;
} world_t;

static int world__seq;

/* Runs the loop until every work in w[0..n) is done. Returns the first
 * nonzero status (or 0). */
static int world_wait(world_t *W) {
  int i, rc = 0;
  for (i = 0; i < W->n; i++) {
    if (W->w[i].state == UVCCL_WORK_IDLE) continue;
    while (!uvccl_work_done(&W->w[i])) uv_run(W->loop, UV_RUN_ONCE);
  }
  for (i = 0; i < W->n; i++)
    if (W->w[i].status != 0 && rc == 0) rc = W->w[i].status;
  return rc;
}

static int world_init(world_t *W, uv_loop_t *loop, int n,
                      const uvccl_pg_options_t *base) {
  int i, rc;
  char prefix[64];
  memset(W, 0, sizeof(*W));
  W->loop = loop;
  W->n = n;
  rc = uvccl_hash_store_init(loop, &W->store);
  if (rc != 0) return rc;
  snprintf(prefix, sizeof(prefix), "world%d", ++world__seq);
  for (i = 0; i < n; i++) {
    uvccl_pg_options_t o;
    if (base) o = *base;
    else memset(&o, 0, sizeof(o));
    o.rank = i;
    o.size = n;
    o.prefix = prefix;
    if (o.timeout_ms == 0) o.timeout_ms = 20000;
    rc = uvccl_pg_init(loop, &W->pg[i], &W->store, &o, &W->w[i], NULL);
    if (rc != 0) return rc;
  }
  return world_wait(W);
}

static void world__closed(uvccl_pg_t *pg) { ((world_t *)pg->data)->closed++; }
static void world__store_closed(uvccl_store_t *s) { (void)s; }

static void world_destroy(world_t *W) {
  int i, want = 0;
  for (i = 0; i < W->n; i++) {
    if (W->pg[i].impl_ == NULL) continue;
    W->pg[i].data = W;
    uvccl_pg_destroy(&W->pg[i], world__closed);
    want++;
  }
  while (W->closed < want) uv_run(W->loop, UV_RUN_ONCE);
  uvccl_store_close(&W->store, world__store_closed);
  uv_run(W->loop, UV_RUN_DEFAULT);
}

#endif
