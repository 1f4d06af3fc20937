/* The transport of the CPU process groups: one listener per process, one
 * TCP connection per pair of ranks, frames with a 24-byte header and no
 * per-message handshake.
 *
 * Receiving. Each connection runs a small state machine over one read
 * buffer. A header is matched at once against the receives posted for
 * (group, sequence, tag); a plain receive then reads straight into the
 * destination (alloc_cb hands libuv the tail of the user's buffer), a
 * reducing receive reads into the connection's buffer and reduces whole
 * elements as they arrive (so the reduction happens while the data is
 * still in cache, in small steps that keep the loop responsive), and a
 * frame nobody waits for yet is held in memory (an early frame) until its
 * receive is posted. Sending is sendmsg of (header, user buffer): no copy, and never
 * a SIGPIPE (sendq.c: MSG_NOSIGNAL; libuv's uv_write would raise it when a
 * peer dies mid-send).
 *
 * Shutdown never resets: both ends half-close, read until EOF, then
 * close, so no unread data is left in a kernel buffer.
 *
 * Peers of the same host send their data frames through shared memory
 * (shm.c), read by the same frame steps (uvccl__net_frame_begin/end) with
 * a receive state of their own (peer->srx); the socket stays for the
 * handshake, control frames, the goodbye and noticing a death. */
#include "tcp.h"

/* ---- life cycle ---------------------------------------------------------- */

static void on_tick(uv_prepare_t *h) {
  net_t *net = h->data;
  uvccl__turn_tick(&net->turn);
  if (net->nspares > 0) uvccl__net_spare_expire(net);
}

/* No same-host transport: every peer over TCP, until the group's creation
 * sets one (uvccl__shm_xport). */
static int none_net_init(net_t *net, char *err, size_t errlen) { return 0; }
static int none_net(net_t *net) { return 0; }
static void none_peer(peer_t *p) {}
static void none_on_frame(peer_t *p, const frame_hdr_t *h,
                          const unsigned char *payload) {}
static int none_send(peer_t *p, sop_t *op) { return UV_ENOTSUP; }
static void none_net_void(net_t *net) {}
static void none_set_big(net_t *net, int big) {}

static const uvccl__xport_t none_xport = {
    .name = "none",
    .net_init = none_net_init,
    .active = none_net,
    .poll = none_net,
    .peer_up = none_peer,
    .on_frame = none_on_frame,
    .send = none_send,
    .orphan = none_send,
    .drain = none_peer,
    .kick = none_peer,
    .peer_down = none_peer,
    .net_close = none_net_void,
    .net_free = none_net_void,
    .set_big = none_set_big,
    .host_big = none_net,
};

static const uvccl__net_hooks_t tcp_hooks = {
    .peer_fail = uvccl__net_peer_fail,
    .kick_spin = uvccl__net_kick_spin,
    .slicer_start = uvccl__net_slicer_start,
    .start_read = uvccl__net_peer_start_read,
    .stripe_pump = uvccl__net_stripe_pump,
};

net_t *uvccl__net_new(uv_loop_t *loop, int rank, int size) {
  net_t *net = uvccl__calloc(1, sizeof(*net));
  if (net == NULL) return NULL;
  net->local_xport = &none_xport;
  net->hooks = &tcp_hooks;
  net->loop = loop;
  net->rank = rank;
  net->size = size;
  net->peers = uvccl__calloc((size_t)size, sizeof(peer_t *));
  net->addrs = uvccl__calloc((size_t)size, sizeof(*net->addrs));
  net->fails = uvccl__calloc((size_t)size, sizeof(*net->fails));
  net->failed = uvccl__calloc((size_t)size, sizeof(int));
  net->hosts = uvccl__calloc(3 * (size_t)size, sizeof(uint64_t));
  net->linked = uvccl__calloc((size_t)size, 1);
  if (net->peers == NULL || net->addrs == NULL || net->fails == NULL ||
      net->failed == NULL || net->hosts == NULL || net->linked == NULL) {
    uvccl__free(net->linked);
    uvccl__free(net->peers);
    uvccl__free(net->addrs);
    uvccl__free(net->fails);
    uvccl__free(net->failed);
    uvccl__free(net->hosts);
    uvccl__free(net);
    return NULL;
  }
  net->kernels = net->hosts + size;
  net->lost = net->hosts + 2 * (size_t)size;
  {
    int r;
    for (r = 0; r < size; r++) net->fails[r].rank = -1;
    net->first.rank = -1;
  }
  if (uv_random(NULL, NULL, &net->nonce, sizeof(net->nonce), 0, NULL) != 0)
    net->nonce = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
  net->want_up = net->want_shm = -1;
  net->early_limit = UVCCL__EARLY_LIMIT;
  net->stripes = 1;
  net->stripe_min = SIZE_MAX;
  uvccl__config_uint(UVCCL__CFG_SCRATCH_KEEP_MS, &net->spare_keep_ms);
  uv_idle_init(loop, &net->spin);
  net->spin.data = net;
  net->spin_open = 1;
  uv_idle_init(loop, &net->slicer);
  net->slicer.data = net;
  net->slicer_open = 1;
  uvccl__turn_init(&net->turn, UVCCL_TURN_BYTES_DEFAULT,
                   (uint64_t)UVCCL_TURN_US_DEFAULT * 1000, 0);
  uv_prepare_init(loop, &net->tick);
  net->tick.data = net;
  net->tick_open = 1;
  uv_prepare_start(&net->tick, on_tick);
  uv_unref((uv_handle_t *)&net->tick);
  uv_timer_init(loop, &net->deadline);
  uv_check_init(loop, &net->deliver_chk);
  uv_idle_init(loop, &net->deliver_idle);
  net->deadline.data = net->deliver_chk.data = net->deliver_idle.data = net;
  net->works_open = 1;
  return net;
}

