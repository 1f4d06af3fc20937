/* The flight recorder's ring and group records (see flight.h). */
#include "flight.h"
#include "loop/internal.h"

#include <stdio.h>
#include <string.h>

#define DEFAULT_RING 2000
#define MAX_RING (1u << 20)
#define KEEP_DESTROYED 64 /* destroyed groups kept for dumps */

static uv_once_t once = UV_ONCE_INIT;
static uv_mutex_t mu;
static int env_size = -1;        /* UVCCL_TRACE_BUFFER_SIZE, -1: unset */
static uvccl__fentry_t *ring;    /* under mu */
static size_t cap;
static uint64_t next_id = 1;     /* ids start at 1; slot = (id - 1) % cap */
static uint64_t next_guid = 1;
static uvccl__fgroup_t *groups;  /* newest first */
static int ndestroyed;

static void init_once(void) {
  uint64_t n;
  uv_mutex_init(&mu);
  if (uvccl__config_uint(UVCCL__CFG_TRACE_BUFFER_SIZE, &n) == 1)
    env_size = (int)n;
}

/* The ring size a group asks for (0: off). */
static size_t wanted_size(uint32_t opt) {
  if (opt == UVCCL_TRACE_OFF) return 0;
  if (opt != 0) return opt > MAX_RING ? MAX_RING : opt;
  return env_size >= 0 ? (size_t)env_size : DEFAULT_RING;
}

/* Grows the ring to n entries, keeping what it holds (under mu). Entries
 * keep their ids; a slot is found again as (id - 1) % cap, so they are
 * moved to the slots of the new size. */
static int ring_grow(size_t n) {
  uvccl__fentry_t *r;
  size_t i;
  if (n <= cap) return 0;
  r = uvccl__calloc(n, sizeof(*r));
  if (r == NULL) return UV_ENOMEM;
  for (i = 0; i < cap; i++)
    if (ring[i].id != 0) r[(ring[i].id - 1) % n] = ring[i];
  uvccl__free(ring);
  ring = r;
  cap = n;
  return 0;
}

uvccl__fgroup_t *uvccl__flight_group_add(const char *backend,
                                         const char *name, uint32_t gid,
                                         int rank, int size, const int *ranks,
                                         uint32_t ring_size, uv_loop_t *loop,
                                         uvccl__fwaiting_fn waiting,
                                         void *ctx) {
  uvccl__fgroup_t *fg;
  size_t want;
  uv_once(&once, init_once);
  want = wanted_size(ring_size);
  if (want == 0) return NULL;
  fg = uvccl__calloc(1, sizeof(*fg));
  if (fg == NULL) return NULL;
  fg->ranks = uvccl__malloc((size_t)(size > 0 ? size : 1) * sizeof(int));
  if (fg->ranks == NULL) {
    uvccl__free(fg);
    return NULL;
  }
  memcpy(fg->ranks, ranks, (size_t)size * sizeof(int));
  snprintf(fg->backend, sizeof(fg->backend), "%s", backend);
  snprintf(fg->name, sizeof(fg->name), "%s", name ? name : "");
  fg->gid = gid;
  fg->rank = rank;
  fg->size = size;
  fg->loop = loop;
  fg->waiting = waiting;
  fg->ctx = ctx;
  uv_mutex_lock(&mu);
  if (ring_grow(want) != 0 && cap == 0) {
    uv_mutex_unlock(&mu);
    uvccl__free(fg->ranks);
    uvccl__free(fg);
    return NULL;
  }
  fg->guid = next_guid++;
  fg->next = groups;
  groups = fg;
  uv_mutex_unlock(&mu);
  return fg;
}

void uvccl__flight_group_broken(uvccl__fgroup_t *fg, int err,
                                const char *msg) {
  if (fg == NULL) return;
  uv_mutex_lock(&mu);
  if (!fg->broken) {
    fg->broken = 1;
    fg->broken_err = err;
    snprintf(fg->broken_msg, sizeof(fg->broken_msg), "%s", msg ? msg : "");
  }
  uv_mutex_unlock(&mu);
}

void uvccl__flight_group_remove(uvccl__fgroup_t *fg) {
  uvccl__fgroup_t **pp, *old = NULL;
  if (fg == NULL) return;
  uv_mutex_lock(&mu);
  fg->destroyed = 1;
  fg->waiting = NULL;
  fg->ctx = NULL;
  fg->loop = NULL;
  if (++ndestroyed > KEEP_DESTROYED) {
    /* the oldest destroyed record goes (the list is newest first) */
    uvccl__fgroup_t **last = NULL;
    for (pp = &groups; *pp != NULL; pp = &(*pp)->next)
      if ((*pp)->destroyed) last = pp;
    if (last != NULL) {
      old = *last;
      *last = old->next;
      ndestroyed--;
    }
  }
  uv_mutex_unlock(&mu);
  if (old != NULL) {
    uvccl__free(old->ranks);
    uvccl__free(old);
  }
}

