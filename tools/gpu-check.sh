#!/bin/bash
# Everything uvccl checks and measures on a machine with an NVIDIA GPU, in
# one go, each step under its own time limit; logs into DIR (one file per
# step) and a summary on stdout. Needs `make` done (build/), and for the
# PyTorch steps a python3 with a CUDA PyTorch (the extension is built for
# it by tools/torch-ext.sh).
#
#   tools/gpu-check.sh DIR
# On a GPU machine that cannot build: tools/gpu-pack.sh where it can,
# carry .gpu/, then `. .gpu/unpack.sh && tools/gpu-check.sh DIR` there.
# Steps: the GPU tests (t/30*, t/204*), nccl_bench and stage_bench,
# uvccl-bench on GPU buffers (staged, 2 processes; NCCL, 1 process), the
# PyTorch backend's CUDA checks (t/run-torch-cuda.sh), DDP on CUDA against
# Gloo (2 ranks), and bench/torch on CUDA tensors (1 and 2 ranks).
# GPU_CHECK_TORCH=0 leaves the PyTorch steps out (and the extension's
# build); GPU_CHECK_LOOP_LAG=1 adds the loop's lag under staged GPU
# collectives beside the same job on host buffers (bench/coll/loop_lag.sh,
# W=2, both transports, 2 jobs each; logs in DIR/loop-lag-*.log, every
# job in DIR/gpu-host-* and DIR/gpu-staged-*). GPU_CHECK_LOOP_LAG_W4=1
# adds issue 30's W=4 question on 2 CPUs of this machine (taskset -c 0,1,
# host buffers, both transports, 2 jobs, the fixed-work probe beside
# uvccl's callbacks: loop_lag.c --probe; DIR/w4-pinned-*).
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: gpu-check.sh DIR}
mkdir -p "$out"
PY=${PYTHON:-python3}
step() { # name seconds command...
  local name=$1 secs=$2 t0 rc
  shift 2
  t0=$(date +%s.%N)
  # shell functions too: the command runs in a bash that has them
  timeout -k 5 "$secs" bash -c "$(declare -f ext_build loop_lag tests ddp); PY=$PY; $*" \
    >"$out/$name.log" 2>&1
  rc=$?
  printf "%-14s rc=%-3s %6.1fs\n" "$name" "$rc" "$(awk "BEGIN { print $(date +%s.%N) - $t0 }")"
}
ext_build() {
  PYTHON=$PY tools/torch-ext.sh
}
loop_lag() { # tag, then arguments of the benchmark
  local tag=$1
  shift
  WORLDS=2 JOBS=2 SIZES=64M,256M LAG_ARGS="$*" bench/coll/loop_lag.sh "$tag"
  cp -r "bench/coll/out/$tag" "$out/$tag"
}
nvidia-smi -L
torch=${GPU_CHECK_TORCH:-1}
# the extension builds while the C tests run
ext=
[ "$torch" = 1 ] && { ( step torch-ext 300 ext_build ) & ext=$!; }
tests() {
  for t in t/3001*.t t/3002-gpu-device-cuda.t t/3004*.t t/3010*.t t/204*.t; do
    echo "## $t"
    timeout -k 5 120 "./$t"
  done
}
if [ "${GPU_CHECK_TORCH_ONLY:-0}" != 1 ]; then
  step c-tests 400 tests
  step nccl-bench 120 ./build/bench/nccl_bench 2000
  step stage-bench 120 ./build/bench/stage_bench
  step bench-staged 120 build/bin/uvccl-run -n 2 build/bin/uvccl-bench --gpu --op all
  step bench-nccl 120 build/bin/uvccl-run -n 1 build/bin/uvccl-bench --backend nccl --op all
fi
if [ "${GPU_CHECK_LOOP_LAG:-0}" = 1 ]; then
  t=$(date +%m%d-%H%M)
  step loop-lag-host 150 "out=$out; loop_lag gpu-host-$t"
  step loop-lag-gpu 200 "out=$out; loop_lag gpu-staged-$t --gpu"
fi
if [ "${GPU_CHECK_LOOP_LAG_W4:-0}" = 1 ]; then
  t=$(date +%m%d-%H%M)
  step loop-lag-w4 420 "WORLDS=4 JOBS=2 SIZES=64M,256M LAG_ARGS='--probe 150' \
    taskset -c 0,1 bench/coll/loop_lag.sh w4-pinned-$t; cp -r bench/coll/out/w4-pinned-$t $out/"
fi
[ -n "$ext" ] && wait $ext
ddp() {
  local port r
  port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      DDP_DEVICE=cuda DDP_STEPS=50 PYTHONWARNINGS=ignore $PY t/py/torch_ddp.py &
  done
  wait
}
if [ "$torch" = 1 ] && [ -n "$(ls python/uvccl_torch/_C*.so 2>/dev/null)" ]; then
  step torch-cuda 300 PYTHON=$PY t/run-torch-cuda.sh
  step torch-ddp 180 ddp
  step torch-bench1 120 env BENCH_DEVICE=cuda $PY bench/torch/bench.py allreduce 1 3
  step torch-bench2 150 env BENCH_DEVICE=cuda $PY bench/torch/bench.py allreduce 2 3
  step torch-ddp1 120 env BENCH_DEVICE=cuda $PY bench/torch/bench.py ddp 1 mlp 100
  step torch-ddp2 150 env BENCH_DEVICE=cuda $PY bench/torch/bench.py ddp 2 mlp 100
fi
echo "== summary"
if [ -f "$out/c-tests.log" ]; then
  grep -h "^not ok\|^ok\|^1\.\.\|^# \|SKIP" "$out/c-tests.log" | grep -v "^ok" | head -40
  echo "c-tests: $(grep -c '^ok' "$out/c-tests.log") ok, $(grep -c '^not ok' "$out/c-tests.log") not ok"
fi
[ -f "$out/torch-cuda.log" ] && grep -h "^ok\|^not ok\|^#" "$out/torch-cuda.log"
f=torch-ddp
[ -f "$out/$f.log" ] && echo "$f: $(grep -c '^@check [0-9]* 1' "$out/$f.log") checks ok, $(grep -c '^@check [0-9]* 0' "$out/$f.log") failed" && grep -h '^@check [0-9]* 0' "$out/$f.log" | head -5
tail -5 "$out/torch-ext.log" 2>/dev/null
