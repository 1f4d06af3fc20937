/* Dumps everywhere at once, through a world's store (trace_watch.c): a
 * world that owns its store client polls <prefix>/trace/req and dumps when
 * any rank (a timeout) or uvccl-trace --live asks. */
#ifndef UVCCL_DIAG_TRACE_WATCH_H
#define UVCCL_DIAG_TRACE_WATCH_H

#include "uvccl.h"

typedef struct uvccl__twatch_s uvccl__twatch_t;

/* Polls <prefix>/trace/req in store every UVCCL_TRACE_POLL_MS (1000; NULL
 * when that is 0) on loop, for global rank `rank` of a world of `size`. */
uvccl__twatch_t *uvccl__trace_watch_start(uv_loop_t *loop, int rank, int size,
                                          uvccl_store_t *store,
                                          const char *prefix);
/* Before the store closes; freed once its operation in flight ends. */
void uvccl__trace_watch_stop(uvccl__twatch_t *tw);
/* Asks every rank to dump to its UVCCL_TRACE_DIR (a timeout here). */
void uvccl__trace_watch_request(uvccl__twatch_t *tw, const char *reason);

#endif
