/* bench/chaos: the Open MPI rank of the chaos benchmark, doing what
 * uvccl_chaos does (the same pseudo-random sequence of collectives, every
 * result checked) with MPI_ERRORS_RETURN, so that an error, if MPI ever
 * reports one, is printed instead of aborting. Built by bench/chaos/run.sh
 * with mpicc; run under mpirun.
 *   @ready RANK PID
 *   @bad RANK ITER N
 *   @err RANK T - - | MESSAGE     T: CLOCK_MONOTONIC seconds */
#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXN ((size_t)1 << 18)

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pick(unsigned i, int *kind, size_t *n) {
  uint64_t x = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  *kind = (int)(x % 6);
  *n = (size_t)1 << ((x >> 8) % 19);
}

static float *sb, *rb;

static int run_one(unsigned i, int me, int P, int *bad) {
  int kind, rc, q;
  size_t n, k;
  float want;
  pick(i, &kind, &n);
  if (kind == 3 || kind == 4) n = n / (size_t)P ? n / (size_t)P : 1;
  switch (kind) {
  case 0:
    for (k = 0; k < n; k++) sb[k] = (float)(me + 1);
    rc = MPI_Allreduce(sb, rb, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    want = (float)(P * (P + 1) / 2);
    for (k = 0; rc == MPI_SUCCESS && k < n; k++) *bad += rb[k] != want;
    return rc;
  case 1:
    for (k = 0; k < n; k++) rb[k] = me == (int)(i % (unsigned)P) ? (float)i : -1;
    rc = MPI_Bcast(rb, (int)n, MPI_FLOAT, (int)(i % (unsigned)P),
                   MPI_COMM_WORLD);
    for (k = 0; rc == MPI_SUCCESS && k < n; k++) *bad += rb[k] != (float)i;
    return rc;
  case 2:
    for (k = 0; k < n; k++) sb[k] = (float)(me * 3 + (int)(i % 5));
    rc = MPI_Allgather(sb, (int)n, MPI_FLOAT, rb, (int)n, MPI_FLOAT,
                       MPI_COMM_WORLD);
    for (q = 0; rc == MPI_SUCCESS && q < P; q++)
      for (k = 0; k < n; k++)
        *bad += rb[(size_t)q * n + k] != (float)(q * 3 + (int)(i % 5));
    return rc;
  case 3:
    for (k = 0; k < n * (size_t)P; k++) sb[k] = (float)(me * 100 + (int)(k / n));
    rc = MPI_Alltoall(sb, (int)n, MPI_FLOAT, rb, (int)n, MPI_FLOAT,
                      MPI_COMM_WORLD);
    for (q = 0; rc == MPI_SUCCESS && q < P; q++)
      for (k = 0; k < n; k++) *bad += rb[(size_t)q * n + k] != (float)(q * 100 + me);
    return rc;
  case 4:
    for (k = 0; k < n * (size_t)P; k++) sb[k] = (float)(me + 1);
    rc = MPI_Reduce_scatter_block(sb, rb, (int)n, MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
    want = (float)(P * (P + 1) / 2);
    for (k = 0; rc == MPI_SUCCESS && k < n; k++) *bad += rb[k] != want;
    return rc;
  default:
    return MPI_Barrier(MPI_COMM_WORLD);
  }
}

int main(int argc, char **argv) {
  int me, P, rc, bad = 0, last = 0, len;
  unsigned i;
  char msg[MPI_MAX_ERROR_STRING];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  sb = malloc(MAXN * 8 * sizeof(float));
  rb = malloc(MAXN * 8 * sizeof(float));
  for (i = 0;; i++) {
    rc = run_one(i, me, P, &bad);
    if (rc != MPI_SUCCESS) break;
    if (bad != last) {
      printf("@bad %d %u %d\n", me, i, bad - last);
      last = bad;
    }
    if (i == 20) printf("@ready %d %d\n", me, (int)getpid());
  }
  len = 0;
  MPI_Error_string(rc, msg, &len);
  printf("@err %d %.6f - - | %.*s\n", me, mono(), len, msg);
  _exit(0); /* MPI_Finalize may wait for the dead */
}
