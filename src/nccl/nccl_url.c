/* NCCL groups from an init URL (env://, tcp://HOST:PORT, file://PATH), as
 * uvccl_pg_init_url does for TCP groups: the URL gives the store (rank 0
 * hosts a store server for env:// and local tcp://), then the group is
 * made over it as by uvccl_pg_init, and owns the store and server: they
 * close with the group. */
#include "nccl_internal.h"
#include "boot/bootenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int uvccl__nccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
                            const uvccl_pg_options_t *opts, uvccl_work_t *work,
                            uvccl_work_cb cb) {
  uvccl_pg_options_t o;
  uvccl_store_t *store;
  uvccl_store_server_t *server;
  nccl_group_t *g;
  int rc, local_rank;

  if (loop == NULL || pg == NULL || url == NULL || work == NULL)
    return UV_EINVAL;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  rc = uvccl__url_open(loop, url, opts, "nccl", &o, &local_rank, &store,
                       &server);
  if (rc != 0) return rc;
  if (o.device < 0 && local_rank >= 0 && getenv("LOCAL_RANK") == NULL)
    o.device = local_rank; /* mpirun, srun: their local rank */
  rc = uvccl__nccl_pg_init(loop, pg, store, &o, work, cb);
  if (rc != 0) {
    uvccl__url_close(store, server);
    return rc;
  }
  g = pg->impl_;
  g->own_store = store;
  g->own_server = server;
  return 0;
}
