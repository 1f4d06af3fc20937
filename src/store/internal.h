/* Store internals: the vtable every store implements. Not installed. */
#ifndef UVCCL_STORE_INTERNAL_H
#define UVCCL_STORE_INTERNAL_H

#include "loop/internal.h"
#include "auth.h"

/* Operations, numbered as the newer PyTorch dialect numbers them. */
typedef enum {
  UVCCL__OP_VALIDATE = 0,
  UVCCL__OP_SET = 1,
  UVCCL__OP_COMPARE_SET = 2,
  UVCCL__OP_GET = 3,
  UVCCL__OP_ADD = 4,
  UVCCL__OP_CHECK = 5,
  UVCCL__OP_WAIT = 6,
  UVCCL__OP_GETNUMKEYS = 7,
  UVCCL__OP_DELETE_KEY = 8,
  UVCCL__OP_APPEND = 9,
  UVCCL__OP_MULTI_GET = 10,
  UVCCL__OP_MULTI_SET = 11,
  UVCCL__OP_CANCEL_WAIT = 12,
  UVCCL__OP_PING = 13,
  UVCCL__OP_QUEUE_PUSH = 14,
  UVCCL__OP_QUEUE_POP = 15,
  UVCCL__OP_QUEUE_LEN = 16,
  UVCCL__OP_LIST_KEYS = 17,
  UVCCL__OP_BARRIER = 18,
  UVCCL__OP_WATCH_KEY = 19, /* 1.13 only (opcode 7 there) */
  UVCCL__OP_COUNT
} uvccl__op_t;

const char *uvccl__op_name(int op); /* "store.get", ... */

/* One call of the generic store API, as handed to a store's submit(). The
 * pointers are only valid during submit(): a store copies what it keeps. */
typedef struct {
  uvccl__op_t op;
  const char *key;           /* SET GET ADD COMPARE_SET DELETE APPEND QUEUE_* */
  const void *value;         /* SET APPEND QUEUE_PUSH; COMPARE_SET: desired */
  size_t value_len;
  const void *expected;      /* COMPARE_SET */
  size_t expected_len;
  int64_t delta;             /* ADD */
  const char *const *keys;   /* CHECK WAIT MULTI_GET MULTI_SET */
  const uvccl_buf_t *values; /* MULTI_SET */
  size_t nkeys;
  int block;                 /* QUEUE_POP */
  uint64_t timeout_ms;       /* resolved: never 0 (UVCCL_NO_TIMEOUT = none) */
} uvccl__store_req_t;

struct uvccl__store_vtable {
  /* Starts the operation on work (uvccl__work_start is the store's job, so
   * it can install its own abandon hook). Returns 0 or an error (then the
   * callback never runs). */
  int (*submit)(uvccl_store_t *store, uvccl_work_t *work,
                const uvccl__store_req_t *req, uvccl_work_cb cb);
  /* Starts closing; must call uvccl__store_closed(store) once done (from a
   * callback, never inside close). */
  void (*close)(uvccl_store_t *store);
};

/* Shared by every store's init. */
void uvccl__store_init_common(uvccl_store_t *store, uv_loop_t *loop,
                              uvccl_store_type_t type,
                              const struct uvccl__store_vtable *vt,
                              void *impl);
/* Called by a store's close path once everything is released: runs the
 * user's close_cb. */
void uvccl__store_closed(uvccl_store_t *store);

/* Value helpers for completing works. They take ownership of nothing: they
 * copy. A NUL is always written after the bytes. Return 0 or UV_ENOMEM. */
int uvccl__work_set_value(uvccl_work_t *work, const void *p, size_t len);
int uvccl__work_set_values(uvccl_work_t *work, size_t n);
int uvccl__work_set_nth(uvccl_work_t *work, size_t i, const void *p,
                        size_t len);

/* For the process groups: where a store lives. */
const char *uvccl__store_host(const uvccl_store_t *s);
/* The secret a TCP store client (under any prefixes) authenticates with:
 * 1 and *k (a uvccl__auth_key_t), or 0 when it has none. */
int uvccl__store_auth_key(const uvccl_store_t *s, uvccl__auth_key_t *k);
const char *uvccl__store_describe(const uvccl_store_t *s);
const uvccl_store_t *uvccl__prefix_store_base(const uvccl_store_t *s);

#endif
