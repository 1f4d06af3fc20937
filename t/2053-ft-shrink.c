/* Revoke and shrink, with separate processes (env://), SIGPIPE at its
 * default action:
 *   a) 4 ranks, rank 2 killed during allreduces: the survivors shrink to 3
 *      ranks (renumbered in order) and go on, every result checked;
 *   b) a chain of shrinks from 8 ranks down to 3: five ranks killed one
 *      after another (rank 0, which hosts the store and coordinates the
 *      first agreements, among them), a shrink after each, results right
 *      after each;
 *   c) two ranks killed at once, one of them the lowest (the agreement's
 *      coordinator): the agreement survives failures during it;
 *   d) revoke: rank 1 revokes the world while the others wait in an
 *      allreduce: they fail with UVCCL_EREVOKED naming rank 1 and its
 *      reason, later calls too; then everyone shrinks the revoked group
 *      (nobody removed) and the new group works;
 *   e) uvccl_pg_shrink_excluding: ranks 1-3 leave out rank 0, alive and not
 *      shrinking (the lowest rank, the store's host); bad lists refused;
 *   f) the same leaving out rank 2 while rank 3 died: both go (the result
 *      says 2 removed);
 *   g) a group made after one of its members failed (new_group of the
 *      world with rank 2 dead, as a shrink whose coordinator dies after
 *      deciding makes one): born broken, its allreduce fails at once
 *      naming rank 2, not at its timeout; a group without rank 2 works.
 * Each rank prints "shrunk to N ranks after losing rank R (reason)", as
 * uvccl-bench --shrink-on-failure does, and the members of each new group
 * (an allgather of world ranks), which the parent compares with who it
 * killed; after each shrink it rebuilds a subgroup from the new group
 * (split into even and odd ranks) and checks an allreduce there. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXG 16

static uvccl_pg_t groups[MAXG]; /* groups[0] unused: the world is pg */
static int ngroups;
static int closed_groups;

static void on_group_closed(uvccl_pg_t *p) {
  (void)p;
  closed_groups++;
}

/* One allreduce of int64 (world rank + 1) * (iter + 1) on cur; checked
 * against the members. */
static int checked_allreduce(uvccl_pg_t *cur, int iter, int *bad) {
  int64_t v[64], want = 0;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int i, rc;
  for (i = 0; i < cur->size; i++)
    want += (int64_t)(uvccl_pg_global_rank(cur, i) + 1) * (iter + 1);
  for (i = 0; i < 64; i++) v[i] = (int64_t)(R + 1) * (iter + 1);
  w.data = &c;
  rc = uvccl_allreduce(cur, &w, v, v, 64, UVCCL_INT64, UVCCL_SUM, on_work);
  rc = finish_work(&c, rc, 60000);
  if (rc == 0)
    for (i = 0; i < 64; i++) *bad += v[i] != want;
  if (rc == 0 && v[0] != want && *bad == 64)
    printf("@note %d iter %d size %d: got %lld want %lld\n", R, iter,
           cur->size, (long long)v[0], (long long)want);
  if (rc != 0) printf("@note %d failed: %s %s\n", R, ename(rc), w.msg);
  return rc;
}

/* Rebuilds a subgroup from cur as an application would after a shrink (its
 * even and odd ranks, by split) and checks an allreduce on it; destroyed
 * at the end with the other groups. 0 if right. */
static int subgroup_ok(uvccl_pg_t *cur, int iter) {
  uvccl_pg_t *sub = &groups[ngroups];
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int rc, bad = 0;
  w.data = &c;
  rc = uvccl_pg_split(cur, sub, cur->rank % 2, cur->rank, &w, on_work);
  rc = finish_work(&c, rc, 20000);
  if (rc != 0) printf("@note %d split: %s %s\n", R, ename(rc), w.msg);
  else if (sub->size != (cur->size + 1 - cur->rank % 2) / 2) rc = UV_EINVAL;
  else if ((rc = checked_allreduce(sub, iter, &bad)) == 0 && bad != 0)
    rc = UV_EINVAL;
  if (sub->impl_ != NULL) {
    ngroups++;
    uvccl_pg_destroy(sub, on_group_closed);
  }
  return rc;
}

