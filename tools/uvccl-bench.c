/* uvccl-bench: an nccl-tests-style benchmark of uvccl's CPU collectives.
 *
 * One process is one rank. The group comes from "env://" (RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or mpirun's / srun's variables),
 * so it runs under `uvccl-run -n N uvccl-bench ...`, under mpirun, or by
 * hand. Rank 0 prints one row per (op, size).
 *
 * Method (the same as bench/coll/gloo_bench.py and bench/coll/mpi_bench.c,
 * and as the shared baselines):
 *  - sizes follow nccl-tests: allreduce, broadcast and reduce: the buffer;
 *    allgather and gather: the whole output; reduce_scatter, alltoall and
 *    scatter: the whole input of a rank (the root's for scatter). Sizes are
 *    rounded down to whole elements (per rank where the op splits the
 *    buffer in blocks); a size that leaves no element is skipped.
 *  - algbw = size / time (GB = 1e9 B); busbw = algbw * factor: allreduce
 *    2(W-1)/W; reduce_scatter, allgather, alltoall, gather, scatter
 *    (W-1)/W; broadcast, reduce 1.
 *  - every iteration starts after a barrier (not timed) and is timed on
 *    every rank (uv_hrtime from the call to the completion of its work);
 *    per iteration the MAX over ranks is kept; rows show the median and
 *    the min over the timed iterations.
 *  - iterations: cap = clamp(256 MiB / size, 10, 1000) (1000 for barrier);
 *    warmup = clamp(cap / 10, 2, 20); iters = clamp(budget / mean warmup
 *    time (MAX over ranks), 10, cap). -n and -w override. The first size
 *    of a run warms up for at least SETTLE_S first (batches of warmup
 *    iterations until the MAX over ranks of the time spent passes it):
 *    processes just started are still being placed on the CPUs, which
 *    made the first cells of 4 ranks on 2 cores twice the later ones.
 *    bench/coll/mpi_bench.c and gloo_bench.py do the same; -w or -n turn
 *    it off (a job of -n 1 at 1,024 ranks is timed whole).
 *  - check: inputs are small integers, exact in the dtype, that depend on
 *    the rank and the index; before the last timed iteration the outputs
 *    are poisoned, after it every rank compares its output with values
 *    computed locally; the "ok" column is the AND over ranks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uvccl.h"
#include "size_arg.h"

#define PROG "uvccl-bench"

static const char usage_text[] =
"usage: " PROG " [options]\n"
"\n"
"One process per rank; the group comes from env:// (RANK, WORLD_SIZE,\n"
"MASTER_ADDR, MASTER_PORT, or Open MPI's / Slurm's variables). Run it as\n"
"  uvccl-run -n 4 " PROG " -b 4 -e 64M --op all\n"
"\n"
"options:\n"
"  -b, --minbytes B      smallest size (default 4; suffixes K M G)\n"
"  -e, --maxbytes B      largest size (default 64M)\n"
"  -f, --stepfactor F    size multiplier (default 4)\n"
"  -n, --iters N         timed iterations (default 0: from --budget)\n"
"  -w, --warmup_iters N  warm-up iterations (default 0: automatic)\n"
"  --op NAME[,NAME...]   allreduce broadcast reduce allgather\n"
"                        reduce_scatter alltoall gather scatter barrier,\n"
"                        or all (default allreduce)\n"
"  -d, --dtype T         element type (default float32)\n"
"  -o, --redop OP        reduction (default sum; premul_sum uses factor 2)\n"
"  -r, --root R          root of broadcast, reduce, gather, scatter (0)\n"
"  --inplace             allreduce in place (default: out of place)\n"
"  --busy-poll[=US]      uvccl_pg_set_busy_poll (default 50 us)\n"
"  --gpu                 buffers in GPU memory (device $LOCAL_RANK, else\n"
"                        rank modulo the devices): the TCP group stages\n"
"                        them through pinned host memory\n"
"  --backend tcp|nccl    nccl: time an NCCL group instead (implies --gpu)\n"
"  --budget S            seconds of timed iterations per size (0.5)\n"
"  --timeout S           per-operation and creation timeout (120)\n"
"  --heartbeat S         declare a silent rank failed after S seconds\n"
"                        (default: $UVCCL_HEARTBEAT_TIMEOUT_MS, else 15)\n"
"  --shrink-on-failure   when a rank fails, the others shrink the group\n"
"                        and go on from where they agree (one line per\n"
"                        shrink: \"shrunk to N ranks after losing rank R\n"
"                        (cause)\"); every result is still checked\n"
"  --elastic             --shrink-on-failure, then grow back as soon as\n"
"                        replacements join (uvccl-run --respawn starts\n"
"                        them with UVCCL_JOIN=1): \"grew to N ranks (rank R\n"
"                        joined)\"; the store must outlive rank 0\n"
"                        (uvccl-run --respawn serves it)\n"
"  --stall R@N:S         rank R spends S seconds elsewhere (its loop runs)\n"
"                        before its N-th collective: a hang to debug; with\n"
"                        UVCCL_TRACE_DIR set, every rank dumps its flight\n"
"                        recorder there once the others time out\n"
"  --check / --no-check  verify the last iteration (default: check)\n"
"  --json                one JSON object per row instead of the table\n"
"  -h, --help, -V, --version\n"
"\n"
"SIGUSR2 dumps the flight recorder to $UVCCL_TRACE_DIR (or the current\n"
"directory). After a failed operation with UVCCL_TRACE_DIR set, each rank\n"
"keeps its loop (and rank 0 the store) up 2.5 s so every rank can dump.\n"
"\n"
"Rows (rank 0): op W size_B iters med_us min_us algbw_GBps busbw_GBps ok\n"
"(time = median over iterations of the MAX over ranks). Exit status 1 if\n"
"a check failed or an operation failed, 2 for a usage error.\n";

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

static int g_rank = -1;

/* Every rank parses the same command line: before the group exists only
 * the first rank complains. */
static int usage_speaks(void)
{
  const char *r = getenv("RANK");

  if (r == NULL)
    r = getenv("OMPI_COMM_WORLD_RANK");
  return g_rank == 0 || (g_rank < 0 && (r == NULL || atoi(r) == 0));
}

#define CLI_USAGE_SPEAKS() usage_speaks()
#include "cli.h"

static void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One write per line: a launcher that stops the ranks mid-line (uvccl-run
 * does once one rank fails) loses whole lines, never halves. */
static void errorf(const char *fmt, ...)
{
  char line[1024];
  va_list ap;
  int n;

  if (g_rank >= 0)
    n = snprintf(line, sizeof(line), PROG ": rank %d: ", g_rank);
  else
    n = snprintf(line, sizeof(line), PROG ": ");
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t) n - 1, fmt, ap);
  va_end(ap);
  n = (int) strlen(line);
  line[n++] = '\n';
  fflush(stdout);
  if (write(STDERR_FILENO, line, (size_t) n) < 0)
    (void) 0;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------------ */
/* Operations                                                               */

enum {
  OP_ALLREDUCE,
  OP_BROADCAST,
  OP_REDUCE,
  OP_ALLGATHER,
  OP_REDUCE_SCATTER,
  OP_ALLTOALL,
  OP_GATHER,
  OP_SCATTER,
  OP_BARRIER,
  OP_COUNT
};

/* How an op's size splits: the whole buffer, or W blocks of `per`. */
enum { SPLIT_NONE, SPLIT_BLOCKS, SPLIT_BARRIER };