/* The listener, the shared-memory side and the monitor, in that order. */
int uvccl__net_listen(net_t *net, const struct sockaddr *addr, uint64_t hb_ms,
                      char *err, size_t errlen) {
  int rc = uvccl__net_listen_tcp(net, addr, hb_ms, err, errlen);
  if (rc == 0) rc = uvccl__net_live_start(net, hb_ms, err, errlen);
  return rc;
}

/* ---- busy polling ------------------------------------------------------------
 * While collectives are in flight, an active idle handle makes every loop
 * iteration poll with a zero timeout: the loop spins instead of sleeping,
 * which saves the wake-up latency of a blocking epoll_wait. It stops after
 * busy_us without activity, so an idle process never burns a core. */
static uint32_t net_busy_us(net_t *net) {
  group_t *g;
  uint32_t us = 0;
  for (g = net->groups; g != NULL; g = g->next)
    if (g->busy_us > us) us = g->busy_us;
  return us;
}

/* With 3 or 4 ranks a CPU: whether a rank of this host has a large
 * collective in flight (see uvccl__net_kick_spin). Without shared memory
 * the others cannot be seen: taken to have one (8 ranks on 2 CPUs over
 * TCP spinning beside 8 MiB allreduces made them 1.3x slower). */
static void spin_look_host(net_t *net) {
  if (net->spin_check == 3 && net->inflight_big == 0)
    net->host_big = !net->local_xport->active(net) ||
                    net->local_xport->host_big(net);
}

static void on_spin(uv_idle_t *h) {
  net_t *net = h->data;
  uint64_t now, window;
  if (net->shm != NULL) {
    uvccl__turn_enter(&net->turn, UVCCL__SITE_SPIN, NULL);
    net->local_xport->poll(net);
    uvccl__turn_leave(&net->turn);
  }
  if (net->inflight == 0) {
    uv_idle_stop(h);
    return;
  }
  spin_look_host(net);
  if (!uvccl__net_spin_yielding(net) && net->spin_check != 1) {
    uv_idle_stop(h); /* a large collective came: see kick_spin */
    return;
  }
  now = uv_hrtime();
  window = (uint64_t)net->spin_us * 1000;
  if (net->spin_kicked) {
    net->spin_kicked = 0;
    net->spin_until_ns = now + window;
  } else if (now > net->spin_until_ns) {
    uv_idle_stop(h);
    return;
  }
  /* Oversubscribed, or 20 us without news: give the CPU away each turn,
   * in case the rank awaited waits for it (the scheduler may put two
   * spinning ranks on one CPU for a while; a plain spin then holds the
   * CPU the other needs for a whole time slice). */
  if (uvccl__net_spin_yielding(net) || net->spin_yields ||
      (window > 20000 && net->spin_until_ns - now < window - 20000))
    sched_yield();
}

/* ---- the schedules' works ------------------------------------------------ */

static void deliver_works(net_t *net) {
  uv_check_stop(&net->deliver_chk);
  uv_idle_stop(&net->deliver_idle);
  uvccl__work_drain(net->loop);
}

