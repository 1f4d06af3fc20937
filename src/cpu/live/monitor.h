/* What the monitor's two files share: the link and the monitor's state.
 * link.c is a link's life: writing, reading, connecting, accepting, the
 * handshake; it tells the monitor what it learns through the monitor's
 * `up` table. live.c is the monitor: commands, events, declaring, the
 * tick, teardown and the entry points (live.h). The link frames are
 * link_frame.h's. */
#ifndef UVCCL_CPU_LIVE_MONITOR_H
#define UVCCL_CPU_LIVE_MONITOR_H

#include "loop/internal.h"
#include "store/auth.h"
#include "tls/tls.h"
#include "cpu/live/event.h"
#include "link_frame.h"
#include "tls/conn.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LINK_PEND_MAX (64u * 1024) /* a peer this far behind is not reading */

enum { LK_CONNECTING = 1, LK_UP, LK_DOWN };

typedef struct link_s {
  uvccl__live_t *l;
  int rank;                /* -1 until an incoming hello names it */
  int state;
  int outgoing;
  uv_tcp_t tcp;
  int tcp_open;
  uv_connect_t creq;
  uv_timer_t timer;        /* connect backoff, then suspicion grace */
  int timer_open;
  struct sockaddr_storage addr;
  uint64_t nonce;          /* outgoing: the target's */
  uvccl__tls_hs_t *tls_hs; /* TLS: the connect and handshake under way */
  int discard_parts;       /* an unnamed incoming link going: handles
                              still closing before it is freed */
  int auth_step;           /* 1 challenge or proof sent, 2 proven */
  lf_hdr_t auth_hdr;       /* the hello, acted on once proven */
  wire_hello_t auth_hello;
  uint8_t auth_nc[UVCCL__AUTH_NONCE], auth_ns[UVCCL__AUTH_NONCE];
  uint64_t deadline;
  uint64_t backoff;
  unsigned char rbuf[LF_HDR + LF_MAX_PAYLOAD];
  size_t rlen;
  uint64_t last_rx;        /* ms */
  int bye;                 /* the peer said goodbye */
  int closing_bye;         /* we said goodbye: wait for its EOF */
  int suspected;
  uvccl__fail_t suspicion;
  /* under l->lock */
  int fd;                  /* >= 0 while writable */
  char *pend;              /* bytes the socket did not take yet */
  size_t pend_len, pend_cap;
  int blocked;             /* pend grew past LINK_PEND_MAX */
  struct link_s *next;     /* every link, for teardown */
} link_t;

/* What a link tells the monitor (live.c's table; link.c calls it). */
typedef struct {
  /* an event for the application's loop */
  void (*post)(uvccl__live_t *l, const uvccl__live_ev_t *ev);
  /* a rank failed (broadcast: tell every link), or this one was declared
   * failed by the others */
  void (*declare)(uvccl__live_t *l, const uvccl__fail_t *f, int broadcast);
  void (*declare_self_dead)(uvccl__live_t *l, const uvccl__fail_t *f);
  /* the link's connection broke (EOF, reset, timeout, a protocol error) */
  void (*link_broken)(link_t *k, int err);
} uvccl__mon_up_t;

struct uvccl__live_s {
  const uvccl__mon_up_t *up;
  uv_loop_t *app_loop;
  uvccl__xqueue_t appq;    /* events, on the application's loop */
  uvccl__live_cb cb;
  void *arg;
  uv_loop_t loop;          /* the monitor's */
  uvccl__xqueue_t cmdq;    /* commands, on the monitor's loop */
  uv_thread_t thread;
  int thread_started;
  uv_mutex_t lock;
  int rank, size;          /* size: the monitor thread's (written under
                              lock as the world grows) */
  int app_size;            /* the application thread's view of size */
  uint64_t nonce;
  uvccl__auth_key_t auth;  /* the world's secret, when it has one */
  uvccl__tls_ctx_t *tls;   /* TLS for every link, or NULL */
  uvccl__acceptor_t acceptor;  /* incoming links (TLS first) */
  uvccl__refusals_t refusals;   /* their refusals' log lines, bounded */
  uint64_t hb_ms, period_ms, grace_ms;
  uv_tcp_t listener;
  uv_timer_t tick;
  uv_timer_t susp_timer;   /* the next suspicion due (overlays) */
  uint64_t last_tick;
  link_t **links;          /* by rank (under lock for the app's writes) */
  link_t *all;             /* every link object */
  unsigned char *dead;     /* 1 failed, 2 left */
  /* Overlays (relay): failures and notices are passed on once; a rank
   * with no link to us is suspected until susp_due (ms), then declared. */
  int relay;
  uint64_t *seen;          /* notices already passed on (their keys) */
  int nseen, seencap;
  uvccl__fail_t *susp;
  uint64_t *susp_due;
  int fenced;              /* we were declared failed */
  int closing;
  int app_closed;          /* live_close was called (app thread) */
};


/* link.c */
void uvccl__mon_connect_retry(link_t *k);
void uvccl__mon_connect_start(link_t *k);
void uvccl__mon_link_close(link_t *k);
link_t *uvccl__mon_link_new(uvccl__live_t *l, int rank);
void uvccl__mon_link_send(link_t *k, int kind, uint32_t a, uint32_t b,
                          uint32_t c, const void *payload, size_t plen);
void uvccl__mon_send_to_all(uvccl__live_t *l, int kind, const void *payload,
                            size_t plen);
void uvccl__mon_link_set_fd(link_t *k, int fd);
void uvccl__mon_link_up(link_t *k);
void uvccl__mon_on_connection(uv_stream_t *server, int status);

/* An event of one kind about rank, with a message (may be NULL). */
static inline void uvccl__mon_post_simple(uvccl__live_t *l, int kind,
                                          int rank, const char *msg) {
  uvccl__live_ev_t ev;
  memset(&ev, 0, sizeof(ev));
  ev.kind = kind;
  ev.rank = rank;
  if (msg) snprintf(ev.msg, sizeof(ev.msg), "%s", msg);
  l->up->post(l, &ev);
}

/* The acceptor's callbacks (link.c): a new incoming link; a refused one. */
void uvccl__mon_link_adopt(void *owner, int fd, const char *from);
void uvccl__mon_on_refused(void *owner, const char *from, const char *why);

#endif
