/* uvccl-vsearch: routes, request lifetimes, statistics (H2O).
 *
 * A search is answered later, from a collective's callback. H2O frees a
 * request's memory (its pool) when the client goes away; a small object
 * in that pool, with a dispose callback, tells us, so we never touch a
 * freed request and the service forgets the search. */
#include "http.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <h2o.h>

#include "query.h"

#define LAT_RING 16384

struct http_s {
  uv_loop_t *loop;
  svc_t *svc;
  http_options_t o;
  h2o_globalconf_t config;
  h2o_context_t ctx;
  h2o_accept_ctx_t accept_ctx;
  uv_tcp_t listener;
  int listening;
  /* stats */
  uint64_t n_search, n_rows, n_healthz, n_stats, n_4xx, n_5xx, n_200;
  uint32_t lat_us[LAT_RING];
  uint64_t nlat;
  uint64_t started_ms;
};

typedef struct search_s search_t;
typedef struct {
  search_t *s;          /* NULL once answered */
} req_ref_t;

struct search_s {
  svc_search_t ss;
  http_t *h;
  h2o_req_t *req;       /* NULL once the client went away */
  req_ref_t *ref;
  uint64_t t0_ns;
  float vec[];
};

/* H2O's handler, with a way back to us */
typedef struct {
  h2o_handler_t super;
  http_t *h;
} handler_t;

/* ---- replies ---------------------------------------------------------- */

static void send_json(http_t *h, h2o_req_t *req, int status,
                      const char *reason, const char *body, size_t len)
{
  if (status >= 500) h->n_5xx++;
  else if (status >= 400) h->n_4xx++;
  else h->n_200++;
  req->res.status = status;
  req->res.reason = reason;
  /* a known length: no chunked encoding, and the connection is kept for
   * every status (H2O closes it after a chunked reply other than 200) */
  req->res.content_length = len;
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                 H2O_STRLIT("application/json"));
  h2o_send_inline(req, body, len);
}

static const char *reason_of(int status)
{
  switch (status) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 413: return "Payload Too Large";
  case 503: return "Service Unavailable";
  default: return "Error";
  }
}

static void send_error(http_t *h, h2o_req_t *req, int status, const char *msg)
{
  vs_out_t o = {0};

  vs_out_printf(&o, "{\"error\": ");
  vs_out_json_string(&o, msg);
  vs_out_printf(&o, "}\n");
  if (o.oom)
    send_json(h, req, 503, "Service Unavailable", "{}\n", 3);
  else
    send_json(h, req, status, reason_of(status), o.buf, o.len);
  vs_out_free(&o);
}

/* ---- searches --------------------------------------------------------- */

static void on_req_dispose(void *p)
{
  req_ref_t *ref = p;
  search_t *s = ref->s;

  if (s == NULL)
    return;
  /* the client went away before its answer */
  s->req = NULL;
  s->ref = NULL;
  svc_cancel(s->h->svc, &s->ss);
  free(s);
}

static void on_search_done(svc_search_t *ss, int status,
                           const vs_cand_t *results, const char *err)
{
  search_t *s = (search_t *) ss;
  http_t *h = s->h;
  h2o_req_t *req = s->req;

  if (s->ref)
    s->ref->s = NULL; /* sending may dispose the request at once */
  s->ref = NULL;
  if (req != NULL) {
    if (status == 200) {
      vs_out_t o = {0};
      svc_stats_t st;
      char extra[96];
      uint64_t us = (uv_hrtime() - s->t0_ns) / 1000;

      svc_stats(h->svc, &st);
      snprintf(extra, sizeof(extra), ", \"ranks\": %d, \"epoch\": %d",
               st.ranks_alive, st.epoch);
      vs_out_results(&o, results, ss->k, extra);
      h->lat_us[h->nlat++ % LAT_RING] = us > UINT32_MAX ? UINT32_MAX : us;
      if (o.oom)
        send_error(h, req, 503, "out of memory");
      else
        send_json(h, req, 200, "OK", o.buf, o.len);
      vs_out_free(&o);
    } else {
      send_error(h, req, status, err ? err : "failed");
    }
  }
  free(s);
}

