/* The TCP transport's ground floor: what every other file of it needs of
 * a net and its peers. Looking things up (addresses, groups, whether a
 * peer is usable or awaits the monitor's verdict), making a peer, closing
 * a peer's connection, and freeing the net once nothing of it is closing.
 * It calls nothing above it: what it must start there (busy polling, the
 * slicer, a peer's failure) goes through the net's hooks (tcp.h). */
#include "tcp.h"

/* ---- lookups ------------------------------------------------------------- */

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
int uvccl__net_awaiting_verdict(net_t *net, int r) {
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
  if (uvccl__net_awaiting_verdict(net, r)) return 1;
  if (net->fails[r].rank >= 0) {
    snprintf(msg, len, "rank %d (%s) failed: %s", r, uvccl__net_addr(net, r),
             net->fails[r].detail);
    return UVCCL_EPEER;
  }
  if (uvccl__net_not_yet_connected(net, r))
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

/* Sparse worlds: r is not connected yet, and may be (what is sent to it
 * waits; what comes from it comes when it dials). */
int uvccl__net_not_yet_connected(const net_t *net, int r) {
  const peer_t *p = net->peers[r];
  return net->sparse && !net->closing && r != net->rank &&
         net->fails[r].rank < 0 &&
         (p == NULL || p->state == PEER_NONE || p->state == PEER_CONNECTING);
}

/* Refusals of connections that fail (or never try) authentication, or
 * never finish their handshake, are logged: up to 10 a second, so that
 * a flood of them cannot flood the log. */
void uvccl__net_refusal_log(net_t *net, const char *from, const char *why) {
  int unlogged;
  int log = uvccl__refusals_admit(&net->refusals, uvccl__now_ms(), &unlogged);
  if (unlogged > 0)
    LOG_WARN("coll", "rank %d: %d more connections refused in the last "
             "second", net->rank, unlogged);
  if (log)
    LOG_WARN("coll", "rank %d: refusing the connection from %s: %s",
             net->rank, from, why);
}

void uvccl__net_ctl_drop(peer_t *p) {
  ctl_t *c;
  while ((c = p->ctlq) != NULL) {
    p->ctlq = c->next;
    uvccl__free(c);
  }
  p->ctlq_tail = NULL;
}

/* ---- making and retiring ------------------------------------------------- */

peer_t *uvccl__net_peer_new(net_t *net, int rank) {
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

void uvccl__net_retire_mem(net_t *net, void *p) {
  if (p == NULL) return;
  if (net == NULL || net->closing || !net->slicer_open) {
    uvccl__big_free(p);
    return;
  }
  uvccl__big_retire(&net->retired_mem, p);
  net->hooks->slicer_start(net);
}

void uvccl__net_spare_put(net_t *net, void *p, size_t cap) {
  int i, at = -1;
  if (p == NULL) return;
  if (net == NULL || net->closing || !net->slicer_open) {
    uvccl__big_free(p);
    return;
  }
  if (net->spare_keep_ms == 0) {
    uvccl__net_retire_mem(net, p);
    return;
  }
  if (net->nspares < UVCCL__SPARES) {
    at = net->nspares++;
  } else {
    for (i = 0; i < net->nspares; i++)
      if (net->spares[i].cap < cap &&
          (at < 0 || net->spares[i].cap < net->spares[at].cap))
        at = i;
    if (at < 0) {
      uvccl__net_retire_mem(net, p);
      return;
    }
    uvccl__net_retire_mem(net, net->spares[at].mem);
  }
  net->spares[at].mem = p;
  net->spares[at].cap = cap;
  net->spares[at].at = uv_now(net->loop);
}

void *uvccl__net_scratch_get(net_t *net, size_t len, size_t *cap) {
  void *p;
  *cap = len ? len : 1;
  if (*cap < UVCCL__BIG_MIN) return uvccl__malloc(*cap);
  p = uvccl__net_spare_take(net, *cap, cap);
  return p != NULL ? p : uvccl__big_alloc(*cap);
}

void uvccl__net_scratch_put(net_t *net, void *p, size_t cap) {
  if (cap < UVCCL__BIG_MIN) uvccl__free(p);
  else uvccl__net_spare_put(net, p, cap);
}

static void spare_drop(net_t *net, int i) {
  net->spares[i] = net->spares[--net->nspares];
}

void *uvccl__net_spare_take(net_t *net, size_t len, size_t *cap) {
  int i, best = -1;
  void *p;
  for (i = 0; i < net->nspares; i++)
    if (net->spares[i].cap >= len &&
        (best < 0 || net->spares[i].cap < net->spares[best].cap))
      best = i;
  if (best < 0) return NULL;
  p = net->spares[best].mem;
  *cap = net->spares[best].cap;
  spare_drop(net, best);
  return p;
}

void uvccl__net_spare_expire(net_t *net) {
  uint64_t now = uv_now(net->loop);
  int i = 0;
  while (i < net->nspares) {
    if (now - net->spares[i].at < net->spare_keep_ms) {
      i++;
      continue;
    }
    uvccl__net_retire_mem(net, net->spares[i].mem);
    spare_drop(net, i);
  }
}

void uvccl__net_peer_stop_read(peer_t *p) {
  if (!p->reading) return;
  p->reading = 0;
  uv_read_stop((uv_stream_t *)&p->tcp);
}

/* Gone now (teardown). */
void uvccl__net_early_release(early_t *st) {
  if (st->big) uvccl__big_free(st);
  else uvccl__free(st);
}

/* ---- closing and freeing ------------------------------------------------- */

static void peer_free(peer_t *p) {
  early_t *st, *next;
  int i;
  for (st = p->early_head; st != NULL; st = next) {
    next = st->next;
    uvccl__net_early_release(st);
  }
  uvccl__net_ctl_drop(p);
  for (i = 0; p->lanes != NULL && i < p->net->stripes - 1; i++)
    if (p->lanes[i] != NULL) peer_free(p->lanes[i]);
  uvccl__free(p->lanes);
  uvccl__free(p->rbuf);
  uvccl__free(p);
}

static void net_free(net_t *net) {
  int r;
  net->local_xport->net_free(net);
  while (net->handoffs != NULL) {
    early_t *st = net->handoffs;
    net->handoffs = st->next;
    uvccl__net_early_release(st);
  }
  while (net->nspares > 0) uvccl__big_free(net->spares[--net->nspares].mem);
  uvccl__big_reap_all(&net->retired_mem);
  for (r = 0; r < net->size; r++)
    if (net->peers[r] != NULL) peer_free(net->peers[r]);
  while (net->early_small != NULL) {
    early_t *st = net->early_small;
    net->early_small = st->next;
    uvccl__free(st);
  }
  while (net->early_spare != NULL) {
    early_t *st = net->early_spare;
    net->early_spare = st->next;
    uvccl__net_early_release(st);
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
  uvccl__free(net->hosts);
  uvccl__free(net->failed);
  uvccl__free(net->linked);
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

void uvccl__net_live_closed(net_t *net) {
  net->live = NULL;
  net->nclosing--;
  uvccl__net_maybe_closed(net);
}

void uvccl__net_on_peer_closed(uv_handle_t *h) {
  peer_t *p = h->data;
  net_t *net = p->net;
  net->nclosing--;
  if (h == (uv_handle_t *)&p->tcp && p->state == PEER_DEAD) {
    /* Nothing reads from a dead rank again: its read buffer goes now, not
     * with the net (a net a grow kept lives through many deaths). */
    uvccl__free(p->rbuf);
    p->rbuf = NULL;
    p->rcap = 0;
  }
  if (h == (uv_handle_t *)&p->tcp && net->closing && p->retry_open) {
    p->retry_open = 0;
    net->nclosing++;
    uv_close((uv_handle_t *)&p->retry, uvccl__net_on_peer_closed);
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
void uvccl__net_peer_close_tcp(peer_t *p) {
  if (!p->tcp_open) return;
  peer_wq_close(p);
  p->tcp_open = 0;
  uvccl__net_peer_stop_read(p);
  p->tcp.data = p;
  if (!p->draining) p->net->nclosing++;
  p->draining = 0;
  uv_close((uv_handle_t *)&p->tcp, uvccl__net_on_peer_closed);
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

static void on_pending_sendq_closed(uvccl__sendq_t *q) {
  pending_part_closed(q->data);
}

/* Closes and frees an unnamed (never adopted) incoming connection. */
void uvccl__net_peer_close(peer_t *p) {
  net_t *net = p->net;
  if (p->rank >= 0) {
    uvccl__net_peer_close_tcp(p);
    return;
  }
  uvccl__net_pending_unlink(p);
  uvccl__net_peer_stop_read(p);
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
