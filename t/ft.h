/* Fault-tolerance tests: a rank that runs one kind of operation over and
 * over until it fails, then reports what the failure said. Include after
 * ranks.h. Environment of a rank (besides env://'s):
 *   T_OP     allreduce, broadcast, allgather, reduce_scatter, alltoall,
 *            barrier, sendrecv (ring) or bytes (allgather_bytes)
 *   T_SIZE   bytes per rank
 *   T_ITERS  operations to run when nothing fails (default: until failure,
 *            at most 30 s)
 *   T_START  the rank that prints "@val R started" after 2 operations (the
 *            parent's cue to strike)
 *   T_CASCADE  a rank that, when its operation fails, aborts and exits at
 *            once (as an application that dies of the error would)
 *   T_BUSY_MS  ranks in T_BUSY_RANKS block their loop this long after every
 *            T_BUSY_EVERY operations (an application computing)
 * Reports: "ops" (how many succeeded, results checked), "failed" (status
 * and message), "fail_api" (uvccl_pg_get_failure), "later" (a later call
 * fails at once with the same culprit). */
#ifndef UVCCL_T_FT_H
#define UVCCL_T_FT_H

#include <signal.h>

static inline int ft_env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

static inline void sigpipe_default(void) {
  sigset_t set;
  signal(SIGPIPE, SIG_DFL);
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigprocmask(SIG_UNBLOCK, &set, NULL);
}

/* needle's first 60 bytes appear in hay (messages may be truncated). */
static inline int has_prefix_of(const char *hay, const char *needle) {
  char b[64];
  snprintf(b, sizeof(b), "%.60s", needle);
  return b[0] != '\0' && strstr(hay, b) != NULL;
}

static inline void busy_wait_ms(int ms) {
  double t0 = now_s();
  volatile unsigned long x = 0;
  while ((now_s() - t0) * 1000.0 < ms) x++;
}

typedef struct {
  const char *op;
  size_t n;               /* elements (float32) or bytes */
  float *s, *r;
  int iter;
} ftop_t;

/* Starts one operation of kind op->op; the values depend on the iteration
 * so a stale result cannot pass. */
static inline int ft_start(ftop_t *o, uvccl_work_t *w, uvccl_work_cb cb) {
  size_t i, n = o->n;
  int it = o->iter;
  if (strcmp(o->op, "allreduce") == 0) {
    for (i = 0; i < n; i++) o->s[i] = (float)(R + 1 + it % 7);
    return uvccl_allreduce(&pg, w, o->s, o->r, n, UVCCL_FLOAT32, UVCCL_SUM,
                           cb);
  }
  if (strcmp(o->op, "broadcast") == 0) {
    for (i = 0; i < n; i++) o->r[i] = R == it % P ? (float)(it + 3) : -1.0f;
    return uvccl_broadcast(&pg, w, o->r, n, UVCCL_FLOAT32, it % P, cb);
  }
  if (strcmp(o->op, "allgather") == 0) {
    for (i = 0; i < n; i++) o->s[i] = (float)(R * 10 + it % 7);
    return uvccl_allgather(&pg, w, o->s, o->r, n, UVCCL_FLOAT32, cb);
  }
  if (strcmp(o->op, "reduce_scatter") == 0) {
    for (i = 0; i < n * (size_t)P; i++) o->s[i] = (float)(R + 1 + it % 5);
    return uvccl_reduce_scatter(&pg, w, o->s, o->r, n, UVCCL_FLOAT32,
                                UVCCL_SUM, cb);
  }
  if (strcmp(o->op, "alltoall") == 0) {
    for (i = 0; i < n * (size_t)P; i++)
      o->s[i] = (float)(R * 100 + (int)(i / n) + it % 3);
    return uvccl_alltoall(&pg, w, o->s, o->r, n, UVCCL_FLOAT32, cb);
  }
  if (strcmp(o->op, "barrier") == 0) return uvccl_barrier(&pg, w, cb);
  return UV_EINVAL;
}

static inline size_t ft_bad(ftop_t *o) {
  size_t i, bad = 0, n = o->n;
  int it = o->iter, q;
  if (strcmp(o->op, "allreduce") == 0) {
    float want = 0;
    for (q = 0; q < P; q++) want += (float)(q + 1 + it % 7);
    for (i = 0; i < n; i++) bad += o->r[i] != want;
  } else if (strcmp(o->op, "broadcast") == 0) {
    for (i = 0; i < n; i++) bad += o->r[i] != (float)(it + 3);
  } else if (strcmp(o->op, "allgather") == 0) {
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        bad += o->r[(size_t)q * n + i] != (float)(q * 10 + it % 7);
  } else if (strcmp(o->op, "reduce_scatter") == 0) {
    float want = 0;
    for (q = 0; q < P; q++) want += (float)(q + 1 + it % 5);
    for (i = 0; i < n; i++) bad += o->r[i] != want;
  } else if (strcmp(o->op, "alltoall") == 0) {
    for (q = 0; q < P; q++)
      for (i = 0; i < n; i++)
        bad += o->r[(size_t)q * n + i] != (float)(q * 100 + R + it % 3);
  }
  return bad;
}

