/* Every callback uvccl runs on the loop is a turn with a budget
 * (src/loop/turn.c): it moves about turn_bytes and returns, and the loop
 * comes back for the rest. In-process worlds (t/world.h), loop statistics
 * on (uvccl_pg_loop_stats), the clock's limit off (turn_us UINT32_MAX) so
 * that only bytes decide:
 *   a) allreduce, broadcast, allgather and reduce_scatter of 8 MiB, over
 *      shared memory and over TCP, 2 and 3 ranks, turn_bytes 128 KiB:
 *      exact, and no callback moved more than the budget and a step
 *      (BOUND); the work took many callbacks;
 *   b) a large frame that arrives before its receive (staged): handed over
 *      in slices, exact, within the bound, whether the receive is posted
 *      once it is all here or while it is still arriving;
 *   c) a receive cancelled while its staged bytes are handed over: the
 *      next message of that peer still arrives whole and exact;
 *   d) the clock: turn_bytes 1 GiB, turn_us 100: a 64 MiB allreduce over
 *      TCP is still cut into many callbacks (memory faster than 300 GB/s
 *      would be needed to move it in one);
 *   e) bad values of the variables are named in the log, the defaults
 *      hold, and the work is exact;
 *   f) byte payloads (broadcast_bytes, allgather_bytes, gather_bytes,
 *      scatter_bytes) of 4-8 MiB, 3 ranks: exact, within the bound (a
 *      rank's own payload is copied into its result in slices). */
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "logcap.h"

#include <stdlib.h>
#include <string.h>

#define BUDGET (128u * 1024)
/* a turn may pass its budget by a step or two (each peer's ring and
 * queue advance by one a turn; see turn.c) */
#define BOUND (BUDGET + 512u * 1024)
#define N8 ((size_t)2 << 20) /* 8 MiB of float32 */

static uv_loop_t L;

static void opts(uvccl_pg_options_t *o, size_t bytes, uint32_t us) {
  memset(o, 0, sizeof(*o));
  o->turn_bytes = bytes;
  o->turn_us = us;
  o->loop_stats = 1;
}

/* The largest max_bytes over the world's ranks, and the callbacks. */
static void stats(world_t *W, uint64_t *max_bytes, uint64_t *callbacks,
                  int reset) {
  int i;
  *max_bytes = *callbacks = 0;
  for (i = 0; i < W->n; i++) {
    uvccl_loop_stats_t st;
    if (uvccl_pg_loop_stats(&W->pg[i], &st, reset) != 0) continue;
    if (st.max_bytes > *max_bytes) *max_bytes = st.max_bytes;
    *callbacks += st.callbacks;
  }
}

/* ---- a ------------------------------------------------------------------ */

enum { ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER, NKINDS };
static const char *const kind_names[NKINDS] = {"allreduce", "broadcast",
                                               "allgather", "reduce_scatter"};

/* Runs kind on every rank of W over n floats (nccl-tests' sizes) and
 * checks every element. */
static int run_kind(world_t *W, int kind, size_t n) {
  int P = W->n, r, bad = 0;
  float *in[WORLD_MAX], *out[WORLD_MAX];
  size_t k, per = n / (size_t)P;
  for (r = 0; r < P; r++) {
    in[r] = malloc(n * sizeof(float));
    out[r] = malloc(n * sizeof(float));
    for (k = 0; k < n; k++) {
      in[r][k] = (float)((r + 1) * ((k % 13) + 1));
      out[r][k] = -1.0f;
    }
  }
  for (r = 0; r < P; r++) {
    int rc;
    switch (kind) {
    case ALLREDUCE:
      rc = uvccl_allreduce(&W->pg[r], &W->w[r], in[r], out[r], n,
                           UVCCL_FLOAT32, UVCCL_SUM, NULL);
      break;
    case BROADCAST:
      rc = uvccl_broadcast(&W->pg[r], &W->w[r], in[r], n, UVCCL_FLOAT32, 0,
                           NULL);
      break;
    case ALLGATHER:
      rc = uvccl_allgather(&W->pg[r], &W->w[r], in[r], out[r], per,
                           UVCCL_FLOAT32, NULL);
      break;
    default:
      rc = uvccl_reduce_scatter(&W->pg[r], &W->w[r], in[r], out[r], per,
                                UVCCL_FLOAT32, UVCCL_SUM, NULL);
      break;
    }
    if (rc != 0) return rc;
  }
  if (world_wait(W) != 0) return W->w[0].status ? W->w[0].status : -1;
  for (r = 0; r < P; r++) {
    float sum = (float)(P * (P + 1) / 2);
    switch (kind) {
    case ALLREDUCE:
      for (k = 0; k < n; k++)
        if (out[r][k] != sum * (float)((k % 13) + 1)) bad++;
      break;
    case BROADCAST:
      for (k = 0; k < n; k++)
        if (in[r][k] != (float)((k % 13) + 1)) bad++;
      break;
    case ALLGATHER:
      for (k = 0; k < per * (size_t)P; k++)
        if (out[r][k] != (float)((k / per + 1) * ((k % per % 13) + 1))) bad++;
      break;
    default:
      for (k = 0; k < per; k++)
        if (out[r][k] != sum * (float)(((size_t)r * per + k) % 13 + 1)) bad++;
      break;
    }
    free(in[r]);
    free(out[r]);
  }
  return bad ? 1 : 0;
}

