/* Same-host peers through shared memory: the transport's frames (the
 * same 24-byte header and payload as on TCP) go through a ring in the
 * receiver's inbox (shm_seg.c) instead of a socket, so every collective,
 * dtype, subgroup and point-to-point operation works unchanged, and the
 * matching, early-frame and failure rules are net.c's.
 *
 * Setting up. Once a peer's TCP connection is up, each side sends a
 * FRAME_SHM describing its inbox; the other maps its slot (which works
 * only on the same host, as the same user) and answers whether it did.
 * Frames go through the rings only when both mapped the other's inbox
 * (each needs the other's to wake it); otherwise through TCP, as before.
 * Creation completes once every peer's exchange is over (in a sparse
 * world, connected lazily, a peer's data frames wait for its exchange),
 * so no data frame can precede the switch. The TCP connection stays: it
 * carries the goodbye and control frames, and its EOF is how a dead peer
 * is noticed, as promptly as before (the liveness monitor is unchanged
 * too).
 *
 * Receiving. The ring is read by the same steps as a socket: a header is
 * matched, then the payload is copied straight into the receive's buffer,
 * reduced straight from the ring (no copy first) or held as an early
 * frame. Frames start 8-byte aligned (each is padded), so reductions
 * read aligned elements.
 *
 * Waking. The loop reads the rings before it blocks (a prepare handle):
 * it flags its inbox asleep, looks again, and only then blocks in epoll
 * on its doorbell pipe with everything else. A producer rings the bell
 * only when the flag is set, and clears it, so an awake consumer costs no
 * system call per message and a sleeping one one per sleep. In busy-poll
 * mode the spinning loop reads the rings every iteration.
 *
 * Flow control. A sender whose frame does not fit copies what fits,
 * flags the ring, and waits; the consumer wakes it when it frees room.
 *
 * Single copy (UVCCL_SHM_CMA). A frame of at least UVCCL_SHM_CMA_MIN
 * bytes (256 KiB) is not copied into the ring: the ring carries its header
 * and a descriptor (where the payload lies in the sender, the transfer's
 * number), and the receiver reads the payload with process_vm_readv
 * straight into the receive's buffer (or its early frame, or a small
 * scratch it reduces from), in 1 MiB steps. One copy instead of two, and the sender's
 * CPU is free. The receiver acknowledges through the ring's header; the
 * send completes then, and the sender's later frames to that peer wait for
 * it. Whether a rank may read a peer's memory is tried at the exchange
 * (the peer offers the address of its cookie; the kernel's ptrace check,
 * Yama and seccomp decide); without it everything goes through the ring.
 * By default (auto) a process turns it on only where it measured it
 * paying (cma_auto_decide): where process_vm_readv copies well below
 * memcpy's speed, the ring's two copies, which overlap on two cores, are
 * faster (bench/RESULTS.md). A bad descriptor
 * fails that peer (the kernel checks the address), never this process. A
 * send taken back while being read (its work failed) is redirected to a
 * copy: the sender publishes the copy, revokes the transfer and waits
 * until the receiver is out of its current read (each side announces, then
 * looks at the other's word). */
#include "samehost.h"

#include <unistd.h>


/* 1 when $UVCCL_TRANSPORT asks for TCP only ("tcp"; "shm", "auto" or
 * unset: shared memory with the ranks of this host), UV_EINVAL (err says
 * why) for a value it does not take. */
static int transport_tcp_only(char *err, size_t errlen) {
  char why[96];
  int t; /* auto|shm|tcp */
  if (uvccl__config_check(UVCCL__CFG_TRANSPORT, why, sizeof(why)) < 0) {
    /* a transport asked for and not understood: no guess (and no
     * warning that a default holds) */
    snprintf(err, errlen, "UVCCL_TRANSPORT=%s is not one of auto, shm, tcp",
             uvccl__config_text(UVCCL__CFG_TRANSPORT));
    return UV_EINVAL;
  }
  uvccl__config_choice(UVCCL__CFG_TRANSPORT, &t);
  return t == 2;
}

static void on_prepare(uv_prepare_t *h);
static void on_check(uv_check_t *h);
static void on_bell(uv_poll_t *h, int status, int events);
static void on_defer(uv_timer_t *t);

