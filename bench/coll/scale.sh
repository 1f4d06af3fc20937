#!/bin/bash
# bench/coll/scale.sh - what creating a large world costs: the whole job of
# one 4-byte allreduce at WORLDS ranks on this host, uvccl next to Gloo
# (python3-torch) and Open MPI, one after the other.
#
#   uvccl  build/bin/uvccl-run -n W build/bin/uvccl-bench --op allreduce
#          -b 4 -e 4 -n 1   (the issue's job: 20 warm-up allreduces, each
#          after a barrier, then the timed one; worlds above
#          UVCCL_MESH_MAX are sparse)
#   uvccl-1  the same with -w 1: creation, two allreduces, teardown
#   uvccl-mesh  the same as uvccl with UVCCL_MESH_MAX=100000: the full mesh
#          at creation (WORLDS_MESH only: it grows as W^2)
#   gloo   /usr/bin/python3 bench/coll/gloo_bench.py --world W --op
#          allreduce -b 4 -e 4 -n 1 -w 1 (WORLDS_GLOO: each rank imports
#          torch, about 200 MB)
#   mpi    mpirun --oversubscribe -np W --mca btl self,vader
#          build/bench/mpi_bench --op allreduce -b 4 -e 4 -n 1 -w 1
#          (WORLDS_MPI)
# For each: the wall time of the whole job (start to exit), the group
# creation time rank 0 reports (uvccl-bench, gloo_bench.py), and the largest
# peak RSS of one rank (GNU time's %M over the launcher: the maximum over
# the processes it waited for; shared library pages count in every rank).
#
# Usage: bench/coll/scale.sh   (prints a Markdown table)
# Environment: WORLDS="64 256 512 1024" WORLDS_MESH="64 128 256"
#   WORLDS_GLOO="16 32 64" WORLDS_MPI="64 256" TIMEOUT=600
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORLDS=${WORLDS:-"64 256 512 1024"}
WORLDS_MESH=${WORLDS_MESH:-"64 128 256"}
WORLDS_GLOO=${WORLDS_GLOO:-"16 32 64"}
WORLDS_MPI=${WORLDS_MPI:-"64 256"}
TIMEOUT=${TIMEOUT:-600}
B=$ROOT/build
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ulimit -n 65536 2>/dev/null || true

[ -x "$B/bin/uvccl-bench" ] || make -C "$ROOT" all >/dev/null
if [ ! -x "$B/bench/mpi_bench" ] && command -v mpicc >/dev/null; then
  mkdir -p "$B/bench"
  mpicc -O2 -o "$B/bench/mpi_bench" "$ROOT/bench/coll/mpi_bench.c" -lm
fi

# run NAME W INIT_REGEX cmd...: one row
run() {
  local name=$1 w=$2 re=$3
  shift 3
  local t0 t1 rc init rss
  t0=$(date +%s.%N)
  /usr/bin/time -f "@rss %M" -o "$TMP/time" timeout "$TIMEOUT" "$@" \
    >"$TMP/out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  init=$(grep -oE "$re" "$TMP/out" | head -1 | grep -oE '[0-9]+\.[0-9]+' |
         head -1)
  rss=$(grep -oE '@rss [0-9]+' "$TMP/time" | awk '{printf "%.1f", $2/1024}')
  if [ $rc -ne 0 ] || ! grep -q " yes" "$TMP/out"; then
    echo "| $name | $w | failed (exit $rc) | | | $(grep -m1 -iE 'error|failed' "$TMP/out" | cut -c1-80) |"
    return
  fi
  printf "| %s | %s | %.2f | %s | %s | |\n" "$name" "$w" \
    "$(awk "BEGIN { print $t1 - $t0 }")" "${init:--}" "${rss:--}"
}

echo "| job | ranks | whole job (s) | creation on rank 0 (ms) | largest rank peak RSS (MiB) | note |"
echo "|---|---|---|---|---|---|"
for w in $WORLDS; do
  run uvccl "$w" 'group init \(env://\): [0-9.]+' \
    "$B/bin/uvccl-run" -n "$w" "$B/bin/uvccl-bench" --op allreduce -b 4 -e 4 -n 1
  run uvccl-1 "$w" 'group init \(env://\): [0-9.]+' \
    "$B/bin/uvccl-run" -n "$w" "$B/bin/uvccl-bench" --op allreduce -b 4 -e 4 -n 1 -w 1
done
for w in $WORLDS_MESH; do
  UVCCL_MESH_MAX=100000 run uvccl-mesh "$w" 'group init \(env://\): [0-9.]+' \
    "$B/bin/uvccl-run" -n "$w" "$B/bin/uvccl-bench" --op allreduce -b 4 -e 4 -n 1
done
for w in $WORLDS_GLOO; do
  run gloo "$w" 'init [0-9.]+ ms' /usr/bin/python3 "$ROOT/bench/coll/gloo_bench.py" \
    --world "$w" --op allreduce -b 4 -e 4 -n 1 -w 1
done
if [ -x "$B/bench/mpi_bench" ]; then
  for w in $WORLDS_MPI; do
    run mpi-vader "$w" 'NONE' mpirun --oversubscribe --bind-to none \
      --mca pml ob1 --mca btl self,vader --mca oob_tcp_if_include lo \
      -np "$w" "$B/bench/mpi_bench" --op allreduce -b 4 -e 4 -n 1 -w 1
  done
fi