static void scenario_kinds(const char *transport, int P) {
  world_t W;
  uvccl_pg_options_t o;
  int kind;
  if (strcmp(transport, "tcp") == 0) setenv("UVCCL_TRANSPORT", "tcp", 1);
  else unsetenv("UVCCL_TRANSPORT");
  opts(&o, BUDGET, UINT32_MAX);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, P, &o), 0, "a: a world of %d over %s", P,
              transport))
    return;
  ok(strcmp(uvccl_pg_peer_transport(&W.pg[0], 1), transport) == 0,
     "a: ranks 0 and 1 talk over %s (%s)", transport,
     uvccl_pg_peer_transport(&W.pg[0], 1));
  for (kind = 0; kind < NKINDS; kind++) {
    uint64_t max_bytes, cbs;
    int rc;
    stats(&W, &max_bytes, &cbs, 1);
    rc = run_kind(&W, kind, N8);
    stats(&W, &max_bytes, &cbs, 1);
    ok(rc == 0, "a: %s, %s, %d ranks, 8 MiB: exact (%d)", kind_names[kind],
       transport, P, rc);
    ok(max_bytes > 0 && max_bytes <= BOUND && cbs >= 8 * 1024 * 1024 / BOUND,
       "a: %s: at most %llu bytes a callback (budget %u; bound %u), %llu "
       "callbacks", kind_names[kind], (unsigned long long)max_bytes, BUDGET,
       BOUND, (unsigned long long)cbs);
  }
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "a: the loop closes cleanly");
  unsetenv("UVCCL_TRANSPORT");
}

/* ---- b, c ------------------------------------------------------------------- */

#define BIG ((size_t)16 << 20)

static void fill(unsigned char *b, size_t n, unsigned seed) {
  size_t k;
  for (k = 0; k < n; k++) b[k] = (unsigned char)(k * 31 + seed + k / 4099);
}

static size_t wrong(const unsigned char *b, size_t n, unsigned seed) {
  size_t k, bad = 0;
  for (k = 0; k < n; k++)
    if (b[k] != (unsigned char)(k * 31 + seed + k / 4099)) bad++;
  return bad;
}

/* Rank 0 sends BIG bytes to rank 1; after `turns` loop iterations (-1:
 * once the send completed and the loop is idle) rank 1 posts its receive;
 * cancel: it cancels it at once, and a second message must arrive whole. */
