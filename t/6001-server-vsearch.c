/* The HTTP service example, uvccl-vsearch (examples/vsearch), run as a
 * user runs it: uvccl-run -n 4 --keep-going, H2O on rank 0's loop, real
 * HTTP from t/py/vsearch_check.py (Python's http.client and raw sockets),
 * which prints the TAP:
 *   - every row through GET /rows/ID, equal to table.h's generator;
 *   - searches (k 1..50) equal to a brute-force search over those rows,
 *     alone and from 16 concurrent clients; a stored row comes back first
 *     at distance 0; the refresh allreduce runs beside them;
 *   - 17 malformed or wrong requests get 400/404/405 with a clear message,
 *     a 2 MiB body 413, a slow client is cut at the client timeout while
 *     others are served;
 *   - rank 2 SIGKILLed under 8 clients' load: every request answered, 200
 *     and right or 503 naming rank 2; the 3 survivors shrink, remake the
 *     lost shard and find every row again; rank 1 stopped (SIGSTOP): 503
 *     naming it (heartbeat), the 2 survivors go on;
 *   - SIGTERM stops it; no sanitizer report in the ranks' output.
 * Skips where the example was not built (no libh2o-dev). */
#define _GNU_SOURCE
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PY "/usr/bin/python3"
#define SCRIPT UVCCL_SRC_DIR "/t/py/vsearch_check.py"

int main(void) {
  const char *build = getenv("UVCCL_BUILD_DIR");
  char bin[4096];
  pid_t pid;
  int st;

  if (build == NULL) build = UVCCL_BUILD_DIR;
  snprintf(bin, sizeof(bin), "%s/bin/uvccl-vsearch", build);
  if (access(bin, X_OK) != 0) {
    printf("1..0 # SKIP %s not built (needs libh2o-dev)\n", bin);
    return 0;
  }
  if (access(PY, X_OK) != 0) {
    printf("1..0 # SKIP no %s\n", PY);
    return 0;
  }
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    execl(PY, PY, SCRIPT, build, (char *)NULL);
    _exit(127);
  }
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
