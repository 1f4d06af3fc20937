/* Striped TCP: a large frame to a rank on another host is cut into pieces
 * that travel on several connections to it at once, each received
 * straight into its place. One TCP stream cannot fill a lossy link (every
 * loss halves its window, and a lost segment stalls what follows it until
 * it is sent again) nor a long one (its window is one round trip's worth);
 * streams that share the link each lose alone and together keep it busy.
 *
 * The connections: once both ends of a rank's connection know they are on
 * different hosts (the shared-memory exchange tells each the other's
 * host), each sets that peer's nlanes to stripes - 1, and the end that
 * dialed it dials that many more to the same listener, each hello naming
 * its lane. A lane is a peer_t of its own (reader, send queue, posted
 * receives, early frames) whose owner is the rank's first connection;
 * creation waits for every lane (net->lanes_want, net->lanes_up).
 *
 * The frames: a schedule cuts each send and receive of a large frame to
 * such a rank into pieces of one size (uvccl__net_stripe_parts; sched.c
 * adds the pieces as ops with the same predecessors and successors). Both
 * ends cut alike: the pieces follow from the frame's size alone. A piece
 * goes on whichever of the rank's connections has nothing queued, else
 * waits in the rank's stripeq for the first that empties: a connection
 * that is slower for a while (a loss, an unlucky share of a queue) carries
 * fewer pieces instead of holding the frame back. Its header names the
 * piece (frame_hdr_t.piece), and the receiver matches it, arriving on any
 * of the rank's connections, against the receives posted on the rank's
 * first one. So that "nothing queued" means something, a connection of a
 * striped rank takes little more than it can send at once into the
 * kernel (TCP_NOTSENT_LOWAT).
 *
 * Failures: a lane that breaks fails its rank (fail.c); a rank that
 * leaves says goodbye on every lane, and its leave is taken only once
 * every lane is read to its end, so nothing it sent before is lost. */
#include "tcp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* Pieces start at multiples of this: a multiple of every element size. */
#define STRIPE_ALIGN ((size_t)4096)
/* What a striped rank's connection holds unsent in the kernel at most
 * (256 KiB cost a third of the throughput over a lossy link: the app
 * could not refill it fast enough). */
#define STRIPE_LOWAT (1024 * 1024)
/* Pieces: each at most this large, so that when one connection stalls
 * (a loss) the others carry more of the frame; but never more than
 * STRIPE_PARTS_MAX a frame (each costs an op, and dependencies between
 * the pieces of two cut ops may go to parts x parts). */
#define STRIPE_PIECE_MAX ((size_t)1024 * 1024)
#define STRIPE_PARTS_MAX ((size_t)64)
/* A lane not connected by then fails creation. */
#define LANE_DIAL_MS 10000

uint32_t uvccl__net_stripe_parts(const net_t *net, int r, size_t len,
                                 size_t *piece) {
  const peer_t *p;
  size_t k, each;
  *piece = len;
  if (r < 0 || r >= net->size || len == 0 || len < net->stripe_min)
    return 1;
  p = net->peers[r];
  if (p == NULL || p->nlanes == 0) return 1;
  k = (size_t)p->nlanes + 1;
  each = (len + k - 1) / k;
  if (each > STRIPE_PIECE_MAX) each = STRIPE_PIECE_MAX;
  if (each < (len + STRIPE_PARTS_MAX - 1) / STRIPE_PARTS_MAX)
    each = (len + STRIPE_PARTS_MAX - 1) / STRIPE_PARTS_MAX;
  each = (each + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  if (each >= len) return 1;
  *piece = each;
  return (uint32_t)((len + each - 1) / each);
}

static void conn_tune(peer_t *c) {
  uv_os_fd_t fd;
  int v = STRIPE_LOWAT;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof(v));
}

static int lanes_alloc(peer_t *o) {
  if (o->lanes != NULL) return 0;
  o->lanes = uvccl__calloc((size_t)o->net->stripes - 1, sizeof(peer_t *));
  return o->lanes != NULL ? 0 : UV_ENOMEM;
}

/* Both ends of o know where the other is (shm.c): on another host, o
 * gets its lanes, dialed by the end that dialed o. */
void uvccl__net_lanes_start(peer_t *o) {
  net_t *net = o->net;
  uint64_t mine = net->hosts[net->rank], theirs = net->hosts[o->rank];
  int i;
  if (net->stripes < 2 || net->sparse || o->owner != NULL || o->nlanes > 0 ||
      mine == 0 || theirs == 0 || mine == theirs)
    return;
  if (lanes_alloc(o) != 0) {
    net->hooks->peer_fail(net, o, UV_ENOMEM, "making its stripes");
    return;
  }
  o->nlanes = net->stripes - 1;
  net->lanes_want += o->nlanes;
  conn_tune(o);
  if (!o->outgoing) return; /* they come to us */
  for (i = 1; i <= o->nlanes && o->state == PEER_UP; i++) {
    peer_t *l = uvccl__net_peer_new(net, o->rank);
    if (l == NULL) {
      net->hooks->peer_fail(net, o, UV_ENOMEM, "making its stripes");
      return;
    }
    l->owner = o;
    l->lane = i;
    l->outgoing = 1;
    l->nonce = o->nonce;
    l->state = PEER_CONNECTING;
    memcpy(&l->addr, &o->addr, sizeof(l->addr));
    memcpy(l->addrstr, o->addrstr, sizeof(l->addrstr));
    l->retry.timeout = uvccl__now_ms() + LANE_DIAL_MS;
    o->lanes[i - 1] = l;
    uvccl__net_peer_connect(l);
  }
}

