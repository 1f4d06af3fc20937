/* Internals shared by the NCCL group files: the group (nccl_pg.c), the
 * operations and their GPU-thread issue() (nccl_ops.c, nccl_exec.c). */
#ifndef UVCCL_NCCL_NCCL_INTERNAL_H
#define UVCCL_NCCL_NCCL_INTERNAL_H

#include "cuda/gpu.h"
#include "nccl.h"
#include "nccl_api.h"
#include "diag/flight.h"
#include "diag/trace_watch.h"
#include "diag/fingerprint.h"
#include "pg/backend.h"

/* The backend's entry points (nccl_backend.c puts them in its table), each
 * with the contract of its public function in uvccl.h. */
#define UVCCL__IS_NCCL(pg) ((pg) != NULL && (pg)->backend_ == UVCCL_BACKEND_NCCL)

int uvccl__nccl_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, uvccl_work_cb cb);
int uvccl__nccl_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work, const
    uvccl_buf_t *bufs, size_t nbufs, uvccl_dtype_t dtype, uvccl_redop_t op,
    uvccl_work_cb cb);
int uvccl__nccl_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, uvccl_work_cb cb);
int uvccl__nccl_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, const size_t *recvcounts, uvccl_dtype_t dtype,
    uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__nccl_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
    size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb);
int uvccl__nccl_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t
    op, int root, uvccl_work_cb cb);
int uvccl__nccl_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb
    cb);
int uvccl__nccl_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, size_t sendcount, void *const *recvbufs, const size_t
    *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__nccl_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
    uvccl_work_cb cb);
int uvccl__nccl_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
    uvccl_work_cb cb);
int uvccl__nccl_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_work_cb
    cb);
int uvccl__nccl_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *sendbuf, const size_t *sendcounts, void *recvbuf, const size_t
    *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__nccl_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int
    wait_all, uvccl_work_cb cb);
int uvccl__nccl_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
    size_t len, int dst, int tag, uvccl_work_cb cb);
int uvccl__nccl_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t
    len, int src, int tag, uvccl_work_cb cb);
int uvccl__nccl_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t
    *ops, size_t nops, uvccl_work_cb cb);
int uvccl__nccl_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__nccl_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, uvccl_work_cb cb);
int uvccl__nccl_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void
    *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__nccl_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const
    uvccl_buf_t *bufs, size_t nbufs, int root, uvccl_work_cb cb);
int uvccl__nccl_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
void uvccl__nccl_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb);
void uvccl__nccl_pg_abort(uvccl_pg_t *pg, const char *reason);
int uvccl__nccl_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f);
int uvccl__nccl_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max);
int uvccl__nccl_pg_revoke(uvccl_pg_t *pg, const char *reason);
int uvccl__nccl_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                          const int *exclude, int nexclude, uvccl_work_t *w,
                          uvccl_work_cb cb);
int uvccl__nccl_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg, const int
    *ranks, int nranks, const char *tag);
int uvccl__nccl_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color, int
    key, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__nccl_pg_global_rank(const uvccl_pg_t *pg, int group_rank);
int uvccl__nccl_pg_group_rank(const uvccl_pg_t *pg, int global_rank);
const char *uvccl__nccl_pg_peer_address(const uvccl_pg_t *pg, int group_rank);
void uvccl__nccl_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms);
void uvccl__nccl_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us);
int uvccl__nccl_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t
    *op);
/* Custom PREMUL_SUM op ids, the same numbering as the TCP groups. */
#define UVCCL__NCCL_PREMUL_BASE 0x100

typedef struct nccl_group_s nccl_group_t;
typedef struct nccl_op_s nccl_op_t;

/* One NCCL or CUDA call of an operation. */
typedef enum {
  NCALL_ALLREDUCE,
  NCALL_BROADCAST,
  NCALL_REDUCE,
  NCALL_ALLGATHER,
  NCALL_REDUCE_SCATTER,
  NCALL_SEND,
  NCALL_RECV,
  NCALL_COPY,       /* local cudaMemcpyAsync on the group stream */
} ncall_type_t;

