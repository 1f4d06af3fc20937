/* libFuzzer target for the TCPStore protocol parser (make fuzz).
 *
 * The input is treated as what a peer might send: a connection's first
 * bytes (dialect detection), a stream of pipelined requests in either
 * dialect, and, shifted by one byte, a reply to each op. Beyond "never
 * crash", it checks the promises the server relies on:
 *  - every pointer and length the parser hands out lies inside the input;
 *  - a request that parses is re-encoded to exactly the same bytes;
 *  - every proper prefix of a request that parses is NEED_MORE, with a
 *    bound past the prefix and not past the request (the server waits for
 *    that many bytes before parsing again, so an overestimate would hang
 *    a client);
 *  - errors are only EPROTO or ELIMIT, and a prefix of a rejected input is
 *    either NEED_MORE or rejected the same way.
 * Inputs are copied to heap blocks of exactly the length parsed, so ASan
 * catches any read past the end. */
#include "store/auth.h"
#include "store/proto.h"

#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                             \
  do {                                                                       \
    if (!(c)) __builtin_trap();                                              \
  } while (0)

/* Small limits, so that the fuzzer reaches the ends of every field. */
static const uvccl__proto_limits_t small_lim = {32, 64, 8};

static volatile uint64_t sink;

static uint8_t *dup_exact(const uint8_t *p, size_t n) {
  uint8_t *d = malloc(n != 0 ? n : 1);
  CHECK(d != NULL);
  if (n != 0) memcpy(d, p, n);
  return d;
}

/* p[0..n) must lie inside [lo, hi); reading it lets ASan check too. */
static void inside(const uint8_t *p, size_t n, const uint8_t *lo,
                   const uint8_t *hi) {
  uint64_t s = 0;
  size_t i;
  if (n == 0) return;
  CHECK(p != NULL && p >= lo && n <= (size_t)(hi - lo) &&
        (size_t)(p - lo) <= (size_t)(hi - lo) - n);
  for (i = 0; i < n; i++) s += p[i];
  sink += s;
}

static int has_list(uvccl__op_t op) {
  return op == UVCCL__OP_CHECK || op == UVCCL__OP_WAIT ||
         op == UVCCL__OP_MULTI_GET || op == UVCCL__OP_MULTI_SET;
}

/* Parses the first n bytes of p, from a block of exactly n bytes. */
static int parse_prefix(uvccl_dialect_t d, const uint8_t *p, size_t n,
                        const uvccl__proto_limits_t *lim, size_t *need) {
  uvccl__proto_req_t req;
  uint8_t *b = n != 0 ? dup_exact(p, n) : NULL;
  int rc = uvccl__proto_parse_request(d, b, n, lim, &req, need);
  free(b);
  return rc;
}

/* The prefixes to try: all of them for short requests, a sample else. */
static void check_prefixes(uvccl_dialect_t d, const uint8_t *p, size_t total,
                           const uvccl__proto_limits_t *lim, int want_rc) {
  size_t picks[6], npicks = 0, i, n, need;
  int rc;

  if (total <= 64) {
    for (n = 0; n < total; n++) {
      rc = parse_prefix(d, p, n, lim, &need);
      if (want_rc == UVCCL__PROTO_OK)
        CHECK(rc == UVCCL__PROTO_NEED_MORE && need > n && need <= total);
      else
        CHECK(rc == want_rc || (rc == UVCCL__PROTO_NEED_MORE && need > n));
    }
    return;
  }
  picks[npicks++] = 0;
  picks[npicks++] = 1;
  picks[npicks++] = 9;
  picks[npicks++] = total / 2;
  picks[npicks++] = total - 9;
  picks[npicks++] = total - 1;
  for (i = 0; i < npicks; i++) {
    n = picks[i];
    rc = parse_prefix(d, p, n, lim, &need);
    if (want_rc == UVCCL__PROTO_OK)
      CHECK(rc == UVCCL__PROTO_NEED_MORE && need > n && need <= total);
    else
      CHECK(rc == want_rc || (rc == UVCCL__PROTO_NEED_MORE && need > n));
  }
}

/* Encodes the parsed request back (with no key prefix) and compares. Keys
 * travel as C strings in a store request, so one with a NUL in it cannot
 * be re-encoded; nor can a VALIDATE with the wrong magic. */
