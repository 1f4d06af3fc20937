#!/usr/bin/env bash
# The uvccl backend on PyTorch 2.x (c10d's Backend API): in a Debian root
# that tools/torch-root.sh made with TORCH_ROOT_DEV=1 (libtorch-dev and a
# compiler inside), copies this source tree in (ROOT/uvccl-src), builds
# libuvccl and the extension there with the root's compiler against its
# libtorch, then runs t/py/torch_backend.py (every operation against Gloo
# in the same job, errors, a timeout, a killed peer, split_group) at 2, 3
# and 4 ranks, shrink_group at 4, reconfigure at 4, the elastic DDP
# example (examples/torch/elastic_ddp.py) under uvccl-run --respawn.
# Prints TAP; exits 2 when the root cannot build the extension.
#
#   t/run-torch2-backend.sh /opt/uvccl-torch/trixie
set -u
cd "$(dirname "$0")/.."
root=${1:?usage: run-torch2-backend.sh ROOT}
hdr=$root/usr/include/torch/csrc/distributed/c10d/Backend.hpp
if [ ! -f "$hdr" ] || [ ! -x "$root/usr/bin/g++" ]; then
  echo "run-torch2-backend: $root has no libtorch-dev or g++" \
    "(TORCH_ROOT_DEV=1 tools/torch-root.sh create)" >&2
  exit 2
fi
if [ ! -f "$root/usr/include/openssl/hmac.h" ]; then
  echo "run-torch2-backend: $root has no libssl-dev, which libuvccl needs" \
    "now (chroot $root apt-get install libssl-dev, or make the root again)" >&2
  exit 2
fi
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
# The root builds its own way: not with the flags of a make that runs this
# (make check SANITIZE=1 would ask for a sanitizer build, which has no
# extension)
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES SANITIZE
src=$root/uvccl-src
rm -rf "$src.new"
mkdir -p "$src.new"
# the tracked files as they are now in the work tree, not as committed
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -z | xargs -0 cp --parents -t "$src.new" 2>/dev/null
else
  tar --exclude=./build --exclude='./build-*' -cf - . | tar -C "$src.new" -xf -
fi
rm -rf "$src"
mv "$src.new" "$src"
if ! chroot "$root" /bin/sh -c 'cd /uvccl-src && make -o deps -j2 build/libuvccl.a build/bin/uvccl-run >/tmp/uvccl-build.log 2>&1 && make -o deps torch-ext >>/tmp/uvccl-build.log 2>&1'; then
  tail -20 "$root/tmp/uvccl-build.log" >&2
  echo "run-torch2-backend: building in $root failed" >&2
  exit 2