static const struct {
  const char *name;
  int split;
  int reduces;       /* uses the reduction op */
} ops[OP_COUNT] = {
  [OP_ALLREDUCE] = {"allreduce", SPLIT_NONE, 1},
  [OP_BROADCAST] = {"broadcast", SPLIT_NONE, 0},
  [OP_REDUCE] = {"reduce", SPLIT_NONE, 1},
  [OP_ALLGATHER] = {"allgather", SPLIT_BLOCKS, 0},
  [OP_REDUCE_SCATTER] = {"reduce_scatter", SPLIT_BLOCKS, 1},
  [OP_ALLTOALL] = {"alltoall", SPLIT_BLOCKS, 0},
  [OP_GATHER] = {"gather", SPLIT_BLOCKS, 0},
  [OP_SCATTER] = {"scatter", SPLIT_BLOCKS, 0},
  [OP_BARRIER] = {"barrier", SPLIT_BARRIER, 0},
};

static double bus_factor(int op, int w)
{
  switch (op) {
  case OP_ALLREDUCE:
    return 2.0 * (w - 1) / w;
  case OP_BROADCAST:
  case OP_REDUCE:
    return 1.0;
  case OP_BARRIER:
    return 0.0;
  default:
    return (double) (w - 1) / w;
  }
}

/* ------------------------------------------------------------------------ */
/* State                                                                    */

static struct {
  /* options */
  uint64_t min_bytes, max_bytes;
  uint64_t factor;
  int iters, warmup;
  int settled;           /* the first size's settling warm-up is done */
  int selected[OP_COUNT];
  int nselected;
  int order[OP_COUNT];
  uvccl_dtype_t dtype;
  uvccl_redop_t redop;       /* as parsed */
  uvccl_redop_t run_redop;   /* what the collectives get (premul: the id) */
  int root;
  int inplace;
  int busy_poll;             /* 0: not set; else the microseconds */
  int gpu;                   /* buffers in GPU memory */
  int nccl;                  /* the timed ops on an NCCL group */
  double budget;
  double timeout_s;
  int check;
  int json;
  /* group */
  uv_loop_t loop;
  uvccl_pg_t pg;
  int rank, world;
  size_t esize;
  uvccl_pg_t npg;            /* --backend nccl: the group timed */
  uvccl_store_t nstore;      /* its bootstrap: rank 0's store */
  uvccl_pg_t *opg;           /* the group the timed ops run on */
  int device;
  /* buffers: the host copies are filled and checked; with --gpu the ops
   * run on the device copies */
  unsigned char *sbuf, *rbuf;
  unsigned char *dsbuf, *drbuf;
  size_t buf_bytes;
  double *times;
  size_t times_cap;
  int failed;                /* a check failed somewhere */
  double heartbeat_s;        /* 0: the library's default */
  /* --shrink-on-failure: the groups made by shrinks (handles must not
   * move), where to resume, and how often it happened */
  int shrink;
  int elastic;               /* --elastic: grow back after a shrink */
  uvccl_store_t estore;      /* its client of the world's store */
  int estore_open;
  uvccl_pg_t shrunk[64];
  int nshrunk;
  int pos_op, pos_size;      /* progress: op index, size index */
  jmp_buf resume;
  /* diagnostics: SIGUSR2 dumps; --stall */
  uv_signal_t usr2;
  int usr2_on;
  int stall_rank, stall_at;
  double stall_s;
  long nstarted;
} B;

#define PREMUL_FACTOR 2.0

/* ------------------------------------------------------------------------ */
/* Elements: small integers, stored exactly in any dtype                    */

static uint16_t f32_to_f16(float f)
{
  uint32_t x, sign, mant;
  int32_t exp;
  uint16_t h;

  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffff) > 0x7f800000)
    return (uint16_t) (sign | 0x7e00);
  exp = (int32_t) ((x >> 23) & 0xff) - 127 + 15;
  mant = x & 0x7fffff;
  if (exp >= 31)
    return (uint16_t) (sign | 0x7c00);
  if (exp <= 0) {
    uint32_t shift, half, rem, mid;

    if (exp < -10)
      return (uint16_t) sign;
    mant |= 0x800000;
    shift = (uint32_t) (14 - exp);
    half = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1)))
      half++;
    return (uint16_t) (sign | half);
  }
  h = (uint16_t) (sign | ((uint32_t) exp << 10) | (mant >> 13));
  if ((mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (h & 1)))
    h++;
  return h;
}

