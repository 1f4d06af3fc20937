/* Shared memory, receiving: a peer's ring read through the transport's
 * frame steps (uvccl__net_frame_begin/end), single copies pulled and
 * acknowledged. */
#include "samehost.h"

/* ---- receiving ----------------------------------------------------------- */

static void cma_fail(peer_t *p, int err) {
  char msg[160];
  p->cma_rx = 0;
  if (err == UV_ESRCH) {
    /* Its process is gone (its connection's end may not be read yet). */
    uvccl__net_peer_fail(p->net, p, UVCCL_EPEER, "its process exited or was "
                         "killed (gone while its memory was read)");
    return;
  }
  snprintf(msg, sizeof(msg), "reading a %llu-byte frame from its memory "
           "failed: %s (a bad descriptor)",
           (unsigned long long)p->srx.cur.len, uvccl_strerror(err));
  uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO, msg);
}

/* The transfer is read to the end: the sender hears it (its send
 * completes), and the frame is delivered. */
static int cma_done(peer_t *p) {
  p->cma_rx = 0;
  atomic_store_explicit(&p->shm_in.ring->cma_acked, p->cma_rx_seq,
                        memory_order_release);
  uvccl__shm_nudge(p->shm_out);
  if (p->srx.rstate == RS_DISCARD) {
    p->srx.rstate = RS_HDR;
    return 0;
  }
  return uvccl__net_frame_end(p, &p->srx);
}

/* One step of the frame being read from the sender's memory: the bytes
 * are announced (cma_reading) before the revocation is looked at, so a
 * sender taking its buffer back either is seen here or waits for this
 * read. Returns the bytes read, or -1 when the peer failed. */
static int64_t cma_step(peer_t *p) {
  uvccl__shm_ring_hdr_t *ring = p->shm_in.ring;
  rx_t *rx = &p->srx;
  uint64_t left = rx->cur.len - rx->cur_got, n = left, base = p->cma_rx_addr;
  char *dst = NULL;
  int rc = 0;
  if (n > CMA_STEP) n = CMA_STEP;
  switch (rx->rstate) {
  case RS_DIRECT: dst = rx->cur_op->buf + rx->cur_got; break;
  case RS_EARLY: dst = rx->cur_early->data + rx->cur_got; break;
  case RS_REDUCE:
    if (p->net->shm->scratch == NULL) {
      p->net->shm->scratch = uvccl__malloc(CMA_SCRATCH);
      if (p->net->shm->scratch == NULL) {
        uvccl__net_peer_fail(p->net, p, UV_ENOMEM, "out of memory reading "
                             "a frame");
        return -1;
      }
    }
    dst = p->net->shm->scratch;
    if (n > CMA_SCRATCH) n = CMA_SCRATCH; /* a multiple of every dtype */
    break;
  default: n = left; break; /* RS_DISCARD: nothing read */
  }
  if (dst != NULL) {
    atomic_store_explicit(&ring->cma_reading, p->cma_rx_seq,
                          memory_order_seq_cst);
    if (atomic_load_explicit(&ring->cma_revoked, memory_order_seq_cst) ==
        p->cma_rx_seq)
      base = atomic_load_explicit(&ring->cma_redirect, memory_order_relaxed);
    rc = uvccl__shm_cma_read(p->cma_pid, dst, base + rx->cur_got, (size_t)n);
    atomic_store_explicit(&ring->cma_reading, 0, memory_order_release);
    if (rc != 0) {
      cma_fail(p, rc);
      return -1;
    }
    if (rx->rstate == RS_REDUCE)
      p->net->up->reduce_in(rx->cur_op, (size_t)rx->cur_got, dst, (size_t)n);
  }
  rx->cur_got += n;
  if (rx->cur_got == rx->cur.len && cma_done(p) != 0) return -1;
  return (int64_t)n;
}

/* A frame header with the single-copy flag: its descriptor follows. 0 to
 * go on, 1 when the descriptor is not all in yet, -1 when the peer failed. */