uint64_t uvccl__flight_begin(uvccl__fgroup_t *fg, uint32_t seq,
                             const uvccl__fdesc_t *d, int started) {
  uvccl__fentry_t *e;
  uint64_t id, now;
  int k;
  if (fg == NULL) return 0;
  now = uvccl__now_ns();
  k = d->p2p ? 1 : 0;
  uv_mutex_lock(&mu);
  id = next_id++;
  e = &ring[(id - 1) % cap];
  e->id = id;
  e->guid = fg->guid;
  e->seq = seq;
  e->p2p = (uint8_t)k;
  e->state = started ? UVCCL__FL_STARTED : UVCCL__FL_QUEUED;
  e->op = d->op;
  e->dtype = d->dtype;
  e->redop = d->redop;
  e->root = d->root;
  e->peer = d->peer;
  e->count_in = d->count_in;
  e->count_out = d->count_out;
  e->t_queued = now;
  e->t_started = started ? now : 0;
  e->t_done = 0;
  e->err = 0;
  e->msg[0] = '\0';
  if (d->tag != NULL) snprintf(e->tag, sizeof(e->tag), "%s", d->tag);
  else e->tag[0] = '\0';
  fg->enq[k] = (uint64_t)seq + 1;
  if (started) fg->started[k] = (uint64_t)seq + 1;
  uv_mutex_unlock(&mu);
  return id;
}

/* The entry of id, if the ring still holds it (under mu). */
static uvccl__fentry_t *entry_of(uint64_t id) {
  uvccl__fentry_t *e;
  if (id == 0 || cap == 0) return NULL;
  e = &ring[(id - 1) % cap];
  return e->id == id ? e : NULL;
}

void uvccl__flight_started(uvccl__fgroup_t *fg, uint64_t id) {
  uvccl__fentry_t *e;
  uint64_t now;
  if (fg == NULL || id == 0) return;
  now = uvccl__now_ns();
  uv_mutex_lock(&mu);
  e = entry_of(id);
  if (e != NULL && e->state == UVCCL__FL_QUEUED) {
    e->state = UVCCL__FL_STARTED;
    e->t_started = now;
    fg->started[e->p2p] = (uint64_t)e->seq + 1;
  }
  uv_mutex_unlock(&mu);
}

void uvccl__flight_end(uvccl__fgroup_t *fg, uint64_t id, int status,
                       const char *msg) {
  uvccl__fentry_t *e;
  uint64_t now;
  if (fg == NULL || id == 0) return;
  now = uvccl__now_ns();
  uv_mutex_lock(&mu);
  e = entry_of(id);
  if (e != NULL && e->state <= UVCCL__FL_STARTED) {
    e->state = status == 0               ? UVCCL__FL_COMPLETED
               : status == UV_ETIMEDOUT ? UVCCL__FL_TIMED_OUT
               : status == UV_ECANCELED ? UVCCL__FL_CANCELLED
                                        : UVCCL__FL_FAILED;
    if (e->t_started == 0) e->t_started = now;
    e->t_done = now;
    e->err = status;
    if (status != 0 && msg != NULL)
      snprintf(e->msg, sizeof(e->msg), "%s", msg);
    if (status == 0) fg->done[e->p2p] = (uint64_t)e->seq + 1;
  }
  uv_mutex_unlock(&mu);
}

int uvccl__flight_snapshot(uvccl__fsnap_t *s) {
  uvccl__fgroup_t *fg;
  size_t i, n = 0;
  int k = 0;
  uint64_t first;
  memset(s, 0, sizeof(*s));
  uv_once(&once, init_once);
  uv_mutex_lock(&mu);
  for (fg = groups; fg != NULL; fg = fg->next) k++;
  s->groups = uvccl__calloc((size_t)(k ? k : 1), sizeof(*s->groups));
  s->entries = uvccl__malloc((cap ? cap : 1) * sizeof(*s->entries));
  if (s->groups == NULL || s->entries == NULL) goto nomem;
  k = 0;
  for (fg = groups; fg != NULL; fg = fg->next) {
    uvccl__fgroup_t *c = &s->groups[k];
    *c = *fg;
    c->next = NULL;
    c->ranks = uvccl__malloc((size_t)(fg->size > 0 ? fg->size : 1) *
                             sizeof(int));
    if (c->ranks == NULL) goto nomem;
    memcpy(c->ranks, fg->ranks, (size_t)fg->size * sizeof(int));
    k++;
    s->ngroups = k;
  }
  /* oldest first: ids next_id - cap .. next_id - 1 */
  first = next_id > cap ? next_id - cap : 1;
  for (i = 0; i < cap && first + i < next_id; i++) {
    uvccl__fentry_t *e = entry_of(first + i);
    if (e != NULL) s->entries[n++] = *e;
  }
  s->nentries = n;
  s->capacity = cap;
  s->recorded = next_id - 1;
  uv_mutex_unlock(&mu);
  return 0;
nomem:
  uv_mutex_unlock(&mu);
  uvccl__flight_snapshot_free(s);
  return UV_ENOMEM;
}

void uvccl__flight_snapshot_free(uvccl__fsnap_t *s) {
  int i;
  for (i = 0; i < s->ngroups; i++) uvccl__free(s->groups[i].ranks);
  uvccl__free(s->groups);
  uvccl__free(s->entries);
  memset(s, 0, sizeof(*s));
}
