/* Reduction kernels against a scalar reference written here: every dtype x
 * op pair's validity, random data at sizes 0..4099 from aligned and
 * misaligned pointers, in every kernel tier this CPU runs (portable, AVX2,
 * AVX-512), 2- and 3-operand forms; special values (NaN, infinities, -0,
 * subnormals, rounding ties); the half conversions, exhaustively; names and
 * sizes; scaling and division. Halfs are checked against a reference that
 * rounds by searching the table of all 65536 values, so it shares no code
 * (and no bit tricks) with the library. */
#include "tap.h"
#include "uvccl.h"
#include "reduce/reduce.h"

#include <float.h>
#include <math.h>

#define ND UVCCL_DTYPE_COUNT
#define NO UVCCL_REDOP_COUNT

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  rng_state = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* ---- Reference halfs: value tables and rounding by search --------------- */

static double f16_val[65536], bf16_val[65536];

static void make_half_tables(void) {
  unsigned h;
  for (h = 0; h < 65536; h++) {
    double s = (h & 0x8000) ? -1.0 : 1.0;
    unsigned e = (h >> 10) & 0x1f, m = h & 0x3ff;
    f16_val[h] = e == 0    ? s * ldexp(m, -24)
                 : e == 31 ? (m ? NAN : s * INFINITY)
                           : s * ldexp(1024 + m, (int)e - 25);
    e = (h >> 7) & 0xff;
    m = h & 0x7f;
    bf16_val[h] = e == 0     ? s * ldexp(m, -133)
                  : e == 255 ? (m ? NAN : s * INFINITY)
                             : s * ldexp(128 + m, (int)e - 134);
  }
}

