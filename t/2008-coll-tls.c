/* TLS on the store, the mesh and the liveness links (issue 17):
 * certificates made
 * here with the openssl command (a job CA, ranks' certificates, and a
 * stranger's CA and certificate). In one process (ranks on one loop):
 *   a) three ranks with certificates of the job's CA: created; an
 *      allreduce of 1 MiB and a broadcast of 16 MiB arrive whole (many
 *      TLS records each, through the relay where the kernel has no kTLS);
 *   b) a rank whose certificate another CA signed: refused by the rank it
 *      dials, which logs why; it fails with UVCCL_EAUTH at once;
 *   c) a rank that trusts another CA: rank 0's certificate does not verify
 *      for it: UVCCL_EAUTH, saying so;
 *   d) a rank without TLS in a TLS world: refused (logged), creation
 *      fails; a stray plaintext connection to a TLS listener is closed;
 *   e) half a configuration (a certificate, no key, no CA), a key that is
 *      not the certificate's, a missing file: UV_EINVAL, logged;
 *   f) TLS and a secret together: created, right;
 *   the store: a client with the job CA's certificate sets and gets; one
 *      with a stranger's, one trusting another CA: UVCCL_EAUTH; one
 *      without TLS fails; the server logs and counts the refusals.
 * In separate processes: uvccl-run with $UVCCL_TLS_* runs uvccl-bench's
 * checked collectives on 3 ranks, and every rank leaves cleanly; a rank of
 * 4 SIGKILLed mid-run: the survivors name it, shrink and finish. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"
#include "logcap.h"
#include "inproc.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef UVCCL_BUILD_DIR
#define UVCCL_BUILD_DIR "build"
#endif

static char dir[64];
static char ca[128], cert[128], key[128], bad_cert[128], bad_key[128],
    bad_ca[128];

typedef struct {
  const char *cert, *key, *ca;
  int none;
  const char *secret;
} tls_t;

static int init_rank(uvccl_pg_t *gp, uvccl_store_t *st, int rank, int size,
                     const char *prefix, uint64_t timeout, uvccl_work_t *w,
                     const tls_t *t) {
  uvccl_pg_options_t o;
  memset(&o, 0, sizeof(o));
  o.rank = rank;
  o.size = size;
  o.prefix = prefix;
  o.timeout_ms = timeout;
  o.host = "127.0.0.1";
  o.tls_cert = t->cert;
  o.tls_key = t->key;
  o.tls_ca = t->ca;
  o.tls_none = t->none;
  o.auth_token = t->secret;
  o.auth_none = t->secret == NULL;
  return uvccl_pg_init(&L, gp, st, &o, w, NULL);
}

/* 1 MiB allreduce (float32, each rank i + 1 at every j, plus j) and a
 * 16 MiB broadcast from rank n - 1: 1 when every byte is right. */
static int data_ok(uvccl_pg_t *gp, int n) {
  enum { AN = 256 * 1024, BN = 16 * 1024 * 1024 };
  float *a[4];
  unsigned char *b[4];
  uvccl_work_t w[4];
  int i, good = 1;
  size_t j;
  memset(w, 0, sizeof(w));
  for (i = 0; i < n; i++) {
    a[i] = malloc(AN * sizeof(float));
    for (j = 0; j < AN; j++) a[i][j] = (float)(i + 1) + (float)(j % 1000);
    if (uvccl_allreduce(&gp[i], &w[i], a[i], a[i], AN, UVCCL_FLOAT32,
                        UVCCL_SUM, NULL) != 0)
      good = 0;
  }
  wait_all(w, n, 20000);
  for (i = 0; i < n; i++) {
    if (w[i].status != 0) good = 0;
    for (j = 0; j < AN && good; j++)
      if (a[i][j] != (float)(n * (n + 1) / 2) + (float)n * (float)(j % 1000))
        good = 0;
    free(a[i]);
  }
  memset(w, 0, sizeof(w));
  for (i = 0; i < n; i++) {
    b[i] = malloc(BN);
    for (j = 0; j < BN; j++)
      b[i][j] = i == n - 1 ? (unsigned char)(j * 131 + (j >> 12)) : 0;
    if (uvccl_broadcast(&gp[i], &w[i], b[i], BN, UVCCL_UINT8, n - 1,
                        NULL) != 0)
      good = 0;
  }
  wait_all(w, n, 30000);
  for (i = 0; i < n; i++) {
    if (w[i].status != 0) good = 0;
    for (j = 0; j < BN && good; j++)
      if (b[i][j] != (unsigned char)(j * 131 + (j >> 12))) good = 0;
    free(b[i]);
  }
  return good;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  return system(cmd);
}