static void scenario_staged(const char *transport, int turns, int cancel) {
  world_t W;
  uvccl_pg_options_t o;
  uvccl_work_t sw = {0}, rw = {0}, sw2 = {0}, rw2 = {0};
  unsigned char *out = malloc(BIG), *in = malloc(BIG);
  uint64_t max_bytes, cbs;
  const char *when = turns < 0 ? "all here" : "still arriving";
  int i, rc;
  if (strcmp(transport, "tcp") == 0) setenv("UVCCL_TRANSPORT", "tcp", 1);
  else unsetenv("UVCCL_TRANSPORT");
  opts(&o, BUDGET, UINT32_MAX);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 2, &o), 0, "b: a world of 2 over %s",
              transport))
    return;
  fill(out, BIG, 7);
  memset(in, 0, BIG);
  stats(&W, &max_bytes, &cbs, 1);
  rc = uvccl_send(&W.pg[0], &sw, out, BIG, 1, 5, NULL);
  if (turns < 0) {
    while (rc == 0 && !uvccl_work_done(&sw)) uv_run(&L, UV_RUN_ONCE);
    for (i = 0; i < 50; i++) uv_run(&L, UV_RUN_NOWAIT);
  } else {
    for (i = 0; i < turns; i++) uv_run(&L, UV_RUN_NOWAIT);
  }
  rc = rc ? rc : uvccl_recv(&W.pg[1], &rw, in, BIG, 0, 5, NULL);
  if (cancel) {
    uvccl_work_cancel(&rw);
    while (!uvccl_work_done(&rw) || !uvccl_work_done(&sw))
      uv_run(&L, UV_RUN_ONCE);
    is_int(rw.status, UV_ECANCELED, "c: %s, %s: the receive is cancelled",
           transport, when);
    fill(out, BIG, 9);
    memset(in, 0, BIG);
    rc = uvccl_send(&W.pg[0], &sw2, out, BIG, 1, 5, NULL);
    rc = rc ? rc : uvccl_recv(&W.pg[1], &rw2, in, BIG, 0, 5, NULL);
    while (rc == 0 && (!uvccl_work_done(&rw2) || !uvccl_work_done(&sw2)))
      uv_run(&L, UV_RUN_ONCE);
    ok(rc == 0 && sw2.status == 0 && rw2.status == 0 &&
           rw2.value_len == BIG && wrong(in, BIG, 9) == 0,
       "c: %s, %s: the next message arrives whole and exact (%s %s, %zu "
       "bytes, %zu wrong)", transport, when, uvccl_err_name(sw2.status),
       uvccl_err_name(rw2.status), rw2.value_len, wrong(in, BIG, 9));
  } else {
    while (rc == 0 && (!uvccl_work_done(&rw) || !uvccl_work_done(&sw)))
      uv_run(&L, UV_RUN_ONCE);
    stats(&W, &max_bytes, &cbs, 0);
    ok(rc == 0 && sw.status == 0 && rw.status == 0 && rw.value_len == BIG &&
           wrong(in, BIG, 7) == 0,
       "b: %s, posted with the frame %s: 16 MiB exact (%s %s, %zu bytes)",
       transport, when, uvccl_err_name(sw.status), uvccl_err_name(rw.status),
       rw.value_len);
    ok(max_bytes <= BOUND && cbs >= BIG / BOUND,
       "b: %s, %s: at most %llu bytes a callback (bound %u), %llu callbacks",
       transport, when, (unsigned long long)max_bytes, BOUND,
       (unsigned long long)cbs);
  }
  uvccl_work_cleanup(&rw);
  uvccl_work_cleanup(&rw2);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "b: the loop closes cleanly");
  free(out);
  free(in);
  unsetenv("UVCCL_TRANSPORT");
}

/* ---- d ------------------------------------------------------------------- */

static void scenario_clock(void) {
  world_t W;
  uvccl_pg_options_t o;
  uint64_t max_bytes, cbs;
  size_t n = (size_t)16 << 20; /* 64 MiB of float32 */
  int rc;
  setenv("UVCCL_TRANSPORT", "tcp", 1);
  opts(&o, (size_t)1 << 30, 100);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 2, &o), 0, "d: a world of 2 over tcp"))
    return;
  stats(&W, &max_bytes, &cbs, 1);
  rc = run_kind(&W, ALLREDUCE, n);
  stats(&W, &max_bytes, &cbs, 1);
  ok(rc == 0, "d: allreduce of 64 MiB: exact");
  ok(max_bytes < (uint64_t)32 << 20,
     "d: turn_bytes 1 GiB, turn_us 100: at most %llu bytes a callback, %llu "
     "callbacks", (unsigned long long)max_bytes, (unsigned long long)cbs);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "d: the loop closes cleanly");
  unsetenv("UVCCL_TRANSPORT");
}

/* ---- e ------------------------------------------------------------------- */

static void scenario_bad_env(void) {
  world_t W;
  uvccl_pg_options_t o;
  uint64_t max_bytes, cbs;
  int rc;
  memset(&o, 0, sizeof(o));
  o.loop_stats = 1;
  setenv("UVCCL_TURN_BYTES", "12x", 1);
  setenv("UVCCL_TURN_US", "-5", 1);
  logcap_start();
  uv_loop_init(&L);
  rc = world_init(&W, &L, 2, &o);
  logcap_stop();
  unsetenv("UVCCL_TURN_BYTES");
  unsetenv("UVCCL_TURN_US");
  if (!is_int(rc, 0, "e: a world of 2 with malformed UVCCL_TURN_*")) return;
  ok(strstr(logbuf, "UVCCL_TURN_BYTES=12x") != NULL &&
         strstr(logbuf, "UVCCL_TURN_US=-5") != NULL,
     "e: both variables are named in the log");
  stats(&W, &max_bytes, &cbs, 1);
  rc = run_kind(&W, ALLREDUCE, N8);
  stats(&W, &max_bytes, &cbs, 1);
  ok(rc == 0 && max_bytes <= UVCCL_TURN_BYTES_DEFAULT + 512u * 1024,
     "e: the defaults hold: exact, at most %llu bytes a callback",
     (unsigned long long)max_bytes);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "e: the loop closes cleanly");
}

