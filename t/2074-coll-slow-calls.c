/* A system call of a turn that took long makes the next ones smaller
 * (src/loop/turn.h, uvccl__piece_t): the turn's clock, read between
 * calls, cannot cut one short, and a kernel or memory several times
 * slower than usual for a while made single sendmsg and read calls take
 * 2-8 ms inside one loop callback.
 *
 *   a) the rule itself: a call over the target shrinks the piece to what
 *      would have fit (in whole pages, at least the least piece); calls
 *      at a rate that would move a whole piece in under half the target
 *      double it back, whether or not they moved a whole piece; a call
 *      between, it leaves it;
 *   b) a real 2-rank world over TCP on one loop, this program standing in
 *      for libc's sendmsg and read (each passes the call to the kernel and
 *      notes the bytes asked for): while calls are fast, a broadcast of
 *      8 MiB goes in sendmsg calls of 512 KiB; one call that burns 4 ms of
 *      the thread's CPU, and the next asks for a quarter of it or less,
 *      the broadcast is exact, and later calls are 512 KiB again;
 *   c) the same for the receiver's reads: one slow read, the next large
 *      read asks for at most a quarter of the usual 128 KiB, exact, and
 *      reads of 128 KiB again later (a piece cut below the size from
 *      which calls are timed is timed all the same). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "loop/turn.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1024)
#define SLOW_NS ((uint64_t)4000000)
#define NOTE_MIN (8 * KiB) /* calls this large or larger are noted */
#define NOTES 4096

/* ---- standing in for libc ------------------------------------------------ */

typedef struct {
  size_t asked[NOTES];
  int slowed[NOTES];
  int n;
  int slow; /* calls still to slow down */
} notes_t;

static notes_t sends, reads;
static int noting;

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A slow kernel, as the thread's CPU clock sees it. */
static void burn(void) {
  uint64_t t0 = thread_cpu_ns();
  while (thread_cpu_ns() - t0 < SLOW_NS) {
  }
}

static void note_call(notes_t *nt, size_t asked, ssize_t got) {
  int slowed = 0;
  if (!noting || asked < NOTE_MIN) return;
  if (nt->slow > 0 && asked >= 64 * KiB && got > 0) {
    nt->slow--;
    burn();
    slowed = 1;
  }
  if (nt->n < NOTES) {
    nt->asked[nt->n] = asked;
    nt->slowed[nt->n] = slowed;
    nt->n++;
  }
}

/* (exported: libuv, a shared library, calls read) */
#define EXPORTED __attribute__((visibility("default")))

EXPORTED ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
  size_t asked = 0;
  size_t i;
  ssize_t r;
  for (i = 0; i < (size_t)m->msg_iovlen; i++) asked += m->msg_iov[i].iov_len;
  r = syscall(SYS_sendmsg, fd, m, flags);
  note_call(&sends, asked, r);
  return r;
}

EXPORTED ssize_t read(int fd, void *buf, size_t n) {
  ssize_t r = syscall(SYS_read, fd, buf, n);
  note_call(&reads, n, r);
  return r;
}

/* ---- a ------------------------------------------------------------------ */

static void scenario_rule(void) {
  uvccl__piece_t p = {0};
  const size_t max = 512 * KiB;
  size_t want;
  is_int((int)uvccl__piece_get(&p, max), (int)max, "a: a new piece is the largest");
  uvccl__piece_learn(&p, max, max, 300000);
  is_int((int)uvccl__piece_get(&p, max), (int)max, "a: a fast call leaves it");
  uvccl__piece_learn(&p, max, max, 3400000);
  want = (size_t)((double)max * 1000000 / 3400000) & ~(size_t)4095;
  is_int((int)uvccl__piece_get(&p, max), (int)want,
         "a: 512 KiB in 3.4 ms: %zu bytes (what 1 ms would move, whole pages)",
         want);
  uvccl__piece_learn(&p, max, 64 * KiB, 900000);
  is_int((int)uvccl__piece_get(&p, max), (int)want,
         "a: a call between half the target and the target leaves it");
  uvccl__piece_learn(&p, max, 128 * KiB, 80000000);
  is_int((int)uvccl__piece_get(&p, max), (int)UVCCL__PIECE_MIN,
         "a: a very slow call: the least piece, %zu", UVCCL__PIECE_MIN);
  uvccl__piece_learn(&p, max, 8 * KiB, 300000);
  is_int((int)uvccl__piece_get(&p, max), (int)UVCCL__PIECE_MIN,
         "a: a part of a piece at a rate that would take 600 us for a whole "
         "one leaves it");
  uvccl__piece_learn(&p, max, 8 * KiB, 200000);
  is_int((int)uvccl__piece_get(&p, max), 32 * 1024,
         "a: a part at a rate of 400 us a piece doubles it (a full socket "
         "takes part of a send)");
  uvccl__piece_learn(&p, max, 32 * KiB, 20000);
  uvccl__piece_learn(&p, max, 64 * KiB, 40000);
  uvccl__piece_learn(&p, max, 128 * KiB, 80000);
  uvccl__piece_learn(&p, max, 256 * KiB, 160000);
  is_int((int)uvccl__piece_get(&p, max), (int)max,
         "a: and back to the largest, not past it");
  is_int((int)p.now, 0, "a: (held as 'the largest', whatever the caller's)");
  uvccl__piece_learn(&p, max, max, 5000);
  is_int((int)uvccl__piece_get(&p, max), (int)max, "a: which stays");
  uvccl__piece_learn(&p, max, 100, UINT64_MAX / 2);
  is_int((int)uvccl__piece_get(&p, max), (int)UVCCL__PIECE_MIN,
         "a: a tiny slow call: the least piece, never 0");
}

