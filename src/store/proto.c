/* TCPStore wire protocol, both PyTorch dialects, with no I/O.
 *
 * The request parser is restartable rather than stateful: the server keeps
 * a connection's unparsed bytes in one buffer and calls parse_request on it
 * whenever more arrive. A parse either finds a whole request (OK), or finds
 * that bytes are missing (NEED_MORE, with a lower bound of how many the
 * request needs in all), or rejects the input. Because a NEED_MORE parse
 * never commits anything, there is no state to get out of step, and the
 * lower bound lets the server skip re-parsing until enough has arrived, so a
 * large request costs one full parse, not one per read.
 *
 * Nothing here trusts a length from the wire: every length is checked
 * against its limit as soon as its 8 bytes are in, before any of the bytes
 * it announces, and every size computed from one saturates instead of
 * wrapping. (The legacy PyTorch server trusted them, which is how an nmap
 * scan of the port could OOM a training job, pytorch/pytorch#106294.) */
#include "proto.h"

#include <string.h>

/* PyTorch's libuv server: MAX_STRING_LEN, MAX_PAYLOAD_LEN, MAX_KEY_COUNT. */
#define DEFAULT_MAX_KEY_LEN ((size_t)8 << 10)
#define DEFAULT_MAX_VALUE_LEN ((size_t)8 << 20)
#define DEFAULT_MAX_KEYS ((size_t)128 << 10)

/* Every length on the wire is a u64. */
#define LEN_SIZE 8

