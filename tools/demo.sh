#!/bin/sh
# make demo: real multi-rank worlds on this host.
#  1. the collectives: uvccl-run starts 4 ranks; each creates its group
#     from env:// (rank 0 hosts the store server itself), then uvccl-bench
#     runs every collective over a size sweep, checks every result and
#     prints nccl-tests-style timings;
#  2. a rank dies: uvccl-run SIGKILLs rank 2 of 4 mid-run; the survivors
#     name it, shrink to a group of 3 and finish the sweep, results checked;
#  3. a hang: rank 2 of 4 stalls before a collective; the others time out
#     naming whom they wait for, every rank dumps its flight recorder
#     (asked through the store) and uvccl-trace names rank 2;
#  4. the store: worker processes rendezvous through an embedded TCPStore
#     server and put a short load on it;
#  5. the GPU, where there is one: 2 ranks sharing it through a TCP group
#     (buffers staged through pinned memory) and a 1-rank NCCL group;
#     elsewhere the reason there is none.
set -e
BUILD=${1:-build}
echo "== uvccl-run -n 4 uvccl-bench: every collective, 4 ranks, 4 B .. 4 MiB"
"$BUILD/bin/uvccl-run" -n 4 "$BUILD/bin/uvccl-bench" --op all -b 4 -e 4M -f 16 \
  --budget 0.2
echo
echo "== uvccl-run -n 2 uvccl-bench: allreduce, 2 ranks, 4 B .. 64 MiB"
"$BUILD/bin/uvccl-run" -n 2 "$BUILD/bin/uvccl-bench" --op allreduce -b 4 -e 64M -f 16 \
  --budget 0.2
echo
echo "== a rank dies: uvccl-run -n 4 --kill 2@0.3 uvccl-bench --shrink-on-failure"
"$BUILD/bin/uvccl-run" -n 4 --kill 2@0.3 "$BUILD/bin/uvccl-bench" \
  --op allreduce,allgather -b 4 -e 4M -f 16 --budget 0.1 --shrink-on-failure
echo
echo "== a hang: rank 2 stalls 6 s before its 40th operation; timeout 2 s; UVCCL_TRACE_DIR set"
TRACE_DIR=$(mktemp -d)
UVCCL_TRACE_DIR=$TRACE_DIR UVCCL_TRACE_POLL_MS=500 "$BUILD/bin/uvccl-run" -n 4 \
  --keep-going "$BUILD/bin/uvccl-bench" --op allreduce -b 4 -e 64 -f 4 \
  --budget 0.05 --stall 2@40:6 --timeout 2 || true
echo
echo "== uvccl-trace $TRACE_DIR ($(ls "$TRACE_DIR" | wc -l) dumps)"
"$BUILD/bin/uvccl-trace" "$TRACE_DIR" || true
rm -rf "$TRACE_DIR"
echo
echo "== uvccl-demo: the store, 4 worker processes"
"$BUILD/bin/uvccl-demo" -n 4 --ops 3000
echo
echo "== uvccl-demo: the store, 32 worker processes"
"$BUILD/bin/uvccl-demo" -n 32 --ops 600
echo
echo "== GPU"
if out=$("$BUILD/bin/uvccl-run" -n 2 "$BUILD/bin/uvccl-bench" --gpu \
    --op allreduce,allgather,broadcast -b 4K -e 64M -f 16 --budget 0.2 2>&1); then
  echo "$out"
  "$BUILD/bin/uvccl-run" -n 1 "$BUILD/bin/uvccl-bench" --backend nccl \
    --op allreduce,allgather,broadcast -b 4K -e 64M -f 16 --budget 0.2
else
  echo "skipped: $(echo "$out" | grep -m1 -o 'no CUDA.*\|--gpu: .*' || echo "$out" | tail -1)"
fi
