/* What the NCCL backend (src/nccl/) shows the layers above it besides its
 * table (pg/backend.h): hooks for benchmarks and tests. The files:
 * nccl_api.c (loading libnccl), nccl_pg.c (op life cycle, watchdog,
 * destroy/abort, queries), nccl_boot.c (creation over a store),
 * nccl_subgroup.c (new_group, split), nccl_ops.c (the operations),
 * nccl_exec.c (their device-thread side), nccl_url.c (creation from an
 * init URL), nccl_shrink.c (revoke, shrink), nccl_backend.c (the table);
 * nccl_internal.h is what they share. */
#ifndef UVCCL_NCCL_NCCL_H
#define UVCCL_NCCL_NCCL_H

#include "uvccl.h"

/* For benchmarks: the uvccl__now_ns() times of the group's last completed
 * op: submitted, issued, end event seen by the GPU thread, done() on the
 * loop. */
void uvccl__nccl_pg_times(const uvccl_pg_t *pg, uint64_t times[4]);
/* Tests only: the next collective of any NCCL group, once started on the
 * GPU, waits until the 32-bit word at dev_flag (device-visible, e.g.
 * mapped pinned memory) is >= 1 (cuStreamWaitValue32). */
void uvccl__nccl_debug_block_next(void *dev_flag);

#endif
