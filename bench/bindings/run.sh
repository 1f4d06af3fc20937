#!/usr/bin/env bash
# The bindings' figures side by side in one run (bench/RESULTS.md,
# "Bindings"): at world size 2, for each transport (shared memory, TCP),
# JOBS jobs of each, interleaved:
#   - back-to-back allreduces at 4 B, 1 MiB and 16 MiB, each started when
#     the previous one completes: the C library driven from callbacks under
#     uv_run (uvccl-bindings-chain) against the asyncio binding and the
#     Node.js addon (awaited)
#   - a 1 ms timer's lateness while 64 MiB allreduces run back to back for
#     SECONDS: the asyncio binding, torch.distributed's Gloo through
#     run_in_executor, the Node.js addon (with monitorEventLoopDelay), and
#     no collectives at all (the floors of asyncio and of Node)
# Usage: bench/bindings/run.sh [JOBS] [SECONDS]   (after make)
set -euo pipefail
cd "$(dirname "$0")/../.."
JOBS=${1:-3}
SECS=${2:-5}
PY=/usr/bin/python3
RUN=build/bin/uvccl-run
OUT=$(mktemp -d)
for job in $(seq 1 "$JOBS"); do
  for tr in shm tcp; do
    envs=()
    [ "$tr" = tcp ] && envs=(UVCCL_TRANSPORT=tcp)
    env "${envs[@]}" $RUN -n 2 build/bench/uvccl-bindings-chain 2>&1 |
      sed -n "s/^\[0\] c /$tr c /p" >> "$OUT/chain"
    env "${envs[@]}" $RUN -n 2 $PY bench/bindings/py_bench.py chain 2>&1 |
      sed -n "s/^\[0\] py /$tr py /p" >> "$OUT/chain"
    env "${envs[@]}" $RUN -n 2 node bench/bindings/node_bench.js chain 2>&1 |
      sed -n "s/^\[0\] node /$tr node /p" >> "$OUT/chain"
    for b in uvccl idle gloo; do
      # Gloo has no shared memory: its rows are TCP's whatever the column
      [ "$b" != uvccl ] && [ "$tr" = tcp ] && continue
      env "${envs[@]}" $RUN -n 2 $PY bench/bindings/py_bench.py lag $b 64 "$SECS" 2>&1 |
        sed -n "s/^\[[01]\] lag /$tr /p" >> "$OUT/lag"
    done
    for b in uvccl idle; do
      [ "$b" = idle ] && [ "$tr" = tcp ] && continue
      env "${envs[@]}" $RUN -n 2 node bench/bindings/node_bench.js lag $b 64 "$SECS" 2>&1 |
        sed -n "s/^\[[01]\] lag /$tr /p" >> "$OUT/lag"
    done
  done
done
$PY - "$OUT" "$JOBS" <<'PYEOF'
import collections, statistics, sys
out, jobs = sys.argv[1], sys.argv[2]
chain = collections.defaultdict(list)
for line in open(out + "/chain"):
    tr, impl, size, iters, us, bw = line.split()
    chain[(tr, int(size), impl)].append((float(us), float(bw)))
print("| transport | size | C, callbacks under uv_run: us/op (median, range) | asyncio binding: us/op | Node.js addon: us/op | asyncio - C / Node - C (medians) | busbw C / asyncio / Node (GB/s) |")
print("|---|---:|---:|---:|---:|---:|---:|")
rng = lambda xs: "%.1f (%.1f-%.1f)" % (statistics.median(x[0] for x in xs), min(x[0] for x in xs), max(x[0] for x in xs))
med = lambda xs, i=0: statistics.median(x[i] for x in xs)
for tr in ("shm", "tcp"):
    for size in sorted({k[1] for k in chain if k[0] == tr}):
        c = chain[(tr, size, "c")]; p = chain[(tr, size, "py")]; nd = chain[(tr, size, "node")]
        name = "4 B" if size < 1024 else "%d MiB" % (size >> 20)
        print("| %s | %s | %s | %s | %s | %+.1f / %+.1f us | %.2f / %.2f / %.2f |" % (
            tr, name, rng(c), rng(p), rng(nd), med(p) - med(c), med(nd) - med(c),
            med(c, 1), med(p, 1), med(nd, 1)))
print()
lag = collections.defaultdict(list)
for line in open(out + "/lag"):
    f = line.split()
    tr, backend, rank = f[0], f[1], f[2]
    eld = (float(f[8]), float(f[9])) if len(f) > 9 else None
    lag[(tr, backend)].append((float(f[3]), float(f[4]), float(f[5]), int(f[6]), float(f[7]), eld))
print("| what runs (2 ranks, 64 MiB allreduces) | transport | timer lag p50 (worst rank-job) | p99 | max | monitorEventLoopDelay p50 / p99 | allreduces | ms each (median) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for key, label in ((("shm", "idle"), "asyncio, nothing (the floor)"), (("shm", "uvccl"), "uvccl asyncio binding"),
                   (("tcp", "uvccl"), "uvccl asyncio binding"), (("shm", "gloo"), "torch.distributed Gloo via run_in_executor"),
                   (("shm", "node-idle"), "Node, nothing (the floor)"), (("shm", "node-uvccl"), "uvccl Node.js addon"),
                   (("tcp", "node-uvccl"), "uvccl Node.js addon")):
    rows = lag.get(key, [])
    if not rows: continue
    tr = "tcp" if key[1] == "gloo" else key[0]
    idle = key[1].endswith("idle")
    eld = "%.2f / %.2f" % (max(r[5][0] for r in rows), max(r[5][1] for r in rows)) if rows[0][5] else "-"
    print("| %s | %s | %.2f | %.2f | %.2f | %s | %s | %s |" % (
        label, "-" if idle else tr, max(r[0] for r in rows), max(r[1] for r in rows),
        max(r[2] for r in rows), eld, "-" if idle else sum(r[3] for r in rows),
        "-" if idle else "%.1f" % statistics.median(r[4] for r in rows)))
print("\n(%s jobs; raw lines in %s)" % (jobs, out))
PYEOF