static void check_reencode(uvccl_dialect_t d, const uvccl__proto_req_t *req,
                           const uint8_t *p, size_t n) {
  uvccl__store_req_t sr;
  uvccl__obuf_t b = {NULL, 0, 0};
  uvccl__proto_iter_t it = req->keys;
  char *key = NULL;
  char **keys = NULL;
  uvccl_buf_t *vals = NULL;
  const uint8_t *k, *v;
  size_t kl, vl, i = 0;
  int ok = 1;

  if (req->op == UVCCL__OP_VALIDATE && req->u32 != UVCCL__MAGIC) return;
  if (req->key_len != 0 && memchr(req->key, 0, req->key_len) != NULL) return;

  memset(&sr, 0, sizeof(sr));
  sr.op = req->op;
  key = malloc(req->key_len + 1);
  CHECK(key != NULL);
  if (req->key_len != 0) memcpy(key, req->key, req->key_len);
  key[req->key_len] = '\0';
  sr.key = key;
  sr.value = req->val;
  sr.value_len = req->val_len;
  sr.expected = req->exp;
  sr.expected_len = req->exp_len;
  sr.delta = req->op == UVCCL__OP_PING ? (int64_t)req->u32 : req->i64;
  if (req->nkeys != 0) {
    keys = calloc(req->nkeys, sizeof(*keys));
    vals = calloc(req->nkeys, sizeof(*vals));
    CHECK(keys != NULL && vals != NULL);
    while (uvccl__proto_iter_next(&it, &k, &kl, &v, &vl)) {
      if (kl != 0 && memchr(k, 0, kl) != NULL) ok = 0;
      keys[i] = malloc(kl + 1);
      CHECK(keys[i] != NULL);
      if (kl != 0) memcpy(keys[i], k, kl);
      keys[i][kl] = '\0';
      vals[i].base = (void *)v;
      vals[i].len = vl;
      i++;
    }
    CHECK(i == req->nkeys);
  }
  sr.keys = (const char *const *)keys;
  sr.values = vals;
  sr.nkeys = req->nkeys;

  if (ok) {
    CHECK(uvccl__proto_encode_request(&b, d, &sr, NULL) == 0);
    CHECK(b.len == n && memcmp(b.base, p, n) == 0);
  }
  uvccl__obuf_free(&b);
  for (i = 0; i < req->nkeys; i++) free(keys[i]);
  free(keys);
  free(vals);
  free(key);
}

static void check_request(uvccl_dialect_t d, const uint8_t *p, size_t n,
                          const uvccl__proto_limits_t *lim,
                          const uvccl__proto_req_t *req) {
  uvccl__proto_iter_t it = req->keys;
  const uint8_t *k, *v, *hi = p + n;
  size_t kl, vl, count = 0;

  CHECK(n > 0);
  CHECK(uvccl__proto_opcode(d, req->op) == p[0]);
  inside(req->key, req->key_len, p, hi);
  inside(req->val, req->val_len, p, hi);
  inside(req->exp, req->exp_len, p, hi);
  CHECK(req->key_len <= lim->max_key_len);
  CHECK(req->val_len <= lim->max_value_len);
  CHECK(req->exp_len <= lim->max_value_len);
  CHECK(req->nkeys <= lim->max_keys);
  CHECK(it.left == req->nkeys);
  CHECK(it.pairs == (req->op == UVCCL__OP_MULTI_SET));
  while (uvccl__proto_iter_next(&it, &k, &kl, &v, &vl)) {
    inside(k, kl, p, hi);
    CHECK(kl <= lim->max_key_len);
    if (it.pairs) {
      inside(v, vl, p, hi);
      CHECK(vl <= lim->max_value_len);
    } else {
      CHECK(v == NULL && vl == 0);
    }
    count++;
  }
  CHECK(count == req->nkeys);
  /* The list is the last field: its walk ends where the request does. */
  if (has_list(req->op) && req->nkeys != 0) CHECK(it.p == hi);
  if (!has_list(req->op)) CHECK(req->nkeys == 0);
  check_reencode(d, req, p, n);
}

/* Parses a stream of pipelined requests the way the server does. */
static void run_requests(uvccl_dialect_t d, const uint8_t *data, size_t size,
                         const uvccl__proto_limits_t *lim) {
  /* NULL limits are the defaults, which check_request needs spelled out. */
  static const uvccl__proto_limits_t defaults = {8 << 10, 8 << 20, 128 << 10};
  const uvccl__proto_limits_t *eff = lim != NULL ? lim : &defaults;
  size_t off = 0, consumed, steps = 0;
  int rc;

  while (off < size && steps++ < 64) {
    uvccl__proto_req_t req;
    uint8_t *b = dup_exact(data + off, size - off);
    rc = uvccl__proto_parse_request(d, b, size - off, lim, &req, &consumed);
    if (rc == UVCCL__PROTO_OK) {
      CHECK(consumed > 0 && consumed <= size - off);
      check_request(d, b, consumed, eff, &req);
      /* Parsing exactly the request's bytes gives the same result. */
      check_prefixes(d, b, consumed, lim, UVCCL__PROTO_OK);
      free(b);
      off += consumed;
      continue;
    }
    if (rc == UVCCL__PROTO_NEED_MORE) {
      CHECK(consumed > size - off);
    } else {
      CHECK(rc == UVCCL_EPROTO || rc == UVCCL_ELIMIT);
      check_prefixes(d, b, size - off, lim, rc);
    }
    free(b);
    break;
  }
}

