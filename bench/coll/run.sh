#!/bin/bash
# bench/coll/run.sh - uvccl's CPU collectives side by side with Gloo and
# Open MPI, on one machine, over loopback only.
#
# For each W in WORLDS (default "2 4"), one after the other (never two at
# once: the machine may have 2 cores, and W=4 already oversubscribes them):
#   uvccl     build/bin/uvccl-run -n W build/bin/uvccl-bench --json ...
#   uvccl-bp  the same with --busy-poll=BUSY_POLL_US (default 50)
#   uvccl-cma, uvccl-cma-bp  uvccl and uvccl-bp with UVCCL_SHM_CMA=1:
#             frames of 256 KiB or more read by the receiver straight from
#             the sender's memory (process_vm_readv), single copy
#   uvccl-ip  allreduce only, in place (--inplace): c10d's all_reduce, so
#             the like-for-like of Gloo's (PyTorch's is in place only)
#   uvccl-tcp, uvccl-tcp-bp  uvccl and uvccl-bp with UVCCL_TRANSPORT=tcp:
#             loopback TCP only, as between hosts (ranks of one host
#             otherwise talk through shared memory, src/cpu/xport/shm.c)
#   gloo      /usr/bin/python3 bench/coll/gloo_bench.py --world W (PyTorch
#             1.13's Gloo, TCPStore rendezvous, GLOO_SOCKET_IFNAME=lo)
#   mpi-tcp   Open MPI, pml ob1, btl self,tcp on lo: a socket peer
#   mpi-shm   Open MPI, pml ob1, btl self,vader: shared memory, the
#             same-host reference (not a socket baseline)
# every one with the same method (see tools/uvccl-bench.c): float32 SUM,
# nccl-tests sizes and busbw, barrier before every timed iteration, per
# iteration the MAX over ranks, median and min, budget BUDGET s per size.
#
# Usage: bench/coll/run.sh [TAG]
# Output: raw JSON lines in bench/coll/out/TAG/IMPL-WN.json (stderr and
# the tables in IMPL-WN.log), the run log in run.log, machine and software
# in env.txt, and the Markdown summary (bench/coll/summarize.py) in
# summary.md, also printed.
# Environment (defaults):
#   WORLDS="2 4"  OPS=allreduce,broadcast,allgather,reduce_scatter,alltoall,barrier
#   SIZES_MIN=4  SIZES_MAX=64M  BUDGET=0.5  BUSY_POLL_US=50
#   IMPLS="uvccl uvccl-bp uvccl-ip gloo mpi-tcp mpi-shm"  RUN_TIMEOUT=1200 (s per run)
#   QUIET_MAX=0.3 QUIET_WAIT=10: before each run, wait up to QUIET_WAIT s
#   for a 0.3 s sample with at most QUIET_MAX CPUs busy (others' builds
#   distort a 2-core measurement; the wait and load are logged).
# Installs what it needs if missing (openmpi-bin, libopenmpi-dev,
# python3-torch; as root, or through sudo), builds uvccl (make) and
# build/bench/mpi_bench (mpicc).
# The whole script is one function, parsed before it runs.
main() {
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/coll
TAG=${1:-${TAG:-$(date +%Y%m%d-%H%M%S)}}
OUT=$HERE/out/$TAG
WORLDS=${WORLDS:-"2 4"}
OPS=${OPS:-allreduce,broadcast,allgather,reduce_scatter,alltoall,barrier}
SIZES_MIN=${SIZES_MIN:-4}
SIZES_MAX=${SIZES_MAX:-64M}
BUDGET=${BUDGET:-0.5}
BUSY_POLL_US=${BUSY_POLL_US:-50}
IMPLS=${IMPLS:-"uvccl uvccl-bp uvccl-ip gloo mpi-tcp mpi-shm"}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-10}
PY=/usr/bin/python3   # the interpreter that sees Debian's python3-torch
HZ=$(getconf CLK_TCK)

