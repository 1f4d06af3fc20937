/* Small collectives through shared-memory boxes. A world whose every pair of
 * ranks is linked here (and at most UVCCL__SHM_BOX_WORLD ranks) takes its
 * small allreduces, broadcasts, allgathers, reduce-scatters, alltoalls and
 * barriers through boxes instead of messages: every rank writes its part
 * (reduce_scatter and alltoall: each peer's own block) into a box beside its
 * ring in each peer's inbox, then waits until every peer's part is in its
 * own inbox, and reduces all P parts in rank order (the same bits on every
 * rank) or places them (uvccl__box_kind_t). A broadcast's other ranks post
 * an empty part: every rank waits for every part, whatever the kind, which
 * the reuse below rests on. One round instead of log2(P), no frames to
 * match, and with ranks taking turns on a CPU, one turn each. Collective
 * number t uses box t % 2, so a rank posts t only after it finished t - 1
 * (which needs every rank's part of t - 1, posted after that rank read
 * t - 2's). Whether a world uses boxes is agreed without a message: each rank
 * says in its inbox header, before creation's store barrier, whether it
 * links every peer here (and allows boxes: UVCCL_SHM_BOXES=0 does not);
 * after the barrier each reads every peer's word, and boxes are on only if
 * all said yes. A rank missing a link says no, and every rank either misses
 * a link itself or reads that no. */
#include "samehost.h"

#include <string.h>

/* Before creation's store barrier: whether this rank takes boxes. */
void uvccl__shm_boxes_offer(net_t *net) {
  shm_net_t *sn = net->shm;
  int r, boxes, ok;
  uvccl__config_choice(UVCCL__CFG_SHM_BOXES, &boxes);
  ok = sn != NULL && net->size >= 2 && net->size <= UVCCL__SHM_BOX_WORLD &&
       !net->sparse && boxes;
  for (r = 0; ok && r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank) continue;
    if (p == NULL || !p->shm_tx || !p->shm_rx || p->shm_out == NULL ||
        p->shm_out->peer == NULL)
      ok = 0;
  }
  if (sn != NULL && sn->ib.hdr != NULL) uvccl__shm_set_boxes_ok(&sn->ib, ok);
}

/* After the barrier: 1 when every rank offered boxes. */
int uvccl__shm_boxes_agreed(net_t *net) {
  shm_net_t *sn = net->shm;
  int r;
  if (sn == NULL || sn->ib.hdr == NULL || !uvccl__shm_boxes_ok(sn->ib.hdr))
    return 0;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank) continue;
    if (p == NULL || p->shm_out == NULL || p->shm_out->peer == NULL ||
        !uvccl__shm_boxes_ok(p->shm_out->peer))
      return 0;
  }
  return 1;
}

static int box_per_peer(const sop_t *op) {
  return op->tag == UVCCL__BOX_REDUCE_SCATTER || op->tag == UVCCL__BOX_ALLTOALL;
}

/* Our part of op into every peer's box (and our own, kept here: the
 * caller's buffers may be written before the others' parts are in). A
 * broadcast's other ranks post no bytes, only the number: every rank
 * still waits for every part, which is what makes reusing box t % 2 for
 * t + 2 safe. */
static void box_post(net_t *net, sop_t *op) {
  shm_net_t *sn = net->shm;
  size_t len = op->len;
  int r, per_peer = box_per_peer(op);
  if (op->tag == UVCCL__BOX_PICK && net->rank != op->source) len = 0;
  if (len > 0 && op->tag != UVCCL__BOX_PICK)
    memcpy(sn->box_own, per_peer ? op->src + (size_t)net->rank * len : op->src,
           len);
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank || p == NULL || !p->shm_tx || p->shm_out == NULL ||
        p->shm_out->ring == NULL)
      continue; /* gone: the group fails for it */
    uvccl__shm_box_put(p->shm_out, op->slot_t,
                       per_peer ? op->src + (size_t)r * len : op->src, len);
  }
  sn->box_posted = 1;
}

static int box_fold_half(sched_t *s, char *buf, const char **parts, int np,
                         size_t n);

/* Every part is in: the result, the same bits on every rank. */
static void box_finish(net_t *net, sop_t *op, const char **parts) {
  sched_t *s = op->s;
  size_t es = s->esize ? s->esize : 1, n = op->len / es, len = op->len;
  int r;
  switch (op->tag) {
  case UVCCL__BOX_CONCAT:
  case UVCCL__BOX_ALLTOALL:
    for (r = 0; r < net->size; r++)
      if (len > 0) memcpy(op->buf + (size_t)r * len, parts[r], len);
    return;
  case UVCCL__BOX_PICK:
    if (net->rank != op->source && len > 0)
      memcpy(op->buf, parts[op->source], len);
    return;
  default:
    /* rank order, left to right: the same bits everywhere */
    if (n > 0 && net->size >= 2 &&
        !((s->dtype == UVCCL_FLOAT16 || s->dtype == UVCCL_BFLOAT16) &&
          box_fold_half(s, op->buf, parts, net->size, n))) {
      s->red3(op->buf, parts[0], parts[1], n);
      for (r = 2; r < net->size; r++) s->red(op->buf, parts[r], n);
    }
  }
}

