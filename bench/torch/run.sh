#!/bin/sh
# uvccl vs Gloo through PyTorch (Debian's python3-torch 1.13), side by side
# in one job per row: allreduce latency and bus bandwidth at world sizes 2
# and 4, then DDP step time and samples/s for a small MLP (latency-bound)
# a 25 M-parameter MLP at batch 8 and 1 (compute-bound on few cores), and
# a 25.6 M-parameter model that is allreduce-bound (a dense-gradient
# embedding table and a small head, "emb"), and an FSDP2 step (2.14).
# Prints markdown tables (the ones in bench/RESULTS.md). Needs `make` (the
# extension) first. World size
# 1 measures what a call costs with no network at all: the hand-off to the
# backend's thread and back.
#
#   bench/torch/run.sh [ROUNDS [BIG_STEPS]]    # 5 rounds, 20 steps
#   TORCH_ROOT=/opt/uvccl-torch/sid bench/torch/run.sh
#       the same with the PyTorch of a root of tools/torch-root.sh, against
#       the extension t/run-torch2-backend.sh built there (ROOT/uvccl-src:
#       `prove t/5003-torch2-backend.t` makes it)
set -e
cd "$(dirname "$0")/../.."
rounds=${1:-5}
big=${2:-20}
py() {
  if [ -n "${TORCH_ROOT:-}" ]; then
    # Debian builds PyTorch without libuv: its TCPStore needs USE_LIBUV=0
    chroot "$TORCH_ROOT" /usr/bin/env USE_LIBUV=0 /bin/sh -c \
      'cd /uvccl-src && exec python3 "$@"' sh "$@"
  else
    /usr/bin/python3 "$@"
  fi
}
for w in 1 2 4; do
  py bench/torch/bench.py allreduce $w "$rounds"
  echo
done
echo "DDP, mean step time after 5 warm-up steps, and samples/s (all ranks)"
echo
echo "| model | world | steps | Gloo step | uvccl step | uvccl vs Gloo | Gloo samples/s | uvccl samples/s |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for w in 2 4; do
  py bench/torch/bench.py ddp $w mlp 100
  py bench/torch/bench.py ddp $w big "$big"
  py bench/torch/bench.py ddp $w big "$big" 1
  py bench/torch/bench.py ddp $w emb 30          # allreduce-bound
done
# FSDP2 (fully_shard on a CPU mesh over each backend's group): PyTorch
# whose FSDP2 runs on CPU (2.14; 2.6's calls record_event on a CPU stream)
for w in 2 4; do
  py bench/torch/bench.py fsdp2 $w 20 2>/dev/null ||
    echo "| fsdp2 MLP 8x1024 | $w | - | FSDP2 does not run on CPU in this PyTorch | | | | |"
done
