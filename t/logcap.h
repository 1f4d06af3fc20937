/* Captures the library's log lines so a test can assert what was said:
 * logcap_start() empties the buffer and installs the sink, logcap_stop()
 * restores the default. Lines past the buffer's end are dropped. The sink
 * runs on uvccl's threads too (the liveness monitor logs from its own), at
 * the same time as on the loop's: the lock keeps two lines from being
 * written at the same place (one of two refusals logged together was once
 * lost so). */
#ifndef UVCCL_T_LOGCAP_H
#define UVCCL_T_LOGCAP_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static char logbuf[8192];
static pthread_mutex_t logcap_lock = PTHREAD_MUTEX_INITIALIZER;

static inline void logcap_sink(uvccl_log_level_t lvl, const char *comp,
                               const char *line, void *arg) {
  size_t l;
  (void)lvl;
  (void)comp;
  (void)arg;
  pthread_mutex_lock(&logcap_lock);
  l = strlen(logbuf);
  if (l + strlen(line) + 2 < sizeof(logbuf))
    snprintf(logbuf + l, sizeof(logbuf) - l, "%s\n", line);
  pthread_mutex_unlock(&logcap_lock);
}

static inline void logcap_start(void) {
  pthread_mutex_lock(&logcap_lock);
  logbuf[0] = '\0';
  pthread_mutex_unlock(&logcap_lock);
  uvccl_log_set_sink(logcap_sink, NULL);
}

static inline void logcap_stop(void) { uvccl_log_set_sink(NULL, NULL); }

#endif
