/* Turns on the application's loop: a budget of bytes and time per
 * callback, and what the callbacks cost (see internal.h). */
#include "internal.h"
#include "loop/turn.h"

#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

static const char *const site_names[UVCCL__SITES] = {
    "read", "write", "ring", "spin", "slice", "call", "timer"};

static uint64_t cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void uvccl__turn_init(uvccl__turn_t *t, size_t budget, uint64_t ns_budget,
                      int timing) {
  memset(t, 0, sizeof(*t));
  t->budget = budget > (size_t)INT64_MAX ? INT64_MAX : (int64_t)budget;
  t->ns_budget = ns_budget;
  t->timing = timing;
  t->st.timed = timing;
}

void uvccl__piece_learn(uvccl__piece_t *p, size_t max, size_t bytes,
                        uint64_t ns) {
  size_t cur = uvccl__piece_get(p, max), n;
  if (ns > UVCCL__PIECE_TARGET_NS) {
    /* what would have taken the target, in whole pages */
    n = (size_t)((double)bytes * UVCCL__PIECE_TARGET_NS / (double)ns);
    n &= ~(size_t)4095;
    if (n < UVCCL__PIECE_MIN) n = UVCCL__PIECE_MIN;
    if (n < cur) p->now = n;
  } else if (cur < max && (double)ns * (double)cur <
                              (double)bytes * (UVCCL__PIECE_TARGET_NS / 2)) {
    /* at this call's rate a whole piece takes under half the target (a
     * send the socket took only part of counts too: where ranks
     * outnumber CPUs the socket is often full) */
    n = cur * 2;
    p->now = n >= max ? 0 : n;
  }
}

void uvccl__turn_io(uvccl__turn_t *t, uvccl__piece_t *p, size_t max,
                    size_t bytes, uint64_t ns) {
  uvccl__piece_learn(p, max, bytes, ns);
  if (ns > UVCCL__PIECE_TARGET_NS / 2 && t->depth > 0) t->clock_at = t->left;
}

/* Another TURN_CLOCK_EVERY bytes moved: 1 when the turn has run out of
 * time (from its start: see uvccl__turn_enter). */
int uvccl__turn_clock(uvccl__turn_t *t) {
  t->clock_at = t->left - UVCCL__TURN_CLOCK_EVERY;
  if (t->ns_budget == 0 || uv_hrtime() - t->clock0 < t->ns_budget) return 0;
  t->late = 1;
  return 1;
}

/* A timed turn this long (CPU) is named in the debug log. */
#define LONG_TURN_NS 2000000u

/* The kernel's id of the calling thread, which a long turn's log line
 * carries so that a kernel trace of the same run can say what ran inside
 * it (bench/coll/long_turns.sh); the process's elsewhere. */
static long thread_id(void) {
#ifdef __linux__
  return (long)syscall(SYS_gettid);
#else
  return (long)uv_os_getpid();
#endif
}

/* Bucket bounds of uvccl_loop_stats_t's histograms, in ns. */
static const uint64_t hist_ns[UVCCL_LOOP_HIST - 1] = {
    100000, 250000, 500000, 1000000, 2000000, 5000000, 10000000};

static int bucket(uint64_t ns) {
  int i;
  for (i = 0; i < UVCCL_LOOP_HIST - 1; i++)
    if (ns < hist_ns[i]) return i;
  return UVCCL_LOOP_HIST - 1;
}

/* The turn left last is over: into the counters. */
static void turn_count(uvccl__turn_t *t) {
  uvccl_loop_stats_t *st = &t->st;
  uint64_t bytes = (uint64_t)(t->budget - t->left);
  t->open = 0;
  st->callbacks++;
  st->bytes += bytes;
  if (bytes > st->max_bytes) st->max_bytes = bytes;
  if (t->timing) {
    uint64_t wall = t->t1 - t->t0, cpu = t->c1 > t->c0 ? t->c1 - t->c0 : 0;
    st->wall_ns += wall;
    st->cpu_ns += cpu;
    if (wall > st->max_wall_ns) {
      st->max_wall_ns = wall;
      st->max_wall_site = site_names[t->site];
    }
    if (cpu > st->max_cpu_ns) {
      st->max_cpu_ns = cpu;
      st->max_cpu_site = site_names[t->site];
    }
    st->wall_hist[bucket(wall)]++;
    st->cpu_hist[bucket(cpu)]++;
    if (cpu >= LONG_TURN_NS)
      LOG_DEBUG("loop", "a long turn: %s, %.3f ms of CPU (%.3f ms on the "
                "clock, from %.6f s), %llu bytes, thread %ld",
                site_names[t->site], (double)cpu / 1e6, (double)wall / 1e6,
                (double)t->t0 / 1e9, (unsigned long long)bytes, thread_id());
  }
}

void uvccl__turn_enter(uvccl__turn_t *t, uvccl__site_t site, const void *key) {
  if (t->depth++ > 0) return;
  if (t->open) {
    if (key != NULL && key == t->key && t->site == (int)site &&
        t->key_iter == t->iter) {
      t->open = 0; /* goes on: same budget, same start */
      return;
    }
    turn_count(t);
  }
  t->site = site;
  t->key = key;
  t->key_iter = t->iter;
  t->left = t->budget;
  t->clock_at = t->budget - UVCCL__TURN_CLOCK_EVERY;
  t->late = 0;
  /* The clock runs from here, not from the first look at it: the first
   * step into memory the host has not yet backed (a fresh scratch or early
   * frame, first touched) can take a millisecond, and a clock started
   * after it let a turn run 2 ms where its budget is 0.5 (issue 30). */
  if (t->timing) {
    t->t0 = t->clock0 = uv_hrtime();
    t->c0 = cpu_ns();
  } else if (t->ns_budget != 0) {
    t->clock0 = uv_hrtime();
  }
}

void uvccl__turn_leave(uvccl__turn_t *t) {
  if (t->depth == 0 || --t->depth > 0) return;
  if (t->timing) {
    t->t1 = uv_hrtime();
    t->c1 = cpu_ns();
  }
  if (t->key != NULL) t->open = 1; /* may go on (see enter) */
  else turn_count(t);
}

void uvccl__turn_stats(uvccl__turn_t *t, uvccl_loop_stats_t *out, int reset) {
  if (t->open && t->depth == 0) turn_count(t);
  if (out != NULL) *out = t->st;
  if (reset) {
    memset(&t->st, 0, sizeof(t->st));
    t->st.timed = t->timing;
  }
}
