/* CPU process groups: internals shared by the transport (net.c), the
 * schedule executor (sched.c), the group API (pg.c) and the algorithms.
 * Not installed.
 *
 * The model. A world group owns a "net": one listening socket and one TCP
 * connection to every other rank (full mesh); with a rank of the same
 * host, data frames go through shared-memory rings instead (shm.c) and
 * the connection carries the rest. Subgroups share their
 * parent's net; every frame names its group, so a subgroup costs no
 * socket. Every collective is compiled into a schedule: a small DAG of
 * sends, receives (plain or reducing) and local steps (copy, reduce,
 * scale). The executor starts an op once the ops it depends on are done;
 * receives are matched by (group, sequence, tag), so data that arrives
 * before its receive is posted is held as an early frame (a bounded
 * store, net.c), never "staged": that word is GPU staging's. Everything
 * runs on the group's loop thread, but for the helper thread (par.c),
 * which takes half of a large copy or reduction it claims with an atomic
 * flag (the loop thread takes back a half the helper has not started),
 * and single copy's measurement, once a process, on a thread of its own
 * (shm.c). */
#ifndef UVCCL_CPU_INTERNAL_H
#define UVCCL_CPU_INTERNAL_H

#include "loop/internal.h"
#include "loop/sendq.h"
#include "reduce/reduce.h"
#include "cpu/live/live.h"
#include "diag/flight.h"
#include "diag/fingerprint.h"
#include "diag/trace_watch.h"
#include "tls/tls.h"
#include "tls/conn.h"
#include "cpu/xport/shm_seg.h"
#include "cpu/xport/frame.h"

#include <string.h>

/* ---- Forward declarations ----------------------------------------------- */
typedef struct net_s net_t;
typedef struct peer_s peer_t;
typedef struct group_s group_t;
typedef struct sched_s sched_t;
typedef struct sop_s sop_t;
typedef struct early_s early_t;

/* An intrusive list of ops (through next/prev); an op is in at most one:
 * a peer's posted receives, a group's p2p receives, or the net's slices. */
typedef struct {
  sop_t *head;
  sop_t *tail;
} sop_list_t;

/* ---- Schedules ------------------------------------------------------------ */
typedef enum {
  SOP_SEND = 1,   /* buf/len to peer */
  SOP_RECV,       /* from peer into buf (len: expected; p2p: capacity) */
  SOP_RECV_RED,   /* from peer, reduced into buf: buf = buf op in, or
                     buf = src op in when src is set (no copy first) */
  SOP_COPY,       /* memcpy(buf, src, len) */
  SOP_REDUCE,     /* buf = buf op src (len bytes) */
  SOP_SCALE,      /* AVG / PREMUL_SUM on buf (len bytes) */
  SOP_CALL,       /* fn(sched, op): glue (sizes known only at run time) */
  SOP_BOX,        /* one of the world's small collectives through
                     shared-memory boxes (shm_box.c): every rank posts its
                     part, then each uses all P parts as `tag` says
                     (uvccl__box_kind_t) */
  SOP_NOP
} sop_type_t;

enum { SOP_WAITING = 0, SOP_ACTIVE, SOP_DONE };

/* What a box collective does with the P parts of len bytes (sop_t.tag).
 * "Per peer": rank r's part for peer j is src + j * len, else src. */
typedef enum {
  UVCCL__BOX_REDUCE = 0, /* allreduce, barrier (len 0): buf = the parts
                            reduced in rank order */
  UVCCL__BOX_CONCAT,     /* allgather: buf + r * len = part r */
  UVCCL__BOX_PICK,       /* broadcast from sop_t.source: buf = its part
                            (the others post none) */
  UVCCL__BOX_REDUCE_SCATTER, /* per peer; buf = the parts for us reduced
                                in rank order */
  UVCCL__BOX_ALLTOALL    /* per peer; buf + r * len = part r */
} uvccl__box_kind_t;

struct sop_s {
  uint8_t type;
  uint8_t state;
  uint8_t p2p;          /* frame kind P2P, tag = user tag */
  uint8_t writing;      /* a uv_write is in flight */
  uint16_t piece;       /* SEND/RECV of a frame cut across the peer's
                           connections (stripe.c): which piece, from 1;
                           0: the frame is whole */
  uint32_t deps;        /* unfinished predecessors */
  uint32_t succ_off;    /* successors: s->succ[succ_off .. +nsucc] */
  uint32_t nsucc;
  int peer;             /* world rank; RECV p2p: -1 = any */
  uint32_t tag;
  char *buf;
  const char *src;
  size_t len;
  uint64_t got;         /* RECV: bytes received so far */
  sched_t *s;
  int (*fn)(sched_t *s, sop_t *op);
  sop_t *next;          /* in the list `list` */
  sop_t *prev;
  sop_list_t *list;
  uint32_t ready_next;  /* executor's ready queue (index + 1) */
  int source;           /* RECV: the world rank it came from */
  uint64_t arrival;     /* RECV p2p: order for ANY_SOURCE */
  uint64_t slot_t;      /* BOX: the world's box collective number */
  early_t *handoff;     /* RECV: an early frame still being handed over to
                           it (net.c, "handing over") */
  peer_t *via;          /* SEND: the connection it went on */
  unsigned char hdr[UVCCL__FRAME_HDR];
  uvccl__wreq_t wreq;
};

typedef struct {
  uint32_t from;
  uint32_t to;
} sedge_t;

struct sched_s {
  group_t *g;
  uvccl_work_t *w;
  const char *name;      /* "allreduce" */
  uint32_t seq;
  int p2p;               /* point-to-point: no sequence, not ordered */
  int ordered;           /* barrier: completes after earlier ops */
  int sizes_late;        /* some frames' sizes are set while it runs (a
                            receiver cannot cut them as the sender does):
                            never striped */
  int list_waiting;      /* timeouts name the missing ranks: 1 the first,
                            2 all (monitored_barrier) */
  sop_t *ops;
  uint32_t nops, opcap;
  uint32_t nbox;         /* SOP_BOX ops among them */
  sedge_t *edges;
  uint32_t nedges, edgecap;
  uint32_t *succ, succcap; /* succcap: kept with the schedule */
  uint32_t remaining;    /* ops not yet done */
  uint32_t ready_head, ready_tail;
  int running;           /* inside the executor loop */
  int big;               /* a transfer over UVCCL__SPIN_SMALL_MAX bytes
                            (net_t.inflight_big) */
  int finished;          /* every op done */
  int completed;         /* the work was completed (ok or not) */
  int failing;           /* failed; completes once libuv gives back the
                            user's buffers (sends in flight) */
  int fail_status;
  char fail_msg[UVCCL_WORK_MSG_LEN];
  uint32_t nwriting;     /* sends libuv still holds */
  int status;            /* first failure */
  uvccl_dtype_t dtype;
  uvccl_redop_t op;
  uvccl__reduce_fn red;
  uvccl__reduce3_fn red3;
  size_t esize;
  int stream;            /* bytes land in the user's buffers through
                            non-temporal stores (uvccl__sched_stream) */
  double scale;          /* SOP_SCALE factor; 0 = divide by divisor */
  int64_t divisor;
  char *tmp;             /* scratch owned by the schedule */
  size_t tmpcap;
  void *user;            /* algorithm state (bytes collectives, split) */
  size_t user_cap;       /* its size where it is large scratch (spares) */
  int (*finish)(sched_t *s); /* runs before the work completes (ok);
                                nonzero fails the work with that code */
  void (*release)(sched_t *s); /* frees user */
  uvccl__fdesc_t desc;   /* what the flight recorder says of it */
  uvccl__fp_t *fps;      /* fingerprint checks: every member's (size) */
  uint64_t fid;          /* its flight recorder entry (0: none) */
  sched_t *next;         /* group's pending list, in start order */
  sched_t *prev;
  sched_t *free_next;
};

