/* Collective fingerprints: what a rank says it is calling (sequence
 * number, op, dtype, reduce op, root, counts), compared across the members
 * of a group before a collective runs when fingerprint checks are on
 * (UVCCL_DEBUG=detail, or the fingerprint_check group option), and by
 * uvccl-trace on dumps. One rule for both: which counts must agree depends
 * on the op (a root's buffers and the v variants' per-rank counts
 * legitimately differ). Pure functions: no I/O. */
#ifndef UVCCL_DIAG_FINGERPRINT_H
#define UVCCL_DIAG_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

/* On the wire between members of one job (same build, same byte order):
 * fixed size, strings NUL-padded. */
typedef struct {
  uint32_t magic;         /* UVCCL__FP_MAGIC */
  uint32_t seq;
  char op[24];
  char dtype[12];         /* "" when none */
  char redop[12];
  int32_t root;           /* group rank, -1 none */
  uint64_t count_in, count_out;
} uvccl__fp_t;

#define UVCCL__FP_MAGIC 0x55465031u /* "UFP1" */

enum { UVCCL__FP_CMP_NONE = 0, UVCCL__FP_CMP_IN = 1, UVCCL__FP_CMP_OUT = 2 };
/* Which counts every member must agree on for op. */
int uvccl__fp_counts_compared(const char *op);

/* Fills fp (strings may be NULL). */
void uvccl__fp_make(uvccl__fp_t *fp, uint32_t seq, const char *op,
                    const char *dtype, const char *redop, int root,
                    uint64_t count_in, uint64_t count_out);
/* Whether two members agree (same magic, sequence, op, dtype, reduce op,
 * root and the counts that must agree). */
int uvccl__fp_same(const uvccl__fp_t *a, const uvccl__fp_t *b);
/* "allreduce float32 sum, 4 -> 4" (root appended when there is one). */
void uvccl__fp_format(const uvccl__fp_t *fp, char *buf, size_t len);
/* Every member's fingerprint (all[0..size)) against this rank's (mine):
 * 0 when they all agree, else 1 and msg says "ranks disagree: ranks 0,1,3
 * called X; rank 2 called Y" (this rank's side first, the first other
 * description second). */
int uvccl__fp_verdict(const uvccl__fp_t *mine, const uvccl__fp_t *all,
                      int size, char *msg, size_t len);

#endif
