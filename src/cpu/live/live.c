/* The monitor of a world: heartbeats and failure notices on links of
 * their own, on a thread of their own (see live.h for why).
 *
 * Threads. Everything below runs on the monitor's thread, except the
 * entry points (uvccl__live_*), which run on the application's loop
 * thread and reach the monitor through its command queue, and the writes
 * of link frames, which either thread makes under `lock`: a notice of the
 * application (abort, revoke) must be on the wire before the call
 * returns. A link's descriptor is published (fd >= 0) under the lock
 * only while the link is up, so no thread ever writes a closed one.
 *
 * Link frames: a 16-byte header (kind, payload length, three words) and
 * at most 512 payload bytes, little-endian like the data frames. */
#include "monitor.h"
#include "live.h"

/* ---- commands (application thread -> monitor) ------------------------------- */

enum { CMD_CONNECT = 1, CMD_SUSPECT, CMD_DECLARE, CMD_CLOSE, CMD_GROW,
       CMD_ABSENT };

typedef struct {
  uvccl__xitem_t item;
  uvccl__live_t *l;
  int kind;
  int rank;
  struct sockaddr_storage addr;
  uint64_t nonce, deadline;
  uvccl__fail_t f;
  int bye;
} cmd_t;

typedef struct {
  uvccl__xitem_t item;
  uvccl__live_t *l;
  uvccl__live_ev_t ev;
} evi_t;

/* ---- small helpers ------------------------------------------------------- */

