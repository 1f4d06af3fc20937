/* Process groups: creation over a store (listen, publish the address,
 * connect the full mesh, store-based barrier), sparse worlds' creation and
 * their addresses read when a peer is first needed, and creation from a
 * URL. */
#include "internal.h"
#include "stage.h"
#include "boot/bootenv.h"
#include "store/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* ---- small utilities ------------------------------------------------------ */

/* Runs fn(arg) from a callback, never inside the caller. */
typedef struct {
  uv_timer_t t;
  void (*fn)(void *);
  void *arg;
} defer_t;

static void defer_closed(uv_handle_t *h) {
  defer_t *d = h->data;
  d->fn(d->arg);
  uvccl__free(d);
}

int uvccl__pg_defer_call(uv_loop_t *loop, void (*fn)(void *), void *arg) {
  defer_t *d = uvccl__malloc(sizeof(*d));
  if (d == NULL) return UV_ENOMEM;
  d->fn = fn;
  d->arg = arg;
  uv_timer_init(loop, &d->t);
  d->t.data = d;
  uv_close((uv_handle_t *)&d->t, defer_closed);
  return 0;
}

static void apply_options(group_t *g, const uvccl_pg_options_t *o) {
  uint64_t busy, x;
  g->timeout_ms = o && o->timeout_ms ? o->timeout_ms
                                     : UVCCL_PG_DEFAULT_TIMEOUT_MS;
  g->small_max = o && o->small_max ? o->small_max : UVCCL__SMALL_MAX;
  g->segment = o && o->segment ? o->segment : UVCCL__SEGMENT;
  x = o ? o->stage_chunk : 0;
  if (x == 0) uvccl__config_uint(UVCCL__CFG_STAGE_CHUNK, &x);
  g->stage_chunk = x >= SIZE_MAX ? 0 : (size_t)x;
  busy = o ? o->busy_poll_us : 0;
  if (busy == 0) uvccl__config_uint(UVCCL__CFG_BUSY_POLL_US, &busy);
  if (busy == UINT32_MAX) busy = 0;
  g->busy_us = busy > 10000000 ? 10000000 : (uint32_t)busy;
  if (o != NULL && o->fingerprint_check != 0) {
    g->fp_check = o->fingerprint_check > 0;
  } else {
    int debug;
    uvccl__config_choice(UVCCL__CFG_DEBUG, &debug);
    g->fp_check = debug == 2; /* detail */
  }
  /* the variables, where set, over the options */
  if (uvccl__config_uint(UVCCL__CFG_SMALL_MAX, &x) == 1) g->small_max = x;
  uvccl__config_choice(UVCCL__CFG_SMALL_TREE, &g->small_tree);
  if (uvccl__config_uint(UVCCL__CFG_SEGMENT, &x) == 1) g->segment = x;
  uvccl__config_uint(UVCCL__CFG_STREAM_MIN, &x);
  g->stream_min = x;
}

/* The world's turns on the loop (src/loop/turn.c): the budget and
 * whether they are timed; the options, else the variables. */
#define TURN_BYTES_MIN ((size_t)64 * 1024)
static void apply_turn_options(net_t *net, const uvccl_pg_options_t *o) {
  uint64_t bytes = o->turn_bytes, us = o->turn_us;
  int timing = o->loop_stats > 0;
  if (bytes == 0) uvccl__config_uint(UVCCL__CFG_TURN_BYTES, &bytes);
  if (bytes < TURN_BYTES_MIN) bytes = TURN_BYTES_MIN;
  if (us == 0) uvccl__config_uint(UVCCL__CFG_TURN_US, &us);
  if (us >= UINT32_MAX) us = 0; /* no limit */
  if (o->loop_stats == 0) uvccl__config_choice(UVCCL__CFG_LOOP_STATS, &timing);
  uvccl__turn_init(&net->turn, (size_t)bytes, us * 1000, timing);
}

static void apply_stripe_options(net_t *net, const uvccl_pg_options_t *o) {
  uint64_t n = o->tcp_stripes > 0 ? (uint64_t)o->tcp_stripes : 0,
           min = o->tcp_stripe_min;
  if (n == 0) uvccl__config_uint(UVCCL__CFG_TCP_STRIPES, &n);
  if (n > 16) n = 16;
  if (min == 0) uvccl__config_uint(UVCCL__CFG_TCP_STRIPE_MIN, &min);
  net->stripes = (int)n;
  net->stripe_min = min > SIZE_MAX ? SIZE_MAX : (size_t)min;
}

/* ---- creation over a store -------------------------------------------------- */

typedef struct {
  group_t *g;
  uvccl_pg_t *pg;
  uvccl_store_t *store;
  uvccl_work_t *w;         /* the user's creation work */
  char prefix[200];
  char key[256];
  char value[160];
  uvccl_work_t setw, addw, waitw, donew;
  uvccl_work_t passw, allw; /* after the gate (barrier_through) */
  uvccl_work_t *getw;      /* one per lower rank */
  int ngets, ngot;
  int nstore;              /* store works in flight */
  int mesh_done;
  int dead;                /* the creation work completed */
  uint64_t deadline;
  char waitkey[256];
  char passkey[280];       /* waitkey/through: the ranks past the gate */
  char allkey[280];        /* waitkey/all: every one of them is */
  /* sparse worlds (see below) */
  int sparse;
  long long gen;
  int nb[128], nnb;        /* the overlay neighbours (one MULTI_GET in
                              addw, or a GET each in getw) */
  uvccl_work_t tickw;
  struct lookup_s *lk;
  /* A world grown on the members' net (uvccl__cpu_pg_init_grown): 1 on a
   * member, 2 on a joiner; the ranks dialed (getr[i] is getw[i]'s; NULL:
   * ranks 0 .. ngets - 1); a member's joiners, declared failed if the
   * grow fails (so every member and joiner sees it end). */
  int grow;
  int *getr;
  int *joiners, njoiners;
} boot_t;

static int get_rank(const boot_t *b, int i) {
  return b->getr != NULL ? b->getr[i] : i;
}

