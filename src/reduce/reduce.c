/* Data types, reduction operations and the reduction kernels.
 *
 * The kernels are the compute half of allreduce: dst[i] = dst[i] op src[i]
 * over every chunk that arrives. They are memory-bound (fp32 add moves 12
 * bytes per 4 of output), so the goal is simply to never be the bottleneck:
 * plain `restrict` loops the compiler vectorises, built at -O3 whatever the
 * global flags, and compiled three times (portable C, AVX2 + F16C,
 * AVX-512) with the tier picked once at run time from CPUID. The halfs
 * have hand-written vector loops: GCC does not vectorise _Float16
 * conversions (F16C does them in one instruction), and bfloat16 can skip
 * the shuffles the compiler would use. Every tier returns the same bits
 * (NaN payloads aside), so hosts with different CPUs agree on every reduced
 * value; the test checks each tier against one scalar reference.
 *
 * Buffers may be misaligned (pointers to an `aligned(1)` typedef), because
 * chunks can start anywhere in a receive buffer.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* -O2's "very cheap" vectoriser model skips loops of unknown trip count,
 * which is every loop here. Trapping math keeps GCC from turning the
 * selects of min/max and of the half conversions into vector blends; the
 * kernels promise values, not floating-point exception flags. Clang does
 * both at -O2 already. */
#pragma GCC optimize("O3", "no-trapping-math")
#endif

#include "reduce.h"

#include <limits.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) &&                            \
    (defined(__GNUC__) || defined(__clang__))
#define UVCCL__X86 1
#include <cpuid.h>
#include <immintrin.h>
#define ATTR_AVX2 __attribute__((target("avx2,f16c")))
#define ATTR_AVX512                                                          \
  __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#endif

#define INLINE static inline __attribute__((always_inline))

/* ---- Names and sizes ----------------------------------------------------- */

static const struct {
  const char *name;
  size_t size;
} dtype_info[UVCCL_DTYPE_COUNT] = {
    [UVCCL_INT8] = {"int8", 1},          [UVCCL_UINT8] = {"uint8", 1},
    [UVCCL_BOOL] = {"bool", 1},          [UVCCL_INT32] = {"int32", 4},
    [UVCCL_INT64] = {"int64", 8},        [UVCCL_FLOAT16] = {"float16", 2},
    [UVCCL_BFLOAT16] = {"bfloat16", 2},  [UVCCL_FLOAT32] = {"float32", 4},
    [UVCCL_FLOAT64] = {"float64", 8},    [UVCCL_COMPLEX64] = {"complex64", 8},
    [UVCCL_COMPLEX128] = {"complex128", 16},
    [UVCCL_FLOAT8_E4M3] = {"float8_e4m3fn", 1},
    [UVCCL_FLOAT8_E5M2] = {"float8_e5m2", 1},
};

static const char *const redop_names[UVCCL_REDOP_COUNT] = {
    [UVCCL_SUM] = "sum",         [UVCCL_AVG] = "avg",
    [UVCCL_PRODUCT] = "product", [UVCCL_MIN] = "min",
    [UVCCL_MAX] = "max",         [UVCCL_BAND] = "band",
    [UVCCL_BOR] = "bor",         [UVCCL_BXOR] = "bxor",
    [UVCCL_PREMUL_SUM] = "premul_sum",
};

struct alias {
  const char *name;
  int value;
};

/* PyTorch's names and tensor-type names, C names, and common shorthands. */
static const struct alias dtype_aliases[] = {
    {"i8", UVCCL_INT8},          {"char", UVCCL_INT8},
    {"int8_t", UVCCL_INT8},      {"u8", UVCCL_UINT8},
    {"byte", UVCCL_UINT8},       {"uint8_t", UVCCL_UINT8},
    {"boolean", UVCCL_BOOL},     {"int", UVCCL_INT32},
    {"i32", UVCCL_INT32},        {"int32_t", UVCCL_INT32},
    {"long", UVCCL_INT64},       {"i64", UVCCL_INT64},
    {"int64_t", UVCCL_INT64},    {"half", UVCCL_FLOAT16},
    {"fp16", UVCCL_FLOAT16},     {"f16", UVCCL_FLOAT16},
    {"bf16", UVCCL_BFLOAT16},    {"float", UVCCL_FLOAT32},
    {"fp32", UVCCL_FLOAT32},     {"f32", UVCCL_FLOAT32},
    {"double", UVCCL_FLOAT64},   {"fp64", UVCCL_FLOAT64},
    {"f64", UVCCL_FLOAT64},      {"cfloat", UVCCL_COMPLEX64},
    {"c64", UVCCL_COMPLEX64},    {"cdouble", UVCCL_COMPLEX128},
    {"c128", UVCCL_COMPLEX128},  {"float8_e4m3", UVCCL_FLOAT8_E4M3},
    {"fp8_e4m3", UVCCL_FLOAT8_E4M3}, {"e4m3", UVCCL_FLOAT8_E4M3},
    {"fp8_e5m2", UVCCL_FLOAT8_E5M2}, {"e5m2", UVCCL_FLOAT8_E5M2},
};

