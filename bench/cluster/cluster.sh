#!/bin/bash
# bench/cluster/cluster.sh - an emulated cluster on one machine, and uvccl,
# Gloo and Open MPI side by side on it, in one run.
#
# H hosts, each a network namespace joined by a veth pair to a bridge in a
# switch namespace (addresses 10.215.0.1-H/24, a private range that exists
# only inside these namespaces; nothing leaves them). Each host's link is
# shaped both ways with tc tbf at RATE (this kernel has tbf and htb, not
# netem: rates, no delays). L ranks in each host share its memory; between
# hosts they talk TCP. Ranks are placed by host (rank r on host r / L) or
# scattered (host r % H); rank 0 is on host 0 either way and serves the
# store. uvccl's ranks get UVCCL_HOST_ID=<their host>, so that ranks of
# two namespaces never share memory (one kernel would let them).
#
# Runs, per placement, interleaved PASSES times:
#   uvccl       build/bin/uvccl-bench (the default: rings in host order,
#               and hierarchical allreduces where hosts are alike)
#   uvccl-ring  the same with UVCCL_RING_ORDER=ring (one ring in host order)
#   uvccl-rank  the same with UVCCL_RING_ORDER=rank (one ring in rank
#               order, as before hosts were known)
#   uvccl-b     BENCH_B: another build's uvccl-bench, for a before/after
#               in one run (not in the default IMPLS)
#   uvccl-sN    the same with UVCCL_TCP_STRIPES=N (N TCP connections to
#               each rank of another host, large frames cut across them;
#               uvccl-s1: one, the default)
#   uvccl-gpu   uvccl-bench --gpu: buffers in GPU memory, staged through
#               pinned memory in chunks (UVCCL_STAGE_CHUNK); without a GPU,
#               set UVCCL_CUDART=build/fake/libcudart.so.13 and
#               FAKE_CUDA_COPY_MBPS (the fake's copy rate)
#   uvccl-gpuK  the same in chunks of K KiB (UVCCL_STAGE_CHUNK; uvccl-gpu0:
#               whole)
#   tcp         bench/cluster/tcp_ring.py: no library, plain TCP, one
#               process a host in a ring of hosts, each sending what the
#               link limit says the collective must carry through its link
#               while it receives as much: the limit as TCP can reach it
#               (headers, acknowledgements, the same losses)
#   tcpN        the same on N connections to the next host
#   gloo        bench/coll/gloo_bench.py --env (/usr/bin/python3, Debian's
#               PyTorch), GLOO_SOCKET_IFNAME=eth0
#   openmpi     bench/coll/mpi_bench (mpirun in host 0's namespace, its
#               daemons started in the others through a plm_rsh_agent that
#               enters their namespace; vader inside a host, tcp between),
#               where openmpi-bin and libopenmpi-dev are installed
# and prints, per op and size, each one's median time and the link's
# limit: each host must send (and receive) 2(H-1)/H x S for an allreduce,
# (H-1)/H x S for allgather and reduce_scatter ((P-L)/P x S with hosts of
# different sizes, L the fewest ranks of a host), S for broadcast, at
# RATE.
#
#   bench/cluster/cluster.sh            (root, iproute2, tc; a few minutes)
# Environment: H=2 L=2 (or SHAPE="3 1": hosts of different sizes, ranks
#   by host in that order, or scattered round the hosts that have room)
#   RATE=400mbit OPS="allreduce broadcast allgather
#   reduce_scatter" SIZES="16M" PASSES=3 PLACES="host scattered"
#   IMPLS="uvccl uvccl-ring uvccl-rank gloo openmpi" ITERS=5 WARMUP=1 (timed and
#   untimed iterations of each run; every rank's last result is checked)
#   ROWS=FILE (keep every run's JSON row there)
#   LOSS=0 (percent of the packets host LOSS_HOST=0's link drops, each way,
#   at random: nftables' numgen, since this kernel has no netem; needs nft;
#   every host sends packets of one segment then, so that a drop is one
#   packet's, not a large send's)
#   LOSS_AT=wire (where: wire, the switch's port, so that neither end's
#   stack sees the drop, as on a real link; stack, the lossy host's own
#   output and input hooks, as in older rows of bench/RESULTS.md: a drop
#   at the output hook is an error to TCP, which sends the segment again
#   later, not a loss)
#   CC= (the hosts' TCP congestion control, e.g. cubic, Linux's default;
#   empty: the machine's, named in the header; one the machine does not
#   allow joins net.ipv4.tcp_allowed_congestion_control for the run)
#   QUEUE_MS=100 (how much a link queues before it drops, in time at RATE:
#   tbf's latency)
#   WRAP= (a command every rank's program is started through, uvccl's,
#   Gloo's and Open MPI's alike, with the program and its arguments after
#   it; it sees RANK, or OMPI_COMM_WORLD_RANK under mpirun: e.g. a script
#   that pins each rank to a CPU, to see what the ranks' placement on a
#   machine's few CPUs does)
#   DELAY_US=0 (every host's link holds what it sends this long: round
#   trips of 2 x DELAY_US between hosts; bench/cluster/delay.c through
#   iptables' NFQUEUE, since this kernel has no netem; needs iptables and
#   libnetfilter-queue-dev)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
H=${H:-2}
L=${L:-2}
SHAPE=${SHAPE:-}
RATE=${RATE:-400mbit}
OPS=${OPS:-"allreduce broadcast allgather reduce_scatter"}
SIZES=${SIZES:-16M}
PASSES=${PASSES:-3}
PLACES=${PLACES:-"host scattered"}
IMPLS=${IMPLS:-"uvccl uvccl-ring uvccl-rank gloo openmpi"}
ITERS=${ITERS:-5}
LOSS=${LOSS:-0}
LOSS_HOST=${LOSS_HOST:-0}
LOSS_AT=${LOSS_AT:-wire}
CC=${CC:-}
DELAY_US=${DELAY_US:-0}
QUEUE_MS=${QUEUE_MS:-100}
WARMUP=${WARMUP:-1}
N=(-n "$ITERS" -w "$WARMUP")
# ranks a host: L each, or SHAPE's (hosts of different sizes)
if [ -n "$SHAPE" ]; then read -r -a per <<< "$SHAPE"; else per=(); for i in $(seq 1 "$H"); do per+=("$L"); done; fi
H=${#per[@]}
W=0 min_per=${per[0]}
for i in "${per[@]}"; do W=$((W + i)); if [ "$i" -lt "$min_per" ]; then min_per=$i; fi; done
[ "$(id -u)" = 0 ] || { echo "cluster.sh: needs root (network namespaces)"; exit 1; }
command -v ip > /dev/null && command -v tc > /dev/null ||
  { echo "cluster.sh: needs ip and tc (iproute2)"; exit 1; }
# LOSS in tenths of a per cent, for numgen's whole numbers
LOSS_PM=$(awk -v l="$LOSS" 'BEGIN { printf "%d", l * 10 + 0.5 }')
[ "$LOSS_PM" = 0 ] || command -v nft > /dev/null ||
  { echo "cluster.sh: LOSS needs nft (nftables)"; exit 1; }
case $LOSS_AT in wire | stack) ;; *) echo "cluster.sh: LOSS_AT: wire or stack"; exit 1 ;; esac