/* ---- Early frames: data that came before its receive was posted ---------- */
struct early_s {
  uint8_t kind;
  uint8_t big;           /* from uvccl__big_alloc */
  uint16_t piece;        /* frame_hdr_t.piece */
  uint32_t gid, seq, tag;
  int from;              /* world rank */
  uint64_t len, got;
  uint64_t cap;          /* bytes data[] holds (>= len: buffers are reused) */
  uint64_t arrival;
  sop_t *claim;          /* a receive waits for the rest, or takes the
                            bytes (being handed over) */
  uint64_t upto, done;   /* handing over: bytes to give, given */
  early_t *next;
  char data[];
};

/* ---- What the transport tells the layer above ------------------------------
 * The transport (net.c) never calls the schedules by name: it reports
 * through this table, which sched.c fills (uvccl__sched_upcalls) and pg.c
 * hands to each net, so the layers point one way (operations -> schedules
 * -> transport), and another transport can plug in beside TCP. */
typedef struct {
  void (*op_done)(sop_t *op);           /* a send or receive finished */
  void (*send_lost)(sop_t *op);         /* a send's connection broke */
  void (*op_fail)(sched_t *s, int err, const char *msg);
  /* n bytes arrived for offset off of a reducing receive */
  void (*reduce_in)(sop_t *op, size_t off, const void *in, size_t n);
  int (*slice)(sop_t *op);              /* next slice of a local op: 1 done */
  void (*group_fail_all)(group_t *g, int err, const char *msg);
  void (*group_fail_peer)(group_t *g, int world_rank, int err,
                          const char *msg);
  void (*group_break)(group_t *g, int err, const uvccl__fail_t *culprit,
                      const char *msg);
  void (*expire)(net_t *net);           /* the deadline timer fired */
} net_upcalls_t;

/* ---- Connections ---------------------------------------------------------- */
typedef enum {
  RS_HDR = 0, RS_DIRECT, RS_REDUCE, RS_EARLY, RS_DISCARD
} rstate_t;

typedef enum {
  PEER_NONE = 0,   /* no connection yet */
  PEER_CONNECTING, /* connect or hello in progress */
  PEER_UP,
  PEER_DEAD,       /* failed; error in err/errmsg */
  PEER_CLOSING
} peer_state_t;

/* Where a byte stream is in its current frame. */
typedef struct {
  rstate_t rstate;
  frame_hdr_t cur;
  uint64_t cur_got;
  sop_t *cur_op;
  early_t *cur_early;
} rx_t;

struct peer_s {
  net_t *net;
  int rank;              /* world rank; -1 until an incoming hello names it */
  peer_state_t state;
  int outgoing;          /* we connected (we sent hello) */
  uv_tcp_t tcp;
  int tcp_open;          /* uv_tcp_init done, not closed */
  uvccl__sendq_t sendq;  /* all output (never SIGPIPE); live while
                            sendq_open */
  int sendq_open;
  uv_connect_t creq;
  uv_timer_t retry;      /* connect backoff, close deadline */
  int retry_open;
  uint64_t backoff_ms;
  struct sockaddr_storage addr;
  char addrstr[64];
  uint64_t nonce;        /* the target's listener id (outgoing) */
  int shut;              /* half-closed our side */
  int eof;               /* peer half-closed */
  int err;
  /* receive state machines: the TCP stream's, and the shared-memory
   * ring's (shm.c), each mid-frame on its own */
  char *rbuf;
  size_t rcap, rlen;
  rx_t rx;
  rx_t srx;
  uint32_t srx_pad;      /* ring: padding still to skip after a frame */
  int reading;
  uint64_t read_c0;      /* uv_hrtime when a timed read's buffer was
                            given (rx.c; 0: not timed) */
  int read_refused;      /* on_alloc gave an empty buffer: the turn was
                            spent (on_read gets UV_ENOBUFS) */
  int paused;            /* early frames over their limit */
  /* collective receives posted for this peer, in posting order */
  sop_list_t posted;
  early_t *early_head, *early_tail;
  uint64_t early_bytes;
  unsigned char hello_buf[UVCCL__FRAME_HDR + sizeof(hello_t) +
                          UVCCL__AUTH_NONCE];
  uvccl__wreq_t hello_req;
  /* Authentication (worlds with a secret): the step reached (0 none yet,
   * 1 challenge sent or proof sent, 2 proven), both nonces, and the hello
   * the acceptor acts on once it is proven. */
  uvccl__tls_hs_t *tls_hs; /* TLS: the connect and handshake under way */
  int auth_step;
  uint8_t auth_nc[UVCCL__AUTH_NONCE], auth_ns[UVCCL__AUTH_NONCE];
  hello_t auth_hello;
  unsigned char auth_buf[UVCCL__FRAME_HDR + UVCCL__AUTH_NONCE +
                         UVCCL__AUTH_MAC];
  uvccl__wreq_t auth_req;
  peer_t *next_pending;  /* net's accepted-but-unnamed list */
  int nclosing;          /* unnamed peers: handles still closing */
  int left;              /* said BYE: its EOF is a clean leave */
  int left_applied;      /* ... and the monitor confirmed it (groups told) */
  unsigned char bye_hdr[UVCCL__FRAME_HDR];
  uvccl__wreq_t bye_req;
  int draining;          /* half-closed, reading to EOF (counted in the
                            net's nclosing already) */
  /* Shared memory (shm.c): this rank's slot in the peer's inbox, the
   * peer's slot in ours, and whether each is in use. */
  uvccl__shm_out_t *shm_out;
  uvccl__shm_in_t shm_in;
  int shm_tx;            /* frames to this peer go through its inbox */
  int shm_rx;            /* frames from it come through ours */
  int shm_step;          /* 1: its info arrived; 2: its answer too; 3: both */
  int shm_attached;      /* we mapped its inbox */
  int shm_peer_attached; /* it mapped ours */
  sop_list_t shm_sendq;  /* sends waiting for room in its ring */
  /* Single copy (shm.c): a large frame's payload is read by the receiver
   * straight from the sender's memory; its ring carries a descriptor.
   * Sender's side: whether it may, the last transfer's number, the send
   * it reads (NULL once orphaned: then cma_ghost, a copy, is read), and
   * whether that transfer is unacknowledged (later frames wait). */
  int cma_tx;
  uint64_t cma_seq;
  sop_t *cma_op;
  char *cma_ghost;
  int cma_wait;
  /* Receiver's side: its pid when we may read its memory (0: no), and
   * the transfer being read (cma_rx), its number and address. */
  uint32_t cma_pid;
  int cma_rx;
  uint64_t cma_rx_seq, cma_rx_addr;
  char reject[256];      /* REJECT payload to send, or received */
  unsigned char reject_buf[UVCCL__FRAME_HDR + 256];
  /* Lazy connections: what waits for the connection (data frames until
   * the shared-memory exchange is over, control frames until it is up),
   * and a dial refused because the other side's dial wins. */
  sop_list_t waitq;
  struct ctl_s *ctlq, *ctlq_tail;
  int crossed;
  int looking;           /* its address is being read from the store */
  /* Striped TCP (stripe.c): a rank on another host is reached through
   * this connection and nlanes more (lanes[i] carries lane i + 1), each a
   * peer_t whose owner is this one. */
  peer_t *owner;         /* a lane's: the rank's first connection */
  int lane;              /* a lane's number (1..); 0 for the first */
  peer_t **lanes;
  int nlanes;            /* lanes to this rank (set once both sides know
                            it is on another host) */
  int eof_waits;         /* it left and closed: its failure waits until
                            every lane is read to the end */
  sop_list_t stripeq;    /* pieces waiting for a connection with room */
};

