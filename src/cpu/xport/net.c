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
#include "cpu/internal.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <stdio.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "uvccl's frame format assumes a little-endian host"
#endif

static void peer_start_read(peer_t *p);
static void peer_close(peer_t *p);
static void net_creation_failed(net_t *net, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Takes an unnamed incoming connection off the net's list (it is adopted
 * as a rank, or closed). */
static void pending_unlink(peer_t *p) {
  peer_t **pp;
  for (pp = &p->net->pending; *pp != NULL; pp = &(*pp)->next_pending)
    if (*pp == p) {
      *pp = p->next_pending;
      break;
    }
}
static void peer_wq_open(peer_t *p);
static int peer_write_ctl(peer_t *p, uvccl__wreq_t *req, void *buf,
                          size_t len, void (*cb)(uvccl__wreq_t *, int));
static void peer_close_tcp(peer_t *p);
void uvccl__net_maybe_closed(net_t *net);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
static void on_write(uvccl__wreq_t *req, int status);
static void on_peer_closed(uv_handle_t *h);
static void on_ctl_written(uvccl__wreq_t *req, int status);
static int not_yet_connected(const net_t *net, int r);

/* A control frame, copied: written now, or queued on a peer not yet
 * connected (sparse worlds). */
typedef struct ctl_s {
  uvccl__wreq_t req;
  struct ctl_s *next;
  size_t len;
  unsigned char buf[];
} ctl_t;

/* ---- helpers --------------------------------------------------------------- */

static void hdr_encode(unsigned char *b, const frame_hdr_t *h) {
  memcpy(b, h, UVCCL__FRAME_HDR);
}

static void hdr_decode(frame_hdr_t *h, const unsigned char *b) {
  memcpy(h, b, UVCCL__FRAME_HDR);
}

const char *uvccl__net_transport(net_t *net, int r) {
  peer_t *p;
  if (r < 0 || r >= net->size) return "?";
  if (r == net->rank) return "self";
  p = net->peers[r];
  if (p == NULL || p->state != PEER_UP) return "?";
  return p->shm_tx ? "shm" : "tcp";
}

const char *uvccl__net_addr(net_t *net, int r) {
  if (r < 0 || r >= net->size) return "?";
  if (r == net->rank) return net->selfstr;
  return net->addrs[r][0] ? net->addrs[r] : "?";
}

group_t *uvccl__net_group(net_t *net, uint32_t gid) {
  group_t *g;
  for (g = net->groups; g != NULL; g = g->next)
    if (g->gid == gid && !g->destroying) return g;
  return NULL;
}

/* The connection to r broke and the monitor has not yet said who failed
 * first: work involving r waits for that verdict (which fails it with the
 * right culprit) instead of failing now with whatever the socket said.
 * The same for a rank that left: it may have left because a third rank
 * failed, which the monitor tells before it confirms the leave. */
static int awaiting_verdict(net_t *net, int r) {
  peer_t *p = net->peers[r];
  return net->live != NULL && !net->fenced && !net->closing && p != NULL &&
         p->state == PEER_DEAD && !p->left_applied && net->fails[r].rank < 0;
}

int uvccl__net_peer_ok(net_t *net, int r, char *msg, size_t len) {
  peer_t *p;
  if (net->aborted) {
    snprintf(msg, len, "the group was aborted");
    return UVCCL_EABORTED;
  }
  if (r == net->rank) return 0;
  p = net->peers[r];
  /* the usual case first: a connected peer nobody reported */
  if (p != NULL && p->state == PEER_UP && net->fails[r].rank < 0) return 0;
  if (awaiting_verdict(net, r)) return 1;
  if (net->fails[r].rank >= 0) {
    snprintf(msg, len, "rank %d (%s) failed: %s", r, uvccl__net_addr(net, r),
             net->fails[r].detail);
    return UVCCL_EPEER;
  }
  if (not_yet_connected(net, r))
    return 0; /* connected when it (or we) first send */
  if (p == NULL || p->state != PEER_UP) {
    snprintf(msg, len, "rank %d (%s) is not connected%s%s", r,
             uvccl__net_addr(net, r), p && p->err ? ": " : "",
             p && p->err ? uvccl_strerror(p->err) : "");
    return UVCCL_EPEER;
  }
  return 0;
}

int uvccl__net_left_cleanly(net_t *net, int r) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  return p != NULL && p->left && p->state == PEER_DEAD && !net->aborted &&
         net->fails[r].rank < 0;
}

/* ---- life cycle ------------------------------------------------------------ */

static void on_tick(uv_prepare_t *h) {
  net_t *net = h->data;
  uvccl__turn_tick(&net->turn);
}

