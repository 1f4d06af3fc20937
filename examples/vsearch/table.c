/* uvccl-vsearch: the synthetic table and the brute-force search kernel. */
#include "table.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float vs_value(uint64_t seed, int dim, int64_t id, int j)
{
  uint64_t h = splitmix64(seed * 0x9E3779B97F4A7C15ull +
                          (uint64_t) id * (uint64_t) dim + (uint64_t) j);
  return (float) (h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

void vs_shard_range(int64_t rows, int rank, int size, int64_t *lo,
                    int64_t *hi)
{
  int64_t base = rows / size, extra = rows % size;

  *lo = rank * base + (rank < extra ? rank : extra);
  *hi = *lo + base + (rank < extra ? 1 : 0);
}

int vs_table_fill(vs_table_t *t, uint64_t seed, int dim, int64_t rows,
                  int64_t lo, int64_t hi)
{
  int stride = (dim + 3) & ~3;
  size_t n = (size_t) (hi - lo) * (size_t) stride;
  float *data = NULL;
  int64_t i;
  int j;

  if (n > 0 && posix_memalign((void **) &data, 64, n * sizeof(float)) != 0)
    return -ENOMEM;
  for (i = lo; i < hi; i++) {
    float *row = data + (size_t) (i - lo) * stride;
    for (j = 0; j < dim; j++)
      row[j] = vs_value(seed, dim, i, j);
    for (; j < stride; j++)
      row[j] = 0.0f;
  }
  free(t->data);
  t->seed = seed;
  t->dim = dim;
  t->stride = stride;
  t->rows = rows;
  t->lo = lo;
  t->hi = hi;
  t->data = data;
  return 0;
}

void vs_table_free(vs_table_t *t)
{
  free(t->data);
  t->data = NULL;
  t->lo = t->hi = 0;
}

int vs_cand_cmp(const vs_cand_t *a, const vs_cand_t *b)
{
  if ((a->id < 0) != (b->id < 0))
    return a->id < 0 ? 1 : -1;
  if (a->dist2 != b->dist2)
    return a->dist2 < b->dist2 ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

static int cand_qsort_cmp(const void *a, const void *b)
{
  return vs_cand_cmp(a, b);
}

/* A max-heap of at most k candidates (the worst at the top). */
static void heap_sift_down(vs_cand_t *h, uint32_t n, uint32_t i)
{
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    vs_cand_t tmp;

    if (l < n && vs_cand_cmp(&h[l], &h[m]) > 0)
      m = l;
    if (r < n && vs_cand_cmp(&h[r], &h[m]) > 0)
      m = r;
    if (m == i)
      return;
    tmp = h[i];
    h[i] = h[m];
    h[m] = tmp;
    i = m;
  }
}

/* Four floats at a time: GCC's vector extension, SSE2 on x86-64 (every
 * such CPU) and plain code elsewhere. The sum's order is fixed, so every
 * rank computes the same bits for the same row. */
typedef float v4f __attribute__((vector_size(16)));

static float dist2(const float *a, const float *b, int stride)
{
  v4f acc = {0, 0, 0, 0};
  int j;

  for (j = 0; j < stride; j += 4) {
    v4f x, y, d;
    memcpy(&x, a + j, sizeof(x));
    memcpy(&y, b + j, sizeof(y));
    d = x - y;
    acc += d * d;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void vs_search(const vs_table_t *t, const float *queries, int nq,
               const uint32_t *k, vs_cand_t *out)
{
  vs_cand_t *heap[256];
  uint32_t fill[256];
  size_t off = 0;
  int64_t i;
  int q, q0;

  /* queries in blocks of 256 (a batch is smaller): each row is read once
   * per block while the block's queries stay in cache */
  for (q0 = 0; q0 < nq; q0 += 256) {
    int nb = nq - q0 < 256 ? nq - q0 : 256;

    for (q = 0; q < nb; q++) {
      heap[q] = out + off;
      fill[q] = 0;
      off += k[q0 + q];
    }
    for (i = t->lo; i < t->hi; i++) {
      const float *row = t->data + (size_t) (i - t->lo) * t->stride;
      for (q = 0; q < nb; q++) {
        uint32_t kq = k[q0 + q];
        vs_cand_t c;
        if (kq == 0)
          continue;
        c.dist2 = dist2(row, queries + (size_t) (q0 + q) * t->stride,
                        t->stride);
        c.pad = 0;
        c.id = i;
        if (fill[q] < kq) {
          /* sift up */
          uint32_t n = fill[q]++;
          vs_cand_t *h = heap[q];
          h[n] = c;
          while (n > 0 && vs_cand_cmp(&h[(n - 1) / 2], &h[n]) < 0) {
            vs_cand_t tmp = h[n];
            h[n] = h[(n - 1) / 2];
            h[(n - 1) / 2] = tmp;
            n = (n - 1) / 2;
          }
        } else if (vs_cand_cmp(&c, &heap[q][0]) < 0) {
          heap[q][0] = c;
          heap_sift_down(heap[q], kq, 0);
        }
      }
    }
    for (q = 0; q < nb; q++) {
      uint32_t j, kq = k[q0 + q];
      for (j = fill[q]; j < kq; j++) {
        heap[q][j].dist2 = INFINITY;
        heap[q][j].pad = 0;
        heap[q][j].id = -1;
      }
      qsort(heap[q], kq, sizeof(vs_cand_t), cand_qsort_cmp);
    }
  }
}

void vs_merge(const vs_cand_t *const *lists, int n, uint32_t k,
              vs_cand_t *out)
{
  uint32_t stack_pos[64], *pos = stack_pos, j;
  int i;

  /* n-way merge of sorted lists (n is the world size) */
  if (n > 64 && (pos = malloc(sizeof(*pos) * (size_t) n)) == NULL) {
    for (j = 0; j < k; j++) { /* out of memory: the first list alone */
      out[j] = lists[0][j];
    }
    return;
  }
  memset(pos, 0, sizeof(*pos) * (size_t) n);
  for (j = 0; j < k; j++) {
    int best = -1;
    for (i = 0; i < n; i++) {
      if (pos[i] >= k)
        continue;
      if (best < 0 || vs_cand_cmp(&lists[i][pos[i]],
                                  &lists[best][pos[best]]) < 0)
        best = i;
    }
    out[j] = lists[best][pos[best]++];
  }
  if (pos != stack_pos)
    free(pos);
}
