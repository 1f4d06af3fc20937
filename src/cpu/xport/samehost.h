/* What the shared-memory transport's files share (shm.c: setting up,
 * the loop's hooks, failure and teardown; shm_box.c: small collectives
 * through boxes; shm_tx.c: sending through a peer's ring, single copies;
 * shm_rx.c: reading the rings). */
#ifndef UVCCL_CPU_XPORT_SAMEHOST_H
#define UVCCL_CPU_XPORT_SAMEHOST_H

#include "cpu/internal.h"
#include "cpu/par.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct uvccl__shm_net_s {
  uvccl__shm_inbox_t ib;
  uv_prepare_t prep;
  uv_check_t check;
  uv_poll_t bell;
  uv_timer_t defer;      /* gives lost sends back from the loop */
  int nopen;             /* handles open */
  int started;
  int closed;            /* uvccl__shm_net_close ran */
  int *rx;               /* world ranks read through shared memory */
  int nrx;
  uint64_t nqueued;      /* sends waiting for room, all peers */
  sop_list_t lost;       /* sends a dead peer will never take */
  uint64_t cma_min;      /* single copy from this size (0: off) */
  int cma_auto; /* on or off when first wanted (uvccl__shm_cma_auto_decide) */
  char *scratch;         /* single-copy reductions read into this */
  /* Boxes (below): the world's small collectives started here, the
   * number of the next to post, whether it is posted, our own part. */
  sop_list_t boxq;
  uint64_t box_next;
  int box_posted;
  uint64_t *box_gone;    /* numbers of box collectives this rank abandoned
                            before posting its part (shm_box.c) */
  int nbox_gone, box_gone_cap;
  int box_pumping;
  int box_n;             /* the ranks 0 .. box_n - 1 the boxes were agreed
                            among (the net may grow past them later) */
  char box_own[UVCCL__SHM_BOX_MAX];
} shm_net_t;

#define SHM_PUBLISH_EVERY (256u * 1024)
#define SHM_DEFAULT_RING (1024u * 1024)
#define CMA_STEP (1024u * 1024)       /* one process_vm_readv */
#define CMA_SCRATCH (128u * 1024)     /* a reduction's step (stays in cache) */
/* The least a step moves when the turn is spent (turn.c): each peer's
 * ring and queue advance by at least this much a turn. */
#define SHM_STEP (64u * 1024)
#define CMA_REVOKE_MS 200

/* A reduction out of a ring, in parts (par.c): the kernels touch only
 * [off, off + n) of the op's buffers. */
typedef struct {
  net_t *net;
  sop_t *op;
  size_t at;
  const char *in;
} reduce_job_t;

static inline uint64_t uvccl__shm_pad8(uint64_t len) {
  return (8 - len % 8) % 8;
}

int uvccl__shm_box_pump(net_t *net);
int uvccl__shm_box_ready(net_t *net);
int uvccl__shm_cma_acked(peer_t *p);
int uvccl__shm_pump(peer_t *p);
void uvccl__shm_reduce_part(void *ctx, size_t off, size_t n);
void uvccl__shm_ring_corrupt(peer_t *p);

/* The transport's table entries (uvccl__shm_xport, shm.c). */
int uvccl__shm_net_init(net_t *net, char *err, size_t errlen);
int uvccl__shm_active(net_t *net);
void uvccl__shm_set_big_here(net_t *net, int big);
int uvccl__shm_host_big(net_t *net);
int uvccl__shm_poll(net_t *net);
void uvccl__shm_peer_up(peer_t *p);
void uvccl__shm_on_frame(peer_t *p, const frame_hdr_t *h,
                         const unsigned char *payload);
int uvccl__shm_send(peer_t *p, sop_t *op);
int uvccl__shm_orphan(peer_t *p, sop_t *op);
void uvccl__shm_drain(peer_t *p);
void uvccl__shm_kick(peer_t *p);
void uvccl__shm_peer_down(peer_t *p);
void uvccl__shm_net_close(net_t *net);
void uvccl__shm_net_free(net_t *net);

#endif