static const struct alias redop_aliases[] = {
    {"average", UVCCL_AVG},     {"mean", UVCCL_AVG},
    {"prod", UVCCL_PRODUCT},    {"mul", UVCCL_PRODUCT},
    {"and", UVCCL_BAND},        {"or", UVCCL_BOR},
    {"xor", UVCCL_BXOR},        {"premulsum", UVCCL_PREMUL_SUM},
    {"premul-sum", UVCCL_PREMUL_SUM},
};

/* ASCII only: strcasecmp() follows the locale (Turkish dotless i). */
static int lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

static int name_eq(const char *a, const char *b) {
  for (; *a && lower((unsigned char)*a) == lower((unsigned char)*b); a++, b++)
    ;
  return *a == 0 && *b == 0;
}

static const char *skip_prefix(const char *s, const char *prefix) {
  size_t i;
  for (i = 0; prefix[i]; i++)
    if (lower((unsigned char)s[i]) != prefix[i]) return s;
  return s + i;
}

size_t uvccl_dtype_size(uvccl_dtype_t dtype) {
  return (unsigned)dtype < UVCCL_DTYPE_COUNT ? dtype_info[dtype].size : 0;
}

const char *uvccl_dtype_name(uvccl_dtype_t dtype) {
  return (unsigned)dtype < UVCCL_DTYPE_COUNT ? dtype_info[dtype].name : NULL;
}

const char *uvccl_redop_name(uvccl_redop_t op) {
  return (unsigned)op < UVCCL_REDOP_COUNT ? redop_names[op] : NULL;
}

int uvccl_dtype_from_name(const char *name, uvccl_dtype_t *out) {
  size_t i;
  if (name == NULL || out == NULL) return UV_EINVAL;
  name = skip_prefix(name, "torch."); /* str(torch.float32) */
  for (i = 0; i < UVCCL_DTYPE_COUNT; i++)
    if (name_eq(name, dtype_info[i].name)) {
      *out = (uvccl_dtype_t)i;
      return 0;
    }
  for (i = 0; i < UVCCL__ARRAY_SIZE(dtype_aliases); i++)
    if (name_eq(name, dtype_aliases[i].name)) {
      *out = (uvccl_dtype_t)dtype_aliases[i].value;
      return 0;
    }
  return UV_EINVAL;
}

int uvccl_redop_from_name(const char *name, uvccl_redop_t *out) {
  size_t i;
  if (name == NULL || out == NULL) return UV_EINVAL;
  name = skip_prefix(name, "reduceop."); /* str(dist.ReduceOp.SUM) */
  for (i = 0; i < UVCCL_REDOP_COUNT; i++)
    if (name_eq(name, redop_names[i])) {
      *out = (uvccl_redop_t)i;
      return 0;
    }
  for (i = 0; i < UVCCL__ARRAY_SIZE(redop_aliases); i++)
    if (name_eq(name, redop_aliases[i].name)) {
      *out = (uvccl_redop_t)redop_aliases[i].value;
      return 0;
    }
  return UV_EINVAL;
}

/* ---- Scalar building blocks ----------------------------------------------
 * Written branch-free (selects, not ifs) so that loops calling them still
 * vectorise. memcpy is the UB-free bit cast; it compiles to nothing. */

INLINE uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

INLINE float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

