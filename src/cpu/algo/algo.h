/* The collectives, as schedules (see sched.c), one family a file:
 * allreduce.c, reduce_scatter.c, rooted.c (broadcast, reduce), gather.c
 * (allgather(v), gather, scatter), alltoall.c, barrier.c, p2p.c; byte
 * payloads in algo_bytes.c; what they share, here. Each builder only says who
 * sends what to whom and what waits for what; the executor does the rest.
 *
 * Choices (P ranks, S bytes; thresholds are per group, see
 * uvccl_pg_options_t):
 *  - allreduce: recursive doubling for S <= small_max (a direct exchange
 *    at P = 2; non-powers of two fold the extra ranks in first, as in
 *    Thakur et al. 2005), across hosts alike among the hosts' leaders
 *    only; a ring reduce-scatter + allgather above, every chunk cut in
 *    segments so the two phases pipeline, across hosts alike in two
 *    levels (ring.c).
 *  - reduce_scatter: a ring, natively (never P allreduces).
 *  - broadcast: binomial tree for small S (across hosts alike, one tree
 *    across the hosts and one in each), a pipelined chain for large
 *    (across hosts alike, one chain across the hosts for each place in a
 *    host, each with its part of the buffer, passed on within the host).
 *  - reduce: the mirror image.
 *  - allgather(v): Bruck (log2 P rounds) for small totals at P > 2, else a
 *    ring, segmented.
 *  - alltoall(v), gather, scatter: every transfer posted at once.
 *  - barrier: dissemination, ceil(log2 P) rounds of empty messages;
 *    across hosts alike, an empty allreduce through the leaders.
 * Tags only need to be unique per (peer, direction) within one operation;
 * each builder numbers its messages explicitly. */
#ifndef UVCCL_CPU_ALGO_ALGO_H
#define UVCCL_CPU_ALGO_ALGO_H

#include "cpu/internal.h"

#include <stdio.h>

#define NONE UINT32_MAX

static inline int mod(int a, int p) { return ((a % p) + p) % p; }

static inline uint32_t nseg_for(size_t bytes, size_t segment) {
  size_t n = segment ? (bytes + segment - 1) / segment : 1;
  if (n == 0) n = 1;
  if (n > 65536) n = 65536;
  return (uint32_t)n;
}

/* A NOP that waits for `a` (and later whatever is added). */
static inline uint32_t join(sched_t *s, uint32_t a) {
  uint32_t j = uvccl__sop_nop(s);
  uvccl__sop_dep(s, a, j);
  return j;
}

/* AVG and PREMUL_SUM: buf[0..n) scaled once, after `last`; returns the
 * op that ends it (last itself for the other reductions). */
static inline uint32_t then_scale(sched_t *s, char *buf, size_t n,
                                  uint32_t last) {
  uint32_t sc;
  if (s->divisor <= 1 && s->scale == 1.0) return last;
  sc = uvccl__sop_scale(s, buf, n);
  uvccl__sop_dep(s, last, sc);
  return sc;
}

static inline int check_count(size_t count, size_t esize, const void *p) {
  if (esize == 0) return UV_EINVAL;
  if (count > SIZE_MAX / esize / 64) return UV_EINVAL;
  if (count > 0 && p == NULL) return UV_EINVAL;
  return 0;
}

static inline int check_root(const group_t *g, int root) {
  return root >= 0 && root < g->size ? 0 : UV_EINVAL;
}

/* Segment k of a block of n elements cut in nseg pieces. */
static inline void seg_range(size_t n, uint32_t nseg, uint32_t k, size_t *off,
                      size_t *len) {
  size_t per = (n + nseg - 1) / nseg;
  size_t a = (size_t)k * per, b = a + per;
  if (a > n) a = n;
  if (b > n) b = n;
  *off = a;
  *len = b - a;
}

/* A transfer of len bytes cut in segment-sized frames (tags 0..n-1): one
 * huge frame per peer moved at half the speed of the segmented rings. Both
 * sides cut the same length the same way. */
static inline void send_segs(sched_t *s, int to, const void *buf, size_t len) {
  uint32_t n = nseg_for(len, s->g->segment), k;
  size_t o, l;
  for (k = 0; k < n; k++) {
    seg_range(len, n, k, &o, &l);
    uvccl__sop_send(s, to, k, (const char *)buf + o, l);
  }
}

