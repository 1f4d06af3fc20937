/* libFuzzer target for uvccl-vsearch's request parser and reply writer
 * (examples/vsearch/query.c): any body gives a vector or a clean error
 * message; no crash, no read out of bounds, no write past the vector. The
 * first byte picks the dimension (1..64), so short and long vectors both
 * meet the length check. */
#include "query.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  float *vec;
  uint32_t k = 0;
  char err[160];
  int dim;

  if (size < 1)
    return 0;
  dim = 1 + data[0] % 64;
  /* exactly dim floats: ASan catches a write past them */
  vec = malloc(sizeof(float) * (size_t) dim);
  if (vec == NULL)
    return 0;
  if (vs_parse_search((const char *) data + 1, size - 1, dim, 100, vec, &k,
                      err, sizeof(err)) == 0) {
    vs_cand_t c[100];
    vs_out_t o = {0};
    uint32_t i;
    if (k < 1 || k > 100)
      abort();
    for (i = 0; i < k; i++) {
      c[i].dist2 = vec[i % (uint32_t) dim];
      c[i].pad = 0;
      c[i].id = (int64_t) i - 1;
    }
    vs_out_results(&o, c, k, ", \"x\": 1");
    vs_out_free(&o);
  } else if (memchr(err, '\0', sizeof(err)) == NULL || err[0] == '\0') {
    abort(); /* an error must say something */
  }
  free(vec);
  return 0;
}
