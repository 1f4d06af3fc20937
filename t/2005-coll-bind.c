/* Safe defaults: what a world made from env:// (and tcp://) listens on.
 * With MASTER_ADDR on loopback, every listening socket of the process (the
 * embedded store server, the mesh listener, the liveness monitor's) is
 * bound to loopback, so nothing of the job is reachable from another
 * host; UVCCL_STORE_BIND=any opens the store server on every interface
 * again, UVCCL_STORE_BIND=ADDR binds that address. Checked in
 * /proc/net/tcp{,6} against this process's own sockets. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char addr[72]; /* "127.0.0.1", "::", "::1", "0.0.0.0", ... */
  int port;
  int loopback, any;
} listener_t;

/* The inode of every socket this process holds. */
static int own_inodes(unsigned long *ino, int max) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (d == NULL) return 0;
  while ((e = readdir(d)) != NULL && n < max) {
    char path[300], link[64];
    ssize_t l;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    l = readlink(path, link, sizeof(link) - 1);
    if (l <= 0) continue;
    link[l] = '\0';
    if (sscanf(link, "socket:[%lu]", &ino[n]) == 1) n++;
  }
  closedir(d);
  return n;
}

/* This process's listening TCP sockets. */
static int listeners(listener_t *out, int max) {
  unsigned long ino[512];
  int nino = own_inodes(ino, 512), n = 0, v6;
  for (v6 = 0; v6 < 2; v6++) {
    FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
    char line[512];
    if (f == NULL) continue;
    if (fgets(line, sizeof(line), f) == NULL) { /* header */
      fclose(f);
      continue;
    }
    while (fgets(line, sizeof(line), f) != NULL && n < max) {
      char local[64], remote[64];
      unsigned st, port;
      unsigned long inode;
      int i, mine = 0;
      if (sscanf(line, " %*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local,
                 remote, &st, &inode) != 4 || st != 0x0A)
        continue;
      for (i = 0; i < nino; i++) mine |= ino[i] == inode;
      if (!mine) continue;
      {
        char *colon = strchr(local, ':');
        listener_t *L = &out[n++];
        memset(L, 0, sizeof(*L));
        *colon = '\0';
        sscanf(colon + 1, "%x", &port);
        L->port = (int)port;
        if (!v6) {
          unsigned a;
          sscanf(local, "%x", &a); /* little-endian */
          snprintf(L->addr, sizeof(L->addr), "%u.%u.%u.%u", a & 255,
                   (a >> 8) & 255, (a >> 16) & 255, a >> 24);
          L->loopback = (a & 255) == 127;
          L->any = a == 0;
        } else {
          L->any = strcmp(local, "00000000000000000000000000000000") == 0;
          L->loopback =
              strcmp(local, "00000000000000000000000001000000") == 0 ||
              (strncmp(local, "0000000000000000FFFF0000", 24) == 0 &&
               strcmp(local + 30, "7F") == 0);
          snprintf(L->addr, sizeof(L->addr), "%s",
                   L->any ? "::" : L->loopback ? "::1 or ::ffff:127.x"
                                               : local);
        }
      }
    }
    fclose(f);
  }
  return n;
}

/* (the loop is ranks.h's) */
static int closed;
static void on_closed(uvccl_pg_t *g) { closed = 1; }

/* A world of one from url with the environment set; then what listens. */
static void world(const char *what, const char *url, int port,
                  int want_store_loopback) {
  uvccl_pg_t g;
  uvccl_pg_options_t o;
  uvccl_work_t w = {0};
  listener_t L[64];
  int n, i, rc, store = -1, others_loopback = 1;
  char detail[4096] = "";

  memset(&o, 0, sizeof(o));
  memset(&g, 0, sizeof(g));
  o.timeout_ms = 20000;
  rc = uvccl_pg_init_url(&loop, &g, url, &o, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (!is_int(rc, 0, "%s: the world is made (%s)", what, w.msg)) return;
  n = listeners(L, 64);
  for (i = 0; i < n; i++) {
    size_t l = strlen(detail);
    snprintf(detail + l, sizeof(detail) - l, "%s%.40s port %d", i ? ", " : "",
             L[i].addr, L[i].port);
    if (L[i].port == port) store = i;
    else if (!L[i].loopback) others_loopback = 0;
  }
  ok(n >= 2 && store >= 0, "%s: %d listening sockets, the store's among them"
     " (%s)", what, n, detail);
  if (store >= 0) {
    if (want_store_loopback)
      ok(L[store].loopback, "%s: the store server listens on loopback only "
         "(%s)", what, L[store].addr);
    else
      ok(L[store].any, "%s: the store server listens on every interface "
         "(%s)", what, L[store].addr);
  }
  ok(others_loopback, "%s: the mesh and monitor listeners are on loopback "
     "too", what);
  closed = 0;
  uvccl_pg_destroy(&g, on_closed);
  while (!closed) uv_run(&loop, UV_RUN_ONCE);
}

int main(void) {
  char port[16], url[64];
  int p;

  tap_alarm(60);
  uv_loop_init(&loop);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  unsetenv("UVCCL_STORE_BIND");

  p = free_port();
  snprintf(port, sizeof(port), "%d", p);
  setenv("MASTER_PORT", port, 1);
  world("env://, MASTER_ADDR=127.0.0.1", "env://", p, 1);

  p = free_port();
  snprintf(url, sizeof(url), "tcp://127.0.0.1:%d?rank=0&world_size=1", p);
  world("tcp://127.0.0.1", url, p, 1);

  p = free_port();
  snprintf(port, sizeof(port), "%d", p);
  setenv("MASTER_PORT", port, 1);
  setenv("UVCCL_STORE_BIND", "any", 1);
  world("env:// with UVCCL_STORE_BIND=any", "env://", p, 0);

  p = free_port();
  snprintf(port, sizeof(port), "%d", p);
  setenv("MASTER_PORT", port, 1);
  setenv("UVCCL_STORE_BIND", "127.0.0.1", 1);
  world("env:// with UVCCL_STORE_BIND=127.0.0.1", "env://", p, 1);

  uv_run(&loop, UV_RUN_DEFAULT);
  is_int(uv_loop_close(&loop), 0, "the loop closes clean");
  return done_testing();
}
