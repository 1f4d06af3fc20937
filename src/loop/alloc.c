/* Allocation goes through these so it can be counted or failed in tests. */
#include "internal.h"

#include <string.h>

void *uvccl__malloc(size_t n) { return malloc(n ? n : 1); }
void *uvccl__calloc(size_t n, size_t m) { return calloc(n ? n : 1, m ? m : 1); }
void *uvccl__realloc(void *p, size_t n) { return realloc(p, n ? n : 1); }
void uvccl__free(void *p) { free(p); }

char *uvccl__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = uvccl__malloc(n);
  if (d != NULL) memcpy(d, s, n);
  return d;
}
