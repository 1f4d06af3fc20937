/* HashStore: an in-process store on the caller's loop, on the same KV
 * engine as the TCP server (so waits, adds and queues behave alike). Works
 * complete through the work life cycle, so callbacks still never run
 * inside the call even though everything is answered at once. */
#include "internal.h"
#include "kv.h"

#include <string.h>

typedef struct {
  uvccl_store_t *store;
  uvccl__kv_t *kv;
  uvccl__work_list_t blocked; /* works waiting for keys */
  uv_timer_t close_timer;     /* a handle whose close defers close_cb */
} hash_store_t;

/* A work waiting for keys: get, wait, multi_get, blocking queue_pop. */
typedef struct {
  uvccl__kv_waiter_t waiter;
  uvccl_work_t *work;
  hash_store_t *hs;
  uvccl__op_t op;
  size_t nkeys;
  size_t klen[]; /* then the keys, NUL-terminated, back to back */
} blocked_t;

static void blocked_free(blocked_t *b) { uvccl__free(b); }

static const char *blocked_key(const blocked_t *b, size_t i) {
  const char *p = (const char *)&b->klen[b->nkeys];
  size_t j;
  for (j = 0; j < i; j++) p += b->klen[j] + 1;
  return p;
}

/* Answers a work whose keys are all present. */
static void blocked_answer(hash_store_t *hs, uvccl_work_t *w, uvccl__op_t op,
                           const char *const *keys, const size_t *klen,
                           size_t n) {
  const void *v;
  size_t vlen, i;
  int r = 0;
  void *item;

  switch (op) {
  case UVCCL__OP_GET:
    if (!uvccl__kv_get(hs->kv, keys[0], klen[0], &v, &vlen)) {
      /* Present as a queue only: PyTorch's server answers empty. */
      v = "";
      vlen = 0;
    }
    r = uvccl__work_set_value(w, v, vlen);
    break;
  case UVCCL__OP_MULTI_GET:
    r = uvccl__work_set_values(w, n);
    for (i = 0; r == 0 && i < n; i++) {
      if (!uvccl__kv_get(hs->kv, keys[i], klen[i], &v, &vlen)) {
        v = "";
        vlen = 0;
      }
      r = uvccl__work_set_nth(w, i, v, vlen);
    }
    break;
  case UVCCL__OP_QUEUE_POP: {
    int64_t before = uvccl__kv_queue_pop(hs->kv, keys[0], klen[0], &item, &vlen);
    if (before <= 0) {
      uvccl__work_fail(w, UVCCL_EQEMPTY, "store.queue_pop '%s': queue is empty",
                       keys[0]);
      return;
    }
    uvccl__free(w->value);
    w->value = uvccl__realloc(item, vlen + 1);
    if (w->value == NULL) {
      uvccl__free(item);
      r = UV_ENOMEM;
      break;
    }
    ((char *)w->value)[vlen] = '\0';
    w->value_len = vlen;
    w->result = before - 1;
    break;
  }
  default:
    break;
  }
  uvccl__work_complete(w, r);
}

static void blocked_wake(uvccl__kv_waiter_t *kw) {
  blocked_t *b = UVCCL__CONTAINER_OF(kw, blocked_t, waiter);
  const char *keys[64];
  const char **kp = keys;
  uvccl_work_t *w = b->work;
  size_t i;

  uvccl__work_list_remove(&b->hs->blocked, w);
  w->priv_[0] = NULL;
  if (b->nkeys > UVCCL__ARRAY_SIZE(keys)) kp = uvccl__malloc(b->nkeys * sizeof(*kp));
  if (kp == NULL) {
    uvccl__work_complete(w, UV_ENOMEM);
  } else {
    for (i = 0; i < b->nkeys; i++) kp[i] = blocked_key(b, i);
    blocked_answer(b->hs, w, b->op, kp, b->klen, b->nkeys);
    if (kp != keys) uvccl__free(kp);
  }
  blocked_free(b);
}

