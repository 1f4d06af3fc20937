/* The store's key-value engine: a hash table of entries, each holding an
 * optional value, a FIFO queue and the waiters registered on the key.
 *
 * Layout. The table is open addressing with linear probing over a power of
 * two of slots; a slot keeps the full 64-bit hash next to the entry pointer
 * so a probe rarely touches an entry it does not want, and removal shifts
 * the cluster back (no tombstones, so lookups never degrade after churn).
 * Entries are separate allocations and never move, which lets registrations
 * point at them across a rehash. An entry holds its key and, when the value
 * is small, the value too, in one allocation; a value that outgrows the
 * inline room moves to a block of its own, and a set that fits the current
 * room copies in place without allocating.
 *
 * Waits. A registration (reg) is one node per missing key of a wait, linked
 * into two doubly linked lists: the key's (in order of arrival, so queue
 * pushes wake the oldest first) and the waiter's, so both a write and a
 * cancel unlink in O(1). Invariant: w->remaining equals the number of regs
 * of w. A write moves the reg of a waiter that reaches 0 onto kv->pending,
 * and only once the store is consistent are the pending waiters woken, one
 * at a time, popping each before its callback runs. That keeps the
 * callbacks free to do anything the API allows: reply, cancel another
 * pending waiter (it is then never woken), start a new wait, write (the
 * nested write drains the same pending list), free the waiter.
 *
 * Waiters are caller memory that this file may find uninitialised (the
 * hash store mallocs them), so whether a waiter is registered is never read
 * from the waiter itself: kv keeps a set of the waiter pointers it holds
 * (from wait_begin until wake, cancel or a wait_end with nothing missing). */
#include "kv.h"
#include "loop/internal.h"

#include <string.h>

/* ---- Types --------------------------------------------------------------- */

typedef struct kv_qitem_s {
  struct kv_qitem_s *next;
  size_t len;
  char data[];
} kv_qitem_t;

struct uvccl__kv_reg_s {
  uvccl__kv_waiter_t *w;
  uvccl__kv_entry_t *e; /* NULL while on kv->pending */
  uvccl__kv_reg_t *kprev, *knext; /* the key's list, or kv->pending */
  uvccl__kv_reg_t *wprev, *wnext; /* the waiter's list (w->regs) */
};

struct uvccl__kv_entry_s {
  uint64_t hash;
  char *val;   /* the inline room (data + klen) or a block of its own */
  size_t vlen;
  size_t vcap; /* room at val */
  size_t klen;
  kv_qitem_t *qhead, *qtail;
  size_t qlen;
  size_t qbytes;
  uvccl__kv_reg_t *rhead, *rtail;
  uint32_t icap; /* inline room after the key */
  unsigned char has_value;
  char data[];   /* key, then the inline value room */
};

typedef struct {
  uint64_t hash;
  uvccl__kv_entry_t *e; /* NULL: empty */
} kv_slot_t;

struct uvccl__kv_s {
  kv_slot_t *slots;
  size_t mask;
  size_t count;
  size_t max_memory;
  uint64_t memory;
  uint64_t nkeys;
  uint64_t nqueues;
  uint64_t nwaiters;
  uvccl__kv_reg_t *phead, *ptail; /* waiters due a wake */
  uvccl__kv_waiter_t **wset;      /* waiters this kv holds */
  size_t wmask;
  size_t wcount;
};

/* w->active. Only 0 and 1 are meant for callers; the rest is bookkeeping
 * between wait_begin and wait_end. */
#define KV_W_IDLE 0
#define KV_W_ACTIVE 1   /* registered, or due a wake */
#define KV_W_BUILDING 2 /* between begin and end */
#define KV_W_FAILED 3   /* out of memory while building */

#define KV_MIN_SLOTS 16
/* Values above this live in their own block so that the entry's inline room
 * (which can never shrink) stays small. */
#define KV_INLINE_MAX 256
#define KV_MIN_ROOM 8

/* ---- Hashing --------------------------------------------------------------
 * A wyhash-style multiply-fold: 16 bytes per 128-bit multiply, short keys
 * read with a few overlapping loads and no loop. */

#define KV_P0 UINT64_C(0xa0761d6478bd642f)
#define KV_P1 UINT64_C(0xe7037ed1a0b428db)
#define KV_P2 UINT64_C(0x8ebc6af09c88c6e3)

