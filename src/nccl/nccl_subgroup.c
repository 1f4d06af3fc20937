/* Subgroups of NCCL groups: new_group (synchronous, usable at once) and
 * split, both made by ncclCommSplit of the parent on the device thread,
 * queued in program order behind the parent's earlier ops so every rank
 * splits in the same order; the child's ops are held until it exists. */
#include "nccl_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- subgroups -------------------------------------------------------------------- */

nccl_group_t *uvccl__nccl_child_new(nccl_group_t *p, uvccl_pg_t *pg, int rank,
                                    int size, char *err, size_t errlen) {
  nccl_group_t *c = uvccl__nccl_group_new(p->loop, pg, rank, size, p->device);
  if (c == NULL) return NULL;
  c->timeout_ms = p->timeout_ms;
  c->creating = 1; /* the split */
  /* the flight recorder's: every rank of the parent counts the subgroups
   * it takes part in making (member or not) in the same order, so the
   * members number them alike */
  c->trace_size = p->trace_size;
  c->fp_check = p->fp_check;
  c->trace_gid = ((p->trace_gid ? p->trace_gid : 1) * 31u + p->nchildren) &
                 0x7fffffffu;
  snprintf(c->trace_name, sizeof(c->trace_name), "split");
  if (uvccl__nccl_group_attach(c, err, errlen) != 0) {
    uvccl__nccl_group_discard(c);
    return NULL;
  }
  return c;
}

/* done() of a split, on the parent's client. */
void uvccl__nccl_split_done(nccl_op_t *op) {
  nccl_group_t *c = op->target;
  int st = op->gop.status;
  uvccl_work_t *w = op->work;
  char m[UVCCL_WORK_MSG_LEN];
  snprintf(m, sizeof(m), "split of group rank %d/%d (cuda:%d): %.140s",
           op->g->rank, op->g->size, op->g->device,
           op->gop.msg[0] ? op->gop.msg : uvccl_strerror(st));
  if (c != NULL) {
    c->creating--;
    if (st == 0) {
      if (c->rank < 0) { /* pg_split learns its place now */
        c->rank = op->split_rank;
        c->size = op->split_size;
        if (c->pg != NULL) {
          c->pg->rank = c->rank;
          c->pg->size = c->size;
        }
      }
      c->ready = 1;
      uvccl__nccl_flush_held(c, 0, NULL);
    } else {
      c->failed = 1;
      LOG_ERROR("nccl", "%s", m);
      uvccl__nccl_flush_held(c, st, m);
    }
    uvccl__nccl_destroy_progress(c);
  }
  if (w != NULL) {
    op->work = NULL;
    w->owner_ = NULL;
    if (st == 0 && c == NULL)
      uvccl__work_fail(w, UVCCL_ENOTMEMBER, "split: not a member (color < 0)");
    else if (st == 0)
      uvccl__work_complete(w, 0);
    else
      uvccl__work_fail(w, st, "%s", m);
  }
}

static int queue_split(nccl_group_t *p, nccl_group_t *c, int color, int key,
                       uvccl_work_t *work, uvccl_work_cb cb) {
  nccl_op_t *op = uvccl__nccl_op_new(p, NOP_SPLIT, "split");
  int rc;
  if (op == NULL) return UV_ENOMEM;
  op->done_fn = uvccl__nccl_split_done;
  op->target = c;
  op->color = color;
  op->key = key;
  if (work != NULL) {
    rc = uvccl__work_start(work, p->loop, "split", &uvccl__nccl_work_ops, op, 0, cb);
    if (rc != 0) {
      uvccl__nccl_op_free(op);
      return rc;
    }
    op->work = work;
  }
  /* In program order on the parent's queue: every rank splits in the same
   * order, and the child's ops wait (held) until it exists. */
  if (!p->ready) {
    uvccl__nccl_op_hold(p, op);
    return 0;
  }
  rc = uvccl__nccl_op_submit(p, op);
  if (rc != 0) {
    op->target = NULL;
    if (op->work) uvccl__nccl_fail_work(op, rc, "split: submitting to the GPU thread");
    uvccl__nccl_op_free(op);
    if (c != NULL) {
      c->creating--;
      c->failed = 1;
    }
    return work != NULL ? 0 : rc;
  }
  return 0;
}