/* ---- b, c --------------------------------------------------------------- */

static uv_loop_t L;
#define NB ((size_t)8 << 20)

/* A broadcast of 8 MiB from rank 0; 1 when every byte arrived. */
static int bcast8(world_t *W, unsigned seed) {
  static unsigned char *buf[2];
  int r;
  size_t i;
  for (r = 0; r < 2; r++) {
    if (buf[r] == NULL) buf[r] = malloc(NB);
    if (buf[r] == NULL) return 0;
    for (i = 0; i < NB; i++)
      buf[r][i] = r == 0 ? (unsigned char)(i * 7 + seed) : 0;
  }
  for (r = 0; r < 2; r++)
    if (uvccl_broadcast(&W->pg[r], &W->w[r], buf[r], NB, UVCCL_UINT8, 0,
                        NULL) != 0)
      return 0;
  if (world_wait(W) != 0) return 0;
  for (i = 0; i < NB; i++)
    if (buf[1][i] != (unsigned char)(i * 7 + seed)) return 0;
  return 1;
}

/* The first slowed call's index, or -1. */
static int first_slowed(const notes_t *nt) {
  int i;
  for (i = 0; i < nt->n; i++)
    if (nt->slowed[i]) return i;
  return -1;
}

static size_t largest(const notes_t *nt, int from) {
  size_t m = 0;
  int i;
  for (i = from; i < nt->n; i++)
    if (nt->asked[i] > m) m = nt->asked[i];
  return m;
}

static void scenario_world(void) {
  world_t W;
  int k, round, ok_all = 1, back;
  setenv("UVCCL_TRANSPORT", "tcp", 1);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 2, NULL), 0, "b: a world of 2 over TCP"))
    return;

  memset(&sends, 0, sizeof(sends));
  noting = 1;
  ok(bcast8(&W, 1), "b: an 8 MiB broadcast, calls fast: exact");
  noting = 0;
  is_int((int)largest(&sends, 0), 512 * 1024,
         "b: its largest sendmsg asked for 512 KiB (%d calls noted)", sends.n);

  memset(&sends, 0, sizeof(sends));
  sends.slow = 1;
  noting = 1;
  ok(bcast8(&W, 2), "b: an 8 MiB broadcast with one slow sendmsg: exact");
  k = first_slowed(&sends);
  ok(k >= 0, "b: a sendmsg was slowed (call %d of %d)", k, sends.n);
  if (k >= 0 && k + 1 < sends.n)
    ok(sends.asked[k + 1] <= 128 * KiB && sends.asked[k + 1] >= UVCCL__PIECE_MIN,
       "b: the next asked for %zu bytes (the slow one: %zu in 4 ms)",
       sends.asked[k + 1], sends.asked[k]);
  else
    ok(0, "b: a sendmsg after the slow one");
  /* calls at the usual speed double the piece back */
  back = k >= 0 && largest(&sends, k + 1) == 512 * KiB;
  for (round = 0; round < 6 && !back && k >= 0; round++) {
    ok_all &= bcast8(&W, 10 + (unsigned)round);
    back = largest(&sends, k + 1) == 512 * KiB;
  }
  noting = 0;
  ok(ok_all, "b: the broadcasts after it: exact");
  ok(back, "b: sendmsg calls ask for 512 KiB again (%d more broadcasts)",
     round);

  memset(&reads, 0, sizeof(reads));
  reads.slow = 1;
  noting = 1;
  ok(bcast8(&W, 3), "c: an 8 MiB broadcast with one slow read: exact");
  noting = 0;
  k = first_slowed(&reads);
  ok(k >= 0, "c: a read was slowed (call %d of %d, %zu bytes asked)", k,
     reads.n, k >= 0 ? reads.asked[k] : 0);
  if (k >= 0 && k + 1 < reads.n)
    ok(reads.asked[k + 1] <= 32 * KiB,
       "c: the next large read asked for %zu bytes (at most 128 KiB / 4)",
       reads.asked[k + 1]);
  else
    ok(0, "c: a read after the slow one");
  /* reads of a cut piece are timed too, so it grows back */
  back = k >= 0 && largest(&reads, k + 1) == 128 * KiB;
  noting = 1;
  for (round = 0; round < 6 && !back && k >= 0; round++) {
    ok_all &= bcast8(&W, 20 + (unsigned)round);
    back = largest(&reads, k + 1) == 128 * KiB;
  }
  noting = 0;
  ok(back && ok_all, "c: reads ask for 128 KiB again, exact (%d more "
     "broadcasts)", round);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "the loop closes cleanly");
  unsetenv("UVCCL_TRANSPORT");
}

int main(void) {
  plan(24);
  scenario_rule();
  scenario_world();
  return done_testing();
}
