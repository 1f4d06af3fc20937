/* uvccl-vsearch: parsing search requests and writing replies. A small
 * recursive-descent JSON reader: it knows the one object it wants and
 * skips (while validating) everything else. */
#include "query.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32

typedef struct {
  const char *s;
  size_t len, pos;
  char *err;
  size_t errlen;
  int failed;
} parser_t;

static void skip_ws(parser_t *p);

static int fail(parser_t *p, const char *what)
{
  if (!p->failed) {
    p->failed = 1;
    skip_ws(p);
    if (p->pos >= p->len)
      snprintf(p->err, p->errlen, "invalid JSON: it ends early (%s)", what);
    else
      snprintf(p->err, p->errlen, "invalid JSON at byte %zu: %s", p->pos,
               what);
  }
  return -1;
}

static void skip_ws(parser_t *p)
{
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

static int peek(parser_t *p)
{
  skip_ws(p);
  return p->pos < p->len ? (unsigned char) p->s[p->pos] : -1;
}

static int expect(parser_t *p, char c, const char *what)
{
  if (peek(p) != c)
    return fail(p, what);
  p->pos++;
  return 0;
}

/* A string; its raw bytes (escapes not decoded: member names we look for
 * have none) in *b, *n. */
static int parse_string(parser_t *p, const char **b, size_t *n)
{
  if (expect(p, '"', "expected a string") != 0)
    return -1;
  *b = p->s + p->pos;
  while (p->pos < p->len) {
    unsigned char c = (unsigned char) p->s[p->pos];
    if (c == '"') {
      *n = (size_t) (p->s + p->pos - *b);
      p->pos++;
      return 0;
    }
    if (c < 0x20)
      return fail(p, "control character in a string");
    if (c == '\\') {
      p->pos++;
      if (p->pos >= p->len)
        break;
      c = (unsigned char) p->s[p->pos];
      if (c == 'u') {
        int i;
        for (i = 1; i <= 4; i++) {
          if (p->pos + i >= p->len ||
              !strchr("0123456789abcdefABCDEF", p->s[p->pos + i]) ||
              p->s[p->pos + i] == '\0')
            return fail(p, "bad \\u escape");
        }
        p->pos += 4;
      } else if (!strchr("\"\\/bfnrt", c) || c == '\0') {
        return fail(p, "bad escape");
      }
    }
    p->pos++;
  }
  return fail(p, "unterminated string");
}

/* A JSON number (the grammar checked here; strtod converts it). */
static int parse_number(parser_t *p, double *out)
{
  size_t start, i;
  char tmp[64];

  skip_ws(p);
  start = i = p->pos;
  if (i < p->len && p->s[i] == '-')
    i++;
  if (i < p->len && p->s[i] == '0') {
    i++;
  } else if (i < p->len && p->s[i] >= '1' && p->s[i] <= '9') {
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  } else {
    return fail(p, "expected a number");
  }
  if (i < p->len && p->s[i] == '.') {
    i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
      return fail(p, "expected a digit after '.'");
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
      i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
      return fail(p, "expected a digit in the exponent");
    while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
      i++;
  }
  if (i - start >= sizeof(tmp)) {
    p->pos = start;
    return fail(p, "number too long");
  }
  memcpy(tmp, p->s + start, i - start);
  tmp[i - start] = '\0';
  *out = strtod(tmp, NULL);
  p->pos = i;
  return 0;
}

static int skip_value(parser_t *p, int depth);

static int skip_literal(parser_t *p, const char *lit)
{
  size_t n = strlen(lit);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0)
    return fail(p, "unexpected character");
  p->pos += n;
  return 0;
}

static int skip_value(parser_t *p, int depth)
{
  const char *b;
  size_t n;
  double d;
  int c = peek(p);

  if (depth > MAX_DEPTH)
    return fail(p, "nested too deeply");
  switch (c) {
  case '"':
    return parse_string(p, &b, &n);
  case '{':
    p->pos++;
    if (peek(p) == '}') {
      p->pos++;
      return 0;
    }
    for (;;) {
      if (parse_string(p, &b, &n) != 0 ||
          expect(p, ':', "expected ':'") != 0 || skip_value(p, depth + 1) != 0)
        return -1;
      c = peek(p);
      p->pos++;
      if (c == '}')
        return 0;
      if (c != ',') {
        p->pos--;
        return fail(p, "expected ',' or '}'");
      }
    }
  case '[':
    p->pos++;
    if (peek(p) == ']') {
      p->pos++;
      return 0;
    }
    for (;;) {
      if (skip_value(p, depth + 1) != 0)
        return -1;
      c = peek(p);
      p->pos++;
      if (c == ']')
        return 0;
      if (c != ',') {
        p->pos--;
        return fail(p, "expected ',' or ']'");
      }
    }
  case 't':
    return skip_literal(p, "true");
  case 'f':
    return skip_literal(p, "false");
  case 'n':
    return skip_literal(p, "null");
  case -1:
    return fail(p, "unexpected end");
  default:
    return parse_number(p, &d);
  }
}

