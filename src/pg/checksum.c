/* CRC-32C: the SSE 4.2 instruction where the CPU has it (chosen once, at
 * the first call), else tables eight bytes at a time. A transfer
 * checksums every byte on both sides while the bytes stream, so the
 * checksum must run well above the transport's rate: the instruction
 * takes three cycles but can start every cycle, so three runs go side by
 * side over three thirds of a block and are joined after it (the CRC of
 * a run shifted over the length of the next, by a table made once: the
 * operator that appends that many zero bytes, in GF(2)). */
#include "checksum.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u /* reflected Castagnoli */

static uint32_t table[8][256];

static void make_table(void) {
  uint32_t i, j, c;
  for (i = 0; i < 256; i++) {
    c = i;
    for (j = 0; j < 8; j++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
    table[0][i] = c;
  }
  for (i = 0; i < 256; i++)
    for (j = 1; j < 8; j++)
      table[j][i] = (table[j - 1][i] >> 8) ^ table[0][table[j - 1][i] & 0xff];
}

/* ---- joining runs ------------------------------------------------------ */

#define LONG_RUN 8192
#define SHORT_RUN 256

/* mat (32 columns) times vec */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

/* out = a after b (every power of one operator commutes) */
static void gf2_compose(uint32_t *out, const uint32_t *a, const uint32_t *b) {
  uint32_t t[32];
  int n;
  for (n = 0; n < 32; n++) t[n] = gf2_times(a, b[n]);
  memcpy(out, t, sizeof(t));
}

/* zeros[k][v]: what appending len zero bytes does to byte k of a CRC
 * register holding v there */
static void make_zeros(uint32_t zeros[4][256], size_t len) {
  uint32_t op[32], base[32];
  int n, k;
  /* one zero bit: shift right, folding the polynomial in */
  base[0] = POLY;
  for (n = 1; n < 32; n++) base[n] = 1u << (n - 1);
  for (n = 0; n < 3; n++) gf2_compose(base, base, base); /* one byte */
  for (n = 0; n < 32; n++) op[n] = 1u << n;               /* identity */
  while (len) {
    if (len & 1) gf2_compose(op, base, op);
    len >>= 1;
    if (len) gf2_compose(base, base, base);
  }
  for (k = 0; k < 4; k++)
    for (n = 0; n < 256; n++) zeros[k][n] = gf2_times(op, (uint32_t)n << (8 * k));
}

static uint32_t shift(uint32_t zeros[4][256], uint32_t crc) {
  return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^
         zeros[2][(crc >> 16) & 0xff] ^ zeros[3][crc >> 24];
}

static uint32_t long_zeros[4][256], short_zeros[4][256];

static uint32_t crc_tables(uint32_t c, const unsigned char *p, size_t n) {
  while (n >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    lo = __builtin_bswap32(lo);
    hi = __builtin_bswap32(hi);
#endif
    lo ^= c;
    c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^
        table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
        table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
        table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

/* Three runs of len bytes each, side by side, joined. */
#define THREE_RUNS(len, zeros)                                               \
  while (n >= 3 * (len)) {                                                   \
    uint64_t c1 = 0, c2 = 0;                                                 \
    const unsigned char *end = p + (len);                                    \
    while (p < end) {                                                        \
      uint64_t v0, v1, v2;                                                   \
      memcpy(&v0, p, 8);                                                     \
      memcpy(&v1, p + (len), 8);                                             \
      memcpy(&v2, p + 2 * (len), 8);                                         \
      c64 = _mm_crc32_u64(c64, v0);                                          \
      c1 = _mm_crc32_u64(c1, v1);                                            \
      c2 = _mm_crc32_u64(c2, v2);                                            \
      p += 8;                                                                \
    }                                                                        \
    c64 = shift(zeros, (uint32_t)c64) ^ (uint32_t)c1;                        \
    c64 = shift(zeros, (uint32_t)c64) ^ (uint32_t)c2;                        \
    p += 2 * (len);                                                          \
    n -= 3 * (len);                                                          \
  }

__attribute__((target("sse4.2"))) static uint32_t
crc_sse42(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c64 = _mm_crc32_u8((uint32_t)c64, *p++);
    n--;
  }
  THREE_RUNS(LONG_RUN, long_zeros)
  THREE_RUNS(SHORT_RUN, short_zeros)
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  while (n--) c64 = _mm_crc32_u8((uint32_t)c64, *p++);
  return (uint32_t)c64;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);

static crc_fn choose(void) {
  make_table();
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) {
    make_zeros(long_zeros, LONG_RUN);
    make_zeros(short_zeros, SHORT_RUN);
    return crc_sse42;
  }
#endif
  return crc_tables;
}

static crc_fn fn;
static pthread_once_t chosen = PTHREAD_ONCE_INIT;

static void choose_once(void) { fn = choose(); }

uint32_t uvccl__crc32c(uint32_t crc, const void *p, size_t n) {
  pthread_once(&chosen, choose_once);
  return ~fn(~crc, p, n);
}
