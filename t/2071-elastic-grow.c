/* uvccl_pg_grow and uvccl_pg_join between real processes. The world's
 * store is served by a process of its own (uvccl-store serve, with a
 * secret), as uvccl-run --host-store does, so it outlives every rank:
 *   a) grow 4 -> 6: two joiners at once; members keep their ranks, the
 *      joiners take 4 and 5; the same epoch (1) everywhere; an allreduce
 *      of the six; a subgroup of ranks 1, 3 and 5 made from it; the
 *      flight recorder holding its operations; then a state transfer from
 *      rank 0 to the joiners, every byte checked;
 *   b) rank 0 killed and replaced: ranks 1-3 shrink to 3, then grow back to
 *      4 with a replacement that waited for the grow to open; allreduce;
 *   c) a joiner killed while the new world is being made: every member
 *      fails the grow, at its creation deadline at the latest, and the old
 *      world still works;
 *   d) a member killed before the grow: the others fail the members'
 *      agreement (naming it) and keep the old world; the joiner fails too;
 *   e) a stranger (another secret) cannot join: its store refuses it;
 *   e2) a member killed mid-grow: rank 3 dies after the agreement, while
 *      the members wait for a joiner that comes late: every other member
 *      fails the grow naming rank 3, shrinks the old world to 3 and
 *      allreduces over it; the late joiner is refused (the members
 *      declared its place failed) and fails within its deadline;
 *   f) a grow after a chain of shrinks: rank 3 killed, 4 -> 3; rank 2
 *      killed, 3 -> 2; then 2 -> 4 with two joiners, ranks 0 and 1 kept;
 *      allreduce of the four;
 *   g) a) with UVCCL_GROW=anew: every connection made anew;
 *   h) across hosts (t/netns.h: two network namespaces, the store served
 *      in the first): ranks 0 and 1 on host A, 2 and 3 on host B; rank 3
 *      killed, the others shrink to 3 (hosts of 2 and 1) and grow back
 *      with a joiner on host B: connections kept, peers of the same host
 *      through shared memory and the others over TCP; a 4 B and a 2 MiB
 *      allreduce and a 2 MiB allgather of the four (two levels across
 *      the hosts), every value checked;
 *   i) leave and join in one agreement (uvccl_pg_reconfigure): rank 1 of
 *      4 leaves as a joiner comes; ranks 0, 2, 3 become 0, 1, 2 with their
 *      connections kept, the joiner 3; the one leaving gets no world;
 *      an allreduce of the new four;
 *   i2) the same, but rank 1 dies (rather than leaves) once it is out,
 *      while the members wait for a joiner that comes late: not a rank of
 *      the new world, so the new world is made all the same;
 *   j) the members name different ranks to leave: every member fails at
 *      the agreement and keeps its world (an allreduce of the old four);
 *      the joiner fails at its deadline.
 * In a) and g) the old world of four still takes an allreduce after the
 * grow. In a), b) and f) the members keep their connections (the same net:
 * each member's peer addresses are the old world's) and every link in
 * the new world, joiners' included, goes through shared memory; in g)
 * every member's peer address is new. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"
#include "netns.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SECRET "t2071-secret-0123456789"
#define NMAX 8

static uvccl_store_t store;
static int store_port;

#define PREP(w, c)                                                           \
  do {                                                                       \
    memset(&(w), 0, sizeof(w));                                              \
    memset(&(c), 0, sizeof(c));                                              \
    (w).data = &(c);                                                         \
  } while (0)

static void store_open(void) {
  uvccl_tcp_store_options_t so;
  memset(&so, 0, sizeof(so));
  so.host = getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : "127.0.0.1";
  so.port = store_port;
  so.timeout_ms = 20000;
  if (uvccl_tcp_store_init(&loop, &store, &so) != 0) {
    rep(0, "store", "cannot make a store client");
    exit(1);
  }
}

static void store_close(void) { uvccl_store_close(&store, NULL); }

/* sum of the ranks over g, checked */
static int allreduce_check(uvccl_pg_t *g, const char *name) {
  uvccl_work_t w;
  cbres_t c;
  int64_t v = g->rank, sum = -1;
  int rc;
  PREP(w, c);
  rc = finish_work(&c, uvccl_allreduce(g, &w, &v, &sum, 1, UVCCL_INT64,
                                       UVCCL_SUM, on_work), 15000);
  rep(rc == 0 && sum == (int64_t)g->size * (g->size - 1) / 2, name,
      "allreduce over %d ranks: %s %s, sum %lld", g->size, ename(rc), w.msg,
      (long long)sum);
  return rc;
}

/* The members' connections were kept (keep: the old world's peers have
 * the same addresses in the new one) or made anew (all new); either way
 * every peer of the new world is reached through shared memory. */