static void hash_abandon(uvccl_work_t *w, int status) {
  blocked_t *b = w->priv_[0];
  if (b == NULL) return;
  uvccl__kv_wait_cancel(b->hs->kv, &b->waiter);
  uvccl__work_list_remove(&b->hs->blocked, w);
  w->priv_[0] = NULL;
  if (status == UV_ETIMEDOUT)
    uvccl__work_fail(w, status, "%s '%s': wait timeout after %llu ms",
                     w->op, blocked_key(b, 0),
                     (unsigned long long)w->timeout_ms_);
  blocked_free(b);
}

static const struct uvccl__work_ops hash_work_ops = {hash_abandon, NULL, NULL};

/* Registers a blocked work; answers at once if every key is present. */
static int hash_block(hash_store_t *hs, uvccl_work_t *w, uvccl__op_t op,
                      const char *const *keys, size_t n) {
  size_t i, total = 0;
  blocked_t *b;
  char *p;
  int r;

  for (i = 0; i < n; i++) total += strlen(keys[i]) + 1;
  b = uvccl__malloc(sizeof(*b) + n * sizeof(size_t) + total);
  if (b == NULL) return UV_ENOMEM;
  b->work = w;
  b->hs = hs;
  b->op = op;
  b->nkeys = n;
  p = (char *)&b->klen[n];
  for (i = 0; i < n; i++) {
    b->klen[i] = strlen(keys[i]);
    memcpy(p, keys[i], b->klen[i] + 1);
    p += b->klen[i] + 1;
  }
  uvccl__kv_wait_begin(hs->kv, &b->waiter, blocked_wake);
  for (i = 0; i < n; i++) {
    r = uvccl__kv_wait_add_key(hs->kv, &b->waiter, blocked_key(b, i),
                               b->klen[i]);
    if (r < 0) {
      uvccl__kv_wait_cancel(hs->kv, &b->waiter);
      blocked_free(b);
      return r;
    }
  }
  r = uvccl__kv_wait_end(hs->kv, &b->waiter);
  if (r < 0) {
    blocked_free(b);
    return r;
  }
  if (r == 1) { /* nothing missing */
    blocked_answer(hs, w, op, keys, b->klen, n);
    blocked_free(b);
    return 0;
  }
  w->priv_[0] = b;
  uvccl__work_list_push(&hs->blocked, w);
  return 0;
}

static int collect_key(const void *k, size_t klen, void *arg) {
  uvccl_work_t *w = arg;
  return uvccl__work_set_nth(w, w->result++, k, klen);
}

