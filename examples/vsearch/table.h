/* uvccl-vsearch: the vector table and the search kernel (no I/O, no loop).
 *
 * The table is synthetic and a pure function of (seed, row id): any rank
 * can make any row, so a shard lost with its rank is remade by the
 * survivors, and a client can check a reply against GET /rows/ID. Value j
 * of row i is a uniform float in [-1, 1): the top 24 bits of
 * splitmix64(seed * 0x9E3779B97F4A7C15 + i * dim + j), times 2^-23, minus 1. */
#ifndef VSEARCH_TABLE_H
#define VSEARCH_TABLE_H

#include <stddef.h>
#include <stdint.h>

/* One candidate of a search: squared L2 distance and row id. 16 bytes, the
 * unit the ranks gather. */
typedef struct {
  float dist2;
  uint32_t pad;
  int64_t id;
} vs_cand_t;

typedef struct {
  uint64_t seed;
  int dim;            /* values per row */
  int stride;         /* dim rounded up to 4 (zero padded) */
  int64_t rows;       /* rows in the whole table */
  int64_t lo, hi;     /* this shard: rows [lo, hi) */
  float *data;        /* (hi - lo) * stride floats, 16-byte aligned */
} vs_table_t;

/* The shard of rank `rank` among `size`: contiguous, sizes differ by at
 * most one row. */
void vs_shard_range(int64_t rows, int rank, int size, int64_t *lo,
                    int64_t *hi);
/* Value j of row id. */
float vs_value(uint64_t seed, int dim, int64_t id, int j);
/* Makes the rows [lo, hi) (frees what t held). 0 or -ENOMEM. */
int vs_table_fill(vs_table_t *t, uint64_t seed, int dim, int64_t rows,
                  int64_t lo, int64_t hi);
void vs_table_free(vs_table_t *t);

/* The k nearest rows of the shard to each of nq queries (query q is
 * queries[q * stride ...], padded with zeros), by squared distance, ties
 * by id. out receives, query after query, k[q] candidates each, nearest
 * first; where the shard has fewer rows than k[q], the rest have id -1
 * and an infinite distance. */
void vs_search(const vs_table_t *t, const float *queries, int nq,
               const uint32_t *k, vs_cand_t *out);
/* Merges n sorted lists of k candidates into the k nearest (out, nearest
 * first; entries with id -1 sort last). */
void vs_merge(const vs_cand_t *const *lists, int n, uint32_t k,
              vs_cand_t *out);
/* Orders candidates: distance, then id; id -1 last. */
int vs_cand_cmp(const vs_cand_t *a, const vs_cand_t *b);

#endif