static void kept_check(uvccl_pg_t *old, uvccl_pg_t *np, int keep) {
  int i, n = 0, same = 0, shm = 0;
  char what[160] = "";
  size_t off = 0;
  for (i = 0; i < old->size; i++) {
    const char *a = uvccl_pg_peer_address(old, i),
               *b = uvccl_pg_peer_address(np, i);
    if (i == old->rank) continue;
    n++;
    same += strcmp(a, b) == 0 && strcmp(a, "?") != 0;
    if (off < sizeof(what))
      off += (size_t)snprintf(what + off, sizeof(what) - off, " %d:%s>%s", i,
                              a, b);
  }
  for (i = 0; i < np->size; i++)
    shm += i != np->rank && strcmp(uvccl_pg_peer_transport(np, i), "shm") == 0;
  rep((keep ? same == n : same == 0) && shm == np->size - 1, "kept",
      "%d of %d members' addresses the same (%s), %d of %d peers through "
      "shared memory:%s", same, n, keep ? "all kept" : "none kept", shm,
      np->size - 1, what);
}

/* Across hosts (h): peers of this rank's host through shared memory, the
 * others over TCP; with old, the members' addresses kept too. */
static void hosts_check(uvccl_pg_t *old, uvccl_pg_t *np) {
  int i, good = 0, same = 0, n = 0, me = uvccl_pg_peer_host(np, np->rank);
  char what[200] = "";
  size_t off = 0;
  for (i = 0; i < np->size; i++) {
    const char *t = uvccl_pg_peer_transport(np, i);
    int h = uvccl_pg_peer_host(np, i);
    if (i == np->rank) continue;
    good += strcmp(t, h == me ? "shm" : "tcp") == 0;
    if (off < sizeof(what))
      off += (size_t)snprintf(what + off, sizeof(what) - off, " %d:%s@%d", i,
                              t, h);
  }
  for (i = 0; old != NULL && i < old->size; i++) {
    if (i == old->rank) continue;
    n++;
    same += strcmp(uvccl_pg_peer_address(old, i),
                   uvccl_pg_peer_address(np, i)) == 0;
  }
  rep(good == np->size - 1 && same == n, "kept",
      "%d of %d peers through shared memory on this host (%d) and TCP "
      "across, %d of %d members' addresses kept:%s", good, np->size - 1, me,
      same, n, what);
}

/* A 2 MiB allreduce and allgather of int64s (two levels across the
 * hosts), every value checked. */
static void big_check(uvccl_pg_t *g) {
  enum { N = 256 * 1024 };
  int64_t *a = malloc(N * sizeof(int64_t)), *o = malloc(N * sizeof(int64_t)),
          *all = malloc((size_t)g->size * N / 4 * sizeof(int64_t));
  uvccl_work_t w;
  cbres_t c;
  int rc, rc2 = -1, i, bad = 0, k;
  for (i = 0; i < N; i++) a[i] = (int64_t)g->rank * 1000003 + i;
  PREP(w, c);
  rc = finish_work(&c, uvccl_allreduce(g, &w, a, o, N, UVCCL_INT64, UVCCL_SUM,
                                       on_work), 15000);
  for (i = 0; rc == 0 && i < N; i++)
    bad += o[i] != (int64_t)g->size * (g->size - 1) / 2 * 1000003 +
                       (int64_t)g->size * i;
  if (rc == 0) {
    PREP(w, c);
    rc2 = finish_work(&c, uvccl_allgather(g, &w, a, all, N / 4, UVCCL_INT64,
                                          on_work), 15000);
    for (k = 0; rc2 == 0 && k < g->size; k++)
      for (i = 0; i < N / 4; i++)
        bad += all[(size_t)k * N / 4 + i] != (int64_t)k * 1000003 + i;
  }
  rep(rc == 0 && rc2 == 0 && bad == 0, "big", "2 MiB allreduce %s, 512 KiB "
      "a rank allgather %s: %d wrong values", ename(rc), ename(rc2), bad);
  free(a);
  free(o);
  free(all);
}

static void destroy(uvccl_pg_t *g);

/* The grown world of six: a subgroup of ranks 1, 3 and 5 (two members
 * and a joiner) made from it takes an allreduce, and the flight recorder
 * holds the grown world's operations under its prefix. */