/* the large scratch buffers a net keeps for its next collectives */
#define UVCCL__SPARES 4

struct net_s {
  const struct uvccl__xport_s *local_xport; /* same-host peers: shm.c's */
  uv_loop_t *loop;
  const net_upcalls_t *up;  /* the schedules' (see above) */
  /* the transport's own calls up its floors (xport/tcp.h) */
  const struct uvccl__net_hooks_s *hooks;
  int rank, size;
  int refs;              /* groups using it */
  uv_tcp_t listener;
  int listener_open;
  struct sockaddr_storage self;
  char selfstr[64];
  uint64_t nonce;
  uvccl__auth_key_t auth; /* the world's secret: connections prove it */
  uvccl__tls_ctx_t *tls;  /* TLS for every connection, or NULL */
  uvccl__acceptor_t acceptor; /* incoming connections (TLS first) */
  uvccl__refusals_t refusals;  /* their refusals' log lines, bounded */
  peer_t **peers;        /* by world rank; NULL for self (and, in a sparse
                            world, for a rank not yet needed) */
  /* Sparse worlds (more ranks than UVCCL_MESH_MAX): data connections are
   * made when a schedule first needs a peer, from the addresses every
   * rank published (book), and the monitor links form an overlay of
   * O(log N) links per rank instead of a full mesh. */
  int sparse;
  struct net_book_s *book; /* by world rank, once creation read them */
  int want_links;        /* monitor links creation waits for */
  peer_t *retired;       /* attempts a crossing dial replaced (their
                            memory goes with the net's) */
  /* Sparse worlds: where a rank not yet booked is asked for (the group
   * layer reads it from the store; uvccl__net_lookup_done answers), and
   * how that is stopped when the net closes. */
  int (*lookup)(void *arg, int rank);
  void (*lookup_close)(void *arg);
  void *lookup_arg;
  char (*addrs)[64];     /* every rank's published address, for messages */
  peer_t *pending;       /* accepted, hello not yet received */
  int nup;               /* peers UP */
  /* Creation: mesh_cb(net, 0, NULL) once every peer is connected and
   * linked, or (net, error, why) when creation cannot succeed. It waits
   * for want_up peers UP and want_shm shared-memory exchanges over (-1:
   * every other rank): a grow waits for its joiners only, a joiner for
   * the ranks alive (xport/grow.c). */
  int want_up, want_shm;
  /* Or, where set, what creation waits for (a grow's members: their
   * joiners' connections, exchanges and links, whatever happens to the
   * ranks that leave meanwhile). */
  int (*mesh_ready)(net_t *net);
  group_t *mesh_group;    /* where set, the group it makes: only its ranks'
                             deaths fail the creation */
  unsigned char *linked;  /* by world rank: its monitor link came up */
  /* A grow (xport/grow.c): grown_cb(net, 0) once the monitor takes links
   * from the new ranks, (net, error) if it cannot. */
  void (*grown_cb)(net_t *net, int status);
  void (*mesh_cb)(net_t *net, int status, const char *msg);
  void *mesh_arg;
  /* Liveness (live.c): the monitor, and what it told us. */
  uvccl__live_t *live;   /* NULL in a world of one */
  int live_port;
  uint64_t hb_ms;
  int links_up;
  uvccl__fail_t first;   /* the first failure learned (rank -1: none) */
  uvccl__fail_t *fails;  /* by world rank (rank -1: alive) */
  int *failed;           /* world ranks, in the order learned */
  int nfailed;
  int fenced;            /* the others declared this rank failed */
  /* Upcalls of the group layer (shrink.c): a FRAME_AGREE arrived; a
   * verdict (failed or left) on a rank. */
  void (*on_agree)(net_t *net, int from, const frame_hdr_t *h,
                   const unsigned char *payload);
  void (*on_failed)(net_t *net, int world_rank);
  struct agree_s *agrees;  /* shrink agreements (shrink.c) */
  void (*agrees_free)(net_t *net);
  group_t *groups;       /* every group on this net */
  uint64_t arrivals;     /* counter for early-frame/recv ordering */
  uint64_t early_limit;
  early_t *early_spare;  /* freed early-frame buffers kept for reuse (net.c) */
  uint32_t early_spare_n;
  uint64_t early_spare_bytes;
  early_t *early_small;  /* and small ones (EARLY_SMALL bytes each) */
  uint32_t early_small_n;
  /* busy polling */
  uv_idle_t spin;
  int spin_open;
  uint64_t spin_until_ns;
  uint32_t spin_us;      /* the window kick_spin asked for */
  int spin_kicked;       /* activity since on_spin last looked */
  int spin_yields;       /* the window is TCP's: give the CPU away each turn */
  int spin_check;        /* 0 not yet, 1 spin allowed, 2 oversubscribed
                            (spins yielding), 3 more so (spins yielding
                            only while every schedule is small), 4 even
                            more (never spins) */
  uint64_t inflight;     /* schedules pending on this net */
  uint64_t inflight_big; /* those with a large transfer (sched_t.big) */
  int host_big;          /* another rank of this host has one (looked at
                            by kick_spin and on_spin, spin_check 3) */
  struct uvccl__twatch_s *twatch; /* the world's dump requests (store) */
  /* Shared memory with the ranks of this host (shm.c); NULL: off. */
  struct uvccl__shm_net_s *shm;
  int shm_done;          /* peers whose shared-memory exchange is over */
  uint64_t *hosts;       /* by world rank: its host (shm_seg.c's key, from
                            the shared-memory offers; 0: not known) */
  uint64_t *kernels;     /* by world rank: its kernel, whose CPUs it shares
                            (hosts' second part; 0: not known) */
  uint64_t *lost;        /* hosts every rank of which failed, in the order
                            learned (hosts' third part; fail.c) */
  int nlost;
  int cut_off;           /* every rank on another host failed */
  /* Striped TCP (stripe.c): connections to each rank of another host
   * (1: no stripes), the smallest frame cut across them, and the lanes
   * creation waits for and has. */
  int stripes;
  size_t stripe_min;
  int lanes_want, lanes_up;
  /* Local ops larger than a slice, or met when the turn is spent, run a
   * turn's worth of slices per loop iteration, so a 256 MiB copy or
   * reduction never blocks the loop for long. */
  uv_idle_t slicer;
  int slicer_open;
  sop_list_t slices;
  /* Every callback of the net's on the loop is a turn with a budget of
   * bytes and time (src/loop/turn.c); the tick counts the loop's
   * iterations for it. */
  uvccl__turn_t turn;
  uv_prepare_t tick;
  int tick_open;
  /* Staged frames being handed over to their receives, in slices
   * (net.c), by the slicer too. */
  early_t *handoffs, *handoffs_tail;
  /* Large buffers no longer needed, unmapped a few MiB a turn by the
   * slicer too (src/loop/bigmem.c). */
  uvccl__big_list_t retired_mem;
  /* Large scratch (UVCCL__BIG_MIN or more) that collectives gave back,
   * kept for the next that need as much (schedules keep small scratch
   * only): mapped anew each time, a 256 MiB reduce_scatter's touched
   * 65,536 new pages, each a fault on the loop's thread, and unmapped
   * them again. Each is retired once spare_keep_ms pass without a taker
   * ($UVCCL_SCRATCH_KEEP_MS); at most UVCCL__SPARES, for collectives in
   * flight together. */
  struct {
    void *mem;
    size_t cap;
    uint64_t at;          /* loop ms it was given back */
  } spares[UVCCL__SPARES];
  int nspares;
  uint64_t spare_keep_ms; /* 0: none kept */
  /* The schedules' works (sched.c keeps their timeouts and delivery, see
   * src/loop/work.c): one timer for the earliest deadline, and a check
   * and an idle handle that deliver completed works later in the loop
   * iteration (the check in this one; the idle keeps the loop from
   * sleeping first when the check's turn has passed). */
  uv_timer_t deadline;
  uint64_t deadline_due;  /* loop ms it is set for; 0: not set */
  int deadline_idle;      /* set but unreferenced: nothing in flight */
  uv_check_t deliver_chk;
  uv_idle_t deliver_idle;
  int works_open;
  int closing;
  int nclosing;          /* handles still closing */
  void (*closed_cb)(net_t *net);
  void *closed_arg;
  int aborted;
};