net_t *uvccl__net_new(uv_loop_t *loop, int rank, int size) {
  net_t *net = uvccl__calloc(1, sizeof(*net));
  if (net == NULL) return NULL;
  net->loop = loop;
  net->rank = rank;
  net->size = size;
  net->peers = uvccl__calloc((size_t)size, sizeof(peer_t *));
  net->addrs = uvccl__calloc((size_t)size, sizeof(*net->addrs));
  net->fails = uvccl__calloc((size_t)size, sizeof(*net->fails));
  net->failed = uvccl__calloc((size_t)size, sizeof(int));
  if (net->peers == NULL || net->addrs == NULL || net->fails == NULL ||
      net->failed == NULL) {
    uvccl__free(net->peers);
    uvccl__free(net->addrs);
    uvccl__free(net->fails);
    uvccl__free(net->failed);
    uvccl__free(net);
    return NULL;
  }
  {
    int r;
    for (r = 0; r < size; r++) net->fails[r].rank = -1;
    net->first.rank = -1;
  }
  if (uv_random(NULL, NULL, &net->nonce, sizeof(net->nonce), 0, NULL) != 0)
    net->nonce = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
  net->early_limit = UVCCL__EARLY_LIMIT;
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

static peer_t *peer_new(net_t *net, int rank) {
  peer_t *p = uvccl__calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  p->net = net;
  p->rank = rank;
  p->rcap = UVCCL__RBUF;
  p->rbuf = uvccl__malloc(p->rcap);
  if (p->rbuf == NULL) {
    uvccl__free(p);
    return NULL;
  }
  uv_timer_init(net->loop, &p->retry);
  p->retry.data = p;
  p->retry_open = 1;
  return p;
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

static void on_spin(uv_idle_t *h) {
  net_t *net = h->data;
  uint64_t now, window;
  if (net->shm != NULL) {
    uvccl__turn_enter(&net->turn, UVCCL__SITE_SPIN, NULL);
    uvccl__shm_poll(net);
    uvccl__turn_leave(&net->turn);
  }
  if (net->inflight == 0) {
    uv_idle_stop(h);
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
  if (net->spin_check == 2 ||
      (window > 20000 && net->spin_until_ns - now < window - 20000))
    sched_yield();
}

/* ---- the schedules' works ---------------------------------------------------- */

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
  if (net->closing || !uvccl__shm_active(net) ||
      (net->spin_check != 1 && net->spin_check != 2) ||
      !uv_is_active((uv_handle_t *)&net->spin) ||
      uv_is_active((uv_handle_t *)&net->slicer))
    return 0;
  /* Oversubscribed (up to 2 ranks a CPU): give the CPU away when nothing
   * moved, as on_spin does, but without the loop turn around it (an
   * epoll_wait, the timers, the handles): with ranks taking turns on a
   * CPU, a turn's length is the latency, and that system call was half
   * of a turn's system calls. */
  if (!uvccl__shm_poll(net) && net->spin_check == 2) sched_yield();
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
 * UVCCL_BUSY_POLL_FORCE=1. Ranks count as local when their published
 * address has our host part. */
int uvccl__net_local_ranks(const net_t *net) {
  const char *me = net->selfstr, *colon = strrchr(me, ':');
  size_t hl = colon ? (size_t)(colon - me) : strlen(me);
  int r, local = 1, known = 1;
  for (r = 0; r < net->size; r++) {
    if (r == net->rank || net->addrs[r][0] == '\0') continue;
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
           local <= 2 * ncpu ? "shared memory spins yielding the CPU, TCP "
                               "does not spin"
                             : "nobody spins");
  /* up to 2 ranks a CPU, shared memory still spins, yielding (below) */
  return local <= 2 * ncpu ? 1 : 2;
}

/* Without busy polling, a loop whose peers talk through shared memory
 * still looks at its rings for a short while before it sleeps: an answer
 * due within microseconds then costs no wake-up (a sleeping loop takes
 * tens of microseconds to wake on a virtual machine). $UVCCL_SHM_SPIN_US
 * (default 100: longer than a wake-up takes here, so two ranks never
 * settle into waking each other turn by turn; 0: sleep at once). */
static uint32_t shm_spin_us(void) {
  static int have;
  static uint32_t us;
  if (!have) {
    uint64_t n;
    uvccl__config_uint(UVCCL__CFG_SHM_SPIN_US, &n);
    us = (uint32_t)n;
    have = 1;
  }
  return us;
}

int uvccl__net_oversubscribed(net_t *net) {
  if (net->spin_check == 0) net->spin_check = 1 + spin_oversubscribed(net);
  return net->spin_check > 1;
}

void uvccl__net_kick_spin(net_t *net) {
  uint32_t us;
  if (net->closing || net->inflight == 0) return;
  us = net_busy_us(net);
  if (us == 0 && uvccl__shm_active(net)) us = shm_spin_us();
  if (us == 0) return;
  uvccl__net_oversubscribed(net);
  /* Oversubscribed: TCP does not spin (see above); shared memory spins
   * yielding the CPU each turn (on_spin), so the rank whose answer is
   * awaited runs at once: 4 ranks on 2 cores wait 14 us for a 4 B
   * allreduce that way, 55 us sleeping in epoll. Past 2 ranks a CPU
   * nobody spins (the spinners' turns then delay the ranks awaited). */
  if (net->spin_check == 3 ||
      (net->spin_check == 2 && !uvccl__shm_active(net)))
    return;
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

static int handoff_step(net_t *net);

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
    handoff_step(net);
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

static void slicer_start(net_t *net) {
  if (net->slicer_open && !uv_is_active((uv_handle_t *)&net->slicer))
    uv_idle_start(&net->slicer, on_slice);
}

void uvccl__net_retire_mem(net_t *net, void *p) {
  if (p == NULL) return;
  if (net == NULL || net->closing || !net->slicer_open) {
    uvccl__big_free(p);
    return;
  }
  uvccl__big_retire(&net->retired_mem, p);
  slicer_start(net);
}

void uvccl__net_slice_add(net_t *net, sop_t *op) {
  sop_list_push(&net->slices, op);
  slicer_start(net);
}

void uvccl__net_slice_remove(net_t *net, sop_t *op) {
  sop_list_remove(&net->slices, op);
}

/* ---- listening and accepting ------------------------------------------------- */

/* Refusals of connections that fail (or never try) authentication, or
 * never finish their handshake, are logged: up to 10 a second, so that
 * a flood of them cannot flood the log. */
static void net_refusal_log(net_t *net, const char *from, const char *why) {
  uint64_t now = uvccl__now_ms();
  if (now - net->auth_log_ms >= 1000) {
    if (net->auth_logged > 10)
      LOG_WARN("coll", "rank %d: %d more connections refused in the last "
               "second", net->rank, net->auth_logged - 10);
    net->auth_log_ms = now;
    net->auth_logged = 0;
  }
  if (++net->auth_logged <= 10)
    LOG_WARN("coll", "rank %d: refusing the connection from %s: %s",
             net->rank, from, why);
}

static void on_handshake_timeout(uv_timer_t *t) {
  peer_t *p = t->data;
  char why[64];
  if (p->rank >= 0 || p->state != PEER_CONNECTING) return;
  snprintf(why, sizeof(why), "no handshake within %d s",
           UVCCL__HANDSHAKE_MS / 1000);
  net_refusal_log(p->net, p->addrstr, why);
  peer_close(p);
}

/* ---- TLS (tls.h): the server's handshake runs before the connection is
 * a pending peer; its plaintext descriptor is then adopted as if
 * accepted. */
typedef struct tls_accept_s {
  net_t *net;
  uvccl__tls_hs_t *hs;
  char from[64];
  struct tls_accept_s *next;
} tls_accept_t;

static void peer_adopt(net_t *net, int fd, const char *from);

static void tls_accept_unlink(tls_accept_t *a) {
  tls_accept_t **pp;
  for (pp = &a->net->tls_accepts; *pp != NULL; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      break;
    }
}

static void on_tls_accepted(void *arg, int status, int fd, const char *msg) {
  tls_accept_t *a = arg;
  net_t *net = a->net;
  tls_accept_unlink(a);
  if (status != 0) net_refusal_log(net, a->from, msg);
  else peer_adopt(net, fd, a->from);
  uvccl__free(a);
}

static void tls_accepts_cancel(net_t *net) {
  while (net->tls_accepts != NULL) {
    tls_accept_t *a = net->tls_accepts;
    net->tls_accepts = a->next;
    uvccl__tls_cancel(a->hs);
    uvccl__free(a);
  }
}

static void tls_accept(net_t *net, uv_stream_t *server) {
  tls_accept_t *a = uvccl__calloc(1, sizeof(*a));
  if (a == NULL) return;
  a->net = net;
  if (uvccl__tls_accept_from(net->tls, server, net->hb_ms, 0,
                             on_tls_accepted, a, a->from, sizeof(a->from),
                             &a->hs) != 0) {
    uvccl__free(a);
    return;
  }
  a->next = net->tls_accepts;
  net->tls_accepts = a;
}

static void on_connection(uv_stream_t *server, int status) {
  net_t *net = server->data;
  if (status < 0) {
    LOG_WARN("coll", "accept failed: %s", uvccl_strerror(status));
    return;
  }
  if (net->tls != NULL) {
    tls_accept(net, server);
    return;
  }
  peer_adopt(net, -1, NULL);
}

/* A new incoming connection: accepted from the listener (fd -1), or the
 * plaintext descriptor of one TLS secured. */
static void peer_adopt(net_t *net, int fd, const char *from) {
  peer_t *p;
  p = peer_new(net, -1);
  if (p == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  uv_tcp_init(net->loop, &p->tcp);
  p->tcp.data = p;
  p->tcp_open = 1;
  if (fd >= 0 ? uv_tcp_open(&p->tcp, fd) != 0
              : uv_accept((uv_stream_t *)&net->listener,
                          (uv_stream_t *)&p->tcp) != 0) {
    if (fd >= 0) close(fd);
    peer_close(p);
    return;
  }
  uv_tcp_nodelay(&p->tcp, 1);
  peer_wq_open(p);
  if (from != NULL) {
    snprintf(p->addrstr, sizeof(p->addrstr), "%s", from);
  } else {
    uvccl__peer_addr(&p->tcp, p->addrstr, sizeof(p->addrstr));
  }
  p->state = PEER_CONNECTING;
  p->next_pending = net->pending;
  net->pending = p;
  /* A connection that has not named itself (and proven the secret, where
   * there is one) by then is closed: strays never pile up. */
  uv_timer_start(&p->retry, on_handshake_timeout, UVCCL__HANDSHAKE_MS, 0);
  peer_start_read(p);
}

static void net_on_live(void *arg, const uvccl__live_ev_t *ev);

int uvccl__net_listen(net_t *net, const struct sockaddr *addr, uint64_t hb_ms,
                      char *err, size_t errlen) {
  int rc, len = sizeof(net->self);
  uv_tcp_init(net->loop, &net->listener);
  net->listener.data = net;
  net->listener_open = 1;
  rc = uv_tcp_bind(&net->listener, addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&net->listener, 4096,
                              on_connection);
  if (rc == 0)
    rc = uv_tcp_getsockname(&net->listener, (struct sockaddr *)&net->self,
                            &len);
  if (rc != 0) {
    snprintf(err, errlen, "listening on %s: %s", "the chosen address",
             uvccl_strerror(rc));
    return rc;
  }
  uvccl__addr_fmt((struct sockaddr *)&net->self, net->selfstr, sizeof(net->selfstr));
  net->hb_ms = hb_ms;
  rc = uvccl__shm_net_init(net, err, errlen);
  if (rc != 0) return rc;
  if (net->size > 1) {
    net->live = uvccl__live_new(net->loop, net->rank, net->size,
                                (struct sockaddr *)&net->self, net->nonce,
                                &net->auth, net->tls, hb_ms, net->sparse,
                                net_on_live, net,
                                &net->live_port, err, errlen, &rc);
    if (net->live == NULL) return rc;
    /* sparse: known once the addresses are (uvccl__net_link_overlay) */
    net->want_links = net->sparse ? -1 : net->size - 1;
  }
  return 0;
}

/* ---- connecting ----------------------------------------------------------------- */

static void connect_start(peer_t *p);

static void on_retry_timer(uv_timer_t *t) {
  peer_t *p = t->data;
  if (p->net->closing || p->state != PEER_CONNECTING) return;
  connect_start(p);
}

static void on_retry_closed(uv_handle_t *h) {
  peer_t *p = h->data;
  net_t *net = p->net;
  net->nclosing--;
  if (net->closing) {
    uvccl__net_maybe_closed(net);
    return;
  }
  if (p->state == PEER_CONNECTING)
    uv_timer_start(&p->retry, on_retry_timer, p->backoff_ms, 0);
}

static void peer_connected(peer_t *p);

static void on_connect(uv_connect_t *req, int status) {
  peer_t *p = req->data;
  net_t *net = p->net;

  if (net->closing || p->state != PEER_CONNECTING) return;
  if (status == 0 && uvccl__tcp_is_self(&p->tcp)) status = UV_ECONNREFUSED;
  if (status < 0) {
    /* Until the deadline, a refused or unreachable peer is one that has
     * not started listening yet: try again with backoff (10 ms .. 1 s). */
    if (uvccl__now_ms() < p->retry.timeout && status != UV_ECANCELED) {
      p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 10;
      if (p->backoff_ms > 1000) p->backoff_ms = 1000;
      p->tcp_open = 0;
      net->nclosing++;
      uv_close((uv_handle_t *)&p->tcp, on_retry_closed);
      return;
    }
    uvccl__net_peer_fail(net, p, status, "connect failed");
    return;
  }
  peer_connected(p);
}

/* TLS: the connect and the handshake are done (or failed). */
static void on_tls_connected(void *arg, int status, int fd, const char *msg) {
  peer_t *p = arg;
  net_t *net = p->net;
  p->tls_hs = NULL;
  if (net->closing || p->state != PEER_CONNECTING) {
    if (fd >= 0) close(fd);
    return;
  }
  if (status == UVCCL_EAUTH) {
    net_creation_failed(net, UVCCL_EAUTH, "process group creation failed: "
                        "rank %d (%s): %s", p->rank, p->addrstr, msg);
    uvccl__net_peer_fail(net, p, UVCCL_EAUTH, msg);
    return;
  }
  if (status < 0) {
    if (uvccl__now_ms() < p->retry.timeout) {
      p->backoff_ms = p->backoff_ms ? p->backoff_ms * 2 : 10;
      if (p->backoff_ms > 1000) p->backoff_ms = 1000;
      uv_timer_start(&p->retry, on_retry_timer, p->backoff_ms, 0);
      return;
    }
    uvccl__net_peer_fail(net, p, status, msg);
    return;
  }
  uv_tcp_init(net->loop, &p->tcp);
  p->tcp.data = p;
  if (uv_tcp_open(&p->tcp, fd) != 0) {
    close(fd);
    p->tcp_open = 1;
    uvccl__net_peer_fail(net, p, UV_EIO, "adopting the TLS connection");
    return;
  }
  p->tcp_open = 1;
  peer_connected(p);
}

/* The connection is made: hello. */
static void peer_connected(peer_t *p) {
  net_t *net = p->net;
  frame_hdr_t h;
  hello_t hello;
  int rc;

  uv_tcp_nodelay(&p->tcp, 1);
  peer_wq_open(p);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_HELLO;
  h.len = sizeof(hello);
  if (net->auth.set) {
    if (uvccl__auth_random(p->auth_nc, sizeof(p->auth_nc)) != 0) {
      uvccl__net_peer_fail(net, p, UVCCL_EAUTH, "no random nonce");
      return;
    }
    h.len += UVCCL__AUTH_NONCE; /* the nonce follows the hello */
  }
  memset(&hello, 0, sizeof(hello));
  hello.magic = UVCCL__HELLO_MAGIC;
  hello.version = UVCCL__WIRE_VERSION;
  hello.from = (uint32_t)net->rank;
  hello.to = (uint32_t)p->rank;
  hello.to_nonce = p->nonce;
  hello.world = (uint32_t)net->size;
  snprintf(hello.addr, sizeof(hello.addr), "%s", net->selfstr);
  hdr_encode(p->hello_buf, &h);
  memcpy(p->hello_buf + UVCCL__FRAME_HDR, &hello, sizeof(hello));
  if (net->auth.set) {
    memcpy(p->hello_buf + UVCCL__FRAME_HDR + sizeof(hello), p->auth_nc,
           UVCCL__AUTH_NONCE);
    p->auth_hello = hello;
  }
  peer_start_read(p);
  rc = peer_write_ctl(p, &p->hello_req, p->hello_buf,
                      UVCCL__FRAME_HDR + (size_t)h.len, NULL);
  if (rc != 0) uvccl__net_peer_fail(net, p, rc, "sending hello failed");
}

static void connect_start(peer_t *p) {
  int rc;
  if (p->net->tls != NULL) {
    rc = uvccl__tls_connect(p->net->tls, p->net->loop,
                            (struct sockaddr *)&p->addr, p->net->hb_ms, 0,
                            on_tls_connected, p, &p->tls_hs);
    if (rc != 0) uvccl__net_peer_fail(p->net, p, rc, "connect failed");
    return;
  }
  uv_tcp_init(p->net->loop, &p->tcp);
  p->tcp.data = p;
  p->tcp_open = 1;
  p->creq.data = p;
  rc = uv_tcp_connect(&p->creq, &p->tcp, (struct sockaddr *)&p->addr,
                      on_connect);
  if (rc != 0) uvccl__net_peer_fail(p->net, p, rc, "connect failed");
}

int uvccl__net_connect(net_t *net, int rank, const struct sockaddr *addr,
                       uint64_t nonce, int live_port, uint64_t deadline_ms) {
  peer_t *p;
  if (rank < 0 || rank >= net->size || net->peers[rank] != NULL)
    return UV_EINVAL;
  if (net->live != NULL) {
    struct sockaddr_storage la;
    memcpy(&la, addr, addr->sa_family == AF_INET6
                          ? sizeof(struct sockaddr_in6)
                          : sizeof(struct sockaddr_in));
    if (la.ss_family == AF_INET6)
      ((struct sockaddr_in6 *)&la)->sin6_port = htons((uint16_t)live_port);
    else
      ((struct sockaddr_in *)&la)->sin_port = htons((uint16_t)live_port);
    uvccl__live_connect(net->live, rank, (struct sockaddr *)&la, nonce,
                        deadline_ms);
  }
  p = peer_new(net, rank);
  if (p == NULL) return UV_ENOMEM;
  p->outgoing = 1;
  p->nonce = nonce;
  p->state = PEER_CONNECTING;
  memcpy(&p->addr, addr,
         addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                     : sizeof(struct sockaddr_in));
  uvccl__addr_fmt(addr, p->addrstr, sizeof(p->addrstr));
  /* The retry timer's due time doubles as the connect deadline. */
  p->retry.timeout = deadline_ms;
  net->peers[rank] = p;
  connect_start(p);
  return 0;
}

/* ---- sparse worlds: lazy connections ------------------------------------------
 * A world above UVCCL_MESH_MAX ranks connects nothing at creation: a
 * schedule's first send to a rank dials it (the address comes from the
 * book, which holds the overlay neighbours' from creation, or else from
 * the store through net->lookup), and a receive
 * from a rank not yet connected waits on a placeholder for the sender's
 * dial. A ring then costs two connections per rank, not N - 1.
 *
 * Two ranks may dial each other at once. The higher rank's connection
 * wins: the lower one adopts it (peer_takeover moves what waited on its
 * own attempt over) and the higher one refuses the lower's with
 * FRAME_CROSSED, after which the lower waits for the higher's dial. */

int uvccl__net_set_sparse(net_t *net) {
  net->book = uvccl__calloc((size_t)net->size, sizeof(*net->book));
  if (net->book == NULL) return UV_ENOMEM;
  net->sparse = 1;
  return 0;
}

int uvccl__net_book(net_t *net, int rank, const struct sockaddr *addr,
                    uint64_t nonce, int live_port) {
  net_book_t *b;
  if (net->book == NULL || rank < 0 || rank >= net->size) return UV_EINVAL;
  b = &net->book[rank];
  memset(&b->addr, 0, sizeof(b->addr));
  memcpy(&b->addr, addr, addr->sa_family == AF_INET6
                             ? sizeof(struct sockaddr_in6)
                             : sizeof(struct sockaddr_in));
  b->nonce = nonce;
  b->live_port = live_port;
  return 0;
}

int uvccl__overlay_neighbours(int rank, int size, int *out, int max) {
  int n = 0, d, s, j, k, seen;
  for (d = 1; d < size; d *= 2)
    for (s = -1; s <= 1; s += 2) {
      j = ((rank + s * d) % size + size) % size;
      if (j == rank) continue;
      for (seen = 0, k = 0; k < n; k++) seen |= out[k] == j;
      if (!seen && n < max) out[n++] = j;
    }
  return n;
}

void uvccl__net_link_overlay(net_t *net, uint64_t deadline_ms) {
  int nb[128], n, i;
  if (net->live == NULL || net->book == NULL) return;
  n = uvccl__overlay_neighbours(net->rank, net->size, nb, 128);
  net->want_links = n;
  for (i = 0; i < n; i++) {
    net_book_t *b = &net->book[nb[i]];
    struct sockaddr_storage la = b->addr;
    if (nb[i] > net->rank) continue; /* the higher rank dials */
    if (la.ss_family == AF_INET6)
      ((struct sockaddr_in6 *)&la)->sin6_port = htons((uint16_t)b->live_port);
    else
      ((struct sockaddr_in *)&la)->sin_port = htons((uint16_t)b->live_port);
    uvccl__live_connect(net->live, nb[i], (struct sockaddr *)&la, b->nonce,
                        deadline_ms);
  }
  uvccl__net_check_ready(net);
}

void uvccl__net_set_lookup(net_t *net, int (*start)(void *, int),
                           void (*close)(void *), void *arg) {
  net->lookup = start;
  net->lookup_close = close;
  net->lookup_arg = arg;
}

static int booked(const net_t *net, int r) {
  return net->book != NULL && net->book[r].addr.ss_family != 0;
}

/* Sparse worlds: r is not connected yet, and may be (what is sent to it
 * waits; what comes from it comes when it dials). */
static int not_yet_connected(const net_t *net, int r) {
  const peer_t *p = net->peers[r];
  return net->sparse && !net->closing && r != net->rank &&
         net->fails[r].rank < 0 &&
         (p == NULL || p->state == PEER_NONE || p->state == PEER_CONNECTING);
}

/* A placeholder for rank r (sparse worlds): receives post on it, sends
 * queue on it, until a connection to r is up. */
static peer_t *peer_need(net_t *net, int r) {
  peer_t *p = net->peers[r];
  if (p != NULL || !net->sparse) return p;
  p = peer_new(net, r);
  if (p == NULL) return NULL;
  p->state = PEER_NONE;
  if (booked(net, r))
    uvccl__addr_fmt((struct sockaddr *)&net->book[r].addr, p->addrstr,
                    sizeof(p->addrstr));
  else
    snprintf(p->addrstr, sizeof(p->addrstr), "?");
  net->peers[r] = p;
  return p;
}

/* Dials a placeholder's rank. A refused connect is retried briefly (the
 * monitor reports a dead rank meanwhile). */
#define UVCCL__DIAL_MS 10000
static void peer_dial_booked(peer_t *p) {
  net_t *net = p->net;
  p->nonce = net->book[p->rank].nonce;
  memcpy(&p->addr, &net->book[p->rank].addr, sizeof(p->addr));
  uvccl__addr_fmt((struct sockaddr *)&p->addr, p->addrstr,
                  sizeof(p->addrstr));
  p->retry.timeout = uvccl__now_ms() + UVCCL__DIAL_MS;
  LOG_DEBUG("coll", "rank %d: dialing rank %d (%s)", net->rank, p->rank,
            p->addrstr);
  connect_start(p);
}

static void peer_dial(peer_t *p) {
  net_t *net = p->net;
  int rc;
  if (p->state != PEER_NONE || net->closing) return;
  p->outgoing = 1;
  p->state = PEER_CONNECTING;
  if (booked(net, p->rank)) {
    peer_dial_booked(p);
    return;
  }
  /* Where it is comes from the store first. */
  p->looking = 1;
  rc = net->lookup != NULL ? net->lookup(net->lookup_arg, p->rank)
                           : UV_EINVAL;
  if (rc != 0) {
    p->looking = 0;
    uvccl__net_peer_fail(net, p, rc, "its address could not be read from "
                         "the store");
  }
}

void uvccl__net_lookup_done(net_t *net, int r, int status, const char *why) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (p == NULL || !p->looking || net->closing) return;
  p->looking = 0;
  if (p->state != PEER_CONNECTING) return;
  if (status != 0) {
    uvccl__net_peer_fail(net, p, status, why);
    return;
  }
  peer_dial_booked(p);
}

static void sop_list_move(sop_list_t *dst, sop_list_t *src) {
  sop_t *op;
  while ((op = src->head) != NULL) {
    sop_list_remove(src, op);
    sop_list_push(dst, op);
  }
}

/* The connection p (incoming, just named) replaces q, this rank's own
 * attempt or placeholder for the same rank: what waits moves over, q
 * goes quietly. */
static void peer_takeover(peer_t *p, peer_t *q) {
  net_t *net = p->net;
  sop_list_move(&p->posted, &q->posted);
  sop_list_move(&p->waitq, &q->waitq);
  p->ctlq = q->ctlq;
  p->ctlq_tail = q->ctlq_tail;
  q->ctlq = q->ctlq_tail = NULL;
  if (q->tls_hs != NULL) {
    uvccl__tls_cancel(q->tls_hs);
    q->tls_hs = NULL;
  }
  net->peers[q->rank] = NULL;
  LOG_DEBUG("coll", "rank %d: rank %d's dial wins over ours", net->rank,
            q->rank);
  /* Its handles may be closing already (a crossed attempt): its memory
   * stays until the net goes, like a named peer's. */
  q->state = PEER_CLOSING;
  q->next_pending = net->retired;
  net->retired = q;
  uv_timer_stop(&q->retry);
  peer_close_tcp(q);
  if (q->retry_open) {
    q->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&q->retry, on_peer_closed);
  }
}

static void on_crossed_timeout(uv_timer_t *t) {
  peer_t *p = t->data;
  if (p->state != PEER_CONNECTING || !p->crossed) return;
  uvccl__net_peer_fail(p->net, p, UV_ETIMEDOUT, "it refused our connection "
                       "as crossed but never connected back");
}

/* Our dial met the other side's (it is the higher rank): wait for its. */
static void peer_crossed(peer_t *p) {
  p->crossed = 1;
  peer_close_tcp(p);
  uv_timer_start(&p->retry, on_crossed_timeout, UVCCL__DIAL_MS, 0);
}

static int peer_transmit(net_t *net, peer_t *p, sop_t *op);

static void ctl_flush(peer_t *p) {
  ctl_t *c;
  while ((c = p->ctlq) != NULL && p->state == PEER_UP) {
    p->ctlq = c->next;
    if (p->ctlq == NULL) p->ctlq_tail = NULL;
    if (peer_write_ctl(p, &c->req, c->buf, c->len, on_ctl_written) != 0)
      uvccl__free(c);
  }
}

static void ctl_drop(peer_t *p) {
  ctl_t *c;
  while ((c = p->ctlq) != NULL) {
    p->ctlq = c->next;
    uvccl__free(c);
  }
  p->ctlq_tail = NULL;
}

void uvccl__net_peer_ready(peer_t *p) {
  net_t *net = p->net;
  sop_t *op;
  while ((op = p->waitq.head) != NULL && p->state == PEER_UP) {
    int rc;
    sop_list_remove(&p->waitq, op);
    op->writing = 0;
    rc = peer_transmit(net, p, op);
    if (rc == 1) {
      uvccl__net_kick_spin(net);
      net->up->op_done(op);
    } else if (rc != 0) {
      net->up->send_lost(op); /* the verdict on p fails the schedule */
    }
  }
}

/* ---- output ------------------------------------------------------------------------ */

static void peer_wq_open(peer_t *p) {
  uvccl__sendq_init(&p->sendq, p->net->loop, &p->tcp);
  p->sendq.data = p;
  p->sendq.turn = &p->net->turn;
  p->sendq_open = 1;
}

/* A control frame (hello, ack, bye): at once when the socket takes it,
 * else queued behind the frames already queued. cb (may be NULL) runs
 * when it is written: inside this call when it went at once. */
static int peer_write_ctl(peer_t *p, uvccl__wreq_t *req, void *buf,
                          size_t len, void (*cb)(uvccl__wreq_t *, int)) {
  uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
  ssize_t n;
  if (!p->sendq_open) return UV_EPIPE;
  n = uvccl__sendq_try(&p->sendq, &b, 1);
  if (n < 0) return (int)n;
  if ((size_t)n == len) {
    if (cb != NULL) {
      req->data = p;
      cb(req, 0);
    }
    return 0;
  }
  b.base += n;
  b.len -= (size_t)n;
  req->data = p;
  return uvccl__sendq_write(&p->sendq, req, &b, 1, cb ? cb : NULL);
}

/* Creation is over once every peer is connected and linked. */
void uvccl__net_check_ready(net_t *net) {
  void (*cb)(net_t *, int, const char *) = net->mesh_cb;
  if (cb == NULL) return;
  if (!net->sparse &&
      (net->nup != net->size - 1 || net->shm_done != net->size - 1))
    return;
  if (net->live != NULL && net->links_up != net->want_links) return;
  net->mesh_cb = NULL;
  cb(net, 0, NULL);
}

/* Creation cannot succeed (the caller says why). */
static void net_creation_failed(net_t *net, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void net_creation_failed(net_t *net, int err, const char *fmt, ...) {
  void (*cb)(net_t *, int, const char *) = net->mesh_cb;
  char msg[UVCCL_WORK_MSG_LEN];
  va_list ap;
  if (cb == NULL) return;
  net->mesh_cb = NULL;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cb(net, err, msg);
}

static void peer_up(peer_t *p) {
  net_t *net = p->net;
  p->state = PEER_UP;
  net->nup++;
  LOG_DEBUG("coll", "rank %d: connected to rank %d (%s)", net->rank, p->rank,
            p->addrstr);
  {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&p->tcp, &fd) == 0)
      uvccl__tune_socket(fd, net->hb_ms, 0);
  }
  /* Same host? Each side offers its inbox (shm.c); creation completes
   * once every peer answered. */
  uvccl__shm_peer_up(p);
  if (p->state != PEER_UP) return;
  ctl_flush(p);
  if (p->state != PEER_UP) return;
  uvccl__net_check_ready(net);
}

/* ---- receiving ------------------------------------------------------------------- */

/* The least a read in a spent turn takes (see uvccl__turn_allow), and
 * the most one does: libuv reads again at once when a read fills its
 * buffer, within the same turn, which looks at its clock between reads
 * (see SENDQ_PIECE in sendq.c). */
#define READ_STEP (64u * 1024)
#define READ_PIECE (128u * 1024)

static size_t read_allow(net_t *net, uint64_t left) {
  size_t n = uvccl__turn_allow(&net->turn, (size_t)left, READ_STEP);
  return n < READ_PIECE ? n : READ_PIECE;
}

/* libuv reads a socket in a loop of alloc and read callbacks, all one
 * turn (the peer is its key). Once the turn is spent, the next buffer is
 * empty: libuv calls on_read with UV_ENOBUFS and leaves the socket, which
 * is still readable, to the loop's next iteration. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  peer_t *p = h->data;
  uint64_t left = p->rx.cur.len - p->rx.cur_got;
  (void)suggested;
  uvccl__turn_enter(&p->net->turn, UVCCL__SITE_READ, p);
  if (uvccl__turn_spent(&p->net->turn)) {
    buf->base = p->rbuf;
    buf->len = 0;
    p->read_refused = 1;
    return;
  }
  switch (p->rx.rstate) {
  case RS_DIRECT:
    buf->base = p->rx.cur_op->buf + p->rx.cur_got;
    buf->len = read_allow(p->net, left);
    return;
  case RS_EARLY:
    buf->base = p->rx.cur_early->data + p->rx.cur_got;
    buf->len = read_allow(p->net, left);
    return;
  case RS_REDUCE:
    /* Only this frame's bytes: the reduction consumes them in place. */
    buf->base = p->rbuf + p->rlen;
    buf->len = p->rcap - p->rlen;
    if ((uint64_t)buf->len > left - (p->rlen)) {
      /* rlen bytes of this frame are already buffered */
      buf->len = (size_t)(left - p->rlen);
    }
    /* (each read is reduced at once: a piece, so the turn's clock is read
     * between them) */
    if (buf->len > READ_PIECE) buf->len = READ_PIECE;
    return;
  default:
    /* At a frame boundary: read the header and a little more, so a small
     * frame costs one read, but never pull much of a large payload into
     * rbuf, which would cost a second copy to its destination. When the
     * read fills this, libuv reads again at once, straight into place. */
    buf->base = p->rbuf + p->rlen;
    buf->len = p->rcap - p->rlen;
    if (buf->len > UVCCL__HDR_READ) buf->len = UVCCL__HDR_READ;
    return;
  }
}