static void sub_and_trace_check(uvccl_pg_t *np) {
  static const int sub_ranks[] = {1, 3, 5};
  uvccl_pg_t sub;
  uvccl_work_t w;
  cbres_t c;
  int64_t v = np->rank, sum = -1;
  int rc, in = np->rank == 1 || np->rank == 3 || np->rank == 5;
  char *json = NULL;
  size_t len = 0;
  memset(&sub, 0, sizeof(sub));
  rc = uvccl_pg_new_group(np, &sub, sub_ranks, 3, NULL);
  if (in && rc == 0) {
    PREP(w, c);
    rc = finish_work(&c, uvccl_allreduce(&sub, &w, &v, &sum, 1, UVCCL_INT64,
                                         UVCCL_SUM, on_work), 15000);
    rep(rc == 0 && sum == 9 && sub.size == 3, "sub", "subgroup 1, 3, 5 of "
        "the grown world: %s %s, sum %lld", ename(rc), w.msg, (long long)sum);
    destroy(&sub);
  } else {
    rep(!in && rc == UVCCL_ENOTMEMBER, "sub", "not in the subgroup: %s",
        ename(rc));
  }
  rc = uvccl_trace_json(&loop, NULL, &json, &len);
  rep(rc == 0 && json != NULL &&
          strstr(json, "uvccl/default/grow/1/world") != NULL &&
          strstr(json, "allreduce") != NULL,
      "trace", "the flight recorder: %s, %zu bytes, the grown world's "
      "prefix %s", ename(rc), len,
      json != NULL && strstr(json, "uvccl/default/grow/1/world") ? "in it"
                                                                  : "missing");
  free(json);
}

static void destroy(uvccl_pg_t *g) {
  pg_closed = 0;
  uvccl_pg_destroy(g, on_pg_closed);
  run_until(&pg_closed, 5000);
}

static int grow(uvccl_pg_t *from, uvccl_pg_t *to, int njoin, uint64_t ms,
                uvccl_work_t *w, cbres_t *c) {
  uvccl_pg_options_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = ms;
  PREP(*w, *c);
  memset(to, 0, sizeof(*to));
  return finish_work(c, uvccl_pg_grow(from, to, &store, njoin, &o, w, on_work),
                 ms + 20000);
}

static int shrink(uvccl_pg_t *from, uvccl_pg_t *to, uvccl_work_t *w,
                  cbres_t *c) {
  PREP(*w, *c);
  memset(to, 0, sizeof(*to));
  return finish_work(c, uvccl_pg_shrink(from, to, w, on_work), 20000);
}

static int reconfigure(uvccl_pg_t *from, uvccl_pg_t *to, const int *leave,
                       int nleave, uint64_t ms, uvccl_work_t *w, cbres_t *c) {
  uvccl_pg_options_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = ms;
  PREP(*w, *c);
  memset(to, 0, sizeof(*to));
  return finish_work(c, uvccl_pg_reconfigure(from, to, &store, leave, nleave,
                                             1, &o, w, on_work),
                     ms + 20000);
}

static int join(uvccl_pg_t *to, uint64_t ms, uvccl_work_t *w, cbres_t *c) {
  uvccl_pg_options_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = ms;
  PREP(*w, *c);
  memset(to, 0, sizeof(*to));
  return finish_work(c, uvccl_pg_join(&loop, to, &store, &o, w, on_work),
                 ms + 30000);
}

/* the transfer of a), both sides */
static int transfer_check(uvccl_pg_t *g) {
  static const int to[2] = {4, 5};
  static unsigned char mem[(1 << 20) + 3];
  uvccl_buf_t b = {mem, sizeof(mem)};
  uvccl_work_t w;
  cbres_t c;
  size_t i, bad = 0;
  int rc;
  if (g->rank != 0 && g->rank < 4) return 0;
  for (i = 0; i < sizeof(mem); i++)
    mem[i] = g->rank == 0 ? (unsigned char)(i * 13 + 5) : 0;
  PREP(w, c);
  rc = finish_work(&c, uvccl_pg_transfer(g, &w, &b, 1, 0, to, 2, 77, on_work),
                   15000);
  for (i = 0; i < sizeof(mem); i++)
    bad += mem[i] != (unsigned char)(i * 13 + 5);
  rep(rc == 0 && bad == 0, "transfer", "state to the joiners: %s %s, %zu "
      "wrong bytes", ename(rc), w.msg, bad);
  return rc;
}