/* ---- Groups --------------------------------------------------------------- */
struct group_s {
  net_t *net;
  uvccl_pg_t *pg;         /* the first handle (messages, callbacks) */
  int handles;            /* handles referring to it (find-or-create) */
  uint32_t gid;
  int rank, size;
  int *ranks;             /* group rank -> world rank */
  int *inv;               /* world rank -> group rank (-1) */
  uint32_t seq;
  uint32_t nchildren;
  uint64_t timeout_ms;
  uint32_t busy_us;
  size_t small_max;
  /* Small allreduces and barriers through a binomial tree (about 2 wake-ups
   * a rank) instead of recursive doubling or dissemination (log2 P): for
   * worlds with many more ranks than CPUs, where every wake-up costs a
   * context switch ($UVCCL_SMALL_TREE=1; uvccl-run sets it when it starts
   * more than 4 ranks a CPU). Every rank must choose alike. */
  int small_tree;
  int box_ok;             /* the world's small allreduces and barriers go
                             through shared-memory boxes (shm_box.c) */
  uint64_t box_seq;       /* the next box collective's number */
  size_t segment;
  size_t stage_chunk;     /* GPU buffers: staged in chunks this large
                             (stage.c; 0: whole) */
  size_t stream_min;      /* outputs this large are written around the
                             cache ($UVCCL_STREAM_MIN; 0: never) */
  char *tag;              /* find-or-create tag */
  sched_t *pend_head, *pend_tail; /* pending schedules, start order */
  sop_list_t p2p;         /* posted p2p receives */
  double *premul;
  int npremul;
  int broken;             /* failed: every later call fails at once */
  int broken_err;         /* with this code (EPEER, EREVOKED, ...) */
  uvccl__fail_t culprit;  /* why (rank -1 when no rank is to blame) */
  char broken_msg[UVCCL_WORK_MSG_LEN];
  size_t broken_head;     /* the host verdict put before it (fail.c) */
  uint32_t nshrinks;      /* shrink epochs started */
  int destroying;
  sched_t *free_scheds;
  group_t *next;          /* net's list */
  group_t *parent;
  /* owned bootstrap objects (init_url) */
  uvccl_store_t *own_store;
  uvccl_store_server_t *own_server;
  uvccl_pg_close_cb close_cb;
  int nsched;             /* schedule objects alive (not cached) */
  int closing_parts;      /* destroy: net, store, server still closing */
  void *boot;             /* creation in progress */
  struct uvccl__stager_s *stager; /* GPU buffers: staging (stage.c) */
  /* pg.c's: the last schedule of a group being destroyed is gone */
  void (*on_sched_gone)(group_t *g);
  /* Flight recorder: the group's record (NULL: not recorded), its
   * point-to-point count, and what it registers with. */
  uvccl__fgroup_t *fg;
  uint32_t p2p_seq;
  uint32_t trace_size;    /* the option (children inherit it) */
  int fp_check;           /* members compare fingerprints before each
                             collective (children inherit it) */
  char trace_name[64];    /* world: the store prefix; else set by kind */
  /* The rings' and chains' order (topo.c): position -> group rank, and
   * this rank's position; ring NULL: rank order. Made at the first
   * collective that asks (creation is over by then). */
  int *ring;
  int ring_pos;
  int ring_made;
  /* Hosts alike (ring.c, uvccl__ring_hosts): this rank's host's ranks
   * (hier[0 .. hier_L)), then each host's rank at this rank's place in
   * its host (hier[hier_L ..  + hier_H)), then the columns (L of H);
   * hier NULL: not so. */
  int *hier;
  int hier_L, hier_H, hier_me_l, hier_me_h;
  int hier_made;
  /* Hosts of any sizes (ring.c, uvccl__ring_leaders): this rank's host's
   * ranks, its leader first (lead[0 .. lead_L)), the hosts' leaders
   * (lead[size .. size + lead_H)), and where each host's ranks begin in
   * the ring (lead[2 size .. 2 size + lead_H], the last: size); lead
   * NULL: not so. */
  int *lead;
  int lead_L, lead_H, lead_me_l, lead_me_h;
  int lead_made;
};



static inline void sop_list_push(sop_list_t *l, sop_t *op) {
  op->next = NULL;
  op->prev = l->tail;
  if (l->tail) l->tail->next = op;
  else l->head = op;
  l->tail = op;
  op->list = l;
}

/* Returns 1 if op was in l. */
static inline int sop_list_remove(sop_list_t *l, sop_t *op) {
  if (op->list != l) return 0;
  if (op->prev) op->prev->next = op->next;
  else l->head = op->next;
  if (op->next) op->next->prev = op->prev;
  else l->tail = op->prev;
  op->next = op->prev = NULL;
  op->list = NULL;
  return 1;
}

/* ---- net.c ---------------------------------------------------------------- */
net_t *uvccl__net_new(uv_loop_t *loop, int rank, int size);
/* Binds and listens on addr (port 0 = any). */
/* Binds and listens on addr (port 0 = any), and starts the world's
 * monitor (heartbeat timeout hb_ms; 0 = none) on the same host. */
int uvccl__net_listen(net_t *net, const struct sockaddr *addr, uint64_t hb_ms,
                      char *err, size_t errlen);
/* Connects to peer rank at addr, and its monitor at live_port (with
 * retry/backoff until deadline_ms). */
