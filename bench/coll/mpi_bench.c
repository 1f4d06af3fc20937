/* mpi_bench.c - the uvccl-bench measurement with MPI collectives, so that
 * Open MPI (TCP or shared memory) can be run side by side with uvccl and
 * Gloo by bench/coll/run.sh. float32, SUM.
 *
 * Build: mpicc -O2 -o build/bench/mpi_bench bench/coll/mpi_bench.c
 * Run:   mpirun -np 2 build/bench/mpi_bench --op allreduce -b 4 -e 1M
 *
 * Same rules as tools/uvccl-bench.c (see its header comment):
 *  - nccl-tests sizes: allreduce/broadcast/reduce = buffer; allgather,
 *    gather = whole output; reduce_scatter, alltoall, scatter = whole input
 *    of a rank; rounded down to whole floats per block, skipped when a
 *    block would be empty. busbw factors: allreduce 2(W-1)/W; broadcast,
 *    reduce 1; the others (W-1)/W. algbw = size / time, GB = 1e9 B.
 *  - MPI_Barrier (not timed) before every iteration; every iteration timed
 *    on every rank with MPI_Wtime; per iteration the MAX over ranks; rows
 *    show the median and min.
 *  - the first size warms up for at least SETTLE_S first (see
 *    tools/uvccl-bench.c); -w or -n turn it off
 *  - cap = clamp(256 MiB / size, 10, 1000) (barrier: 1000); warmup =
 *    clamp(cap / 10, 2, 20); iters = clamp(budget / mean warmup time (MAX
 *    over ranks), 10, cap).
 *  - the last iteration is checked against locally computed values
 *    (outputs poisoned before it); "ok" is the AND over ranks.
 * Ops: allreduce (MPI_Allreduce), broadcast (MPI_Bcast), reduce
 * (MPI_Reduce), allgather (MPI_Allgather), reduce_scatter
 * (MPI_Reduce_scatter_block), alltoall (MPI_Alltoall), gather
 * (MPI_Gather), scatter (MPI_Scatter), barrier (MPI_Barrier).
 */
#include <mpi.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL,
       GATHER, SCATTER, BARRIER, NOPS };

static const char *const names[NOPS] = {
  "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
  "alltoall", "gather", "scatter", "barrier"};
/* 1: the size splits in W blocks of `per` floats */
static const int blocks[NOPS] = {0, 0, 0, 1, 1, 1, 1, 1, 0};

static int rank, world, root, inplace, check = 1, json, iters_opt,
           warm_opt, settled;
/* seconds of warm-up before the first size (as tools/uvccl-bench.c) */
#define SETTLE_S 0.3
static double budget = 0.5;
static const char *label = "mpi";
static float *sbuf, *rbuf;
static int any_failed;

static void die(const char *msg)
{
  if (rank == 0)
    fprintf(stderr, "mpi_bench: %s\n", msg);
  MPI_Finalize();
  exit(2);
}

static size_t parse_size(const char *s)
{
  char *end;
  unsigned long long v;

  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || end == s)
    die("bad size");
  switch (*end) {
  case 'k': case 'K': v <<= 10; end++; break;
  case 'm': case 'M': v <<= 20; end++; break;
  case 'g': case 'G': v <<= 30; end++; break;
  }
  if (*end == 'i')
    end++;
  if (*end == 'B' || *end == 'b')
    end++;
  if (*end)
    die("bad size");
  return (size_t) v;
}

static int clampi(long v, long lo, long hi)
{
  return (int) (v < lo ? lo : v > hi ? hi : v);
}

static int cmpd(const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return x < y ? -1 : x > y;
}

static double busf(int op)
{
  if (op == ALLREDUCE)
    return 2.0 * (world - 1) / world;
  if (op == BROADCAST || op == REDUCE)
    return 1.0;
  return (double) (world - 1) / world;
}

/* Inputs: small integers, exact in float32. mov: data movement; red: for
 * reductions (the sum over W ranks stays exact). */
static float mov(int r, size_t i)
{
  return (float) (((uint64_t) r * 7919u + i) % (1u << 20));
}

static float red(int r, size_t i)
{
  uint64_t k = (uint64_t) (16777216.0 / world);

  if (k > 7)
    k = 7;
  if (k < 1)
    k = 1;
  return (float) (((uint64_t) r * 5u + i) % k + 1);
}