static void peer_start_read(peer_t *p) {
  if (p->reading || !p->tcp_open) return;
  p->reading = 1;
  uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read);
}

static void peer_stop_read(peer_t *p) {
  if (!p->reading) return;
  p->reading = 0;
  uv_read_stop((uv_stream_t *)&p->tcp);
}

static void op_recv_done(sop_t *op) {
  op->got = op->len;
  op->s->g->net->up->op_done(op);
}

/* ---- early frames ------------------------------------------------------------
 * A frame that arrives before its receive is posted is copied into an early
 * buffer. That is the common case for pipelined collectives (a peer a step
 * ahead), and a large buffer from malloc is fresh pages each time (glibc
 * maps and unmaps it): a page fault per 4 KiB, about a tenth of a rank's
 * time in a 1 MiB allreduce of 4 ranks on 2 cores (bench/RESULTS.md). So
 * the net keeps a few freed buffers of EARLY_SPARE_MIN bytes or more for
 * the next frames, EARLY_SPARE_N of them and EARLY_SPARE_BYTES in all,
 * until it closes; smaller ones are malloc's business. */
#define EARLY_SPARE_MIN ((uint64_t)16 * 1024)
#define EARLY_SPARE_N 8u
#define EARLY_SPARE_BYTES ((uint64_t)16 * 1024 * 1024)
/* Small frames (a small collective's, whose peer is a step ahead) are
 * held in buffers of EARLY_SMALL bytes, EARLY_SMALL_N of them kept: no
 * malloc and free for every early 4-byte allreduce. */
