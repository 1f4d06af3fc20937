/* uvccl-trace: merges the flight recorder dumps of a job's ranks and says,
 * per group, what a person needs when the job hangs: the first collective
 * the ranks disagree on, the collective they are stuck in and the ranks
 * that never entered it, who waits for whom, and the ranks without a
 * dump. The reasoning is src/diag/analyze.c; this file reads and prints.
 *
 *   uvccl-trace [--json] DIR|FILE...
 *   uvccl-trace --live HOST:PORT [--prefix P] [--timeout S] [--out DIR]
 *
 * Exit status: 0 a culprit was found (named in the verdict), 1 nothing
 * wrong was found, 2 an error (no dumps, unreadable files, bad usage). */
#define PROG "uvccl-trace"
#include "uvccl.h"
#include <inttypes.h>
#include "cli.h"

/* Errors exit with 2 (1 means "no culprit found"). */
#define die(...) (fprintf(stderr, PROG ": " __VA_ARGS__), fputc('\n', stderr), exit(2))
#include "diag/analyze.h"
#include "diag/json.h"

#include <dirent.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "Usage: " PROG " [--json] DIR|FILE...\n"
          "       " PROG " --live HOST:PORT [--prefix P] [--timeout SECONDS]"
          " [--out DIR] [--json]\n"
          "\n"
          "Reads the flight recorder dumps of a job's ranks (the files\n"
          "uvccl-trace.RANK.PID.json that UVCCL_TRACE_DIR or\n"
          "uvccl_trace_dump() wrote) and prints, per process group, the\n"
          "first collective the ranks disagree on, the collective they are\n"
          "stuck in and the ranks that never entered it, who waits for\n"
          "whom, and the ranks without a dump.\n"
          "\n"
          "  --json            the verdict as JSON (format uvccl-trace-verdict)\n"
          "  --live HOST:PORT  ask a running job, through its store, to dump\n"
          "                    now (every rank, on its own loop, within about\n"
          "                    UVCCL_TRACE_POLL_MS), collect the dumps through\n"
          "                    the store and analyze them; the job goes on\n"
          "  --prefix P        the world's store prefix (default uvccl/default)\n"
          "  --timeout S       how long --live waits for the ranks (default 10)\n"
          "  --out DIR         --live also writes the dumps there\n"
          "\n"
          "Exit status: 0 a culprit was found, 1 nothing wrong was found,\n"
          "2 an error.\n");
}

/* ---- reading ------------------------------------------------------------- */

typedef struct {
  char **texts;
  size_t *lens;
  char **names;
  int n;
} inputs_t;

static void add_input(inputs_t *in, char *text, size_t len, const char *name) {
  in->texts = realloc(in->texts, (size_t)(in->n + 1) * sizeof(char *));
  in->lens = realloc(in->lens, (size_t)(in->n + 1) * sizeof(size_t));
  in->names = realloc(in->names, (size_t)(in->n + 1) * sizeof(char *));
  if (in->texts == NULL || in->lens == NULL || in->names == NULL)
    die("out of memory");
  in->texts[in->n] = text;
  in->lens[in->n] = len;
  in->names[in->n] = strdup(name);
  in->n++;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  size_t cap = 0, n = 0;
  if (f == NULL) return NULL;
  for (;;) {
    size_t got;
    if (n + 65536 > cap) {
      cap = cap ? cap * 2 : 1 << 20;
      buf = realloc(buf, cap);
      if (buf == NULL) die("out of memory");
    }
    got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    free(buf);
    fclose(f);
    return NULL;
  }
  fclose(f);
  *len = n;
  return buf;
}