int vs_parse_search(const char *body, size_t len, int dim, uint32_t max_k,
                    float *vec, uint32_t *k, char *err, size_t errlen)
{
  parser_t p = {body, len, 0, err, errlen, 0};
  int have_vec = 0, have_k = 0, n = 0, c;
  double d, kd = VS_DEFAULT_K;
  const char *name;
  size_t nlen;

  if (expect(&p, '{', "expected an object") != 0)
    return -1;
  if (peek(&p) == '}') {
    p.pos++;
  } else {
    for (;;) {
      if (parse_string(&p, &name, &nlen) != 0 ||
          expect(&p, ':', "expected ':'") != 0)
        return -1;
      if (nlen == 6 && memcmp(name, "vector", 6) == 0) {
        if (have_vec)
          return fail(&p, "\"vector\" given twice");
        have_vec = 1;
        if (expect(&p, '[', "\"vector\" must be an array of numbers") != 0)
          return -1;
        if (peek(&p) == ']') {
          p.pos++;
        } else {
          for (;;) {
            if (parse_number(&p, &d) != 0)
              return -1;
            if (!(fabs(d) <= FLT_MAX)) { /* the cast below must be defined */
              snprintf(err, errlen, "vector[%d] is not a finite float", n);
              return -1;
            }
            if (n < dim)
              vec[n] = (float) d;
            n++;
            c = peek(&p);
            p.pos++;
            if (c == ']')
              break;
            if (c != ',') {
              p.pos--;
              return fail(&p, "expected ',' or ']'");
            }
          }
        }
      } else if (nlen == 1 && name[0] == 'k') {
        if (have_k)
          return fail(&p, "\"k\" given twice");
        have_k = 1;
        if (parse_number(&p, &kd) != 0)
          return -1;
      } else if (skip_value(&p, 1) != 0) {
        return -1;
      }
      c = peek(&p);
      p.pos++;
      if (c == '}')
        break;
      if (c != ',') {
        p.pos--;
        return fail(&p, "expected ',' or '}'");
      }
    }
  }
  if (peek(&p) != -1)
    return fail(&p, "trailing characters after the object");
  if (!have_vec) {
    snprintf(err, errlen, "missing \"vector\"");
    return -1;
  }
  if (n != dim) {
    snprintf(err, errlen, "vector has %d numbers, expected %d", n, dim);
    return -1;
  }
  if (kd != floor(kd) || kd < 1 || kd > (double) max_k) {
    snprintf(err, errlen, "k must be an integer from 1 to %u", max_k);
    return -1;
  }
  *k = (uint32_t) kd;
  return 0;
}

void vs_out_printf(vs_out_t *o, const char *fmt, ...)
{
  va_list ap;
  int n;

  if (o->oom)
    return;
  for (;;) {
    size_t room = o->cap - o->len;
    va_start(ap, fmt);
    n = vsnprintf(o->buf ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      o->oom = 1;
      return;
    }
    if ((size_t) n < room) {
      o->len += (size_t) n;
      return;
    }
    {
      size_t cap = o->cap ? o->cap * 2 : 256;
      char *b;
      while (cap - o->len <= (size_t) n)
        cap *= 2;
      b = realloc(o->buf, cap);
      if (b == NULL) {
        o->oom = 1;
        return;
      }
      o->buf = b;
      o->cap = cap;
    }
  }
}

void vs_out_json_string(vs_out_t *o, const char *s)
{
  vs_out_printf(o, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char) *s;
    if (c == '"' || c == '\\')
      vs_out_printf(o, "\\%c", c);
    else if (c < 0x20)
      vs_out_printf(o, "\\u%04x", c);
    else
      vs_out_printf(o, "%c", c);
  }
  vs_out_printf(o, "\"");
}

void vs_out_free(vs_out_t *o)
{
  free(o->buf);
  o->buf = NULL;
  o->len = o->cap = 0;
}

void vs_out_results(vs_out_t *o, const vs_cand_t *c, uint32_t k,
                    const char *extra)
{
  uint32_t i;
  int first = 1;

  vs_out_printf(o, "{\"results\": [");
  for (i = 0; i < k; i++) {
    if (c[i].id < 0)
      continue;
    vs_out_printf(o, "%s{\"id\": %lld, \"distance\": %.9g}",
                  first ? "" : ", ", (long long) c[i].id,
                  sqrt((double) c[i].dist2));
    first = 0;
  }
  vs_out_printf(o, "]%s}\n", extra ? extra : "");
}