/* Runs operations until one fails (or T_ITERS pass); reports. Returns the
 * failure status (0: none). */
static inline int ft_rank(void) {
  ftop_t o;
  size_t bytes = (size_t)ft_env_int("T_SIZE", 4096), bad_total = 0;
  int iters = ft_env_int("T_ITERS", 0), start = ft_env_int("T_START", -1);
  int cascade = ft_env_int("T_CASCADE", -1), busy_ms = ft_env_int("T_BUSY_MS", 0);
  int busy_every = ft_env_int("T_BUSY_EVERY", 1), rc = 0;
  const char *busy_ranks = getenv("T_BUSY_RANKS");
  double t0 = now_s();
  uvccl_work_t w = {0};
  memset(&o, 0, sizeof(o));
  o.op = getenv("T_OP") ? getenv("T_OP") : "allreduce";
  o.n = bytes / 4 ? bytes / 4 : 1;
  o.s = calloc(o.n * (size_t)P, 4);
  o.r = calloc(o.n * (size_t)P, 4);
  for (o.iter = 0; iters == 0 || o.iter < iters; o.iter++) {
    cbres_t c = {0};
    memset(&w, 0, sizeof(w));
    w.data = &c;
    rc = ft_start(&o, &w, on_work);
    rc = finish_work(&c, rc, 60000);
    if (rc != 0) break;
    bad_total += ft_bad(&o);
    if (o.iter == 1 && R == start) val("started", 1);
    if (busy_ms > 0 && busy_ranks && strchr(busy_ranks, '0' + R) &&
        o.iter % busy_every == 0)
      busy_wait_ms(busy_ms);
    if (iters == 0 && now_s() - t0 > 30) break;
  }
  rep(bad_total == 0, "ops", "%d %s of %zu B ran, %zu wrong values", o.iter,
      o.op, bytes, bad_total);
  if (rc != 0) {
    uvccl_pg_failure_t f;
    int g, ranks[8], nf;
    uvccl_work_t w2 = {0};
    cbres_t c2 = {0};
    if (R == cascade) {
      /* An application that dies of the error: others must still name
       * the rank that failed first, not this one. */
      uvccl_pg_abort(&pg, "exiting after an error");
      rep(1, "failed", "%s %s", ename(rc), w.msg);
      fflush(stdout);
      _exit(0);
    }
    rep(rc < 0, "failed", "after %d: %s %s", o.iter, ename(rc), w.msg);
    memset(&f, 0, sizeof(f));
    g = uvccl_pg_get_failure(&pg, &f);
    nf = uvccl_pg_failed_ranks(&pg, ranks, 8);
    printf("@val %d culprit %d\n@val %d cause %d\n@val %d first_failed %d\n",
           R, g == 1 ? f.global_rank : -9, R, g == 1 ? (int)f.cause : -9, R,
           nf > 0 ? ranks[0] : -9);
    rep(g == 1 && has_prefix_of(w.msg, f.msg), "fail_api",
        "get_failure %d: rank %d global %d cause %s reporter %d err %s: %s", g,
        f.rank, f.global_rank, uvccl_fail_cause_name(f.cause), f.reporter,
        ename(f.err), f.msg);
    w2.data = &c2;
    o.iter++;
    {
      int rc2 = ft_start(&o, &w2, on_work);
      if (rc2 == 0) rc2 = finish_work(&c2, 0, 5000);
      rep(rc2 < 0 && g == 1 && has_prefix_of(w2.msg, f.msg), "later",
          "a later %s: %s %s", o.op, ename(rc2), w2.msg);
    }
  }
  free(o.s);
  free(o.r);
  return rc;
}

/* The group a shrink made works: 10 allreduces of every rank's global
 * rank + 1 (me is this rank's), each checked; reports "after". Returns
 * the last status. */
static inline int ft_check_shrunk(uvccl_pg_t *next, int me) {
  int64_t v[16], want = 0;
  int iter, i, rc = 0, bad = 0;
  for (i = 0; i < next->size; i++) want += uvccl_pg_global_rank(next, i) + 1;
  for (iter = 0; iter < 10 && rc == 0; iter++) {
    uvccl_work_t w = {0};
    for (i = 0; i < 16; i++) v[i] = me + 1;
    rc = uvccl_allreduce(next, &w, v, v, 16, UVCCL_INT64, UVCCL_SUM, NULL);
    if (rc == 0) rc = uvccl_work_wait(&w);
    for (i = 0; rc == 0 && i < 16; i++) bad += v[i] != want;
  }
  rep(rc == 0 && bad == 0, "after", "10 allreduces on the shrunk group: "
      "%s, %d wrong", ename(rc), bad);
  return rc;
}

#endif