static int cma_begin(peer_t *p, const frame_hdr_t *h, int64_t avail) {
  unsigned char d[UVCCL__FRAME_HDR + UVCCL__CMA_DESC];
  if (p->cma_pid == 0 || h->len == 0 || h->flags != UVCCL__FRAME_F_CMA) {
    uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO, "a single-copy frame it "
                         "may not send (bad frame in its shared-memory ring)");
    return -1;
  }
  if (avail < (int64_t)sizeof(d)) return 1;
  uvccl__shm_copy_out(&p->shm_in, d, sizeof(d));
  uvccl__shm_consume(&p->shm_in, sizeof(d));
  memcpy(&p->cma_rx_addr, d + UVCCL__FRAME_HDR, 8);
  memcpy(&p->cma_rx_seq, d + UVCCL__FRAME_HDR + 8, 8);
  if (p->cma_rx_seq == 1)
    LOG_DEBUG("coll", "rank %d: first single-copy frame from rank %d (%llu "
              "bytes)", p->net->rank, p->rank, (unsigned long long)h->len);
  if (uvccl__net_frame_begin(p, &p->srx, h) != 0) return -1;
  p->cma_rx = 1;
  return 0;
}

/* Reads what the peer's ring holds, at most a ring's worth (a producer
 * as fast as this reader must not keep the loop here) and what the turn
 * allows (a step at least); 1 when something moved. */
static int consume(peer_t *p) {
  uvccl__shm_in_t *in = &p->shm_in;
  uvccl__turn_t *turn = &p->net->turn;
  uint64_t released = in->head, start = in->head;
  int moved = 0, stepped = 0;
  while (p->shm_rx && p->state == PEER_UP && in->head - start < in->size) {
    int64_t avail;
    uint64_t left, take;
    size_t contig;
    const char *ptr;
    if (stepped && uvccl__turn_spent(turn)) break;
    if (p->cma_rx) {
      int64_t n;
      n = cma_step(p);
      if (n < 0) return 1;
      uvccl__turn_charge(turn, (size_t)n);
      moved = stepped = 1;
      continue;
    }
    avail = uvccl__shm_avail(in);
    if (avail < 0) {
      uvccl__shm_ring_corrupt(p);
      return 1;
    }
    if (avail == 0) break;
    if (p->srx_pad > 0) {
      take = (uint64_t)avail < p->srx_pad ? (uint64_t)avail : p->srx_pad;
      uvccl__shm_consume(in, (size_t)take);
      p->srx_pad -= (uint32_t)take;
      continue;
    }
    if (p->srx.rstate == RS_HDR) {
      unsigned char hb[UVCCL__FRAME_HDR];
      frame_hdr_t h;
      if (p->paused || avail < UVCCL__FRAME_HDR) break;
      uvccl__shm_copy_out(in, hb, sizeof(hb));
      memcpy(&h, hb, sizeof(h));
      if (h.kind != FRAME_COLL && h.kind != FRAME_P2P) {
        uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO, "bad frame in its "
                             "shared-memory ring");
        return 1;
      }
      if (h.flags != 0) {
        int r = cma_begin(p, &h, avail);
        if (r < 0) return 1;
        if (r > 0) break; /* the descriptor is still on its way */
        moved = 1;
        continue;
      }
      uvccl__shm_consume(in, sizeof(hb));
      moved = 1;
      if (uvccl__net_frame_begin(p, &p->srx, &h) != 0) return 1;
      continue;
    }
    left = p->srx.cur.len - p->srx.cur_got;
    ptr = uvccl__shm_peek(in, (uint64_t)avail, &contig);
    take = contig < left ? contig : left;
    take = uvccl__turn_piece(turn, (size_t)take, SHM_STEP);
    switch (p->srx.rstate) {
    case RS_DIRECT:
      if (p->srx.cur_op->s != NULL && p->srx.cur_op->s->stream)
        uvccl__par_memcpy_stream(p->srx.cur_op->buf + p->srx.cur_got, ptr,
                                 (size_t)take);
      else
        uvccl__par_memcpy(p->srx.cur_op->buf + p->srx.cur_got, ptr,
                          (size_t)take);
      break;
    case RS_EARLY:
      uvccl__par_memcpy(p->srx.cur_early->data + p->srx.cur_got, ptr,
                        (size_t)take);
      break;
    case RS_REDUCE: {
      sop_t *op = p->srx.cur_op;
      size_t es = op->s->esize ? op->s->esize : 1;
      uint64_t whole = take - take % es;
      if (whole > 0) {
        reduce_job_t j = {p->net, op, (size_t)p->srx.cur_got, ptr};
        uvccl__par_run(uvccl__shm_reduce_part, &j, (size_t)whole, es);
        take = whole;
      } else {
        /* One element across the ring's end, or not all of it here yet
         * (then wait for the rest). */
        uint64_t tmp[2];
        if ((uint64_t)avail < es || es > sizeof(tmp)) take = 0;
        else {
          uvccl__shm_copy_out(in, tmp, es);
          p->net->up->reduce_in(op, (size_t)p->srx.cur_got, tmp, es);
          take = es;
        }
      }
      break;
    }
    default: /* RS_DISCARD */
      break;
    }
    if (take == 0) break;
    uvccl__shm_consume(in, (size_t)take);
    uvccl__turn_charge(turn, (size_t)take);
    p->srx.cur_got += take;
    moved = stepped = 1;
    if (in->head - released >= in->size / 4) {
      uvccl__shm_release(in, p->shm_out);
      released = in->head;
    }
    if (p->srx.cur_got == p->srx.cur.len) {
      p->srx_pad = (uint32_t)uvccl__shm_pad8(p->srx.cur.len); /* skipped next */
      if (p->srx.rstate == RS_DISCARD) {
        p->srx.rstate = RS_HDR;
      } else if (uvccl__net_frame_end(p, &p->srx) != 0) {
        return 1;
      }
    }
  }
  if (in->head != released && p->shm_rx) uvccl__shm_release(in, p->shm_out);
  return moved;
}