/* The world ranks of cur's members, as a bit mask, by allgather. */
static int members_mask(uvccl_pg_t *cur, unsigned *mask) {
  int32_t me = R, all[64];
  uvccl_work_t w = {0};
  cbres_t c = {0};
  int i, rc, ordered = 1;
  w.data = &c;
  rc = uvccl_allgather(cur, &w, &me, all, 1, UVCCL_INT32, on_work);
  rc = finish_work(&c, rc, 20000);
  *mask = 0;
  if (rc != 0) return rc;
  for (i = 0; i < cur->size; i++) {
    *mask |= 1u << all[i];
    if (i > 0 && all[i] <= all[i - 1]) ordered = 0;
    if (all[i] != uvccl_pg_global_rank(cur, i)) ordered = 0;
  }
  return ordered ? 0 : UV_EINVAL;
}

static int role_shrink(void) {
  int final_size = ft_env_int("T_FINAL", 3), iter = 0, bad = 0, shrinks = 0;
  int after_final = 0, subs = 0, overtaken = 0, last_ok = 1, rc;
  uvccl_pg_t *cur;
  unsigned mask;
  double t0 = now_s();
  rank_init(30000);
  ngroups = 1; /* handles must not be copied: the world stays in pg */
  cur = &pg;
  printf("@val %d size %d\n", R, cur->size);
  while (now_s() - t0 < 60) {
    rc = checked_allreduce(cur, iter++, &bad);
    if (rc == 0) {
      if (iter == 2) val("started", 1);
      if (cur->size == final_size && ++after_final >= 30) break;
      if (cur->size > final_size) sleep_ms(2);
      continue;
    }
    {
      uvccl_pg_failure_t f;
      uvccl_work_t w = {0};
      cbres_t c = {0};
      uvccl_pg_t *next = &groups[ngroups];
      uvccl_pg_get_failure(cur, &f);
      w.data = &c;
      rc = uvccl_pg_shrink(cur, next, &w, on_work);
      rc = finish_work(&c, rc, 40000);
      if (rc != 0) {
        rep(0, "shrink", "shrink %d failed: %s %s", shrinks + 1, ename(rc),
            w.msg);
        break;
      }
      ngroups++;
      shrinks++;
      printf("@line %d shrunk to %d ranks after losing rank %d (%s)\n", R,
             next->size, f.global_rank, uvccl_fail_cause_name(f.cause));
      uvccl_pg_destroy(cur, on_group_closed);
      cur = next;
      {
        /* The ranks may have failed at different iterations: agree on
         * the next one (as an application resumes from a common step). */
        int64_t it = iter;
        uvccl_work_t wi = {0};
        cbres_t ci = {0};
        wi.data = &ci;
        rc = uvccl_allreduce(cur, &wi, &it, &it, 1, UVCCL_INT64, UVCCL_MAX,
                             on_work);
        rc = finish_work(&ci, rc, 20000);
        if (rc == 0) iter = (int)it;
      }
      rc = members_mask(cur, &mask);
      /* before reporting the new size: the parent strikes after that */
      if (rc == 0) {
        rc = subgroup_ok(cur, iter);
        if (rc == 0) subs++;
      }
      printf("@val %d members_%d %u\n@val %d size %d\n@val %d rank_%d %d\n", R,
             shrinks, mask, R, cur->size, R, shrinks, cur->rank);
      last_ok = rc == 0;
      if (rc == UVCCL_EPEER) {
        /* Another member failed after the agreement (two killed "at
         * once" can straddle it): the next allreduce shrinks again. */
        printf("@note %d group of shrink %d overtaken by a failure\n", R,
               shrinks);
        overtaken++;
      } else if (rc != 0) {
        rep(0, "subgroup", "members or split of the group of %d after "
            "shrink %d: %s", cur->size, shrinks, ename(rc));
        break;
      }
    }
  }
  rep(bad == 0 && cur->size == final_size && last_ok, "done",
      "%d allreduces, %d shrinks, final size %d, %d wrong values, the last "
      "group's members and subgroup %s", iter, shrinks, cur->size, bad,
      last_ok ? "right" : "failed");
  printf("@val %d shrinks %d\n@val %d subgroups %d\n@val %d overtaken %d\n",
         R, shrinks, R, subs, R, overtaken);
  uvccl_pg_destroy(cur, on_group_closed);
  run_until(&pg_closed, 100); /* let the destroys go */
  {
    double t1 = now_s();
    while (closed_groups < ngroups && now_s() - t1 < 8)
      uv_run(&loop, UV_RUN_ONCE);
  }
  uv_close((uv_handle_t *)&guard, NULL);
  while (uv_loop_alive(&loop) && now_s() - t0 < 90) uv_run(&loop, UV_RUN_ONCE);
  rc = uv_loop_close(&loop);
  {
    char left[256] = "";
    if (rc != 0) uv_walk(&loop, walk_cb, left);
    rep(closed_groups == ngroups && rc == 0, "destroy",
        "%d of %d groups closed, uv_loop_close %s%s", closed_groups, ngroups,
        ename(rc), left);
  }
  return 0;
}

