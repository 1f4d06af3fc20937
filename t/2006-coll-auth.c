/* A world's secret (uvccl_pg_options_t.auth_token, issue 17's first step):
 * a world of one made from env:// with a secret serves its store only to
 * clients that hold it (a client without one fails with UVCCL_EAUTH, one
 * with it reads what the world wrote there); a world made without one
 * stays open. The mesh is not authenticated yet. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <stdlib.h>
#include <string.h>

static int closed, sclosed;
static void on_sclosed(uvccl_store_t *s) { sclosed = 1; }
static void on_closed(uvccl_pg_t *g) { closed = 1; }

/* a client of the world's store: 0 or the error of a num_keys */
static int probe(int port, const char *token, char *msg, size_t mlen) {
  uvccl_store_t s;
  uvccl_tcp_store_options_t o;
  uvccl_work_t w = {0};
  int rc;
  memset(&o, 0, sizeof(o));
  memset(&s, 0, sizeof(s));
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 5000;
  o.auth_token = token;
  o.auth_none = token == NULL;
  rc = uvccl_tcp_store_init(&loop, &s, &o);
  if (rc == 0) rc = uvccl_store_num_keys(&s, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  snprintf(msg, mlen, "%s", w.msg);
  sclosed = 0;
  uvccl_store_close(&s, on_sclosed);
  while (!sclosed) uv_run(&loop, UV_RUN_ONCE);
  return rc;
}

static void world(const char *what, const char *token) {
  uvccl_pg_t g;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  char port_s[16], msg[UVCCL_WORK_MSG_LEN];
  int port = free_port(), rc;

  snprintf(port_s, sizeof(port_s), "%d", port);
  setenv("MASTER_PORT", port_s, 1);
  memset(&o, 0, sizeof(o));
  memset(&g, 0, sizeof(g));
  o.timeout_ms = 20000;
  o.auth_token = token;
  o.auth_none = token == NULL;
  rc = uvccl_pg_init_url(&loop, &g, "env://", &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (!is_int(rc, 0, "%s: the world is made (%s)", what, w.msg)) return;
  rc = probe(port, NULL, msg, sizeof(msg));
  if (token) {
    is_int(rc, UVCCL_EAUTH, "%s: a client without the secret is refused "
           "(%s)", what, msg);
    rc = probe(port, token, msg, sizeof(msg));
    is_int(rc, 0, "%s: a client with it is served (%s)", what, msg);
    rc = probe(port, "not it", msg, sizeof(msg));
    is_int(rc, UVCCL_EAUTH, "%s: a client with another secret is refused "
           "(%s)", what, msg);
  } else {
    is_int(rc, 0, "%s: a client without a secret is served (%s)", what, msg);
  }
  closed = 0;
  uvccl_pg_destroy(&g, on_closed);
  while (!closed) uv_run(&loop, UV_RUN_ONCE);
}

int main(void) {
  tap_alarm(60);
  uv_loop_init(&loop);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  unsetenv("UVCCL_AUTH_TOKEN");
  unsetenv("UVCCL_AUTH_FILE");
  world("a world with a secret", "the group's secret");
  world("a world without one", NULL);
  setenv("UVCCL_AUTH_TOKEN", "from the environment", 1);
  {
    /* the options win over the environment */
    world("a world whose options give the secret, the environment another",
          "the group's secret");
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "the loop closes clean");
  return done_testing();
}
