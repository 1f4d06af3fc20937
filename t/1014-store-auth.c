/* Authenticated store connections (src/store/auth.h): a server with a
 * secret answers only clients that prove they hold it, and proves it holds
 * it too. Checked: the same secret (token, file, environment) works with
 * exact values; a secret file open to others is refused at init; another
 * secret, no secret (both dialects) and a secured client against an open
 * server fail with UVCCL_EAUTH and a message saying which; on raw
 * sockets, the wire format against an HMAC computed here from the
 * documented exchange; a replayed proof fails (fresh server nonce); garbage
 * before and during the exchange and a half-sent hello get the connection
 * closed, never a crash; PyTorch 1.13's client is refused; the server
 * counts the refusals. The server runs on a thread of its own (the raw
 * socket checks block). */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "loop_helpers.h"

#define SECRET "correct horse battery staple"
#define PY "/usr/bin/python3"

/* ---- the server, on its own thread ---------------------------------------- */

static uv_loop_t sloop;
static uvccl_store_server_t server;
static uv_async_t stop_async;
static uv_thread_t sthread;
static uv_sem_t started;
static int srv_rc;
static uvccl_store_server_stats_t final_stats;
static const char *srv_token; /* NULL: an open server */

static void on_stop(uv_async_t *a) {
  uvccl_store_server_stats(&server, &final_stats);
  uvccl_store_server_close(&server, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

static void srv_main(void *arg) {
  uvccl_store_server_options_t o;
  (void)arg;
  uv_loop_init(&sloop);
  memset(&o, 0, sizeof(o));
  o.host = "127.0.0.1";
  o.listen_fd = -1;
  o.auth_token = srv_token;
  o.auth_none = srv_token == NULL;
  srv_rc = uvccl_store_server_init(&sloop, &server, &o);
  uv_async_init(&sloop, &stop_async, on_stop);
  uv_sem_post(&started);
  uv_run(&sloop, UV_RUN_DEFAULT);
  uv_loop_close(&sloop);
}

static void start_server(const char *token) {
  srv_token = token;
  uv_sem_init(&started, 0);
  uv_thread_create(&sthread, srv_main, NULL);
  uv_sem_wait(&started);
  tap_require(srv_rc == 0, "server started (%s)", token ? "secured" : "open");
}

static void stop_server(void) {
  uv_async_send(&stop_async);
  uv_thread_join(&sthread);
  uv_sem_destroy(&started);
}

/* ---- our client ------------------------------------------------------------ */

static uv_loop_t loop;

typedef struct {
  const char *token, *file;
  int none;
  uvccl_dialect_t dialect;
} copts_t;

static int open_client(uvccl_store_t *s, copts_t c) {
  uvccl_tcp_store_options_t o;
  memset(&o, 0, sizeof(o));
  memset(s, 0, sizeof(*s));
  o.host = "127.0.0.1";
  o.port = server.port;
  o.timeout_ms = 5000;
  o.dialect = c.dialect;
  o.auth_token = c.token;
  o.auth_file = c.file;
  o.auth_none = c.none;
  return uvccl_tcp_store_init(&loop, s, &o);
}

/* set k=v then get it: 0, or the first error (message in msg) */
static int set_get(uvccl_store_t *s, const char *k, const char *v, char *msg,
                   size_t mlen) {
  uvccl_work_t w = {0}, g = {0};
  int rc = uvccl_store_set(s, &w, k, v, strlen(v), NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) {
    snprintf(msg, mlen, "%s", w.msg);
    return rc;
  }
  rc = uvccl_store_get(s, &g, k, NULL);
  if (rc == 0) rc = uvccl_work_wait(&g);
  if (rc == 0 && (g.value_len != strlen(v) || memcmp(g.value, v, g.value_len)))
    rc = UVCCL_EPROTO;
  snprintf(msg, mlen, "%s", g.msg);
  uvccl_work_cleanup(&g);
  return rc;
}

static void client_case(const char *what, copts_t c, int want,
                        const char *want_msg) {
  uvccl_store_t s;
  char msg[UVCCL_WORK_MSG_LEN] = "";
  int rc = open_client(&s, c);
  if (!is_int(rc, 0, "%s: client init", what)) return;
  rc = set_get(&s, "auth/k", "v1", msg, sizeof(msg));
  is_int(rc, want, "%s: %s (%s)", what, want ? uvccl_err_name(want) : "works",
         msg);
  if (want_msg)
    ok(strstr(msg, want_msg) != NULL, "%s: the message says \"%s\"", what,
       want_msg);
  store_close_wait(&loop, &s);
}

/* ---- raw sockets: the exchange as documented ------------------------------ */

static void mac(const char *role, const uint8_t *nc, const uint8_t *ns,
                uint8_t *out) {
  uint8_t key[32], buf[256];
  unsigned int n = 0;
  size_t l;
  /* K = SHA-256("uvccl-auth-key-1" | secret) */
  l = (size_t)snprintf((char *)buf, sizeof(buf), "uvccl-auth-key-1%s",
                       SECRET);
  EVP_Digest(buf, l, key, &n, EVP_sha256(), NULL);
  l = (size_t)snprintf((char *)buf, sizeof(buf), "uvccl-auth-1 %s store",
                       role);
  memcpy(buf + l, nc, 32);
  memcpy(buf + l + 32, ns, 32);
  HMAC(EVP_sha256(), key, 32, buf, l + 64, out, &n);
}

static int raw_connect(void) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)server.port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Reads n bytes within ms: n, fewer at EOF, -1 on timeout. */
static ssize_t read_n(int fd, uint8_t *b, size_t n, int ms) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t r;
    if (poll(&p, 1, ms) <= 0) return -1;
    r = read(fd, b + got, n - got);
    if (r <= 0) return (ssize_t)got;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* 1 when the server closed fd within ms (EOF or reset). */
static int closed_by_server(int fd, int ms) {
  uint8_t b[64];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t r;
    if (poll(&p, 1, ms) <= 0) return 0;
    r = read(fd, b, sizeof(b));
    if (r <= 0) return 1;
  }
}