typedef struct {
  ncall_type_t type;
  int peer;         /* root or peer (group rank) */
  const void *send;
  void *recv;
  size_t count;     /* elements of the op's NCCL dtype (COPY: bytes) */
} ncall_t;

typedef enum {
  NOP_CALLS,        /* a collective or p2p: calls[] */
  NOP_COMM_INIT,    /* ncclCommInitRankConfig, then stream and scratch */
  NOP_UNIQUE_ID,    /* ncclGetUniqueId (rank 0) */
  NOP_SPLIT,        /* ncclCommSplit of the parent */
  NOP_CHECK,        /* ncclCommGetAsyncError (the watchdog) */
  NOP_DRAIN,        /* nothing: its end event says the stream is idle */
  NOP_FINALIZE,     /* ncclCommFinalize + Destroy, stream, scratch */
  NOP_ABORT,        /* ncclCommAbort, stream, scratch */
  NOP_STREAM_WAIT,  /* the user's stream waits for the group's */
  NOP_WAIT_STREAM,  /* the group's stream waits for the user's */
  NOP_REVOKE,       /* ncclCommRevoke, then wait until quiescent */
  NOP_SHRINK,       /* ncclCommShrink of the group, without excl[] */
  NOP_GROW_ID,      /* ncclCommGetUniqueId of the parent (its rank 0) */
  NOP_GROW,         /* ncclCommGrow: from the parent, or as a joiner */
} nop_kind_t;

struct nccl_op_s {
  uvccl__gpu_op_t gop;   /* first */
  nop_kind_t kind;
  nccl_group_t *g;       /* the group whose client runs it */
  nccl_group_t *target;  /* NOP_SPLIT: the child (NULL: not a member) */
  uvccl_work_t *work;    /* NULL once detached (cancel, timeout) */
  const char *name;      /* "allreduce", ... */
  int dtype;             /* NCCL data type */
  int redop;             /* NCCL op (SUM, ...) */
  int premul;            /* create a PreMulSum op with factor */
  double factor;
  int grouped;           /* wrap the calls in ncclGroupStart/End */
  size_t ncalls;
  ncall_t *calls;        /* inline_calls, or allocated */
  ncall_t inline_calls[2];
  uvccl_p2p_op_t *p2p;   /* p2p_batch results */
  size_t recv_len;       /* recv results */
  int recv_src;
  /* GPU-thread state across AGAIN */
  int phase;
  int async_failed;      /* the communicator reported an async error */
  int nccl_op;           /* the PreMulSum op made for this call */
  uvccl__nccl_comm_t newcomm;
  int color, key;
  void *user_stream;     /* STREAM_WAIT / WAIT_STREAM */
  int split_rank, split_size;
  int *excl;             /* NOP_SHRINK: the ranks left out (owned) */
  int nexcl;
  struct nccl_shrink_s *shrink; /* NOP_SHRINK: its agreement */
  /* done() of the kinds that belong to a layer above nccl_pg.c (init,
   * unique id, split, shrink, revoke): set by who makes the op */
  void (*done_fn)(nccl_op_t *op);
  nccl_op_t *next, *prev; /* the group's list of live ops */
  /* flight recorder: what it is (filled by the builders), its entry */
  uvccl__fdesc_t desc;
  uint64_t fid;
  uint32_t seq;          /* its number (collectives and p2p apart) */
  /* fingerprint checks: this rank's, and how far the exchange got */
  int fp;
  int fp_phase;
  uvccl__fp_t fp_mine;
};

