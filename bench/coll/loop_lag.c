/* How responsive a server's loop stays while large collectives run on it.
 *
 * Driven as a server drives uvccl: everything happens in callbacks under
 * one uv_run(UV_RUN_DEFAULT); each collective is started from the
 * callback of the one before (a barrier between them, as a server's
 * requests would come), and nothing ever waits (no uvccl_work_wait).
 * Beside them a 1 ms uv_timer records how late each tick fires: the
 * loop's lag, what a server sharing the loop would add to its own
 * requests. Per (collective, size) cell, every rank reports:
 *
 *   lag p50/p99/max      how late the ticks fired (ms)
 *   os p99/max           the part of each tick's lag the machine took
 *                        away from the loop's thread, since the previous
 *                        tick: its run delay (runnable, not running:
 *                        /proc/thread-self/schedstat) plus the time it
 *                        neither ran, waited nor slept in the loop
 *                        (uv_metrics_idle_time): a virtual CPU the
 *                        hypervisor did not run, interrupts; capped at
 *                        the lag
 *   own p99/max          the rest of the lag: the thread ran (uvccl's
 *                        callbacks, the loop's and the program's own
 *                        work) or slept past the due time (libuv sleeps
 *                        in whole milliseconds)
 *   cb wall/cpu max      the longest uvccl callback on the loop, in
 *                        wall-clock and in thread CPU time
 *                        (uvccl_pg_loop_stats, loop_stats on); the
 *                        difference is time the thread was descheduled
 *   cb>2ms               callbacks over 2 ms of CPU time
 *   steady cb cpu, >2ms  the same without the warm-up iteration (the
 *                        lag is measured without it: its callbacks
 *                        touch uvccl's buffers for the first time)
 *   MiB/cb               the most bytes one callback moved
 *   op ms                each collective's median and worst time
 *
 * The row is the worst over the ranks (MAX), gathered with uvccl itself
 * after the cell; values are checked after each cell (outside the timed
 * part).
 *
 *   build/bin/uvccl-run -n 2 build/bench/uvccl-loop-lag \
 *       [--op allreduce,broadcast,allgather,reduce_scatter|all]
 *       [--sizes 16M,64M,256M] [--iters N] [--json] [--no-stats] [--gpu]
 *       [--probe US]
 *
 * --gpu puts the buffers in GPU memory (device $LOCAL_RANK, else 0): the
 * collectives are staged through pinned host memory by the device thread,
 * whose hand-offs to the loop are then what the ticks see.
 *
 * --probe US runs a control on the loop beside uvccl's callbacks: each
 * tick does US microseconds of arithmetic (no memory, no system call),
 * timed on the thread's CPU clock like uvccl's callbacks. A probe that
 * takes 2 ms of CPU took it from the machine (an interrupt charged to the
 * thread, a virtual CPU the hypervisor held without saying so), not from
 * its work: how often that happens, per second of CPU, is the floor any
 * callback of that length meets on this machine. The row then also has
 * sums over the ranks and the whole cell, warm-up included (the probes',
 * and uvccl's callbacks' CPU time and counts of 1 and 2 ms or more), to
 * compare the two rates.
 *
 * --no-stats leaves the callbacks untimed (loop_stats off: two reads of
 * the thread's CPU clock a callback, about 10% of a 256 MiB collective's
 * time on the 2-core VM), for the collectives' own times; the cb columns
 * are then bytes only.
 *
 * bench/coll/loop_lag.sh runs it over transports, world sizes and several
 * jobs each. */
#define _GNU_SOURCE
#include "uvccl.h"

#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../tools/size_arg.h"

enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, NOPS };
static const char *const op_names[NOPS] = {"allreduce", "broadcast",
                                           "allgather", "reduce_scatter"};