static int member_main(const char *role) {
  uvccl_work_t w;
  cbres_t c;
  uvccl_pg_t np, sh;
  int rc;
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  rank_init(20000);
  store_open();
  if (strcmp(role, "grow") == 0 || strcmp(role, "anew") == 0) {
    rc = grow(&pg, &np, 2, 20000, &w, &c);
    rep(rc == 0 && np.size == 6 && np.rank == R && w.result == 1, "grew",
        "grow by 2: %s %s (rank %d of %d, epoch %lld)", ename(rc), w.msg,
        np.rank, np.size, (long long)w.result);
    if (rc == 0) {
      kept_check(&pg, &np, strcmp(role, "grow") == 0);
      allreduce_check(&np, "after");
      sub_and_trace_check(&np);
      transfer_check(&np);
      destroy(&np);
    }
    allreduce_check(&pg, "old"); /* the old world goes on beside it */
  } else if (strcmp(role, "kill0") == 0) {
    if (R == 0) raise(SIGKILL); /* rank 0, and the store lives on */
    PREP(w, c);
    memset(&sh, 0, sizeof(sh));
    rc = finish_work(&c, uvccl_pg_shrink(&pg, &sh, &w, on_work), 20000);
    if (rc != 0 || sh.size != 3) {
      rep(0, "grew", "shrink: %s %s (size %d)", ename(rc), w.msg, sh.size);
    } else {
      rc = grow(&sh, &np, 1, 20000, &w, &c);
      rep(rc == 0 && np.size == 4 && np.rank == sh.rank && w.result == 1,
          "grew", "shrunk to 3, grown back to 4: %s %s (rank %d of %d, "
          "epoch %lld)", ename(rc), w.msg, np.rank, np.size,
          (long long)w.result);
      if (rc == 0) {
        kept_check(&sh, &np, 1);
        allreduce_check(&np, "after");
        destroy(&np);
      }
      destroy(&sh);
    }
  } else if (strcmp(role, "chain") == 0) {
    uvccl_pg_t s1, s2;
    if (R == 3) raise(SIGKILL);
    rc = shrink(&pg, &s1, &w, &c);
    if (rc == 0 && R == 2) raise(SIGKILL); /* the shrunk world loses it */
    if (rc == 0 && s1.size == 3) rc = shrink(&s1, &s2, &w, &c);
    else rc = rc != 0 ? rc : UVCCL_EPROTO;
    if (rc != 0 || s2.size != 2) {
      rep(0, "grew", "shrinks: %s %s", ename(rc), w.msg);
    } else {
      rc = grow(&s2, &np, 2, 20000, &w, &c);
      rep(rc == 0 && np.size == 4 && np.rank == R && w.result == 1, "grew",
          "4 -> 3 -> 2, grown to 4: %s %s (rank %d of %d, epoch %lld)",
          ename(rc), w.msg, np.rank, np.size, (long long)w.result);
      if (rc == 0) {
        kept_check(&s2, &np, 1);
        allreduce_check(&np, "after");
        destroy(&np);
      }
      destroy(&s2);
    }
    if (s1.impl_ != NULL) destroy(&s1);
  } else if (strcmp(role, "nsgrow") == 0) {
    if (R == 3) raise(SIGKILL); /* host B keeps rank 2 */
    PREP(w, c);
    memset(&sh, 0, sizeof(sh));
    rc = finish_work(&c, uvccl_pg_shrink(&pg, &sh, &w, on_work), 20000);
    if (rc != 0 || sh.size != 3) {
      rep(0, "grew", "shrink: %s %s (size %d)", ename(rc), w.msg, sh.size);
    } else {
      rc = grow(&sh, &np, 1, 20000, &w, &c);
      rep(rc == 0 && np.size == 4 && np.rank == sh.rank && w.result == 1,
          "grew", "across hosts, 3 grown back to 4: %s %s (rank %d of %d)",
          ename(rc), w.msg, np.rank, np.size);
      if (rc == 0) {
        hosts_check(&sh, &np);
        allreduce_check(&np, "after");
        big_check(&np);
        destroy(&np);
      }
      destroy(&sh);
    }
  } else if (strcmp(role, "reconf") == 0 || strcmp(role, "reconfdie") == 0) {
    int leave = 1;
    rc = reconfigure(&pg, &np, &leave, 1, 20000, &w, &c);
    if (R == 1 && strcmp(role, "reconfdie") == 0) {
      sleep_ms(300); /* the members are making the new world by now */
      raise(SIGKILL);
    }
    if (R == 1) {
      rep(rc == 0 && np.rank == -1 && np.size == 4 && w.result == 1, "grew",
          "left: %s %s (rank %d of %d, epoch %lld)", ename(rc), w.msg,
          np.rank, np.size, (long long)w.result);
      rep(1, "kept", "(left)");
      rep(1, "after", "(left)");
    } else {
      int i, same = 0;
      rep(rc == 0 && np.size == 4 && np.rank == (R == 0 ? 0 : R - 1) &&
              w.result == 1,
          "grew", "rank 1 left, one joined: %s %s (rank %d of %d, epoch "
          "%lld)", ename(rc), w.msg, np.rank, np.size, (long long)w.result);
      if (rc == 0) {
        for (i = 0; i < 4; i++)
          if (i != 1 && i != R)
            same += strcmp(uvccl_pg_peer_address(&pg, i),
                           uvccl_pg_peer_address(&np, i < 1 ? i : i - 1)) == 0;
        rep(same == 2 && strcmp(uvccl_pg_peer_transport(&np, 3), "shm") == 0,
            "kept", "%d of 2 staying peers at the same address; the joiner "
            "through %s", same, uvccl_pg_peer_transport(&np, 3));
        allreduce_check(&np, "after");
        destroy(&np);
      }
    }
  } else if (strcmp(role, "reconfbad") == 0) {
    int leave = R == 2 ? 2 : 1; /* rank 2 names another rank */
    rc = reconfigure(&pg, &np, &leave, 1, 3000, &w, &c);
    rep(rc == UV_EINVAL && strstr(w.msg, "leave") != NULL, "grew",
        "different leave lists: %s %s", ename(rc), w.msg);
    allreduce_check(&pg, "after");
  } else if (strcmp(role, "joinerdies") == 0) {
    double t0 = now_s();
    rc = grow(&pg, &np, 1, 3000, &w, &c);
    rep(rc != 0 && rc != HANG && now_s() - t0 < 15, "grew",
        "the joiner died: %s %s after %.1f s", ename(rc), w.msg,
        now_s() - t0);
    allreduce_check(&pg, "after");
  } else if (strcmp(role, "midgrow") == 0) {
    double t0 = now_s();
    if (R == 3) {
      /* past the agreement, waiting for the joiner: then gone */
      uvccl_pg_options_t o;
      memset(&o, 0, sizeof(o));
      o.timeout_ms = 20000;
      PREP(w, c);
      memset(&np, 0, sizeof(np));
      rc = uvccl_pg_grow(&pg, &np, &store, 1, &o, &w, on_work);
      run_until(&c.done, 800);
      raise(SIGKILL);
    }
    rc = grow(&pg, &np, 1, 20000, &w, &c);
    rep(rc != 0 && rc != HANG && strstr(w.msg, "rank 3") != NULL &&
            now_s() - t0 < 10,
        "grew", "a member died mid-grow: %s %s after %.1f s", ename(rc),
        w.msg, now_s() - t0);
    PREP(w, c);
    memset(&sh, 0, sizeof(sh));
    rc = finish_work(&c, uvccl_pg_shrink(&pg, &sh, &w, on_work), 20000);
    if (rc == 0 && sh.size == 3) {
      allreduce_check(&sh, "after");
      destroy(&sh);
    } else {
      rep(0, "after", "shrink after the failed grow: %s %s (size %d)",
          ename(rc), w.msg, sh.size);
    }
  } else if (strcmp(role, "memberdies") == 0) {
    if (R == 3) raise(SIGKILL);
    rc = grow(&pg, &np, 1, 3000, &w, &c);
    rep(rc != 0 && rc != HANG && strstr(w.msg, "agreement") != NULL &&
            strstr(w.msg, "rank 3") != NULL,
        "grew", "a member died: %s %s", ename(rc), w.msg);
    rep(1, "after", "(the old world lost rank 3)");
  }
  store_close();
  return rank_destroy();
}