#define EARLY_SMALL ((uint64_t)256)
#define EARLY_SMALL_N 16u

static early_t *early_alloc(net_t *net, uint64_t len) {
  early_t **pp, **best = NULL, *st;
  if (len <= EARLY_SMALL) {
    if ((st = net->early_small) != NULL) {
      net->early_small = st->next;
      net->early_small_n--;
    } else {
      st = uvccl__malloc(sizeof(*st) + (size_t)EARLY_SMALL);
      if (st == NULL) return NULL;
    }
    memset(st, 0, sizeof(*st));
    st->cap = EARLY_SMALL;
    return st;
  }
  if (len >= EARLY_SPARE_MIN)
    for (pp = &net->early_spare; *pp != NULL; pp = &(*pp)->next)
      if ((*pp)->cap >= len && (best == NULL || (*pp)->cap < (*best)->cap))
        best = pp;
  if (best != NULL) {
    st = *best;
    *best = st->next;
    net->early_spare_n--;
    net->early_spare_bytes -= st->cap;
  } else if (sizeof(*st) + len >= UVCCL__BIG_MIN) {
    /* (unmapped in slices when it goes: see early_free) */
    st = uvccl__big_alloc(sizeof(*st) + (size_t)len);
    if (st == NULL) return NULL;
    st->cap = len;
    st->big = 1;
  } else {
    st = uvccl__malloc(sizeof(*st) + (size_t)len);
    if (st == NULL) return NULL;
    st->cap = len;
    st->big = 0;
  }
  {
    uint64_t cap = st->cap;
    uint8_t big = st->big;
    memset(st, 0, sizeof(*st));
    st->cap = cap;
    st->big = big;
  }
  return st;
}

/* Gone now (teardown). */
static void early_release(early_t *st) {
  if (st->big) uvccl__big_free(st);
  else uvccl__free(st);
}

static void early_free(net_t *net, early_t *st) {
  if (st->cap == EARLY_SMALL && net->early_small_n < EARLY_SMALL_N) {
    st->next = net->early_small;
    net->early_small = st;
    net->early_small_n++;
    return;
  }
  if (st->cap >= EARLY_SPARE_MIN && net->early_spare_n < EARLY_SPARE_N &&
      net->early_spare_bytes + st->cap <= EARLY_SPARE_BYTES) {
    st->next = net->early_spare;
    net->early_spare = st;
    net->early_spare_n++;
    net->early_spare_bytes += st->cap;
    return;
  }
  if (st->big) uvccl__net_retire_mem(net, st);
  else uvccl__free(st);
}

/* Takes st out of the list (head, tail); 0 when it was not in it. */
static int early_list_unlink(early_t **head, early_t **tail, early_t *st) {
  early_t **pp = head, *prev = NULL;
  while (*pp != NULL && *pp != st) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (*pp == NULL) return 0;
  *pp = st->next;
  if (*tail == st) *tail = prev;
  st->next = NULL;
  return 1;
}

/* Delivers a complete early frame to the receive that claimed it. */
static void early_deliver(net_t *net, early_t *st, sop_t *op) {
  op->source = st->from;
  if (op->type == SOP_RECV_RED)
    net->up->reduce_in(op, 0, st->data, (size_t)st->len);
  else if (st->len > 0)
    memcpy(op->buf, st->data, (size_t)st->len);
  uvccl__turn_charge(&net->turn, (size_t)st->len);
  op->got = st->len;
  if (op->p2p) op->len = (size_t)st->len;
  net->up->op_done(op);
}

/* ---- handing over ----------------------------------------------------------
 * A receive posted for a frame that came first (an early frame) takes
 * its bytes in slices, a turn's worth a loop iteration, from the
 * slicer (a 256 MiB frame must not be copied in one callback); a frame
 * still arriving then goes on straight into the receive's buffer, so only
 * what came early is copied twice. Small frames are delivered at once. */
#define HANDOFF_INLINE ((uint64_t)64 * 1024)
#define HANDOFF_STEP (64u * 1024) /* a multiple of every element size */

static void handoff_start(net_t *net, early_t *st, sop_t *op, uint64_t upto) {
  st->claim = op;
  st->upto = upto;
  st->done = 0;
  st->next = NULL;
  op->handoff = st;
  op->source = st->from;
  if (op->p2p) op->len = (size_t)st->len;
  if (net->handoffs_tail) net->handoffs_tail->next = st;
  else net->handoffs = st;
  net->handoffs_tail = st;
  slicer_start(net);
}

static void handoff_unlink(net_t *net, early_t *st) {
  early_list_unlink(&net->handoffs, &net->handoffs_tail, st);
}

/* The next slice of the head of the hand-overs; 1 when one ended. */
static int handoff_step(net_t *net) {
  early_t *st = net->handoffs;
  sop_t *op = st->claim;
  size_t n = uvccl__turn_piece(&net->turn, (size_t)(st->upto - st->done),
                               HANDOFF_STEP);
  if (n < st->upto - st->done) n -= n % HANDOFF_STEP;
  if (op->type == SOP_RECV_RED)
    net->up->reduce_in(op, (size_t)st->done, st->data + st->done, n);
  else
    memcpy(op->buf + st->done, st->data + st->done, n);
  uvccl__turn_charge(&net->turn, n);
  st->done += n;
  if (st->done < st->upto) return 0;
  handoff_unlink(net, st);
  op->handoff = NULL;
  /* the frame is all here (early) or its rest went straight in: done;
   * else frame_end finishes it */
  if (st->got == st->len) op_recv_done(op);
  early_free(net, st);
  return 1;
}

/* A complete early frame to op: small, at once; else in slices. */
static void early_give(net_t *net, early_t *st, sop_t *op) {
  if (st->len <= HANDOFF_INLINE && !uvccl__turn_spent(&net->turn)) {
    early_deliver(net, st, op);
    early_free(net, st);
    return;
  }
  handoff_start(net, st, op, st->len);
}

/* A receive is no longer interested (its work failed). */
static void handoff_drop(net_t *net, sop_t *op) {
  early_t *st = op->handoff;
  handoff_unlink(net, st);
  op->handoff = NULL;
  early_free(net, st);
}

/* The rx (a socket's or a ring's) whose current frame st is, or NULL. */
static rx_t *early_rx(peer_t *p, early_t *st) {
  if (p->rx.cur_early == st) return &p->rx;
  if (p->srx.cur_early == st) return &p->srx;
  return NULL;
}

static void early_unlink(peer_t *p, early_t *st) {
  if (!early_list_unlink(&p->early_head, &p->early_tail, st)) return;
  p->early_bytes -= st->len;
  if (p->paused && p->early_bytes <= p->net->early_limit / 2) {
    p->paused = 0;
    peer_start_read(p);
    uvccl__shm_kick(p); /* its ring too */
  }
}

/* The receive a frame is for, or NULL. */
static sop_t *match_frame(peer_t *p, const frame_hdr_t *h, group_t **gp) {
  sop_t *op;
  *gp = NULL;
  if (h->kind == FRAME_COLL) {
    for (op = p->posted.head; op != NULL; op = op->next)
      if (op->tag == h->tag && op->s->seq == h->seq && op->s->g->gid == h->gid)
        return op;
    return NULL;
  }
  *gp = uvccl__net_group(p->net, h->gid);
  if (*gp == NULL) return NULL;
  for (op = (*gp)->p2p.head; op != NULL; op = op->next)
    if (op->tag == h->tag && (op->peer == -1 || op->peer == p->rank))
      return op;
  return NULL;
}

/* A frame does not fit the receive it matched: fail that receive's
 * operation with a message naming the sender (the caller drops the data). */
static int frame_misfit(peer_t *p, sop_t *op, uint64_t len, uint32_t tag) {
  group_t *g = op->s->g;
  char msg[UVCCL_WORK_MSG_LEN];
  if (op->p2p && len > op->len) {
    snprintf(msg, sizeof(msg), "recv: rank %d (%s) sent %llu bytes with tag "
             "%u, more than the %zu-byte buffer", g->inv[p->rank], p->addrstr,
             (unsigned long long)len, tag, op->len);
    p->net->up->op_fail(op->s, UVCCL_ELIMIT, msg);
    return 1;
  }
  if (!op->p2p && len != op->len) {
    snprintf(msg, sizeof(msg), "%s: rank %d (%s) sent %llu bytes where %zu "
             "were expected (mismatched collective or arguments across "
             "ranks?)", op->s->name, g->inv[p->rank], p->addrstr,
             (unsigned long long)len, op->len);
    p->net->up->op_fail(op->s, UVCCL_EMISMATCH, msg);
    return 1;
  }
  return 0;
}

/* Returns 0 to go on with the buffer, or -1 if the peer went away. */
int uvccl__net_frame_begin(peer_t *p, rx_t *rx, const frame_hdr_t *h) {
  net_t *net = p->net;
  group_t *g;
  sop_t *op;
  early_t *st;

  rx->cur = *h;
  rx->cur_got = 0;
  rx->cur_op = NULL;
  rx->cur_early = NULL;
  op = match_frame(p, h, &g);
  if (op != NULL) {
    sop_list_remove(op->list, op);
    if (frame_misfit(p, op, h->len, h->tag)) {
      rx->rstate = h->len ? RS_DISCARD : RS_HDR;
      return 0;
    }
    if (op->p2p) op->len = (size_t)h->len;
    op->source = p->rank;
    if (h->len == 0) {
      rx->rstate = RS_HDR;
      op_recv_done(op);
      return p->state == PEER_UP ? 0 : -1;
    }
    rx->cur_op = op;
    rx->rstate = op->type == SOP_RECV_RED ? RS_REDUCE : RS_DIRECT;
    return 0;
  }
  /* Nobody waits for it yet. Frames of a group that failed are dropped. */
  g = uvccl__net_group(net, h->gid);
  if (g != NULL && g->broken && h->kind == FRAME_COLL) {
    rx->rstate = h->len ? RS_DISCARD : RS_HDR;
    return 0;
  }
  if (h->len > net->early_limit) {
    uvccl__net_peer_fail(net, p, UVCCL_ELIMIT,
                         "frame larger than the early frames' limit");
    return -1;
  }
  st = early_alloc(net, h->len);
  if (st == NULL) {
    uvccl__net_peer_fail(net, p, UV_ENOMEM, "out of memory holding an early frame");
    return -1;
  }
  st->kind = h->kind;
  st->gid = h->gid;
  st->seq = h->seq;
  st->tag = h->tag;
  st->from = p->rank;
  st->len = h->len;
  st->arrival = ++net->arrivals;
  if (p->early_tail) p->early_tail->next = st;
  else p->early_head = st;
  p->early_tail = st;
  p->early_bytes += st->len;
  if (h->len == 0) {
    rx->rstate = RS_HDR;
    return 0;
  }
  rx->cur_early = st;
  rx->rstate = RS_EARLY;
  return 0;
}

/* The current frame is complete. */
int uvccl__net_frame_end(peer_t *p, rx_t *rx) {
  sop_t *op = rx->cur_op;
  early_t *st = rx->cur_early;
  rx->rstate = RS_HDR;
  rx->cur_op = NULL;
  rx->cur_early = NULL;
  if (op != NULL) {
    /* Its first bytes came early: done once they are handed over. */
    if (op->handoff != NULL) op->handoff->got = op->handoff->len;
    else op_recv_done(op);
  } else if (st != NULL) {
    st->got = st->len;
    if (st->claim != NULL) {
      early_unlink(p, st);
      early_give(p->net, st, st->claim);
    } else if (p->early_bytes > p->net->early_limit && !p->paused) {
      /* Early arrivals pile up: stop reading this peer until receives
       * catch up (TCP's flow control then slows the sender). */
      p->paused = 1;
      peer_stop_read(p);
      LOG_WARN("coll", "rank %d: pausing reads from rank %d: %llu bytes "
               "held early", p->net->rank, p->rank,
               (unsigned long long)p->early_bytes);
    }
  }
  return p->state == PEER_UP ? 0 : -1;
}

/* An unnamed connection is refused: it gets the reason, then a
 * half-close; it is closed when its EOF comes (so the reason is not lost
 * to a reset), or after 2 s. */
static void on_reject_drain_timeout(uv_timer_t *t) { peer_close(t->data); }

static void on_reject_written(uvccl__wreq_t *req, int status) {
  peer_t *p = req->data;
  if (status == 0 && p->tcp_open && uvccl__sendq_shutdown(&p->sendq) == 0) {
    uv_timer_start(&p->retry, on_reject_drain_timeout, 2000, 0);
    return;
  }
  peer_close(p);
}

