/* The works of collectives and point-to-point operations hold no handle of
 * their own: the group keeps their timeouts (one timer) and delivers them
 * from its handles, and uvccl_work_wait delivers a ready one itself
 * (src/loop/work.c, sched.c). In-process worlds (t/world.h):
 *   a) a world of 1: allreduces that complete inside their calls; each
 *      callback runs once, on the loop, never inside the call, in the
 *      order the works completed;
 *   b) timeouts in a world of 2: rank 0 receives from rank 1 (which sends
 *      nothing yet) with 900 ms, 300 ms and the group's timeout, started in
 *      that order: the 300 ms receive fails with UV_ETIMEDOUT first, then
 *      the 900 ms one, neither before its time; the third completes when
 *      rank 1 sends, exact; once nothing is pending the group's timer is
 *      off (it would keep a loop alive);
 *   c) busy polling, small allreduces started on both ranks, then
 *      uvccl_work_wait on each: exact, and most waits end without a loop
 *      turn (a prepare handle counts the turns; every 16th wait turns the
 *      loop all the same, so its timers and sockets are served). */
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "cpu/internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uv_loop_t L;

static double now_ms(void) { return (double)uv_hrtime() / 1e6; }

/* ---- a ------------------------------------------------------------------ */

static int order[8], norder, inside;
static int calls[8];

static void on_a(uvccl_work_t *w, int status) {
  int k = (int)(intptr_t)w->data;
  (void)status;
  calls[k]++;
  if (inside) calls[k] += 100; /* inside the starting call: wrong */
  if (norder < 8) order[norder++] = k;
}

static void scenario_inline(void) {
  world_t W;
  uvccl_work_t w[3];
  float v[3][4];
  int k, rc[3], good = 1;
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 1, NULL), 0, "a: a world of 1")) return;
  memset(w, 0, sizeof(w));
  for (k = 0; k < 3; k++) {
    int i;
    for (i = 0; i < 4; i++) v[k][i] = (float)(k + i);
    w[k].data = (void *)(intptr_t)k;
    inside = 1;
    rc[k] = uvccl_allreduce(&W.pg[0], &w[k], v[k], v[k], 4, UVCCL_FLOAT32,
                            UVCCL_SUM, on_a);
    inside = 0;
  }
  ok(rc[0] == 0 && rc[1] == 0 && rc[2] == 0 && calls[0] + calls[1] +
         calls[2] == 0,
     "a: three allreduces started; no callback ran inside its call");
  for (k = 0; k < 3; k++) uvccl_work_wait(&w[k]);
  for (k = 0; k < 3; k++) {
    int i;
    if (calls[k] != 1 || w[k].status != 0) good = 0;
    for (i = 0; i < 4; i++)
      if (v[k][i] != (float)(k + i)) good = 0;
  }
  ok(good, "a: each callback ran once, status 0, values kept (%d %d %d)",
     calls[0], calls[1], calls[2]);
  ok(norder == 3 && order[0] == 0 && order[1] == 1 && order[2] == 2,
     "a: in the order the works completed (%d %d %d)", order[0], order[1],
     order[2]);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "a: the loop closes cleanly");
}

/* ---- b ------------------------------------------------------------------ */

static double done_at[3];
static int done_order[3], ndone;

static void on_b(uvccl_work_t *w, int status) {
  int k = (int)(intptr_t)w->data;
  (void)status;
  done_at[k] = now_ms();
  if (ndone < 3) done_order[ndone++] = k;
}

static void on_later(uv_timer_t *t) {
  world_t *W = t->data;
  static int32_t out[16];
  static uvccl_work_t ws;
  int i;
  for (i = 0; i < 16; i++) out[i] = 1000 + i;
  memset(&ws, 0, sizeof(ws));
  uvccl_send(&W->pg[1], &ws, out, sizeof(out), 0, 7, NULL);
}

