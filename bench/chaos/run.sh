#!/bin/bash
# bench/chaos/run.sh - failures injected into running collectives: uvccl
# side by side with Gloo (python3-torch 1.13) and Open MPI 4.1 (TCP), on
# one machine. See bench/chaos/chaos.py for what a trial is.
#
# Usage: bench/chaos/run.sh [TAG]
# Environment (defaults): TRIALS=10 WORLD=4 KINDS="kill stop partition"
#   IMPLS="uvccl gloo mpi" TIMEOUT=20 (operation timeout, all three)
#   HEARTBEAT=3 (uvccl's heartbeat timeout; its default is 15 s)
#   DEADLINE=40 (a survivor still running this long after the failure
#   hangs). partition needs root and iproute2 (network namespaces).
# Output: bench/chaos/out/TAG/IMPL-KIND.json (one line per trial) and
# summary.md (bench/chaos/summarize.py), also printed.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TAG=${1:-$(date +%Y%m%d-%H%M%S)}
OUT=$ROOT/bench/chaos/out/$TAG
TRIALS=${TRIALS:-10}
WORLD=${WORLD:-4}
KINDS=${KINDS:-"kill stop partition"}
IMPLS=${IMPLS:-"uvccl gloo mpi"}
TIMEOUT=${TIMEOUT:-20}
HEARTBEAT=${HEARTBEAT:-3}
DEADLINE=${DEADLINE:-40}
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
need=()
command -v mpicc > /dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun > /dev/null 2>&1 || need+=(openmpi-bin)
/usr/bin/python3 -c 'import torch.distributed' > /dev/null 2>&1 || need+=(python3-torch)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null; }
fi
mkdir -p "$OUT"
(cd "$ROOT" && make > "$OUT/make.log" 2>&1) || { echo "make failed: $OUT/make.log"; exit 1; }
mpicc -O2 -o "$ROOT/build/bench/mpi_chaos" "$ROOT/bench/chaos/mpi_chaos.c" || exit 1
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "git: $(cd "$ROOT" && git rev-parse --short HEAD)"
  echo "cpus: $(nproc), kernel $(uname -r)"
  echo "torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
  echo "mpi: $(mpirun --version 2>/dev/null | head -1)"
  echo "trials=$TRIALS world=$WORLD timeout=$TIMEOUT heartbeat=$HEARTBEAT deadline=$DEADLINE"
} > "$OUT/env.txt"
for kind in $KINDS; do
  for impl in $IMPLS; do
    echo "# $impl $kind ($TRIALS trials)" >&2
    /usr/bin/python3 "$ROOT/bench/chaos/chaos.py" --impl "$impl" --kind "$kind" \
      --trials "$TRIALS" --world "$WORLD" --timeout "$TIMEOUT" \
      --heartbeat "$HEARTBEAT" --deadline "$DEADLINE" \
      --json "$OUT/$impl-$kind.json" > /dev/null
  done
done
/usr/bin/python3 "$ROOT/bench/chaos/summarize.py" "$OUT" | tee "$OUT/summary.md"
cat "$OUT/env.txt"