static void peer_reject(peer_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sends p->reject as a REJECT frame, then closes (on_reject_written). */
static void send_reject(peer_t *p) {
  frame_hdr_t h;
  size_t n = strlen(p->reject);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_REJECT;
  h.len = n;
  hdr_encode(p->reject_buf, &h);
  memcpy(p->reject_buf + UVCCL__FRAME_HDR, p->reject, n);
  p->state = PEER_CLOSING;
  if (peer_write_ctl(p, &p->hello_req, p->reject_buf, UVCCL__FRAME_HDR + n,
                     on_reject_written) != 0)
    peer_close(p);
}

static void peer_reject(peer_t *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->reject, sizeof(p->reject), fmt, ap);
  va_end(ap);
  LOG_WARN("coll", "rank %d: refusing the connection from %s: %s",
           p->net->rank, p->addrstr, p->reject);
  send_reject(p);
}

/* A misconfigured world (sizes differ, a rank claimed twice): this rank's
 * creation fails with the same words the other side is sent. */
static void net_misconfigured(net_t *net, const char *msg) {
  if (net->mesh_cb != NULL)
    net_creation_failed(net, strncmp(msg, "authentication failed", 21)
                                 ? UV_EINVAL : UVCCL_EAUTH,
                        "process group creation failed: %s", msg);
  else
    LOG_WARN("coll", "rank %d: %s", net->rank, msg);
}

/* What both ends' MACs cover besides the nonces: who dials whom, the
 * listener it means, the world, the dialer's address. A proof made for
 * one connection opens no other. */
static void mesh_purpose(const hello_t *h, char *buf, size_t len) {
  snprintf(buf, len, "mesh %u>%u %016llx %u %s", h->from, h->to,
           (unsigned long long)h->to_nonce, h->world, h->addr);
}

/* The acceptor refuses a connection over authentication: the connector
 * is told why (a rank holding another secret then fails with these
 * words), this side logs it, rate-limited, and carries on. */
static void auth_refuse(peer_t *p, const char *why) {
  net_refusal_log(p->net, p->addrstr, why);
  snprintf(p->reject, sizeof(p->reject), "authentication failed: %s", why);
  send_reject(p);
}

/* A hello whose sender is known (proven, or no secret in this world):
 * checked against this rank and world, then the connection is adopted. */
static void hello_accept(peer_t *p, hello_t *hello) {
  net_t *net = p->net;
  frame_hdr_t ack;
  char why[256];

  if (hello->to_nonce != net->nonce || hello->to != (uint32_t)net->rank) {
    /* Not meant for this process: an address left in a reused store, or a
     * process of another world. Nothing of ours is wrong. */
    peer_reject(p, "stale or foreign connection: rank %d (%s) is not the "
                "process it dialed (rank %u)", net->rank, net->selfstr,
                hello->to);
    return;
  }
  if (hello->world != (uint32_t)net->size) {
    snprintf(why, sizeof(why), "world size mismatch: rank %d (%s) was "
             "started with a world of %d, rank %u (%s) with %u", net->rank,
             net->selfstr, net->size, hello->from, hello->addr, hello->world);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  if (hello->from >= (uint32_t)net->size) {
    snprintf(why, sizeof(why), "a process (%s) claims rank %u, outside the "
             "world of %d", hello->addr, hello->from, net->size);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  if (net->sparse && (int)hello->from != net->rank &&
      net->peers[hello->from] != NULL) {
    peer_t *q = net->peers[hello->from];
    if (q->state == PEER_NONE ||
        (q->outgoing && q->state == PEER_CONNECTING &&
         (int)hello->from > net->rank)) {
      pending_unlink(p);
      uv_timer_stop(&p->retry);
      peer_takeover(p, q);
      goto adopt;
    }
    if (q->outgoing && (int)hello->from < net->rank &&
        (q->state == PEER_CONNECTING || q->state == PEER_UP)) {
      /* Both dialed: ours (the higher rank's) wins. */
      frame_hdr_t x;
      memset(&x, 0, sizeof(x));
      x.kind = FRAME_CROSSED;
      hdr_encode(p->reject_buf, &x);
      p->state = PEER_CLOSING;
      if (peer_write_ctl(p, &p->hello_req, p->reject_buf, UVCCL__FRAME_HDR,
                         on_reject_written) != 0)
        peer_close(p);
      return;
    }
  }
  if ((int)hello->from == net->rank || net->peers[hello->from] != NULL) {
    snprintf(why, sizeof(why), "two processes claim rank %u: %s and %s",
             hello->from,
             (int)hello->from == net->rank ? net->selfstr
                                           : net->addrs[hello->from],
             hello->addr);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  pending_unlink(p);
  uv_timer_stop(&p->retry); /* the handshake deadline */
adopt:
  p->rank = (int)hello->from;
  net->peers[p->rank] = p;
  snprintf(net->addrs[p->rank], sizeof(net->addrs[p->rank]), "%s",
           hello->addr);
  memset(&ack, 0, sizeof(ack));
  ack.kind = FRAME_HELLO_ACK;
  hdr_encode(p->hello_buf, &ack);
  if (peer_write_ctl(p, &p->hello_req, p->hello_buf, UVCCL__FRAME_HDR,
                     NULL) != 0) {
    uvccl__net_peer_fail(net, p, UV_EPIPE, "sending hello ack failed");
    return;
  }
  peer_up(p);
}

/* Acceptor, world with a secret: the connector's HELLO carried its nonce;
 * answer with ours and our MAC, and act on nothing until its PROOF. */
static void auth_challenge(peer_t *p, const hello_t *hello,
                           const uint8_t *nc) {
  frame_hdr_t h;
  char purpose[160];
  p->auth_hello = *hello;
  memcpy(p->auth_nc, nc, UVCCL__AUTH_NONCE);
  if (uvccl__auth_random(p->auth_ns, sizeof(p->auth_ns)) != 0) {
    peer_close(p);
    return;
  }
  mesh_purpose(hello, purpose, sizeof(purpose));
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_CHALLENGE;
  h.len = UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC;
  hdr_encode(p->auth_buf, &h);
  memcpy(p->auth_buf + UVCCL__FRAME_HDR, p->auth_ns, UVCCL__AUTH_NONCE);
  uvccl__auth_mac(&p->net->auth, "server", purpose, p->auth_nc, p->auth_ns,
                  p->auth_buf + UVCCL__FRAME_HDR + UVCCL__AUTH_NONCE);
  p->auth_step = 1;
  if (peer_write_ctl(p, &p->auth_req, p->auth_buf, sizeof(p->auth_buf),
                     NULL) != 0)
    peer_close(p);
}

/* Acceptor: the connector's PROOF. */
static void auth_proof(peer_t *p, const uint8_t *mac) {
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[160];
  mesh_purpose(&p->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&p->net->auth, "client", purpose, p->auth_nc, p->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, mac, sizeof(want))) {
    auth_refuse(p, "wrong proof (the connecting process holds another "
                "secret)");
    return;
  }
  p->auth_step = 2;
  hello_accept(p, &p->auth_hello);
}

/* Connector: the acceptor's CHALLENGE. Its MAC proves it holds the
 * secret; ours goes back. */
static void auth_answer(peer_t *p, const unsigned char *payload) {
  net_t *net = p->net;
  uint8_t want[UVCCL__AUTH_MAC];
  char purpose[160];
  frame_hdr_t h;
  memcpy(p->auth_ns, payload, UVCCL__AUTH_NONCE);
  mesh_purpose(&p->auth_hello, purpose, sizeof(purpose));
  uvccl__auth_mac(&net->auth, "server", purpose, p->auth_nc, p->auth_ns,
                  want);
  if (!uvccl__auth_equal(want, payload + UVCCL__AUTH_NONCE, sizeof(want))) {
    net_creation_failed(net, UVCCL_EAUTH, "process group creation failed: "
                        "rank %d (%s) failed authentication: it holds "
                        "another secret (every rank of a world must hold "
                        "the same UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)",
                        p->rank, p->addrstr);
    uvccl__net_peer_fail(net, p, UVCCL_EAUTH, "failed authentication");
    return;
  }
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_PROOF;
  h.len = UVCCL__AUTH_MAC;
  hdr_encode(p->auth_buf, &h);
  uvccl__auth_mac(&net->auth, "client", purpose, p->auth_nc, p->auth_ns,
                  p->auth_buf + UVCCL__FRAME_HDR);
  p->auth_step = 2;
  if (peer_write_ctl(p, &p->auth_req, p->auth_buf,
                     UVCCL__FRAME_HDR + UVCCL__AUTH_MAC, NULL) != 0)
    uvccl__net_peer_fail(net, p, UV_EPIPE, "sending the proof failed");
}

/* The handshake's frames. Without a secret: HELLO, then HELLO_ACK (or
 * REJECT). With one: HELLO (+ nonce), CHALLENGE, PROOF, HELLO_ACK. */
static void handle_hello(peer_t *p, const frame_hdr_t *h,
                         const unsigned char *payload) {
  net_t *net = p->net;
  hello_t hello;
  int offered;

  if (p->outgoing && p->state == PEER_CONNECTING) {
    if (h->kind == FRAME_CHALLENGE && net->auth.set && p->auth_step == 0 &&
        h->len == UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC) {
      auth_answer(p, payload);
      return;
    }
    if (h->kind == FRAME_HELLO_ACK && h->len == 0 &&
        (!net->auth.set || p->auth_step == 2)) {
      peer_up(p);
      return;
    }
    if (h->kind == FRAME_HELLO_ACK && net->auth.set) {
      net_creation_failed(net, UVCCL_EAUTH, "process group creation failed: "
                          "rank %d (%s) accepted the connection without "
                          "proving the world's secret", p->rank, p->addrstr);
      uvccl__net_peer_fail(net, p, UVCCL_EAUTH, "did not authenticate");
      return;
    }
  }
  if (!p->outgoing && p->rank < 0 && p->auth_step == 1 &&
      h->kind == FRAME_PROOF && h->len == UVCCL__AUTH_MAC) {
    auth_proof(p, payload);
    return;
  }
  offered = h->len == sizeof(hello) + UVCCL__AUTH_NONCE;
  if (h->kind != FRAME_HELLO || p->outgoing || p->rank >= 0 ||
      p->auth_step != 0 || (h->len != sizeof(hello) && !offered)) {
    if (net->auth.set && p->rank < 0)
      auth_refuse(p, "not the handshake (a stray or hostile connection)");
    else
      uvccl__net_peer_fail(net, p, UVCCL_EPROTO,
                           "unexpected handshake frame");
    return;
  }
  memcpy(&hello, payload, sizeof(hello));
  hello.addr[sizeof(hello.addr) - 1] = '\0';
  if (hello.magic != UVCCL__HELLO_MAGIC) {
    if (net->auth.set) {
      auth_refuse(p, "not a uvccl peer");
      return;
    }
    uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "bad hello");
    return;
  }
  if (hello.version != UVCCL__WIRE_VERSION) {
    peer_reject(p, "wire version %u, rank %d speaks %d", hello.version,
                net->rank, UVCCL__WIRE_VERSION);
    return;
  }
  if (net->auth.set) {
    if (!offered) {
      auth_refuse(p, "no secret offered (this world requires one: "
                  "UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)");
      return;
    }
    auth_challenge(p, &hello, payload + sizeof(hello));
    return;
  }
  if (offered) {
    char why[256];
    snprintf(why, sizeof(why), "authentication failed: rank %u holds a "
             "secret, rank %d none (every rank must hold the same "
             "UVCCL_AUTH_TOKEN or UVCCL_AUTH_FILE)", hello.from, net->rank);
    peer_reject(p, "%s", why);
    net_misconfigured(net, why);
    return;
  }
  hello_accept(p, &hello);
}

/* Consumes what the read buffer holds. */
static void process_rbuf(peer_t *p) {
  size_t pos = 0;
  frame_hdr_t h;

  while (p->state == PEER_UP || p->state == PEER_CONNECTING) {
    size_t avail = p->rlen - pos;
    if (p->rx.rstate == RS_HDR) {
      if (avail < UVCCL__FRAME_HDR) break;
      hdr_decode(&h, (unsigned char *)p->rbuf + pos);
      if (h.kind == FRAME_HELLO || h.kind == FRAME_HELLO_ACK ||
          h.kind == FRAME_CHALLENGE || h.kind == FRAME_PROOF) {
        if (h.len > sizeof(hello_t) + UVCCL__AUTH_NONCE) {
          uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO, "oversized hello");
          return;
        }
        if (avail < UVCCL__FRAME_HDR + h.len) break;
        pos += UVCCL__FRAME_HDR;
        handle_hello(p, &h, (unsigned char *)p->rbuf + pos);
        /* A failed handshake may have dropped the buffer's contents. */
        if (p->state != PEER_UP && p->state != PEER_CONNECTING) return;
        pos += (size_t)h.len;
        continue;
      }
      if (h.kind == FRAME_REJECT &&
          ((p->outgoing && p->state == PEER_CONNECTING) ||
           (p->state == PEER_UP && p->net->mesh_cb != NULL))) {
        size_t n = h.len < sizeof(p->reject) - 1 ? (size_t)h.len
                                                 : sizeof(p->reject) - 1;
        if (avail < UVCCL__FRAME_HDR + h.len && h.len < 4096) break;
        memcpy(p->reject, p->rbuf + pos + UVCCL__FRAME_HDR,
               avail - UVCCL__FRAME_HDR < n ? avail - UVCCL__FRAME_HDR : n);
        p->reject[n] = '\0';
        net_creation_failed(p->net,
                            strncmp(p->reject, "authentication failed", 21)
                                ? UV_EINVAL : UVCCL_EAUTH,
                            "process group creation failed: rank %d (%s) "
                            "%s: %s", p->rank, p->addrstr,
                            p->state == PEER_UP ? "gave up"
                                                : "refused the connection",
                            p->reject);
        uvccl__net_peer_fail(p->net, p, UV_ECONNREFUSED, "refused");
        return;
      }
      if (h.kind == FRAME_CROSSED && p->outgoing &&
          p->state == PEER_CONNECTING && p->net->sparse && h.len == 0) {
        peer_crossed(p);
        return;
      }
      if (h.kind == FRAME_AGREE && p->state == PEER_UP) {
        net_t *net = p->net;
        if (h.len > 8 + 2 * (uint64_t)net->size) {
          uvccl__net_peer_fail(net, p, UVCCL_EPROTO, "oversized agree frame");
          return;
        }
        if (avail < UVCCL__FRAME_HDR + h.len) break;
        pos += UVCCL__FRAME_HDR;
        if (net->on_agree != NULL)
          net->on_agree(net, p->rank, &h, (unsigned char *)p->rbuf + pos);
        pos += (size_t)h.len;
        continue;
      }
      if (h.kind == FRAME_SHM && p->state == PEER_UP) {
        if (h.len != sizeof(uvccl__shm_info_t)) {
          uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO,
                               "bad shared-memory frame");
          return;
        }
        if (avail < UVCCL__FRAME_HDR + h.len) break;
        pos += UVCCL__FRAME_HDR;
        uvccl__shm_on_frame(p, &h, (unsigned char *)p->rbuf + pos);
        if (p->state != PEER_UP) return;
        pos += (size_t)h.len;
        continue;
      }
      if (h.kind == FRAME_BYE && p->state == PEER_UP && h.len == 0) {
        /* What it sent through shared memory before leaving is read
         * first (it was in the ring before the goodbye left). */
        uvccl__shm_drain(p);
        if (p->state != PEER_UP) return;
        p->left = 1;
        pos += UVCCL__FRAME_HDR;
        continue;
      }
      if (p->state != PEER_UP ||
          (h.kind != FRAME_COLL && h.kind != FRAME_P2P)) {
        uvccl__net_peer_fail(p->net, p, UVCCL_EPROTO,
                             "bad frame (garbage, or not a uvccl peer)");
        return;
      }
      pos += UVCCL__FRAME_HDR;
      if (uvccl__net_frame_begin(p, &p->rx, &h) != 0) return;
      continue;
    }
    if (avail == 0) break;
    if (p->rx.rstate == RS_REDUCE) {
      sop_t *op = p->rx.cur_op;
      size_t es = op->s->esize ? op->s->esize : 1;
      uint64_t left = p->rx.cur.len - p->rx.cur_got;
      size_t take = avail < left ? avail : (size_t)left;
      size_t whole = take - take % es;
      if (whole == 0) break; /* a partial element: wait for the rest */
      if (((uintptr_t)(p->rbuf + pos)) % 8 != 0) {
        /* Kernels need aligned input: shift the bytes down first. */
        memmove(p->rbuf, p->rbuf + pos, avail);
        p->rlen = avail;
        pos = 0;
      }
      p->net->up->reduce_in(op, (size_t)p->rx.cur_got, p->rbuf + pos, whole);
      pos += whole;
      p->rx.cur_got += whole;
      if (p->rx.cur_got == p->rx.cur.len && uvccl__net_frame_end(p, &p->rx) != 0) return;
      continue;
    }
    {
      uint64_t left = p->rx.cur.len - p->rx.cur_got;
      size_t take = avail < left ? avail : (size_t)left;
      if (p->rx.rstate == RS_DIRECT)
        memcpy(p->rx.cur_op->buf + p->rx.cur_got, p->rbuf + pos, take);
      else if (p->rx.rstate == RS_EARLY)
        memcpy(p->rx.cur_early->data + p->rx.cur_got, p->rbuf + pos, take);
      pos += take;
      p->rx.cur_got += take;
      if (p->rx.cur_got == p->rx.cur.len) {
        if (p->rx.rstate == RS_DISCARD) {
          p->rx.rstate = RS_HDR;
        } else if (uvccl__net_frame_end(p, &p->rx) != 0) {
          return;
        }
      }
    }
  }
  if (pos > 0 && p->rbuf != NULL) {
    memmove(p->rbuf, p->rbuf + pos, p->rlen - pos);
    p->rlen -= pos;
  }
}

