#!/bin/sh
# uvccl vs Gloo through PyTorch (Debian's python3-torch 1.13), side by side
# in one job per row: allreduce latency and bus bandwidth at world sizes 2
# and 4, then DDP step time and samples/s for a small MLP (latency-bound)
# a 25 M-parameter MLP at batch 8 and 1 (compute-bound on few cores), and
# a 25.6 M-parameter model that is allreduce-bound (a dense-gradient
# embedding table and a small head, "emb"). Prints markdown tables (the
# ones in bench/RESULTS.md). Needs `make` (the extension) first.
#
#   bench/torch/run.sh [ROUNDS [BIG_STEPS]]    # 5 rounds, 20 steps
set -e
cd "$(dirname "$0")/../.."
rounds=${1:-5}
big=${2:-20}
py=/usr/bin/python3
for w in 2 4; do
  $py bench/torch/bench.py allreduce $w "$rounds"
  echo
done
echo "DDP, mean step time after 5 warm-up steps, and samples/s (all ranks)"
echo
echo "| model | world | steps | Gloo step | uvccl step | uvccl vs Gloo | Gloo samples/s | uvccl samples/s |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for w in 2 4; do
  $py bench/torch/bench.py ddp $w mlp 100
  $py bench/torch/bench.py ddp $w big "$big"
  $py bench/torch/bench.py ddp $w big "$big" 1
  $py bench/torch/bench.py ddp $w emb 30          # allreduce-bound
done
