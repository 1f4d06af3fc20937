/* The trace analyzer's reasoning (see analyze.h). */
#include "analyze.h"
#include "fingerprint.h"
#include "uvccl.h"
#include "loop/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers --------------------------------------------------------- */

static int streq(const char *a, const char *b) {
  if (a == NULL || b == NULL) return a == b;
  return strcmp(a, b) == 0;
}

static int int_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* A set of ints as a growing array. */
static int push(int **arr, int *n, int v) {
  int *p = uvccl__realloc(*arr, (size_t)(*n + 1) * sizeof(int));
  if (p == NULL) return UV_ENOMEM;
  p[(*n)++] = v;
  *arr = p;
  return 0;
}

static int has(const int *arr, int n, int v) {
  int i;
  for (i = 0; i < n; i++)
    if (arr[i] == v) return 1;
  return 0;
}

static int push_unique(int **arr, int *n, int v) {
  return has(*arr, *n, v) ? 0 : push(arr, n, v);
}

/* Sequence numbers in dumps: a number, or null (none yet: -1). */
static int64_t seq_of(const uvccl__json_t *obj, const char *key) {
  const uvccl__json_t *v = uvccl__json_get(obj, key);
  int64_t x;
  if (v == NULL || v->type != UVCCL__J_NUM) return -1;
  x = uvccl__json_int(v, -1);
  /* sequence numbers are 32-bit: anything larger is not one (and +1 on
   * it must not overflow) */
  return x >= 0 && x <= (int64_t)UINT32_MAX ? x : -1;
}

static void desc_of(const uvccl__json_t *e, uvccl__tdesc_t *d) {
  d->op = uvccl__json_get_str(e, "op", "?");
  d->dtype = uvccl__json_get_str(e, "dtype", NULL);
  d->redop = uvccl__json_get_str(e, "redop", NULL);
  d->root = (int)uvccl__json_get_int(e, "root", -1);
  d->count_in = uvccl__json_get_int(e, "count_in", 0);
  d->count_out = uvccl__json_get_int(e, "count_out", 0);
}

static int desc_same(const uvccl__tdesc_t *a, const uvccl__tdesc_t *b) {
  int c;
  if (!streq(a->op, b->op) || !streq(a->dtype, b->dtype) ||
      !streq(a->redop, b->redop) || a->root != b->root)
    return 0;
  /* the rule the fingerprint checks follow */
  c = uvccl__fp_counts_compared(a->op);
  if (c == UVCCL__FP_CMP_IN && a->count_in != b->count_in) return 0;
  if (c == UVCCL__FP_CMP_OUT && a->count_out != b->count_out) return 0;
  return 1;
}

void uvccl__tdesc_format(const uvccl__tdesc_t *d, char *buf, size_t len) {
  size_t off = 0;
  off += (size_t)snprintf(buf, len, "%s", d->op);
  if (off < len && d->dtype != NULL)
    off += (size_t)snprintf(buf + off, len - off, " %s", d->dtype);
  if (off < len && d->redop != NULL)
    off += (size_t)snprintf(buf + off, len - off, " %s", d->redop);
  if (off < len)
    off += (size_t)snprintf(buf + off, len - off, ", %lld -> %lld %s",
                            (long long)d->count_in, (long long)d->count_out,
                            d->dtype != NULL ? "elements" : "bytes");
  if (off < len && d->root >= 0)
    snprintf(buf + off, len - off, ", root %d", d->root);
}

/* ---- one group across the dumps -------------------------------------------- */

/* One of a member's entries, by sequence number (sorted; ties in the
 * dump's order, so the newest of equal numbers is last). */
typedef struct {
  int64_t seq;
  int pos;
  const uvccl__json_t *e;
} sentry_t;

/* What one member's dump says of the group. */
typedef struct {
  const uvccl__json_t *doc;   /* NULL: no dump has this member */
  const uvccl__json_t *rec;   /* its group record */
  int64_t enq, done;          /* last collective enqueued, completed */
  sentry_t *ent;              /* its collective entries of the group */
  int nent;
} member_t;