static void on_deliver_chk(uv_check_t *h) { deliver_works(h->data); }
static void on_deliver_idle(uv_idle_t *h) { deliver_works(h->data); }

int uvccl__net_defer_works(net_t *net) {
  if (!net->works_open) return UV_ECANCELED;
  uv_check_start(&net->deliver_chk, on_deliver_chk);
  uv_idle_start(&net->deliver_idle, on_deliver_idle);
  return 0;
}

static void on_deadline(uv_timer_t *t) {
  net_t *net = t->data;
  net->deadline_due = 0;
  uvccl__turn_enter(&net->turn, UVCCL__SITE_TIMER, NULL);
  net->up->expire(net);
  uvccl__turn_leave(&net->turn);
}

void uvccl__net_deadline(net_t *net, uint64_t due_ms) {
  uint64_t now;
  if (!net->works_open || due_ms == 0) return;
  if (net->deadline_idle) {
    uv_ref((uv_handle_t *)&net->deadline);
    net->deadline_idle = 0;
  }
  if (net->deadline_due != 0 && net->deadline_due <= due_ms) return;
  now = uv_now(net->loop);
  net->deadline_due = due_ms;
  uv_timer_start(&net->deadline, on_deadline, due_ms > now ? due_ms - now : 0,
                 0);
}

/* Nothing in flight. The timer stays set (the next collective is due
 * later than the last, so it would only be set again: a heap insert and
 * removal for every small collective); it merely stops keeping the loop
 * alive, and if it fires first it finds nothing due. */
void uvccl__net_deadline_off(net_t *net) {
  if (!net->works_open || net->deadline_due == 0 || net->deadline_idle) return;
  uv_unref((uv_handle_t *)&net->deadline);
  net->deadline_idle = 1;
}

int uvccl__net_poll_fast(net_t *net) {
  if (net->closing || !net->local_xport->active(net) ||
      (net->spin_check != 1 && !uvccl__net_spin_yielding(net)) ||
      !uv_is_active((uv_handle_t *)&net->spin) ||
      uv_is_active((uv_handle_t *)&net->slicer))
    return 0;
  /* Oversubscribed (spinning yielding): give the CPU away when nothing
   * moved, as on_spin does, but without the loop turn around it (an
   * epoll_wait, the timers, the handles): with ranks taking turns on a
   * CPU, a turn's length is the latency, and that system call was half
   * of a turn's system calls. */
  if (!net->local_xport->poll(net) && uvccl__net_spin_yielding(net))
    sched_yield();
  return 1;
}

/* The next loop iteration polls without blocking (shm.c: rings still
 * busy when the loop was about to sleep). */
void uvccl__net_spin_now(net_t *net) {
  if (net->closing || !net->spin_open) return;
  if (!uv_is_active((uv_handle_t *)&net->spin)) {
    net->spin_until_ns = uv_hrtime();
    net->spin_kicked = 0;
    uv_idle_start(&net->spin, on_spin);
  }
}

/* Spinning only pays when every spinning rank has a core: with more ranks
 * on this host than CPUs, a spinning rank takes the CPU its peer needs to
 * send what it waits for (4 ranks on 2 cores ran small allreduces 3-8x
 * slower). So busy polling turns itself off then, unless
 * UVCCL_BUSY_POLL_FORCE=1. Ranks count as local when they run on this
 * kernel (its boot id, from the shared-memory offers: network namespaces
 * that stand for hosts still share its CPUs), or, where that is not
 * known yet, when their published address has our host part. */
int uvccl__net_local_ranks(const net_t *net) {
  const char *me = net->selfstr, *colon = strrchr(me, ':');
  size_t hl = colon ? (size_t)(colon - me) : strlen(me);
  uint64_t mine = net->kernels[net->rank];
  int r, local = 1, known = 1;
  for (r = 0; r < net->size; r++) {
    if (r == net->rank) continue;
    if (mine != 0 && net->kernels[r] != 0) {
      known++;
      local += net->kernels[r] == mine;
      continue;
    }
    if (net->addrs[r][0] == '\0') continue;
    known++;
    if (strncmp(net->addrs[r], me, hl) == 0 && net->addrs[r][hl] == ':')
      local++;
  }
  /* A sparse world knows only some addresses yet: the same share of the
   * whole world is taken to be here. */
  if (known < net->size)
    local = (int)((int64_t)local * net->size / known);
  return local;
}