[ "$DELAY_US" = 0 ] || command -v iptables > /dev/null ||
  { echo "cluster.sh: DELAY_US needs iptables"; exit 1; }

TMP=$(mktemp -d)
TAG=uvc$$
delays=()
cleanup() {
  local i
  [ ${#delays[@]} = 0 ] || kill "${delays[@]}" 2> /dev/null || true
  for i in $(seq 0 "$H"); do ip netns del "$TAG$i" 2> /dev/null || true; done
  [ -z "$cc_allowed" ] || sysctl -qw net.ipv4.tcp_allowed_congestion_control="$cc_allowed"
  rm -rf "$TMP"
}
trap cleanup EXIT
# a network namespace may only pick an algorithm the machine allows: CC
# joins that list for the run (put back at the end)
cc_allowed=
if [ -n "$CC" ]; then
  allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
  if [[ " $allowed " != *" $CC "* ]]; then
    sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $CC" ||
      { echo "cluster.sh: CC=$CC: not available here"; exit 1; }
    cc_allowed=$allowed
  fi
fi

make -C "$ROOT" -s build/bin/uvccl-bench > /dev/null
have_mpi=0
if [[ " $IMPLS " == *" openmpi "* ]] && command -v mpicc > /dev/null &&
  command -v mpirun > /dev/null; then
  mpicc -O2 -o "$TMP/mpi_bench" "$ROOT/bench/coll/mpi_bench.c" && have_mpi=1
fi
have_gloo=0
if [[ " $IMPLS " == *" gloo "* ]] && /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  have_gloo=1
fi

# the switch in namespace $TAG$H, host i in $TAG$i at 10.215.0.(i+1)
SW=$TAG$H
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in $(seq 0 $((H - 1))); do
  ip netns add "$TAG$i"
  ip -n "$TAG$i" link add eth0 type veth peer name p$i netns "$SW"
  ip -n "$SW" link set p$i master br0
  ip -n "$SW" link set p$i up
  ip -n "$TAG$i" addr add 10.215.0.$((i + 1))/24 dev eth0
  ip -n "$TAG$i" link set eth0 up
  ip -n "$TAG$i" link set lo up
  [ -z "$CC" ] || ip netns exec "$TAG$i" sysctl -qw net.ipv4.tcp_congestion_control="$CC"
  # the host's link, both ways: out of the host, and out of the switch
  # towards it
  ip netns exec "$TAG$i" tc qdisc add dev eth0 root tbf rate "$RATE" \
    burst 256kb latency "${QUEUE_MS}ms"
  ip netns exec "$SW" tc qdisc add dev p$i root tbf rate "$RATE" \
    burst 256kb latency "${QUEUE_MS}ms"
done
if [ "$DELAY_US" != 0 ]; then
  gcc -O2 -o "$TMP/delay" "$ROOT/bench/cluster/delay.c" -lnetfilter_queue ||
    { echo "cluster.sh: DELAY_US needs libnetfilter-queue-dev"; exit 1; }
  for i in $(seq 0 $((H - 1))); do
    ip netns exec "$TAG$i" "$TMP/delay" 0 "$DELAY_US" &
    delays+=($!)
    # (iptables' NFQUEUE target: this kernel's nftables has no queue)
    ip netns exec "$TAG$i" iptables -A OUTPUT -o eth0 -j NFQUEUE \
      --queue-num 0 --queue-bypass
  done
fi
if [ "$LOSS_PM" != 0 ] && [ "$LOSS_AT" = wire ]; then
  # every host sends packets of one segment (a GSO packet crosses a veth
  # whole: its drop would be 45 packets'); the switch's port drops them,
  # so neither end's stack sees the drop (at a host's output hook TCP gets
  # an error and sends the segment again later instead)
  for i in $(seq 0 $((H - 1))); do ip -n "$TAG$i" link set eth0 gso_max_segs 1; done
  ip netns exec "$SW" nft -f - << NFT
table netdev loss {
  chain from_host { type filter hook ingress device "p$LOSS_HOST" priority 0; numgen random mod 1000 < $LOSS_PM drop; }
  chain to_host { type filter hook egress device "p$LOSS_HOST" priority 0; numgen random mod 1000 < $LOSS_PM drop; }
}
NFT
elif [ "$LOSS_PM" != 0 ]; then
  ip -n "$TAG$LOSS_HOST" link set eth0 gso_max_segs 1 gro_max_size 1500 2> /dev/null ||
    ip -n "$TAG$LOSS_HOST" link set eth0 gso_max_segs 1
  ip netns exec "$TAG$LOSS_HOST" nft -f - << NFT
table inet loss {
  chain out { type filter hook output priority 0; oifname "eth0" numgen random mod 1000 < $LOSS_PM drop; }
  chain in { type filter hook input priority 0; iifname "eth0" numgen random mod 1000 < $LOSS_PM drop; }
}
NFT
fi

# rank -> host: by host, each host's ranks one after another; scattered,
# round the hosts, passing those already full
hosts_host=() hosts_scattered=()
for i in "${!per[@]}"; do for j in $(seq 1 "${per[$i]}"); do hosts_host+=("$i"); done; done
left=("${per[@]}")
while [ ${#hosts_scattered[@]} -lt "$W" ]; do
  for i in "${!per[@]}"; do
    [ "${left[$i]}" -gt 0 ] || continue
    hosts_scattered+=("$i")
    left[$i]=$((left[$i] - 1))
  done
done
host_of() { # rank placement
  if [ "$2" = host ]; then echo "${hosts_host[$1]}"; else echo "${hosts_scattered[$1]}"; fi
}

port=29800
run_ranks() { # impl placement op bytes -> rank 0's JSON row on stdout
  local impl=$1 place=$2 op=$3 bytes=$4 r h pids=() cmd
  port=$((port + 1))
  for r in $(seq $((W - 1)) -1 0); do
    h=$(host_of "$r" "$place")
    local env=(RANK=$r WORLD_SIZE=$W MASTER_ADDR=10.215.0.1 MASTER_PORT=$port)
    case $impl in
      uvccl | uvccl-ring | uvccl-rank | uvccl-b | uvccl-s* | uvccl-gpu*)
        local bin=$ROOT/build/bin/uvccl-bench gpu=()
        env+=(UVCCL_HOST_ID=h$h UVCCL_SOCKET_IFNAME=eth0)
        case $impl in
          uvccl-ring | uvccl-rank) env+=(UVCCL_RING_ORDER=${impl#uvccl-}) ;;
          uvccl-s*) env+=(UVCCL_TCP_STRIPES=${impl#uvccl-s}) ;;
          uvccl-b) bin=${BENCH_B:?uvccl-b needs BENCH_B} ;;
          uvccl-gpu) gpu=(--gpu) ;;
          uvccl-gpu*) gpu=(--gpu); env+=(UVCCL_STAGE_CHUNK=$((${impl#uvccl-gpu} * 1024))) ;;
        esac
        cmd=("$bin" --op "$op" -b "$bytes" -e "$bytes" "${gpu[@]}"
          "${N[@]}" --json --timeout 300) ;;
      gloo)
        env+=(GLOO_SOCKET_IFNAME=eth0)
        cmd=(/usr/bin/python3 "$ROOT/bench/coll/gloo_bench.py" --env --world "$W"
          --op "$op" -b "$bytes" -e "$bytes" "${N[@]}" --json) ;;
    esac
    ip netns exec "$TAG$h" env "${env[@]}" ${WRAP:-} "${cmd[@]}" \
      > "$TMP/out.$r" 2> "$TMP/err.$r" &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "cluster.sh: a rank of $impl failed:" >&2; cat "$TMP"/err.* >&2; return 1; }
  grep '^{' "$TMP/out.0" | head -n 1
}

run_tcp() { # impl op bytes -> host 0's JSON row (no placement: one process a host)
  local impl=$1 op=$2 bytes=$3 wire h pids=() streams=${1#tcp}
  # what the busiest host's link must carry: the summary's share (below)
  case $op in
    allreduce) wire=$(( bytes * 2 * (H - 1) / H )) ;;
    allgather | reduce_scatter) wire=$(( bytes * (W - min_per) / W )) ;;
    broadcast) wire=$bytes ;;
    *) echo '{"time_us":null}'; return 0 ;;
  esac
  port=$((port + 2))
  for h in $(seq $((H - 1)) -1 0); do
    ip netns exec "$TAG$h" /usr/bin/python3 "$ROOT/bench/cluster/tcp_ring.py" \
      --host "$h" --hosts "$H" --port "$port" --op "$op" --size "$bytes" \
      --bytes "$wire" --streams "${streams:-1}" "${N[@]}" --json \
      > "$TMP/out.$h" 2> "$TMP/err.$h" &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "cluster.sh: tcp_ring failed:" >&2; cat "$TMP"/err.* >&2; return 1; }
  grep '^{' "$TMP/out.0" | head -n 1
}