static inline uint64_t kv__mum(uint64_t a, uint64_t b) {
#ifdef __SIZEOF_INT128__
  __uint128_t r = (__uint128_t)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
#else
  uint64_t ha = a >> 32, hb = b >> 32, la = (uint32_t)a, lb = (uint32_t)b;
  uint64_t rh = ha * hb, rm0 = ha * lb, rm1 = hb * la, rl = la * lb;
  uint64_t t = rl + (rm0 << 32), c = t < rl, lo = t + (rm1 << 32);
  c += lo < t;
  return lo ^ (rh + (rm0 >> 32) + (rm1 >> 32) + c);
#endif
}

static inline uint64_t kv__r64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static inline uint64_t kv__r32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

static uint64_t kv__hash(const void *key, size_t len) {
  const uint8_t *p = key;
  uint64_t seed = KV_P2, a, b;

  if (len <= 16) {
    if (len >= 4) {
      size_t d = (len >> 3) << 2;
      a = (kv__r32(p) << 32) | kv__r32(p + d);
      b = (kv__r32(p + len - 4) << 32) | kv__r32(p + len - 4 - d);
    } else if (len > 0) {
      a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
      b = 0;
    } else {
      a = b = 0;
    }
  } else {
    size_t i = len;
    while (i > 16) {
      seed = kv__mum(kv__r64(p) ^ KV_P1, kv__r64(p + 8) ^ seed);
      p += 16;
      i -= 16;
    }
    /* The last 16 bytes, overlapping what the loop ate if need be. */
    a = kv__r64(p + i - 16);
    b = kv__r64(p + i - 8);
  }
  return kv__mum(KV_P0 ^ (uint64_t)len, kv__mum(a ^ KV_P1, b ^ seed));
}

/* ---- Table ---------------------------------------------------------------- */

static inline int kv__key_eq(const uvccl__kv_entry_t *e, const void *k,
                             size_t klen) {
  return e->klen == klen && (klen == 0 || memcmp(e->data, k, klen) == 0);
}

static uvccl__kv_entry_t *kv__find(const uvccl__kv_t *kv, uint64_t h,
                                   const void *k, size_t klen) {
  size_t i = (size_t)h & kv->mask;
  const kv_slot_t *s;
  for (;;) {
    s = &kv->slots[i];
    if (s->e == NULL) return NULL;
    if (s->hash == h && kv__key_eq(s->e, k, klen)) return s->e;
    i = (i + 1) & kv->mask;
  }
}

static void kv__place(kv_slot_t *slots, size_t mask, uint64_t h,
                      uvccl__kv_entry_t *e) {
  size_t i = (size_t)h & mask;
  while (slots[i].e != NULL) i = (i + 1) & mask;
  slots[i].hash = h;
  slots[i].e = e;
}

static int kv__grow(uvccl__kv_t *kv) {
  size_t ncap = (kv->mask + 1) * 2, i;
  kv_slot_t *ns = uvccl__calloc(ncap, sizeof(*ns));
  if (ns == NULL) return UV_ENOMEM;
  for (i = 0; i <= kv->mask; i++)
    if (kv->slots[i].e != NULL)
      kv__place(ns, ncap - 1, kv->slots[i].hash, kv->slots[i].e);
  uvccl__free(kv->slots);
  kv->slots = ns;
  kv->mask = ncap - 1;
  return 0;
}

/* A new entry with room for a value of vlen bytes (0 for an entry created
 * by a wait or a queue), in the table. NULL on allocation failure, with
 * nothing changed. */
static uvccl__kv_entry_t *kv__insert(uvccl__kv_t *kv, uint64_t h,
                                     const void *k, size_t klen, size_t vlen) {
  uvccl__kv_entry_t *e;
  size_t room = vlen <= KV_INLINE_MAX ? vlen : 0, size;

  /* Keep the load factor at or under 3/4. */
  if ((kv->count + 1) * 4 > (kv->mask + 1) * 3 && kv__grow(kv) != 0)
    return NULL;
  if (room < KV_MIN_ROOM) room = KV_MIN_ROOM;
  if (klen > SIZE_MAX - sizeof(*e) - room - 16) return NULL;
  /* Round up to 16: malloc would waste those bytes anyway. */
  size = (sizeof(*e) + klen + room + 15) & ~(size_t)15;
  room = size - sizeof(*e) - klen;
  e = uvccl__malloc(size);
  if (e == NULL) return NULL;
  e->hash = h;
  e->klen = klen;
  e->icap = (uint32_t)room;
  e->val = e->data + klen;
  e->vcap = room;
  e->vlen = 0;
  e->has_value = 0;
  e->qhead = e->qtail = NULL;
  e->qlen = 0;
  e->qbytes = 0;
  e->rhead = e->rtail = NULL;
  if (klen > 0) memcpy(e->data, k, klen);
  kv__place(kv->slots, kv->mask, h, e);
  kv->count++;
  return e;
}