static int half_is_nan(int bf, uint16_t h) {
  return bf ? (h & 0x7f80) == 0x7f80 && (h & 0x7f)
            : (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
}

static double half_val(int bf, uint16_t h) {
  return bf ? bf16_val[h] : f16_val[h];
}

/* Nearest (ties to even) among the positive values 0..inf, where infinity
 * counts as the next power of two after the largest finite value, as IEEE
 * rounding defines overflow. NaN maps to a NaN. */
static uint16_t ref_round(int bf, double x) {
  unsigned inf = bf ? 0x7f80 : 0x7c00;
  double top = bf ? ldexp(1, 128) : 65536.0;
  unsigned sign = signbit(x) ? 0x8000 : 0, lo = 0, hi = inf, mid;
  double ax = fabs(x), vlo, vhi;
  if (isnan(x)) return (uint16_t)(bf ? 0x7fc0 : 0x7e00);
  if (ax >= top) return (uint16_t)(sign | inf);
  /* Largest lo with val(lo) <= ax; val(inf) is taken as top. */
  while (hi - lo > 1) {
    mid = (lo + hi) / 2;
    if (half_val(bf, (uint16_t)mid) <= ax) lo = mid;
    else hi = mid;
  }
  vlo = half_val(bf, (uint16_t)lo);
  vhi = hi == inf ? top : half_val(bf, (uint16_t)hi);
  if (ax - vlo < vhi - ax) return (uint16_t)(sign | lo);
  if (ax - vlo > vhi - ax) return (uint16_t)(sign | hi);
  return (uint16_t)(sign | ((lo & 1) ? hi : lo));
}

/* ---- Reference operations ------------------------------------------------ */

/* torch.minimum/maximum with NaN propagation; -0 < +0, so the order of
 * the operands never matters. */
static double ref_min(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}

static double ref_max(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}

/* Exact in double for two floats (53 >= 2 * 24 + 2), then rounded once:
 * the same as float arithmetic. */
static float ref_f32(int op, float a, float b) {
  switch (op) {
  case UVCCL_PRODUCT: return (float)((double)a * (double)b);
  case UVCCL_MIN: return (float)ref_min(a, b);
  case UVCCL_MAX: return (float)ref_max(a, b);
  default: return (float)((double)a + (double)b);
  }
}

static double ref_f64(int op, double a, double b) {
  switch (op) {
  case UVCCL_PRODUCT: return a * b;
  case UVCCL_MIN: return ref_min(a, b);
  case UVCCL_MAX: return ref_max(a, b);
  default: return a + b;
  }
}

static uint16_t ref_half(int bf, int op, uint16_t a, uint16_t b) {
  float fa = (float)half_val(bf, a), fb = (float)half_val(bf, b);
  return ref_round(bf, ref_f32(op, fa, fb));
}

/* Integers: wide arithmetic, then wrapped into the type by the caller. */
static int64_t ref_int(int op, int64_t a, int64_t b) {
  switch (op) {
  case UVCCL_PRODUCT: return (int64_t)((uint64_t)a * (uint64_t)b);
  case UVCCL_MIN: return a < b ? a : b;
  case UVCCL_MAX: return a > b ? a : b;
  case UVCCL_BAND: return a & b;
  case UVCCL_BOR: return a | b;
  case UVCCL_BXOR: return a ^ b;
  default: return (int64_t)((uint64_t)a + (uint64_t)b);
  }
}

static uint8_t ref_bool(int op, uint8_t a, uint8_t b) {
  switch (op) {
  case UVCCL_PRODUCT:
  case UVCCL_MIN:
  case UVCCL_BAND: return a && b;
  case UVCCL_BXOR: return !a != !b;
  default: return a || b;
  }
}

static size_t esize(int dt) {
  static const size_t s[ND] = {1, 1, 1, 4, 8, 2, 2, 4, 8, 8, 16};
  return s[dt];
}

/* Computes e[i] = a[i] op b[i] with the reference; buffers hold n
 * elements, possibly misaligned (all access via memcpy). */
static void ref_reduce(int dt, int op, void *e, const void *a, const void *b,
                       size_t n) {
  size_t i, k;
  for (i = 0; i < n; i++) {
    const char *pa = (const char *)a + i * esize(dt);
    const char *pb = (const char *)b + i * esize(dt);
    char *pe = (char *)e + i * esize(dt);
    switch (dt) {
    case UVCCL_INT8: {
      int8_t x, y, r;
      memcpy(&x, pa, 1), memcpy(&y, pb, 1);
      r = (int8_t)(uint8_t)ref_int(op, x, y);
      memcpy(pe, &r, 1);
      break;
    }
    case UVCCL_UINT8: {
      uint8_t x, y, r;
      memcpy(&x, pa, 1), memcpy(&y, pb, 1);
      r = (uint8_t)ref_int(op, x, y);
      memcpy(pe, &r, 1);
      break;
    }
    case UVCCL_BOOL: {
      uint8_t x, y, r;
      memcpy(&x, pa, 1), memcpy(&y, pb, 1);
      r = ref_bool(op, x, y);
      memcpy(pe, &r, 1);
      break;
    }
    case UVCCL_INT32: {
      int32_t x, y, r;
      memcpy(&x, pa, 4), memcpy(&y, pb, 4);
      r = (int32_t)(uint32_t)ref_int(op, x, y);
      memcpy(pe, &r, 4);
      break;
    }
    case UVCCL_INT64: {
      int64_t x, y, r;
      memcpy(&x, pa, 8), memcpy(&y, pb, 8);
      r = ref_int(op, x, y);
      memcpy(pe, &r, 8);
      break;
    }
    case UVCCL_FLOAT16:
    case UVCCL_BFLOAT16: {
      uint16_t x, y, r;
      memcpy(&x, pa, 2), memcpy(&y, pb, 2);
      r = ref_half(dt == UVCCL_BFLOAT16, op, x, y);
      memcpy(pe, &r, 2);
      break;
    }
    case UVCCL_FLOAT32:
    case UVCCL_COMPLEX64:
      for (k = 0; k < esize(dt) / 4; k++) {
        float x, y, r;
        memcpy(&x, pa + 4 * k, 4), memcpy(&y, pb + 4 * k, 4);
        r = ref_f32(op, x, y);
        memcpy(pe + 4 * k, &r, 4);
      }
      break;
    default:
      for (k = 0; k < esize(dt) / 8; k++) {
        double x, y, r;
        memcpy(&x, pa + 8 * k, 8), memcpy(&y, pb + 8 * k, 8);
        r = ref_f64(op, x, y);
        memcpy(pe + 8 * k, &r, 8);
      }
      break;
    }
  }
}

/* Index of the first element where got and want differ (NaN equals any
 * NaN; otherwise bit-exact, so -0 != +0), or n. */
static size_t first_diff(int dt, const void *got, const void *want, size_t n) {
  size_t i, k;
  for (i = 0; i < n; i++) {
    const char *g = (const char *)got + i * esize(dt);
    const char *w = (const char *)want + i * esize(dt);
    if (memcmp(g, w, esize(dt)) == 0) continue;
    if (dt == UVCCL_FLOAT16 || dt == UVCCL_BFLOAT16) {
      uint16_t x, y;
      memcpy(&x, g, 2), memcpy(&y, w, 2);
      if (half_is_nan(dt == UVCCL_BFLOAT16, x) &&
          half_is_nan(dt == UVCCL_BFLOAT16, y))
        continue;
    } else if (dt == UVCCL_FLOAT32 || dt == UVCCL_COMPLEX64) {
      for (k = 0; k < esize(dt) / 4; k++) {
        float x, y;
        memcpy(&x, g + 4 * k, 4), memcpy(&y, w + 4 * k, 4);
        if (memcmp(&x, &y, 4) != 0 && !(isnan(x) && isnan(y))) break;
      }
      if (k == esize(dt) / 4) continue;
    } else if (dt == UVCCL_FLOAT64 || dt == UVCCL_COMPLEX128) {
      for (k = 0; k < esize(dt) / 8; k++) {
        double x, y;
        memcpy(&x, g + 8 * k, 8), memcpy(&y, w + 8 * k, 8);
        if (memcmp(&x, &y, 8) != 0 && !(isnan(x) && isnan(y))) break;
      }
      if (k == esize(dt) / 8) continue;
    }
    return i;
  }
  return n;
}

/* ---- Random data --------------------------------------------------------- */

static float rand_f32(void) {
  uint64_t r = rnd();
  switch (r % 64) { /* about 1 in 6: a special value */
  case 0: return 0.0f;
  case 1: return -0.0f;
  case 2: return INFINITY;
  case 3: return -INFINITY;
  case 4: return NAN;
  case 5: return FLT_MIN / 8 * (float)(r >> 60); /* subnormal */
  case 6: return FLT_MAX;
  case 7: return -FLT_MIN;
  case 8: return (float)(r >> 40 & 0xff); /* small integers: ties, equality */
  case 9: return -(float)(r >> 40 & 0x3);
  default:
    return (float)ldexp((double)(r >> 40), (int)(r >> 8 & 63) - 56) *
           ((r & 0x80) ? -1.0f : 1.0f);
  }
}

static double rand_f64(void) {
  uint64_t r = rnd();
  switch (r % 64) {
  case 0: return 0.0;
  case 1: return -0.0;
  case 2: return INFINITY;
  case 3: return -INFINITY;
  case 4: return NAN;
  case 5: return DBL_MIN / 8 * (double)(rnd() >> 60);
  case 6: return DBL_MAX;
  case 7: return (double)(r >> 40 & 0xff);
  case 8: return -(double)(r >> 40 & 0x3);
  default:
    return ldexp((double)(rnd() >> 11), (int)(r >> 8 & 127) - 100) *
           ((r & 0x80) ? -1.0 : 1.0);
  }
}

static uint16_t rand_half(int bf) {
  uint64_t r = rnd();
  if (r & 1) return (uint16_t)(r >> 16); /* any pattern: NaN, inf, subnormal */
  /* Else exponents near 1.0, where sums round most often. */
  if (bf)
    return (uint16_t)((r >> 16 & 0x8000) | ((124 + (r >> 20) % 6) << 7) |
                      (r >> 32 & 0x7f));
  return (uint16_t)((r >> 16 & 0x8000) | ((12 + (r >> 20) % 6) << 10) |
                    (r >> 32 & 0x3ff));
}

static void fill(int dt, void *p, size_t n) {
  size_t i, k;
  char *c = p;
  for (i = 0; i < n; i++, c += esize(dt)) {
    switch (dt) {
    case UVCCL_BOOL: *c = (char)(rnd() & 1); break;
    case UVCCL_FLOAT16:
    case UVCCL_BFLOAT16: {
      uint16_t h = rand_half(dt == UVCCL_BFLOAT16);
      memcpy(c, &h, 2);
      break;
    }
    case UVCCL_FLOAT32:
    case UVCCL_COMPLEX64:
      for (k = 0; k < esize(dt) / 4; k++) {
        float f = rand_f32();
        memcpy(c + 4 * k, &f, 4);
      }
      break;
    case UVCCL_FLOAT64:
    case UVCCL_COMPLEX128:
      for (k = 0; k < esize(dt) / 8; k++) {
        double f = rand_f64();
        memcpy(c + 8 * k, &f, 8);
      }
      break;
    default:
      for (k = 0; k < esize(dt); k++) c[k] = (char)rnd();
    }
  }
}

/* ---- Kernels against the reference -------------------------------------- */

static const size_t sizes[] = {0, 1, 7, 33, 1000, 4099};
#define MAXN 4099
#define PAD 64
#define GUARD 0xa5

static char *buf_a, *buf_b, *buf_d, *buf_want, *in_a, *in_b;

/* Checks the PAD guard bytes on both sides of [p, p + len). */
static int guards_ok(const char *base, size_t off, size_t len) {
  size_t i;
  for (i = 0; i < off; i++)
    if ((unsigned char)base[i] != GUARD) return 0;
  for (i = off + len; i < off + len + PAD; i++)
    if ((unsigned char)base[i] != GUARD) return 0;
  return 1;
}

/* form 0: uvccl_reduce_local(d, b); 1: reduce3(d, a, b) into a third
 * buffer; 2: reduce3(a, a, b); 3: reduce3(b, a, b). Fills why on failure. */
static int check_kernel(int dt, int op, int form, char *why, size_t whylen) {
  uvccl__reduce3_fn fn3 = uvccl__reduce3_get((uvccl_dtype_t)dt,
                                             (uvccl_redop_t)op);
  size_t si, ai, es = esize(dt);
  /* byte offsets of (a, b, d): aligned, odd bytes, whole elements */
  const size_t offs[3][3] = {{0, 0, 0}, {1, 3, 5}, {es, 2 * es, 3 * es}};
  for (si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
    size_t n = sizes[si], len = n * es;
    for (ai = 0; ai < 3; ai++) {
      char *a = buf_a + offs[ai][0], *b = buf_b + offs[ai][1];
      char *d = buf_d + offs[ai][2], *out;
      size_t bad;
      int rc = 0;
      memset(buf_a, GUARD, MAXN * 16 + 2 * PAD);
      memset(buf_b, GUARD, MAXN * 16 + 2 * PAD);
      memset(buf_d, GUARD, MAXN * 16 + 2 * PAD);
      fill(dt, in_a, n);
      fill(dt, in_b, n);
      memcpy(a, in_a, len);
      memcpy(b, in_b, len);
      ref_reduce(dt, op, buf_want, in_a, in_b, n);
      switch (form) {
      case 0: rc = uvccl_reduce_local(a, b, n, (uvccl_dtype_t)dt,
                                      (uvccl_redop_t)op);
        out = a;
        break;
      case 1: fn3(d, a, b, n); out = d; break;
      case 2: fn3(a, a, b, n); out = a; break;
      default: fn3(b, a, b, n); out = b; break;
      }
      if (rc != 0) {
        snprintf(why, whylen, "n=%zu: rc %d", n, rc);
        return 0;
      }
      bad = first_diff(dt, out, buf_want, n);
      if (bad < n) {
        char g[40] = "", w[40] = "";
        size_t k;
        for (k = 0; k < es && k < 16; k++) {
          sprintf(g + 2 * k, "%02x", (unsigned char)out[bad * es + k]);
          sprintf(w + 2 * k, "%02x", (unsigned char)buf_want[bad * es + k]);
        }
        snprintf(why, whylen, "n=%zu align=%zu: [%zu] got %s want %s", n, ai,
                 bad, g, w);
        return 0;
      }
      /* Inputs other than the output untouched; nothing written outside. */
      if ((out != a && memcmp(a, in_a, len) != 0) ||
          (out != b && memcmp(b, in_b, len) != 0) ||
          !guards_ok(buf_a, offs[ai][0], len) ||
          !guards_ok(buf_b, offs[ai][1], len) ||
          (form == 1 && !guards_ok(buf_d, offs[ai][2], len))) {
        snprintf(why, whylen, "n=%zu align=%zu: wrote outside the output",
                 n, ai);
        return 0;
      }
    }
  }
  snprintf(why, whylen, "ok");
  return 1;
}

/* Which pairs are valid: written out, not derived. */
static const char valid[ND][NO] = {
    /*                SUM AVG PROD MIN MAX BAND BOR BXOR PREMUL */
    [UVCCL_INT8] = {1, 1, 1, 1, 1, 1, 1, 1, 0},
    [UVCCL_UINT8] = {1, 1, 1, 1, 1, 1, 1, 1, 0},
    [UVCCL_BOOL] = {1, 0, 1, 1, 1, 1, 1, 1, 0},
    [UVCCL_INT32] = {1, 1, 1, 1, 1, 1, 1, 1, 0},
    [UVCCL_INT64] = {1, 1, 1, 1, 1, 1, 1, 1, 0},
    [UVCCL_FLOAT16] = {1, 1, 1, 1, 1, 0, 0, 0, 1},
    [UVCCL_BFLOAT16] = {1, 1, 1, 1, 1, 0, 0, 0, 1},
    [UVCCL_FLOAT32] = {1, 1, 1, 1, 1, 0, 0, 0, 1},
    [UVCCL_FLOAT64] = {1, 1, 1, 1, 1, 0, 0, 0, 1},
    [UVCCL_COMPLEX64] = {1, 1, 0, 0, 0, 0, 0, 0, 1},
    [UVCCL_COMPLEX128] = {1, 1, 0, 0, 0, 0, 0, 0, 1},
};

static const char *dn(int dt) { return uvccl_dtype_name((uvccl_dtype_t)dt); }
static const char *on(int op) { return uvccl_redop_name((uvccl_redop_t)op); }

static void test_validity(void) {
  int dt, op;
  for (dt = 0; dt < ND; dt++)
    for (op = 0; op < NO; op++) {
      int rc = uvccl_redop_check((uvccl_redop_t)op, (uvccl_dtype_t)dt);
      int has2 = uvccl__reduce_get((uvccl_dtype_t)dt, (uvccl_redop_t)op) != 0;
      int has3 = uvccl__reduce3_get((uvccl_dtype_t)dt, (uvccl_redop_t)op) != 0;
      ok(rc == (valid[dt][op] ? 0 : UV_EINVAL) && has2 == valid[dt][op] &&
             has3 == valid[dt][op],
         "%s %s: %s", dn(dt), on(op), valid[dt][op] ? "valid" : "EINVAL");
    }
  is_int(uvccl_redop_check(UVCCL_REDOP_COUNT, UVCCL_FLOAT32), UV_EINVAL,
         "check: op out of range");
  is_int(uvccl_redop_check((uvccl_redop_t)-1, UVCCL_FLOAT32), UV_EINVAL,
         "check: negative op");
  is_int(uvccl_redop_check(UVCCL_SUM, UVCCL_DTYPE_COUNT), UV_EINVAL,
         "check: dtype out of range");
  is_int(uvccl_redop_check(UVCCL_SUM, (uvccl_dtype_t)-1), UV_EINVAL,
         "check: negative dtype");
  ok(uvccl__reduce_get(UVCCL_DTYPE_COUNT, UVCCL_SUM) == NULL &&
         uvccl__reduce_get(UVCCL_FLOAT32, (uvccl_redop_t)99) == NULL &&
         uvccl__reduce3_get((uvccl_dtype_t)-7, UVCCL_SUM) == NULL,
     "reduce_get: NULL out of range");
  ok(uvccl__reduce_get(UVCCL_FLOAT32, UVCCL_AVG) ==
             uvccl__reduce_get(UVCCL_FLOAT32, UVCCL_SUM) &&
         uvccl__reduce_get(UVCCL_BFLOAT16, UVCCL_PREMUL_SUM) ==
             uvccl__reduce_get(UVCCL_BFLOAT16, UVCCL_SUM) &&
         uvccl__reduce_get(UVCCL_INT32, UVCCL_AVG) ==
             uvccl__reduce_get(UVCCL_INT32, UVCCL_SUM),
     "AVG and PREMUL_SUM reduce with the SUM kernel");
}

static void test_kernels(int isa) {
  int dt, op, form;
  char why[200];
  static const char *const forms[] = {"reduce_local", "reduce3 d=a op b",
                                      "reduce3 a=a op b", "reduce3 b=a op b"};
  for (dt = 0; dt < ND; dt++)
    for (op = 0; op < NO; op++) {
      if (!valid[dt][op]) continue;
      for (form = 0; form < 4; form++)
        ok(check_kernel(dt, op, form, why, sizeof(why)), "%s %s %s %s: %s",
           uvccl__reduce_isa_name(isa), forms[form], dn(dt), on(op), why);
    }
}

/* ---- Special values ------------------------------------------------------ */

static float f32_red(int op, float a, float b) {
  uvccl_reduce_local(&a, &b, 1, UVCCL_FLOAT32, (uvccl_redop_t)op);
  return a;
}

static double f64_red(int op, double a, double b) {
  uvccl_reduce_local(&a, &b, 1, UVCCL_FLOAT64, (uvccl_redop_t)op);
  return a;
}

/* Reduces 40 copies of x and y, so both the vector steps and the scalar
 * tail see them; they must all agree (else 0xdead). */
static uint16_t half_red(int dt, int op, uint16_t x, uint16_t y) {
  uint16_t a[40], b[40];
  int i;
  for (i = 0; i < 40; i++) a[i] = x, b[i] = y;
  uvccl_reduce_local(a, b, 40, (uvccl_dtype_t)dt, (uvccl_redop_t)op);
  for (i = 1; i < 40; i++)
    if (a[i] != a[0]) return 0xdead; /* lanes disagree */
  return a[37];
}

static void test_specials(void) {
  float nf = NAN, inf = INFINITY;
  double nd = NAN;

  /* NaN propagation in MIN/MAX, both orders, both widths. */
  ok(isnan(f32_red(UVCCL_MIN, nf, 1.0f)) && isnan(f32_red(UVCCL_MIN, 1.0f, nf)),
     "f32 min: NaN either side wins");
  ok(isnan(f32_red(UVCCL_MAX, nf, 1.0f)) && isnan(f32_red(UVCCL_MAX, 1.0f, nf)),
     "f32 max: NaN either side wins");
  ok(isnan(f32_red(UVCCL_MAX, inf, nf)) && isnan(f32_red(UVCCL_MIN, -inf, nf)),
     "f32 max(inf, NaN) and min(-inf, NaN) are NaN");
  ok(isnan(f64_red(UVCCL_MIN, nd, -1e300)) &&
         isnan(f64_red(UVCCL_MAX, 1e300, nd)),
     "f64 min/max: NaN wins");
  /* Signed zeros, both orders. */
  ok(signbit(f32_red(UVCCL_MIN, -0.0f, 0.0f)) &&
         signbit(f32_red(UVCCL_MIN, 0.0f, -0.0f)),
     "f32 min(-0, +0) = -0 in either order");
  ok(!signbit(f32_red(UVCCL_MAX, -0.0f, 0.0f)) &&
         !signbit(f32_red(UVCCL_MAX, 0.0f, -0.0f)),
     "f32 max(-0, +0) = +0 in either order");
  ok(signbit(f64_red(UVCCL_MIN, 0.0, -0.0)) &&
         !signbit(f64_red(UVCCL_MAX, -0.0, 0.0)),
     "f64 min/max of signed zeros");
  ok(signbit(f32_red(UVCCL_SUM, -0.0f, -0.0f)) &&
         !signbit(f32_red(UVCCL_SUM, -0.0f, 0.0f)),
     "f32 -0 + -0 = -0, -0 + +0 = +0");
  /* Infinities. */
  ok(isnan(f32_red(UVCCL_SUM, inf, -inf)), "f32 inf + -inf = NaN");
  ok(f32_red(UVCCL_SUM, inf, 1e30f) == inf, "f32 inf + x = inf");
  ok(f32_red(UVCCL_SUM, FLT_MAX, FLT_MAX) == inf, "f32 overflow to inf");
  ok(isnan(f32_red(UVCCL_PRODUCT, inf, 0.0f)), "f32 inf * 0 = NaN");
  ok(f32_red(UVCCL_MIN, -inf, 5.0f) == -inf &&
         f32_red(UVCCL_MAX, -inf, 5.0f) == 5.0f,
     "f32 min/max with -inf");
  ok(f64_red(UVCCL_PRODUCT, -inf, 2.0) == -inf, "f64 -inf * 2 = -inf");
  /* Subnormal floats are not flushed. */
  ok(f32_red(UVCCL_SUM, FLT_TRUE_MIN, FLT_TRUE_MIN) == 2 * FLT_TRUE_MIN,
     "f32 subnormal sum");
  ok(f64_red(UVCCL_PRODUCT, DBL_MIN, 0.5) == DBL_MIN / 2,
     "f64 product into the subnormals");
  ok(f32_red(UVCCL_MIN, FLT_TRUE_MIN, 0.0f) == 0.0f &&
         f32_red(UVCCL_MAX, FLT_TRUE_MIN, 0.0f) == FLT_TRUE_MIN,
     "f32 min/max of a subnormal and 0");

  /* float16. */
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x3c00, 0x3c00), 0x4000,
         "f16 1 + 1 = 2");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x7bff, 0x4c00), 0x7c00,
         "f16 65504 + 16 = inf (tie rounds to even: up)");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x7bff, 0x4b80), 0x7bff,
         "f16 65504 + 15 = 65504");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0xfbff, 0xcc00), 0xfc00,
         "f16 -65504 - 16 = -inf");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x0001, 0x0001), 0x0002,
         "f16 subnormal + subnormal");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x03ff, 0x0001), 0x0400,
         "f16 largest subnormal + ulp = smallest normal");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x0400, 0x8001), 0x03ff,
         "f16 smallest normal - ulp = largest subnormal");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_PRODUCT, 0x0001, 0x3800), 0x0000,
         "f16 2^-24 * 0.5: tie to even gives 0");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_PRODUCT, 0x0003, 0x3800), 0x0002,
         "f16 3 * 2^-24 * 0.5: tie to even gives 2 * 2^-24");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_PRODUCT, 0x8001, 0x3800), 0x8000,
         "f16 -2^-25 rounds to -0");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x3c00, 0x1000), 0x3c00,
         "f16 1 + 2^-11 (tie): stays 1");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x3c01, 0x1000), 0x3c02,
         "f16 (1 + 2^-10) + 2^-11 (tie): to even, up");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x8000, 0x8000), 0x8000,
         "f16 -0 + -0 = -0");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x8000, 0x0000), 0x0000,
         "f16 -0 + 0 = 0");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_MIN, 0x0000, 0x8000), 0x8000,
         "f16 min(0, -0) = -0");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_MAX, 0x8000, 0x0000), 0x0000,
         "f16 max(-0, 0) = 0");
  ok(half_is_nan(0, half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x7c00, 0xfc00)),
     "f16 inf - inf = NaN");
  ok(half_is_nan(0, half_red(UVCCL_FLOAT16, UVCCL_MAX, 0x7e00, 0x3c00)) &&
         half_is_nan(0, half_red(UVCCL_FLOAT16, UVCCL_MIN, 0x3c00, 0x7e01)),
     "f16 min/max: NaN wins");
  ok(half_is_nan(0, half_red(UVCCL_FLOAT16, UVCCL_SUM, 0x7c01, 0x0000)),
     "f16 signalling NaN stays a NaN");
  is_int(half_red(UVCCL_FLOAT16, UVCCL_MAX, 0x7c00, 0x7bff), 0x7c00,
         "f16 max(inf, 65504) = inf");

  /* bfloat16. */
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x3f80, 0x3b80), 0x3f80,
         "bf16 1 + 2^-8 (tie): to even, stays 1");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x3f81, 0x3b80), 0x3f82,
         "bf16 (1 + 2^-7) + 2^-8 (tie): to even, up");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x3f80, 0x3b81), 0x3f81,
         "bf16 1 + just over half an ulp rounds up");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0xbf80, 0xbb80), 0xbf80,
         "bf16 negative tie to even");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x7f7f, 0x7f7f), 0x7f80,
         "bf16 max + max = inf");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x7f7f, 0x7b00), 0x7f80,
         "bf16 max + half an ulp: tie rounds to even (inf)");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x0001, 0x0001), 0x0002,
         "bf16 subnormals add exactly");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x007f, 0x0001), 0x0080,
         "bf16 largest subnormal + ulp = smallest normal");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_MIN, 0x0000, 0x8000), 0x8000,
         "bf16 min(0, -0) = -0");
  ok(half_is_nan(1, half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x7fc1, 0x3f80)),
     "bf16 NaN + 1 = NaN");
  ok(half_is_nan(1, half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0x7f81, 0x0000)) &&
         half_is_nan(1, half_red(UVCCL_BFLOAT16, UVCCL_SUM, 0xffff, 0x0000)),
     "bf16 NaNs that rounding would carry into inf stay NaN");
  ok(half_is_nan(1, half_red(UVCCL_BFLOAT16, UVCCL_MIN, 0x3f80, 0xffc0)),
     "bf16 min: NaN wins");
  is_int(half_red(UVCCL_BFLOAT16, UVCCL_PRODUCT, 0x4000, 0xc040), 0xc0c0,
         "bf16 2 * -3 = -6");

  /* Booleans: results are 0/1 even from non-canonical bytes. */
  {
    uint8_t a[4] = {0, 1, 2, 2}, b[4] = {2, 0, 1, 0};
    uvccl_reduce_local(a, b, 4, UVCCL_BOOL, UVCCL_BOR);
    ok(a[0] == 1 && a[1] == 1 && a[2] == 1 && a[3] == 1,
       "bool OR normalises to 1");
    a[0] = 2, a[1] = 1, a[2] = 0, a[3] = 2;
    b[0] = 1, b[1] = 2, b[2] = 2, b[3] = 0;
    uvccl_reduce_local(a, b, 4, UVCCL_BOOL, UVCCL_BAND);
    ok(a[0] == 1 && a[1] == 1 && a[2] == 0 && a[3] == 0,
       "bool AND is logical");
    a[0] = 2, a[1] = 1, a[2] = 0, a[3] = 2;
    b[0] = 1, b[1] = 0, b[2] = 2, b[3] = 2;
    uvccl_reduce_local(a, b, 4, UVCCL_BOOL, UVCCL_BXOR);
    ok(a[0] == 0 && a[1] == 1 && a[2] == 1 && a[3] == 0,
       "bool XOR is logical");
  }
  /* Integer wrap-around and extremes. */
  {
    int32_t a[3] = {INT32_MAX, INT32_MIN, 65536}, b[3] = {1, -1, 65536};
    int64_t c[2] = {INT64_MAX, INT64_MIN}, d[2] = {1, INT64_MIN};
    int8_t e[2] = {127, -128}, f[2] = {1, -1};
    uvccl_reduce_local(a, b, 3, UVCCL_INT32, UVCCL_SUM);
    ok(a[0] == INT32_MIN && a[1] == INT32_MAX && a[2] == 131072,
       "int32 SUM wraps");
    a[0] = 65536, b[0] = 65536, a[1] = INT32_MIN, b[1] = -1;
    uvccl_reduce_local(a, b, 2, UVCCL_INT32, UVCCL_PRODUCT);
    ok(a[0] == 0 && a[1] == INT32_MIN, "int32 PRODUCT wraps");
    uvccl_reduce_local(c, d, 2, UVCCL_INT64, UVCCL_SUM);
    ok(c[0] == INT64_MIN && c[1] == 0, "int64 SUM wraps");
    uvccl_reduce_local(e, f, 2, UVCCL_INT8, UVCCL_SUM);
    ok(e[0] == -128 && e[1] == 127, "int8 SUM wraps");
    e[0] = -128, f[0] = 127;
    uvccl_reduce_local(e, f, 1, UVCCL_INT8, UVCCL_MIN);
    is_int(e[0], -128, "int8 MIN is signed");
    {
      uint8_t g = 200, h = 100;
      uvccl_reduce_local(&g, &h, 1, UVCCL_UINT8, UVCCL_MAX);
      is_int(g, 200, "uint8 MAX is unsigned");
    }
  }
  /* Complex: element-wise on the pairs. */
  {
    float a[4] = {1, 2, -0.0f, inf}, b[4] = {0.5f, -2, -0.0f, 1};
    double c[2] = {1e300, -1}, d[2] = {1e300, 0.25};
    uvccl_reduce_local(a, b, 2, UVCCL_COMPLEX64, UVCCL_SUM);
    ok(a[0] == 1.5f && a[1] == 0 && signbit(a[2]) && a[3] == inf,
       "complex64 SUM by parts");
    uvccl_reduce_local(c, d, 1, UVCCL_COMPLEX128, UVCCL_AVG);
    ok(c[0] == 2e300 && c[1] == -0.75, "complex128 AVG reduces as SUM");
  }
}

