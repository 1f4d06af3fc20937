/* The flight recorder on TCP groups (in-process worlds, t/world.h):
 *   a) after allreduce, broadcast, allgather and a send/recv, every rank's
 *      group and entries say what ran: sequence numbers (collectives and
 *      point-to-point apart), op, dtype, reduce op, counts, root, peer,
 *      the caller's tag, states and times, last enqueued/started/completed;
 *   b) a collective that rank 2 never joins: the dump taken on the loop
 *      shows it started, waiting for rank 2; when it times out, with
 *      UVCCL_TRACE_DIR set, a dump appears there by itself, saying
 *      timed_out with the error and message, and the group broken;
 *   c) the ring: with UVCCL_TRACE_BUFFER_SIZE=8 (a child process, the
 *      ring is one per process) 20 allreduces leave the last 8 entries,
 *      "dropped" 12, and the group counters still right;
 *   d) a group made with trace_buffer_size = UVCCL_TRACE_OFF records
 *      nothing; subgroups are named by their tag, "split", "new_group";
 *   e) a tag with quotes, a newline and a high byte still makes valid
 *      JSON, and reads back; uvccl_trace_dump writes a file; a NULL path
 *      without UVCCL_TRACE_DIR is UV_EINVAL. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "world.h"
#include "loop_helpers.h"
#include "diag/json.h"
#include "dump.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static uv_loop_t L;

static uvccl__json_t *parse_text(const char *text, size_t n) {
  uvccl__json_t *j = NULL;
  char err[128];
  if (uvccl__json_parse(text, n, &j, err, sizeof(err)) != 0) {
    diag("parse: %s", err);
    return NULL;
  }
  return j;
}

static uvccl__json_t *dump_now(uv_loop_t *loop) {
  char *s = NULL;
  size_t n = 0;
  uvccl__json_t *j;
  if (uvccl_trace_json(loop, "test", &s, &n) != 0) return NULL;
  j = parse_text(s, n);
  free(s);
  return j;
}

static uvccl__json_t *parse_file(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  uvccl__json_t *j;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  fclose(f);
  j = parse_text(buf, (size_t)n);
  free(buf);
  return j;
}

static int entries_of(const uvccl__json_t *d, const uvccl__json_t *g) {
  const uvccl__json_t *es = uvccl__json_get(d, "entries");
  int64_t id = uvccl__json_get_int(g, "id", -1);
  size_t i;
  int n = 0;
  for (i = 0; i < uvccl__json_len(es); i++)
    n += uvccl__json_get_int(uvccl__json_at(es, i), "group", -2) == id;
  return n;
}

static int64_t last_seq(const uvccl__json_t *g, const char *kind,
                        const char *which) {
  const uvccl__json_t *x =
      uvccl__json_get(uvccl__json_get(uvccl__json_get(g, "last"), kind), which);
  if (x == NULL) return -9;
  if (x->type == UVCCL__J_NULL) return -1;
  return uvccl__json_int(x, -9);
}

static int times_ordered(const uvccl__json_t *e) {
  int64_t q = uvccl__json_get_int(e, "queued_ns", 0),
          s = uvccl__json_get_int(e, "started_ns", 0),
          x = uvccl__json_get_int(e, "ended_ns", 0);
  return q > 0 && s >= q && x >= s;
}

/* ---- a) ------------------------------------------------------------------ */

static char prefix_a[32];