/* What a cell's rank reports, MAX-reduced over the ranks. */
enum {
  R_P50, R_P99, R_MAX, R_OS99, R_OSMAX, R_OWN99, R_OWNMAX, R_CBWALL,
  R_CBCPU, R_CB2MS, R_MAXBYTES, R_OPMED, R_OPMAX, R_BAD, R_TICKS, R_CBS,
  R_SCBCPU, R_SCB2MS, R_PROBEMAX, NR
};

/* Sums over the ranks (--probe). */
enum {
  S_PROBES, S_PROBE_NS, S_PROBE_1MS, S_PROBE_2MS, S_CBS, S_CB_NS, S_CB_1MS,
  S_CB_2MS, NS
};

static struct {
  uv_loop_t loop;
  uvccl_pg_t pg;
  uvccl_work_t w, statw;
  uv_timer_t tick;
  int ops[NOPS], nops;
  uint64_t sizes[16];
  int nsizes;
  int iters;                  /* this cell's */
  int iters_opt;              /* --iters (0: by size) */
  int json;
  int no_stats;
  int op_i, size_i, iter;     /* where the run is */
  float *sbuf, *rbuf;         /* the largest size's buffers */
  int gpu;                    /* --gpu: the collectives' buffers on the
                                 device, sbuf and rbuf their host copies */
  void *dsbuf, *drbuf;
  size_t n;                   /* elements of the cell's buffer */
  /* the cell's ticks */
  int measuring;
  uint64_t expected_ns;
  uint64_t last_ns, last_cpu, last_delay, last_idle;
  double *lag, *os;
  size_t nticks, capticks;
  double *opms;
  uint64_t op_t0;
  int sched_fd;
  double row[NR];
  double sums[NS];
  /* --probe */
  uint64_t probe_us, probe_iters;
  int probing;                /* the cell's ticks, warm-up too */
  uint64_t probes, probe_ns, probe_1ms, probe_2ms, probe_max;
  /* the warm-up iteration's callbacks (counted apart, then with the
   * rest) */
  uint64_t warm_cpu_max, warm_2ms;
  uint64_t warm_cbs, warm_cpu_ns, warm_1ms;
  int rc;
  int stats_ok;
} B;

static void die(const char *what, int rc) {
  fprintf(stderr, "loop_lag: %s: %s %s\n", what, uvccl_strerror(rc), B.w.msg);
  exit(1);
}

/* The buffers the collectives run on. */
static void *send_buf(void) { return B.gpu ? B.dsbuf : (void *)B.sbuf; }
static void *recv_buf(void) { return B.gpu ? B.drbuf : (void *)B.rbuf; }

/* --gpu: the host copies to the device before a cell, the result back
 * after it (outside the timed part; blocking). */
static void gpu_copy(void *dst, const void *src, size_t n) {
  int rc;
  if (!B.gpu || n == 0) return;
  if ((rc = uvccl_gpu_memcpy(dst, src, n)) != 0) die("uvccl_gpu_memcpy", rc);
}

/* The loop thread's CPU time and run delay so far (ns): time it ran, and
 * time it was runnable but not running. 0 where the kernel does not say. */
