#!/usr/bin/env bash
# The bindings' figures side by side in one run (bench/RESULTS.md,
# "Bindings"): at world size 2, for each transport (shared memory, TCP),
# JOBS jobs of each, interleaved:
#   - back-to-back allreduces at 4 B, 1 MiB and 16 MiB, each started when
#     the previous one completes: the C library driven from callbacks under
#     uv_run (uvccl-bindings-chain) against the asyncio binding (awaited)
#   - a 1 ms asyncio timer's lateness while 64 MiB allreduces run back to
#     back for SECONDS: the asyncio binding, torch.distributed's Gloo
#     through run_in_executor, and no collectives at all (the floor)
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
    for b in uvccl idle gloo; do
      # Gloo has no shared memory: its rows are TCP's whatever the column
      [ "$b" != uvccl ] && [ "$tr" = tcp ] && continue
      env "${envs[@]}" $RUN -n 2 $PY bench/bindings/py_bench.py lag $b 64 "$SECS" 2>&1 |
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
print("| transport | size | C, callbacks under uv_run: us/op (median, range) | asyncio binding: us/op | binding - C (medians) | busbw C / binding (GB/s) |")
print("|---|---:|---:|---:|---:|---:|")
for tr in ("shm", "tcp"):
    for size in sorted({k[1] for k in chain if k[0] == tr}):
        c = chain[(tr, size, "c")]; p = chain[(tr, size, "py")]
        cm = statistics.median(x[0] for x in c); pm = statistics.median(x[0] for x in p)
        name = "4 B" if size < 1024 else "%d MiB" % (size >> 20)
        print("| %s | %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %+.1f us | %.2f / %.2f |" % (
            tr, name, cm, min(x[0] for x in c), max(x[0] for x in c),
            pm, min(x[0] for x in p), max(x[0] for x in p), pm - cm,
            statistics.median(x[1] for x in c), statistics.median(x[1] for x in p)))
print()
lag = collections.defaultdict(list)
for line in open(out + "/lag"):
    tr, backend, rank, p50, p99, mx, ops, opms = line.split()
    lag[(tr, backend)].append((float(p50), float(p99), float(mx), int(ops), float(opms)))
print("| what runs (2 ranks, 64 MiB allreduces) | transport | timer lag p50 (worst rank-job) | p99 | max | allreduces | ms each (median) |")
print("|---|---|---:|---:|---:|---:|---:|")
for key, label in ((("shm", "idle"), "nothing (the floor)"), (("shm", "uvccl"), "uvccl asyncio binding"),
                   (("tcp", "uvccl"), "uvccl asyncio binding"), (("shm", "gloo"), "torch.distributed Gloo via run_in_executor")):
    rows = lag.get(key, [])
    if not rows: continue
    tr = "tcp" if key[1] == "gloo" else key[0]
    print("| %s | %s | %.2f | %.2f | %.2f | %s | %s |" % (
        label, "-" if key[1] == "idle" else tr, max(r[0] for r in rows), max(r[1] for r in rows),
        max(r[2] for r in rows), "-" if key[1] == "idle" else sum(r[3] for r in rows),
        "-" if key[1] == "idle" else "%.1f" % statistics.median(r[4] for r in rows)))
print("\n(%s jobs; raw lines in %s)" % (jobs, out))
PYEOF