static void test_ops(world_t *W) {
  uvccl_work_t w[3], pw[2];
  float f[3][16], fr[3][16];
  int32_t b[3][8], ag_in[3][4], ag_out[3][12];
  char sb[8] = "payload", rb[8];
  uvccl__json_t *d;
  int r, good = 1;
  memset(w, 0, sizeof(w));
  memset(pw, 0, sizeof(pw));
  for (r = 0; r < 3; r++) {
    int i;
    for (i = 0; i < 16; i++) f[r][i] = (float)(r + 1);
    w[r].tag = r == 0 ? "step-1" : NULL;
    uvccl_allreduce(&W->pg[r], &w[r], f[r], fr[r], 16, UVCCL_FLOAT32,
                    UVCCL_SUM, NULL);
  }
  for (r = 0; r < 3; r++) good &= uvccl_work_wait(&w[r]) == 0;
  for (r = 0; r < 3; r++) {
    int i;
    for (i = 0; i < 8; i++) b[r][i] = r == 1 ? 7 : 0;
    w[r].tag = NULL;
    uvccl_broadcast(&W->pg[r], &w[r], b[r], 8, UVCCL_INT32, 1, NULL);
  }
  for (r = 0; r < 3; r++) good &= uvccl_work_wait(&w[r]) == 0;
  for (r = 0; r < 3; r++) {
    int i;
    for (i = 0; i < 4; i++) ag_in[r][i] = r;
    uvccl_allgather(&W->pg[r], &w[r], ag_in[r], ag_out[r], 4, UVCCL_INT32,
                    NULL);
  }
  for (r = 0; r < 3; r++) good &= uvccl_work_wait(&w[r]) == 0;
  uvccl_send(&W->pg[0], &pw[0], sb, 8, 1, 5, NULL);
  uvccl_recv(&W->pg[1], &pw[1], rb, 8, 0, 5, NULL);
  good &= uvccl_work_wait(&pw[0]) == 0 && uvccl_work_wait(&pw[1]) == 0;
  ok(good && fr[2][0] == 6.0f && b[0][7] == 7 && ag_out[2][11] == 2,
     "a: the operations ran, results right");

  d = dump_now(NULL);
  ok(d != NULL && str_is(d, "format", "uvccl-flight-recorder") &&
         uvccl__json_get_int(d, "version", 0) == 1 &&
         uvccl__json_get_int(d, "pid", 0) == (int64_t)getpid() &&
         uvccl__json_get_int(d, "capacity", 0) == 2000,
     "a: a dump parses: format uvccl-flight-recorder, version 1, this pid, "
     "2000 entries by default");
  for (r = 0; r < 3; r++) {
    const uvccl__json_t *g = find_group(d, prefix_a, r), *ranks;
    const uvccl__json_t *ar, *bc, *ag;
    ranks = uvccl__json_get(g, "ranks");
    ok(g != NULL && str_is(g, "backend", "tcp") &&
           uvccl__json_get_int(g, "gid", 0) == 1 &&
           uvccl__json_get_int(g, "size", 0) == 3 &&
           uvccl__json_len(ranks) == 3 &&
           uvccl__json_int(uvccl__json_at(ranks, 2), -1) == 2 &&
           str_is(g, "state", "ok"),
       "a: rank %d: its world group (name, gid 1, tcp, size 3, ranks, ok)",
       r);
    ar = find_entry(d, g, "collective", 0);
    bc = find_entry(d, g, "collective", 1);
    ag = find_entry(d, g, "collective", 2);
    ok(ar != NULL && str_is(ar, "op", "allreduce") &&
           str_is(ar, "dtype", "float32") && str_is(ar, "redop", "sum") &&
           uvccl__json_get_int(ar, "count_in", 0) == 16 &&
           uvccl__json_get_int(ar, "count_out", 0) == 16 &&
           uvccl__json_get_int(ar, "root", 0) == -1 &&
           str_is(ar, "state", "completed") && times_ordered(ar) &&
           str_is(ar, "error", NULL) &&
           str_is(ar, "tag", r == 0 ? "step-1" : NULL),
       "a: rank %d: #0 allreduce float32 sum 16 -> 16, completed, times in "
       "order, tag %s", r, r == 0 ? "step-1" : "none");
    ok(bc != NULL && str_is(bc, "op", "broadcast") &&
           str_is(bc, "dtype", "int32") && str_is(bc, "redop", NULL) &&
           uvccl__json_get_int(bc, "root", 0) == 1 &&
           uvccl__json_get_int(bc, "count_in", 0) == 8 &&
           str_is(bc, "state", "completed"),
       "a: rank %d: #1 broadcast int32 8, root 1", r);
    ok(ag != NULL && str_is(ag, "op", "allgather") &&
           uvccl__json_get_int(ag, "count_in", 0) == 4 &&
           uvccl__json_get_int(ag, "count_out", 0) == 12,
       "a: rank %d: #2 allgather 4 -> 12", r);
    ok(last_seq(g, "collective", "enqueued") == 2 &&
           last_seq(g, "collective", "started") == 2 &&
           last_seq(g, "collective", "completed") == 2,
       "a: rank %d: last collective enqueued, started, completed: 2", r);
    if (r == 2)
      ok(last_seq(g, "p2p", "enqueued") == -1 && entries_of(d, g) == 3,
         "a: rank 2: no point-to-point (null), 3 entries");
    else {
      const uvccl__json_t *p = find_entry(d, g, "p2p", 0);
      ok(p != NULL && str_is(p, "op", r == 0 ? "send" : "recv") &&
             uvccl__json_get_int(p, "peer", -1) == (r == 0 ? 1 : 0) &&
             uvccl__json_get_int(p, r == 0 ? "count_in" : "count_out", 0) ==
                 8 &&
             str_is(p, "state", "completed") &&
             last_seq(g, "p2p", "completed") == 0,
         "a: rank %d: p2p #0 %s, peer %d, 8 bytes, completed", r,
         r == 0 ? "send" : "recv", r == 0 ? 1 : 0);
    }
  }
  uvccl__json_free(d);
}

