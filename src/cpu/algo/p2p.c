/* send, recv (with any source) and batched point-to-point calls. */
#include "algo.h"

/* ---- point to point ------------------------------------------------------ */

static int p2p_finish(sched_t *s) {
  group_t *g = s->g;
  uvccl_p2p_op_t *ops = s->user;
  uint32_t i;
  if (ops == NULL) {
    sop_t *op = &s->ops[0];
    if (op->type == SOP_RECV) {
      s->w->result = op->source >= 0 ? g->inv[op->source] : -1;
      s->w->value_len = op->len;
    }
    return 0;
  }
  for (i = 0; i < s->nops; i++) {
    sop_t *op = &s->ops[i];
    if (op->type != SOP_RECV) continue;
    ops[i].received = op->len;
    ops[i].source = op->source >= 0 ? g->inv[op->source] : -1;
  }
  return 0;
}

static int p2p_peer_ok(group_t *g, int peer, int any_ok) {
  if (peer == UVCCL_ANY_SOURCE) return any_ok ? 0 : UV_EINVAL;
  if (peer < 0 || peer >= g->size || peer == g->rank) return UV_EINVAL;
  return 0;
}

int uvccl__host_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                     size_t len, int dst, int tag, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = p2p_peer_ok(g, dst, 0)) != 0 || (len > 0 && buf == NULL))
    return rc ? rc : UV_EINVAL;
  s = uvccl__sched_new(g, "send", 1);
  if (s == NULL) return UV_ENOMEM;
  uvccl__sop_send(s, dst, (uint32_t)tag, buf, len);
  uvccl__sched_describe(s, -1, len, 0, -1);
  s->desc.peer = dst;
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
                     int src, int tag, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if ((rc = p2p_peer_ok(g, src, 1)) != 0 || (len > 0 && buf == NULL))
    return rc ? rc : UV_EINVAL;
  s = uvccl__sched_new(g, "recv", 1);
  if (s == NULL) return UV_ENOMEM;
  uvccl__sop_recv(s, src, (uint32_t)tag, buf, len);
  s->finish = p2p_finish;
  uvccl__sched_describe(s, -1, 0, len, -1);
  s->desc.peer = src;
  return uvccl__sched_start(s, work, cb);
}

int uvccl__host_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work,
                          uvccl_p2p_op_t *ops, size_t nops, uvccl_work_cb cb) {
  group_t *g;
  sched_t *s;
  size_t i;
  int rc = uvccl__pg_check(pg, work, &g);
  if (rc != 0) return rc;
  if (nops > 0 && ops == NULL) return UV_EINVAL;
  for (i = 0; i < nops; i++) {
    rc = p2p_peer_ok(g, ops[i].peer, !ops[i].is_send);
    if (rc != 0 || (ops[i].len > 0 && ops[i].buf == NULL)) return UV_EINVAL;
  }
  s = uvccl__sched_new(g, "p2p_batch", 1);
  if (s == NULL) return UV_ENOMEM;
  for (i = 0; i < nops; i++) {
    if (ops[i].is_send)
      uvccl__sop_send(s, ops[i].peer, (uint32_t)ops[i].tag, ops[i].buf,
                      ops[i].len);
    else
      uvccl__sop_recv(s, ops[i].peer, (uint32_t)ops[i].tag, ops[i].buf,
                      ops[i].len);
  }
  s->user = ops;
  s->finish = p2p_finish;
  {
    uint64_t in = 0, out = 0;
    for (i = 0; i < nops; i++) {
      if (ops[i].is_send) in += ops[i].len;
      else out += ops[i].len;
    }
    uvccl__sched_describe(s, -1, in, out, -1);
  }
  return uvccl__sched_start(s, work, cb);
}
