/* The generic store API: argument checks, timeout resolution, and the
 * dispatch to each kind of store through its vtable; plus the blocking
 * wrappers for bootstrap code. */
#include "internal.h"

#include <string.h>

void uvccl__store_init_common(uvccl_store_t *s, uv_loop_t *loop,
                              uvccl_store_type_t type,
                              const struct uvccl__store_vtable *vt,
                              void *impl) {
  void *data = s->data;
  memset(s, 0, sizeof(*s));
  s->data = data;
  s->type = type;
  s->loop = loop;
  s->vt_ = vt;
  s->impl_ = impl;
  s->timeout_ms_ = UVCCL_STORE_DEFAULT_TIMEOUT_MS;
}

void uvccl__store_closed(uvccl_store_t *s) {
  uvccl_store_close_cb cb = s->close_cb_;
  s->impl_ = NULL;
  if (cb != NULL) cb(s);
}

void uvccl_store_set_timeout(uvccl_store_t *s, uint64_t timeout_ms) {
  s->timeout_ms_ = timeout_ms ? timeout_ms : UVCCL_STORE_DEFAULT_TIMEOUT_MS;
}

uint64_t uvccl_store_get_timeout(const uvccl_store_t *s) {
  return s->timeout_ms_;
}

void uvccl_store_close(uvccl_store_t *s, uvccl_store_close_cb close_cb) {
  if (s == NULL || s->closing_) return;
  s->closing_ = 1;
  s->close_cb_ = close_cb;
  s->vt_->close(s);
}

static int key_ok(const char *k) { return k != NULL; }

static int keys_ok(const char *const *keys, size_t n) {
  size_t i;
  if (n > 0 && keys == NULL) return 0;
  for (i = 0; i < n; i++)
    if (keys[i] == NULL) return 0;
  return 1;
}

static int submit(uvccl_store_t *s, uvccl_work_t *w, uvccl__store_req_t *req,
                  uvccl_work_cb cb) {
  if (s == NULL || w == NULL || s->vt_ == NULL) return UV_EINVAL;
  if (s->closing_) return UVCCL_ECLOSING;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  if (req->timeout_ms == UVCCL_DEFAULT_TIMEOUT) req->timeout_ms = s->timeout_ms_;
  return s->vt_->submit(s, w, req, cb);
}

#define REQ(name) uvccl__store_req_t name = {0}

int uvccl_store_set(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                    const void *value, size_t len, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key) || (value == NULL && len > 0)) return UV_EINVAL;
  r.op = UVCCL__OP_SET;
  r.key = key;
  r.value = value;
  r.value_len = len;
  return submit(s, w, &r, cb);
}

int uvccl_store_get(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                    uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key)) return UV_EINVAL;
  r.op = UVCCL__OP_GET;
  r.key = key;
  return submit(s, w, &r, cb);
}

int uvccl_store_add(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                    int64_t delta, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key)) return UV_EINVAL;
  r.op = UVCCL__OP_ADD;
  r.key = key;
  r.delta = delta;
  return submit(s, w, &r, cb);
}

int uvccl_store_compare_set(uvccl_store_t *s, uvccl_work_t *w,
                            const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen,
                            uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key) || (expected == NULL && elen > 0) ||
      (desired == NULL && dlen > 0))
    return UV_EINVAL;
  r.op = UVCCL__OP_COMPARE_SET;
  r.key = key;
  r.expected = expected;
  r.expected_len = elen;
  r.value = desired;
  r.value_len = dlen;
  return submit(s, w, &r, cb);
}

int uvccl_store_check(uvccl_store_t *s, uvccl_work_t *w,
                      const char *const *keys, size_t nkeys,
                      uvccl_work_cb cb) {
  REQ(r);
  if (!keys_ok(keys, nkeys)) return UV_EINVAL;
  r.op = UVCCL__OP_CHECK;
  r.keys = keys;
  r.nkeys = nkeys;
  return submit(s, w, &r, cb);
}

int uvccl_store_wait(uvccl_store_t *s, uvccl_work_t *w,
                     const char *const *keys, size_t nkeys,
                     uint64_t timeout_ms, uvccl_work_cb cb) {
  REQ(r);
  if (!keys_ok(keys, nkeys)) return UV_EINVAL;
  r.op = UVCCL__OP_WAIT;
  r.keys = keys;
  r.nkeys = nkeys;
  r.timeout_ms = timeout_ms;
  return submit(s, w, &r, cb);
}

int uvccl_store_delete_key(uvccl_store_t *s, uvccl_work_t *w,
                           const char *key, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key)) return UV_EINVAL;
  r.op = UVCCL__OP_DELETE_KEY;
  r.key = key;
  return submit(s, w, &r, cb);
}

int uvccl_store_num_keys(uvccl_store_t *s, uvccl_work_t *w,
                         uvccl_work_cb cb) {
  REQ(r);
  r.op = UVCCL__OP_GETNUMKEYS;
  return submit(s, w, &r, cb);
}

int uvccl_store_append(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                       const void *value, size_t len, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key) || (value == NULL && len > 0)) return UV_EINVAL;
  r.op = UVCCL__OP_APPEND;
  r.key = key;
  r.value = value;
  r.value_len = len;
  return submit(s, w, &r, cb);
}

