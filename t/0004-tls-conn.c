/* The connection helper shared by the store, the mesh and the monitor
 * (src/tls/conn.c), on its own: refusals logged at most 10 a second and
 * the rest counted; the dial backoff's steps and cap; a plain listener's
 * connection handed to the owner and taken into a handle; a descriptor
 * taken, and a bad one refused; a dial's status passed
 * through. TLS handshakes through it are t/2008's and t/1014's. */
#include "tap.h"
#include "tls/conn.h"

#include <sys/socket.h>
#include <unistd.h>

static uv_loop_t L;

static void test_refusals(void) {
  uvccl__refusals_t r = {0, 0};
  int i, logged = 0, unlogged = -1;
  for (i = 0; i < 25; i++) logged += uvccl__refusals_admit(&r, 5000, &unlogged);
  ok(logged == UVCCL__REFUSALS_PER_S && unlogged == 0,
     "25 refusals in one second: %d logged", logged);
  ok(uvccl__refusals_admit(&r, 5999, &unlogged) == 0 && unlogged == 0,
     "still the same second: not logged");
  logged = uvccl__refusals_admit(&r, 6000, &unlogged);
  ok(logged == 1 && unlogged == 16,
     "the next second: logged, and the 16 unlogged are told (%d)", unlogged);
  ok(uvccl__refusals_admit(&r, 7500, &unlogged) == 1 && unlogged == 0,
     "a quiet second after: nothing to tell");
}

static void test_backoff(void) {
  uint64_t ms = 0, seen[9];
  int i;
  for (i = 0; i < 9; i++) seen[i] = uvccl__backoff_next(&ms, 1000);
  ok(seen[0] == 10 && seen[1] == 20 && seen[2] == 40 && seen[6] == 640 &&
         seen[7] == 1000 && seen[8] == 1000 && ms == 1000,
     "backoff: 10, 20, 40 ... 640, then the 1000 ms cap");
  ms = 0;
  ok(uvccl__backoff_next(&ms, 5) == 5, "a cap below 10 ms holds");
}

/* ---- a plain listener through the acceptor ------------------------------- */

static uv_tcp_t listener, taken, client;
static uv_connect_t creq;
static uvccl__acceptor_t acc;
static int adopted, adopt_fd = -2, take_rc = 1, refused, connected = 1;

static void on_adopt(void *owner, int fd, const char *from) {
  adopted++;
  adopt_fd = fd;
  ok(owner == &acc && from == NULL, "a plain connection: no address yet");
  take_rc = uvccl__conn_take(&L, &taken, (uv_stream_t *)&listener, fd);
}

static void on_refused(void *owner, const char *from, const char *why) {
  refused++;
}

static void on_connection(uv_stream_t *s, int status) {
  if (status >= 0) uvccl__acceptor_incoming(&acc, s);
}

static void on_connect(uv_connect_t *req, int status) {
  connected = uvccl__dial_status((uv_tcp_t *)req->handle, status);
}

static void test_acceptor(void) {
  struct sockaddr_in a;
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  uv_ip4_addr("127.0.0.1", 0, &a);
  uv_tcp_init(&L, &listener);
  uv_tcp_bind(&listener, (struct sockaddr *)&a, 0);
  uv_listen((uv_stream_t *)&listener, 16, on_connection);
  uv_tcp_getsockname(&listener, (struct sockaddr *)&ss, &len);
  uvccl__acceptor_init(&acc, NULL, 0, 0, on_adopt, on_refused, &acc);
  uv_tcp_init(&L, &client);
  uv_tcp_connect(&creq, &client, (struct sockaddr *)&ss, on_connect);
  while (adopted == 0 || connected == 1) uv_run(&L, UV_RUN_ONCE);
  ok(adopted == 1 && adopt_fd == -1 && take_rc == 0 && refused == 0,
     "the acceptor hands the owner the connection; it is taken (%s)",
     uvccl_err_name(take_rc));
  ok(connected == 0, "the dial's status passes through (%s): another end",
     uvccl_err_name(connected));
  ok(uvccl__dial_status(&client, UV_ETIMEDOUT) == UV_ETIMEDOUT,
     "an error passes through as it is");
  uvccl__acceptor_cancel(&acc);
  uv_close((uv_handle_t *)&taken, NULL);
  uv_close((uv_handle_t *)&client, NULL);
  uv_close((uv_handle_t *)&listener, NULL);
  uv_run(&L, UV_RUN_DEFAULT);
}

static void test_take_fd(void) {
  int sv[2], rc;
  uv_tcp_t t;
  ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "a socket pair");
  /* an AF_UNIX descriptor is no TCP socket, but uv_tcp_open takes any
   * stream socket: taken */
  rc = uvccl__conn_take(&L, &t, NULL, sv[0]);
  ok(rc == 0, "a descriptor is taken (%s)", uvccl_err_name(rc));
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&L, UV_RUN_DEFAULT);
  {
    int fd = dup(sv[1]);
    close(fd); /* a number that is no descriptor any more */
    rc = uvccl__conn_take(&L, &t, NULL, fd);
    ok(rc == UV_EBADF, "a bad descriptor: refused (%s)", uvccl_err_name(rc));
  }
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&L, UV_RUN_DEFAULT);
  close(sv[1]);
}

int main(void) {
  plan(4 + 2 + 4 + 3 + 1);
  uv_loop_init(&L);
  test_refusals();
  test_backoff();
  test_acceptor();
  test_take_fd();
  ok(uv_loop_close(&L) == 0, "nothing left on the loop");
  return done_testing();
}
