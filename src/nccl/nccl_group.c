/* The public calls on NCCL groups other than creation and operations:
 * destroy, abort, failures, queries and settings. Above nccl_pg.c (the
 * ops' life cycle) and nccl_boot.c (creation, which a destroy may cut
 * short). */
#include "nccl_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  uv_timer_t t;
  uvccl_pg_t *pg;
  uvccl_pg_close_cb cb;
} handle_close_t;

static void handle_closed(uv_handle_t *h) {
  handle_close_t *hc = (handle_close_t *)h;
  if (hc->cb != NULL) hc->cb(hc->pg);
  uvccl__free(hc);
}

void uvccl__nccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb) {
  nccl_group_t *g;
  if (pg == NULL || pg->impl_ == NULL) return;
  g = pg->impl_;
  if (g->destroying) return;
  if (g->handles > 1) {
    /* another handle of a find-or-create subgroup: only this one goes */
    handle_close_t *hc = uvccl__calloc(1, sizeof(*hc));
    g->handles--;
    if (g->pg == pg) g->pg = NULL;
    pg->impl_ = NULL;
    if (hc == NULL) return;
    hc->pg = pg;
    hc->cb = cb;
    uv_timer_init(g->loop, &hc->t);
    uv_close((uv_handle_t *)&hc->t, handle_closed);
    return;
  }
  g->destroying = 1;
  g->pg = pg;
  g->close_cb = cb;
  if (g->boot != NULL && !g->boot->dead)
    uvccl__nccl_boot_fail(g, UV_ECANCELED, "group destroyed during creation");
  if (g->boot != NULL && g->boot->getw.state == UVCCL_WORK_PENDING)
    uvccl_work_cancel(&g->boot->getw);
  uvccl__nccl_fail_all_works(g, UV_ECANCELED, "the group was destroyed");
  uvccl__nccl_destroy_progress(g);
}

void uvccl__nccl_pg_abort(uvccl_pg_t *pg, const char *reason) {
  nccl_group_t *g;
  nccl_op_t *op;
  char msg[160];
  if (pg == NULL || pg->impl_ == NULL) return;
  g = pg->impl_;
  if (g->aborted) return;
  g->aborted = 1;
  snprintf(msg, sizeof(msg), "aborted: %s", reason ? reason : "by the user");
  if (g->fail_msg[0] == '\0')
    snprintf(g->fail_msg, sizeof(g->fail_msg), "%s", msg);
  LOG_WARN("nccl", "rank %d/%d: %s", g->rank, g->size, msg);
  if (g->boot != NULL && !g->boot->dead) uvccl__nccl_boot_fail(g, UVCCL_EABORTED, "%s", msg);
  uvccl__nccl_fail_all_works(g, UVCCL_EABORTED, msg);
  if (g->client == NULL) return;
  /* The device thread stops polling our ops; the abort itself runs
   * there, after anything it is issuing now, never on this loop. */
  uvccl__gpu_client_fail_all(g->client, UVCCL_EABORTED, msg);
  op = uvccl__nccl_op_new(g, NOP_ABORT, "ncclCommAbort");
  if (op == NULL || uvccl__nccl_op_submit(g, op) != 0) {
    LOG_ERROR("nccl", "rank %d/%d: could not queue ncclCommAbort", g->rank,
              g->size);
    uvccl__nccl_op_free(op);
  }
}

/* ---- queries and settings ------------------------------------------------------------ */

int uvccl__nccl_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f) {
  const nccl_group_t *g = pg ? pg->impl_ : NULL;
  if (g == NULL || f == NULL) return UV_EINVAL;
  memset(f, 0, sizeof(*f));
  f->rank = f->global_rank = f->reporter = f->host = -1;
  if (!g->broken && !g->aborted && !g->failed) return 0;
  /* NCCL reports that a peer failed, never which: the culprit is
   * unknown here. */
  f->cause = g->aborted ? UVCCL_FAIL_ABORTED : UVCCL_FAIL_RESET;
  f->err = g->aborted ? UVCCL_EABORTED : UVCCL_ENCCL;
  snprintf(f->msg, sizeof(f->msg), "%s", g->fail_msg[0] ? g->fail_msg
                                        : "the NCCL group failed");
  return 1;
}

int uvccl__nccl_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max) {
  (void)pg;
  (void)ranks;
  (void)max;
  return 0; /* NCCL does not say who */
}

int uvccl__nccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank) {
  const nccl_group_t *g = pg ? pg->impl_ : NULL;
  if (g == NULL || group_rank < 0 || group_rank >= g->size) return -1;
  if (g->world) return group_rank;
  return g->ranks ? g->ranks[group_rank] : -1;
}

int uvccl__nccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank) {
  const nccl_group_t *g = pg ? pg->impl_ : NULL;
  int i;
  if (g == NULL || global_rank < 0) return -1;
  if (g->world) return global_rank < g->size ? global_rank : -1;
  if (g->ranks == NULL) return -1;
  for (i = 0; i < g->size; i++)
    if (g->ranks[i] == global_rank) return i;
  return -1;
}

const char *uvccl__nccl_pg_peer_address(const uvccl_pg_t *pg, int group_rank) {
  const nccl_group_t *g = pg ? pg->impl_ : NULL;
  if (g == NULL || group_rank != g->rank) return "?";
  return g->addr; /* peers' devices are NCCL's business */
}

void uvccl__nccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms) {
  nccl_group_t *g = pg ? pg->impl_ : NULL;
  if (g) g->timeout_ms = timeout_ms ? timeout_ms : UVCCL_PG_DEFAULT_TIMEOUT_MS;
}

void uvccl__nccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us) {
  (void)pg;
  (void)us; /* the device thread polls adaptively; nothing to set */
}

int uvccl__nccl_pg_premul_sum(uvccl_pg_t *pg, double factor,
                              uvccl_redop_t *op) {
  nccl_group_t *g = pg ? pg->impl_ : NULL;
  double *p;
  if (g == NULL || op == NULL) return UV_EINVAL;
  p = uvccl__realloc(g->premul, (size_t)(g->npremul + 1) * sizeof(double));
  if (p == NULL) return UV_ENOMEM;
  g->premul = p;
  p[g->npremul] = factor;
  *op = (uvccl_redop_t)(UVCCL__NCCL_PREMUL_BASE + g->npremul++);
  return 0;
}

void uvccl__nccl_pg_times(const uvccl_pg_t *pg, uint64_t times[4]) {
  const nccl_group_t *g = pg ? pg->impl_ : NULL;
  memcpy(times, g ? g->last_times : (const uint64_t[4]){0, 0, 0, 0},
         4 * sizeof(uint64_t));
}