/* ---- Conversions --------------------------------------------------------- */

static void test_conversions(void) {
  unsigned h, bad16 = 0, bad16r = 0, badbf = 0, badbfr = 0;
  unsigned bad16_mid = 0, badbf_mid = 0;
  uint64_t i, bad_round16 = 0, bad_roundbf = 0, first16 = 0, firstbf = 0;
  for (h = 0; h < 65536; h++) {
    float f = uvccl__f16_to_f32((uint16_t)h);
    uint16_t g;
    double v = f16_val[h];
    if (half_is_nan(0, (uint16_t)h) ? !isnan(f)
                                    : !(f == v && !signbit(f) == !signbit(v)))
      bad16++;
    g = uvccl__f32_to_f16(f);
    if (half_is_nan(0, (uint16_t)h) ? !half_is_nan(0, (uint16_t)g) : g != h)
      bad16r++;
    f = uvccl__bf16_to_f32((uint16_t)h);
    v = bf16_val[h];
    if (half_is_nan(1, (uint16_t)h) ? !isnan(f)
                                    : !(f == v && !signbit(f) == !signbit(v)))
      badbf++;
    g = uvccl__f32_to_bf16(f);
    if (half_is_nan(1, (uint16_t)h) ? !half_is_nan(1, (uint16_t)g) : g != h)
      badbfr++;
  }
  is_int(bad16, 0, "f16 -> f32 exact for all 65536 halfs");
  is_int(bad16r, 0, "f16 -> f32 -> f16 round trips (NaN stays NaN)");
  is_int(badbf, 0, "bf16 -> f32 exact for all 65536");
  is_int(badbfr, 0, "bf16 -> f32 -> bf16 round trips");
  /* Rounding: every midpoint between neighbouring halfs (exact in float),
   * its two float neighbours and its negation; then random floats. */
  for (h = 0; h < 0x7f80; h++) {
    int bf;
    for (bf = 0; bf < 2; bf++) {
      double lo, hi;
      float mid, probe[6];
      int k;
      if (!bf && h >= 0x7c00) continue;
      lo = half_val(bf, (uint16_t)h);
      hi = h == (bf ? 0x7f7fu : 0x7bffu) ? (bf ? ldexp(1, 128) : 65536.0)
                                         : half_val(bf, (uint16_t)(h + 1));
      mid = (float)((lo + hi) / 2);
      probe[0] = mid, probe[1] = nextafterf(mid, 0);
      probe[2] = nextafterf(mid, INFINITY);
      probe[3] = -mid, probe[4] = -probe[1], probe[5] = -probe[2];
      for (k = 0; k < 6; k++) {
        uint16_t got = bf ? uvccl__f32_to_bf16(probe[k])
                          : uvccl__f32_to_f16(probe[k]);
        if (got != ref_round(bf, probe[k])) {
          if (bf ? !badbf_mid++ : !bad16_mid++)
            note("%s: %a -> %04x, want %04x", bf ? "bf16" : "f16",
                 (double)probe[k], got, ref_round(bf, probe[k]));
        }
      }
    }
  }
  is_int(bad16_mid, 0, "f32 -> f16: ties to even, neighbours to nearest");
  is_int(badbf_mid, 0, "f32 -> bf16: ties to even, neighbours to nearest");
  for (i = 0; i < 300000; i++) {
    uint32_t u = (uint32_t)rnd();
    float f;
    if (i & 1) /* half the time, the exponents halfs can represent */
      u = (u & 0x80000000u) | (0x33000000u + u % 0x15000000u);
    memcpy(&f, &u, 4);
    if (isnan(f) ? !half_is_nan(0, uvccl__f32_to_f16(f))
                 : uvccl__f32_to_f16(f) != ref_round(0, f)) {
      if (!bad_round16) first16 = u;
      bad_round16++;
    }
    if (isnan(f) ? !half_is_nan(1, uvccl__f32_to_bf16(f))
                 : uvccl__f32_to_bf16(f) != ref_round(1, f)) {
      if (!bad_roundbf) firstbf = u;
      bad_roundbf++;
    }
  }
  ok(bad_round16 == 0, "f32 -> f16 on random floats (%llu bad, first %08llx)",
     (unsigned long long)bad_round16, (unsigned long long)first16);
  ok(bad_roundbf == 0, "f32 -> bf16 on random floats (%llu bad, first %08llx)",
     (unsigned long long)bad_roundbf, (unsigned long long)firstbf);
  {
    float qn, sn;
    uint32_t u = 0x7fa00001u; /* signalling, payload in low bits only */
    memcpy(&sn, &u, 4);
    u = 0xffc00000u;
    memcpy(&qn, &u, 4);
    ok(half_is_nan(0, uvccl__f32_to_f16(sn)) &&
           half_is_nan(1, uvccl__f32_to_bf16(sn)),
       "signalling float NaN -> half NaN (not inf)");
    ok(uvccl__f32_to_f16(qn) & 0x8000 && uvccl__f32_to_bf16(qn) & 0x8000,
       "NaN sign kept");
    is_int(uvccl__f32_to_f16(FLT_MAX), 0x7c00, "f16(FLT_MAX) = inf");
    is_int(uvccl__f32_to_bf16(FLT_MAX), 0x7f80, "bf16(FLT_MAX) = inf");
    is_int(uvccl__f32_to_f16(FLT_TRUE_MIN), 0x0000, "f16(tiny) = 0");
    is_int(uvccl__f32_to_bf16(-0x1p-130f), 0x8008,
           "bf16 keeps float subnormals (-2^-130 -> 0x8008)");
    is_int(uvccl__f32_to_bf16(-FLT_TRUE_MIN), 0x8000,
           "bf16(-2^-149) = -0");
    is_int(uvccl__f32_to_f16(-0x1p-25f), 0x8000,
           "f16(-2^-25): tie to even gives -0");
    is_int(uvccl__f32_to_f16(0x1.8p-24f), 0x0002,
           "f16(1.5 * 2^-24): tie to even gives 2 * 2^-24");
  }
#ifdef __FLT16_MAX__
  /* The compiler's own _Float16 conversion agrees too (GCC 12, x86-64). */
  {
    unsigned long bad = 0;
    for (i = 0; i < 200000; i++) {
      uint32_t u = (uint32_t)rnd();
      float f;
      _Float16 c;
      uint16_t cb;
      u = (u & 0x80000000u) | (0x30000000u + u % 0x18000000u);
      memcpy(&f, &u, 4);
      c = (_Float16)f;
      memcpy(&cb, &c, 2);
      if (cb != uvccl__f32_to_f16(f)) bad++;
    }
    is_int(bad, 0, "f32 -> f16 agrees with the compiler's _Float16");
  }
#endif
}