INLINE uint64_t f64_bits(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

INLINE double bits_f64(uint64_t u) {
  double f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

INLINE float f16_to_f32(uint16_t h) {
  uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = em & 0x0f800000u;
  uint32_t normal = em + 0x38000000u; /* rebias 15 -> 127 */
  uint32_t special = em + 0x70000000u; /* inf/NaN: exponent 31 -> 255 */
  /* Subnormal m * 2^-24 is (1 + m/1024) * 2^-14 - 2^-14: both terms and
   * the exact difference are normal floats, so DAZ/FTZ cannot bite. */
  uint32_t sub = f32_bits(bits_f32(em + 0x38800000u) - 0x1p-14f);
  uint32_t r = exp == 0x0f800000u ? special : exp == 0 ? sub : normal;
  return bits_f32(r | sign);
}

INLINE uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  /* Rebias, then round to nearest even on the 13 dropped bits; a carry
   * out of the mantissa bumps the exponent, up to infinity, as IEEE says. */
  uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  /* Below 2^-14 the result is subnormal: adding 0.5 puts the half's last
   * place (2^-24) at float32's last place, so the FPU rounds for us. */
  uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
  /* Same NaN as F16C's vcvtps2ph: quiet, top payload bits kept. */
  uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t r = a > 0x7f800000u   ? nan
               : a >= 0x47800000u ? 0x7c00u /* >= 65536: overflow */
               : a < 0x38800000u  ? sub
                                  : normal;
  return (uint16_t)(r | sign);
}

INLINE float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

INLINE uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  /* Integer rounding works through subnormals and carries into the
   * exponent (max float rounds to infinity). AVX512_BF16's converter is
   * not used: it flushes subnormals to zero. */
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u; /* quieted, else rounding could make
                                       it infinity */
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* NaN wins (a + b is then a NaN), as torch.minimum/maximum. Equal operands
 * merge their bits so that min(-0, +0) is -0 and max is +0 whatever the
 * order: a reduction's result must not depend on which rank's data came
 * first. The vector versions below follow exactly these rules. Written as
 * a chain of plain selects so GCC makes blends of simple compares (and
 * valgrind 3.19, which gets EQ_UQ compares wrong, runs the result). */
INLINE float f32_min(float a, float b) {
  float r = a + b; /* a NaN if either is */
  r = a == b ? bits_f32(f32_bits(a) | f32_bits(b)) : r;
  r = b < a ? b : r;
  return a < b ? a : r;
}

INLINE float f32_max(float a, float b) {
  float r = a + b;
  r = a == b ? bits_f32(f32_bits(a) & f32_bits(b)) : r;
  r = b > a ? b : r;
  return a > b ? a : r;
}

INLINE double f64_min(double a, double b) {
  double r = a + b;
  r = a == b ? bits_f64(f64_bits(a) | f64_bits(b)) : r;
  r = b < a ? b : r;
  return a < b ? a : r;
}

INLINE double f64_max(double a, double b) {
  double r = a + b;
  r = a == b ? bits_f64(f64_bits(a) & f64_bits(b)) : r;
  r = b > a ? b : r;
  return a > b ? a : r;
}

float uvccl__f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t uvccl__f32_to_f16(float f) { return f32_to_f16(f); }
float uvccl__bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t uvccl__f32_to_bf16(float f) { return f32_to_bf16(f); }

/* Element types with alignment 1: loads from odd addresses are defined. */
typedef int8_t ua_int8_t;
typedef uint8_t ua_uint8_t;
typedef uint16_t ua_uint16_t __attribute__((aligned(1)));
typedef int32_t ua_int32_t __attribute__((aligned(1)));
typedef int64_t ua_int64_t __attribute__((aligned(1)));
typedef float ua_float __attribute__((aligned(1)));
typedef double ua_double __attribute__((aligned(1)));
#define UA(T) ua_##T

/* ---- The operations ------------------------------------------------------
 * X(dtype, op, T, expr): expr combines the elements a and b (of type T).
 * Integer SUM and PRODUCT go through the unsigned type U: they wrap, as in
 * PyTorch, without signed-overflow UB. Booleans are normalised to 0/1. */

#define INT_OPS(X, dt, T, U)                                                 \
  X(dt, sum, T, (T)((U)a + (U)b))                                            \
  X(dt, prod, T, (T)((U)a * (U)b))                                           \
  X(dt, min, T, b < a ? b : a)                                               \
  X(dt, max, T, a < b ? b : a)                                               \
  X(dt, band, T, (T)(a & b))                                                 \
  X(dt, bor, T, (T)(a | b))                                                  \
  X(dt, bxor, T, (T)(a ^ b))

#define BOOL_OPS(X)                                                          \
  X(b8, lor, uint8_t, (uint8_t)((a | b) != 0))                               \
  X(b8, land, uint8_t, (uint8_t)((a != 0) & (b != 0)))                       \
  X(b8, lxor, uint8_t, (uint8_t)((a != 0) ^ (b != 0)))

#define FLOAT_OPS(X, dt, T)                                                  \
  X(dt, sum, T, a + b)                                                       \
  X(dt, prod, T, a * b)                                                      \
  X(dt, min, T, dt##_min(a, b))                                              \
  X(dt, max, T, dt##_max(a, b))

/* Halfs: widen both, compute in float32, round once. */
#define HALF_OPS(X, dt)                                                      \
  X(dt, sum, uint16_t, f32_to_##dt(dt##_to_f32(a) + dt##_to_f32(b)))         \
  X(dt, prod, uint16_t, f32_to_##dt(dt##_to_f32(a) * dt##_to_f32(b)))        \
  X(dt, min, uint16_t, f32_to_##dt(f32_min(dt##_to_f32(a), dt##_to_f32(b)))) \
  X(dt, max, uint16_t, f32_to_##dt(f32_max(dt##_to_f32(a), dt##_to_f32(b))))

#define PLAIN_OPS(X)                                                         \
  INT_OPS(X, i8, int8_t, uint8_t)                                            \
  INT_OPS(X, u8, uint8_t, unsigned)                                          \
  INT_OPS(X, i32, int32_t, uint32_t)                                         \
  INT_OPS(X, i64, int64_t, uint64_t)                                         \
  BOOL_OPS(X)                                                                \
  FLOAT_OPS(X, f32, float)                                                   \
  FLOAT_OPS(X, f64, double)

/* ---- Kernel templates -----------------------------------------------------
 * One 3-operand kernel per (tier, dtype, op), plus the 2-operand one. The
 * loops live in inlined helpers with `restrict` parameters (GCC ignores
 * restrict on local pointers), so they vectorise with no run-time overlap
 * checks; the aliasing allowed (dst == a or dst == b) gets its own copy of
 * the loop so that no restrict promise is broken. */

#define LOOP(T, expr, D, A, B)                                               \
  do {                                                                       \
    size_t i_;                                                               \
    for (i_ = 0; i_ < n; i_++) {                                             \
      T a = (A)[i_], b = (B)[i_];                                            \
      (D)[i_] = (expr);                                                      \
    }                                                                        \
  } while (0)

#define KERNEL(tier, attr, dt, op, T, expr)                                  \
  attr INLINE void tier##_##dt##_##op##_da(                                  \
      UA(T) *restrict d, const UA(T) *restrict s, size_t n) {                \
    LOOP(T, expr, d, d, s);                                                  \
  }                                                                          \
  attr INLINE void tier##_##dt##_##op##_db(                                  \
      UA(T) *restrict d, const UA(T) *restrict s, size_t n) {                \
    LOOP(T, expr, d, s, d);                                                  \
  }                                                                          \
  attr INLINE void tier##_##dt##_##op##_dab(UA(T) *restrict d,               \
                                            const UA(T) *restrict pa,        \
                                            const UA(T) *restrict pb,        \
                                            size_t n) {                      \
    LOOP(T, expr, d, pa, pb);                                                \
  }                                                                          \
  static attr void tier##_##dt##_##op##3(void *dst, const void *a,           \
                                         const void *b, size_t n) {          \
    if (dst == a)                                                            \
      tier##_##dt##_##op##_da(dst, b, n);                                    \
    else if (dst == b)                                                       \
      tier##_##dt##_##op##_db(dst, a, n);                                    \
    else                                                                     \
      tier##_##dt##_##op##_dab(dst, a, b, n);                                \
  }                                                                          \
  static attr void tier##_##dt##_##op(void *dst, const void *src, size_t n) { \
    tier##_##dt##_##op##_da(dst, src, n);                                    \
  }

/* Complex SUM is float SUM over twice as many scalars. */
#define COMPLEX_KERNELS(tier, attr)                                          \
  static attr void tier##_c64_sum(void *d, const void *s, size_t n) {        \
    tier##_f32_sum(d, s, 2 * n);                                             \
  }                                                                          \
  static attr void tier##_c64_sum3(void *d, const void *a, const void *b,    \
                                   size_t n) {                               \
    tier##_f32_sum3(d, a, b, 2 * n);                                         \
  }                                                                          \
  static attr void tier##_c128_sum(void *d, const void *s, size_t n) {       \
    tier##_f64_sum(d, s, 2 * n);                                             \
  }                                                                          \
  static attr void tier##_c128_sum3(void *d, const void *a, const void *b,   \
                                    size_t n) {                              \
    tier##_f64_sum3(d, a, b, 2 * n);                                         \
  }

