/* Captures the library's log lines so a test can assert what was said:
 * logcap_start() empties the buffer and installs the sink, logcap_stop()
 * restores the default. Lines past the buffer's end are dropped. */
#ifndef UVCCL_T_LOGCAP_H
#define UVCCL_T_LOGCAP_H

#include <stdio.h>
#include <string.h>

static char logbuf[8192];

static inline void logcap_sink(uvccl_log_level_t lvl, const char *comp,
                               const char *line, void *arg) {
  size_t l = strlen(logbuf);
  (void)lvl;
  (void)comp;
  (void)arg;
  if (l + strlen(line) + 2 < sizeof(logbuf))
    snprintf(logbuf + l, sizeof(logbuf) - l, "%s\n", line);
}

static inline void logcap_start(void) {
  logbuf[0] = '\0';
  uvccl_log_set_sink(logcap_sink, NULL);
}

static inline void logcap_stop(void) { uvccl_log_set_sink(NULL, NULL); }

#endif