int uvccl__net_connect(net_t *net, int rank, const struct sockaddr *addr,
                       uint64_t nonce, int live_port, uint64_t deadline_ms);
/* Sparse worlds: where rank is (what it published), for the dial made
 * when it is first needed. */
typedef struct net_book_s {
  struct sockaddr_storage addr;
  uint64_t nonce;
  int live_port;
} net_book_t;
/* The world is sparse (call before uvccl__net_listen): see net_t. */
int uvccl__net_set_sparse(net_t *net);
/* Sparse worlds: how an address not yet booked is found (start(arg, r)
 * returns 0 and later uvccl__net_lookup_done, or an error); close(arg)
 * when the net closes. */
void uvccl__net_set_lookup(net_t *net, int (*start)(void *, int),
                           void (*close)(void *), void *arg);
/* The lookup of rank r ended (status 0: booked; else why). */
void uvccl__net_lookup_done(net_t *net, int r, int status, const char *why);
/* Records rank's published address (sparse worlds). */
int uvccl__net_book(net_t *net, int rank, const struct sockaddr *addr,
                    uint64_t nonce, int live_port);
/* Sparse worlds, once every address is booked: dials this rank's lower
 * neighbours in the monitor's overlay; creation completes when all its
 * links are up. */
void uvccl__net_link_overlay(net_t *net, uint64_t deadline_ms);
/* The ranks a rank's monitor links to in a sparse world of size: r +- 2^k
 * (mod size). Writes at most max into out; returns how many. */
int uvccl__overlay_neighbours(int rank, int size, int *out, int max);
/* A peer's connection is ready for data (the shared-memory exchange is
 * over): what waited for it goes out. */
void uvccl__net_peer_ready(peer_t *p);
/* xport/grow.c. The world grows to size ranks (the new ones dial in):
 * the arrays by rank, every group's inverse map and the monitor grow;
 * grown_cb follows. 0, or an error (nothing changed). */
int uvccl__net_grow(net_t *net, int size, void (*grown_cb)(net_t *, int));
/* A rank that failed before this one joined (a joiner's net): no
 * connection or link is expected from it. 0, or an error. */
int uvccl__net_absent(net_t *net, int rank);
/* Shared-memory inbox slots for a net of size ranks: room for as many
 * again, so ranks that join later get rings too. */
uint32_t uvccl__shm_slots(int size);
/* Sends a frame. op->hdr is filled here. 1: written at once (done); 0:
 * queued (on_write completes the op); 2: the connection broke and the
 * monitor's verdict will fail the schedule (leave op pending); or an
 * error (peer dead). */
int uvccl__net_send(net_t *net, sop_t *op, uint8_t kind, uint32_t gid,
                    uint32_t seq);
/* Striped TCP (xport/stripe.c): how many pieces a frame of len bytes to
 * world rank r is cut into (1: not cut), and the size of each but the
 * last (*piece); the same at both ends. Both ends of a rank's connection
 * know its host: its lanes are dialed (shm.c calls this then). */
uint32_t uvccl__net_stripe_parts(const net_t *net, int r, size_t len,
                                 size_t *piece);
void uvccl__net_lanes_start(peer_t *o);
/* Posts a receive: matched against early frames first. May complete op
 * synchronously (through uvccl__sched_op_done). */
void uvccl__net_post_recv(net_t *net, sop_t *op);
/* Unlinks a posted receive (abandon). Returns 1 if data was mid-transfer
 * into it (the rest of that frame is read and dropped). */
int uvccl__net_unpost(net_t *net, sop_t *op);
/* A send still queued is detached from the caller's buffer: the rest of
 * the frame goes out from a copy, so the connection stays in step and the
 * caller may have the buffer back now. 0, or an error (then the
 * connection was closed instead). */
int uvccl__net_orphan(net_t *net, sop_t *op);
/* Marks a peer failed: closes its connection, fails every group's work
 * that involves it. */
void uvccl__net_peer_fail(net_t *net, peer_t *p, int err, const char *why);
void uvccl__net_abort(net_t *net, int err, const char *why);
/* Drops a group's early frames and p2p receives (group going away). */
void uvccl__net_forget_group(net_t *net, uint32_t gid);
/* Starts closing when refs reaches 0: half-close, drain, close. */
void uvccl__net_release(net_t *net, void (*cb)(net_t *net), void *arg);
void uvccl__net_kick_spin(net_t *net);
/* Works (see net_t): completed ones go out soon (0; nonzero when the
 * net is closing); the deadline timer at loop time due_ms at the latest,
 * or off; fast progress for a waiting caller (1 when it may go on: shared
 * memory, busy polling, a core of its own). */
int uvccl__net_defer_works(net_t *net);
void uvccl__net_deadline(net_t *net, uint64_t due_ms);
void uvccl__net_deadline_off(net_t *net);
int uvccl__net_poll_fast(net_t *net);
/* 1 when more ranks run on this host than it has CPUs (decided once). */
int uvccl__net_oversubscribed(net_t *net);
/* A schedule whose transfers all move this much or less is small: with
 * 3 or 4 ranks a CPU, loops spin (yielding) only while every schedule in
 * flight on this host is (net.c, uvccl__net_kick_spin). */
#define UVCCL__SPIN_SMALL_MAX ((size_t)128 * 1024)
/* 1 when a loop that waits polls yielding the CPU each turn rather than
 * spinning plainly: ranks outnumber CPUs (net.c). */
static inline int uvccl__net_spin_yielding(const net_t *net) {
  return net->spin_check == 2 ||
         (net->spin_check == 3 && net->inflight_big == 0 && !net->host_big);
}
void uvccl__net_slice_add(net_t *net, sop_t *op);
void uvccl__net_slice_remove(net_t *net, sop_t *op);
group_t *uvccl__net_group(net_t *net, uint32_t gid);
const char *uvccl__net_addr(net_t *net, int world_rank);
/* "shm", "tcp", "self" or "?" (not connected). */
const char *uvccl__net_transport(net_t *net, int world_rank);
/* A peer usable for traffic? 0; 1 when its connection broke and the
 * verdict is not in yet (start the work: the verdict fails it); or the
 * error to report, with msg. */
int uvccl__net_peer_ok(net_t *net, int world_rank, char *msg, size_t len);
/* 1 when world_rank left cleanly (said goodbye, its connection read to
 * the end, no failure): what it sent before leaving can still be received. */
int uvccl__net_left_cleanly(net_t *net, int world_rank);
/* 1 when the receive op's frame, from a rank that left cleanly, is here
 * (early, or whole and being handed over to op in slices). */
int uvccl__net_left_early(net_t *net, const sop_t *op);
/* What a work failing on g because of the world's failures says: the
 * first failed rank, from g's point of view. */
/* 1 when every rank of world rank r's host has failed (fail.c). */
int uvccl__net_host_lost(const net_t *net, int r);
void uvccl__net_fail_msg(net_t *net, group_t *g, const uvccl__fail_t *f,
                         char *buf, size_t len);
/* A group made from another after one of its members failed: it is born
 * broken (fail.c). */
void uvccl__net_group_born(net_t *net, group_t *g);
/* Creation failed here: every connected peer gets a REJECT with why (it
 * fails its own creation with it). */