static inline int kv__val_inline(const uvccl__kv_entry_t *e) {
  return e->val == e->data + e->klen;
}

/* Unlinks e from the table (backward-shift deletion) and frees it. */
static void kv__remove(uvccl__kv_t *kv, uvccl__kv_entry_t *e) {
  size_t mask = kv->mask, i = (size_t)e->hash & mask, j, home;
  kv_slot_t *s = kv->slots;

  while (s[i].e != e) i = (i + 1) & mask;
  j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (s[j].e == NULL) break;
    home = (size_t)s[j].hash & mask;
    /* s[j] may move back to i only if its home is not cyclically in
     * (i, j]: otherwise the move would put it before its home. */
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      s[i] = s[j];
      i = j;
    }
  }
  s[i].e = NULL;
  kv->count--;
  if (!kv__val_inline(e)) uvccl__free(e->val);
  uvccl__free(e);
}

/* An entry with nothing left to hold goes. */
static void kv__maybe_drop(uvccl__kv_t *kv, uvccl__kv_entry_t *e) {
  if (!e->has_value && e->qlen == 0 && e->rhead == NULL) kv__remove(kv, e);
}

/* ---- Memory accounting ---------------------------------------------------- */

/* The key counts once while the entry holds a value or queue items. */
static inline size_t kv__key_mem(const uvccl__kv_entry_t *e) {
  return e != NULL && (e->has_value || e->qlen > 0) ? e->klen : 0;
}

/* Whether growing from sub to add bytes keeps within max_memory. A write
 * that shrinks is always let through. */
static inline int kv__fits(const uvccl__kv_t *kv, uint64_t add, uint64_t sub) {
  return kv->max_memory == 0 || add <= sub ||
         kv->memory - sub + add <= (uint64_t)kv->max_memory;
}

/* ---- Values ---------------------------------------------------------------- */

static inline size_t kv__round_room(size_t n) {
  return n > SIZE_MAX - 15 ? n : (n + 15) & ~(size_t)15;
}

/* Makes v the entry's value, keeping the accounting. v may point into the
 * entry's current value. 0 or UV_ENOMEM (nothing changed). */
static int kv__store(uvccl__kv_t *kv, uvccl__kv_entry_t *e, const void *v,
                     size_t vlen) {
  char *inl = e->data + e->klen, *nb;
  uint64_t old = kv__key_mem(e) + (e->has_value ? e->vlen : 0);

  if (vlen <= e->icap) {
    /* memmove before the free: v may live in the old block. */
    if (vlen > 0) memmove(inl, v, vlen);
    if (!kv__val_inline(e)) uvccl__free(e->val);
    e->val = inl;
    e->vcap = e->icap;
  } else if (!kv__val_inline(e) && vlen <= e->vcap && vlen >= e->vcap / 4) {
    memmove(e->val, v, vlen);
  } else {
    size_t cap = kv__round_room(vlen);
    nb = uvccl__malloc(cap);
    if (nb == NULL) return UV_ENOMEM;
    memcpy(nb, v, vlen);
    if (!kv__val_inline(e)) uvccl__free(e->val);
    e->val = nb;
    e->vcap = cap;
  }
  e->vlen = vlen;
  if (!e->has_value) {
    e->has_value = 1;
    kv->nkeys++;
  }
  kv->memory = kv->memory - old + e->klen + vlen;
  return 0;
}

static void kv__drop_value(uvccl__kv_t *kv, uvccl__kv_entry_t *e) {
  uint64_t old = kv__key_mem(e) + e->vlen;
  if (!kv__val_inline(e)) uvccl__free(e->val);
  e->val = e->data + e->klen;
  e->vcap = e->icap;
  e->vlen = 0;
  e->has_value = 0;
  kv->nkeys--;
  kv->memory = kv->memory - old + kv__key_mem(e);
}

/* ---- Waiter set ------------------------------------------------------------ */

static inline size_t kv__ptr_hash(const void *p) {
  return (size_t)kv__mum((uint64_t)(uintptr_t)p ^ KV_P0, KV_P1);
}

static size_t kv__wset_find(const uvccl__kv_t *kv,
                            const uvccl__kv_waiter_t *w) {
  size_t i;
  if (kv->wset == NULL) return SIZE_MAX;
  i = kv__ptr_hash(w) & kv->wmask;
  while (kv->wset[i] != NULL) {
    if (kv->wset[i] == w) return i;
    i = (i + 1) & kv->wmask;
  }
  return SIZE_MAX;
}