static int spin_oversubscribed(net_t *net) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int force, local;
  uvccl__config_choice(UVCCL__CFG_BUSY_POLL_FORCE, &force);
  if (force) return 0;
  local = uvccl__net_local_ranks(net);
  if (ncpu <= 0 || local <= ncpu) return 0;
  LOG_INFO("coll", "busy polling gives way: %d ranks on this host, %ld "
           "CPUs (%s; UVCCL_BUSY_POLL_FORCE=1 spins anyway)", local, ncpu,
           local <= 2 * ncpu
               ? "loops spin only briefly, yielding the CPU each turn"
           : local <= 4 * ncpu
               ? "loops spin only briefly, yielding the CPU each turn, "
                 "while no large collective is in flight"
               : "nobody spins");
  /* up to 2 ranks a CPU, loops still spin, yielding (below); up to 4,
   * only for small collectives (uvccl__net_kick_spin); past that, nobody */
  return local <= 2 * ncpu ? 1 : local <= 4 * ncpu ? 2 : 3;
}

/* How long a loop with collectives in flight keeps polling before it
 * sleeps, when busy polling is off (read once each):
 * - shm: a loop whose peers talk through shared memory looks at its rings
 *   a while: an answer due within microseconds then costs no wake-up (a
 *   sleeping loop takes tens of microseconds to wake on a virtual
 *   machine). $UVCCL_SHM_SPIN_US (default 100: longer than a wake-up
 *   takes here, so two ranks never settle into waking each other turn by
 *   turn; 0: sleep at once).
 * - tcp: a loop that sleeps in epoll while it waits on TCP pays a wake-up
 *   for each message (on a virtual machine an interrupt between CPUs,
 *   tens of microseconds: most of a small collective's time). It too
 *   keeps polling, yielding the CPU each turn (on_spin), so that a rank it
 *   awaits on the same CPU runs meanwhile: with a CPU each, a 4 B
 *   allreduce between 2 ranks over TCP took 7x less (bench/RESULTS.md,
 *   "TCP waits polling"), with 2 ranks on one CPU 1.5x more than asleep.
 *   With 3 or 4 ranks a CPU, only while the collectives in flight are
 *   small (uvccl__net_kick_spin); with more, never. $UVCCL_TCP_SPIN_US
 *   (default 100). */
enum { SPIN_SHM = 0, SPIN_TCP };

static uint32_t spin_window_us(int which) {
  static const uvccl__cfg_id_t ids[] = {UVCCL__CFG_SHM_SPIN_US,
                                        UVCCL__CFG_TCP_SPIN_US};
  static int have[2];
  static uint32_t us[2];
  if (!have[which]) {
    uint64_t n;
    uvccl__config_uint(ids[which], &n);
    us[which] = (uint32_t)n;
    have[which] = 1;
  }
  return us[which];
}

int uvccl__net_oversubscribed(net_t *net) {
  if (net->spin_check == 0) net->spin_check = 1 + spin_oversubscribed(net);
  return net->spin_check > 1;
}

void uvccl__net_kick_spin(net_t *net) {
  uint32_t us;
  if (net->closing || net->inflight == 0) return;
  us = net_busy_us(net);
  if (us == 0 && net->local_xport->active(net)) us = spin_window_us(SPIN_SHM);
  uvccl__net_oversubscribed(net);
  /* Oversubscribed: loops spin yielding the CPU each turn (on_spin), so
   * the rank whose answer is awaited runs at once: 4 ranks on 2 cores
   * wait 14 us for a 4 B allreduce over shared memory that way, 55 us
   * sleeping in epoll. With 3 or 4 ranks a CPU, only while every
   * collective in flight here and at the ranks we reach through shared
   * memory is small (UVCCL__SPIN_SMALL_MAX): 8 ranks on 2 CPUs then ran
   * a 4 B allreduce 4-9x faster over shared memory, and 4 emulated hosts
   * of 2 ranks 1.3-1.7x, where spinning through large ones too made
   * broadcasts of 1-4 MiB 20-30% slower (the spinners' turns delay the
   * ranks that copy). With more, nobody spins. Waits on TCP spin
   * yielding whether or not ranks outnumber CPUs (above
   * spin_window_us). */
  net->spin_yields = 0;
  spin_look_host(net);
  if (net->spin_check != 1 && !uvccl__net_spin_yielding(net)) return;
  if (us == 0) {
    us = spin_window_us(SPIN_TCP);
    net->spin_yields = 1;
  }
  if (us == 0) return;
  /* on_spin moves the deadline: one clock read per loop turn, not one
   * per message */
  net->spin_us = us;
  net->spin_kicked = 1;
  if (!uv_is_active((uv_handle_t *)&net->spin)) {
    net->spin_until_ns = uv_hrtime() + (uint64_t)us * 1000;
    uv_idle_start(&net->spin, on_spin);
  }
}

