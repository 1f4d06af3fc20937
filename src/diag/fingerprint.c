/* Collective fingerprints (see fingerprint.h). */
#include "fingerprint.h"

#include <stdio.h>
#include <string.h>

int uvccl__fp_counts_compared(const char *op) {
  static const char *const in_ops[] = {
      "allreduce", "allreduce_coalesced", "broadcast", "broadcast_bytes",
      "reduce", "reduce_scatter", "gather", "barrier", NULL};
  int i;
  if (op == NULL) return UVCCL__FP_CMP_NONE;
  for (i = 0; in_ops[i] != NULL; i++)
    if (strcmp(op, in_ops[i]) == 0) return UVCCL__FP_CMP_IN;
  if (strcmp(op, "allgather") == 0 || strcmp(op, "scatter") == 0)
    return UVCCL__FP_CMP_OUT;
  return UVCCL__FP_CMP_NONE;
}

static void copy_str(char *dst, size_t len, const char *src) {
  memset(dst, 0, len);
  if (src != NULL) snprintf(dst, len, "%s", src);
}

void uvccl__fp_make(uvccl__fp_t *fp, uint32_t seq, const char *op,
                    const char *dtype, const char *redop, int root,
                    uint64_t count_in, uint64_t count_out) {
  memset(fp, 0, sizeof(*fp));
  fp->magic = UVCCL__FP_MAGIC;
  fp->seq = seq;
  copy_str(fp->op, sizeof(fp->op), op);
  copy_str(fp->dtype, sizeof(fp->dtype), dtype);
  copy_str(fp->redop, sizeof(fp->redop), redop);
  fp->root = root;
  fp->count_in = count_in;
  fp->count_out = count_out;
}

/* The strings of a fingerprint from the wire may lack their NUL. */
static int field_eq(const char *a, const char *b, size_t len) {
  return strncmp(a, b, len) == 0;
}

int uvccl__fp_same(const uvccl__fp_t *a, const uvccl__fp_t *b) {
  char op[sizeof(a->op) + 1];
  int c;
  if (a->magic != b->magic || a->seq != b->seq || a->root != b->root ||
      !field_eq(a->op, b->op, sizeof(a->op)) ||
      !field_eq(a->dtype, b->dtype, sizeof(a->dtype)) ||
      !field_eq(a->redop, b->redop, sizeof(a->redop)))
    return 0;
  memcpy(op, a->op, sizeof(a->op));
  op[sizeof(a->op)] = '\0';
  c = uvccl__fp_counts_compared(op);
  if (c == UVCCL__FP_CMP_IN && a->count_in != b->count_in) return 0;
  if (c == UVCCL__FP_CMP_OUT && a->count_out != b->count_out) return 0;
  return 1;
}

void uvccl__fp_format(const uvccl__fp_t *fp, char *buf, size_t len) {
  int n;
  if (fp->magic != UVCCL__FP_MAGIC) {
    snprintf(buf, len, "(not a fingerprint)");
    return;
  }
  n = snprintf(buf, len, "%.24s%s%.12s%s%.12s, %llu -> %llu", fp->op,
               fp->dtype[0] ? " " : "", fp->dtype, fp->redop[0] ? " " : "",
               fp->redop, (unsigned long long)fp->count_in,
               (unsigned long long)fp->count_out);
  if (n > 0 && (size_t)n < len && fp->root >= 0)
    snprintf(buf + n, len - (size_t)n, ", root %d", (int)fp->root);
}

/* Appends rank r to a list "0,1,3" (at most 6 named, then ",..."). */
static void list_add(char *list, size_t cap, size_t *off, int *n, int r) {
  if (*n < 6 && *off < cap)
    *off += (size_t)snprintf(list + *off, cap - *off, "%s%d", *n ? "," : "",
                             r);
  else if (*n == 6 && *off < cap)
    *off += (size_t)snprintf(list + *off, cap - *off, ",...");
  (*n)++;
}

int uvccl__fp_verdict(const uvccl__fp_t *mine, const uvccl__fp_t *all,
                      int size, char *msg, size_t len) {
  char a[80], b[80], ra[48] = "", rb[48] = "";
  size_t oa = 0, ob = 0;
  int r, first_b = -1, na = 0, nb = 0;
  for (r = 0; r < size; r++) {
    if (uvccl__fp_same(mine, &all[r])) {
      list_add(ra, sizeof(ra), &oa, &na, r);
    } else {
      if (first_b < 0) first_b = r;
      list_add(rb, sizeof(rb), &ob, &nb, r);
    }
  }
  if (first_b < 0) return 0;
  uvccl__fp_format(mine, a, sizeof(a));
  uvccl__fp_format(&all[first_b], b, sizeof(b));
  snprintf(msg, len, "ranks disagree: rank%s %s called %s; rank%s %s called "
           "%s", na > 1 ? "s" : "", ra, a, nb > 1 ? "s" : "", rb, b);
  return 1;
}