/* ---- b) ------------------------------------------------------------------ */

static char trace_dir[256];

static int find_dump_file(char *path, size_t len) {
  DIR *dir = opendir(trace_dir);
  struct dirent *de;
  int found = 0;
  if (dir == NULL) return 0;
  while ((de = readdir(dir)) != NULL)
    if (strncmp(de->d_name, "uvccl-trace.", 12) == 0 &&
        strstr(de->d_name, ".json") != NULL &&
        strstr(de->d_name, ".tmp") == NULL) {
      snprintf(path, len, "%s/%s", trace_dir, de->d_name);
      found = 1;
    }
  closedir(dir);
  return found;
}

/* ---- the schema (docs/trace-format.md, version 1) ---------------------- */

/* type letters: s string, S string or null, i integer, I integer or null,
 * a array, o object */
typedef struct {
  const char *key;
  char type;
} field_t;

static int type_ok(const uvccl__json_t *v, char t) {
  if (v == NULL) return 0;
  switch (t) {
  case 's': return v->type == UVCCL__J_STR;
  case 'S': return v->type == UVCCL__J_STR || v->type == UVCCL__J_NULL;
  case 'i': return v->type == UVCCL__J_NUM && v->is_int;
  case 'I': return (v->type == UVCCL__J_NUM && v->is_int) ||
                   v->type == UVCCL__J_NULL;
  case 'a': return v->type == UVCCL__J_ARR;
  case 'o': return v->type == UVCCL__J_OBJ;
  }
  return 0;
}

/* Every documented member with its type, and no other (extra: a member
 * allowed besides, or NULL). */
static int fields_ok(const uvccl__json_t *o, const field_t *f, size_t n,
                     const char *extra, const char *what) {
  size_t i, j;
  if (o == NULL || o->type != UVCCL__J_OBJ) {
    diag("%s: not an object", what);
    return 0;
  }
  for (i = 0; i < n; i++)
    if (!type_ok(uvccl__json_get(o, f[i].key), f[i].type)) {
      diag("%s: member \"%s\" missing or not of type %c", what, f[i].key,
           f[i].type);
      return 0;
    }
  for (j = 0; j < o->len; j++) {
    int known = extra != NULL && strcmp(o->keys[j], extra) == 0;
    for (i = 0; i < n && !known; i++) known = strcmp(o->keys[j], f[i].key) == 0;
    if (!known) {
      diag("%s: undocumented member \"%s\"", what, o->keys[j]);
      return 0;
    }
  }
  return 1;
}