static uv_timer_t revoke_timer;
static void on_revoke_timer(uv_timer_t *t) {
  (void)t;
  uvccl_pg_revoke(&pg, "testing revoke");
}

static int role_revoke(void) {
  int64_t v = R + 1;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  uvccl_pg_t next;
  int rc, bad = 0;
  rank_init(30000);
  if (R == 1) {
    uv_timer_init(&loop, &revoke_timer);
    uv_timer_start(&revoke_timer, on_revoke_timer, 300, 0);
    run_until(&c.done, 500);
    uv_close((uv_handle_t *)&revoke_timer, NULL);
    rc = uvccl_allreduce(&pg, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, NULL);
    rep(rc == UVCCL_EREVOKED && strstr(w.msg, "revoked by rank 1") != NULL,
        "revoked", "own later call: %s %s", ename(rc), w.msg);
  } else {
    w.data = &c;
    rc = uvccl_allreduce(&pg, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 20000);
    rep(rc == UVCCL_EREVOKED &&
            strstr(w.msg, "revoked by rank 1 (global 1") != NULL &&
            strstr(w.msg, "testing revoke") != NULL,
        "revoked", "pending allreduce: %s %s", ename(rc), w.msg);
    memset(&w, 0, sizeof(w));
    rc = uvccl_allreduce(&pg, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, NULL);
    rep(rc == UVCCL_EREVOKED && strstr(w.msg, "testing revoke") != NULL,
        "later", "a later call: %s %s", ename(rc), w.msg);
  }
  memset(&w, 0, sizeof(w));
  memset(&c, 0, sizeof(c));
  w.data = &c;
  rc = uvccl_pg_shrink(&pg, &next, &w, on_work);
  rc = finish_work(&c, rc, 20000);
  rep(rc == 0 && next.size == 4 && next.rank == R && w.result == 0,
      "shrink", "shrink of the revoked group: %s %s (size %d rank %d, %lld "
      "removed)", ename(rc), w.msg, next.size, next.rank,
      (long long)w.result);
  if (rc == 0) {
    rc = checked_allreduce(&next, 5, &bad);
    rep(rc == 0 && bad == 0, "after", "allreduce on the new group: %s, %d "
        "wrong", ename(rc), bad);
    uvccl_pg_destroy(&next, NULL);
  }
  return rank_destroy();
}

/* e/f: the survivors leave out rank T_EXCL, alive and not calling
 * (uvccl_pg_shrink_excluding); rank T_DIE (-1: none) kills itself first. */
