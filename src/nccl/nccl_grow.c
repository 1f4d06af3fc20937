/* Grows of NCCL worlds (src/pg/grow.c's backend entries), through NCCL's
 * ncclCommGetUniqueId and ncclCommGrow (2.29); UVCCL_ENOTSUP where the
 * loaded NCCL lacks them.
 *
 * The members agree on the grow's epoch through the store, not by a
 * broadcast over the old world (its collectives take device memory):
 * rank 0 sets PREFIX/nccl/grow/<n> to it, the others wait for it, n
 * counting the grows called on that world (the same on every member).
 * Then every rank makes the new world with nccl_boot.c in its grow form:
 * members keep their ranks and device, joiners take theirs from the
 * agreement. A member or joiner that dies meanwhile fails ncclCommGrow on
 * the others (NCCL's bootstrap) or lets it time out; they keep the old
 * world either way. */
#include "nccl_internal.h"
#include "cuda/cuda_api.h"

#include <stdio.h>
#include <string.h>

int uvccl__nccl_pg_grow_check(const uvccl_pg_t *pg, char *why, size_t len) {
  nccl_group_t *g = pg != NULL ? pg->impl_ : NULL;
  char err[256];
  int rc;
  if (pg != NULL && g == NULL) return UV_EINVAL;
  if (g != NULL && g->destroying) return UVCCL_ECLOSING;
  err[0] = '\0';
  rc = uvccl__gpu_load(err, sizeof(err));
  if (rc == 0) rc = uvccl__nccl_api_load(err, sizeof(err));
  if (rc != 0) {
    snprintf(why, len, "grow: no NCCL group on this machine: %s",
             err[0] ? err : uvccl_strerror(rc));
    return rc;
  }
  if (uvccl__nccl.CommGrow == NULL) {
    snprintf(why, len, "grow: the loaded NCCL (%d) has no ncclCommGrow "
             "(2.29 or newer)", uvccl__nccl.version);
    return UVCCL_ENOTSUP;
  }
  if (g != NULL && g->prefix[0] == '\0') {
    snprintf(why, len, "grow: a group made by split or new_group has no "
             "store keys of its own: grow its world");
    return UVCCL_ENOTSUP;
  }
  if (g != NULL && (g->failed || g->broken || g->revoked || g->aborted)) {
    snprintf(why, len, "grow: the world is %s (%s): shrink it first",
             g->revoked ? "revoked" : "broken",
             g->fail_msg[0] ? g->fail_msg : "no communicator");
    return UVCCL_ECLOSING;
  }
  return 0;
}

void uvccl__nccl_pg_grow_agree_key(uvccl_pg_t *pg, char *key, size_t len) {
  nccl_group_t *g = pg->impl_;
  snprintf(key, len, "%.200s/nccl/grow/%u", g->prefix, ++g->ngrows);
}

int uvccl__nccl_pg_grow_init(uv_loop_t *loop, uvccl_pg_t *parent,
                             uvccl_pg_t *pg, uvccl_store_t *store,
                             const uvccl_pg_options_t *opts,
                             const uvccl__grow_plan_t *plan,
                             uvccl_work_t *work, uvccl_work_cb cb) {
  nccl_group_t *p = parent != NULL ? parent->impl_ : NULL;
  uvccl_pg_options_t o = *opts;
  (void)plan; /* ncclCommGrow keeps the members' communicator itself */
  if (parent != NULL && p == NULL) return UV_EINVAL;
  if (p != NULL) o.device = p->device; /* a member stays where it is */
  return uvccl__nccl_boot_start(loop, pg, store, &o, work, cb, 1, p);
}
