/* Subgroups (new_group, split, tagged find-or-create, rank translation,
 * non-members), point-to-point (tags, any source, batches, too-long
 * messages), byte-payload collectives, allreduce_coalesced and PREMUL_SUM,
 * on in-process worlds. */
#include "tap.h"
#include "world.h"

#include <stdlib.h>

static uv_loop_t loop;

static int wait_all(uvccl_work_t *w, int n) {
  int i, rc = 0;
  for (i = 0; i < n; i++) {
    if (w[i].state == UVCCL_WORK_IDLE) continue;
    while (!uvccl_work_done(&w[i])) uv_run(&loop, UV_RUN_ONCE);
    if (w[i].status && !rc) rc = w[i].status;
  }
  return rc;
}

static void test_subgroups(world_t *W) {
  int P = W->n, r, i, rc, bad = 0;
  static uvccl_pg_t sub[WORLD_MAX], again[WORLD_MAX], sp[WORLD_MAX],
      sp2[WORLD_MAX];
  uvccl_work_t w[WORLD_MAX];
  int odd[WORLD_MAX], nodd = 0;
  float v[WORLD_MAX];
  for (i = 1; i < P; i += 2) odd[nodd++] = i;
  /* group of the odd ranks, listed in reverse order */
  for (i = 0; i < nodd / 2; i++) {
    int t = odd[i];
    odd[i] = odd[nodd - 1 - i];
    odd[nodd - 1 - i] = t;
  }
  memset(w, 0, sizeof(w));
  for (r = 0; r < P; r++) {
    rc = uvccl_pg_new_group(&W->pg[r], &sub[r], odd, nodd, "odd");
    if (nodd == 0) {
      if (rc != UV_EINVAL) bad++;
    } else if (r % 2 == 0) {
      if (rc != UVCCL_ENOTMEMBER || sub[r].rank != -1) bad++;
    } else if (rc != 0) {
      bad++;
    }
  }
  is_int(bad, 0, "P=%d: new_group: members get a group, others ENOTMEMBER", P);
  bad = 0;
  for (r = 1; r < P; r += 2) {
    int gr = uvccl_pg_group_rank(&sub[r], r);
    if (gr != nodd - 1 - (r - 1) / 2 || uvccl_pg_global_rank(&sub[r], gr) != r)
      bad++;
    if (uvccl_pg_group_rank(&sub[r], 0) != -1) bad++;
    v[r] = (float)r;
    if (uvccl_allreduce(&sub[r], &w[r], &v[r], &v[r], 1, UVCCL_FLOAT32,
                        UVCCL_SUM, NULL) != 0)
      bad++;
  }
  rc = wait_all(w, P);
  for (r = 1; r < P; r += 2)
    if (v[r] != (float)(nodd * nodd)) bad++; /* 1 + 3 + ... */
  is_int(rc, 0, "P=%d: allreduce on the subgroup", P);
  is_int(bad, 0, "P=%d: subgroup ranks translate, sum of odd ranks exact", P);
  /* find-or-create by tag */
  bad = 0;
  for (r = 0; r < P && nodd > 0; r++) {
    rc = uvccl_pg_new_group(&W->pg[r], &again[r], odd, nodd, "odd");
    if (r % 2 && (rc != 0 || again[r].impl_ != sub[r].impl_)) bad++;
  }
  is_int(bad, 0, "P=%d: the same tag and ranks give the existing group", P);
  if (nodd > 0)
    for (r = 1; r < P; r += 2) uvccl_pg_destroy(&again[r], NULL);
  /* split by parity, key = -rank (reverse order) */
  memset(w, 0, sizeof(w));
  for (r = 0; r < P; r++)
    uvccl_pg_split(&W->pg[r], &sp[r], r % 2, -r, &w[r], NULL);
  rc = wait_all(w, P);
  is_int(rc, 0, "P=%d: split", P);
  bad = 0;
  for (r = 0; r < P; r++) {
    int n = (P + 1 - r % 2) / 2;
    if (sp[r].size != n) bad++;
    /* key -r: highest parent rank first */
    if (uvccl_pg_global_rank(&sp[r], 0) != (r % 2 ? (P % 2 ? P - 2 : P - 1)
                                                  : (P % 2 ? P - 1 : P - 2)))
      bad++;
    v[r] = 1.0f;
    uvccl_allreduce(&sp[r], &w[r], &v[r], &v[r], 1, UVCCL_FLOAT32, UVCCL_SUM,
                    NULL);
  }
  rc = wait_all(w, P);
  for (r = 0; r < P; r++)
    if (v[r] != (float)sp[r].size) bad++;
  is_int(rc, 0, "P=%d: allreduce on split groups", P);
  is_int(bad, 0, "P=%d: split sizes, key order, sums", P);
  /* color < 0 joins nothing */
  for (r = 0; r < P; r++)
    uvccl_pg_split(&W->pg[r], &sp2[r], r == 0 ? -1 : 0, 0, &w[r], NULL);
  wait_all(w, P);
  is_int(w[0].status, UVCCL_ENOTMEMBER, "P=%d: split with color -1: ENOTMEMBER", P);
  bad = 0;
  for (r = 1; r < P; r++)
    if (w[r].status != 0 || sp2[r].size != P - 1 || sp2[r].rank != r - 1) bad++;
  is_int(bad, 0, "P=%d: the others form a group without rank 0", P);
  for (r = 0; r < P; r++) uvccl_pg_destroy(&sp[r], NULL);
  for (r = 1; r < P; r++) uvccl_pg_destroy(&sp2[r], NULL);
  if (nodd > 0)
    for (r = 1; r < P; r += 2) uvccl_pg_destroy(&sub[r], NULL);
}

