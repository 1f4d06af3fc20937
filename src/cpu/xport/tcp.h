/* What the files of the TCP transport share. From the ground up: peer.c
 * (lookups, making a peer, closing, freeing), tx.c (output, sending,
 * control frames), conn.c (listening, accepting, TLS, dialing, lazy
 * connections), stripe.c (the extra connections to a rank of another
 * host, and how frames are cut across them), rx.c (reading frames,
 * early frames, handing over,
 * posting receives), fail.c (a connection's failure, the monitor's
 * verdicts), net.c (the net's life, busy polling, works, slicing,
 * sending, teardown). A file calls the ones below it by name; what it
 * must start above goes through the hooks below. The rest of the CPU
 * backend sees the uvccl__net_* calls of cpu/internal.h only. */
#ifndef UVCCL_CPU_XPORT_TCP_H
#define UVCCL_CPU_XPORT_TCP_H

#include "cpu/internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* What the lower files start in the higher ones (net.c's table): a
 * peer's failure (fail.c), busy polling and the slicer (net.c), reading
 * a new connection (rx.c). */
typedef struct uvccl__net_hooks_s {
  void (*peer_fail)(net_t *net, peer_t *p, int err, const char *why);
  void (*kick_spin)(net_t *net);
  void (*slicer_start)(net_t *net);
  void (*start_read)(peer_t *p);
  void (*stripe_pump)(peer_t *o);
} uvccl__net_hooks_t;

/* A control frame, copied: written now, or queued on a peer not yet
 * connected (sparse worlds). */
typedef struct ctl_s {
  uvccl__wreq_t req;
  struct ctl_s *next;
  size_t len;
  unsigned char buf[];
} ctl_t;

/* Takes an unnamed incoming connection off the net's list (it is adopted
 * as a rank, or closed). */
static inline void uvccl__net_pending_unlink(peer_t *p) {
  peer_t **pp;
  for (pp = &p->net->pending; *pp != NULL; pp = &(*pp)->next_pending)
    if (*pp == p) {
      *pp = p->next_pending;
      break;
    }
}

int uvccl__net_awaiting_verdict(net_t *net, int r);
void uvccl__net_ctl_drop(peer_t *p);
void uvccl__net_ctl_flush(peer_t *p);
void uvccl__net_early_free(net_t *net, early_t *st);
void uvccl__net_early_release(early_t *st);
void uvccl__net_early_unlink(peer_t *p, early_t *st);
int uvccl__net_handoff_step(net_t *net);
int uvccl__net_listen_tcp(net_t *net, const struct sockaddr *addr,
                          uint64_t hb_ms, char *err, size_t errlen);
int uvccl__net_live_start(net_t *net, uint64_t hb_ms, char *err,
                          size_t errlen);
void uvccl__net_creation_failed(net_t *net, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void uvccl__net_live_closed(net_t *net);
void uvccl__net_on_live(void *arg, const uvccl__live_ev_t *ev);
void uvccl__net_refusal_log(net_t *net, const char *from, const char *why);
int uvccl__net_not_yet_connected(const net_t *net, int r);
void uvccl__net_on_ctl_written(uvccl__wreq_t *req, int status);
void uvccl__net_on_peer_closed(uv_handle_t *h);
void uvccl__net_peer_close(peer_t *p);
void uvccl__net_peer_close_tcp(peer_t *p);
void uvccl__net_peer_crossed(peer_t *p);
void uvccl__net_peer_dial(peer_t *p);
void uvccl__net_peer_connect(peer_t *p);
const char *uvccl__net_lane_accept(peer_t *l, int from, int lane);
void uvccl__net_lane_up(peer_t *l);
void uvccl__net_lanes_down(peer_t *o);
int uvccl__net_lane_down(peer_t *l, int err);
int uvccl__net_lanes_open(const peer_t *o);
int uvccl__net_stripe_send(net_t *net, peer_t *o, sop_t *op);
void uvccl__net_stripe_pump(peer_t *o);
peer_t *uvccl__net_peer_need(net_t *net, int r);
peer_t *uvccl__net_peer_new(net_t *net, int rank);
void uvccl__net_peer_start_read(peer_t *p);
void uvccl__net_peer_stop_read(peer_t *p);
void uvccl__net_peer_takeover(peer_t *p, peer_t *q);
int uvccl__net_peer_transmit(net_t *net, peer_t *p, sop_t *op);
void uvccl__net_send_waited(net_t *net, peer_t *p, sop_t *op);
void uvccl__net_peer_up(peer_t *p);
void uvccl__net_peer_sendq_open(peer_t *p);
int uvccl__net_peer_write_ctl(peer_t *p, uvccl__wreq_t *req, void *buf,
                              size_t len, void (*cb)(uvccl__wreq_t *, int));
void uvccl__net_slicer_start(net_t *net);

#endif
