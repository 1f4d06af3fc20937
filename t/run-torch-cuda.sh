#!/usr/bin/env bash
# The uvccl backend on CUDA tensors (t/py/torch_cuda.py): every operation
# on CUDA tensors against the same on CPU tensors, the transport the ranks
# agree on, stream ordering, async work; at 1 rank on NCCL (a GPU of its
# own), 2 and 3 ranks sharing GPU 0 (staged), 1 rank staged on request, 2
# ranks on NCCL where there are 2 GPUs. Prints TAP. Needs a python3 whose
# PyTorch has CUDA and sees a GPU, and the extension built for it
# (tools/torch-ext.sh); exits 2 without them.
#
#   PYTHON=python3 t/run-torch-cuda.sh
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "run-torch-cuda: $PY has no PyTorch with a usable GPU" >&2
  exit 2
fi
if ! PYTHONPATH=python $PY -c 'import sys, uvccl_torch; sys.exit(0 if uvccl_torch._C.cuda else 1)' 2>/dev/null; then
  echo "run-torch-cuda: no extension with CUDA for $PY (tools/torch-ext.sh)" >&2
  exit 2
fi
port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
echo "1..5"
n_test=0
verdict() { # out want what
  local out=$1 want=$2 what=$3 got fails
  n_test=$((n_test + 1))
  got=$(cat "$out"/* | grep -c '^@check [0-9]* 1 ')
  fails=$(cat "$out"/* | grep -c '^@check [0-9]* 0 ')
  if [ "$fails" = 0 ] && [ "$got" -ge "$want" ]; then
    echo "ok $n_test - $what: $got checks passed"
  else
    echo "not ok $n_test - $what: $got passed, $fails failed (of $want)"
    grep -h '^@check [0-9]* 0 \|Error' "$out"/* | head -20 | sed 's/^/#   /'
  fi
  grep -h '^@check 0 1 ops ' "$out"/* | sed 's/^@check 0 1 ops | /# /'
}
world() { # n mode want [env...]
  local n=$1 mode=$2 want=$3 p r out
  shift 3
  p=$(port)
  out=$(mktemp -d)
  for r in $(seq 0 $((n - 1))); do
    env "$@" RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      T_MODE=$mode PYTHONWARNINGS=ignore timeout 180 $PY t/py/torch_cuda.py \
      >"$out/$r" 2>&1 &
  done
  wait
  verdict "$out" "$want" "CUDA tensors, $n rank(s), $mode${*:+ ($*)}"
  rm -rf "$out"
}
ngpu=$($PY -c 'import torch; print(torch.cuda.device_count())')
# one rank per GPU where there are enough and NCCL is there: NCCL; two
# ranks on one GPU: staged
one=staged
$PY -c 'import sys, torch.distributed as d; sys.exit(0 if d.is_nccl_available() else 1)' 2>/dev/null && one=nccl
world 1 $one 6
world 2 staged 12 CUDA_VISIBLE_DEVICES=0
world 3 staged 18 CUDA_VISIBLE_DEVICES=0
world 1 staged 6 UVCCL_TORCH_CUDA=staged
if [ "$ngpu" -ge 2 ] && [ "$one" = nccl ]; then
  world 2 nccl 12
else
  n_test=$((n_test + 1))
  echo "ok $n_test # SKIP 2 ranks on NCCL: one GPU (NCCL refuses two ranks on one) or no NCCL"
fi
