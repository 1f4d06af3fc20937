/* A small JSON reader for the diagnostics (the flight recorder's dumps:
 * uvccl-trace, the tests). Parsing only, from a buffer: no I/O, so it can
 * be fuzzed. Bounded: nesting depth 64; strings are unescaped (\uXXXX to
 * UTF-8, surrogate pairs joined). Numbers keep both a double and, when
 * they are integers that fit, the exact int64 (nanosecond times). */
#ifndef UVCCL_DIAG_JSON_H
#define UVCCL_DIAG_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  UVCCL__J_NULL = 0,
  UVCCL__J_BOOL,
  UVCCL__J_NUM,
  UVCCL__J_STR,
  UVCCL__J_ARR,
  UVCCL__J_OBJ
} uvccl__jtype_t;

typedef struct uvccl__json_s uvccl__json_t;
struct uvccl__json_s {
  uvccl__jtype_t type;
  int boolean;
  int is_int;             /* num is an integer that fits int64 */
  int64_t i;
  double num;
  char *str;              /* J_STR: unescaped, NUL-terminated */
  size_t len;             /* J_STR: bytes; J_ARR/J_OBJ: members */
  uvccl__json_t *items;   /* J_ARR/J_OBJ: len members */
  char **keys;            /* J_OBJ: their keys */
};

/* Parses text[0..len). 0 and *out (free with uvccl__json_free), or
 * UVCCL_EPROTO with err saying where and what. */
int uvccl__json_parse(const char *text, size_t len, uvccl__json_t **out,
                      char *err, size_t errlen);
void uvccl__json_free(uvccl__json_t *j);

/* Lookups that accept NULL and the wrong type (they return NULL or the
 * default). */
const uvccl__json_t *uvccl__json_get(const uvccl__json_t *obj,
                                     const char *key);
const uvccl__json_t *uvccl__json_at(const uvccl__json_t *arr, size_t i);
size_t uvccl__json_len(const uvccl__json_t *j); /* members of arr/obj */
int64_t uvccl__json_int(const uvccl__json_t *j, int64_t dflt);
const char *uvccl__json_str(const uvccl__json_t *j, const char *dflt);
/* uvccl__json_int(uvccl__json_get(obj, key), dflt), and so on. */
int64_t uvccl__json_get_int(const uvccl__json_t *obj, const char *key,
                            int64_t dflt);
const char *uvccl__json_get_str(const uvccl__json_t *obj, const char *key,
                                const char *dflt);

#endif