/* Messages that arrive before their receives wait in stage buffers, which
 * the transport keeps and reuses (net.c, early_alloc): three rounds of
 * five sizes, each round's a little smaller (so it lands in larger buffers
 * than it needs), received in reverse order into larger buffers; every one
 * must come back with its own length and bytes, nothing past them. */
static void test_early_arrivals(world_t *W) {
  static const size_t full[5] = {1 << 20, 65536, 300000, 20000,
                                 (1 << 20) - 3};
  size_t sizes[5];
  static unsigned char out[5][1 << 20], in[5][1 << 20];
  uvccl_work_t sw[5], rw[5];
  int round, i, rc = 0, bad = 0;
  for (round = 0; round < 3; round++) {
    memset(sw, 0, sizeof(sw));
    memset(rw, 0, sizeof(rw));
    for (i = 0; i < 5; i++) {
      size_t k;
      sizes[i] = full[i] - (size_t)round * 4099;
      for (k = 0; k < sizes[i]; k++)
        out[i][k] = (unsigned char)(k * 7 + (size_t)i * 31 + (size_t)round);
      rc |= uvccl_send(&W->pg[1], &sw[i], out[i], sizes[i], 0,
                       (uint32_t)(20 + i), NULL);
    }
    rc |= wait_all(sw, 5); /* all read (staged) by rank 0 by now */
    for (i = 4; i >= 0; i--) {
      memset(in[i], 0xee, sizeof(in[i]));
      rc |= uvccl_recv(&W->pg[0], &rw[i], in[i], sizeof(in[i]), 1,
                       (uint32_t)(20 + i), NULL);
    }
    rc |= wait_all(rw, 5);
    for (i = 0; i < 5; i++)
      if (rw[i].value_len != sizes[i] ||
          memcmp(in[i], out[i], sizes[i]) != 0 ||
          (sizes[i] < sizeof(in[i]) && in[i][sizes[i]] != 0xee))
        bad++;
  }
  is_int(rc, 0, "P=%d: early arrivals, 3 rounds of 5 sizes", W->n);
  is_int(bad, 0, "P=%d: each received with its own length and bytes", W->n);
}

