/* The NCCL backend's table (src/pg/backend.h). */
#include "nccl_internal.h"
#include "pg/backend.h"

static const char *nccl_peer_transport(const uvccl_pg_t *pg, int group_rank) {
  return "nccl";
}

const uvccl__backend_t uvccl__nccl_backend = {
    .name = "nccl",
    .init = uvccl__nccl_pg_init,
    .init_url = uvccl__nccl_pg_init_url,
    .destroy = uvccl__nccl_pg_destroy,
    .abort = uvccl__nccl_pg_abort,
    .get_failure = uvccl__nccl_pg_get_failure,
    .failed_ranks = uvccl__nccl_pg_failed_ranks,
    .revoke = uvccl__nccl_pg_revoke,
    .shrink = uvccl__nccl_pg_shrink,
    .grow_check = uvccl__nccl_pg_grow_check,
    .grow_agree_key = uvccl__nccl_pg_grow_agree_key,
    .grow_init = uvccl__nccl_pg_grow_init,
    .new_group = uvccl__nccl_pg_new_group,
    .split = uvccl__nccl_pg_split,
    .global_rank = uvccl__nccl_pg_global_rank,
    .group_rank = uvccl__nccl_pg_group_rank,
    .peer_address = uvccl__nccl_pg_peer_address,
    .peer_transport = nccl_peer_transport,
    .set_timeout = uvccl__nccl_pg_set_timeout,
    .set_busy_poll = uvccl__nccl_pg_set_busy_poll,
    .premul_sum = uvccl__nccl_pg_premul_sum,
    .loop_stats = NULL,
    .allreduce = uvccl__nccl_allreduce,
    .allreduce_coalesced = uvccl__nccl_allreduce_coalesced,
    .reduce_scatter = uvccl__nccl_reduce_scatter,
    .reduce_scatterv = uvccl__nccl_reduce_scatterv,
    .broadcast = uvccl__nccl_broadcast,
    .reduce = uvccl__nccl_reduce,
    .allgather = uvccl__nccl_allgather,
    .allgatherv = uvccl__nccl_allgatherv,
    .gather = uvccl__nccl_gather,
    .scatter = uvccl__nccl_scatter,
    .alltoall = uvccl__nccl_alltoall,
    .alltoallv = uvccl__nccl_alltoallv,
    .barrier = uvccl__nccl_barrier,
    .monitored_barrier = uvccl__nccl_monitored_barrier,
    .send = uvccl__nccl_send,
    .recv = uvccl__nccl_recv,
    .p2p_batch = uvccl__nccl_p2p_batch,
    .broadcast_bytes = uvccl__nccl_broadcast_bytes,
    .allgather_bytes = uvccl__nccl_allgather_bytes,
    .gather_bytes = uvccl__nccl_gather_bytes,
    .scatter_bytes = uvccl__nccl_scatter_bytes,
};
