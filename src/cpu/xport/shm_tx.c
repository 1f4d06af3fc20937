/* Shared memory, sending: a frame into the receiver's ring in steps,
 * a large one offered for a single copy (process_vm_readv) instead, and
 * the reductions a receiver runs out of a sender's memory. */
#include "samehost.h"

/* ---- sending ---------------------------------------------------------------- */

static const char zeros[8];

/* Copies more of op's frame into the ring: 1 when all of it is in, 0
 * when the ring is full or the turn spent (after a first step), -1 when
 * the ring is corrupted. A sent op counts its frame's bytes in got; a
 * detached one (s == NULL) holds the rest of its frame as raw bytes in
 * buf. */
static int tx_fill(uvccl__shm_out_t *o, sop_t *op, uvccl__turn_t *turn) {
  uint64_t total = op->s == NULL
                       ? op->len
                       : UVCCL__FRAME_HDR + op->len + uvccl__shm_pad8(op->len);
  uint64_t since = 0, start = op->got;
  int64_t space = 0;
  while (op->got < total) {
    const char *src;
    uint64_t n;
    if (op->got != start && uvccl__turn_spent(turn)) break;
    if (space == 0) {
      space = uvccl__shm_space(o);
      if (space < 0) return -1;
      if (space == 0) break;
    }
    if (op->s == NULL) {
      src = op->buf + op->got;
      n = total - op->got;
    } else if (op->got < UVCCL__FRAME_HDR) {
      src = (const char *)op->hdr + op->got;
      n = UVCCL__FRAME_HDR - op->got;
    } else if (op->got < UVCCL__FRAME_HDR + op->len) {
      src = op->buf + (op->got - UVCCL__FRAME_HDR);
      n = UVCCL__FRAME_HDR + op->len - op->got;
    } else {
      src = zeros;
      n = total - op->got;
    }
    if (n > (uint64_t)space) n = (uint64_t)space;
    if (n > SHM_PUBLISH_EVERY) n = SHM_PUBLISH_EVERY;
    n = uvccl__turn_piece(turn, (size_t)n, SHM_STEP);
    uvccl__shm_put(o, src, (size_t)n);
    uvccl__turn_charge(turn, (size_t)n);
    op->got += n;
    space -= (int64_t)n;
    since += n;
    /* Large frames: the consumer starts on the first part while this
     * copies the next. */
    if (since >= SHM_PUBLISH_EVERY) {
      uvccl__shm_publish(o);
      since = 0;
    }
  }
  uvccl__shm_publish(o);
  return op->got == total;
}


void uvccl__shm_reduce_part(void *ctx, size_t off, size_t n) {
  reduce_job_t *j = ctx;
  j->net->up->reduce_in(j->op, j->at + off, j->in + off, n);
}

void uvccl__shm_ring_corrupt(peer_t *p) {
  uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO, "its shared-memory ring "
                       "holds impossible indices (memory corrupted)");
}

/* A large frame goes as its header and a descriptor: 2 when they are in
 * the ring (the receiver now reads the payload; the send completes at its
 * acknowledgement), 0 when the ring has no room for them yet. */
static int tx_cma(peer_t *p, sop_t *op) {
  unsigned char d[UVCCL__FRAME_HDR + UVCCL__CMA_DESC];
  uint64_t addr = (uint64_t)(uintptr_t)op->buf, seq = p->cma_seq + 1;
  int64_t space = uvccl__shm_space(p->shm_out);
  if (space < 0) return -1;
  if (space < (int64_t)sizeof(d)) return 0;
  memcpy(d, op->hdr, UVCCL__FRAME_HDR);
  d[1] |= UVCCL__FRAME_F_CMA; /* frame_hdr_t.flags */
  memcpy(d + UVCCL__FRAME_HDR, &addr, 8);
  memcpy(d + UVCCL__FRAME_HDR + 8, &seq, 8);
  p->cma_seq = seq;
  p->cma_op = op;
  p->cma_wait = 1;
  op->writing = 1;
  uvccl__shm_put(p->shm_out, d, sizeof(d));
  uvccl__shm_publish(p->shm_out);
  return 2;
}

/* UVCCL_SHM_CMA=auto, the first time a frame could go as a single copy:
 * whether to. The ring costs two copies that overlap (the sender fills
 * while the receiver empties), so it moves data at about memcpy's speed,
 * and single copy pays only where process_vm_readv comes close to that
 * (CMA_AUTO_RATIO). That holds with more ranks than CPUs too: there, with
 * process_vm_readv well below memcpy, single copy was slower in most
 * cells of allreduce, allgather, reduce_scatter and broadcast
 * (bench/RESULTS.md), against the guess that one copy instead of two
 * pays from half memcpy's speed. Measured once a process,
 * on a thread of its own (about a millisecond the loop does not wait
 * for: frames take the ring meanwhile), decided once a net when it is
 * in. */