/* ---- Portable tier ------------------------------------------------------- */

#define GENERIC_KERNEL(dt, op, T, expr) KERNEL(gen, , dt, op, T, expr)
PLAIN_OPS(GENERIC_KERNEL)
HALF_OPS(GENERIC_KERNEL, f16)
HALF_OPS(GENERIC_KERNEL, bf16)
COMPLEX_KERNELS(gen, )

/* ---- x86 tiers ----------------------------------------------------------- */
#ifdef UVCCL__X86

#define AVX2_KERNEL(dt, op, T, expr) KERNEL(avx2, ATTR_AVX2, dt, op, T, expr)
#define AVX512_KERNEL(dt, op, T, expr)                                       \
  KERNEL(avx512, ATTR_AVX512, dt, op, T, expr)
PLAIN_OPS(AVX2_KERNEL)
PLAIN_OPS(AVX512_KERNEL)
COMPLEX_KERNELS(avx2, ATTR_AVX2)
COMPLEX_KERNELS(avx512, ATTR_AVX512)

/* Halfs by hand. A step reduces one vector's worth: float16 widens with
 * F16C, computes in float32 and narrows rounding to nearest even;
 * bfloat16 needs no shuffles at all: in each 32-bit lane the odd element
 * already is a float32 once the low half is masked off, the even one once
 * shifted up, and both round back in place. The vector ops mirror the
 * scalar ones exactly; the tail of a buffer uses the scalar kernel. */

/* Streaming from memory, the half loops ran at ~60% of float32's speed
 * until they prefetched 1 KiB ahead (then ~100%). Computed as integers:
 * a pointer past the end of the buffer would be undefined. */
#define PREFETCH(p, off)                                                     \
  _mm_prefetch((const char *)((uintptr_t)(p) + (off)), _MM_HINT_T0)

#define HALF_VEC_KERNEL(tier, attr, dt, op, B)                               \
  static attr void tier##_##dt##_##op##3(void *dst, const void *a,           \
                                         const void *b, size_t n) {          \
    char *d = dst;                                                           \
    const char *pa = a, *pb = b;                                             \
    size_t i = 0;                                                            \
    for (; i + 2 * B <= n; i += 2 * B) {                                     \
      PREFETCH(pa, 2 * i + 1024);                                            \
      PREFETCH(pb, 2 * i + 1024);                                            \
      tier##_##dt##_##op##_step(d + 2 * i, pa + 2 * i, pb + 2 * i);          \
      PREFETCH(pa, 2 * (i + B) + 1024);                                      \
      PREFETCH(pb, 2 * (i + B) + 1024);                                      \
      tier##_##dt##_##op##_step(d + 2 * (i + B), pa + 2 * (i + B),           \
                                pb + 2 * (i + B));                           \
    }                                                                        \
    for (; i + B <= n; i += B)                                               \
      tier##_##dt##_##op##_step(d + 2 * i, pa + 2 * i, pb + 2 * i);          \
    gen_##dt##_##op##3(d + 2 * i, pa + 2 * i, pb + 2 * i, n - i);            \
  }                                                                          \
  static attr void tier##_##dt##_##op(void *dst, const void *src, size_t n) { \
    tier##_##dt##_##op##3(dst, dst, src, n);                                 \
  }

