/* The GPU side's internal interfaces, shared by the device thread
 * (device.c, cuda_api.c) and the NCCL process groups (nccl_*.c).
 *
 * Shape (see ../shared/notes/gpu.md):
 *  - CUDA and NCCL are loaded at run time (dlopen), never linked, so the
 *    same binaries start on a machine with no GPU and no driver; then every
 *    entry point reports UVCCL_ENOGPU with the reason.
 *  - One GPU thread per device per process makes every CUDA and NCCL call
 *    for that device, in submission order. Loops never block on the GPU.
 *  - Each operation's work goes on a stream, then an end event from a
 *    reused pool (timing disabled) is recorded after it. The GPU thread
 *    keeps a FIFO per stream and polls only the oldest event of each
 *    (spin briefly, then back off), and hands completions to the
 *    submitting loop through the loop core's cross-thread queue, where the
 *    op's done() runs.
 *
 * Threads: fields marked (gpu) are touched only by the GPU thread, (loop)
 * only by the submitting loop's thread. */
#ifndef UVCCL_CUDA_GPU_H
#define UVCCL_CUDA_GPU_H

#include "loop/internal.h"

#include <stddef.h>
#include <stdint.h>

typedef struct uvccl__gpu_s uvccl__gpu_t;               /* a device's thread */
typedef struct uvccl__gpu_client_s uvccl__gpu_client_t; /* a loop's end */
typedef struct uvccl__gpu_op_s uvccl__gpu_op_t;

/* issue() results besides 0 and negative error codes. */
#define UVCCL__GPU_AGAIN 1 /* not finished issuing (a nonblocking NCCL call
                              returned ncclInProgress): call issue() again
                              on a later poll, before anything else on
                              this op's stream or communicator */

struct uvccl__gpu_op_s {
  /* Set by the submitter before uvccl__gpu_submit(). */
  /* (gpu) Makes the CUDA/NCCL calls that put the work on op->stream.
   * Returns 0 (issued: the end event is recorded on op->stream now; with
   * stream == NULL and no_event set, the op is done at once), a negative
   * error (op->msg says what failed; nothing recorded), or
   * UVCCL__GPU_AGAIN. */
  int (*issue)(uvccl__gpu_op_t *op);
  /* (loop) Runs once, on the submitting loop, when the op finished: status
   * 0, or its error (op->msg). The op memory is the submitter's again. */
  void (*done)(uvccl__gpu_op_t *op);
  void *stream;         /* cudaStream_t the work goes on */
  int no_event;         /* host-only op (comm init, destroy): done when
                           issue() returns 0 */
  uint64_t timeout_ms;  /* 0 = none; measured from when the work starts
                           on the GPU (a start event is recorded before
                           issue() when set), not from submission */
  void *data;           /* the submitter's */
  /* Results, valid in done(). */
  int status;
  char msg[160];
  uint64_t t_submit_ns;   /* uvccl__now_ns() clock */
  uint64_t t_issued_ns;   /* issue() returned 0 */
  uint64_t t_gpu_done_ns; /* the GPU thread saw the end event complete */
  uint64_t t_done_ns;     /* done() about to run on the loop */
  /* Private to device.c. */
  uvccl__xitem_t xitem_;
  uvccl__gpu_client_t *client_;
  uvccl__gpu_op_t *next_;
  void *start_ev_;
  void *end_ev_;
  uint64_t deadline_ns_;
  int state_;
};

/* Loads libcudart and libnccl (once per process; thread-safe) and counts
 * devices. 0, or UVCCL_ENOGPU with the reason in err ("libcudart.so.13:
 * cannot open shared object file", "cudaGetDeviceCount: CUDA driver
 * version is insufficient for CUDA runtime version (35)"). */
int uvccl__gpu_load(char *err, size_t errlen);

/* The thread of a device, started on first use, shared and refcounted. */
int uvccl__gpu_acquire(int device, uvccl__gpu_t **out, char *err,
                       size_t errlen);
void uvccl__gpu_release(uvccl__gpu_t *gpu);

/* A loop's connection to a device thread: completions arrive on this loop
 * (through an xqueue); a uv_timer watches the thread's heartbeat and fails
 * everything pending with UV_ETIMEDOUT ("GPU thread of device N stuck in
 * <call> for S s") when it stops while work is pending. */
int uvccl__gpu_client_init(uv_loop_t *loop, uvccl__gpu_t *gpu,
                           uvccl__gpu_client_t **out);
/* Ops still pending complete with UV_ECANCELED first; cb(arg) on the loop
 * once closed. */
void uvccl__gpu_client_close(uvccl__gpu_client_t *c, void (*cb)(void *arg),
                             void *arg);

/* (loop) Queues op; its done() runs exactly once, later, on c's loop,
 * never inside this call. 0 or an error (then done() never runs). */
int uvccl__gpu_submit(uvccl__gpu_client_t *c, uvccl__gpu_op_t *op);
/* (gpu) For issue(): names the call it is about to block in
 * ("ncclCommInitRankConfig"), for the watchdog's "stuck in <call>"
 * message; NULL goes back to "issue". */
void uvccl__gpu_in_call(uvccl__gpu_op_t *op, const char *call);
/* (loop) Every op of c not yet done completes with err and reason; ops
 * whose work is on the GPU are no longer polled (the caller aborts the
 * communicator, which is what stops the kernels). */
void uvccl__gpu_client_fail_all(uvccl__gpu_client_t *c, int err,
                                const char *reason);

#endif