static float red_sum(size_t i)
{
  float s = 0;
  int r;

  for (r = 0; r < world; r++)
    s += red(r, i);
  return s;
}

static int run(int op, size_t n)
{
  int c = (int) n, me = rank == root;
  void *s = sbuf, *r = rbuf;

  switch (op) {
  case ALLREDUCE:
    return MPI_Allreduce(inplace ? MPI_IN_PLACE : s, r, c, MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
  case BROADCAST:
    return MPI_Bcast(r, c, MPI_FLOAT, root, MPI_COMM_WORLD);
  case REDUCE:
    return MPI_Reduce(s, me ? r : NULL, c, MPI_FLOAT, MPI_SUM, root,
                      MPI_COMM_WORLD);
  case ALLGATHER:
    return MPI_Allgather(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD);
  case REDUCE_SCATTER:
    return MPI_Reduce_scatter_block(s, r, c, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
  case ALLTOALL:
    return MPI_Alltoall(s, c, MPI_FLOAT, r, c, MPI_FLOAT, MPI_COMM_WORLD);
  case GATHER:
    return MPI_Gather(s, c, MPI_FLOAT, me ? r : NULL, c, MPI_FLOAT, root,
                      MPI_COMM_WORLD);
  case SCATTER:
    return MPI_Scatter(me ? s : NULL, c, MPI_FLOAT, r, c, MPI_FLOAT, root,
                       MPI_COMM_WORLD);
  default:
    return MPI_Barrier(MPI_COMM_WORLD);
  }
}

static void fill(int op, size_t n)
{
  size_t i, w = (size_t) world;

  switch (op) {
  case ALLREDUCE:
    if (inplace)
      memset(rbuf, 0, n * 4);
    else
      for (i = 0; i < n; i++) sbuf[i] = red(rank, i);
    break;
  case BROADCAST:
    if (rank == root)
      for (i = 0; i < n; i++) rbuf[i] = mov(root, i);
    break;
  case REDUCE:
    for (i = 0; i < n; i++) sbuf[i] = red(rank, i);
    break;
  case REDUCE_SCATTER:
    for (i = 0; i < n * w; i++) sbuf[i] = red(rank, i);
    break;
  case ALLGATHER:
  case GATHER:
    for (i = 0; i < n; i++) sbuf[i] = mov(rank, i);
    break;
  case ALLTOALL:
    for (i = 0; i < n * w; i++) sbuf[i] = mov(rank, i);
    break;
  case SCATTER:
    if (rank == root)
      for (i = 0; i < n * w; i++) sbuf[i] = mov(root, i);
    break;
  }
}

static void poison(int op, size_t n)
{
  size_t i, w = (size_t) world, len = 0;
  int me = rank == root;

  switch (op) {
  case ALLREDUCE:
    if (inplace) {
      for (i = 0; i < n; i++) rbuf[i] = red(rank, i);
      return;
    }
    len = n;
    break;
  case BROADCAST: len = me ? 0 : n; break;
  case REDUCE: len = me ? n : 0; break;
  case ALLGATHER: case ALLTOALL: len = n * w; break;
  case GATHER: len = me ? n * w : 0; break;
  case REDUCE_SCATTER: case SCATTER: len = n; break;
  }
  memset(rbuf, 0xA5, len * 4);
}

static int verify(int op, size_t n)
{
  size_t i, j, k, w = (size_t) world, me = (size_t) rank;
  int bad = 0;

#define CHECK(idx, want)                                                       \
  do {                                                                         \
    float got_ = rbuf[idx], want_ = (want);                                    \
    if (got_ != want_ && bad++ < 3)                                            \
      fprintf(stderr, "mpi_bench: rank %d: %s check failed at %zu: got %g, "  \
              "want %g\n", rank, names[op], (size_t) (idx), got_, want_);      \
  } while (0)

  switch (op) {
  case ALLREDUCE:
    for (i = 0; i < n; i++) CHECK(i, red_sum(i));
    break;
  case REDUCE:
    if (rank == root)
      for (i = 0; i < n; i++) CHECK(i, red_sum(i));
    break;
  case BROADCAST:
    for (i = 0; i < n; i++) CHECK(i, mov(root, i));
    break;
  case REDUCE_SCATTER:
    for (k = 0; k < n; k++) CHECK(k, red_sum(me * n + k));
    break;
  case GATHER:
    if (rank != root)
      break;
    /* fall through */
  case ALLGATHER:
    for (j = 0; j < w; j++)
      for (k = 0; k < n; k++) CHECK(j * n + k, mov((int) j, k));
    break;
  case ALLTOALL:
    for (j = 0; j < w; j++)
      for (k = 0; k < n; k++) CHECK(j * n + k, mov((int) j, me * n + k));
    break;
  case SCATTER:
    for (k = 0; k < n; k++) CHECK(k, mov(root, me * n + k));
    break;
  }
#undef CHECK
  return bad == 0;
}

static void row(int op, size_t bytes, int iters, double med, double mn, int ok)
{
  double alg = op == BARRIER ? 0 : bytes / (med * 1e-6) / 1e9;

  if (json) {
    printf("{\"impl\":\"%s\",\"op\":\"%s\",\"dtype\":\"float32\","
           "\"redop\":\"sum\",\"world\":%d,\"bytes\":%zu,\"iters\":%d,"
           "\"time_us\":%.3f,\"min_us\":%.3f,", label, names[op], world, bytes,
           iters, med, mn);
    if (op == BARRIER)
      printf("\"algbw_gbps\":null,\"busbw_gbps\":null,");
    else
      printf("\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,", alg, alg * busf(op));
    printf("\"ok\":%s,\"inplace\":%s}\n", ok ? "true" : "false",
           inplace ? "true" : "false");
  } else if (op == BARRIER) {
    printf("%-15s %3d %10s %6d %12.2f %12.2f %11s %11s %3s\n", names[op],
           world, "-", iters, med, mn, "-", "-", ok ? "yes" : "NO");
  } else {
    printf("%-15s %3d %10zu %6d %12.2f %12.2f %11.3f %11.3f %3s\n", names[op],
           world, bytes, iters, med, mn, alg, alg * busf(op),
           ok ? "yes" : "NO");
  }
  fflush(stdout);
}

static void bench(int op, size_t bytes, size_t n)
{
  int cap, warm, iters, i, ok;
  double sum = 0, tw, twmax, t0, *t;

  cap = op == BARRIER ? 1000
                      : clampi((long) ((256u << 20) / (bytes ? bytes : 1)), 10,
                               1000);
  warm = warm_opt > 0 ? warm_opt : clampi(cap / 10, 2, 20);
  fill(op, n);
  if (!settled && warm_opt == 0 && iters_opt == 0) {
    double s0 = MPI_Wtime(), spent = 0;
    settled = 1;
    while (spent < SETTLE_S) {
      for (i = 0; i < warm; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        run(op, n);
      }
      spent = MPI_Wtime() - s0;
      MPI_Allreduce(MPI_IN_PLACE, &spent, 1, MPI_DOUBLE, MPI_MAX,
                    MPI_COMM_WORLD);
    }
  }
  for (i = 0; i < warm; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    run(op, n);
    sum += MPI_Wtime() - t0;
  }
  tw = sum / warm;
  MPI_Allreduce(&tw, &twmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  iters = iters_opt > 0 ? iters_opt
                        : clampi((long) (budget / (twmax > 1e-9 ? twmax : 1e-9)),
                                 10, cap);
  t = malloc(sizeof(double) * ((size_t) iters + 1));
  if (t == NULL)
    MPI_Abort(MPI_COMM_WORLD, 1);
  for (i = 0; i < iters; i++) {
    if (check && i == iters - 1)
      poison(op, n);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    run(op, n);
    t[i] = (MPI_Wtime() - t0) * 1e6;
  }
  t[iters] = check && !verify(op, n) ? 1.0 : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, t, iters + 1, MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  ok = t[iters] == 0.0;
  if (!ok)
    any_failed = 1;
  if (rank == 0) {
    qsort(t, (size_t) iters, sizeof(double), cmpd);
    row(op, bytes, iters, t[iters / 2], t[0], ok);
  }
  free(t);
}

int main(int argc, char **argv)
{
  size_t minb = 4, maxb = 64u << 20, factor = 4, size, n, bytes, alloc;
  int sel[NOPS] = {0}, order[NOPS], nsel = 0, i, op;
  char *opsarg = NULL;

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL() (v ? (i++, v) : (die("option needs a value"), ""))
    if (!strcmp(a, "-b") || !strcmp(a, "--minbytes")) minb = parse_size(VAL());
    else if (!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) maxb = parse_size(VAL());
    else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) factor = parse_size(VAL());
    else if (!strcmp(a, "-n") || !strcmp(a, "--iters")) iters_opt = atoi(VAL());
    else if (!strcmp(a, "-w") || !strcmp(a, "--warmup_iters")) warm_opt = atoi(VAL());
    else if (!strcmp(a, "--op")) opsarg = strdup(VAL());
    else if (!strcmp(a, "-r") || !strcmp(a, "--root")) root = atoi(VAL());
    else if (!strcmp(a, "--budget")) budget = atof(VAL());
    else if (!strcmp(a, "--label")) label = VAL();
    else if (!strcmp(a, "--inplace")) inplace = 1;
    else if (!strcmp(a, "--check")) check = 1;
    else if (!strcmp(a, "--no-check")) check = 0;
    else if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      if (rank == 0)
        printf("usage: mpirun -np W mpi_bench [-b MIN] [-e MAX] [-f F] [-n N] "
               "[-w N]\n  [--op NAME[,NAME...]|all] [--root R] [--budget S] "
               "[--inplace] [--no-check]\n  [--json] [--label NAME]\n");
      MPI_Finalize();
      return 0;
    } else
      die("unknown option (try --help)");
#undef VAL
  }
  if (factor < 2 || minb == 0 || minb > maxb || root < 0 || root >= world)
    die("bad -b/-e/-f/--root");
  {
    char *save = NULL, *tok;

    if (opsarg == NULL)
      opsarg = strdup("allreduce");
    for (tok = strtok_r(opsarg, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
      int all = !strcmp(tok, "all"), found = 0;

      for (op = 0; op < NOPS; op++)
        if (all || !strcmp(tok, names[op]) ||
            (op == BROADCAST && !strcmp(tok, "bcast"))) {
          found = 1;
          if (!sel[op]) {
            sel[op] = 1;
            order[nsel++] = op;
          }
        }
      if (!found)
        die("unknown op");
    }
    free(opsarg);
  }

  alloc = (maxb + 4095) & ~(size_t) 4095;
  sbuf = malloc(alloc + 64);
  rbuf = malloc(alloc + 64);
  if (!sbuf || !rbuf)
    die("out of memory");
  memset(sbuf, 0, alloc + 64);
  memset(rbuf, 0, alloc + 64);

  /* Open MPI's TCP BTL connects pairs lazily, on first use: connect every
   * pair now, so that no first warm-up pays for it. */
  {
    int *a = calloc((size_t) world, sizeof(int)), *b = calloc((size_t) world, sizeof(int));

    if (!a || !b)
      die("out of memory");
    MPI_Alltoall(a, 1, MPI_INT, b, 1, MPI_INT, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    free(a);
    free(b);
  }

  if (rank == 0 && !json) {
    int len;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];

    MPI_Get_library_version(ver, &len);
    ver[strcspn(ver, "\n,")] = 0;
    printf("# mpi_bench (%s): %s, W=%d, float32 sum, root %d, %s, budget "
           "%.2f s, check %s\n", label, ver, world, root,
           inplace ? "in place" : "out of place", budget, check ? "on" : "off");
    printf("# time = median (min) over iterations of the MAX over ranks; "
           "GB = 1e9 B\n");
    printf("%-15s %3s %10s %6s %12s %12s %11s %11s %3s\n", "op", "W", "size_B",
           "iters", "med_us", "min_us", "algbw_GBps", "busbw_GBps", "ok");
    fflush(stdout);
  }
  for (i = 0; i < nsel; i++) {
    op = order[i];
    if (op == BARRIER) {
      bench(op, 0, 0);
      continue;
    }
    for (size = minb; size <= maxb; size *= factor) {
      n = blocks[op] ? size / (4 * (size_t) world) : size / 4;
      bytes = blocks[op] ? n * 4 * (size_t) world : n * 4;
      if (n > 0 && n <= (size_t) INT32_MAX)
        bench(op, bytes, n);
      if (size > maxb / factor)
        break;
    }
  }
  free(sbuf);
  free(rbuf);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