typedef struct lookup_s lookup_t;

static void boot_abandon(uvccl_work_t *w, int status);
static const struct uvccl__work_ops boot_ops = {boot_abandon, NULL, NULL};

static void boot_maybe_free(boot_t *b) {
  int i;
  if (!b->dead || b->nstore > 0) return;
  for (i = 0; i < (b->sparse ? b->nnb : b->ngets); i++)
    uvccl_work_cleanup(&b->getw[i]);
  uvccl_work_cleanup(&b->setw);
  uvccl_work_cleanup(&b->addw);
  uvccl_work_cleanup(&b->waitw);
  uvccl_work_cleanup(&b->donew);
  uvccl_work_cleanup(&b->passw);
  uvccl_work_cleanup(&b->allw);
  uvccl_work_cleanup(&b->tickw);
  uvccl__free(b->getw);
  uvccl__free(b->getr);
  uvccl__free(b->joiners);
  uvccl__free(b);
}

static void boot_fail(boot_t *b, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void boot_fail(boot_t *b, int err, const char *fmt, ...) {
  va_list ap;
  char msg[UVCCL_WORK_MSG_LEN];
  net_t *net;
  int i;
  if (b->dead) return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  b->dead = 1;
  b->g->boot = NULL;
  b->g->broken = 1;
  b->g->broken_err = err;
  snprintf(b->g->broken_msg, sizeof(b->g->broken_msg), "%s", msg);
  uvccl__flight_group_broken(b->g->fg, err, msg);
  net = b->g->net;
  net->mesh_cb = NULL; /* b goes: nothing may call back with it */
  net->mesh_arg = NULL;
  net->mesh_ready = NULL;
  net->mesh_group = NULL;
  if (b->grow == 1) {
    /* A member's grow: the old world goes on; the joiners are out, on
     * every member and on themselves. */
    char d[UVCCL__DETAIL_LEN];
    net->grown_cb = NULL;
    snprintf(d, sizeof(d), "the grow it joined failed: %.90s", msg);
    for (i = 0; i < b->njoiners; i++)
      if (b->joiners[i] < net->size && net->fails[b->joiners[i]].rank < 0)
        uvccl__live_declare(net->live, b->joiners[i], UVCCL_FAIL_ABORTED,
                            err, d);
  } else if (net->live != NULL && !net->aborted && err != UV_ECANCELED) {
    /* The ranks already connected hear why at once, instead of waiting
     * for their own timeout: on their data connections (in order, before
     * those close) and on the monitor's links. */
    char d[UVCCL__DETAIL_LEN];
    uvccl__net_reject_all(net, msg);
    const char *why = msg;
    if (strncmp(why, "process group creation failed: ", 31) == 0) why += 31;
    snprintf(d, sizeof(d), "its group creation failed: %.90s", why);
    uvccl__live_fail_self(net->live, UVCCL_FAIL_ABORTED, err, d);
    net->aborted = 1;
  }
  uvccl__work_fail(b->w, err, "%s", msg);
  /* Store works still out come back cancelled; then b goes. */
  uvccl_work_cancel(&b->setw);
  uvccl_work_cancel(&b->addw);
  uvccl_work_cancel(&b->waitw);
  uvccl_work_cancel(&b->donew);
  uvccl_work_cancel(&b->passw);
  uvccl_work_cancel(&b->allw);
  uvccl_work_cancel(&b->tickw);
  for (i = 0; i < (b->sparse ? b->nnb : b->ngets); i++)
    uvccl_work_cancel(&b->getw[i]);
  boot_maybe_free(b);
}

/* "0, 3, 5" (at most a few, then "..."), the ranks for which pick says
 * yes. Returns how many there are. */
static int rank_list(boot_t *b, int (*pick)(boot_t *, int), char *buf,
                     size_t len) {
  int i, n = 0;
  size_t off = 0;
  buf[0] = '\0';
  for (i = 0; i < b->g->net->size; i++) {
    if (i == b->g->net->rank || !pick(b, i)) continue;
    if (n < 8 && off < len)
      off += (size_t)snprintf(buf + off, len - off, "%s%d", n ? ", " : "", i);
    else if (n == 8 && off < len)
      off += (size_t)snprintf(buf + off, len - off, ", ...");
    n++;
  }
  return n;
}

static int pick_unpublished(boot_t *b, int r) {
  int i;
  for (i = 0; i < b->ngets; i++)
    if (get_rank(b, i) == r) return b->getw[i].state == UVCCL_WORK_PENDING;
  return 0;
}

static int pick_unconnected(boot_t *b, int r) {
  peer_t *p = b->g->net->peers[r];
  if (b->g->inv[r] < 0) return 0; /* not of this world (a grown one) */
  return p == NULL || p->state != PEER_UP;
}

/* Sparse worlds: the neighbours whose address did not come (all of them
 * while the one MULTI_GET waits). */
static const char *sparse_unpublished(boot_t *b, char *buf, size_t len) {
  int i, n = 0, all = b->addw.state == UVCCL_WORK_PENDING;
  size_t off = 0;
  buf[0] = '\0';
  for (i = 0; i < b->nnb && off < len; i++) {
    if (!all && b->getw[i].state != UVCCL_WORK_PENDING) continue;
    off += (size_t)snprintf(buf + off, len - off, "%s%d", n++ ? ", " : "",
                            b->nb[i]);
  }
  return buf;
}

static void boot_abandon(uvccl_work_t *w, int status) {
  boot_t *b = w->owner_;
  char msg[UVCCL_WORK_MSG_LEN], list[64], where[180];
  net_t *net = b->g->net;
  int n;
  if (b->setw.state == UVCCL_WORK_PENDING ||
      b->tickw.state == UVCCL_WORK_PENDING) {
    snprintf(where, sizeof(where), "the store (%.60s) never answered",
             uvccl__store_describe(b->store));
  } else if (b->sparse && b->ngot < b->nnb) {
    if (b->addw.state == UVCCL_WORK_PENDING) /* one MULTI_GET for all */
      snprintf(where, sizeof(where), "not every neighbour published its "
               "address (one of ranks %s: not started, or another world "
               "size or prefix?)", sparse_unpublished(b, list, sizeof(list)));
    else
      snprintf(where, sizeof(where), "rank%s %s never published %s address "
               "(not started, or another world size or prefix?)",
               b->nnb - b->ngot > 1 ? "s" : "",
               sparse_unpublished(b, list, sizeof(list)),
               b->nnb - b->ngot > 1 ? "their" : "its");
  } else if (b->sparse && !b->mesh_done) {
    snprintf(where, sizeof(where), "the monitor links of %d of %d "
             "neighbours are up", net->links_up, net->want_links);
  } else if ((n = rank_list(b, pick_unpublished, list, sizeof(list))) > 0) {
    snprintf(where, sizeof(where), "rank%s %s never published %s address "
             "(not started, or another world size or prefix?)",
             n > 1 ? "s" : "", list, n > 1 ? "their" : "its");
  } else if ((n = rank_list(b, pick_unconnected, list, sizeof(list))) > 0) {
    snprintf(where, sizeof(where), "%d of %d peers connected; not rank%s %s",
             b->g->size - 1 - n, b->g->size - 1, n > 1 ? "s" : "", list);
  } else if (b->grow == 1 && net->grown_cb != NULL) {
    snprintf(where, sizeof(where), "the monitor never took the new ranks");
  } else if (b->grow == 1 && !b->mesh_done) {
    snprintf(where, sizeof(where), "the joiners are connected, but not "
             "every monitor link or shared-memory exchange is done");
  } else if (!b->mesh_done) {
    snprintf(where, sizeof(where), "the monitor links of %d of %d peers are "
             "up", net->links_up, net->want_links);
  } else if (b->allw.state == UVCCL_WORK_PENDING ||
             b->passw.state == UVCCL_WORK_PENDING) {
    snprintf(where, sizeof(where), "past the store barrier; waiting for the "
             "other ranks to pass it too");
  } else {
    snprintf(where, sizeof(where), "connected; waiting at the store barrier "
             "for the other ranks");
  }
  snprintf(msg, sizeof(msg), "process group creation (rank %d of %d) %s "
           "after %llu ms: %.120s", b->g->rank, b->g->size,
           status == UV_ETIMEDOUT ? "timed out" : "cancelled",
           (unsigned long long)w->timeout_ms_, where);
  if (status == UV_ETIMEDOUT) uvccl__work_fail(w, status, "%s", msg);
  boot_fail(b, status, "%s", msg);
}

static void boot_done(boot_t *b) {
  group_t *g = b->g;
  b->dead = 1;
  g->boot = NULL;
  if (!b->sparse && !b->grow && g->size == g->net->size &&
      uvccl__shm_boxes_agreed(g->net)) {
    g->box_ok = 1;
    LOG_INFO("coll", "rank %d: small collectives and barriers of %d ranks "
             "through shared-memory boxes", g->rank, g->size);
  }
  /* a world that owns its store client watches it for dump requests */
  if (g->own_store != NULL && g->net->twatch == NULL)
    g->net->twatch = uvccl__trace_watch_start(
        g->net->loop, g->net->rank, g->net->size, g->own_store, g->trace_name);
  uvccl__work_complete(b->w, 0);
  boot_maybe_free(b);
}

/* A store work of the creation came back: 1 when the creation is over
 * (it had ended, or this failed it with what, and the store's message). */
static int boot_store_fail(boot_t *b, uvccl_work_t *w, int status,
                           const char *what) {
  b->nstore--;
  if (b->dead) {
    boot_maybe_free(b);
    return 1;
  }
  if (status != 0) {
    boot_fail(b, status, "%s: %s", what, w->msg);
    return 1;
  }
  return 0;
}

static void boot_store_started(boot_t *b, int rc, const char *what) {
  if (rc != 0)
    boot_fail(b, rc, "%s: %s", what, uvccl_strerror(rc));
  else
    b->nstore++;
}

#define BARRIER "store barrier failed"

static uint64_t boot_left_ms(const boot_t *b) {
  uint64_t now = uvccl__now_ms();
  return b->deadline > now ? b->deadline - now : 1;
}

static void on_all(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  if (!boot_store_fail(b, w, status, BARRIER)) boot_done(b);
}

static void on_through(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  if (boot_store_fail(b, w, status, BARRIER)) return;
  if (w->result < b->g->size - 1)
    boot_done(b);
  else
    boot_store_started(b, uvccl_store_set(b->store, &b->allw, b->allkey, "1",
                                          1, on_all),
                       BARRIER);
}

/* Past the gate, rank 0, whose process hosts the store when the world
 * made it (env://, tcp://), must not finish before every other rank is
 * past it too: the user may destroy the world at once, closing the store
 * while another rank is between its ADD's reply and its WAIT, and that
 * rank's creation then fails with the store lost (t/2070's d, under load).
 * So each other rank counts itself through the gate (an ADD, acknowledged
 * before it finishes); the last to do so sets a key rank 0 waits for.
 * (The gate's last rank waits for no WAIT of its own, only for its SET's
 * acknowledgement: the gate is open.) */
static void on_gate(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  const char *keys[1];
  if (boot_store_fail(b, w, status, BARRIER)) return;
  if (b->g->size == 1) {
    boot_done(b);
    return;
  }
  snprintf(b->passkey, sizeof(b->passkey), "%s/through", b->waitkey);
  snprintf(b->allkey, sizeof(b->allkey), "%s/all", b->waitkey);
  keys[0] = b->allkey;
  boot_store_started(
      b,
      b->g->rank != 0
          ? uvccl_store_add(b->store, &b->passw, b->passkey, 1, on_through)
          : uvccl_store_wait(b->store, &b->allw, keys, 1, boot_left_ms(b),
                             on_all),
      BARRIER);
}

static void on_barrier_add(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  int64_t gen;
  const char *keys[1];
  if (boot_store_fail(b, w, status, BARRIER)) return;
  /* Generations let a prefix be reused by a later group of the same
   * size: the last of each generation opens its gate. */
  gen = (w->result - 1) / b->g->size;
  snprintf(b->waitkey, sizeof(b->waitkey), "%s/ready/%lld", b->prefix,
           (long long)gen);
  keys[0] = b->waitkey;
  boot_store_started(
      b,
      w->result % b->g->size == 0
          ? uvccl_store_set(b->store, &b->donew, b->waitkey, "1", 1, on_gate)
          : uvccl_store_wait(b->store, &b->waitw, keys, 1, boot_left_ms(b),
                             on_gate),
      BARRIER);
}

static void boot_maybe_barrier(boot_t *b) {
  if (b->dead || !b->mesh_done || b->ngot < b->ngets) return;
  if (b->sparse) {
    /* No store barrier: the neighbours are linked, the rest connect when
     * first needed. */
    boot_done(b);
    return;
  }
  /* said before the barrier, read after it (shm_box.c) */
  if (!b->grow) uvccl__shm_boxes_offer(b->g->net);
  snprintf(b->key, sizeof(b->key), "%s/ready", b->prefix);
  boot_store_started(b, uvccl_store_add(b->store, &b->addw, b->key, 1,
                                        on_barrier_add),
                     BARRIER);
}

static void on_mesh(net_t *net, int status, const char *msg) {
  boot_t *b = net->mesh_arg;
  net->mesh_arg = NULL;
  if (b == NULL || b->dead) return;
  if (status != 0) {
    boot_fail(b, status, "%s", msg ? msg : "process group creation failed");
    return;
  }
  b->mesh_done = 1;
  boot_maybe_barrier(b);
}

/* "host port nonce monitor-port world-size" */
static int parse_addr(const char *v, struct sockaddr_storage *ss,
                      uint64_t *nonce, int *live_port, int *world, char *str,
                      size_t slen) {
  char host[128];
  int port;
  unsigned long long n;
  if (sscanf(v, "%127s %d %llx %d %d", host, &port, &n, live_port, world) !=
          5 ||
      port <= 0 || port > 65535 || *live_port < 0 || *live_port > 65535)
    return UV_EINVAL;
  *nonce = n;
  if (strchr(host, ':') != NULL) {
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) != 0)
      return UV_EINVAL;
    snprintf(str, slen, "[%.50s]:%d", host, port);
  } else {
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) != 0)
      return UV_EINVAL;
    snprintf(str, slen, "%.50s:%d", host, port);
  }
  return 0;
}

