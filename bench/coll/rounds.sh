#!/bin/bash
# bench/coll/rounds.sh - uvccl (busy-poll) against Open MPI's shared memory
# (btl vader), interleaved round by round, and optionally an older uvccl
# build in the same rounds: one job per tool per round, so that both sides
# see the same minutes of a noisy machine. Prints each cell's busbw in
# every round and the ratio of the medians.
#
# Usage: bench/coll/rounds.sh W ROUNDS [OLD_UVCCL_BENCH] > raw.txt
#        bench/coll/rounds.py raw.txt           (the Markdown table)
# Environment: ROUNDS_ARGS (default: the four ops at 1 MiB and 16 MiB,
# --budget 0.3), MPI_BENCH (default build/bench/mpi_bench, built here
# with mpicc when missing).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
W=${1:?world size}
N=${2:?rounds}
OLD=${3:-}
ARGS=${ROUNDS_ARGS:-"--op allreduce,allgather,reduce_scatter,broadcast -b 1M -e 16M -f 16 --budget 0.3"}
MPI_BENCH=${MPI_BENCH:-build/bench/mpi_bench}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s >/dev/null || exit 1
if [ ! -x "$MPI_BENCH" ]; then
  mkdir -p "$(dirname "$MPI_BENCH")"
  mpicc -O2 -o "$MPI_BENCH" bench/coll/mpi_bench.c -lm || exit 1
fi
OVER=""
[ "$W" -gt "$(nproc)" ] && OVER=--oversubscribe
uvccl() { # label bench
  build/bin/uvccl-run -n "$W" "$2" $ARGS --busy-poll 2>/dev/null |
    awk -v t="$1" -v r="$i" '/^\[0\] [a-z]/ && $4 ~ /^[0-9]+$/ {print t, r, $2, $4, $9}'
}
for i in $(seq "$N"); do
  [ -n "$OLD" ] && uvccl old "$OLD"
  uvccl uvccl build/bin/uvccl-bench
  mpirun -n "$W" $OVER --mca btl self,vader "$MPI_BENCH" $ARGS 2>/dev/null |
    awk -v r="$i" -v w="$W" '$2 == w && $3 ~ /^[0-9]+$/ {print "vader", r, $1, $3, $8}'
done
