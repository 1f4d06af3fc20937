/* The trace analyzer's reasoning (uvccl-trace): from the flight recorder
 * dumps of a job's ranks (one parsed document per process), per group, the
 * verdict a person needs when the job hangs or went wrong:
 *   - the first sequence number where members disagree on what they
 *     called (op, dtype, reduce op, counts, root), with both sides;
 *   - the collective the group is stuck in, the members that never
 *     entered it (the likely culprits), and who waits for whom;
 *   - the members missing from the dumps.
 * No I/O: documents in, a result out (so it can be fuzzed and tested on
 * made-up dumps); the tool prints it. */
#ifndef UVCCL_DIAG_ANALYZE_H
#define UVCCL_DIAG_ANALYZE_H

#include "json.h"

#include <stdint.h>

/* What a member says it called. */
typedef struct {
  const char *op;         /* never NULL ("?" when absent) */
  const char *dtype;      /* NULL: none */
  const char *redop;
  int root;               /* group rank, -1: none */
  int64_t count_in, count_out;
} uvccl__tdesc_t;

/* A member waiting in the stuck collective, and for whom. */
typedef struct {
  int rank;               /* global */
  const char *state;      /* "started", "timed_out", ... */
  int nfor;
  int *for_ranks;         /* global ranks it still waits for */
} uvccl__twait_t;

typedef struct {
  /* identity */
  const char *name, *backend;
  uint32_t gid;
  int size;
  int *ranks;             /* group rank -> global */
  /* members without a dump (or whose dump lacks the group) */
  int nmissing;
  int *missing;           /* global */
  /* the first disagreement */
  int mismatch;
  uint64_t mm_seq;
  uvccl__tdesc_t mm_a, mm_b;  /* a: the side of the lowest rank */
  int nmm_a, nmm_b;
  int *mm_ranks_a, *mm_ranks_b;
  /* the collective the group is stuck in */
  int stuck;
  uint64_t stuck_seq;
  uvccl__tdesc_t stuck_desc;
  int nin, nnot;
  int *in_ranks;          /* entered it (global) */
  int *not_entered;       /* dumped, in the group, but never entered it */
  int nwait;
  uvccl__twait_t *waits;
  /* the verdict: the ranks most likely at fault (global), and why */
  int nculprits;
  int *culprits;
  const char *why;        /* "mismatch", "not_entered", "waited_for_missing",
                             "waited_for", NULL */
} uvccl__tgroup_t;

typedef struct {
  int ndumps;
  int *dump_ranks;        /* the global rank of each document, -1 unknown */
  int world;              /* the largest group size seen (the world's) */
  int nmissing;
  int *missing;           /* world ranks with no dump */
  int ngroups;
  uvccl__tgroup_t *groups;
  int nculprits;          /* union over groups, ascending */
  int *culprits;
} uvccl__tresult_t;

/* Analyzes ndocs dumps (format "uvccl-flight-recorder" version 1). A
 * document that is not one is an error: UVCCL_EPROTO with err naming its
 * index. Strings in the result point into the documents: keep them until
 * uvccl__trace_result_free(). */
int uvccl__trace_analyze(const uvccl__json_t *const *docs, int ndocs,
                         uvccl__tresult_t *res, char *err, size_t errlen);
void uvccl__trace_result_free(uvccl__tresult_t *res);

/* "allreduce float32 sum, 4 -> 4 elements, root 1" */
void uvccl__tdesc_format(const uvccl__tdesc_t *d, char *buf, size_t len);

#endif