static void sched_times(uint64_t *cpu_ns, uint64_t *delay_ns) {
  char buf[128];
  ssize_t n;
  unsigned long long cpu, delay;
  *cpu_ns = *delay_ns = 0;
  if (B.sched_fd < 0) return;
  n = pread(B.sched_fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return;
  buf[n] = '\0';
  if (sscanf(buf, "%llu %llu", &cpu, &delay) != 2) return;
  *cpu_ns = cpu;
  *delay_ns = delay;
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The probe's work: a xorshift in registers, n steps. */
static volatile uint64_t probe_sink;
static void probe_work(uint64_t n) {
  uint64_t x = 88172645463325252ull, i;
  for (i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  probe_sink = x;
}

/* Steps for probe_us of CPU: the fastest of a few tries, so that a try
 * the machine stalled does not set it. */
static void probe_calibrate(void) {
  uint64_t best = UINT64_MAX, n = 1000000;
  int k;
  for (k = 0; k < 5; k++) {
    uint64_t c0 = thread_cpu_ns(), d;
    probe_work(n);
    d = thread_cpu_ns() - c0;
    if (d > 0 && d < best) best = d;
  }
  B.probe_iters = best == UINT64_MAX ? n : B.probe_us * 1000 * n / best;
  if (B.probe_iters == 0) B.probe_iters = 1;
}

static void probe_run(void) {
  uint64_t c0 = thread_cpu_ns(), d;
  probe_work(B.probe_iters);
  d = thread_cpu_ns() - c0;
  B.probes++;
  B.probe_ns += d;
  B.probe_1ms += d >= 1000000;
  B.probe_2ms += d >= 2000000;
  if (d > B.probe_max) B.probe_max = d;
}

static void on_tick(uv_timer_t *t) {
  uint64_t now = uv_hrtime(), cpu, delay, idle = uv_metrics_idle_time(&B.loop);
  (void)t;
  if (B.probing) probe_run();
  sched_times(&cpu, &delay);
  if (B.measuring && B.expected_ns) {
    double lag = now > B.expected_ns ? (double)(now - B.expected_ns) / 1e6 : 0;
    /* the interval's wall time that the thread neither ran, waited to run
     * nor slept in the loop: taken by the machine */
    int64_t gone = (int64_t)(now - B.last_ns) - (int64_t)(cpu - B.last_cpu) -
                   (int64_t)(delay - B.last_delay) -
                   (int64_t)(idle - B.last_idle);
    double os = (double)(delay - B.last_delay) / 1e6 +
                (gone > 0 ? (double)gone / 1e6 : 0);
    if (B.nticks == B.capticks) {
      B.capticks = B.capticks ? B.capticks * 2 : 8192;
      B.lag = realloc(B.lag, B.capticks * sizeof(double));
      B.os = realloc(B.os, B.capticks * sizeof(double));
      if (B.lag == NULL || B.os == NULL) die("out of memory", UV_ENOMEM);
    }
    B.lag[B.nticks] = lag;
    B.os[B.nticks] = os < lag ? os : lag;
    B.nticks++;
    if (lag > 3 && getenv("LOOP_LAG_SITES") != NULL)
      fprintf(stderr, "rank %d at %.6f tick late %.3f ms: interval %.3f ms, ran %.3f, "
              "waited to run %.3f, slept in the loop %.3f, gone %.3f\n",
              B.pg.rank, (double)now / 1e9, lag, (double)(now - B.last_ns) / 1e6,
              (double)(cpu - B.last_cpu) / 1e6,
              (double)(delay - B.last_delay) / 1e6,
              (double)(idle - B.last_idle) / 1e6, (double)gone / 1e6);
  }
  B.last_ns = now;
  B.last_cpu = cpu;
  B.last_delay = delay;
  B.last_idle = idle;
  B.expected_ns = now + 1000000;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double q) {
  size_t i;
  if (n == 0) return 0;
  i = (size_t)((double)n * q);
  if (i >= n) i = n - 1;
  return v[i];
}

static int cur_op(void) { return B.ops[B.op_i]; }

/* Elements in and out for the cell's size (nccl-tests' conventions: the
 * buffer for allreduce and broadcast, the whole output of allgather, the
 * whole input of reduce_scatter). */
static void cell_counts(size_t *in, size_t *out) {
  size_t total = (size_t)(B.sizes[B.size_i] / 4), p = (size_t)B.pg.size;
  switch (cur_op()) {
  case OP_ALLGATHER: *in = total / p; *out = *in * p; break;
  case OP_REDUCE_SCATTER: *out = total / p; *in = *out * p; break;
  default: *in = *out = total; break;
  }
}

static float want(size_t i) {
  int p = B.pg.size;
  size_t in, out;
  cell_counts(&in, &out);
  switch (cur_op()) {
  case OP_ALLREDUCE: return (float)(p * (p + 1) / 2);
  case OP_BROADCAST: return 1.0f + (float)(i % 7);
  case OP_ALLGATHER: return (float)(i / in + 1);
  default: return (float)(p * (p + 1) / 2) + (float)(i % 3);
  }
}

static void fill(void) {
  size_t in, out, k;
  float me = (float)(B.pg.rank + 1);
  cell_counts(&in, &out);
  for (k = 0; k < in; k++) {
    switch (cur_op()) {
    case OP_BROADCAST:
      B.sbuf[k] = B.pg.rank == 0 ? 1.0f + (float)(k % 7) : -1.0f;
      break;
    case OP_REDUCE_SCATTER:
      B.sbuf[k] = me + (B.pg.rank == 0 ? (float)((k % out) % 3) : 0.0f);
      break;
    default: B.sbuf[k] = me; break;
    }
  }
  for (k = 0; k < out; k++) B.rbuf[k] = -2.0f;
  gpu_copy(B.dsbuf, B.sbuf, in * sizeof(float));
  gpu_copy(B.drbuf, B.rbuf, out * sizeof(float));
}

/* Every element of the output, sampled at growing strides (the whole
 * of a 256 MiB buffer would take longer than the collective). */
static int check(void) {
  size_t in, out, k, bad = 0;
  const float *res = cur_op() == OP_BROADCAST ? B.sbuf : B.rbuf;
  cell_counts(&in, &out);
  if (cur_op() == OP_BROADCAST)
    gpu_copy(B.sbuf, B.dsbuf, out * sizeof(float));
  else
    gpu_copy(B.rbuf, B.drbuf, out * sizeof(float));
  for (k = 0; k < out; k += 1 + k % 61)
    if (res[k] != want(k)) bad++;
  if (out > 0 && res[out - 1] != want(out - 1)) bad++;
  return bad > 0;
}

static void start_iter(void);
static void cell_begin(void);

static void report(void) {
  double *r = B.row;
  const char *op = op_names[cur_op()];
  double mib = (double)B.sizes[B.size_i] / (1 << 20);
  if (B.pg.rank != 0) return;
  if (B.json) {
    printf("{\"op\":\"%s\",\"mib\":%.0f,\"world\":%d,\"iters\":%d,"
           "\"ticks\":%.0f,\"lag_p50\":%.3f,\"lag_p99\":%.3f,"
           "\"lag_max\":%.3f,\"os_p99\":%.3f,\"os_max\":%.3f,"
           "\"own_p99\":%.3f,\"own_max\":%.3f,\"cb_wall_max\":%.3f,"
           "\"cb_cpu_max\":%.3f,\"cb_over_2ms\":%.0f,\"callbacks\":%.0f,"
           "\"cb_max_mib\":%.2f,\"op_med\":%.2f,\"op_max\":%.2f,"
           "\"cb_cpu_max_steady\":%.3f,\"cb_over_2ms_steady\":%.0f,"
           "\"gpu\":%s,\"ok\":%s",
           op, mib, B.pg.size, B.iters, r[R_TICKS], r[R_P50], r[R_P99],
           r[R_MAX], r[R_OS99], r[R_OSMAX], r[R_OWN99], r[R_OWNMAX],
           r[R_CBWALL], r[R_CBCPU], r[R_CB2MS], r[R_CBS],
           r[R_MAXBYTES] / (1 << 20), r[R_OPMED], r[R_OPMAX], r[R_SCBCPU],
           r[R_SCB2MS], B.gpu ? "true" : "false",
           r[R_BAD] > 0 ? "false" : "true");
    if (B.probe_us > 0)
      printf(",\"probe_us\":%llu,\"probes\":%.0f,\"probe_cpu_ms\":%.3f,"
             "\"probes_over_1ms\":%.0f,\"probes_over_2ms\":%.0f,"
             "\"probe_max\":%.3f,\"cbs_all\":%.0f,\"cb_cpu_ms\":%.3f,"
             "\"cbs_over_1ms\":%.0f,\"cbs_over_2ms\":%.0f",
             (unsigned long long)B.probe_us, B.sums[S_PROBES],
             B.sums[S_PROBE_NS] / 1e6, B.sums[S_PROBE_1MS],
             B.sums[S_PROBE_2MS], r[R_PROBEMAX], B.sums[S_CBS],
             B.sums[S_CB_NS] / 1e6, B.sums[S_CB_1MS], B.sums[S_CB_2MS]);
    printf("}\n");
  } else {
    printf("%-14s %5.0f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f "
           "%7.3f %6.0f %6.2f %8.2f %8.2f  %s\n",
           op, mib, r[R_P50], r[R_P99], r[R_MAX], r[R_OS99], r[R_OSMAX],
           r[R_OWN99], r[R_OWNMAX], r[R_CBWALL], r[R_CBCPU], r[R_CB2MS],
           r[R_MAXBYTES] / (1 << 20), r[R_OPMED], r[R_OPMAX],
           r[R_BAD] > 0 ? "WRONG" : "exact");
  }
  fflush(stdout);
}

static void next_cell(void) {
  if (++B.size_i == B.nsizes) {
    B.size_i = 0;
    if (++B.op_i == B.nops) {
      uv_close((uv_handle_t *)&B.tick, NULL);
      uvccl_pg_destroy(&B.pg, NULL);
      return;
    }
  }
  cell_begin();
}

static void on_sums(uvccl_work_t *w, int status) {
  (void)w;
  if (status != 0) die("summing the probes", status);
  report();
  if (B.row[R_BAD] > 0) B.rc = 1;
  next_cell();
}

static void on_row(uvccl_work_t *w, int status) {
  (void)w;
  if (status != 0) die("gathering the row", status);
  if (B.probe_us > 0) {
    if (uvccl_allreduce(&B.pg, &B.statw, B.sums, B.sums, NS, UVCCL_FLOAT64,
                        UVCCL_SUM, on_sums) != 0)
      die("allreduce of the sums", UV_EINVAL);
    return;
  }
  report();
  if (B.row[R_BAD] > 0) B.rc = 1;
  next_cell();
}

static void cell_end(void) {
  double *r = B.row, *own;
  size_t i, n = B.nticks;
#ifdef UVCCL_LOOP_HIST
  uvccl_loop_stats_t st;
  int k;
#endif
  B.measuring = 0;
  B.probing = 0;
  uv_timer_stop(&B.tick);
  memset(r, 0, sizeof(B.row));
  memset(B.sums, 0, sizeof(B.sums));
  B.sums[S_PROBES] = (double)B.probes;
  B.sums[S_PROBE_NS] = (double)B.probe_ns;
  B.sums[S_PROBE_1MS] = (double)B.probe_1ms;
  B.sums[S_PROBE_2MS] = (double)B.probe_2ms;
  r[R_PROBEMAX] = (double)B.probe_max / 1e6;
  own = malloc((n ? n : 1) * sizeof(double));
  if (own == NULL) die("out of memory", UV_ENOMEM);
  for (i = 0; i < n; i++) own[i] = B.lag[i] - B.os[i];
  qsort(B.lag, n, sizeof(double), cmp);
  qsort(B.os, n, sizeof(double), cmp);
  qsort(own, n, sizeof(double), cmp);
  qsort(B.opms, (size_t)B.iters, sizeof(double), cmp);
  r[R_P50] = pct(B.lag, n, 0.5);
  r[R_P99] = pct(B.lag, n, 0.99);
  r[R_MAX] = n ? B.lag[n - 1] : 0;
  r[R_OS99] = pct(B.os, n, 0.99);
  r[R_OSMAX] = n ? B.os[n - 1] : 0;
  r[R_OWN99] = pct(own, n, 0.99);
  r[R_OWNMAX] = n ? own[n - 1] : 0;
  r[R_TICKS] = (double)n;
  free(own);
#ifdef UVCCL_LOOP_HIST /* (built against an older uvccl: no counters) */
  if (uvccl_pg_loop_stats(&B.pg, &st, 1) == 0) {
    r[R_CBWALL] = (double)st.max_wall_ns / 1e6;
    r[R_SCBCPU] = (double)st.max_cpu_ns / 1e6;
    for (k = 5; k < UVCCL_LOOP_HIST; k++) r[R_SCB2MS] += (double)st.cpu_hist[k];
    r[R_CBCPU] = (double)(st.max_cpu_ns > B.warm_cpu_max ? st.max_cpu_ns
                                                          : B.warm_cpu_max) /
                 1e6;
    r[R_CB2MS] = r[R_SCB2MS] + (double)B.warm_2ms;
    r[R_MAXBYTES] = (double)st.max_bytes;
    r[R_CBS] = (double)st.callbacks;
    /* every callback of the cell, the warm-up's too, as the probes */
    B.sums[S_CBS] = (double)(st.callbacks + B.warm_cbs);
    B.sums[S_CB_NS] = (double)(st.cpu_ns + B.warm_cpu_ns);
    B.sums[S_CB_1MS] = (double)B.warm_1ms;
    for (k = 4; k < UVCCL_LOOP_HIST; k++) B.sums[S_CB_1MS] += (double)st.cpu_hist[k];
    B.sums[S_CB_2MS] = r[R_CB2MS];
    if (getenv("LOOP_LAG_SITES") != NULL)
      fprintf(stderr, "rank %d %s %.0f MiB: longest callback %s %.3f ms "
              "(cpu: %s %.3f ms)\n", B.pg.rank, op_names[cur_op()],
              (double)B.sizes[B.size_i] / (1 << 20),
              st.max_wall_site ? st.max_wall_site : "-", r[R_CBWALL],
              st.max_cpu_site ? st.max_cpu_site : "-", r[R_CBCPU]);
  }
#endif
  r[R_OPMED] = B.opms[B.iters / 2];
  r[R_OPMAX] = B.opms[B.iters - 1];
  r[R_BAD] = check();
  B.nticks = 0;
  if (uvccl_allreduce(&B.pg, &B.statw, r, r, NR, UVCCL_FLOAT64, UVCCL_MAX,
                      on_row) != 0)
    die("allreduce of the row", UV_EINVAL);
}

static void on_op(uvccl_work_t *w, int status) {
  double ms = (double)(uv_hrtime() - B.op_t0) / 1e6;
  if (status != 0) die(op_names[cur_op()], status);
  (void)w;
  if (B.iter >= 0) B.opms[B.iter] = ms;
  if (++B.iter == B.iters) {
    cell_end();
    return;
  }
  start_iter();
}

static void on_barrier(uvccl_work_t *w, int status) {
  size_t in, out;
  int rc;
  (void)w;
  if (status != 0) die("barrier", status);
  cell_counts(&in, &out);
  if (B.iter >= 0) B.measuring = 1; /* the first one warms up */
#ifdef UVCCL_LOOP_HIST
  if (B.iter == 0) {
    uvccl_loop_stats_t st;
    int k;
    B.warm_cpu_max = B.warm_2ms = B.warm_cbs = B.warm_cpu_ns = B.warm_1ms = 0;
    if (uvccl_pg_loop_stats(&B.pg, &st, 1) == 0) {
      B.warm_cpu_max = st.max_cpu_ns;
      B.warm_cbs = st.callbacks;
      B.warm_cpu_ns = st.cpu_ns;
      for (k = 5; k < UVCCL_LOOP_HIST; k++) B.warm_2ms += st.cpu_hist[k];
      for (k = 4; k < UVCCL_LOOP_HIST; k++) B.warm_1ms += st.cpu_hist[k];
    }
  }
#endif
  B.op_t0 = uv_hrtime();
  switch (cur_op()) {
  case OP_ALLREDUCE:
    rc = uvccl_allreduce(&B.pg, &B.w, send_buf(), recv_buf(), in,
                         UVCCL_FLOAT32, UVCCL_SUM, on_op);
    break;
  case OP_BROADCAST:
    rc = uvccl_broadcast(&B.pg, &B.w, send_buf(), in, UVCCL_FLOAT32, 0,
                         on_op);
    break;
  case OP_ALLGATHER:
    rc = uvccl_allgather(&B.pg, &B.w, send_buf(), recv_buf(), in,
                         UVCCL_FLOAT32, on_op);
    break;
  default:
    rc = uvccl_reduce_scatter(&B.pg, &B.w, send_buf(), recv_buf(), out,
                              UVCCL_FLOAT32, UVCCL_SUM, on_op);
    break;
  }
  if (rc != 0) die(op_names[cur_op()], rc);
}

static void start_iter(void) {
  int rc = uvccl_barrier(&B.pg, &B.w, on_barrier);
  if (rc != 0) die("barrier", rc);
}

static void cell_begin(void) {
  /* enough ticks for a p99 at every size: about 1 GiB a cell */
  B.iters = B.iters_opt;
  if (B.iters == 0) {
    uint64_t n = ((uint64_t)1 << 30) / B.sizes[B.size_i];
    B.iters = n < 4 ? 4 : n > 64 ? 64 : (int)n;
  }
  fill();
  B.iter = -1; /* a warm-up first */
  B.probes = B.probe_ns = B.probe_1ms = B.probe_2ms = B.probe_max = 0;
  B.probing = B.probe_us > 0;
  B.nticks = 0;
  B.expected_ns = 0;
#ifdef UVCCL_LOOP_HIST
  uvccl_pg_loop_stats(&B.pg, NULL, 1);
#endif
  uv_timer_start(&B.tick, on_tick, 1, 1);
  start_iter();
}

static void on_created(uvccl_work_t *w, int status) {
  (void)w;
  if (status != 0) die("group", status);
  if (B.pg.rank == 0 && !B.json) {
    printf("# loop lag, %d ranks (%s between ranks 0 and 1)%s; times in ms, "
           "MAX over ranks\n",
           B.pg.size, B.pg.size > 1 ? uvccl_pg_peer_transport(&B.pg, 1) : "-",
           B.gpu ? ", GPU buffers staged" : "");
    printf("%-14s %5s %7s %7s %7s %7s %7s %7s %7s %7s %7s %6s %6s %8s %8s\n",
           "# op", "MiB", "lag50", "lag99", "lagmax", "os99", "osmax",
           "own99", "ownmax", "cbwall", "cbcpu", "cb>2ms", "MiB/cb",
           "op_med", "op_max");
  }
  uv_timer_init(&B.loop, &B.tick);
  cell_begin();
}

static void usage(void) {
  fprintf(stderr,
          "usage: uvccl-run -n W uvccl-loop-lag [--op "
          "allreduce,broadcast,allgather,reduce_scatter|all]\n"
          "       [--sizes 16M,64M,256M] [--iters N] [--json] [--no-stats] "
          "[--gpu] [--probe US]\n");
  exit(2);
}

static void parse_ops(const char *arg) {
  char *dup = strdup(arg), *tok, *save = NULL;
  int k;
  B.nops = 0;
  for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (strcmp(tok, "all") == 0) {
      for (k = 0; k < NOPS; k++) B.ops[k] = k;
      B.nops = NOPS;
      continue;
    }
    for (k = 0; k < NOPS && strcmp(tok, op_names[k]) != 0; k++) {
    }
    if (k == NOPS || B.nops == NOPS) usage();
    B.ops[B.nops++] = k;
  }
  free(dup);
  if (B.nops == 0) usage();
}

static void parse_sizes(const char *arg) {
  char *dup = strdup(arg), *tok, *save = NULL;
  B.nsizes = 0;
  for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    uint64_t v;
    if (B.nsizes == 16 || parse_size_arg(tok, (uint64_t)4 << 30, &v) != 0 ||
        v < 4096)
      usage();
    B.sizes[B.nsizes++] = v;
  }
  free(dup);
  if (B.nsizes == 0) usage();
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"op", required_argument, NULL, 'o'},
      {"sizes", required_argument, NULL, 's'},
      {"iters", required_argument, NULL, 'n'},
      {"json", no_argument, NULL, 'j'},
      {"no-stats", no_argument, NULL, 's' + 256},
      {"gpu", no_argument, NULL, 'g'},
      {"probe", required_argument, NULL, 'p'},
      {NULL, 0, NULL, 0}};
  uvccl_pg_options_t o;
  uint64_t largest = 0;
  int c, k, rc;

  B.ops[0] = OP_ALLREDUCE;
  B.nops = 1;
  B.sizes[0] = (uint64_t)64 << 20;
  B.sizes[1] = (uint64_t)256 << 20;
  B.nsizes = 2;
  B.iters = 0;
  while ((c = getopt_long(argc, argv, "n:", longopts, NULL)) != -1) {
    switch (c) {
    case 'o': parse_ops(optarg); break;
    case 's': parse_sizes(optarg); break;
    case 'n': B.iters = atoi(optarg); break;
    case 'j': B.json = 1; break;
    case 's' + 256: B.no_stats = 1; break;
    case 'g': B.gpu = 1; break;
    case 'p':
      B.probe_us = (uint64_t)strtoull(optarg, NULL, 10);
      if (B.probe_us == 0 || B.probe_us > 900) usage();
      break;
    default: usage();
    }
  }
  if (optind != argc || B.iters < 0 || B.iters > 1000) usage();
  for (k = 0; k < B.nsizes; k++)
    if (B.sizes[k] > largest) largest = B.sizes[k];
  B.iters_opt = B.iters;
  B.sbuf = malloc(largest);
  B.rbuf = malloc(largest);
  B.opms = calloc(1000, sizeof(double));
  if (B.sbuf == NULL || B.rbuf == NULL || B.opms == NULL) {
    fprintf(stderr, "loop_lag: out of memory\n");
    return 1;
  }
  /* every page touched before anything is timed (not zeros: malloc and
   * memset of zeros may become a calloc that touches nothing) */
  memset(B.sbuf, 0x55, largest);
  memset(B.rbuf, 0x55, largest);
  if (B.gpu) {
    const char *lr = getenv("LOCAL_RANK");
    int dev = lr ? atoi(lr) : 0, count = 0;
    if (uvccl_gpu_device_count(&count) != 0 || count == 0) {
      fprintf(stderr, "loop_lag: --gpu: %s\n",
              uvccl_gpu_unavailable_reason() ? uvccl_gpu_unavailable_reason()
                                             : "no CUDA device");
      return 1;
    }
    if ((rc = uvccl_gpu_malloc(dev % count, &B.dsbuf, largest)) != 0 ||
        (rc = uvccl_gpu_malloc(dev % count, &B.drbuf, largest)) != 0)
      die("--gpu: uvccl_gpu_malloc", rc);
  }
  B.sched_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (B.probe_us > 0) probe_calibrate();
  memset(&o, 0, sizeof(o));
#ifdef UVCCL_LOOP_HIST
  o.loop_stats = B.no_stats ? -1 : 1;
#endif
  uv_loop_init(&B.loop);
  uv_loop_configure(&B.loop, UV_METRICS_IDLE_TIME);
  rc = uvccl_pg_init_url(&B.loop, &B.pg, "env://", &o, &B.w, on_created);
  if (rc != 0) die("group", rc);
  uv_run(&B.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&B.loop);
  free(B.sbuf);
  free(B.rbuf);
  if (B.dsbuf) uvccl_gpu_free(B.dsbuf);
  if (B.drbuf) uvccl_gpu_free(B.drbuf);
  free(B.opms);
  free(B.lag);
  free(B.os);
  if (B.sched_fd >= 0) close(B.sched_fd);
  return B.rc != 0 || rc != 0;
}