static int role_exclude(void) {
  int excl = ft_env_int("T_EXCL", 0), die = ft_env_int("T_DIE", -1);
  int want_removed = die >= 0 ? 2 : 1, never = 0, bad = 0, rc, i, odd;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  uvccl_pg_t next;
  unsigned mask, want = 0;
  rank_init(30000);
  if (R == die) {
    sleep_ms(50);
    raise(SIGKILL);
  }
  if (R == excl) {
    run_until(&never, 3000); /* alive, answering, not shrinking */
    return rank_destroy();
  }
  /* bad input first: nothing starts */
  odd = R;
  rc = uvccl_pg_shrink_excluding(&pg, &next, &odd, 1, &w, on_work);
  rep(rc == UV_EINVAL && strstr(w.msg, "own list") != NULL, "self",
      "excluding itself: %s %s", ename(rc), w.msg);
  memset(&w, 0, sizeof(w));
  odd = P + 3;
  rc = uvccl_pg_shrink_excluding(&pg, &next, &odd, 1, &w, on_work);
  rep(rc == UV_EINVAL && strstr(w.msg, "not in the group") != NULL, "range",
      "excluding rank %d of %d: %s %s", P + 3, P, ename(rc), w.msg);
  memset(&w, 0, sizeof(w));
  w.data = &c;
  rc = uvccl_pg_shrink_excluding(&pg, &next, &excl, 1, &w, on_work);
  rc = finish_work(&c, rc, 20000);
  for (i = 0; i < P; i++)
    if (i != excl && i != die) want |= 1u << i;
  rep(rc == 0 && w.result == want_removed && next.size == P - want_removed,
      "shrink", "shrink excluding rank %d%s: %s %s (size %d, %lld removed)",
      excl, die >= 0 ? " (another dead)" : "", ename(rc), w.msg, next.size,
      (long long)w.result);
  if (rc == 0) {
    rc = members_mask(&next, &mask);
    rep(rc == 0 && mask == want, "members", "members 0x%x, want 0x%x (%s)",
        mask, want, ename(rc));
    rc = checked_allreduce(&next, 3, &bad);
    rep(rc == 0 && bad == 0, "after", "allreduce on the new group: %s, %d "
        "wrong", ename(rc), bad);
    uvccl_pg_destroy(&next, NULL);
  }
  return rank_destroy();
}

/* g: rank 2 dies; once 0 and 1 know, each makes groups of the world. */
static int role_born(void) {
  static const int all[] = {0, 1, 2}, two[] = {0, 1};
  uvccl_pg_t g3, g2;
  uvccl_pg_failure_t f;
  int64_t v = R + 1;
  uvccl_work_t w = {0};
  cbres_t c = {0};
  double t0;
  int rc, bad = 0;
  rank_init(30000);
  if (R == 2) {
    sleep_ms(50);
    raise(SIGKILL);
  }
  rc = checked_allreduce(&pg, 0, &bad);
  rep(rc == UVCCL_EPEER, "world", "the world's allreduce: %s", ename(rc));
  rc = uvccl_pg_new_group(&pg, &g3, all, 3, NULL);
  if (rc == 0) {
    t0 = now_s();
    w.data = &c;
    rc = uvccl_allreduce(&g3, &w, &v, &v, 1, UVCCL_INT64, UVCCL_SUM, on_work);
    rc = finish_work(&c, rc, 40000);
    rep(rc == UVCCL_EPEER && strstr(w.msg, "global 2") != NULL &&
            now_s() - t0 < 5,
        "born", "allreduce on a new group holding the dead rank: %s after "
        "%.2f s: %s", ename(rc), now_s() - t0, w.msg);
    rc = uvccl_pg_get_failure(&g3, &f);
    rep(rc == 1 && f.global_rank == 2 && f.rank == 2, "culprit",
        "its failure: %d, culprit rank %d (global %d)", rc, f.rank,
        f.global_rank);
    uvccl_pg_destroy(&g3, NULL);
  } else {
    rep(0, "born", "new_group of 3: %s", ename(rc));
  }
  rc = uvccl_pg_new_group(&pg, &g2, two, 2, NULL);
  if (rc == 0) {
    rc = checked_allreduce(&g2, 1, &bad);
    rep(rc == 0 && bad == 0, "without", "allreduce on a new group without "
        "it: %s, %d wrong", ename(rc), bad);
    uvccl_pg_destroy(&g2, NULL);
  } else {
    rep(0, "without", "new_group of 2: %s", ename(rc));
  }
  return rank_destroy();
}

static int rank_main(const char *role) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(120);
  unsetenv("UVCCL_SOCKET_IFNAME");
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  if (strcmp(role, "revoke") == 0) return role_revoke();
  if (strcmp(role, "exclude") == 0) return role_exclude();
  if (strcmp(role, "born") == 0) return role_born();
  return role_shrink();
}

/* ======================================================================== */

