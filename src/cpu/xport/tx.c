/* The TCP transport's sending side: each connection's send queue
 * (sendq.c), control frames, and a data frame as sendmsg of its header
 * and the user's buffer. */
#include "tcp.h"

/* ---- output -------------------------------------------------------------- */

void uvccl__net_peer_sendq_open(peer_t *p) {
  uvccl__sendq_init(&p->sendq, p->net->loop, &p->tcp);
  p->sendq.data = p;
  p->sendq.turn = &p->net->turn;
  p->sendq_open = 1;
}

/* A control frame (hello, ack, bye): at once when the socket takes it,
 * else queued behind the frames already queued. cb (may be NULL) runs
 * when it is written: inside this call when it went at once. */
int uvccl__net_peer_write_ctl(peer_t *p, uvccl__wreq_t *req, void *buf,
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
  if (net->mesh_ready != NULL) {
    if (!net->mesh_ready(net)) return;
  } else {
    if (!net->sparse &&
        (net->nup < (net->want_up >= 0 ? net->want_up : net->size - 1) ||
         net->shm_done <
             (net->want_shm >= 0 ? net->want_shm : net->size - 1)))
      return;
    if (net->live != NULL && net->links_up != net->want_links) return;
  }
  if (net->lanes_up < net->lanes_want) return;
  net->mesh_cb = NULL;
  net->mesh_ready = NULL;
  net->mesh_group = NULL;
  cb(net, 0, NULL);
}

/* Creation cannot succeed (the caller says why). */
void uvccl__net_creation_failed(net_t *net, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void uvccl__net_creation_failed(net_t *net, int err, const char *fmt, ...) {
  void (*cb)(net_t *, int, const char *) = net->mesh_cb;
  char msg[UVCCL_WORK_MSG_LEN];
  va_list ap;
  if (cb == NULL) return;
  net->mesh_cb = NULL;
  net->mesh_ready = NULL;
  net->mesh_group = NULL;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cb(net, err, msg);
}

void uvccl__net_peer_up(peer_t *p) {
  net_t *net = p->net;
  p->state = PEER_UP;
  net->nup++;
  LOG_DEBUG("coll", "rank %d: connected to rank %d (%s)", net->rank, p->rank,
            p->addrstr);
  {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&p->tcp, &fd) == 0) {
      uvccl__tune_socket(fd, net->hb_ms, 0);
      uvccl__tune_local(fd);
    }
  }
  /* Same host? Each side offers its inbox (shm.c); creation completes
   * once every peer answered. */
  p->net->local_xport->peer_up(p);
  if (p->state != PEER_UP) return;
  uvccl__net_ctl_flush(p);
  if (p->state != PEER_UP) return;
  uvccl__net_check_ready(net);
}

/* ---- sending ------------------------------------------------------------- */

static void on_write(uvccl__wreq_t *req, int status) {
  sop_t *op = req->data;
  sched_t *s = op->s;
  op->writing = 0;
  if (status < 0) {
    net_t *net = s->g->net;
    peer_t *p = op->via;
    /* The peer's failure is settled by the monitor, whose verdict fails
     * this schedule with the right culprit; only the buffer is back. */
    if (status != UV_ECANCELED && p != NULL && p->state == PEER_UP)
      net->hooks->peer_fail(net, p, status, "send failed");
    net->up->send_lost(op);
    return;
  }
  {
    net_t *net = s->g->net;
    peer_t *p = op->via;
    net->hooks->kick_spin(net);
    net->up->op_done(op);
    /* its connection has room: a piece waiting for one may go */
    if (p != NULL && (p->owner != NULL || p->nlanes > 0))
      net->hooks->stripe_pump(p->owner != NULL ? p->owner : p);
  }
}

/* The frame (its header already in op->hdr) onto p's ring or socket. */
int uvccl__net_peer_transmit(net_t *net, peer_t *p, sop_t *op) {
  uv_buf_t b[2];
  int rc, nb;
  op->via = p;
  if (p->shm_tx) {
    rc = p->net->local_xport->send(p, op);
    if (rc < 0)
      return uvccl__net_awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
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
      net->hooks->peer_fail(net, p, (int)n, "send failed");
      return uvccl__net_awaiting_verdict(net, op->peer) ? 2 : UVCCL_EPEER;
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

/* A send that waited (for its connection, or for a connection with room)
 * goes on p now: done at once, or queued, or lost (the verdict on the
 * peer then fails its schedule). */
void uvccl__net_send_waited(net_t *net, peer_t *p, sop_t *op) {
  int rc;
  op->writing = 0;
  rc = uvccl__net_peer_transmit(net, p, op);
  if (rc == 1) {
    net->hooks->kick_spin(net);
    net->up->op_done(op);
  } else if (rc != 0) {
    net->up->send_lost(op);
  }
}

/* ---- control frames ------------------------------------------------------ */

void uvccl__net_ctl_flush(peer_t *p) {
  ctl_t *c;
  while ((c = p->ctlq) != NULL && p->state == PEER_UP) {
    p->ctlq = c->next;
    if (p->ctlq == NULL) p->ctlq_tail = NULL;
    if (uvccl__net_peer_write_ctl(p, &c->req, c->buf, c->len,
                                  uvccl__net_on_ctl_written) != 0)
      uvccl__free(c);
  }
}

void uvccl__net_on_ctl_written(uvccl__wreq_t *req, int status) {
  (void)status;
  uvccl__free(UVCCL__CONTAINER_OF(req, ctl_t, req));
}
