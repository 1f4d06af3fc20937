/* uvccl-vsearch: the distributed side. Every rank holds a shard of the
 * table; rank 0 orders the work. A batch of queries is one broadcast from
 * rank 0 (on the world group: the command channel) and one gather of
 * every rank's candidates (on a subgroup: results), so that rank 0 can
 * broadcast batch i+1 while the ranks still scan batch i. A periodic
 * "refresh" allreduce runs on a third group beside the searches. When a
 * rank fails, the survivors shrink the world, remake the subgroups and
 * remake the lost shard between them (the table is a function of the
 * seed), and go on. */
#ifndef VSEARCH_SERVICE_H
#define VSEARCH_SERVICE_H

#include <stdint.h>
#include <uv.h>

#include "table.h"
#include "uvccl.h"

typedef struct {
  int dim;
  int64_t rows;
  uint64_t seed;
  int batch;              /* queries per batch, at most */
  int pipeline;           /* batches in flight, at most */
  uint32_t max_k;
  uint64_t heartbeat_ms;  /* 0: the library's default */
  uint64_t op_timeout_ms; /* collectives' timeout (then revoke + shrink) */
  size_t refresh_bytes;   /* 0: no refresh */
  uint64_t refresh_ms;    /* period */
} svc_options_t;

typedef struct svc_s svc_t;

/* One search, owned by the caller (the HTTP side), queued at rank 0. */
typedef struct svc_search_s svc_search_t;
typedef void (*svc_search_cb)(svc_search_t *s, int http_status,
                              const vs_cand_t *results, const char *err);
struct svc_search_s {
  void *data;
  float *vec;             /* stride floats (zero padded) */
  uint32_t k;
  uint64_t deadline_ms;   /* uv_now() by which it must be answered */
  svc_search_cb cb;       /* exactly once, never inside svc_submit */
  /* private */
  svc_search_t *next_, *prev_;
  void *batch_;
  int slot_;
  int queued_;
};

typedef struct {
  const char *state;      /* "starting", "running", "recovering", ... */
  int ranks_alive;
  int world_size;         /* at the start */
  int epoch;              /* shrinks so far */
  uint64_t batches, queries;
  int collectives_in_flight;
  int queued;
  uint64_t refreshes_ok, refreshes_bad;
  int refresh_in_flight;
  const char *last_failure; /* "" when none */
  int64_t shard_lo, shard_hi;
  int failed_ranks[16];   /* global ranks lost, in order */
  int nfailed;
} svc_stats_t;

/* Creates the world from env:// and starts the rank's role: a worker runs
 * until rank 0 stops it; rank 0 waits for svc_submit. on_ready runs at
 * rank 0 once the world and its shard are ready (status 0) or not;
 * on_exit when the rank is done (status: 0 after a clean stop). */
svc_t *svc_start(uv_loop_t *loop, const svc_options_t *o,
                 void (*on_ready)(svc_t *, int status, const char *msg),
                 void (*on_exit)(svc_t *, int status, const char *msg),
                 void *data);
void *svc_data(svc_t *svc);
int svc_rank(svc_t *svc);
int svc_stride(svc_t *svc);
/* Rank 0: queue a search. 0, or an HTTP status (503) with *err set. */
int svc_submit(svc_t *svc, svc_search_t *s, const char **err);
/* The client went away: its callback will not run. */
void svc_cancel(svc_t *svc, svc_search_t *s);
void svc_stats(svc_t *svc, svc_stats_t *st);
/* Stops (rank 0: tells the workers): queued searches get 503, in-flight
 * batches finish; then on_exit. A second call stops at once. */
void svc_stop(svc_t *svc, const char *why);

#endif