static int joiner_main(const char *role) {
  uvccl_work_t w;
  cbres_t c;
  uvccl_pg_t np;
  int rc;
  R = ft_env_int("UVCCL_T_ID", -1);
  uv_loop_init(&loop);
  uv_timer_init(&loop, &guard);
  store_open();
  if (strcmp(role, "grow") == 0 || strcmp(role, "kill0") == 0 ||
      strcmp(role, "chain") == 0 || strcmp(role, "anew") == 0 ||
      strcmp(role, "reconf") == 0 || strcmp(role, "reconfdie") == 0) {
    int want = strcmp(role, "grow") == 0 || strcmp(role, "anew") == 0 ? 6 : 4;
    if (strcmp(role, "reconfdie") == 0) sleep_ms(1000); /* comes late */
    rc = join(&np, 20000, &w, &c);
    rep(rc == 0 && np.size == want && np.rank >= want - 2 && w.result == 1,
        "grew", "joined: %s %s (rank %d of %d, epoch %lld)", ename(rc), w.msg,
        np.rank, np.size, (long long)w.result);
    if (rc == 0) {
      allreduce_check(&np, "after");
      if (want == 6) sub_and_trace_check(&np);
      if (want == 6) transfer_check(&np);
      destroy(&np);
    }
  } else if (strcmp(role, "nsgrow") == 0) {
    rc = join(&np, 20000, &w, &c);
    rep(rc == 0 && np.size == 4 && np.rank == 3 && w.result == 1, "grew",
        "joined across hosts: %s %s (rank %d of %d)", ename(rc), w.msg,
        np.rank, np.size);
    if (rc == 0) {
      hosts_check(NULL, &np);
      allreduce_check(&np, "after");
      big_check(&np);
      destroy(&np);
    }
  } else if (strcmp(role, "joinerdies") == 0) {
    /* a joiner's first steps, then death before it connects: it holds a
     * place in the new world that nobody will fill */
    void *v = NULL;
    size_t len = 0;
    char key[128];
    int64_t place = 0;
    rc = uvccl_store_get_sync(&store, "uvccl/default/grow/open", &v, &len);
    if (rc == 0) {
      snprintf(key, sizeof(key), "uvccl/default/grow/%s/joined", (char *)v);
      rc = uvccl_store_add_sync(&store, key, 1, &place);
    }
    free(v);
    printf("# took place %lld (%s), dying\n", (long long)place, ename(rc));
    fflush(stdout);
    raise(SIGKILL);
  } else if (strcmp(role, "midgrow") == 0) {
    double t0;
    sleep_ms(1500); /* late: the members are waiting, rank 3 is gone */
    t0 = now_s();
    rc = join(&np, 5000, &w, &c);
    rep(rc != 0 && rc != HANG && now_s() - t0 < 10, "grew",
        "a late joiner of a failed grow: %s %s after %.1f s", ename(rc),
        w.msg, now_s() - t0);
    rep(1, "after", "(a joiner)");
  } else if (strcmp(role, "memberdies") == 0 ||
             strcmp(role, "reconfbad") == 0) {
    rc = join(&np, 3000, &w, &c);
    rep(rc != 0 && rc != HANG, "grew", "the members never came: %s %s",
        ename(rc), w.msg);
    rep(1, "after", "(a joiner)");
  } else if (strcmp(role, "stranger") == 0) {
    rc = join(&np, 3000, &w, &c);
    rep(rc == UVCCL_EAUTH, "grew", "a stranger's join: %s %s", ename(rc),
        w.msg);
  }
  store_close();
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  return 0;
}

