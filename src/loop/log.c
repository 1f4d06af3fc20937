/* Logging: a level from UVCCL_LOG, lines tagged with the component and,
 * once a process group sets it, the rank. Lines are written with one
 * write() each so that ranks sharing a terminal do not interleave within a
 * line. */
#include "internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int uvccl__log_level = -1;
static int log_rank = -1;
static uvccl_log_sink_cb log_sink;
static void *log_sink_arg;

static const char *level_names[] = {"off", "error", "warn", "info", "debug",
                                    "trace"};

/* UVCCL_LOG (config.c); a malformed value is said once the level is set. */
static int log_level_from_env(void) {
  int level, rc = uvccl__config_choice(UVCCL__CFG_LOG, &level);
  uvccl__log_level = level;
  if (rc == UV_EINVAL)
    uvccl__log(UVCCL_LOG_WARN, "config",
               "UVCCL_LOG=%s is not one of off, error, warn, info, debug, "
               "trace or 0-5: warn holds", uvccl__config_text(UVCCL__CFG_LOG));
  return level;
}

int uvccl__log_enabled(uvccl_log_level_t level) {
  /* Racy first read is harmless: every thread computes the same value. */
  if (uvccl__log_level < 0) uvccl__log_level = log_level_from_env();
  return (int)level <= uvccl__log_level && level != UVCCL_LOG_OFF;
}

void uvccl_log_set_level(uvccl_log_level_t level) {
  uvccl__log_level = (int)level;
}

uvccl_log_level_t uvccl_log_get_level(void) {
  if (uvccl__log_level < 0) uvccl__log_level = log_level_from_env();
  return (uvccl_log_level_t)uvccl__log_level;
}

void uvccl_log_set_rank(int rank) { log_rank = rank; }

void uvccl_log_set_sink(uvccl_log_sink_cb cb, void *arg) {
  log_sink = cb;
  log_sink_arg = arg;
}

void uvccl__log(uvccl_log_level_t level, const char *component,
                const char *fmt, ...) {
  char line[1024];
  char out[1200];
  va_list ap;
  int n;

  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (log_sink != NULL) {
    log_sink(level, component, line, log_sink_arg);
    return;
  }
  if (log_rank >= 0)
    n = snprintf(out, sizeof(out), "uvccl[rank %d] %s %s: %s\n", log_rank,
                 level_names[level], component, line);
  else
    n = snprintf(out, sizeof(out), "uvccl %s %s: %s\n", level_names[level],
                 component, line);
  if (n > (int)sizeof(out) - 1) n = (int)sizeof(out) - 1;
  if (write(STDERR_FILENO, out, (size_t)n) < 0) { /* nowhere to report */ }
}
