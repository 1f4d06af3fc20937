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
 * a link itself or reads that no.
 *
 * Parts are matched by number, so each also says what it is (box_desc):
 * a part unlike this rank's fails the collective on every rank with
 * UVCCL_EMISMATCH, never reduces in. A rank that abandons a box collective
 * (its call timed out or was cancelled) leaves its number behind: posted,
 * the others finish without it; not yet posted, a part saying "gone" goes
 * out in its turn, and each rank that reads it fails that collective.
 * Either way the numbers go on in step, and a failed number is passed
 * without reading the others' parts: a rank posts t + 2 (into the same
 * box) only after every rank posted t + 1, so none still reads its t. */
#include "samehost.h"

#include <stdio.h>
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
  sn->box_n = net->size;
  return 1;
}

static int box_per_peer(const sop_t *op) {
  return op->tag == UVCCL__BOX_REDUCE_SCATTER || op->tag == UVCCL__BOX_ALLTOALL;
}

static int box_reduces(uint32_t kind) {
  return kind == UVCCL__BOX_REDUCE || kind == UVCCL__BOX_REDUCE_SCATTER;
}

#define BOX_GONE UINT64_MAX /* the part of a collective its rank abandoned */

/* What op's part is: its length (at most UVCCL__SHM_BOX_MAX), kind, and
 * where they matter the element type and reduction, or the root. */
static uint64_t box_desc(const sop_t *op) {
  const sched_t *s = op->s;
  uint64_t d = (uint64_t)op->len | (uint64_t)(op->tag & 0xff) << 32;
  if (box_reduces(op->tag))
    d |= (uint64_t)(s->dtype & 0xff) << 40 | (uint64_t)(s->op & 0xff) << 48;
  if (op->tag == UVCCL__BOX_PICK) d |= (uint64_t)(op->source & 0xff) << 56;
  return d;
}

static const char *const box_kind_name[] = {
    "allreduce or barrier", "allgather", "broadcast", "reduce_scatter",
    "alltoall"};

static int box_desc_text(char *buf, size_t len, uint64_t d) {
  uint32_t kind = (uint32_t)(d >> 32) & 0xff;
  const char *name = kind < 5 ? box_kind_name[kind] : "unknown collective";
  if (box_reduces(kind))
    return snprintf(buf, len, "%s of %u bytes (%s, %s)", name,
                    (unsigned)(d & 0xffffffffu),
                    uvccl_dtype_name((uvccl_dtype_t)((d >> 40) & 0xff)),
                    uvccl_redop_name((uvccl_redop_t)((d >> 48) & 0xff)));
  if (kind == UVCCL__BOX_PICK)
    return snprintf(buf, len, "%s of %u bytes from rank %u", name,
                    (unsigned)(d & 0xffffffffu), (unsigned)(d >> 56));
  return snprintf(buf, len, "%s of %u bytes", name,
                  (unsigned)(d & 0xffffffffu));
}

/* Why rank r's part (desc theirs) does not go with op. */
static void box_misfit(net_t *net, sop_t *op, int r, uint64_t theirs,
                       char *why, size_t len) {
  group_t *g = op->s->g;
  char a[80], b[80], msg[320];
  size_t n;
  if (theirs == BOX_GONE) {
    snprintf(why, len, "%s: rank %d abandoned its part of box collective "
             "%llu (its call timed out or was cancelled)", op->s->name,
             g->inv[r], (unsigned long long)op->slot_t);
    return;
  }
  box_desc_text(a, sizeof(a), theirs);
  box_desc_text(b, sizeof(b), box_desc(op));
  /* whole here, then as much as why holds (cut short by hand: the
   * compiler warns of a snprintf into why that might cut) */
  snprintf(msg, sizeof(msg), "%s: box collective %llu: rank %d's part is "
           "%s, this rank's %s (mismatched calls?)", op->s->name,
           (unsigned long long)op->slot_t, g->inv[r], a, b);
  if (len == 0) return;
  n = strlen(msg);
  if (n >= len) n = len - 1;
  memcpy(why, msg, n);
  why[n] = '\0';
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
  for (r = 0; r < net->shm->box_n; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank || p == NULL || !p->shm_tx || p->shm_out == NULL ||
        p->shm_out->ring == NULL)
      continue; /* gone: the group fails for it */
    uvccl__shm_box_put(p->shm_out, op->slot_t, box_desc(op),
                       per_peer ? op->src + (size_t)r * len : op->src, len);
  }
  sn->box_posted = 1;
}

/* The part of number t, abandoned before it was posted: "gone". */
static void box_post_gone(net_t *net, uint64_t t) {
  int r;
  for (r = 0; r < net->shm->box_n; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank || p == NULL || !p->shm_tx || p->shm_out == NULL ||
        p->shm_out->ring == NULL)
      continue;
    uvccl__shm_box_put(p->shm_out, t, BOX_GONE, NULL, 0);
  }
}

/* 1 if t was abandoned before its turn (then no longer listed). */
static int box_gone_take(shm_net_t *sn, uint64_t t) {
  int i;
  for (i = 0; i < sn->nbox_gone; i++)
    if (sn->box_gone[i] == t) {
      sn->box_gone[i] = sn->box_gone[--sn->nbox_gone];
      return 1;
    }
  return 0;
}

