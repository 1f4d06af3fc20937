/* One connection life cycle for the store, the mesh and the monitor: see
 * conn.h. */
#include "conn.h"

#include <string.h>
#include <unistd.h>

/* ---- incoming connections ------------------------------------------------ */

struct uvccl__accept_hs_s {
  uvccl__acceptor_t *a;
  uvccl__tls_hs_t *hs;
  char from[64];
  uvccl__accept_hs_t *next;
};

void uvccl__acceptor_init(uvccl__acceptor_t *a, uvccl__tls_ctx_t *tls,
                          uint64_t hb_ms, int user_timeout,
                          uvccl__adopt_cb adopt, uvccl__refused_cb refused,
                          void *owner) {
  a->tls = tls;
  a->hb_ms = hb_ms;
  a->user_timeout = user_timeout;
  a->adopt = adopt;
  a->refused = refused;
  a->owner = owner;
  a->hs = NULL;
}

static void on_tls_accepted(void *arg, int status, int fd, const char *msg) {
  uvccl__accept_hs_t *h = arg, **pp;
  uvccl__acceptor_t *a = h->a;
  for (pp = &a->hs; *pp != NULL; pp = &(*pp)->next)
    if (*pp == h) {
      *pp = h->next;
      break;
    }
  if (status != 0) a->refused(a->owner, h->from, msg);
  else a->adopt(a->owner, fd, h->from);
  uvccl__free(h);
}

void uvccl__acceptor_incoming(uvccl__acceptor_t *a, uv_stream_t *listener) {
  uvccl__accept_hs_t *h;
  if (a->tls == NULL) {
    a->adopt(a->owner, -1, NULL);
    return;
  }
  h = uvccl__calloc(1, sizeof(*h));
  if (h == NULL) return; /* it waits in the backlog; the next one tries */
  h->a = a;
  if (uvccl__tls_accept_from(a->tls, listener, a->hb_ms, a->user_timeout,
                             on_tls_accepted, h, h->from, sizeof(h->from),
                             &h->hs) != 0) {
    uvccl__free(h);
    return;
  }
  h->next = a->hs;
  a->hs = h;
}

void uvccl__acceptor_cancel(uvccl__acceptor_t *a) {
  while (a->hs != NULL) {
    uvccl__accept_hs_t *h = a->hs;
    a->hs = h->next;
    uvccl__tls_cancel(h->hs);
    uvccl__free(h);
  }
}

int uvccl__conn_take(uv_loop_t *loop, uv_tcp_t *tcp, uv_stream_t *listener,
                     int fd) {
  int rc;
  uv_tcp_init(loop, tcp); /* makes no socket: cannot fail */
  rc = fd >= 0 ? uv_tcp_open(tcp, fd)
               : uv_accept(listener, (uv_stream_t *)tcp);
  if (rc != 0) {
    if (fd >= 0) close(fd);
    return rc;
  }
  uv_tcp_nodelay(tcp, 1);
  return 0;
}

/* ---- refusals, logged at a bounded rate ---------------------------------- */

int uvccl__refusals_admit(uvccl__refusals_t *r, uint64_t now_ms,
                          int *unlogged) {
  *unlogged = 0;
  if (now_ms - r->since_ms >= 1000) {
    if (r->count > UVCCL__REFUSALS_PER_S)
      *unlogged = r->count - UVCCL__REFUSALS_PER_S;
    r->since_ms = now_ms;
    r->count = 0;
  }
  return ++r->count <= UVCCL__REFUSALS_PER_S;
}

/* ---- dialing --------------------------------------------------------------- */

uint64_t uvccl__backoff_next(uint64_t *ms, uint64_t cap_ms) {
  *ms = *ms ? *ms * 2 : 10;
  if (*ms > cap_ms) *ms = cap_ms;
  return *ms;
}

static int tcp_is_self(const uv_tcp_t *tcp) {
  struct sockaddr_storage a, b;
  int la = sizeof(a), lb = sizeof(b);
  if (uv_tcp_getsockname(tcp, (struct sockaddr *)&a, &la) != 0 ||
      uv_tcp_getpeername(tcp, (struct sockaddr *)&b, &lb) != 0)
    return 0;
  return la == lb && memcmp(&a, &b, (size_t)la) == 0;
}

int uvccl__dial_status(const uv_tcp_t *tcp, int status) {
  return status == 0 && tcp_is_self(tcp) ? UV_ECONNREFUSED : status;
}
