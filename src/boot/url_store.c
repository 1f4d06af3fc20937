/* The store an init URL names (env://, tcp://HOST:PORT, file://PATH), for
 * uvccl_pg_init_url with either backend: rank and size come from the URL
 * or the launcher's environment, and rank 0 hosts the store server itself
 * for env:// and for tcp:// to a local address, so a job needs nothing
 * else running. */
#include "loop/internal.h"
#include "bootenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_store(uvccl_store_t *s) { uvccl__free(s); }
static void free_server(uvccl_store_server_t *s) { uvccl__free(s); }

void uvccl__url_close(uvccl_store_t *store, uvccl_store_server_t *server) {
  if (store != NULL) uvccl_store_close(store, free_store);
  if (server != NULL) uvccl_store_server_close(server, free_server);
}

/* Rank 0's embedded server on host:port (port 0 = any). It binds the
 * address the ranks are told (MASTER_ADDR, the tcp:// host), not every
 * interface: a world on loopback is reachable from this host only.
 * $UVCCL_STORE_BIND names another address to bind, or "any" for all.
 * *server stays NULL when a tcp:// address is already served by someone
 * else: that one is used. */
static int open_server(uv_loop_t *loop, const char *scheme, const char *host,
                       int port, const uvccl_pg_options_t *o,
                       const char *component,
                       uvccl_store_server_t **server) {
  uvccl_store_server_options_t sv;
  uvccl_store_server_t *s = uvccl__calloc(1, sizeof(*s));
  const char *bind = uvccl__config_text(UVCCL__CFG_STORE_BIND);
  int rc;
  if (s == NULL) return UV_ENOMEM;
  memset(&sv, 0, sizeof(sv));
  if (bind == NULL || *bind == '\0') sv.host = host;
  else if (strcmp(bind, "any") != 0) sv.host = bind;
  sv.port = port;
  sv.listen_fd = -1;
  sv.auth_token = o->auth_token;
  sv.auth_file = o->auth_file;
  sv.auth_none = o->auth_none;
  sv.tls_cert = o->tls_cert;
  sv.tls_key = o->tls_key;
  sv.tls_ca = o->tls_ca;
  sv.tls_none = o->tls_none;
  rc = uvccl_store_server_init(loop, s, &sv);
  if (rc == UV_EADDRINUSE && strcmp(scheme, "tcp") == 0) {
    uvccl__free(s);
    return 0;
  }
  if (rc != 0) {
    LOG_ERROR(component, "rank 0: store server on %s port %d: %s",
              sv.host ? sv.host : "every interface", port,
              uvccl_strerror(rc));
    uvccl__free(s);
    return rc;
  }
  *server = s;
  return 0;
}

int uvccl__url_open(uv_loop_t *loop, const char *url,
                    const uvccl_pg_options_t *opts, const char *component,
                    uvccl_pg_options_t *o, int *local_rank,
                    uvccl_store_t **storep, uvccl_store_server_t **serverp) {
  char scheme[UVCCL__URL_SCHEME_MAX], host[UVCCL__URL_HOST_MAX],
      path[UVCCL__URL_PATH_MAX], err[256];
  int port = 0, urank = -1, usize = -1, rc;
  uvccl_store_t *store;
  uvccl_store_server_t *server = NULL;

  *storep = NULL;
  *serverp = NULL;
  *local_rank = -1;
  memset(o, 0, sizeof(*o));
  if (opts != NULL) *o = *opts;
  rc = uvccl__url_parse(url, scheme, host, &port, path, &urank, &usize, err,
                        sizeof(err));
  if (rc != 0) {
    LOG_ERROR(component, "%s", err);
    return rc;
  }
  if (o->size <= 0) {
    if (usize > 0 && urank >= 0) {
      o->rank = urank;
      o->size = usize;
    } else if (strcmp(scheme, "env") == 0 || usize <= 0) {
      uvccl__env_t e;
      rc = uvccl__env_read(&e, err, sizeof(err));
      if (rc != 0) {
        LOG_ERROR(component, "%s: %s", url, err);
        return rc;
      }
      o->rank = e.rank;
      o->size = e.size;
      *local_rank = e.local_rank;
      if (strcmp(scheme, "env") == 0) {
        snprintf(host, sizeof(host), "%s", e.master_addr);
        port = e.master_port;
      }
    }
  }
  if (o->size <= 0 || o->rank < 0 || o->rank >= o->size) return UV_EINVAL;
  uvccl_log_set_rank(o->rank);
  store = uvccl__calloc(1, sizeof(*store));
  if (store == NULL) return UV_ENOMEM;
  if (strcmp(scheme, "file") == 0) {
    rc = uvccl_file_store_init(loop, store, path, o->size);
  } else if (strcmp(scheme, "env") == 0 || strcmp(scheme, "tcp") == 0) {
    uvccl_tcp_store_options_t so;
    /* torchrun's agent already serves a TCPStore at MASTER_PORT and tells
     * its workers to use it (as PyTorch's env:// rendezvous does); the
     * client finds out which dialect that PyTorch speaks */
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int agent_store = strcmp(scheme, "env") == 0 && agent != NULL &&
                      strcmp(agent, "True") == 0;
    if (o->rank == 0 && !agent_store && uvccl__host_is_local(host))
      rc = open_server(loop, scheme, host, port, o, component, &server);
    if (rc == 0) {
      memset(&so, 0, sizeof(so));
      so.host = host;
      so.port = port;
      so.auth_token = o->auth_token;
      so.auth_file = o->auth_file;
      so.auth_none = o->auth_none;
      so.tls_cert = o->tls_cert;
      so.tls_key = o->tls_key;
      so.tls_ca = o->tls_ca;
      so.tls_none = o->tls_none;
      so.timeout_ms =
          o->timeout_ms ? o->timeout_ms : UVCCL_PG_DEFAULT_TIMEOUT_MS;
      rc = uvccl_tcp_store_init(loop, store, &so);
    }
  } else {
    LOG_ERROR(component, "%s: unknown scheme \"%s\" (env, tcp or file)", url,
              scheme);
    rc = UV_EINVAL;
  }
  if (rc != 0) { /* the store never came up: nothing of it to close */
    uvccl__url_close(NULL, server);
    uvccl__free(store);
    return rc;
  }
  *storep = store;
  *serverp = server;
  return 0;
}