static int schema_ok(const uvccl__json_t *d, int *nwaiting) {
  static const field_t top[] = {
      {"format", 's'}, {"version", 'i'}, {"reason", 's'}, {"host", 's'},
      {"pid", 'i'}, {"rank", 'i'}, {"library", 's'}, {"time_unix_ns", 'i'},
      {"time_mono_ns", 'i'}, {"capacity", 'i'}, {"recorded", 'i'},
      {"dropped", 'i'}, {"groups", 'a'}, {"entries", 'a'}};
  static const field_t grp[] = {
      {"id", 'i'}, {"gid", 'i'}, {"name", 's'}, {"backend", 's'},
      {"rank", 'i'}, {"size", 'i'}, {"ranks", 'a'}, {"state", 's'},
      {"error", 'S'}, {"message", 'S'}, {"last", 'o'}};
  static const field_t seqs[] = {
      {"enqueued", 'I'}, {"started", 'I'}, {"completed", 'I'}};
  static const field_t ent[] = {
      {"id", 'i'}, {"group", 'i'}, {"gid", 'i'}, {"seq", 'i'}, {"kind", 's'},
      {"op", 's'}, {"dtype", 'S'}, {"redop", 'S'}, {"root", 'i'},
      {"peer", 'i'}, {"count_in", 'i'}, {"count_out", 'i'}, {"tag", 'S'},
      {"state", 's'}, {"queued_ns", 'I'}, {"started_ns", 'I'},
      {"ended_ns", 'I'}, {"error", 'S'}, {"message", 'S'}};
  static const char *const states[] = {"queued", "started", "completed",
                                       "failed", "timed_out", "cancelled"};
  const uvccl__json_t *gs, *es;
  size_t i, k;
  if (!fields_ok(d, top, sizeof(top) / sizeof(top[0]), NULL, "dump") ||
      !str_is(d, "format", "uvccl-flight-recorder") ||
      uvccl__json_get_int(d, "version", 0) != 1)
    return 0;
  gs = uvccl__json_get(d, "groups");
  for (i = 0; i < uvccl__json_len(gs); i++) {
    const uvccl__json_t *g = uvccl__json_at(gs, i), *last;
    if (!fields_ok(g, grp, sizeof(grp) / sizeof(grp[0]), NULL, "group"))
      return 0;
    last = uvccl__json_get(g, "last");
    if (!fields_ok(last, (const field_t[]){{"collective", 'o'}, {"p2p", 'o'}},
                   2, NULL, "group.last") ||
        !fields_ok(uvccl__json_get(last, "collective"), seqs, 3, NULL,
                   "last.collective") ||
        !fields_ok(uvccl__json_get(last, "p2p"), seqs, 3, NULL, "last.p2p"))
      return 0;
    if ((int64_t)uvccl__json_len(uvccl__json_get(g, "ranks")) !=
        uvccl__json_get_int(g, "size", -1)) {
      diag("group: ranks has not size members");
      return 0;
    }
  }
  es = uvccl__json_get(d, "entries");
  for (i = 0; i < uvccl__json_len(es); i++) {
    const uvccl__json_t *e = uvccl__json_at(es, i), *wf;
    int st = 0;
    if (!fields_ok(e, ent, sizeof(ent) / sizeof(ent[0]), "waiting_for",
                   "entry"))
      return 0;
    for (k = 0; k < sizeof(states) / sizeof(states[0]); k++)
      st |= str_is(e, "state", states[k]);
    if (!st || !(str_is(e, "kind", "collective") || str_is(e, "kind", "p2p"))) {
      diag("entry: state or kind not one of the documented values");
      return 0;
    }
    wf = uvccl__json_get(e, "waiting_for");
    if (wf != NULL) {
      if (!type_ok(wf, 'a')) return 0;
      for (k = 0; k < uvccl__json_len(wf); k++)
        if (!type_ok(uvccl__json_at(wf, k), 'i')) return 0;
      (*nwaiting)++;
    }
  }
  return 1;
}

