#!/bin/bash
# bench/coll/netns.sh - TCP between hosts, simulated: every rank in a
# network namespace of its own, joined by veth pairs to a bridge (addresses
# 10.214.0.1-W/24, a private range that exists only inside these
# namespaces), so that each pair's bytes cross two veth devices and a
# bridge, as between containers, never loopback. The question it answers
# (issue 16): is TCP between hosts any slower now that ranks of one host
# use shared memory? So it runs, side by side, interleaved:
#   now     this tree's uvccl-bench with UVCCL_TRANSPORT=tcp (the ranks are
#           on one kernel; without it they would share memory)
#   before  the same benchmark built from BEFORE (default 8dc9d29^, the
#           commit before shared memory landed; its only transport is TCP)
# at WORLDS ranks, default mode and busy-poll, PASSES passes (each pass
# runs every cell once, the order of the two builds alternating), and
# prints per size the median over the passes of each build's median time
# (4 B .. 4 KiB) or bus bandwidth (larger), and now / before.
#
#   bench/coll/netns.sh            (root, iproute2; ~3 minutes)
# Environment: WORLDS="2 4" PASSES=3 OP=allreduce SIZES="4 4K 1M 16M"
#   BUDGET=0.3 BEFORE=8dc9d29^
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORLDS=${WORLDS:-"2 4"}
PASSES=${PASSES:-3}
OP=${OP:-allreduce}
SIZES=${SIZES:-"4 4K 1M 16M"}
BUDGET=${BUDGET:-0.3}
BEFORE=${BEFORE:-8dc9d29^}
[ "$(id -u)" = 0 ] || { echo "netns.sh: needs root (network namespaces)"; exit 1; }
command -v ip > /dev/null || { echo "netns.sh: needs ip (iproute2)"; exit 1; }

TMP=$(mktemp -d)
TAG=uvb$$
NS_MAX=4
cleanup() {
  local i
  for i in $(seq 0 $NS_MAX); do ip netns del "$TAG$i" 2> /dev/null || true; done
  [ -d "$TMP/before" ] && git -C "$ROOT" worktree remove --force "$TMP/before" \
    > /dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT

make -C "$ROOT" -s build/bin/uvccl-bench > /dev/null
NOW=$ROOT/build/bin/uvccl-bench
git -C "$ROOT" worktree add -q --detach "$TMP/before" "$BEFORE"
make -C "$TMP/before" -s -j2 build/bin/uvccl-bench > "$TMP/before.log" 2>&1 ||
  { echo "netns.sh: cannot build $BEFORE (see $TMP/before.log)"; cat "$TMP/before.log"; exit 1; }
OLD=$TMP/before/build/bin/uvccl-bench

# the switch in namespace $TAG$NS_MAX, rank i in $TAG$i at 10.214.0.(i+1)
ip netns add "$TAG$NS_MAX"
ip -n "$TAG$NS_MAX" link add br0 type bridge
ip -n "$TAG$NS_MAX" link set br0 up
for i in $(seq 0 $((NS_MAX - 1))); do
  ip netns add "$TAG$i"
  ip -n "$TAG$i" link add eth0 type veth peer name p$i netns "$TAG$NS_MAX"
  ip -n "$TAG$NS_MAX" link set p$i master br0
  ip -n "$TAG$NS_MAX" link set p$i up
  ip -n "$TAG$i" addr add 10.214.0.$((i + 1))/24 dev eth0
  ip -n "$TAG$i" link set eth0 up
  ip -n "$TAG$i" link set lo up
done

# one run: W ranks of $bin, prints rank 0's JSON rows
port=29700
run() { # bin world mode
  local bin=$1 w=$2 mode=$3 r pids=() flags=(--op "$OP" --budget "$BUDGET" --json)
  [ "$mode" = busy-poll ] && flags+=(--busy-poll)
  port=$((port + 1))
  for r in $(seq $((w - 1)) -1 0); do
    ip netns exec "$TAG$r" env RANK=$r WORLD_SIZE=$w MASTER_ADDR=10.214.0.1 \
      MASTER_PORT=$port UVCCL_TRANSPORT=tcp \
      "$bin" "${flags[@]}" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
      > "$TMP/out.$r" 2> "$TMP/err.$r" &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "netns.sh: a rank failed:"; cat "$TMP"/err.*; exit 1; }
  grep '^{' "$TMP/out.0"
}

# sizes as -b/-e/-f: the benchmark runs every size from MINB by FACTOR
to_bytes() { numfmt --from=iec "$1"; }
set -- $SIZES
MINB=$(to_bytes "$1")
MAXB=$(to_bytes "${!#}")
FACTOR=4

for p in $(seq 1 "$PASSES"); do
  for w in $WORLDS; do
    for mode in default busy-poll; do
      if [ $((p % 2)) = 1 ]; then order="before now"; else order="now before"; fi
      for impl in $order; do
        bin=$NOW
        [ "$impl" = before ] && bin=$OLD
        # not in a pipe: a subshell would keep port's increment and
        # run's exit on a failed rank to itself
        run "$bin" "$w" "$mode" > "$TMP/run.jsonl"
        sed "s/^{/{\"build\":\"$impl\",\"mode\":\"$mode\",\"pass\":$p,/" \
          "$TMP/run.jsonl" >> "$TMP/rows.jsonl"
      done
    done
  done
done

echo "# bench/coll/netns.sh: $OP, ranks in separate network namespaces over"
echo "# veth + bridge, TCP; now = $(git -C "$ROOT" rev-parse --short HEAD) with UVCCL_TRANSPORT=tcp,"
echo "# before = $(git -C "$ROOT" rev-parse --short "$BEFORE"); $PASSES passes, budget $BUDGET s; $(date -u '+%Y-%m-%d %H:%M UTC')"
python3 - "$TMP/rows.jsonl" "$SIZES" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = set()
for s in sys.argv[2].split():
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    want.add(int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s))
cells = {}
for r in rows:
    if r["bytes"] not in want:
        continue
    key = (r["world"], r["mode"], r["bytes"])
    small = r["bytes"] <= 4096
    cells.setdefault(key, {}).setdefault(r["build"], []).append(
        r["time_us"] if small else r["busbw_gbps"])
def label(b):
    return f"{b} B" if b < 1024 else (f"{b >> 10} KiB" if b < 1 << 20 else f"{b >> 20} MiB")
print()
print("| W | mode | size | before | now | now / before |")
print("|---:|---|---:|---:|---:|---:|")
for (w, mode, b) in sorted(cells):
    c = cells[(w, mode, b)]
    if "before" not in c or "now" not in c:
        continue
    o, n = statistics.median(c["before"]), statistics.median(c["now"])
    unit = "us" if b <= 4096 else "GB/s"
    # for time, lower is better: report the speed ratio either way
    ratio = o / n if b <= 4096 else n / o
    print(f"| {w} | {mode} | {label(b)} | {o:.2f} {unit} | {n:.2f} {unit} | "
          f"{ratio:.2f}x {'faster' if ratio >= 1 else 'slower'} |")
EOF