static int kv__wset_add(uvccl__kv_t *kv, uvccl__kv_waiter_t *w) {
  size_t i;
  if (kv->wset == NULL || (kv->wcount + 1) * 4 > (kv->wmask + 1) * 3) {
    size_t ncap = kv->wset == NULL ? 16 : (kv->wmask + 1) * 2;
    uvccl__kv_waiter_t **nt = uvccl__calloc(ncap, sizeof(*nt));
    if (nt == NULL) return UV_ENOMEM;
    for (i = 0; kv->wset != NULL && i <= kv->wmask; i++) {
      size_t j;
      if (kv->wset[i] == NULL) continue;
      j = kv__ptr_hash(kv->wset[i]) & (ncap - 1);
      while (nt[j] != NULL) j = (j + 1) & (ncap - 1);
      nt[j] = kv->wset[i];
    }
    uvccl__free(kv->wset);
    kv->wset = nt;
    kv->wmask = ncap - 1;
  }
  i = kv__ptr_hash(w) & kv->wmask;
  while (kv->wset[i] != NULL) i = (i + 1) & kv->wmask;
  kv->wset[i] = w;
  kv->wcount++;
  return 0;
}

static void kv__wset_del_at(uvccl__kv_t *kv, size_t i) {
  size_t mask = kv->wmask, j = i, home;
  uvccl__kv_waiter_t **t = kv->wset;
  for (;;) {
    j = (j + 1) & mask;
    if (t[j] == NULL) break;
    home = kv__ptr_hash(t[j]) & mask;
    if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
      t[i] = t[j];
      i = j;
    }
  }
  t[i] = NULL;
  kv->wcount--;
}

static void kv__wset_del(uvccl__kv_t *kv, uvccl__kv_waiter_t *w) {
  size_t i = kv__wset_find(kv, w);
  if (i != SIZE_MAX) kv__wset_del_at(kv, i);
}

/* ---- Registrations --------------------------------------------------------- */

static inline void kv__klist_unlink(uvccl__kv_reg_t **head,
                                    uvccl__kv_reg_t **tail,
                                    uvccl__kv_reg_t *r) {
  if (r->kprev != NULL) r->kprev->knext = r->knext;
  else *head = r->knext;
  if (r->knext != NULL) r->knext->kprev = r->kprev;
  else *tail = r->kprev;
}

static inline void kv__klist_push(uvccl__kv_reg_t **head,
                                  uvccl__kv_reg_t **tail, uvccl__kv_reg_t *r) {
  r->knext = NULL;
  r->kprev = *tail;
  if (*tail != NULL) (*tail)->knext = r;
  else *head = r;
  *tail = r;
}

static inline void kv__wlist_unlink(uvccl__kv_waiter_t *w,
                                    uvccl__kv_reg_t *r) {
  if (r->wprev != NULL) r->wprev->wnext = r->wnext;
  else w->regs = r->wnext;
  if (r->wnext != NULL) r->wnext->wprev = r->wprev;
}

/* Drops every registration of w, wherever it sits, without waking. */
static void kv__wait_drop(uvccl__kv_t *kv, uvccl__kv_waiter_t *w) {
  uvccl__kv_reg_t *r, *next;
  for (r = w->regs; r != NULL; r = next) {
    uvccl__kv_entry_t *e = r->e;
    next = r->wnext;
    if (e != NULL) {
      kv__klist_unlink(&e->rhead, &e->rtail, r);
      kv__maybe_drop(kv, e);
    } else {
      kv__klist_unlink(&kv->phead, &kv->ptail, r);
    }
    uvccl__free(r);
  }
  w->regs = NULL;
  w->remaining = 0;
}

/* Counts one key down for the waiter of r, which the caller has taken off
 * its key's list. Returns 1 if that woke the waiter (r went to pending). */
static int kv__release(uvccl__kv_t *kv, uvccl__kv_reg_t *r) {
  uvccl__kv_waiter_t *w = r->w;
  w->remaining--;
  if (w->remaining == 0 && w->active == KV_W_ACTIVE) {
    /* By the invariant r is w's last reg: it stays on w->regs as the
     * token that lets a cancel take w off the pending list. */
    r->e = NULL;
    kv__klist_push(&kv->phead, &kv->ptail, r);
    return 1;
  }
  kv__wlist_unlink(w, r);
  uvccl__free(r);
  /* A waiter still being built (a write from inside begin..end) just
   * counts; wait_end sees 0 and reports everything present. */
  return w->remaining == 0;
}