int uvccl__shm_net_init(net_t *net, char *err, size_t errlen) {
  shm_net_t *sn;
  uint64_t ring;
  int rc;
  rc = transport_tcp_only(err, errlen);
  if (rc < 0) return rc;
  if (net->size < 2 || rc == 1) return 0;
  /* 1 MiB rings; a large world gets smaller ones (its pages are only
   * touched by the peers that talk to this rank, but they stay). */
  if (uvccl__config_uint(UVCCL__CFG_SHM_RING_KB, &ring) == 1)
    ring *= 1024;
  else
    ring = net->size > 64 ? 256u * 1024 : SHM_DEFAULT_RING;
  ring = (ring + UVCCL__SHM_PAGE - 1) / UVCCL__SHM_PAGE * UVCCL__SHM_PAGE;
  sn = uvccl__calloc(1, sizeof(*sn));
  if (sn == NULL) return UV_ENOMEM;
  /* UVCCL_SHM_CMA: single copy "1" on, "0" off, "auto" (the default) on
   * where it pays (cma_auto_decide); its threshold
   * UVCCL_SHM_CMA_MIN, in bytes. */
  {
    int cma; /* 0 auto, 1 "0" (off), 2 "1" (on) */
    uint64_t min;
    uvccl__config_choice(UVCCL__CFG_SHM_CMA, &cma);
    uvccl__config_uint(UVCCL__CFG_SHM_CMA_MIN, &min);
    sn->cma_auto = cma == 0;
    sn->cma_min = cma == 1 ? 0 : min;
  }
  sn->rx = uvccl__calloc(uvccl__shm_slots(net->size), sizeof(int));
  if (sn->rx == NULL) {
    uvccl__free(sn);
    return UV_ENOMEM;
  }
  rc = uvccl__shm_inbox_open(&sn->ib, uvccl__shm_slots(net->size), ring, err,
                             errlen);
  if (rc != 0) {
    /* Not fatal: this rank offers no shared memory, TCP carries all. */
    LOG_INFO("coll", "rank %d: %s; using TCP only", net->rank, err);
    uvccl__free(sn->rx);
    uvccl__free(sn);
    return 0;
  }
  uv_prepare_init(net->loop, &sn->prep);
  uv_check_init(net->loop, &sn->check);
  uv_timer_init(net->loop, &sn->defer);
  rc = uv_poll_init(net->loop, &sn->bell, sn->ib.bell_r);
  if (rc != 0) {
    snprintf(err, errlen, "shared memory: watching the doorbell: %s",
             uvccl_strerror(rc));
    /* the three handles above still need closing: keep sn */
  }
  sn->prep.data = sn->check.data = sn->defer.data = net;
  sn->bell.data = net;
  sn->nopen = rc == 0 ? 4 : 3;
  /* These never keep a loop alive on their own: the net's sockets do. */
  uv_unref((uv_handle_t *)&sn->prep);
  uv_unref((uv_handle_t *)&sn->check);
  if (rc == 0) uv_unref((uv_handle_t *)&sn->bell);
  net->shm = sn;
  if (rc != 0) {
    /* Shared memory unusable: close it again through the normal path. */
    uvccl__shm_inbox_close(&sn->ib);
    LOG_INFO("coll", "rank %d: %s; using TCP only", net->rank, err);
  }
  return 0;
}

static int shm_usable(const net_t *net) {
  return net->shm != NULL && net->shm->ib.base != NULL && net->shm->nopen == 4;
}

static void shm_start(net_t *net) {
  shm_net_t *sn = net->shm;
  if (sn->started || net->closing) return;
  sn->started = 1;
  uv_prepare_start(&sn->prep, on_prepare);
  uv_check_start(&sn->check, on_check);
  uv_poll_start(&sn->bell, UV_READABLE, on_bell);
}

int uvccl__shm_active(net_t *net) {
  return net->shm != NULL && net->shm->nrx > 0;
}

void uvccl__shm_set_big_here(net_t *net, int big) {
  if (net->shm != NULL && net->shm->ib.hdr != NULL)
    uvccl__shm_set_big(&net->shm->ib, big);
}

int uvccl__shm_host_big(net_t *net) {
  shm_net_t *sn = net->shm;
  int i;
  if (sn == NULL) return 0;
  for (i = 0; i < sn->nrx; i++) {
    peer_t *p = net->peers[sn->rx[i]];
    if (p != NULL && p->state == PEER_UP && p->shm_out != NULL &&
        p->shm_out->peer != NULL && uvccl__shm_big(p->shm_out->peer))
      return 1;
  }
  return 0;
}