/* A lane is up (its hello answered, or ours sent): creation may be over. */
void uvccl__net_lane_up(peer_t *l) {
  net_t *net = l->net;
  uv_os_fd_t fd;
  l->state = PEER_UP;
  net->lanes_up++;
  if (uv_fileno((uv_handle_t *)&l->tcp, &fd) == 0)
    uvccl__tune_socket(fd, net->hb_ms, 0);
  conn_tune(l);
  LOG_DEBUG("coll", "rank %d: stripe %d to rank %d up", net->rank, l->lane,
            l->rank);
  uvccl__net_check_ready(net);
}

/* An incoming connection named itself lane `lane` of rank `from` (its
 * hello checked as the rank's first connection's is). 0, or why it is
 * refused. */
const char *uvccl__net_lane_accept(peer_t *l, int from, int lane) {
  net_t *net = l->net;
  peer_t *o = net->peers[from];
  frame_hdr_t ack;
  if (net->sparse || net->stripes < 2 || lane >= net->stripes)
    return "a stripe connection this world does not use";
  if (o == NULL || o->state != PEER_UP || o->owner != NULL)
    return "a stripe connection before the rank's first connection";
  if (lanes_alloc(o) != 0) return "out of memory";
  if (o->lanes[lane - 1] != NULL) return "a stripe connection made twice";
  uvccl__net_pending_unlink(l);
  uv_timer_stop(&l->retry); /* the handshake deadline */
  l->rank = from;
  l->owner = o;
  l->lane = lane;
  memcpy(l->addrstr, o->addrstr, sizeof(l->addrstr)); /* for messages */
  o->lanes[lane - 1] = l;
  memset(&ack, 0, sizeof(ack));
  ack.kind = FRAME_HELLO_ACK;
  uvccl__frame_encode(l->hello_buf, &ack);
  if (uvccl__net_peer_write_ctl(l, &l->hello_req, l->hello_buf,
                                UVCCL__FRAME_HDR, NULL) != 0) {
    net->hooks->peer_fail(net, l, UV_EPIPE, "sending hello ack failed");
    return NULL;
  }
  uvccl__net_lane_up(l);
  return NULL;
}

/* 1 while a lane of o may still carry something. */
int uvccl__net_lanes_open(const peer_t *o) {
  int i;
  for (i = 0; o->lanes != NULL && i < o->net->stripes - 1; i++)
    if (o->lanes[i] != NULL && (o->lanes[i]->state == PEER_UP ||
                                o->lanes[i]->state == PEER_CONNECTING))
      return 1;
  return 0;
}

/* o failed: its lanes close with it (their work fails with o's). */
void uvccl__net_lanes_down(peer_t *o) {
  int i;
  for (i = 0; o->lanes != NULL && i < o->net->stripes - 1; i++)
    if (o->lanes[i] != NULL) uvccl__net_lane_down(o->lanes[i], o->err);
}

/* One lane is done (its own failure or its rank's): closed, err kept.
 * 0 when it already was. */
int uvccl__net_lane_down(peer_t *l, int err) {
  if (l->state == PEER_DEAD || l->state == PEER_CLOSING) return 0;
  if (l->tls_hs != NULL) {
    uvccl__tls_cancel(l->tls_hs);
    l->tls_hs = NULL;
  }
  if (l->state == PEER_UP) l->net->lanes_up--;
  l->state = PEER_DEAD;
  l->err = err;
  uvccl__net_peer_close_tcp(l);
  l->rx.cur_op = NULL;
  l->rx.rstate = RS_HDR;
  l->rlen = 0;
  return 1;
}

/* ---- pieces ---------------------------------------------------------------- */

/* Bytes the kernel holds for c: not yet sent, or sent and not yet
 * acknowledged (how far behind its stream is). */
static size_t conn_behind(peer_t *c) {
  uv_os_fd_t fd;
  int n = 0;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 ||
      ioctl(fd, SIOCOUTQ, &n) != 0 || n < 0)
    return 0;
  return (size_t)n;
}

/* Of o's connections with nothing queued here, the one whose stream is
 * least behind (the pieces of a frame, cut to travel side by side, then
 * arrive close together; a stream slowed by a loss gets fewer), or NULL
 * when every one has something queued. */
static peer_t *conn_free(peer_t *o) {
  int n = o->nlanes + 1, i;
  peer_t *best = NULL;
  size_t least = SIZE_MAX;
  for (i = 0; i < n; i++) {
    peer_t *c = i == 0 ? o : o->lanes[i - 1];
    size_t b;
    if (c == NULL || c->state != PEER_UP || !c->sendq_open ||
        uvccl__sendq_queued(&c->sendq) != 0)
      continue;
    b = conn_behind(c);
    if (b < least) {
      least = b;
      best = c;
    }
  }
  return best;
}

/* A piece to rank o: on a free connection now (as uvccl__net_send
 * returns), else queued (0) until one empties. */
int uvccl__net_stripe_send(net_t *net, peer_t *o, sop_t *op) {
  peer_t *c = o->stripeq.head == NULL ? conn_free(o) : NULL;
  if (c != NULL) return uvccl__net_peer_transmit(net, c, op);
  sop_list_push(&o->stripeq, op);
  op->writing = 1;
  return 0;
}

/* A connection of o's emptied: queued pieces go, while one is free. */
void uvccl__net_stripe_pump(peer_t *o) {
  net_t *net = o->net;
  sop_t *op;
  peer_t *c;
  while ((op = o->stripeq.head) != NULL && (c = conn_free(o)) != NULL) {
    sop_list_remove(&o->stripeq, op);
    uvccl__net_send_waited(net, c, op);
  }
}
