/* Dumps everywhere at once, through the world's store: the flight
 * recorder's answer to "my job is stuck" without the failed collective's
 * connections (as PyTorch's dump-on-timeout signal in its store).
 *
 * A world made from a URL (env://, tcp://: it owns its store client)
 * polls one counter in the store, <prefix>/trace/req, every
 * UVCCL_TRACE_POLL_MS (default 1000; 0: never). Whoever wants dumps adds 1
 * to it and then sets <prefix>/trace/cmd to "KIND GEN REASON":
 *   dump     every rank writes its dump to its UVCCL_TRACE_DIR (a rank
 *            whose collective timed out asks this, when it has that dir);
 *   collect  the same, and every rank also puts its dump in the store as
 *            <prefix>/trace/dump/GEN/RANK (uvccl-trace --live, which
 *            reads them and deletes them).
 * Rank 0 sets <prefix>/trace/world to the world size, for the collector.
 * One store operation at a time, on the application's loop; the timer is
 * unreferenced, so it never keeps a loop alive. */
#include "trace_watch.h"
#include "flight.h"
#include "loop/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD_RETRIES 3 /* polls to wait for a command to follow its count */

enum {
  ST_IDLE = 0,
  ST_WORLD,       /* rank 0: set trace/world */
  ST_REQ_ADD,     /* our request: add 1 */
  ST_REQ_SET,     /* our request: set the command */
  ST_POLL,        /* add 0: the current generation */
  ST_CHECK,       /* does the command exist yet */
  ST_GET,         /* read it */
  ST_UPLOAD       /* collect: our dump into the store */
};

struct uvccl__twatch_s {
  int active;               /* 0 once stopped */
  uv_loop_t *loop;
  uvccl_store_t *store;
  char prefix[128];
  int rank, size;
  uv_timer_t timer;
  int timer_open;
  uvccl_work_t w;           /* the store operation in flight */
  int busy, step;
  int64_t seen, cur;
  int retries;
  int world_done;
  int req_pending;
  int64_t req_gen;
  char req_reason[160];
  char key[256];
  char cmd[256];
  char *json;               /* collect: being uploaded */
};

static void tw_next(uvccl__twatch_t *tw);
static void tw_done(uvccl_work_t *w, int status);

static void tw_maybe_free(uvccl__twatch_t *tw) {
  if (tw->active || tw->busy || tw->timer_open) return;
  uvccl_work_cleanup(&tw->w); /* a command read last */
  uvccl__free(tw->json);
  uvccl__free(tw);
}

static void tw_key(uvccl__twatch_t *tw, const char *what) {
  snprintf(tw->key, sizeof(tw->key), "%s/trace/%s", tw->prefix, what);
}

/* Does what a command asks: "KIND GEN REASON". */
static void tw_act(uvccl__twatch_t *tw, const char *cmd) {
  char kind[16] = "dump", reason[200];
  const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
  long long gen = tw->cur;
  int off = 0, rc;
  if (sscanf(cmd, "%15s %lld %n", kind, &gen, &off) < 2) off = 0;
  snprintf(reason, sizeof(reason), "requested through the store: %s",
           off > 0 ? cmd + off : "dump");
  if (dir != NULL && *dir != '\0') {
    rc = uvccl_trace_dump(tw->loop, NULL, reason);
    if (rc != 0)
      LOG_WARN("trace", "rank %d: dumping to %s: %s", tw->rank, dir,
               uvccl_strerror(rc));
    else
      LOG_INFO("trace", "rank %d: flight recorder dumped to %s (%s)",
               tw->rank, dir, reason);
  }
  if (strcmp(kind, "collect") == 0) {
    size_t len = 0;
    uvccl__free(tw->json);
    tw->json = NULL;
    if (uvccl__flight_json(tw->loop, reason, &tw->json, &len) != 0) return;
    snprintf(tw->key, sizeof(tw->key), "%s/trace/dump/%lld/%d", tw->prefix,
             gen, tw->rank);
    tw->step = ST_UPLOAD;
    tw->busy = 1;
    if (uvccl_store_set(tw->store, &tw->w, tw->key, tw->json, len,
                        tw_done) != 0) {
      tw->busy = 0;
      tw->step = ST_IDLE;
    }
  }
}