void uvccl__shm_drain(peer_t *p) {
  while (p->shm_rx && p->state == PEER_UP && consume(p)) {
  }
}

/* Reads the rings whose producers said they moved (their dirty bits),
 * and moves blocked sends along. */
int uvccl__shm_poll(net_t *net) {
  shm_net_t *sn = net->shm;
  uint32_t w, nw;
  int i, moved = 0;
  if (sn == NULL || net->closing || sn->nrx == 0) return 0;
  if (sn->boxq.head != NULL) moved |= uvccl__shm_box_pump(net);
  if (sn->nqueued > 0)
    for (i = 0; i < sn->nrx; i++) {
      peer_t *p = net->peers[sn->rx[i]];
      if (p != NULL && p->shm_tx && p->shm_sendq.head != NULL)
        moved |= uvccl__shm_pump(p);
    }
  nw = (sn->ib.nslots + 63) / 64;
  for (w = 0; w < nw; w++) {
    uint64_t bits = uvccl__shm_take_dirty(&sn->ib, w);
    while (bits != 0) {
      int s = (int)(w * 64) + __builtin_ctzll(bits);
      peer_t *p = s < net->size ? net->peers[s] : NULL;
      bits &= bits - 1;
      if (p == NULL || !p->shm_rx)
        continue; /* not linked: shm_link looks */
      moved |= consume(p);
      /* Stopped with bytes left (its share of this turn was used up):
       * again next turn. Paused: uvccl__shm_kick when it resumes. */
      if (p->shm_rx && p->state == PEER_UP &&
          (p->cma_rx || (!p->paused && uvccl__shm_nonempty(&p->shm_in))))
        uvccl__shm_mark_dirty(&sn->ib, (uint32_t)s);
      /* Its acknowledgement of our transfer comes the same way. */
      if (p->cma_wait && p->state == PEER_UP && uvccl__shm_cma_acked(p)) {
        moved = 1;
        if (p->shm_sendq.head != NULL) uvccl__shm_pump(p);
      }
      if (net->closing) return 1;
    }
  }
  if (moved) uvccl__net_kick_spin(net);
  return moved;
}
