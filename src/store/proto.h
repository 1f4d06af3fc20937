/* TCPStore wire protocol, both PyTorch dialects, with no I/O: requests and
 * replies are parsed from and encoded to memory, so the parser can be
 * tested byte by byte and fuzzed.
 *
 * Encoding (both dialects): u8 opcode, then fields; integers in host byte
 * order (little-endian); strings and byte strings as u64 length + bytes;
 * key lists as u64 count + strings. */
#ifndef UVCCL_STORE_PROTO_H
#define UVCCL_STORE_PROTO_H

#include "internal.h"

#define UVCCL__MAGIC 0x3C85F7CEu

/* Reply enums */
#define UVCCL__CHECK_READY 0
#define UVCCL__CHECK_NOT_READY 1
#define UVCCL__WAIT_STOP_WAITING 0
#define UVCCL__WAIT_CANCELED 1
#define UVCCL__WATCH_REGISTERED 3

/* Results of the parse functions, besides negative error codes. */
#define UVCCL__PROTO_OK 0
#define UVCCL__PROTO_NEED_MORE 1

typedef struct {
  size_t max_key_len;
  size_t max_value_len;
  size_t max_keys;
} uvccl__proto_limits_t;

/* A cursor over a key list (or MULTI_SET pairs) inside the input buffer. */
typedef struct {
  const uint8_t *p;
  size_t left;  /* items left */
  int pairs;    /* MULTI_SET: key then value */
} uvccl__proto_iter_t;

/* A parsed request. Pointers point into the parsed buffer. */
typedef struct {
  uvccl__op_t op;
  const uint8_t *key; size_t key_len;
  const uint8_t *val; size_t val_len;  /* SET APPEND QUEUE_PUSH; CAS desired */
  const uint8_t *exp; size_t exp_len;  /* COMPARE_SET expected */
  int64_t i64;                         /* ADD delta, BARRIER world size */
  uint32_t u32;                        /* VALIDATE magic, PING nonce */
  uvccl__proto_iter_t keys;            /* CHECK WAIT MULTI_GET MULTI_SET */
  size_t nkeys;
} uvccl__proto_req_t;

/* Detects the dialect from a connection's first bytes: MODERN when they
 * are 00 CE F7 85 3C, LEGACY otherwise. Returns UVCCL__PROTO_NEED_MORE
 * while undecidable (a lone 00 or a prefix of the magic). */
int uvccl__proto_detect(const uint8_t *buf, size_t len,
                        uvccl_dialect_t *out);

/* Parses one request from buf. Returns UVCCL__PROTO_OK with *consumed set,
 * UVCCL__PROTO_NEED_MORE (with *consumed = the total length known to be
 * needed so far, a lower bound), or UVCCL_EPROTO (unknown opcode) /
 * UVCCL_ELIMIT (a limit exceeded). */
int uvccl__proto_parse_request(uvccl_dialect_t dialect, const uint8_t *buf,
                               size_t len, const uvccl__proto_limits_t *lim,
                               uvccl__proto_req_t *req, size_t *consumed);

/* Steps a key-list cursor. For pairs, *v gets the value. Returns 1 while
 * there was an item. Only valid on a request parse_request accepted. */
int uvccl__proto_iter_next(uvccl__proto_iter_t *it, const uint8_t **k,
                           size_t *klen, const uint8_t **v, size_t *vlen);

/* The wire opcode of op in dialect, or -1 if the dialect lacks it. */
int uvccl__proto_opcode(uvccl_dialect_t dialect, uvccl__op_t op);

/* ---- Encoding -------------------------------------------------------------
 * A growable output buffer. Encoders append; they return 0 or UV_ENOMEM. */
typedef struct {
  uint8_t *base;
  size_t len;
  size_t cap;
} uvccl__obuf_t;

int uvccl__obuf_reserve(uvccl__obuf_t *b, size_t extra);
int uvccl__obuf_u8(uvccl__obuf_t *b, uint8_t v);
int uvccl__obuf_u32(uvccl__obuf_t *b, uint32_t v);
int uvccl__obuf_i64(uvccl__obuf_t *b, int64_t v);
int uvccl__obuf_bytes(uvccl__obuf_t *b, const void *p, size_t len);
/* u64 length + bytes (a string or byte string on the wire). */
int uvccl__obuf_str(uvccl__obuf_t *b, const void *p, size_t len);
void uvccl__obuf_free(uvccl__obuf_t *b);

/* Client side: encodes a whole request (opcode and fields) from a generic
 * store request. Keys get key_prefix prepended ("/" for PyTorch clients).
 * Returns 0, UV_ENOMEM, or UVCCL_ENOTSUP if the dialect lacks the op. */
int uvccl__proto_encode_request(uvccl__obuf_t *b, uvccl_dialect_t dialect,
                                const uvccl__store_req_t *req,
                                const char *key_prefix);

/* Client side: parses the reply to op. On success fills *reply and
 * *consumed. NEED_MORE and errors as for parse_request. List replies
 * (MULTI_GET, LIST_KEYS) are returned through the iterator. */
typedef struct {
  int64_t i64;        /* ADD GETNUMKEYS DELETE_KEY QUEUE_LEN QUEUE_POP(len) */
  uint8_t u8;         /* CHECK WAIT CANCEL_WAIT */
  uint32_t u32;       /* PING */
  const uint8_t *val; size_t val_len; /* GET COMPARE_SET QUEUE_POP */
  uvccl__proto_iter_t list;           /* MULTI_GET LIST_KEYS */
  size_t count;
} uvccl__proto_reply_t;

int uvccl__proto_parse_reply(uvccl__op_t op, size_t nkeys, const uint8_t *buf,
                             size_t len, size_t max_value_len,
                             uvccl__proto_reply_t *reply, size_t *consumed);

#endif
