/* Bad bytes in a shared-memory ring stay harmless (one process, a world of
 * 2 ranks on one loop, t/world.h; the test writes into rank 0's inbox as a
 * buggy or hostile peer would):
 *   a) an impossible index (a tail far past the head) and
 *   b) 24 bytes that are no frame, published as one,
 * each fail rank 0's pending allreduce with a clear error naming rank 1 and
 * the ring, never a crash, a hang or a copy out of bounds; the world is
 * destroyed cleanly afterwards and the loop closes with nothing left. */
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "coll/internal.h"

#include <string.h>

static uv_loop_t L;

static void on_noop(uv_timer_t *t) { (void)t; }

/* Rank 0 starts an allreduce of 64 int32 and waits for rank 1's frame in
 * the ring the test spoiled. Returns its status, its message in msg. */
static int spoiled_allreduce(world_t *W, void (*spoil)(peer_t *p),
                             char *msg, size_t len) {
  group_t *g0 = W->pg[0].impl_;
  peer_t *p = g0->net->peers[1];
  int32_t v[1][64];
  int i, rc;
  uv_timer_t guard_t;
  for (i = 0; i < 64; i++) v[0][i] = 1;
  if (p == NULL || !p->shm_rx) {
    snprintf(msg, len, "rank 0 does not read rank 1 through shared memory");
    return 1;
  }
  /* Only rank 0 starts: rank 1 never writes to its ring, so what the test
   * put there is all rank 0 finds. */
  memset(&W->w[0], 0, sizeof(W->w[0]));
  rc = uvccl_allreduce(&W->pg[0], &W->w[0], v[0], v[0], 64, UVCCL_INT32,
                       UVCCL_SUM, NULL);
  if (rc != 0) {
    snprintf(msg, len, "the call failed: %s", uvccl_strerror(rc));
    return 1;
  }
  spoil(p);
  uvccl__shm_kick(p); /* its dirty bit, as a producer sets it */
  uv_timer_init(&L, &guard_t);
  uv_timer_start(&guard_t, on_noop, 10000, 0);
  while (!uvccl_work_done(&W->w[0]) && uv_run(&L, UV_RUN_ONCE) >= 0 &&
         uv_is_active((uv_handle_t *)&guard_t)) {
  }
  uv_close((uv_handle_t *)&guard_t, NULL);
  rc = uvccl_work_done(&W->w[0]) ? W->w[0].status : UV_ETIMEDOUT;
  snprintf(msg, len, "%s", W->w[0].msg);
  return rc;
}

static void spoil_index(peer_t *p) {
  /* a tail far past the head: "this many bytes are readable" is a lie */
  atomic_store(&p->shm_in.ring->tail, p->shm_in.head + ((uint64_t)1 << 40));
}

static void spoil_frame(peer_t *p) {
  /* 24 bytes that are no frame, published as if they were one */
  uvccl__shm_in_t *in = &p->shm_in;
  unsigned char junk[UVCCL__FRAME_HDR];
  uint64_t off = in->head % in->size;
  memset(junk, 0xee, sizeof(junk));
  memcpy((char *)in->data + off, junk, sizeof(junk));
  atomic_store(&in->ring->tail, in->head + sizeof(junk));
}

static void scenario_hostile(void) {
  world_t W;
  char msg[UVCCL_WORK_MSG_LEN];
  int rc, k;
  static void (*const spoilers[2])(peer_t *) = {spoil_index, spoil_frame};
  static const char *const names[2] = {"an impossible ring index",
                                       "a ring holding no frame"};
  uv_loop_init(&L);
  for (k = 0; k < 2; k++) {
    rc = world_init(&W, &L, 2, NULL);
    if (!is_int(rc, 0, "a world of 2 in one process")) return;
    rc = spoiled_allreduce(&W, spoilers[k], msg, sizeof(msg));
    ok(rc != 0 && rc != UV_ETIMEDOUT && strstr(msg, "rank 1") != NULL &&
           strstr(msg, "shared-memory") != NULL,
       "%s: rank 0's allreduce fails naming rank 1: %s (%s)", names[k],
       rc ? uvccl_strerror(rc) : "no error", msg);
    world_destroy(&W);
  }
  is_int(uv_loop_close(&L), 0, "the loop closes cleanly (nothing leaked)");
}

int main(void) {
  tap_alarm(120);
  unsetenv("UVCCL_TRANSPORT");
  scenario_hostile();
  return done_testing();
}