struct nccl_group_s {
  uvccl_pg_t *pg;
  uv_loop_t *loop;
  int rank, size;
  int device;
  int handles;            /* find-or-create subgroups share the group */
  uvccl__gpu_t *gpu;
  uvccl__gpu_client_t *client;
  /* (gpu thread once created; read on the loop only after the op that
   * set them completed) */
  uvccl__nccl_comm_t comm;
  void *stream;
  void *scratch;          /* barrier's device word */
  uint64_t timeout_ms;
  double *premul;
  int npremul;
  int *ranks;             /* global rank of each group rank; NULL: world
                             or unknown (split) */
  int world;              /* the world group: translation is identity */
  char addr[32];
  /* state */
  int ready;              /* the communicator exists */
  int lazy;               /* opts->lazy_init */
  int init_due;           /* lazy: the id is known, the init not yet queued */
  void (*lazy_init)(nccl_group_t *g); /* nccl_boot.c's, for init_due */
  int failed;             /* creation failed: ops refused */
  int broken;             /* an async NCCL error or an abort */
  int revoked;            /* uvccl_pg_revoke: ops refused (EREVOKED) */
  /* shrink (nccl_shrink.c): the store the group was made over (NULL for
   * groups made by split or new_group), the agreement's key prefix, and
   * how long to wait for ranks that may be dead */
  uvccl_store_t *store;
  char prefix[200];
  uint64_t hb_ms;
  uint32_t nshrinks;
  uint32_t ngrows;        /* grows agreed on this group (nccl_grow.c) */
  /* a world made by a grow: the world it grew from (a member's; NULL on
   * a joiner), read by the GPU thread's ncclCommGetUniqueId and
   * ncclCommGrow while the grow is made, NULL afterwards */
  struct nccl_group_s *grow_parent;
  int grown;              /* made by ncclCommGrow (NOP_GROW_ID, NOP_GROW) */
  char fail_msg[UVCCL_WORK_MSG_LEN]; /* why, once failed or broken */
  int destroying;
  int aborted;
  int creating;           /* init/split ops or store calls outstanding */
  nccl_op_t *live_head, *live_tail; /* submitted, not yet done */
  size_t nlive;
  nccl_op_t *held_head, *held_tail; /* waiting for the communicator */
  int checking;           /* a watchdog check is in flight */
  uv_timer_t watchdog;
  int watchdog_init;
  int closing_parts;      /* own store and server still closing */
  uvccl_store_t *own_store;          /* made by init_url: closed with us */
  uvccl_store_server_t *own_server;
  uvccl_pg_close_cb close_cb;
  /* subgroups made with a tag (find-or-create) */
  struct tagged_s *tagged;
  struct tagged_s *tag_entry; /* this group's entry in its parent's list */
  /* bootstrap */
  struct nccl_boot_s *boot;
  uvccl__nccl_unique_id_t uid; /* read by the init op on the GPU thread */
  int dstate;             /* destroy: 0 waiting, 1 finalizing, 2 closing */
  int had_timeout;        /* an op timed out: its stream may be stuck */
  size_t nwork;           /* live ops that carry a user's work */
  /* timings of the last completed op (benchmarks) */
  uint64_t last_times[4];
  /* flight recorder: the group's record (registered at its first op,
   * once its rank is known), sequence numbers, name, id shared by the
   * members (world 1; children numbered by their parent) */
  uvccl__fgroup_t *fg;
  int fg_tried;
  uint32_t seq, p2p_seq;
  uint32_t trace_size;
  uint32_t trace_gid;
  uint32_t nchildren;
  char trace_name[64];
  /* a world made from a URL: dump requests through its store */
  uvccl__twatch_t *twatch;
  /* fingerprint checks (GPU thread's buffers: size fingerprints on the
   * device and in pinned host memory, and the event that says the
   * exchange reached the host) */
  int fp_check;
  void *fp_dev, *fp_host, *fp_event;
};

/* Creation state (nccl_boot.c). */
typedef struct nccl_boot_s {
  uvccl_store_t *store;
  uvccl_work_t *work;  /* the user's pg.init work */
  uvccl_work_t addw, setw, getw;
  char prefix[200];
  char key[256];
  int dead;
} nccl_boot_t;

/* A subgroup made with a tag (find-or-create), in its parent's list. */
typedef struct tagged_s {
  struct tagged_s *next;
  char *tag;
  int *ranks;
  int n;
  nccl_group_t *g; /* NULL: this rank is not a member */
  int gone;        /* the member group was destroyed */
} tagged_t;

/* nccl_exec.c: the GPU-thread side. */
int uvccl__nccl_issue(uvccl__gpu_op_t *gop);