void uvccl__net_reject_all(net_t *net, const char *why);
/* A notice to every rank of the world, out of band (the monitor's
 * links): revoke, or a group given up. */
void uvccl__net_notify(net_t *net, const uvccl__notice_t *n);
/* A small control frame (kind, gid, seq, tag, payload copied) to world
 * rank r, behind what is queued to it. 0 or an error (not connected). */
int uvccl__net_send_ctl(net_t *net, int r, uint8_t kind, uint32_t gid,
                        uint32_t seq, uint32_t tag, const void *payload,
                        size_t len);

/* The receive state machine's steps (net.c), shared with the ring
 * reader (shm.c): a header arrived / its frame is complete. 0, or -1 when
 * the peer went away meanwhile. */
int uvccl__net_frame_begin(peer_t *p, rx_t *rx, const frame_hdr_t *h);
int uvccl__net_frame_end(peer_t *p, rx_t *rx);
/* Creation waits for the shared-memory exchange too. */
void uvccl__net_check_ready(net_t *net);
/* A large buffer (uvccl__big_alloc) no longer needed: unmapped in the
 * net's turns, or now when the net is closing (or NULL). */
void uvccl__net_retire_mem(net_t *net, void *p);
/* A large scratch (uvccl__big_alloc, cap bytes) no longer needed: kept
 * among the net's spares (where they are all taken, in place of the
 * smallest if it is larger; what goes is retired), or freed now when the
 * net is closing. */
void uvccl__net_spare_put(net_t *net, void *p, size_t cap);
/* The smallest spare that holds len bytes (its size in *cap), else NULL. */
void *uvccl__net_spare_take(net_t *net, size_t len, size_t *cap);
/* Scratch of len bytes (its size in *cap): large from the spares or
 * mapped anew, small from malloc; NULL: out of memory. Given back with
 * uvccl__net_scratch_put (large to the spares). */
void *uvccl__net_scratch_get(net_t *net, size_t len, size_t *cap);
void uvccl__net_scratch_put(net_t *net, void *p, size_t cap);
/* Retires the spares that have waited spare_keep_ms (the tick). */
void uvccl__net_spare_expire(net_t *net);
void uvccl__net_maybe_closed(net_t *net);
/* The next loop iteration polls without blocking. */
void uvccl__net_spin_now(net_t *net);

/* ---- the same-host transport: a table (shm.c's) ---------------------------
 * Peers of this host also talk through shared memory: the TCP transport
 * (net.c, conn.c, rx.c, tx.c, fail.c) reaches it through net->local_xport
 * only, set by the group's creation; shm.c, shm_tx.c and shm_rx.c read
 * their frames through the TCP transport's frame steps. */
typedef struct uvccl__xport_s {
  const char *name;
  /* Sets up (unless $UVCCL_TRANSPORT=tcp or a world of one). */
  int (*net_init)(net_t *net, char *err, size_t errlen);
  /* 1 when it carries traffic of this net. */
  int (*active)(net_t *net);
  /* One look at what moved; 1 when something did. */
  int (*poll)(net_t *net);
  /* A peer's connection is up: tell it where to reach us. */
  void (*peer_up)(peer_t *p);
  /* Its offer arrived (FRAME_SHM, payload complete). */
  void (*on_frame)(peer_t *p, const frame_hdr_t *h,
                   const unsigned char *payload);
  /* Sends op's frame: 1 all in, 0 queued (op_done later), or an error. */
  int (*send)(peer_t *p, sop_t *op);
  /* A queued send goes on from a copy (see uvccl__net_orphan). */
  int (*orphan)(peer_t *p, sop_t *op);
  /* Reads what the peer sent (a clean leave, or an EOF first). */
  void (*drain)(peer_t *p);
  /* Its input is read again (it was paused: early frames over their
   * limit). */
  void (*kick)(peer_t *p);
  /* The peer is gone: its input is no longer read; queued sends are
   * lost. */
  void (*peer_down)(peer_t *p);
  void (*net_close)(net_t *net);
  void (*net_free)(net_t *net);
  /* Tells the host's other ranks whether a large collective is in flight
   * here (net_t.inflight_big); host_big: 1 when one of them has one. */
  void (*set_big)(net_t *net, int big);
  int (*host_big)(net_t *net);
} uvccl__xport_t;

extern const uvccl__xport_t uvccl__shm_xport;

/* Ranks of the world on this host (by address; a sparse world's share
 * of those it knows). */
int uvccl__net_local_ranks(const net_t *net);
/* Boxes, for the world's small collectives (at most this many ranks). */
#define UVCCL__SHM_BOX_WORLD 8
void uvccl__shm_boxes_offer(net_t *net);
int uvccl__shm_boxes_agreed(net_t *net);
void uvccl__shm_box_start(net_t *net, sop_t *op);
void uvccl__shm_box_remove(net_t *net, sop_t *op);
int uvccl__shm_box_needs(net_t *net, sop_t *op, int world_rank);

/* ---- shrink.c ---------------------------------------------------------------- */
/* The net's shrink upcalls (every world net gets them at creation). */
void uvccl__shrink_attach(net_t *net);
void uvccl__agree_free_all(net_t *net);
/* 1 where a shrink on this net decided world_rank had failed. */
int uvccl__agree_declared(const net_t *net, int world_rank);
/* g is being destroyed: a pending shrink of it fails. */
void uvccl__shrink_forget_group(group_t *g);

/* ---- sched.c -------------------------------------------------------------- */
/* Common argument checks at the call: group usable, work free. */
int uvccl__pg_check(uvccl_pg_t *pg, uvccl_work_t *w, group_t **gp);
int uvccl__pg_world(const group_t *g, int grank);
/* A fresh schedule for a collective on g (seq assigned) or p2p. */
sched_t *uvccl__sched_new(group_t *g, const char *name, int p2p);
void uvccl__sched_free(sched_t *s);
/* Builders. Return the op index. Peers are GROUP ranks here. */
uint32_t uvccl__sop_send(sched_t *s, int grank, uint32_t tag,
                         const void *buf, size_t len);
uint32_t uvccl__sop_recv(sched_t *s, int grank, uint32_t tag, void *buf,
                         size_t len);
uint32_t uvccl__sop_recv_red(sched_t *s, int grank, uint32_t tag, void *buf,
                             size_t len);
/* buf = src op (what arrives): an out-of-place reduction straight from the
 * caller's input, so no copy of src into buf has to come first. */
uint32_t uvccl__sop_recv_red_from(sched_t *s, int grank, uint32_t tag,
                                  void *buf, const void *src, size_t len);
uint32_t uvccl__sop_copy(sched_t *s, void *dst, const void *src,
                         size_t len);
uint32_t uvccl__sop_reduce(sched_t *s, void *dst, const void *src,
                           size_t len);
uint32_t uvccl__sop_scale(sched_t *s, void *buf, size_t len);
uint32_t uvccl__sop_call(sched_t *s, int (*fn)(sched_t *, sop_t *));
uint32_t uvccl__sop_nop(sched_t *s);
uint32_t uvccl__sop_box(sched_t *s, uvccl__box_kind_t kind, int root,
                        const void *src, void *buf, size_t len);