static void peer_read(peer_t *p, ssize_t n);

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  peer_t *p = s->data;
  net_t *net = p->net;
  (void)buf;
  if (n == UV_ENOBUFS && p->read_refused) {
    p->read_refused = 0; /* the turn was spent: the loop comes back */
  } else {
    if (n > 0) uvccl__turn_charge(&net->turn, (size_t)n);
    peer_read(p, n);
  }
  uvccl__turn_leave(&net->turn); /* net outlives p's callbacks */
}

static void peer_read(peer_t *p, ssize_t n) {
  net_t *net = p->net;
  uv_stream_t *s = (uv_stream_t *)&p->tcp;
  if (n == 0) return;
  if (n < 0) {
    p->reading = 0;
    uv_read_stop(s);
    if (n == UV_EOF) p->eof = 1;
    if (net->closing || p->state == PEER_CLOSING) {
      peer_close(p);
      return;
    }
    if (p->state == PEER_DEAD) return;
    /* Frames it put in our inbox before it went are still delivered. */
    if (n == UV_EOF) uvccl__shm_drain(p);
    if (p->state == PEER_DEAD) return;
    if (net->tls != NULL) {
      /* The TLS session may say why (a refused certificate arrives as an
       * alert after a TLS 1.3 client's handshake). */
      char why[200];
      uv_os_fd_t fd;
      if (uv_fileno((uv_handle_t *)&p->tcp, &fd) == 0 &&
          uvccl__tls_conn_error(fd, why, sizeof(why))) {
        int refused = strstr(why, "alert") != NULL;
        if (refused && p->state == PEER_CONNECTING)
          net_creation_failed(net, UVCCL_EAUTH, "process group creation "
                              "failed: rank %d (%s) refused this rank's TLS "
                              "certificate: %s", p->rank, p->addrstr, why);
        uvccl__net_peer_fail(net, p, refused ? UVCCL_EAUTH : UVCCL_EPEER,
                             why);
        return;
      }
    }
    uvccl__net_peer_fail(net, p, n == UV_EOF ? UVCCL_EPEER : (int)n,
                         n == UV_EOF ? "closed the connection"
                                     : "connection failed");
    return;
  }
  if (net->closing || p->state == PEER_CLOSING || p->state == PEER_DEAD) {
    /* Draining before close: whatever arrives is dropped. */
    if (p->rx.rstate == RS_HDR || p->rx.rstate == RS_REDUCE) p->rlen = 0;
    p->rx.rstate = RS_HDR;
    p->rlen = 0;
    p->rx.cur_op = NULL;
    return;
  }
  uvccl__net_kick_spin(net);
  switch (p->rx.rstate) {
  case RS_DIRECT:
  case RS_EARLY:
    p->rx.cur_got += (uint64_t)n;
    if (p->rx.cur_got == p->rx.cur.len) {
      if (uvccl__net_frame_end(p, &p->rx) != 0) return;
    }
    return;
  default:
    p->rlen += (size_t)n;
    process_rbuf(p);
    return;
  }
}

/* ---- posting receives ------------------------------------------------------------- */

static early_t *early_find(peer_t *p, uint8_t kind, uint32_t gid,
                           uint32_t seq, uint32_t tag) {
  early_t *st;
  for (st = p->early_head; st != NULL; st = st->next)
    if (st->kind == kind && st->gid == gid && st->tag == tag &&
        st->claim == NULL && (kind == FRAME_P2P || st->seq == seq))
      return st;
  return NULL;
}

/* Hands an early frame to op: small and all here, now; large, in slices
 * (see "handing over"); still arriving, what came so far in slices, the
 * rest straight into op's buffer. */
static void early_take(net_t *net, peer_t *p, early_t *st, sop_t *op) {
  rx_t *rx;
  if (frame_misfit(p, op, st->len, st->tag)) return;
  if (st->got < st->len) {
    size_t es = op->type == SOP_RECV_RED && op->s->esize ? op->s->esize : 1;
    rx = early_rx(p, st);
    /* (a reduction goes on at an element's start only) */
    if (rx == NULL || rx->cur_got % es != 0) {
      st->claim = op; /* frame_end delivers it */
      return;
    }
    early_unlink(p, st);
    rx->cur_early = NULL;
    rx->cur_op = op;
    rx->rstate = op->type == SOP_RECV_RED ? RS_REDUCE : RS_DIRECT;
    handoff_start(net, st, op, rx->cur_got);
    return;
  }
  early_unlink(p, st);
  early_give(net, st, op);
}

void uvccl__net_post_recv(net_t *net, sop_t *op) {
  group_t *g = op->s->g;
  peer_t *p;
  early_t *st;

  if (op->p2p) {
    if (op->peer >= 0) {
      p = net->peers[op->peer];
      st = p ? early_find(p, FRAME_P2P, g->gid, 0, op->tag) : NULL;
      if (st != NULL) {
        early_take(net, p, st, op);
        return;
      }
    } else {
      /* Any source: the earliest early frame with this tag wins. */
      early_t *best = NULL;
      peer_t *bestp = NULL;
      int r;
      for (r = 0; r < net->size; r++) {
        p = net->peers[r];
        if (p == NULL || g->inv[r] < 0) continue;
        st = early_find(p, FRAME_P2P, g->gid, 0, op->tag);
        if (st != NULL && (best == NULL || st->arrival < best->arrival)) {
          best = st;
          bestp = p;
        }
      }
      if (best != NULL) {
        early_take(net, bestp, best, op);
        return;
      }
    }
    sop_list_push(&g->p2p, op);
    return;
  }
  p = net->peers[op->peer];
  if (p == NULL) p = peer_need(net, op->peer); /* sparse: it will dial */
  if (p == NULL) {
    net->up->op_fail(op->s, UV_ENOMEM, "out of memory");
    return;
  }
  st = early_find(p, FRAME_COLL, g->gid, op->s->seq, op->tag);
  if (st != NULL) {
    early_take(net, p, st, op);
    return;
  }
  sop_list_push(&p->posted, op);
}

int uvccl__net_left_early(net_t *net, const sop_t *op) {
  peer_t *p;
  if (op->peer < 0 || !uvccl__net_left_cleanly(net, op->peer)) return 0;
  p = net->peers[op->peer];
  if (op->p2p)
    return early_find(p, FRAME_P2P, op->s->g->gid, 0, op->tag) != NULL;
  return early_find(p, FRAME_COLL, op->s->g->gid, op->s->seq, op->tag) != NULL;
}

size_t uvccl__net_queued(net_t *net, int r) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  if (p == NULL || !p->sendq_open) return 0;
  return uvccl__sendq_queued(&p->sendq);
}

int uvccl__net_orphan(net_t *net, sop_t *op) {
  peer_t *p = op->peer >= 0 && op->peer < net->size ? net->peers[op->peer]
                                                     : NULL;
  int rc;
  if (!op->writing) return 0;
  if (p != NULL && op->list == &p->waitq) {
    sop_list_remove(&p->waitq, op); /* never started: nothing to copy */
    op->writing = 0;
    return 0;
  }
  if (p != NULL && (op->list == &p->shm_sendq || p->cma_op == op))
    rc = uvccl__shm_orphan(p, op);
  else
    rc = p != NULL && p->sendq_open ? uvccl__sendq_orphan(&p->sendq, &op->wreq)
                                 : UV_ENOENT;
  if (rc == 0) {
    op->writing = 0;
    return 0;
  }
  if (p != NULL && p->state == PEER_UP) {
    /* No copy could be made: the frame cannot be finished, so the
     * connection goes (the rank is then declared failed). */
    uvccl__net_peer_fail(net, p, rc, "a send could not be detached");
  }
  return rc;
}