static void on_addr(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  net_t *net;
  int j = get_rank(b, (int)(w - b->getw));
  struct sockaddr_storage ss;
  uint64_t nonce;
  int rc, live_port = 0, world = 0;
  b->nstore--;
  if (b->dead) {
    boot_maybe_free(b);
    return;
  }
  if (status != 0) {
    boot_fail(b, status, "getting the address of rank %d from the store: %s",
              j, w->msg);
    return;
  }
  net = b->g->net; /* (only now: a dead boot may have lost its group) */
  memset(&ss, 0, sizeof(ss));
  if (parse_addr(w->value, &ss, &nonce, &live_port, &world, net->addrs[j],
                 sizeof(net->addrs[j]))) {
    boot_fail(b, UVCCL_EPROTO,
              "rank %d published a bad address \"%.60s\" (a process of "
              "another uvccl version, or a key reused?)",
              j, (const char *)w->value);
    return;
  }
  /* A size mismatch is connected all the same: rank j then refuses us
   * with the reason, so both sides report it (failing here would leave j
   * waiting for us until its timeout). */
  if (world != net->size)
    LOG_DEBUG("coll", "rank %d: rank %d published a world of %d, not %d",
              net->rank, j, world, net->size);
  rc = uvccl__net_connect(net, j, (struct sockaddr *)&ss, nonce, live_port,
                          b->deadline);
  if (rc != 0) {
    boot_fail(b, rc, "connecting to rank %d (%s): %s", j, net->addrs[j],
              uvccl_strerror(rc));
    return;
  }
  b->ngot++;
  boot_maybe_barrier(b);
}