/* Steps for one op in one tier (VOP: the float32 vector op). */
#define HALF_VEC_STEPS(tier, attr, op, VOP)                                  \
  attr INLINE void tier##_f16_##op##_step(void *d, const void *a,            \
                                          const void *b) {                   \
    tier##_st_f16(d, VOP(tier##_ld_f16(a), tier##_ld_f16(b)));               \
  }                                                                          \
  attr INLINE void tier##_bf16_##op##_step(void *d, const void *a,           \
                                           const void *b) {                  \
    tier##_i x = tier##_loadu(a), y = tier##_loadu(b);                       \
    tier##_i odd = tier##_bf16_round(VOP(tier##_bf16_odd(x),                 \
                                         tier##_bf16_odd(y)));               \
    tier##_i even = tier##_bf16_round(VOP(tier##_bf16_even(x),               \
                                          tier##_bf16_even(y)));             \
    tier##_storeu(d, tier##_bf16_merge(odd, even));                          \
  }

#define HALF_VEC_ALL(tier, attr, BF16, BBF16)                                \
  HALF_VEC_STEPS(tier, attr, sum, tier##_add)                                \
  HALF_VEC_STEPS(tier, attr, prod, tier##_mul)                               \
  HALF_VEC_STEPS(tier, attr, min, tier##_min)                                \
  HALF_VEC_STEPS(tier, attr, max, tier##_max)                                \
  HALF_VEC_KERNEL(tier, attr, f16, sum, BF16)                                \
  HALF_VEC_KERNEL(tier, attr, f16, prod, BF16)                               \
  HALF_VEC_KERNEL(tier, attr, f16, min, BF16)                                \
  HALF_VEC_KERNEL(tier, attr, f16, max, BF16)                                \
  HALF_VEC_KERNEL(tier, attr, bf16, sum, BBF16)                              \
  HALF_VEC_KERNEL(tier, attr, bf16, prod, BBF16)                             \
  HALF_VEC_KERNEL(tier, attr, bf16, min, BBF16)                              \
  HALF_VEC_KERNEL(tier, attr, bf16, max, BBF16)

/* AVX2: 8 float16 or 16 bfloat16 per step. */
typedef __m256i avx2_i;

ATTR_AVX2 INLINE avx2_i avx2_loadu(const void *p) {
  return _mm256_loadu_si256((const __m256i *)p);
}

ATTR_AVX2 INLINE void avx2_storeu(void *p, avx2_i v) {
  _mm256_storeu_si256((__m256i *)p, v);
}

ATTR_AVX2 INLINE __m256 avx2_ld_f16(const void *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

ATTR_AVX2 INLINE void avx2_st_f16(void *p, __m256 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

ATTR_AVX2 INLINE __m256 avx2_bf16_odd(avx2_i x) {
  return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(~0xffff)));
}

ATTR_AVX2 INLINE __m256 avx2_bf16_even(avx2_i x) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

/* The bfloat16 in the top half of each lane, as f32_to_bf16(). NaNs need
 * no care here, unlike there: a NaN computed from bfloat16 operands is
 * quiet with its low 16 bits zero, so rounding cannot carry out of it. */
ATTR_AVX2 INLINE avx2_i avx2_bf16_round(__m256 v) {
  avx2_i u = _mm256_castps_si256(v);
  avx2_i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
}

ATTR_AVX2 INLINE avx2_i avx2_bf16_merge(avx2_i odd, avx2_i even) {
  return _mm256_or_si256(_mm256_and_si256(odd, _mm256_set1_epi32(~0xffff)),
                         _mm256_srli_epi32(even, 16));
}

ATTR_AVX2 INLINE __m256 avx2_add(__m256 a, __m256 b) {
  return _mm256_add_ps(a, b);
}

ATTR_AVX2 INLINE __m256 avx2_mul(__m256 a, __m256 b) {
  return _mm256_mul_ps(a, b);
}

ATTR_AVX2 INLINE __m256 avx2_min(__m256 a, __m256 b) {
  __m256 r = _mm256_or_ps(a, b);
  r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
  return _mm256_blendv_ps(r, _mm256_add_ps(a, b),
                          _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

ATTR_AVX2 INLINE __m256 avx2_max(__m256 a, __m256 b) {
  __m256 r = _mm256_and_ps(a, b);
  r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
  r = _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  return _mm256_blendv_ps(r, _mm256_add_ps(a, b),
                          _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

HALF_VEC_ALL(avx2, ATTR_AVX2, 8, 16)

/* AVX-512: 16 float16 or 32 bfloat16 per step. */
typedef __m512i avx512_i;

ATTR_AVX512 INLINE avx512_i avx512_loadu(const void *p) {
  return _mm512_loadu_si512(p);
}

ATTR_AVX512 INLINE void avx512_storeu(void *p, avx512_i v) {
  _mm512_storeu_si512(p, v);
}

ATTR_AVX512 INLINE __m512 avx512_ld_f16(const void *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

ATTR_AVX512 INLINE void avx512_st_f16(void *p, __m512 v) {
  _mm256_storeu_si256((__m256i *)p,
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                             _MM_FROUND_NO_EXC));
}

ATTR_AVX512 INLINE __m512 avx512_bf16_odd(avx512_i x) {
  return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(~0xffff)));
}

ATTR_AVX512 INLINE __m512 avx512_bf16_even(avx512_i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

ATTR_AVX512 INLINE avx512_i avx512_bf16_round(__m512 v) {
  avx512_i u = _mm512_castps_si512(v);
  avx512_i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                  _mm512_set1_epi32(1));
  return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
}

ATTR_AVX512 INLINE avx512_i avx512_bf16_merge(avx512_i odd, avx512_i even) {
  /* (odd & 0xffff0000) | (even >> 16) in one vpternlogd. */
  return _mm512_ternarylogic_epi32(odd, _mm512_srli_epi32(even, 16),
                                   _mm512_set1_epi32(~0xffff), 0xec);
}

ATTR_AVX512 INLINE __m512 avx512_add(__m512 a, __m512 b) {
  return _mm512_add_ps(a, b);
}

ATTR_AVX512 INLINE __m512 avx512_mul(__m512 a, __m512 b) {
  return _mm512_mul_ps(a, b);
}

ATTR_AVX512 INLINE __m512 avx512_min(__m512 a, __m512 b) {
  __m512 r = _mm512_or_ps(a, b);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), a);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), b);
  return _mm512_mask_add_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
}

ATTR_AVX512 INLINE __m512 avx512_max(__m512 a, __m512 b) {
  __m512 r = _mm512_and_ps(a, b);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), a);
  r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), b);
  return _mm512_mask_add_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
}

