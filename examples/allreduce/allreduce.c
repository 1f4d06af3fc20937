/* A collective on your loop. Each rank of a world (from env://, as
 * torchrun, mpirun, srun or uvccl-run set it) sums a vector with the
 * others; the result arrives in a callback, and meanwhile the loop keeps
 * serving its other handles (here a 1 ms timer, counting its ticks).
 *
 *   cc allreduce.c $(pkg-config --cflags --libs uvccl) -o allreduce
 *   uvccl-run -n 4 ./allreduce
 */
#include <stdio.h>
#include <stdlib.h>

#include <uv.h>
#include <uvccl.h>

#define COUNT (4u << 20) /* floats: 16 MiB */

static uvccl_pg_t pg;
static uvccl_work_t create, sum; /* zeroed: idle works */
static uv_timer_t ticker;
static float *in, *out;
static int ticks, exit_status = 1;

static void on_tick(uv_timer_t *t) { ticks++; }

static void on_pg_closed(uvccl_pg_t *p) {
  uv_close((uv_handle_t *)&ticker, NULL); /* then uv_run returns */
}

static void on_sum(uvccl_work_t *w, int status) {
  /* every rank gave rank + 1: the sum is size * (size + 1) / 2 */
  float want = (float)pg.size * (float)(pg.size + 1) / 2;
  size_t i, wrong = 0;
  if (status != 0) {
    /* the message names the rank that failed first, and why */
    fprintf(stderr, "rank %d: allreduce: %s\n", pg.rank, w->msg);
  } else {
    for (i = 0; i < COUNT; i++) wrong += out[i] != want;
    printf("rank %d of %d: sum %g (want %g), %zu wrong; the loop ticked %d "
           "times meanwhile\n", pg.rank, pg.size, out[0], want, wrong, ticks);
    exit_status = wrong != 0;
  }
  uvccl_pg_destroy(&pg, on_pg_closed);
}

static void on_created(uvccl_work_t *w, int status) {
  size_t i;
  int rc;
  if (status != 0) {
    fprintf(stderr, "creating the group: %s\n", w->msg);
    uvccl_pg_destroy(&pg, on_pg_closed); /* a failed group is destroyed too */
    return;
  }
  for (i = 0; i < COUNT; i++) in[i] = (float)(pg.rank + 1);
  ticks = 0;
  rc = uvccl_allreduce(&pg, &sum, in, out, COUNT, UVCCL_FLOAT32, UVCCL_SUM,
                       on_sum);
  if (rc != 0) { /* refused at once: no callback will come */
    fprintf(stderr, "allreduce: %s\n", uvccl_strerror(rc));
    uvccl_pg_destroy(&pg, on_pg_closed);
  }
}

int main(void) {
  uv_loop_t *loop = uv_default_loop();
  int rc;
  in = malloc(COUNT * sizeof(float));
  out = malloc(COUNT * sizeof(float));
  if (in == NULL || out == NULL) return 1;
  uv_timer_init(loop, &ticker);
  uv_timer_start(&ticker, on_tick, 1, 1);
  rc = uvccl_pg_init_url(loop, &pg, "env://", NULL, &create, on_created);
  if (rc != 0) {
    fprintf(stderr, "uvccl_pg_init_url: %s\n", uvccl_strerror(rc));
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT); /* everything happens in callbacks */
  uv_loop_close(loop);
  free(in);
  free(out);
  return exit_status;
}
