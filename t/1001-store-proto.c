/* The TCPStore wire protocol without sockets: exact bytes as captured from
 * PyTorch clients (notes/store-protocol.md §1.3 and §2), encode/parse round
 * trips for every op in both dialects, byte-at-a-time feeding, pipelining,
 * limits and hostile lengths, dialect detection and reply parsing.
 *
 * Inputs are parsed from heap copies of exactly their length, so that
 * AddressSanitizer catches any read past the end. */
#include "tap.h"

#include "store/proto.h"

/* A u64 or i64 small enough to fit its low byte, as hex. */
#define Q(x) x " 00 00 00 00 00 00 00"

static const uvccl__proto_limits_t small_lim = {4, 8, 2};

/* Parses hex digit pairs, skipping anything else ("|", spaces). */
static size_t hx(uint8_t *out, size_t cap, const char *s) {
  size_t n = 0;
  int hi = -1;
  for (; *s != '\0'; s++) {
    int d;
    if (*s >= '0' && *s <= '9') d = *s - '0';
    else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
    else if (*s >= 'A' && *s <= 'F') d = *s - 'A' + 10;
    else continue;
    if (hi < 0) {
      hi = d;
    } else {
      if (n < cap) out[n] = (uint8_t)(hi << 4 | d);
      n++;
      hi = -1;
    }
  }
  return n;
}

static uint8_t *dup_exact(const void *p, size_t n) {
  uint8_t *d = malloc(n != 0 ? n : 1);
  if (d == NULL) abort();
  if (n != 0) memcpy(d, p, n);
  return d;
}

static void dump(const char *what, const uint8_t *p, size_t n) {
  size_t i;
  printf("#   %s (%zu):", what, n);
  for (i = 0; i < n && i < 64; i++) printf(" %02X", p[i]);
  printf("%s\n", n > 64 ? " ..." : "");
}

static int is_bytes(const uint8_t *got, size_t glen, const char *want_hex,
                    const char *name) {
  uint8_t want[512];
  size_t wlen = hx(want, sizeof(want), want_hex);
  int c = glen == wlen && (wlen == 0 || memcmp(got, want, wlen) == 0);
  ok(c, "%s", name);
  if (!c) {
    dump("got", got, glen);
    dump("expected", want, wlen);
  }
  return c;
}

static int mem_eq(const uint8_t *p, size_t n, const char *a, const char *b) {
  size_t la = a != NULL ? strlen(a) : 0, lb = strlen(b);
  return n == la + lb && (la == 0 || memcmp(p, a, la) == 0) &&
         memcmp(p + la, b, lb) == 0;
}

/* ---- detect -------------------------------------------------------------- */

