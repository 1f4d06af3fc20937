/* uvccl_pg_transfer, the state transfer that brings a joiner up to date,
 * between real processes (env://, 4 ranks):
 *   a) rank 1 sends four buffers (9 MiB + 5 B, 1 B, none, 3 MiB) to ranks
 *      3, 0 and 2, in that chain order: every byte right on every rank,
 *      and each chunk went down the chain once (the root sent about the
 *      bytes of one copy, not three);
 *   b) rank 2's second buffer is a byte short: all four fail with
 *      UVCCL_EMISMATCH naming rank 2 and its buffer 1, before any byte
 *      moved (rank 2's first buffer keeps its old contents);
 *   c) rank 2, the middle of the chain 0 -> 2 -> 3, kills itself once the
 *      first bytes landed: the root and rank 3 fail naming rank 2, at
 *      once (no hang), and rank 1, not in it, is untouched;
 *   d) the arguments: a rank not in the transfer, the root in to, a rank
 *      twice, a bad root: UV_EINVAL at the call;
 *   e) back to back on one world, different roots and lists, tags reused:
 *      ten transfers, every byte right;
 *   f) nobody at the other end: a receiver's own timeout (the root never
 *      calls) and a root's cancel (its receiver never calls) end it.
 * And CRC-32C itself: the standard check value, and any split of a buffer
 * into pieces giving the checksum of the whole. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "ft.h"
#include "pg/checksum.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define W 4
#define MiB (1024 * 1024)

static const size_t lens[4] = {9 * MiB + 5, 1, 0, 3 * MiB};

static unsigned char pattern(size_t i, int b, int round) {
  return (unsigned char)((i * 131 + (size_t)b * 17 + (size_t)round * 7 +
                          (i >> 12)) & 0xff);
}

static unsigned char *bufs_mem[4];
static uvccl_buf_t bufs[4];

static void make_bufs(const size_t *l, int fill_round) {
  int b;
  size_t i;
  for (b = 0; b < 4; b++) {
    free(bufs_mem[b]);
    bufs_mem[b] = malloc(l[b] ? l[b] : 1);
    bufs[b].base = bufs_mem[b];
    bufs[b].len = l[b];
    for (i = 0; i < l[b]; i++)
      bufs_mem[b][i] = fill_round >= 0 ? pattern(i, b, fill_round) : 0xee;
  }
}

static size_t wrong_bytes(const size_t *l, int round) {
  size_t bad = 0, i;
  int b;
  for (b = 0; b < 4; b++)
    for (i = 0; i < l[b]; i++) bad += bufs_mem[b][i] != pattern(i, b, round);
  return bad;
}

static int transfer(uvccl_work_t *w, cbres_t *c, int root, const int *to,
                    int nto, int tag, uint64_t ms) {
  memset(w, 0, sizeof(*w));
  memset(c, 0, sizeof(*c));
  w->data = c;
  return finish_work(c, uvccl_pg_transfer(&pg, w, bufs, 4, root, to, nto, tag,
                                          on_work), ms);
}

static int in_list(const int *to, int n, int r) {
  int i;
  for (i = 0; i < n; i++)
    if (to[i] == r) return 1;
  return 0;
}

/* c: rank 2 dies once the first bytes are in (checked every loop turn:
 * one turn moves far less than the 12 MiB due) */
static uv_prepare_t watch;
static void on_watch(uv_prepare_t *h) {
  (void)h;
  if (bufs_mem[0][0] == pattern(0, 0, 0) &&
      bufs_mem[0][1] == pattern(1, 0, 0))
    raise(SIGKILL);
}

