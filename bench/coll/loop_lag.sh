#!/bin/bash
# bench/coll/loop_lag.sh - how responsive a server's loop stays while large
# collectives run on it (bench/coll/loop_lag.c), over both transports and
# world sizes, several jobs each (a slow mode may show in some jobs only).
#
# Usage: bench/coll/loop_lag.sh [TAG]
# Environment (defaults):
#   WORLDS="2 4"  TRANSPORTS="shm tcp"  JOBS=3
#   OPS=all  SIZES=16M,64M,256M  ITERS= (the benchmark's default)
#   BINS="uvccl:build/bench/uvccl-loop-lag": LABEL:BINARY pairs; with
#     several (another build's, to compare: the benchmark builds against
#     an older uvccl too), each job runs every one in turn, so that they
#     see the same minutes of a noisy machine
#   ENVS= extra variables for the ranks ("UVCCL_TURN_BYTES=262144 ...")
#   LAG_ARGS= more arguments for the benchmark (--no-stats)
#   CALL_TIMES=1 also times the ranks' TCP system calls by size
#     (bench/coll/call_times.c, preloaded): a table per build after the
#     summary, the counts in calls/LABEL/
# Output: one JSON line per cell, build and job in bench/coll/out/TAG/
# raw.jsonl (with the CPU time the hypervisor stole from the machine
# during that job, /proc/stat), and the summary (bench/coll/loop_lag.py:
# the worst job of each cell), also printed.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TAG=${1:-loop-lag-$(date +%Y%m%d-%H%M%S)}
OUT=$ROOT/bench/coll/out/$TAG
WORLDS=${WORLDS:-"2 4"}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
JOBS=${JOBS:-3}
OPS=${OPS:-all}
SIZES=${SIZES:-16M,64M,256M}
ITERS=${ITERS:-}
BINS=${BINS:-uvccl:$ROOT/build/bench/uvccl-loop-lag}
ENVS=${ENVS:-}
CALL_TIMES=${CALL_TIMES:-0}
RUN=$ROOT/build/bin/uvccl-run

[ -x "$ROOT/build/bench/uvccl-loop-lag" ] && [ -x "$RUN" ] || make -C "$ROOT" >/dev/null
[ "$CALL_TIMES" = 1 ] && { [ -f "$ROOT/build/bench/call_times.so" ] || make -C "$ROOT" >/dev/null; }
mkdir -p "$OUT"
: > "$OUT/raw.jsonl"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "bins: $BINS"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+changes')"
  echo "env: $ENVS"
  echo "steal before: $(awk '/^cpu /{print $9}' /proc/stat) ticks"
} > "$OUT/env.txt"
for W in $WORLDS; do
  for T in $TRANSPORTS; do
    for J in $(seq 1 "$JOBS"); do
      tenv=""
      [ "$T" = tcp ] && tenv="UVCCL_TRANSPORT=tcp"
      for LB in $BINS; do
        L=${LB%%:*}
        B=${LB#*:}
        echo "== W=$W $T job $J $L" >&2
        cenv=""
        if [ "$CALL_TIMES" = 1 ]; then
          mkdir -p "$OUT/calls/$L"
          cenv="LD_PRELOAD=$ROOT/build/bench/call_times.so CALL_TIMES_OUT=$OUT/calls/$L"
        fi
        s0=$(awk '/^cpu /{print $9}' /proc/stat)
        env $tenv $ENVS $cenv "$RUN" -n "$W" --no-prefix "$B" --json --op "$OPS" \
          --sizes "$SIZES" ${ITERS:+--iters $ITERS} ${LAG_ARGS:-} 2>>"$OUT/stderr.log" \
          > "$OUT/job.tmp"
        s1=$(awk '/^cpu /{print $9}' /proc/stat)
        steal=$(( (s1 - s0) * 1000 / $(getconf CLK_TCK) ))
        sed -n 's/^{/{"build":"'"$L"'","transport":"'"$T"'","job":'"$J"',"steal_ms":'"$steal"',/p' \
          "$OUT/job.tmp" >> "$OUT/raw.jsonl"
      done
    done
  done
done
echo "steal after: $(awk '/^cpu /{print $9}' /proc/stat) ticks" >> "$OUT/env.txt"
rm -f "$OUT/job.tmp"
{
  /usr/bin/python3 "$ROOT/bench/coll/loop_lag.py" "$OUT/raw.jsonl"
  if [ "$CALL_TIMES" = 1 ]; then
    for LB in $BINS; do /usr/bin/python3 "$ROOT/bench/coll/call_times.py" "$OUT/calls/${LB%%:*}"; done
  fi
} | tee "$OUT/summary.md"