#define CMA_AUTO_RATIO 0.8
enum { CMA_UNMEASURED, CMA_MEASURING, CMA_MEASURED };
static _Atomic int cma_state;
static int cma_refused;
static double cma_gbps, cpy_gbps;

static void *cma_measure(void *arg) {
  (void)arg;
  cma_refused = uvccl__shm_cma_speed(&cma_gbps, &cpy_gbps);
  atomic_store_explicit(&cma_state, CMA_MEASURED, memory_order_release);
  return NULL;
}

/* 1 once the figures are in; the first call starts their measurement. */
static int cma_measured(void) {
  int st = atomic_load_explicit(&cma_state, memory_order_acquire);
  if (st == CMA_UNMEASURED &&
      atomic_compare_exchange_strong(&cma_state, &st, CMA_MEASURING)) {
    pthread_t t;
    pthread_attr_t a;
    sigset_t all, old;
    int rc;
    /* every signal blocked in it: the host's signals stay the host's */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&t, &a, cma_measure, NULL);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
      cma_refused = -rc;
      atomic_store_explicit(&cma_state, CMA_MEASURED, memory_order_release);
    }
    return 0;
  }
  return st == CMA_MEASURED;
}

static void cma_auto_decide(net_t *net) {
  shm_net_t *sn = net->shm;
  double ratio;
  int over;
  sn->cma_auto = 0;
  if (cma_refused != 0) {
    sn->cma_min = 0;
    LOG_INFO("coll", "rank %d: single copy off: process_vm_readv on itself "
             "failed (%s)", net->rank, uv_strerror(cma_refused));
    return;
  }
  over = uvccl__net_oversubscribed(net);
  ratio = cma_gbps / cpy_gbps;
  if (ratio < CMA_AUTO_RATIO) sn->cma_min = 0;
  LOG_INFO("coll", "rank %d: single copy %s: process_vm_readv copies %.2f "
           "GB/s, memcpy %.2f (ratio %.2f; on from %.2f, %s)", net->rank,
           sn->cma_min ? "on" : "off", cma_gbps, cpy_gbps, ratio,
           CMA_AUTO_RATIO,
           over ? "more ranks than CPUs" : "a CPU a rank");
}

/* 1 when op goes to p as a single copy. */
static int use_cma(peer_t *p, const sop_t *op) {
  shm_net_t *sn = p->net->shm;
  if (!p->cma_tx || sn->cma_min == 0 || op->s == NULL ||
      op->len < sn->cma_min || op->got != 0)
    return 0;
  if (sn->cma_auto) {
    if (!cma_measured()) return 0; /* the ring until the figures are in */
    cma_auto_decide(p->net);
    return sn->cma_min != 0 && op->len >= sn->cma_min;
  }
  return 1;
}

/* The next frame into the ring: 1 all in (the send is done), 2 in as a
 * descriptor (done at its acknowledgement), 0 not (all) in yet, -1 a
 * corrupted ring. */
static int tx_frame(peer_t *p, sop_t *op) {
  if (use_cma(p, op)) return tx_cma(p, op);
  return tx_fill(p->shm_out, op, &p->net->turn);
}

int uvccl__shm_send(peer_t *p, sop_t *op) {
  op->got = 0;
  /* (the turn spent: queued, and pumped in a later one) */
  if (p->shm_sendq.head == NULL && !p->cma_wait &&
      !uvccl__turn_spent(&p->net->turn)) {
    int r = tx_frame(p, op);
    if (r < 0) {
      uvccl__shm_ring_corrupt(p);
      return UVCCL_EPEER;
    }
    if (r == 1) return 1;
    if (r == 2) return 0;
  }
  op->writing = 1;
  sop_list_push(&p->shm_sendq, op);
  p->net->shm->nqueued++;
  return 0;
}

/* The receiver finished the transfer: its send completes (or, orphaned,
 * the copy goes), and later frames may go. 1 when it did. */
int uvccl__shm_cma_acked(peer_t *p) {
  sop_t *op = p->cma_op;
  uint64_t acked;
  if (!p->cma_wait) return 0;
  acked = atomic_load_explicit(&p->shm_out->ring->cma_acked,
                               memory_order_acquire);
  if (acked != p->cma_seq) return 0;
  p->cma_wait = 0;
  p->cma_op = NULL;
  uvccl__free(p->cma_ghost);
  p->cma_ghost = NULL;
  if (op != NULL) {
    op->writing = 0;
    p->net->up->op_done(op);
  }
  return 1;
}

