/* The TCP transport's failures: what a broken connection says about its
 * rank, and the liveness monitor's verdicts turned into group failures
 * that name the rank that failed first. */
#include "tcp.h"

/* ---- failure ------------------------------------------------------------- */

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

/* A lane (stripe.c) broke: its rank failed, unless the rank said
 * goodbye on it and closed it (read to its end: the rank's leave, which
 * waited for that, may go on). */
static void lane_fail(net_t *net, peer_t *l, int err, const char *why) {
  peer_t *o = l->owner;
  char m[160];
  if (!uvccl__net_lane_down(l, err)) return;
  if (l->left && err == UVCCL_EPEER) {
    if (o->eof_waits && !uvccl__net_lanes_open(o)) {
      o->eof_waits = 0;
      uvccl__net_peer_fail(net, o, UVCCL_EPEER, "closed the connection");
    }
    return;
  }
  snprintf(m, sizeof(m), "stripe connection %d: %s", l->lane, why);
  if (net->mesh_cb != NULL)
    uvccl__net_creation_failed(net, UVCCL_EPEER, "process group creation "
                               "failed: rank %d (%s): %s: %s", o->rank,
                               o->addrstr, m, uvccl_strerror(err));
  uvccl__net_peer_fail(net, o, err, m);
}

void uvccl__net_peer_fail(net_t *net, peer_t *p, int err, const char *why) {
  int r = p->rank, was_up = p->state == PEER_UP, cause;
  char detail[UVCCL__DETAIL_LEN];

  if (p->owner != NULL) {
    lane_fail(net, p, err, why);
    return;
  }
  if (p->state == PEER_DEAD || p->state == PEER_CLOSING) return;
  if (p->left && err == UVCCL_EPEER && uvccl__net_lanes_open(p)) {
    /* It left and closed this connection: its lanes may still hold what
     * it sent before (the last lane's end goes on, in lane_fail). */
    p->eof_waits = 1;
    return;
  }
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
      uvccl__net_refusal_log(net, p->addrstr, m);
    }
    uvccl__net_peer_close(p);
    return;
  }
  LOG_DEBUG("coll", "rank %d: rank %d (%s): %s (%s)", net->rank, r,
            p->addrstr, why, uvccl_strerror(err));
  uvccl__net_peer_close_tcp(p);
  uvccl__net_lanes_down(p);
  p->net->local_xport->peer_down(p);
  p->rx.cur_op = NULL;
  p->rx.rstate = RS_HDR;
  p->rlen = 0;
  uvccl__net_ctl_drop(p);
  if (!was_up && (!net->sparse || net->mesh_cb != NULL)) {
    /* Still connecting: creation fails, nobody else is involved. */
    uvccl__net_creation_failed(net, err == UVCCL_EPROTO ? err : UVCCL_EPEER,
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

/* ---- failures: the monitor's verdicts ------------------------------------ */

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

/* A group made from another (a shrink, new_group, split) after one of
 * its members failed: the verdict was given before the group existed, so
 * it is born broken, and its operations fail at once naming that rank
 * instead of waiting for it to their timeout. (A shrink's decision can
 * be overtaken: the coordinator decides, sends, and dies before this
 * rank's application calls the shrink.) */
void uvccl__net_group_born(net_t *net, group_t *g) {
  char msg[UVCCL_WORK_MSG_LEN];
  int i, r;
  for (i = 0; i < net->nfailed; i++) {
    const uvccl__fail_t *f;
    r = net->failed[i];
    if (r == net->rank || !in_group(g, r)) continue;
    f = &net->fails[r];
    uvccl__net_fail_msg(net, g, f, msg, sizeof(msg));
    net->up->group_break(g, UVCCL_EPEER,
                         in_group(g, net->first.rank) ? &net->first : f, msg);
    return;
  }
}

/* ---- hosts lost ------------------------------------------------------------
 * A host's ranks fail together when the host does (its link down, the
 * machine gone): once every rank of another host has failed, the host is
 * lost, and the messages of the groups that held its ranks say so first
 * (later calls and uvccl_pg_get_failure; works that failed with its first
 * rank said that rank). Where every other host is lost, it is more likely
 * this host that was cut off, and the messages say that instead. */

/* The group's message becomes "<head>: <message>" (a head put there
 * before replaced; the message cut where it must be). */
static void msg_head(group_t *g, const char *head) {
  char old[UVCCL_WORK_MSG_LEN];
  int n;
  snprintf(old, sizeof(old), "%s", g->broken_msg + g->broken_head);
  n = snprintf(g->broken_msg, sizeof(g->broken_msg), "%s: %s", head, old);
  g->broken_head = n > 0 ? strlen(head) + 2 : 0;
  if (g->broken_head > strlen(g->broken_msg)) g->broken_head = 0;
}

static int host_in_group(const net_t *net, const group_t *g, uint64_t h) {
  int i;
  for (i = 0; i < g->size; i++)
    if (net->hosts[g->ranks[i]] == h) return 1;
  return 0;
}

/* "10.0.0.3 (global ranks 4, 5)": the host part of the first rank's
 * address, and the ranks on h. */
static void host_name(net_t *net, uint64_t h, char *buf, size_t len) {
  const char *a = NULL, *colon;
  size_t l;
  int q, n = 0, k = 0;
  for (q = 0; q < net->size; q++)
    if (net->hosts[q] == h) {
      if (a == NULL) a = uvccl__net_addr(net, q);
      n++;
    }
  if (a == NULL) a = "?";
  colon = strrchr(a, ':');
  snprintf(buf, len, "%.*s (global rank%s", colon ? (int)(colon - a) : 64, a,
           n > 1 ? "s" : "");
  for (q = 0; q < net->size; q++)
    if (net->hosts[q] == h) {
      l = strlen(buf);
      snprintf(buf + l, len - l, "%s %d", k++ ? "," : "", q);
    }
  l = strlen(buf);
  snprintf(buf + l, len - l, ")");
}

static void hosts_check(net_t *net, int r) {
  uint64_t h = net->hosts[r], mine = net->hosts[net->rank];
  char name[96], head[128];
  group_t *g;
  int q, i, others = 0;
  if (h == 0 || mine == 0 || h == mine) return;
  for (i = 0; i < net->nlost; i++)
    if (net->lost[i] == h) return;
  for (q = 0; q < net->size; q++)
    if (net->hosts[q] == h && net->fails[q].rank < 0) return;
  net->lost[net->nlost++] = h;
  for (q = 0; q < net->size; q++)
    if (net->hosts[q] != mine && net->fails[q].rank < 0) others++;
  if (others == 0 && !net->cut_off) {
    /* no other host left: this one is the likelier to be cut off */
    net->cut_off = 1;
    LOG_ERROR("coll", "rank %d: every other host is lost to this one (its "
              "link is down, or they all failed)", net->rank);
    snprintf(head, sizeof(head), "every other host is lost to this rank's "
             "(its link is down, or they all failed)");
    for (g = net->groups; g != NULL; g = g->next)
      if (g->broken) msg_head(g, head);
    return;
  }
  if (net->cut_off) return;
  host_name(net, h, name, sizeof(name));
  LOG_WARN("coll", "rank %d: host %s lost: every rank on it failed",
           net->rank, name);
  snprintf(head, sizeof(head), "host %s lost", name);
  for (g = net->groups; g != NULL; g = g->next)
    if (g->broken && host_in_group(net, g, h)) msg_head(g, head);
}

int uvccl__net_host_lost(const net_t *net, int r) {
  int i;
  if (r < 0 || r >= net->size || net->hosts[r] == 0) return 0;
  for (i = 0; i < net->nlost; i++)
    if (net->lost[i] == net->hosts[r]) return 1;
  return 0;
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
      uvccl__net_peer_close_tcp(p);
      uvccl__net_lanes_down(p);
    }
    uvccl__net_fail_msg(net, NULL, f, msg, sizeof(msg));
    uvccl__net_creation_failed(net, UVCCL_EPEER,
                               "process group creation failed: %s", msg);
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
    uvccl__net_peer_close_tcp(p);
    uvccl__net_lanes_down(p);
    p->net->local_xport->peer_down(p);
    p->rx.cur_op = NULL;
    p->rx.rstate = RS_HDR;
    p->rlen = 0;
  }
  if (net->mesh_cb != NULL &&
      (net->mesh_group == NULL || in_group(net->mesh_group, r))) {
    char m2[UVCCL_WORK_MSG_LEN + 64];
    snprintf(m2, sizeof(m2), "rank %d (%s) failed: %.100s%s", r,
             uvccl__net_addr(net, r), f->detail,
             f->origin != net->rank ? " (reported by another rank)" : "");
    /* A world found misconfigured (sizes, striping, secrets differ) fails
     * every rank's creation with the same code, whichever words arrive
     * first: the monitor's notice often beats the refused connection's. */
    int misconf = f->cause == UVCCL_FAIL_ABORTED &&
                  (f->err == UV_EINVAL || f->err == UVCCL_EAUTH);
    uvccl__net_creation_failed(net, misconf ? f->err : UVCCL_EPEER,
                        "process group creation failed: %s", m2);
  }
  for (g = net->groups; g != NULL; g = g->next) {
    if (!in_group(g, r)) continue;
    uvccl__net_fail_msg(net, g, f, msg, sizeof(msg));
    net->up->group_break(g, UVCCL_EPEER,
                       in_group(g, net->first.rank) ? &net->first : f, msg);
  }
  hosts_check(net, r);
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


void uvccl__net_on_live(void *arg, const uvccl__live_ev_t *ev) {
  net_t *net = arg;
  switch (ev->kind) {
  case UVCCL__LIVE_LINK_UP:
    net->links_up++;
    if (ev->rank >= 0 && ev->rank < net->size) net->linked[ev->rank] = 1;
    uvccl__net_check_ready(net);
    return;
  case UVCCL__LIVE_LINK_FAILED:
    uvccl__net_creation_failed(net, ev->fail.err == UVCCL_EAUTH ? UVCCL_EAUTH
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
    uvccl__net_live_closed(net);
    return;
  case UVCCL__LIVE_GROWN: {
    void (*cb)(net_t *, int) = net->grown_cb;
    net->grown_cb = NULL;
    if (cb != NULL) cb(net, ev->rank < 0 ? UV_ENOMEM : 0);
    return;
  }
  }
}

/* Starts this rank's monitor (a world of more than one), its verdicts
 * coming to uvccl__net_on_live. */
int uvccl__net_live_start(net_t *net, uint64_t hb_ms, char *err,
                          size_t errlen) {
  int rc = 0;
  if (net->size <= 1) return 0;
  net->live = uvccl__live_new(net->loop, net->rank, net->size,
                              (struct sockaddr *)&net->self, net->nonce,
                              &net->auth, net->tls, hb_ms, net->sparse,
                              uvccl__net_on_live, net, &net->live_port, err,
                              errlen, &rc);
  if (net->live == NULL) return rc;
  /* sparse: known once the addresses are (uvccl__net_link_overlay) */
  net->want_links = net->sparse ? -1 : net->size - 1;
  return 0;
}

int uvccl__net_send_ctl(net_t *net, int r, uint8_t kind, uint32_t gid,
                        uint32_t seq, uint32_t tag, const void *payload,
                        size_t len) {
  peer_t *p = r >= 0 && r < net->size ? net->peers[r] : NULL;
  frame_hdr_t h;
  ctl_t *c;
  int rc;
  int queue = r >= 0 && r < net->size && uvccl__net_not_yet_connected(net, r);
  if (!queue && (p == NULL || p->state != PEER_UP || !p->sendq_open))
    return UVCCL_EPEER;
  if (queue && (p = uvccl__net_peer_need(net, r)) == NULL) return UV_ENOMEM;
  c = uvccl__malloc(sizeof(*c) + UVCCL__FRAME_HDR + len);
  if (c == NULL) return UV_ENOMEM;
  memset(&h, 0, sizeof(h));
  h.kind = kind;
  h.gid = gid;
  h.seq = seq;
  h.tag = tag;
  h.len = len;
  uvccl__frame_encode(c->buf, &h);
  if (len) memcpy(c->buf + UVCCL__FRAME_HDR, payload, len);
  c->len = UVCCL__FRAME_HDR + len;
  if (queue) {
    c->next = NULL;
    if (p->ctlq_tail) p->ctlq_tail->next = c;
    else p->ctlq = c;
    p->ctlq_tail = c;
    uvccl__net_peer_dial(p);
    return 0;
  }
  rc = uvccl__net_peer_write_ctl(p, &c->req, c->buf, c->len,
                                 uvccl__net_on_ctl_written);
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
    uvccl__net_peer_close_tcp(p);
    uvccl__net_lanes_down(p);
    p->net->local_xport->peer_down(p);
  }
}

static void forget_early(peer_t *p, uint32_t gid) {
  early_t *st, *next;
  for (st = p->early_head; st != NULL; st = next) {
    next = st->next;
    /* (a frame mid-transfer, from the socket or the ring, stays until
     * it is complete: its reader still writes into it) */
    if (st->gid == gid && st != p->rx.cur_early && st != p->srx.cur_early) {
      uvccl__net_early_unlink(p, st);
      uvccl__net_early_free(p->net, st);
    }
  }
}

void uvccl__net_forget_group(net_t *net, uint32_t gid) {
  int r, i;
  for (r = 0; r < net->size; r++) {
    peer_t *p = net->peers[r];
    if (p == NULL) continue;
    forget_early(p, gid);
    for (i = 0; p->lanes != NULL && i < net->stripes - 1; i++)
      if (p->lanes[i] != NULL) forget_early(p->lanes[i], gid);
  }
}