/* Every waiter listed under e counts the key; the list is emptied. */
static void kv__release_all(uvccl__kv_t *kv, uvccl__kv_entry_t *e) {
  uvccl__kv_reg_t *r = e->rhead, *next;
  e->rhead = e->rtail = NULL;
  for (; r != NULL; r = next) {
    next = r->knext;
    kv__release(kv, r);
  }
}

/* PyTorch's wakeupOneWaitingClient: count down waiters from the front and
 * stop at the first that reaches 0. PyTorch leaves the counted ones listed
 * (so a later write counts them again); here they come off the list, which
 * keeps remaining == #regs and is what a key now present means. */
static void kv__release_one(uvccl__kv_t *kv, uvccl__kv_entry_t *e) {
  uvccl__kv_reg_t *r;
  while ((r = e->rhead) != NULL) {
    kv__klist_unlink(&e->rhead, &e->rtail, r);
    if (kv__release(kv, r)) break;
  }
}

/* Wakes the pending waiters. Each is off every list and out of the set
 * before its callback runs, so the callback may reuse or free it. A
 * callback that writes drains the same list from inside; this loop then
 * finds it empty. */
static void kv__drain(uvccl__kv_t *kv) {
  uvccl__kv_reg_t *r;
  while ((r = kv->phead) != NULL) {
    uvccl__kv_waiter_t *w = r->w;
    kv__klist_unlink(&kv->phead, &kv->ptail, r);
    uvccl__free(r);
    w->regs = NULL;
    w->remaining = 0;
    w->active = KV_W_IDLE;
    kv->nwaiters--;
    kv__wset_del(kv, w);
    if (w->wake != NULL) w->wake(w);
  }
}

/* ---- Life cycle ------------------------------------------------------------ */

uvccl__kv_t *uvccl__kv_new(size_t max_memory) {
  uvccl__kv_t *kv = uvccl__calloc(1, sizeof(*kv));
  if (kv == NULL) return NULL;
  kv->slots = uvccl__calloc(KV_MIN_SLOTS, sizeof(*kv->slots));
  if (kv->slots == NULL) {
    uvccl__free(kv);
    return NULL;
  }
  kv->mask = KV_MIN_SLOTS - 1;
  kv->max_memory = max_memory;
  return kv;
}

/* Must not be called from a wake callback of this kv. */
void uvccl__kv_free(uvccl__kv_t *kv) {
  size_t i;
  uvccl__kv_reg_t *r, *next;

  if (kv == NULL) return;
  /* Waiters outlive the kv: leave them idle, so a later cancel or begin
   * on them (which will not find them in any set) is harmless. */
  for (i = 0; kv->wset != NULL && i <= kv->wmask; i++) {
    uvccl__kv_waiter_t *w = kv->wset[i];
    if (w == NULL) continue;
    w->regs = NULL;
    w->remaining = 0;
    w->active = KV_W_IDLE;
  }
  for (r = kv->phead; r != NULL; r = next) {
    next = r->knext;
    uvccl__free(r);
  }
  for (i = 0; i <= kv->mask; i++) {
    uvccl__kv_entry_t *e = kv->slots[i].e;
    kv_qitem_t *q, *qn;
    if (e == NULL) continue;
    for (r = e->rhead; r != NULL; r = next) {
      next = r->knext;
      uvccl__free(r);
    }
    for (q = e->qhead; q != NULL; q = qn) {
      qn = q->next;
      uvccl__free(q);
    }
    if (!kv__val_inline(e)) uvccl__free(e->val);
    uvccl__free(e);
  }
  uvccl__free(kv->wset);
  uvccl__free(kv->slots);
  uvccl__free(kv);
}

void uvccl__kv_stats(const uvccl__kv_t *kv, uvccl__kv_stats_t *st) {
  st->keys = kv->nkeys;
  st->queues = kv->nqueues;
  st->memory = kv->memory;
  st->waiters = kv->nwaiters;
}

/* ---- Writes ---------------------------------------------------------------- */

