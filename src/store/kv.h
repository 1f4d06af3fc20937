/* The key-value state of a store, with PyTorch's wait bookkeeping and
 * queues: pure logic, no I/O. The TCP server and the in-process hash store
 * both run on it.
 *
 * Wait bookkeeping (as PyTorch's servers): a waiter registers on each of its
 * keys that is missing and counts them; every write that creates or changes
 * a key (set, add, append, and compare_set where the caller wants it)
 * decrements the count of each waiter listed under that key and drops the
 * list; a waiter whose count reaches 0 is woken. A queue push wakes only one
 * waiter whose count reaches 0. A key listed twice is released by one
 * write, because both registrations sit under the same key. */
#ifndef UVCCL_STORE_KV_H
#define UVCCL_STORE_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct uvccl__kv_s uvccl__kv_t;
typedef struct uvccl__kv_entry_s uvccl__kv_entry_t;
typedef struct uvccl__kv_reg_s uvccl__kv_reg_t;
typedef struct uvccl__kv_waiter_s uvccl__kv_waiter_t;

/* Caller-owned, embedded in a connection or a pending work. */
struct uvccl__kv_waiter_s {
  void (*wake)(uvccl__kv_waiter_t *w); /* all keys present; may free w */
  size_t remaining;        /* keys still missing */
  uvccl__kv_reg_t *regs;   /* this waiter's registrations */
  int active;
};

typedef struct {
  uint64_t keys;    /* keys with a value */
  uint64_t queues;  /* non-empty queues */
  uint64_t memory;  /* bytes of keys, values and queue items */
  uint64_t waiters; /* registered waiters */
} uvccl__kv_stats_t;

/* max_memory: 0 = unlimited. Returns NULL on allocation failure. */
uvccl__kv_t *uvccl__kv_new(size_t max_memory);
/* Frees everything; waiters still registered are dropped, not woken. */
void uvccl__kv_free(uvccl__kv_t *kv);
void uvccl__kv_stats(const uvccl__kv_t *kv, uvccl__kv_stats_t *st);

/* Writes. Return 0, UV_ENOMEM, UVCCL_ENOMEM_STORE (over max_memory; nothing
 * changed) or UVCCL_ENOTNUM (add on a value that is not an integer). */
int uvccl__kv_set(uvccl__kv_t *kv, const void *k, size_t klen,
                  const void *v, size_t vlen);
int uvccl__kv_append(uvccl__kv_t *kv, const void *k, size_t klen,
                     const void *v, size_t vlen);
/* std::stoll rules: leading spaces, sign, digits, trailing junk ignored; an
 * empty or digit-less value is UVCCL_ENOTNUM. */
int uvccl__kv_add(uvccl__kv_t *kv, const void *k, size_t klen, int64_t delta,
                  int64_t *result);
/* PyTorch's compare_set. out and outlen: the value to reply (points into the
 * store or to exp/des; valid until the next write). wake: whether waiters
 * on the key are woken (the newer server does, 1.13's does not). */
int uvccl__kv_compare_set(uvccl__kv_t *kv, const void *k, size_t klen,
                          const void *exp, size_t elen, const void *des,
                          size_t dlen, int wake, const void **out,
                          size_t *outlen);
/* Returns 1 if deleted, 0 if missing. Wakes nobody. */
int uvccl__kv_delete(uvccl__kv_t *kv, const void *k, size_t klen);

/* Reads. get returns 1 and points *v into the store (valid until the next
 * write), or 0 if missing. */
int uvccl__kv_get(uvccl__kv_t *kv, const void *k, size_t klen,
                  const void **v, size_t *vlen);
/* A key exists if it has a value or a non-empty queue. */
int uvccl__kv_exists(uvccl__kv_t *kv, const void *k, size_t klen);
uint64_t uvccl__kv_num_keys(const uvccl__kv_t *kv);
/* Calls fn for every key with a value; stops early if fn returns != 0. */
int uvccl__kv_foreach_key(uvccl__kv_t *kv,
                          int (*fn)(const void *k, size_t klen, void *arg),
                          void *arg);

/* Queues */
int uvccl__kv_queue_push(uvccl__kv_t *kv, const void *k, size_t klen,
                         const void *v, size_t vlen);
/* Returns the length before the pop; if > 0, *item is malloc'ed (the
 * caller frees it) with *ilen bytes. < 0 on error. */
int64_t uvccl__kv_queue_pop(uvccl__kv_t *kv, const void *k, size_t klen,
                            void **item, size_t *ilen);
int64_t uvccl__kv_queue_len(uvccl__kv_t *kv, const void *k, size_t klen);

/* Waits. begin/add_key/end register a waiter on a list of keys:
 *   uvccl__kv_wait_begin(kv, w, wake);
 *   for each key: uvccl__kv_wait_add_key(kv, w, k, klen);
 *   r = uvccl__kv_wait_end(kv, w);
 * end returns 1 if nothing is missing (the waiter is not registered and
 * wake is not called), 0 if registered, or UV_ENOMEM (then nothing is
 * registered). A waiter that is already registered is cancelled first. */
void uvccl__kv_wait_begin(uvccl__kv_t *kv, uvccl__kv_waiter_t *w,
                          void (*wake)(uvccl__kv_waiter_t *w));
int uvccl__kv_wait_add_key(uvccl__kv_t *kv, uvccl__kv_waiter_t *w,
                           const void *k, size_t klen);
int uvccl__kv_wait_end(uvccl__kv_t *kv, uvccl__kv_waiter_t *w);
/* Removes every registration of w (no wake). Safe if not registered. */
void uvccl__kv_wait_cancel(uvccl__kv_t *kv, uvccl__kv_waiter_t *w);

#endif