/* ---- sliced local ops ---------------------------------------------------- */


#define REAP_STEP ((size_t)2 << 20)

static void on_slice(uv_idle_t *h) {
  net_t *net = h->data;
  sop_t *op;
  if (net->slices.head == NULL && net->handoffs == NULL &&
      net->retired_mem.head == NULL) {
    uv_idle_stop(h);
    return;
  }
  /* Staged bytes first (their receives wait on them), then round robin:
   * a slice of the head, then it goes to the back, until the turn is
   * spent. */
  uvccl__turn_enter(&net->turn, UVCCL__SITE_SLICE, NULL);
  while (net->handoffs != NULL && !uvccl__turn_spent(&net->turn) &&
         !net->closing)
    uvccl__net_handoff_step(net);
  while ((op = net->slices.head) != NULL && !uvccl__turn_spent(&net->turn) &&
         !net->closing) {
    uvccl__net_slice_remove(net, op);
    if (net->up->slice(op)) {
      net->up->op_done(op);
    } else {
      uvccl__net_slice_add(net, op);
    }
  }
  /* Memory back to the system last (nobody waits for it): unmapping
   * costs about an eighth of a copy of the same bytes. */
  while (net->retired_mem.head != NULL && !uvccl__turn_spent(&net->turn)) {
    size_t n = uvccl__big_reap(&net->retired_mem, REAP_STEP);
    uvccl__turn_charge(&net->turn, n / 8);
  }
  uvccl__turn_leave(&net->turn);
}

void uvccl__net_slicer_start(net_t *net) {
  if (net->slicer_open && !uv_is_active((uv_handle_t *)&net->slicer))
    uv_idle_start(&net->slicer, on_slice);
}

void uvccl__net_slice_add(net_t *net, sop_t *op) {
  sop_list_push(&net->slices, op);
  uvccl__net_slicer_start(net);
}

void uvccl__net_slice_remove(net_t *net, sop_t *op) {
  sop_list_remove(&net->slices, op);
}

/* ---- sending: straight out, or queued while the peer is dialed ----------- */

/* A collective's or point-to-point frame to op->peer. */
int uvccl__net_send(net_t *net, sop_t *op, uint8_t kind, uint32_t gid,
                    uint32_t seq) {
  peer_t *p = net->peers[op->peer];
  frame_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.kind = kind;
  h.piece = op->piece;
  h.gid = gid;
  h.seq = seq;
  h.tag = op->tag;
  h.len = op->len;
  uvccl__frame_encode(op->hdr, &h);
  op->via = NULL;
  if (uvccl__net_not_yet_connected(net, op->peer) ||
      (net->sparse && p != NULL && p->state == PEER_UP &&
       (p->shm_step != 3 || p->waitq.head))) {
    /* Not connected yet (or earlier frames still wait): queued, in
     * order, until uvccl__net_peer_ready. */
    p = uvccl__net_peer_need(net, op->peer);
    if (p == NULL) return UV_ENOMEM;
    sop_list_push(&p->waitq, op);
    op->writing = 1;
    uvccl__net_peer_dial(p);
    return 0;
  }
  if (p == NULL || p->state != PEER_UP)
    return uvccl__net_awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
  if (op->piece > 0) return uvccl__net_stripe_send(net, p, op);
  return uvccl__net_peer_transmit(net, p, op);
}

/* ---- teardown ------------------------------------------------------------ */

