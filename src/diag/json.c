/* A small JSON reader (see json.h): recursive descent over a buffer. */
#include "json.h"
#include "loop/internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
  const char *p, *end, *start;
  char *err;
  size_t errlen;
  int failed;
} jp_t;

static void fail(jp_t *j, const char *what) {
  if (j->failed) return;
  j->failed = 1;
  if (j->err != NULL && j->errlen > 0)
    snprintf(j->err, j->errlen, "JSON: %s at byte %zu", what,
             (size_t)(j->p - j->start));
}

static void skip_ws(jp_t *j) {
  while (j->p < j->end &&
         (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static int lit(jp_t *j, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return 0;
  j->p += n;
  return 1;
}

static int hex4(jp_t *j, unsigned *v) {
  int k;
  *v = 0;
  if (j->end - j->p < 4) return 0;
  for (k = 0; k < 4; k++) {
    char c = *j->p++;
    *v <<= 4;
    if (c >= '0' && c <= '9') *v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') *v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') *v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  return 1;
}

static size_t utf8(unsigned cp, char *o) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18));
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* At the opening quote: the unescaped string (malloc'ed) and its length.
 * The output is never longer than the input, so one allocation does. */
static char *parse_string(jp_t *j, size_t *len) {
  const char *q;
  char *out, *o;
  j->p++; /* " */
  for (q = j->p; q < j->end && *q != '"'; q++)
    if (*q == '\\') q++;
  if (q >= j->end) {
    fail(j, "unterminated string");
    return NULL;
  }
  out = o = uvccl__malloc((size_t)(q - j->p) + 1);
  if (out == NULL) {
    fail(j, "out of memory");
    return NULL;
  }
  while (j->p < j->end && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p++;
    if (c < 0x20) {
      fail(j, "control character in a string");
      goto bad;
    }
    if (c != '\\') {
      *o++ = (char)c;
      continue;
    }
    if (j->p >= j->end) break;
    c = (unsigned char)*j->p++;
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '/': *o++ = '/'; break;
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      unsigned cp, lo;
      if (!hex4(j, &cp)) {
        fail(j, "bad \\u escape");
        goto bad;
      }
      if (cp >= 0xd800 && cp < 0xdc00 && j->end - j->p >= 6 &&
          j->p[0] == '\\' && j->p[1] == 'u') {
        const char *save = j->p;
        j->p += 2;
        if (hex4(j, &lo) && lo >= 0xdc00 && lo < 0xe000)
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        else
          j->p = save;
      }
      /* \uXXXX is 6 bytes of input, at most 4 of output */
      o += utf8(cp, o);
      break;
    }
    default:
      fail(j, "bad escape");
      goto bad;
    }
  }
  if (j->p >= j->end) {
    fail(j, "unterminated string");
    goto bad;
  }
  j->p++; /* " */
  *o = '\0';
  *len = (size_t)(o - out);
  return out;
bad:
  uvccl__free(out);
  return NULL;
}

static int parse_value(jp_t *j, uvccl__json_t *v, int depth);

/* Appends a member to an array or object (doubling). */
static uvccl__json_t *grow(jp_t *j, uvccl__json_t *v, size_t *cap) {
  if (v->len == *cap) {
    size_t c = *cap ? *cap * 2 : 8;
    uvccl__json_t *it = uvccl__realloc(v->items, c * sizeof(*it));
    if (it == NULL) {
      fail(j, "out of memory");
      return NULL;
    }
    v->items = it;
    if (v->type == UVCCL__J_OBJ) {
      char **k = uvccl__realloc(v->keys, c * sizeof(*k));
      if (k == NULL) {
        fail(j, "out of memory");
        return NULL;
      }
      v->keys = k;
    }
    *cap = c;
  }
  memset(&v->items[v->len], 0, sizeof(v->items[0]));
  return &v->items[v->len];
}

static int parse_container(jp_t *j, uvccl__json_t *v, int depth) {
  char close = v->type == UVCCL__J_OBJ ? '}' : ']';
  size_t cap = 0;
  j->p++;
  skip_ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    return 0;
  }
  for (;;) {
    uvccl__json_t *m;
    char *key = NULL;
    size_t klen;
    skip_ws(j);
    if (v->type == UVCCL__J_OBJ) {
      if (j->p >= j->end || *j->p != '"') {
        fail(j, "expected a key");
        return -1;
      }
      key = parse_string(j, &klen);
      if (key == NULL) return -1;
      skip_ws(j);
      if (j->p >= j->end || *j->p != ':') {
        uvccl__free(key);
        fail(j, "expected ':'");
        return -1;
      }
      j->p++;
    }
    m = grow(j, v, &cap);
    if (m == NULL) {
      uvccl__free(key);
      return -1;
    }
    if (v->type == UVCCL__J_OBJ) v->keys[v->len] = key;
    v->len++;
    if (parse_value(j, m, depth + 1) != 0) return -1;
    skip_ws(j);
    if (j->p < j->end && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->end && *j->p == close) {
      j->p++;
      return 0;
    }
    fail(j, v->type == UVCCL__J_OBJ ? "expected ',' or '}'"
                                    : "expected ',' or ']'");
    return -1;
  }
}

