#!/bin/sh
# make demo: real multi-rank worlds on this host.
#  1. the collectives: uvccl-run starts 4 ranks; each creates its group
#     from env:// (rank 0 hosts the store server itself), then uvccl-bench
#     runs every collective over a size sweep, checks every result and
#     prints nccl-tests-style timings;
#  2. the store: worker processes rendezvous through an embedded TCPStore
#     server and put a short load on it.
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
echo "== uvccl-demo: the store, 4 worker processes"
"$BUILD/bin/uvccl-demo" -n 4 --ops 3000
echo
echo "== uvccl-demo: the store, 32 worker processes"
"$BUILD/bin/uvccl-demo" -n 32 --ops 600