int uvccl__nccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg,
                             const int *ranks, int nranks, const char *tag) {
  nccl_group_t *p, *c = NULL;
  tagged_t *t;
  char err[256];
  int i, j, me = -1, rc;
  if (parent == NULL || pg == NULL || parent->impl_ == NULL || nranks <= 0 ||
      ranks == NULL)
    return UV_EINVAL;
  p = parent->impl_;
  if (p->destroying || p->failed || p->broken || p->aborted) return UV_EINVAL;
  for (i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= p->size) {
      LOG_ERROR("nccl", "new_group: rank %d is not in the parent (size %d)",
                ranks[i], p->size);
      return UV_EINVAL;
    }
    for (j = 0; j < i; j++)
      if (ranks[j] == ranks[i]) return UV_EINVAL;
    if (ranks[i] == p->rank) me = i;
  }
  if (tag != NULL) {
    for (t = p->tagged; t != NULL; t = t->next) {
      if (t->gone || strcmp(t->tag, tag) != 0 || t->n != nranks ||
          memcmp(t->ranks, ranks, (size_t)nranks * sizeof(int)) != 0)
        continue;
      /* found: no split (every rank remembers the tag, members or not) */
      pg->loop = p->loop;
      pg->size = nranks;
      if (t->g == NULL || t->g->destroying) {
        pg->rank = -1;
        pg->impl_ = NULL;
        return t->g == NULL ? UVCCL_ENOTMEMBER : UV_EINVAL;
      }
      t->g->handles++;
      pg->rank = t->g->rank;
      pg->impl_ = t->g;
      pg->backend_ = UVCCL_BACKEND_NCCL;
      return 0;
    }
  }
  p->nchildren++;
  if (me >= 0) {
    c = uvccl__nccl_child_new(p, pg, me, nranks, err, sizeof(err));
    if (c == NULL) {
      LOG_ERROR("nccl", "new_group: %s", err);
      return UV_ENOMEM;
    }
    snprintf(c->trace_name, sizeof(c->trace_name), "%s",
             tag != NULL ? tag : "new_group");
    c->ranks = uvccl__malloc((size_t)nranks * sizeof(int));
    if (c->ranks == NULL) {
      c->creating = 0;
      c->destroying = 1;
      uvccl__nccl_destroy_progress(c);
      return UV_ENOMEM;
    }
    for (i = 0; i < nranks; i++)
      c->ranks[i] = p->world ? ranks[i] : p->ranks ? p->ranks[ranks[i]] : -1;
  }
  rc = queue_split(p, c, me >= 0 ? 0 : UVCCL__NCCL_SPLIT_NOCOLOR, me, NULL,
                   NULL);
  if (rc != 0) {
    if (c != NULL) {
      c->creating = 0;
      c->destroying = 1;
      uvccl__nccl_destroy_progress(c);
    }
    return rc;
  }
  if (tag != NULL) {
    t = uvccl__calloc(1, sizeof(*t));
    if (t != NULL) {
      t->tag = uvccl__strdup(tag);
      t->ranks = uvccl__malloc((size_t)nranks * sizeof(int));
      if (t->ranks) memcpy(t->ranks, ranks, (size_t)nranks * sizeof(int));
      t->n = nranks;
      t->g = c;
      if (c != NULL) c->tag_entry = t;
      t->next = p->tagged;
      p->tagged = t;
    }
  }
  pg->loop = p->loop;
  pg->size = nranks;
  if (c == NULL) {
    pg->rank = -1;
    pg->impl_ = NULL;
    return UVCCL_ENOTMEMBER;
  }
  pg->rank = me;
  pg->impl_ = c;
  pg->backend_ = UVCCL_BACKEND_NCCL;
  return 0;
}

int uvccl__nccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color,
                         int key, uvccl_work_t *work, uvccl_work_cb cb) {
  nccl_group_t *p, *c = NULL;
  char err[256];
  int rc;
  if (pg == NULL) return UV_EINVAL;
  rc = uvccl__nccl_group_check(parent, work, &p);
  if (rc != 0) return rc;
  p->nchildren++;
  if (color >= 0) {
    c = uvccl__nccl_child_new(p, pg, -1, 0, err, sizeof(err));
    if (c == NULL) {
      LOG_ERROR("nccl", "split: %s", err);
      return UV_ENOMEM;
    }
  }
  /* NCCL groups the ranks by color and orders them by key itself, so no
   * host allgather is needed; the members' global ranks stay unknown. */
  rc = queue_split(p, c, color >= 0 ? color : UVCCL__NCCL_SPLIT_NOCOLOR, key,
                   work, cb);
  if (rc != 0) {
    if (c != NULL) {
      c->creating = 0;
      c->destroying = 1;
      uvccl__nccl_destroy_progress(c);
    }
    return rc;
  }
  pg->loop = p->loop;
  pg->rank = -1;
  pg->size = 0;
  pg->impl_ = c;
  if (c != NULL) pg->backend_ = UVCCL_BACKEND_NCCL;
  return 0;
}