/* ---- Names and sizes ----------------------------------------------------- */

static void test_names(void) {
  static const char *const dnames[ND] = {
      "int8",     "uint8",   "bool",    "int32",     "int64",     "float16",
      "bfloat16", "float32", "float64", "complex64", "complex128",
      "float8_e4m3fn", "float8_e5m2"};
  static const size_t dsizes[ND] = {1, 1, 1, 4, 8, 2, 2, 4, 8, 8, 16, 1, 1};
  static const char *const onames[NO] = {"sum",  "avg",  "product",
                                         "min",  "max",  "band",
                                         "bor",  "bxor", "premul_sum"};
  static const struct {
    const char *name;
    int dt;
  } dalias[] = {
      {"float", UVCCL_FLOAT32},   {"double", UVCCL_FLOAT64},
      {"half", UVCCL_FLOAT16},    {"int", UVCCL_INT32},
      {"long", UVCCL_INT64},      {"bf16", UVCCL_BFLOAT16},
      {"fp16", UVCCL_FLOAT16},    {"fp32", UVCCL_FLOAT32},
      {"fp64", UVCCL_FLOAT64},    {"byte", UVCCL_UINT8},
      {"char", UVCCL_INT8},       {"cfloat", UVCCL_COMPLEX64},
      {"cdouble", UVCCL_COMPLEX128}, {"FLOAT32", UVCCL_FLOAT32},
      {"BFloat16", UVCCL_BFLOAT16}, {"torch.float16", UVCCL_FLOAT16},
      {"torch.bool", UVCCL_BOOL},  {"Torch.Int64", UVCCL_INT64},
      {"torch.float8_e4m3fn", UVCCL_FLOAT8_E4M3},
      {"float8_e4m3", UVCCL_FLOAT8_E4M3}, {"E5M2", UVCCL_FLOAT8_E5M2},
  };
  static const struct {
    const char *name;
    int op;
  } oalias[] = {
      {"prod", UVCCL_PRODUCT},     {"avg", UVCCL_AVG},
      {"average", UVCCL_AVG},      {"SUM", UVCCL_SUM},
      {"Max", UVCCL_MAX},          {"PREMUL_SUM", UVCCL_PREMUL_SUM},
      {"ReduceOp.BXOR", UVCCL_BXOR}, {"reduceop.min", UVCCL_MIN},
      {"and", UVCCL_BAND},         {"xor", UVCCL_BXOR},
  };
  static const char *const bad[] = {"", "float8", "int16", "floa",
                                    "float32 ", "torch.", "complex"};
  int i;
  for (i = 0; i < ND; i++) {
    uvccl_dtype_t d = UVCCL_DTYPE_COUNT;
    is_str(uvccl_dtype_name((uvccl_dtype_t)i), dnames[i], "dtype %d name", i);
    is_int(uvccl_dtype_size((uvccl_dtype_t)i), dsizes[i], "%s size", dnames[i]);
    ok(uvccl_dtype_from_name(dnames[i], &d) == 0 && (int)d == i,
       "%s parses back", dnames[i]);
  }
  for (i = 0; i < NO; i++) {
    uvccl_redop_t o = UVCCL_REDOP_COUNT;
    is_str(uvccl_redop_name((uvccl_redop_t)i), onames[i], "op %d name", i);
    ok(uvccl_redop_from_name(onames[i], &o) == 0 && (int)o == i,
       "%s parses back", onames[i]);
  }
  for (i = 0; i < (int)(sizeof(dalias) / sizeof(dalias[0])); i++) {
    uvccl_dtype_t d = UVCCL_DTYPE_COUNT;
    int rc = uvccl_dtype_from_name(dalias[i].name, &d);
    ok(rc == 0 && (int)d == dalias[i].dt, "dtype alias '%s' -> %s",
       dalias[i].name, dn(dalias[i].dt));
  }
  for (i = 0; i < (int)(sizeof(oalias) / sizeof(oalias[0])); i++) {
    uvccl_redop_t o = UVCCL_REDOP_COUNT;
    int rc = uvccl_redop_from_name(oalias[i].name, &o);
    ok(rc == 0 && (int)o == oalias[i].op, "op alias '%s' -> %s",
       oalias[i].name, on(oalias[i].op));
  }
  for (i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
    uvccl_dtype_t d = UVCCL_FLOAT32;
    uvccl_redop_t o = UVCCL_SUM;
    ok(uvccl_dtype_from_name(bad[i], &d) == UV_EINVAL &&
           uvccl_redop_from_name(bad[i], &o) == UV_EINVAL &&
           d == UVCCL_FLOAT32 && o == UVCCL_SUM,
       "'%s' is no name (output untouched)", bad[i]);
  }
  {
    uvccl_dtype_t d;
    uvccl_redop_t o;
    ok(uvccl_dtype_from_name(NULL, &d) == UV_EINVAL &&
           uvccl_dtype_from_name("float", NULL) == UV_EINVAL &&
           uvccl_redop_from_name(NULL, &o) == UV_EINVAL &&
           uvccl_redop_from_name("sum", NULL) == UV_EINVAL,
       "from_name: NULL arguments");
  }
  ok(uvccl_dtype_name(UVCCL_DTYPE_COUNT) == NULL &&
         uvccl_dtype_name((uvccl_dtype_t)-1) == NULL &&
         uvccl_dtype_size(UVCCL_DTYPE_COUNT) == 0 &&
         uvccl_dtype_size((uvccl_dtype_t)-1) == 0,
     "invalid dtype: no name, size 0");
  ok(uvccl_redop_name(UVCCL_REDOP_COUNT) == NULL &&
         uvccl_redop_name((uvccl_redop_t)-1) == NULL,
     "invalid op: no name");
}