static void on_published(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  int j, rc;
  b->nstore--;
  if (b->dead) {
    boot_maybe_free(b);
    return;
  }
  if (status != 0) {
    boot_fail(b, status, "publishing this rank's address in the store: %s",
              w->msg);
    return;
  }
  /* Higher ranks connect to lower ones: rank r dials ranks 0..r-1. */
  for (j = 0; j < b->ngets; j++) {
    char key[256];
    snprintf(key, sizeof(key), "%s/addr/%d", b->prefix, get_rank(b, j));
    b->getw[j].data = b;
    rc = uvccl_store_get(b->store, &b->getw[j], key, on_addr);
    if (rc != 0) {
      boot_fail(b, rc, "store get %s: %s", key, uvccl_strerror(rc));
      return;
    }
    b->nstore++;
  }
  boot_maybe_barrier(b);
}

/* ---- creation of a sparse world: O(log N) in the store ----------------------
 * Above UVCCL_MESH_MAX ranks a rank's creation asks the store for a ticket
 * (ADD: which generation of this prefix, so a later group of the same size
 * may reuse it), publishes its address (SET), and reads the addresses of
 * its neighbours in the monitors' overlay (about 2 log2 N GETs, each of
 * which waits until that rank published). Creation completes once its
 * monitor links are up. Data connections are made when a schedule first
 * needs a peer (net.c); the address of a rank not yet known is then read
 * from the store (lookup_t below), so the store must outlive the group: a
 * world that embeds the store server keeps it up at destroy until the
 * other ranks' clients are gone (server_linger in pg.c). */

/* A published address ("host port nonce monitor-port world") into the
 * book; 0, or an error with why. */
