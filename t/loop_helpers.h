/* Running a test's loop for a while, and until a store has closed: the
 * small loop chores the store tests share. Header-only, like tap.h. */
#ifndef UVCCL_T_LOOP_HELPERS_H
#define UVCCL_T_LOOP_HELPERS_H

#include "uvccl.h"

static inline void loop_helpers_fired_(uv_timer_t *t) {
  *(int *)t->data = 1;
}
static inline void loop_helpers_noop_close_(uv_handle_t *h) { (void)h; }

/* Runs loop for ms; the works on it progress meanwhile. */
static inline void loop_run_for(uv_loop_t *loop, int ms) {
  uv_timer_t t;
  int fired = 0;
  uv_timer_init(loop, &t);
  t.data = &fired;
  uv_timer_start(&t, loop_helpers_fired_, (uint64_t)ms, 0);
  while (!fired) uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, loop_helpers_noop_close_);
  uv_run(loop, UV_RUN_NOWAIT);
}

static int loop_helpers_closed_;
static inline void loop_helpers_store_closed_(uvccl_store_t *s) {
  (void)s;
  loop_helpers_closed_++;
}

/* Closes the store and runs loop until its close callback has run. */
static inline void store_close_wait(uv_loop_t *loop, uvccl_store_t *s) {
  int before = loop_helpers_closed_;
  uvccl_store_close(s, loop_helpers_store_closed_);
  while (loop_helpers_closed_ == before) uv_run(loop, UV_RUN_ONCE);
}

#endif
