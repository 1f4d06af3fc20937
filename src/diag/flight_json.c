/* The flight recorder's dump: JSON, one document per process (format
 * "uvccl-flight-recorder", version 1; docs/trace-format.md), to a buffer
 * or a file, on demand or on an error (UVCCL_TRACE_DIR). */
#include "flight.h"
#include "loop/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FORMAT_VERSION 1
#define MAX_WAITING 64

/* ---- a growing buffer ---------------------------------------------------- */
typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} jbuf_t;

static void jb_need(jbuf_t *b, size_t n) {
  char *p;
  size_t c;
  if (b->oom || b->len + n + 1 <= b->cap) return;
  c = b->cap ? b->cap : 4096;
  while (c < b->len + n + 1) c *= 2;
  p = uvccl__realloc(b->p, c);
  if (p == NULL) {
    b->oom = 1;
    return;
  }
  b->p = p;
  b->cap = c;
}

static void jb_raw(jbuf_t *b, const char *s, size_t n) {
  jb_need(b, n);
  if (b->oom) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* A string literal, its length counted by the compiler. */
#define JB_LIT(b, lit) jb_raw((b), (lit), sizeof(lit) - 1)

static void jb_printf(jbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void jb_printf(jbuf_t *b, const char *fmt, ...) {
  va_list ap;
  int n;
  jb_need(b, 64);
  if (b->oom) return;
  va_start(ap, fmt);
  n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= b->cap - b->len) {
    jb_need(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
}

/* A JSON string; NULL is null. Bytes outside printable ASCII are escaped
 * (\u00XX), so any message makes valid JSON. */
static void jb_str(jbuf_t *b, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  if (s == NULL) {
    JB_LIT(b, "null");
    return;
  }
  JB_LIT(b, "\"");
  for (; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char e[2] = {'\\', (char)*p};
      jb_raw(b, e, 2);
    } else if (*p < 0x20 || *p >= 0x7f) {
      jb_printf(b, "\\u%04x", *p);
    } else {
      jb_raw(b, (const char *)p, 1);
    }
  }
  JB_LIT(b, "\"");
}

static const char *state_name(int st) {
  switch (st) {
  case UVCCL__FL_QUEUED: return "queued";
  case UVCCL__FL_STARTED: return "started";
  case UVCCL__FL_COMPLETED: return "completed";
  case UVCCL__FL_FAILED: return "failed";
  case UVCCL__FL_TIMED_OUT: return "timed_out";
  default: return "cancelled";
  }
}

/* The process's rank for file names and the header: its global rank in
 * the first world group (gid 1) still alive, else in any group, else -1. */
static int process_rank(const uvccl__fsnap_t *s) {
  int i, any = -1;
  for (i = 0; i < s->ngroups; i++) {
    const uvccl__fgroup_t *g = &s->groups[i];
    if (g->rank < 0 || g->rank >= g->size) continue;
    if (g->gid == 1 && !g->destroyed) return g->ranks[g->rank];
    if (any < 0) any = g->ranks[g->rank];
  }
  return any;
}

static const uvccl__fgroup_t *group_of(const uvccl__fsnap_t *s,
                                       uint64_t guid) {
  int i;
  for (i = 0; i < s->ngroups; i++)
    if (s->groups[i].guid == guid) return &s->groups[i];
  return NULL;
}

static void jb_seq(jbuf_t *b, const char *name, uint64_t v, int last) {
  if (v == 0) jb_printf(b, "\"%s\":null%s", name, last ? "" : ",");
  else jb_printf(b, "\"%s\":%llu%s", name, (unsigned long long)(v - 1),
                 last ? "" : ",");
}

static void jb_time(jbuf_t *b, const char *name, uint64_t ns) {
  if (ns == 0) jb_printf(b, ",\"%s\":null", name);
  else jb_printf(b, ",\"%s\":%llu", name, (unsigned long long)ns);
}

static void format(jbuf_t *b, const uvccl__fsnap_t *s, uv_loop_t *loop,
                   const char *reason) {
  struct timespec rt;
  char host[256];
  size_t i;
  int k;
  clock_gettime(CLOCK_REALTIME, &rt);
  if (gethostname(host, sizeof(host)) != 0) host[0] = '\0';
  host[sizeof(host) - 1] = '\0';
  jb_printf(b, "{\"format\":\"uvccl-flight-recorder\",\"version\":%d,",
            FORMAT_VERSION);
  JB_LIT(b, "\"reason\":");
  jb_str(b, reason ? reason : "");
  JB_LIT(b, ",\"host\":");
  jb_str(b, host);
  jb_printf(b, ",\"pid\":%ld,\"rank\":%d,\"library\":", (long)getpid(),
            process_rank(s));
  jb_str(b, uvccl_version_string());
  jb_printf(b, ",\"time_unix_ns\":%llu,\"time_mono_ns\":%llu,"
            "\"capacity\":%zu,\"recorded\":%llu,\"dropped\":%llu,",
            (unsigned long long)rt.tv_sec * 1000000000ull +
                (unsigned long long)rt.tv_nsec,
            (unsigned long long)uvccl__now_ns(), s->capacity,
            (unsigned long long)s->recorded,
            (unsigned long long)(s->recorded - s->nentries));
  JB_LIT(b, "\"groups\":[");
  for (k = 0; k < s->ngroups; k++) {
    const uvccl__fgroup_t *g = &s->groups[k];
    int r;
    jb_printf(b, "%s{\"id\":%llu,\"gid\":%u,\"name\":", k ? "," : "",
              (unsigned long long)g->guid, g->gid);
    jb_str(b, g->name);
    JB_LIT(b, ",\"backend\":");
    jb_str(b, g->backend);
    jb_printf(b, ",\"rank\":%d,\"size\":%d,\"ranks\":[", g->rank, g->size);
    for (r = 0; r < g->size; r++)
      jb_printf(b, "%s%d", r ? "," : "", g->ranks[r]);
    jb_printf(b, "],\"state\":\"%s\",\"error\":",
              g->destroyed ? "destroyed" : g->broken ? "broken" : "ok");
    jb_str(b, g->broken ? uvccl_err_name(g->broken_err) : NULL);
    JB_LIT(b, ",\"message\":");
    jb_str(b, g->broken ? g->broken_msg : NULL);
    JB_LIT(b, ",\"last\":{\"collective\":{");
    jb_seq(b, "enqueued", g->enq[0], 0);
    jb_seq(b, "started", g->started[0], 0);
    jb_seq(b, "completed", g->done[0], 1);
    JB_LIT(b, "},\"p2p\":{");
    jb_seq(b, "enqueued", g->enq[1], 0);
    jb_seq(b, "started", g->started[1], 0);
    jb_seq(b, "completed", g->done[1], 1);
    JB_LIT(b, "}}}");
  }
  JB_LIT(b, "],\"entries\":[");
  for (i = 0; i < s->nentries; i++) {
    const uvccl__fentry_t *e = &s->entries[i];
    const uvccl__fgroup_t *g = group_of(s, e->guid);
    jb_printf(b, "%s{\"id\":%llu,\"group\":%llu,\"gid\":%u,\"seq\":%u,"
              "\"kind\":\"%s\",\"op\":",
              i ? "," : "", (unsigned long long)e->id,
              (unsigned long long)e->guid, g ? g->gid : 0, e->seq,
              e->p2p ? "p2p" : "collective");
    jb_str(b, e->op);
    JB_LIT(b, ",\"dtype\":");
    jb_str(b, e->dtype);
    JB_LIT(b, ",\"redop\":");
    jb_str(b, e->redop);
    jb_printf(b, ",\"root\":%d,\"peer\":%d,\"count_in\":%llu,"
              "\"count_out\":%llu,\"tag\":",
              e->root, e->peer, (unsigned long long)e->count_in,
              (unsigned long long)e->count_out);
    jb_str(b, e->tag[0] ? e->tag : NULL);
    jb_printf(b, ",\"state\":\"%s\"", state_name(e->state));
    jb_time(b, "queued_ns", e->t_queued);
    jb_time(b, "started_ns", e->t_started);
    jb_time(b, "ended_ns", e->t_done);
    JB_LIT(b, ",\"error\":");
    jb_str(b, e->state > UVCCL__FL_COMPLETED ? uvccl_err_name(e->err) : NULL);
    JB_LIT(b, ",\"message\":");
    jb_str(b, e->msg[0] ? e->msg : NULL);
    if (e->state <= UVCCL__FL_STARTED && g != NULL && loop != NULL &&
        g->loop == loop && g->waiting != NULL && !g->destroyed) {
      int w[MAX_WAITING], n, j;
      n = g->waiting(g->ctx, e->id, w, MAX_WAITING);
      JB_LIT(b, ",\"waiting_for\":[");
      for (j = 0; j < n && j < MAX_WAITING; j++)
        jb_printf(b, "%s%d", j ? "," : "", w[j]);
      JB_LIT(b, "]");
    }
    JB_LIT(b, "}");
  }
  JB_LIT(b, "]}\n");
}

int uvccl__flight_json(uv_loop_t *loop, const char *reason, char **out,
                       size_t *len) {
  uvccl__fsnap_t s;
  jbuf_t b = {0};
  int rc = uvccl__flight_snapshot(&s);
  if (rc != 0) return rc;
  format(&b, &s, loop, reason);
  uvccl__flight_snapshot_free(&s);
  if (b.oom) {
    uvccl__free(b.p);
    return UV_ENOMEM;
  }
  *out = b.p;
  if (len) *len = b.len;
  return 0;
}

/* Writes data to path through a temporary file and a rename, so a reader
 * never sees half a dump. */
static int write_file(const char *path, const char *data, size_t n) {
  char tmp[4096];
  int fd, rc = 0;
  if (snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid()) >=
      (int)sizeof(tmp))
    return UV_ENAMETOOLONG;
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      rc = -errno;
      break;
    }
    data += w;
    n -= (size_t)w;
  }
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc != 0) unlink(tmp);
  return rc;
}

