/* Reduction kernels: the element-wise inner loops of allreduce, reduce and
 * reduce_scatter. Internal; the public wrappers are uvccl_reduce_local() and
 * friends in uvccl.h.
 *
 * Buffers may have any alignment (even odd byte addresses) and hold `n`
 * elements of the dtype (complex: n pairs). dst and a source may be the
 * same pointer; any other overlap is undefined. Kernels are chosen once per
 * process for the best instruction set the CPU has (AVX-512, AVX2+F16C,
 * portable C); every tier gives the same bits (NaN payloads aside), so ranks
 * on different hosts agree. */
#ifndef UVCCL_REDUCE_REDUCE_H
#define UVCCL_REDUCE_REDUCE_H

#include "loop/internal.h"

#include <stddef.h>
#include <stdint.h>

/* dst[i] = dst[i] op src[i], n elements. */
typedef void (*uvccl__reduce_fn)(void *dst, const void *src, size_t n);
/* dst[i] = a[i] op b[i], n elements: reduces straight out of a receive
 * buffer into the output without a copy first. dst may equal a or b. */
typedef void (*uvccl__reduce3_fn)(void *dst, const void *a, const void *b,
                                  size_t n);

/* NULL if op does not apply to dtype (or either is out of range). AVG and
 * PREMUL_SUM give the SUM kernel: the scaling happens once, at the end. */
uvccl__reduce_fn uvccl__reduce_get(uvccl_dtype_t dtype, uvccl_redop_t op);
uvccl__reduce3_fn uvccl__reduce3_get(uvccl_dtype_t dtype, uvccl_redop_t op);

/* Instruction-set tiers of the kernels. The default is the best one the CPU
 * supports, capped by $UVCCL_REDUCE_ISA ("generic", "avx2", "avx512") when
 * set. Tests and benchmarks switch tiers to compare them. */
enum {
  UVCCL__ISA_GENERIC = 0,
  UVCCL__ISA_AVX2,   /* AVX2 + F16C */
  UVCCL__ISA_AVX512, /* AVX-512 F, BW, DQ, VL + F16C */
  UVCCL__ISA_COUNT
};
int uvccl__reduce_isa(void);                 /* the tier in use */
int uvccl__reduce_isa_supported(int isa);    /* 1 if this CPU can run it */
const char *uvccl__reduce_isa_name(int isa); /* NULL if out of range */
/* Selects a tier for later uvccl__reduce_get() calls (kernels already
 * handed out keep working). 0, or UV_ENOTSUP / UV_EINVAL. Not meant to be
 * raced with reductions on other threads (it is safe, just pointless). */
int uvccl__reduce_set_isa(int isa);

/* The portable conversions the kernels use (round to nearest even; NaN
 * stays NaN, quieted; infinities and subnormals exact). */
float uvccl__f16_to_f32(uint16_t h);
uint16_t uvccl__f32_to_f16(float f);
float uvccl__bf16_to_f32(uint16_t h);
uint16_t uvccl__f32_to_bf16(float f);

#endif
