#!/bin/bash
# tools/valgrind.sh - the tests under valgrind's memcheck: every process
# they start (ranks, uvccl-run, the store tool) is followed, and each
# writes its own log, so that an error in a rank whose output a test
# captures is not lost. Fails on an invalid access, a use of an
# uninitialised value, a mismatched free, a bad system call argument or a
# block definitely lost; a test's own failures under valgrind's slowdown
# (a kill timed at 0.5 s, a deadline) are listed but do not fail it
# (make check runs them at full speed).
#
# Usage: tools/valgrind.sh [t/NNNN-*.t ...]   (make valgrind)
# Default: the tests below, the longest first. Left out: the PyTorch,
# Python and Node.js ones (the interpreters are not followed; 7002 runs
# the Node.js addon under valgrind itself; 2004's ranks wait on
# torchrun's store, which under valgrind's load answered too late), the sparse worlds of hundreds
# of ranks (2062), the real-GPU and multi-process GPU ones, and those
# that time kills, stops, partitions and restarts (2003, 2050-2058,
# 2066), whose clocks valgrind's slowdown breaks. 2071 kills a member
# mid-grow: under valgrind the survivors' new world times out first (its
# check fails, not counted), the rest of it runs.
# Environment: VALGRIND_OUT (default build/valgrind): the logs;
# VALGRIND_JOBS (default: the CPUs): tests run at once.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${VALGRIND_OUT:-$ROOT/build/valgrind}
if ! command -v valgrind >/dev/null 2>&1; then
  echo "tools/valgrind.sh: no valgrind (apt-get install valgrind)" >&2
  exit 2
fi
JOBS=${VALGRIND_JOBS:-$(nproc)}
if [ $# -eq 0 ]; then
  # the longest first, so that the others run beside it
  set -- t/2010-coll-ops.t t/2071-elastic-grow.t t/2065-coll-hosts.t \
    t/2060-coll-shm.t t/2072-coll-scratch.t t/2070-elastic-transfer.t \
    t/2020-coll-procs.t t/2067-coll-stripes.t t/0001-loop-errors.t \
    t/0002-loop-work.t t/0003-loop-config.t t/0004-tls-conn.t \
    t/1001-store-proto.t t/1002-store-kv.t t/1010-store-tcp.t \
    t/1011-store-rendezvous.t t/1012-store-listen.t \
    t/1013-store-liveness.t t/1014-store-auth.t \
    t/1020-store-torch-client.t t/1021-store-torch-server.t \
    t/1022-store-torch2.t t/1030-store-badinput.t t/1040-store-file.t \
    t/1050-store-hash-prefix.t t/1060-store-tool.t t/2001-coll-reduce.t \
    t/2002-coll-bootenv.t t/2005-coll-bind.t \
    t/2006-coll-auth.t t/2007-coll-mesh-auth.t t/2008-coll-tls.t \
    t/2009-coll-frames.t t/2011-coll-groups-p2p.t \
    t/2012-coll-embedded-loop.t t/2040-coll-gpu-stage.t \
    t/2061-coll-shm-hostile.t t/2063-coll-works.t t/2064-coll-turns.t \
    t/2073-coll-local-cc.t t/2074-coll-slow-calls.t t/3001-gpu-load.t \
    t/3002-gpu-device.t t/3003-gpu-nccl-fake.t t/3005-gpu-nccl-ranks.t \
    t/4001-diag-flight.t t/4002-diag-trace.t t/4003-diag-live.t \
    t/6001-server-vsearch.t
fi
# One test (the loop below runs several at a time through this).
if [ "${1:-}" = --one ]; then
  t=$2
  name=$(basename "$t" .t)
  mkdir -p "$OUT/$name"
  start=$(date +%s)
  UVCCL_BUILD_DIR=$ROOT/build timeout 900 valgrind --trace-children=yes \
    --trace-children-skip='*python*,*node*' \
    --child-silent-after-fork=no --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite \
    --log-file="$OUT/$name/%p.log" "$t" > "$OUT/$name/tap.out" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  # the logs that hold an error (valgrind's own warnings, such as a system
  # call it does not know, are not errors), of a program of this tree: the
  # system's own (ip setting up a namespace, sh) are followed, for what
  # they start, but not judged
  errs=$(grep -l -E '== (Invalid|Conditional jump|Use of uninitialised|Mismatched|Syscall param|Source and destination overlap|[0-9,]+ bytes in [0-9,]+ blocks are definitely lost)' \
    "$OUT/$name"/*.log 2>/dev/null |
    while read -r log; do
      grep -q -E '^==[0-9]+== Command: (/usr)?/s?bin/' "$log" || echo "$log"
    done | wc -l)
  fails=$(grep -c '^not ok' "$OUT/$name/tap.out")
  oks=$(grep -c '^ok' "$OUT/$name/tap.out")
  if [ "$errs" -gt 0 ]; then
    echo "not ok - $name: valgrind errors in $errs processes ($OUT/$name), ${secs}s"
  else
    echo "ok - $name: $oks checks passed under valgrind, no errors, ${secs}s"
  fi
  if [ "$fails" -gt 0 ] || [ "$rc" -ne 0 ]; then
    echo "# $name: $fails checks failed, exit $rc, under valgrind's slowdown (not counted)"
  fi
  exit 0
fi

rm -rf "$OUT"
mkdir -p "$OUT"
printf '%s\n' "$@" | xargs -P "$JOBS" -I{} "$0" --one {} | tee "$OUT/summary.txt"
bad=$(grep -c '^not ok' "$OUT/summary.txt")
if [ "$bad" -gt 0 ]; then
  echo "tools/valgrind.sh: $bad tests with valgrind errors"
  exit 1
fi
echo "tools/valgrind.sh: no valgrind errors in $# tests"