/* DIR/uvccl-trace.RANK.PID.json */
static int default_path(char *buf, size_t len) {
  const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
  uvccl__fsnap_t s;
  int rank = -1;
  if (dir == NULL || *dir == '\0') return UV_EINVAL;
  if (uvccl__flight_snapshot(&s) == 0) {
    rank = process_rank(&s);
    uvccl__flight_snapshot_free(&s);
  }
  if (snprintf(buf, len, "%s/uvccl-trace.%d.%ld.json", dir, rank,
               (long)getpid()) >= (int)len)
    return UV_ENAMETOOLONG;
  return 0;
}

int uvccl_trace_dump(uv_loop_t *loop, const char *path, const char *reason) {
  char dflt[4096], *json = NULL;
  size_t n = 0;
  int rc;
  if (path == NULL) {
    rc = default_path(dflt, sizeof(dflt));
    if (rc != 0) return rc;
    path = dflt;
    /* UVCCL_TRACE_DIR may name a directory that does not exist yet (the
     * last level is made; every rank may race to it) */
    if (mkdir(uvccl__config_text(UVCCL__CFG_TRACE_DIR), 0755) != 0 && errno != EEXIST)
      return -errno;
  }
  rc = uvccl__flight_json(loop, reason ? reason : "requested", &json, &n);
  if (rc != 0) return rc;
  rc = write_file(path, json, n);
  uvccl__free(json);
  return rc;
}