static int book_addr(net_t *net, int r, const void *value, size_t len,
                     char *why, size_t wlen) {
  char buf[200];
  struct sockaddr_storage ss;
  uint64_t nonce;
  int live_port = 0, world = 0;
  memset(&ss, 0, sizeof(ss));
  snprintf(buf, sizeof(buf), "%.*s", (int)(len < sizeof(buf) ? len : 0),
           value ? (const char *)value : "");
  if (len >= sizeof(buf) ||
      parse_addr(buf, &ss, &nonce, &live_port, &world, net->addrs[r],
                 sizeof(net->addrs[r])) != 0) {
    snprintf(why, wlen, "rank %d published a bad address \"%.60s\" (a "
             "process of another uvccl version, or a key reused?)", r, buf);
    return UVCCL_EPROTO;
  }
  if (world != net->size) {
    snprintf(why, wlen, "world size mismatch: rank %d (%s) was started with "
             "a world of %d, rank %d with %d", r, net->addrs[r], world,
             net->rank, net->size);
    return UV_EINVAL;
  }
  return uvccl__net_book(net, r, (struct sockaddr *)&ss, nonce, live_port);
}

static void on_nb_addr(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  int i = (int)(w - b->getw), rc;
  char why[256];
  if (boot_store_fail(b, w, status, "getting a neighbour's address")) return;
  rc = book_addr(b->g->net, b->nb[i], w->value, w->value_len, why,
                 sizeof(why));
  if (rc != 0) {
    boot_fail(b, rc, "%s", why);
    return;
  }
  if (++b->ngot == b->nnb) uvccl__net_link_overlay(b->g->net, b->deadline);
}

/* One GET each (a store without MULTI_GET: PyTorch 1.13's). */
static void neighbours_get(boot_t *b) {
  int i;
  for (i = 0; i < b->nnb; i++) {
    char key[256];
    snprintf(key, sizeof(key), "%s/sparse/%lld/addr/%d", b->prefix, b->gen,
             b->nb[i]);
    b->getw[i].data = b;
    boot_store_started(b, uvccl_store_get(b->store, &b->getw[i], key,
                                          on_nb_addr),
                       "getting a neighbour's address");
    if (b->dead) return;
  }
}

static void on_nb_addrs(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  char why[256];
  int i, rc;
  if (status == UVCCL_ENOTSUP && !b->dead) {
    b->nstore--;
    neighbours_get(b);
    return;
  }
  if (boot_store_fail(b, w, status, "getting the neighbours' addresses"))
    return;
  if (w->nvalues != (size_t)b->nnb) {
    boot_fail(b, UVCCL_EPROTO, "the store answered %zu addresses for %d "
              "keys", w->nvalues, b->nnb);
    return;
  }
  for (i = 0; i < b->nnb; i++) {
    rc = book_addr(b->g->net, b->nb[i], w->values[i].base, w->values[i].len,
                   why, sizeof(why));
    if (rc != 0) {
      boot_fail(b, rc, "%s", why);
      return;
    }
  }
  b->ngot = b->nnb;
  uvccl__net_link_overlay(b->g->net, b->deadline);
}

static void on_sparse_published(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  net_t *net;
  int i, n, all[128];
  char (*keys)[64];
  const char *kp[128];
  if (boot_store_fail(b, w, status, "publishing this rank's address")) return;
  net = b->g->net;
  /* The monitor dials its lower neighbours; the collectives' small-message
   * algorithms talk to these same ranks (r +- 2^k), so their addresses are
   * read now, and the store is rarely needed later. */
  n = uvccl__overlay_neighbours(net->rank, net->size, all, 128);
  for (i = 0; i < n; i++) b->nb[b->nnb++] = all[i];
  if (b->nnb == 0) {
    uvccl__net_link_overlay(net, b->deadline);
    return;
  }
  /* One request for them all, where the store has MULTI_GET. */
  keys = uvccl__malloc((size_t)b->nnb * sizeof(*keys));
  if (keys == NULL) {
    boot_fail(b, UV_ENOMEM, "out of memory");
    return;
  }
  for (i = 0; i < b->nnb; i++) {
    int k = snprintf(keys[i], sizeof(keys[i]), "%s/sparse/%lld/addr/%d",
                     b->prefix, b->gen, b->nb[i]);
    if (k < 0 || (size_t)k >= sizeof(keys[i])) {
      uvccl__free(keys); /* a long prefix: a GET each */
      neighbours_get(b);
      return;
    }
    kp[i] = keys[i];
  }
  b->addw.data = b;
  i = uvccl_store_multi_get(b->store, &b->addw, kp, (size_t)b->nnb,
                            on_nb_addrs);
  uvccl__free(keys);
  if (i == UVCCL_ENOTSUP) /* known already: the 1.13 dialect */
    neighbours_get(b);
  else
    boot_store_started(b, i, "getting the neighbours' addresses");
}

static void lookup_set_gen(lookup_t *l, long long gen);

static void on_ticket(uvccl_work_t *w, int status) {
  boot_t *b = w->data;
  char key[256];
  if (boot_store_fail(b, w, status, "taking a ticket in the store")) return;
  b->gen = (long long)((w->result - 1) / b->g->net->size);
  snprintf(key, sizeof(key), "%s/sparse/%lld/addr/%d", b->prefix, b->gen,
           b->g->net->rank);
  lookup_set_gen(b->lk, b->gen);
  boot_store_started(b, uvccl_store_set(b->store, &b->setw, key, b->value,
                                        strlen(b->value),
                                        on_sparse_published),
                     "publishing this rank's address");
}

/* ---- sparse worlds: addresses read when a peer is first needed ------------- */

typedef struct {
  uvccl_work_t w;
  int rank;
} lookup_get_t;

struct lookup_s {
  uvccl_store_t *store;
  net_t *net;              /* NULL once the net is closing */
  int size;
  char prefix[200];
  long long gen;
  lookup_get_t **gets;     /* by world rank, made on demand */
  int inflight;
};

static void lookup_maybe_free(lookup_t *l) {
  int r;
  if (l->net != NULL || l->inflight > 0) return;
  for (r = 0; r < l->size; r++)
    if (l->gets[r] != NULL) {
      uvccl_work_cleanup(&l->gets[r]->w);
      uvccl__free(l->gets[r]);
    }
  uvccl__free(l->gets);
  uvccl__free(l);
}