static int is_dump_name(const char *name) {
  size_t n = strlen(name);
  return strncmp(name, "uvccl-trace.", 12) == 0 && n > 5 &&
         strcmp(name + n - 5, ".json") == 0;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void read_path(inputs_t *in, const char *path) {
  struct stat st;
  size_t len;
  char *text;
  if (stat(path, &st) != 0) die("%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    struct dirent *de;
    char **names = NULL;
    int n = 0, i;
    if (d == NULL) die("%s: %s", path, strerror(errno));
    while ((de = readdir(d)) != NULL) {
      if (!is_dump_name(de->d_name)) continue;
      names = realloc(names, (size_t)(n + 1) * sizeof(char *));
      if (names == NULL) die("out of memory");
      names[n++] = strdup(de->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof(char *), name_cmp);
    for (i = 0; i < n; i++) {
      char full[4096];
      snprintf(full, sizeof(full), "%s/%s", path, names[i]);
      text = read_file(full, &len);
      if (text == NULL) die("%s: %s", full, strerror(errno));
      add_input(in, text, len, full);
      free(names[i]);
    }
    free(names);
    return;
  }
  text = read_file(path, &len);
  if (text == NULL) die("%s: %s", path, strerror(errno));
  add_input(in, text, len, path);
}

/* ---- printing -------------------------------------------------------------- */

/* "rank 2", "ranks 0, 1 and 3" */
static void print_ranks(FILE *f, const int *r, int n) {
  int i;
  if (n == 0) {
    fprintf(f, "no rank");
    return;
  }
  fprintf(f, "rank%s ", n > 1 ? "s" : "");
  for (i = 0; i < n; i++)
    fprintf(f, "%s%d", i == 0 ? "" : i == n - 1 ? " and " : ", ", r[i]);
}

static void json_ranks(FILE *f, const int *r, int n) {
  int i;
  fputc('[', f);
  for (i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", r[i]);
  fputc(']', f);
}

static void json_str(FILE *f, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  if (s == NULL) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void json_desc(FILE *f, const uvccl__tdesc_t *d) {
  fputs("{\"op\":", f);
  json_str(f, d->op);
  fputs(",\"dtype\":", f);
  json_str(f, d->dtype);
  fputs(",\"redop\":", f);
  json_str(f, d->redop);
  fprintf(f, ",\"root\":%d,\"count_in\":%lld,\"count_out\":%lld}", d->root,
          (long long)d->count_in, (long long)d->count_out);
}

static const char *why_text(const char *why) {
  if (why == NULL) return "";
  if (strcmp(why, "mismatch") == 0)
    return "called something else than the others";
  if (strcmp(why, "not_entered") == 0)
    return "never entered the collective the others are stuck in";
  if (strcmp(why, "waited_for_missing") == 0)
    return "left no dump, and the others wait for it";
  return "the others wait for it, and it waits for nobody in this group";
}

static int group_interesting(const uvccl__tgroup_t *g) {
  return g->mismatch || g->stuck || g->nmissing > 0;
}

static void print_text(FILE *f, const uvccl__tresult_t *res) {
  int k, i, quiet = 0;
  fprintf(f, "%d dump%s: ", res->ndumps, res->ndumps == 1 ? "" : "s");
  print_ranks(f, res->dump_ranks, res->ndumps);
  if (res->nmissing > 0) {
    fprintf(f, "; without a dump: ");
    print_ranks(f, res->missing, res->nmissing);
  }
  fputc('\n', f);
  for (k = 0; k < res->ngroups; k++) {
    const uvccl__tgroup_t *g = &res->groups[k];
    char d1[256], d2[256];
    if (!group_interesting(g)) {
      quiet++;
      continue;
    }
    fprintf(f, "\ngroup \"%s\" (gid %u, %s, %d ranks: ", g->name, g->gid,
            g->backend, g->size);
    for (i = 0; i < g->size && i < 16; i++)
      fprintf(f, "%s%d", i ? "," : "", g->ranks[i]);
    fprintf(f, "%s)\n", g->size > 16 ? ",..." : "");
    if (g->mismatch) {
      uvccl__tdesc_format(&g->mm_a, d1, sizeof(d1));
      uvccl__tdesc_format(&g->mm_b, d2, sizeof(d2));
      fprintf(f, "  mismatch at collective #%llu: ",
              (unsigned long long)g->mm_seq);
      print_ranks(f, g->mm_ranks_a, g->nmm_a);
      fprintf(f, " called %s; ", d1);
      print_ranks(f, g->mm_ranks_b, g->nmm_b);
      fprintf(f, " called %s\n", d2);
    }
    if (g->stuck) {
      uvccl__tdesc_format(&g->stuck_desc, d1, sizeof(d1));
      fprintf(f, "  stuck in collective #%llu (%s): entered by ",
              (unsigned long long)g->stuck_seq, d1);
      print_ranks(f, g->in_ranks, g->nin);
      if (g->nnot > 0) {
        fprintf(f, "; never entered by ");
        print_ranks(f, g->not_entered, g->nnot);
      }
      fputc('\n', f);
      for (i = 0; i < g->nwait; i++) {
        const uvccl__twait_t *w = &g->waits[i];
        fprintf(f, "    rank %d (%s)", w->rank, w->state);
        if (w->nfor > 0) {
          fprintf(f, " waits for ");
          print_ranks(f, w->for_ranks, w->nfor);
        }
        fputc('\n', f);
      }
    }
    if (g->nmissing > 0) {
      fprintf(f, "  no dump from ");
      print_ranks(f, g->missing, g->nmissing);
      fputc('\n', f);
    }
    if (g->nculprits > 0) {
      fprintf(f, "  => ");
      print_ranks(f, g->culprits, g->nculprits);
      fprintf(f, ": %s\n", why_text(g->why));
    }
  }
  if (quiet > 0)
    fprintf(f, "\n%d other group%s: nothing pending, no disagreement\n",
            quiet, quiet == 1 ? "" : "s");
  fputc('\n', f);
  if (res->nculprits > 0) {
    fprintf(f, "verdict: ");
    print_ranks(f, res->culprits, res->nculprits);
    fputc('\n', f);
  } else {
    fprintf(f, "verdict: no culprit found (nothing stuck, no disagreement)\n");
  }
}

static void print_json(FILE *f, const uvccl__tresult_t *res) {
  int k, i;
  fputs("{\"format\":\"uvccl-trace-verdict\",\"version\":1,\"dumps\":", f);
  json_ranks(f, res->dump_ranks, res->ndumps);
  fprintf(f, ",\"world\":%d,\"missing\":", res->world);
  json_ranks(f, res->missing, res->nmissing);
  fputs(",\"culprits\":", f);
  json_ranks(f, res->culprits, res->nculprits);
  fputs(",\"groups\":[", f);
  for (k = 0; k < res->ngroups; k++) {
    const uvccl__tgroup_t *g = &res->groups[k];
    fprintf(f, "%s{\"name\":", k ? "," : "");
    json_str(f, g->name);
    fputs(",\"backend\":", f);
    json_str(f, g->backend);
    fprintf(f, ",\"gid\":%u,\"ranks\":", g->gid);
    json_ranks(f, g->ranks, g->size);
    fputs(",\"missing\":", f);
    json_ranks(f, g->missing, g->nmissing);
    fputs(",\"mismatch\":", f);
    if (g->mismatch) {
      fprintf(f, "{\"seq\":%llu,\"a\":{\"ranks\":",
              (unsigned long long)g->mm_seq);
      json_ranks(f, g->mm_ranks_a, g->nmm_a);
      fputs(",\"called\":", f);
      json_desc(f, &g->mm_a);
      fputs("},\"b\":{\"ranks\":", f);
      json_ranks(f, g->mm_ranks_b, g->nmm_b);
      fputs(",\"called\":", f);
      json_desc(f, &g->mm_b);
      fputs("}}", f);
    } else {
      fputs("null", f);
    }
    fputs(",\"stuck\":", f);
    if (g->stuck) {
      fprintf(f, "{\"seq\":%llu,\"called\":", (unsigned long long)g->stuck_seq);
      json_desc(f, &g->stuck_desc);
      fputs(",\"entered\":", f);
      json_ranks(f, g->in_ranks, g->nin);
      fputs(",\"not_entered\":", f);
      json_ranks(f, g->not_entered, g->nnot);
      fputs(",\"waiting\":[", f);
      for (i = 0; i < g->nwait; i++) {
        fprintf(f, "%s{\"rank\":%d,\"state\":", i ? "," : "",
                g->waits[i].rank);
        json_str(f, g->waits[i].state);
        fputs(",\"for\":", f);
        json_ranks(f, g->waits[i].for_ranks, g->waits[i].nfor);
        fputc('}', f);
      }
      fputs("]}", f);
    } else {
      fputs("null", f);
    }
    fputs(",\"culprits\":", f);
    json_ranks(f, g->culprits, g->nculprits);
    fputs(",\"why\":", f);
    json_str(f, g->why);
    fputc('}', f);
  }
  fputs("]}\n", f);
}

/* ---- analysis ---------------------------------------------------------------- */

static int analyze(inputs_t *in, int as_json) {
  uvccl__json_t **docs;
  uvccl__tresult_t res;
  char err[256];
  int i, rc;
  if (in->n == 0) {
    fprintf(stderr, PROG ": no dumps (uvccl-trace.*.json) found\n");
    return 2;
  }
  docs = xcalloc((size_t)in->n, sizeof(*docs));
  rc = 0;
  for (i = 0; i < in->n && rc == 0; i++)
    if (uvccl__json_parse(in->texts[i], in->lens[i], &docs[i], err,
                          sizeof(err)) != 0) {
      fprintf(stderr, PROG ": %s: %s\n", in->names[i], err);
      rc = 2;
    }
  if (rc == 0 &&
      uvccl__trace_analyze((const uvccl__json_t *const *)docs, in->n, &res,
                           err, sizeof(err)) != 0) {
    /* err names the dump by its index: give the file */
    int d;
    if (sscanf(err, "dump %d", &d) == 1 && d >= 0 && d < in->n)
      fprintf(stderr, PROG ": %s: %s\n", in->names[d], err);
    else
      fprintf(stderr, PROG ": %s\n", err);
    rc = 2;
  }
  if (rc == 0) {
    if (as_json) print_json(stdout, &res);
    else print_text(stdout, &res);
    rc = res.nculprits > 0 ? 0 : 1;
    uvccl__trace_result_free(&res);
  }
  for (i = 0; i < in->n; i++) uvccl__json_free(docs[i]);
  free(docs);
  return rc;
}

/* ---- --live: through the job's store ----------------------------------------- */

/* Asks every rank of the world under prefix to dump into the store, and
 * reads what arrives within timeout_s (ranks that do not answer are
 * reported missing by the analysis). */
static void collect_live(inputs_t *in, const char *hostport,
                         const char *prefix, double timeout_s,
                         const char *outdir) {
  uv_loop_t loop;
  uvccl_store_t st;
  uvccl_tcp_store_options_t o;
  uvccl_work_t w;
  char host[256], key[512], cmd[300], *colon;
  void *val = NULL;
  size_t len = 0;
  int64_t gen = 0;
  int world, r, rc, got = 0;
  uint64_t t0 = now_ns(), budget = (uint64_t)(timeout_s * 1e3);
  snprintf(host, sizeof(host), "%s", hostport);
  colon = strrchr(host, ':');
  if (colon == NULL) usage_error("--live wants HOST:PORT, not '%s'", hostport);
  *colon = '\0';
  memset(&o, 0, sizeof(o));
  o.host = host;
  o.port = (int)arg_int("port", colon + 1, 1, 65535);
  o.timeout_ms = budget ? budget : 1;
  uv_loop_init(&loop);
  if (uvccl_tcp_store_init(&loop, &st, &o) != 0) die("store client: init");
  memset(&w, 0, sizeof(w));
  rc = uvccl_tcp_store_connect(&st, &w, NULL);
  if (rc == 0) rc = uvccl_work_wait(&w);
  if (rc != 0) die("the store at %s: %s", hostport, w.msg[0] ? w.msg : uvccl_strerror(rc));
  snprintf(key, sizeof(key), "%s/trace/world", prefix);
  rc = uvccl_store_get_sync(&st, key, &val, &len);
  if (rc != 0)
    die("%s: no world is watching this store under '%s' (%s): is the job "
        "running, made from a URL, with UVCCL_TRACE_POLL_MS not 0?", hostport,
        prefix, uvccl_strerror(rc));
  world = atoi(val);
  free(val);
  if (world <= 0) die("%s: '%s' holds no world size", hostport, key);
  snprintf(key, sizeof(key), "%s/trace/req", prefix);
  rc = uvccl_store_add_sync(&st, key, 1, &gen);
  if (rc == 0) {
    snprintf(key, sizeof(key), "%s/trace/cmd", prefix);
    snprintf(cmd, sizeof(cmd), "collect %lld uvccl-trace --live",
             (long long)gen);
    rc = uvccl_store_set_sync(&st, key, cmd, strlen(cmd));
  }
  if (rc != 0) die("%s: asking for dumps: %s", hostport, uvccl_strerror(rc));
  fprintf(stderr, PROG ": asked the %d ranks under '%s' to dump (request "
          "%lld); waiting up to %.0f s\n", world, prefix, (long long)gen,
          timeout_s);
  for (r = 0; r < world; r++) {
    const char *keys[1];
    uint64_t spent = (now_ns() - t0) / 1000000;
    snprintf(key, sizeof(key), "%s/trace/dump/%lld/%d", prefix,
             (long long)gen, r);
    keys[0] = key;
    if (spent >= budget ||
        uvccl_store_wait_sync(&st, keys, 1, budget - spent) != 0 ||
        uvccl_store_get_sync(&st, key, &val, &len) != 0) {
      fprintf(stderr, PROG ": rank %d did not answer\n", r);
      continue;
    }
    got++;
    memset(&w, 0, sizeof(w));
    if (uvccl_store_delete_key(&st, &w, key, NULL) == 0) uvccl_work_wait(&w);
    if (outdir != NULL) {
      char path[4096];
      FILE *f;
      snprintf(path, sizeof(path), "%s/uvccl-trace.%d.live.json", outdir, r);
      f = fopen(path, "wb");
      if (f == NULL || fwrite(val, 1, len, f) != len || fclose(f) != 0)
        die("%s: %s", path, strerror(errno));
    }
    snprintf(key, sizeof(key), "%s (rank %d, through the store)", hostport, r);
    add_input(in, val, len, key);
  }
  fprintf(stderr, PROG ": %d of %d ranks answered\n", got, world);
  uvccl_store_close(&st, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

int main(int argc, char **argv) {
  inputs_t in = {0};
  const char *live = NULL, *prefix = "uvccl/default", *outdir = NULL;
  double timeout_s = 10;
  int i, as_json = 0, npaths = 0, rc;
  for (i = 1; i < argc; i++) {
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--json") == 0) {
      as_json = 1;
    } else if (opt_value(argc, argv, &i, "--live", &v)) {
      live = v;
    } else if (opt_value(argc, argv, &i, "--prefix", &v)) {
      prefix = v;
    } else if (opt_value(argc, argv, &i, "--out", &v)) {
      outdir = v;
    } else if (opt_value(argc, argv, &i, "--timeout", &v)) {
      timeout_s = arg_seconds("--timeout", v, 0.001, 86400);
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      usage_error("unknown option '%s'", argv[i]);
    } else {
      npaths++;
    }
  }
  if (live != NULL && npaths > 0)
    usage_error("--live reads from the job: no paths with it");
  if (live == NULL && npaths == 0)
    usage_error("which dumps? give a directory or files, or --live");
  if (live != NULL) {
    collect_live(&in, live, prefix, timeout_s, outdir);
  } else {
    for (i = 1; i < argc; i++) {
      if (i > 1 && (strcmp(argv[i - 1], "--prefix") == 0 ||
                    strcmp(argv[i - 1], "--out") == 0 ||
                    strcmp(argv[i - 1], "--timeout") == 0 ||
                    strcmp(argv[i - 1], "--live") == 0))
        continue;
      if (argv[i][0] != '-' || argv[i][1] == '\0') read_path(&in, argv[i]);
    }
  }
  rc = analyze(&in, as_json);
  for (i = 0; i < in.n; i++) {
    free(in.texts[i]);
    free(in.names[i]);
  }
  free(in.texts);
  free(in.lens);
  free(in.names);
  return rc;
}