static void handle_search(http_t *h, h2o_req_t *req)
{
  int stride = svc_stride(h->svc);
  search_t *s = calloc(1, sizeof(*s) + sizeof(float) * (size_t) stride);
  char err[160];
  const char *serr = NULL;
  int rc;

  h->n_search++;
  if (s == NULL) {
    send_error(h, req, 503, "out of memory");
    return;
  }
  if (vs_parse_search(req->entity.base, req->entity.len, h->o.dim,
                      h->o.max_k, s->vec, &s->ss.k, err, sizeof(err)) != 0) {
    free(s);
    send_error(h, req, 400, err);
    return;
  }
  s->h = h;
  s->req = req;
  s->t0_ns = uv_hrtime();
  s->ss.data = s;
  s->ss.vec = s->vec;
  s->ss.cb = on_search_done;
  s->ss.deadline_ms = uv_now(h->loop) + h->o.request_timeout_ms;
  s->ref = h2o_mem_alloc_shared(&req->pool, sizeof(req_ref_t), on_req_dispose);
  s->ref->s = s;
  rc = svc_submit(h->svc, &s->ss, &serr);
  if (rc != 0) {
    s->ref->s = NULL;
    s->ref = NULL;
    free(s);
    send_error(h, req, rc, serr);
  }
}

/* ---- the other routes ------------------------------------------------- */

static void handle_row(http_t *h, h2o_req_t *req, const char *idp, size_t n)
{
  vs_out_t o = {0};
  int64_t id = 0;
  size_t i;
  int j;

  h->n_rows++;
  if (n == 0 || n > 18) {
    send_error(h, req, n == 0 ? 400 : 404, n == 0 ? "no row id"
                                                  : "no such row");
    return;
  }
  for (i = 0; i < n; i++) {
    if (idp[i] < '0' || idp[i] > '9') {
      send_error(h, req, 400, "a row id is a decimal number");
      return;
    }
    id = id * 10 + (idp[i] - '0');
  }
  if (id >= h->o.rows) {
    send_error(h, req, 404, "no such row");
    return;
  }
  /* rows are a function of the seed (table.h): rank 0 makes it here */
  vs_out_printf(&o, "{\"id\": %" PRId64 ", \"vector\": [", id);
  for (j = 0; j < h->o.dim; j++)
    vs_out_printf(&o, "%s%.9g", j ? ", " : "",
                  (double) vs_value(h->o.seed, h->o.dim, id, j));
  vs_out_printf(&o, "]}\n");
  if (o.oom)
    send_error(h, req, 503, "out of memory");
  else
    send_json(h, req, 200, "OK", o.buf, o.len);
  vs_out_free(&o);
}

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
  return x < y ? -1 : x > y;
}

