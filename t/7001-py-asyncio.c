/* The asyncio binding (python/uvccl), through its pytest suite
 * (t/py/asyncio, pytest-asyncio), one TAP line a pytest test:
 *   - worlds of 2 and 4 processes over env://: every collective exact
 *     (allreduce of ten dtypes x sum/max/min/product, avg, bfloat16;
 *     broadcast and reduce from every root, allgather, reduce_scatter,
 *     alltoall, gather, scatter, barrier, monitored_barrier, the uneven
 *     allgatherv, reduce_scatterv and alltoallv, allreduce_coalesced,
 *     the byte and object collectives, batch_isend_irecv, premul_sum,
 *     send/recv, recv from any
 *     source, twenty allreduces in flight at once, split, new_group), on
 *     numpy arrays, array.array, bytearray and memoryviews; the store
 *     client; the flight recorder's dump;
 *   - a peer SIGKILLed mid-allreduce: PeerError naming it on every
 *     survivor, the loop still serving a timer, later calls failing the
 *     same way, shrink to the survivors and an exact allreduce there;
 *   - wrong sizes across ranks (fingerprint check): MismatchError with
 *     both counts; a timeout (TimeoutError, and the other rank hears of it
 *     naming the culprit); revoke (RevokedError with the reason); abort
 *     (AbortedError here, PeerError naming the aborter there);
 *   - groups from a store object and from tcp://, a StoreServer in the
 *     process;
 *   - in one process: bad buffers and arguments raise TypeError or
 *     ValueError saying what is wrong, and the group works after each; a
 *     destroyed group and a closed store refuse; a group used from another
 *     event loop; HashStore and TCPStore operations and timeouts;
 *   - examples/python/vsearch.py at 2 ranks: HTTP searches equal the
 *     brute-force answer, a killed rank gives 503 naming it;
 *   - pip install ./python/uvccl offline into a venv, then a world of one
 *     from the installed package.
 * Skips where Debian's python3 lacks pytest, pytest-asyncio or numpy, or
 * the extension is not built. */
#define _GNU_SOURCE
#include "tap.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PY "/usr/bin/python3"

int main(void) {
  char tapfile[] = "/tmp/uvccl-py-tap.XXXXXX";
  char cmd[1024], line[1024];
  glob_t g;
  FILE *f;
  int fd, st, n = 0, failed = 0;

  if (system(PY " -c 'import pytest, pytest_asyncio, numpy' 2>/dev/null") != 0)
    skip_all("Debian's python3 lacks pytest, pytest-asyncio or numpy");
  if (glob(UVCCL_SRC_DIR "/python/uvccl/_core*.so", 0, NULL, &g) != 0)
    skip_all("python/uvccl's extension is not built (make)");
  globfree(&g);
  tap_alarm(900);
  if ((fd = mkstemp(tapfile)) < 0) skip_all("mkstemp failed");
  close(fd);
  /* pytest's own report goes to stderr, for the log */
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && UVCCL_TAP_FILE='%s' PYTHONDONTWRITEBYTECODE=1 " PY
           " -m pytest -q -p no:cacheprovider t/py/asyncio 1>&2",
           UVCCL_SRC_DIR, tapfile);
  st = system(cmd);
  f = fopen(tapfile, "r");
  if (f != NULL) {
    while (fgets(line, sizeof(line), f) != NULL) {
      line[strcspn(line, "\n")] = '\0';
      if (strncmp(line, "not ok", 6) == 0) failed++;
      ok(strncmp(line, "ok", 2) == 0, "%s", strchr(line, '-') + 2);
      n++;
    }
    fclose(f);
  }
  unlink(tapfile);
  ok(n >= 22, "pytest ran %d tests (22 or more)", n);
  ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
     "pytest exited 0 (status %d, %d failed)", st, failed);
  return done_testing();
}
