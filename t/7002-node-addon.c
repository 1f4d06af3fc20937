/* The Node.js addon (node/), through its `node --test` suite (t/node), one
 * TAP line a test of Node's runner:
 *   - worlds of 2 and 4 processes over env://: every collective exact
 *     (allreduce of six TypedArray types x sum/max/min/product, avg, a
 *     Buffer, a view at an offset into a larger ArrayBuffer, 4 MiB,
 *     bfloat16 in a Uint16Array; broadcast and reduce from every root,
 *     allgather, reduce_scatter, alltoall, gather, scatter, barrier,
 *     monitoredBarrier, allgatherv, reduceScatterv, alltoallv,
 *     allreduceCoalesced, the byte and object collectives,
 *     batchIsendIrecv, premulSum, send/recv, recv from any source, twenty
 *     allreduces in flight, split, newGroup), the store client, the
 *     flight recorder's dump;
 *   - a peer SIGKILLed mid-allreduce: PeerError naming it on every
 *     survivor, a 1 ms interval still ticking, later calls failing the
 *     same way, shrink to the survivors and an exact allreduce there;
 *   - wrong sizes across ranks: MismatchError with both counts; a timeout
 *     (TimeoutError, the other rank hears of it naming the culprit);
 *     revoke (RevokedError with the reason); abort (AbortedError here,
 *     PeerError naming the aborter there); groups from a store object and
 *     from tcp://, a StoreServer in the process;
 *   - in one process: bad buffers and arguments reject (never throw, never
 *     crash) with TypeError, RangeError or InvalidArgumentError saying
 *     what is wrong, the group working after each; a destroyed group and a
 *     closed store refuse; HashStore and TCPStore operations and timeouts;
 *     groups on worker threads (a loop each), and a worker terminated with
 *     its group, store and operations open (the process lives on, the
 *     other rank hears that rank 1 left); the process ending by itself
 *     after destroy(), on Node's own libuv;
 *   - examples/node/vsearch.js at 2 ranks: HTTP searches equal the
 *     brute-force answer, a killed rank gives 503 naming it;
 *   - npm install of ./node into a project, offline, and a world of one
 *     from the installed package;
 *   - under valgrind (where installed): every kind of call once, the
 *     failing ones too, with no invalid access and no leak of the addon's.
 * Skips where node is missing or the addon is not built. */
#define _GNU_SOURCE
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  char tapfile[] = "/tmp/uvccl-node-tap.XXXXXX";
  char cmd[1024], line[1024];
  FILE *f;
  int fd, st, n = 0, failed = 0;

  if (system("node --version >/dev/null 2>&1") != 0) skip_all("no node");
  if (access(UVCCL_SRC_DIR "/node/build/Release/uvccl.node", R_OK) != 0)
    skip_all("node/'s addon is not built (make)");
  tap_alarm(900);
  if ((fd = mkstemp(tapfile)) < 0) skip_all("mkstemp failed");
  close(fd);
  /* one file at a time: the npm install test rebuilds the addon in place */
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && node --test --test-concurrency=1 --test-reporter=tap "
           "--test-reporter-destination='%s' --test-reporter=spec "
           "--test-reporter-destination=stderr t/node/",
           UVCCL_SRC_DIR, tapfile);
  st = system(cmd);
  f = fopen(tapfile, "r");
  if (f != NULL) {
    /* the runner's top-level results: "ok N - name", not indented */
    while (fgets(line, sizeof(line), f) != NULL) {
      const char *name;
      line[strcspn(line, "\n")] = '\0';
      if (strncmp(line, "ok ", 3) != 0 && strncmp(line, "not ok ", 7) != 0)
        continue;
      if (line[0] == 'n') failed++;
      name = strstr(line, " - ");
      ok(line[0] == 'o', "%s", name ? name + 3 : line);
      n++;
    }
    fclose(f);
  }
  unlink(tapfile);
  ok(n >= 25, "node --test ran %d tests (25 or more)", n);
  ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
     "node --test exited 0 (status %d, %d failed)", st, failed);
  return done_testing();
}