/* ---- Arguments ----------------------------------------------------------- */

static void test_args(void) {
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int i;
  is_int(uvccl_reduce_local(NULL, NULL, 0, UVCCL_FLOAT32, UVCCL_SUM), 0,
         "count 0 with NULL buffers is a no-op");
  is_int(uvccl_reduce_local(NULL, a, 1, UVCCL_FLOAT32, UVCCL_SUM), UV_EINVAL,
         "NULL dst");
  is_int(uvccl_reduce_local(a, NULL, 1, UVCCL_FLOAT32, UVCCL_SUM), UV_EINVAL,
         "NULL src");
  is_int(uvccl_reduce_local(a, a, 0, UVCCL_FLOAT32, UVCCL_BAND), UV_EINVAL,
         "invalid pair fails even with count 0");
  is_int(uvccl_reduce_local(a, a, 1, UVCCL_DTYPE_COUNT, UVCCL_SUM), UV_EINVAL,
         "invalid dtype");
  is_int(uvccl_reduce_local(a, a, 1, UVCCL_FLOAT32, UVCCL_REDOP_COUNT),
         UV_EINVAL, "invalid op");
  is_int(uvccl_reduce_local(a + 1, a, 4, UVCCL_FLOAT32, UVCCL_SUM), UV_EINVAL,
         "partial overlap refused");
  is_int(uvccl_reduce_local(a, a + 4, 4, UVCCL_FLOAT32, UVCCL_SUM), 0,
         "adjacent buffers are fine");
  ok(a[0] == 6 && a[3] == 12 && a[4] == 5, "adjacent: values");
  is_int(uvccl_reduce_local(a, a, 8, UVCCL_FLOAT32, UVCCL_SUM), 0,
         "dst == src allowed");
  ok(a[0] == 12 && a[7] == 16, "dst == src doubles");
  is_int(uvccl_reduce_local(a, a, SIZE_MAX / 2, UVCCL_FLOAT32, UVCCL_SUM),
         UV_EINVAL, "count overflowing the address space");
  for (i = 0; i < UVCCL__ISA_COUNT; i++)
    ok(uvccl__reduce_isa_name(i) != NULL, "tier %d is %s%s", i,
       uvccl__reduce_isa_name(i),
       uvccl__reduce_isa_supported(i) ? "" : " (not on this CPU)");
  ok(uvccl__reduce_isa_name(-1) == NULL &&
         uvccl__reduce_isa_name(UVCCL__ISA_COUNT) == NULL,
     "tier names out of range");
  ok(uvccl__reduce_set_isa(-1) == UV_EINVAL &&
         uvccl__reduce_set_isa(UVCCL__ISA_COUNT) == UV_EINVAL,
     "set_isa out of range");
  ok(uvccl__reduce_isa_supported(UVCCL__ISA_GENERIC),
     "the portable tier always runs");
}

