/* uvccl-bench started by the real torchrun (Debian's python3-torch 1.13),
 * 2 and 4 ranks: its agent serves a TCPStore (PyTorch 1.13's, the older
 * dialect) at MASTER_PORT and tells the workers so
 * (TORCHELASTIC_USE_AGENT_STORE=True). env:// then makes no server of its
 * own (the port is taken) and the store client, in its default dialect,
 * finds out that the agent speaks 1.13's. Every row of the table must come
 * back checked ("yes"), and torchrun must exit 0. Skips without torchrun. */
#define _GNU_SOURCE
#include "tap.h"
#include "uvccl.h"
#include "ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TORCHRUN "/usr/bin/torchrun"

/* torchrun's last lines, shown when a check fails */
#define TAIL 40
static char tail[TAIL][256];
static int ntail;

static void show_tail(void) {
  int i;
  for (i = ntail > TAIL ? ntail - TAIL : 0; i < ntail; i++)
    diag("torchrun: %s", tail[i % TAIL]);
}

static void run(int n) {
  char cmd[2048], line[1024], *build = getenv("UVCCL_BUILD_DIR");
  int rows = 0, bad = 0, inuse = 0, st, pass = 1;
  FILE *p;

  if (build == NULL) build = UVCCL_BUILD_DIR;
  /* (--redirects 1 --tee 1: torchrun 1.13 on Python 3.11 cannot parse its
   * own defaults) */
  snprintf(cmd, sizeof(cmd),
           "timeout 120 " TORCHRUN " --nproc_per_node %d --master_addr "
           "127.0.0.1 --master_port %d --redirects 1 --tee 1 --no_python "
           "%s/bin/uvccl-bench --op allreduce,broadcast,allgather -b 4 "
           "-e 64K -f 16 --budget 0.02 2>&1",
           n, free_port(), build);
  p = popen(cmd, "r");
  tap_require(p != NULL, "popen");
  ntail = 0;
  while (fgets(line, sizeof(line), p) != NULL) {
    char *l = strstr(line, "]:");
    snprintf(tail[ntail++ % TAIL], sizeof(tail[0]), "%.*s",
             (int)strcspn(line, "\n"), line);
    if (strstr(line, "address already in use")) inuse++;
    if (l == NULL || strncmp(line, "[default0]", 10) != 0) continue;
    l += 2;
    if (strncmp(l, "allreduce ", 10) == 0 ||
        strncmp(l, "broadcast ", 10) == 0 ||
        strncmp(l, "allgather ", 10) == 0) {
      rows++;
      if (strstr(l, " yes") == NULL) {
        bad++;
        note("%s", l);
      }
    }
  }
  st = pclose(p);
  pass &= ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "torchrun --nproc_per_node %d "
     "uvccl-bench: exit status %d", n, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  /* allreduce and broadcast at 4 sizes, allgather at 3 (4 B is less than
   * an element a rank) */
  pass &= ok(rows == 11 && bad == 0, "%d ranks: %d rows, %d not checked", n, rows,
     bad);
  pass &= is_int(inuse, 0, "%d ranks: nobody tried to serve the agent's port",
                 n);
  if (!pass) show_tail();
}

int main(void) {
  if (access(TORCHRUN, X_OK) != 0) skip_all("no " TORCHRUN);
  tap_alarm(300);
  run(2);
  run(4);
  return done_testing();
}