static void raw_cases(void) {
  uint8_t hello[40], ch[72], ch2[72], proof[32], want[32], nc[32];
  int fd, i;
  ssize_t n;

  for (i = 0; i < 32; i++) nc[i] = (uint8_t)(i * 7 + 1);
  memcpy(hello, "UVCCLAU1", 8);
  memcpy(hello + 8, nc, 32);

  /* a whole exchange by hand */
  fd = raw_connect();
  tap_require(fd >= 0, "raw connection");
  ok(write(fd, hello, 40) == 40, "raw: HELLO sent");
  n = read_n(fd, ch, 72, 5000);
  is_int((int)n, 72, "raw: a 72-byte CHALLENGE comes back");
  ok(memcmp(ch, "UVCCLAU1", 8) == 0, "raw: it starts with the magic");
  mac("server", nc, ch + 8, want);
  ok(memcmp(ch + 40, want, 32) == 0, "raw: the server's MAC is HMAC-SHA-256 "
     "under K over (\"uvccl-auth-1 server store\", Nc, Ns), as documented");
  mac("client", nc, ch + 8, proof);
  ok(write(fd, proof, 32) == 32, "raw: PROOF sent");
  ok(!closed_by_server(fd, 300), "raw: after a right proof the connection "
     "stays open");
  close(fd);

  /* the same proof replayed on a new connection: a new server nonce */
  fd = raw_connect();
  ok(write(fd, hello, 40) == 40, "replay: the same HELLO");
  n = read_n(fd, ch2, 72, 5000);
  is_int((int)n, 72, "replay: a CHALLENGE");
  ok(memcmp(ch + 8, ch2 + 8, 32) != 0, "replay: the server's nonce is new");
  ok(write(fd, proof, 32) == 32, "replay: the recorded PROOF sent");
  ok(closed_by_server(fd, 5000), "replay: the server closes the connection");
  close(fd);

  /* garbage before the exchange: the magic, then closed */
  fd = raw_connect();
  ok(write(fd, "GET / HTTP/1.1\r\n\r\n", 18) == 18, "garbage: sent");
  n = read_n(fd, ch2, 8, 5000);
  ok(n == 8 && memcmp(ch2, "UVCCLAU1", 8) == 0, "garbage: the server answers "
     "its magic (\"authentication required\")");
  ok(closed_by_server(fd, 5000), "garbage: then closes");
  close(fd);

  /* garbage as the proof */
  fd = raw_connect();
  ok(write(fd, hello, 40) == 40 && read_n(fd, ch2, 72, 5000) == 72,
     "bad proof: HELLO and CHALLENGE");
  memset(proof, 0xAB, sizeof(proof));
  ok(write(fd, proof, 32) == 32, "bad proof: 32 bytes of garbage sent");
  ok(closed_by_server(fd, 5000), "bad proof: the server closes");
  close(fd);

  /* half a hello, then gone */
  fd = raw_connect();
  ok(write(fd, hello, 20) == 20, "half a HELLO sent, then closed");
  close(fd);
}