int uvccl_trace_json(uv_loop_t *loop, const char *reason, char **json,
                     size_t *len) {
  if (json == NULL) return UV_EINVAL;
  return uvccl__flight_json(loop, reason ? reason : "requested", json, len);
}

static uv_mutex_t dump_mu;
static uv_once_t dump_once = UV_ONCE_INIT;
static uint64_t last_dump_ns;

static void init_dump_mutex(void) { uv_mutex_init(&dump_mu); }

void uvccl__flight_dump_on_error(uv_loop_t *loop, const char *reason) {
  const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
  uint64_t now;
  int rc;
  if (dir == NULL || *dir == '\0') return;
  uv_once(&dump_once, init_dump_mutex);
  now = uvccl__now_ns();
  uv_mutex_lock(&dump_mu);
  if (last_dump_ns != 0 && now - last_dump_ns < 200000000ull) {
    uv_mutex_unlock(&dump_mu);
    return;
  }
  last_dump_ns = now;
  uv_mutex_unlock(&dump_mu);
  rc = uvccl_trace_dump(loop, NULL, reason);
  if (rc != 0)
    LOG_WARN("trace", "dumping the flight recorder to %s: %s", dir,
             uvccl_strerror(rc));
  else
    LOG_INFO("trace", "flight recorder dumped to %s (%s)", dir, reason);
}

static void on_trace_signal(uv_signal_t *h, int signum) {
  const char *dir = uvccl__config_text(UVCCL__CFG_TRACE_DIR);
  char reason[64], path[4096];
  int rc;
  snprintf(reason, sizeof(reason), "signal %d", signum);
  if (dir != NULL && *dir != '\0') {
    rc = uvccl_trace_dump(h->loop, NULL, reason);
  } else {
    uvccl__fsnap_t s;
    int rank = -1;
    if (uvccl__flight_snapshot(&s) == 0) {
      rank = process_rank(&s);
      uvccl__flight_snapshot_free(&s);
    }
    snprintf(path, sizeof(path), "uvccl-trace.%d.%ld.json", rank,
             (long)getpid());
    rc = uvccl_trace_dump(h->loop, path, reason);
  }
  if (rc != 0)
    LOG_WARN("trace", "dumping the flight recorder on signal %d: %s", signum,
             uvccl_strerror(rc));
  else
    LOG_INFO("trace", "flight recorder dumped (signal %d)", signum);
}

int uvccl_trace_signal_start(uv_loop_t *loop, uv_signal_t *handle,
                             int signum) {
  int rc;
  if (loop == NULL || handle == NULL) return UV_EINVAL;
  rc = uv_signal_init(loop, handle);
  if (rc != 0) return rc;
  rc = uv_signal_start(handle, on_trace_signal, signum);
  if (rc != 0) {
    uv_close((uv_handle_t *)handle, NULL);
    return rc;
  }
  uv_unref((uv_handle_t *)handle);
  return 0;
}
