/* uvccl-elastic-cycles: a world loses a rank and grows back, again and
 * again, under uvccl-run --respawn:
 *
 *   uvccl-run -n 4 --respawn=N build/bench/uvccl-elastic-cycles --cycles N
 *
 * Each cycle: every rank checks an allreduce of the world; the last rank
 * (the one uvccl-run keeps starting again) then dies (SIGKILL); the others
 * find out at their next barrier, shrink, grow back by one, and the
 * replacement (started with UVCCL_JOIN=1) joins; the new world checks its
 * allreduce. Ranks 0 .. n-2 live through every cycle: rank 0 prints its
 * resident memory, the heap in use and open descriptors at cycles 1, 10,
 * 100, 1000 ... (or every N with --every N; they must stay flat: the
 * flight recorder's ring, calloc'ed whole, is resident only as it fills)
 * and, at the end, how long a cycle took from the
 * death to the grown world's first allreduce (median, 90th percentile,
 * worst). Exit status 0 only if every result was right. */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "uvccl.h"

static uv_loop_t loop;
static uvccl_store_t store;
static uvccl_pg_options_t opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int wait_w(int rc, uvccl_work_t *w, const char *what) {
  if (rc == 0) rc = uvccl_work_wait(w);
  if (rc != 0 && what != NULL)
    fprintf(stderr, "%s: %s%s%s\n", what, uvccl_strerror(rc),
            w->msg[0] ? ": " : "", w->msg);
  return rc;
}

/* 0 when right, 1 when wrong, or the error (UVCCL_EPEER: the dying rank
 * went before every part of it reached this one: its death is seen here
 * rather than at the barrier after) */
static int check_allreduce(uvccl_pg_t *g) {
  uvccl_work_t w = {0};
  int64_t v = g->rank, sum = -1;
  int rc = wait_w(uvccl_allreduce(g, &w, &v, &sum, 1, UVCCL_INT64, UVCCL_SUM,
                                  NULL), &w, NULL);
  if (rc != 0) return rc;
  return sum == (int64_t)g->size * (g->size - 1) / 2 ? 0 : 1;
}

/* The allocator's bytes in use (glibc's count; -1 elsewhere): RSS that
 * grows while this stays flat is pages touched, not memory held. */
static long heap_kib(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  return (long)(mallinfo2().uordblks / 1024);
#else
  return -1;
#endif
}

static long rss_kib(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return -1;
  if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
  fclose(f);
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own */
}

/* Three slots for the groups: the world, its shrink, the grown one. A
 * slot is reused once its group has finished closing. */
static uvccl_pg_t groups[3];
static int closing[3];

static void on_closed(uvccl_pg_t *g) { closing[(intptr_t)g->data] = 0; }

static void destroy(int i) {
  groups[i].data = (void *)(intptr_t)i;
  closing[i] = 1;
  uvccl_pg_destroy(&groups[i], on_closed);
}