run_mpi() { # placement op bytes
  local place=$1 op=$2 bytes=$3 hosts="" i map
  for i in $(seq 0 $((H - 1))); do hosts+="${hosts:+,}10.215.0.$((i + 1)):${per[$i]}"; done
  # the agent: "agent [options] HOST CMD..." enters HOST's network
  # namespace, and a UTS namespace with a host name of its own (Open MPI
  # names its session directories and shared-memory files after it: two
  # "hosts" called alike would open each other's)
  cat > "$TMP/agent" << AG
#!/bin/bash
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
n=\$(( \${host##*.} - 1 ))
exec ip netns exec $TAG\$n unshare --uts /bin/sh -c "hostname $TAG-h\$n && \$*"
AG
  chmod +x "$TMP/agent"
  map=slot
  [ "$place" = scattered ] && map=node
  ip netns exec "${TAG}0" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --host "$hosts" -np "$W" --map-by "$map" \
    --mca plm_rsh_agent "$TMP/agent" --mca btl self,vader,tcp \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    --mca pml ob1 --mca mpi_yield_when_idle 1 \
    ${WRAP:-} "$TMP/mpi_bench" --op "$op" -b "$bytes" -e "$bytes" "${N[@]}" --json \
    > "$TMP/mpi.out" 2> "$TMP/mpi.err" ||
    { echo "cluster.sh: mpirun failed:" >&2; cat "$TMP/mpi.err" >&2; return 1; }
  grep '^{' "$TMP/mpi.out" | head -n 1
}

to_bytes() { numfmt --from=iec "$1"; }
impls=()
for i in $IMPLS; do
  case $i in
    gloo) [ $have_gloo = 1 ] && impls+=(gloo) || echo "# gloo: no PyTorch for /usr/bin/python3, left out" ;;
    openmpi) [ $have_mpi = 1 ] && impls+=(openmpi) || echo "# openmpi: mpicc/mpirun not installed (openmpi-bin, libopenmpi-dev), left out" ;;
    *) impls+=("$i") ;;
  esac