/* The job's CA and a rank certificate; a stranger's CA and certificate. */
static int make_certs(void) {
  const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
  snprintf(cert, sizeof(cert), "%s/rank.pem", dir);
  snprintf(key, sizeof(key), "%s/rank.key", dir);
  snprintf(bad_ca, sizeof(bad_ca), "%s/other-ca.pem", dir);
  snprintf(bad_cert, sizeof(bad_cert), "%s/other.pem", dir);
  snprintf(bad_key, sizeof(bad_key), "%s/other.key", dir);
  return sh("(cd %s && "
            "openssl req -x509 %s -keyout ca.key -out ca.pem -days 2 "
            "-subj '/CN=uvccl job CA' && "
            "openssl req %s -keyout rank.key -out rank.csr "
            "-subj '/CN=uvccl rank' && "
            "openssl x509 -req -in rank.csr -CA ca.pem -CAkey ca.key "
            "-CAcreateserial -out rank.pem -days 2 && "
            "openssl req -x509 %s -keyout other-ca.key -out other-ca.pem "
            "-days 2 -subj '/CN=a stranger CA' && "
            "openssl req %s -keyout other.key -out other.csr "
            "-subj '/CN=a stranger' && "
            "openssl x509 -req -in other.csr -CA other-ca.pem "
            "-CAkey other-ca.key -CAcreateserial -out other.pem -days 2 "
            ") >/dev/null 2>&1",
            dir, ec, ec, ec, ec);
}

/* ---- a), f) ------------------------------------------------------------------ */