int uvccl_store_multi_get(uvccl_store_t *s, uvccl_work_t *w,
                          const char *const *keys, size_t nkeys,
                          uvccl_work_cb cb) {
  REQ(r);
  if (!keys_ok(keys, nkeys)) return UV_EINVAL;
  r.op = UVCCL__OP_MULTI_GET;
  r.keys = keys;
  r.nkeys = nkeys;
  return submit(s, w, &r, cb);
}

int uvccl_store_multi_set(uvccl_store_t *s, uvccl_work_t *w,
                          const char *const *keys, const uvccl_buf_t *values,
                          size_t n, uvccl_work_cb cb) {
  REQ(r);
  size_t i;
  if (!keys_ok(keys, n) || (n > 0 && values == NULL)) return UV_EINVAL;
  for (i = 0; i < n; i++)
    if (values[i].base == NULL && values[i].len > 0) return UV_EINVAL;
  r.op = UVCCL__OP_MULTI_SET;
  r.keys = keys;
  r.values = values;
  r.nkeys = n;
  return submit(s, w, &r, cb);
}

int uvccl_store_queue_push(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                           const void *value, size_t len, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key) || (value == NULL && len > 0)) return UV_EINVAL;
  r.op = UVCCL__OP_QUEUE_PUSH;
  r.key = key;
  r.value = value;
  r.value_len = len;
  return submit(s, w, &r, cb);
}

int uvccl_store_queue_pop(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                          int block, uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key)) return UV_EINVAL;
  r.op = UVCCL__OP_QUEUE_POP;
  r.key = key;
  r.block = block;
  return submit(s, w, &r, cb);
}

int uvccl_store_queue_len(uvccl_store_t *s, uvccl_work_t *w, const char *key,
                          uvccl_work_cb cb) {
  REQ(r);
  if (!key_ok(key)) return UV_EINVAL;
  r.op = UVCCL__OP_QUEUE_LEN;
  r.key = key;
  return submit(s, w, &r, cb);
}

int uvccl_store_list_keys(uvccl_store_t *s, uvccl_work_t *w,
                          uvccl_work_cb cb) {
  REQ(r);
  r.op = UVCCL__OP_LIST_KEYS;
  return submit(s, w, &r, cb);
}

/* ---- Values handed back in works ----------------------------------------- */

static void *dup_bytes(const void *p, size_t len) {
  char *d = uvccl__malloc(len + 1);
  if (d == NULL) return NULL;
  if (len) memcpy(d, p, len);
  d[len] = '\0';
  return d;
}

int uvccl__work_set_value(uvccl_work_t *w, const void *p, size_t len) {
  void *d = dup_bytes(p, len);
  if (d == NULL) return UV_ENOMEM;
  uvccl__free(w->value);
  w->value = d;
  w->value_len = len;
  return 0;
}

int uvccl__work_set_values(uvccl_work_t *w, size_t n) {
  uvccl_buf_t *v = uvccl__calloc(n ? n : 1, sizeof(*v));
  if (v == NULL) return UV_ENOMEM;
  w->values = v;
  w->nvalues = n;
  return 0;
}

int uvccl__work_set_nth(uvccl_work_t *w, size_t i, const void *p,
                        size_t len) {
  void *d = dup_bytes(p, len);
  if (d == NULL) return UV_ENOMEM;
  w->values[i].base = d;
  w->values[i].len = len;
  return 0;
}

/* ---- Blocking wrappers ---------------------------------------------------- */

int uvccl_store_set_sync(uvccl_store_t *s, const char *key, const void *value,
                         size_t len) {
  uvccl_work_t w;
  int r;
  memset(&w, 0, sizeof(w));
  r = uvccl_store_set(s, &w, key, value, len, NULL);
  if (r == 0) r = uvccl_work_wait(&w);
  uvccl_work_cleanup(&w);
  return r;
}

int uvccl_store_get_sync(uvccl_store_t *s, const char *key, void **value,
                         size_t *len) {
  uvccl_work_t w;
  int r;
  memset(&w, 0, sizeof(w));
  *value = NULL;
  *len = 0;
  r = uvccl_store_get(s, &w, key, NULL);
  if (r == 0) r = uvccl_work_wait(&w);
  if (r == 0) {
    /* Hand the buffer over instead of copying it (the allocator is the
     * same malloc, see alloc.c). */
    *value = w.value;
    *len = w.value_len;
    w.value = NULL;
    w.value_len = 0;
  }
  uvccl_work_cleanup(&w);
  return r;
}

int uvccl_store_add_sync(uvccl_store_t *s, const char *key, int64_t delta,
                         int64_t *result) {
  uvccl_work_t w;
  int r;
  memset(&w, 0, sizeof(w));
  r = uvccl_store_add(s, &w, key, delta, NULL);
  if (r == 0) r = uvccl_work_wait(&w);
  if (r == 0 && result != NULL) *result = w.result;
  uvccl_work_cleanup(&w);
  return r;
}

int uvccl_store_wait_sync(uvccl_store_t *s, const char *const *keys,
                          size_t nkeys, uint64_t timeout_ms) {
  uvccl_work_t w;
  int r;
  memset(&w, 0, sizeof(w));
  r = uvccl_store_wait(s, &w, keys, nkeys, timeout_ms, NULL);
  if (r == 0) r = uvccl_work_wait(&w);
  uvccl_work_cleanup(&w);
  return r;
}