static void test_detect(void) {
  static const struct {
    const char *hex;
    int rc;
    uvccl_dialect_t d;
  } cases[] = {
      {"", UVCCL__PROTO_NEED_MORE, UVCCL_DIALECT_AUTO},
      {"00", UVCCL__PROTO_NEED_MORE, UVCCL_DIALECT_AUTO},
      {"00 CE", UVCCL__PROTO_NEED_MORE, UVCCL_DIALECT_AUTO},
      {"00 CE F7", UVCCL__PROTO_NEED_MORE, UVCCL_DIALECT_AUTO},
      {"00 CE F7 85", UVCCL__PROTO_NEED_MORE, UVCCL_DIALECT_AUTO},
      {"00 CE F7 85 3C", UVCCL__PROTO_OK, UVCCL_DIALECT_MODERN},
      {"00 CE F7 85 3C 0D 01 02 03 04", UVCCL__PROTO_OK, UVCCL_DIALECT_MODERN},
      {"00 CE F7 85 3D", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"00 CE F7 86", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"00 CF", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"00 02 00 00 00", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY}, /* 1.13 SET */
      {"01", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"03 02", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY}, /* 1.13 ADD */
      {"06", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"CE F7 85 3C", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
      {"FF", UVCCL__PROTO_OK, UVCCL_DIALECT_LEGACY},
  };
  size_t i;

  for (i = 0; i < UVCCL__ARRAY_SIZE(cases); i++) {
    uint8_t raw[16];
    size_t n = hx(raw, sizeof(raw), cases[i].hex);
    uint8_t *b = n != 0 ? dup_exact(raw, n) : NULL;
    uvccl_dialect_t d = UVCCL_DIALECT_AUTO;
    int rc = uvccl__proto_detect(b, n, &d);
    ok(rc == cases[i].rc && d == cases[i].d, "detect [%s]: rc %d dialect %d",
       cases[i].hex, rc, (int)d);
    free(b);
  }
}

/* ---- opcode tables ------------------------------------------------------- */

static void test_opcodes(void) {
  static const int legacy[UVCCL__OP_COUNT] = {
      [UVCCL__OP_VALIDATE] = -1,   [UVCCL__OP_SET] = 0,
      [UVCCL__OP_COMPARE_SET] = 1, [UVCCL__OP_GET] = 2,
      [UVCCL__OP_ADD] = 3,         [UVCCL__OP_CHECK] = 4,
      [UVCCL__OP_WAIT] = 5,        [UVCCL__OP_GETNUMKEYS] = 6,
      [UVCCL__OP_DELETE_KEY] = 8,  [UVCCL__OP_APPEND] = -1,
      [UVCCL__OP_MULTI_GET] = -1,  [UVCCL__OP_MULTI_SET] = -1,
      [UVCCL__OP_CANCEL_WAIT] = -1, [UVCCL__OP_PING] = -1,
      [UVCCL__OP_QUEUE_PUSH] = -1, [UVCCL__OP_QUEUE_POP] = -1,
      [UVCCL__OP_QUEUE_LEN] = -1,  [UVCCL__OP_LIST_KEYS] = -1,
      [UVCCL__OP_BARRIER] = -1,    [UVCCL__OP_WATCH_KEY] = 7,
  };
  int i, bad_m = 0, bad_l = 0;

  for (i = 0; i < UVCCL__OP_COUNT; i++) {
    int want_m = i <= UVCCL__OP_BARRIER ? i : -1;
    if (uvccl__proto_opcode(UVCCL_DIALECT_MODERN, (uvccl__op_t)i) != want_m)
      bad_m++;
    if (uvccl__proto_opcode(UVCCL_DIALECT_LEGACY, (uvccl__op_t)i) != legacy[i])
      bad_l++;
  }
  is_int(bad_m, 0, "modern opcodes are the op numbers 0..18, no WATCH_KEY");
  is_int(bad_l, 0, "legacy opcodes as captured from 1.13");
  is_int(uvccl__proto_opcode(UVCCL_DIALECT_AUTO, UVCCL__OP_SET), -1,
         "no opcodes for AUTO");
  is_int(uvccl__proto_opcode(UVCCL_DIALECT_MODERN, UVCCL__OP_COUNT), -1,
         "no opcode past the last op");
}

/* ---- exact bytes --------------------------------------------------------- */

static void enc_is(uvccl_dialect_t d, const uvccl__store_req_t *req,
                   const char *pfx, const char *hex, const char *name) {
  uvccl__obuf_t b = {NULL, 0, 0};
  int rc = uvccl__proto_encode_request(&b, d, req, pfx);
  is_int(rc, 0, "%s: encodes", name);
  is_bytes(b.base, b.len, hex, name);
  uvccl__obuf_free(&b);
}

static void test_exact_bytes(void) {
  static const char *const ab[] = {"a", "b"};
  static const char *const k1[] = {"k"};
  static const uvccl_buf_t xe[] = {{(void *)"x", 1}, {(void *)"", 0}};
  const uvccl_dialect_t M = UVCCL_DIALECT_MODERN, L = UVCCL_DIALECT_LEGACY;
  uvccl__store_req_t r;

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_SET;
  r.key = "k";
  r.value = "v";
  r.value_len = 1;
  enc_is(M, &r, "/", "01 | " Q("02") " | 2F 6B | " Q("01") " | 76",
         "modern set(k, v), notes §1.3");
  enc_is(L, &r, "/", "00 | " Q("02") " | 2F 6B | " Q("01") " | 76",
         "legacy set(k, v), notes §2");
  enc_is(M, &r, NULL, "01 | " Q("01") " | 6B | " Q("01") " | 76",
         "modern set(k, v) without a prefix");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_ADD;
  r.key = "n";
  r.delta = 3;
  enc_is(L, &r, "/", "03 | " Q("02") " 2F 6E | " Q("03"),
         "legacy add(n, 3), notes §2");
  r.key = "init/";
  r.delta = -1;
  enc_is(M, &r, NULL,
         "04 | " Q("05") " 69 6E 69 74 2F | FF FF FF FF FF FF FF FF",
         "modern add(init/, -1), unprefixed");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_WAIT;
  r.keys = k1;
  r.nkeys = 1;
  enc_is(L, &r, "/", "05 | " Q("01") " | " Q("02") " 2F 6B",
         "legacy get(k) part 1: wait([k])");
  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_GET;
  r.key = "k";
  enc_is(L, &r, "/", "02 | " Q("02") " 2F 6B", "legacy get(k) part 2: get");
  enc_is(M, &r, "/", "03 | " Q("02") " 2F 6B", "modern get(k)");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_GETNUMKEYS;
  enc_is(L, &r, "/", "06", "legacy num_keys()");
  enc_is(M, &r, "/", "07", "modern num_keys()");
  r.op = UVCCL__OP_CANCEL_WAIT;
  enc_is(M, &r, "/", "0C", "modern cancel_wait");
  r.op = UVCCL__OP_LIST_KEYS;
  enc_is(M, &r, "/", "11", "modern list_keys");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_DELETE_KEY;
  r.key = "k";
  enc_is(L, &r, "/", "08 | " Q("02") " 2F 6B", "legacy delete_key(k)");
  enc_is(M, &r, "/", "08 | " Q("02") " 2F 6B", "modern delete_key(k)");
  r.op = UVCCL__OP_WATCH_KEY;
  r.key = "w";
  enc_is(L, &r, "/", "07 | " Q("02") " 2F 77", "legacy watch_key(w)");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_VALIDATE;
  enc_is(M, &r, "/", "00 CE F7 85 3C", "modern validate");
  r.op = UVCCL__OP_PING;
  r.delta = 0x7701020304LL; /* truncated to the u32 nonce */
  enc_is(M, &r, "/", "0D 04 03 02 01", "modern ping(nonce)");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_MULTI_SET;
  r.keys = ab;
  r.values = xe;
  r.nkeys = 2;
  enc_is(M, &r, NULL,
         "0B | " Q("02") " | " Q("01") " 61 | " Q("01") " 78 | " Q("01")
         " 62 | " Q("00"),
         "modern multi_set([a, b], [x, ''])");
  enc_is(M, &r, "/",
         "0B | " Q("02") " | " Q("02") " 2F 61 | " Q("01") " 78 | " Q("02")
         " 2F 62 | " Q("00"),
         "modern multi_set: the prefix goes on every key");
  r.op = UVCCL__OP_CHECK;
  enc_is(M, &r, "/",
         "05 | " Q("02") " | " Q("02") " 2F 61 | " Q("02") " 2F 62",
         "modern check([a, b])");
  r.op = UVCCL__OP_MULTI_GET;
  enc_is(M, &r, "/",
         "0A | " Q("02") " | " Q("02") " 2F 61 | " Q("02") " 2F 62",
         "modern multi_get([a, b])");
  r.op = UVCCL__OP_WAIT;
  r.nkeys = 0;
  enc_is(M, &r, "/", "06 | " Q("00"), "modern wait([])");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_COMPARE_SET;
  r.key = "k";
  r.expected = "";
  r.value = "Y";
  r.value_len = 1;
  enc_is(M, &r, "/", "02 | " Q("02") " 2F 6B | " Q("00") " | " Q("01") " 59",
         "modern compare_set(k, '', Y)");
  enc_is(L, &r, "/", "01 | " Q("02") " 2F 6B | " Q("00") " | " Q("01") " 59",
         "legacy compare_set(k, '', Y)");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_BARRIER;
  r.key = "b";
  r.delta = 4;
  enc_is(M, &r, NULL, "12 | " Q("01") " 62 | " Q("04"), "modern barrier(b, 4)");

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_QUEUE_POP;
  r.key = "q";
  r.block = 1;
  enc_is(M, &r, "/", "0F | " Q("02") " 2F 71",
         "modern queue_pop(block): only the pop (the WAIT goes separately)");
  r.op = UVCCL__OP_QUEUE_LEN;
  enc_is(M, &r, "/", "10 | " Q("02") " 2F 71", "modern queue_len(q)");
  r.op = UVCCL__OP_QUEUE_PUSH;
  r.value = "it";
  r.value_len = 2;
  enc_is(M, &r, "/", "0E | " Q("02") " 2F 71 | " Q("02") " 69 74",
         "modern queue_push(q, it)");
  r.op = UVCCL__OP_APPEND;
  enc_is(M, &r, "/", "09 | " Q("02") " 2F 71 | " Q("02") " 69 74",
         "modern append(q, it)");
}

static void test_encode_errors(void) {
  static const uvccl__op_t legacy_lacks[] = {
      UVCCL__OP_VALIDATE,   UVCCL__OP_APPEND,      UVCCL__OP_MULTI_GET,
      UVCCL__OP_MULTI_SET,  UVCCL__OP_CANCEL_WAIT, UVCCL__OP_PING,
      UVCCL__OP_QUEUE_PUSH, UVCCL__OP_QUEUE_POP,   UVCCL__OP_QUEUE_LEN,
      UVCCL__OP_LIST_KEYS,  UVCCL__OP_BARRIER,
  };
  static const char *const bad_keys[] = {"a", NULL};
  uvccl__obuf_t b = {NULL, 0, 0};
  uvccl__store_req_t r;
  size_t i;
  int bad = 0, rc;

  memset(&r, 0, sizeof(r));
  r.op = UVCCL__OP_SET;
  r.key = "k";
  rc = uvccl__proto_encode_request(&b, UVCCL_DIALECT_MODERN, &r, "/");
  tap_require(rc == 0 && b.len == 19, "set(k, '') encodes to 19 bytes");

  for (i = 0; i < UVCCL__ARRAY_SIZE(legacy_lacks); i++) {
    r.op = legacy_lacks[i];
    r.key = "k";
    if (uvccl__proto_encode_request(&b, UVCCL_DIALECT_LEGACY, &r, "/") !=
            UVCCL_ENOTSUP ||
        b.len != 19)
      bad++;
  }
  is_int(bad, 0, "legacy lacks the newer ops: ENOTSUP, buffer untouched");
  r.op = UVCCL__OP_WATCH_KEY;
  is_int(uvccl__proto_encode_request(&b, UVCCL_DIALECT_MODERN, &r, "/"),
         UVCCL_ENOTSUP, "modern lacks WATCH_KEY");
  r.op = UVCCL__OP_SET;
  is_int(uvccl__proto_encode_request(&b, UVCCL_DIALECT_AUTO, &r, "/"),
         UVCCL_ENOTSUP, "AUTO is no dialect to encode in");

  r.op = UVCCL__OP_GET;
  r.key = NULL;
  is_int(uvccl__proto_encode_request(&b, UVCCL_DIALECT_MODERN, &r, "/"),
         UV_EINVAL, "a NULL key is EINVAL");
  r.op = UVCCL__OP_CHECK;
  r.keys = bad_keys;
  r.nkeys = 2;
  is_int(uvccl__proto_encode_request(&b, UVCCL_DIALECT_MODERN, &r, "/"),
         UV_EINVAL, "a NULL key inside a list is EINVAL");
  is_int(b.len, 19, "a failed encode leaves no partial request behind");
  is_bytes(b.base, b.len, "01 | " Q("02") " 2F 6B | " Q("00"),
           "and the earlier request is intact");
  uvccl__obuf_free(&b);
}

/* ---- obuf ---------------------------------------------------------------- */

static void test_obuf(void) {
  uvccl__obuf_t b = {NULL, 0, 0};
  uint8_t *big;
  size_t i;
  int rc = 0;

  rc |= uvccl__obuf_u8(&b, 0xAB);
  rc |= uvccl__obuf_u32(&b, 0x11223344u);
  rc |= uvccl__obuf_i64(&b, -2);
  rc |= uvccl__obuf_bytes(&b, "xy", 2);
  rc |= uvccl__obuf_bytes(&b, NULL, 0);
  rc |= uvccl__obuf_str(&b, "abc", 3);
  rc |= uvccl__obuf_str(&b, NULL, 0);
  is_int(rc, 0, "obuf appends succeed");
  is_bytes(b.base, b.len,
           "AB | 44 33 22 11 | FE FF FF FF FF FF FF FF | 78 79 | " Q("03")
           " 61 62 63 | " Q("00"),
           "obuf: u8, u32 and i64 little-endian, bytes, length-prefixed str");

  is_int(uvccl__obuf_reserve(&b, SIZE_MAX), UV_ENOMEM,
         "reserving SIZE_MAX more fails cleanly");
  is_int(uvccl__obuf_reserve(&b, SIZE_MAX - b.len + 1), UV_ENOMEM,
         "a reservation that would wrap fails cleanly");
  is_int(b.len, 34, "and leaves the contents alone");

  big = malloc(300000);
  for (i = 0; i < 300000; i++) big[i] = (uint8_t)(i * 7);
  rc = uvccl__obuf_bytes(&b, big, 300000);
  ok(rc == 0 && b.len == 300034 && b.cap >= b.len &&
         memcmp(b.base + 34, big, 300000) == 0 && b.base[0] == 0xAB,
     "obuf grows past 300 KB and keeps its bytes");
  free(big);
  uvccl__obuf_free(&b);
  ok(b.base == NULL && b.len == 0 && b.cap == 0, "obuf_free resets it");
  uvccl__obuf_free(&b);
  ok(1, "obuf_free twice is harmless");
}

/* ---- round trips --------------------------------------------------------- */

static const char *const keys3[] = {"a", "bb", ""};
static const uvccl_buf_t vals3[] = {
    {(void *)"x", 1}, {(void *)"", 0}, {(void *)"zzz", 3}};

typedef struct {
  const char *name;
  uvccl__store_req_t req;
} rt_case_t;

static const rt_case_t rt_cases[] = {
    {"validate", {.op = UVCCL__OP_VALIDATE}},
    {"ping", {.op = UVCCL__OP_PING, .delta = 0x1234567890LL}},
    {"set", {.op = UVCCL__OP_SET, .key = "k", .value = "v", .value_len = 1}},
    {"set empty", {.op = UVCCL__OP_SET, .key = "", .value = ""}},
    {"compare_set",
     {.op = UVCCL__OP_COMPARE_SET, .key = "k", .expected = "old",
      .expected_len = 3, .value = "newer", .value_len = 5}},
    {"get", {.op = UVCCL__OP_GET, .key = "key"}},
    {"add", {.op = UVCCL__OP_ADD, .key = "n", .delta = -5}},
    {"add max", {.op = UVCCL__OP_ADD, .key = "n", .delta = INT64_MAX}},
    {"check", {.op = UVCCL__OP_CHECK, .keys = keys3, .nkeys = 3}},
    {"wait", {.op = UVCCL__OP_WAIT, .keys = keys3, .nkeys = 2}},
    {"wait none", {.op = UVCCL__OP_WAIT, .keys = NULL, .nkeys = 0}},
    {"num_keys", {.op = UVCCL__OP_GETNUMKEYS}},
    {"delete_key", {.op = UVCCL__OP_DELETE_KEY, .key = "d"}},
    {"append",
     {.op = UVCCL__OP_APPEND, .key = "a", .value = "tail", .value_len = 4}},
    {"multi_get", {.op = UVCCL__OP_MULTI_GET, .keys = keys3, .nkeys = 3}},
    {"multi_set",
     {.op = UVCCL__OP_MULTI_SET, .keys = keys3, .values = vals3, .nkeys = 3}},
    {"multi_set none", {.op = UVCCL__OP_MULTI_SET, .nkeys = 0}},
    {"cancel_wait", {.op = UVCCL__OP_CANCEL_WAIT}},
    {"queue_push",
     {.op = UVCCL__OP_QUEUE_PUSH, .key = "q", .value = "item", .value_len = 4}},
    {"queue_pop", {.op = UVCCL__OP_QUEUE_POP, .key = "q", .block = 1}},
    {"queue_len", {.op = UVCCL__OP_QUEUE_LEN, .key = "q"}},
    {"list_keys", {.op = UVCCL__OP_LIST_KEYS}},
    {"barrier", {.op = UVCCL__OP_BARRIER, .key = "bar", .delta = 4}},
    {"watch_key", {.op = UVCCL__OP_WATCH_KEY, .key = "w"}},
};

static int has_key(uvccl__op_t op) {
  switch (op) {
  case UVCCL__OP_SET: case UVCCL__OP_COMPARE_SET: case UVCCL__OP_GET:
  case UVCCL__OP_ADD: case UVCCL__OP_DELETE_KEY: case UVCCL__OP_APPEND:
  case UVCCL__OP_QUEUE_PUSH: case UVCCL__OP_QUEUE_POP:
  case UVCCL__OP_QUEUE_LEN: case UVCCL__OP_BARRIER: case UVCCL__OP_WATCH_KEY:
    return 1;
  default:
    return 0;
  }
}

static int has_list(uvccl__op_t op) {
  return op == UVCCL__OP_CHECK || op == UVCCL__OP_WAIT ||
         op == UVCCL__OP_MULTI_GET || op == UVCCL__OP_MULTI_SET;
}

/* The first way the parsed request differs from what was encoded, or NULL. */
static const char *req_mismatch(const uvccl__store_req_t *w, const char *pfx,
                                const uvccl__proto_req_t *g) {
  const uint8_t *k, *v;
  size_t kl, vl, i;
  uvccl__proto_iter_t it;

  if (g->op != w->op) return "op";
  if (has_key(w->op)) {
    if (!mem_eq(g->key, g->key_len, pfx, w->key)) return "key";
  } else if (g->key != NULL || g->key_len != 0) {
    return "stray key";
  }
  switch (w->op) {
  case UVCCL__OP_SET: case UVCCL__OP_APPEND: case UVCCL__OP_QUEUE_PUSH:
  case UVCCL__OP_COMPARE_SET:
    if (g->val_len != w->value_len ||
        (w->value_len != 0 && memcmp(g->val, w->value, w->value_len) != 0))
      return "value";
    if (g->exp_len != w->expected_len ||
        (w->expected_len != 0 &&
         memcmp(g->exp, w->expected, w->expected_len) != 0))
      return "expected";
    break;
  case UVCCL__OP_ADD: case UVCCL__OP_BARRIER:
    if (g->i64 != w->delta) return "i64";
    break;
  case UVCCL__OP_VALIDATE:
    if (g->u32 != UVCCL__MAGIC) return "magic";
    break;
  case UVCCL__OP_PING:
    if (g->u32 != (uint32_t)w->delta) return "nonce";
    break;
  default:
    break;
  }
  if (!has_list(w->op)) return g->nkeys == 0 && g->keys.left == 0 ? NULL
                                                                  : "stray list";
  if (g->nkeys != w->nkeys || g->keys.left != w->nkeys) return "nkeys";
  if (g->keys.pairs != (w->op == UVCCL__OP_MULTI_SET)) return "pairs";
  it = g->keys;
  for (i = 0; i < w->nkeys; i++) {
    if (!uvccl__proto_iter_next(&it, &k, &kl, &v, &vl)) return "list short";
    if (!mem_eq(k, kl, pfx, w->keys[i])) return "list key";
    if (w->op == UVCCL__OP_MULTI_SET) {
      if (vl != w->values[i].len ||
          (vl != 0 && memcmp(v, w->values[i].base, vl) != 0))
        return "list value";
    } else if (v != NULL || vl != 0) {
      return "list value set";
    }
  }
  if (uvccl__proto_iter_next(&it, &k, &kl, &v, &vl)) return "list long";
  return NULL;
}

/* Feeds a request one byte at a time: every proper prefix must be
 * NEED_MORE with a lower bound that is past the prefix and not past the
 * whole; the whole must parse with consumed == its length. Each prefix is
 * its own heap block, so a read past it is an ASan error. */
static int feed_bytewise(uvccl_dialect_t d, const uint8_t *p, size_t n,
                         const uvccl__proto_limits_t *lim, const char *name) {
  uvccl__proto_req_t req;
  size_t i, consumed;
  int rc, bad = 0;

  for (i = 0; i < n; i++) {
    uint8_t *b = i != 0 ? dup_exact(p, i) : NULL;
    rc = uvccl__proto_parse_request(d, b, i, lim, &req, &consumed);
    if (rc != UVCCL__PROTO_NEED_MORE || consumed <= i || consumed > n) {
      if (bad++ == 0)
        note("%s: prefix %zu of %zu: rc %d consumed %zu", name, i, n, rc,
             consumed);
    }
    free(b);
  }
  return bad;
}

static void test_round_trips(uvccl_dialect_t d, const char *dname) {
  size_t i;

  for (i = 0; i < UVCCL__ARRAY_SIZE(rt_cases); i++) {
    const rt_case_t *c = &rt_cases[i];
    uvccl__obuf_t b = {NULL, 0, 0};
    uvccl__proto_req_t req;
    const char *why;
    uint8_t *exact;
    size_t consumed;
    int code = uvccl__proto_opcode(d, c->req.op);
    int rc = uvccl__proto_encode_request(&b, d, &c->req, "/");

    if (code < 0) {
      ok(rc == UVCCL_ENOTSUP && b.len == 0, "%s %s: not in this dialect",
         dname, c->name);
      uvccl__obuf_free(&b);
      continue;
    }
    tap_require(rc == 0 && b.len > 0 && b.base[0] == code,
                "%s %s: encodes with opcode %d", dname, c->name, code);
    exact = dup_exact(b.base, b.len);
    rc = uvccl__proto_parse_request(d, exact, b.len, NULL, &req, &consumed);
    why = rc == UVCCL__PROTO_OK ? req_mismatch(&c->req, "/", &req) : "rc";
    ok(rc == UVCCL__PROTO_OK && consumed == b.len && why == NULL,
       "%s %s: parses back (%zu bytes)%s%s", dname, c->name, b.len,
       why ? ", mismatch: " : "", why ? why : "");
    is_int(feed_bytewise(d, exact, b.len, NULL, c->name), 0,
           "%s %s: every proper prefix is NEED_MORE with a sound bound", dname,
           c->name);
    free(exact);
    uvccl__obuf_free(&b);
  }
}

/* ---- pipelining ---------------------------------------------------------- */

static void test_pipelined(uvccl_dialect_t d, const char *dname) {
  static const uvccl__op_t seq[] = {
      UVCCL__OP_VALIDATE, UVCCL__OP_PING,      UVCCL__OP_SET,
      UVCCL__OP_ADD,      UVCCL__OP_WAIT,      UVCCL__OP_GET,
      UVCCL__OP_MULTI_SET, UVCCL__OP_CHECK,    UVCCL__OP_GETNUMKEYS,
      UVCCL__OP_COMPARE_SET, UVCCL__OP_DELETE_KEY, UVCCL__OP_CANCEL_WAIT,
      UVCCL__OP_SET,
  };
  uvccl__obuf_t b = {NULL, 0, 0};
  uvccl__op_t want[32], got[32];
  size_t nwant = 0, ngot = 0, i, j, off = 0, consumed, last_start = 0;
  uint8_t *exact;
  int rc = 0, bad = 0;

  for (i = 0; i < UVCCL__ARRAY_SIZE(seq); i++) {
    for (j = 0; j < UVCCL__ARRAY_SIZE(rt_cases); j++)
      if (rt_cases[j].req.op == seq[i]) break;
    if (uvccl__proto_opcode(d, seq[i]) < 0) continue;
    last_start = b.len;
    rc |= uvccl__proto_encode_request(&b, d, &rt_cases[j].req, "/");
    want[nwant++] = seq[i];
  }
  /* Cut the last request (a SET) short by its last byte. */
  b.len -= 1;
  tap_require(rc == 0, "%s: pipeline encodes", dname);
  exact = dup_exact(b.base, b.len);

  for (;;) {
    uvccl__proto_req_t req;
    rc = uvccl__proto_parse_request(d, exact + off, b.len - off, NULL, &req,
                                    &consumed);
    if (rc != UVCCL__PROTO_OK) break;
    if (ngot < UVCCL__ARRAY_SIZE(got)) got[ngot++] = req.op;
    for (j = 0; j < UVCCL__ARRAY_SIZE(rt_cases); j++)
      if (rt_cases[j].req.op == req.op) break;
    if (req_mismatch(&rt_cases[j].req, "/", &req) != NULL) bad++;
    off += consumed;
  }
  is_int(ngot, nwant - 1, "%s: all whole requests of the pipeline parse",
         dname);
  ok(memcmp(got, want, ngot * sizeof(got[0])) == 0 && bad == 0,
     "%s: in order, with their fields", dname);
  is_int(off, last_start, "%s: they consume exactly their bytes", dname);
  ok(rc == UVCCL__PROTO_NEED_MORE && consumed == b.len - off + 1,
     "%s: the cut-off SET is NEED_MORE, needing exactly its missing byte "
     "(rc %d, consumed %zu)", dname, rc, consumed);
  free(exact);
  uvccl__obuf_free(&b);
}

/* ---- bad input ----------------------------------------------------------- */

static int parse_hex(uvccl_dialect_t d, const char *hex,
                     const uvccl__proto_limits_t *lim, size_t *consumed) {
  uint8_t raw[256];
  uvccl__proto_req_t req;
  size_t n = hx(raw, sizeof(raw), hex);
  uint8_t *b = dup_exact(raw, n);
  int rc = uvccl__proto_parse_request(d, b, n, lim, &req, consumed);
  free(b);
  return rc;
}

static void test_unknown_opcodes(void) {
  const uvccl_dialect_t M = UVCCL_DIALECT_MODERN, L = UVCCL_DIALECT_LEGACY;
  uvccl__proto_req_t req;
  size_t consumed;
  uint8_t c;
  int bad = 0, code;

  for (code = 19; code <= 255; code++) {
    c = (uint8_t)code;
    if (uvccl__proto_parse_request(M, &c, 1, NULL, &req, &consumed) !=
        UVCCL_EPROTO)
      bad++;
  }
  is_int(bad, 0, "modern opcodes 19..255 are EPROTO at the first byte");
  bad = 0;
  for (code = 9; code <= 255; code++) {
    c = (uint8_t)code;
    if (uvccl__proto_parse_request(L, &c, 1, NULL, &req, &consumed) !=
        UVCCL_EPROTO)
      bad++;
  }
  is_int(bad, 0, "legacy opcodes 9..255 are EPROTO (1.13 resets on 9)");
  c = 7;
  is_int(uvccl__proto_parse_request(L, &c, 1, NULL, &req, &consumed),
         UVCCL__PROTO_NEED_MORE, "legacy 7 is WATCH_KEY, waiting for its key");
  is_int(consumed, 9, "which needs at least 9 bytes");
  is_int(uvccl__proto_parse_request(UVCCL_DIALECT_AUTO, &c, 1, NULL, &req,
                                    &consumed),
         UV_EINVAL, "parsing needs a dialect");
  is_int(parse_hex(L, "07 " Q("01") " 77", NULL, &consumed), UVCCL__PROTO_OK,
         "legacy watch_key(w) parses");
}

static void test_need_more_bounds(void) {
  const uvccl_dialect_t M = UVCCL_DIALECT_MODERN, L = UVCCL_DIALECT_LEGACY;
  uvccl__proto_req_t req;
  size_t consumed;

  is_int(uvccl__proto_parse_request(M, NULL, 0, NULL, &req, &consumed),
         UVCCL__PROTO_NEED_MORE, "nothing buffered: NEED_MORE");
  is_int(consumed, 1, "for at least the opcode");
  parse_hex(L, "00", NULL, &consumed);
  is_int(consumed, 17, "1.13 SET opcode alone (as 1.13 sends it): needs 17");
  parse_hex(M, "02", NULL, &consumed);
  is_int(consumed, 25, "COMPARE_SET opcode alone needs 25");
  parse_hex(M, "04 " Q("02") " 2F", NULL, &consumed);
  is_int(consumed, 19, "ADD inside its key needs 9 + 2 + 8");
  parse_hex(M, "05 " Q("03"), NULL, &consumed);
  is_int(consumed, 33, "CHECK of 3 keys needs 9 + 3 x 8 before any key");
  parse_hex(M, "05 " Q("03") Q("04") "61", NULL, &consumed);
  is_int(consumed, 37, "CHECK inside the first of 3 keys needs 9+12+16");
  parse_hex(M, "0B " Q("02"), NULL, &consumed);
  is_int(consumed, 41, "MULTI_SET of 2 pairs needs 9 + 2 x 16");
  parse_hex(M, "0B " Q("02") Q("01") "61", NULL, &consumed);
  is_int(consumed, 42, "MULTI_SET after its first key needs 18 + 8 + 16");
  parse_hex(M, "0B " Q("02") Q("01") "61" Q("05"), NULL, &consumed);
  is_int(consumed, 47, "MULTI_SET inside its first value needs 26 + 5 + 16");
  is_int(parse_hex(M, "01 " Q("00") Q("00"), NULL, &consumed),
         UVCCL__PROTO_OK, "SET of an empty key to an empty value parses");
  is_int(consumed, 17, "in 17 bytes");
}

static void test_limits(void) {
  const uvccl_dialect_t M = UVCCL_DIALECT_MODERN, L = UVCCL_DIALECT_LEGACY;
  static const char *const huge[] = {
      "FF FF FF FF FF FF FF FF", /* UINT64_MAX = 2^64 - 1 */
      "00 00 00 00 00 00 00 80", /* 2^63 */
      "FF FF FF FF FF FF FF 7F", /* 2^63 - 1 */
      "00 00 00 00 00 00 00 10", /* 2^60 */
      "01 20 00 00 00 00 00 00", /* 8 KiB + 1 */
  };
  const uvccl__proto_limits_t nolim = {SIZE_MAX, SIZE_MAX, SIZE_MAX};
  char hex[256];
  size_t consumed, i;
  int bad;

  /* A length field arriving with nothing after it must be judged on its
   * own: the heap block ends right there. */
  for (i = 0; i < UVCCL__ARRAY_SIZE(huge); i++) {
    snprintf(hex, sizeof(hex), "01 %s", huge[i]);
    is_int(parse_hex(M, hex, NULL, &consumed), UVCCL_ELIMIT,
           "SET key length %s: ELIMIT from the length alone", huge[i]);
    snprintf(hex, sizeof(hex), "02 %s", huge[i]);
    is_int(parse_hex(L, hex, NULL, &consumed), UVCCL_ELIMIT,
           "legacy GET key length %s: ELIMIT", huge[i]);
    /* 8 KiB + 1 is a fine value length and key count. */
    if (i == UVCCL__ARRAY_SIZE(huge) - 1) continue;
    snprintf(hex, sizeof(hex), "05 %s", huge[i]);
    is_int(parse_hex(M, hex, NULL, &consumed), UVCCL_ELIMIT,
           "CHECK key count %s: ELIMIT from the count alone", huge[i]);
    snprintf(hex, sizeof(hex), "0A %s", huge[i]);
    is_int(parse_hex(M, hex, NULL, &consumed), UVCCL_ELIMIT,
           "MULTI_GET key count %s: ELIMIT", huge[i]);
    snprintf(hex, sizeof(hex), "01 " Q("01") " 6B %s", huge[i]);
    is_int(parse_hex(M, hex, NULL, &consumed), UVCCL_ELIMIT,
           "SET value length %s: ELIMIT", huge[i]);
  }
  is_int(parse_hex(M, "0B FF FF FF FF FF FF FF FF", NULL, &consumed),
         UVCCL_EPROTO, "MULTI_SET count -1 (2^64 - 1 as u64): EPROTO");
  is_int(parse_hex(M, "0B 00 00 00 00 00 00 00 80", NULL, &consumed),
         UVCCL_EPROTO, "MULTI_SET count INT64_MIN: EPROTO");
  is_int(parse_hex(M, "0B FF FF FF FF FF FF FF 7F", NULL, &consumed),
         UVCCL_ELIMIT, "MULTI_SET count 2^63 - 1: ELIMIT");
  is_int(parse_hex(L, "00 CE F7 85 3C 00 00 00 00", NULL, &consumed),
         UVCCL_ELIMIT, "a VALIDATE sent to a 1.13 parser: a ~1 GB key, ELIMIT");

  /* With no limits at all, the sizes must saturate rather than wrap. */
  is_int(parse_hex(M, "01 FF FF FF FF FF FF FF FF", &nolim, &consumed),
         UVCCL__PROTO_NEED_MORE, "unlimited: a 2^64 - 1 key is NEED_MORE");
  ok(consumed == SIZE_MAX, "and the bound saturates at SIZE_MAX (%zu)",
     consumed);
  is_int(parse_hex(M, "01 00 00 00 00 00 00 00 40", &nolim, &consumed),
         UVCCL__PROTO_NEED_MORE, "unlimited: a 2^62 key is NEED_MORE");
  ok(consumed == 9 + ((size_t)1 << 62) + 8,
     "needing 9 + 2^62 + 8 bytes exactly (%zu)", consumed);
  is_int(parse_hex(M, "05 FF FF FF FF FF FF FF FF", &nolim, &consumed),
         UVCCL__PROTO_NEED_MORE, "unlimited: 2^64 - 1 keys is NEED_MORE");
  ok(consumed == SIZE_MAX, "with a saturated bound");
  is_int(parse_hex(M, "0B FF FF FF FF FF FF FF 7F", &nolim, &consumed),
         UVCCL__PROTO_NEED_MORE, "unlimited: 2^63 - 1 pairs is NEED_MORE");
  ok(consumed == SIZE_MAX, "with a saturated bound");

  /* Defaults: 8 KiB keys, 8 MiB values, 128 Ki keys; 0 means default. */
  {
    const uvccl__proto_limits_t zero = {0, 0, 0};
    is_int(parse_hex(M, "03 00 20 00 00 00 00 00 00", &zero, &consumed),
           UVCCL__PROTO_NEED_MORE, "default limits: an 8 KiB key is fine");
    is_int(consumed, 9 + 8192, "and awaited in full");
    is_int(parse_hex(M, "03 01 20 00 00 00 00 00 00", &zero, &consumed),
           UVCCL_ELIMIT, "8 KiB + 1 is ELIMIT");
    is_int(parse_hex(M, "01 " Q("00") " 00 00 80 00 00 00 00 00", &zero,
                     &consumed),
           UVCCL__PROTO_NEED_MORE, "an 8 MiB value is fine");
    is_int(parse_hex(M, "01 " Q("00") " 01 00 80 00 00 00 00 00", &zero,
                     &consumed),
           UVCCL_ELIMIT, "8 MiB + 1 is ELIMIT");
    is_int(parse_hex(M, "05 00 00 02 00 00 00 00 00", &zero, &consumed),
           UVCCL__PROTO_NEED_MORE, "128 Ki keys are fine");
    is_int(consumed, 9 + 8 * 131072, "needing 8 bytes each at least");
    is_int(parse_hex(M, "05 01 00 02 00 00 00 00 00", &zero, &consumed),
           UVCCL_ELIMIT, "128 Ki + 1 keys is ELIMIT");
    is_int(parse_hex(M, "0B 01 00 02 00 00 00 00 00", &zero, &consumed),
           UVCCL_ELIMIT, "128 Ki + 1 MULTI_SET pairs is ELIMIT");
  }

  /* Small limits: key 4, value 8, keys 2. Every string is checked. */
  is_int(parse_hex(M, "03 " Q("04") " 61 62 63 64", &small_lim, &consumed),
         UVCCL__PROTO_OK, "small limits: a 4-byte key parses");
  is_int(parse_hex(M, "03 " Q("05"), &small_lim, &consumed), UVCCL_ELIMIT,
         "a 5-byte key is ELIMIT");
  is_int(parse_hex(M, "05 " Q("02") Q("01") "61" Q("05"), &small_lim,
                   &consumed),
         UVCCL_ELIMIT, "a 5-byte second key of a CHECK is ELIMIT");
  is_int(parse_hex(M, "06 " Q("03"), &small_lim, &consumed), UVCCL_ELIMIT,
         "3 keys in a WAIT is ELIMIT");
  is_int(parse_hex(M, "0B " Q("01") Q("01") "61" Q("09"), &small_lim,
                   &consumed),
         UVCCL_ELIMIT, "a 9-byte MULTI_SET value is ELIMIT");
  is_int(parse_hex(M, "0B " Q("01") Q("05"), &small_lim, &consumed),
         UVCCL_ELIMIT, "a 5-byte MULTI_SET key is ELIMIT");
  is_int(parse_hex(M, "02 " Q("01") "61" Q("09"), &small_lim, &consumed),
         UVCCL_ELIMIT, "a 9-byte COMPARE_SET expected value is ELIMIT");
  is_int(parse_hex(M, "02 " Q("01") "61" Q("00") Q("09"), &small_lim,
                   &consumed),
         UVCCL_ELIMIT, "a 9-byte COMPARE_SET desired value is ELIMIT");
  is_int(parse_hex(M, "0E " Q("01") "61" Q("09"), &small_lim, &consumed),
         UVCCL_ELIMIT, "a 9-byte QUEUE_PUSH is ELIMIT");
  is_int(parse_hex(M, "09 " Q("01") "61" Q("08") "0102030405060708",
                   &small_lim, &consumed),
         UVCCL__PROTO_OK, "an 8-byte APPEND is fine");

  /* Every request of the round trips, fed bytewise under small limits
   * where it fits them. */
  bad = 0;
  for (i = 0; i < UVCCL__ARRAY_SIZE(rt_cases); i++) {
    uvccl__obuf_t b = {NULL, 0, 0};
    uvccl__proto_req_t req;
    uvccl__proto_limits_t big = {64, 64, 8};
    uint8_t *exact;
    if (uvccl__proto_opcode(M, rt_cases[i].req.op) < 0) continue;
    if (uvccl__proto_encode_request(&b, M, &rt_cases[i].req, "/") != 0) bad++;
    exact = dup_exact(b.base, b.len);
    bad += feed_bytewise(M, exact, b.len, &big, rt_cases[i].name);
    if (uvccl__proto_parse_request(M, exact, b.len, &big, &req, &consumed) !=
            UVCCL__PROTO_OK ||
        consumed != b.len)
      bad++;
    free(exact);
    uvccl__obuf_free(&b);
  }
  is_int(bad, 0, "every request feeds bytewise under custom limits too");
}

static void test_iterators(void) {
  uint8_t raw[256];
  uvccl__proto_req_t req;
  const uint8_t *k, *v;
  size_t n, consumed, kl, vl;
  uint8_t *b;
  int rc;

  n = hx(raw, sizeof(raw),
         "0B " Q("03") Q("01") "61" Q("02") "7A 7A" Q("00") Q("00")
         Q("03") "63 63 63" Q("01") "00");
  b = dup_exact(raw, n);
  rc = uvccl__proto_parse_request(UVCCL_DIALECT_MODERN, b, n, NULL, &req,
                                  &consumed);
  ok(rc == UVCCL__PROTO_OK && consumed == n && req.nkeys == 3 &&
         req.keys.pairs == 1,
     "MULTI_SET of 3 pairs parses");
  ok(uvccl__proto_iter_next(&req.keys, &k, &kl, &v, &vl) && kl == 1 &&
         k[0] == 'a' && vl == 2 && memcmp(v, "zz", 2) == 0,
     "pair 1: a = zz");
  ok(uvccl__proto_iter_next(&req.keys, &k, &kl, &v, &vl) && kl == 0 &&
         vl == 0 && k == b + 9 + 8 + 1 + 8 + 2 + 8,
     "pair 2: empty key, empty value, pointing into the buffer");
  ok(uvccl__proto_iter_next(&req.keys, &k, &kl, &v, &vl) && kl == 3 &&
         memcmp(k, "ccc", 3) == 0 && vl == 1 && v[0] == 0,
     "pair 3: ccc = NUL byte");
  ok(!uvccl__proto_iter_next(&req.keys, &k, &kl, &v, &vl) &&
         req.keys.left == 0,
     "then the walk ends");
  free(b);

  n = hx(raw, sizeof(raw), "05 " Q("02") Q("01") "61" Q("02") "62 63");
  b = dup_exact(raw, n);
  rc = uvccl__proto_parse_request(UVCCL_DIALECT_LEGACY, b, n, NULL, &req,
                                  &consumed);
  ok(rc == UVCCL__PROTO_OK && req.op == UVCCL__OP_WAIT && req.nkeys == 2,
     "legacy opcode 5 is WAIT, 2 keys");
  ok(uvccl__proto_iter_next(&req.keys, NULL, NULL, NULL, NULL) &&
         uvccl__proto_iter_next(&req.keys, &k, &kl, NULL, NULL) && kl == 2 &&
         memcmp(k, "bc", 2) == 0 &&
         !uvccl__proto_iter_next(&req.keys, NULL, NULL, NULL, NULL),
     "the walk takes NULL outputs; key 2 is bc");
  free(b);
}

/* ---- replies ------------------------------------------------------------- */

static int reply_hex(uvccl__op_t op, size_t nkeys, const char *hex,
                     size_t maxv, uvccl__proto_reply_t *rep, size_t *consumed,
                     uint8_t **keep) {
  uint8_t raw[256];
  size_t n = hx(raw, sizeof(raw), hex), i, c;
  uint8_t *b = n != 0 ? dup_exact(raw, n) : NULL;
  uvccl__proto_reply_t tmp;
  int rc, bad = 0;

  rc = uvccl__proto_parse_reply(op, nkeys, b, n, maxv, rep, consumed);
  /* If it is a whole reply, its every prefix must be NEED_MORE. */
  if (rc == UVCCL__PROTO_OK) {
    for (i = 0; i < *consumed; i++) {
      uint8_t *p = i != 0 ? dup_exact(raw, i) : NULL;
      int prc = uvccl__proto_parse_reply(op, nkeys, p, i, maxv, &tmp, &c);
      if (prc != UVCCL__PROTO_NEED_MORE || c <= i || c > *consumed) bad++;
      free(p);
    }
    if (bad) {
      note("reply [%s]: %d prefixes were not NEED_MORE with a sound bound",
           hex, bad);
      rc = -1;
    }
  }
  *keep = b;
  return rc;
}

static void test_replies(void) {
  uvccl__proto_reply_t r;
  const uint8_t *k;
  size_t c, kl;
  uint8_t *b;
  int rc;

#define REPLY(op, nkeys, hex, maxv) reply_hex(op, nkeys, hex, maxv, &r, &c, &b)

  {
    static const uvccl__op_t none[] = {UVCCL__OP_SET, UVCCL__OP_APPEND,
                                       UVCCL__OP_MULTI_SET,
                                       UVCCL__OP_QUEUE_PUSH,
                                       UVCCL__OP_VALIDATE};
    size_t i;
    int bad = 0;
    for (i = 0; i < UVCCL__ARRAY_SIZE(none); i++) {
      c = 99;
      if (uvccl__proto_parse_reply(none[i], 0, NULL, 0, 0, &r, &c) !=
              UVCCL__PROTO_OK ||
          c != 0)
        bad++;
    }
    is_int(bad, 0, "set, append, multi_set, queue_push, validate: no reply");
  }

  rc = REPLY(UVCCL__OP_GET, 0, Q("01") " 76", 0);
  ok(rc == 0 && c == 9 && r.val_len == 1 && r.val == b + 8 && r.val[0] == 'v',
     "get reply: bytes 'v'");
  free(b);
  rc = REPLY(UVCCL__OP_GET, 0, Q("00") " 99", 0);
  ok(rc == 0 && c == 8 && r.val_len == 0,
     "get reply: empty value (missing key, libuv), the next byte left alone");
  free(b);
  rc = REPLY(UVCCL__OP_COMPARE_SET, 0, Q("03") " 6E 65 77", 0);
  ok(rc == 0 && c == 11 && r.val_len == 3 && memcmp(r.val, "new", 3) == 0,
     "compare_set reply: bytes 'new'");
  free(b);
  rc = REPLY(UVCCL__OP_GET, 0, Q("05"), 4);
  is_int(rc, UVCCL_ELIMIT, "get reply over max_value_len: ELIMIT at once");
  free(b);
  rc = REPLY(UVCCL__OP_GET, 0, "FF FF FF FF FF FF FF FF", 0);
  is_int(rc, UVCCL_ELIMIT, "get reply of 2^64 - 1 bytes: ELIMIT");
  free(b);
  rc = REPLY(UVCCL__OP_GET, 0, Q("04") "61 62 63 64", 4);
  ok(rc == 0 && c == 12, "get reply at max_value_len is fine");
  free(b);

  rc = REPLY(UVCCL__OP_ADD, 0, Q("03"), 0);
  ok(rc == 0 && c == 8 && r.i64 == 3, "add reply: i64 3 (notes §2 trace)");
  free(b);
  rc = REPLY(UVCCL__OP_ADD, 0, "FB FF FF FF FF FF FF FF", 0);
  ok(rc == 0 && r.i64 == -5, "add reply: i64 -5");
  free(b);
  rc = REPLY(UVCCL__OP_GETNUMKEYS, 0, "39 30 00 00 00 00 00 00", 0);
  ok(rc == 0 && r.i64 == 12345, "num_keys reply: 12345");
  free(b);
  rc = REPLY(UVCCL__OP_DELETE_KEY, 0, Q("01"), 0);
  ok(rc == 0 && r.i64 == 1, "delete_key reply: 1");
  free(b);
  rc = REPLY(UVCCL__OP_QUEUE_LEN, 0, Q("07"), 0);
  ok(rc == 0 && r.i64 == 7, "queue_len reply: 7");
  free(b);

  rc = REPLY(UVCCL__OP_CHECK, 0, "01", 0);
  ok(rc == 0 && c == 1 && r.u8 == UVCCL__CHECK_NOT_READY, "check: NOT_READY");
  free(b);
  rc = REPLY(UVCCL__OP_WAIT, 0, "00 01", 0);
  ok(rc == 0 && c == 1 && r.u8 == UVCCL__WAIT_STOP_WAITING,
     "wait: STOP_WAITING, one byte only (a cancel race sends two)");
  free(b);
  rc = REPLY(UVCCL__OP_CANCEL_WAIT, 0, "01", 0);
  ok(rc == 0 && r.u8 == UVCCL__WAIT_CANCELED, "cancel_wait: WAIT_CANCELED");
  free(b);
  rc = REPLY(UVCCL__OP_BARRIER, 0, "00", 0);
  ok(rc == 0 && c == 1 && r.u8 == 0, "barrier: STOP_WAITING");
  free(b);
  rc = REPLY(UVCCL__OP_WATCH_KEY, 0, "03", 0);
  ok(rc == 0 && r.u8 == UVCCL__WATCH_REGISTERED, "watch_key: REGISTERED");
  free(b);
  rc = REPLY(UVCCL__OP_PING, 0, "04 03 02 01", 0);
  ok(rc == 0 && c == 4 && r.u32 == 0x01020304u, "ping: the nonce echoed");
  free(b);

  rc = REPLY(UVCCL__OP_QUEUE_POP, 0, Q("00"), 0);
  ok(rc == 0 && c == 8 && r.i64 == 0 && r.val == NULL,
     "queue_pop of an empty queue: length 0 and no value");
  free(b);
  rc = REPLY(UVCCL__OP_QUEUE_POP, 0, Q("02") Q("03") "61 62 63", 0);
  ok(rc == 0 && c == 19 && r.i64 == 2 && r.val_len == 3 &&
         memcmp(r.val, "abc", 3) == 0,
     "queue_pop: length 2 before, value abc");
  free(b);
  rc = REPLY(UVCCL__OP_QUEUE_POP, 0, "FF FF FF FF FF FF FF FF", 0);
  is_int(rc, UVCCL_EPROTO, "queue_pop: a negative length is EPROTO");
  free(b);

  rc = REPLY(UVCCL__OP_MULTI_GET, 3, Q("01") "61" Q("00") Q("02") "62 63", 0);
  ok(rc == 0 && c == 27 && r.count == 3 && r.list.left == 3,
     "multi_get of 3: three values");
  ok(uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL) && kl == 1 &&
         k[0] == 'a' &&
         uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL) && kl == 0 &&
         uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL) && kl == 2 &&
         memcmp(k, "bc", 2) == 0 &&
         !uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL),
     "walked: a, '', bc");
  free(b);
  rc = REPLY(UVCCL__OP_MULTI_GET, 0, "", 0);
  ok(rc == 0 && c == 0 && r.count == 0, "multi_get of 0 keys: nothing");
  free(b);
  rc = REPLY(UVCCL__OP_MULTI_GET, 2, Q("01") "61" Q("09"), 8);
  is_int(rc, UVCCL_ELIMIT, "multi_get value over the limit: ELIMIT");
  free(b);

  rc = REPLY(UVCCL__OP_LIST_KEYS, 0, Q("02") Q("02") "2F 61" Q("03") "2F 62 63",
             0);
  ok(rc == 0 && c == 29 && r.count == 2 &&
         uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL) &&
         mem_eq(k, kl, NULL, "/a") &&
         uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL) &&
         mem_eq(k, kl, NULL, "/bc") &&
         !uvccl__proto_iter_next(&r.list, &k, &kl, NULL, NULL),
     "list_keys: /a, /bc");
  free(b);
  rc = REPLY(UVCCL__OP_LIST_KEYS, 0, Q("00"), 0);
  ok(rc == 0 && c == 8 && r.count == 0, "list_keys: none");
  free(b);
  rc = REPLY(UVCCL__OP_LIST_KEYS, 0, "FE FF FF FF FF FF FF FF", 0);
  is_int(rc, UVCCL_EPROTO, "list_keys: a negative count is EPROTO");
  free(b);
  rc = REPLY(UVCCL__OP_LIST_KEYS, 0, Q("01") Q("09"), 8);
  is_int(rc, UVCCL_ELIMIT, "list_keys: a name over the limit is ELIMIT");
  free(b);
  rc = REPLY(UVCCL__OP_LIST_KEYS, 0, "FF FF FF FF FF FF FF 7F", 0);
  ok(rc == UVCCL__PROTO_NEED_MORE && c == SIZE_MAX,
     "list_keys of 2^63 - 1 names: NEED_MORE, bound saturated");
  free(b);

  c = 99;
  is_int(uvccl__proto_parse_reply(UVCCL__OP_COUNT, 0, NULL, 0, 0, &r, &c),
         UV_EINVAL, "no reply format for an unknown op");
  uvccl__proto_parse_reply(UVCCL__OP_ADD, 0, NULL, 0, 0, &r, &c);
  is_int(c, 8, "an i64 reply with nothing buffered needs 8");
  uvccl__proto_parse_reply(UVCCL__OP_MULTI_GET, 4, NULL, 0, 0, &r, &c);
  is_int(c, 32, "multi_get of 4 with nothing buffered needs 32");