static void fail_set(uvccl__fail_t *f, int rank, int origin, int cause,
                     int err, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void fail_set(uvccl__fail_t *f, int rank, int origin, int cause,
                     int err, const char *fmt, ...) {
  va_list ap;
  memset(f, 0, sizeof(*f));
  f->rank = rank;
  f->origin = origin;
  f->via = origin;
  f->cause = cause;
  f->err = err;
  va_start(ap, fmt);
  vsnprintf(f->detail, sizeof(f->detail), fmt, ap);
  va_end(ap);
}

static void send_dead(link_t *k, const uvccl__fail_t *f) {
  wire_fail_t w;
  uvccl__lframe_fail_put(&w, f);
  uvccl__mon_link_send(k, LF_DEAD, 0, 0, 0, &w, sizeof(w));
}

/* ---- events (monitor -> application) ------------------------------------- */

static void on_app_closed(uvccl__live_t *l);

static void ev_run(uvccl__xitem_t *it) {
  evi_t *e = UVCCL__CONTAINER_OF(it, evi_t, item);
  uvccl__live_t *l = e->l;
  uvccl__live_ev_t ev = e->ev;
  uvccl__free(e);
  l->cb(l->arg, &ev);
  if (ev.kind == UVCCL__LIVE_CLOSED) on_app_closed(l);
}

static void post_ev(uvccl__live_t *l, const uvccl__live_ev_t *ev) {
  evi_t *e = uvccl__calloc(1, sizeof(*e));
  if (e == NULL) return; /* out of memory: the collective timeout remains */
  e->l = l;
  e->ev = *ev;
  e->item.fn = ev_run;
  uvccl__xqueue_post(&l->appq, &e->item);
}

/* ---- declaring ----------------------------------------------------------- */

/* rank failed: tell every other live rank (and rank itself, so that if it
 * is alive after all it knows it was cut off), then the application. */
static void declare(uvccl__live_t *l, const uvccl__fail_t *f,
                    int broadcast) {
  uvccl__live_ev_t ev;
  link_t *k;
  int r;
  if (f->rank < 0 || f->rank >= l->size || f->rank == l->rank) return;
  if (l->dead[f->rank] || l->fenced) return;
  l->dead[f->rank] = 1;
  LOG_DEBUG("live", "rank %d: rank %d failed: %s (seen by %d, told by %d)",
            l->rank, f->rank, f->detail, f->origin, f->via);
  if (broadcast)
    for (r = 0; r < l->size; r++) {
      k = l->links[r];
      if (k != NULL && k->state == LK_UP) send_dead(k, f);
    }
  k = l->links[f->rank];
  if (k != NULL) {
    /* It hears why before it sees us go (if it is alive after all, it
     * must not take our leaving for a failure of ours). */
    if (!broadcast && k->state == LK_UP) send_dead(k, f);
    uvccl__mon_link_close(k);
  }
  memset(&ev, 0, sizeof(ev));
  ev.kind = UVCCL__LIVE_DEAD;
  ev.rank = f->rank;
  ev.fail = *f;
  post_ev(l, &ev);
}

static void declare_self_dead(uvccl__live_t *l, const uvccl__fail_t *f) {
  uvccl__live_ev_t ev;
  int r;
  if (l->fenced) return;
  l->fenced = 1;
  for (r = 0; r < l->size; r++)
    if (l->links[r] != NULL) uvccl__mon_link_close(l->links[r]);
  memset(&ev, 0, sizeof(ev));
  ev.kind = UVCCL__LIVE_DEAD;
  ev.rank = l->rank;
  ev.fail = *f;
  post_ev(l, &ev);
}

/* ---- a link broke -------------------------------------------------------- */

/* The link to k->rank broke (EOF, reset, timeout). */

static void link_broken(link_t *k, int err) {
  uvccl__live_t *l = k->l;
  int r = k->rank, was_up = k->state == LK_UP;
  uvccl__fail_t f;
  if (k->outgoing && k->state == LK_CONNECTING && !l->closing) {
    /* Refused by the other monitor (its rank is misconfigured, or not
     * ready): try again until the deadline; the data connection reports
     * the reason meanwhile. */
    uvccl__mon_connect_retry(k);
    return;
  }
  uvccl__mon_link_close(k);
  if (r < 0 || l->closing || l->fenced) return;
  if (k->closing_bye) return;
  if (k->bye || (k->suspected && k->suspicion.cause == UVCCL_FAIL_LEFT)) {
    /* It said goodbye (on the link, or on its data connection: a process
     * may exit before its monitor's goodbye leaves). */
    if (!l->dead[r]) {
      l->dead[r] = 2;
      uvccl__mon_post_simple(l, UVCCL__LIVE_LEFT, r, NULL);
    }
    return;
  }
  if (!was_up) return;
  if (k->suspected)
    f = k->suspicion;
  else if (err == UV_EOF)
    fail_set(&f, r, l->rank, UVCCL_FAIL_EXITED, err,
             "its process exited or was killed (connection closed)");
  else if (err == UV_ETIMEDOUT || err == UV_EHOSTUNREACH ||
           err == UV_ENETUNREACH)
    fail_set(&f, r, l->rank, UVCCL_FAIL_UNREACHABLE, err, "unreachable: %s",
             uvccl_strerror(err));
  else if (err == UV_ECONNRESET || err == UV_EPIPE)
    fail_set(&f, r, l->rank, UVCCL_FAIL_RESET, err, "connection reset (its "
             "process was killed, or the network reset it)");
  else
    fail_set(&f, r, l->rank, UVCCL_FAIL_RESET, err, "connection lost: %s",
             uvccl_strerror(err));
  declare(l, &f, 1);
}

static const uvccl__mon_up_t mon_up = {
    .post = post_ev,
    .declare = declare,
    .declare_self_dead = declare_self_dead,
    .link_broken = link_broken,
};

/* ---- the tick: heartbeats out, silence checked --------------------------- */

/* Overlays: suspicions of ranks without a link that are due. */
static void on_susp(uv_timer_t *t) {
  uvccl__live_t *l = t->data;
  uint64_t now = uvccl__now_ms(), next = 0;
  int r;
  if (l->closing || l->fenced) return;
  for (r = 0; r < l->size; r++) {
    if (l->susp_due[r] == 0) continue;
    if (now >= l->susp_due[r]) {
      l->susp_due[r] = 0;
      if (!l->dead[r]) declare(l, &l->susp[r], 1);
    } else if (next == 0 || l->susp_due[r] < next) {
      next = l->susp_due[r];
    }
  }
  if (next != 0) uv_timer_start(&l->susp_timer, on_susp, next - now, 0);
}

static void on_tick(uv_timer_t *t) {
  uvccl__live_t *l = t->data;
  uint64_t now = uvccl__now_ms();
  int r, stalled;
  if (l->closing || l->fenced) return;
  /* If this thread itself did not run for a while (the process was
   * stopped, or starved), the silence it sees is its own: start afresh. */
  stalled = now - l->last_tick > 2 * l->period_ms;
  if (stalled)
    LOG_DEBUG("live", "rank %d: the monitor did not run for %llu ms: "
              "silence restarts from now", l->rank,
              (unsigned long long)(now - l->last_tick));
  l->last_tick = now;
  for (r = 0; r < l->size; r++) {
    link_t *k = l->links[r];
    int blocked;
    if (k == NULL || k->state != LK_UP) continue;
    if (stalled) k->last_rx = now;
    uvccl__mon_link_send(k, LF_HB, 0, 0, 0, NULL, 0);
    uv_mutex_lock(&l->lock);
    blocked = k->blocked;
    uv_mutex_unlock(&l->lock);
    if (blocked) {
      uvccl__fail_t f;
      fail_set(&f, r, l->rank, UVCCL_FAIL_HEARTBEAT, UV_ETIMEDOUT,
               "its monitor stopped reading (stopped or hung)");
      declare(l, &f, 1);
    } else if (l->hb_ms > 0 && now - k->last_rx > l->hb_ms + l->period_ms) {
      /* Silence is counted from the last heartbeat, which came up to a
       * period before the rank stopped: one period more, so a rank
       * stopped for less than the timeout is never declared failed, and
       * one stopped for good is, within the timeout plus two periods. */
      uvccl__fail_t f;
      fail_set(&f, r, l->rank, UVCCL_FAIL_HEARTBEAT, UV_ETIMEDOUT,
               "no heartbeat for %.1f s (stopped, hung or unreachable)",
               (double)(now - k->last_rx) / 1000.0);
      declare(l, &f, 1);
    }
  }
}

/* ---- commands ------------------------------------------------------------ */

static void on_grace(uv_timer_t *t) {
  link_t *k = t->data;
  uvccl__live_t *l = k->l;
  if (!k->suspected || k->rank < 0 || l->dead[k->rank]) return;
  if (k->suspicion.cause == UVCCL_FAIL_LEFT) {
    l->dead[k->rank] = 2;
    uvccl__mon_post_simple(l, UVCCL__LIVE_LEFT, k->rank, NULL);
    return;
  }
  /* The link is still up although the data connection broke: the rank is
   * alive but cut off from us; it is declared failed all the same. */
  declare(l, &k->suspicion, 1);
}

/* The world grew to n ranks (uvccl__live_grow): the arrays by rank grow
 * under the lock, as the application's thread reads links[] under it;
 * the new ranks' links come when they dial. The event says it is done,
 * so the new ranks are told where to dial only once they can be taken. */
static void grow_arrays(uvccl__live_t *l, int n) {
  link_t **links;
  unsigned char *dead;
  uvccl__fail_t *susp = NULL;
  uint64_t *due = NULL;
  int old = l->size;
  uvccl__live_ev_t ev;
  memset(&ev, 0, sizeof(ev));
  ev.kind = UVCCL__LIVE_GROWN;
  ev.rank = n;
  if (n <= old) {
    l->up->post(l, &ev);
    return;
  }
  links = uvccl__calloc((size_t)n, sizeof(*links));
  dead = uvccl__calloc((size_t)n, 1);
  if (l->relay) {
    susp = uvccl__calloc((size_t)n, sizeof(*susp));
    due = uvccl__calloc((size_t)n, sizeof(*due));
  }
  if (links == NULL || dead == NULL ||
      (l->relay && (susp == NULL || due == NULL))) {
    uvccl__free(links);
    uvccl__free(dead);
    uvccl__free(susp);
    uvccl__free(due);
    ev.rank = -1; /* out of memory: the grow fails */
    l->up->post(l, &ev);
    return;
  }
  memcpy(dead, l->dead, (size_t)old);
  if (l->relay) {
    memcpy(susp, l->susp, (size_t)old * sizeof(*susp));
    memcpy(due, l->susp_due, (size_t)old * sizeof(*due));
  }
  uv_mutex_lock(&l->lock);
  memcpy(links, l->links, (size_t)old * sizeof(*links));
  uvccl__free(l->links);
  l->links = links;
  l->size = n;
  uv_mutex_unlock(&l->lock);
  uvccl__free(l->dead);
  l->dead = dead;
  if (l->relay) {
    uvccl__free(l->susp);
    uvccl__free(l->susp_due);
    l->susp = susp;
    l->susp_due = due;
  }
  LOG_DEBUG("live", "rank %d: the world grew from %d to %d ranks", l->rank,
            old, n);
  l->up->post(l, &ev);
}

static void close_all(uvccl__live_t *l, int bye);

static void cmd_run(uvccl__xitem_t *it) {
  cmd_t *c = UVCCL__CONTAINER_OF(it, cmd_t, item);
  uvccl__live_t *l = c->l;
  link_t *k;
  switch (c->kind) {
  case CMD_CONNECT:
    if (l->closing || c->rank < 0 || c->rank >= l->size ||
        l->links[c->rank] != NULL)
      break;
    k = uvccl__mon_link_new(l, c->rank);
    if (k == NULL) {
      uvccl__mon_post_simple(l, UVCCL__LIVE_LINK_FAILED, c->rank,
                             "out of memory");
      break;
    }
    k->outgoing = 1;
    k->state = LK_CONNECTING;
    k->nonce = c->nonce;
    k->deadline = c->deadline;
    memcpy(&k->addr, &c->addr, sizeof(k->addr));
    uv_mutex_lock(&l->lock);
    l->links[c->rank] = k;
    uv_mutex_unlock(&l->lock);
    uvccl__mon_connect_start(k);
    break;
  case CMD_SUSPECT:
    if (l->closing || l->fenced) break;
    if (l->dead[c->rank] == 2) {
      /* already gone cleanly: the data connection may say so now */
      uvccl__mon_post_simple(l, UVCCL__LIVE_LEFT, c->rank, NULL);
      break;
    }
    if (l->dead[c->rank]) break;
    k = l->links[c->rank];
    if ((k == NULL || k->state != LK_UP) && l->relay &&
        c->f.cause != UVCCL_FAIL_LEFT) {
      /* No link to it (an overlay): what failed first may still be on
       * its way through the others; wait a grace period for it. */
      if (l->susp_due[c->rank] == 0) {
        l->susp[c->rank] = c->f;
        l->susp_due[c->rank] = uvccl__now_ms() + l->grace_ms;
        if (!uv_is_active((uv_handle_t *)&l->susp_timer))
          uv_timer_start(&l->susp_timer, on_susp, l->grace_ms, 0);
      }
      break;
    }
    if (k == NULL || k->state != LK_UP) {
      if (c->f.cause == UVCCL_FAIL_LEFT) {
        l->dead[c->rank] = 2;
        uvccl__mon_post_simple(l, UVCCL__LIVE_LEFT, c->rank, NULL);
      } else {
        declare(l, &c->f, 1);
      }
      break;
    }
    if (k->suspected) break;
    k->suspected = 1;
    k->suspicion = c->f;
    uv_timer_start(&k->timer, on_grace, l->grace_ms, 0);
    break;
  case CMD_DECLARE:
    if (!l->closing) declare(l, &c->f, 1);
    break;
  case CMD_CLOSE:
    close_all(l, c->bye);
    break;
  case CMD_GROW:
    grow_arrays(l, c->rank);
    break;
  case CMD_ABSENT:
    if (c->rank >= 0 && c->rank < l->size && c->rank != l->rank &&
        l->links[c->rank] == NULL && !l->dead[c->rank])
      l->dead[c->rank] = 1;
    break;
  }
  uvccl__free(c);
}

static int post_cmd(uvccl__live_t *l, cmd_t *c) {
  c->l = l;
  c->item.fn = cmd_run;
  return uvccl__xqueue_post(&l->cmdq, &c->item);
}

/* ---- teardown ------------------------------------------------------------ */

static void on_bye_timeout(uv_timer_t *t) { uvccl__mon_link_close(t->data); }

static void close_all(uvccl__live_t *l, int bye) {
  link_t *k;
  if (l->closing) return;
  l->closing = 1;
  uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
  uv_close((uv_handle_t *)&l->listener, NULL);
  uvccl__acceptor_cancel(&l->acceptor);
  for (k = l->all; k != NULL; k = k->next)
    if (k->tls_hs != NULL) {
      uvccl__tls_cancel(k->tls_hs);
      k->tls_hs = NULL;
    }
  for (k = l->all; k != NULL; k = k->next) {
    if (k->state == LK_UP && bye && k->tcp_open) {
      uv_os_fd_t fd;
      /* Goodbye (already written by uvccl__live_bye), then half-close and
       * wait for the peer's EOF (closing with unread data would reset the
       * connection, and the peer could lose the goodbye). */
      if (uv_fileno((uv_handle_t *)&k->tcp, &fd) == 0) shutdown(fd, SHUT_WR);
      uvccl__mon_link_set_fd(k, -1);
      k->closing_bye = 1;
      uv_timer_start(&k->timer, on_bye_timeout, 1000, 0);
      continue;
    }
    uvccl__mon_link_close(k);
  }
  for (k = l->all; k != NULL; k = k->next)
    if (k->timer_open && !k->closing_bye) {
      k->timer_open = 0;
      uv_close((uv_handle_t *)&k->timer, NULL);
    }
  uvccl__xqueue_close(&l->cmdq, NULL, NULL);
}

static void thread_main(void *arg) {
  uvccl__live_t *l = arg;
  link_t *k;
  uv_run(&l->loop, UV_RUN_DEFAULT);
  /* Links that waited for a goodbye's EOF closed their timers last. */
  for (k = l->all; k != NULL; k = k->next)
    if (k->timer_open) {
      k->timer_open = 0;
      uv_close((uv_handle_t *)&k->timer, NULL);
    }
  uv_run(&l->loop, UV_RUN_DEFAULT);
  uvccl__mon_post_simple(l, UVCCL__LIVE_CLOSED, -1, NULL);
}

/* ---- entry points (application thread) ----------------------------------- */

static void live_free(void *arg) {
  uvccl__live_t *l = arg;
  link_t *k, *next;
  for (k = l->all; k != NULL; k = next) {
    next = k->next;
    uvccl__free(k->pend);
    uvccl__free(k);
  }
  uv_mutex_destroy(&l->lock);
  uvccl__tls_ctx_unref(l->tls);
  uvccl__free(l->links);
  uvccl__free(l->dead);
  uvccl__free(l->seen);
  uvccl__free(l->susp);
  uvccl__free(l->susp_due);
  uvccl__free(l);
}

uvccl__live_t *uvccl__live_new(uv_loop_t *app_loop, int rank, int size,
                               const struct sockaddr *addr, uint64_t nonce,
                               const uvccl__auth_key_t *auth,
                               uvccl__tls_ctx_t *tls,
                               uint64_t hb_timeout_ms, int relay,
                               uvccl__live_cb cb,
                               void *arg, int *port, char *err,
                               size_t errlen, int *status) {
  uvccl__live_t *l = uvccl__calloc(1, sizeof(*l));
  struct sockaddr_storage ss;
  int rc, len = sizeof(ss);
  if (l == NULL) {
    snprintf(err, errlen, "out of memory");
    *status = UV_ENOMEM;
    return NULL;
  }
  l->app_loop = app_loop;
  l->up = &mon_up;
  l->cb = cb;
  l->arg = arg;
  l->rank = rank;
  l->size = l->app_size = size;
  l->nonce = nonce;
  if (auth != NULL) l->auth = *auth;
  if (tls != NULL) {
    uvccl__tls_ctx_ref(tls);
    l->tls = tls;
  }
  l->hb_ms = hb_timeout_ms;
  uvccl__acceptor_init(&l->acceptor, l->tls, l->hb_ms, 1,
                       uvccl__mon_link_adopt, uvccl__mon_on_refused, l);
  l->relay = relay;
  l->period_ms = hb_timeout_ms ? hb_timeout_ms / 10 : 1000;
  if (l->period_ms < 20) l->period_ms = 20;
  l->grace_ms = hb_timeout_ms ? hb_timeout_ms / 4 : 1000;
  if (l->grace_ms > 1000) l->grace_ms = 1000;
  if (l->grace_ms < 100) l->grace_ms = 100;
  l->links = uvccl__calloc((size_t)size, sizeof(link_t *));
  l->dead = uvccl__calloc((size_t)size, 1);
  if (relay) {
    l->susp = uvccl__calloc((size_t)size, sizeof(*l->susp));
    l->susp_due = uvccl__calloc((size_t)size, sizeof(*l->susp_due));
  }
  if (l->links == NULL || l->dead == NULL ||
      (relay && (l->susp == NULL || l->susp_due == NULL)) ||
      uv_mutex_init(&l->lock) != 0) {
    uvccl__free(l->links);
    uvccl__free(l->dead);
    uvccl__free(l->susp);
    uvccl__free(l->susp_due);
    uvccl__free(l);
    snprintf(err, errlen, "out of memory");
    *status = UV_ENOMEM;
    return NULL;
  }
  rc = uv_loop_init(&l->loop);
  if (rc == 0) rc = uvccl__xqueue_init(&l->loop, &l->cmdq);
  if (rc != 0) {
    snprintf(err, errlen, "starting the monitor's loop: %s",
             uvccl_strerror(rc));
    uv_loop_close(&l->loop);
    live_free(l);
    *status = rc;
    return NULL;
  }
  uv_tcp_init(&l->loop, &l->listener);
  l->listener.data = l;
  uv_timer_init(&l->loop, &l->tick);
  l->tick.data = l;
  uv_timer_init(&l->loop, &l->susp_timer);
  l->susp_timer.data = l;
  memcpy(&ss, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in));
  if (ss.ss_family == AF_INET6) ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
  else ((struct sockaddr_in *)&ss)->sin_port = 0;
  rc = uv_tcp_bind(&l->listener, (struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&l->listener, 4096, uvccl__mon_on_connection);
  if (rc == 0)
    rc = uv_tcp_getsockname(&l->listener, (struct sockaddr *)&ss, &len);
  if (rc == 0) rc = uvccl__xqueue_init(app_loop, &l->appq);
  if (rc != 0) {
    snprintf(err, errlen, "the monitor's listener: %s", uvccl_strerror(rc));
    uv_close((uv_handle_t *)&l->listener, NULL);
    uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
    uvccl__xqueue_close(&l->cmdq, NULL, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
    live_free(l);
    *status = rc;
    return NULL;
  }
  *port = ntohs(ss.ss_family == AF_INET6
                    ? ((struct sockaddr_in6 *)&ss)->sin6_port
                    : ((struct sockaddr_in *)&ss)->sin_port);
  l->last_tick = uvccl__now_ms(); /* a stop before the first tick counts */
  uv_timer_start(&l->tick, on_tick, l->period_ms, l->period_ms);
  rc = uv_thread_create(&l->thread, thread_main, l);
  if (rc != 0) {
    snprintf(err, errlen, "starting the monitor's thread: %s",
             uvccl_strerror(rc));
    uv_close((uv_handle_t *)&l->listener, NULL);
    uv_close((uv_handle_t *)&l->tick, NULL);
  uv_close((uv_handle_t *)&l->susp_timer, NULL);
    uvccl__xqueue_close(&l->cmdq, NULL, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
    uvccl__xqueue_close(&l->appq, live_free, l);
    *status = rc;
    return NULL;
  }
  l->thread_started = 1;
  return l;
}

void uvccl__live_connect(uvccl__live_t *l, int rank,
                         const struct sockaddr *addr, uint64_t nonce,
                         uint64_t deadline_ms) {
  cmd_t *c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL || l->app_closed) {
    uvccl__free(c);
    return;
  }
  c->kind = CMD_CONNECT;
  c->rank = rank;
  memcpy(&c->addr, addr, addr->sa_family == AF_INET6
                             ? sizeof(struct sockaddr_in6)
                             : sizeof(struct sockaddr_in));
  c->nonce = nonce;
  c->deadline = deadline_ms;
  post_cmd(l, c);
}

static void post_fail_cmd(uvccl__live_t *l, int kind, int rank, int cause,
                          int err, const char *detail) {
  cmd_t *c;
  if (l == NULL || l->app_closed || rank < 0 || rank >= l->app_size) return;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return;
  c->kind = kind;
  c->rank = rank;
  fail_set(&c->f, rank, l->rank, cause, err, "%s", detail ? detail : "");
  post_cmd(l, c);
}

void uvccl__live_suspect(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail) {
  post_fail_cmd(l, CMD_SUSPECT, rank, cause, err, detail);
}

void uvccl__live_declare(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail) {
  post_fail_cmd(l, CMD_DECLARE, rank, cause, err, detail);
}

int uvccl__live_grow(uvccl__live_t *l, int size) {
  cmd_t *c;
  if (l == NULL || l->app_closed || size <= l->app_size) return UV_EINVAL;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return UV_ENOMEM;
  l->app_size = size;
  c->kind = CMD_GROW;
  c->rank = size;
  post_cmd(l, c);
  return 0;
}

int uvccl__live_absent(uvccl__live_t *l, int rank) {
  cmd_t *c;
  if (l == NULL || l->app_closed || rank < 0 || rank >= l->app_size)
    return UV_EINVAL;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) return UV_ENOMEM;
  c->kind = CMD_ABSENT;
  c->rank = rank;
  post_cmd(l, c);
  return 0;
}

void uvccl__live_fail_self(uvccl__live_t *l, int cause, int err,
                           const char *detail) {
  uvccl__fail_t f;
  wire_fail_t w;
  if (l == NULL || l->app_closed) return;
  fail_set(&f, l->rank, l->rank, cause, err, "%s", detail);
  uvccl__lframe_fail_put(&w, &f);
  uvccl__mon_send_to_all(l, LF_DEAD, &w, sizeof(w));
}

void uvccl__live_bye(uvccl__live_t *l) {
  if (l == NULL || l->app_closed) return;
  uvccl__mon_send_to_all(l, LF_BYE, NULL, 0);
}

void uvccl__live_notify(uvccl__live_t *l, const uvccl__notice_t *n) {
  wire_notice_t w;
  if (l == NULL || l->app_closed) return;
  memset(&w, 0, sizeof(w));
  w.what = n->what;
  w.gid = n->gid;
  w.rank = n->rank;
  w.origin = n->origin;
  w.cause = n->cause;
  w.err = n->err;
  memcpy(w.detail, n->detail, sizeof(w.detail));
  w.detail[sizeof(w.detail) - 1] = '\0';
  uvccl__mon_send_to_all(l, LF_NOTICE, &w, sizeof(w));
}

/* The monitor's CLOSED event: the thread is done; join it, then let the
 * event queue go (its close callback frees everything). */
static void on_app_closed(uvccl__live_t *l) {
  uv_thread_join(&l->thread);
  uv_loop_close(&l->loop);
  uvccl__xqueue_close(&l->appq, live_free, l);
}

void uvccl__live_close(uvccl__live_t *l, int bye) {
  cmd_t *c;
  if (l == NULL || l->app_closed) return;
  l->app_closed = 1;
  c = uvccl__calloc(1, sizeof(*c));
  if (c == NULL) {
    /* Out of memory with nothing to ask the thread with: it is left
     * running rather than stopped unsafely. */
    LOG_ERROR("live", "rank %d: out of memory closing the monitor", l->rank);
    return;
  }
  c->kind = CMD_CLOSE;
  c->bye = bye;
  post_cmd(l, c);
}