int uvccl__kv_set(uvccl__kv_t *kv, const void *k, size_t klen, const void *v,
                  size_t vlen) {
  uint64_t h = kv__hash(k, klen);
  uvccl__kv_entry_t *e = kv__find(kv, h, k, klen);
  int r;

  if (!kv__fits(kv, klen + (uint64_t)vlen,
                kv__key_mem(e) + (e != NULL && e->has_value ? e->vlen : 0)))
    return UVCCL_ENOMEM_STORE;
  if (e == NULL) {
    e = kv__insert(kv, h, k, klen, vlen);
    if (e == NULL) return UV_ENOMEM;
  }
  r = kv__store(kv, e, v, vlen);
  if (r != 0) {
    kv__maybe_drop(kv, e);
    return r;
  }
  kv__release_all(kv, e);
  kv__drain(kv);
  return 0;
}

int uvccl__kv_append(uvccl__kv_t *kv, const void *k, size_t klen,
                     const void *v, size_t vlen) {
  uint64_t h = kv__hash(k, klen);
  uvccl__kv_entry_t *e = kv__find(kv, h, k, klen);
  size_t need;
  char *nb;

  if (e == NULL || !e->has_value) return uvccl__kv_set(kv, k, klen, v, vlen);
  if (vlen > SIZE_MAX - e->vlen) return UV_ENOMEM;
  need = e->vlen + vlen;
  if (!kv__fits(kv, need, e->vlen)) return UVCCL_ENOMEM_STORE;
  if (need > e->vcap) {
    /* Doubling keeps a run of appends linear. A fresh block rather than a
     * realloc, because v may point into the old one. */
    size_t cap = e->vcap * 2 > need ? e->vcap * 2 : kv__round_room(need);
    nb = uvccl__malloc(cap);
    if (nb == NULL) return UV_ENOMEM;
    memcpy(nb, e->val, e->vlen);
    memcpy(nb + e->vlen, v, vlen); /* vlen > 0 here: need > vcap >= vlen */
    if (!kv__val_inline(e)) uvccl__free(e->val);
    e->val = nb;
    e->vcap = cap;
  } else if (vlen > 0) {
    memmove(e->val + e->vlen, v, vlen);
  }
  e->vlen = need;
  kv->memory += vlen;
  kv__release_all(kv, e);
  kv__drain(kv);
  return 0;
}

/* std::stoll (base 10, C locale): isspace, an optional sign, then at least
 * one digit; whatever follows is ignored. Out of range is an error too
 * (stoll throws). */
static int kv__parse_i64(const char *s, size_t n, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  uint64_t acc = 0, limit;

  while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
  if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i >= n || s[i] < '0' || s[i] > '9') return UVCCL_ENOTNUM;
  limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (acc > (limit - d) / 10) return UVCCL_ENOTNUM;
    acc = acc * 10 + d;
  }
  if (!neg) *out = (int64_t)acc;
  else if (acc == (uint64_t)INT64_MAX + 1) *out = INT64_MIN;
  else *out = -(int64_t)acc;
  return 0;
}

/* std::to_string. Returns the length; buf needs 20 bytes. */
static size_t kv__fmt_i64(char *buf, int64_t v) {
  char tmp[20];
  size_t n = 0, i = 0;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0) buf[i++] = '-';
  while (n > 0) buf[i++] = tmp[--n];
  return i;
}

int uvccl__kv_add(uvccl__kv_t *kv, const void *k, size_t klen, int64_t delta,
                  int64_t *result) {
  uint64_t h = kv__hash(k, klen);
  uvccl__kv_entry_t *e = kv__find(kv, h, k, klen);
  int64_t cur = 0, sum;
  char buf[20];
  size_t n;
  int r;

  if (e != NULL && e->has_value) {
    r = kv__parse_i64(e->val, e->vlen, &cur);
    if (r != 0) return r;
  }
  /* PyTorch's int64 += overflows; what it does in practice is wrap. */
  sum = (int64_t)((uint64_t)cur + (uint64_t)delta);
  n = kv__fmt_i64(buf, sum);
  if (!kv__fits(kv, klen + (uint64_t)n,
                kv__key_mem(e) + (e != NULL && e->has_value ? e->vlen : 0)))
    return UVCCL_ENOMEM_STORE;
  if (e == NULL) {
    e = kv__insert(kv, h, k, klen, n);
    if (e == NULL) return UV_ENOMEM;
  }
  r = kv__store(kv, e, buf, n);
  if (r != 0) {
    kv__maybe_drop(kv, e);
    return r;
  }
  if (result != NULL) *result = sum;
  kv__release_all(kv, e);
  kv__drain(kv);
  return 0;
}

/* Waiters: PyTorch's libuv server wakes them after every compare_set, even
 * one that changed nothing, and so do we when wake is set; but only while
 * the key exists afterwards. On "missing, expected non-empty" the key stays
 * missing, and releasing a waiter there would send it to read a key that is
 * not there, so its registration stays until a real write. */