/* Every peer's part of op (0: not all here; -1: a peer failed, or its
 * box lies). parts[r] points at rank r's part. */
static int box_parts(net_t *net, sop_t *op, const char **parts) {
  int r, rc;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank) {
      parts[r] = net->shm->box_own;
      continue;
    }
    if (p == NULL || p->shm_in.ring == NULL) return 0;
    rc = uvccl__shm_box_get(&p->shm_in, op->slot_t, &parts[r]);
    if (rc < 0) {
      if (p->state == PEER_UP)
        uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "its collective box in "
                             "shared memory holds an impossible number");
      return -1;
    }
    if (rc == 0) return 0;
  }
  return 1;
}

/* 16-bit floats are folded in float32 and rounded once at the end: as
 * exact as the inputs allow (a product of four bfloat16 rounded at every
 * step, as a tree of messages must, can miss by a unit). */
static int box_fold_half(sched_t *s, char *buf, const char **parts, int np,
                         size_t n) {
  float acc[UVCCL__SHM_BOX_MAX / 2], x[UVCCL__SHM_BOX_MAX / 2];
  uvccl__reduce_fn red = uvccl__reduce_get(UVCCL_FLOAT32, s->op);
  int bf = s->dtype == UVCCL_BFLOAT16, r;
  size_t i;
  if (red == NULL || n > UVCCL__SHM_BOX_MAX / 2) return 0;
  for (r = 0; r < np; r++) {
    const char *p = parts[r];
    float *dst = r == 0 ? acc : x;
    for (i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      dst[i] = bf ? uvccl__bf16_to_f32(h) : uvccl__f16_to_f32(h);
    }
    if (r > 0) red(acc, x, n);
  }
  for (i = 0; i < n; i++) {
    uint16_t h = bf ? uvccl__f32_to_bf16(acc[i]) : uvccl__f32_to_f16(acc[i]);
    memcpy(buf + 2 * i, &h, 2);
  }
  return 1;
}

/* The op whose turn it is (started here), if any. */
static sop_t *box_due(shm_net_t *sn) {
  sop_t *op;
  for (op = sn->boxq.head; op != NULL; op = op->next)
    if (op->slot_t == sn->box_next) return op;
  return NULL;
}

/* Posts the due op, and finishes it (and the next) once every part is
 * here; 1 when one finished. */
int uvccl__shm_box_pump(net_t *net) {
  shm_net_t *sn = net->shm;
  const char *parts[UVCCL__SHM_BOX_WORLD];
  int moved = 0;
  sop_t *op;
  if (sn->box_pumping) return 0;
  sn->box_pumping = 1;
  while (!net->closing && (op = box_due(sn)) != NULL) {
    if (!sn->box_posted) box_post(net, op);
    if (box_parts(net, op, parts) <= 0) break;
    box_finish(net, op, parts);
    sop_list_remove(&sn->boxq, op);
    sn->box_next++;
    sn->box_posted = 0;
    moved = 1;
    net->up->op_done(op);
  }
  sn->box_pumping = 0;
  return moved;
}

/* Ready: a box op is due and unposted, or every part of it is here. */
int uvccl__shm_box_ready(net_t *net) {
  shm_net_t *sn = net->shm;
  const char *parts[UVCCL__SHM_BOX_WORLD];
  sop_t *op = box_due(sn);
  if (op == NULL) return 0;
  if (!sn->box_posted) return 1;
  return box_parts(net, op, parts) != 0;
}

void uvccl__shm_box_start(net_t *net, sop_t *op) {
  sop_list_push(&net->shm->boxq, op);
  uvccl__shm_box_pump(net);
}

void uvccl__shm_box_remove(net_t *net, sop_t *op) {
  shm_net_t *sn = net->shm;
  if (sn != NULL) sop_list_remove(&sn->boxq, op);
}

/* 1 while op still needs world rank r's part. */
int uvccl__shm_box_needs(net_t *net, sop_t *op, int r) {
  const char *data;
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (r == net->rank || p == NULL || p->shm_in.ring == NULL) return 1;
  return uvccl__shm_box_get(&p->shm_in, op->slot_t, &data) != 1;
}