mkdir -p "$OUT" "$OUT/bin" "$ROOT/build/bench"
LOG=$OUT/run.log
: > "$LOG"
log() { echo "$*" | tee -a "$LOG" >&2; }

# ------------------------------------------------------------------ deps
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
apt_install() {
  log "# installing: $*"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >> "$LOG" 2>&1 ||
    { $SUDO apt-get update -qq >> "$LOG" 2>&1 &&
      $SUDO apt-get install -y -qq --no-install-recommends "$@" >> "$LOG" 2>&1; } ||
    { log "error: apt-get install $* failed (see $LOG)"; exit 1; }
}
need=()
command -v mpicc > /dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun > /dev/null 2>&1 || need+=(openmpi-bin)
$PY -c 'import torch.distributed' > /dev/null 2>&1 || need+=(python3-torch)
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"

# ----------------------------------------------------------------- build
log "# bench/coll/run.sh, tag $TAG, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
case " $IMPLS " in *" uvccl"*) WANT_UVCCL=1 ;; *) WANT_UVCCL=0 ;; esac
if [ "$WANT_UVCCL" = 1 ]; then
  # (another `make` may be running in the same tree: retry once)
  (cd "$ROOT" && make >> "$LOG" 2>&1) || { sleep 10; (cd "$ROOT" && make >> "$LOG" 2>&1); } ||
    { log "error: make failed (see $LOG)"; exit 1; }
  # Private copies: a `make` elsewhere must not swap a binary mid-run.
  for b in uvccl-bench uvccl-run; do
    cp "$ROOT/build/bin/$b" "$OUT/bin/$b.tmp" && mv "$OUT/bin/$b.tmp" "$OUT/bin/$b" ||
      { log "error: cannot copy build/bin/$b"; exit 1; }
  done
fi
mpicc -O2 -Wall -o "$ROOT/build/bench/mpi_bench" "$HERE/mpi_bench.c" >> "$LOG" 2>&1 ||
  { log "error: cannot build mpi_bench (see $LOG)"; exit 1; }
cp "$ROOT/build/bench/mpi_bench" "$OUT/bin/mpi_bench"

if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
MPIRUN=(mpirun --oversubscribe --bind-to none --mca pml ob1 --mca oob_tcp_if_include lo)