static int rank_main(const char *role) {
  uvccl_work_t w;
  cbres_t c;
  int rc;
  setvbuf(stdout, NULL, _IOLBF, 0);
  sigpipe_default();
  alarm(90);
  R = ft_env_int("RANK", -1);
  P = ft_env_int("WORLD_SIZE", 0);
  /* a: the root's loop counts the bytes it pushes; with single copy,
   * which turns itself on where it pays, a receiver copies them itself */
  if (strcmp(role, "chain") == 0) setenv("UVCCL_SHM_CMA", "0", 1);
  rank_init(20000);
  if (strcmp(role, "chain") == 0) {
    static const int to[3] = {3, 0, 2};
    uvccl_loop_stats_t st0, st1;
    make_bufs(lens, R == 1 ? 0 : -1);
    uvccl_pg_loop_stats(&pg, &st0, 0);
    rc = transfer(&w, &c, 1, to, 3, 7, 30000);
    uvccl_pg_loop_stats(&pg, &st1, 0);
    rep(rc == 0 && wrong_bytes(lens, 0) == 0, "chain",
        "rank 1 -> 3 -> 0 -> 2, 12 MiB in four buffers: %s %s, %zu wrong "
        "bytes", ename(rc), w.msg, wrong_bytes(lens, 0));
    /* the root moves its bytes about once (plus small messages), not once
     * per receiver */
    val("moved_mib", (double)(st1.bytes - st0.bytes) / MiB);
  } else if (strcmp(role, "mismatch") == 0) {
    static const int to[3] = {0, 2, 3};
    size_t l[4];
    memcpy(l, lens, sizeof(l));
    if (R == 2) l[1] = 0;
    make_bufs(l, R == 1 ? 0 : -1);
    rc = transfer(&w, &c, 1, to, 3, 7, 30000);
    rep(rc == UVCCL_EMISMATCH && strstr(w.msg, "rank 2") != NULL &&
            strstr(w.msg, "buffer 1") != NULL &&
            (R == 1 || bufs_mem[0][0] == 0xee),
        "mismatch", "%s: %s", ename(rc), w.msg);
  } else if (strcmp(role, "kill") == 0) {
    static const int to[2] = {2, 3};
    static const size_t big[4] = {8 * MiB, 1, 0, 4 * MiB};
    make_bufs(big, R == 0 ? 0 : -1);
    if (R == 2) {
      uv_prepare_init(&loop, &watch);
      uv_prepare_start(&watch, on_watch);
    }
    if (R != 1) {
      rc = transfer(&w, &c, 0, to, 2, 7, 20000);
      rep(rc != 0 && rc != UV_ETIMEDOUT && strstr(w.msg, "rank 2") != NULL,
          "kill", "rank 2 died mid-transfer: %s: %s", ename(rc), w.msg);
    }
    /* what an elastic world does next: the survivors shrink and go on */
    {
      uvccl_pg_t next;
      int32_t v = R, sum = 0;
      memset(&next, 0, sizeof(next));
      memset(&w, 0, sizeof(w));
      memset(&c, 0, sizeof(c));
      w.data = &c;
      rc = finish_work(&c, uvccl_pg_shrink(&pg, &next, &w, on_work), 20000);
      if (rc == 0) {
        memset(&w, 0, sizeof(w));
        memset(&c, 0, sizeof(c));
        w.data = &c;
        rc = finish_work(&c, uvccl_allreduce(&next, &w, &v, &sum, 1,
                                             UVCCL_INT32, UVCCL_SUM, on_work),
                         10000);
        pg_closed = 0;
        uvccl_pg_destroy(&next, on_pg_closed);
        run_until(&pg_closed, 5000);
      }
      rep(rc == 0 && sum == 0 + 1 + 3, "after", "the survivors shrink to "
          "3 and allreduce: %s %s (sum %d)", ename(rc), w.msg, (int)sum);
    }
  } else if (strcmp(role, "args") == 0) {
    static const int ok_to[2] = {2, 3}, with_root[2] = {0, 2},
                     twice[3] = {2, 3, 2};
    int bad = 0;
    make_bufs(lens, -1);
    memset(&w, 0, sizeof(w));
    if (R == 1) /* not in it */
      bad += uvccl_pg_transfer(&pg, &w, bufs, 4, 0, ok_to, 2, 1, on_work) !=
             UV_EINVAL;
    bad += uvccl_pg_transfer(&pg, &w, bufs, 4, 0, with_root, 2, 1,
                             on_work) != UV_EINVAL;
    bad += uvccl_pg_transfer(&pg, &w, bufs, 4, 0, twice, 3, 1, on_work) !=
           UV_EINVAL;
    bad += uvccl_pg_transfer(&pg, &w, bufs, 4, W, ok_to, 2, 1, on_work) !=
           UV_EINVAL;
    bad += uvccl_pg_transfer(&pg, &w, bufs, 4, 0, ok_to, 0, 1, on_work) !=
           UV_EINVAL;
    bad += uvccl_pg_transfer(&pg, &w, NULL, 4, 0, ok_to, 2, 1, on_work) !=
           UV_EINVAL;
    rep(bad == 0 && w.state != UVCCL_WORK_PENDING, "args",
        "%d bad calls not refused with UV_EINVAL", bad);
  } else if (strcmp(role, "abandon") == 0) {
    static const int to3[1] = {3}, to1[1] = {1};
    make_bufs(lens, R == 0 ? 0 : -1);
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    if (R == 3) { /* the root never comes: its own timeout */
      double t0 = now_s();
      w.timeout_ms = 300;
      rc = finish_work(&c, uvccl_pg_transfer(&pg, &w, bufs, 4, 0, to3, 1, 5,
                                             on_work), 10000);
      rep(rc == UV_ETIMEDOUT && now_s() - t0 < 5, "abandon",
          "a receiver whose root never comes: %s %s after %.2f s",
          ename(rc), w.msg, now_s() - t0);
    } else if (R == 0) { /* its receiver never comes: cancelled */
      int never = 0;
      rc = uvccl_pg_transfer(&pg, &w, bufs, 4, 0, to1, 1, 5, on_work);
      run_until(&never, 200);
      if (rc == 0) rc = uvccl_work_cancel(&w);
      rc = finish_work(&c, rc, 5000);
      rep(rc == UV_ECANCELED, "abandon", "a root whose receiver never "
          "comes, cancelled: %s %s", ename(rc), w.msg);
    } else {
      rep(1, "abandon", "(not in it)");
    }
    /* nobody leaves before the others are done */
    memset(&w, 0, sizeof(w));
    memset(&c, 0, sizeof(c));
    w.data = &c;
    rc = finish_work(&c, uvccl_barrier(&pg, &w, on_work), 10000);
    rep(rc == 0, "barrier", "the world still works after: %s %s", ename(rc),
        w.msg);
  } else { /* rounds */
    int round, bad = 0, failed = 0;
    for (round = 0; round < 10; round++) {
      int root = round % W, to[W - 1], nto = 0, r;
      for (r = 1; r < W; r++)
        if ((r + round) % 3 != 0 || nto == 0) to[nto++] = (root + r) % W;
      make_bufs(lens, R == root ? round : -1);
      if (R != root && !in_list(to, nto, R)) continue;
      rc = transfer(&w, &c, root, to, nto, 3, 30000);
      if (rc != 0) {
        failed++;
        printf("# round %d: %s %s\n", round, ename(rc), w.msg);
      }
      if (R != root) bad += wrong_bytes(lens, round) != 0;
    }
    rep(failed == 0 && bad == 0, "rounds", "ten transfers, roots and lists "
        "changing: %d failed, %d with wrong bytes", failed, bad);
  }
  return rank_destroy();
}