static int box_gone_has(const shm_net_t *sn, uint64_t t) {
  int i;
  for (i = 0; i < sn->nbox_gone; i++)
    if (sn->box_gone[i] == t) return 1;
  return 0;
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
    for (r = 0; r < net->shm->box_n; r++)
      if (len > 0) memcpy(op->buf + (size_t)r * len, parts[r], len);
    return;
  case UVCCL__BOX_PICK:
    if (net->rank != op->source && len > 0)
      memcpy(op->buf, parts[op->source], len);
    return;
  default:
    /* rank order, left to right: the same bits everywhere */
    if (n > 0 && net->shm->box_n >= 2 &&
        !((s->dtype == UVCCL_FLOAT16 || s->dtype == UVCCL_BFLOAT16) &&
          box_fold_half(s, op->buf, parts, net->shm->box_n, n))) {
      s->red3(op->buf, parts[0], parts[1], n);
      for (r = 2; r < net->shm->box_n; r++) s->red(op->buf, parts[r], n);
    }
  }
}

/* Every peer's part of op (0: not all here; -1: a peer failed, or its
 * box lies; -2: a part that does not go with op, why says so). parts[r]
 * points at rank r's part. */
static int box_parts(net_t *net, sop_t *op, const char **parts, char *why,
                     size_t whylen) {
  uint64_t mine = box_desc(op), theirs;
  int r, rc, all = 1;
  for (r = 0; r < net->shm->box_n; r++) {
    peer_t *p = net->peers[r];
    if (r == net->rank) {
      parts[r] = net->shm->box_own;
      continue;
    }
    if (p == NULL || p->shm_in.ring == NULL) return 0;
    rc = uvccl__shm_box_get(&p->shm_in, op->slot_t, &parts[r], &theirs);
    if (rc < 0) {
      if (p->state == PEER_UP)
        uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "its collective box in "
                             "shared memory holds an impossible number");
      return -1;
    }
    if (rc == 0) {
      all = 0;
      continue;
    }
    if (theirs != mine) {
      if (why != NULL) box_misfit(net, op, r, theirs, why, whylen);
      return -2;
    }
  }
  return all;
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
  while (!net->closing) {
    char why[UVCCL_WORK_MSG_LEN];
    int rc;
    if (!sn->box_posted && box_gone_take(sn, sn->box_next)) {
      box_post_gone(net, sn->box_next++);
      continue;
    }
    if ((op = box_due(sn)) == NULL) break;
    if (!sn->box_posted) box_post(net, op);
    rc = box_parts(net, op, parts, why, sizeof(why));
    if (rc == -2) {
      /* passed without the others' parts: see the top of the file */
      sop_list_remove(&sn->boxq, op);
      sn->box_next++;
      sn->box_posted = 0;
      moved = 1;
      net->up->op_fail(op->s, UVCCL_EMISMATCH, why);
      continue;
    }
    if (rc <= 0) break;
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
  sop_t *op;
  if (!sn->box_posted && box_gone_has(sn, sn->box_next)) return 1;
  if ((op = box_due(sn)) == NULL) return 0;
  if (!sn->box_posted) return 1;
  return box_parts(net, op, parts, NULL, 0) != 0;
}

void uvccl__shm_box_start(net_t *net, sop_t *op) {
  sop_list_push(&net->shm->boxq, op);
  uvccl__shm_box_pump(net);
}

/* op abandoned (its call failed, timed out or was cancelled): its number
 * is passed in turn, its part posted or said gone (the top of the file). */
void uvccl__shm_box_remove(net_t *net, sop_t *op) {
  shm_net_t *sn = net->shm;
  if (sn == NULL || !sop_list_remove(&sn->boxq, op)) return;
  if (op->slot_t == sn->box_next && sn->box_posted) {
    sn->box_next++;
    sn->box_posted = 0;
    return;
  }
  if (op->slot_t < sn->box_next) return;
  if (sn->nbox_gone == sn->box_gone_cap) {
    int cap = sn->box_gone_cap ? 2 * sn->box_gone_cap : 8;
    uint64_t *v = uvccl__realloc(sn->box_gone, (size_t)cap * sizeof(*v));
    if (v == NULL) {
      /* its turn never comes: the others' calls time out, as before */
      LOG_WARN("coll", "rank %d: box collective %llu abandoned, out of "
               "memory to note it", net->rank,
               (unsigned long long)op->slot_t);
      return;
    }
    sn->box_gone = v;
    sn->box_gone_cap = cap;
  }
  sn->box_gone[sn->nbox_gone++] = op->slot_t;
}

/* 1 while op still needs world rank r's part. */
int uvccl__shm_box_needs(net_t *net, sop_t *op, int r) {
  const char *data;
  uint64_t desc;
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (net->shm == NULL || r >= net->shm->box_n) return 0; /* not of the box
                                                             world */
  if (r == net->rank || p == NULL || p->shm_in.ring == NULL) return 1;
  return uvccl__shm_box_get(&p->shm_in, op->slot_t, &data, &desc) != 1;
}