static size_t sat_add(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t sat_mul(size_t a, size_t b) {
  return b != 0 && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* ---- Reading --------------------------------------------------------------
 * A cursor over the input. tail is a lower bound of the bytes the fields
 * after the one being read still need (8 per length field to come), so that
 * NEED_MORE can report the whole request's minimum, not just the next
 * field's. */
typedef struct {
  const uint8_t *buf;
  size_t len;
  size_t off;
  size_t tail;
  size_t need; /* set when a read returns NEED_MORE */
} rd_t;

/* The cursor's position as a pointer. A caller with nothing buffered may
 * pass buf == NULL, and NULL + 0 is undefined, so it is never computed. */
static const uint8_t *rd_ptr(const rd_t *r) {
  return r->buf != NULL ? r->buf + r->off : NULL;
}

static int rd_take(rd_t *r, size_t n, const uint8_t **p) {
  if (r->len - r->off < n) {
    r->need = sat_add(sat_add(r->off, n), r->tail);
    return UVCCL__PROTO_NEED_MORE;
  }
  *p = rd_ptr(r);
  r->off += n;
  return UVCCL__PROTO_OK;
}

static int rd_u8(rd_t *r, uint8_t *v) {
  const uint8_t *p;
  int rc = rd_take(r, 1, &p);
  if (rc == UVCCL__PROTO_OK) *v = p[0];
  return rc;
}

/* memcpy, not a pointer cast: fields sit at any alignment. */
static int rd_u32(rd_t *r, uint32_t *v) {
  const uint8_t *p;
  int rc = rd_take(r, sizeof(*v), &p);
  if (rc == UVCCL__PROTO_OK) memcpy(v, p, sizeof(*v));
  return rc;
}

static int rd_u64(rd_t *r, uint64_t *v) {
  const uint8_t *p;
  int rc = rd_take(r, sizeof(*v), &p);
  if (rc == UVCCL__PROTO_OK) memcpy(v, p, sizeof(*v));
  return rc;
}

static int rd_i64(rd_t *r, int64_t *v) {
  const uint8_t *p;
  int rc = rd_take(r, sizeof(*v), &p);
  if (rc == UVCCL__PROTO_OK) memcpy(v, p, sizeof(*v));
  return rc;
}

/* A u64 length and that many bytes, at most limit of them. The limit is
 * checked before the bytes are waited for, so a peer announcing 2^60
 * bytes is turned away at once instead of being buffered for. */
static int rd_blob(rd_t *r, size_t limit, const uint8_t **p, size_t *n) {
  uint64_t len;
  int rc = rd_u64(r, &len);
  if (rc != UVCCL__PROTO_OK) return rc;
  if (len > (uint64_t)limit) return UVCCL_ELIMIT;
  rc = rd_take(r, (size_t)len, p);
  if (rc == UVCCL__PROTO_OK) *n = (size_t)len;
  return rc;
}

/* n strings (pairs: n key/value pairs), all of them checked, none kept:
 * the iterator walks them again later. The list is always the last field,
 * so only the items after the current one make up the tail. */
static int rd_list(rd_t *r, size_t n, size_t klimit, size_t vlimit,
                   int pairs, uvccl__proto_iter_t *it) {
  const size_t per = pairs ? 2 * LEN_SIZE : LEN_SIZE;
  const uint8_t *p;
  size_t i, plen;
  int rc;

  it->p = rd_ptr(r);
  it->left = n;
  it->pairs = pairs;
  for (i = 0; i < n; i++) {
    size_t rest = sat_mul(n - i - 1, per);
    r->tail = pairs ? sat_add(rest, LEN_SIZE) : rest;
    rc = rd_blob(r, klimit, &p, &plen);
    if (rc != UVCCL__PROTO_OK) return rc;
    if (pairs) {
      r->tail = rest;
      rc = rd_blob(r, vlimit, &p, &plen);
      if (rc != UVCCL__PROTO_OK) return rc;
    }
  }
  r->tail = 0;
  return UVCCL__PROTO_OK;
}

/* ---- Dialects ------------------------------------------------------------ */

/* 1.13 numbering, captured on the wire (notes §2). */
static const uvccl__op_t legacy_ops[] = {
    UVCCL__OP_SET,        UVCCL__OP_COMPARE_SET, UVCCL__OP_GET,
    UVCCL__OP_ADD,        UVCCL__OP_CHECK,       UVCCL__OP_WAIT,
    UVCCL__OP_GETNUMKEYS, UVCCL__OP_WATCH_KEY,   UVCCL__OP_DELETE_KEY,
};

static const uint8_t modern_hello[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};

int uvccl__proto_detect(const uint8_t *buf, size_t len,
                        uvccl_dialect_t *out) {
  size_t n = len < sizeof(modern_hello) ? len : sizeof(modern_hello);

  /* A 1.13 first request can never start with the whole VALIDATE: it
   * would be a SET whose key is ~1 GB long. So the first mismatching byte
   * decides, and only a prefix of the VALIDATE keeps us waiting. */
  if (n > 0 && memcmp(buf, modern_hello, n) != 0) {
    *out = UVCCL_DIALECT_LEGACY;
    return UVCCL__PROTO_OK;
  }
  if (n < sizeof(modern_hello)) return UVCCL__PROTO_NEED_MORE;
  *out = UVCCL_DIALECT_MODERN;
  return UVCCL__PROTO_OK;
}

int uvccl__proto_opcode(uvccl_dialect_t dialect, uvccl__op_t op) {
  size_t i;

  if (dialect == UVCCL_DIALECT_MODERN)
    return (int)op >= 0 && op <= UVCCL__OP_BARRIER ? (int)op : -1;
  if (dialect == UVCCL_DIALECT_LEGACY) {
    for (i = 0; i < UVCCL__ARRAY_SIZE(legacy_ops); i++)
      if (legacy_ops[i] == op) return (int)i;
  }
  return -1;
}

static int op_of_opcode(uvccl_dialect_t dialect, uint8_t code,
                        uvccl__op_t *op) {
  if (dialect == UVCCL_DIALECT_MODERN && code <= UVCCL__OP_BARRIER) {
    *op = (uvccl__op_t)code;
    return 0;
  }
  if (dialect == UVCCL_DIALECT_LEGACY && code < UVCCL__ARRAY_SIZE(legacy_ops)) {
    *op = legacy_ops[code];
    return 0;
  }
  return UVCCL_EPROTO;
}

/* ---- Requests ------------------------------------------------------------ */

static int parse_fields(rd_t *r, const uvccl__proto_limits_t *lim,
                        uvccl__proto_req_t *req) {
  uint64_t count;
  int64_t scount;
  int rc;

  switch (req->op) {
  case UVCCL__OP_VALIDATE:
  case UVCCL__OP_PING:
    return rd_u32(r, &req->u32);

  case UVCCL__OP_SET:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_QUEUE_PUSH:
    r->tail = LEN_SIZE;
    rc = rd_blob(r, lim->max_key_len, &req->key, &req->key_len);
    if (rc != UVCCL__PROTO_OK) return rc;
    r->tail = 0;
    return rd_blob(r, lim->max_value_len, &req->val, &req->val_len);

  case UVCCL__OP_COMPARE_SET:
    r->tail = 2 * LEN_SIZE;
    rc = rd_blob(r, lim->max_key_len, &req->key, &req->key_len);
    if (rc != UVCCL__PROTO_OK) return rc;
    r->tail = LEN_SIZE;
    rc = rd_blob(r, lim->max_value_len, &req->exp, &req->exp_len);
    if (rc != UVCCL__PROTO_OK) return rc;
    r->tail = 0;
    return rd_blob(r, lim->max_value_len, &req->val, &req->val_len);

  case UVCCL__OP_GET:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_QUEUE_POP:
  case UVCCL__OP_QUEUE_LEN:
  case UVCCL__OP_WATCH_KEY:
    return rd_blob(r, lim->max_key_len, &req->key, &req->key_len);

  case UVCCL__OP_ADD:
  case UVCCL__OP_BARRIER:
    r->tail = sizeof(int64_t);
    rc = rd_blob(r, lim->max_key_len, &req->key, &req->key_len);
    if (rc != UVCCL__PROTO_OK) return rc;
    r->tail = 0;
    return rd_i64(r, &req->i64);

  case UVCCL__OP_CHECK:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_MULTI_GET:
    rc = rd_u64(r, &count);
    if (rc != UVCCL__PROTO_OK) return rc;
    if (count > (uint64_t)lim->max_keys) return UVCCL_ELIMIT;
    req->nkeys = (size_t)count;
    return rd_list(r, req->nkeys, lim->max_key_len, 0, 0, &req->keys);

  case UVCCL__OP_MULTI_SET:
    /* The count is signed here (the client writes an int64_t). A negative
     * one is malformed rather than too large. */
    rc = rd_i64(r, &scount);
    if (rc != UVCCL__PROTO_OK) return rc;
    if (scount < 0) return UVCCL_EPROTO;
    if ((uint64_t)scount > (uint64_t)lim->max_keys) return UVCCL_ELIMIT;
    req->nkeys = (size_t)scount;
    return rd_list(r, req->nkeys, lim->max_key_len, lim->max_value_len, 1,
                   &req->keys);

  case UVCCL__OP_GETNUMKEYS:
  case UVCCL__OP_CANCEL_WAIT:
  case UVCCL__OP_LIST_KEYS:
    return UVCCL__PROTO_OK;

  default:
    return UVCCL_EPROTO;
  }
}

int uvccl__proto_parse_request(uvccl_dialect_t dialect, const uint8_t *buf,
                               size_t len, const uvccl__proto_limits_t *lim,
                               uvccl__proto_req_t *req, size_t *consumed) {
  uvccl__proto_limits_t l = {0, 0, 0};
  rd_t r;
  uint8_t code;
  int rc;

  memset(req, 0, sizeof(*req));
  *consumed = 0;
  if (dialect != UVCCL_DIALECT_MODERN && dialect != UVCCL_DIALECT_LEGACY)
    return UV_EINVAL;

  if (lim != NULL) l = *lim;
  if (l.max_key_len == 0) l.max_key_len = DEFAULT_MAX_KEY_LEN;
  if (l.max_value_len == 0) l.max_value_len = DEFAULT_MAX_VALUE_LEN;
  if (l.max_keys == 0) l.max_keys = DEFAULT_MAX_KEYS;

  memset(&r, 0, sizeof(r));
  r.buf = buf;
  r.len = len;
  rc = rd_u8(&r, &code);
  if (rc == UVCCL__PROTO_OK) rc = op_of_opcode(dialect, code, &req->op);
  if (rc == UVCCL__PROTO_OK) rc = parse_fields(&r, &l, req);

  if (rc == UVCCL__PROTO_OK)
    *consumed = r.off;
  else if (rc == UVCCL__PROTO_NEED_MORE)
    *consumed = r.need;
  return rc;
}

int uvccl__proto_iter_next(uvccl__proto_iter_t *it, const uint8_t **k,
                           size_t *klen, const uint8_t **v, size_t *vlen) {
  uint64_t n;

  if (it->left == 0) return 0;
  /* The parser has checked every length against the buffer, so the walk
   * needs no bounds of its own. */
  memcpy(&n, it->p, sizeof(n));
  if (k != NULL) *k = it->p + LEN_SIZE;
  if (klen != NULL) *klen = (size_t)n;
  it->p += LEN_SIZE + (size_t)n;
  if (it->pairs) {
    memcpy(&n, it->p, sizeof(n));
    if (v != NULL) *v = it->p + LEN_SIZE;
    if (vlen != NULL) *vlen = (size_t)n;
    it->p += LEN_SIZE + (size_t)n;
  } else {
    if (v != NULL) *v = NULL;
    if (vlen != NULL) *vlen = 0;
  }
  it->left--;
  return 1;
}

/* ---- Output buffers ------------------------------------------------------ */

int uvccl__obuf_reserve(uvccl__obuf_t *b, size_t extra) {
  size_t want, cap;
  void *p;

  if (extra <= b->cap - b->len) return 0;
  if (extra > SIZE_MAX - b->len) return UV_ENOMEM;
  want = b->len + extra;
  cap = b->cap != 0 ? b->cap : 256;
  while (cap < want) cap = cap > SIZE_MAX / 2 ? want : cap * 2;
  p = uvccl__realloc(b->base, cap);
  if (p == NULL) return UV_ENOMEM;
  b->base = p;
  b->cap = cap;
  return 0;
}

int uvccl__obuf_bytes(uvccl__obuf_t *b, const void *p, size_t len) {
  int rc = uvccl__obuf_reserve(b, len);
  if (rc != 0) return rc;
  if (len != 0) memcpy(b->base + b->len, p, len);
  b->len += len;
  return 0;
}

int uvccl__obuf_u8(uvccl__obuf_t *b, uint8_t v) {
  return uvccl__obuf_bytes(b, &v, sizeof(v));
}

int uvccl__obuf_u32(uvccl__obuf_t *b, uint32_t v) {
  return uvccl__obuf_bytes(b, &v, sizeof(v));
}

int uvccl__obuf_i64(uvccl__obuf_t *b, int64_t v) {
  return uvccl__obuf_bytes(b, &v, sizeof(v));
}

static int obuf_u64(uvccl__obuf_t *b, uint64_t v) {
  return uvccl__obuf_bytes(b, &v, sizeof(v));
}

int uvccl__obuf_str(uvccl__obuf_t *b, const void *p, size_t len) {
  int rc = uvccl__obuf_reserve(b, sat_add(LEN_SIZE, len));
  if (rc == 0) rc = obuf_u64(b, len);
  if (rc == 0) rc = uvccl__obuf_bytes(b, p, len);
  return rc;
}

void uvccl__obuf_free(uvccl__obuf_t *b) {
  uvccl__free(b->base);
  b->base = NULL;
  b->len = 0;
  b->cap = 0;
}

/* ---- Encoding requests --------------------------------------------------- */

/* A key as one string: the prefix is part of the key on the wire. */
static int put_key(uvccl__obuf_t *b, const char *pfx, size_t plen,
                   const char *key) {
  size_t klen;
  int rc;

  if (key == NULL) return UV_EINVAL;
  klen = strlen(key);
  rc = uvccl__obuf_reserve(b, sat_add(LEN_SIZE, sat_add(plen, klen)));
  if (rc == 0) rc = obuf_u64(b, plen + klen);
  if (rc == 0) rc = uvccl__obuf_bytes(b, pfx, plen);
  if (rc == 0) rc = uvccl__obuf_bytes(b, key, klen);
  return rc;
}

static int put_keys(uvccl__obuf_t *b, const char *pfx, size_t plen,
                    const uvccl__store_req_t *req) {
  size_t i;
  int rc;

  if (req->nkeys != 0 && req->keys == NULL) return UV_EINVAL;
  rc = obuf_u64(b, req->nkeys);
  for (i = 0; rc == 0 && i < req->nkeys; i++)
    rc = put_key(b, pfx, plen, req->keys[i]);
  return rc;
}

static int put_value(uvccl__obuf_t *b, const void *p, size_t len) {
  if (p == NULL && len != 0) return UV_EINVAL;
  return uvccl__obuf_str(b, p, len);
}

static int encode_fields(uvccl__obuf_t *b, const char *pfx, size_t plen,
                         const uvccl__store_req_t *req) {
  size_t i;
  int rc;

  switch (req->op) {
  case UVCCL__OP_VALIDATE:
    return uvccl__obuf_u32(b, UVCCL__MAGIC);

  case UVCCL__OP_PING:
    return uvccl__obuf_u32(b, (uint32_t)req->delta);

  case UVCCL__OP_SET:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_QUEUE_PUSH:
    rc = put_key(b, pfx, plen, req->key);
    return rc != 0 ? rc : put_value(b, req->value, req->value_len);

  case UVCCL__OP_COMPARE_SET:
    rc = put_key(b, pfx, plen, req->key);
    if (rc == 0) rc = put_value(b, req->expected, req->expected_len);
    return rc != 0 ? rc : put_value(b, req->value, req->value_len);

  /* QUEUE_POP with block is WAIT then QUEUE_POP; the client sends the
   * WAIT as its own request, so only the pop is encoded here. */
  case UVCCL__OP_GET:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_QUEUE_POP:
  case UVCCL__OP_QUEUE_LEN:
  case UVCCL__OP_WATCH_KEY:
    return put_key(b, pfx, plen, req->key);

  case UVCCL__OP_ADD:
  case UVCCL__OP_BARRIER:
    rc = put_key(b, pfx, plen, req->key);
    return rc != 0 ? rc : uvccl__obuf_i64(b, req->delta);

  case UVCCL__OP_CHECK:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_MULTI_GET:
    return put_keys(b, pfx, plen, req);

  case UVCCL__OP_MULTI_SET:
    if (req->nkeys != 0 && (req->keys == NULL || req->values == NULL))
      return UV_EINVAL;
    rc = uvccl__obuf_i64(b, (int64_t)req->nkeys);
    for (i = 0; rc == 0 && i < req->nkeys; i++) {
      rc = put_key(b, pfx, plen, req->keys[i]);
      if (rc == 0) rc = put_value(b, req->values[i].base, req->values[i].len);
    }
    return rc;

  case UVCCL__OP_GETNUMKEYS:
  case UVCCL__OP_CANCEL_WAIT:
  case UVCCL__OP_LIST_KEYS:
    return 0;

  default:
    return UVCCL_ENOTSUP;
  }
}

int uvccl__proto_encode_request(uvccl__obuf_t *b, uvccl_dialect_t dialect,
                                const uvccl__store_req_t *req,
                                const char *key_prefix) {
  size_t start = b->len;
  size_t plen = key_prefix != NULL ? strlen(key_prefix) : 0;
  int code = uvccl__proto_opcode(dialect, req->op);
  int rc;

  if (code < 0) return UVCCL_ENOTSUP;
  rc = uvccl__obuf_u8(b, (uint8_t)code);
  if (rc == 0) rc = encode_fields(b, key_prefix, plen, req);
  /* Never leave half a request behind: the buffer may already hold
   * earlier requests that still have to go out intact. */
  if (rc != 0) b->len = start;
  return rc;
}

/* ---- Replies ------------------------------------------------------------- */

int uvccl__proto_parse_reply(uvccl__op_t op, size_t nkeys, const uint8_t *buf,
                             size_t len, size_t max_value_len,
                             uvccl__proto_reply_t *reply, size_t *consumed) {
  size_t maxv = max_value_len != 0 ? max_value_len : DEFAULT_MAX_VALUE_LEN;
  rd_t r;
  int rc;

  memset(reply, 0, sizeof(*reply));
  memset(&r, 0, sizeof(r));
  r.buf = buf;
  r.len = len;
  *consumed = 0;

  switch (op) {
  case UVCCL__OP_SET:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_MULTI_SET:
  case UVCCL__OP_QUEUE_PUSH:
  case UVCCL__OP_VALIDATE:
    rc = UVCCL__PROTO_OK; /* fire and forget: there is no reply */
    break;

  case UVCCL__OP_GET:
  case UVCCL__OP_COMPARE_SET:
    rc = rd_blob(&r, maxv, &reply->val, &reply->val_len);
    break;

  case UVCCL__OP_ADD:
  case UVCCL__OP_GETNUMKEYS:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_QUEUE_LEN:
    rc = rd_i64(&r, &reply->i64);
    break;

  case UVCCL__OP_CHECK:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_CANCEL_WAIT:
  case UVCCL__OP_BARRIER:
  case UVCCL__OP_WATCH_KEY:
    rc = rd_u8(&r, &reply->u8);
    break;

  case UVCCL__OP_PING:
    rc = rd_u32(&r, &reply->u32);
    break;

  case UVCCL__OP_QUEUE_POP:
    /* The length before the pop; a value follows only if there was one,
     * so the 8 bytes of the length are all that is sure to come. */
    rc = rd_i64(&r, &reply->i64);
    if (rc != UVCCL__PROTO_OK) break;
    if (reply->i64 < 0) {
      rc = UVCCL_EPROTO;
      break;
    }
    if (reply->i64 > 0) rc = rd_blob(&r, maxv, &reply->val, &reply->val_len);
    break;

  case UVCCL__OP_MULTI_GET:
    /* No count on the wire: one value per key asked for. */
    reply->count = nkeys;
    rc = rd_list(&r, nkeys, maxv, 0, 0, &reply->list);
    break;

  case UVCCL__OP_LIST_KEYS: {
    int64_t n;
    rc = rd_i64(&r, &n);
    if (rc != UVCCL__PROTO_OK) break;
    if (n < 0) {
      rc = UVCCL_EPROTO;
      break;
    }
    if ((uint64_t)n > (uint64_t)SIZE_MAX) {
      rc = UVCCL_ELIMIT;
      break;
    }
    reply->count = (size_t)n;
    rc = rd_list(&r, reply->count, maxv, 0, 0, &reply->list);
    break;
  }

  default:
    return UV_EINVAL;
  }

  if (rc == UVCCL__PROTO_OK)
    *consumed = r.off;
  else if (rc == UVCCL__PROTO_NEED_MORE)
    *consumed = r.need;
  return rc;
}

/* ---- Names --------------------------------------------------------------- */

/* As the public calls are named (uvccl_store_num_keys is "store.num_keys"),
 * since these strings end up in work->op and in error messages. */
static const char *const op_names[UVCCL__OP_COUNT] = {
    [UVCCL__OP_VALIDATE] = "store.validate",
    [UVCCL__OP_SET] = "store.set",
    [UVCCL__OP_COMPARE_SET] = "store.compare_set",
    [UVCCL__OP_GET] = "store.get",
    [UVCCL__OP_ADD] = "store.add",
    [UVCCL__OP_CHECK] = "store.check",
    [UVCCL__OP_WAIT] = "store.wait",
    [UVCCL__OP_GETNUMKEYS] = "store.num_keys",
    [UVCCL__OP_DELETE_KEY] = "store.delete_key",
    [UVCCL__OP_APPEND] = "store.append",
    [UVCCL__OP_MULTI_GET] = "store.multi_get",
    [UVCCL__OP_MULTI_SET] = "store.multi_set",
    [UVCCL__OP_CANCEL_WAIT] = "store.cancel_wait",
    [UVCCL__OP_PING] = "store.ping",
    [UVCCL__OP_QUEUE_PUSH] = "store.queue_push",
    [UVCCL__OP_QUEUE_POP] = "store.queue_pop",
    [UVCCL__OP_QUEUE_LEN] = "store.queue_len",
    [UVCCL__OP_LIST_KEYS] = "store.list_keys",
    [UVCCL__OP_BARRIER] = "store.barrier",
    [UVCCL__OP_WATCH_KEY] = "store.watch_key",
};

const char *uvccl__op_name(int op) {
  if (op < 0 || op >= UVCCL__OP_COUNT) return "store.unknown";
  return op_names[op];
}