static uvccl_pg_t *slot(int i) {
  while (closing[i]) uv_run(&loop, UV_RUN_ONCE);
  memset(&groups[i], 0, sizeof(groups[i]));
  return &groups[i];
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int cycles = 100, every = 0, k, joiner, rc, bad = 0;
  const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT"),
             *join = getenv("UVCCL_JOIN"), *count = getenv("UVCCL_RESPAWN_COUNT");
  uvccl_tcp_store_options_t so;
  uvccl_pg_t *cur;
  int c = 0; /* cur's slot */
  uvccl_work_t w = {0};
  double *took;
  for (k = 1; k < argc; k++) {
    if (strcmp(argv[k], "--cycles") == 0 && k + 1 < argc) {
      cycles = atoi(argv[++k]);
    } else if (strcmp(argv[k], "--every") == 0 && k + 1 < argc) {
      every = atoi(argv[++k]);
    } else {
      fprintf(stderr, "usage: %s [--cycles N] [--every N] (under uvccl-run "
              "--respawn=N)\n",
              argv[0]);
      return 2;
    }
  }
  if (host == NULL || port == NULL || cycles < 1) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  uv_loop_init(&loop);
  memset(&so, 0, sizeof(so));
  so.host = host;
  so.port = atoi(port);
  so.timeout_ms = 60000;
  if (uvccl_tcp_store_init(&loop, &store, &so) != 0) return 1;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = 60000;
  joiner = join != NULL && strcmp(join, "1") == 0;
  cur = slot(c);
  if (joiner)
    rc = wait_w(uvccl_pg_join(&loop, cur, &store, &opts, &w, NULL), &w,
                "join");
  else
    rc = wait_w(uvccl_pg_init_url(&loop, cur, "env://", &opts, &w, NULL), &w,
                "init");
  if (rc != 0) return 1;
  took = calloc((size_t)cycles + 1, sizeof(double));
  if (took == NULL) return 1;
  /* the cycle this process starts in: a replacement's respawn count */
  k = joiner && count != NULL ? atoi(count) : 0;
  for (;; k++) {
    int last = cur->rank == cur->size - 1, seen;
    rc = check_allreduce(cur);
    seen = rc == UVCCL_EPEER && k < cycles && !last;
    if (rc != 0 && !seen) {
      fprintf(stderr, "rank %d: cycle %d: the allreduce was %s\n", cur->rank,
              k, rc == 1 ? "wrong" : uvccl_err_name(rc));
      bad++;
    }
    if (k == cycles) break;
    if (last) raise(SIGKILL); /* uvccl-run starts it again */
    {
      uvccl_pg_t *sh = slot((c + 1) % 3), *grown = slot((c + 2) % 3);
      double t0 = now_s();
      memset(&w, 0, sizeof(w));
      /* the last rank's death shows at the next barrier */
      if (!seen) rc = wait_w(uvccl_barrier(cur, &w, NULL), &w, NULL);
      if (rc != UVCCL_EPEER) {
        fprintf(stderr, "cycle %d: the barrier said %s, not EPEER\n", k,
                uvccl_err_name(rc));
        return 1;
      }
      memset(&w, 0, sizeof(w));
      if (wait_w(uvccl_pg_shrink(cur, sh, &w, NULL), &w, "shrink") != 0)
        return 1;
      memset(&w, 0, sizeof(w));
      if (wait_w(uvccl_pg_grow(sh, grown, &store, 1, &opts, &w, NULL), &w,
                 "grow") != 0)
        return 1;
      destroy(c);
      destroy((c + 1) % 3);
      c = (c + 2) % 3;
      cur = grown;
      took[k] = now_s() - t0;
      /* what the process holds once the old worlds are gone (a world made
       * anew closes its predecessor's net meanwhile) */
      while (closing[(c + 1) % 3] || closing[(c + 2) % 3])
        uv_run(&loop, UV_RUN_ONCE);
    }
    if (cur->rank == 0 &&
        (every > 0 ? (k + 1) % every == 0
                   : (k + 1 == 1 || k + 1 == 10 || k + 1 == 100 ||
                      k + 1 == 1000 || k + 1 == 10000) ||
         k + 1 == cycles))
      printf("cycle %d: world of %d, rank 0: RSS %ld KiB, heap in use %ld "
             "KiB, %d open descriptors\n", k + 1, cur->size, rss_kib(),
             heap_kib(), open_fds());
  }
  if (cur->rank == 0 && !joiner && cycles > 0) {
    qsort(took, (size_t)cycles, sizeof(double), cmp_d);
    printf("%d cycles: death to a grown world, median %.1f ms, p90 %.1f "
           "ms, worst %.1f ms; %s\n", cycles, took[cycles / 2] * 1e3,
           took[cycles * 9 / 10] * 1e3, took[cycles - 1] * 1e3,
           bad ? "some results WRONG" : "every result right");
  }
  memset(&w, 0, sizeof(w));
  wait_w(uvccl_barrier(cur, &w, NULL), &w, "final barrier");
  destroy(c);
  uvccl_store_close(&store, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(took);
  return bad ? 1 : 0;
}
