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
 * paying (cma_auto_decide): on the machines measured so far (a KVM guest,
 * kernel 6.18) process_vm_readv copies at a quarter of memcpy's speed in
 * cache and a third out of it, so the ring's two copies, which overlap on
 * two cores, are faster there (bench/RESULTS.md). A bad descriptor
 * fails that peer (the kernel checks the address), never this process. A
 * send taken back while being read (its work failed) is redirected to a
 * copy: the sender publishes the copy, revokes the transfer and waits
 * until the receiver is out of its current read (each side announces, then
 * looks at the other's word).
 *
 * Boxes. A world whose every pair of ranks is linked here (and at most
 * UVCCL__SHM_BOX_WORLD ranks) takes its small allreduces, broadcasts,
 * allgathers, reduce-scatters, alltoalls and barriers through boxes
 * instead of messages: every rank writes its part (reduce_scatter and
 * alltoall: each peer's own block) into a box beside its ring in each
 * peer's inbox, then waits until every peer's part is in its own inbox,
 * and reduces all P parts in rank order (the same bits on every rank) or
 * places them (uvccl__box_kind_t). A broadcast's other ranks post an
 * empty part: every rank waits for every part, whatever the kind, which
 * the reuse below rests on. One round instead of log2(P), no frames to
 * match, and with ranks taking turns on a CPU, one turn each. Collective
 * number t uses box t % 2, so a rank posts t only after it finished t - 1
 * (which needs every rank's part of t - 1, posted after that rank read
 * t - 2's). Whether a world uses boxes is agreed without a message: each
 * rank says in its inbox header, before creation's store barrier, whether
 * it links every peer here (and allows boxes: UVCCL_SHM_BOXES=0 does
 * not); after the barrier each reads every peer's word, and boxes are on
 * only if all said yes. A rank missing a link says no, and every rank
 * either misses a link itself or reads that no. */
#include "cpu/internal.h"
#include "cpu/par.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct uvccl__shm_net_s {
  uvccl__shm_inbox_t ib;
  uv_prepare_t prep;
  uv_check_t check;
  uv_poll_t bell;
  uv_timer_t defer;      /* gives lost sends back from the loop */
  int nopen;             /* handles open */
  int started;
  int closed;            /* uvccl__shm_net_close ran */
  int *rx;               /* world ranks read through shared memory */
  int nrx;
  uint64_t nqueued;      /* sends waiting for room, all peers */
  sop_list_t lost;       /* sends a dead peer will never take */
  uint64_t cma_min;      /* single copy from this size (0: off) */
  int cma_auto;          /* on or off when first wanted (cma_auto_decide) */
  char *scratch;         /* single-copy reductions read into this */
  /* Boxes (below): the world's small collectives started here, the
   * number of the next to post, whether it is posted, our own part. */
  sop_list_t boxq;
  uint64_t box_next;
  int box_posted;
  int box_pumping;
  char box_own[UVCCL__SHM_BOX_MAX];
} shm_net_t;

#define SHM_PUBLISH_EVERY (256u * 1024)
#define SHM_DEFAULT_RING (1024u * 1024)
#define CMA_STEP (1024u * 1024)       /* one process_vm_readv */
#define CMA_SCRATCH (128u * 1024)     /* a reduction's step (stays in cache) */
/* The least a step moves when the turn is spent (turn.c): each peer's
 * ring and queue advance by at least this much a turn. */
#define SHM_STEP (64u * 1024)
#define CMA_REVOKE_MS 200

static uint64_t pad8(uint64_t len) { return (8 - len % 8) % 8; }

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
static int box_pump(net_t *net);
static int box_ready(net_t *net);

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
   * where it pays (cma_auto_decide); its threshold UVCCL_SHM_CMA_MIN, in
   * bytes. */
  {
    int cma; /* 0 auto, 1 "0" (off), 2 "1" (on) */
    uint64_t min;
    uvccl__config_choice(UVCCL__CFG_SHM_CMA, &cma);
    uvccl__config_uint(UVCCL__CFG_SHM_CMA_MIN, &min);
    sn->cma_auto = cma == 0;
    sn->cma_min = cma == 1 ? 0 : min;
  }
  sn->rx = uvccl__calloc((size_t)net->size, sizeof(int));
  if (sn->rx == NULL) {
    uvccl__free(sn);
    return UV_ENOMEM;
  }
  rc = uvccl__shm_inbox_open(&sn->ib, (uint32_t)net->size, ring, err, errlen);
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

int uvccl__shm_active(net_t *net) { return net->shm != NULL && net->shm->nrx > 0; }

void uvccl__shm_peer_up(peer_t *p) {
  net_t *net = p->net;
  uvccl__shm_info_t info;
  if (shm_usable(net)) uvccl__shm_inbox_info(&net->shm->ib, &info);
  else uvccl__shm_info_none(&info);
  if (net->shm == NULL || net->shm->cma_min == 0) info.cma_addr = 0;
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
    uvccl__net_peer_ready(p); /* sparse worlds: what waited for it */
    if (p->state != PEER_UP) return;
    uvccl__net_check_ready(net);
  }
}

/* ---- sending ---------------------------------------------------------------- */

static const char zeros[8];

/* Copies more of op's frame into the ring: 1 when all of it is in, 0
 * when the ring is full or the turn spent (after a first step), -1 when
 * the ring is corrupted. A sent op counts its frame's bytes in got; a
 * detached one (s == NULL) holds the rest of its frame as raw bytes in
 * buf. */
static int tx_fill(uvccl__shm_out_t *o, sop_t *op, uvccl__turn_t *turn) {
  uint64_t total = op->s == NULL ? op->len
                                 : UVCCL__FRAME_HDR + op->len + pad8(op->len);
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

/* A reduction out of a ring, in parts (par.c): the kernels touch only
 * [off, off + n) of the op's buffers. */
typedef struct {
  net_t *net;
  sop_t *op;
  size_t at;
  const char *in;
} reduce_job_t;

static void reduce_part(void *ctx, size_t off, size_t n) {
  reduce_job_t *j = ctx;
  j->net->up->reduce_in(j->op, j->at + off, j->in + off, n);
}

static void ring_corrupt(peer_t *p) {
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
 * (CMA_AUTO_RATIO). That holds with more ranks than CPUs too: at 4 ranks
 * on 2 CPUs, where process_vm_readv runs at 0.3-0.5 of memcpy, single
 * copy was slower in 13 of 16 cells of 256 KiB-16 MiB allreduce,
 * allgather, reduce_scatter and broadcast, down to 0.26x the rings'
 * bandwidth (bench/RESULTS.md), against the guess that one copy instead
 * of two pays from half memcpy's speed there. Measured once a process,
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
      ring_corrupt(p);
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
static int cma_acked(peer_t *p) {
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
static int pump(peer_t *p) {
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
      ring_corrupt(p);
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
  uint64_t total = UVCCL__FRAME_HDR + op->len + pad8(op->len), left, at;
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

/* ---- receiving ---------------------------------------------------------------- */

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
      ring_corrupt(p);
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
        uvccl__par_run(reduce_part, &j, (size_t)whole, es);
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
      p->srx_pad = (uint32_t)pad8(p->srx.cur.len); /* skipped next */
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
  if (sn->boxq.head != NULL) moved |= box_pump(net);
  if (sn->nqueued > 0)
    for (i = 0; i < sn->nrx; i++) {
      peer_t *p = net->peers[sn->rx[i]];
      if (p != NULL && p->shm_tx && p->shm_sendq.head != NULL)
        moved |= pump(p);
    }
  nw = (sn->ib.nslots + 63) / 64;
  for (w = 0; w < nw; w++) {
    uint64_t bits = uvccl__shm_take_dirty(&sn->ib, w);
    while (bits != 0) {
      int s = (int)(w * 64) + __builtin_ctzll(bits);
      peer_t *p = s < net->size ? net->peers[s] : NULL;
      bits &= bits - 1;
      if (p == NULL || !p->shm_rx) continue; /* not linked: shm_link looks */
      moved |= consume(p);
      /* Stopped with bytes left (its share of this turn was used up):
       * again next turn. Paused: uvccl__shm_kick when it resumes. */
      if (p->shm_rx && p->state == PEER_UP &&
          (p->cma_rx || (!p->paused && uvccl__shm_nonempty(&p->shm_in))))
        uvccl__shm_mark_dirty(&sn->ib, (uint32_t)s);
      /* Its acknowledgement of our transfer comes the same way. */
      if (p->cma_wait && p->state == PEER_UP && cma_acked(p)) {
        moved = 1;
        if (p->shm_sendq.head != NULL) pump(p);
      }
      if (net->closing) return 1;
    }
  }
  if (moved) uvccl__net_kick_spin(net);
  return moved;
}

/* ---- boxes ------------------------------------------------------------------ */

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
static int box_pump(net_t *net) {
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
static int box_ready(net_t *net) {
  shm_net_t *sn = net->shm;
  const char *parts[UVCCL__SHM_BOX_WORLD];
  sop_t *op = box_due(sn);
  if (op == NULL) return 0;
  if (!sn->box_posted) return 1;
  return box_parts(net, op, parts) != 0;
}

void uvccl__shm_box_start(net_t *net, sop_t *op) {
  sop_list_push(&net->shm->boxq, op);
  box_pump(net);
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

void uvccl__shm_kick(peer_t *p) {
  if (p->shm_rx && p->net->shm != NULL)
    uvccl__shm_mark_dirty(&p->net->shm->ib, (uint32_t)p->rank);
}

/* 1 when a ring has news or a blocked send has room. */
static int shm_ready(net_t *net) {
  shm_net_t *sn = net->shm;
  int i;
  if (uvccl__shm_any_dirty(&sn->ib)) return 1;
  if (sn->boxq.head != NULL && box_ready(net)) return 1;
  if (sn->nqueued > 0)
    for (i = 0; i < sn->nrx; i++) {
      peer_t *p = net->peers[sn->rx[i]];
      if (p == NULL || !p->shm_tx || p->state != PEER_UP) continue;
      if (p->shm_sendq.head != NULL && uvccl__shm_space(p->shm_out) != 0)
        return 1;
    }
  return 0;
}

/* ---- the loop ------------------------------------------------------------------ */

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

/* ---- failure and teardown --------------------------------------------------------- */

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
  uvccl__free(sn);
  net->shm = NULL;
}
