/* uvccl-vsearch: the JSON of requests and replies (no I/O: fuzzed by
 * fuzz/vsearch_query_fuzz.c). */
#ifndef VSEARCH_QUERY_H
#define VSEARCH_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

#define VS_DEFAULT_K 10

/* A POST /search body: {"vector": [dim numbers], "k": K}. k is optional
 * (VS_DEFAULT_K); other members are ignored (their values must still be
 * valid JSON). On success returns 0 with vec[0..dim) and *k set; else -1
 * with a message for the client in err ("vector has 3 numbers, expected
 * 64", "invalid JSON at byte 17: expected ':'"). Accepts at most max_k,
 * and numbers that are finite as floats. Nesting is limited (32 levels). */
int vs_parse_search(const char *body, size_t len, int dim, uint32_t max_k,
                    float *vec, uint32_t *k, char *err, size_t errlen);

/* A growing output buffer for replies. */
typedef struct {
  char *buf;
  size_t len, cap;
  int oom;
} vs_out_t;

void vs_out_printf(vs_out_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* s as a JSON string (quotes included, escaped). */
void vs_out_json_string(vs_out_t *o, const char *s);
void vs_out_free(vs_out_t *o);

/* {"results": [{"id": .., "distance": ..}, ...], ...}: the k nearest
 * (sqrt of the squared distances), then extra (", \"ranks\": 4" etc). */
void vs_out_results(vs_out_t *o, const vs_cand_t *c, uint32_t k,
                    const char *extra);

#endif
