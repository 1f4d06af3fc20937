/* A rank that finishes first and leaves cleanly takes nothing with it:
 * what it sent before leaving is still received by ranks that start their
 * part later, and only what it never sent fails ("left the group").
 * Three processes (env://): rank 0 roots a broadcast (64 KiB, then 16 B),
 * sends 100 B to rank 1 (tag 5) and destroys its group at once. Ranks 1
 * and 2 run their loops for a second (rank 0's goodbye is in by then),
 * then:
 *   - take their part of both broadcasts: every byte right;
 *   - rank 1 receives the 100 B from rank 0: right;
 *   - rank 1's receive of tag 6 (rank 0 never sent it) fails with
 *     UVCCL_EPEER naming rank 0 as gone, at once, not a hang;
 *   - a third broadcast from rank 0 (never sent) fails the same way;
 *   - an allreduce between ranks 1 and 2's subgroup still works.
 * (PyTorch's DDP runs ended like this: rank 0, root of the last
 * broadcast, destroyed its group before the others started theirs, and
 * they failed with "rank 0 is not connected".) */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char pattern(size_t i, int which) {
  return (unsigned char)((i * 7 + (size_t)which * 13) & 0xff);
}

static int bcast(unsigned char *buf, size_t n, uvccl_work_t *w, cbres_t *c) {
  memset(w, 0, sizeof(*w));
  memset(c, 0, sizeof(*c));
  w->data = c;
  return finish_work(c, uvccl_broadcast(&pg, w, buf, n, UVCCL_UINT8, 0,
                                        on_work), 10000);
}

static int rank_main(void) {
  static unsigned char big[65536], small[16], msg[100];
  uvccl_work_t w;
  cbres_t c;
  size_t i;
  int rc, bad = 0, never = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(90);
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  rank_init(20000);
  if (R == 0) {
    for (i = 0; i < sizeof(big); i++) big[i] = pattern(i, 1);
    for (i = 0; i < sizeof(small); i++) small[i] = pattern(i, 2);
    for (i = 0; i < sizeof(msg); i++) msg[i] = pattern(i, 3);
    rc = bcast(big, sizeof(big), &w, &c);
    rc |= bcast(small, sizeof(small), &w, &c);
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    rc |= finish_work(&c, uvccl_send(&pg, &w, msg, sizeof(msg), 1, 5,
                                     on_work), 10000);
    rep(rc == 0, "root", "two broadcasts and a send, then gone: %s",
        ename(rc));
    return rank_destroy();
  }
  run_until(&never, 1000); /* rank 0 leaves meanwhile */
  rc = bcast(big, sizeof(big), &w, &c);
  for (i = 0; i < sizeof(big); i++) bad += big[i] != pattern(i, 1);
  rc |= bcast(small, sizeof(small), &w, &c);
  for (i = 0; i < sizeof(small); i++) bad += small[i] != pattern(i, 2);
  rep(rc == 0 && bad == 0, "late_bcast", "broadcasts from rank 0, started "
      "after it left: %s, %d wrong bytes (%s)", ename(rc), bad, w.msg);
  if (R == 1) {
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    rc = finish_work(&c, uvccl_recv(&pg, &w, msg, sizeof(msg), 0, 5, on_work),
                     10000);
    for (bad = 0, i = 0; i < sizeof(msg); i++) bad += msg[i] != pattern(i, 3);
    rep(rc == 0 && bad == 0 && w.value_len == sizeof(msg), "late_recv",
        "recv of what rank 0 sent before leaving: %s, %zu B, %d wrong",
        ename(rc), (size_t)w.value_len, bad);
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    rc = finish_work(&c, uvccl_recv(&pg, &w, msg, sizeof(msg), 0, 6, on_work),
                     5000);
    rep(rc == UVCCL_EPEER && strstr(w.msg, "rank 0") != NULL, "never_sent",
        "recv of what rank 0 never sent: %s: %s", ename(rc), w.msg);
  } else {
    rep(1, "late_recv", "(rank 1's)");
    rep(1, "never_sent", "(rank 1's)");
  }
  rc = bcast(small, sizeof(small), &w, &c);
  rep(rc == UVCCL_EPEER && strstr(w.msg, "rank 0") != NULL, "never_bcast",
      "a broadcast rank 0 never rooted: %s: %s", ename(rc), w.msg);
  {
    int ranks[2] = {1, 2}, rc2;
    uvccl_pg_t sub;
    int32_t v = R, out = 0;
    memset(&sub, 0, sizeof(sub));
    rc2 = uvccl_pg_new_group(&pg, &sub, ranks, 2, NULL);
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    rc = rc2 ? rc2 : finish_work(&c, uvccl_allreduce(&sub, &w, &v, &out, 1,
                                                     UVCCL_INT32, UVCCL_SUM,
                                                     on_work), 10000);
    rep(rc == 0 && out == 3, "survivors", "allreduce of ranks 1 and 2: %s, "
        "sum %d (%s)", ename(rc), (int)out, w.msg);
    if (rc2 == 0) {
      pg_closed = 0;
      uvccl_pg_destroy(&sub, on_pg_closed);
      run_until(&pg_closed, 5000);
    }
  }
  return rank_destroy();
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  proc_t ps[3];
  int round;
  if (role != NULL && *role) return rank_main();
  parent_init(300);
  sigpipe_default();
  plan(3 * 7);
  for (round = 0; round < 3; round++) {
    spawn_world(ps, 3, "left", 0);
    finish_all(ps, 3, 60);
    scenario_failed = 0;
    agg(ps, 3, "root", 1, "round %d: rank 0 broadcast twice, sent, left",
        round);
    agg(ps, 3, "late_bcast", 6, "round %d: ranks 1, 2 got both broadcasts "
        "after rank 0 left", round);
    agg(ps, 3, "late_recv", 6, "round %d: rank 1 got the message rank 0 "
        "sent before leaving", round);
    agg(ps, 3, "never_sent", 6, "round %d: a receive rank 0 never sent "
        "fails naming it", round);
    agg(ps, 3, "never_bcast", 6, "round %d: a broadcast rank 0 never rooted "
        "fails naming it", round);
    agg(ps, 3, "survivors", 6, "round %d: ranks 1 and 2 still work together",
        round);
    ok(ps[0].status == 0 && ps[1].status == 0 && ps[2].status == 0,
       "round %d: every rank exited 0 (%d %d %d)", round, ps[0].status,
       ps[1].status, ps[2].status);
    if (scenario_failed) dump_procs(ps, 3);
    procs_free(ps, 3);
  }
  return done_testing();
}
