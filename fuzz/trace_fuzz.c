/* libFuzzer target for what uvccl-trace reads: the JSON parser
 * (src/diag/json.c), the analyzer over the parsed dumps
 * (src/diag/analyze.c), and fingerprint comparison (src/diag/
 * fingerprint.c). Any input must give a result or a clean error: no crash,
 * no leak, no read out of bounds. */
#include "diag/analyze.h"
#include "diag/fingerprint.h"
#include "diag/json.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uvccl__json_t *doc = NULL;
  char err[128];
  if (size >= 2 * sizeof(uvccl__fp_t)) {
    /* fingerprints off the wire: strings without their NUL */
    uvccl__fp_t a, b;
    char buf[200];
    memcpy(&a, data, sizeof(a));
    memcpy(&b, data + sizeof(a), sizeof(b));
    uvccl__fp_t all[2];
    (void)uvccl__fp_same(&a, &b);
    uvccl__fp_format(&a, buf, sizeof(buf));
    all[0] = a;
    all[1] = b;
    (void)uvccl__fp_verdict(&a, all, 2, buf, sizeof(buf));
  }
  if (uvccl__json_parse((const char *)data, size, &doc, err, sizeof(err)) ==
      0) {
    /* the same dump twice: two members of every group it names */
    const uvccl__json_t *docs[2] = {doc, doc};
    uvccl__tresult_t res;
    if (uvccl__trace_analyze(docs, 2, &res, err, sizeof(err)) == 0) {
      int k;
      char d[256];
      for (k = 0; k < res.ngroups; k++) {
        uvccl__tdesc_format(&res.groups[k].mm_a, d, sizeof(d));
        uvccl__tdesc_format(&res.groups[k].stuck_desc, d, sizeof(d));
      }
      uvccl__trace_result_free(&res);
    }
    uvccl__json_free(doc);
  }
  return 0;
}
