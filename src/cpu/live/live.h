/* Liveness of the ranks of a world, on a thread of its own.
 *
 * Every process of a world runs one monitor per world (net): a thread
 * with its own small libuv loop and its own TCP connection ("link") to
 * every other rank's monitor. Links carry heartbeats and failure notices,
 * never data, so:
 *  - a rank whose application keeps its loop busy still answers (the
 *    monitor thread beats for it), while a stopped process (SIGSTOP, a
 *    hung host, a cut link) falls silent and is declared failed by every
 *    survivor within the heartbeat timeout;
 *  - a rank that learns of a failure tells every other rank on its links
 *    before it does anything about it, so a survivor that then sees that
 *    rank go away has already read who failed first (TCP keeps the order
 *    of each link);
 *  - the monitor is the one authority on who failed, in what order: the
 *    data connections only report suspicions (uvccl__live_suspect), which
 *    the monitor settles against what its link to that rank says.
 * Verdicts reach the application's loop through a cross-thread queue, as
 * events, in the order the monitor reached them. */
#ifndef UVCCL_CPU_LIVE_LIVE_H
#define UVCCL_CPU_LIVE_LIVE_H

#include "loop/internal.h"
#include "store/auth.h"
#include "tls/tls.h"
#include "cpu/live/event.h"

#include <sys/socket.h>


/* Starts the monitor of rank `rank` of a world of `size`: binds a
 * listening socket on addr's host (any port; *port gets it), starts the
 * thread. Events are delivered on app_loop through cb(arg, ev).
 * hb_timeout_ms: silence after which a rank is declared failed (0 = no
 * heartbeats: links still carry notices and show deaths). nonce: this
 * rank's listener id (hellos must carry it). auth (may be NULL): the
 * world's secret, which every link then proves both ways; tls (may be
 * NULL; referenced): TLS for every link. relay: the links form an
 * overlay, not a full mesh (sparse worlds): failures and notices are
 * passed on to the other links, once, and a rank without a link is
 * suspected for a grace period before it is declared failed. NULL on
 * failure (err says why, *status has the error). */
uvccl__live_t *uvccl__live_new(uv_loop_t *app_loop, int rank, int size,
                               const struct sockaddr *addr, uint64_t nonce,
                               const uvccl__auth_key_t *auth,
                               uvccl__tls_ctx_t *tls,
                               uint64_t hb_timeout_ms, int relay,
                               uvccl__live_cb cb,
                               void *arg, int *port, char *err,
                               size_t errlen, int *status);
/* Connects to rank's monitor (higher ranks dial lower ones), retrying
 * until deadline_ms (uvccl__now_ms clock); nonce is the target's. */
void uvccl__live_connect(uvccl__live_t *l, int rank,
                         const struct sockaddr *addr, uint64_t nonce,
                         uint64_t deadline_ms);
/* The data connection to rank failed: the monitor declares rank failed
 * once its link says so too (or after a short grace, with this cause),
 * having read every notice rank sent before. */
void uvccl__live_suspect(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail);
/* Declares rank failed now (a protocol error of its, say). */
void uvccl__live_declare(uvccl__live_t *l, int rank, int cause, int err,
                         const char *detail);
/* This rank gives up (its application aborts, its creation failed):
 * every link gets the notice, naming this rank with cause and detail,
 * before this returns (so peers read it before they see our connections
 * close). */
void uvccl__live_fail_self(uvccl__live_t *l, int cause, int err,
                           const char *detail);
/* Sends a notice to every live rank now (from the calling thread). */
void uvccl__live_notify(uvccl__live_t *l, const uvccl__notice_t *n);
/* Goodbye on every link, now (before the data connections say it, and
 * before a process that exits at once could lose it). */
void uvccl__live_bye(uvccl__live_t *l);
/* The world grows to size ranks (the new ones dial in); an
 * UVCCL__LIVE_GROWN event follows once links from them are taken. 0, or
 * an error (nothing changed, no event). */
int uvccl__live_grow(uvccl__live_t *l, int size);
/* rank is not in the world (it failed before this rank joined): no link
 * is expected from it, and none is taken. Before any connect. 0, or an
 * error. */
int uvccl__live_absent(uvccl__live_t *l, int rank);
/* Stops: with bye (after uvccl__live_bye), links wait for the peers' EOF. The last event is
 * UVCCL__LIVE_CLOSED; l is freed after it. */
void uvccl__live_close(uvccl__live_t *l, int bye);


#endif