int uvccl__kv_compare_set(uvccl__kv_t *kv, const void *k, size_t klen,
                          const void *exp, size_t elen, const void *des,
                          size_t dlen, int wake, const void **out,
                          size_t *outlen) {
  uint64_t h = kv__hash(k, klen);
  uvccl__kv_entry_t *e = kv__find(kv, h, k, klen);
  int r;

  if (e == NULL || !e->has_value) {
    if (elen != 0) {
      *out = exp;
      *outlen = elen;
      if (wake && e != NULL && e->qlen > 0) {
        kv__release_all(kv, e);
        kv__drain(kv);
      }
      return 0;
    }
    if (!kv__fits(kv, klen + (uint64_t)dlen, kv__key_mem(e)))
      return UVCCL_ENOMEM_STORE;
    if (e == NULL) {
      e = kv__insert(kv, h, k, klen, dlen);
      if (e == NULL) return UV_ENOMEM;
    }
    r = kv__store(kv, e, des, dlen);
    if (r != 0) {
      kv__maybe_drop(kv, e);
      return r;
    }
  } else if (e->vlen == elen && (elen == 0 || memcmp(e->val, exp, elen) == 0)) {
    if (!kv__fits(kv, dlen, e->vlen)) return UVCCL_ENOMEM_STORE;
    r = kv__store(kv, e, des, dlen);
    if (r != 0) return r;
  }
  /* Valid until the next write, which includes one made by a wake
   * callback below. */
  *out = e->val;
  *outlen = e->vlen;
  if (wake) {
    kv__release_all(kv, e);
    kv__drain(kv);
  }
  return 0;
}

int uvccl__kv_delete(uvccl__kv_t *kv, const void *k, size_t klen) {
  uvccl__kv_entry_t *e = kv__find(kv, kv__hash(k, klen), k, klen);
  if (e == NULL || !e->has_value) return 0;
  kv__drop_value(kv, e);
  kv__maybe_drop(kv, e);
  return 1;
}

/* ---- Reads ----------------------------------------------------------------- */

int uvccl__kv_get(uvccl__kv_t *kv, const void *k, size_t klen, const void **v,
                  size_t *vlen) {
  uvccl__kv_entry_t *e = kv__find(kv, kv__hash(k, klen), k, klen);
  if (e == NULL || !e->has_value) return 0;
  *v = e->val;
  *vlen = e->vlen;
  return 1;
}

static inline int kv__entry_exists(const uvccl__kv_entry_t *e) {
  return e != NULL && (e->has_value || e->qlen > 0);
}

int uvccl__kv_exists(uvccl__kv_t *kv, const void *k, size_t klen) {
  return kv__entry_exists(kv__find(kv, kv__hash(k, klen), k, klen));
}

uint64_t uvccl__kv_num_keys(const uvccl__kv_t *kv) { return kv->nkeys; }

/* fn must not change kv (a write may move entries between slots). */
int uvccl__kv_foreach_key(uvccl__kv_t *kv,
                          int (*fn)(const void *k, size_t klen, void *arg),
                          void *arg) {
  size_t i;
  int r;
  for (i = 0; i <= kv->mask; i++) {
    uvccl__kv_entry_t *e = kv->slots[i].e;
    if (e == NULL || !e->has_value) continue;
    r = fn(e->data, e->klen, arg);
    if (r != 0) return r;
  }
  return 0;
}

/* ---- Queues ---------------------------------------------------------------- */

int uvccl__kv_queue_push(uvccl__kv_t *kv, const void *k, size_t klen,
                         const void *v, size_t vlen) {
  uint64_t h = kv__hash(k, klen);
  uvccl__kv_entry_t *e = kv__find(kv, h, k, klen);
  kv_qitem_t *q;

  if (!kv__fits(kv, (uint64_t)vlen + (kv__key_mem(e) ? 0 : klen), 0))
    return UVCCL_ENOMEM_STORE;
  if (vlen > SIZE_MAX - sizeof(*q)) return UV_ENOMEM;
  q = uvccl__malloc(sizeof(*q) + vlen);
  if (q == NULL) return UV_ENOMEM;
  if (e == NULL) {
    e = kv__insert(kv, h, k, klen, 0);
    if (e == NULL) {
      uvccl__free(q);
      return UV_ENOMEM;
    }
  }
  q->next = NULL;
  q->len = vlen;
  if (vlen > 0) memcpy(q->data, v, vlen);
  kv->memory += vlen + (kv__key_mem(e) ? 0 : klen);
  if (e->qtail != NULL) e->qtail->next = q;
  else e->qhead = q;
  e->qtail = q;
  if (e->qlen++ == 0) kv->nqueues++;
  e->qbytes += vlen;
  kv__release_one(kv, e);
  kv__drain(kv);
  return 0;
}