static void test_pending(world_t *W) {
  uvccl_work_t w[2];
  float f[2][4], fr[2][4];
  uvccl__json_t *d;
  int r, waits_for_2 = 0, all_wait = 1, started = 1, k;
  char path[512];
  /* the sequence number the next collective gets */
  d = dump_now(NULL);
  k = (int)last_seq(find_group(d, prefix_a, 0), "collective", "enqueued") + 1;
  uvccl__json_free(d);
  memset(w, 0, sizeof(w));
  memset(f, 0, sizeof(f));
  for (r = 0; r < 2; r++) {
    w[r].timeout_ms = 400;
    uvccl_allreduce(&W->pg[r], &w[r], f[r], fr[r], 4, UVCCL_FLOAT32,
                    UVCCL_SUM, NULL);
  }
  loop_run_for(&L, 50);
  d = dump_now(&L);
  for (r = 0; r < 2; r++) {
    const uvccl__json_t *g = find_group(d, prefix_a, r);
    const uvccl__json_t *e = find_entry(d, g, "collective", k);
    const uvccl__json_t *wf = uvccl__json_get(e, "waiting_for");
    size_t i;
    started &= e != NULL && str_is(e, "op", "allreduce") &&
               str_is(e, "state", "started") &&
               str_is(e, "ended_ns", NULL);
    all_wait &= uvccl__json_len(wf) > 0;
    for (i = 0; i < uvccl__json_len(wf); i++)
      waits_for_2 |= uvccl__json_int(uvccl__json_at(wf, i), -1) == 2;
  }
  ok(started, "b: the allreduce rank 2 skips is recorded as started, not "
     "ended, on ranks 0 and 1");
  ok(all_wait && waits_for_2,
     "b: the dump on the loop says whom each waits for, rank 2 among them");
  {
    int nw = 0, sch = schema_ok(d, &nw);
    ok(sch && nw >= 2, "the schema: every member of the dump, "
       "its groups and entries is documented, of its documented type, and "
       "present (waiting_for on %d pending entries)", nw);
  }
  uvccl__json_free(d);

  setenv("UVCCL_TRACE_DIR", trace_dir, 1);
  for (r = 0; r < 2; r++) uvccl_work_wait(&w[r]);
  unsetenv("UVCCL_TRACE_DIR");
  ok(w[0].status == UV_ETIMEDOUT && w[1].status == UV_ETIMEDOUT,
     "b: both time out");
  {
    /* allreduce #K (group "P") timed out after 400 ms: waiting for rank 2
     * (127.0.0.1:PORT), which has not sent step S (0 of N bytes arrived);
     * rank 2, or a rank that waits for rank 2 */
    char head[256], names2[64];
    int form = 1, named = 0;
    snprintf(head, sizeof(head), "allreduce #%d (group \"%s\") timed out "
             "after 400 ms: waiting for rank ", k, prefix_a);
    snprintf(names2, sizeof(names2), "rank 2 (127.0.0.1:");
    for (r = 0; r < 2; r++) {
      const char *m = w[r].msg;
      if (strncmp(m, head, strlen(head)) != 0 ||
          strstr(m, "), which has not sent ") == NULL ||
          strstr(m, " bytes arrived)") == NULL) {
        form = 0;
        diag("rank %d: %s", r, m);
      }
      named |= strstr(m, names2) != NULL;
    }
    ok(form && named, "b: the timeout errors say which collective of which "
       "group, and whom they wait for with the step; rank 2 is named: %s",
       w[0].msg);
  }
  ok(find_dump_file(path, sizeof(path)), "b: with UVCCL_TRACE_DIR set, a dump "
     "appeared there by itself: %s", path);
  d = parse_file(path);
  {
    const uvccl__json_t *g = find_group(d, prefix_a, 0);
    const uvccl__json_t *e = find_entry(d, g, "collective", k);
    if (!ok(d != NULL && strstr(uvccl__json_get_str(d, "reason", ""),
                           "timed out") != NULL &&
           str_is(e, "state", "timed_out") &&
           str_is(e, "error", "ETIMEDOUT") &&
           strstr(uvccl__json_get_str(e, "message", ""), "timed out") !=
               NULL,
       "b: it says why (the timeout), and rank 0's entry: timed_out, "
       "ETIMEDOUT, the message")) {
      if (e == NULL) diag("no entry #%d of %s rank 0 in %s", k, prefix_a,
                          path);
      else
        diag("reason \"%s\", state %s, error %s, message \"%s\"",
             uvccl__json_get_str(d, "reason", "?"),
             uvccl__json_get_str(e, "state", "?"),
             uvccl__json_get_str(e, "error", "?"),
             uvccl__json_get_str(e, "message", "?"));
    }
  }
  uvccl__json_free(d);
  d = dump_now(NULL);
  {
    const uvccl__json_t *g = find_group(d, prefix_a, 0);
    if (!ok(str_is(g, "state", "broken") && str_is(g, "error", "ETIMEDOUT") &&
           last_seq(g, "collective", "completed") == k - 1 &&
           last_seq(g, "collective", "enqueued") == k,
       "b: rank 0's group: broken by the timeout; last completed #%d, last "
       "enqueued #%d", k - 1, k))
    diag("group state %s error %s, last completed %lld enqueued %lld",
         uvccl__json_get_str(g, "state", "?"),
         uvccl__json_get_str(g, "error", "?"),
         (long long)last_seq(g, "collective", "completed"),
         (long long)last_seq(g, "collective", "enqueued"));
  }
  uvccl__json_free(d);
}

/* ---- c) (child process: its own ring) ------------------------------------ */

static int child_ring(const char *out) {
  world_t W;
  uvccl_work_t w[2];
  int i, r, rc;
  uv_loop_init(&L);
  if (world_init(&W, &L, 2, NULL) != 0) return 3;
  for (i = 0; i < 20; i++) {
    int32_t v[2] = {1, 1};
    memset(w, 0, sizeof(w));
    for (r = 0; r < 2; r++)
      uvccl_allreduce(&W.pg[r], &w[r], &v[r], &v[r], 1, UVCCL_INT32,
                      UVCCL_SUM, NULL);
    for (r = 0; r < 2; r++)
      if (uvccl_work_wait(&w[r]) != 0) return 4;
  }
  rc = uvccl_trace_dump(NULL, out, "ring test");
  world_destroy(&W);
  return rc == 0 ? 0 : 5;
}