void uvccl__shm_peer_up(peer_t *p) {
  net_t *net = p->net;
  uvccl__shm_info_t info;
  if (shm_usable(net)) uvccl__shm_inbox_info(&net->shm->ib, &info);
  else uvccl__shm_info_none(&info);
  if (net->shm == NULL || net->shm->cma_min == 0) info.cma_addr = 0;
  net->hosts[net->rank] = uvccl__shm_host_key(&info);
  net->kernels[net->rank] = uvccl__shm_kernel_key(&info);
  if (uvccl__net_send_ctl(net, p->rank, FRAME_SHM, 0, 0, 0, &info,
                          sizeof(info)) != 0)
    uvccl__net_peer_fail(net, p, UV_EPIPE, "sending the shared-memory offer "
                         "failed");
}

/* Both sides mapped the other's inbox: frames go through the rings. */
static void shm_link(peer_t *p, int peer_attached) {
  net_t *net = p->net;
  shm_net_t *sn = net->shm;
  if (!peer_attached || !p->shm_attached || sn == NULL) {
    if (p->shm_out != NULL) {
      /* One way only is no use (each side wakes the other). */
      uvccl__shm_detach(p->shm_out);
      uvccl__free(p->shm_out);
      p->shm_out = NULL;
      p->shm_attached = 0;
    }
    p->cma_tx = 0;
    p->cma_pid = 0;
    return;
  }
  uvccl__shm_inbox_slot(&sn->ib, (uint32_t)p->rank, &p->shm_in);
  p->srx.rstate = RS_HDR;
  p->srx_pad = 0;
  p->shm_rx = 1;
  p->shm_tx = 1;
  sn->rx[sn->nrx++] = p->rank;
  if (sn->nrx == 1) {
    int here = uvccl__net_local_ranks(net);
    if (uvccl__par_setup(here))
      LOG_INFO("coll", "rank %d: a helper thread takes half of each large "
               "copy and reduction through shared memory (%d ranks here; "
               "UVCCL_SHM_HELPER=0 turns it off)", net->rank, here);
  }
  /* It may have written before this side linked (its bit was taken and
   * dropped then): look at its ring once. */
  uvccl__shm_mark_dirty(&sn->ib, (uint32_t)p->rank);
  shm_start(net);
  LOG_DEBUG("coll", "rank %d: rank %d through shared memory", net->rank,
            p->rank);
}

void uvccl__shm_on_frame(peer_t *p, const frame_hdr_t *h,
                         const unsigned char *payload) {
  net_t *net = p->net;
  uvccl__shm_info_t info;
  (void)h;
  memcpy(&info, payload, sizeof(info));
  if (info.magic != UVCCL__SHM_MAGIC) {
    uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "bad shared-memory offer");
    return;
  }
  if (info.kind == UVCCL__SHM_INFO && !(p->shm_step & 1)) {
    uvccl__shm_info_t answer;
    char why[160];
    p->shm_step |= 1;
    net->hosts[p->rank] = uvccl__shm_host_key(&info);
    net->kernels[p->rank] = uvccl__shm_kernel_key(&info);
    uvccl__shm_info_none(&answer);
    answer.kind = UVCCL__SHM_REFUSED;
    if (shm_usable(net) && uvccl__shm_info_local(&info)) {
      uvccl__shm_out_t *o = uvccl__malloc(sizeof(*o));
      int rc = o == NULL ? UV_ENOMEM
                         : uvccl__shm_attach(o, &info, (uint32_t)net->rank,
                                             why, sizeof(why));
      if (rc == 0) {
        p->shm_out = o;
        p->shm_attached = 1;
        answer.kind = UVCCL__SHM_ATTACHED;
        /* It lets us read its memory: try it once, here. */
        if (net->shm->cma_min != 0 &&
            uvccl__shm_cma_probe(info.pid, info.cma_addr, info.cookie)) {
          p->cma_pid = info.pid;
          answer.cma_addr = 1;
        }
      } else {
        LOG_INFO("coll", "rank %d: rank %d runs on this host but its shared "
                 "memory cannot be mapped (%s): TCP it is", net->rank,
                 p->rank, o == NULL ? "out of memory" : why);
        uvccl__free(o);
      }
    }
    if (uvccl__net_send_ctl(net, p->rank, FRAME_SHM, 0, 0, 0, &answer,
                            sizeof(answer)) != 0) {
      uvccl__net_peer_fail(net, p, UV_EPIPE, "answering the shared-memory "
                           "offer failed");
      return;
    }
  } else if ((info.kind == UVCCL__SHM_ATTACHED ||
              info.kind == UVCCL__SHM_REFUSED) && !(p->shm_step & 2)) {
    p->shm_step |= 2;
    p->shm_peer_attached = info.kind == UVCCL__SHM_ATTACHED;
    p->cma_tx = p->shm_peer_attached && info.cma_addr == 1 &&
                net->shm != NULL && net->shm->cma_min != 0;
  } else {
    uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "unexpected shared-memory "
                         "frame");
    return;
  }
  if (p->shm_step == 3) {
    shm_link(p, p->shm_peer_attached);
    net->shm_done++;
    uvccl__net_lanes_start(p); /* another host: striped TCP */
    if (p->state != PEER_UP) return;
    uvccl__net_peer_ready(p); /* sparse worlds: what waited for it */
    if (p->state != PEER_UP) return;
    uvccl__net_check_ready(net);
  }
}