static float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t) (h & 0x8000) << 16, exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff, x;
  float f;

  if (exp == 0) {
    f = ldexpf((float) mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31)
    x = sign | 0x7f800000 | (mant << 13);
  else
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f32_to_bf16(float f)
{
  uint32_t x;

  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000)
    return (uint16_t) ((x >> 16) | 0x40);
  return (uint16_t) ((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static float bf16_to_f32(uint16_t b)
{
  uint32_t x = (uint32_t) b << 16;
  float f;

  memcpy(&f, &x, 4);
  return f;
}

static int is_float(uvccl_dtype_t t)
{
  return t == UVCCL_FLOAT16 || t == UVCCL_BFLOAT16 || t == UVCCL_FLOAT32 ||
         t == UVCCL_FLOAT64 || t == UVCCL_COMPLEX64 || t == UVCCL_COMPLEX128;
}

/* Largest integer up to which the dtype holds every integer. */
static double exact_limit(uvccl_dtype_t t)
{
  switch (t) {
  case UVCCL_INT8: return 127;
  case UVCCL_UINT8: case UVCCL_FLOAT8_E4M3: case UVCCL_FLOAT8_E5M2: return 255;
  case UVCCL_BOOL: return 1;
  case UVCCL_INT32: return 2147483647.0;
  case UVCCL_FLOAT16: return 2048;
  case UVCCL_BFLOAT16: return 256;
  case UVCCL_FLOAT32: case UVCCL_COMPLEX64: return 16777216.0;
  default: return 9007199254740992.0;
  }
}

/* Stores v (complex: v - v*i). Integers wrap as two's complement. */
static void put(void *buf, size_t i, double v)
{
  switch (B.dtype) {
  case UVCCL_INT8: ((int8_t *) buf)[i] = (int8_t) (uint8_t) (int64_t) v; break;
  case UVCCL_UINT8:
  case UVCCL_FLOAT8_E4M3:   /* float8 only moves: checked as raw bytes */
  case UVCCL_FLOAT8_E5M2: ((uint8_t *) buf)[i] = (uint8_t) (int64_t) v; break;
  case UVCCL_BOOL: ((uint8_t *) buf)[i] = v != 0; break;
  case UVCCL_INT32:
    ((int32_t *) buf)[i] = (int32_t) (uint32_t) (int64_t) v;
    break;
  case UVCCL_INT64: ((int64_t *) buf)[i] = (int64_t) v; break;
  case UVCCL_FLOAT16: ((uint16_t *) buf)[i] = f32_to_f16((float) v); break;
  case UVCCL_BFLOAT16: ((uint16_t *) buf)[i] = f32_to_bf16((float) v); break;
  case UVCCL_FLOAT32: ((float *) buf)[i] = (float) v; break;
  case UVCCL_FLOAT64: ((double *) buf)[i] = v; break;
  case UVCCL_COMPLEX64:
    ((float *) buf)[2 * i] = (float) v;
    ((float *) buf)[2 * i + 1] = (float) -v;
    break;
  case UVCCL_COMPLEX128:
    ((double *) buf)[2 * i] = v;
    ((double *) buf)[2 * i + 1] = -v;
    break;
  default: break;
  }
}

/* Reads element i; *im gets the imaginary part (minus the real part for
 * real types, so that a check of both parts works for every type). Bools
 * read as their raw byte. */
static double get(const void *buf, size_t i, double *im)
{
  double v = 0;

  switch (B.dtype) {
  case UVCCL_INT8: v = ((const int8_t *) buf)[i]; break;
  case UVCCL_UINT8:
  case UVCCL_FLOAT8_E4M3:
  case UVCCL_FLOAT8_E5M2: v = ((const uint8_t *) buf)[i]; break;
  case UVCCL_BOOL: v = ((const uint8_t *) buf)[i]; break;
  case UVCCL_INT32: v = ((const int32_t *) buf)[i]; break;
  case UVCCL_INT64: v = (double) ((const int64_t *) buf)[i]; break;
  case UVCCL_FLOAT16: v = f16_to_f32(((const uint16_t *) buf)[i]); break;
  case UVCCL_BFLOAT16: v = bf16_to_f32(((const uint16_t *) buf)[i]); break;
  case UVCCL_FLOAT32: v = ((const float *) buf)[i]; break;
  case UVCCL_FLOAT64: v = ((const double *) buf)[i]; break;
  case UVCCL_COMPLEX64:
    *im = ((const float *) buf)[2 * i + 1];
    return ((const float *) buf)[2 * i];
  case UVCCL_COMPLEX128:
    *im = ((const double *) buf)[2 * i + 1];
    return ((const double *) buf)[2 * i];
  default: break;
  }
  *im = -v;
  return v;
}

/* What storing v and reading it back gives (rounding, wrapping). */
static double stored(double v)
{
  unsigned char tmp[16];
  double im;

  put(tmp, 0, v);
  return get(tmp, 0, &im);
}

/* Data-movement pattern: the value rank r puts at index i of its input. */
static double mov_val(int r, size_t i)
{
  double lim = exact_limit(B.dtype);
  uint64_t m;

  if (B.dtype == UVCCL_BOOL)
    return (double) (((uint64_t) r + i) & 1);
  m = lim < (double) (1 << 20) ? (uint64_t) lim : (uint64_t) 1 << 20;
  return (double) (((uint64_t) r * 7919u + i) % m);
}

/* Reduction pattern: small enough that the reduction over W ranks is
 * exact (where the dtype can hold it at all). */
static double red_val(int r, size_t i)
{
  uint64_t k;
  double lim;

  if (B.dtype == UVCCL_BOOL)
    return ((uint64_t) r + i) % 3 == 0;
  switch (B.redop) {
  case UVCCL_PRODUCT:
    return ((uint64_t) r + i) % (uint64_t) B.world == 0 ? 2 : 1;
  case UVCCL_SUM:
  case UVCCL_AVG:
  case UVCCL_PREMUL_SUM:
    lim = exact_limit(B.dtype) / B.world /
          (B.redop == UVCCL_PREMUL_SUM ? PREMUL_FACTOR : 1);
    k = lim >= 7 ? 7 : lim >= 1 ? (uint64_t) lim : 1;
    return (double) (((uint64_t) r * 5u + i) % k + 1);
  default:
    return (double) (((uint64_t) r * 5u + i) % 7 + 1);
  }
}

/* The reduction over every rank of red_val(., i), as the dtype holds it. */
static double red_expected(size_t i)
{
  double acc = red_val(0, i), v;
  int64_t a = (int64_t) acc, b;
  int r;

  for (r = 1; r < B.world; r++) {
    v = red_val(r, i);
    b = (int64_t) v;
    switch (B.redop) {
    case UVCCL_SUM:
    case UVCCL_AVG:
    case UVCCL_PREMUL_SUM:
      acc += v;
      break;
    case UVCCL_PRODUCT: acc *= v; break;
    case UVCCL_MIN: acc = v < acc ? v : acc; break;
    case UVCCL_MAX: acc = v > acc ? v : acc; break;
    case UVCCL_BAND: a &= b; acc = (double) a; break;
    case UVCCL_BOR: a |= b; acc = (double) a; break;
    case UVCCL_BXOR: a ^= b; acc = (double) a; break;
    default: break;
    }
  }
  if (B.dtype == UVCCL_BOOL) {
    /* SUM and MAX are OR, PRODUCT and MIN are AND */
    int any = 0, all = 1, par = 0;

    for (r = 0; r < B.world; r++) {
      int x = red_val(r, i) != 0;

      any |= x;
      all &= x;
      par ^= x;
    }
    switch (B.redop) {
    case UVCCL_PRODUCT: case UVCCL_MIN: case UVCCL_BAND: return all;
    case UVCCL_BXOR: return par;
    default: return any;
    }
  }
  if (B.redop == UVCCL_PREMUL_SUM)
    acc *= PREMUL_FACTOR;
  if (B.redop == UVCCL_AVG) {
    if (is_float(B.dtype))
      acc /= B.world;
    else
      acc = (double) ((int64_t) stored(acc) / B.world);
  }
  return stored(acc);
}

static double tolerance(void)
{
  switch (B.dtype) {
  case UVCCL_FLOAT16: return 1e-3;
  case UVCCL_BFLOAT16: return 8e-3;
  case UVCCL_FLOAT32: case UVCCL_COMPLEX64: return 1e-6;
  case UVCCL_FLOAT64: case UVCCL_COMPLEX128: return 1e-12;
  default: return 0;
  }
}

/* Compares element i of buf with want; reports the first few mismatches. */
static int check_elem(const char *opname, const void *buf, size_t i,
                      double want, int *reported)
{
  double im, re = get(buf, i, &im), tol = tolerance();
  double lim = tol * (fabs(want) > 1 ? fabs(want) : 1);

  if (fabs(re - want) <= lim && fabs(im + want) <= lim)
    return 1;
  if ((*reported)++ >= 3)
    return 0;
  if (B.dtype == UVCCL_COMPLEX64 || B.dtype == UVCCL_COMPLEX128)
    errorf("%s check failed at element %zu: got %g%+gi, want %g%+gi", opname,
           i, re, im, want, -want);
  else
    errorf("%s check failed at element %zu: got %g, want %g", opname, i, re,
           want);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Running operations                                                       */

static void close_cb(uvccl_pg_t *pg)
{
  (void) pg;
}

/* The group every operation runs on: the world, or its last shrink. */
static uvccl_pg_t *cur_pg(void)
{
  return B.nshrunk > 0 ? &B.shrunk[B.nshrunk - 1] : &B.pg;
}

/* --elastic: the world's store, at MASTER_ADDR:MASTER_PORT (it outlives
 * rank 0 under uvccl-run --respawn). */
static int estore_open(void)
{
  uvccl_tcp_store_options_t so;
  const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");

  if (B.estore_open)
    return 0;
  if (host == NULL || port == NULL)
    return UV_EINVAL;
  memset(&so, 0, sizeof(so));
  so.host = host;
  so.port = atoi(port);
  so.timeout_ms = (uint64_t) (B.timeout_s * 1000);
  if (uvccl_tcp_store_init(&B.loop, &B.estore, &so) != 0)
    return UV_EINVAL;
  B.estore_open = 1;
  return 0;
}

static void elastic_opts(uvccl_pg_options_t *o)
{
  memset(o, 0, sizeof(*o));
  o->timeout_ms = (uint64_t) (B.timeout_s * 1000);
  if (B.heartbeat_s > 0)
    o->heartbeat_timeout_ms = (uint64_t) (B.heartbeat_s * 1000);
}

/* --elastic, after a shrink that lost `lost` ranks: the survivors admit as
 * many newcomers. On failure they go on at the shrunk size. */
static void grow_back(int lost)
{
  uvccl_pg_t *from = cur_pg(), *to = &B.shrunk[B.nshrunk];
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  int rc;

  elastic_opts(&o);
  rc = estore_open();
  if (rc == 0)
    rc = uvccl_pg_grow(from, to, &B.estore, lost, &o, &w, NULL);
  if (rc == 0)
    rc = uvccl_work_wait(&w);
  if (rc != 0) {
    if (from->rank == 0)
      printf("%scould not grow back: %s%s%s\n", B.json ? "# " : "",
             uvccl_strerror(rc), w.msg[0] ? ": " : "", w.msg);
    return;
  }
  B.nshrunk++;
  if (to->rank == 0) {
    if (lost == 1)
      printf("%sgrew to %d ranks (rank %d joined)\n", B.json ? "# " : "",
             to->size, to->size - 1);
    else
      printf("%sgrew to %d ranks (ranks %d-%d joined)\n", B.json ? "# " : "",
             to->size, to->size - lost, to->size - 1);
  }
  if (from != &B.pg)
    uvccl_pg_destroy(from, close_cb);
}

/* --shrink-on-failure: a peer failed. Shrink to the survivors, agree on
 * where to go on (the earliest op and size any survivor was at: they may
 * have failed in different places), and resume there. Returns only if
 * the shrink is not possible (the caller dies then). */
static void shrink_and_resume(int err)
{
  uvccl_pg_t *old = cur_pg(), *next;
  uvccl_pg_failure_t f;
  uvccl_work_t w = {0};
  int64_t pos;
  int rc;

  if (!B.shrink || B.nccl || (err != UVCCL_EPEER && err != UVCCL_EREVOKED) ||
      B.nshrunk >= (int) (sizeof(B.shrunk) / sizeof(B.shrunk[0])))
    return;
  memset(&f, 0, sizeof(f));
  uvccl_pg_get_failure(old, &f);
  next = &B.shrunk[B.nshrunk];
  rc = uvccl_pg_shrink(old, next, &w, NULL);
  if (rc == 0)
    rc = uvccl_work_wait(&w);
  if (rc != 0) {
    errorf("shrink failed: %s (%s)%s%s", uvccl_strerror(rc),
           uvccl_err_name(rc), w.msg[0] ? ": " : "", w.msg);
    return;
  }
  B.nshrunk++;
  if (next->rank == 0)
    printf("%sshrunk to %d ranks after losing rank %d (%s)\n",
           B.json ? "# " : "", next->size, f.global_rank,
           uvccl_fail_cause_name(f.cause));
  if (old != &B.pg)
    uvccl_pg_destroy(old, close_cb);
  if (B.elastic && B.nshrunk < (int) (sizeof(B.shrunk) / sizeof(B.shrunk[0])))
    grow_back(old->size - next->size);
  next = cur_pg();
  B.rank = next->rank;
  B.world = next->size;
  B.opg = next;
  if (B.redop == UVCCL_PREMUL_SUM &&
      uvccl_pg_premul_sum(next, PREMUL_FACTOR, &B.run_redop) != 0)
    return;
  pos = ((int64_t) B.pos_op << 32) | (int64_t) B.pos_size;
  memset(&w, 0, sizeof(w));
  rc = uvccl_allreduce(next, &w, &pos, &pos, 1, UVCCL_INT64, UVCCL_MIN, NULL);
  if (rc == 0)
    rc = uvccl_work_wait(&w);
  if (rc != 0) {
    /* another failure at once: shrink again */
    shrink_and_resume(rc);
    return;
  }
  B.pos_op = (int) (pos >> 32);
  B.pos_size = (int) (pos & 0xffffffff);
  longjmp(B.resume, 1);
}

static void shutdown_group(void)
{
  if (B.usr2_on) {
    uv_close((uv_handle_t *) &B.usr2, NULL);
    B.usr2_on = 0;
  }
  if (B.nshrunk > 0)
    uvccl_pg_destroy(cur_pg(), close_cb);
  uvccl_pg_destroy(&B.pg, close_cb);
  if (B.estore_open) {
    uvccl_store_close(&B.estore, NULL);
    B.estore_open = 0;
  }
  uv_run(&B.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&B.loop) != 0) {
    uv_run(&B.loop, UV_RUN_DEFAULT);
    uv_loop_close(&B.loop);
  }
}

static void on_pause_timer(uv_timer_t *t)
{
  *(int *) t->data = 1;
}

/* Runs the loop for ms (the group's connections, the store, the flight
 * recorder's store requests are served meanwhile). */
static void run_loop_for(uint64_t ms)
{
  uv_timer_t t;
  int fired = 0;

  uv_timer_init(&B.loop, &t);
  t.data = &fired;
  uv_timer_start(&t, on_pause_timer, ms, 0);
  while (!fired)
    uv_run(&B.loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *) &t, NULL);
  uv_run(&B.loop, UV_RUN_NOWAIT);
}

/* An operation failed: say why, abort the group so the others stop too. */
static void die_op(const char *what, int err, const uvccl_work_t *w)
    __attribute__((noreturn));

static void die_op(const char *what, int err, const uvccl_work_t *w)
{
  const char *dir = getenv("UVCCL_TRACE_DIR");

  errorf("%s failed: %s (%s)%s%s", what, uvccl_strerror(err),
         uvccl_err_name(err), w && w->msg[0] ? ": " : "",
         w && w->msg[0] ? w->msg : "");
  fflush(stdout);
  if (dir != NULL && *dir != '\0')
    /* the others' dumps, asked through the store (on rank 0), need it up */
    run_loop_for(2500);
  uvccl_pg_abort(cur_pg(), PROG ": an operation failed");
  shutdown_group();
  exit(1);
}

/* Runs one started operation to completion. */
static void finish(const char *what, int rc, uvccl_work_t *w)
{
  if (rc == 0)
    rc = uvccl_work_wait(w);
  else if (w->msg[0] == '\0')
    w = NULL; /* a call refused at once may still say why in w->msg */
  if (rc != 0) {
    shrink_and_resume(rc); /* with --shrink-on-failure */
    die_op(what, rc, w);
  }
}

static void barrier(void)
{
  uvccl_work_t w = {0};

  finish("barrier", uvccl_barrier(cur_pg(), &w, NULL), &w);
}

/* In-place MAX over ranks of n doubles. */
static void allreduce_max(double *v, size_t n)
{
  uvccl_work_t w = {0};

  finish("allreduce (results)",
         uvccl_allreduce(cur_pg(), &w, v, v, n, UVCCL_FLOAT64, UVCCL_MAX,
                         NULL),
         &w);
}

static int start_op(int op, uvccl_work_t *w, size_t n)
{
  int root = B.root, me = B.rank == B.root;
  void *s = B.gpu ? B.dsbuf : B.sbuf, *r = B.gpu ? B.drbuf : B.rbuf;
  uvccl_pg_t *pg = B.opg;

  if (++B.nstarted == B.stall_at && B.rank == B.stall_rank) {
    fprintf(stderr, PROG ": rank %d: --stall: %.1f s elsewhere before its "
            "operation %d\n", B.rank, B.stall_s, B.stall_at);
    run_loop_for((uint64_t) (B.stall_s * 1000));
  }
  switch (op) {
  case OP_ALLREDUCE:
    return uvccl_allreduce(pg, w, B.inplace ? r : s, r, n, B.dtype,
                           B.run_redop, NULL);
  case OP_BROADCAST:
    return uvccl_broadcast(pg, w, r, n, B.dtype, root, NULL);
  case OP_REDUCE:
    return uvccl_reduce(pg, w, s, me ? r : NULL, n, B.dtype, B.run_redop,
                        root, NULL);
  case OP_ALLGATHER:
    return uvccl_allgather(pg, w, s, r, n, B.dtype, NULL);
  case OP_REDUCE_SCATTER:
    return uvccl_reduce_scatter(pg, w, s, r, n, B.dtype, B.run_redop,
                                NULL);
  case OP_ALLTOALL:
    return uvccl_alltoall(pg, w, s, r, n, B.dtype, NULL);
  case OP_GATHER:
    return uvccl_gather(pg, w, s, me ? r : NULL, n, B.dtype, root, NULL);
  case OP_SCATTER:
    return uvccl_scatter(pg, w, me ? s : NULL, r, n, B.dtype, root, NULL);
  case OP_BARRIER:
    return uvccl_barrier(pg, w, NULL);
  default:
    return UV_EINVAL;
  }
}

/* Inputs for op with n elements (per block for the split ops). */
static void fill_inputs(int op, size_t n)
{
  size_t i, w = (size_t) B.world;

  switch (op) {
  case OP_ALLREDUCE:
    if (B.inplace)
      memset(B.rbuf, 0, n * B.esize);
    else
      for (i = 0; i < n; i++)
        put(B.sbuf, i, red_val(B.rank, i));
    break;
  case OP_BROADCAST:
    if (B.rank == B.root)
      for (i = 0; i < n; i++)
        put(B.rbuf, i, mov_val(B.root, i));
    break;
  case OP_REDUCE:
    for (i = 0; i < n; i++)
      put(B.sbuf, i, red_val(B.rank, i));
    break;
  case OP_REDUCE_SCATTER:
    for (i = 0; i < n * w; i++)
      put(B.sbuf, i, red_val(B.rank, i));
    break;
  case OP_ALLGATHER:
  case OP_GATHER:
    for (i = 0; i < n; i++)
      put(B.sbuf, i, mov_val(B.rank, i));
    break;
  case OP_ALLTOALL:
    for (i = 0; i < n * w; i++)
      put(B.sbuf, i, mov_val(B.rank, i));
    break;
  case OP_SCATTER:
    if (B.rank == B.root)
      for (i = 0; i < n * w; i++)
        put(B.sbuf, i, mov_val(B.root, i));
    break;
  default:
    break;
  }
}

#define POISON 0xA5

/* Before the checked iteration: outputs hold garbage, so a stale result
 * from an earlier iteration cannot pass. */
static void poison_outputs(int op, size_t n)
{
  size_t w = (size_t) B.world, i;
  int me = B.rank == B.root;

  switch (op) {
  case OP_ALLREDUCE:
    if (B.inplace)
      for (i = 0; i < n; i++)
        put(B.rbuf, i, red_val(B.rank, i));
    else
      memset(B.rbuf, POISON, n * B.esize);
    break;
  case OP_BROADCAST:
    if (!me)
      memset(B.rbuf, POISON, n * B.esize);
    break;
  case OP_REDUCE:
    if (me)
      memset(B.rbuf, POISON, n * B.esize);
    break;
  case OP_ALLGATHER:
  case OP_ALLTOALL:
    memset(B.rbuf, POISON, n * w * B.esize);
    break;
  case OP_GATHER:
    if (me)
      memset(B.rbuf, POISON, n * w * B.esize);
    break;
  case OP_REDUCE_SCATTER:
  case OP_SCATTER:
    memset(B.rbuf, POISON, n * B.esize);
    break;
  default:
    break;
  }
}

/* 1 if this rank's outputs are right. */
static int verify(int op, size_t n)
{
  const char *name = ops[op].name;
  size_t w = (size_t) B.world, me = (size_t) B.rank, i, j, k;
  int ok = 1, rep = 0;

  switch (op) {
  case OP_ALLREDUCE:
    for (i = 0; i < n; i++)
      ok &= check_elem(name, B.rbuf, i, red_expected(i), &rep);
    break;
  case OP_REDUCE:
    if (B.rank == B.root)
      for (i = 0; i < n; i++)
        ok &= check_elem(name, B.rbuf, i, red_expected(i), &rep);
    break;
  case OP_BROADCAST:
    for (i = 0; i < n; i++)
      ok &= check_elem(name, B.rbuf, i, stored(mov_val(B.root, i)), &rep);
    break;
  case OP_REDUCE_SCATTER:
    for (k = 0; k < n; k++)
      ok &= check_elem(name, B.rbuf, k, red_expected(me * n + k), &rep);
    break;
  case OP_GATHER:
    if (B.rank != B.root)
      break;
    /* fall through */
  case OP_ALLGATHER:
    for (j = 0; j < w; j++)
      for (k = 0; k < n; k++)
        ok &= check_elem(name, B.rbuf, j * n + k, stored(mov_val((int) j, k)),
                         &rep);
    break;
  case OP_ALLTOALL:
    for (j = 0; j < w; j++)
      for (k = 0; k < n; k++)
        ok &= check_elem(name, B.rbuf, j * n + k,
                         stored(mov_val((int) j, me * n + k)), &rep);
    break;
  case OP_SCATTER:
    for (k = 0; k < n; k++)
      ok &= check_elem(name, B.rbuf, k, stored(mov_val(B.root, me * n + k)),
                       &rep);
    break;
  default:
    break;
  }
  if (rep > 3)
    errorf("%s: %d mismatches in all", name, rep);
  return ok;
}

static int clampi(long v, long lo, long hi)
{
  return (int) (v < lo ? lo : v > hi ? hi : v);
}

static void print_header(void)
{
  if (B.json || B.rank != 0)
    return;
  printf("# %s: uvccl %s (libuv %s), W=%d, dtype %s, redop %s, root %d, "
         "%s, busy-poll %s, budget %.2f s, check %s\n",
         PROG, uvccl_version_string(), uv_version_string(), B.world,
         uvccl_dtype_name(B.dtype), uvccl_redop_name(B.redop), B.root,
         B.inplace ? "in place" : "out of place",
         B.busy_poll ? "on" : "off", B.budget, B.check ? "on" : "off");
  if (B.busy_poll)
    printf("# busy-poll %d us\n", B.busy_poll);
  if (B.gpu)
    printf("# buffers in GPU memory; %s\n",
           B.nccl ? "NCCL group" : "TCP group, staged through pinned memory");
  printf("# time = median (min) over iterations of the MAX over ranks; "
         "GB = 1e9 B\n");
  printf("%-15s %3s %10s %6s %12s %12s %11s %11s %3s\n", "op", "W", "size_B",
         "iters", "med_us", "min_us", "algbw_GBps", "busbw_GBps", "ok");
  fflush(stdout);
}

static void print_row(int op, size_t bytes, int iters, double med_us,
                      double min_us, int ok)
{
  double alg = 0, bus = 0;
  int is_barrier = op == OP_BARRIER;

  if (B.rank != 0)
    return;
  if (!is_barrier && med_us > 0) {
    alg = (double) bytes / (med_us * 1e-6) / 1e9;
    bus = alg * bus_factor(op, B.world);
  }
  if (B.json) {
    printf("{\"impl\":\"uvccl\",\"op\":\"%s\",\"dtype\":\"%s\",\"redop\":\"%s\","
           "\"world\":%d,\"bytes\":%zu,\"iters\":%d,\"time_us\":%.3f,"
           "\"min_us\":%.3f,",
           ops[op].name, uvccl_dtype_name(B.dtype), uvccl_redop_name(B.redop),
           B.world, bytes, iters, med_us, min_us);
    if (is_barrier)
      printf("\"algbw_gbps\":null,\"busbw_gbps\":null,");
    else
      printf("\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,", alg, bus);
    printf("\"backend\":\"%s\",\"gpu\":%s,", B.nccl ? "nccl" : "tcp",
           B.gpu ? "true" : "false");
    printf("\"ok\":%s,\"busy_poll_us\":%d,\"inplace\":%s}\n",
           ok ? "true" : "false", B.busy_poll, B.inplace ? "true" : "false");
  } else if (is_barrier) {
    printf("%-15s %3d %10s %6d %12.2f %12.2f %11s %11s %3s\n", ops[op].name,
           B.world, "-", iters, med_us, min_us, "-", "-", ok ? "yes" : "NO");
  } else {
    printf("%-15s %3d %10zu %6d %12.2f %12.2f %11.3f %11.3f %3s\n",
           ops[op].name, B.world, bytes, iters, med_us, min_us, alg, bus,
           ok ? "yes" : "NO");
  }
  fflush(stdout);
}

/* --gpu: the device buffers take the host ones' contents, or give them
 * back (outside the timed region). */
static void gpu_sync(int to_device)
{
  int rc = 0;

  if (!B.gpu)
    return;
  if (to_device) {
    rc = uvccl_gpu_memcpy(B.dsbuf, B.sbuf, B.buf_bytes);
    if (rc == 0)
      rc = uvccl_gpu_memcpy(B.drbuf, B.rbuf, B.buf_bytes);
  } else {
    rc = uvccl_gpu_memcpy(B.rbuf, B.drbuf, B.buf_bytes);
  }
  if (rc != 0)
    die_op("uvccl_gpu_memcpy", rc, NULL);
}

#define SETTLE_S 0.3 /* seconds of warm-up before the first size */

/* One row: op at `bytes` (already rounded), n elements (per block). */
static void run_size(int op, size_t bytes, size_t n)
{
  uvccl_work_t w = {0};
  char what[96];
  int cap, warm, iters, i, ok = 1;
  double sum = 0, tw;
  uint64_t t0;

  snprintf(what, sizeof(what), "%s %zu B", ops[op].name, bytes);
  if (op == OP_BARRIER)
    cap = 1000;
  else
    cap = clampi((long) ((256u << 20) / (bytes ? bytes : 1)), 10, 1000);
  warm = B.warmup > 0 ? B.warmup : clampi(cap / 10, 2, 20);
  fill_inputs(op, n);
  gpu_sync(1);

  if (!B.settled && B.warmup == 0 && B.iters == 0) {
    double spent = 0;
    uint64_t s0 = uv_hrtime();
    B.settled = 1;
    while (spent < SETTLE_S) {
      for (i = 0; i < warm; i++) {
        barrier();
        finish(what, start_op(op, &w, n), &w);
      }
      spent = (double) (uv_hrtime() - s0) * 1e-9;
      allreduce_max(&spent, 1);
    }
  }

  for (i = 0; i < warm; i++) {
    barrier();
    t0 = uv_hrtime();
    finish(what, start_op(op, &w, n), &w);
    sum += (double) (uv_hrtime() - t0) * 1e-9;
  }
  tw = sum / warm;
  allreduce_max(&tw, 1);
  if (B.iters > 0)
    iters = B.iters;
  else
    iters = clampi((long) (B.budget / (tw > 1e-9 ? tw : 1e-9)), 10, cap);

  if ((size_t) iters + 1 > B.times_cap) {
    B.times_cap = (size_t) iters + 1;
    B.times = realloc(B.times, B.times_cap * sizeof(double));
    if (B.times == NULL) {
      errorf("out of memory");
      exit(1);
    }
  }
  for (i = 0; i < iters; i++) {
    if (B.check && i == iters - 1) {
      poison_outputs(op, n);
      gpu_sync(1);
    }
    barrier();
    t0 = uv_hrtime();
    finish(what, start_op(op, &w, n), &w);
    B.times[i] = (double) (uv_hrtime() - t0) * 1e-3;
  }
  if (B.check)
    gpu_sync(0);
  /* the check's verdict rides along as one more element (MAX of "bad") */
  B.times[iters] = B.check && !verify(op, n) ? 1.0 : 0.0;
  allreduce_max(B.times, (size_t) iters + 1);
  ok = B.times[iters] == 0.0;
  if (!ok)
    B.failed = 1;
  if (B.rank == 0) {
    qsort(B.times, (size_t) iters, sizeof(double), cmp_double);
    print_row(op, bytes, iters, B.times[iters / 2], B.times[0], ok);
  }
}

static void run_op(int op)
{
  uint64_t size;
  size_t w = (size_t) B.world, n, bytes;
  int k;

  if (op == OP_BARRIER) {
    run_size(op, 0, 0);
    return;
  }
  /* sizes before B.pos_size were done (a resume after a shrink) */
  for (k = 0, size = B.min_bytes; size <= B.max_bytes; size *= B.factor, k++) {
    if (k < B.pos_size) {
      if (size > B.max_bytes / B.factor)
        break;
      continue;
    }
    B.pos_size = k;
    if (ops[op].split == SPLIT_BLOCKS) {
      n = (size_t) size / (B.esize * w);
      bytes = n * w * B.esize;
    } else {
      n = (size_t) size / B.esize;
      bytes = n * B.esize;
    }
    if (n > 0)
      run_size(op, bytes, n);
    if (size > B.max_bytes / B.factor)
      break;
  }
}

/* ------------------------------------------------------------------------ */
/* GPU buffers and the NCCL group                                           */

static int setup_gpu(void)
{
  const char *lr = getenv("LOCAL_RANK");
  char name[128] = "";
  int count = 0, rc, drv = 0, rt = 0;

  rc = uvccl_gpu_device_count(&count);
  if (rc != 0 || count == 0) {
    errorf("--gpu: %s", uvccl_gpu_unavailable_reason()
                            ? uvccl_gpu_unavailable_reason()
                            : "no CUDA device");
    return -1;
  }
  B.device = lr && *lr ? atoi(lr) % count : B.rank % count;
  uvccl_gpu_info(B.device, name, sizeof(name), &drv, &rt);
  if ((rc = uvccl_gpu_malloc(B.device, (void **) &B.dsbuf, B.buf_bytes)) ||
      (rc = uvccl_gpu_malloc(B.device, (void **) &B.drbuf, B.buf_bytes))) {
    errorf("--gpu: cannot allocate 2 x %zu bytes on device %d: %s",
           B.buf_bytes, B.device, uvccl_strerror(rc));
    return -1;
  }
  if (!B.json && B.rank == 0)
    printf("# gpu: device %d (%s), driver %d, runtime %d\n", B.device, name,
           drv, rt);
  if (B.nccl) {
    uvccl_tcp_store_options_t so;
    uvccl_pg_options_t o;
    uvccl_work_t w = {0};
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");

    memset(&so, 0, sizeof(so));
    so.host = ma ? ma : "127.0.0.1";
    so.port = mp ? atoi(mp) : 29500;
    so.timeout_ms = (uint64_t) (B.timeout_s * 1000);
    if ((rc = uvccl_tcp_store_init(&B.loop, &B.nstore, &so)) != 0) {
      errorf("--backend nccl: store client: %s", uvccl_strerror(rc));
      return -1;
    }
    memset(&o, 0, sizeof(o));
    o.rank = B.rank;
    o.size = B.world;
    o.timeout_ms = so.timeout_ms;
    o.prefix = "uvccl-bench/nccl";
    o.backend = UVCCL_BACKEND_NCCL;
    o.device = B.device;
    rc = uvccl_pg_init(&B.loop, &B.npg, &B.nstore, &o, &w, NULL);
    if (rc == 0)
      rc = uvccl_work_wait(&w);
    if (rc != 0) {
      errorf("--backend nccl: creating the group: %s%s%s", uvccl_strerror(rc),
             w.msg[0] ? ": " : "", w.msg);
      return -1;
    }
    B.opg = &B.npg;
  }
  return 0;
}

static int nccl_parts_closed;

static void on_npg_closed(uvccl_pg_t *pg)
{
  (void) pg;
  nccl_parts_closed++;
}

static void on_nstore_closed(uvccl_store_t *s)
{
  (void) s;
  nccl_parts_closed++;
}

static void teardown_gpu(void)
{
  if (B.nccl && B.opg == &B.npg) {
    uvccl_pg_destroy(&B.npg, on_npg_closed);
    uvccl_store_close(&B.nstore, on_nstore_closed);
    while (nccl_parts_closed < 2)
      uv_run(&B.loop, UV_RUN_ONCE);
  }
  if (B.dsbuf)
    uvccl_gpu_free(B.dsbuf);
  if (B.drbuf)
    uvccl_gpu_free(B.drbuf);
  B.dsbuf = B.drbuf = NULL;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

static void parse_ops(const char *s)
{
  char *copy = strdup(s), *tok, *save = NULL;
  int i, any = 0;

  if (copy == NULL)
    usage_error("out of memory");
  memset(B.selected, 0, sizeof(B.selected));
  B.nselected = 0;
  for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    any = 1;
    if (strcmp(tok, "all") == 0) {
      for (i = 0; i < OP_COUNT; i++)
        if (!B.selected[i]) {
          B.selected[i] = 1;
          B.order[B.nselected++] = i;
        }
      continue;
    }
    for (i = 0; i < OP_COUNT; i++)
      if (strcmp(tok, ops[i].name) == 0)
        break;
    if (i == OP_COUNT && strcmp(tok, "bcast") == 0)
      i = OP_BROADCAST;
    if (i == OP_COUNT)
      usage_error("unknown op '%s'", tok);
    if (!B.selected[i]) {
      B.selected[i] = 1;
      B.order[B.nselected++] = i;
    }
  }
  free(copy);
  if (!any)
    usage_error("--op needs at least one op");
}

enum {
  O_OP = 256, O_INPLACE, O_BUSY, O_BUDGET, O_TIMEOUT, O_CHECK, O_NOCHECK,
  O_JSON, O_GPU, O_BACKEND, O_HEARTBEAT, O_SHRINK, O_STALL, O_ELASTIC
};

static void parse_args(int argc, char **argv)
{
  static const struct option lopts[] = {
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"warmup", required_argument, NULL, 'w'},
    {"dtype", required_argument, NULL, 'd'},
    {"datatype", required_argument, NULL, 'd'},
    {"redop", required_argument, NULL, 'o'},
    {"op", required_argument, NULL, O_OP},
    {"root", required_argument, NULL, 'r'},
    {"inplace", no_argument, NULL, O_INPLACE},
    {"busy-poll", optional_argument, NULL, O_BUSY},
    {"budget", required_argument, NULL, O_BUDGET},
    {"timeout", required_argument, NULL, O_TIMEOUT},
    {"check", no_argument, NULL, O_CHECK},
    {"no-check", no_argument, NULL, O_NOCHECK},
    {"json", no_argument, NULL, O_JSON},
    {"gpu", no_argument, NULL, O_GPU},
    {"backend", required_argument, NULL, O_BACKEND},
    {"heartbeat", required_argument, NULL, O_HEARTBEAT},
    {"shrink-on-failure", no_argument, NULL, O_SHRINK},
    {"elastic", no_argument, NULL, O_ELASTIC},
    {"stall", required_argument, NULL, O_STALL},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
  };
  int c;

  B.min_bytes = 4;
  B.max_bytes = 64u << 20;
  B.factor = 4;
  B.dtype = UVCCL_FLOAT32;
  B.redop = UVCCL_SUM;
  B.budget = 0.5;
  B.timeout_s = 120;
  B.check = 1;
  B.selected[OP_ALLREDUCE] = 1;
  B.order[0] = OP_ALLREDUCE;
  B.nselected = 1;

  while ((c = getopt_long(argc, argv, "b:e:f:n:w:d:o:r:hV", lopts, NULL)) !=
         -1) {
    switch (c) {
    case 'b': B.min_bytes = arg_size("--minbytes", optarg, (uint64_t) 1 << 40); break;
    case 'e': B.max_bytes = arg_size("--maxbytes", optarg, (uint64_t) 1 << 40); break;
    case 'f':
      B.factor = (uint64_t) arg_int("--stepfactor", optarg, 2, 1 << 20);
      break;
    case 'n': B.iters = (int) arg_int("--iters", optarg, 0, 100000000); break;
    case 'w':
      B.warmup = (int) arg_int("--warmup_iters", optarg, 0, 100000000);
      break;
    case 'd':
      if (uvccl_dtype_from_name(optarg, &B.dtype) != 0)
        usage_error("unknown dtype '%s'", optarg);
      break;
    case 'o':
      if (uvccl_redop_from_name(optarg, &B.redop) != 0)
        usage_error("unknown reduction '%s'", optarg);
      break;
    case O_OP: parse_ops(optarg); break;
    case 'r': B.root = (int) arg_int("--root", optarg, 0, 1 << 30); break;
    case O_INPLACE: B.inplace = 1; break;
    case O_BUSY:
      B.busy_poll = optarg ? (int) arg_int("--busy-poll", optarg, 1,
                                           10000000)
                           : 50;
      break;
    case O_BUDGET:
      B.budget = arg_seconds("--budget", optarg, 0, 3600);
      break;
    case O_TIMEOUT:
      B.timeout_s = arg_seconds("--timeout", optarg, 0.001, 86400);
      break;
    case O_CHECK: B.check = 1; break;
    case O_NOCHECK: B.check = 0; break;
    case O_JSON: B.json = 1; break;
    case O_GPU: B.gpu = 1; break;
    case O_HEARTBEAT:
      B.heartbeat_s = arg_seconds("--heartbeat", optarg, 0.01, 86400);
      break;
    case O_SHRINK: B.shrink = 1; break;
    case O_ELASTIC: B.shrink = B.elastic = 1; break;
    case O_STALL: {
      char *end;
      long r = strtol(optarg, &end, 10), at;
      if (end == optarg || *end != '@')
        usage_error("--stall wants R@N:SECONDS, not '%s'", optarg);
      at = strtol(end + 1, &end, 10);
      if (*end != ':' || r < 0 || at < 1)
        usage_error("--stall wants R@N:SECONDS, not '%s'", optarg);
      B.stall_rank = (int) r;
      B.stall_at = (int) at;
      B.stall_s = arg_seconds("--stall", end + 1, 0.001, 86400);
      break;
    }
    case O_BACKEND:
      if (strcmp(optarg, "nccl") == 0)
        B.nccl = B.gpu = 1;
      else if (strcmp(optarg, "tcp") != 0)
        usage_error("unknown --backend '%s' (tcp or nccl)", optarg);
      break;
    case 'h':
      fputs(usage_text, stdout);
      exit(0);
    case 'V':
      printf(PROG " %s (libuv %s)\n", uvccl_version_string(),
             uv_version_string());
      exit(0);
    default:
      usage_error("bad option");
    }
  }
  if (optind < argc)
    usage_error("unexpected argument '%s'", argv[optind]);
  if (B.min_bytes == 0)
    B.min_bytes = 1;
  if (B.min_bytes > B.max_bytes)
    usage_error("--minbytes is larger than --maxbytes");
  if (B.shrink && B.nccl)
    usage_error("--shrink-on-failure works on TCP groups only");
}

int main(int argc, char **argv)
{
  uvccl_pg_options_t opts;
  uvccl_work_t w = {0};
  uint64_t t0;
  double init_ms;
  size_t bytes;
  int rc, i, any_reduction = 0, joining;

  parse_args(argc, argv);
  B.esize = uvccl_dtype_size(B.dtype);
  if (B.esize == 0)
    usage_error("invalid dtype");
  for (i = 0; i < OP_COUNT; i++)
    if (B.selected[i] && ops[i].reduces)
      any_reduction = 1;
  if (any_reduction && uvccl_redop_check(B.redop, B.dtype) != 0)
    usage_error("reduction %s does not apply to %s", uvccl_redop_name(B.redop),
                uvccl_dtype_name(B.dtype));
  setvbuf(stdout, NULL, _IOLBF, 0);

  rc = uv_loop_init(&B.loop);
  if (rc != 0) {
    errorf("uv_loop_init: %s", uv_strerror(rc));
    return 1;
  }
  /* a hung run can be asked what it is doing: kill -USR2 (uvccl-run
   * passes it on) */
  B.usr2_on = uvccl_trace_signal_start(&B.loop, &B.usr2, SIGUSR2) == 0;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = (uint64_t) (B.timeout_s * 1000);
  if (B.heartbeat_s > 0)
    opts.heartbeat_timeout_ms = (uint64_t) (B.heartbeat_s * 1000);
  t0 = uv_hrtime();
  joining = B.elastic && getenv("UVCCL_JOIN") != NULL &&
            strcmp(getenv("UVCCL_JOIN"), "1") == 0;
  if (joining) {
    /* a replacement (uvccl-run --respawn): into the running world */
    rc = estore_open();
    if (rc == 0)
      rc = uvccl_pg_join(&B.loop, &B.pg, &B.estore, &opts, &w, NULL);
  } else {
    rc = uvccl_pg_init_url(&B.loop, &B.pg, "env://", &opts, &w, NULL);
  }
  if (rc != 0) {
    errorf("%s: %s (%s)", joining ? "uvccl_pg_join" : "uvccl_pg_init_url",
           uvccl_strerror(rc), uvccl_err_name(rc));
    if (B.usr2_on)
      uv_close((uv_handle_t *) &B.usr2, NULL);
    uv_run(&B.loop, UV_RUN_DEFAULT);
    uv_loop_close(&B.loop);
    return 1;
  }
  rc = uvccl_work_wait(&w);
  init_ms = (double) (uv_hrtime() - t0) * 1e-6;
  if (rc != 0) {
    errorf("creating the group: %s (%s)%s%s", uvccl_strerror(rc),
           uvccl_err_name(rc), w.msg[0] ? ": " : "", w.msg);
    shutdown_group();
    return 1;
  }
  B.rank = B.pg.rank;
  B.world = B.pg.size;
  g_rank = B.rank;
  uvccl_log_set_rank(B.rank);
  if (B.root >= B.world) {
    if (B.rank == 0)
      errorf("--root %d is not a rank of a group of %d", B.root, B.world);
    shutdown_group();
    return 2;
  }
  if (B.busy_poll)
    uvccl_pg_set_busy_poll(&B.pg, (uint32_t) B.busy_poll);
  B.run_redop = B.redop;
  if (B.redop == UVCCL_PREMUL_SUM) {
    rc = uvccl_pg_premul_sum(&B.pg, PREMUL_FACTOR, &B.run_redop);
    if (rc != 0)
      die_op("uvccl_pg_premul_sum", rc, NULL);
  }

  /* Buffers for the largest size of any op, touched before timing. */
  bytes = (size_t) B.max_bytes + 2 * B.esize;
  bytes = (bytes + 4095) & ~(size_t) 4095;
  B.buf_bytes = bytes;
  B.sbuf = aligned_alloc(4096, bytes);
  B.rbuf = aligned_alloc(4096, bytes);
  if (B.sbuf == NULL || B.rbuf == NULL) {
    errorf("cannot allocate 2 x %zu bytes", bytes);
    uvccl_pg_abort(&B.pg, PROG ": out of memory");
    shutdown_group();
    return 1;
  }
  memset(B.sbuf, 0, bytes);
  memset(B.rbuf, 0, bytes);
  B.opg = &B.pg;
  if (B.gpu && setup_gpu() != 0) {
    uvccl_pg_abort(&B.pg, PROG ": no GPU");
    shutdown_group();
    return 1;
  }

  print_header();
  if (!B.json && B.rank == 0) {
    int q, nshm = 0, ntcp = 0;
    printf("# group init (env://): %.1f ms on rank 0\n", init_ms);
    for (q = 0; q < B.pg.size; q++) {
      const char *t = uvccl_pg_peer_transport(&B.pg, q);
      nshm += strcmp(t, "shm") == 0;
      ntcp += strcmp(t, "tcp") == 0;
    }
    if (nshm + ntcp == B.pg.size - 1)
      printf("# rank 0 reaches %d peers through shared memory, %d through "
             "TCP\n", nshm, ntcp);
    else
      printf("# a sparse world (more ranks than UVCCL_MESH_MAX): rank 0 "
             "connects to a peer when it first needs it\n");
  }

  if (joining) {
    /* where the members are: they agree on it with us right after the
     * grow (we bring nothing: the largest position) */
    uvccl_work_t pw = {0};
    int64_t pos = INT64_MAX;

    /* the members settled the machine before the first size (a phase of
     * their own collectives): not again here, or we would wait for
     * collectives they never start */
    B.settled = 1;
    finish("allreduce (position)",
           uvccl_allreduce(&B.pg, &pw, &pos, &pos, 1, UVCCL_INT64, UVCCL_MIN,
                           NULL),
           &pw);
    B.pos_op = (int) (pos >> 32);
    B.pos_size = (int) (pos & 0xffffffff);
  }
  /* --shrink-on-failure resumes here, at the agreed op and size */
  setjmp(B.resume);
  for (; B.pos_op < B.nselected; B.pos_op++, B.pos_size = 0)
    run_op(B.order[B.pos_op]);

  /* Nobody leaves while another rank still needs it. */
  barrier();
  if (!B.json && B.rank == 0) {
    int q, nshm = 0, ntcp = 0;
    for (q = 0; q < B.pg.size; q++) {
      const char *t = uvccl_pg_peer_transport(&B.pg, q);
      nshm += strcmp(t, "shm") == 0;
      ntcp += strcmp(t, "tcp") == 0;
    }
    if (nshm + ntcp < B.pg.size - 1 && uvccl_pg_failed_ranks(&B.pg, NULL, 0) == 0)
      printf("# rank 0 connected to %d of its %d peers (%d through shared "
             "memory, %d through TCP)\n", nshm + ntcp, B.pg.size - 1, nshm,
             ntcp);
  }
  teardown_gpu();
  free(B.sbuf);
  free(B.rbuf);
  free(B.times);
  shutdown_group();
  if (B.failed && B.rank == 0)
    errorf("some checks FAILED");
  return B.failed ? 1 : 0;
}
