#!/bin/bash
# bench/coll/loop_lag.sh - how responsive a server's loop stays while large
# collectives run on it (bench/coll/loop_lag.c), over both transports and
# world sizes, several jobs each (a slow mode may show in some jobs only).
#
# Usage: bench/coll/loop_lag.sh [TAG]
# Environment (defaults):
#   WORLDS="2 4"  TRANSPORTS="shm tcp"  JOBS=3
#   OPS=all  SIZES=16M,64M,256M  ITERS= (the benchmark's default)
#   BIN=build/bench/uvccl-loop-lag  (another build's, to compare)
#   ENVS= extra variables for the ranks ("UVCCL_TURN_BYTES=262144 ...")
# Output: one JSON line per cell and job in bench/coll/out/TAG/raw.jsonl,
# and the summary (bench/coll/loop_lag.py: the worst job of each cell),
# also printed.
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
BIN=${BIN:-$ROOT/build/bench/uvccl-loop-lag}
ENVS=${ENVS:-}
RUN=$ROOT/build/bin/uvccl-run

[ -x "$BIN" ] && [ -x "$RUN" ] || make -C "$ROOT" >/dev/null
mkdir -p "$OUT"
: > "$OUT/raw.jsonl"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "bin: $BIN"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+changes')"
  echo "env: $ENVS"
  echo "steal before: $(awk '/^cpu /{print $9}' /proc/stat) ticks"
} > "$OUT/env.txt"
for W in $WORLDS; do
  for T in $TRANSPORTS; do
    for J in $(seq 1 "$JOBS"); do
      tenv=""
      [ "$T" = tcp ] && tenv="UVCCL_TRANSPORT=tcp"
      echo "== W=$W $T job $J" >&2
      env $tenv $ENVS "$RUN" -n "$W" --no-prefix "$BIN" --json --op "$OPS" \
        --sizes "$SIZES" ${ITERS:+--iters $ITERS} 2>>"$OUT/stderr.log" |
        sed -n 's/^{/{"transport":"'"$T"'","job":'"$J"',/p' >> "$OUT/raw.jsonl"
    done
  done
done
echo "steal after: $(awk '/^cpu /{print $9}' /proc/stat) ticks" >> "$OUT/env.txt"
/usr/bin/python3 "$ROOT/bench/coll/loop_lag.py" "$OUT/raw.jsonl" | tee "$OUT/summary.md"