int64_t uvccl__kv_queue_pop(uvccl__kv_t *kv, const void *k, size_t klen,
                            void **item, size_t *ilen) {
  uvccl__kv_entry_t *e = kv__find(kv, kv__hash(k, klen), k, klen);
  kv_qitem_t *q;
  size_t before, len;

  *item = NULL;
  *ilen = 0;
  if (e == NULL || e->qlen == 0) return 0;
  before = e->qlen;
  q = e->qhead;
  e->qhead = q->next;
  if (e->qhead == NULL) e->qtail = NULL;
  e->qlen--;
  e->qbytes -= q->len;
  len = q->len;
  kv->memory -= len;
  if (e->qlen == 0) {
    kv->nqueues--;
    if (!e->has_value) kv->memory -= e->klen;
    kv__maybe_drop(kv, e);
  }
  /* Hand over the item's own block, its bytes slid to the front: the
   * caller gets a block it can free (or realloc) without another copy. */
  memmove(q, q->data, len);
  *item = q;
  *ilen = len;
  return (int64_t)before;
}

int64_t uvccl__kv_queue_len(uvccl__kv_t *kv, const void *k, size_t klen) {
  uvccl__kv_entry_t *e = kv__find(kv, kv__hash(k, klen), k, klen);
  return e == NULL ? 0 : (int64_t)e->qlen;
}

/* ---- Waits ----------------------------------------------------------------- */

void uvccl__kv_wait_begin(uvccl__kv_t *kv, uvccl__kv_waiter_t *w,
                          void (*wake)(uvccl__kv_waiter_t *w)) {
  uvccl__kv_wait_cancel(kv, w);
  w->wake = wake;
  w->remaining = 0;
  w->regs = NULL;
  /* begin cannot fail: a failure here shows in add_key and end. */
  w->active = kv__wset_add(kv, w) == 0 ? KV_W_BUILDING : KV_W_FAILED;
}

int uvccl__kv_wait_add_key(uvccl__kv_t *kv, uvccl__kv_waiter_t *w,
                           const void *k, size_t klen) {
  uint64_t h;
  uvccl__kv_entry_t *e;
  uvccl__kv_reg_t *r;

  if (w->active == KV_W_FAILED) return UV_ENOMEM;
  if (w->active != KV_W_BUILDING) return UV_EINVAL;
  h = kv__hash(k, klen);
  e = kv__find(kv, h, k, klen);
  if (kv__entry_exists(e)) return 0;
  r = uvccl__malloc(sizeof(*r));
  if (r == NULL) goto fail;
  if (e == NULL) {
    e = kv__insert(kv, h, k, klen, 0);
    if (e == NULL) {
      uvccl__free(r);
      goto fail;
    }
  }
  r->w = w;
  r->e = e;
  kv__klist_push(&e->rhead, &e->rtail, r);
  r->wprev = NULL;
  r->wnext = w->regs;
  if (w->regs != NULL) w->regs->wprev = r;
  w->regs = r;
  w->remaining++;
  return 0;

fail:
  /* Nothing stays registered, whether or not the caller goes on to end. */
  kv__wait_drop(kv, w);
  kv__wset_del(kv, w);
  w->active = KV_W_FAILED;
  return UV_ENOMEM;
}

int uvccl__kv_wait_end(uvccl__kv_t *kv, uvccl__kv_waiter_t *w) {
  if (w->active == KV_W_FAILED) {
    w->active = KV_W_IDLE;
    return UV_ENOMEM;
  }
  if (w->active != KV_W_BUILDING) return UV_EINVAL;
  if (w->remaining == 0) {
    kv__wset_del(kv, w);
    w->active = KV_W_IDLE;
    return 1;
  }
  w->active = KV_W_ACTIVE;
  kv->nwaiters++;
  return 0;
}

void uvccl__kv_wait_cancel(uvccl__kv_t *kv, uvccl__kv_waiter_t *w) {
  size_t i = kv__wset_find(kv, w);
  if (i == SIZE_MAX) return; /* not ours: its memory may be uninitialised */
  kv__wset_del_at(kv, i);
  kv__wait_drop(kv, w);
  if (w->active == KV_W_ACTIVE) kv->nwaiters--;
  w->active = KV_W_IDLE;
}
