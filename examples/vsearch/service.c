/* uvccl-vsearch: batches, collectives, scans and recovery (see service.h).
 *
 * Ordering: every rank must issue the same collectives on each group in
 * the same order. Commands go out on the world group in rank 0's order
 * (seq); each rank scans its shard for the batches it received one at a
 * time, in that order (one scan queue), and posts the batch's gather on
 * the results group when its scan is done, so gathers go out in command
 * order too. Refresh allreduces have a group of their own, one at a time
 * at rank 0. */
#include "service.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD_MAGIC 0x31515356u /* "VSQ1" */
enum { CMD_SEARCH = 1, CMD_REFRESH = 2, CMD_STOP = 3 };
enum { ST_STARTING, ST_RUNNING, ST_RECOVERING, ST_STOPPING, ST_DONE,
       ST_SHRINKING };
static const char *state_names[] = {"starting", "running", "recovering",
                                    "stopping", "stopped", "recovering"};

#define MAX_WORLDS 17
#define REFRESH_WORKS 4
#define STOP_GRACE_MS 3000

typedef struct {
  uint32_t magic, type;
  uint64_t seq;
  uint32_t count, pad;
} cmd_hdr_t;

typedef struct batch_s batch_t;
struct batch_s {
  svc_t *svc;
  int busy;
  int type;
  uint64_t seq;
  int works;            /* its collectives still pending */
  int scanning;         /* queued for, or in, a scan */
  int failed;
  uvccl_work_t bw, gw;
  unsigned char *cmd;
  uint32_t *k;          /* into cmd */
  float *q;             /* into cmd */
  int count;
  size_t nk;            /* sum of k */
  vs_cand_t *mine;      /* this rank's candidates */
  vs_cand_t *all;       /* rank 0: every rank's */
  svc_search_t **reqs;  /* rank 0: who asked, NULL once gone */
  batch_t *scan_next;
  uv_work_t scan_req;
};

struct svc_s {
  uv_loop_t *loop;
  svc_options_t o;
  void *data;
  void (*on_ready)(svc_t *, int, const char *);
  void (*on_exit)(svc_t *, int, const char *);
  int state;
  int rank, size, size0, epoch;
  uvccl_pg_t worlds[MAX_WORLDS];
  int nworlds;
  /* the subgroups of each world: a destroyed group's memory stays
   * untouched until its close callback, so each epoch has its own */
  uvccl_pg_t subs[MAX_WORLDS][2];
  int have_sub;
  uvccl_work_t init_w, shrink_w;
  vs_table_t table;
  size_t cmd_size, qoff;
  batch_t *slots;
  int nslots, busy;
  uint64_t seq;
  int bcast_posted;     /* worker: a command broadcast is waiting */
  int works;            /* collectives pending, all groups */
  /* rank 0's queue */
  svc_search_t *qhead, *qtail;
  int nqueued;
  /* scans, one at a time */
  batch_t *scan_head, *scan_tail;
  int scan_busy, reload_pending, reload_rc;
  uv_work_t reload_req;
  /* refresh */
  float *rsend, *rrecv;
  size_t rcount;
  uvccl_work_t rw[REFRESH_WORKS];
  int rw_next, refresh_inflight, refresh_due;
  uv_timer_t refresh_timer, sweep_timer, stop_timer;
  int timers_open;
  int destroying;     /* groups whose destroy has not completed */
  /* stop */
  int stop_sent, exit_status;
  char exit_msg[512];
  /* stats */
  uint64_t batches, queries, refreshes_ok, refreshes_bad;
  char last_failure[UVCCL_WORK_MSG_LEN + 64];
  int failed_ranks[16], nfailed;
  int ready_told;
  /* rank 0: a receive nobody sends to, pending while the service runs, so
   * that a worker's failure is heard at once even when no search is in
   * flight (pending work on a group fails when a member fails) */
  uvccl_work_t watch_w;
  int watch_posted;
  char watch_buf[8];
};

static void pump(svc_t *svc);
static void maybe_finish(svc_t *svc);
static void enter_recovery(svc_t *svc, int status, const char *msg);