void uvccl__shm_kick(peer_t *p) {
  if (p->shm_rx && p->net->shm != NULL)
    uvccl__shm_mark_dirty(&p->net->shm->ib, (uint32_t)p->rank);
}

/* 1 when a ring has news or a blocked send has room. */
static int shm_ready(net_t *net) {
  shm_net_t *sn = net->shm;
  int i;
  if (uvccl__shm_any_dirty(&sn->ib)) return 1;
  if (sn->boxq.head != NULL && uvccl__shm_box_ready(net)) return 1;
  if (sn->nqueued > 0)
    for (i = 0; i < sn->nrx; i++) {
      peer_t *p = net->peers[sn->rx[i]];
      if (p == NULL || !p->shm_tx || p->state != PEER_UP) continue;
      if (p->shm_sendq.head != NULL && uvccl__shm_space(p->shm_out) != 0)
        return 1;
    }
  return 0;
}

/* ---- the loop ------------------------------------------------------------ */

static void on_prepare(uv_prepare_t *h) {
  net_t *net = h->data;
  shm_net_t *sn = net->shm;
  int i;
  uvccl__turn_enter(&net->turn, UVCCL__SITE_RING, NULL);
  for (i = 0; i < 4; i++) {
    if (net->closing) goto out;
    uvccl__shm_poll(net);
    if (uv_is_active((uv_handle_t *)&net->spin)) {
      /* The loop spins (zero timeout): it will look again at once. */
      uvccl__shm_set_sleeping(&sn->ib, 0);
      goto out;
    }
    if (uvccl__turn_spent(&net->turn)) break; /* the rest next iteration */
    uvccl__shm_set_sleeping(&sn->ib, 1);
    if (!shm_ready(net)) goto out; /* a producer will ring */
    uvccl__shm_set_sleeping(&sn->ib, 0);
  }
  /* Still busy: this iteration polls without blocking. */
  uvccl__net_spin_now(net);
out:
  uvccl__turn_leave(&net->turn);
}

/* An embedded loop (uvccl_loop_before_block) blocks without a prepare
 * phase first: do each ring's prepare now, so that its inbox is flagged
 * asleep (or the loop told to spin) before the host blocks. */
typedef struct {
  int busy;
} before_block_t;

static void before_block_one(uv_handle_t *h, void *arg) {
  before_block_t *bb = arg;
  net_t *net;
  if (h->type != UV_PREPARE || ((uv_prepare_t *)h)->prepare_cb != on_prepare ||
      !uv_is_active(h))
    return;
  on_prepare((uv_prepare_t *)h);
  net = h->data;
  if (uv_is_active((uv_handle_t *)&net->spin)) bb->busy = 1;
}

int uvccl__shm_before_block(uv_loop_t *loop) {
  before_block_t bb = {0};
  uv_walk(loop, before_block_one, &bb);
  return bb.busy;
}

static void on_check(uv_check_t *h) {
  net_t *net = h->data;
  if (net->shm != NULL && net->shm->ib.hdr != NULL)
    uvccl__shm_set_sleeping(&net->shm->ib, 0);
}

static void on_bell(uv_poll_t *h, int status, int events) {
  net_t *net = h->data;
  (void)status;
  (void)events;
  uvccl__shm_bell_drain(&net->shm->ib);
  uvccl__turn_enter(&net->turn, UVCCL__SITE_RING, NULL);
  uvccl__shm_poll(net);
  uvccl__turn_leave(&net->turn);
}

/* ---- failure and teardown ------------------------------------------------ */

static void flush_lost(net_t *net) {
  shm_net_t *sn = net->shm;
  sop_t *op;
  while ((op = sn->lost.head) != NULL) {
    sop_list_remove(&sn->lost, op);
    if (op->s == NULL) {
      uvccl__free(op);
      continue;
    }
    op->writing = 0;
    net->up->send_lost(op);
  }
}

