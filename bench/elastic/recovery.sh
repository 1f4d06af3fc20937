#!/usr/bin/env bash
# Recovery from a killed rank, the same job both ways, in a Debian root that
# tools/torch-root.sh made (TORCH_ROOT_DEV=1) with a PyTorch that has c10d's
# reconfigure API (sid: 2.14):
#   uvccl:   examples/torch/elastic_ddp.py under uvccl-run --respawn=1: the
#            survivors shrink and go on, the replacement joins (reconfigure);
#   torchrun: bench/elastic/restart_all.py under torchrun --max-restarts 1
#            with Gloo: every worker stopped and started again, the last
#            checkpoint (every 50 steps) loaded.
# 4 ranks, 400 steps of 10 ms, rank 2 SIGKILLed at step 120. Prints each
# run's lines, then the medians: the time from the kill to training again
# (any size) and to training at full size again, and the steps lost.
#
#   bench/elastic/recovery.sh [ROOT] [RUNS]     (ROOT: /opt/uvccl-torch/sid)
set -u
cd "$(dirname "$0")/../.."
root=${1:-/opt/uvccl-torch/sid}
runs=${2:-3}
[ -x "$root/usr/bin/g++" ] || { echo "recovery: $root is no PyTorch root with g++" >&2; exit 2; }
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
unset MAKEFLAGS MFLAGS MAKELEVEL SANITIZE
src=$root/uvccl-src
rm -rf "$src.new" && mkdir -p "$src.new"
git ls-files -z | xargs -0 cp --parents -t "$src.new" 2>/dev/null
rm -rf "$src" && mv "$src.new" "$src"
chroot "$root" /bin/sh -c 'cd /uvccl-src && make -o deps -j2 build/libuvccl.a build/bin/uvccl-run >/tmp/uvccl-build.log 2>&1 && make -o deps torch-ext >>/tmp/uvccl-build.log 2>&1' ||
  { tail -20 "$root/tmp/uvccl-build.log" >&2; exit 2; }
args="--kill-rank 2 --kill-step 120"
# torchrun's own store in a PyTorch built without libuv (Debian's) needs
# use_libuv=False, which torchrun cannot be told: said for it here
torchrun='import sys, torch.distributed as d
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as b
class S(d.TCPStore):
    def __init__(self, *a, **k):
        k.setdefault("use_libuv", False)
        super().__init__(*a, **k)
b.TCPStore = d.TCPStore = S
from torch.distributed.run import main
sys.argv = ["torchrun"] + sys.argv[1:]
main()'
out=$(mktemp -d)
for i in $(seq "$runs"); do
  chroot "$root" /bin/sh -c "cd /uvccl-src && PYTHONPATH=python USE_LIBUV=0 \
    PYTHONWARNINGS=ignore timeout 300 build/bin/uvccl-run --respawn=1 \
    --no-auth -n 4 python3 examples/torch/elastic_ddp.py $args" \
    2>&1 | grep -o 'shrunk to .*\|final: .*' | tee -a "$out/uvccl" |
    sed 's/^/uvccl    /'
  chroot "$root" /bin/sh -c "cd /uvccl-src && PYTHONPATH=python USE_LIBUV=0 \
    PYTHONWARNINGS=ignore LOGLEVEL=ERROR timeout 300 python3 -c '$torchrun' \
    --standalone --local-addr 127.0.0.1 --nproc-per-node 4 --max-restarts 1 \
    bench/elastic/restart_all.py --backend gloo $args" \
    2>&1 | grep -o 'final: .*' | tee -a "$out/torchrun" | sed 's/^/torchrun /'
done
python3 - "$out" <<'EOF'
import re, statistics, sys
d = sys.argv[1]
for name, lost_re in (("uvccl", r"steps lost (\d+)"),
                      ("torchrun", r"steps lost (\d+)")):
    try:
        lines = open("%s/%s" % (d, name)).read().splitlines()
    except OSError:
        lines = []
    t = [float(m.group(1)) for l in lines
         for m in [re.search(r"full size again ([0-9.]+) s", l)] if m]
    lost = [int(m.group(1)) for l in lines for m in [re.search(lost_re, l)] if m]
    # training again (at any size): uvccl's survivors at 3 ranks; a
    # restarted job only at full size
    again = [float(m.group(1)) for l in lines
             for m in [re.search(r"shrunk to \d+ ranks at step \d+ ([0-9.]+) s", l)]
             if m] or t
    lines = [l for l in lines if l.startswith("final:")]
    print("%-9s runs %d: training again %s s after the kill, full size again "
          "%s s (medians), steps lost %s" % (
              name, len(lines),
              "%.3f" % statistics.median(again) if again else "-",
              "%.2f" % statistics.median(t) if t else "-",
              "%d" % statistics.median(lost) if lost else "-"))
EOF
rm -rf "$out"