static void test_p2p(world_t *W) {
  int P = W->n, r, bad = 0, rc;
  uvccl_work_t ws[WORLD_MAX][4];
  char out[WORLD_MAX][4][64];
  static char big[WORLD_MAX][300000];
  if (P < 2) return;
  memset(ws, 0, sizeof(ws));
  /* rank 0 receives from any source, tag 7, P-1 times; everyone else sends */
  for (r = 1; r < P; r++) {
    snprintf(out[r][0], 64, "hello from %d", r);
    uvccl_send(&W->pg[r], &ws[r][0], out[r][0], strlen(out[r][0]) + 1, 0, 7,
               NULL);
  }
  {
    uvccl_work_t rw[WORLD_MAX];
    char in[WORLD_MAX][64];
    int seen[WORLD_MAX] = {0};
    memset(rw, 0, sizeof(rw));
    for (r = 1; r < P; r++)
      uvccl_recv(&W->pg[0], &rw[r], in[r], 64, UVCCL_ANY_SOURCE, 7, NULL);
    rc = wait_all(rw, P);
    rc |= wait_all(&ws[0][0], 1);
    for (r = 1; r < P; r++) {
      int src = (int)rw[r].result;
      char want[64];
      snprintf(want, 64, "hello from %d", src);
      if (src < 1 || src >= P || seen[src]++ || strcmp(in[r], want) ||
          rw[r].value_len != strlen(want) + 1)
        bad++;
    }
    for (r = 1; r < P; r++) wait_all(&ws[r][0], 1);
    is_int(rc, 0, "P=%d: any-source receives", P);
    is_int(bad, 0, "P=%d: every sender seen once, with its bytes and length", P);
  }
  /* tags keep order per (sender, tag); a large message straight into place */
  bad = 0;
  uvccl_send(&W->pg[1], &ws[1][0], "A", 1, 0, 1, NULL);
  uvccl_send(&W->pg[1], &ws[1][1], "B", 1, 0, 2, NULL);
  uvccl_send(&W->pg[1], &ws[1][2], "C", 1, 0, 1, NULL);
  memset(big[1], 0x5a, sizeof(big[1]));
  uvccl_send(&W->pg[1], &ws[1][3], big[1], sizeof(big[1]), 0, 9, NULL);
  {
    uvccl_work_t rw[4];
    char a[4] = {0}, b[4] = {0}, c[4] = {0};
    memset(rw, 0, sizeof(rw));
    uvccl_recv(&W->pg[0], &rw[0], b, 4, 1, 2, NULL);
    uvccl_recv(&W->pg[0], &rw[1], big[0], sizeof(big[0]), 1, 9, NULL);
    uvccl_recv(&W->pg[0], &rw[2], a, 4, 1, 1, NULL);
    uvccl_recv(&W->pg[0], &rw[3], c, 4, 1, 1, NULL);
    rc = wait_all(rw, 4) | wait_all(ws[1], 4);
    if (a[0] != 'A' || b[0] != 'B' || c[0] != 'C') bad++;
    if (memcmp(big[0], big[1], sizeof(big[0])) != 0) bad++;
    is_int(rc, 0, "P=%d: tagged sends and receives", P);
    is_int(bad, 0, "P=%d: per-tag order kept, 300 KB message intact", P);
  }
  /* a message longer than the receive buffer */
  {
    uvccl_work_t rw = {0};
    char small[4];
    uvccl_send(&W->pg[1], &ws[1][0], "toolong", 7, 0, 3, NULL);
    uvccl_recv(&W->pg[0], &rw, small, 4, 1, 3, NULL);
    wait_all(&rw, 1);
    wait_all(ws[1], 1);
    is_int(rw.status, UVCCL_ELIMIT, "P=%d: too-long message: UVCCL_ELIMIT", P);
    ok(strstr(rw.msg, "rank 1") != NULL, "message names the sender: %s", rw.msg);
  }
  /* batch: ring exchange */
  {
    uvccl_p2p_op_t ops[WORLD_MAX][2];
    int sendv[WORLD_MAX], recvv[WORLD_MAX];
    uvccl_work_t bw[WORLD_MAX];
    memset(bw, 0, sizeof(bw));
    bad = 0;
    for (r = 0; r < P; r++) {
      sendv[r] = r * 11;
      ops[r][0] = (uvccl_p2p_op_t){1, &sendv[r], 4, (r + 1) % P, 0, 0, 0};
      ops[r][1] = (uvccl_p2p_op_t){0, &recvv[r], 4, (r + P - 1) % P, 0, 0, 0};
      uvccl_p2p_batch(&W->pg[r], &bw[r], ops[r], 2, NULL);
    }
    rc = wait_all(bw, P);
    for (r = 0; r < P; r++)
      if (recvv[r] != ((r + P - 1) % P) * 11 || ops[r][1].received != 4 ||
          ops[r][1].source != (r + P - 1) % P)
        bad++;
    is_int(rc, 0, "P=%d: batched send/recv", P);
    is_int(bad, 0, "P=%d: batch results and sources", P);
  }
  test_early_arrivals(W);
  ok(uvccl_send(&W->pg[0], &ws[0][0], "x", 1, 0, 0, NULL) == UV_EINVAL,
     "send to self refused");
  ok(uvccl_recv(&W->pg[0], &ws[0][0], out[0][0], 1, P, 0, NULL) == UV_EINVAL,
     "bad source refused");
}