#undef REPLY
}

static void test_op_names(void) {
  is_str(uvccl__op_name(UVCCL__OP_SET), "store.set", "op name: set");
  is_str(uvccl__op_name(UVCCL__OP_GET), "store.get", "op name: get");
  is_str(uvccl__op_name(UVCCL__OP_GETNUMKEYS), "store.num_keys",
         "op name: num_keys, as the public call");
  is_str(uvccl__op_name(UVCCL__OP_DELETE_KEY), "store.delete_key",
         "op name: delete_key");
  is_str(uvccl__op_name(UVCCL__OP_WATCH_KEY), "store.watch_key",
         "op name: watch_key");
  is_str(uvccl__op_name(UVCCL__OP_COUNT), "store.unknown",
         "op name: out of range");
  is_str(uvccl__op_name(-1), "store.unknown", "op name: negative");
  {
    int i, bad = 0;
    for (i = 0; i < UVCCL__OP_COUNT; i++)
      if (uvccl__op_name(i) == NULL || strncmp(uvccl__op_name(i), "store.", 6))
        bad++;
    is_int(bad, 0, "every op has a store.* name");
  }
}

int main(void) {
  tap_alarm(60);
  test_detect();
  test_opcodes();
  test_exact_bytes();
  test_encode_errors();
  test_obuf();
  test_round_trips(UVCCL_DIALECT_MODERN, "modern");
  test_round_trips(UVCCL_DIALECT_LEGACY, "legacy");
  test_pipelined(UVCCL_DIALECT_MODERN, "modern");
  test_pipelined(UVCCL_DIALECT_LEGACY, "legacy");
  test_unknown_opcodes();
  test_need_more_bounds();
  test_limits();
  test_iterators();
  test_replies();
  test_op_names();
  return done_testing();
}