static int live_at_size(proc_t *ps, int n, unsigned alive, int size) {
  int r;
  for (r = 0; r < n; r++) {
    const char *b = ps[r].obuf, *last = NULL, *x = b;
    char key[32];
    if (!(alive & (1u << r))) continue;
    snprintf(key, sizeof(key), "@val %d size ", r);
    while ((x = strstr(x, key)) != NULL) last = x++;
    if (last == NULL || atoi(last + strlen(key)) != size) return 0;
  }
  return 1;
}

/* Kills victims[0..nv) one after another (each group of `together`
 * victims within a few ms), each time once every survivor reports the
 * current size; then checks that the survivors ended in a group of the
 * others, with the right members after every shrink. */
static void chain(const char *name, int n, const int *victims, int nv,
                  int together) {
  proc_t ps[8];
  static char e_final[32];
  unsigned alive = (1u << n) - 1;
  int i, k, size = n, r, good = 1, okv;
  double t0;
  char det[512];
  snprintf(e_final, sizeof(e_final), "T_FINAL=%d", n - nv);
  putenv(e_final);
  spawn_world(ps, n, "shrink", 0);
  for (i = 0; i < nv; i += together) {
    t0 = now_s();
    while (!live_at_size(ps, n, alive, size) && now_s() - t0 < 30)
      pump(ps, n, 10);
    if (!live_at_size(ps, n, alive, size)) {
      diag("%s: the survivors never reported size %d", name, size);
      good = 0;
      break;
    }
    sleep_ms(20 + rand() % 30);
    for (k = 0; k < together && i + k < nv; k++) {
      kill(ps[victims[i + k]].pid, SIGKILL);
      alive &= ~(1u << victims[i + k]);
      size--;
      if (k + 1 < together) sleep_ms(rand() % 3);
    }
  }
  finish_all(ps, n, 90);
  for (r = 0; r < n; r++) {
    double v;
    if (!(alive & (1u << r))) continue;
    find_check(ps, n, r, "done", &okv, det, sizeof(det));
    if (okv != 1) {
      diag("%s: rank %d: %s", name, r, det);
      good = 0;
    }
    find_check(ps, n, r, "shrink", &okv, det, sizeof(det));
    if (okv == 0) good = 0;
    find_check(ps, n, r, "subgroup", &okv, det, sizeof(det));
    if (okv == 0) good = 0;
    find_check(ps, n, r, "destroy", &okv, det, sizeof(det));
    if (okv != 1) {
      diag("%s: rank %d destroy: %s", name, r, det);
      good = 0;
    }
    if (ps[r].status != 0) {
      diag("%s: rank %d exit status %d", name, r, ps[r].status);
      good = 0;
    }
    /* the last group has exactly the survivors, renumbered in order */
    if (find_val(ps, n, r, "shrinks", &v)) {
      char key[32];
      double m = -1;
      snprintf(key, sizeof(key), "members_%d", (int)v);
      if (!find_val(ps, n, r, key, &m) || (unsigned)m != alive) {
        diag("%s: rank %d's last group has members 0x%x, want 0x%x", name, r,
             (unsigned)m, alive);
        good = 0;
      }
      /* a subgroup rebuilt from every new group, its allreduce right;
       * only a group that lost another member before that (two victims
       * killed together can fall on both sides of one agreement) may be
       * skipped, and the last group never */
      {
        double o = -1;
        if (!find_val(ps, n, r, "subgroups", &m) ||
            !find_val(ps, n, r, "overtaken", &o) || m + o != v ||
            (together == 1 && o != 0)) {
          diag("%s: rank %d rebuilt %g subgroups after %g shrinks (%g groups "
               "overtaken by a failure)", name, r, m, v, o);
          good = 0;
        }
      }
    }
  }
  ok(good, "%s; a subgroup split from each new group works", name);
  if (!good) dump_procs(ps, n);
  else
    for (r = 0; r < n; r++)
      if (alive & (1u << r)) {
        const char *b = ps[r].obuf, *x;
        while ((x = strstr(b, "@line ")) != NULL) {
          const char *nl = strchr(x, '\n');
          note("  rank %.*s", (int)(nl ? nl - x - 6 : 60), x + 6);
          b = nl ? nl : x + 6;
        }
        break;
      }
  procs_free(ps, n);
}