/* ---- parent ---------------------------------------------------------- */

static proc_t server;

static void start_store(void) {
  static char port[16], tool[4096];
  char *argv[] = {tool, (char *)"serve", (char *)"--host", (char *)"127.0.0.1",
                  (char *)"--port", port, NULL};
  const char *bd = getenv("UVCCL_BUILD_DIR");
  snprintf(tool, sizeof(tool), "%s/bin/uvccl-store",
           bd && *bd ? bd : UVCCL_BUILD_DIR);
  if (access(tool, X_OK) != 0) {
    note("%s not built", tool);
    return;
  }
  store_port = free_port();
  snprintf(port, sizeof(port), "%d", store_port);
  spawn(&server, "store", argv, NULL, 0);
  sleep_ms(300);
}

/* members 0..nm-1 (env://, the agent's store), joiners nm..nm+nj-1 */
static void spawn_all(proc_t *ps, int nm, int nj, const char *role) {
  static char e_role[64], e_size[32], e_port[32], e_rank[NMAX][32],
      e_id[NMAX][32];
  char *argv[] = {self, NULL};
  int r;
  snprintf(e_role, sizeof(e_role), "UVCCL_T_ROLE=%s", role);
  snprintf(e_size, sizeof(e_size), "WORLD_SIZE=%d", nm);
  snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", store_port);
  for (r = 0; r < nm + nj; r++) {
    char name[32];
    const char *env[] = {e_role, e_rank[r], e_size, "MASTER_ADDR=127.0.0.1",
                         e_port, "TORCHELASTIC_USE_AGENT_STORE=True",
                         "UVCCL_AUTH_TOKEN=" SECRET, e_id[r], NULL};
    snprintf(e_rank[r], sizeof(e_rank[r]), "RANK=%d", r < nm ? r : 0);
    snprintf(e_id[r], sizeof(e_id[r]), "UVCCL_T_ID=%d", r);
    if (r >= nm) snprintf(e_rank[r], sizeof(e_rank[r]), "UVCCL_T_JOINER=1");
    snprintf(name, sizeof(name), r < nm ? "rank %d" : "joiner %d", r);
    if (spawn(&ps[r], name, argv, env, 0) != 0) note("spawning %d failed", r);
  }
}

