/* Lookups in a flight recorder dump (docs/trace-format.md) for the tests
 * that read them (t/4001, t/4004). Header-only; include after tap.h and
 * diag/json.h. */
#ifndef UVCCL_T_DUMP_H
#define UVCCL_T_DUMP_H

#include <string.h>

/* The group record of (name, rank, not destroyed). */
static inline const uvccl__json_t *find_group(const uvccl__json_t *d,
                                              const char *name, int rank) {
  const uvccl__json_t *gs = uvccl__json_get(d, "groups");
  size_t i;
  for (i = 0; i < uvccl__json_len(gs); i++) {
    const uvccl__json_t *g = uvccl__json_at(gs, i);
    if (strcmp(uvccl__json_get_str(g, "name", ""), name) == 0 &&
        uvccl__json_get_int(g, "rank", -9) == rank &&
        strcmp(uvccl__json_get_str(g, "state", ""), "destroyed") != 0)
      return g;
  }
  return NULL;
}

/* The entry of group g with (kind, seq). */
static inline const uvccl__json_t *find_entry(const uvccl__json_t *d,
                                              const uvccl__json_t *g,
                                              const char *kind, int seq) {
  const uvccl__json_t *es = uvccl__json_get(d, "entries");
  int64_t id = uvccl__json_get_int(g, "id", -1);
  size_t i;
  for (i = 0; i < uvccl__json_len(es); i++) {
    const uvccl__json_t *e = uvccl__json_at(es, i);
    if (uvccl__json_get_int(e, "group", -2) == id &&
        strcmp(uvccl__json_get_str(e, "kind", ""), kind) == 0 &&
        uvccl__json_get_int(e, "seq", -1) == seq)
      return e;
  }
  return NULL;
}

/* o[key] is the string want (NULL: is null). */
static inline int str_is(const uvccl__json_t *o, const char *key,
                         const char *want) {
  const char *v = uvccl__json_get_str(o, key, NULL);
  if (want == NULL) {
    const uvccl__json_t *x = uvccl__json_get(o, key);
    return x != NULL && x->type == UVCCL__J_NULL;
  }
  return v != NULL && strcmp(v, want) == 0;
}

#endif