static void tw_done(uvccl_work_t *w, int status) {
  uvccl__twatch_t *tw = w->data;
  tw->busy = 0;
  if (!tw->active) {
    tw_maybe_free(tw);
    return;
  }
  switch (tw->step) {
  case ST_WORLD:
    tw->world_done = status == 0;
    break;
  case ST_REQ_ADD:
    if (status == 0) {
      char c[sizeof(tw->cmd)];
      tw->req_gen = w->result;
      snprintf(c, sizeof(c), "dump %lld %s", (long long)tw->req_gen,
               tw->req_reason);
      snprintf(tw->cmd, sizeof(tw->cmd), "%s", c);
      tw_key(tw, "cmd");
      tw->step = ST_REQ_SET;
      tw->busy = 1;
      if (uvccl_store_set(tw->store, &tw->w, tw->key, tw->cmd,
                          strlen(tw->cmd), tw_done) == 0)
        return;
      tw->busy = 0;
    }
    tw->req_pending = 0;
    break;
  case ST_REQ_SET:
    tw->req_pending = 0;
    /* our own dump was taken when the operation timed out */
    if (status == 0 && tw->seen < tw->req_gen && tw->seen == tw->req_gen - 1)
      tw->seen = tw->req_gen;
    break;
  case ST_POLL:
    if (status != 0) break;
    if (tw->seen == -2) { /* the first poll: where the count stands */
      tw->seen = w->result;
      break;
    }
    if (w->result <= tw->seen) break;
    tw->cur = w->result;
    {
      const char *keys[1];
      tw_key(tw, "cmd");
      keys[0] = tw->key;
      tw->step = ST_CHECK;
      tw->busy = 1;
      if (uvccl_store_check(tw->store, &tw->w, keys, 1, tw_done) == 0) return;
      tw->busy = 0;
    }
    break;
  case ST_CHECK:
    if (status != 0) break;
    if (w->result == 0) {
      if (++tw->retries >= CMD_RETRIES) {
        tw->seen = tw->cur;
        tw->retries = 0;
        tw_act(tw, "dump");
      }
      break;
    }
    tw_key(tw, "cmd");
    tw->step = ST_GET;
    tw->busy = 1;
    if (uvccl_store_get(tw->store, &tw->w, tw->key, tw_done) == 0) return;
    tw->busy = 0;
    break;
  case ST_GET:
    if (status != 0) break;
    {
      char cmd[sizeof(tw->cmd)], kind[16];
      long long gen = 0;
      size_t n = w->value_len < sizeof(cmd) - 1 ? w->value_len
                                                  : sizeof(cmd) - 1;
      memcpy(cmd, w->value, n);
      cmd[n] = '\0';
      uvccl__free(w->value);
      w->value = NULL;
      w->value_len = 0;
      if (sscanf(cmd, "%15s %lld", kind, &gen) < 2) gen = 0;
      /* the command of an older request: this one's is on its way */
      if (gen < tw->cur && ++tw->retries < CMD_RETRIES) break;
      tw->seen = tw->cur;
      tw->retries = 0;
      tw_act(tw, cmd);
      if (tw->busy) return; /* uploading */
    }
    break;
  case ST_UPLOAD:
    uvccl__free(tw->json);
    tw->json = NULL;
    if (status != 0)
      LOG_WARN("trace", "rank %d: putting the dump in the store: %s",
               tw->rank, w->msg[0] ? w->msg : uvccl_strerror(status));
    break;
  }
  tw->step = ST_IDLE;
  /* a request of ours waits for the poll in flight */
  if (tw->req_pending) tw_next(tw);
}

/* Starts the next store operation, if one is due. */
static void tw_next(uvccl__twatch_t *tw) {
  int rc;
  if (tw->busy || !tw->active) return;
  tw->w.data = tw;
  if (tw->rank == 0 && !tw->world_done) {
    char v[32];
    snprintf(v, sizeof(v), "%d", tw->size);
    tw_key(tw, "world");
    tw->step = ST_WORLD;
    tw->busy = 1;
    rc = uvccl_store_set(tw->store, &tw->w, tw->key, v, strlen(v), tw_done);
  } else if (tw->req_pending) {
    tw_key(tw, "req");
    tw->step = ST_REQ_ADD;
    tw->busy = 1;
    rc = uvccl_store_add(tw->store, &tw->w, tw->key, 1, tw_done);
  } else {
    tw_key(tw, "req");
    tw->step = ST_POLL;
    tw->busy = 1;
    rc = uvccl_store_add(tw->store, &tw->w, tw->key, 0, tw_done);
  }
  if (rc != 0) {
    tw->busy = 0;
    tw->step = ST_IDLE;
  }
}

static void tw_tick(uv_timer_t *t) { tw_next(t->data); }

static void tw_timer_closed(uv_handle_t *h) {
  uvccl__twatch_t *tw = h->data;
  tw->timer_open = 0;
  tw_maybe_free(tw);
}

static uint64_t poll_ms(void) {
  uint64_t ms;
  uvccl__config_uint(UVCCL__CFG_TRACE_POLL_MS, &ms);
  return ms;
}

uvccl__twatch_t *uvccl__trace_watch_start(uv_loop_t *loop, int rank,
                                          int size, uvccl_store_t *store,
                                          const char *prefix) {
  uvccl__twatch_t *tw;
  uint64_t ms = poll_ms();
  if (ms == 0 || store == NULL) return NULL;
  tw = uvccl__calloc(1, sizeof(*tw));
  if (tw == NULL) return NULL;
  tw->active = 1;
  tw->loop = loop;
  tw->store = store;
  tw->rank = rank;
  tw->size = size;
  snprintf(tw->prefix, sizeof(tw->prefix), "%s", prefix);
  if (uv_timer_init(loop, &tw->timer) != 0) {
    uvccl__free(tw);
    return NULL;
  }
  tw->timer.data = tw;
  tw->timer_open = 1;
  uv_unref((uv_handle_t *)&tw->timer);
  /* the first poll learns the current generation: older requests are
   * not for us (the store may outlive earlier jobs) */
  tw->seen = -2;
  uv_timer_start(&tw->timer, tw_tick, 0, ms);
  return tw;
}

void uvccl__trace_watch_stop(uvccl__twatch_t *tw) {
  if (tw == NULL) return;
  tw->active = 0;
  uv_timer_stop(&tw->timer);
  uv_close((uv_handle_t *)&tw->timer, tw_timer_closed);
  /* an operation in flight ends when the store closes (UV_ECANCELED) */
  tw_maybe_free(tw);
}

void uvccl__trace_watch_request(uvccl__twatch_t *tw, const char *reason) {
  if (tw == NULL || !tw->active || tw->req_pending) return;
  tw->req_pending = 1;
  snprintf(tw->req_reason, sizeof(tw->req_reason), "%s",
           reason ? reason : "");
  tw_next(tw);
}