static void handle_stats(http_t *h, h2o_req_t *req)
{
  svc_stats_t st;
  vs_out_t o = {0};
  size_t n = h->nlat < LAT_RING ? (size_t) h->nlat : LAT_RING;
  uint32_t *lat = n ? malloc(n * sizeof(uint32_t)) : NULL;
  int i;

  h->n_stats++;
  svc_stats(h->svc, &st);
  if (lat) {
    memcpy(lat, h->lat_us, n * sizeof(uint32_t));
    qsort(lat, n, sizeof(uint32_t), cmp_u32);
  }
#define PCT(p) (lat ? lat[(size_t) ((double) (n - 1) * (p))] : 0)
  vs_out_printf(&o, "{\"state\": \"%s\", \"uptime_s\": %.1f,\n", st.state,
                (double) (uv_now(h->loop) - h->started_ms) / 1000.0);
  vs_out_printf(&o, " \"requests\": {\"search\": %" PRIu64 ", \"rows\": %"
                PRIu64 ", \"healthz\": %" PRIu64 ", \"stats\": %" PRIu64
                ", \"ok\": %" PRIu64 ", \"4xx\": %" PRIu64 ", \"5xx\": %"
                PRIu64 "},\n", h->n_search, h->n_rows, h->n_healthz,
                h->n_stats, h->n_200, h->n_4xx, h->n_5xx);
  vs_out_printf(&o, " \"search_latency_us\": {\"count\": %zu, \"p50\": %u, "
                "\"p90\": %u, \"p99\": %u, \"max\": %u},\n", n, PCT(0.5),
                PCT(0.9), PCT(0.99), PCT(1.0));
  vs_out_printf(&o, " \"batches\": %" PRIu64 ", \"queries\": %" PRIu64
                ", \"mean_batch\": %.2f, \"queued\": %d,\n", st.batches,
                st.queries, st.batches ? (double) st.queries / st.batches : 0.0,
                st.queued);
  vs_out_printf(&o, " \"collectives_in_flight\": %d, \"ranks_alive\": %d, "
                "\"world_size\": %d, \"epoch\": %d,\n",
                st.collectives_in_flight, st.ranks_alive, st.world_size,
                st.epoch);
  vs_out_printf(&o, " \"rows\": %" PRId64 ", \"dim\": %d, \"shard0\": [%"
                PRId64 ", %" PRId64 "],\n", h->o.rows, h->o.dim, st.shard_lo,
                st.shard_hi);
  vs_out_printf(&o, " \"refreshes\": {\"ok\": %" PRIu64 ", \"bad\": %" PRIu64
                ", \"in_flight\": %d},\n", st.refreshes_ok, st.refreshes_bad,
                st.refresh_in_flight);
  vs_out_printf(&o, " \"failed_ranks\": [");
  for (i = 0; i < st.nfailed; i++)
    vs_out_printf(&o, "%s%d", i ? ", " : "", st.failed_ranks[i]);
  vs_out_printf(&o, "], \"last_failure\": ");
  vs_out_json_string(&o, st.last_failure);
  vs_out_printf(&o, "}\n");
#undef PCT
  free(lat);
  if (o.oom)
    send_error(h, req, 503, "out of memory");
  else
    send_json(h, req, 200, "OK", o.buf, o.len);
  vs_out_free(&o);
}

static void handle_healthz(http_t *h, h2o_req_t *req)
{
  svc_stats_t st;
  char body[256];
  int n, ok;

  h->n_healthz++;
  svc_stats(h->svc, &st);
  ok = strcmp(st.state, "running") == 0;
  n = snprintf(body, sizeof(body), "{\"status\": \"%s\", \"ranks_alive\": "
               "%d, \"epoch\": %d}\n", ok ? "ok" : st.state, st.ranks_alive,
               st.epoch);
  send_json(h, req, ok ? 200 : 503, ok ? "OK" : "Service Unavailable", body,
            (size_t) n);
}

static int is(h2o_iovec_t v, const char *s)
{
  return h2o_memis(v.base, v.len, s, strlen(s));
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
  http_t *h = ((handler_t *) self)->h;
  h2o_iovec_t path = req->path_normalized;
  int get = is(req->method, "GET") || is(req->method, "HEAD");
  int post = is(req->method, "POST");

  if (is(path, "/search")) {
    if (!post) {
      send_error(h, req, 405, "use POST /search");
      return 0;
    }
    handle_search(h, req);
  } else if (path.len > 6 && memcmp(path.base, "/rows/", 6) == 0) {
    if (!get) {
      send_error(h, req, 405, "use GET /rows/ID");
      return 0;
    }
    handle_row(h, req, path.base + 6, path.len - 6);
  } else if (is(path, "/healthz")) {
    handle_healthz(h, req);
  } else if (is(path, "/stats")) {
    handle_stats(h, req);
  } else {
    send_error(h, req, 404, "not found: POST /search, GET /rows/ID, "
               "GET /healthz, GET /stats");
  }
  return 0;
}