static void test_ring(const char *self) {
  char out[512], cmd[8192];
  uvccl__json_t *d;
  int st;
  snprintf(out, sizeof(out), "%s/ring.json", trace_dir);
  snprintf(cmd, sizeof(cmd),
           "UVCCL_T_ROLE=ring UVCCL_TRACE_BUFFER_SIZE=8 UVCCL_T_OUT=%s %s",
           out, self);
  st = system(cmd);
  is_int(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0,
         "c: a child with UVCCL_TRACE_BUFFER_SIZE=8 ran 20 allreduces on 2 "
         "ranks and dumped");
  d = parse_file(out);
  {
    const uvccl__json_t *es = uvccl__json_get(d, "entries");
    const uvccl__json_t *first = uvccl__json_at(es, 0);
    const uvccl__json_t *gs = uvccl__json_get(d, "groups");
    const uvccl__json_t *g = uvccl__json_at(gs, 0);
    ok(uvccl__json_get_int(d, "capacity", 0) == 8 &&
           uvccl__json_len(es) == 8 &&
           uvccl__json_get_int(d, "recorded", 0) == 40 &&
           uvccl__json_get_int(d, "dropped", 0) == 32 &&
           uvccl__json_get_int(first, "id", 0) == 33,
       "c: 8 entries kept (ids 33..40 of 40 recorded), 32 dropped");
    ok(str_is(g, "state", "destroyed") == 0 &&
           last_seq(g, "collective", "completed") == 19,
       "c: the group's counters outlive the ring: last completed #19");
  }
  uvccl__json_free(d);
}

/* ---- d) ------------------------------------------------------------------ */

static void test_off_and_names(world_t *A) {
  world_t W;
  uv_loop_t L2; /* world_destroy runs its loop until empty: not A's */
  uvccl_pg_options_t o;
  uvccl_pg_t sub[3], sp[3];
  uvccl_work_t w[3];
  uvccl__json_t *d;
  char name[32];
  int r, n_off = 0, good = 1;
  int32_t v[2];
  const int ranks01[] = {0, 1};
  memset(&o, 0, sizeof(o));
  o.trace_buffer_size = UVCCL_TRACE_OFF;
  uv_loop_init(&L2);
  ok(world_init(&W, &L2, 2, &o) == 0, "d: a world with UVCCL_TRACE_OFF");
  snprintf(name, sizeof(name), "world%d", world__seq);
  for (r = 0; r < 2; r++) {
    v[r] = 1; /* alive until the work is done */
    memset(&w[r], 0, sizeof(w[r]));
    uvccl_allreduce(&W.pg[r], &w[r], &v[r], &v[r], 1, UVCCL_INT32,
                    UVCCL_SUM, NULL);
  }
  for (r = 0; r < 2; r++) uvccl_work_wait(&w[r]);
  d = dump_now(NULL);
  n_off = find_group(d, name, 0) != NULL || find_group(d, name, 1) != NULL;
  ok(!n_off, "d: ... has no record in the dump");
  uvccl__json_free(d);
  world_destroy(&W);
  uv_loop_close(&L2);

  /* subgroups of world A (3 ranks): new_group with a tag, and split */
  for (r = 0; r < 3; r++) /* every rank of the parent calls it */
    good &= uvccl_pg_new_group(&A->pg[r], &sub[r], ranks01, 2, "pairs") ==
            (r < 2 ? 0 : UVCCL_ENOTMEMBER);
  memset(w, 0, sizeof(w));
  for (r = 0; r < 3; r++)
    good &= uvccl_pg_split(&A->pg[r], &sp[r], r % 2, r, &w[r], NULL) == 0;
  for (r = 0; r < 3; r++) good &= uvccl_work_wait(&w[r]) == 0;
  d = dump_now(NULL);
  {
    const uvccl__json_t *gp = find_group(d, "pairs", 1);
    const uvccl__json_t *gs = find_group(d, "split", 1); /* global 2 */
    ok(good && gp != NULL && uvccl__json_get_int(gp, "size", 0) == 2 &&
           gs != NULL && uvccl__json_get_int(gs, "size", 0) == 2 &&
           uvccl__json_get_int(gs, "rank", -1) == 1 &&
           uvccl__json_int(uvccl__json_at(uvccl__json_get(gs, "ranks"), 1),
                           -1) == 2,
       "d: a new_group tagged \"pairs\" and a split are named so, with "
       "their ranks (split of rank 2: rank 1 of [0, 2])");
    if (!good || gp == NULL || gs == NULL) {
      const uvccl__json_t *gl = uvccl__json_get(d, "groups");
      size_t i;
      for (i = 0; i < uvccl__json_len(gl); i++)
        diag("group %s rank %lld size %lld %s",
             uvccl__json_get_str(uvccl__json_at(gl, i), "name", "?"),
             (long long)uvccl__json_get_int(uvccl__json_at(gl, i), "rank", -9),
             (long long)uvccl__json_get_int(uvccl__json_at(gl, i), "size", -9),
             uvccl__json_get_str(uvccl__json_at(gl, i), "state", "?"));
    }
  }
  uvccl__json_free(d);
  (void)A;
  {
    int closed = 0;
    for (r = 0; r < 2; r++) uvccl_pg_destroy(&sub[r], NULL);
    for (r = 0; r < 3; r++) uvccl_pg_destroy(&sp[r], NULL);
    loop_run_for(&L, 20);
    (void)closed;
  }
  d = dump_now(NULL);
  ok(find_group(d, "pairs", 1) == NULL, "d: destroyed groups are marked "
     "destroyed");
  uvccl__json_free(d);
}

