/* uvccl-vsearch: the HTTP side, H2O on the service's own uv_loop_t. */
#ifndef VSEARCH_HTTP_H
#define VSEARCH_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "service.h"

typedef struct {
  int dim;
  int64_t rows;
  uint64_t seed;
  uint32_t max_k;
  const char *host;
  int port;               /* 0: any free port */
  size_t max_body;        /* bigger bodies get 413 */
  uint64_t client_timeout_ms; /* a request must arrive within this */
  uint64_t request_timeout_ms; /* a search is answered within this */
} http_options_t;

typedef struct http_s http_t;

/* Starts serving; prints "listening on HOST:PORT". NULL on error (printed). */
http_t *http_start(uv_loop_t *loop, svc_t *svc, const http_options_t *o);
/* 1 when the listener is up. */
int http_listening(http_t *h);
/* Stops listening (the process ends soon after: open connections are
 * left to it). */
void http_stop(http_t *h);

#endif