GIT_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)
GIT_DIRTY=$(cd "$ROOT" && git status --porcelain -- src include tools Makefile 2>/dev/null | wc -l)
{
  echo "tag: $TAG"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "uvccl: git $GIT_REV ($GIT_DIRTY files modified in src/ include/ tools/ Makefile); $("$OUT/bin/uvccl-bench" --version 2>/dev/null)"
  echo "machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), kernel $(uname -r)"
  echo "torch: $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null) ($(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null))"
  echo "openmpi: $(mpirun --version 2>/dev/null | head -n 1)"
  echo "compiler: $(cc --version | head -n 1)"
  echo "settings: WORLDS=$WORLDS OPS=$OPS SIZES=$SIZES_MIN..$SIZES_MAX (x4) BUDGET=$BUDGET BUSY_POLL_US=$BUSY_POLL_US IMPLS=$IMPLS"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
sed 's/^/# /' "$OUT/env.txt" | tee -a "$LOG" >&2

# ------------------------------------------------------ quiet machine
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
now_s() { date +%s.%N; }
wait_quiet() {
  local t0 a b
  t0=$(now_s)
  while :; do
    a=$(machine_busy); sleep 0.3; b=$(machine_busy)
    BUSY_BEFORE=$(awk -v d="$((b - a))" -v hz="$HZ" 'BEGIN{printf "%.2f", d/hz/0.3}')
    QUIET_WAITED=$(awk -v a="$t0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}')
    awk -v x="$BUSY_BEFORE" -v m="$QUIET_MAX" -v w="$QUIET_WAITED" -v mw="$QUIET_WAIT" \
      'BEGIN{exit !(x <= m || w >= mw)}' && return 0
  done
}

# ------------------------------------------------------------ one run
# bench_one IMPL W: runs one implementation at world size W; JSON lines
# to IMPL-WW.json, everything else to IMPL-WW.log.
FAILED=()
bench_one() {
  local impl=$1 w=$2 json=$OUT/$1-W$2.json errf=$OUT/$1-W$2.log rc t0 t1 m0 m1
  local args=(--op "$OPS" -b "$SIZES_MIN" -e "$SIZES_MAX" --budget "$BUDGET" --json)
  local cmd=()
  case $impl in
    uvccl)    cmd=(env -u UVCCL_BUSY_POLL_US "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}") ;;
    uvccl-bp) cmd=(env -u UVCCL_BUSY_POLL_US "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}" "--busy-poll=$BUSY_POLL_US") ;;
    uvccl-cma)    cmd=(env -u UVCCL_BUSY_POLL_US UVCCL_SHM_CMA=1 "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}") ;;
    uvccl-cma-bp) cmd=(env -u UVCCL_BUSY_POLL_US UVCCL_SHM_CMA=1 "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}" "--busy-poll=$BUSY_POLL_US") ;;
    uvccl-tcp)    cmd=(env -u UVCCL_BUSY_POLL_US UVCCL_TRANSPORT=tcp "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}") ;;
    uvccl-tcp-bp) cmd=(env -u UVCCL_BUSY_POLL_US UVCCL_TRANSPORT=tcp "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench" "${args[@]}" "--busy-poll=$BUSY_POLL_US") ;;
    uvccl-ip)
      case ",$OPS," in *,allreduce,*) ;; *) return ;; esac
      cmd=(env -u UVCCL_BUSY_POLL_US "$OUT/bin/uvccl-run" -n "$w" "$OUT/bin/uvccl-bench"
           --op allreduce -b "$SIZES_MIN" -e "$SIZES_MAX" --budget "$BUDGET" --json --inplace) ;;
    gloo)     cmd=($PY "$HERE/gloo_bench.py" --world "$w" "${args[@]}") ;;
    mpi-tcp)  cmd=("${MPIRUN[@]}" -np "$w" --mca btl self,tcp --mca btl_tcp_if_include lo
                   "$OUT/bin/mpi_bench" "${args[@]}" --label mpi-tcp) ;;
    mpi-shm)  cmd=("${MPIRUN[@]}" -np "$w" --mca btl self,vader
                   "$OUT/bin/mpi_bench" "${args[@]}" --label mpi-shm) ;;
    *) log "error: unknown impl $impl"; return ;;
  esac
  wait_quiet
  log "## $impl W=$w (waited ${QUIET_WAITED}s for a quiet machine, ${BUSY_BEFORE} CPUs busy before): ${cmd[*]}"
  echo "# ${cmd[*]}" > "$errf"
  m0=$(machine_busy); t0=$(now_s)
  # uvccl-run prefixes each line with "[RANK] ": keep rank 0's JSON lines.
  timeout "$RUN_TIMEOUT" "${cmd[@]}" 2>> "$errf" |
    sed -u -E 's/^\[[0-9]+\] //' | tee -a "$errf" | grep --line-buffered '^{' > "$json"
  rc=${PIPESTATUS[0]}
  m1=$(machine_busy); t1=$(now_s)
  log "   rc=$rc, $(wc -l < "$json") rows, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s, $(awk -v d="$((m1 - m0))" -v hz="$HZ" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", d/hz/(b-a)}') CPUs busy on average"
  if [ "$rc" != 0 ]; then
    FAILED+=("$impl-W$w(rc=$rc)")
    tail -n 5 "$errf" | sed 's/^/   | /' | tee -a "$LOG" >&2
  fi
}

for w in $WORLDS; do
  for impl in $IMPLS; do
    bench_one "$impl" "$w"
  done
done

# ------------------------------------------------------------ summary
log "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ ${#FAILED[@]} -eq 0 ] || log "# FAILED runs: ${FAILED[*]}"
$PY "$HERE/summarize.py" "$OUT" | tee "$OUT/summary.md"
log "# raw results and summary.md in $OUT"
[ ${#FAILED[@]} -eq 0 ]
}

main "$@"