/* ---- PyTorch's client -------------------------------------------------------- */

static void pytorch_client(void) {
  char cmd[512], out[256] = "";
  FILE *p;
  if (access(PY, X_OK) != 0 ||
      system(PY " -c 'import torch.distributed' >/dev/null 2>&1") != 0) {
    ok(1, "# SKIP no python3-torch");
    return;
  }
  snprintf(cmd, sizeof(cmd),
           PY " -c \"import datetime, torch.distributed as d\n"
           "try:\n"
           "  s = d.TCPStore('127.0.0.1', %d, 1, False, "
           "datetime.timedelta(seconds=5)); s.set('x', 'y'); print('got', "
           "s.get('x'))\n"
           "except Exception as e: print('refused:', type(e).__name__)\" "
           "2>/dev/null",
           server.port);
  p = popen(cmd, "r");
  if (p != NULL) {
    if (fgets(out, sizeof(out), p) == NULL) out[0] = '\0';
    pclose(p);
  }
  out[strcspn(out, "\n")] = '\0';
  ok(strncmp(out, "refused:", 8) == 0, "PyTorch 1.13's client is refused "
     "(%s)", out);
}

int main(void) {
  char path[] = "/tmp/uvccl-auth-XXXXXX";
  int fd;
  uvccl_store_t s;

  tap_alarm(120);
  unsetenv("UVCCL_AUTH_TOKEN");
  unsetenv("UVCCL_AUTH_FILE");
  uv_loop_init(&loop);
  start_server(SECRET);

  client_case("the same secret (token)", (copts_t){SECRET, NULL, 0, 0}, 0,
              NULL);
  fd = mkstemp(path);
  tap_require(fd >= 0, "secret file");
  ok(write(fd, SECRET "\n", strlen(SECRET) + 1) > 0, "secret file written");
  close(fd);
  chmod(path, 0600);
  client_case("the same secret (a file, mode 600, trailing newline)",
              (copts_t){NULL, path, 0, 0}, 0, NULL);
  chmod(path, 0644);
  is_int(open_client(&s, (copts_t){NULL, path, 0, 0}), UV_EPERM,
         "a secret file readable by others is refused at init");
  chmod(path, 0600);
  setenv("UVCCL_AUTH_FILE", path, 1);
  client_case("the same secret ($UVCCL_AUTH_FILE)", (copts_t){0}, 0, NULL);
  unsetenv("UVCCL_AUTH_FILE");
  setenv("UVCCL_AUTH_TOKEN", SECRET, 1);
  client_case("the same secret ($UVCCL_AUTH_TOKEN)", (copts_t){0}, 0, NULL);
  unsetenv("UVCCL_AUTH_TOKEN");
  unlink(path);

  client_case("another secret", (copts_t){"wrong horse", NULL, 0, 0},
              UVCCL_EAUTH, "another secret");
  client_case("no secret", (copts_t){NULL, NULL, 1, 0}, UVCCL_EAUTH,
              "requires a secret");
  client_case("no secret, 1.13 dialect",
              (copts_t){NULL, NULL, 1, UVCCL_DIALECT_LEGACY}, UVCCL_EAUTH,
              "requires a secret");
  raw_cases();
  pytorch_client();
  client_case("the same secret after all that", (copts_t){SECRET, NULL, 0, 0},
              0, NULL);
  stop_server();
  ok(final_stats.auth_failures >= 7, "the server counted %llu refusals (at "
     "least 7: another secret, no secret twice, the replay, garbage twice, "
     "PyTorch)", (unsigned long long)final_stats.auth_failures);
  ok(final_stats.keys == 1, "only authenticated clients wrote (%llu key)",
     (unsigned long long)final_stats.keys);

  start_server(NULL);
  client_case("a secured client against an open server",
              (copts_t){SECRET, NULL, 0, 0}, UVCCL_EAUTH,
              "closed the connection at our authentication");
  client_case("no secret against an open server", (copts_t){NULL, NULL, 1, 0},
              0, NULL);
  stop_server();

  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "loop closes clean");
  return done_testing();
}
