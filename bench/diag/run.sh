#!/usr/bin/env bash
# What the diagnostics cost on the hot path, side by side in one run:
# the flight recorder (on by default; UVCCL_TRACE_BUFFER_SIZE=0 turns it
# off) and the fingerprint checks (UVCCL_DEBUG=detail), on a 4 B
# allreduce in busy-poll mode and a 1 MiB allreduce, W ranks on this
# host. The configurations alternate, ROUNDS times, and each cell is the
# median of the rounds' medians, so drift of the machine hits them alike.
#
#   bench/diag/run.sh [W=2] [ROUNDS=15]
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-2}
ROUNDS=${2:-15}
BIN=build/bin
[ -x "$BIN/uvccl-bench" ] || make -s all >/dev/null

configs=("recorder off|UVCCL_TRACE_BUFFER_SIZE=0"
         "recorder on (default)|UVCCL_TRACE_BUFFER_SIZE=2000"
         "recorder + fingerprint checks|UVCCL_TRACE_BUFFER_SIZE=2000 UVCCL_DEBUG=detail")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$ROUNDS"); do
  for i in "${!configs[@]}"; do
    envs=${configs[$i]#*|}
    # 4 B, busy-poll: latency
    env $envs timeout 120 "$BIN/uvccl-run" -n "$W" "$BIN/uvccl-bench" -b 4 -e 4 -n 20000 \
      --busy-poll --budget 1 --json 2>/dev/null |
      sed -n "s/^\[0\] //p" | sed "s/^/$i lat /" >>"$out"
    # 1 MiB: bandwidth
    env $envs timeout 120 "$BIN/uvccl-run" -n "$W" "$BIN/uvccl-bench" -b 1M -e 1M \
      --budget 1 --json 2>/dev/null |
      sed -n "s/^\[0\] //p" | sed "s/^/$i bw /" >>"$out"
  done
done
python3 - "$out" "$W" "$ROUNDS" "${configs[@]}" <<'PY'
import json, statistics, sys
path, W, rounds, *configs = sys.argv[1:]
rows = {}
for line in open(path):
    i, kind, js = line.split(" ", 2)
    r = json.loads(js)
    if not r.get("ok"):
        print("FAILED row:", js.strip()); continue
    rows.setdefault((int(i), kind), []).append(r)
print(f"allreduce float32, {W} ranks on one host, {rounds} alternating rounds "
      "(median of the rounds' medians)\n")
print(f"| configuration | 4 B busy-poll latency (us) | vs off | 1 MiB busbw (GB/s) | vs off |")
print(f"|---|---:|---:|---:|---:|")
base_lat = base_bw = None
for i, c in enumerate(configs):
    name = c.split("|")[0]
    lat = statistics.median(r["time_us"] for r in rows.get((i, "lat"), [{"time_us": float("nan")}]))
    bw = statistics.median(r["busbw_gbps"] for r in rows.get((i, "bw"), [{"busbw_gbps": float("nan")}]))
    if i == 0: base_lat, base_bw = lat, bw
    print(f"| {name} | {lat:.2f} | {100*(lat/base_lat-1):+.1f}% | {bw:.3f} | {100*(bw/base_bw-1):+.1f}% |")
PY