static void on_lookup(uvccl_work_t *w, int status) {
  lookup_t *l = w->data;
  net_t *net = l->net;
  int r = UVCCL__CONTAINER_OF(w, lookup_get_t, w)->rank;
  char why[256];
  l->inflight--;
  if (net == NULL) {
    lookup_maybe_free(l);
    return;
  }
  if (status == 0)
    status = book_addr(net, r, w->value, w->value_len, why, sizeof(why));
  else
    snprintf(why, sizeof(why), "its address could not be read from the "
             "store: %s", w->msg);
  uvccl__net_lookup_done(net, r, status, why);
}

static int lookup_start(void *arg, int r) {
  lookup_t *l = arg;
  lookup_get_t *g;
  char key[256];
  int rc;
  if (l->net == NULL || r < 0 || r >= l->size) return UV_ECANCELED;
  g = l->gets[r];
  if (g == NULL) {
    g = l->gets[r] = uvccl__calloc(1, sizeof(*g));
    if (g == NULL) return UV_ENOMEM;
    g->rank = r;
  }
  if (g->w.state == UVCCL_WORK_PENDING) return 0;
  uvccl_work_cleanup(&g->w);
  g->w.data = l;
  snprintf(key, sizeof(key), "%s/sparse/%lld/addr/%d", l->prefix, l->gen, r);
  rc = uvccl_store_get(l->store, &g->w, key, on_lookup);
  if (rc == 0) l->inflight++;
  return rc;
}

static void lookup_close(void *arg) {
  lookup_t *l = arg;
  int r;
  l->net = NULL;
  for (r = 0; r < l->size; r++)
    if (l->gets[r] != NULL) uvccl_work_cancel(&l->gets[r]->w);
  lookup_maybe_free(l);
}

static void lookup_set_gen(lookup_t *l, long long gen) { l->gen = gen; }

static lookup_t *lookup_new(uvccl_store_t *store, net_t *net,
                            const char *prefix) {
  lookup_t *l = uvccl__calloc(1, sizeof(*l));
  if (l == NULL) return NULL;
  l->gets = uvccl__calloc((size_t)net->size, sizeof(*l->gets));
  if (l->gets == NULL) {
    uvccl__free(l);
    return NULL;
  }
  l->size = net->size;
  l->store = store;
  l->net = net;
  snprintf(l->prefix, sizeof(l->prefix), "%s", prefix);
  return l;
}

/* Worlds above this many ranks are sparse (UVCCL_MESH_MAX, default 16:
 * from 32 ranks on, a sparse world is created 1.5 to 7 times faster here). */
static int mesh_max(void) {
  uint64_t x;
  uvccl__config_uint(UVCCL__CFG_MESH_MAX, &x);
  return (int)x;
}

/* The secret the mesh's connections prove: the options', else the one the
 * store client authenticates with, else the environment's (auth.h). */
static int mesh_secret(uvccl_store_t *store, const uvccl_pg_options_t *o,
                       uvccl__auth_key_t *k, char *err, size_t errlen) {
  memset(k, 0, sizeof(*k));
  if (o->auth_none) return 0;
  if (o->auth_token == NULL && o->auth_file == NULL &&
      uvccl__store_auth_key(store, k))
    return 0;
  return uvccl__auth_key_from_opts(k, o->auth_token, o->auth_file, 0, err,
                                   errlen);
}

/* A new group's ranks (NULL: 0 .. size-1), id, options and the name it
 * is traced under, and its creation b's part of it. */
static void boot_group(boot_t *b, group_t *g, uvccl_pg_t *pg,
                       uvccl_store_t *store, const uvccl_pg_options_t *o,
                       const int *ranks, uint32_t gid, uvccl_work_t *w) {
  int i;
  for (i = 0; i < o->size; i++) {
    g->ranks[i] = ranks != NULL ? ranks[i] : i;
    g->inv[g->ranks[i]] = i;
  }
  g->gid = gid;
  g->pg = pg;
  g->on_sched_gone = uvccl__pg_group_sched_gone;
  apply_options(g, o);
  g->trace_size = o->trace_buffer_size;
  snprintf(g->trace_name, sizeof(g->trace_name), "%s",
           o->prefix ? o->prefix : "uvccl/default");
  b->g = g;
  b->pg = pg;
  b->store = store;
  b->w = w;
  snprintf(b->prefix, sizeof(b->prefix), "%s",
           o->prefix ? o->prefix : "uvccl/default");
  b->setw.data = b->addw.data = b->waitw.data = b->donew.data = b;
  b->passw.data = b->allw.data = b->tickw.data = b;
}

/* The group goes on its net's list and becomes pg's, being created. */
static void boot_attach(boot_t *b, uv_loop_t *loop, uvccl_pg_t *pg) {
  group_t *g = b->g;
  uvccl__group_register(g);
  g->boot = b;
  pg->loop = loop;
  pg->rank = g->rank;
  pg->size = g->size;
  pg->impl_ = g;
  pg->backend_ = UVCCL_BACKEND_TCP;
  b->deadline = uvccl__now_ms() + g->timeout_ms;
}

/* The address this rank publishes: "host port nonce monitor-port world". */
static void boot_value(boot_t *b) {
  net_t *net = b->g->net;
  char ip[INET6_ADDRSTRLEN];
  if (net->self.ss_family == AF_INET6)
    uv_ip6_name((struct sockaddr_in6 *)&net->self, ip, sizeof(ip));
  else
    uv_ip4_name((struct sockaddr_in *)&net->self, ip, sizeof(ip));
  snprintf(b->value, sizeof(b->value), "%s %d %llx %d %d", ip,
           ntohs(((struct sockaddr_in *)&net->self)->sin_port),
           (unsigned long long)net->nonce, net->live_port, net->size);
  snprintf(b->key, sizeof(b->key), "%s/addr/%d", b->prefix, net->rank);
}