int uvccl__net_unpost(net_t *net, sop_t *op) {
  int r, rc = 0;
  if (op->handoff != NULL) {
    handoff_drop(net, op);
    rc = 1;
  }
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    early_t *st;
    if (p == NULL) continue;
    if (p->rx.cur_op == op) {
      /* Mid-transfer: the rest of the frame is read and dropped, so the
       * stream stays in step and the user's buffer is not touched. */
      p->rx.cur_op = NULL;
      p->rx.rstate = RS_DISCARD;
      return 1;
    }
    if (p->srx.cur_op == op) { /* the same, in the shared-memory ring */
      p->srx.cur_op = NULL;
      p->srx.rstate = RS_DISCARD;
      return 1;
    }
    for (st = p->early_head; st != NULL; st = st->next)
      if (st->claim == op) st->claim = NULL;
  }
  if (op->list != NULL) sop_list_remove(op->list, op);
  return rc;
}

/* ---- sending ------------------------------------------------------------------------ */

static void on_write(uvccl__wreq_t *req, int status) {
  sop_t *op = req->data;
  sched_t *s = op->s;
  op->writing = 0;
  if (status < 0) {
    net_t *net = s->g->net;
    peer_t *p = net->peers[op->peer];
    /* The peer's failure is settled by the monitor, whose verdict fails
     * this schedule with the right culprit; only the buffer is back. */
    if (status != UV_ECANCELED && p != NULL && p->state == PEER_UP)
      uvccl__net_peer_fail(net, p, status, "send failed");
    net->up->send_lost(op);
    return;
  }
  uvccl__net_kick_spin(s->g->net);
  s->g->net->up->op_done(op);
}

int uvccl__net_send(net_t *net, sop_t *op, uint8_t kind, uint32_t gid,
                    uint32_t seq) {
  peer_t *p = net->peers[op->peer];
  frame_hdr_t h;
  memset(&h, 0, sizeof(h));
  h.kind = kind;
  h.gid = gid;
  h.seq = seq;
  h.tag = op->tag;
  h.len = op->len;
  hdr_encode(op->hdr, &h);
  if (not_yet_connected(net, op->peer) ||
      (net->sparse && p != NULL && p->state == PEER_UP &&
       (p->shm_step != 3 || p->waitq.head))) {
    /* Not connected yet (or earlier frames still wait): queued, in
     * order, until uvccl__net_peer_ready. */
    p = peer_need(net, op->peer);
    if (p == NULL) return UV_ENOMEM;
    sop_list_push(&p->waitq, op);
    op->writing = 1;
    peer_dial(p);
    return 0;
  }
  if (p == NULL || p->state != PEER_UP)
    return awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
  return peer_transmit(net, p, op);
}

/* The frame (its header already in op->hdr) onto p's ring or socket. */
static int peer_transmit(net_t *net, peer_t *p, sop_t *op) {
  uv_buf_t b[2];
  int rc, nb;
  if (p->shm_tx) {
    rc = uvccl__shm_send(p, op);
    if (rc < 0) return awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
    return rc;
  }
  b[0] = uv_buf_init((char *)op->hdr, UVCCL__FRAME_HDR);
  b[1] = uv_buf_init((char *)op->buf, (unsigned int)0);
  b[1].len = op->len;
  nb = op->len ? 2 : 1;
  /* Write directly when nothing is queued: a small frame then leaves in
   * one sendmsg with no request and no epoll_ctl. A turn that is spent
   * queues it whole instead (the loop's next iteration writes it: a step
   * now and the rest then was one more sendmsg for nothing). */
  if (uvccl__sendq_queued(&p->sendq) == 0 &&
      (op->len < UVCCL__TURN_PIECE || !uvccl__turn_spent(&net->turn))) {
    ssize_t n = uvccl__sendq_try(&p->sendq, b, (unsigned)nb);
    if (n < 0) {
      uvccl__net_peer_fail(net, p, (int)n, "send failed");
      return awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
    }
    if ((size_t)n == UVCCL__FRAME_HDR + op->len) return 1;
    if (n > 0 && (size_t)n < UVCCL__FRAME_HDR) {
      b[0].base += n;
      b[0].len -= (size_t)n;
    } else if (n > 0) {
      b[0] = b[1]; /* the header went: the rest of the payload */
      b[0].base += (size_t)n - UVCCL__FRAME_HDR;
      b[0].len -= (size_t)n - UVCCL__FRAME_HDR;
      nb = 1;
    }
  }
  op->wreq.data = op;
  rc = uvccl__sendq_write(&p->sendq, &op->wreq, b, (unsigned)nb, on_write);
  if (rc == 0) op->writing = 1;
  return rc;
}

/* ---- failure ------------------------------------------------------------------------- */

/* What a broken data connection says about its rank. */
static int cause_of(int err) {
  switch (err) {
  case UV_EOF:
  case UVCCL_EPEER:
    return UVCCL_FAIL_EXITED;
  case UVCCL_EPROTO:
  case UVCCL_ELIMIT:
  case UV_ENOMEM:
    return UVCCL_FAIL_PROTOCOL;
  case UV_ETIMEDOUT:
  case UV_EHOSTUNREACH:
  case UV_ENETUNREACH:
    return UVCCL_FAIL_UNREACHABLE;
  default:
    return UVCCL_FAIL_RESET;
  }
}

static void net_apply_dead(net_t *net, const uvccl__fail_t *f);

/* r left cleanly and its data connection is read to the end: only work
 * that still needs it fails (nothing it sent is lost). */
static void net_apply_left(net_t *net, int r) {
  group_t *g;
  char msg[200];
  if (net->peers[r] != NULL) net->peers[r]->left_applied = 1;
  for (g = net->groups; g != NULL; g = g->next) {
    if (g->inv[r] < 0) continue;
    snprintf(msg, sizeof(msg), "rank %d (global %d, %s) left the group",
             g->inv[r], r, uvccl__net_addr(net, r));
    net->up->group_fail_peer(g, r, UVCCL_EPEER, msg);
  }
  if (net->on_failed != NULL) net->on_failed(net, r);
}

void uvccl__net_peer_fail(net_t *net, peer_t *p, int err, const char *why) {
  int r = p->rank, was_up = p->state == PEER_UP, cause;
  char detail[UVCCL__DETAIL_LEN];

  if (p->state == PEER_DEAD || p->state == PEER_CLOSING) return;
  if (p->tls_hs != NULL) {
    uvccl__tls_cancel(p->tls_hs);
    p->tls_hs = NULL;
  }
  if (was_up) net->nup--;
  p->state = PEER_DEAD;
  p->err = err;
  if (r < 0) {
    /* An unnamed incoming connection: nobody depends on it. */
    if (err == UVCCL_EPROTO) {
      char m[160];
      snprintf(m, sizeof(m), "not a uvccl peer (%s)", why);
      net_refusal_log(net, p->addrstr, m);
    }
    peer_close(p);
    return;
  }
  LOG_DEBUG("coll", "rank %d: rank %d (%s): %s (%s)", net->rank, r,
            p->addrstr, why, uvccl_strerror(err));
  peer_close_tcp(p);
  uvccl__shm_peer_down(p);
  p->rx.cur_op = NULL;
  p->rx.rstate = RS_HDR;
  p->rlen = 0;
  ctl_drop(p);
  if (!was_up && (!net->sparse || net->mesh_cb != NULL)) {
    /* Still connecting: creation fails, nobody else is involved. */
    net_creation_failed(net, err == UVCCL_EPROTO ? err : UVCCL_EPEER,
                        "process group creation failed: rank %d (%s): %s: %s",
                        r, p->addrstr, why, uvccl_strerror(err));
    return;
  }
  if (p->left) {
    /* It destroyed its groups after finishing. The monitor says so once
     * it has read that rank's link (a failure it told us of comes first);
     * then net_apply_left. */
    if (net->live != NULL)
      uvccl__live_suspect(net->live, r, UVCCL_FAIL_LEFT, 0, "left the group");
    else
      net_apply_left(net, r);
    return;
  }
  cause = cause_of(err);
  if (cause == UVCCL_FAIL_EXITED)
    snprintf(detail, sizeof(detail),
             "its process exited or was killed (connection closed)");
  else if (err == UV_ECONNRESET || err == UV_EPIPE)
    /* EPIPE: a send after the peer's reset arrived; the same event */
    snprintf(detail, sizeof(detail), "connection reset (its process was "
             "killed, or the network reset it)");
  else
    snprintf(detail, sizeof(detail), "%s: %s", why, uvccl_strerror(err));
  if (net->live == NULL) {
    uvccl__fail_t f;
    memset(&f, 0, sizeof(f));
    f.rank = r;
    f.origin = f.via = net->rank;
    f.cause = cause;
    f.err = err;
    snprintf(f.detail, sizeof(f.detail), "%s", detail);
    net_apply_dead(net, &f);
  } else if (cause == UVCCL_FAIL_PROTOCOL) {
    uvccl__live_declare(net->live, r, cause, err, detail);
  } else {
    /* Settled by the monitor, which first reads what r told us on its
     * link (r may have gone because another rank failed first). */
    uvccl__live_suspect(net->live, r, cause, err, detail);
  }
}

/* ---- failures: the monitor's verdicts ----------------------------------------------- */

static int in_group(const group_t *g, int r) {
  return r >= 0 && r < g->net->size && g->inv[r] >= 0;
}

void uvccl__net_fail_msg(net_t *net, group_t *g, const uvccl__fail_t *f,
                         char *buf, size_t len) {
  const uvccl__fail_t *first = net->first.rank >= 0 ? &net->first : f;
  char seen[48] = "";
  if (net->fenced) {
    snprintf(buf, len, "this rank (global %d) was declared failed by global "
             "rank %d (%s): %s", net->rank, f->origin,
             uvccl__net_addr(net, f->origin), f->detail);
    return;
  }
  if (first->origin != net->rank && first->origin >= 0)
    snprintf(seen, sizeof(seen), " [seen by global rank %d]", first->origin);
  if (in_group(g, first->rank) || !in_group(g, f->rank))
    snprintf(buf, len, "rank %d (global %d, %s) failed: %s%s",
             in_group(g, first->rank) ? g->inv[first->rank] : -1, first->rank,
             uvccl__net_addr(net, first->rank), first->detail, seen);
  else
    snprintf(buf, len, "rank %d (global %d, %s) failed: %s; the first to "
             "fail was global rank %d (%s): %s%s",
             g->inv[f->rank], f->rank, uvccl__net_addr(net, f->rank),
             f->detail, first->rank, uvccl__net_addr(net, first->rank),
             first->detail, seen);
}

/* rank f->rank failed (the monitor's verdict, in the order it reached
 * them): fence it off and fail every group that contains it. */
static void net_apply_dead(net_t *net, const uvccl__fail_t *f) {
  group_t *g;
  peer_t *p;
  char msg[UVCCL_WORK_MSG_LEN];
  int r = f->rank;
  if (r < 0 || r >= net->size) return;
  if (r == net->rank) {
    /* The others cut this rank off (it was stopped too long, say). */
    int q;
    if (net->fenced) return;
    net->fenced = 1;
    /* Being cut off explains everything that came before it too (a peer
     * closing on us, say): it becomes the cause everywhere. */
    net->first = *f;
    if (net->aborted && f->origin == net->rank)
      /* our own abort, said back by a rank it reached: nothing new */
      LOG_DEBUG("coll", "rank %d: the others hold this rank failed: %s",
                net->rank, f->detail);
    else
      LOG_ERROR("coll", "rank %d: declared failed by rank %d: %s", net->rank,
                f->origin, f->detail);
    for (q = 0; q < net->size; q++) {
      p = net->peers[q];
      if (p == NULL || p->state == PEER_DEAD || p->state == PEER_CLOSING)
        continue;
      if (p->state == PEER_UP) net->nup--;
      p->state = PEER_DEAD;
      peer_close_tcp(p);
    }
    uvccl__net_fail_msg(net, NULL, f, msg, sizeof(msg));
    net_creation_failed(net, UVCCL_EPEER, "process group creation failed: %s",
                        msg);
    for (g = net->groups; g != NULL; g = g->next) {
      g->broken = 0; /* restate the cause */
      net->up->group_break(g, UVCCL_EPEER, f, msg);
    }
    return;
  }
  if (net->fails[r].rank >= 0) return;
  net->fails[r] = *f;
  net->failed[net->nfailed++] = r;
  if (net->first.rank < 0) net->first = *f;
  LOG_WARN("coll", "rank %d: rank %d (%s) failed: %s%s", net->rank, r,
           uvccl__net_addr(net, r), f->detail,
           f->origin != net->rank ? " (reported by another rank)" : "");
  p = net->peers[r];
  if (p != NULL && p->state != PEER_DEAD && p->state != PEER_CLOSING) {
    if (p->state == PEER_UP) net->nup--;
    p->state = PEER_DEAD;
    p->err = f->err;
    peer_close_tcp(p);
    uvccl__shm_peer_down(p);
    p->rx.cur_op = NULL;
    p->rx.rstate = RS_HDR;
    p->rlen = 0;
  }
  if (net->mesh_cb != NULL) {
    char m2[UVCCL_WORK_MSG_LEN + 64];
    snprintf(m2, sizeof(m2), "rank %d (%s) failed: %.100s%s", r,
             uvccl__net_addr(net, r), f->detail,
             f->origin != net->rank ? " (reported by another rank)" : "");
    net_creation_failed(net, UVCCL_EPEER,
                        "process group creation failed: %s", m2);
  }
  for (g = net->groups; g != NULL; g = g->next) {
    if (!in_group(g, r)) continue;
    uvccl__net_fail_msg(net, g, f, msg, sizeof(msg));
    net->up->group_break(g, UVCCL_EPEER,
                       in_group(g, net->first.rank) ? &net->first : f, msg);
  }
  if (net->on_failed != NULL) net->on_failed(net, r);
}

