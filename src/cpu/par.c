/* A helper thread for large copies and reductions (see par.h).
 *
 * One per process, shared by every group: a job is posted by bumping
 * `posted` after filling the job fields; whoever claims it first (moves
 * `claimed` to its number) runs the second half: the helper, or the
 * caller once its own half is done and the helper has not come (asleep,
 * or not given a CPU: the loop must not wait a scheduler's time slice
 * for it). The helper stores the number in `finished` when it is done;
 * the caller waits only for a half the helper is running (as long as its
 * own), so nothing here sleeps on the loop. The helper spins a while
 * after each job (large frames come in a burst of 256 KiB chunks) and
 * then sleeps on a futex, so an idle process costs nothing. A process
 * that forks has no helper in the child: the helper is used only by the
 * process that started it. Every signal is blocked on the helper, so none
 * is delivered there. */
#define _GNU_SOURCE
#include "par.h"
#include "loop/config.h"
#include "loop/internal.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define HELPER_SPIN_NS (200u * 1000) /* after a job, before sleeping */

static struct {
  pthread_mutex_t setup_mu;
  int decided;
  int on;
  pid_t pid;            /* the process the helper runs in */
  atomic_flag busy;     /* a caller holds the helper */
  _Atomic uint32_t posted;
  _Atomic uint32_t claimed;
  _Atomic uint32_t finished;
  _Atomic uint32_t sleeping;
  uvccl__par_fn fn;
  void *ctx;
  size_t off, n;
} P = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, ATOMIC_FLAG_INIT, 0, 0, 0, 0,
       NULL, NULL, 0, 0};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *helper(void *arg) {
  uint32_t seen = 0;
  (void)arg;
  for (;;) {
    uint64_t t0 = uvccl__now_ns();
    uint32_t k = 0;
    /* spin a while for the next job, then sleep until one is posted */
    while (atomic_load_explicit(&P.posted, memory_order_acquire) == seen) {
      cpu_relax();
      if ((++k & 255) != 0) continue;
      if (uvccl__now_ns() - t0 < HELPER_SPIN_NS) continue;
      atomic_store(&P.sleeping, 1);
      if (atomic_load(&P.posted) == seen)
        syscall(SYS_futex, &P.posted, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
      atomic_store(&P.sleeping, 0);
      t0 = uvccl__now_ns();
    }
    seen = atomic_load_explicit(&P.posted, memory_order_acquire);
    {
      uint32_t before = seen - 1;
      /* the caller may have taken it back meanwhile */
      if (!atomic_compare_exchange_strong(&P.claimed, &before, seen))
        continue;
    }
    P.fn(P.ctx, P.off, P.n);
    atomic_store_explicit(&P.finished, seen, memory_order_release);
  }
  return NULL;
}

static int cpus_usable(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

int uvccl__par_setup(int local_ranks) {
  int setting; /* auto|0|1 */
  uvccl__config_choice(UVCCL__CFG_SHM_HELPER, &setting);
  pthread_mutex_lock(&P.setup_mu);
  if (!P.decided || P.pid != getpid()) {
    int want = setting != 0 ? setting == 2 : cpus_usable() >= 2 * local_ranks;
    P.decided = 1;
    P.pid = getpid();
    P.on = 0;
    if (want) {
      pthread_t t;
      pthread_attr_t a;
      sigset_t all, old;
      sigfillset(&all);
      pthread_attr_init(&a);
      pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
      pthread_sigmask(SIG_SETMASK, &all, &old);
      /* a fresh start (a forked child's state says nothing) */
      atomic_store(&P.posted, 0);
      atomic_store(&P.claimed, 0);
      atomic_store(&P.finished, 0);
      atomic_flag_clear(&P.busy);
      if (pthread_create(&t, &a, helper, NULL) == 0) P.on = 1;
      pthread_sigmask(SIG_SETMASK, &old, NULL);
      pthread_attr_destroy(&a);
    }
  }
  pthread_mutex_unlock(&P.setup_mu);
  return P.on;
}

void uvccl__par_run(uvccl__par_fn fn, void *ctx, size_t n, size_t grain) {
  size_t half;
  uint32_t job;
  if (grain == 0) grain = 1;
  half = n / 2 - (n / 2) % grain;
  if (!P.on || n < UVCCL__PAR_MIN || half == 0 ||
      atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire)) {
    fn(ctx, 0, n);
    return;
  }
  if (P.pid != getpid()) { /* a forked child: no helper here */
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
    fn(ctx, 0, n);
    return;
  }
  P.fn = fn;
  P.ctx = ctx;
  P.off = half;
  P.n = n - half;
  job = atomic_load_explicit(&P.posted, memory_order_relaxed) + 1;
  atomic_store(&P.posted, job); /* seq_cst: read with `sleeping` below */
  if (atomic_load(&P.sleeping))
    syscall(SYS_futex, &P.posted, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  fn(ctx, 0, half);
  {
    uint32_t before = job - 1;
    if (atomic_compare_exchange_strong(&P.claimed, &before, job))
      fn(ctx, half, n - half); /* the helper did not come: ours too */
    else
      while (atomic_load_explicit(&P.finished, memory_order_acquire) != job)
        cpu_relax();
  }
  atomic_flag_clear_explicit(&P.busy, memory_order_release);
}

typedef struct {
  char *dst;
  const char *src;
} copy_job_t;

static void copy_part(void *ctx, size_t off, size_t n) {
  copy_job_t *j = ctx;
  memcpy(j->dst + off, j->src + off, n);
}

/* A copy through part, split with the helper where it pays. */
static void par_copy(void *dst, const void *src, size_t n, uvccl__par_fn part) {
  copy_job_t j = {dst, src};
  if (!P.on || n < UVCCL__PAR_MIN) part(&j, 0, n);
  else uvccl__par_run(part, &j, n, 64);
}

void uvccl__par_memcpy(void *dst, const void *src, size_t n) {
  par_copy(dst, src, n, copy_part);
}

/* memcpy with non-temporal stores: the destination's lines are written
 * whole, without being read into the cache first (a plain store fetches
 * each line before it overwrites it: a third of the memory traffic of a
 * copy that misses the cache) and without evicting what the cache holds.
 * The fence at the end orders the stores before whatever tells another
 * thread they are done (they are weakly ordered). */
static void copy_stream(char *dst, const char *src, size_t n) {
#if defined(__x86_64__)
  size_t head = (size_t)(-(uintptr_t)dst & 15), i;
  if (n < 256) {
    memcpy(dst, src, n);
    return;
  }
  memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (i = 0; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  memcpy(dst, src, n);
#endif
}

static void stream_part(void *ctx, size_t off, size_t n) {
  copy_job_t *j = ctx;
  copy_stream(j->dst + off, j->src + off, n);
}

void uvccl__par_memcpy_stream(void *dst, const void *src, size_t n) {
  par_copy(dst, src, n, stream_part);
}