/* ---- f ------------------------------------------------------------------- */

#define PAY ((size_t)4 << 20)

static void scenario_bytes(void) {
  world_t W;
  uvccl_pg_options_t o;
  uint64_t max_bytes, cbs;
  unsigned char *pay[3];
  uvccl_buf_t bufs[3];
  size_t len[3];
  int r, q, bad = 0, k;
  static const char *const names[4] = {"broadcast_bytes", "allgather_bytes",
                                       "gather_bytes", "scatter_bytes"};
  opts(&o, BUDGET, UINT32_MAX);
  uv_loop_init(&L);
  if (!is_int(world_init(&W, &L, 3, &o), 0, "f: a world of 3")) return;
  for (r = 0; r < 3; r++) {
    len[r] = PAY + (size_t)r * 1000003; /* lengths differ */
    pay[r] = malloc(len[r]);
    fill(pay[r], len[r], (unsigned)r + 1);
    bufs[r].base = pay[r];
    bufs[r].len = len[r];
  }
  for (k = 0; k < 4; k++) {
    int rc = 0;
    bad = 0;
    stats(&W, &max_bytes, &cbs, 1);
    for (r = 0; r < 3 && rc == 0; r++) {
      switch (k) {
      case 0:
        rc = uvccl_broadcast_bytes(&W.pg[r], &W.w[r], r == 1 ? pay[1] : NULL,
                                   r == 1 ? len[1] : 0, 1, NULL);
        break;
      case 1:
        rc = uvccl_allgather_bytes(&W.pg[r], &W.w[r], pay[r], len[r], NULL);
        break;
      case 2:
        rc = uvccl_gather_bytes(&W.pg[r], &W.w[r], pay[r], len[r], 2, NULL);
        break;
      default:
        rc = uvccl_scatter_bytes(&W.pg[r], &W.w[r], r == 0 ? bufs : NULL,
                                 r == 0 ? 3 : 0, 0, NULL);
        break;
      }
    }
    if (rc == 0) rc = world_wait(&W);
    for (r = 0; r < 3 && rc == 0; r++) {
      uvccl_work_t *w = &W.w[r];
      switch (k) {
      case 0:
        if (w->value_len != len[1] || wrong(w->value, len[1], 2)) bad++;
        break;
      case 1:
        for (q = 0; q < 3; q++)
          if (w->nvalues != 3 || w->values[q].len != len[q] ||
              wrong(w->values[q].base, len[q], (unsigned)q + 1))
            bad++;
        break;
      case 2:
        if (r == 2)
          for (q = 0; q < 3; q++)
            if (w->nvalues != 3 || w->values[q].len != len[q] ||
                wrong(w->values[q].base, len[q], (unsigned)q + 1))
              bad++;
        break;
      default:
        /* rank r gets the root's buffer r, that is pay[r] */
        if (w->value_len != len[r] || wrong(w->value, len[r], (unsigned)r + 1))
          bad++;
        break;
      }
      uvccl_work_cleanup(w);
    }
    stats(&W, &max_bytes, &cbs, 1);
    ok(rc == 0 && bad == 0, "f: %s of 4-8 MiB: exact (%s, %d wrong)",
       names[k], uvccl_err_name(rc), bad);
    ok(max_bytes <= BOUND, "f: %s: at most %llu bytes a callback (bound %u)",
       names[k], (unsigned long long)max_bytes, BOUND);
  }
  for (r = 0; r < 3; r++) free(pay[r]);
  world_destroy(&W);
  is_int(uv_loop_close(&L), 0, "f: the loop closes cleanly");
}

int main(void) {
  static const char *const transports[2] = {"shm", "tcp"};
  int t;
  tap_alarm(600);
  for (t = 0; t < 2; t++) {
    scenario_kinds(transports[t], 2);
    scenario_kinds(transports[t], 3);
  }
  for (t = 0; t < 2; t++) {
    scenario_staged(transports[t], -1, 0);
    scenario_staged(transports[t], 3, 0);
    scenario_staged(transports[t], -1, 1);
    scenario_staged(transports[t], 3, 1);
  }
  scenario_clock();
  scenario_bad_env();
  scenario_bytes();
  return done_testing();
}