static void net_on_notice(net_t *net, const uvccl__notice_t *n) {
  group_t *g = uvccl__net_group(net, n->gid);
  uvccl__fail_t f;
  char msg[UVCCL_WORK_MSG_LEN];
  if (g == NULL || !in_group(g, n->origin) || g->broken) return;
  memset(&f, 0, sizeof(f));
  f.rank = n->rank;
  f.origin = f.via = n->origin;
  f.cause = n->cause;
  f.err = n->err;
  snprintf(f.detail, sizeof(f.detail), "%s", n->detail);
  if (n->what == UVCCL__NOTICE_REVOKE) {
    snprintf(msg, sizeof(msg), "revoked by rank %d (global %d, %.50s): %.80s",
             g->inv[n->origin], n->origin, uvccl__net_addr(net, n->origin),
             n->detail);
    f.rank = -1;
    f.cause = UVCCL_FAIL_REVOKED;
    net->up->group_break(g, UVCCL_EREVOKED, &f, msg);
  } else {
    snprintf(msg, sizeof(msg), "rank %d (global %d) gave up: %s",
             g->inv[n->origin], n->origin, n->detail);
    net->up->group_break(g, n->err ? n->err : UVCCL_EPEER, &f, msg);
  }
}

static void net_live_closed(net_t *net);

static void net_on_live(void *arg, const uvccl__live_ev_t *ev) {
  net_t *net = arg;
  switch (ev->kind) {
  case UVCCL__LIVE_LINK_UP:
    net->links_up++;
    uvccl__net_check_ready(net);
    return;
  case UVCCL__LIVE_LINK_FAILED:
    net_creation_failed(net, ev->fail.err == UVCCL_EAUTH ? UVCCL_EAUTH
                                                         : UVCCL_EPEER,
                        "process group creation failed: %s", ev->msg);
    return;
  case UVCCL__LIVE_DEAD:
    if (!net->closing) net_apply_dead(net, &ev->fail);
    return;
  case UVCCL__LIVE_LEFT: {
    peer_t *p = ev->rank >= 0 && ev->rank < net->size ? net->peers[ev->rank]
                                                       : NULL;
    /* Only once its data connection said goodbye and was read to its end
     * (until then frames it sent may still be on their way). */
    if (p != NULL && p->left && p->state == PEER_DEAD && !net->closing)
      net_apply_left(net, ev->rank);
    return;
  }
  case UVCCL__LIVE_NOTICE:
    if (!net->closing) net_on_notice(net, &ev->notice);
    return;
  case UVCCL__LIVE_CLOSED:
    net_live_closed(net);
    return;
  }
}

static void on_ctl_written(uvccl__wreq_t *req, int status) {
  (void)status;
  uvccl__free(UVCCL__CONTAINER_OF(req, ctl_t, req));
}

int uvccl__net_send_ctl(net_t *net, int r, uint8_t kind, uint32_t gid,
                        uint32_t seq, uint32_t tag, const void *payload,
                        size_t len) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  frame_hdr_t h;
  ctl_t *c;
  int rc;
  int queue = r >= 0 && r < net->size && not_yet_connected(net, r);
  if (!queue && (p == NULL || p->state != PEER_UP || !p->sendq_open))
    return UVCCL_EPEER;
  if (queue && (p = peer_need(net, r)) == NULL) return UV_ENOMEM;
  c = uvccl__malloc(sizeof(*c) + UVCCL__FRAME_HDR + len);
  if (c == NULL) return UV_ENOMEM;
  memset(&h, 0, sizeof(h));
  h.kind = kind;
  h.gid = gid;
  h.seq = seq;
  h.tag = tag;
  h.len = len;
  hdr_encode(c->buf, &h);
  if (len) memcpy(c->buf + UVCCL__FRAME_HDR, payload, len);
  c->len = UVCCL__FRAME_HDR + len;
  if (queue) {
    c->next = NULL;
    if (p->ctlq_tail) p->ctlq_tail->next = c;
    else p->ctlq = c;
    p->ctlq_tail = c;
    peer_dial(p);
    return 0;
  }
  rc = peer_write_ctl(p, &c->req, c->buf, c->len, on_ctl_written);
  if (rc != 0) uvccl__free(c);
  return rc;
}

void uvccl__net_reject_all(net_t *net, const char *why) {
  size_t n = strlen(why);
  int r;
  if (n > 1000) n = 1000;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (p == NULL || p->state != PEER_UP) continue;
    uvccl__net_send_ctl(net, r, FRAME_REJECT, 0, 0, 0, why, n);
  }
}

void uvccl__net_notify(net_t *net, const uvccl__notice_t *n) {
  if (net->live != NULL) uvccl__live_notify(net->live, n);
}

void uvccl__net_abort(net_t *net, int err, const char *why) {
  group_t *g;
  int r;
  /* The others hear it before they see our connections close. */
  if (net->live != NULL && !net->aborted) {
    char d[UVCCL__DETAIL_LEN];
    if (strncmp(why, "aborted: ", 9) == 0) why += 9;
    snprintf(d, sizeof(d), "its application aborted: %.90s", why);
    uvccl__live_fail_self(net->live, UVCCL_FAIL_ABORTED, err, d);
  }
  net->aborted = 1;
  for (g = net->groups; g != NULL; g = g->next)
    net->up->group_fail_all(g, err, why);
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (p == NULL || p->state == PEER_DEAD || p->state == PEER_CLOSING)
      continue;
    if (p->state == PEER_UP) net->nup--;
    p->state = PEER_DEAD;
    p->err = err;
    p->rx.cur_op = NULL;
    peer_close_tcp(p);
    uvccl__shm_peer_down(p);
  }
}

void uvccl__net_forget_group(net_t *net, uint32_t gid) {
  int r;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    early_t *st, *next;
    if (p == NULL) continue;
    for (st = p->early_head; st != NULL; st = next) {
      next = st->next;
      /* (a frame mid-transfer, from the socket or the ring, stays until
       * it is complete: its reader still writes into it) */
      if (st->gid == gid && st != p->rx.cur_early &&
          st != p->srx.cur_early) {
        early_unlink(p, st);
        early_free(net, st);
      }
    }
  }
}

/* ---- teardown ------------------------------------------------------------------------- */

static void net_free(net_t *net) {
  int r;
  uvccl__shm_net_free(net);
  while (net->handoffs != NULL) {
    early_t *st = net->handoffs;
    net->handoffs = st->next;
    early_release(st);
  }
  uvccl__big_reap_all(&net->retired_mem);
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    early_t *st, *next;
    if (p == NULL) continue;
    for (st = p->early_head; st != NULL; st = next) {
      next = st->next;
      early_release(st);
    }
    ctl_drop(p);
    uvccl__free(p->rbuf);
    uvccl__free(p);
  }
  while (net->early_small != NULL) {
    early_t *st = net->early_small;
    net->early_small = st->next;
    uvccl__free(st);
  }
  while (net->early_spare != NULL) {
    early_t *st = net->early_spare;
    net->early_spare = st->next;
    early_release(st);
  }
  while (net->retired != NULL) {
    peer_t *p = net->retired;
    net->retired = p->next_pending;
    uvccl__free(p->rbuf);
    uvccl__free(p);
  }
  uvccl__free(net->book);
  uvccl__free(net->peers);
  uvccl__free(net->addrs);
  uvccl__free(net->fails);
  uvccl__free(net->failed);
  if (net->agrees_free != NULL) net->agrees_free(net);
  uvccl__tls_ctx_unref(net->tls);
  uvccl__free(net);
}

/* Every handle the net owns is counted in nclosing while it closes; the
 * memory goes only when the net is released and nothing is closing. */
void uvccl__net_maybe_closed(net_t *net) {
  void (*cb)(net_t *);
  if (!net->closing || net->nclosing > 0) return;
  cb = net->closed_cb;
  if (cb != NULL) cb(net); /* reads closed_arg */
  net_free(net);
}

static void net_live_closed(net_t *net) {
  net->live = NULL;
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

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

static void on_peer_closed(uv_handle_t *h) {
  peer_t *p = h->data;
  net_t *net = p->net;
  net->nclosing--;
  if (h == (uv_handle_t *)&p->tcp && net->closing && p->retry_open) {
    p->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&p->retry, on_peer_closed);
  }
  uvccl__net_maybe_closed(net);
}

static void on_peer_sendq_closed(uvccl__sendq_t *q) {
  peer_t *p = q->data;
  net_t *net = p->net;
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

static void on_pending_sendq_closed(uvccl__sendq_t *q);

/* Stops the output before the socket closes (queued sends fail with
 * UV_ECANCELED from the loop). */
static void peer_wq_close(peer_t *p) {
  if (!p->sendq_open) return;
  p->sendq_open = 0;
  if (p->rank < 0) {
    if (uvccl__sendq_close(&p->sendq, on_pending_sendq_closed)) {
      p->nclosing++;
      p->net->nclosing++;
    }
  } else if (uvccl__sendq_close(&p->sendq, on_peer_sendq_closed)) {
    p->net->nclosing++;
  }
}

/* Closes a named peer's socket (its memory stays until the net goes). */
static void peer_close_tcp(peer_t *p) {
  if (!p->tcp_open) return;
  peer_wq_close(p);
  p->tcp_open = 0;
  peer_stop_read(p);
  p->tcp.data = p;
  if (!p->draining) p->net->nclosing++;
  p->draining = 0;
  uv_close((uv_handle_t *)&p->tcp, on_peer_closed);
}

static void pending_part_closed(peer_t *p) {
  net_t *net = p->net;
  net->nclosing--;
  if (--p->nclosing == 0) {
    uvccl__free(p->rbuf);
    uvccl__free(p);
  }
  uvccl__net_maybe_closed(net);
}

static void on_pending_closed(uv_handle_t *h) { pending_part_closed(h->data); }

static void on_pending_sendq_closed(uvccl__sendq_t *q) { pending_part_closed(q->data); }

/* Closes and frees an unnamed (never adopted) incoming connection. */
static void peer_close(peer_t *p) {
  net_t *net = p->net;
  if (p->rank >= 0) {
    peer_close_tcp(p);
    return;
  }
  pending_unlink(p);
  peer_stop_read(p);
  peer_wq_close(p);
  if (p->tcp_open) {
    p->tcp_open = 0;
    p->nclosing++;
    net->nclosing++;
    p->tcp.data = p;
    uv_close((uv_handle_t *)&p->tcp, on_pending_closed);
  }
  if (p->retry_open) {
    p->retry_open = 0;
    p->nclosing++;
    net->nclosing++;
    p->retry.data = p;
    uv_close((uv_handle_t *)&p->retry, on_pending_closed);
  }
}

static void on_drain_timeout(uv_timer_t *t) {
  /* The peer did not finish within the grace period: close anyway. */
  peer_close_tcp(t->data);
}

/* BYE is out (after every frame queued before it): half-close. */
static void on_bye_written(uvccl__wreq_t *req, int status) {
  peer_t *p = req->data;
  if (status == 0 && p->tcp_open) status = uvccl__sendq_shutdown(&p->sendq);
  p->shut = 1;
  /* Done once the peer's EOF is in too (on_read closes it then). */
  if (p->eof || status < 0) peer_close_tcp(p);
}

static void peer_teardown(peer_t *p) {
  net_t *net = p->net;
  uv_timer_stop(&p->retry);
  uvccl__shm_peer_down(p);
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
      hdr_encode(p->bye_hdr, &bye);
    }
    p->draining = 1;
    net->nclosing++; /* the socket, until it closes */
    peer_start_read(p);
    uv_timer_start(&p->retry, on_drain_timeout, 2000, 0);
    if (peer_write_ctl(p, &p->bye_req, p->bye_hdr, UVCCL__FRAME_HDR,
                       on_bye_written) != 0)
      peer_close_tcp(p);
    return; /* the retry timer closes after the socket */
  }
  p->state = PEER_CLOSING;
  if (p->tcp_open) {
    peer_close_tcp(p);
    return;
  }
  if (p->retry_open) {
    p->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&p->retry, on_peer_closed);
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
    peer_close(p);
  }
  net->pending = NULL;
  tls_accepts_cancel(net);
  for (r = 0; r < net->size; r++)
    if (net->peers[r] != NULL) {
      if (net->peers[r]->tls_hs != NULL) {
        uvccl__tls_cancel(net->peers[r]->tls_hs);
        net->peers[r]->tls_hs = NULL;
      }
      peer_teardown(net->peers[r]);
    }
  uvccl__shm_net_close(net);
}