done

for p in $(seq 1 "$PASSES"); do
  for place in $PLACES; do
    for op in $OPS; do
      for s in $SIZES; do
        b=$(to_bytes "$s")
        for impl in "${impls[@]}"; do
          if [ "$impl" = openmpi ]; then row=$(run_mpi "$place" "$op" "$b") || exit 1
          elif [[ $impl == tcp* ]]; then row=$(run_tcp "$impl" "$op" "$b") || exit 1
          else row=$(run_ranks "$impl" "$place" "$op" "$b") || exit 1; fi
          echo "{\"impl2\":\"$impl\",\"place\":\"$place\",\"pass\":$p,${row#\{}" >> "$TMP/rows.jsonl"
        done
      done
    done
  done
done

[ -n "${ROWS:-}" ] && cp "$TMP/rows.jsonl" "$ROWS"
if [ -n "$SHAPE" ]; then shape="hosts of ${per[*]} ranks"; else shape="$H hosts x $L ranks"; fi
echo "# bench/cluster/cluster.sh: $shape, links $RATE each way (tc tbf),"
[ "$LOSS_PM" = 0 ] || echo "# host $LOSS_HOST's link drops $LOSS% of the packets each way (nftables numgen, $([ "$LOSS_AT" = wire ] && echo "on the wire" || echo "in the host's stack"))"
echo "# TCP congestion control: ${CC:-$(sysctl -n net.ipv4.tcp_congestion_control)}"
[ "$DELAY_US" = 0 ] || echo "# every host's link holds what it sends $DELAY_US us (delay.c, NFQUEUE): round trips of $((2 * DELAY_US)) us and more"
echo "# uvccl $(git -C "$ROOT" rev-parse --short HEAD); $PASSES passes of $ITERS timed iterations (median); $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs"
python3 - "$TMP/rows.jsonl" "${per[*]}" "$RATE" "${impls[*]}" << 'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
per = [int(x) for x in sys.argv[2].split()]
H, P = len(per), sum(per)
rate = sys.argv[3]
unit = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
num = rate.rstrip("abcdefghijklmnopqrstuvwxyz")
bps = float(num) * unit[rate[len(num):].lower()]
impls = sys.argv[4].split()
# what the busiest host's link must carry: an allgather brings the host of
# fewest ranks the others' blocks ((P - L)/P of the whole; (H-1)/H for
# hosts alike), a reduce_scatter the mirror
share = {"allreduce": 2 * (H - 1) / H, "allgather": (P - min(per)) / P,
         "reduce_scatter": (P - min(per)) / P, "broadcast": 1.0}