static int sentry_cmp(const void *a, const void *b) {
  const sentry_t *x = a, *y = b;
  if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

static int i64_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int same_identity(const uvccl__json_t *rec, const uvccl__tgroup_t *g) {
  const uvccl__json_t *rk = uvccl__json_get(rec, "ranks");
  int i;
  if ((uint32_t)uvccl__json_get_int(rec, "gid", -1) != g->gid ||
      !streq(uvccl__json_get_str(rec, "name", ""), g->name) ||
      (int)uvccl__json_len(rk) != g->size)
    return 0;
  for (i = 0; i < g->size; i++)
    if (uvccl__json_int(uvccl__json_at(rk, (size_t)i), -1) != g->ranks[i])
      return 0;
  return 1;
}

/* The entry of member m with sequence number seq (the newest), or NULL:
 * a binary search, so hostile or huge dumps stay fast. */
static const uvccl__json_t *entry_at(const member_t *m, int64_t seq) {
  int lo = 0, hi = m->nent; /* first index with ent.seq > seq */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (m->ent[mid].seq <= seq) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && m->ent[lo - 1].seq == seq ? m->ent[lo - 1].e : NULL;
}

static void free_members(member_t *mb, int n) {
  int i;
  for (i = 0; i < n; i++) uvccl__free(mb[i].ent);
  uvccl__free(mb);
}

/* Fills mb[0..size) from the documents: for each group rank, the record
 * of the dump that holds it (a live record before a destroyed one, the
 * newest of each). */
static int gather_members(const uvccl__json_t *const *docs, int ndocs,
                          const uvccl__tgroup_t *g, member_t *mb) {
  int d, r;
  for (d = 0; d < ndocs; d++) {
    const uvccl__json_t *gs = uvccl__json_get(docs[d], "groups");
    size_t i;
    for (i = 0; i < uvccl__json_len(gs); i++) {
      const uvccl__json_t *rec = uvccl__json_at(gs, i);
      int gr = (int)uvccl__json_get_int(rec, "rank", -1);
      member_t *m;
      if (!same_identity(rec, g) || gr < 0 || gr >= g->size) continue;
      m = &mb[gr];
      if (m->rec != NULL) {
        int live_old = !streq(uvccl__json_get_str(m->rec, "state", ""),
                              "destroyed");
        int live_new = !streq(uvccl__json_get_str(rec, "state", ""),
                              "destroyed");
        if (live_old && !live_new) continue;
        if (live_old == live_new && uvccl__json_get_int(rec, "id", 0) <
                                        uvccl__json_get_int(m->rec, "id", 0))
          continue;
      }
      m->doc = docs[d];
      m->rec = rec;
    }
  }
  for (r = 0; r < g->size; r++) {
    member_t *m = &mb[r];
    const uvccl__json_t *es, *last;
    int64_t id;
    size_t i;
    if (m->rec == NULL) continue;
    last = uvccl__json_get(uvccl__json_get(m->rec, "last"), "collective");
    m->enq = seq_of(last, "enqueued");
    m->done = seq_of(last, "completed");
    id = uvccl__json_get_int(m->rec, "id", -1);
    es = uvccl__json_get(m->doc, "entries");
    m->ent = uvccl__malloc((uvccl__json_len(es) + 1) * sizeof(*m->ent));
    if (m->ent == NULL) return UV_ENOMEM;
    for (i = 0; i < uvccl__json_len(es); i++) {
      const uvccl__json_t *e = uvccl__json_at(es, i);
      int64_t seq = seq_of(e, "seq");
      if (seq < 0 || uvccl__json_get_int(e, "group", -2) != id ||
          !streq(uvccl__json_get_str(e, "kind", ""), "collective"))
        continue;
      m->ent[m->nent].seq = seq;
      m->ent[m->nent].pos = m->nent;
      m->ent[m->nent].e = e;
      m->nent++;
    }
    if (m->nent > 1)
      qsort(m->ent, (size_t)m->nent, sizeof(*m->ent), sentry_cmp);
  }
  return 0;
}

/* Whether members recorded seq differently: then the two sides (a: the
 * lowest rank's description). */
static int mismatch_at(uvccl__tgroup_t *g, const member_t *mb, int64_t seq) {
  uvccl__tdesc_t a, d;
  int r, rc, have_a = 0, differ = 0;
  for (r = 0; r < g->size; r++) {
    const uvccl__json_t *e = entry_at(&mb[r], seq);
    if (e == NULL) continue;
    desc_of(e, &d);
    if (!have_a) {
      a = d;
      have_a = 1;
    } else if (!desc_same(&a, &d)) {
      differ = 1;
    }
  }
  if (!differ) return 0;
  g->mismatch = 1;
  g->mm_seq = (uint64_t)seq;
  g->mm_a = a;
  for (r = 0; r < g->size; r++) {
    const uvccl__json_t *e = entry_at(&mb[r], seq);
    if (e == NULL) continue;
    desc_of(e, &d);
    if (desc_same(&a, &d)) {
      rc = push(&g->mm_ranks_a, &g->nmm_a, g->ranks[r]);
    } else {
      if (g->nmm_b == 0) g->mm_b = d;
      rc = push(&g->mm_ranks_b, &g->nmm_b, g->ranks[r]);
    }
    if (rc != 0) return rc;
  }
  return 0;
}

/* The first sequence number that members recorded differently. */
static int find_mismatch(uvccl__tgroup_t *g, const member_t *mb) {
  int64_t *seqs;
  size_t n = 0, u, k;
  int r, rc = 0, i;
  /* the numbers any member recorded, each once, in order (not the range
   * between the smallest and the largest: a dump may say anything) */
  for (r = 0; r < g->size; r++) n += (size_t)mb[r].nent;
  if (n == 0) return 0;
  seqs = uvccl__malloc(n * sizeof(*seqs));
  if (seqs == NULL) return UV_ENOMEM;
  n = 0;
  for (r = 0; r < g->size; r++)
    for (i = 0; i < mb[r].nent; i++) seqs[n++] = mb[r].ent[i].seq;
  qsort(seqs, n, sizeof(*seqs), i64_cmp);
  for (u = 0, k = 0; k < n; k++)
    if (u == 0 || seqs[u - 1] != seqs[k]) seqs[u++] = seqs[k];
  for (k = 0; k < u && rc == 0 && !g->mismatch; k++)
    rc = mismatch_at(g, mb, seqs[k]);
  uvccl__free(seqs);
  return rc;
}

static int is_pending_state(const char *st) {
  return streq(st, "queued") || streq(st, "started") ||
         streq(st, "timed_out") || streq(st, "failed") ||
         streq(st, "cancelled");
}

/* The collective the group is stuck in: the oldest one some member has
 * not completed; who entered it, who never did, who waits for whom. */
static int find_stuck(uvccl__tgroup_t *g, const member_t *mb) {
  int64_t s = -1;
  int r, rc;
  for (r = 0; r < g->size; r++) {
    const member_t *m = &mb[r];
    if (m->rec == NULL || m->enq <= m->done) continue;
    if (s < 0 || m->done + 1 < s) s = m->done + 1;
  }
  if (s < 0) return 0;
  g->stuck = 1;
  g->stuck_seq = (uint64_t)s;
  g->stuck_desc.op = "?";
  g->stuck_desc.root = -1;
  for (r = 0; r < g->size; r++) {
    const member_t *m = &mb[r];
    const uvccl__json_t *e;
    if (m->rec == NULL) continue;
    if (m->enq < s) {
      rc = push(&g->not_entered, &g->nnot, g->ranks[r]);
      if (rc != 0) return rc;
      continue;
    }
    rc = push(&g->in_ranks, &g->nin, g->ranks[r]);
    if (rc != 0) return rc;
    e = entry_at(m, s);
    if (e == NULL) continue;
    if (streq(g->stuck_desc.op, "?")) desc_of(e, &g->stuck_desc);
    if (is_pending_state(uvccl__json_get_str(e, "state", ""))) {
      uvccl__twait_t *w;
      const uvccl__json_t *wf = uvccl__json_get(e, "waiting_for");
      size_t i;
      w = uvccl__realloc(g->waits, (size_t)(g->nwait + 1) * sizeof(*w));
      if (w == NULL) return UV_ENOMEM;
      g->waits = w;
      w = &g->waits[g->nwait++];
      memset(w, 0, sizeof(*w));
      w->rank = g->ranks[r];
      w->state = uvccl__json_get_str(e, "state", "?");
      for (i = 0; i < uvccl__json_len(wf); i++) {
        int gr = (int)uvccl__json_int(uvccl__json_at(wf, i), -1);
        if (gr < 0 || gr >= g->size) continue;
        rc = push_unique(&w->for_ranks, &w->nfor, g->ranks[gr]);
        if (rc != 0) return rc;
      }
    }
  }
  return 0;
}

/* The ranks most likely at fault, in order of evidence. */
static int find_culprits(uvccl__tgroup_t *g) {
  int i, j, rc;
  if (g->mismatch) {
    /* the minority; on a tie, the side without the lowest rank */
    int use_a = g->nmm_a < g->nmm_b;
    int *src = use_a ? g->mm_ranks_a : g->mm_ranks_b;
    int n = use_a ? g->nmm_a : g->nmm_b;
    g->why = "mismatch";
    for (i = 0; i < n; i++)
      if ((rc = push_unique(&g->culprits, &g->nculprits, src[i])) != 0)
        return rc;
    return 0;
  }
  if (!g->stuck) return 0;
  if (g->nnot > 0) {
    g->why = "not_entered";
    for (i = 0; i < g->nnot; i++)
      if ((rc = push_unique(&g->culprits, &g->nculprits,
                            g->not_entered[i])) != 0)
        return rc;
    return 0;
  }
  /* Members without a dump that others wait for; with no waiting
   * information at all, every member without a dump. */
  for (i = 0; i < g->nmissing; i++) {
    int waited = 0, any_info = 0;
    for (j = 0; j < g->nwait; j++) {
      any_info |= g->waits[j].nfor > 0;
      waited |= has(g->waits[j].for_ranks, g->waits[j].nfor, g->missing[i]);
    }
    if (waited || !any_info) {
      g->why = "waited_for_missing";
      if ((rc = push_unique(&g->culprits, &g->nculprits, g->missing[i])) != 0)
        return rc;
    }
  }
  if (g->nculprits > 0) return 0;
  /* Ranks waited for that wait for nobody themselves: the ends of the
   * chains (a rank busy elsewhere, or stopped). */
  for (i = 0; i < g->nwait; i++)
    for (j = 0; j < g->waits[i].nfor; j++) {
      int r = g->waits[i].for_ranks[j], k, waits = 0;
      for (k = 0; k < g->nwait; k++)
        if (g->waits[k].rank == r && g->waits[k].nfor > 0) waits = 1;
      if (!waits) {
        g->why = "waited_for";
        if ((rc = push_unique(&g->culprits, &g->nculprits, r)) != 0)
          return rc;
      }
    }
  return 0;
}

static int analyze_group(const uvccl__json_t *const *docs, int ndocs,
                         uvccl__tgroup_t *g) {
  member_t *mb = uvccl__calloc((size_t)g->size, sizeof(*mb));
  int r, rc;
  if (mb == NULL) return UV_ENOMEM;
  rc = gather_members(docs, ndocs, g, mb);
  for (r = 0; rc == 0 && r < g->size; r++)
    if (mb[r].rec == NULL) rc = push(&g->missing, &g->nmissing, g->ranks[r]);
  if (rc == 0) rc = find_mismatch(g, mb);
  if (rc == 0) rc = find_stuck(g, mb);
  if (rc == 0) rc = find_culprits(g);
  if (rc == 0 && g->nculprits > 1)
    qsort(g->culprits, (size_t)g->nculprits, sizeof(int), int_cmp);
  free_members(mb, g->size);
  return rc;
}

/* ---- all groups ---------------------------------------------------------------- */

static int add_groups(const uvccl__json_t *doc, uvccl__tresult_t *res) {
  const uvccl__json_t *gs = uvccl__json_get(doc, "groups");
  size_t i;
  for (i = 0; i < uvccl__json_len(gs); i++) {
    const uvccl__json_t *rec = uvccl__json_at(gs, i);
    const uvccl__json_t *rk = uvccl__json_get(rec, "ranks");
    uvccl__tgroup_t *g, tmp;
    int k, size = (int)uvccl__json_len(rk), known = 0;
    if (size <= 0 || rk->type != UVCCL__J_ARR) continue;
    memset(&tmp, 0, sizeof(tmp));
    tmp.name = uvccl__json_get_str(rec, "name", "");
    tmp.backend = uvccl__json_get_str(rec, "backend", "?");
    tmp.gid = (uint32_t)uvccl__json_get_int(rec, "gid", 0);
    tmp.size = size;
    tmp.ranks = uvccl__malloc((size_t)size * sizeof(int));
    if (tmp.ranks == NULL) return UV_ENOMEM;
    for (k = 0; k < size; k++)
      tmp.ranks[k] = (int)uvccl__json_int(uvccl__json_at(rk, (size_t)k), -1);
    for (k = 0; k < res->ngroups && !known; k++)
      known = same_identity(rec, &res->groups[k]);
    if (known) {
      uvccl__free(tmp.ranks);
      continue;
    }
    g = uvccl__realloc(res->groups,
                       (size_t)(res->ngroups + 1) * sizeof(*g));
    if (g == NULL) {
      uvccl__free(tmp.ranks);
      return UV_ENOMEM;
    }
    res->groups = g;
    res->groups[res->ngroups++] = tmp;
    if (size > res->world) res->world = size;
  }
  return 0;
}

int uvccl__trace_analyze(const uvccl__json_t *const *docs, int ndocs,
                         uvccl__tresult_t *res, char *err, size_t errlen) {
  int d, k, r, rc = 0;
  memset(res, 0, sizeof(*res));
  if (errlen > 0) err[0] = '\0';
  for (d = 0; d < ndocs; d++) {
    const uvccl__json_t *doc = docs[d];
    if (doc == NULL || doc->type != UVCCL__J_OBJ ||
        !streq(uvccl__json_get_str(doc, "format", ""),
               "uvccl-flight-recorder") ||
        uvccl__json_get(doc, "groups") == NULL ||
        uvccl__json_get(doc, "entries") == NULL) {
      snprintf(err, errlen, "dump %d is not a uvccl flight recorder dump", d);
      return UVCCL_EPROTO;
    }
    if (uvccl__json_get_int(doc, "version", 0) != 1) {
      snprintf(err, errlen, "dump %d: format version %lld (this analyzer "
               "reads version 1)", d,
               (long long)uvccl__json_get_int(doc, "version", 0));
      return UVCCL_EPROTO;
    }
  }
  res->ndumps = ndocs;
  res->dump_ranks = uvccl__calloc((size_t)(ndocs ? ndocs : 1), sizeof(int));
  if (res->dump_ranks == NULL) return UV_ENOMEM;
  for (d = 0; d < ndocs && rc == 0; d++) {
    res->dump_ranks[d] = (int)uvccl__json_get_int(docs[d], "rank", -1);
    rc = add_groups(docs[d], res);
  }
  for (k = 0; k < res->ngroups && rc == 0; k++)
    rc = analyze_group(docs, ndocs, &res->groups[k]);
  for (r = 0; r < res->world && rc == 0; r++)
    if (!has(res->dump_ranks, ndocs, r))
      rc = push(&res->missing, &res->nmissing, r);
  for (k = 0; k < res->ngroups && rc == 0; k++)
    for (r = 0; r < res->groups[k].nculprits && rc == 0; r++)
      rc = push_unique(&res->culprits, &res->nculprits,
                       res->groups[k].culprits[r]);
  if (rc == 0 && res->nculprits > 1)
    qsort(res->culprits, (size_t)res->nculprits, sizeof(int), int_cmp);
  if (rc != 0) {
    uvccl__trace_result_free(res);
    snprintf(err, errlen, "%s", uvccl_strerror(rc));
  }
  return rc;
}

void uvccl__trace_result_free(uvccl__tresult_t *res) {
  int k, i;
  for (k = 0; k < res->ngroups; k++) {
    uvccl__tgroup_t *g = &res->groups[k];
    uvccl__free(g->ranks);
    uvccl__free(g->missing);
    uvccl__free(g->mm_ranks_a);
    uvccl__free(g->mm_ranks_b);
    uvccl__free(g->in_ranks);
    uvccl__free(g->not_entered);
    for (i = 0; i < g->nwait; i++) uvccl__free(g->waits[i].for_ranks);
    uvccl__free(g->waits);
    uvccl__free(g->culprits);
  }
  uvccl__free(res->groups);
  uvccl__free(res->dump_ranks);
  uvccl__free(res->missing);
  uvccl__free(res->culprits);
  memset(res, 0, sizeof(*res));
}