/* ---- connections ------------------------------------------------------ */

static void on_conn_closed(uv_handle_t *handle)
{
  free(handle);
}

static void on_accept(uv_stream_t *listener, int status)
{
  http_t *h = listener->data;
  uv_tcp_t *conn;
  h2o_socket_t *sock;

  if (status != 0)
    return;
  conn = malloc(sizeof(*conn));
  if (conn == NULL)
    return;
  uv_tcp_init(listener->loop, conn);
  if (uv_accept(listener, (uv_stream_t *) conn) != 0) {
    uv_close((uv_handle_t *) conn, on_conn_closed);
    return;
  }
  uv_tcp_nodelay(conn, 1);
  sock = h2o_uv_socket_create((uv_stream_t *) conn, on_conn_closed);
  h2o_accept(&h->accept_ctx, sock);
}

http_t *http_start(uv_loop_t *loop, svc_t *svc, const http_options_t *o)
{
  http_t *h = calloc(1, sizeof(*h));
  h2o_hostconf_t *host;
  h2o_pathconf_t *pathconf;
  handler_t *handler;
  struct sockaddr_storage ss;
  int rc, len = sizeof(ss);
  char name[INET6_ADDRSTRLEN] = "?";

  if (h == NULL)
    return NULL;
  h->loop = loop;
  h->svc = svc;
  h->o = *o;
  h->started_ms = uv_now(loop);
  h2o_config_init(&h->config);
  h->config.max_request_entity_size = o->max_body;
  h->config.http1.req_timeout = o->client_timeout_ms;
  h->config.http2.idle_timeout = o->client_timeout_ms;
  host = h2o_config_register_host(&h->config,
                                  h2o_iovec_init(H2O_STRLIT("default")), 65535);
  pathconf = h2o_config_register_path(host, "/", 0);
  handler = (handler_t *) h2o_create_handler(pathconf, sizeof(*handler));
  handler->super.on_req = on_req;
  handler->h = h;
  h2o_context_init(&h->ctx, loop, &h->config);
  h->accept_ctx.ctx = &h->ctx;
  h->accept_ctx.hosts = h->config.hosts;

  uv_tcp_init(loop, &h->listener);
  h->listener.data = h;
  rc = uv_ip4_addr(o->host, o->port, (struct sockaddr_in *) &ss);
  if (rc != 0)
    rc = uv_ip6_addr(o->host, o->port, (struct sockaddr_in6 *) &ss);
  if (rc == 0)
    rc = uv_tcp_bind(&h->listener, (struct sockaddr *) &ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *) &h->listener, 1024, on_accept);
  if (rc == 0)
    rc = uv_tcp_getsockname(&h->listener, (struct sockaddr *) &ss, &len);
  if (rc != 0) {
    fprintf(stderr, "uvccl-vsearch: cannot listen on %s:%d: %s\n", o->host,
            o->port, uv_strerror(rc));
    h->listening = 0;
    return h; /* http_stop closes what was made */
  }
  h->listening = 1;
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *) &ss, name, sizeof(name));
    printf("listening on [%s]:%d\n", name,
           ntohs(((struct sockaddr_in6 *) &ss)->sin6_port));
  } else {
    uv_ip4_name((struct sockaddr_in *) &ss, name, sizeof(name));
    printf("listening on %s:%d\n", name,
           ntohs(((struct sockaddr_in *) &ss)->sin_port));
  }
  fflush(stdout);
  return h;
}

int http_listening(http_t *h)
{
  return h->listening;
}

/* The context and configuration are not disposed: open connections may
 * still use them, and the process ends after a stop. */
void http_stop(http_t *h)
{
  uv_close((uv_handle_t *) &h->listener, NULL);
}