HALF_VEC_ALL(avx512, ATTR_AVX512, 16, 32)

#endif /* UVCCL__X86 */

/* ---- Dispatch tables -----------------------------------------------------
 * AVG and PREMUL_SUM reduce as SUM; booleans map SUM/MAX to OR and
 * PRODUCT/MIN to AND. A missing entry (NULL) is an invalid pair. */

#define INT_ROW(t, dt, x)                                                    \
  {                                                                          \
    [UVCCL_SUM] = t##_##dt##_sum##x, [UVCCL_AVG] = t##_##dt##_sum##x,        \
    [UVCCL_PRODUCT] = t##_##dt##_prod##x, [UVCCL_MIN] = t##_##dt##_min##x,   \
    [UVCCL_MAX] = t##_##dt##_max##x, [UVCCL_BAND] = t##_##dt##_band##x,      \
    [UVCCL_BOR] = t##_##dt##_bor##x, [UVCCL_BXOR] = t##_##dt##_bxor##x,      \
  }
#define BOOL_ROW(t, x)                                                       \
  {                                                                          \
    [UVCCL_SUM] = t##_b8_lor##x, [UVCCL_PRODUCT] = t##_b8_land##x,           \
    [UVCCL_MIN] = t##_b8_land##x, [UVCCL_MAX] = t##_b8_lor##x,               \
    [UVCCL_BAND] = t##_b8_land##x, [UVCCL_BOR] = t##_b8_lor##x,              \
    [UVCCL_BXOR] = t##_b8_lxor##x,                                           \
  }
#define FLOAT_ROW(t, dt, x)                                                  \
  {                                                                          \
    [UVCCL_SUM] = t##_##dt##_sum##x, [UVCCL_AVG] = t##_##dt##_sum##x,        \
    [UVCCL_PRODUCT] = t##_##dt##_prod##x, [UVCCL_MIN] = t##_##dt##_min##x,   \
    [UVCCL_MAX] = t##_##dt##_max##x,                                         \
    [UVCCL_PREMUL_SUM] = t##_##dt##_sum##x,                                  \
  }
#define COMPLEX_ROW(t, dt, x)                                                \
  {                                                                          \
    [UVCCL_SUM] = t##_##dt##_sum##x, [UVCCL_AVG] = t##_##dt##_sum##x,        \
    [UVCCL_PREMUL_SUM] = t##_##dt##_sum##x,                                  \
  }
#define TABLE(t, x)                                                          \
  {                                                                          \
    [UVCCL_INT8] = INT_ROW(t, i8, x), [UVCCL_UINT8] = INT_ROW(t, u8, x),     \
    [UVCCL_BOOL] = BOOL_ROW(t, x), [UVCCL_INT32] = INT_ROW(t, i32, x),       \
    [UVCCL_INT64] = INT_ROW(t, i64, x),                                      \
    [UVCCL_FLOAT16] = FLOAT_ROW(t, f16, x),                                  \
    [UVCCL_BFLOAT16] = FLOAT_ROW(t, bf16, x),                                \
    [UVCCL_FLOAT32] = FLOAT_ROW(t, f32, x),                                  \
    [UVCCL_FLOAT64] = FLOAT_ROW(t, f64, x),                                  \
    [UVCCL_COMPLEX64] = COMPLEX_ROW(t, c64, x),                              \
    [UVCCL_COMPLEX128] = COMPLEX_ROW(t, c128, x),                            \
  }

static const uvccl__reduce_fn
    table2[UVCCL__ISA_COUNT][UVCCL_DTYPE_COUNT][UVCCL_REDOP_COUNT] = {
        [UVCCL__ISA_GENERIC] = TABLE(gen, ),
#ifdef UVCCL__X86
        [UVCCL__ISA_AVX2] = TABLE(avx2, ),
        [UVCCL__ISA_AVX512] = TABLE(avx512, ),
#endif
};