/* nccl_pg.c */
nccl_op_t *uvccl__nccl_op_new(nccl_group_t *g, nop_kind_t kind,
                              const char *name);
void uvccl__nccl_op_free(nccl_op_t *op);
/* Validates the group and starts the work; then submits op (or holds it
 * until the communicator exists). On error op is freed. */
int uvccl__nccl_op_start(nccl_group_t *g, nccl_op_t *op, uvccl_work_t *work,
                         uvccl_work_cb cb);
int uvccl__nccl_group_check(uvccl_pg_t *pg, uvccl_work_t *work,
                            nccl_group_t **out);
ncall_t *uvccl__nccl_op_calls(nccl_op_t *op, size_t n);
/* Keeps op until the group's communicator exists (flush_held). */
void uvccl__nccl_op_hold(nccl_group_t *g, nccl_op_t *op);
/* Queues the communicator's init (nccl_boot.c); lazy groups do it with
 * their first operation. */
void uvccl__nccl_boot_init(nccl_group_t *g);
/* Hands op to the device thread now (the group's live list). */
int uvccl__nccl_op_submit(nccl_group_t *g, nccl_op_t *op);
/* The communicator exists (status 0: submit the held ops) or never will
 * (fail them with status and msg). */
void uvccl__nccl_flush_held(nccl_group_t *g, int status, const char *msg);
/* Fails every work of the group now (live ops run on, detached), and the
 * held ones. */
void uvccl__nccl_fail_all_works(nccl_group_t *g, int status, const char *msg);
/* Fails op's work (if any) with msg and detaches it. */
void uvccl__nccl_fail_work(nccl_op_t *op, int status, const char *msg);
extern const struct uvccl__work_ops uvccl__nccl_work_ops;
/* Continues a destroy once nothing is in flight. */
void uvccl__nccl_destroy_progress(nccl_group_t *g);
nccl_group_t *uvccl__nccl_group_new(uv_loop_t *loop, uvccl_pg_t *pg, int rank,
                                    int size, int device);
/* The device thread and this loop's client of it. */
int uvccl__nccl_group_attach(nccl_group_t *g, char *err, size_t errlen);
/* Frees a group that never got a client, from its timer's close. */
void uvccl__nccl_group_discard(nccl_group_t *g);

/* nccl_boot.c */
/* Creation of a world over a store: by ncclCommInitRankConfig, or, where
 * grown is set, by ncclCommGrow from parent (a member's old world; NULL
 * on a joiner). */
int uvccl__nccl_boot_start(uv_loop_t *loop, uvccl_pg_t *pg,
    uvccl_store_t *store, const uvccl_pg_options_t *o, uvccl_work_t *work,
    uvccl_work_cb cb, int grown, nccl_group_t *parent);
void uvccl__nccl_boot_fail(nccl_group_t *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* done() of the unique-id and init ops. */
void uvccl__nccl_boot_step(nccl_group_t *g, nccl_op_t *op);

/* nccl_subgroup.c: done() of a split. */
void uvccl__nccl_split_done(nccl_op_t *op);
/* A child group of p (not yet made: a split or shrink makes it). */
nccl_group_t *uvccl__nccl_child_new(nccl_group_t *p, uvccl_pg_t *pg, int rank,
                                    int size, char *err, size_t errlen);

/* nccl_shrink.c: done() of a shrink and of a revoke. */
void uvccl__nccl_shrink_done(nccl_op_t *op);
void uvccl__nccl_revoke_done(nccl_op_t *op);

/* nccl_grow.c: grows (src/pg/grow.c's backend entries). */
int uvccl__nccl_pg_grow_check(const uvccl_pg_t *pg, char *why, size_t len);
void uvccl__nccl_pg_grow_agree_key(uvccl_pg_t *pg, char *key, size_t len);
int uvccl__nccl_pg_grow_init(uv_loop_t *loop, uvccl_pg_t *parent,
    uvccl_pg_t *pg, uvccl_store_t *store, const uvccl_pg_options_t *opts,
    const uvccl__grow_plan_t *plan, uvccl_work_t *work, uvccl_work_cb cb);

#endif
