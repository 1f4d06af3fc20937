/* The configuration table (src/loop/config.c): every UVCCL_* variable is
 * read through it; a malformed value is a warning naming the variable and
 * the default holds; docs/env.md is the table as `uvccl-run
 * --print-config=markdown` prints it; no code reads a variable the table
 * lacks; --print-config names malformed and unknown variables and never
 * shows a secret. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "loop/internal.h"
#include "cpu/internal.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define RUN UVCCL_BUILD_DIR "/bin/uvccl-run"

/* ---- the log, caught ----------------------------------------------------- */

static char logged[4096];
static int nlogged;
static void sink(uvccl_log_level_t level, const char *comp, const char *line,
                 void *arg) {
  (void)level, (void)comp, (void)arg;
  snprintf(logged, sizeof(logged), "%s", line);
  nlogged++;
}

/* ---- helpers ---------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *b;
  long n;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  b = malloc((size_t)n + 1);
  if (b != NULL && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b != NULL) b[n] = '\0';
  fclose(f);
  if (len) *len = (size_t)n;
  return b;
}

/* Runs cmd through the shell; its stdout (and stderr) in out. */
static int run(const char *cmd, char *out, size_t len) {
  FILE *p = popen(cmd, "r");
  size_t n = 0, r;
  int st;
  if (p == NULL) return -1;
  while (n + 1 < len && (r = fread(out + n, 1, len - 1 - n, p)) > 0) n += r;
  out[n] = '\0';
  st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- the source scan ---------------------------------------------------------- */

static char offenders[4096];
static int nfiles;

static void offend(const char *path, const char *what) {
  size_t l = strlen(offenders);
  if (l < sizeof(offenders) - 200)
    snprintf(offenders + l, sizeof(offenders) - l, " %s: %s;", path, what);
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Each read of an environment variable in a file: a UVCCL_ name must be
 * in the table; in the library (src/), only config.c reads one, and only
 * the launchers' reader (bootenv.c) reads by a name it was given. */
static int scan_file(const char *path, const struct stat *st, int kind,
                     struct FTW *ftw) {
  static const char *const reads[] = {"getenv(\"", "environ.get(\"",
                                      "environ[\"", "os.getenv(\""};
  const char *rel = path + strlen(UVCCL_SRC_DIR) + 1;
  int in_lib = strncmp(rel, "src/", 4) == 0;
  char *text, *p;
  size_t i;
  (void)st, (void)ftw;
  if (kind != FTW_F) return 0;
  if (!ends_with(path, ".c") && !ends_with(path, ".h") &&
      !ends_with(path, ".cpp") && !ends_with(path, ".py"))
    return 0;
  if ((text = slurp(path, NULL)) == NULL) return 0;
  nfiles++;
  for (i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
    for (p = strstr(text, reads[i]); p != NULL; p = strstr(p + 1, reads[i])) {
      const char *name = p + strlen(reads[i]);
      char var[128];
      size_t n = strcspn(name, "\"");
      if (n >= sizeof(var)) continue;
      memcpy(var, name, n);
      var[n] = '\0';
      if (strncmp(var, "UVCCL_", 6) != 0) continue;
      if (uvccl__config_find(var) < 0) offend(rel, var);
      else if (in_lib && !ends_with(rel, "loop/config.c"))
        offend(rel, "reads a variable of the table with getenv()");
    }
  }
  if (in_lib && !ends_with(rel, "loop/config.c") &&
      !ends_with(rel, "boot/bootenv.c")) {
    for (p = strstr(text, "getenv("); p != NULL; p = strstr(p + 1, "getenv(")) {
      if (p[7] != '"' && p[7] != ')' && p > text &&
          (p[-1] == ' ' || p[-1] == '(' ||
           p[-1] == '!' || p[-1] == '='))
        offend(rel, "getenv() of a name not written out");
    }
  }
  free(text);
  return 0;
}

/* ---- main ------------------------------------------------------------------------ */

int main(void) {
  const uvccl__cfg_var_t *c;
  uint64_t x;
  int id, i, rc, good, n;
  char out[1 << 16], cmd[1024], *doc;

  plan(24);
  uvccl_log_set_sink(sink, NULL);
  for (id = 0; id < UVCCL__CFG_COUNT; id++) unsetenv(uvccl__config_var(id)->name);

  /* the table itself */
  good = uvccl__config_var(UVCCL__CFG_COUNT) == NULL &&
         uvccl__config_var(-1) == NULL;
  for (id = 0; (c = uvccl__config_var(id)) != NULL; id++) {
    int nch = 1;
    good &= strncmp(c->name, "UVCCL_", 6) == 0 && c->doc && *c->doc &&
            c->dflt_text && *c->dflt_text && uvccl__config_find(c->name) == id;
    if (c->type == UVCCL__CFG_UINT)
      good &= c->min <= c->dflt && c->dflt <= c->max;
    if (c->type == UVCCL__CFG_CHOICE) {
      for (i = 0; c->choices[i]; i++) nch += c->choices[i] == '|';
      good &= c->dflt < (uint64_t)nch;
    }
    if (!good) {
      diag("entry %d (%s) is not whole", id, c->name);
      break;
    }
  }
  ok(good && id == UVCCL__CFG_COUNT, "%d variables: each named UVCCL_*, "
     "found by its name, documented, its default within its range", id);
  ok(uvccl__config_find("UVCCL_NOPE") == -1, "a name the table lacks: -1");
  ok(uvccl__config_var(UVCCL__CFG_TURN_BYTES)->dflt == UVCCL_TURN_BYTES_DEFAULT &&
         uvccl__config_var(UVCCL__CFG_TURN_US)->dflt == UVCCL_TURN_US_DEFAULT &&
         uvccl__config_var(UVCCL__CFG_SMALL_MAX)->dflt == UVCCL__SMALL_MAX &&
         uvccl__config_var(UVCCL__CFG_SEGMENT)->dflt == UVCCL__SEGMENT &&
         uvccl__config_var(UVCCL__CFG_STREAM_MIN)->dflt == UVCCL__STREAM_MIN,
     "the table's defaults are the code's (turn, small, segment, stream)");

  /* numbers */
  rc = uvccl__config_uint(UVCCL__CFG_SEGMENT, &x);
  ok(rc == 0 && x == 524288 && nlogged == 0, "unset: 0, the default, "
     "nothing logged (%d, %llu)", rc, (unsigned long long)x);
  setenv("UVCCL_SEGMENT", "1048576", 1);
  rc = uvccl__config_uint(UVCCL__CFG_SEGMENT, &x);
  ok(rc == 1 && x == 1048576 && nlogged == 0, "set: 1 and the value");
  setenv("UVCCL_SEGMENT", "12abc", 1);
  rc = uvccl__config_uint(UVCCL__CFG_SEGMENT, &x);
  ok(rc == UV_EINVAL && x == 524288 && nlogged == 1 &&
         strstr(logged, "UVCCL_SEGMENT=12abc") != NULL &&
         strstr(logged, "not a whole number") != NULL &&
         strstr(logged, "524288") != NULL,
     "malformed: UV_EINVAL, the default, a warning naming the variable, "
     "the value and the default: %s", logged);
  uvccl__config_uint(UVCCL__CFG_SEGMENT, &x);
  ok(nlogged == 1, "the same malformed value again: no second warning");
  setenv("UVCCL_SEGMENT", "0", 1);
  rc = uvccl__config_uint(UVCCL__CFG_SEGMENT, &x);
  ok(rc == UV_EINVAL && x == 524288 && nlogged == 2 &&
         strstr(logged, "not within 1-1073741824") != NULL,
     "out of range (0 for a segment): UV_EINVAL, the default, said so: %s",
     logged);
  n = 0;
  {
    static const char *const bad[] = {"-5", " 5", "5 ", "", "0x10",
                                      "99999999999999999999999", "1e3"};
    for (i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
      setenv("UVCCL_TRACE_POLL_MS", bad[i], 1);
      rc = uvccl__config_uint(UVCCL__CFG_TRACE_POLL_MS, &x);
      n += (bad[i][0] ? rc == UV_EINVAL : rc == 0) && x == 1000;
    }
  }
  ok(n == 7, "a sign, spaces, hex, overflow, an exponent: malformed (empty: "
     "unset); the default each time (%d of 7)", n);
  setenv("UVCCL_TRACE_POLL_MS", "86400001", 1);
  rc = uvccl__config_uint(UVCCL__CFG_TRACE_POLL_MS, &x);
  setenv("UVCCL_TRACE_POLL_MS", "0", 1);
  ok(rc == UV_EINVAL && uvccl__config_uint(UVCCL__CFG_TRACE_POLL_MS, &x) == 1 &&
         x == 0, "above the range: malformed; 0 where the range has it: 0");
  unsetenv("UVCCL_TRACE_POLL_MS");
  unsetenv("UVCCL_SEGMENT");

  /* choices */
  setenv("UVCCL_TRANSPORT", "TCP", 1);
  ok(uvccl__config_choice(UVCCL__CFG_TRANSPORT, &i) == 1 && i == 2,
     "a choice, any case: its index (TCP: 2 of auto|shm|tcp)");
  nlogged = 0;
  setenv("UVCCL_TRANSPORT", "udp", 1);
  rc = uvccl__config_choice(UVCCL__CFG_TRANSPORT, &i);
  ok(rc == UV_EINVAL && i == 0 && nlogged == 1 &&
         strstr(logged, "UVCCL_TRANSPORT=udp") != NULL &&
         strstr(logged, "auto|shm|tcp") != NULL,
     "not one of the choices: the default, and a warning listing them: %s",
     logged);
  unsetenv("UVCCL_TRANSPORT");
  setenv("UVCCL_LOG", "4", 1);
  rc = uvccl__config_choice(UVCCL__CFG_LOG, &i);
  setenv("UVCCL_LOG", "Warning", 1);
  ok(rc == 1 && i == 4 && uvccl__config_choice(UVCCL__CFG_LOG, &i) == 1 &&
         i == 2, "the log level: 0-5 and \"warning\" too");
  nlogged = 0;
  setenv("UVCCL_LOG", "loud", 1);
  rc = uvccl__config_choice(UVCCL__CFG_LOG, &i);
  ok(rc == UV_EINVAL && i == 2 && nlogged == 0,
     "a malformed log level: warn, and the table does not log it (the "
     "logger says so once it has its level)");
  unsetenv("UVCCL_LOG");
  setenv("UVCCL_SHM_BOXES", "2", 1);
  rc = uvccl__config_choice(UVCCL__CFG_SHM_BOXES, &i);
  ok(rc == UV_EINVAL && i == 1, "a switch is 0 or 1 (2: the default, on)");
  unsetenv("UVCCL_SHM_BOXES");

  /* text */
  setenv("UVCCL_TRACE_DIR", "", 1);
  ok(uvccl__config_text(UVCCL__CFG_TRACE_DIR) == NULL, "empty text: unset");
  setenv("UVCCL_TRACE_DIR", "/tmp/x y", 1);
  ok(uvccl__config_text(UVCCL__CFG_TRACE_DIR) != NULL &&
         strcmp(uvccl__config_text(UVCCL__CFG_TRACE_DIR), "/tmp/x y") == 0,
     "text: as it is");
  unsetenv("UVCCL_TRACE_DIR");

  /* a reader through the table: the heartbeat timeout */
  nlogged = 0;
  setenv("UVCCL_HEARTBEAT_TIMEOUT_MS", "250", 1);
  x = uvccl__heartbeat_timeout(0);
  setenv("UVCCL_HEARTBEAT_TIMEOUT_MS", "15s", 1);
  ok(x == 250 && uvccl__heartbeat_timeout(0) == 15000 && nlogged == 1 &&
         strstr(logged, "UVCCL_HEARTBEAT_TIMEOUT_MS=15s") != NULL &&
         uvccl__heartbeat_timeout(7) == 7,
     "the heartbeat timeout: 250 -> 250 ms; 15s -> warned, 15000 (it used "
     "to be silently the default); an option over both");
  unsetenv("UVCCL_HEARTBEAT_TIMEOUT_MS");

  /* docs/env.md is the table */
  doc = slurp(UVCCL_SRC_DIR "/docs/env.md", NULL);
  rc = run(RUN " --print-config=markdown", out, sizeof(out));
  ok(doc != NULL && rc == 0 && strlen(out) > 1000 && strstr(doc, out) != NULL,
     "docs/env.md holds the table as uvccl-run --print-config=markdown "
     "prints it (regenerate the page if this fails)");
  if (doc != NULL && strstr(doc, out) == NULL) diag("the table now:\n%s", out);
  free(doc);

  /* nothing reads a variable the table lacks */
  nftw(UVCCL_SRC_DIR "/src", scan_file, 16, FTW_PHYS);
  nftw(UVCCL_SRC_DIR "/tools", scan_file, 16, FTW_PHYS);
  nftw(UVCCL_SRC_DIR "/python/uvccl_torch", scan_file, 16, FTW_PHYS);
  nftw(UVCCL_SRC_DIR "/examples", scan_file, 16, FTW_PHYS);
  ok(nfiles > 50 && offenders[0] == '\0',
     "%d files of src/, tools/, python/ and examples/: every UVCCL_* "
     "variable read is in the table, and the library reads them only "
     "through it%s%s", nfiles, offenders[0] ? ": not so in" : "", offenders);

  /* --print-config */
  rc = run("env -i PATH=/usr/bin:/bin " RUN " --print-config", out,
           sizeof(out));
  ok(rc == 0 && strstr(out, "UVCCL_TURN_BYTES") != NULL &&
         strstr(out, "524288 (default)") != NULL,
     "--print-config in a clean environment: every default, exit 0");
  snprintf(cmd, sizeof(cmd),
           "env -i PATH=/usr/bin:/bin UVCCL_SEGMENT=abc UVCCL_MESH_MAX=8 "
           "UVCCL_AUTH_TOKEN=sekrit UVCCL_TRANSPRT=tcp %s --print-config",
           RUN);
  rc = run(cmd, out, sizeof(out));
  ok(rc == 1 && strstr(out, "UVCCL_SEGMENT") != NULL &&
         strstr(out, "abc (malformed: not a whole number; the default, "
                     "524288, holds)") != NULL &&
         strstr(out, "8 (set)") != NULL,
     "a malformed value: named with why and what holds instead; exit 1");
  ok(strstr(out, "sekrit") == NULL && strstr(out, "(not shown) (set)") != NULL,
     "a secret is never shown");
  ok(strstr(out, "UVCCL_TRANSPRT") != NULL &&
         strstr(out, "unknown: uvccl does not read it") != NULL,
     "a misspelt variable: named as one uvccl does not read");
  return done_testing();
}
