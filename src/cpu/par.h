/* par.c: a helper thread that takes half of a large copy or reduction,
 * for ranks on a host with cores to spare.
 *
 * A rank's loop thread does every byte of its shared-memory traffic: the
 * copy into a peer's ring, and the copy or reduction out of its own. On a
 * host with more cores than ranks that bounds a large allreduce by one
 * core's memcpy while the other cores idle (bench/RESULTS.md). With the helper
 * on, a chunk of at least UVCCL__PAR_MIN bytes is cut in two: the helper
 * does the second part while the caller does the first, and the call
 * returns when both are done. */
#ifndef UVCCL_CPU_PAR_H
#define UVCCL_CPU_PAR_H

#include <stddef.h>

#define UVCCL__PAR_MIN (64u * 1024)

/* fn(ctx, off, n): one part of the work, [off, off + n). */
typedef void (*uvccl__par_fn)(void *ctx, size_t off, size_t n);

/* Decides once per process whether the helper runs: UVCCL_SHM_HELPER=1
 * on, 0 off, else on when the CPUs this process may use are at least
 * twice the ranks of the host (local_ranks). Starts it when on. 1 when
 * the helper is on. */
int uvccl__par_setup(int local_ranks);

/* Runs fn over [0, n), cut at a multiple of grain, half on the helper
 * where it is on, idle and n >= UVCCL__PAR_MIN; else all on the caller. */
void uvccl__par_run(uvccl__par_fn fn, void *ctx, size_t n, size_t grain);

/* memcpy through uvccl__par_run. */
void uvccl__par_memcpy(void *dst, const void *src, size_t n);

/* The same with non-temporal stores (x86-64; memcpy elsewhere): for a
 * destination too large to stay in the cache and not read again soon.
 * dst and src must not overlap. */
void uvccl__par_memcpy_stream(void *dst, const void *src, size_t n);

#endif
