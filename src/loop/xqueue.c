/* Cross-thread completion: any thread posts, the loop thread drains.
 * uv_async_send() coalesces wake-ups, so the callback takes the whole list
 * under the lock and runs the items outside it, in posting order. */
#include "internal.h"

static void xqueue_drain(uvccl__xqueue_t *q) {
  uvccl__xitem_t *it, *next;
  uv_mutex_lock(&q->lock);
  it = q->head;
  q->head = q->tail = NULL;
  uv_mutex_unlock(&q->lock);
  for (; it != NULL; it = next) {
    next = it->next; /* fn may free or repost the item */
    q->drained++;
    it->fn(it);
  }
}

static void xqueue_async_cb(uv_async_t *a) {
  xqueue_drain(a->data);
}

int uvccl__xqueue_init(uv_loop_t *loop, uvccl__xqueue_t *q) {
  int r;
  q->head = q->tail = NULL;
  q->posted = q->drained = 0;
  q->close_cb = NULL;
  q->close_arg = NULL;
  r = uv_mutex_init(&q->lock);
  if (r != 0) return r;
  r = uv_async_init(loop, &q->async, xqueue_async_cb);
  if (r != 0) {
    uv_mutex_destroy(&q->lock);
    return r;
  }
  q->async.data = q;
  return 0;
}

/* The wake-up is sent under the lock: otherwise the loop could run the
 * item, and its owner close and free the queue, before this thread touches
 * q->async (the close waits for the lock before freeing anything). */
int uvccl__xqueue_post(uvccl__xqueue_t *q, uvccl__xitem_t *item) {
  int r;
  item->next = NULL;
  uv_mutex_lock(&q->lock);
  if (q->tail) q->tail->next = item;
  else q->head = item;
  q->tail = item;
  q->posted++;
  r = uv_async_send(&q->async);
  uv_mutex_unlock(&q->lock);
  return r;
}

static void xqueue_closed(uv_handle_t *h) {
  uvccl__xqueue_t *q = h->data;
  /* Items posted between the last wake-up and the close still run. */
  xqueue_drain(q);
  /* a poster may still be inside its uv_async_send() */
  uv_mutex_lock(&q->lock);
  uv_mutex_unlock(&q->lock);
  uv_mutex_destroy(&q->lock);
  if (q->close_cb) q->close_cb(q->close_arg);
}

void uvccl__xqueue_close(uvccl__xqueue_t *q, void (*close_cb)(void *arg),
                         void *arg) {
  q->close_cb = close_cb;
  q->close_arg = arg;
  uv_close((uv_handle_t *)&q->async, xqueue_closed);
}