static const uvccl__reduce3_fn
    table3[UVCCL__ISA_COUNT][UVCCL_DTYPE_COUNT][UVCCL_REDOP_COUNT] = {
        [UVCCL__ISA_GENERIC] = TABLE(gen, 3),
#ifdef UVCCL__X86
        [UVCCL__ISA_AVX2] = TABLE(avx2, 3),
        [UVCCL__ISA_AVX512] = TABLE(avx512, 3),
#endif
};

static const char *const isa_names[UVCCL__ISA_COUNT] = {
    [UVCCL__ISA_GENERIC] = "generic",
    [UVCCL__ISA_AVX2] = "avx2",
    [UVCCL__ISA_AVX512] = "avx512",
};

static uv_once_t isa_once = UV_ONCE_INIT;
static int isa_best;    /* what the CPU can run; set once */
static int isa_current; /* atomic: uvccl__reduce_set_isa() may change it */

static int isa_detect(void) {
#ifdef UVCCL__X86
  unsigned a, b, c, d;
  /* __builtin_cpu_supports also checks that the OS saves the wide
   * registers; F16C is read directly (clang 14's builtin lacks it). */
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C))
    return UVCCL__ISA_GENERIC;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return UVCCL__ISA_GENERIC;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return UVCCL__ISA_AVX512;
  return UVCCL__ISA_AVX2;
#else
  return UVCCL__ISA_GENERIC;
#endif
}

static void isa_init(void) {
  int isa = isa_detect(), want;
  isa_best = isa;
  /* auto|generic|avx2|avx512: 1 + the kernels' index, or auto */
  uvccl__config_choice(UVCCL__CFG_REDUCE_ISA, &want);
  if (want > 0 && want - 1 < isa) isa = want - 1;
  __atomic_store_n(&isa_current, isa, __ATOMIC_RELAXED);
  LOG_DEBUG("reduce", "kernels: %s (cpu: %s)", isa_names[isa],
            isa_names[isa_best]);
}

int uvccl__reduce_isa(void) {
  uv_once(&isa_once, isa_init);
  return __atomic_load_n(&isa_current, __ATOMIC_RELAXED);
}

int uvccl__reduce_isa_supported(int isa) {
  uv_once(&isa_once, isa_init);
  return isa >= 0 && isa <= isa_best;
}

const char *uvccl__reduce_isa_name(int isa) {
  return isa >= 0 && isa < UVCCL__ISA_COUNT ? isa_names[isa] : NULL;
}

int uvccl__reduce_set_isa(int isa) {
  if (isa < 0 || isa >= UVCCL__ISA_COUNT) return UV_EINVAL;
  if (!uvccl__reduce_isa_supported(isa)) return UV_ENOTSUP;
  __atomic_store_n(&isa_current, isa, __ATOMIC_RELAXED);
  return 0;
}

uvccl__reduce_fn uvccl__reduce_get(uvccl_dtype_t dtype, uvccl_redop_t op) {
  if ((unsigned)dtype >= UVCCL_DTYPE_COUNT || (unsigned)op >= UVCCL_REDOP_COUNT)
    return NULL;
  return table2[uvccl__reduce_isa()][dtype][op];
}

uvccl__reduce3_fn uvccl__reduce3_get(uvccl_dtype_t dtype, uvccl_redop_t op) {
  if ((unsigned)dtype >= UVCCL_DTYPE_COUNT || (unsigned)op >= UVCCL_REDOP_COUNT)
    return NULL;
  return table3[uvccl__reduce_isa()][dtype][op];
}

int uvccl_redop_check(uvccl_redop_t op, uvccl_dtype_t dtype) {
  if ((unsigned)dtype >= UVCCL_DTYPE_COUNT || (unsigned)op >= UVCCL_REDOP_COUNT)
    return UV_EINVAL;
  /* Validity is the same in every tier: the portable table says it. */
  return table2[UVCCL__ISA_GENERIC][dtype][op] ? 0 : UV_EINVAL;
}

/* count elements of dtype starting at p fit in the address space. */
static int span_ok(const void *p, size_t count, size_t size) {
  return count <= (SIZE_MAX - (uintptr_t)p) / size;
}

int uvccl_reduce_local(void *dst, const void *src, size_t count,
                       uvccl_dtype_t dtype, uvccl_redop_t op) {
  uvccl__reduce_fn fn = uvccl__reduce_get(dtype, op);
  size_t size, bytes;
  uintptr_t d, s;
  if (fn == NULL) return UV_EINVAL;
  if (count == 0) return 0;
  size = dtype_info[dtype].size;
  if (dst == NULL || src == NULL || !span_ok(dst, count, size) ||
      !span_ok(src, count, size))
    return UV_EINVAL;
  /* Partial overlap would make the result depend on the loop order. */
  bytes = count * size;
  d = (uintptr_t)dst;
  s = (uintptr_t)src;
  if (d != s && d < s + bytes && s < d + bytes) return UV_EINVAL;
  fn(dst, src, count);
  return 0;
}

/* ---- Scaling (AVG, PREMUL_SUM) ------------------------------------------
 * Run once per collective over the output, so portable loops suffice.
 * float32 and the halfs scale by the factor rounded to float (PyTorch's
 * "opmath" for them), float64 by the double itself. */

