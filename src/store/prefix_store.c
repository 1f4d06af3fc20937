/* PrefixStore: every key of a base store, namespaced under "prefix/" (the
 * join PyTorch's PrefixStore uses, so nested prefixes give the same keys
 * as c10d's). Operations go straight to the base store on the caller's
 * work; only list_keys needs its result rewritten, through the work's
 * inner callback. */
#include "internal.h"

#include <string.h>

typedef struct {
  uvccl_store_t *base;
  char *prefix;       /* "prefix/" */
  size_t prefix_len;
  uv_timer_t close_timer;
  uvccl_store_t *store;
} prefix_store_t;

/* Builds "prefix/key" in buf (of cap bytes) or in a new allocation. */
static char *prefixed(const prefix_store_t *ps, const char *key, char *buf,
                      size_t cap) {
  size_t klen = strlen(key);
  char *p = ps->prefix_len + klen + 1 <= cap
                ? buf
                : uvccl__malloc(ps->prefix_len + klen + 1);
  if (p == NULL) return NULL;
  memcpy(p, ps->prefix, ps->prefix_len);
  memcpy(p + ps->prefix_len, key, klen + 1);
  return p;
}

/* list_keys of the base returns every key: keep ours, without the prefix. */
static void prefix_list_done(uvccl_work_t *w, int status) {
  prefix_store_t *ps = w->inner_data_;
  uvccl_work_cb cb = w->inner_cb_;
  size_t i, n = 0;

  w->inner_cb_ = NULL;
  w->inner_data_ = NULL;
  if (status == 0) {
    for (i = 0; i < w->nvalues; i++) {
      uvccl_buf_t *b = &w->values[i];
      if (b->len >= ps->prefix_len &&
          memcmp(b->base, ps->prefix, ps->prefix_len) == 0) {
        memmove(b->base, (char *)b->base + ps->prefix_len,
                b->len - ps->prefix_len + 1);
        b->len -= ps->prefix_len;
        w->values[n++] = *b;
      } else {
        uvccl__free(b->base);
      }
    }
    w->nvalues = n;
  }
  if (cb != NULL) cb(w, status);
}

static int prefix_submit(uvccl_store_t *s, uvccl_work_t *w,
                         const uvccl__store_req_t *q, uvccl_work_cb cb) {
  prefix_store_t *ps = s->impl_;
  uvccl__store_req_t r = *q;
  char kbuf[256];
  char *key = NULL;
  char **keys = NULL;
  size_t i;
  int err = 0;

  if (ps->base->closing_) return UVCCL_ECLOSING;
  if (q->key != NULL) {
    key = prefixed(ps, q->key, kbuf, sizeof(kbuf));
    if (key == NULL) return UV_ENOMEM;
    r.key = key;
  }
  if (q->nkeys > 0) {
    keys = uvccl__calloc(q->nkeys, sizeof(*keys));
    if (keys == NULL) {
      err = UV_ENOMEM;
      goto out;
    }
    for (i = 0; i < q->nkeys; i++) {
      keys[i] = prefixed(ps, q->keys[i], NULL, 0);
      if (keys[i] == NULL) {
        err = UV_ENOMEM;
        goto out;
      }
    }
    r.keys = (const char *const *)keys;
  }
  if (q->op == UVCCL__OP_LIST_KEYS) {
    w->inner_cb_ = cb;
    w->inner_data_ = ps;
    cb = prefix_list_done;
  }
  /* The base store copies what it keeps before returning. */
  err = ps->base->vt_->submit(ps->base, w, &r, cb);
out:
  if (keys != NULL) {
    for (i = 0; i < q->nkeys; i++) uvccl__free(keys[i]);
    uvccl__free(keys);
  }
  if (key != NULL && key != kbuf) uvccl__free(key);
  return err;
}

static void prefix_closed(uv_handle_t *h) {
  prefix_store_t *ps = h->data;
  uvccl_store_t *s = ps->store;
  uvccl__free(ps->prefix);
  uvccl__free(ps);
  uvccl__store_closed(s);
}

/* The base store is not closed: it belongs to the caller and may be shared
 * by several prefix stores. Works already submitted belong to the base. */
static void prefix_close(uvccl_store_t *s) {
  prefix_store_t *ps = s->impl_;
  uv_close((uv_handle_t *)&ps->close_timer, prefix_closed);
}

static const struct uvccl__store_vtable prefix_vtable = {prefix_submit,
                                                         prefix_close};

int uvccl_prefix_store_init(uvccl_store_t *s, const char *prefix,
                            uvccl_store_t *base) {
  prefix_store_t *ps;
  size_t n;
  if (s == NULL || prefix == NULL || base == NULL || base->vt_ == NULL)
    return UV_EINVAL;
  ps = uvccl__calloc(1, sizeof(*ps));
  if (ps == NULL) return UV_ENOMEM;
  n = strlen(prefix);
  ps->prefix = uvccl__malloc(n + 2);
  if (ps->prefix == NULL) {
    uvccl__free(ps);
    return UV_ENOMEM;
  }
  memcpy(ps->prefix, prefix, n);
  ps->prefix[n] = '/';
  ps->prefix[n + 1] = '\0';
  ps->prefix_len = n + 1;
  ps->base = base;
  ps->store = s;
  uv_timer_init(base->loop, &ps->close_timer);
  ps->close_timer.data = ps;
  uv_unref((uv_handle_t *)&ps->close_timer);
  uvccl__store_init_common(s, base->loop, UVCCL_STORE_PREFIX, &prefix_vtable,
                           ps);
  /* A prefix store inherits its base's timeout. */
  s->timeout_ms_ = base->timeout_ms_;
  return 0;
}

const uvccl_store_t *uvccl__prefix_store_base(const uvccl_store_t *s) {
  return s->impl_ ? ((const prefix_store_t *)s->impl_)->base : NULL;
}