/* sh: a joiner's grown world (NULL: a world of its own). */
static int group_start(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
                       const uvccl_pg_options_t *o,
                       const uvccl__grow_shape_t *sh, uvccl_work_t *w,
                       uvccl_work_cb cb, group_t **out) {
  net_t *net;
  group_t *g;
  boot_t *b;
  struct sockaddr_storage addr;
  char err[256];
  const char *peer_host;
  int rc, i;

  if (loop == NULL || pg == NULL || store == NULL || o == NULL || w == NULL)
    return UV_EINVAL;
  if (o->size <= 0 || o->rank < 0 || o->rank >= o->size) {
    LOG_ERROR("coll", "process group creation: rank %d is outside a world "
              "of %d (ranks are 0 to %d)", o->rank, o->size, o->size - 1);
    return UV_EINVAL;
  }
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  peer_host = uvccl__store_host(store);
  if (peer_host == NULL) peer_host = "127.0.0.1"; /* in-process or file */
  rc = uvccl__pick_address(o->host, o->ifname, o->family, peer_host, &addr,
                           err, sizeof(err));
  if (rc != 0) {
    LOG_ERROR("coll", "rank %d: choosing an address: %s", o->rank, err);
    return rc;
  }
  net = sh != NULL ? uvccl__net_new(loop, sh->net_rank, sh->net_size)
                   : uvccl__net_new(loop, o->rank, o->size);
  if (net == NULL) return UV_ENOMEM;
  /* Peers of this host talk through shared memory (where they can). */
  net->local_xport = &uvccl__shm_xport;
  rc = mesh_secret(store, o, &net->auth, err, sizeof(err));
  if (rc == 0)
    rc = uvccl__tls_ctx_new(o->tls_cert, o->tls_key, o->tls_ca, o->tls_none,
                            &net->tls, err, sizeof(err));
  if (rc != 0) {
    LOG_ERROR("coll", "rank %d: %s", o->rank, err);
    net->refs = 1;
    uvccl__net_release(net, NULL, NULL);
    return rc;
  }
  net->up = &uvccl__sched_upcalls;
  apply_turn_options(net, o);
  apply_stripe_options(net, o);
  uvccl__shrink_attach(net);
  if (sh == NULL && o->size > 1 && o->size > mesh_max()) {
    lookup_t *lk = NULL;
    rc = uvccl__net_set_sparse(net);
    if (rc == 0) {
      lk = lookup_new(store, net, o->prefix ? o->prefix : "uvccl/default");
      if (lk == NULL) rc = UV_ENOMEM;
    }
    if (rc != 0) {
      net->refs = 1;
      uvccl__net_release(net, NULL, NULL);
      return rc;
    }
    uvccl__net_set_lookup(net, lookup_start, lookup_close, lk);
  }
  g = uvccl__group_new(net, o->rank, o->size);
  b = uvccl__calloc(1, sizeof(*b));
  if (g == NULL || b == NULL) {
    uvccl__free(b);
    if (g) uvccl__group_free(g);
    net->refs = 1;
    uvccl__net_release(net, NULL, NULL);
    return UV_ENOMEM;
  }
  boot_group(b, g, pg, store, o, sh != NULL ? sh->ranks : NULL,
             sh != NULL ? sh->gid : 1, w);
  b->ngets = net->sparse ? 0 : o->rank; /* sparse: no per-rank lookups */
  if (sh != NULL) {
    /* a joiner dials the ranks below it: members, earlier joiners */
    b->grow = 2;
    b->getr = uvccl__malloc((size_t)o->size * sizeof(int));
    b->ngets = 0;
    for (i = 0; b->getr != NULL && i < o->size; i++)
      if (sh->ranks[i] < net->rank) b->getr[b->ngets++] = sh->ranks[i];
  }
  b->getw = (sh == NULL || b->getr != NULL)
                ? uvccl__calloc(net->sparse ? 128
                                            : (size_t)(b->ngets ? b->ngets : 1),
                                sizeof(uvccl_work_t))
                : NULL;
  rc = b->getw ? uvccl__net_listen(
                     net, (struct sockaddr *)&addr,
                     uvccl__heartbeat_timeout(o->heartbeat_timeout_ms), err,
                     sizeof(err))
               : UV_ENOMEM;
  if (rc != 0) LOG_ERROR("coll", "rank %d: %s", o->rank, err);
  /* A joiner: the ranks that failed before it joined send no connection
   * or link (the monitor told before any dial). */
  for (i = 0; sh != NULL && rc == 0 && i < net->size; i++)
    if (g->inv[i] < 0) rc = uvccl__net_absent(net, i);
  if (rc != 0) {
    uvccl__free(b->getw);
    uvccl__free(b->getr);
    uvccl__free(b);
    uvccl__group_free(g);
    uvccl__net_release(net, NULL, NULL);
    return rc;
  }
  if (sh != NULL)
    net->want_up = net->want_shm = net->want_links = o->size - 1;
  boot_attach(b, loop, pg);
  rc = uvccl__work_start(w, loop, sh != NULL ? "pg.join" : "pg.init",
                         &boot_ops, b, g->timeout_ms, cb);
  if (rc != 0) goto fail;
  if (net->size == 1) {
    b->mesh_done = 1;
  } else {
    net->mesh_cb = on_mesh;
    net->mesh_arg = b;
  }
  boot_value(b);
  if (net->sparse) {
    b->sparse = 1;
    b->lk = net->lookup_arg;
    snprintf(b->key, sizeof(b->key), "%s/ticket", b->prefix);
    rc = uvccl_store_add(store, &b->tickw, b->key, 1, on_ticket);
  } else {
    rc = uvccl_store_set(store, &b->setw, b->key, b->value,
                         strlen(b->value), on_published);
  }
  if (rc != 0) {
    boot_fail(b, rc, "store set %s: %s", b->key, uvccl_strerror(rc));
    if (out) *out = g;
    return 0; /* the work fails through its callback */
  }
  b->nstore++;
  LOG_DEBUG("coll", "rank %d/%d listening on %s", o->rank, o->size,
            net->selfstr);
  if (out) *out = g;
  return 0;
fail:
  uvccl__group_unregister(g);
  uvccl__free(b->getw);
  uvccl__free(b->getr);
  uvccl__free(b);
  g->boot = NULL;
  pg->impl_ = NULL;
  uvccl__group_free(g);
  uvccl__net_release(net, NULL, NULL);
  return rc;
}