static void run_detect(const uint8_t *data, size_t size) {
  static const uint8_t hello[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
  uvccl_dialect_t d = UVCCL_DIALECT_AUTO;
  size_t n = size < 5 ? size : 5;
  uint8_t *b = size != 0 ? dup_exact(data, size) : NULL;
  int prefix = n == 0 || memcmp(data, hello, n) == 0;
  int rc = uvccl__proto_detect(b, size, &d);

  free(b);
  if (rc == UVCCL__PROTO_NEED_MORE) {
    CHECK(size < 5 && prefix);
    return;
  }
  CHECK(rc == UVCCL__PROTO_OK);
  if (d == UVCCL_DIALECT_MODERN) {
    CHECK(size >= 5 && prefix);
  } else {
    CHECK(d == UVCCL_DIALECT_LEGACY && !prefix);
  }
  /* What the server then does with the connection, default limits. */
  run_requests(d, data, size, NULL);
}

static void run_replies(const uint8_t *data, size_t size) {
  const size_t maxv = 64;
  size_t nkeys, len, consumed, need, count;
  const uint8_t *p, *k, *v;
  size_t kl, vl;
  int op, rc;

  if (size == 0) return;
  nkeys = data[0] % 6;
  p = data + 1;
  len = size - 1;
  for (op = 0; op < UVCCL__OP_COUNT; op++) {
    uvccl__proto_reply_t r;
    uint8_t *b = len != 0 ? dup_exact(p, len) : NULL;
    const uint8_t *bhi = b != NULL ? b + len : NULL;
    rc = uvccl__proto_parse_reply((uvccl__op_t)op, nkeys, b, len, maxv, &r,
                                  &consumed);
    if (rc == UVCCL__PROTO_OK) {
      CHECK(consumed <= len);
      inside(r.val, r.val_len, b, bhi);
      CHECK(r.val_len <= maxv);
      CHECK(r.list.left == r.count);
      count = 0;
      while (uvccl__proto_iter_next(&r.list, &k, &kl, &v, &vl)) {
        inside(k, kl, b, bhi);
        CHECK(kl <= maxv && v == NULL && vl == 0);
        count++;
      }
      CHECK(count == r.count);
      if (op == UVCCL__OP_MULTI_GET) CHECK(r.count == nkeys);
      if (op == UVCCL__OP_QUEUE_POP) CHECK(r.i64 >= 0);
      /* A shorter reply is incomplete, needing more than it has. */
      if (consumed > 0) {
        uvccl__proto_reply_t r2;
        uint8_t *s = consumed - 1 != 0 ? dup_exact(p, consumed - 1) : NULL;
        rc = uvccl__proto_parse_reply((uvccl__op_t)op, nkeys, s, consumed - 1,
                                      maxv, &r2, &need);
        CHECK(rc == UVCCL__PROTO_NEED_MORE && need > consumed - 1 &&
              need <= consumed);
        free(s);
      }
    } else if (rc == UVCCL__PROTO_NEED_MORE) {
      CHECK(consumed > len);
    } else {
      CHECK(rc == UVCCL_EPROTO || rc == UVCCL_ELIMIT);
    }
    free(b);
  }
  CHECK(uvccl__proto_parse_reply(UVCCL__OP_COUNT, nkeys, data, size, maxv,
                                 &(uvccl__proto_reply_t){0}, &consumed) ==
        UV_EINVAL);
}

/* The authentication messages (auth.h) a peer might send: a reader says
 * NEED only for a consistent prefix shorter than its message, never reads
 * past the input, and a message it accepts starts with the magic. */
static void run_auth(const uint8_t *data, size_t size) {
  uint8_t nc[UVCCL__AUTH_NONCE], ns[UVCCL__AUTH_NONCE], mac[UVCCL__AUTH_MAC];
  int r = uvccl__auth_read_hello(data, size, nc);
  if (r == UVCCL__AUTH_NEED && size >= UVCCL__AUTH_HELLO_LEN) abort();
  if (r == 0 && memcmp(data, UVCCL__AUTH_MAGIC, UVCCL__AUTH_MAGIC_LEN) != 0)
    abort();
  r = uvccl__auth_read_challenge(data, size, ns, mac);
  if (r == UVCCL__AUTH_NEED && size >= UVCCL__AUTH_CHALLENGE_LEN) abort();
  if (r == 0 && (size < UVCCL__AUTH_CHALLENGE_LEN ||
                 memcmp(data, UVCCL__AUTH_MAGIC, UVCCL__AUTH_MAGIC_LEN) != 0))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_auth(data, size);
  run_detect(data, size);
  run_requests(UVCCL_DIALECT_MODERN, data, size, &small_lim);
  run_requests(UVCCL_DIALECT_LEGACY, data, size, &small_lim);
  run_replies(data, size);
  return 0;
}