cells = {}
bad = 0
for r in rows:
    if r.get("time_us") is None:
        continue  # the op is not there (1.13's Gloo has no reduce_scatter)
    cells.setdefault((r["op"], r["bytes"], r["place"]), {}).setdefault(
        r["impl2"], []).append(r["time_us"] / 1e3)
    if not r.get("ok", True):
        bad += 1
def label(b):
    if b >= 1 << 20:
        return f"{b >> 20} MiB"
    return f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"
def ms(v):  # small messages take microseconds: keep three figures
    return f"{v:.0f}" if v >= 10 else f"{v:.3g}"
# with tcp (plain TCP, one connection a host pair) in the run: how far
# uvccl is from what TCP itself moves, and the most that any library over
# TCP could lead the best other one by (the best other's time over tcp's)
floor = "tcp" in impls
print()
print("| op | size | placement | link limit ms | " +
      " | ".join(f"{i} ms" for i in impls) + " | uvccl vs best other |" +
      (" uvccl / tcp | room vs best other |" if floor else ""))
print("|---|---:|---|---:|" + "---:|" * len(impls) + "---:|" +
      ("---:|---:|" if floor else ""))
for (op, b, place) in sorted(cells):
    c = cells[(op, b, place)]
    lim = share.get(op, 1.0) * b * 8 / bps * 1e3
    med = {i: statistics.median(c[i]) for i in impls if i in c}
    others = [med[i] for i in med if not i.startswith(("uvccl", "tcp"))]
    vs = f"{min(others) / med['uvccl']:.2f}x" if others and "uvccl" in med else "-"
    tail = ""
    if floor:
        t = med.get("tcp")
        tail = (f" {med['uvccl'] / t:.2f} |" if t and "uvccl" in med else " - |") + \
               (f" {min(others) / t:.2f}x |" if t and others else " - |")
    print(f"| {op} | {label(b)} | {place} | {ms(lim)} | " +
          " | ".join(ms(med[i]) if i in med else "-" for i in impls) +
          f" | {vs} |" + tail)
if bad:
    print(f"\n{bad} rows failed their result check")
    sys.exit(1)
PY
