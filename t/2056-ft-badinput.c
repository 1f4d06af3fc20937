/* Bad input from inside a world stays harmless (in one process, three
 * ranks on one loop, t/world.h; the bytes are written straight into the
 * ranks' established connections, as a buggy or hostile peer would):
 *   a) a frame for a group nobody has is held (bounded), fails nothing,
 *      and the collectives go on, results right;
 *   b) garbage from rank 0 on its connection to rank 1: rank 1 disconnects
 *      it with a logged reason and declares it failed (a protocol error),
 *      so the groups that contain both fail with that cause, while a
 *      subgroup of ranks 1 and 2 (without rank 0) goes on, results right. */
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "logcap.h"
#include "loop_helpers.h"
#include "cpu/internal.h"

#include <string.h>
#include <unistd.h>

static uv_loop_t L;

/* Writes raw bytes into rank `from`'s connection to rank `to`. */
static int inject(world_t *W, int from, int to, const void *p, size_t n) {
  group_t *g = W->pg[from].impl_;
  peer_t *peer = g->net->peers[to];
  uv_os_fd_t fd;
  if (peer == NULL || uv_fileno((uv_handle_t *)&peer->tcp, &fd) != 0)
    return -1;
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* allreduce of int32 (rank+1) on pg[r] for r in mask; 1 if all right. */
static int allreduce_ok(uvccl_pg_t *pgs, unsigned mask, int want) {
  uvccl_work_t w[3];
  int32_t v[3][16];
  int r, i, good = 1;
  memset(w, 0, sizeof(w));
  for (r = 0; r < 3; r++) {
    if (!(mask & (1u << r))) continue;
    for (i = 0; i < 16; i++) v[r][i] = uvccl_pg_global_rank(&pgs[r], pgs[r].rank) + 1;
    if (uvccl_allreduce(&pgs[r], &w[r], v[r], v[r], 16, UVCCL_INT32, UVCCL_SUM,
                        NULL) != 0)
      good = 0;
  }
  for (r = 0; r < 3; r++) {
    if (!(mask & (1u << r))) continue;
    if (uvccl_work_wait(&w[r]) != 0) {
      diag("rank %d: %s", r, w[r].msg);
      good = 0;
      continue;
    }
    for (i = 0; i < 16; i++) good &= v[r][i] == want;
  }
  return good;
}

int main(void) {
  world_t W;
  uvccl_pg_t sub[3];
  int ranks12[2] = {1, 2}, r, rc;
  unsigned char frame[24 + 16];
  tap_alarm(60);
  uv_loop_init(&L);
  is_int(world_init(&W, &L, 3, NULL), 0, "a world of 3 in this process");
  for (r = 0; r < 3; r++) {
    rc = uvccl_pg_new_group(&W.pg[r], &sub[r], ranks12, 2, NULL);
    if (r == 0) ok(rc == UVCCL_ENOTMEMBER, "rank 0 is not in {1, 2}");
  }
  ok(allreduce_ok(W.pg, 7, 6), "allreduce of the world right");

  /* a) a COLL frame for group 0xdeadbeef, 16 bytes */
  memset(frame, 0, sizeof(frame));
  frame[0] = 3; /* FRAME_COLL */
  frame[4] = 0xef;
  frame[5] = 0xbe;
  frame[6] = 0xad;
  frame[7] = 0xde;
  frame[16] = 16;
  memset(frame + 24, 0x5a, 16);
  ok(inject(&W, 2, 1, frame, sizeof(frame)) == 0,
     "a: rank 2 sends rank 1 a frame for a group nobody has");
  ok(allreduce_ok(W.pg, 7, 6), "a: the world's allreduce is still right");
  ok(allreduce_ok(sub, 6, 5), "a: so is the subgroup's");

  /* b) garbage from rank 0 to rank 1 */
  {
    unsigned char junk[64];
    uvccl_pg_failure_t f;
    uvccl_work_t w = {0};
    int32_t v = 1;
    memset(junk, 0xab, sizeof(junk));
    logcap_start();
    ok(inject(&W, 0, 1, junk, sizeof(junk)) == 0,
       "b: rank 0 writes garbage to rank 1");
    loop_run_for(&L, 300);
    logcap_stop();
    ok(strstr(logbuf, "rank 0") != NULL &&
           strstr(logbuf, "bad frame") != NULL,
       "b: rank 1 logs why it drops rank 0: %.160s", logbuf);
    rc = uvccl_pg_get_failure(&W.pg[1], &f);
    ok(rc == 1 && f.global_rank == 0 && f.cause == UVCCL_FAIL_PROTOCOL,
       "b: rank 1's world group failed: rank %d, cause %s: %s", f.global_rank,
       uvccl_fail_cause_name(f.cause), f.msg);
    rc = uvccl_allreduce(&W.pg[1], &w, &v, &v, 1, UVCCL_INT32, UVCCL_SUM,
                         NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    ok(rc == UVCCL_EPEER && strstr(w.msg, "rank 0 (global 0") != NULL,
       "b: a later world op on rank 1 fails naming rank 0: %s", w.msg);
    ok(uvccl_pg_get_failure(&sub[1], &f) == 0 &&
           uvccl_pg_get_failure(&sub[2], &f) == 0,
       "b: the subgroup {1, 2} did not fail");
    ok(allreduce_ok(sub, 6, 5), "b: ... and its allreduce is right");
  }
  uvccl_pg_destroy(&sub[1], NULL);
  uvccl_pg_destroy(&sub[2], NULL);
  world_destroy(&W);
  uv_run(&L, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&L), 0, "nothing left on the loop");
  return done_testing();
}