static int parse_number(jp_t *j, uvccl__json_t *v) {
  char buf[64], *end;
  const char *s = j->p;
  size_t n;
  int frac = 0;
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') {
    fail(j, "unexpected character");
    return -1;
  }
  while (j->p < j->end &&
         ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' ||
          *j->p == 'E' || *j->p == '+' || *j->p == '-')) {
    if (*j->p == '.' || *j->p == 'e' || *j->p == 'E') frac = 1;
    j->p++;
  }
  n = (size_t)(j->p - s);
  if (n >= sizeof(buf)) {
    fail(j, "number too long");
    return -1;
  }
  memcpy(buf, s, n);
  buf[n] = '\0';
  v->type = UVCCL__J_NUM;
  v->num = strtod(buf, &end);
  if (*end != '\0') {
    fail(j, "bad number");
    return -1;
  }
  if (!frac) {
    long long x;
    char *e2;
    errno = 0;
    x = strtoll(buf, &e2, 10);
    if (errno == 0 && *e2 == '\0') {
      v->is_int = 1;
      v->i = x;
    }
  } else if (v->num == floor(v->num) && fabs(v->num) < 9e15) {
    v->is_int = 1;
    v->i = (int64_t)v->num;
  }
  return 0;
}

static int parse_value(jp_t *j, uvccl__json_t *v, int depth) {
  if (depth > MAX_DEPTH) {
    fail(j, "nested too deep");
    return -1;
  }
  skip_ws(j);
  if (j->p >= j->end) {
    fail(j, "unexpected end");
    return -1;
  }
  switch (*j->p) {
  case '{':
    v->type = UVCCL__J_OBJ;
    return parse_container(j, v, depth);
  case '[':
    v->type = UVCCL__J_ARR;
    return parse_container(j, v, depth);
  case '"':
    v->type = UVCCL__J_STR;
    v->str = parse_string(j, &v->len);
    if (v->str == NULL) {
      v->type = UVCCL__J_NULL;
      return -1;
    }
    return 0;
  case 't':
    if (!lit(j, "true")) break;
    v->type = UVCCL__J_BOOL;
    v->boolean = 1;
    return 0;
  case 'f':
    if (!lit(j, "false")) break;
    v->type = UVCCL__J_BOOL;
    return 0;
  case 'n':
    if (!lit(j, "null")) break;
    v->type = UVCCL__J_NULL;
    return 0;
  default:
    return parse_number(j, v);
  }
  fail(j, "unexpected word");
  return -1;
}

static void free_members(uvccl__json_t *v) {
  size_t i;
  if (v->type == UVCCL__J_STR) uvccl__free(v->str);
  if (v->type == UVCCL__J_ARR || v->type == UVCCL__J_OBJ) {
    for (i = 0; i < v->len; i++) {
      free_members(&v->items[i]);
      if (v->keys) uvccl__free(v->keys[i]);
    }
    uvccl__free(v->items);
    uvccl__free(v->keys);
  }
}

int uvccl__json_parse(const char *text, size_t len, uvccl__json_t **out,
                      char *err, size_t errlen) {
  jp_t j;
  uvccl__json_t *v;
  *out = NULL;
  if (err && errlen) err[0] = '\0';
  memset(&j, 0, sizeof(j));
  j.p = j.start = text;
  j.end = text + len;
  j.err = err;
  j.errlen = errlen;
  v = uvccl__calloc(1, sizeof(*v));
  if (v == NULL) return UV_ENOMEM;
  if (parse_value(&j, v, 0) == 0) {
    skip_ws(&j);
    if (j.p != j.end) fail(&j, "trailing bytes");
  }
  if (j.failed) {
    uvccl__json_free(v);
    return UVCCL_EPROTO;
  }
  *out = v;
  return 0;
}

void uvccl__json_free(uvccl__json_t *j) {
  if (j == NULL) return;
  free_members(j);
  uvccl__free(j);
}

const uvccl__json_t *uvccl__json_get(const uvccl__json_t *obj,
                                     const char *key) {
  size_t i;
  if (obj == NULL || obj->type != UVCCL__J_OBJ) return NULL;
  for (i = 0; i < obj->len; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

const uvccl__json_t *uvccl__json_at(const uvccl__json_t *arr, size_t i) {
  if (arr == NULL || arr->type != UVCCL__J_ARR || i >= arr->len) return NULL;
  return &arr->items[i];
}

size_t uvccl__json_len(const uvccl__json_t *j) {
  if (j == NULL || (j->type != UVCCL__J_ARR && j->type != UVCCL__J_OBJ))
    return 0;
  return j->len;
}

int64_t uvccl__json_int(const uvccl__json_t *j, int64_t dflt) {
  if (j == NULL || j->type != UVCCL__J_NUM || !j->is_int) return dflt;
  return j->i;
}

const char *uvccl__json_str(const uvccl__json_t *j, const char *dflt) {
  if (j == NULL || j->type != UVCCL__J_STR) return dflt;
  return j->str;
}

int64_t uvccl__json_get_int(const uvccl__json_t *obj, const char *key,
                            int64_t dflt) {
  return uvccl__json_int(uvccl__json_get(obj, key), dflt);
}

const char *uvccl__json_get_str(const uvccl__json_t *obj, const char *key,
                                const char *dflt) {
  return uvccl__json_str(uvccl__json_get(obj, key), dflt);
}