static int hash_submit(uvccl_store_t *s, uvccl_work_t *w,
                       const uvccl__store_req_t *q, uvccl_work_cb cb) {
  hash_store_t *hs = s->impl_;
  uvccl__kv_t *kv = hs->kv;
  const char *k = q->key;
  size_t klen = k ? strlen(k) : 0, i;
  const void *v;
  size_t vlen;
  int r;
  uint64_t timeout = q->timeout_ms;

  /* Only blocking operations can time out. */
  if (q->op != UVCCL__OP_GET && q->op != UVCCL__OP_WAIT &&
      q->op != UVCCL__OP_MULTI_GET &&
      !(q->op == UVCCL__OP_QUEUE_POP && q->block))
    timeout = UVCCL_NO_TIMEOUT;
  r = uvccl__work_start(w, s->loop, uvccl__op_name(q->op), &hash_work_ops,
                        hs, timeout, cb);
  if (r != 0) return r;
  w->priv_[0] = NULL;

  switch (q->op) {
  case UVCCL__OP_SET:
    r = uvccl__kv_set(kv, k, klen, q->value, q->value_len);
    break;
  case UVCCL__OP_APPEND:
    r = uvccl__kv_append(kv, k, klen, q->value, q->value_len);
    break;
  case UVCCL__OP_ADD:
    r = uvccl__kv_add(kv, k, klen, q->delta, &w->result);
    break;
  case UVCCL__OP_COMPARE_SET:
    r = uvccl__kv_compare_set(kv, k, klen, q->expected, q->expected_len,
                              q->value, q->value_len, 1, &v, &vlen);
    if (r == 0) r = uvccl__work_set_value(w, v, vlen);
    break;
  case UVCCL__OP_DELETE_KEY:
    w->result = uvccl__kv_delete(kv, k, klen);
    break;
  case UVCCL__OP_GETNUMKEYS:
    w->result = (int64_t)uvccl__kv_num_keys(kv);
    break;
  case UVCCL__OP_CHECK:
    w->result = 1;
    for (i = 0; i < q->nkeys; i++)
      if (!uvccl__kv_exists(kv, q->keys[i], strlen(q->keys[i]))) w->result = 0;
    break;
  case UVCCL__OP_MULTI_SET:
    for (i = 0; r == 0 && i < q->nkeys; i++)
      r = uvccl__kv_set(kv, q->keys[i], strlen(q->keys[i]), q->values[i].base,
                        q->values[i].len);
    break;
  case UVCCL__OP_QUEUE_PUSH:
    r = uvccl__kv_queue_push(kv, k, klen, q->value, q->value_len);
    break;
  case UVCCL__OP_QUEUE_LEN:
    w->result = uvccl__kv_queue_len(kv, k, klen);
    break;
  case UVCCL__OP_LIST_KEYS:
    r = uvccl__work_set_values(w, uvccl__kv_num_keys(kv));
    if (r == 0) r = uvccl__kv_foreach_key(kv, collect_key, w);
    w->result = 0;
    break;
  case UVCCL__OP_GET:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_MULTI_GET:
  case UVCCL__OP_QUEUE_POP:
    if (q->op == UVCCL__OP_QUEUE_POP && !q->block) {
      blocked_answer(hs, w, q->op, &q->key, &klen, 1);
      return 0;
    }
    /* The work has started: a failure to register is reported through it. */
    r = q->key != NULL ? hash_block(hs, w, q->op, &q->key, 1)
                       : hash_block(hs, w, q->op, q->keys, q->nkeys);
    if (r != 0) uvccl__work_complete(w, r);
    return 0;
  default:
    r = UVCCL_ENOTSUP;
    break;
  }
  if (r != 0)
    uvccl__work_fail(w, r, "%s '%s': %s", uvccl__op_name(q->op), k ? k : "",
                     uvccl_strerror(r));
  else
    uvccl__work_complete(w, 0);
  return 0;
}

static void hash_close_done(uv_handle_t *h) {
  hash_store_t *hs = h->data;
  uvccl_store_t *s = hs->store;
  uvccl__kv_free(hs->kv);
  uvccl__free(hs);
  uvccl__store_closed(s);
}

static void hash_close(uvccl_store_t *s) {
  hash_store_t *hs = s->impl_;
  uvccl_work_t *w;
  while ((w = hs->blocked.head) != NULL) {
    hash_abandon(w, UV_ECANCELED);
    uvccl__work_fail(w, UV_ECANCELED, "%s: store closed", w->op);
  }
  uv_close((uv_handle_t *)&hs->close_timer, hash_close_done);
}

static const struct uvccl__store_vtable hash_vtable = {hash_submit,
                                                       hash_close};

int uvccl_hash_store_init(uv_loop_t *loop, uvccl_store_t *s) {
  hash_store_t *hs;
  if (loop == NULL || s == NULL) return UV_EINVAL;
  hs = uvccl__calloc(1, sizeof(*hs));
  if (hs == NULL) return UV_ENOMEM;
  hs->kv = uvccl__kv_new(0);
  if (hs->kv == NULL) {
    uvccl__free(hs);
    return UV_ENOMEM;
  }
  hs->store = s;
  uv_timer_init(loop, &hs->close_timer);
  hs->close_timer.data = hs;
  uv_unref((uv_handle_t *)&hs->close_timer);
  uvccl__store_init_common(s, loop, UVCCL_STORE_HASH, &hash_vtable, hs);
  return 0;
}
