/* The process-group backends: what a group of each kind does for every
 * public process-group and collective call. api.c picks the table by the
 * options' backend at creation and by pg->backend_ afterwards, and hands
 * the call on with its arguments unchanged; each entry keeps the contract
 * of its public function in uvccl.h. An entry left NULL is a call the
 * backend does not support (UV_EINVAL). */
#ifndef UVCCL_PG_BACKEND_H
#define UVCCL_PG_BACKEND_H

#include "uvccl.h"

/* What a grow's agreement settled (grow.c), for the backend that makes
 * the grown world: its epoch, the members and joiners it counts, and the
 * backend's own token for a grow that keeps what the members have (CPU:
 * the size of the members' net; 0: the new world is made anew), with
 * the members' ranks in the backend's numbering as rank 0 wrote them
 * (joiners only; members hold them already). */
typedef struct uvccl__grow_plan_s {
  uint64_t epoch;
  int members, njoin;
  int64_t keep;
  const int *ranks;
  const unsigned char *leaving; /* members: by old rank, 1 leaves (NULL:
                                   none) */
} uvccl__grow_plan_t;

typedef struct uvccl__backend_s {
  const char *name;
  int (*init)(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
      const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
  int (*init_url)(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
      const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
  void (*destroy)(uvccl_pg_t *pg, uvccl_pg_close_cb cb);
  void (*abort)(uvccl_pg_t *pg, const char *reason);
  int (*get_failure)(const uvccl_pg_t *pg, uvccl_pg_failure_t *f);
  int (*failed_ranks)(const uvccl_pg_t *pg, int *ranks, int max);
  int (*revoke)(uvccl_pg_t *pg, const char *reason);
  int (*shrink)(uvccl_pg_t *pg, uvccl_pg_t *newpg, const int *exclude,
      int nexclude, uvccl_work_t *work, uvccl_work_cb cb);
  /* Grows (grow.c). grow_check: 0 where this backend can grow pg (a
   * member's world; NULL: a joiner's), else an error with why.
   * grow_agree_key: writes the key where the members agree on the grow's
   * epoch through the store (rank 0 sets it, the others wait for it), for
   * groups whose collectives cannot take host memory; NULL: a broadcast
   * over the old world. grow_keep (rank 0, NULL: never): the plan's
   * keep token for growing pg by njoin, the ranks `leaving` names (by
   * rank; NULL: none) taken out, while keeping what the members have,
   * with the remaining members' ranks written after it (" r0 r1 ...", into
   * *ranks, which the caller frees), or 0 where the grow must make the
   * world anew. grow_init: makes the grown world (parent: a member's old
   * world; NULL on a joiner); NULL: made anew by init. */
  int (*grow_check)(const uvccl_pg_t *pg, char *why, size_t len);
  void (*grow_agree_key)(uvccl_pg_t *pg, char *key, size_t len);
  int64_t (*grow_keep)(const uvccl_pg_t *pg, const unsigned char *leaving,
      int njoin, char **ranks);
  int (*grow_init)(uv_loop_t *loop, uvccl_pg_t *parent, uvccl_pg_t *pg,
      uvccl_store_t *store, const uvccl_pg_options_t *opts,
      const uvccl__grow_plan_t *plan, uvccl_work_t *work, uvccl_work_cb cb);
  int (*new_group)(uvccl_pg_t *parent, uvccl_pg_t *pg, const int *ranks,
      int nranks, const char *tag);
  int (*split)(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int key,
      uvccl_work_t *work, uvccl_work_cb cb);
  int (*global_rank)(const uvccl_pg_t *pg, int group_rank);
  int (*group_rank)(const uvccl_pg_t *pg, int global_rank);
  const char *(*peer_address)(const uvccl_pg_t *pg, int group_rank);
  const char *(*peer_transport)(const uvccl_pg_t *pg, int group_rank);
  int (*peer_host)(const uvccl_pg_t *pg, int group_rank); /* NULL: ENOTSUP */
  void (*set_timeout)(uvccl_pg_t *pg, uint64_t timeout_ms);
  void (*set_busy_poll)(uvccl_pg_t *pg, uint32_t us);
  int (*premul_sum)(uvccl_pg_t *pg, double factor, uvccl_redop_t *op);
  int (*loop_stats)(uvccl_pg_t *pg, uvccl_loop_stats_t *stats, int reset);
  /* Per loop, not per group (uvccl_loop_before_block): arms what wakes
   * the loop through its backend fd; 1 when it must not block now. NULL:
   * the backend needs nothing. */
  int (*before_block)(uv_loop_t *loop);
  int (*allreduce)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op,
      uvccl_work_cb cb);
  int (*allreduce_coalesced)(uvccl_pg_t *pg, uvccl_work_t *work,
      const uvccl_buf_t *bufs, size_t nbufs, uvccl_dtype_t dtype,
      uvccl_redop_t op, uvccl_work_cb cb);
  int (*reduce_scatter)(uvccl_pg_t *pg, uvccl_work_t *work,
      const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
      uvccl_redop_t op, uvccl_work_cb cb);
  int (*reduce_scatterv)(uvccl_pg_t *pg, uvccl_work_t *work,
      const void *sendbuf, void *recvbuf, const size_t *recvcounts,
      uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb);
  int (*broadcast)(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
      size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb);
  int (*reduce)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op,
      int root, uvccl_work_cb cb);
  int (*allgather)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb cb);
  int (*allgatherv)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      size_t sendcount, void *const *recvbufs, const size_t *recvcounts,
      uvccl_dtype_t dtype, uvccl_work_cb cb);
  int (*gather)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
      uvccl_work_cb cb);
  int (*scatter)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
      uvccl_work_cb cb);
  int (*alltoall)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb cb);
  int (*alltoallv)(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
      const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
      uvccl_dtype_t dtype, uvccl_work_cb cb);
  int (*barrier)(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb);
  int (*monitored_barrier)(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all,
      uvccl_work_cb cb);
  int (*send)(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf, size_t len,
      int dst, int tag, uvccl_work_cb cb);
  int (*recv)(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
      int src, int tag, uvccl_work_cb cb);
  int (*p2p_batch)(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops,
      size_t nops, uvccl_work_cb cb);
  int (*broadcast_bytes)(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
      size_t len, int root, uvccl_work_cb cb);
  int (*allgather_bytes)(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
      size_t len, uvccl_work_cb cb);
  int (*gather_bytes)(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
      size_t len, int root, uvccl_work_cb cb);
  int (*scatter_bytes)(uvccl_pg_t *pg, uvccl_work_t *work,
      const uvccl_buf_t *bufs, size_t nbufs, int root, uvccl_work_cb cb);
} uvccl__backend_t;

/* The table of a group's backend (a group not made: the CPU one's), and
 * of the backend options name (NULL: one this build does not know). */
const uvccl__backend_t *uvccl__backend_of(const uvccl_pg_t *pg);
const uvccl__backend_t *uvccl__backend_for(const uvccl_pg_options_t *opts);

/* CPU groups over TCP and shared memory (src/cpu/backend.c). */
extern const uvccl__backend_t uvccl__cpu_backend;
/* NCCL groups (src/nccl/nccl_backend.c). */
extern const uvccl__backend_t uvccl__nccl_backend;

#endif