fi
version=$(chroot "$root" python3 -c 'import torch; print(torch.__version__)')
echo "1..15"
n_test=0
world() { # n scenario
  local n=$1 scen=$2 port r out fails want got
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp -d)
  # tcpinit: each rank in a UTS namespace of its own, named so that the
  # name does not resolve
  local wrap=""
  [ "$scen" = tcpinit ] && wrap="unshare --uts"
  for r in $(seq 0 $((n - 1))); do
    ( $wrap chroot "$root" /usr/bin/env USE_LIBUV=0 RANK=$r WORLD_SIZE=$n \
      T_HOSTNAME=uvccl-nowhere-$$-$r \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONWARNINGS=ignore \
      T_SCENARIO=$scen timeout 180 python3 /uvccl-src/t/py/torch_backend.py \
      >"$out/$r" 2>&1; echo "$?" >"$out/rc.$r" ) &
  done
  wait 2>/dev/null
  n_test=$((n_test + 1))
  fails=$(cat "$out"/[0-9]* | grep -c '^@check [0-9]* 0 ')
  got=$(cat "$out"/[0-9]* | grep -c '^@check [0-9]* 1 ')
  want=$3
  if [ "$fails" = 0 ] && [ "$got" -ge "$want" ]; then
    echo "ok $n_test - PyTorch $version, $n ranks${scen:+ ($scen)}: $got checks passed"
  else
    echo "not ok $n_test - PyTorch $version, $n ranks${scen:+ ($scen)}: $got passed, $fails failed (of $want)"
    grep -h '^@check [0-9]* 0 \|Error' "$out"/[0-9]* | head -20 | sed 's/^/#   /'
    # each rank's exit status (139: a segmentation fault, which prints
    # nothing of its own)
    for r in $(seq 0 $((n - 1))); do
      echo "#   rank $r exited with status $(cat "$out/rc.$r" 2>/dev/null)"
    done
  fi
  rm -rf "$out"
}
# checks per rank: 21 (t/5001's list); the kill scenario: 3 per survivor
world 2 "" 42
world 4 "" 84
world 3 "" 63
world 3 kill 6
world 3 abort 6
world 2 tcpinit 8
# split_group and shrink_group with rank 3 killed, rank 2 excluded alive
# (4 checks a rank)
world 4 shrink 12
# a rank killed during FSDP2 steps (2 checks per survivor)
world 3 fsdp_kill 4
# c10d's reconfigure API (2.14+): a 4th process joins with
# enable_reconfigure, handles as a set and as a list, the 4th leaves,
# refusals (5 checks a rank)
world 4 reconfigure 20
# DDP, 2 ranks: parameters equal, losses as Gloo's
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(mktemp -d)
for r in 0 1; do
  chroot "$root" /usr/bin/env USE_LIBUV=0 RANK=$r WORLD_SIZE=2 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONWARNINGS=ignore \
    DDP_STEPS=50 timeout 180 python3 /uvccl-src/t/py/torch_ddp.py >"$out/$r" 2>&1 &