static void on_handle_closed(uv_handle_t *h) {
  net_t *net = h->data;
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

static void on_works_closed(uv_handle_t *h) {
  net_t *net = h->data;
  uvccl__work_drain(net->loop);
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

static void on_drain_timeout(uv_timer_t *t) {
  /* The peer did not finish within the grace period: close anyway. */
  uvccl__net_peer_close_tcp(t->data);
}

/* BYE is out (after every frame queued before it): half-close. */
static void on_bye_written(uvccl__wreq_t *req, int status) {
  peer_t *p = req->data;
  if (status == 0 && p->tcp_open) status = uvccl__sendq_shutdown(&p->sendq);
  p->shut = 1;
  /* Done once the peer's EOF is in too (on_read closes it then). */
  if (p->eof || status < 0) uvccl__net_peer_close_tcp(p);
}

static void peer_teardown(peer_t *p) {
  net_t *net = p->net;
  uv_timer_stop(&p->retry);
  if (p->owner == NULL) p->net->local_xport->peer_down(p);
  if (p->tcp_open && p->state == PEER_UP && !p->eof) {
    /* Half-close after our queued writes, then read until the peer's EOF:
     * closing with unread data would send a reset. */
    p->state = PEER_CLOSING;
    p->rx.rstate = RS_HDR;
    p->rlen = 0;
    p->rx.cur_op = NULL;
    {
      frame_hdr_t bye;
      memset(&bye, 0, sizeof(bye));
      bye.kind = FRAME_BYE;
      uvccl__frame_encode(p->bye_hdr, &bye);
    }
    p->draining = 1;
    net->nclosing++; /* the socket, until it closes */
    uvccl__net_peer_start_read(p);
    uv_timer_start(&p->retry, on_drain_timeout, 2000, 0);
    if (uvccl__net_peer_write_ctl(p, &p->bye_req, p->bye_hdr, UVCCL__FRAME_HDR,
                       on_bye_written) != 0)
      uvccl__net_peer_close_tcp(p);
    return; /* the retry timer closes after the socket */
  }
  p->state = PEER_CLOSING;
  if (p->tcp_open) {
    uvccl__net_peer_close_tcp(p);
    return;
  }
  if (p->retry_open) {
    p->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&p->retry, uvccl__net_on_peer_closed);
  }
}

void uvccl__net_release(net_t *net, void (*cb)(net_t *), void *arg) {
  int r;
  peer_t *p, *next;
  if (--net->refs > 0) return;
  net->closing = 1;
  net->closed_cb = cb;
  net->closed_arg = arg;
  net->mesh_cb = NULL;
  net->mesh_ready = NULL;
  net->mesh_group = NULL;
  if (net->lookup_close != NULL) {
    net->lookup_close(net->lookup_arg);
    net->lookup_close = NULL;
    net->lookup = NULL;
  }
  if (net->live != NULL) {
    /* Goodbye on the links too; the net goes once the monitor stopped. */
    int bye = !net->aborted && !net->fenced;
    if (bye) uvccl__live_bye(net->live);
    net->nclosing++;
    uvccl__live_close(net->live, bye);
  }
  if (net->listener_open) {
    net->nclosing++;
    net->listener.data = net;
    uv_close((uv_handle_t *)&net->listener, on_handle_closed);
    net->listener_open = 0;
  }
  if (net->slicer_open) {
    net->nclosing++;
    net->slicer.data = net;
    uv_close((uv_handle_t *)&net->slicer, on_handle_closed);
    net->slicer_open = 0;
  }
  if (net->tick_open) {
    net->nclosing++;
    uv_close((uv_handle_t *)&net->tick, on_handle_closed);
    net->tick_open = 0;
  }
  if (net->works_open) {
    /* Works completed before this are delivered from the close callbacks
     * (later ones, from handles of their own: uvccl__net_defer_works
     * refuses now). */
    net->works_open = 0;
    net->nclosing += 3;
    uv_close((uv_handle_t *)&net->deadline, on_works_closed);
    uv_close((uv_handle_t *)&net->deliver_chk, on_works_closed);
    uv_close((uv_handle_t *)&net->deliver_idle, on_works_closed);
  }
  if (net->spin_open) {
    /* Always there: so the net always closes from a callback. */
    net->nclosing++;
    net->spin.data = net;
    uv_close((uv_handle_t *)&net->spin, on_handle_closed);
    net->spin_open = 0;
  }
  for (p = net->pending; p != NULL; p = next) {
    next = p->next_pending;
    uvccl__net_peer_close(p);
  }
  net->pending = NULL;
  uvccl__acceptor_cancel(&net->acceptor);
  for (r = 0; r < net->size; r++) {
    peer_t *o = net->peers[r];
    int i;
    if (o == NULL) continue;
    for (i = -1; i < (o->lanes != NULL ? net->stripes - 1 : 0); i++) {
      peer_t *c = i < 0 ? o : o->lanes[i]; /* the rank's, then its lanes */
      if (c == NULL) continue;
      if (c->tls_hs != NULL) {
        uvccl__tls_cancel(c->tls_hs);
        c->tls_hs = NULL;
      }
      peer_teardown(c);
    }
  }
  net->local_xport->net_close(net);
}
