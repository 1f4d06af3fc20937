/* Helpers for tests whose ranks are groups on one loop of this process
 * (t/2054, t/2007, t/2008): the loop L, running it for a while, waiting
 * for works, destroying groups. Header-only; include after tap.h, uvccl.h
 * and ranks.h. */
#ifndef UVCCL_T_INPROC_H
#define UVCCL_T_INPROC_H

static uv_loop_t L;

/* Runs L for about ms. */
static inline void run_ms(int ms) {
  double t0 = now_s();
  while ((now_s() - t0) * 1000 < ms) {
    uv_run(&L, UV_RUN_NOWAIT);
    sleep_ms(1);
  }
}

static int closed_count;
static inline void on_closed(uvccl_pg_t *p) {
  (void)p;
  closed_count++;
}

/* Destroys whatever pgs have a group, and waits for them. */
static inline int destroy_all(uvccl_pg_t *pgs, int n) {
  int i, want = 0;
  double t0 = now_s();
  closed_count = 0;
  for (i = 0; i < n; i++)
    if (pgs[i].impl_ != NULL) {
      uvccl_pg_destroy(&pgs[i], on_closed);
      want++;
    }
  while (closed_count < want && now_s() - t0 < 10) uv_run(&L, UV_RUN_ONCE);
  return closed_count == want;
}

static inline void store_closed(uvccl_store_t *s) { (void)s; }

/* Runs L until none of the n works is pending, or ms pass. */
static inline int wait_all(uvccl_work_t *w, int n, int ms) {
  double t0 = now_s();
  int i, done;
  do {
    uv_run(&L, UV_RUN_NOWAIT);
    for (done = 1, i = 0; i < n; i++)
      if (w[i].state == UVCCL_WORK_PENDING) done = 0;
    if (!done) sleep_ms(1);
  } while (!done && (now_s() - t0) * 1000 < ms);
  return done;
}

#endif