static void on_defer(uv_timer_t *t) {
  net_t *net = t->data;
  uvccl__turn_enter(&net->turn, UVCCL__SITE_TIMER, NULL);
  flush_lost(net);
  uvccl__turn_leave(&net->turn);
}

void uvccl__shm_peer_down(peer_t *p) {
  net_t *net = p->net;
  shm_net_t *sn = net->shm;
  sop_t *op;
  int i;
  p->srx.rstate = RS_HDR;
  p->srx.cur_op = NULL;
  p->srx.cur_early = NULL;
  p->srx_pad = 0;
  if (sn == NULL) return;
  if (p->shm_rx) {
    p->shm_rx = 0;
    for (i = 0; i < sn->nrx; i++)
      if (sn->rx[i] == p->rank) {
        sn->rx[i] = sn->rx[--sn->nrx];
        break;
      }
  }
  p->shm_tx = 0;
  p->cma_rx = 0;
  p->cma_wait = 0;
  /* Nothing rings a dead peer's doorbell again: its descriptor goes now,
   * not with the net (a net a grow kept lives through many deaths). The
   * rings stay mapped: a helper thread may still be copying into one. */
  if (p->shm_out != NULL && p->shm_out->bellfd >= 0) {
    close(p->shm_out->bellfd);
    p->shm_out->bellfd = -1;
  }
  /* A copy it may still be reading (stopped mid-read): its reads of this
   * process's memory can no longer matter to anyone. */
  uvccl__free(p->cma_ghost);
  p->cma_ghost = NULL;
  if (p->cma_op != NULL) {
    sop_list_push(&sn->lost, p->cma_op);
    p->cma_op = NULL;
  }
  if (p->shm_sendq.head == NULL && sn->lost.head == NULL) return;
  /* Their buffers go back from the loop, as a closed socket's queued
   * writes do (never inside the call that noticed the failure). */
  while ((op = p->shm_sendq.head) != NULL) {
    sop_list_remove(&p->shm_sendq, op);
    sn->nqueued--;
    sop_list_push(&sn->lost, op);
  }
  if (sn->closed) flush_lost(net);
  else uv_timer_start(&sn->defer, on_defer, 0, 0);
}

static void on_shm_closed(uv_handle_t *h) {
  net_t *net = h->data;
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

void uvccl__shm_net_close(net_t *net) {
  shm_net_t *sn = net->shm;
  int n = 0;
  if (sn == NULL || sn->closed) return;
  sn->closed = 1;
  flush_lost(net);
  if (sn->ib.hdr != NULL) uvccl__shm_set_sleeping(&sn->ib, 0);
  uv_close((uv_handle_t *)&sn->prep, on_shm_closed);
  uv_close((uv_handle_t *)&sn->check, on_shm_closed);
  uv_close((uv_handle_t *)&sn->defer, on_shm_closed);
  n = 3;
  if (sn->nopen == 4) {
    uv_close((uv_handle_t *)&sn->bell, on_shm_closed);
    n = 4;
  }
  net->nclosing += n;
}

void uvccl__shm_net_free(net_t *net) {
  shm_net_t *sn = net->shm;
  int r;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (p == NULL) continue;
    uvccl__free(p->cma_ghost);
    p->cma_ghost = NULL;
    if (p->shm_out == NULL) continue;
    uvccl__shm_detach(p->shm_out);
    uvccl__free(p->shm_out);
    p->shm_out = NULL;
  }
  if (sn == NULL) return;
  uvccl__shm_inbox_close(&sn->ib);
  uvccl__free(sn->scratch);
  uvccl__free(sn->rx);
  uvccl__free(sn->box_gone);
  uvccl__free(sn);
  net->shm = NULL;
}

const uvccl__xport_t uvccl__shm_xport = {
    .name = "shm",
    .net_init = uvccl__shm_net_init,
    .active = uvccl__shm_active,
    .poll = uvccl__shm_poll,
    .peer_up = uvccl__shm_peer_up,
    .on_frame = uvccl__shm_on_frame,
    .send = uvccl__shm_send,
    .orphan = uvccl__shm_orphan,
    .drain = uvccl__shm_drain,
    .kick = uvccl__shm_kick,
    .peer_down = uvccl__shm_peer_down,
    .net_close = uvccl__shm_net_close,
    .net_free = uvccl__shm_net_free,
    .set_big = uvccl__shm_set_big_here,
    .host_big = uvccl__shm_host_big,
};