/* Nothing to go on with: the rank stops (on_exit says why, status 1). */
static void give_up(svc_t *svc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void give_up(svc_t *svc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(svc->exit_msg, sizeof(svc->exit_msg), fmt, ap);
  va_end(ap);
  svc->exit_status = 1;
  svc->state = ST_STOPPING;
  svc->stop_sent = 1;
  maybe_finish(svc);
}
static void try_recover(svc_t *svc);
static void scan_pump(svc_t *svc);

static uvccl_pg_t *world(svc_t *svc)
{
  return &svc->worlds[svc->nworlds - 1];
}

/* results (gathers) and refresh (allreduce) groups of the current world */
#define RES(svc) (&(svc)->subs[(svc)->nworlds - 1][0])
#define BG(svc) (&(svc)->subs[(svc)->nworlds - 1][1])

void *svc_data(svc_t *svc) { return svc->data; }
int svc_rank(svc_t *svc) { return svc->rank; }
int svc_stride(svc_t *svc) { return (svc->o.dim + 3) & ~3; }

/* ---- rank 0's queue ---------------------------------------------------- */

static void queue_remove(svc_t *svc, svc_search_t *s)
{
  if (!s->queued_)
    return;
  if (s->prev_) s->prev_->next_ = s->next_; else svc->qhead = s->next_;
  if (s->next_) s->next_->prev_ = s->prev_; else svc->qtail = s->prev_;
  s->next_ = s->prev_ = NULL;
  s->queued_ = 0;
  svc->nqueued--;
}

static void answer(svc_search_t *s, int status, const vs_cand_t *res,
                   const char *err)
{
  s->batch_ = NULL;
  s->cb(s, status, res, err);
}

int svc_submit(svc_t *svc, svc_search_t *s, const char **err)
{
  if (svc->state == ST_STOPPING || svc->state == ST_DONE) {
    *err = "the service is shutting down";
    return 503;
  }
  s->batch_ = NULL;
  s->queued_ = 1;
  s->next_ = NULL;
  s->prev_ = svc->qtail;
  if (svc->qtail) svc->qtail->next_ = s; else svc->qhead = s;
  svc->qtail = s;
  svc->nqueued++;
  pump(svc);
  return 0;
}

void svc_cancel(svc_t *svc, svc_search_t *s)
{
  batch_t *b = s->batch_;

  if (s->queued_)
    queue_remove(svc, s);
  else if (b != NULL && b->reqs[s->slot_] == s)
    b->reqs[s->slot_] = NULL;
  s->batch_ = NULL;
}

/* Requests past their deadline get 503 (those in a batch are let go: the
 * batch goes on without them). */
static void on_sweep(uv_timer_t *t)
{
  svc_t *svc = t->data;
  uint64_t now = uv_now(svc->loop);
  svc_search_t *s, *next;
  int i, j;

  for (s = svc->qhead; s != NULL; s = next) {
    next = s->next_;
    if (s->deadline_ms <= now) {
      queue_remove(svc, s);
      answer(s, 503, NULL, svc->state == ST_RECOVERING
             ? "timed out while the ranks recover from a failure"
             : "timed out in the queue");
    }
  }
  for (i = 0; i < svc->nslots; i++) {
    batch_t *b = &svc->slots[i];
    if (!b->busy || b->reqs == NULL)
      continue;
    for (j = 0; j < b->count; j++) {
      s = b->reqs[j];
      if (s != NULL && s->deadline_ms <= now) {
        b->reqs[j] = NULL;
        answer(s, 503, NULL, "timed out waiting for the ranks' results");
      }
    }
  }
}

/* ---- collectives ------------------------------------------------------- */

static batch_t *free_slot(svc_t *svc)
{
  int i;
  for (i = 0; i < svc->nslots; i++)
    if (!svc->slots[i].busy)
      return &svc->slots[i];
  return NULL;
}

static void batch_release(batch_t *b)
{
  svc_t *svc = b->svc;
  b->busy = 0;
  b->failed = 0;
  b->count = 0;
  svc->busy--;
}

/* Serving: taking commands (a stopping rank finishes what was sent before
 * rank 0's stop command). */
static int serving(svc_t *svc)
{
  return svc->state == ST_RUNNING ||
         (svc->state == ST_STOPPING && !svc->stop_sent);
}

static void batch_finish(batch_t *b)
{
  svc_t *svc = b->svc;
  int i;

  if (!b->busy || b->works > 0 || b->scanning)
    return;
  if (svc->rank == 0 && b->type == CMD_SEARCH) {
    const vs_cand_t *lists[256], **lp = lists;
    vs_cand_t out[1024], *op = out;
    size_t off = 0;
    int r;

    if (svc->size > 256)
      lp = malloc(sizeof(*lp) * (size_t) svc->size);
    if (svc->o.max_k > 1024)
      op = malloc(sizeof(*op) * svc->o.max_k);
    for (i = 0; i < b->count; i++) {
      svc_search_t *s = b->reqs[i];
      uint32_t k = b->k[i];
      if (s == NULL) {
        /* answered already (timed out), or its client went away */
      } else if (!b->failed && lp && op) {
        for (r = 0; r < svc->size; r++)
          lp[r] = b->all + (size_t) r * b->nk + off;
        vs_merge(lp, svc->size, k, op);
        b->reqs[i] = NULL;
        answer(s, 200, op, NULL);
      } else {
        /* a failure while stopping (recovery answers the others at once) */
        b->reqs[i] = NULL;
        answer(s, 503, NULL, svc->last_failure[0] ? svc->last_failure
                                                  : "the batch failed");
      }
      off += k;
    }
    if (lp != lists) free(lp);
    if (op != out) free(op);
  }
  batch_release(b);
  pump(svc);
  try_recover(svc);
  maybe_finish(svc);
}

static void work_failed(svc_t *svc, int status, const char *msg)
{
  if (svc->state == ST_RUNNING)
    enter_recovery(svc, status, msg);
}

static void on_gather(uvccl_work_t *w, int status)
{
  batch_t *b = w->data;
  b->svc->works--;
  b->works--;
  if (status != 0) {
    b->failed = 1;
    work_failed(b->svc, status, w->msg);
  }
  batch_finish(b);
}

static void post_gather(batch_t *b)
{
  svc_t *svc = b->svc;
  int rc;

  b->gw.data = b;
  b->gw.msg[0] = '\0'; /* a refused call may not write one */
  rc = uvccl_gather(RES(svc), &b->gw, b->mine,
                    svc->rank == 0 ? b->all : NULL, b->nk * sizeof(vs_cand_t),
                    UVCCL_UINT8, 0, on_gather);
  if (rc != 0) {
    b->failed = 1;
    work_failed(svc, rc, b->gw.msg[0] ? b->gw.msg : uvccl_strerror(rc));
    return;
  }
  b->works++;
  svc->works++;
}

/* scans: one at a time, in command order */
static void scan_work(uv_work_t *req)
{
  batch_t *b = req->data;
  vs_search(&b->svc->table, b->q, b->count, b->k, b->mine);
}

static void scan_after(uv_work_t *req, int status)
{
  batch_t *b = req->data;
  svc_t *svc = b->svc;

  svc->scan_busy = 0;
  b->scanning = 0;
  if (!b->failed && serving(svc) && svc->have_sub)
    post_gather(b);
  batch_finish(b);
  scan_pump(svc);
}

static void fill_refresh(svc_t *svc)
{
  size_t i;
  for (i = 0; i < svc->rcount; i++)
    svc->rsend[i] = (float) (svc->rank + 1);
}

static void reload_work(uv_work_t *req)
{
  svc_t *svc = req->data;
  int64_t lo, hi;

  vs_shard_range(svc->o.rows, svc->rank, svc->size, &lo, &hi);
  svc->reload_rc = vs_table_fill(&svc->table, svc->o.seed, svc->o.dim,
                                 svc->o.rows, lo, hi);
  if (svc->rsend)
    fill_refresh(svc);
}

static void reload_after(uv_work_t *req, int status)
{
  svc_t *svc = req->data;

  svc->scan_busy = 0;
  if (svc->reload_rc != 0) {
    uvccl_pg_abort(world(svc), "cannot hold its shard");
    give_up(svc, "cannot hold the shard: %s", strerror(-svc->reload_rc));
    return;
  }
  if (svc->rank == 0 && !svc->ready_told) {
    svc->ready_told = 1;
    svc->on_ready(svc, 0, NULL);
  }
  scan_pump(svc);
  try_recover(svc);
  maybe_finish(svc);
}

static void scan_pump(svc_t *svc)
{
  batch_t *b;

  if (svc->scan_busy)
    return;
  if (svc->reload_pending) {
    svc->reload_pending = 0;
    svc->scan_busy = 1;
    svc->reload_req.data = svc;
    uv_queue_work(svc->loop, &svc->reload_req, reload_work, reload_after);
    return;
  }
  if ((b = svc->scan_head) == NULL)
    return;
  svc->scan_head = b->scan_next;
  if (svc->scan_head == NULL)
    svc->scan_tail = NULL;
  b->scan_next = NULL;
  svc->scan_busy = 1;
  b->scan_req.data = b;
  uv_queue_work(svc->loop, &b->scan_req, scan_work, scan_after);
}

static void scan_enqueue(batch_t *b)
{
  svc_t *svc = b->svc;
  b->scanning = 1;
  b->scan_next = NULL;
  if (svc->scan_tail) svc->scan_tail->scan_next = b; else svc->scan_head = b;
  svc->scan_tail = b;
  scan_pump(svc);
}

/* refresh: an allreduce of refresh_bytes on its own group */
static void on_refresh(uvccl_work_t *w, int status)
{
  svc_t *svc = w->data;
  float want = (float) svc->size * (float) (svc->size + 1) / 2.0f;

  svc->works--;
  svc->refresh_inflight--;
  if (status != 0) {
    work_failed(svc, status, w->msg);
  } else if (svc->rrecv[0] == want && svc->rrecv[svc->rcount / 2] == want &&
             svc->rrecv[svc->rcount - 1] == want) {
    svc->refreshes_ok++;
  } else {
    svc->refreshes_bad++;
  }
  pump(svc);
  try_recover(svc);
  maybe_finish(svc);
}

static void post_refresh(svc_t *svc)
{
  uvccl_work_t *w = &svc->rw[svc->rw_next];
  int rc;

  if (!uvccl_work_done(w) || !svc->have_sub) {
    work_failed(svc, UVCCL_EBUSY, "refresh allreduces piled up");
    return;
  }
  svc->rw_next = (svc->rw_next + 1) % REFRESH_WORKS;
  w->data = svc;
  w->msg[0] = '\0';
  rc = uvccl_allreduce(BG(svc), w, svc->rsend, svc->rrecv, svc->rcount,
                       UVCCL_FLOAT32, UVCCL_SUM, on_refresh);
  if (rc != 0) {
    work_failed(svc, rc, w->msg[0] ? w->msg : uvccl_strerror(rc));
    return;
  }
  svc->works++;
  svc->refresh_inflight++;
}

static void on_refresh_timer(uv_timer_t *t)
{
  svc_t *svc = t->data;
  svc->refresh_due = 1;
  pump(svc);
}

/* the command broadcast */
static void on_bcast(uvccl_work_t *w, int status)
{
  batch_t *b = w->data;
  svc_t *svc = b->svc;
  cmd_hdr_t h;

  svc->works--;
  b->works--;
  if (svc->rank != 0)
    svc->bcast_posted = 0;
  if (status != 0) {
    b->failed = 1;
    work_failed(svc, status, w->msg);
    batch_finish(b);
    return;
  }
  if (svc->rank != 0) {
    memcpy(&h, b->cmd, sizeof(h));
    if (h.magic != CMD_MAGIC || h.count > (uint32_t) svc->o.batch) {
      b->failed = 1;
      work_failed(svc, UVCCL_EPROTO, "rank 0 sent a command this rank "
                  "cannot read (different --batch or --dim?)");
      batch_finish(b);
      return;
    }
    b->type = (int) h.type;
    b->seq = h.seq;
    b->count = (int) h.count;
    if (b->type == CMD_SEARCH) {
      int i;
      b->nk = 0;
      for (i = 0; i < b->count; i++) {
        if (b->k[i] > svc->o.max_k) b->k[i] = svc->o.max_k;
        b->nk += b->k[i];
      }
      if (serving(svc))
        scan_enqueue(b);
    } else if (b->type == CMD_REFRESH) {
      if (serving(svc))
        post_refresh(svc);
    } else if (b->type == CMD_STOP) {
      svc->state = ST_STOPPING;
      svc->stop_sent = 1;
    }
  }
  batch_finish(b);
  pump(svc); /* workers: the next command */
}

static int post_bcast(batch_t *b)
{
  svc_t *svc = b->svc;
  int rc;

  b->busy = 1;
  svc->busy++;
  b->works = 0;
  b->failed = 0;
  b->bw.data = b;
  b->bw.msg[0] = '\0';
  /* a worker waits for rank 0's next command as long as it takes (an idle
   * service); dead or stopped ranks are found by the heartbeats */
  b->bw.timeout_ms = svc->rank == 0 ? 0 : UVCCL_NO_TIMEOUT;
  rc = uvccl_broadcast(world(svc), &b->bw, b->cmd, svc->cmd_size,
                       UVCCL_UINT8, 0, on_bcast);
  if (rc != 0) {
    batch_release(b);
    work_failed(svc, rc, b->bw.msg[0] ? b->bw.msg : uvccl_strerror(rc));
    return rc;
  }
  b->works++;
  svc->works++;
  return 0;
}

static void set_cmd(batch_t *b, int type, int count)
{
  svc_t *svc = b->svc;
  cmd_hdr_t h;

  memset(&h, 0, sizeof(h));
  h.magic = CMD_MAGIC;
  h.type = (uint32_t) type;
  h.seq = svc->seq++;
  h.count = (uint32_t) count;
  memcpy(b->cmd, &h, sizeof(h));
  b->type = type;
  b->seq = h.seq;
  b->count = count;
}

/* Rank 0: starts what can start. Workers: keep a command broadcast
 * posted. */
#define TAG_WATCH 0x7673 /* "vs" */

static void on_watch(uvccl_work_t *w, int status)
{
  svc_t *svc = w->data;

  svc->watch_posted = 0;
  if (status != UV_ECANCELED)
    work_failed(svc, status, w->msg);
  try_recover(svc);
  maybe_finish(svc);
}

static void post_watch(svc_t *svc)
{
  int rc;

  if (svc->watch_posted || svc->size < 2)
    return;
  memset(&svc->watch_w, 0, sizeof(svc->watch_w));
  svc->watch_w.data = svc;
  svc->watch_w.timeout_ms = UVCCL_NO_TIMEOUT;
  rc = uvccl_recv(world(svc), &svc->watch_w, svc->watch_buf,
                  sizeof(svc->watch_buf), UVCCL_ANY_SOURCE, TAG_WATCH,
                  on_watch);
  if (rc != 0) {
    work_failed(svc, rc, uvccl_strerror(rc));
    return;
  }
  svc->watch_posted = 1;
}

static void pump(svc_t *svc)
{
  batch_t *b;

  if (svc->rank != 0) {
    if (serving(svc) && !svc->bcast_posted &&
        (b = free_slot(svc)) != NULL) {
      svc->bcast_posted = 1;
      if (post_bcast(b) != 0)
        svc->bcast_posted = 0;
    }
    return;
  }
  while (svc->state == ST_RUNNING && svc->busy < svc->o.pipeline &&
         (b = free_slot(svc)) != NULL) {
    if (svc->refresh_due && svc->refresh_inflight == 0 && svc->rsend) {
      svc->refresh_due = 0;
      set_cmd(b, CMD_REFRESH, 0);
      if (post_bcast(b) == 0)
        post_refresh(svc);
      continue;
    }
    if (svc->nqueued == 0)
      break;
    {
      int n = 0;
      svc_search_t *s;
      int stride = svc_stride(svc);
      b->nk = 0;
      while (n < svc->o.batch && (s = svc->qhead) != NULL) {
        queue_remove(svc, s);
        b->reqs[n] = s;
        s->batch_ = b;
        s->slot_ = n;
        b->k[n] = s->k;
        b->nk += s->k;
        memcpy(b->q + (size_t) n * stride, s->vec, sizeof(float) * stride);
        n++;
      }
      set_cmd(b, CMD_SEARCH, n);
      svc->batches++;
      svc->queries += (uint64_t) n;
      if (post_bcast(b) == 0)
        scan_enqueue(b);
      else {
        int i;
        for (i = 0; i < n; i++) {
          s = b->reqs[i];
          b->reqs[i] = NULL;
          answer(s, 503, NULL, svc->last_failure);
        }
      }
    }
  }
  if (svc->state == ST_STOPPING && !svc->stop_sent && svc->busy == 0 &&
      svc->have_sub && (b = free_slot(svc)) != NULL) {
    svc->stop_sent = 1;
    set_cmd(b, CMD_STOP, 0);
    post_bcast(b);
  }
}

/* ---- failures and recovery -------------------------------------------- */

static void note_failed_rank(svc_t *svc, int global_rank)
{
  int i;
  if (global_rank < 0)
    return;
  for (i = 0; i < svc->nfailed; i++)
    if (svc->failed_ranks[i] == global_rank)
      return;
  if (svc->nfailed < 16)
    svc->failed_ranks[svc->nfailed++] = global_rank;
}

static void enter_recovery(svc_t *svc, int status, const char *msg)
{
  uvccl_pg_failure_t f;
  int i, j;

  memset(&f, 0, sizeof(f));
  f.global_rank = -1;
  if (uvccl_pg_get_failure(world(svc), &f) == 1 && f.msg[0])
    msg = f.msg;
  else if (svc->have_sub && uvccl_pg_get_failure(RES(svc), &f) == 1 &&
           f.msg[0])
    msg = f.msg;
  snprintf(svc->last_failure, sizeof(svc->last_failure), "%s (%s)",
           msg && msg[0] ? msg : uvccl_strerror(status),
           uvccl_err_name(status));
  if (f.cause != UVCCL_FAIL_REVOKED)
    note_failed_rank(svc, f.global_rank);
  fprintf(stderr, "uvccl-vsearch: rank %d: %s\n", svc->rank,
          svc->last_failure);
  if (svc->rank != 0 && f.global_rank == 0) {
    /* rank 0 serves HTTP and orders the work: nothing to go on with */
    uvccl_pg_revoke(world(svc), "rank 0 failed");
    give_up(svc, "rank 0 (the HTTP server) failed: %s", svc->last_failure);
    return;
  }
  svc->state = ST_RECOVERING;
  /* the others learn it at once, and nothing pending waits for a timeout;
   * the reason carries the culprit, so a rank that hears of the failure
   * through this revoke first still names it (rank 0 replies with it) */
  uvccl_pg_revoke(world(svc), svc->last_failure);
  if (svc->have_sub) {
    uvccl_pg_revoke(RES(svc), svc->last_failure);
    uvccl_pg_revoke(BG(svc), svc->last_failure);
  }
  /* rank 0: the searches in flight fail now, with the reason; queued ones
   * wait for the survivors */
  for (i = 0; i < svc->nslots; i++) {
    batch_t *b = &svc->slots[i];
    if (!b->busy)
      continue;
    b->failed = 1;
    for (j = 0; b->reqs && j < b->count; j++) {
      svc_search_t *s = b->reqs[j];
      if (s != NULL) {
        b->reqs[j] = NULL;
        answer(s, 503, NULL, svc->last_failure);
      }
    }
  }
  /* scans not started are dropped */
  while (svc->scan_head != NULL) {
    batch_t *b = svc->scan_head;
    svc->scan_head = b->scan_next;
    b->scan_next = NULL;
    b->scanning = 0;
  }
  svc->scan_tail = NULL;
  for (i = 0; i < svc->nslots; i++)
    if (svc->slots[i].busy)
      batch_finish(&svc->slots[i]);
  try_recover(svc);
}

static void maybe_exit(svc_t *svc);

/* Groups are destroyed through here: the rank exits only once every one
 * is gone (their connections closed cleanly, the monitor's thread done). */
static void on_pg_gone(uvccl_pg_t *pg)
{
  svc_t *svc = pg->data;
  svc->destroying--;
  maybe_exit(svc);
}

static void pg_destroy(svc_t *svc, uvccl_pg_t *pg)
{
  pg->data = svc;
  svc->destroying++;
  uvccl_pg_destroy(pg, on_pg_gone);
}

static int make_subgroups(svc_t *svc)
{
  int *ranks = malloc(sizeof(int) * (size_t) svc->size), i, rc;

  if (ranks == NULL)
    return UV_ENOMEM;
  for (i = 0; i < svc->size; i++)
    ranks[i] = i;
  rc = uvccl_pg_new_group(world(svc), RES(svc), ranks, svc->size, NULL);
  if (rc == 0) {
    rc = uvccl_pg_new_group(world(svc), BG(svc), ranks, svc->size, NULL);
    if (rc != 0)
      pg_destroy(svc, RES(svc));
  }
  free(ranks);
  if (rc == 0)
    svc->have_sub = 1;
  return rc;
}

static void on_shrunk(uvccl_work_t *w, int status)
{
  svc_t *svc = w->data;
  uvccl_pg_t *next = &svc->worlds[svc->nworlds];
  int rc;

  if (status != 0) {
    pg_destroy(svc, next);
    give_up(svc, "shrink failed: %s (%s)%s%s", uvccl_strerror(status),
            uvccl_err_name(status), w->msg[0] ? ": " : "", w->msg);
    return;
  }
  /* who is gone: the old world's members the new one lacks */
  {
    uvccl_pg_t *old = world(svc);
    int i, j;
    for (i = 0; i < old->size; i++) {
      int g = uvccl_pg_global_rank(old, i), kept = 0;
      for (j = 0; j < next->size && !kept; j++)
        kept = uvccl_pg_global_rank(next, j) == g;
      if (!kept)
        note_failed_rank(svc, g);
    }
  }
  svc->nworlds++;
  /* the world before (not the first: it owns the store) is done with */
  if (svc->nworlds > 2)
    pg_destroy(svc, &svc->worlds[svc->nworlds - 2]);
  svc->epoch++;
  fprintf(stderr, "uvccl-vsearch: rank %d: goes on as rank %d of %d (epoch "
          "%d)\n", svc->rank, next->rank, next->size, svc->epoch);
  svc->rank = next->rank;
  svc->size = next->size;
  uvccl_log_set_rank(svc->rank);
  rc = make_subgroups(svc);
  if (rc != 0) {
    enter_recovery(svc, rc, "cannot make the subgroups");
    return;
  }
  svc->state = ST_RUNNING;
  if (svc->rank == 0)
    post_watch(svc);
  /* the lost rows are remade between the survivors */
  svc->reload_pending = 1;
  scan_pump(svc);
  pump(svc);
}

static void try_recover(svc_t *svc)
{
  int rc;

  if (svc->state != ST_RECOVERING || svc->works > 0 || svc->scan_busy ||
      svc->busy > 0 || svc->watch_posted || svc->nworlds >= MAX_WORLDS)
    return;
  if (svc->have_sub) {
    pg_destroy(svc, RES(svc));
    pg_destroy(svc, BG(svc));
    svc->have_sub = 0;
  }
  svc->state = ST_SHRINKING;
  memset(&svc->shrink_w, 0, sizeof(svc->shrink_w));
  svc->shrink_w.data = svc;
  rc = uvccl_pg_shrink(world(svc), &svc->worlds[svc->nworlds],
                       &svc->shrink_w, on_shrunk);
  if (rc != 0)
    give_up(svc, "shrink: %s", uvccl_strerror(rc));
}

/* ---- start and stop ---------------------------------------------------- */

static void maybe_exit(svc_t *svc)
{
  void (*cb)(svc_t *, int, const char *) = svc->on_exit;
  if (svc->timers_open > 0 || svc->destroying > 0 || cb == NULL ||
      svc->state != ST_DONE)
    return;
  svc->on_exit = NULL;
  cb(svc, svc->exit_status, svc->exit_msg[0] ? svc->exit_msg : NULL);
}

static void on_timer_closed(uv_handle_t *h)
{
  svc_t *svc = h->data;
  svc->timers_open--;
  maybe_exit(svc);
}

static void maybe_finish(svc_t *svc)
{
  int i;

  if (svc->state != ST_STOPPING || svc->works > 0 || svc->scan_busy ||
      !svc->stop_sent)
    return;
  if (svc->watch_posted) {
    uvccl_work_cancel(&svc->watch_w); /* on_watch comes back here */
    return;
  }
  for (i = 0; i < svc->nslots; i++)
    if (svc->slots[i].busy)
      return;
  svc->state = ST_DONE;
  if (svc->have_sub) {
    pg_destroy(svc, RES(svc));
    pg_destroy(svc, BG(svc));
    svc->have_sub = 0;
  }
  if (svc->nworlds > 1)
    pg_destroy(svc, world(svc));
  if (svc->nworlds > 0)
    pg_destroy(svc, &svc->worlds[0]);
  uv_close((uv_handle_t *) &svc->refresh_timer, on_timer_closed);
  uv_close((uv_handle_t *) &svc->sweep_timer, on_timer_closed);
  uv_close((uv_handle_t *) &svc->stop_timer, on_timer_closed);
}

static void on_stop_timer(uv_timer_t *t)
{
  svc_t *svc = t->data;
  /* rank 0 never told us to stop: leave anyway */
  if (svc->state == ST_DONE)
    return;
  svc->state = ST_STOPPING;
  svc->stop_sent = 1;
  uvccl_pg_abort(world(svc), "stopped");
  maybe_finish(svc);
}

void svc_stop(svc_t *svc, const char *why)
{
  svc_search_t *s;

  if (svc->state == ST_DONE)
    return;
  if (svc->state == ST_STOPPING || svc->nworlds == 0) {
    /* a second stop, or nothing made yet: at once */
    svc->stop_sent = 1;
    svc->state = ST_STOPPING;
    if (svc->nworlds > 0)
      uvccl_pg_abort(world(svc), why);
    maybe_finish(svc);
    return;
  }
  while ((s = svc->qhead) != NULL) {
    queue_remove(svc, s);
    answer(s, 503, NULL, "the service is shutting down");
  }
  if (svc->state != ST_RUNNING) {
    svc->stop_sent = 1;
    svc->state = ST_STOPPING;
    uvccl_pg_abort(world(svc), why);
    maybe_finish(svc);
    return;
  }
  svc->state = ST_STOPPING;
  uv_timer_stop(&svc->refresh_timer);
  if (svc->rank != 0) {
    /* workers wait for rank 0's stop command, a moment */
    uv_timer_start(&svc->stop_timer, on_stop_timer, STOP_GRACE_MS, 0);
    maybe_finish(svc);
    return;
  }
  pump(svc);
  maybe_finish(svc);
}

static void on_world(uvccl_work_t *w, int status)
{
  svc_t *svc = w->data;
  int rc, i;

  if (status != 0) {
    svc->ready_told = 1;
    svc->on_ready(svc, status, NULL);
    give_up(svc, "creating the world: %s (%s)%s%s", uvccl_strerror(status),
            uvccl_err_name(status), w->msg[0] ? ": " : "", w->msg);
    return;
  }
  svc->nworlds = 1;
  svc->rank = world(svc)->rank;
  svc->size = svc->size0 = world(svc)->size;
  uvccl_log_set_rank(svc->rank);
  rc = make_subgroups(svc);
  if (rc != 0) {
    give_up(svc, "subgroups: %s", uvccl_strerror(rc));
    return;
  }
  if (svc->rank == 0) {
    /* room for every rank's candidates (the world only shrinks) */
    size_t kcap = (size_t) svc->o.batch * svc->o.max_k;
    for (i = 0; i < svc->nslots; i++) {
      batch_t *b = &svc->slots[i];
      b->all = calloc(kcap * (size_t) svc->size, sizeof(vs_cand_t));
      b->reqs = calloc((size_t) svc->o.batch, sizeof(*b->reqs));
      if (b->all == NULL || b->reqs == NULL) {
        fprintf(stderr, "uvccl-vsearch: out of memory\n");
        exit(1);
      }
    }
  }
  svc->state = ST_RUNNING;
  svc->reload_pending = 1;
  scan_pump(svc);
  if (svc->rank == 0 && svc->rsend)
    uv_timer_start(&svc->refresh_timer, on_refresh_timer, svc->o.refresh_ms,
                   svc->o.refresh_ms);
  if (svc->rank == 0) {
    uv_timer_start(&svc->sweep_timer, on_sweep, 20, 20);
    post_watch(svc);
  }
  pump(svc);
}

svc_t *svc_start(uv_loop_t *loop, const svc_options_t *o,
                 void (*on_ready)(svc_t *, int status, const char *msg),
                 void (*on_exit)(svc_t *, int status, const char *msg),
                 void *data)
{
  svc_t *svc = calloc(1, sizeof(*svc));
  uvccl_pg_options_t po;
  int i, stride = (o->dim + 3) & ~3, rc;
  size_t kcap = (size_t) o->batch * o->max_k;

  if (svc == NULL)
    return NULL;
  svc->loop = loop;
  svc->o = *o;
  svc->data = data;
  svc->on_ready = on_ready;
  svc->on_exit = on_exit;
  svc->state = ST_STARTING;
  svc->qoff = (sizeof(cmd_hdr_t) + sizeof(uint32_t) * (size_t) o->batch + 15) &
              ~(size_t) 15;
  svc->cmd_size = svc->qoff + sizeof(float) * (size_t) o->batch * stride;
  svc->nslots = o->pipeline + 1;
  svc->slots = calloc((size_t) svc->nslots, sizeof(batch_t));
  if (svc->slots == NULL)
    goto oom;
  for (i = 0; i < svc->nslots; i++) {
    batch_t *b = &svc->slots[i];
    b->svc = svc;
    if (posix_memalign((void **) &b->cmd, 64, svc->cmd_size) != 0)
      goto oom;
    memset(b->cmd, 0, svc->cmd_size);
    b->k = (uint32_t *) (b->cmd + sizeof(cmd_hdr_t));
    b->q = (float *) (b->cmd + svc->qoff);
    if ((b->mine = calloc(kcap, sizeof(vs_cand_t))) == NULL)
      goto oom;
  }
  if (o->refresh_bytes > 0) {
    svc->rcount = o->refresh_bytes / sizeof(float);
    if (svc->rcount == 0) svc->rcount = 1;
    svc->rsend = malloc(svc->rcount * sizeof(float));
    svc->rrecv = malloc(svc->rcount * sizeof(float));
    if (svc->rsend == NULL || svc->rrecv == NULL)
      goto oom;
  }
  uv_timer_init(loop, &svc->refresh_timer);
  uv_timer_init(loop, &svc->sweep_timer);
  uv_timer_init(loop, &svc->stop_timer);
  svc->refresh_timer.data = svc->sweep_timer.data = svc->stop_timer.data = svc;
  svc->timers_open = 3;

  memset(&po, 0, sizeof(po));
  po.timeout_ms = o->op_timeout_ms;
  po.heartbeat_timeout_ms = o->heartbeat_ms;
  svc->init_w.data = svc;
  rc = uvccl_pg_init_url(loop, &svc->worlds[0], "env://", &po, &svc->init_w,
                         on_world);
  if (rc != 0) {
    /* on_ready and on_exit still run, from the loop */
    snprintf(svc->exit_msg, sizeof(svc->exit_msg),
             "uvccl_pg_init_url(\"env://\"): %s (%s)", uvccl_strerror(rc),
             uvccl_err_name(rc));
    svc->exit_status = 1;
    svc->ready_told = 1;
    svc->state = ST_DONE;
    uv_close((uv_handle_t *) &svc->refresh_timer, on_timer_closed);
    uv_close((uv_handle_t *) &svc->sweep_timer, on_timer_closed);
    uv_close((uv_handle_t *) &svc->stop_timer, on_timer_closed);
  }
  return svc;

oom:
  fprintf(stderr, "uvccl-vsearch: out of memory\n");
  exit(1);
}

void svc_stats(svc_t *svc, svc_stats_t *st)
{
  int i;

  memset(st, 0, sizeof(*st));
  st->state = state_names[svc->state];
  st->ranks_alive = svc->size;
  st->world_size = svc->size0;
  st->epoch = svc->epoch;
  st->batches = svc->batches;
  st->queries = svc->queries;
  st->collectives_in_flight = svc->works;
  st->queued = svc->nqueued;
  st->refreshes_ok = svc->refreshes_ok;
  st->refreshes_bad = svc->refreshes_bad;
  st->refresh_in_flight = svc->refresh_inflight;
  st->last_failure = svc->last_failure;
  st->shard_lo = svc->table.lo;
  st->shard_hi = svc->table.hi;
  for (i = 0; i < svc->nfailed; i++)
    st->failed_ranks[i] = svc->failed_ranks[i];
  st->nfailed = svc->nfailed;
}