static void scenario_revoke(void) {
  proc_t ps[4];
  spawn_world(ps, 4, "revoke", 0);
  finish_all(ps, 4, 60);
  scenario_failed = 0;
  agg(ps, 4, "revoked", 0xf, "d: rank 1 revokes: the pending allreduce of "
      "ranks 0, 2, 3 fails with UVCCL_EREVOKED naming rank 1 and its reason; "
      "rank 1's own later call too");
  agg(ps, 4, "later", 0xd, "d: later calls fail at once, the same way");
  agg(ps, 4, "shrink", 0xf, "d: shrinking the revoked group keeps all 4, "
      "ranks unchanged");
  agg(ps, 4, "after", 0xf, "d: the new group's allreduce is right");
  agg(ps, 4, "destroy", 0xf, "d: every rank destroys cleanly");
  if (scenario_failed) dump_procs(ps, 4);
  procs_free(ps, 4);
}

static void scenario_exclude(const char *name, int excl, int die) {
  proc_t ps[4];
  static char e_excl[32], e_die[32];
  unsigned surv = 0xf & ~(1u << excl);
  if (die >= 0) surv &= ~(1u << die);
  snprintf(e_excl, sizeof(e_excl), "T_EXCL=%d", excl);
  snprintf(e_die, sizeof(e_die), "T_DIE=%d", die);
  putenv(e_excl);
  putenv(e_die);
  spawn_world(ps, 4, "exclude", 0);
  finish_all(ps, 4, 60);
  scenario_failed = 0;
  agg(ps, 4, "self", surv, "%s: excluding itself: UV_EINVAL saying so", name);
  agg(ps, 4, "range", surv, "%s: excluding a rank outside the group: "
      "UV_EINVAL", name);
  agg(ps, 4, "shrink", surv, "%s: the others shrink without waiting for it",
      name);
  agg(ps, 4, "members", surv, "%s: the new group has exactly the others, in "
      "order", name);
  agg(ps, 4, "after", surv, "%s: its allreduce is right", name);
  agg(ps, 4, "destroy", 0xf & ~(die >= 0 ? 1u << die : 0u),
      "%s: every live rank destroys cleanly (the excluded one too)", name);
  if (scenario_failed) dump_procs(ps, 4);
  procs_free(ps, 4);
  unsetenv("T_EXCL");
  unsetenv("T_DIE");
}

static void scenario_born(void) {
  proc_t ps[3];
  spawn_world(ps, 3, "born", 0);
  finish_all(ps, 3, 60);
  scenario_failed = 0;
  agg(ps, 3, "world", 0x3, "g: rank 2 killed: the world's allreduce fails on "
      "ranks 0 and 1");
  agg(ps, 3, "born", 0x3, "g: a group made afterwards with rank 2 in it is "
      "born broken: its allreduce fails at once with UVCCL_EPEER naming "
      "global rank 2");
  agg(ps, 3, "culprit", 0x3, "g: uvccl_pg_get_failure on it names rank 2");
  agg(ps, 3, "without", 0x3, "g: a group made without rank 2 works, results "
      "right");
  agg(ps, 3, "destroy", 0x3, "g: both destroy cleanly");
  if (scenario_failed) dump_procs(ps, 3);
  procs_free(ps, 3);
}

int main(void) {
  static const int v_a[] = {2};
  static const int v_b[] = {6, 0, 3, 7, 1};
  static const int v_c[] = {3, 0};
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && *role) return rank_main(role);
  parent_init(900);
  srand((unsigned)getpid());
  sigpipe_default();
  plan(3 + 5 + 2 * 6 + 5);
  chain("a: 4 ranks, rank 2 killed: 3 survivors shrink and go on, results "
        "right", 4, v_a, 1, 1);
  chain("b: 8 ranks down to 3 (ranks 6, 0, 3, 7, 1 killed one by one): a "
        "shrink after each, results right after each", 8, v_b, 5, 1);
  chain("c: 5 ranks, ranks 3 and 0 (the coordinator) killed at once: the "
        "survivors agree and go on", 5, v_c, 2, 2);
  scenario_revoke();
  scenario_exclude("e: rank 0 (the coordinator, the store's host) excluded "
                   "alive", 0, -1);
  scenario_exclude("f: rank 2 excluded alive while rank 3 died", 2, 3);
  scenario_born();
  return done_testing();
}