/* b runs after a. */
void uvccl__sop_dep(sched_t *s, uint32_t a, uint32_t b);
/* Reserves scratch (owned by s, freed with it). NULL on ENOMEM. */
void *uvccl__sched_tmp(sched_t *s, size_t len);
/* Whether s writes its output of out_bytes with non-temporal stores
 * (from its group's stream_min bytes; sched.c). */
void uvccl__sched_stream(sched_t *s, size_t out_bytes);
/* What the flight recorder says of s: dtype (-1: none, or already set by
 * set_op), element counts in and out, root (group rank or -1). */
void uvccl__sched_describe(sched_t *s, int dtype, uint64_t count_in,
                           uint64_t count_out, int root);
/* Checks the reduce op and sets the kernel and final scaling. */
int uvccl__sched_set_op(sched_t *s, uvccl_dtype_t dtype, uvccl_redop_t op);
/* Starts the schedule on work (work must not be pending). Returns 0 or an
 * error (then s is freed and the callback never runs). */
int uvccl__sched_start(sched_t *s, uvccl_work_t *w, uvccl_work_cb cb);
/* The transport's upcalls (net_upcalls_t). */
extern const net_upcalls_t uvccl__sched_upcalls;
/* Runs the next slice of a local op; returns 1 when the op is finished. */
int uvccl__sched_slice(sop_t *op);
void uvccl__sched_op_done(sop_t *op);
/* A send's connection broke: its buffer is back, but the op is not done
 * (the schedule waits for the monitor's verdict to fail it). */
void uvccl__sched_send_lost(sop_t *op);
void uvccl__sched_fail(sched_t *s, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails every pending schedule of g (err, message); with world_rank >= 0
 * only those that still need that rank (a clean leave). */
void uvccl__group_fail_all(group_t *g, int err, const char *msg);
void uvccl__group_fail_peer(group_t *g, int world_rank, int err,
                            const char *msg);
/* Marks g failed (later calls fail at once with err and msg), forgets
 * its early frames, and fails its pending works. culprit may be NULL. */
void uvccl__group_break(group_t *g, int err, const uvccl__fail_t *culprit,
                        const char *msg);
/* Reduce n bytes of src into dst with the schedule's kernel. */
void uvccl__sched_reduce(sched_t *s, void *dst, const void *src, size_t n);
/* A reducing receive's n bytes that arrived for offset off of op. */
void uvccl__sched_reduce_in(sop_t *op, size_t off, const void *in, size_t n);

/* A dissemination barrier's ops in s (round k tagged tag0 + k), after op
 * `after` (UINT32_MAX: none); returns the op that ends it. */
uint32_t uvccl__barrier_build(sched_t *s, uint32_t tag0, uint32_t after);

/* ---- algo/: the host collectives ------------------------------------------
 * What the public calls (ops.c) run for host buffers on TCP groups, and
 * what GPU staging (stage.c) runs on its pinned copies: same arguments,
 * same contract. */
int uvccl__host_allreduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          void *recvbuf, size_t count, uvccl_dtype_t dtype,
                          uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__host_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
                                    const uvccl_buf_t *bufs, size_t nbufs,
                                    uvccl_dtype_t dtype, uvccl_redop_t op,
                                    uvccl_work_cb cb);
int uvccl__host_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
                               const void *sendbuf, void *recvbuf, size_t count,
                               uvccl_dtype_t dtype, uvccl_redop_t op,
                               uvccl_work_cb cb);
int uvccl__host_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
                                const void *sendbuf, void *recvbuf,
                                const size_t *recvcounts, uvccl_dtype_t dtype,
                                uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__host_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
                          size_t count, uvccl_dtype_t dtype, int root,
                          uvccl_work_cb cb);
int uvccl__host_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype,
                       uvccl_redop_t op, int root, uvccl_work_cb cb);
int uvccl__host_allgather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          void *recvbuf, size_t count, uvccl_dtype_t dtype,
                          uvccl_work_cb cb);
int uvccl__host_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                           size_t sendcount, void *const *recvbufs,
                           const size_t *recvcounts, uvccl_dtype_t dtype,
                           uvccl_work_cb cb);
int uvccl__host_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                       void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                       uvccl_work_cb cb);
int uvccl__host_scatter(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                        void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
                        uvccl_work_cb cb);
int uvccl__host_alltoall(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                         void *recvbuf, size_t count, uvccl_dtype_t dtype,
                         uvccl_work_cb cb);
int uvccl__host_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
                          const size_t *sendcounts, void *recvbuf,
                          const size_t *recvcounts, uvccl_dtype_t dtype,
                          uvccl_work_cb cb);
int uvccl__host_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__host_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work, int wait_all,
                                  uvccl_work_cb cb);
int uvccl__host_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                     size_t len, int dst, int tag, uvccl_work_cb cb);
int uvccl__host_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
                     int src, int tag, uvccl_work_cb cb);
int uvccl__host_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_p2p_op_t *ops,
                          size_t nops, uvccl_work_cb cb);
int uvccl__host_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                                size_t len, int root, uvccl_work_cb cb);
int uvccl__host_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                                size_t len, uvccl_work_cb cb);
int uvccl__host_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
                             size_t len, int root, uvccl_work_cb cb);
int uvccl__host_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
                              const uvccl_buf_t *bufs, size_t nbufs, int root,
                              uvccl_work_cb cb);

/* ---- group.c: group objects ------------------------------------------------- */
/* A group of rank `rank` of `size` on net (ranks and inv to be filled;
 * counts as a reference to net). NULL on ENOMEM. */
group_t *uvccl__group_new(net_t *net, int rank, int size);
void uvccl__group_register(group_t *g);
void uvccl__group_unregister(group_t *g);
void uvccl__group_free(group_t *g);
/* A subgroup of parent with these parent ranks (find-or-create tag may be
 * NULL; kind names it in the flight recorder when there is no tag:
 * "new_group", "split", "shrink"); UVCCL_ENOTMEMBER when this rank is not
 * one of them. */
int uvccl__group_make_child(group_t *parent, uvccl_pg_t *pg, uint32_t gid,
                            const int *ranks, int n, const char *tag,
                            const char *kind);
/* The id every member computes for a child of parent. */
uint32_t uvccl__child_gid(uint32_t parent, uint32_t n, int color);

/* ---- pg.c ------------------------------------------------------------------ */
/* (pg_check and pg_world are sched.c's: every operation's first step) */

/* ---- tuning defaults -------------------------------------------------------- */
#define UVCCL__SMALL_MAX (64u * 1024)
/* The tag of the fingerprint messages (fingerprint checks): no algorithm
 * uses it. */
#define UVCCL__FP_TAG 0xfff0u
#define UVCCL__SEGMENT (512u * 1024)
/* From this many bytes of output a collective writes it with non-temporal
 * stores (uvccl__sched_stream): measured on the 2-core VM, below it they
 * lose (the ring forwards data still in the cache). */
#define UVCCL__STREAM_MIN ((size_t)8 << 20)
#define UVCCL__RBUF (256u * 1024)
/* Bytes read at a frame boundary (header plus the start of the payload). */
#define UVCCL__HDR_READ (UVCCL__FRAME_HDR + 4096u)
#define UVCCL__SLICE (1u << 20)
#define UVCCL__EARLY_LIMIT ((uint64_t)1 << 30)
#define UVCCL__PREMUL_BASE 0x100 /* custom PREMUL_SUM op ids */

/* ---- between a group's creation (create.c) and its life after (pg.c) ---- */