static void scenario_timeouts(void) {
  world_t W;
  uvccl_work_t w[3];
  int32_t in[3][16];
  static const uint64_t tmo[3] = {900, 300, 0};
  uv_timer_t later;
  group_t *g0;
  double t0;
  int k, i, bad = 0;
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 2, NULL), 0, "b: a world of 2")) return;
  g0 = W.pg[0].impl_;
  memset(w, 0, sizeof(w));
  memset(in, 0, sizeof(in));
  t0 = now_ms();
  for (k = 0; k < 3; k++) {
    w[k].data = (void *)(intptr_t)k;
    w[k].timeout_ms = tmo[k];
    if (uvccl_recv(&W.pg[0], &w[k], in[k], sizeof(in[k]), 1, 7, on_b) != 0)
      bad++;
  }
  ok(bad == 0 && uv_is_active((uv_handle_t *)&g0->net->deadline),
     "b: three receives started; the group's timer is set");
  uv_timer_init(&L, &later);
  later.data = &W;
  uv_timer_start(&later, on_later, 1500, 0);
  while (!(uvccl_work_done(&w[0]) && uvccl_work_done(&w[1]) &&
           uvccl_work_done(&w[2])) &&
         now_ms() - t0 < 10000)
    uv_run(&L, UV_RUN_ONCE);
  ok(w[1].status == UV_ETIMEDOUT && done_at[1] - t0 >= 299 &&
         done_at[1] - t0 < 5000,
     "b: the 300 ms receive timed out after %.0f ms: %s", done_at[1] - t0,
     w[1].msg);
  ok(w[0].status == UV_ETIMEDOUT && done_at[0] - t0 >= 899 &&
         done_at[0] - t0 < 5000,
     "b: the 900 ms receive timed out after %.0f ms: %s", done_at[0] - t0,
     w[0].msg);
  for (i = 0; i < 16; i++)
    if (in[2][i] != 1000 + i) bad++;
  ok(w[2].status == 0 && bad == 0 && done_at[2] - t0 >= 1499,
     "b: the receive with the group's timeout got rank 1's send after %.0f "
     "ms, exact (%s)", done_at[2] - t0, w[2].msg);
  ok(ndone == 3 && done_order[0] == 1 && done_order[1] == 0 &&
         done_order[2] == 2,
     "b: in that order (%d %d %d)", done_order[0], done_order[1],
     done_order[2]);
  for (k = 0; k < 50 && (g0->net->inflight > 0 ||
                         (uv_is_active((uv_handle_t *)&g0->net->deadline) &&
                          uv_has_ref((uv_handle_t *)&g0->net->deadline)));
       k++)
    uv_run(&L, UV_RUN_NOWAIT);
  /* it may stay set for the next collective, but keeps nothing alive */
  ok(g0->net->inflight == 0 &&
         (!uv_is_active((uv_handle_t *)&g0->net->deadline) ||
          !uv_has_ref((uv_handle_t *)&g0->net->deadline)),
     "b: nothing pending: the group's timer is off or unreferenced");
  /* A receive with a long timeout leaves the timer set far ahead once it
   * completes; one started after it with a short timeout still times out
   * on time (the timer is moved earlier and referenced again). */
  {
    uvccl_work_t lw, sw, snd;
    int32_t out[16], got[16];
    double t1;
    memset(&lw, 0, sizeof(lw));
    memset(&sw, 0, sizeof(sw));
    memset(&snd, 0, sizeof(snd));
    memset(out, 0, sizeof(out));
    lw.timeout_ms = 60000;
    sw.timeout_ms = 200;
    bad = uvccl_recv(&W.pg[0], &lw, got, sizeof(got), 1, 8, NULL) != 0;
    bad += uvccl_send(&W.pg[1], &snd, out, sizeof(out), 0, 8, NULL) != 0;
    if (!bad) {
      uvccl_work_wait(&lw);
      uvccl_work_wait(&snd);
    }
    t1 = now_ms();
    bad += uvccl_recv(&W.pg[0], &sw, got, sizeof(got), 1, 9, NULL) != 0;
    if (!bad) uvccl_work_wait(&sw);
    ok(!bad && lw.status == 0 && sw.status == UV_ETIMEDOUT &&
           now_ms() - t1 >= 199 && now_ms() - t1 < 5000,
       "b: after a 60 s receive completed, a 200 ms one times out after "
       "%.0f ms: %s", now_ms() - t1, sw.msg);
  }
  uv_close((uv_handle_t *)&later, NULL);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "b: the loop closes cleanly");
}

/* ---- c ------------------------------------------------------------------ */

static unsigned turns;
static void on_turn(uv_prepare_t *h) {
  (void)h;
  turns++;
}

static void scenario_fast_wait(void) {
  enum { N = 320 };
  world_t W;
  uv_prepare_t counter;
  int it, bad = 0, fast_ok;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 2, NULL), 0, "c: a world of 2")) return;
  uvccl_pg_set_busy_poll(&W.pg[0], 50);
  uvccl_pg_set_busy_poll(&W.pg[1], 50);
  uv_prepare_init(&L, &counter);
  uv_prepare_start(&counter, on_turn);
  uv_unref((uv_handle_t *)&counter);
  for (it = 0; it < N; it++) {
    int32_t a[2][4];
    uvccl_work_t w[2];
    int r, i;
    memset(w, 0, sizeof(w));
    for (r = 0; r < 2; r++) {
      for (i = 0; i < 4; i++) a[r][i] = it + r * 10 + i;
      if (uvccl_allreduce(&W.pg[r], &w[r], a[r], a[r], 4, UVCCL_INT32,
                          UVCCL_SUM, NULL) != 0)
        bad++;
    }
    for (r = 0; r < 2; r++)
      if (uvccl_work_wait(&w[r]) != 0) bad++;
    for (r = 0; r < 2; r++)
      for (i = 0; i < 4; i++)
        if (a[r][i] != 2 * (it + i) + 10) bad++;
  }
  ok(bad == 0, "c: %d small allreduces on both ranks, waited for, exact", N);
  /* The fast path needs a core for each rank (else it yields to the loop). */
  fast_ok = turns < 2 * N / 2;
  if (ncpu >= 2)
    ok(fast_ok, "c: %u loop turns for %d waits (most waits need none)",
       turns, 2 * N);
  else
    skip(1, "c: one CPU: busy polling gives way, waits turn the loop");
  uv_close((uv_handle_t *)&counter, NULL);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "c: the loop closes cleanly");
}

int main(void) {
  tap_alarm(120);
  unsetenv("UVCCL_TRANSPORT");
  scenario_inline();
  scenario_timeouts();
  scenario_fast_wait();
  return done_testing();
}
