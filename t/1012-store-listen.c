/* How the server listens: dual-stack "::" reached over IPv4 and IPv6, an
 * adopted pre-bound socket, a port already in use, and a graceful shutdown
 * that answers what it already received. */
#include "tap.h"
#include "uvccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static uv_loop_t loop;
static int closed;
static void on_closed(uvccl_store_t *s) { closed++; }
static int srv_closed;
static void on_srv_closed(uvccl_store_server_t *s) { srv_closed++; }

static int add_via(const char *host, int port, int64_t *out) {
  uvccl_store_t s;
  uvccl_tcp_store_options_t o = {0};
  uvccl_work_t w = {0};
  int r, before = closed;
  o.host = host;
  o.port = port;
  o.timeout_ms = 5000;
  if ((r = uvccl_tcp_store_init(&loop, &s, &o)) != 0) return r;
  uvccl_store_add(&s, &w, "n", 1, NULL);
  r = uvccl_work_wait(&w);
  *out = w.result;
  uvccl_store_close(&s, on_closed);
  while (closed == before) uv_run(&loop, UV_RUN_ONCE);
  return r;
}

static int have_ipv6(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {0};
  int ok6;
  if (fd < 0) return 0;
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  ok6 = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok6;
}

static int quiet_passed;
static void quiet_done(uv_timer_t *t) {
  (void)t;
  quiet_passed = 1;
}

int main(void) {
  uvccl_store_server_t srv, srv2;
  uvccl_store_server_options_t so = {0};
  struct sockaddr_in a = {0};
  socklen_t alen = sizeof(a);
  int64_t v;
  int fd, port, rc;

  tap_alarm(60);
  uv_loop_init(&loop);

  /* Default: "::" dual-stack (or 0.0.0.0 where IPv6 is off). */
  so.listen_fd = -1;
  /* the port is read after the call (an argument beside it may be
   * evaluated first) */
  rc = uvccl_store_server_init(&loop, &srv, &so);
  tap_require(rc == 0, "default listen (%s)", uvccl_strerror(rc));
  ok(srv.port > 0, "port 0 picked a free port");
  {
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    is_int(uvccl_store_server_getsockname(&srv, (struct sockaddr *)&ss, &len),
           0, "getsockname");
    is_int(ntohs(((struct sockaddr_in *)&ss)->sin_port), srv.port,
           "getsockname port (%s)", ss.ss_family == AF_INET6 ? "IPv6" : "IPv4");
  }
  is_int(add_via("127.0.0.1", srv.port, &v), 0, "reached over IPv4");
  is_int(v, 1, "value over IPv4");
  if (have_ipv6()) {
    is_int(add_via("::1", srv.port, &v), 0, "reached over IPv6");
    is_int(v, 2, "value over IPv6");
    is_int(add_via("localhost", srv.port, &v), 0, "reached by name");
  } else {
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
  }

  /* The same port again: the errno code, not a string to match. */
  so.port = srv.port;
  is_int(uvccl_store_server_init(&loop, &srv2, &so), UV_EADDRINUSE,
         "port in use is UV_EADDRINUSE");
  so.port = 70000;
  is_int(uvccl_store_server_init(&loop, &srv2, &so), UV_EINVAL,
         "port out of range");
  so.port = 0;

  /* Adopt a socket bound (and not yet listening) by someone else. */
  fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  tap_require(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "pre-bind");
  getsockname(fd, (struct sockaddr *)&a, &alen);
  port = ntohs(a.sin_port);
  so.listen_fd = fd;
  is_int(uvccl_store_server_init(&loop, &srv2, &so), 0, "adopt a bound fd");
  is_int(srv2.port, port, "reports the adopted port");
  is_int(add_via("127.0.0.1", port, &v), 0, "served on the adopted fd");
  is_int(v, 1, "its own data");

  /* Graceful shutdown: a request already sent is answered first. */
  {
    /* Static: the store's memory must outlive its close callback. */
    static uvccl_store_t s;
    static uvccl_work_t w, w2;
    uvccl_tcp_store_options_t o = {0};
    o.host = "127.0.0.1";
    o.port = srv2.port;
    o.timeout_ms = 5000;
    uvccl_tcp_store_init(&loop, &s, &o);
    uvccl_tcp_store_connect(&s, &w, NULL);
    is_int(uvccl_work_wait(&w), 0, "connected");
    uvccl_store_add(&s, &w, "n", 10, NULL);
    /* Run until the server has the request, then close the server. */
    {
      uvccl_store_server_stats_t st;
      uint64_t req0;
      uvccl_store_server_stats(&srv2, &st);
      req0 = st.requests;
      while (st.requests == req0) {
        uv_run(&loop, UV_RUN_ONCE);
        uvccl_store_server_stats(&srv2, &st);
      }
    }
    uvccl_store_server_close(&srv2, on_srv_closed);
    is_int(uvccl_work_wait(&w), 0, "in-flight request answered at shutdown");
    is_int(w.result, 11, "with the right value");
    /* A closing server answers its clients a moment more (requests on
     * their way), and lets each go once quiet for 100 ms: after that a
     * request is an error. */
    {
      uv_timer_t t;
      uv_timer_init(&loop, &t);
      uv_timer_start(&t, quiet_done, 300, 0);
      while (!quiet_passed) uv_run(&loop, UV_RUN_ONCE);
      uv_close((uv_handle_t *)&t, NULL);
    }
    uvccl_store_set_timeout(&s, 500); /* reconnecting is refused: fail fast */
    uvccl_store_add(&s, &w2, "n", 1, NULL);
    ok(uvccl_work_wait(&w2) < 0, "after shutdown the client gets an error: %s",
       w2.msg);
    uvccl_store_close(&s, on_closed);
  }
  uvccl_store_server_close(&srv, on_srv_closed);
  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(srv_closed, 2, "both servers' close callbacks ran");
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