/* Calls fn(arg) from the loop soon, never inside the caller. */
int uvccl__pg_defer_call(uv_loop_t *loop, void (*fn)(void *), void *arg);
/* Fails the group's creation if it is still under way. */
void uvccl__pg_boot_cancel(group_t *g);
/* The group's last schedule is gone (destruction waits for it). */
void uvccl__pg_group_sched_gone(group_t *g);

/* A world grown on the members' net (grow.c decides, create.c makes it):
 * the net's size once grown, this rank's number in it, the new world's
 * ranks (group rank -> net rank; the members' first, in their order),
 * its id, and how many of them are members. */
typedef struct {
  int net_size, net_rank;
  const int *ranks;
  int size, members;
  uint32_t gid;
} uvccl__grow_shape_t;
/* Makes the grown world pg (parent: a member's world, NULL: a joiner's
 * first) with o->rank and o->size its place in it: a joiner makes a net
 * numbered as the members' and dials them; a member grows its net and
 * waits for the joiners; a store barrier ends it as a creation's does. */
int uvccl__cpu_pg_init_grown(uv_loop_t *loop, uvccl_pg_t *parent,
                             uvccl_pg_t *pg, uvccl_store_t *store,
                             const uvccl_pg_options_t *o,
                             const uvccl__grow_shape_t *sh, uvccl_work_t *w,
                             uvccl_work_cb cb);

/* ---- the CPU backend's entry points (backend.c puts them in its table) ---- */

int uvccl__cpu_pg_init(uv_loop_t *loop, uvccl_pg_t *pg, uvccl_store_t *store,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__cpu_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
    const uvccl_pg_options_t *opts, uvccl_work_t *work, uvccl_work_cb cb);
void uvccl__cpu_pg_destroy(uvccl_pg_t *pg, uvccl_pg_close_cb cb);
void uvccl__cpu_pg_abort(uvccl_pg_t *pg, const char *reason);
int uvccl__cpu_pg_get_failure(const uvccl_pg_t *pg, uvccl_pg_failure_t *f);
int uvccl__cpu_pg_failed_ranks(const uvccl_pg_t *pg, int *ranks, int max);
int uvccl__cpu_pg_revoke(uvccl_pg_t *pg, const char *reason);
int64_t uvccl__cpu_pg_grow_keep(const uvccl_pg_t *pg,
                                const unsigned char *leaving, int njoin,
                                char **ranks);
struct uvccl__grow_plan_s;
int uvccl__cpu_pg_grow_init(uv_loop_t *loop, uvccl_pg_t *parent,
    uvccl_pg_t *pg, uvccl_store_t *store, const uvccl_pg_options_t *opts,
    const struct uvccl__grow_plan_s *plan, uvccl_work_t *work,
    uvccl_work_cb cb);
int uvccl__cpu_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                         const int *exclude, int nexclude, uvccl_work_t *w,
                         uvccl_work_cb cb);
int uvccl__cpu_pg_new_group(uvccl_pg_t *parent, uvccl_pg_t *pg,
    const int *ranks, int nranks, const char *tag);
int uvccl__cpu_pg_split(uvccl_pg_t *parent, uvccl_pg_t *pg, int color,
    int key, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__cpu_pg_global_rank(const uvccl_pg_t *pg, int group_rank);
int uvccl__cpu_pg_group_rank(const uvccl_pg_t *pg, int global_rank);
const char *uvccl__cpu_pg_peer_address(const uvccl_pg_t *pg, int group_rank);
const char *uvccl__cpu_pg_peer_transport(const uvccl_pg_t *pg, int group_rank);
int uvccl__cpu_pg_peer_host(const uvccl_pg_t *pg, int group_rank);
void uvccl__cpu_pg_set_timeout(uvccl_pg_t *pg, uint64_t timeout_ms);
void uvccl__cpu_pg_set_busy_poll(uvccl_pg_t *pg, uint32_t us);
int uvccl__cpu_pg_premul_sum(uvccl_pg_t *pg, double factor, uvccl_redop_t *op);
/* uvccl_loop_before_block for the shared-memory rings of the groups on
 * loop (src/cpu/xport/shm.c). */
int uvccl__shm_before_block(uv_loop_t *loop);
int uvccl__cpu_pg_loop_stats(uvccl_pg_t *pg, uvccl_loop_stats_t *stats,
    int reset);
int uvccl__cpu_allreduce(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
    uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__cpu_allreduce_coalesced(uvccl_pg_t *pg, uvccl_work_t *work,
    const uvccl_buf_t *bufs, size_t nbufs, uvccl_dtype_t dtype,
    uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__cpu_reduce_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
    uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__cpu_reduce_scatterv(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, const size_t *recvcounts,
    uvccl_dtype_t dtype, uvccl_redop_t op, uvccl_work_cb cb);
int uvccl__cpu_broadcast(uvccl_pg_t *pg, uvccl_work_t *work, void *buf,
    size_t count, uvccl_dtype_t dtype, int root, uvccl_work_cb cb);
int uvccl__cpu_reduce(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
    void *recvbuf, size_t count, uvccl_dtype_t dtype, uvccl_redop_t op,
    int root, uvccl_work_cb cb);
int uvccl__cpu_allgather(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
    uvccl_work_cb cb);
int uvccl__cpu_allgatherv(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, size_t sendcount, void *const *recvbufs,
    const size_t *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__cpu_gather(uvccl_pg_t *pg, uvccl_work_t *work, const void *sendbuf,
    void *recvbuf, size_t count, uvccl_dtype_t dtype, int root,
    uvccl_work_cb cb);
int uvccl__cpu_scatter(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
    int root, uvccl_work_cb cb);
int uvccl__cpu_alltoall(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, void *recvbuf, size_t count, uvccl_dtype_t dtype,
    uvccl_work_cb cb);
int uvccl__cpu_alltoallv(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *sendbuf, const size_t *sendcounts, void *recvbuf,
    const size_t *recvcounts, uvccl_dtype_t dtype, uvccl_work_cb cb);
int uvccl__cpu_barrier(uvccl_pg_t *pg, uvccl_work_t *work, uvccl_work_cb cb);
int uvccl__cpu_monitored_barrier(uvccl_pg_t *pg, uvccl_work_t *work,
    int wait_all, uvccl_work_cb cb);
int uvccl__cpu_send(uvccl_pg_t *pg, uvccl_work_t *work, const void *buf,
    size_t len, int dst, int tag, uvccl_work_cb cb);
int uvccl__cpu_recv(uvccl_pg_t *pg, uvccl_work_t *work, void *buf, size_t len,
    int src, int tag, uvccl_work_cb cb);
int uvccl__cpu_p2p_batch(uvccl_pg_t *pg, uvccl_work_t *work,
    uvccl_p2p_op_t *ops, size_t nops, uvccl_work_cb cb);
int uvccl__cpu_broadcast_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__cpu_allgather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *buf, size_t len, uvccl_work_cb cb);
int uvccl__cpu_gather_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
    const void *buf, size_t len, int root, uvccl_work_cb cb);
int uvccl__cpu_scatter_bytes(uvccl_pg_t *pg, uvccl_work_t *work,
    const uvccl_buf_t *bufs, size_t nbufs, int root, uvccl_work_cb cb);

#endif
