#!/bin/bash
# bench/coll/ab.sh - two uvccl builds side by side, interleaved job by job
# (one job of each per round, so both see the same minutes of a noisy
# machine): busbw of each cell in every round, and the ratio of the
# medians (B / A).
#
# Usage: bench/coll/ab.sh W ROUNDS A_UVCCL_BENCH B_UVCCL_BENCH > raw.txt
#        bench/coll/ab.py raw.txt                  (the Markdown table)
# Environment: AB_ARGS (default: allreduce, broadcast, allgather and
# reduce_scatter at 1, 16 and 64 MiB, --budget 0.3), AB_ENV (variables for
# the ranks of both, e.g. UVCCL_TRANSPORT=tcp).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
W=${1:?world size}
N=${2:?rounds}
A=${3:?a uvccl-bench}
B=${4:?another uvccl-bench}
ARGS=${AB_ARGS:-"--op allreduce,broadcast,allgather,reduce_scatter -b 1M -e 64M -f 4 --budget 0.3"}
AB_ENV=${AB_ENV:-}
job() { # label bench
  env $AB_ENV build/bin/uvccl-run -n "$W" "$2" $ARGS 2>/dev/null |
    awk -v t="$1" -v r="$i" '/^\[0\] [a-z]/ && $4 ~ /^[0-9]+$/ {print t, r, $2, $4, $9}'
}
for i in $(seq "$N"); do
  job A "$A"
  job B "$B"
done