int uvccl__cpu_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
                  const uvccl_pg_options_t *opts, uvccl_work_t *work,
                  uvccl_work_cb cb) {
  return group_start(loop, pg, store, opts, NULL, work, cb, NULL);
}

/* ---- a world grown on the members' net (grow.c decides) ----------------------
 * A joiner is created as above, numbered as the members' net is once
 * grown. A member grows its net (the monitor first: the joiners' links
 * must find it ready), publishes its address under the grown world's
 * prefix, and waits for its joiners' connections, shared-memory
 * exchanges and links; then the same store barrier. */

/* A member's grow is ready once every joiner is connected, has done its
 * shared-memory exchange and has its monitor link up (counts would not
 * do: a rank leaving in the same agreement disconnects meanwhile). */
static int member_mesh_ready(net_t *net) {
  boot_t *b = net->mesh_arg;
  int i;
  for (i = 0; b != NULL && i < b->njoiners; i++) {
    int r = b->joiners[i];
    peer_t *p = net->peers[r];
    if (p == NULL || p->state != PEER_UP || p->shm_step != 3 ||
        !net->linked[r])
      return 0;
  }
  return b != NULL;
}

static void on_member_grown(net_t *net, int status) {
  boot_t *b = net->mesh_arg;
  int rc;
  if (b == NULL || b->dead) return;
  if (status != 0) {
    boot_fail(b, status, "growing the monitor: %s", uvccl_strerror(status));
    return;
  }
  boot_value(b);
  rc = uvccl_store_set(b->store, &b->setw, b->key, b->value, strlen(b->value),
                       on_published);
  if (rc != 0) {
    boot_fail(b, rc, "store set %s: %s", b->key, uvccl_strerror(rc));
    return;
  }
  b->nstore++;
}

int uvccl__cpu_pg_init_grown(uv_loop_t *loop, uvccl_pg_t *parent,
                             uvccl_pg_t *pg, uvccl_store_t *store,
                             const uvccl_pg_options_t *o,
                             const uvccl__grow_shape_t *sh, uvccl_work_t *w,
                             uvccl_work_cb cb) {
  group_t *pgr, *g;
  net_t *net;
  boot_t *b;
  int i, rc, nj = sh->size - sh->members;
  if (parent == NULL) return group_start(loop, pg, store, o, sh, w, cb, NULL);
  pgr = parent->impl_;
  if (pgr == NULL || w == NULL) return UV_EINVAL;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  net = pgr->net;
  if (net->mesh_cb != NULL || net->grown_cb != NULL) return UVCCL_EBUSY;
  if (uvccl__net_group(net, sh->gid) != NULL) return UV_EEXIST;
  b = uvccl__calloc(1, sizeof(*b));
  if (b != NULL) {
    b->joiners = uvccl__malloc((size_t)nj * sizeof(int));
    b->getw = uvccl__calloc(1, sizeof(uvccl_work_t));
  }
  if (b == NULL || b->joiners == NULL || b->getw == NULL) goto nomem;
  /* the net (and every group's map) first: the new group's map is sized
   * to it */
  rc = uvccl__net_grow(net, sh->net_size, on_member_grown);
  if (rc != 0) {
    uvccl__free(b->joiners);
    uvccl__free(b->getw);
    uvccl__free(b);
    return rc;
  }
  g = uvccl__group_new(net, o->rank, o->size);
  if (g == NULL) {
    net->grown_cb = NULL;
    goto nomem;
  }
  boot_group(b, g, pg, store, o, sh->ranks, sh->gid, w);
  for (i = 0; i < nj; i++)
    b->joiners[b->njoiners++] = sh->ranks[sh->members + i];
  b->grow = 1;
  boot_attach(b, loop, pg);
  rc = uvccl__work_start(w, loop, "pg.grow", &boot_ops, b, g->timeout_ms, cb);
  if (rc != 0) {
    net->grown_cb = NULL;
    uvccl__group_unregister(g);
    g->boot = NULL;
    pg->impl_ = NULL;
    uvccl__free(b->joiners);
    uvccl__free(b->getw);
    uvccl__free(b);
    uvccl__group_free(g);
    net->refs--;
    return rc;
  }
  /* what the joiners bring: a connection, its shared-memory exchange and
   * a monitor link each */
  net->mesh_ready = member_mesh_ready;
  net->mesh_group = g; /* a rank leaving meanwhile may die: not ours */
  net->mesh_cb = on_mesh;
  net->mesh_arg = b;
  LOG_DEBUG("coll", "rank %d: growing to %d ranks (net of %d), waiting for "
            "%d joiner%s", net->rank, o->size, net->size, nj,
            nj > 1 ? "s" : "");
  return 0;
nomem:
  if (b != NULL) {
    uvccl__free(b->joiners);
    uvccl__free(b->getw);
  }
  uvccl__free(b);
  return UV_ENOMEM;
}

/* ---- creation from a URL ------------------------------------------------- */

int uvccl__cpu_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
                      const uvccl_pg_options_t *opts, uvccl_work_t *work,
                      uvccl_work_cb cb) {
  uvccl_pg_options_t o;
  uvccl_store_t *store;
  uvccl_store_server_t *server;
  group_t *g = NULL;
  int rc, local_rank;

  if (loop == NULL || pg == NULL || url == NULL || work == NULL)
    return UV_EINVAL;
  rc = uvccl__url_open(loop, url, opts, "coll", &o, &local_rank, &store,
                       &server);
  if (rc != 0) return rc;
  rc = group_start(loop, pg, store, &o, NULL, work, cb, &g);
  if (rc != 0) {
    uvccl__url_close(store, server);
    return rc;
  }
  g->own_store = store;
  g->own_server = server;
  return 0;
}

/* The group is destroyed while its creation runs: the creation fails. */
void uvccl__pg_boot_cancel(group_t *g) {
  boot_t *b = g->boot;
  if (b != NULL && !b->dead)
    boot_fail(b, UV_ECANCELED, "group destroyed during creation");
}