/* ---- Scaling and division ------------------------------------------------ */

static void test_scale_divide(void) {
  int dt, i;
  for (dt = 0; dt < ND; dt++) {
    char buf[64] = {0};
    /* float8 only moves data: no arithmetic at all */
    int f8 = dt == UVCCL_FLOAT8_E4M3 || dt == UVCCL_FLOAT8_E5M2;
    int fl = dt >= UVCCL_FLOAT16 && !f8;
    int dv = dt != UVCCL_BOOL && !f8;
    is_int(uvccl_scale_local(buf, 2, (uvccl_dtype_t)dt, 0.5),
           fl ? 0 : UV_EINVAL,
           "scale_local %s: %s", dn(dt), fl ? "ok" : "EINVAL");
    is_int(uvccl_divide_local(buf, 2, (uvccl_dtype_t)dt, 3),
           dv ? 0 : UV_EINVAL, "divide_local %s: %s", dn(dt),
           dv ? "ok" : "EINVAL");
    is_int(uvccl_divide_local(buf, 2, (uvccl_dtype_t)dt, 0), UV_EINVAL,
           "divide_local %s by 0: EINVAL", dn(dt));
  }
  ok(uvccl_scale_local(NULL, 1, UVCCL_FLOAT32, 2) == UV_EINVAL &&
         uvccl_divide_local(NULL, 1, UVCCL_INT32, 2) == UV_EINVAL &&
         uvccl_scale_local(NULL, 0, UVCCL_FLOAT32, 2) == 0 &&
         uvccl_divide_local(NULL, 0, UVCCL_INT32, 2) == 0,
     "NULL buffer: EINVAL unless count is 0");
  ok(uvccl_scale_local(NULL, 0, UVCCL_DTYPE_COUNT, 2) == UV_EINVAL &&
         uvccl_divide_local(NULL, 0, (uvccl_dtype_t)-1, 2) == UV_EINVAL,
     "invalid dtype: EINVAL");
  {
    float f[5] = {1, 2, 3, -0.0f, INFINITY};
    double d[3] = {1, 3, 1e308};
    float c[4] = {2, -4, 6, 8};
    uvccl_scale_local(f, 5, UVCCL_FLOAT32, 0.5);
    ok(f[0] == 0.5f && f[1] == 1 && f[2] == 1.5f && signbit(f[3]) &&
           f[4] == INFINITY,
       "float32 scale by 0.5");
    f[0] = 3;
    uvccl_scale_local(f, 1, UVCCL_FLOAT32, 1.0 / 3);
    ok(f[0] == 3 * (float)(1.0 / 3), "float32 scales by the factor as float");
    uvccl_scale_local(d, 3, UVCCL_FLOAT64, 1.0 / 3);
    ok(d[0] == 1.0 / 3 && d[1] == 3 * (1.0 / 3) && d[2] == 1e308 * (1.0 / 3),
       "float64 scales by the double factor");
    uvccl_scale_local(c, 2, UVCCL_COMPLEX64, -0.25);
    ok(c[0] == -0.5f && c[1] == 1 && c[2] == -1.5f && c[3] == -2,
       "complex64 scales both parts");
  }
  {
    /* Halfs: widen, multiply in float by the float factor, round once. */
    int dtt, bf;
    for (dtt = 0; dtt < 2; dtt++) {
      uint16_t h[512], want[512];
      unsigned bad = 0;
      bf = dtt;
      for (i = 0; i < 512; i++) {
        h[i] = rand_half(bf);
        want[i] = ref_round(bf, (float)half_val(bf, h[i]) * (float)(1.0 / 3));
      }
      uvccl_scale_local(h, 512, bf ? UVCCL_BFLOAT16 : UVCCL_FLOAT16, 1.0 / 3);
      for (i = 0; i < 512; i++)
        if (h[i] != want[i] &&
            !(half_is_nan(bf, h[i]) && half_is_nan(bf, want[i])))
          bad++;
      is_int(bad, 0, "%s scale by 1/3 rounds once",
             bf ? "bfloat16" : "float16");
      for (i = 0; i < 512; i++) {
        h[i] = rand_half(bf);
        want[i] = ref_round(bf, (float)half_val(bf, h[i]) / 7.0f);
      }
      uvccl_divide_local(h, 512, bf ? UVCCL_BFLOAT16 : UVCCL_FLOAT16, 7);
      for (bad = 0, i = 0; i < 512; i++)
        if (h[i] != want[i] &&
            !(half_is_nan(bf, h[i]) && half_is_nan(bf, want[i])))
          bad++;
      is_int(bad, 0, "%s divide by 7 rounds once", bf ? "bfloat16" : "float16");
    }
  }
  {
    float f[4] = {3, 6, 9, 10};
    double d[2] = {9, -1};
    double z[4] = {6, -9, 1, 0};
    uvccl_divide_local(f, 4, UVCCL_FLOAT32, 3);
    ok(f[0] == 1 && f[1] == 2 && f[2] == 3 && f[3] == 10.0f / 3,
       "float32 divide: exact results stay exact");
    uvccl_divide_local(d, 2, UVCCL_FLOAT64, -4);
    ok(d[0] == -2.25 && d[1] == 0.25, "float64 divide by -4");
    uvccl_divide_local(z, 2, UVCCL_COMPLEX128, 3);
    ok(z[0] == 2 && z[1] == -3 && z[2] == 1.0 / 3 && z[3] == 0,
       "complex128 divides both parts");
  }
  {
    int32_t a[8] = {7, -7, 6, -6, INT32_MIN, INT32_MAX, 1, -1};
    int64_t b[3] = {INT64_MIN, INT64_MAX, -5};
    int8_t c[3] = {-128, 127, -3};
    uvccl_divide_local(a, 8, UVCCL_INT32, 2);
    ok(a[0] == 3 && a[1] == -3 && a[2] == 3 && a[3] == -3 &&
           a[4] == INT32_MIN / 2 && a[5] == INT32_MAX / 2 && a[6] == 0 &&
           a[7] == 0,
       "int32 divide truncates toward zero");
    a[0] = INT32_MIN, a[1] = 5;
    is_int(uvccl_divide_local(a, 2, UVCCL_INT32, -1), 0, "int32 / -1");
    ok(a[0] == INT32_MIN && a[1] == -5, "INT32_MIN / -1 wraps, no trap");
    is_int(uvccl_divide_local(b, 3, UVCCL_INT64, -1), 0, "int64 / -1");
    ok(b[0] == INT64_MIN && b[1] == -INT64_MAX && b[2] == 5,
       "INT64_MIN / -1 wraps, no trap");
    b[0] = INT64_MIN, b[1] = INT64_MAX, b[2] = -5;
    uvccl_divide_local(b, 3, UVCCL_INT64, 2);
    ok(b[0] == INT64_MIN / 2 && b[1] == INT64_MAX / 2 && b[2] == -2,
       "int64 divide truncates");
    uvccl_divide_local(c, 3, UVCCL_INT8, -1);
    ok(c[0] == -128 && c[1] == -127 && c[2] == 3, "int8 / -1 wraps");
  }
  {
    /* Every int8 and uint8 value by awkward divisors; int32 and int64 on
     * random values; against C's own division in int64. */
    static const int64_t divs[] = {2,   3,   -2,  -3,  7,      -7,       127,
                                   128, -128, 255, 256, -1000, INT64_MAX,
                                   INT64_MIN, 2147483648LL, -2147483647LL};
    size_t k;
    for (k = 0; k < sizeof(divs) / sizeof(divs[0]); k++) {
      int8_t s8[256];
      uint8_t u8[256];
      int32_t s32[1000], w32[1000];
      int64_t s64[1000], w64[1000];
      unsigned bad = 0;
      int64_t dv = divs[k];
      for (i = 0; i < 256; i++) s8[i] = (int8_t)i, u8[i] = (uint8_t)i;
      uvccl_divide_local(s8, 256, UVCCL_INT8, dv);
      uvccl_divide_local(u8, 256, UVCCL_UINT8, dv);
      for (i = 0; i < 256; i++) {
        if (s8[i] != (int8_t)(uint8_t)((int64_t)(int8_t)i / dv)) bad++;
        if (u8[i] != (uint8_t)((int64_t)i / dv)) bad++;
      }
      for (i = 0; i < 1000; i++) {
        s32[i] = i < 4 ? (int32_t[]){INT32_MIN, INT32_MAX, 0, -1}[i]
                       : (int32_t)(rnd() >> (rnd() % 32));
        w32[i] = (int32_t)(uint32_t)((int64_t)s32[i] / dv);
        s64[i] = i < 4 ? (int64_t[]){INT64_MIN, INT64_MAX, 0, -1}[i]
                       : (int64_t)(rnd() >> (rnd() % 64));
        w64[i] = s64[i] / dv;
      }
      uvccl_divide_local(s32, 1000, UVCCL_INT32, dv);
      uvccl_divide_local(s64, 1000, UVCCL_INT64, dv);
      for (i = 0; i < 1000; i++) bad += (s32[i] != w32[i]) + (s64[i] != w64[i]);
      is_int(bad, 0, "integers / %lld truncate like C", (long long)dv);
    }
  }
}

int main(void) {
  int isa;
  tap_alarm(300);
  make_half_tables();
  buf_a = malloc(MAXN * 16 + 2 * PAD);
  buf_b = malloc(MAXN * 16 + 2 * PAD);
  buf_d = malloc(MAXN * 16 + 2 * PAD);
  buf_want = malloc(MAXN * 16);
  in_a = malloc(MAXN * 16);
  in_b = malloc(MAXN * 16);
  tap_require(buf_a && buf_b && buf_d && buf_want && in_a && in_b, "alloc");

  test_names();
  test_validity();
  test_args();
  test_conversions();
  test_scale_divide();
  for (isa = 0; isa < UVCCL__ISA_COUNT; isa++) {
    if (uvccl__reduce_set_isa(isa) != 0) {
      note("tier %s: not on this CPU, skipped", uvccl__reduce_isa_name(isa));
      continue;
    }
    is_int(uvccl__reduce_isa(), isa, "tier %s selected",
           uvccl__reduce_isa_name(isa));
    test_kernels(isa);
    test_specials();
  }
  free(buf_a), free(buf_b), free(buf_d), free(buf_want), free(in_a),
      free(in_b);
  return done_testing();
}