static inline void recv_segs(sched_t *s, int from, void *buf, size_t len) {
  uint32_t n = nseg_for(len, s->g->segment), k;
  size_t o, l;
  for (k = 0; k < n; k++) {
    seg_range(len, n, k, &o, &l);
    uvccl__sop_recv(s, from, k, (char *)buf + o, l);
  }
}

/* A ring (or chain) over the group, in the order ring.c chooses: P
 * positions, R[position] = group rank (NULL: rank order), this rank at
 * position q, its neighbours' group ranks. Builders count steps in
 * positions and name peers and blocks by ring_at. */
typedef struct {
  int P, q, left, right;
  const int *R;
} ring_t;

static inline int ring_at(const ring_t *x, int pos) {
  pos = mod(pos, x->P);
  return x->R != NULL ? x->R[pos] : pos;
}

void uvccl__ring_of(group_t *g, ring_t *x);
/* Hierarchical collectives (allreduce.c, gather.c): how many segments a
 * rank's crossing of the hosts may run ahead of its left neighbour's in
 * the host. */
#define CROSS_AHEAD 2
/* Hosts alike: 1 with the ring of this rank's host and the ring across
 * the hosts at its place (see ring.c); else 0. */
int uvccl__ring_hosts(group_t *g, ring_t *in_host, ring_t *across);
/* After uvccl__ring_hosts said 1: the columns, L of H group ranks (column
 * i: the rank at place i of every host, hosts in ring order). */
const int *uvccl__ring_columns(const group_t *g);
/* Hosts of any sizes, two or more, one of them with two ranks or more: 1
 * with the ring of this rank's host (its leader, the host's first rank in
 * the ring's order, at position 0) and the ring of the hosts' leaders
 * (hosts in ring order; this rank's host at its position, as for a
 * member); else 0. */
int uvccl__ring_leaders(group_t *g, ring_t *in_host, ring_t *leaders);
/* After uvccl__ring_leaders said 1: where each host's ranks begin in the
 * ring (uvccl__ring_of), H + 1 positions, the last the group's size;
 * runs[1] - runs[0] ... the hosts' sizes. */
const int *uvccl__ring_lead_runs(const group_t *g);
/* After uvccl__ring_leaders said 1 (H hosts): 1 where every host has two
 * ranks or more. Only then do the leaders' allgather and reduce_scatter
 * carry less than one ring: with a host of one rank, that host's link
 * carries as much either way. */
static inline int uvccl__ring_lead_pairs(const group_t *g, int H) {
  const int *runs = uvccl__ring_lead_runs(g);
  int h;
  for (h = 0; h < H; h++)
    if (runs[h + 1] - runs[h] < 2) return 0;
  return 1;
}
/* 1: the group's ranks are on more than one host (all known); else 0. */
int uvccl__ring_spans_hosts(const group_t *g);

/* A chain of P ranks moves nseg segments in nseg + P - 2 segment times,
 * so with few segments a link idles while the chain fills (1 MiB in two
 * segments across 4 hosts: 43% over the link's time, bench/RESULTS.md).
 * Across hosts, where links are what limits it, a chain cuts at least 8
 * segments a hop, none under CHAIN_SEG_MIN; within a host (loopback or
 * shared memory) each segment costs CPU and a wake-up and the fill is
 * short, so the segment stays as configured. Alike on every rank: the
 * hosts are known to all (ring.c). */
#define CHAIN_SEG_MIN 32768
static inline uint32_t chain_nseg_hops(const group_t *g, size_t bytes,
                                       int hops) {
  uint32_t n = nseg_for(bytes, g->segment);
  size_t want = 8 * (size_t)(hops > 1 ? hops : 1),
         most = bytes / CHAIN_SEG_MIN;
  if (!uvccl__ring_spans_hosts(g)) return n;
  if (want > most) want = most;
  if (want > 65536) want = 65536;
  return n > want ? n : (uint32_t)want;
}
static inline uint32_t chain_nseg(const group_t *g, size_t bytes) {
  return chain_nseg_hops(g, bytes, g->size - 1);
}

/* Shared by the families (allreduce.c). */
/* Hosts of any sizes (uvccl__ring_leaders), small: through each host's
 * leader and recursive doubling among the leaders; NONE, having added
 * nothing, where the ranks are not on several hosts so. */
uint32_t uvccl__algo_allreduce_hosts(sched_t *s, char *buf, size_t n,
                                     uint32_t dep0);
uint32_t uvccl__algo_allreduce_tree(sched_t *s, char *buf, size_t n,
                                    uint32_t dep0);
int uvccl__algo_box_fits(const group_t *g, size_t n);

#endif
