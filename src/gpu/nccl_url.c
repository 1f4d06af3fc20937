/* NCCL groups from an init URL (env://, tcp://HOST:PORT, file://PATH), as
 * uvccl_pg_init_url does for TCP groups: the URL gives the store (rank 0
 * hosts a store server for env:// and local tcp://), then the group is
 * made over it as by uvccl_pg_init, and owns the store and server: they
 * close with the group. */
#include "nccl_internal.h"
#include "../coll/bootenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int uvccl__nccl_pg_init_url(uv_loop_t *loop, uvccl_pg_t *pg, const char *url,
                            const uvccl_pg_options_t *opts, uvccl_work_t *work,
                            uvccl_work_cb cb) {
  char scheme[UVCCL__URL_SCHEME_MAX], host[UVCCL__URL_HOST_MAX],
      path[UVCCL__URL_PATH_MAX], err[256];
  int port = 0, urank = -1, usize = -1, rc;
  uvccl_pg_options_t o;
  uvccl_store_t *store;
  uvccl_store_server_t *server = NULL;
  nccl_group_t *g;

  if (loop == NULL || pg == NULL || url == NULL || work == NULL)
    return UV_EINVAL;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  o = *opts; /* the caller chose the NCCL backend: opts is set */
  rc = uvccl__url_parse(url, scheme, host, &port, path, &urank, &usize, err,
                        sizeof(err));
  if (rc != 0) {
    LOG_ERROR("nccl", "%s", err);
    return rc;
  }
  if (o.size <= 0) {
    if (usize > 0 && urank >= 0) {
      o.rank = urank;
      o.size = usize;
    } else {
      uvccl__env_t e;
      rc = uvccl__env_read(&e, err, sizeof(err));
      if (rc != 0) {
        LOG_ERROR("nccl", "%s: %s", url, err);
        return rc;
      }
      o.rank = e.rank;
      o.size = e.size;
      if (o.device < 0 && e.local_rank >= 0 && getenv("LOCAL_RANK") == NULL)
        o.device = e.local_rank; /* mpirun, srun: their local rank */
      if (strcmp(scheme, "env") == 0) {
        snprintf(host, sizeof(host), "%s", e.master_addr);
        port = e.master_port;
      }
    }
  }
  if (o.size <= 0 || o.rank < 0 || o.rank >= o.size) return UV_EINVAL;
  uvccl_log_set_rank(o.rank);
  store = uvccl__calloc(1, sizeof(*store));
  if (store == NULL) return UV_ENOMEM;
  if (strcmp(scheme, "file") == 0) {
    rc = uvccl_file_store_init(loop, store, path, o.size);
  } else if (strcmp(scheme, "env") == 0 || strcmp(scheme, "tcp") == 0) {
    uvccl_tcp_store_options_t so;
    if (o.rank == 0 && uvccl__host_is_local(host)) {
      uvccl_store_server_options_t sv;
      server = uvccl__calloc(1, sizeof(*server));
      if (server == NULL) {
        uvccl__free(store);
        return UV_ENOMEM;
      }
      memset(&sv, 0, sizeof(sv));
      sv.port = port;
      sv.listen_fd = -1;
      rc = uvccl_store_server_init(loop, server, &sv);
      if (rc == UV_EADDRINUSE && strcmp(scheme, "tcp") == 0) {
        uvccl__free(server); /* someone serves there already: use it */
        server = NULL;
        rc = 0;
      } else if (rc != 0) {
        LOG_ERROR("nccl", "rank 0: store server on port %d: %s", port,
                  uvccl_strerror(rc));
        uvccl__free(server);
        uvccl__free(store);
        return rc;
      }
    }
    memset(&so, 0, sizeof(so));
    so.host = host;
    so.port = port;
    so.timeout_ms = o.timeout_ms ? o.timeout_ms : UVCCL_PG_DEFAULT_TIMEOUT_MS;
    rc = uvccl_tcp_store_init(loop, store, &so);
  } else {
    LOG_ERROR("nccl", "%s: unknown scheme \"%s\" (env, tcp or file)", url,
              scheme);
    rc = UV_EINVAL;
  }
  if (rc != 0) { /* the store never came up: nothing to close */
    if (server != NULL)
      uvccl_store_server_close(server,
                               (uvccl_store_server_close_cb)uvccl__free);
    uvccl__free(store);
    return rc;
  }
  rc = uvccl__nccl_pg_init(loop, pg, store, &o, work, cb);
  if (rc != 0) {
    uvccl_store_close(store, (uvccl_store_close_cb)uvccl__free);
    if (server != NULL)
      uvccl_store_server_close(server,
                               (uvccl_store_server_close_cb)uvccl__free);
    return rc;
  }
  g = pg->impl_;
  g->own_store = store;
  g->own_server = server;
  return 0;
}