/* Moves what is queued on the rings along; 1 when something moved. */
int uvccl__shm_pump(peer_t *p) {
  net_t *net = p->net;
  sop_t *op;
  int moved = 0;
  while ((op = p->shm_sendq.head) != NULL && p->shm_tx && !p->cma_wait) {
    uint64_t before = op->got;
    int r;
    /* a step a turn at least; the rest in later turns (the queue keeps
     * shm_ready saying so) */
    if (moved && uvccl__turn_spent(&net->turn)) return moved;
    r = tx_frame(p, op);
    if (op->got != before) moved = 1;
    if (r < 0) {
      uvccl__shm_ring_corrupt(p);
      return 1;
    }
    if (r == 0) {
      if (uvccl__turn_spent(&net->turn)) return moved;
      if (uvccl__shm_want_space(p->shm_out)) continue;
      return moved;
    }
    sop_list_remove(&p->shm_sendq, op);
    net->shm->nqueued--;
    moved = 1;
    if (r == 2) return 1; /* read by the receiver now; acknowledged later */
    if (op->s == NULL) {
      uvccl__free(op);
      continue;
    }
    op->writing = 0;
    net->up->op_done(op);
    if (p->state != PEER_UP) return 1;
  }
  return moved;
}

/* The send being read is taken back (its work failed): the receiver
 * reads a copy from now on. The copy is published, then the transfer
 * revoked; a read under way (the receiver announced it before looking at
 * the revocation) still reads the caller's buffer, so this waits for it
 * to end: one system call of at most CMA_STEP bytes, unless the receiver
 * was stopped in between; then the buffer cannot be given back safely,
 * and the caller fails that peer. */
static int cma_orphan(peer_t *p, sop_t *op) {
  uvccl__shm_ring_hdr_t *ring = p->shm_out->ring;
  uint64_t deadline;
  char *copy = uvccl__malloc(op->len);
  if (copy == NULL) return UV_ENOMEM;
  memcpy(copy, op->buf, op->len);
  atomic_store_explicit(&ring->cma_redirect, (uint64_t)(uintptr_t)copy,
                        memory_order_relaxed);
  atomic_store_explicit(&ring->cma_revoked, p->cma_seq, memory_order_seq_cst);
  deadline = uv_hrtime() + (uint64_t)CMA_REVOKE_MS * 1000000;
  while (atomic_load_explicit(&ring->cma_reading, memory_order_seq_cst) ==
         p->cma_seq) {
    if (uv_hrtime() > deadline) {
      /* Kept: it may still read it. Freed with the peer. */
      p->cma_ghost = copy;
      return UV_EBUSY;
    }
  }
  p->cma_ghost = copy;
  p->cma_op = NULL;
  op->writing = 0;
  return 0;
}

int uvccl__shm_orphan(peer_t *p, sop_t *op) {
  uint64_t total = UVCCL__FRAME_HDR + op->len + uvccl__shm_pad8(op->len), left,
           at;
  sop_t *ghost;
  char *d;
  if (p->cma_op == op && p->cma_op != NULL) return cma_orphan(p, op);
  if (op->list != &p->shm_sendq) return UV_ENOENT;
  left = total - op->got;
  ghost = uvccl__malloc(sizeof(*ghost) + (size_t)left);
  if (ghost == NULL) return UV_ENOMEM;
  memset(ghost, 0, sizeof(*ghost));
  d = (char *)(ghost + 1);
  /* The rest of the frame, byte for byte from where the ring stopped. */
  for (at = op->got; at < total;) {
    uint64_t n;
    if (at < UVCCL__FRAME_HDR) {
      n = UVCCL__FRAME_HDR - at;
      memcpy(d, op->hdr + at, (size_t)n);
    } else if (at < UVCCL__FRAME_HDR + op->len) {
      n = UVCCL__FRAME_HDR + op->len - at;
      memcpy(d, op->buf + (at - UVCCL__FRAME_HDR), (size_t)n);
    } else {
      n = total - at;
      memset(d, 0, (size_t)n);
    }
    d += n;
    at += n;
  }
  ghost->type = SOP_NOP;
  ghost->buf = (char *)(ghost + 1);
  ghost->len = (size_t)left;
  /* in op's place in the queue */
  ghost->prev = op->prev;
  ghost->next = op->next;
  ghost->list = op->list;
  if (op->prev) op->prev->next = ghost;
  else p->shm_sendq.head = ghost;
  if (op->next) op->next->prev = ghost;
  else p->shm_sendq.tail = ghost;
  op->next = op->prev = NULL;
  op->list = NULL;
  op->writing = 0;
  return 0;
}