static void scenario(const char *role, int nm, int nj, const char *what) {
  proc_t ps[NMAX];
  unsigned all = (1u << (nm + nj)) - 1, members = (1u << nm) - 1;
  int r, clean = 1;
  start_store(); /* a fresh one: every scenario's world is a new job */
  spawn_all(ps, nm, nj, role);
  finish_all(ps, nm + nj, 90);
  scenario_failed = 0;
  if (strcmp(role, "grow") == 0 || strcmp(role, "anew") == 0) {
    agg(ps, nm + nj, "grew", all, "%s: 4 members and 2 joiners make a world "
        "of 6; members keep their ranks, epoch 1 everywhere", what);
    agg(ps, nm + nj, "kept", members, "%s: the members' connections %s; "
        "every peer through shared memory", what,
        strcmp(role, "grow") == 0 ? "kept" : "made anew");
    agg(ps, nm + nj, "after", all, "%s: an allreduce of the six", what);
    agg(ps, nm + nj, "old", members, "%s: and then one of the old four "
        "(its small collectives through the boxes of its own ranks)", what);
    agg(ps, nm + nj, "sub", all, "%s: a subgroup of ranks 1, 3 and 5 made "
        "from the grown world takes an allreduce", what);
    agg(ps, nm + nj, "trace", all, "%s: the flight recorder holds the grown "
        "world's operations under its prefix", what);
    agg(ps, nm + nj, "transfer", 0x31, "%s: rank 0's state reaches both "
        "joiners", what);
    {
      int r4 = -1, r5 = -1, okv;
      char det[512];
      find_check(ps, nm + nj, 4, "grew", &okv, det, sizeof(det));
      if (strstr(det, "rank 4 of")) r4 = 4;
      if (strstr(det, "rank 5 of")) r4 = 5;
      find_check(ps, nm + nj, 5, "grew", &okv, det, sizeof(det));
      if (strstr(det, "rank 4 of")) r5 = 4;
      if (strstr(det, "rank 5 of")) r5 = 5;
      ok(r4 + r5 == 9 && r4 != r5, "%s: the joiners took ranks 4 and 5 "
         "(%d, %d)", what, r4, r5);
    }
  } else if (strcmp(role, "kill0") == 0) {
    agg(ps, nm + nj, "grew", all & ~1u, "%s: ranks 1-3 shrink, then grow "
        "back to 4 with the replacement", what);
    agg(ps, nm + nj, "kept", members & ~1u, "%s: the members' connections "
        "kept; every peer through shared memory", what);
    agg(ps, nm + nj, "after", all & ~1u, "%s: allreduce of the four", what);
  } else if (strcmp(role, "joinerdies") == 0) {
    agg(ps, nm + nj, "grew", members, "%s: every member fails the grow, no "
        "hang", what);
    agg(ps, nm + nj, "after", members, "%s: the old world still works",
        what);
  } else if (strcmp(role, "memberdies") == 0) {
    agg(ps, nm + nj, "grew", all & ~8u, "%s: the other members fail the "
        "agreement naming rank 3; the joiner fails too", what);
  } else if (strcmp(role, "stranger") == 0) {
    agg(ps, nm + nj, "grew", all, "%s: refused (UVCCL_EAUTH)", what);
  } else if (strcmp(role, "midgrow") == 0) {
    agg(ps, nm + nj, "grew", all & ~8u, "%s: every other member fails the "
        "grow naming rank 3, the late joiner fails too, none hangs", what);
    agg(ps, nm + nj, "after", all & ~8u, "%s: the members shrink the old "
        "world to 3 and allreduce over it", what);
  } else if (strcmp(role, "reconf") == 0) {
    agg(ps, nm + nj, "grew", all, "%s: rank 1 gets no world; 0, 2, 3 become "
        "0, 1, 2, the joiner 3, epoch 1", what);
    agg(ps, nm + nj, "kept", members, "%s: the staying members' connections "
        "kept, the joiner through shared memory", what);
    agg(ps, nm + nj, "after", all, "%s: an allreduce of the new four", what);
  } else if (strcmp(role, "reconfdie") == 0) {
    agg(ps, nm + nj, "grew", all & ~2u, "%s: 0, 2, 3 become 0, 1, 2 and the "
        "late joiner 3 all the same", what);
    agg(ps, nm + nj, "after", all & ~2u, "%s: an allreduce of the new four",
        what);
  } else if (strcmp(role, "reconfbad") == 0) {
    agg(ps, nm + nj, "grew", all, "%s: every member fails at the agreement "
        "(UV_EINVAL, naming the leave lists), the joiner at its deadline",
        what);
    agg(ps, nm + nj, "after", all, "%s: the old world still works", what);
  } else if (strcmp(role, "chain") == 0) {
    agg(ps, nm + nj, "grew", all & ~0xcu, "%s: ranks 0 and 1 shrink twice, "
        "then grow to 4 with two joiners (ranks kept, epoch 1)", what);
    agg(ps, nm + nj, "kept", 3u, "%s: the members' connections kept; every "
        "peer through shared memory", what);
    agg(ps, nm + nj, "after", all & ~0xcu, "%s: allreduce of the four",
        what);
  }
  for (r = 0; r < nm + nj; r++) {
    int may_die = (strcmp(role, "kill0") == 0 && r == 0) ||
                  (strcmp(role, "memberdies") == 0 && r == 3) ||
                  (strcmp(role, "midgrow") == 0 && r == 3) ||
                  (strcmp(role, "reconfdie") == 0 && r == 1) ||
                  (strcmp(role, "joinerdies") == 0 && r >= nm) ||
                  (strcmp(role, "chain") == 0 && (r == 2 || r == 3));
    if (ps[r].status != 0 && !(may_die && ps[r].status == 128 + SIGKILL))
      clean = 0;
  }
  ok(clean, "%s: every other process exited 0", what);
  if (scenario_failed || !clean) dump_procs(ps, nm + nj);
  procs_free(ps, nm + nj);
  kill(server.pid, SIGTERM);
  finish_all(&server, 1, 5);
  procs_free(&server, 1);
}

