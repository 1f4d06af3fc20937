#!/bin/bash
# GPU buffers between "hosts" without NCCL, on one GPU machine: ranks of
# one kernel told apart by UVCCL_HOST_ID (so they reach each other through
# TCP, never shared memory), every rank's buffers in GPU memory, staged
# through pinned host memory. Side by side in one run: the same job on host
# buffers (what staging can at best reach), GPU buffers staged in chunks
# (the default) and staged whole (UVCCL_STAGE_CHUNK=0). The link is the
# loopback, not a shaped one: the device machines have no network
# namespaces, so this is the least favourable case for hiding the copies.
#
#   bench/gpu/cross_host.sh [H L]      # default 2 hosts x 1 rank
# Env: OPS (allreduce,broadcast,allgather,reduce_scatter), MIN (1M),
# MAX (256M), BUDGET (0.3 s a size), BIN (build/bin), MODES (host
# gpu-chunks gpu-whole; gpu-chunks:N stages in chunks of N bytes).
set -u
cd "$(dirname "$0")/../.."
H=${1:-2}
L=${2:-1}
BIN=${BIN:-build/bin}
OPS=${OPS:-allreduce,broadcast,allgather,reduce_scatter}
n=$((H * L))
echo "# cross_host: $H hosts x $L ranks, ops $OPS, ${MIN:-1M}..${MAX:-256M}"
for mode in ${MODES:-host gpu-chunks gpu-whole}; do
  case $mode in
  host) gpu= chunk= ;;
  gpu-chunks) gpu=--gpu chunk= ;;
  gpu-chunks:*) gpu=--gpu chunk=${mode#*:} ;;
  gpu-whole) gpu=--gpu chunk=0 ;;
  *) echo "cross_host: unknown mode $mode" >&2; exit 2 ;;
  esac
  echo "## $mode"
  # RANK comes from uvccl-run; ranks RANK/L alike share a host
  env ${chunk:+UVCCL_STAGE_CHUNK=$chunk} L="$L" \
    "$BIN/uvccl-run" -n "$n" sh -c \
    'UVCCL_HOST_ID=h$((RANK / L)) exec "$@"' sh "$BIN/uvccl-bench" $gpu \
    --op "$OPS" -b "${MIN:-1M}" -e "${MAX:-256M}" -f 4 \
    --budget "${BUDGET:-0.3}" --timeout 60 2>&1 |
    grep -v "^\[[1-9]"
done