done
wait
fails=$(cat "$out"/* | grep -c '^@check [0-9]* 0 ')
got=$(cat "$out"/* | grep -c '^@check [0-9]* 1 ')
if [ "$fails" = 0 ] && [ "$got" -ge 12 ]; then
  echo "ok 10 - PyTorch $version, DDP (MLP, CNN) 2 ranks 50 steps: parameters equal, losses as Gloo's ($got checks)"
else
  echo "not ok 10 - PyTorch $version, DDP: $got passed, $fails failed"
  grep -h '^@check [0-9]* 0 \|Error' "$out"/* | head -20 | sed 's/^/#   /'
fi
rm -rf "$out"
# What runs on top (t/py/torch_ontop.py): functional collectives, DTensor
# on a CPU DeviceMesh, FSDP2's fully_shard, torch.compile of DDP, and
# TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper, once through uvccl and once
# through Gloo in this root; t/py/ontop_report.py compares them
ontop() { # test-number n description [env...]
  local num=$1 n=$2 what=$3 port r be out rep
  shift 3
  out=$(mktemp -d)
  for be in uvccl gloo; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    for r in $(seq 0 $((n - 1))); do
      chroot "$root" /usr/bin/env USE_LIBUV=0 RANK=$r WORLD_SIZE=$n \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PYTHONWARNINGS=ignore \
        T_BACKEND=$be "$@" timeout 300 python3 /uvccl-src/t/py/torch_ontop.py \
        >"$out/$be.$r" 2>&1 &
    done
    wait
  done
  if rep=$(python3 t/py/ontop_report.py "$out" "$n"); then
    echo "ok $num - PyTorch $version, $n ranks, $what: $rep"
  else
    echo "not ok $num - PyTorch $version, $n ranks, $what"
    echo "$rep" | sed 's/^/#   /'
    grep -h "Error" "$out"/uvccl.* | head -5 | sed 's/^/#   /'
  fi
  rm -rf "$out"
}
ontop 11 2 "functional collectives, DTensor, FSDP2, compiled DDP"
ontop 12 4 "functional collectives, DTensor, FSDP2, compiled DDP"
ontop 13 2 "TORCH_DISTRIBUTED_DEBUG=DETAIL (mismatched shapes caught)" \
  T_ONLY=detail TORCH_DISTRIBUTED_DEBUG=DETAIL
# The elastic DDP example (examples/torch/elastic_ddp.py) under
# uvccl-run --respawn: 4 ranks train, rank 2 is killed at step 120, the
# survivors shrink and go on, its replacement joins through reconfigure,
# the world is 4 again and the loss curve goes on (PyTorch with the
# reconfigure API; the example says so and exits 2 elsewhere)
out=$(mktemp)
chroot "$root" /bin/sh -c "cd /uvccl-src && PYTHONPATH=python USE_LIBUV=0 \
  PYTHONWARNINGS=ignore timeout 240 build/bin/uvccl-run --respawn=1 \
  --no-auth -n 4 python3 examples/torch/elastic_ddp.py --kill-rank 2 \
  --kill-step 120" >"$out" 2>&1
rc=$?
fin=$(grep -o 'final: .*' "$out" | head -1)
if grep -q "has no reconfigure API" "$out"; then
  echo "ok 14 - elastic DDP example # SKIP PyTorch $version has no reconfigure API"
elif [ "$rc" = 0 ] && grep -q "shrunk to 3 ranks at step 120" "$out" &&
    grep -q "grew to 4 ranks (1 joined)" "$out" &&
    echo "$fin" | grep -q "400 steps, loss [0-9.]* -> 0\.0[0-4][0-9]*, world 4, steps lost 0, failed attempts 1,"; then
  echo "ok 14 - PyTorch $version, elastic DDP (uvccl-run --respawn, rank 2 killed): $(grep -o 'shrunk to 3 ranks at step 120 [0-9.]* s after the kill' "$out"); $(grep -o 'grew to 4 ranks (1 joined) at step [0-9]* [0-9.]* s after the kill' "$out"); $fin"
else
  echo "not ok 14 - PyTorch $version, elastic DDP example (exit $rc)"
  grep -v -i warn "$out" | tail -25 | sed 's/^/#   /'
fi
rm -f "$out"
# pip install ./python with the root's own pip, offline, into a venv that
# sees the root's torch; then a 2-rank allreduce with the installed package
# (run from /, so the source tree's copy is not what imports)
if ! chroot "$root" python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "ok 15 - pip install ./python # SKIP $root has no python3-venv (tools/torch-root.sh create installs it)"
  exit 0
fi
log=$root/tmp/uvccl-pip.log
if chroot "$root" /bin/sh -c 'rm -rf /tmp/uvccl-venv &&
    python3 -m venv --system-site-packages /tmp/uvccl-venv &&
    cd /uvccl-src && /tmp/uvccl-venv/bin/pip install --no-build-isolation \
      --no-index ./python' >"$log" 2>&1; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out=$(mktemp -d)
  for r in 0 1; do
    chroot "$root" /bin/sh -c "cd / && USE_LIBUV=0 timeout 60 /tmp/uvccl-venv/bin/python -c '
import torch, torch.distributed as dist, uvccl_torch
dist.init_process_group(\"uvccl\", init_method=\"tcp://127.0.0.1:$port\", rank=$r, world_size=2)
t = torch.full((4,), $r + 1.0)
dist.all_reduce(t)
print(\"@pip\", uvccl_torch.__file__, t.tolist())
dist.destroy_process_group()'" >"$out/$r" 2>&1 &
  done
  wait
  if grep -q "site-packages/uvccl_torch.*\[3.0, 3.0, 3.0, 3.0\]" "$out/0" &&
     grep -q "site-packages/uvccl_torch.*\[3.0, 3.0, 3.0, 3.0\]" "$out/1"; then
    echo "ok 15 - PyTorch $version, pip install --no-build-isolation --no-index ./python in a venv: the installed package's 2-rank allreduce right"
  else
    echo "not ok 15 - PyTorch $version, the pip-installed package"
    cat "$out"/* | tail -20 | sed 's/^/#   /'
  fi
  rm -rf "$out"
else
  echo "not ok 15 - PyTorch $version, pip install ./python failed"
  tail -20 "$log" | sed 's/^/#   /'
fi