/* ---- e) ------------------------------------------------------------------ */

static void test_escaping(world_t *W) {
  uvccl_work_t w[3];
  uvccl__json_t *d;
  char path[512];
  int r;
  memset(w, 0, sizeof(w));
  for (r = 0; r < 3; r++) {
    w[r].tag = "a\"b\n\xff";
    uvccl_barrier(&W->pg[r], &w[r], NULL);
  }
  for (r = 0; r < 3; r++) uvccl_work_wait(&w[r]);
  (void)W;
  snprintf(path, sizeof(path), "%s/explicit.json", trace_dir);
  is_int(uvccl_trace_dump(NULL, path, "explicit"), 0,
         "e: uvccl_trace_dump to a path");
  d = parse_file(path);
  ok(d != NULL && str_is(d, "reason", "explicit"),
     "e: the file parses, reason \"explicit\"");
  {
    const uvccl__json_t *es = uvccl__json_get(d, "entries");
    const uvccl__json_t *last = uvccl__json_at(es, uvccl__json_len(es) - 1);
    ok(str_is(last, "op", "barrier") && str_is(last, "tag", "a\"b\n\xc3\xbf"),
       "e: a tag with a quote, a newline and byte 0xff reads back (0xff as "
       "U+00FF)");
  }
  uvccl__json_free(d);
  unsetenv("UVCCL_TRACE_DIR");
  is_int(uvccl_trace_dump(NULL, NULL, NULL), UV_EINVAL,
         "e: no path and no UVCCL_TRACE_DIR: UV_EINVAL");
}

int main(void) {
  const char *role = getenv("UVCCL_T_ROLE");
  char self[4096];
  ssize_t l;
  world_t W;
  if (role != NULL && strcmp(role, "ring") == 0)
    return child_ring(getenv("UVCCL_T_OUT"));
  tap_alarm(120);
  unsetenv("UVCCL_TRACE_BUFFER_SIZE");
  unsetenv("UVCCL_TRACE_DIR");
  l = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (l <= 0) skip_all("cannot find this binary");
  self[l] = '\0';
  snprintf(trace_dir, sizeof(trace_dir), "/tmp/uvccl-t4001.%ld",
           (long)getpid());
  mkdir(trace_dir, 0700);
  uv_loop_init(&L);
  if (world_init(&W, &L, 3, NULL) != 0) {
    printf("Bail out! world_init\n");
    return 1;
  }
  snprintf(prefix_a, sizeof(prefix_a), "world%d", world__seq);
  test_ops(&W);
  test_escaping(&W);
  test_off_and_names(&W);
  test_pending(&W);
  world_destroy(&W);
  test_ring(self);
  uv_loop_close(&L);
  {
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", trace_dir);
    if (system(cmd) != 0) diag("could not remove %s", trace_dir);
  }
  return done_testing();
}