static void world3(const char *what, const char *secret) {
  uvccl_store_t st;
  uvccl_pg_t gp[3];
  uvccl_work_t w[3] = {{0}};
  tls_t t = {cert, key, ca, 0, secret};
  char prefix[32];
  int i;
  snprintf(prefix, sizeof(prefix), "w3-%s", what);
  uvccl_hash_store_init(&L, &st);
  for (i = 0; i < 3; i++) init_rank(&gp[i], &st, i, 3, prefix, 10000, &w[i], &t);
  wait_all(w, 3, 12000);
  ok(w[0].status == 0 && w[1].status == 0 && w[2].status == 0,
     "%s: three ranks with the job CA's certificates: created (%s %s %s)",
     what, uvccl_err_name(w[0].status), uvccl_err_name(w[1].status),
     uvccl_err_name(w[2].status));
  ok(data_ok(gp, 3), "%s: a 1 MiB allreduce and a 16 MiB broadcast arrive "
     "whole over TLS", what);
  ok(destroy_all(gp, 3), "%s: destroy completes", what);
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

/* ---- b), c), d) ------------------------------------------------------------ */

static void pair(const char *what, const tls_t *t1, int want1,
                 const char *says1, const char *logged) {
  uvccl_store_t st;
  uvccl_pg_t gp[2];
  uvccl_work_t w[2] = {{0}};
  tls_t t0 = {cert, key, ca, 0, NULL};
  char prefix[32];
  double t = now_s();
  snprintf(prefix, sizeof(prefix), "pair-%s", what);
  uvccl_hash_store_init(&L, &st);
  logcap_start();
  init_rank(&gp[0], &st, 0, 2, prefix, 2000, &w[0], &t0);
  init_rank(&gp[1], &st, 1, 2, prefix, 2000, &w[1], t1);
  wait_all(&w[1], 1, 8000);
  ok((want1 == 0 ? w[1].status != 0 : w[1].status == want1) &&
         strstr(w[1].msg, says1) != NULL,
     "%s: rank 1 fails (%s after %.2f s): %s", what,
     uvccl_err_name(w[1].status), now_s() - t, w[1].msg);
  wait_all(w, 2, 8000);
  logcap_stop();
  ok(w[0].status != 0, "%s: rank 0 does not make a world with it (%s)", what,
     uvccl_err_name(w[0].status));
  if (logged)
    ok(strstr(logbuf, logged) != NULL, "%s: rank 0 logged the refusal (%s)",
       what, logged);
  ok(destroy_all(gp, 2), "%s: destroy completes", what);
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

static void test_stray(void) {
  uvccl_store_t st;
  uvccl_pg_t gp;
  uvccl_work_t w = {0}, g = {0};
  tls_t t = {cert, key, ca, 0, NULL};
  char host[64], buf[256];
  int port, fd, closed = 0;
  struct sockaddr_in a;
  double t0;
  uvccl_hash_store_init(&L, &st);
  init_rank(&gp, &st, 0, 2, "stray", 5000, &w, &t);
  uv_run(&L, UV_RUN_NOWAIT);
  uvccl_store_get(&st, &g, "stray/addr/0", NULL);
  uvccl_work_wait(&g);
  if (g.value == NULL || sscanf((char *)g.value, "%63s %d", host, &port) != 2) {
    ok(0, "d: rank 0's address");
    return;
  }
  uvccl_work_cleanup(&g);
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, host, &a.sin_addr);
  logcap_start();
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
    memset(buf, 'x', 200);
    send(fd, buf, 200, MSG_NOSIGNAL);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    t0 = now_s();
    while (now_s() - t0 < 3 && !closed) {
      ssize_t r;
      uv_run(&L, UV_RUN_NOWAIT);
      r = recv(fd, buf, sizeof(buf), 0);
      if (r == 0 || (r < 0 && errno != EAGAIN)) closed = 1;
      else sleep_ms(2);
    }
  }
  close(fd);
  t0 = now_s();
  while (now_s() - t0 < 0.05) {
    uv_run(&L, UV_RUN_NOWAIT);
    sleep_ms(1);
  }
  logcap_stop();
  ok(closed && strstr(logbuf, "TLS handshake failed") != NULL,
     "d: a stray plaintext connection to a TLS listener: closed, logged");
  ok(destroy_all(&gp, 1), "d: destroy completes");
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

/* ---- e) ------------------------------------------------------------------ */

static void bad_config(const char *what, const tls_t *t, const char *says) {
  uvccl_store_t st;
  uvccl_pg_t gp;
  uvccl_work_t w = {0};
  int rc;
  uvccl_hash_store_init(&L, &st);
  logcap_start();
  rc = init_rank(&gp, &st, 0, 2, "cfg", 1000, &w, t);
  logcap_stop();
  if (strchr(logbuf, '\n') != NULL) *strchr(logbuf, '\n') = '\0';
  ok(rc == UV_EINVAL && strstr(logbuf, says) != NULL,
     "e: %s: %s, logged: %.160s", what, uvccl_err_name(rc), logbuf);
  if (rc == 0) destroy_all(&gp, 1);
  uvccl_store_close(&st, store_closed);
  uv_run(&L, UV_RUN_NOWAIT);
}

/* ---- the store -------------------------------------------------------------- */

/* A client of port with t: 0 and the value of a set-then-get of "k", or
 * the error (message in msg). */
static int store_probe(int port, const tls_t *t, char *msg, size_t mlen) {
  uvccl_store_t st;
  uvccl_tcp_store_options_t o;
  uvccl_work_t w = {0}, g = {0};
  int rc, closed = 0;
  memset(&o, 0, sizeof(o));
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 3000;
  o.auth_none = 1;
  o.tls_cert = t->cert;
  o.tls_key = t->key;
  o.tls_ca = t->ca;
  o.tls_none = t->none;
  msg[0] = '\0';
  rc = uvccl_tcp_store_init(&L, &st, &o);
  if (rc != 0) return rc;
  rc = uvccl_store_set(&st, &w, "k", "over TLS", 8, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc == 0) rc = uvccl_store_get(&st, &g, "k", NULL);
  if (rc == 0) rc = uvccl_work_wait(&g);
  if (rc == 0 && (g.value_len != 8 || memcmp(g.value, "over TLS", 8) != 0))
    rc = -1;
  snprintf(msg, mlen, "%s", w.msg[0] ? w.msg : g.msg);
  uvccl_work_cleanup(&g);
  st.data = &closed;
  uvccl_store_close(&st, store_closed);
  {
    double t0 = now_s();
    while (now_s() - t0 < 0.1) {
      uv_run(&L, UV_RUN_NOWAIT);
      sleep_ms(1);
    }
  }
  return rc;
}

static void test_store(void) {
  uvccl_store_server_t sv;
  uvccl_store_server_options_t so;
  uvccl_store_server_stats_t stats;
  tls_t t;
  char msg[UVCCL_WORK_MSG_LEN];
  int rc;
  memset(&so, 0, sizeof(so));
  so.listen_fd = -1;
  so.host = "127.0.0.1";
  so.auth_none = 1;
  so.tls_cert = cert;
  so.tls_key = key;
  so.tls_ca = ca;
  if (!is_int(uvccl_store_server_init(&L, &sv, &so), 0,
              "store: a server with TLS"))
    return;
  t = (tls_t){cert, key, ca, 0, NULL};
  rc = store_probe(sv.port, &t, msg, sizeof(msg));
  is_int(rc, 0, "store: a client with the job CA's certificate: set and get "
         "right (%s)", msg);
  logcap_start();
  t = (tls_t){bad_cert, bad_key, ca, 0, NULL};
  rc = store_probe(sv.port, &t, msg, sizeof(msg));
  ok(rc == UVCCL_EAUTH, "store: a client with a stranger's certificate: "
     "%s: %s", uvccl_err_name(rc), msg);
  t = (tls_t){cert, key, bad_ca, 0, NULL};
  rc = store_probe(sv.port, &t, msg, sizeof(msg));
  ok(rc == UVCCL_EAUTH && strstr(msg, "did not verify") != NULL,
     "store: a client trusting another CA: %s: %s", uvccl_err_name(rc), msg);
  t = (tls_t){NULL, NULL, NULL, 1, NULL};
  rc = store_probe(sv.port, &t, msg, sizeof(msg));
  logcap_stop();
  ok(rc != 0, "store: a client without TLS: %s: %s", uvccl_err_name(rc), msg);
  uvccl_store_server_stats(&sv, &stats);
  ok(stats.auth_failures >= 2 && stats.auth_failures <= 3 &&
         strstr(logbuf, "refused: TLS") != NULL,
     "store: the server refused and logged them, each counted once (%llu "
     "refusals of 3 strangers)",
     (unsigned long long)stats.auth_failures);
  uvccl_store_server_close(&sv, NULL);
  {
    double t0 = now_s();
    while (now_s() - t0 < 0.2) {
      uv_run(&L, UV_RUN_NOWAIT);
      sleep_ms(1);
    }
  }
}

/* ---- separate processes ----------------------------------------------------- */

static void test_procs(void) {
  char cmd[1024], out[8192];
  FILE *f;
  size_t n = 0;
  int st, yes = 0;
  const char *bd = getenv("UVCCL_BUILD_DIR");
  char *p;
  if (bd == NULL) bd = UVCCL_BUILD_DIR;
  snprintf(cmd, sizeof(cmd),
           "UVCCL_TLS_CERT=%s UVCCL_TLS_KEY=%s UVCCL_TLS_CA=%s "
           "timeout 60 %s/bin/uvccl-run -n 3 %s/bin/uvccl-bench -b 4 -e 1M "
           "-f 64 --op allreduce,broadcast,allgather --budget 0.05 "
           "--timeout 20 2>&1",
           cert, key, ca, bd, bd);
  f = popen(cmd, "r");
  if (f != NULL) {
    size_t r;
    while ((r = fread(out + n, 1, sizeof(out) - 1 - n, f)) > 0) n += r;
    out[n] = '\0';
    st = pclose(f);
  } else {
    st = -1;
    out[0] = '\0';
  }
  for (p = out; (p = strstr(p, " yes\n")) != NULL; p++) yes++;
  ok(st == 0 && yes == 11 && strstr(out, " no\n") == NULL,
     "3 processes under uvccl-run with $UVCCL_TLS_*: 11 checked "
     "collectives right (%d), every rank exits 0 (status %d)", yes, st);
  if (st != 0) diag("%s", out);
  /* A rank killed over TLS: the survivors name it and go on. */
  snprintf(cmd, sizeof(cmd),
           "UVCCL_TLS_CERT=%s UVCCL_TLS_KEY=%s UVCCL_TLS_CA=%s "
           "timeout 60 %s/bin/uvccl-run -n 4 --kill 2@0.3 %s/bin/uvccl-bench "
           "--op allreduce -b 4 -e 4M -f 16 --budget 0.1 --timeout 20 "
           "--shrink-on-failure 2>&1",
           cert, key, ca, bd, bd);
  n = 0;
  f = popen(cmd, "r");
  if (f != NULL) {
    size_t r;
    while ((r = fread(out + n, 1, sizeof(out) - 1 - n, f)) > 0) n += r;
    out[n] = '\0';
    st = pclose(f);
  } else {
    st = -1;
    out[0] = '\0';
  }
  ok(st == 0 && strstr(out, "rank 2 (") != NULL &&
         strstr(out, "its process exited or was killed") != NULL &&
         strstr(out, "shrunk to 3 ranks after losing rank 2") != NULL &&
         strstr(out, " no\n") == NULL,
     "a rank SIGKILLed in a TLS world: the survivors name it, shrink to 3 "
     "and finish right (status %d)", st);
  if (st != 0) diag("%s", out);
}

int main(void) {
  tls_t t;
  tap_alarm(180);
  if (system("command -v openssl >/dev/null 2>&1") != 0) {
    printf("1..0 # SKIP no openssl command to make certificates\n");
    return 0;
  }
  unsetenv("UVCCL_TLS_CERT");
  unsetenv("UVCCL_TLS_KEY");
  unsetenv("UVCCL_TLS_CA");
  unsetenv("UVCCL_AUTH_TOKEN");
  unsetenv("UVCCL_AUTH_FILE");
  snprintf(dir, sizeof(dir), "/tmp/uvccl-tls-XXXXXX");
  if (mkdtemp(dir) == NULL || !is_int(make_certs(), 0,
                                      "certificates made with openssl"))
    return done_testing();
  uv_loop_init(&L);

  world3("a", NULL);

  t = (tls_t){bad_cert, bad_key, ca, 0, NULL};
  pair("b: a stranger's certificate", &t, UVCCL_EAUTH, "certificate",
       "TLS");
  t = (tls_t){cert, key, bad_ca, 0, NULL};
  pair("c: trusting another CA", &t, UVCCL_EAUTH, "did not verify", NULL);
  t = (tls_t){NULL, NULL, NULL, 1, NULL};
  pair("d: no TLS", &t, 0, "", "TLS handshake failed");
  test_stray();

  t = (tls_t){cert, NULL, NULL, 0, NULL};
  bad_config("a certificate alone", &t, "missing: key CA");
  t = (tls_t){cert, bad_key, ca, 0, NULL};
  bad_config("another certificate's key", &t, "does not match");
  t = (tls_t){"/nonexistent.pem", key, ca, 0, NULL};
  bad_config("no such certificate file", &t, "/nonexistent.pem");

  world3("f: TLS and a secret", "the secret");
  test_store();

  test_procs();
  sh("rm -rf %s", dir);
  return done_testing();
}