/* h): the store in namespace 0 (served by this program, role nsstore:
 * it becomes uvccl-store), ranks 0 and 1 there, ranks 2 and 3 and the
 * joiner in namespace 1. */
#define NS_TESTS 6
static void ns_scenario(void) {
  proc_t ps[5], st;
  char err[256];
  const char *what = "h) across hosts";
  const char *extra[] = {"TORCHELASTIC_USE_AGENT_STORE=True",
                         "UVCCL_AUTH_TOKEN=" SECRET, NULL, NULL, NULL};
  int r, clean = 1;
  if (ns_prepare(2, err, sizeof(err)) != 0) {
    skip(NS_TESTS, "%s", err);
    return;
  }
  if (ns_setup(err, sizeof(err)) != 0) {
    ns_cleanup();
    skip(NS_TESTS, "cannot build the network namespaces: %s", err);
    return;
  }
  scenario_failed = 0;
  ns_spawn_rank_in(&st, 0, 4, 0, "nsstore", extra);
  sleep_ms(300);
  for (r = 0; r < 5; r++) {
    static char id[5][32];
    snprintf(id[r], sizeof(id[r]), "UVCCL_T_ID=%d", r);
    extra[2] = id[r];
    extra[3] = r == 4 ? "UVCCL_T_JOINER=1" : NULL;
    if (ns_spawn_rank_in(&ps[r], r, 4, r < 2 ? 0 : 1, "nsgrow", extra) != 0)
      note("spawning %d in its namespace failed", r);
  }
  finish_all(ps, 5, 90);
  agg(ps, 5, "grew", 0x17, "%s: ranks 0-2 (hosts of 2 and 1) grow back to "
      "4 with a joiner on host B", what);
  agg(ps, 5, "kept", 0x17, "%s: the members' connections kept; shared "
      "memory within a host, TCP across", what);
  agg(ps, 5, "after", 0x17, "%s: a 4 B allreduce of the four", what);
  agg(ps, 5, "big", 0x17, "%s: a 2 MiB allreduce and allgather, every "
      "value right", what);
  for (r = 0; r < 5; r++)
    if (ps[r].status != 0 && !(r == 3 && ps[r].status == 128 + SIGKILL))
      clean = 0;
  ok(clean, "%s: every other process exited 0", what);
  if (scenario_failed || !clean) dump_procs(ps, 5);
  procs_free(ps, 5);
  kill(st.pid, SIGTERM);
  finish_all(&st, 1, 5);
  procs_free(&st, 1);
  ns_cleanup();
  ok(!ns_leftovers(), "%s: the namespaces are gone", what);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && strcmp(role, "nsstore") == 0) {
    /* inside namespace 0: become the world's store */
    static char tool[4096];
    const char *bd = getenv("UVCCL_BUILD_DIR");
    char *argv[] = {tool, (char *)"serve", (char *)"--host",
                    (char *)NET_PREFIX "1", (char *)"--port",
                    (char *)NS_MASTER_PORT, NULL};
    snprintf(tool, sizeof(tool), "%s/bin/uvccl-store",
             bd && *bd ? bd : UVCCL_BUILD_DIR);
    execv(tool, argv);
    return 127;
  }
  if (role != NULL && *role) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    sigpipe_default();
    alarm(100);
    store_port = ft_env_int("MASTER_PORT", 0);
    if (getenv("UVCCL_T_JOINER") != NULL) {
      if (strcmp(role, "stranger") == 0)
        setenv("UVCCL_AUTH_TOKEN", "not-the-secret", 1);
      return joiner_main(role);
    }
    return member_main(role);
  }
  parent_init(500);
  sigpipe_default();
  setenv("UVCCL_AUTH_TOKEN", SECRET, 1); /* the store's */
  plan(9 + 4 + 3 + 2 + 2 + 3 + 4 + 9 + 4 + 3 + 3 + NS_TESTS);
  scenario("grow", 4, 2, "a) grow 4 -> 6");
  scenario("kill0", 4, 1, "b) rank 0 replaced");
  scenario("joinerdies", 4, 1, "c) a joiner killed mid-join");
  scenario("memberdies", 4, 1, "d) a member killed before the grow");
  scenario("stranger", 0, 1, "e) a stranger");
  scenario("midgrow", 4, 1, "e2) a member killed mid-grow");
  scenario("chain", 4, 2, "f) a grow after a chain of shrinks");
  setenv("UVCCL_GROW", "anew", 1);
  scenario("anew", 4, 2, "g) grow 4 -> 6 anew (UVCCL_GROW=anew)");
  unsetenv("UVCCL_GROW");
  scenario("reconf", 4, 1, "i) leave and join in one agreement");
  scenario("reconfdie", 4, 1, "i2) the rank that left dies meanwhile");
  scenario("reconfbad", 4, 1, "j) different leave lists");
  ns_scenario();
  return done_testing();
}