/* bit by bit, as the definition says */
static uint32_t crc_bits(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  int k;
  while (n--) {
    c ^= *p++;
    for (k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

static void crc_checks(void) {
  static unsigned char big[70000];
  size_t i, cut;
  uint32_t whole;
  int same = 1;
  is_int(uvccl__crc32c(0, "123456789", 9), 0xe3069283u,
         "CRC-32C of \"123456789\" is the standard check value");
  for (i = 0; i < sizeof(big); i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
  whole = uvccl__crc32c(0, big, sizeof(big));
  for (cut = 0; cut < sizeof(big); cut += 4099) {
    uint32_t c = uvccl__crc32c(0, big, cut);
    c = uvccl__crc32c(c, big + cut, 3);
    c = uvccl__crc32c(c, big + cut + 3, sizeof(big) - cut - 3);
    if (c != whole) same = 0;
  }
  ok(same, "any split into pieces gives the whole buffer's CRC-32C");
  is_int(whole, crc_bits(big, sizeof(big)), "a 70000-byte buffer (runs "
         "side by side, joined) checksums as bit by bit");
  is_int(uvccl__crc32c(0, big + 1, sizeof(big) - 1),
         crc_bits(big + 1, sizeof(big) - 1), "and from an odd address");
}

static void run_role(const char *role, const char *what) {
  proc_t ps[W];
  spawn_world(ps, W, role, 0);
  finish_all(ps, W, 80);
  scenario_failed = 0;
  agg(ps, W, "init", 0xf, "%s: world of %d up", what, W);
  if (strcmp(role, "chain") == 0) {
    double mib = -1;
    agg(ps, W, "chain", 0xf, "%s: every byte right on every rank", what);
    find_val(ps, W, 1, "moved_mib", &mib);
    ok(mib > 11.5 && mib < 14, "%s: the root moved %.1f MiB for 12 MiB to "
       "three ranks (a chain: one copy)", what, mib);
  } else if (strcmp(role, "mismatch") == 0) {
    agg(ps, W, "mismatch", 0xf, "%s: every rank fails with EMISMATCH naming "
        "rank 2's buffer 1; no byte moved", what);
  } else if (strcmp(role, "kill") == 0) {
    agg(ps, W, "kill", 0x9, "%s: the root and rank 3 fail naming rank 2, "
        "no timeout", what);
    agg(ps, W, "after", 0xb, "%s: ranks 0, 1 and 3 shrink and go on", what);
    ok(ps[2].status == 128 + SIGKILL, "%s: rank 2 died of SIGKILL (%d)",
       what, ps[2].status);
  } else if (strcmp(role, "abandon") == 0) {
    agg(ps, W, "abandon", 0xf, "%s: a timeout and a cancel end it", what);
    agg(ps, W, "barrier", 0xf, "%s: then a barrier of all four", what);
  } else if (strcmp(role, "args") == 0) {
    agg(ps, W, "args", 0xf, "%s: UV_EINVAL at the call", what);
  } else {
    agg(ps, W, "rounds", 0xf, "%s: every byte right", what);
  }
  {
    int r, clean = 1;
    for (r = 0; r < W; r++)
      if (ps[r].status != 0 && !(strcmp(role, "kill") == 0 && r == 2))
        clean = 0;
    ok(clean, "%s: every rank exited 0 (%d %d %d %d)", what, ps[0].status,
       ps[1].status, ps[2].status, ps[3].status);
    if (!clean) scenario_failed = 1;
  }
  if (scenario_failed) dump_procs(ps, W);
  procs_free(ps, W);
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  if (role != NULL && *role) return rank_main(role);
  parent_init(400);
  sigpipe_default();
  plan(4 + 3 + 2 + 4 + 2 + 2 + 3 + 6);
  crc_checks();
  run_role("chain", "a) chain of three");
  run_role("mismatch", "b) a buffer a byte short");
  run_role("kill", "c) the middle of the chain killed");
  run_role("args", "d) bad arguments");
  run_role("rounds", "e) ten in a row");
  run_role("abandon", "f) nobody at the other end");
  return done_testing();
}