static void test_bytes(world_t *W) {
  int P = W->n, r, q, bad = 0, rc;
  uvccl_work_t w[WORLD_MAX];
  char msg[WORLD_MAX][64];
  memset(w, 0, sizeof(w));
  for (r = 0; r < P; r++) {
    snprintf(msg[r], 64, "rank-%d%.*s", r, r * 5, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    uvccl_broadcast_bytes(&W->pg[r], &w[r], msg[r], strlen(msg[r]), P - 1, NULL);
  }
  rc = wait_all(w, P);
  for (r = 0; r < P; r++)
    if (w[r].value_len != strlen(msg[P - 1]) ||
        memcmp(w[r].value, msg[P - 1], w[r].value_len))
      bad++;
  is_int(rc, 0, "P=%d: broadcast_bytes", P);
  for (r = 0; r < P; r++)
    uvccl_allgather_bytes(&W->pg[r], &w[r], msg[r], strlen(msg[r]), NULL);
  rc = wait_all(w, P);
  for (r = 0; r < P; r++) {
    if (w[r].nvalues != (size_t)P) { bad++; continue; }
    for (q = 0; q < P; q++)
      if (w[r].values[q].len != strlen(msg[q]) ||
          memcmp(w[r].values[q].base, msg[q], strlen(msg[q])))
        bad++;
  }
  is_int(rc, 0, "P=%d: allgather_bytes", P);
  for (r = 0; r < P; r++)
    uvccl_gather_bytes(&W->pg[r], &w[r], msg[r], strlen(msg[r]), 0, NULL);
  rc = wait_all(w, P);
  for (q = 0; q < P; q++)
    if (w[0].nvalues != (size_t)P || w[0].values[q].len != strlen(msg[q]) ||
        memcmp(w[0].values[q].base, msg[q], strlen(msg[q])))
      bad++;
  for (r = 1; r < P; r++)
    if (w[r].nvalues != 0) bad++;
  is_int(rc, 0, "P=%d: gather_bytes", P);
  {
    uvccl_buf_t bufs[WORLD_MAX];
    for (q = 0; q < P; q++) bufs[q] = (uvccl_buf_t){msg[q], strlen(msg[q])};
    for (r = 0; r < P; r++)
      uvccl_scatter_bytes(&W->pg[r], &w[r], r == 0 ? bufs : NULL,
                          r == 0 ? (size_t)P : 0, 0, NULL);
    rc = wait_all(w, P);
    for (r = 0; r < P; r++)
      if (w[r].value_len != strlen(msg[r]) ||
          memcmp(w[r].value, msg[r], w[r].value_len))
        bad++;
    is_int(rc, 0, "P=%d: scatter_bytes", P);
  }
  is_int(bad, 0, "P=%d: byte collectives deliver every payload exactly", P);
  for (r = 0; r < P; r++) uvccl_work_cleanup(&w[r]);
}

static void test_coalesced_premul(world_t *W) {
  int P = W->n, r, bad = 0, rc;
  uvccl_work_t w[WORLD_MAX];
  static double a[WORLD_MAX][10], b[WORLD_MAX][30000], c[WORLD_MAX][3];
  memset(w, 0, sizeof(w));
  for (r = 0; r < P; r++) {
    uvccl_buf_t bufs[3] = {{a[r], sizeof(a[r])}, {b[r], sizeof(b[r])},
                           {c[r], sizeof(c[r])}};
    uvccl_redop_t op;
    size_t i;
    for (i = 0; i < 10; i++) a[r][i] = r + (double)i;
    for (i = 0; i < 30000; i++) b[r][i] = 2 * r;
    for (i = 0; i < 3; i++) c[r][i] = 1;
    uvccl_pg_premul_sum(&W->pg[r], 0.5, &op);
    rc = uvccl_allreduce_coalesced(&W->pg[r], &w[r], bufs, 3, UVCCL_FLOAT64,
                                   op, NULL);
    if (rc) bad++;
  }
  rc = wait_all(w, P);
  for (r = 0; r < P; r++) {
    size_t i;
    for (i = 0; i < 10; i++)
      if (a[r][i] != 0.5 * (P * (P - 1) / 2 + P * (double)i)) bad++;
    for (i = 0; i < 30000; i++)
      if (b[r][i] != 0.5 * P * (P - 1)) bad++;
    for (i = 0; i < 3; i++)
      if (c[r][i] != 0.5 * P) bad++;
  }
  is_int(rc, 0, "P=%d: allreduce_coalesced with PREMUL_SUM(0.5)", P);
  is_int(bad, 0, "P=%d: every buffer reduced and scaled in place", P);
  ok(uvccl_allreduce(&W->pg[0], &w[0], a[0], a[0], 1, UVCCL_FLOAT64,
                     UVCCL_PREMUL_SUM, NULL) == UV_EINVAL,
     "PREMUL_SUM without a factor refused");
  ok(uvccl_allreduce(&W->pg[0], &w[0], a[0], a[0], 1, UVCCL_FLOAT64,
                     (uvccl_redop_t)0x1234, NULL) == UV_EINVAL,
     "unknown op id refused");
  ok(uvccl_broadcast(&W->pg[0], &w[0], a[0], 1, UVCCL_FLOAT64, P, NULL) ==
         UV_EINVAL,
     "bad root refused");
}

/* A world whose ranks bind and advertise ::1: addresses in the store,
 * hellos and messages are IPv6 ("[::1]:port"), and a ring-sized
 * allreduce and an allgather come back exact. */
static void test_ipv6(void) {
  world_t W;
  uvccl_pg_options_t o;
  uv_tcp_t probe;
  struct sockaddr_in6 a6;
  int P = 3, r, rc, bad = 0;
  size_t n = 50000, i;
  float *buf[3], *all[3];
  uv_ip6_addr("::1", 0, &a6);
  uv_tcp_init(&loop, &probe);
  rc = uv_tcp_bind(&probe, (const struct sockaddr *)&a6, 0);
  uv_close((uv_handle_t *)&probe, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (rc != 0) {
    skip(3, "no IPv6 loopback here (%s)", uvccl_strerror(rc));
    return;
  }
  memset(&o, 0, sizeof(o));
  o.host = "::1";
  o.family = AF_INET6;
  is_int(world_init(&W, &loop, P, &o), 0, "IPv6 world of %d on ::1", P);
  for (r = 0; r < P; r++) {
    const char *a = uvccl_pg_peer_address(&W.pg[r], (r + 1) % P);
    if (a == NULL || strncmp(a, "[::1]:", 6) != 0) {
      bad++;
      printf("# rank %d sees peer at %s\n", r, a ? a : "(null)");
    }
    buf[r] = malloc(n * sizeof(float));
    all[r] = malloc(P * sizeof(float));
    for (i = 0; i < n; i++) buf[r][i] = (float)(r + 1) * (float)(i % 7);
    uvccl_allreduce(&W.pg[r], &W.w[r], buf[r], buf[r], n, UVCCL_FLOAT32,
                    UVCCL_SUM, NULL);
  }
  rc = world_wait(&W);
  for (r = 0; r < P; r++)
    for (i = 0; i < n; i++)
      if (buf[r][i] != 6.0f * (float)(i % 7)) bad++;
  {
    float mine[3];
    for (r = 0; r < P; r++) {
      mine[r] = (float)(10 * r);
      uvccl_allgather(&W.pg[r], &W.w[r], &mine[r], all[r], 1, UVCCL_FLOAT32,
                      NULL);
    }
    if (world_wait(&W) != 0) bad++;
    for (r = 0; r < P; r++)
      for (i = 0; i < (size_t)P; i++)
        if (all[r][i] != (float)(10 * i)) bad++;
  }
  is_int(rc, 0, "IPv6: allreduce of %zu floats completes", n);
  is_int(bad, 0, "IPv6: peers at [::1]:port, results exact");
  for (r = 0; r < P; r++) {
    free(buf[r]);
    free(all[r]);
  }
  world_destroy(&W);
}

/* float8 moves but never reduces: broadcast and allgather bring every byte
 * (all 256 patterns) back exact; every reduction is refused at the call. */
static void test_float8(world_t *W) {
  int P = W->n, r, d, o, bad = 0, refused = 0;
  unsigned char src[256], *out[WORLD_MAX];
  for (r = 0; r < 256; r++) src[r] = (unsigned char)r;
  for (d = UVCCL_FLOAT8_E4M3; d <= UVCCL_FLOAT8_E5M2; d++) {
    for (r = 0; r < P; r++) {
      out[r] = malloc(256 * (size_t)P);
      memset(out[r], 0, 256 * (size_t)P);
      if (r == 1 % P) memcpy(out[r], src, 256);
      uvccl_broadcast(&W->pg[r], &W->w[r], out[r], 256, (uvccl_dtype_t)d,
                      1 % P, NULL);
    }
    if (world_wait(W) != 0) bad++;
    for (r = 0; r < P; r++)
      if (memcmp(out[r], src, 256) != 0) bad++;
    for (r = 0; r < P; r++)
      uvccl_allgather(&W->pg[r], &W->w[r], src, out[r], 256,
                      (uvccl_dtype_t)d, NULL);
    if (world_wait(W) != 0) bad++;
    for (r = 0; r < P; r++) {
      int q;
      for (q = 0; q < P; q++)
        if (memcmp(out[r] + 256 * q, src, 256) != 0) bad++;
      free(out[r]);
    }
    for (o = 0; o < UVCCL_REDOP_COUNT; o++) {
      uvccl_work_t w = {0};
      unsigned char b[4] = {0};
      if (uvccl_allreduce(&W->pg[0], &w, b, b, 4, (uvccl_dtype_t)d,
                          (uvccl_redop_t)o, NULL) == UV_EINVAL &&
          uvccl_redop_check((uvccl_redop_t)o, (uvccl_dtype_t)d) == UV_EINVAL)
        refused++;
    }
  }
  is_int(bad, 0, "P=%d: float8 broadcast and allgather, every byte exact", P);
  is_int(refused, 2 * UVCCL_REDOP_COUNT,
         "P=%d: every reduction on float8 refused at the call", P);
}

int main(void) {
  world_t W;
  int P;
  tap_alarm(300);
  uv_loop_init(&loop);
  for (P = 1; P <= 6; P++) {
    is_int(world_init(&W, &loop, P, NULL), 0, "world of %d", P);
    test_subgroups(&W);
    test_p2p(&W);
    test_bytes(&W);
    test_coalesced_premul(&W);
    test_float8(&W);
    world_destroy(&W);
  }
  test_ipv6();
  is_int(uv_loop_close(&loop), 0, "loop closes cleanly");
  done_testing();
}