static void scale_f16(void *buf, size_t n, float f) {
  UA(uint16_t) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) * f);
}

static void scale_bf16(void *buf, size_t n, float f) {
  UA(uint16_t) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) * f);
}

static void scale_f32(void *buf, size_t n, float f) {
  UA(float) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] *= f;
}

static void scale_f64(void *buf, size_t n, double f) {
  UA(double) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] *= f;
}

int uvccl_scale_local(void *buf, size_t count, uvccl_dtype_t dtype,
                      double factor) {
  if ((unsigned)dtype >= UVCCL_DTYPE_COUNT) return UV_EINVAL;
  if (count > 0 && (buf == NULL || !span_ok(buf, count,
                                            dtype_info[dtype].size)))
    return UV_EINVAL;
  switch (dtype) {
  case UVCCL_FLOAT16: scale_f16(buf, count, (float)factor); return 0;
  case UVCCL_BFLOAT16: scale_bf16(buf, count, (float)factor); return 0;
  case UVCCL_FLOAT32: scale_f32(buf, count, (float)factor); return 0;
  case UVCCL_COMPLEX64: scale_f32(buf, 2 * count, (float)factor); return 0;
  case UVCCL_FLOAT64: scale_f64(buf, count, factor); return 0;
  case UVCCL_COMPLEX128: scale_f64(buf, 2 * count, factor); return 0;
  default: return UV_EINVAL; /* integers: use uvccl_divide_local */
  }
}

/* Narrow integers divide in double: for |x| <= 2^31 the rounding error of
 * x / d is below the gap to the next integer, so truncating it is exactly
 * C's integer division, and it vectorises where integer division cannot.
 * d == -1 is left out (INT32_MIN / -1 overflows int32; the caller wraps). */
#define DIV_NARROW(name, T)                                                  \
  static void name(void *buf, size_t n, int64_t dv) {                        \
    UA(T) *restrict p = buf;                                                 \
    double d = (double)dv;                                                   \
    size_t i;                                                                \
    for (i = 0; i < n; i++) p[i] = (T)(int32_t)((double)p[i] / d);           \
  }
DIV_NARROW(div_i8, int8_t)
DIV_NARROW(div_u8, uint8_t)
DIV_NARROW(div_i32, int32_t)

static void div_i64(void *buf, size_t n, int64_t d) {
  UA(int64_t) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] /= d;
}

/* x / -1 in wrapping arithmetic: INT_MIN stays INT_MIN, no trap. */
#define NEG_WRAP(name, T, U)                                                 \
  static void name(void *buf, size_t n) {                                    \
    UA(T) *restrict p = buf;                                                 \
    size_t i;                                                                \
    for (i = 0; i < n; i++) p[i] = (T)(U)(0u - (U)p[i]);                     \
  }
NEG_WRAP(neg_i8, int8_t, uint8_t)
NEG_WRAP(neg_u8, uint8_t, uint8_t)
NEG_WRAP(neg_i32, int32_t, uint32_t)
NEG_WRAP(neg_i64, int64_t, uint64_t)

static void div_f16(void *buf, size_t n, float d) {
  UA(uint16_t) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] = f32_to_f16(f16_to_f32(p[i]) / d);
}

static void div_bf16(void *buf, size_t n, float d) {
  UA(uint16_t) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / d);
}

/* Divide, not multiply by 1/d: sums of k equal values come back exact. */
static void div_f32(void *buf, size_t n, float d) {
  UA(float) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] /= d;
}

static void div_f64(void *buf, size_t n, double d) {
  UA(double) *restrict p = buf;
  size_t i;
  for (i = 0; i < n; i++) p[i] /= d;
}

int uvccl_divide_local(void *buf, size_t count, uvccl_dtype_t dtype,
                       int64_t divisor) {
  int neg = divisor == -1;
  if ((unsigned)dtype >= UVCCL_DTYPE_COUNT || dtype == UVCCL_BOOL ||
      divisor == 0)
    return UV_EINVAL;
  if (count > 0 && (buf == NULL || !span_ok(buf, count,
                                            dtype_info[dtype].size)))
    return UV_EINVAL;
  if (count == 0 || divisor == 1) return 0;
  switch (dtype) {
  case UVCCL_INT8:
    neg ? neg_i8(buf, count) : div_i8(buf, count, divisor);
    break;
  case UVCCL_UINT8:
    neg ? neg_u8(buf, count) : div_u8(buf, count, divisor);
    break;
  case UVCCL_INT32:
    neg ? neg_i32(buf, count) : div_i32(buf, count, divisor);
    break;
  case UVCCL_INT64:
    neg ? neg_i64(buf, count) : div_i64(buf, count, divisor);
    break;
  case UVCCL_FLOAT16: div_f16(buf, count, (float)divisor); break;
  case UVCCL_BFLOAT16: div_bf16(buf, count, (float)divisor); break;
  case UVCCL_FLOAT32: div_f32(buf, count, (float)divisor); break;
  case UVCCL_COMPLEX64: div_f32(buf, 2 * count, (float)divisor); break;
  case UVCCL_FLOAT64: div_f64(buf, count, (double)divisor); break;
  case UVCCL_COMPLEX128: div_f64(buf, 2 * count, (double)divisor); break;
  default: return UV_EINVAL;
  }
  return 0;
}
