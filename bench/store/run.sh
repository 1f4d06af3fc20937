#!/bin/bash
# bench/store/run.sh - the store benchmark, side by side, on one machine.
#
# Servers (all on 127.0.0.1, loopback traffic only, each stopped by its pid):
#   uvccl       build/bin/uvccl-store serve (this repository), both dialects
#   torch-1.13  PyTorch 1.13's TCPStore server (legacy backend), via
#               /usr/bin/python3 bench/store/torch_server.py
#   bare-epoll  bench/store/bare_epoll.c: an epoll loop that answers every
#               request with a canned reply and stores nothing (the floor)
#   redis       redis-server 7 (no persistence) under redis-benchmark: a
#               reference for a mature single-threaded in-memory server
#
# Steps (STEPS, default "load rate idle rdv stall redis"):
#   load   the same closed-loop load from uvccl-store-bench against uvccl
#          (legacy and modern dialects), torch-1.13 (legacy) and bare-epoll
#          (both): ops set, get, add, waitget at 1, 64, 1000, 4000
#          connections, and add at 8000; REPEAT passes, and in each, for
#          every op and connection count, every server in turn (the order
#          rotating from pass to pass), so that a drifting machine hits all
#          servers alike. --server-pid gives the server's CPU time per op
#          (utime+stime from /proc/PID/stat).
#   rate   open loop: ADD at RATE_CONNS (8000) connections at a set offered
#          rate (RATES: 10k, 25k, 50k ops/s, evenly spaced, the
#          connections in turn; latency counted from when each operation
#          was due), the same servers: what a server that is not saturated
#          pays per operation, which is where a poll() loop's scan of
#          every connection shows (in the closed loop each poll() returns
#          hundreds of ready connections and the scan is shared by them).
#   idle   ADD at 1 and 64 active connections while IDLE_N (8,000) more are
#          open and idle (bench/store/idle_conns.py; like the idle second
#          connection of every 1.13 client): what a poll() loop pays per
#          wake-up for every connection, busy or not. Fresh servers.
#   rdv    1,024 connections rendezvous (each ADDs a counter, the one that
#          reaches 1,024 SETs "done", all WAIT for it), uvccl and torch-1.13
#   stall  ADD at 64 connections while one more client sends a lone opcode
#          byte and stalls: (a) for 2 s, then finishes its request; (b) for
#          good (bench --timeout 1000 turns a stalled server into errors).
#          Each against a fresh server, after a run without the stall.
#   redis  redis-benchmark -t set,get,incr at the same concurrencies (incr
#          also at 8000), one test per invocation so that redis-server's
#          CPU per request can be read from /proc around it.
#
# Usage: bench/store/run.sh [TAG]   (or `make bench-store`)
# Output: a table on stdout; raw JSON lines (one per run) in
# bench/store/out/results-TAG.jsonl, the log in out/run-TAG.log, the
# Markdown tables in out/tables-TAG.md. Environment knobs (defaults):
#   DURATION=1.5 WARMUP=0.5 REPEAT=3 CONNS="1 64 1000 4000" ADD_EXTRA=8000
#   OPS="set get add waitget" STEPS="load rate idle rdv stall redis"
#   RATE_CONNS=8000 RATES="10000 25000 50000" IDLE_N=8000
#   RDV=1024 RDV_REPS=5 SOMAXCONN=16384 NICE=-10 PIN=1 SERVER_CPU=0
#   CLIENT_CPU=1 QUIET_MAX=0.3 QUIET_WAIT=10 QUIET_BUDGET=240 TAG=<date>
# The server runs on one core and the load generator on the other (taskset;
# PIN=0: no pinning), so that placement is the same for every server and
# every run (unpinned, a 1-connection ping-pong is bimodal: both ends on one
# core or not). Other work on the machine distorts a 2-core measurement,
# so (1) servers, bench, redis-benchmark and the stall client run at nice
# $NICE (root can lower it; elsewhere `nice` fails and NICE=0 must be used),
# and (2) before each run the script waits up to QUIET_WAIT s (QUIET_BUDGET
# s in all) for a 0.3 s sample in which the machine's busy CPUs are at most
# QUIET_MAX; every JSON line records "quiet_wait_s", "busy_before" and
# "other_cpu_s" (CPU used during the run by anything but the server and the
# load generator). bench/store/summarize.py turns the JSON lines into the
# tables (medians over passes; target checks on ratios paired per pass).
# Takes about 10-15 minutes on a 2-vCPU machine.
# The whole script is one function, parsed before it runs: editing this
# file while it runs cannot derail the run in progress.
main() {
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/store
OUT=$HERE/out
DURATION=${DURATION:-1.5}
WARMUP=${WARMUP:-0.5}
REPEAT=${REPEAT:-3}
CONNS=${CONNS:-"1 64 1000 4000"}
ADD_EXTRA=${ADD_EXTRA:-8000}
OPS=${OPS:-"set get add waitget"}
STEPS=${STEPS:-"load rate idle rdv stall redis"}
RATE_CONNS=${RATE_CONNS:-8000}
RATES=${RATES:-"10000 25000 50000"}
IDLE_N=${IDLE_N:-8000}
RDV=${RDV:-1024}
RDV_REPS=${RDV_REPS:-5}
WANT_SOMAXCONN=${SOMAXCONN:-16384}
NICE=${NICE:--10}          # servers and load generators run at this nice level
PIN=${PIN:-1}              # 1: servers on CPU SERVER_CPU, load on CLIENT_CPU
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
QUIET_MAX=${QUIET_MAX:-0.3}  # CPUs busy at most, before a run starts ...
QUIET_WAIT=${QUIET_WAIT:-10} # ... waiting for that at most this many seconds
QUIET_BUDGET=${QUIET_BUDGET:-240} # in all (then: no more waiting)
QUIET_TOTAL=0
TAG=${1:-${TAG:-$(date +%Y%m%d-%H%M%S)}}   # run.sh [TAG]
PY=/usr/bin/python3   # the interpreter that sees Debian's python3-torch
STORE=$OUT/uvccl-store   # a snapshot of build/bin/uvccl-store, see below
LOADGEN=$OUT/uvccl-store-bench # and of build/bench/uvccl-store-bench
BARE=$OUT/bare_epoll
HZ=$(getconf CLK_TCK)

SRV_PFX=(nice -n "$NICE")
CLI_PFX=(nice -n "$NICE")
if [ "$PIN" = 1 ] && [ "$(nproc)" -ge 2 ]; then
  SRV_PFX+=(taskset -c "$SERVER_CPU")
  CLI_PFX+=(taskset -c "$CLIENT_CPU")
fi

mkdir -p "$OUT"
JSON=$OUT/results-$TAG.jsonl
LOG=$OUT/run-$TAG.log
TABLES=$OUT/tables-$TAG.md
: > "$JSON"
: > "$LOG"

log() { echo "$*" | tee -a "$LOG" >&2; }

# ---------------------------------------------------------------- cleanup
PIDS=()
TMPDIRS=()
OLD_SOMAXCONN=""
cleanup() {
  local p
  for p in "${PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 30); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  PIDS=()
  if [ -n "$OLD_SOMAXCONN" ]; then
    sysctl -q -w net.core.somaxconn="$OLD_SOMAXCONN" 2>/dev/null &&
      log "# net.core.somaxconn restored to $OLD_SOMAXCONN"
  fi
  for p in "${TMPDIRS[@]}"; do rm -rf "$p"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Stops one server started by start_server, by its pid.
stop_server() {
  local pid=$1 p keep=()
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 30); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  for p in "${PIDS[@]}"; do [ "$p" != "$pid" ] && keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# start_server NAME CMD...: starts CMD in the background (its own pid, no
# wrapper shell), waits for "listening on HOST:PORT" on its stdout, and sets
# SRV_PID and SRV_PORT.
SRV_SEQ=0
start_server() {
  local name=$1 f
  shift
  SRV_SEQ=$((SRV_SEQ + 1))
  f=$OUT/server-$SRV_SEQ-$name.log
  rm -f "$f"
  "${SRV_PFX[@]}" "$@" > "$f" 2>&1 &
  SRV_PID=$!
  PIDS+=("$SRV_PID")
  for _ in $(seq 300); do
    SRV_PORT=""
    # a complete line only (ends in a newline)
    [ -s "$f" ] && [ -z "$(tail -c 1 "$f")" ] &&
    SRV_PORT=$(sed -n 's/.*listening on .*:\([0-9][0-9]*\).*/\1/p' "$f" 2>/dev/null |
      head -n 1)
    if [ -n "$SRV_PORT" ]; then
      log "# $name: pid $SRV_PID, port $SRV_PORT ($(head -n 1 "$f"))"
      return 0
    fi
    kill -0 "$SRV_PID" 2>/dev/null || break
    sleep 0.1
  done
  log "error: $name did not come up; its output:"
  cat "$f" >&2
  exit 1
}

start_uvccl() { start_server "uvccl$1" "$STORE" serve --host 127.0.0.1 --port 0 --quiet; }
start_torch() { start_server "torch$1" "$PY" "$HERE/torch_server.py" 127.0.0.1 0; }
start_bare()  { start_server "bare$1" "$BARE" --host 127.0.0.1 --port 0; }

# ------------------------------------------------------- CPU bookkeeping
# Machine-wide busy ticks (everything but idle and iowait).
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
# utime+stime ticks of one process (all threads).
proc_ticks() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $12+$13}'; }
# CPU ticks of this shell's reaped children (cutime+cstime).
child_ticks() { sed 's/.*) //' "/proc/$$/stat" | awk '{print $14+$15}'; }
now_s() { date +%s.%N; }

# Waits (at most QUIET_WAIT s) for a 0.3 s sample with at most QUIET_MAX
# CPUs busy; sets QUIET_WAITED (s) and BUSY_BEFORE (CPUs busy, last sample).
wait_quiet() {
  local t0 a b
  t0=$(now_s)
  while :; do
    a=$(machine_busy)
    sleep 0.3
    b=$(machine_busy)
    BUSY_BEFORE=$(awk -v d="$((b - a))" -v hz="$HZ" 'BEGIN{printf "%.2f", d/hz/0.3}')
    QUIET_WAITED=$(awk -v a="$t0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}')
    if awk -v x="$BUSY_BEFORE" -v m="$QUIET_MAX" -v w="$QUIET_WAITED" \
         -v mw="$QUIET_WAIT" -v tot="$QUIET_TOTAL" -v bud="$QUIET_BUDGET" \
         'BEGIN{exit !(x <= m || w >= mw || tot + w >= bud)}'; then
      QUIET_TOTAL=$(awk -v a="$QUIET_TOTAL" -v b="$QUIET_WAITED" 'BEGIN{print a+b}')
      return 0
    fi
  done
}

# --------------------------------------------------------------- one run
# bench_run TEST SERVER PID PORT DIALECT OP CONNS [extra bench args...]
# Runs `uvccl-store-bench --json`, adds "test", "wall_s" and "other_cpu_s"
# (CPU used on the machine during the run by anything but this bench
# process and the server) to its JSON line and appends it to $JSON.
bench_run() {
  local test=$1 server=$2 pid=$3 port=$4 dialect=$5 op=$6 conns=$7
  shift 7
  local m0 s0 c0 t0 m1 s1 c1 t1 rc line other wall err
  err=$OUT/.bench.err
  [ "${SKIP_QUIET:-0}" = 1 ] || wait_quiet
  m0=$(machine_busy); s0=$(proc_ticks "$pid"); c0=$(child_ticks); t0=$(now_s)
  line=$(timeout 300 "${CLI_PFX[@]}" "$LOADGEN" --host 127.0.0.1 --port "$port" \
    --dialect "$dialect" --op "$op" --connections "$conns" \
    --duration "$DURATION" --warmup "$WARMUP" --server-pid "$pid" \
    --label "$server" --json "$@" 2> "$err")
  rc=$?
  m1=$(machine_busy); s1=$(proc_ticks "$pid"); c1=$(child_ticks); t1=$(now_s)
  other=$(awk -v m="$((m1 - m0))" -v s="$((${s1:-$s0} - s0))" \
    -v c="$((c1 - c0))" -v hz="$HZ" 'BEGIN{printf "%.2f", (m-s-c)/hz}')
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
  if [ -n "$line" ]; then
    line="{\"test\":\"$test\",\"rc\":$rc,\"wall_s\":$wall,\"other_cpu_s\":$other,\"rep\":${REP:-1},\"quiet_wait_s\":$QUIET_WAITED,\"busy_before\":$BUSY_BEFORE,${line#\{}"
  else
    line="{\"test\":\"$test\",\"server\":\"$server\",\"dialect\":\"$dialect\",\"op\":\"$op\",\"connections\":$conns,\"rc\":$rc,\"rep\":${REP:-1},\"failed\":true,\"wall_s\":$wall,\"other_cpu_s\":$other,\"quiet_wait_s\":$QUIET_WAITED,\"busy_before\":$BUSY_BEFORE,\"stderr\":$(tail -n 3 "$err" | $PY -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}"
  fi
  echo "$line" >> "$JSON"
  if [ -s "$err" ]; then
    sed 's/^/    | /' "$err" | head -n 6 >> "$LOG"
  fi
  log "  $(echo "$line" | $PY -c '
import json, sys
r = json.loads(sys.stdin.read())
if r.get("failed"):
    print("%-11s %-6s %-8s %5s  FAILED rc=%s %s" % (r["server"], r["dialect"], r["op"], r["connections"], r["rc"], r["stderr"].strip().replace("\n", " / ")))
elif r["op"] == "rendezvous":
    print("%-11s %-6s rdv %5d  median %.2f ms (min %.2f, max %.2f) errors %d  other-cpu %.2fs" % (r["server"], r["dialect"], r["connections"], r["median_ms"], r["min_ms"], r["max_ms"], r["errors"], r["other_cpu_s"]))
else:
    print("%-11s %-6s %-8s %5d  %9.0f ops/s  p50 %8.1f  p99 %9.1f us  srv %6.2f us/op  err %d  other-cpu %.2fs" % (r["server"], r["dialect"], r["op"], r["connections"], r["ops_per_s"], r["p50_us"], r["p99_us"], r.get("server_cpu_us_per_op", -1), r["errors"], r["other_cpu_s"]))
')"
}

# ------------------------------------------------------------------ setup
log "# bench/store/run.sh, tag $TAG, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
log "# building (make) and $BARE"
# (another `make` may be running in the same tree: retry once)
(cd "$ROOT" && make >> "$LOG" 2>&1) || { sleep 10; (cd "$ROOT" && make >> "$LOG" 2>&1); } ||
  { log "error: make failed (see $LOG)"; exit 1; }
# Run a private copy: a `make` elsewhere must not swap the binary mid-run.
cp "$ROOT/build/bin/uvccl-store" "$STORE.tmp" && mv "$STORE.tmp" "$STORE" ||
  { log "error: cannot copy build/bin/uvccl-store"; exit 1; }
cp "$ROOT/build/bench/uvccl-store-bench" "$LOADGEN.tmp" && mv "$LOADGEN.tmp" "$LOADGEN" ||
  { log "error: cannot copy build/bench/uvccl-store-bench"; exit 1; }
GIT_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)
GIT_DIRTY=$(cd "$ROOT" && git status --porcelain -- src include tools Makefile 2>/dev/null | wc -l)
log "# uvccl at git $GIT_REV ($GIT_DIRTY files modified in src/ include/ tools/ Makefile)"
cc -O2 -Wall -o "$BARE" "$HERE/bare_epoll.c" >> "$LOG" 2>&1 ||
  { log "error: cannot build bare_epoll"; exit 1; }

# File descriptors: 8,000 connections need 8,000+ on each side.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
log "# ulimit -n: $(ulimit -n) (hard $(ulimit -Hn))"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 8300 ]; then
  log "warning: ulimit -n $(ulimit -n) is below what 8000 connections need"
fi
# Listen backlog: bench connects 256 at a time, redis-benchmark all at once.
CUR=$(cat /proc/sys/net/core/somaxconn)
if [ "$CUR" -lt "$WANT_SOMAXCONN" ]; then
  if sysctl -q -w net.core.somaxconn="$WANT_SOMAXCONN" 2>/dev/null; then
    OLD_SOMAXCONN=$CUR
    log "# net.core.somaxconn raised from $CUR to $WANT_SOMAXCONN for the run"
  else
    log "# net.core.somaxconn: could not raise it (not permitted); using $CUR"
  fi
fi
SOMAX_USED=$(cat /proc/sys/net/core/somaxconn)
log "# net.core.somaxconn used: $SOMAX_USED; tcp_max_syn_backlog $(cat /proc/sys/net/ipv4/tcp_max_syn_backlog); tcp_tw_reuse $(cat /proc/sys/net/ipv4/tcp_tw_reuse); ip_local_port_range $(tr '\t' ' ' < /proc/sys/net/ipv4/ip_local_port_range)"

TORCH_V=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')
{
  echo "# machine: $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), kernel $(uname -r)"
  echo "# software: $("$STORE" --version), torch $TORCH_V ($(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null)), $(redis-server --version | cut -d' ' -f1-3), $(cc --version | head -n 1)"
  echo "# load: DURATION=$DURATION s after WARMUP=$WARMUP s per run; servers run as '${SRV_PFX[*]}', load generators as '${CLI_PFX[*]}'; loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$LOG" >&2
printf '{"test":"env","git":"%s+%s","nice":%s,"pin":"%s","tag":"%s","nproc":%d,"cpu":"%s","kernel":"%s","uvccl":"%s","torch":"%s","redis":"%s","somaxconn":%d,"ulimit_n":"%s","duration_s":%s,"warmup_s":%s,"loadavg_start":"%s"}\n' \
  "$GIT_REV" "$GIT_DIRTY" "$NICE" "${SRV_PFX[*]:3} / ${CLI_PFX[*]:3}" "$TAG" "$(nproc)" "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" \
  "$(uname -r)" "$("$STORE" --version)" "$TORCH_V" "$(redis-server --version | cut -d' ' -f3)" \
  "$SOMAX_USED" "$(ulimit -n)" "$DURATION" "$WARMUP" "$(cut -d' ' -f1-3 /proc/loadavg)" >> "$JSON"

has_step() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

# The load and rate steps run the same five (server, dialect) pairs against
# one set of servers: start_all starts them and fills SPECS; each_server
# TEST REP OP CONNS [args...] runs one cell on every one of them in turn,
# the order rotating from pass to pass so that a drifting machine hits all
# servers alike.
start_all() {
  start_uvccl "$1"; U_PID=$SRV_PID; U_PORT=$SRV_PORT
  start_torch "$1"; T_PID=$SRV_PID; T_PORT=$SRV_PORT
  start_bare "$1";  B_PID=$SRV_PID; B_PORT=$SRV_PORT
  SPECS=("uvccl $U_PID $U_PORT legacy" "uvccl $U_PID $U_PORT modern"
         "torch-1.13 $T_PID $T_PORT legacy"
         "bare-epoll $B_PID $B_PORT legacy" "bare-epoll $B_PID $B_PORT modern")
}
stop_all() { stop_server "$U_PID"; stop_server "$T_PID"; stop_server "$B_PID"; }
each_server() {
  local test=$1 rep=$2 op=$3 c=$4 k extra
  shift 4
  extra=("$@")
  for k in $(seq 0 $((${#SPECS[@]} - 1))); do
    # shellcheck disable=SC2086
    set -- ${SPECS[$(((k + rep - 1) % ${#SPECS[@]}))]}
    REP=$rep bench_run "$test" "$1" "$2" "$3" "$4" "$op" "$c" "${extra[@]}"
  done
}

# ------------------------------------------------------------------- load
if has_step load; then
  log "## load: ops [$OPS] at [$CONNS] connections (add also at $ADD_EXTRA)"
  start_all ""
  for rep in $(seq "$REPEAT"); do
    log "# pass $rep of $REPEAT"
    for op in $OPS; do
      list=$CONNS
      [ "$op" = add ] && [ -n "$ADD_EXTRA" ] && list="$list $ADD_EXTRA"
      for c in $list; do
        each_server load "$rep" "$op" "$c"
      done
    done
  done
  stop_all
fi

# ------------------------------------------------------------------- rate
if has_step rate; then
  log "## rate: open-loop ADD at [$RATE_CONNS] connections, [$RATES] ops/s offered"
  start_all "-rate"
  for rep in $(seq "$REPEAT"); do
    log "# pass $rep of $REPEAT"
    for c in $RATE_CONNS; do
      for rate in $RATES; do
        each_server rate "$rep" add "$c" --rate "$rate"
      done
    done
  done
  stop_all
fi

# ------------------------------------------------------------------- idle
if has_step idle; then
  log "## idle: ADD at 1 and 64 active connections, $IDLE_N more open and idle"
  for spec in "uvccl legacy" "uvccl modern" "torch-1.13 legacy" "bare-epoll legacy"; do
    set -- $spec
    case $1 in
      uvccl) start_uvccl "-idle" ;;
      torch-1.13) start_torch "-idle" ;;
      bare-epoll) start_bare "-idle" ;;
    esac
    I_SRV=$SRV_PID
    I_PORT=$SRV_PORT
    f=$OUT/idle_conns.out
    rm -f "$f"
    "${CLI_PFX[@]}" $PY "$HERE/idle_conns.py" 127.0.0.1 "$I_PORT" "$IDLE_N" > "$f" 2>> "$LOG" &
    I_PID=$!
    PIDS+=("$I_PID")
    for _ in $(seq 1200); do
      grep -q '^ready' "$f" 2>/dev/null && break
      kill -0 "$I_PID" 2>/dev/null || break
      sleep 0.1
    done
    if grep -q '^ready' "$f" 2>/dev/null; then
      log "# $1: $(cat "$f") idle connections open"
      for c in 1 64; do
        bench_run "idle-$IDLE_N" "$1" "$I_SRV" "$I_PORT" "$2" add "$c"
      done
    else
      log "error: could not open $IDLE_N idle connections to $1 (see $LOG)"
    fi
    stop_server "$I_PID"
    stop_server "$I_SRV"
  done
fi

# ------------------------------------------------------------- rendezvous
if has_step rdv; then
  log "## rendezvous: $RDV connections, $RDV_REPS runs each"
  start_uvccl "-rdv"; U_PID=$SRV_PID; U_PORT=$SRV_PORT
  start_torch "-rdv"; T_PID=$SRV_PID; T_PORT=$SRV_PORT
  bench_run rdv uvccl "$U_PID" "$U_PORT" legacy add "$RDV" --rendezvous "$RDV" --reps "$RDV_REPS"
  bench_run rdv uvccl "$U_PID" "$U_PORT" modern add "$RDV" --rendezvous "$RDV" --reps "$RDV_REPS"
  bench_run rdv torch-1.13 "$T_PID" "$T_PORT" legacy add "$RDV" --rendezvous "$RDV" --reps "$RDV_REPS"
  stop_server "$U_PID"; stop_server "$T_PID"
fi

# ------------------------------------------------------------------ stall
# stall_case NAME DIALECT VARIANT: a fresh server of kind NAME; ADD at 64
# connections with one more client stalling mid-request.
stall_case() {
  local name=$1 dialect=$2 variant=$3 spid args=() sargs=()
  case $name in
    uvccl) start_uvccl "-stall" ;;
    torch-1.13) start_torch "-stall" ;;
  esac
  # The stall runs last 3 s after a 0.5 s warm-up, whatever DURATION is.
  args=(--duration 3 --warmup 0.5)
  case $variant in
    none)
      bench_run stall-none "$name" "$SRV_PID" "$SRV_PORT" "$dialect" add 64 "${args[@]}"
      stop_server "$SRV_PID"
      return ;;
    2s)
      sargs=(--delay 1.0 --hold 2.0 --finish) ;;
    forever)
      sargs=(--delay 1.0 --hold 5.5)
      args+=(--timeout 1000) ;;
  esac
  # The stall client connects at once, and sends its lone opcode byte 1 s
  # later: after bench has connected (a stalled 1.13 server accepts no one)
  # and within the measured window (which starts at WARMUP). The wait for
  # a quiet machine comes first, so that bench starts right after it.
  wait_quiet
  "${CLI_PFX[@]}" $PY "$HERE/stall_client.py" 127.0.0.1 "$SRV_PORT" --dialect "$dialect" \
    "${sargs[@]}" 2>> "$LOG" &
  spid=$!
  PIDS+=("$spid")
  SKIP_QUIET=1 bench_run "stall-$variant" "$name" "$SRV_PID" "$SRV_PORT" "$dialect" add 64 "${args[@]}"
  stop_server "$spid"
  stop_server "$SRV_PID"
}

if has_step stall; then
  log "## stall: ADD at 64 connections, one client stalls after its opcode byte"
  for spec in "uvccl legacy" "uvccl modern" "torch-1.13 legacy"; do
    for variant in none 2s forever; do
      # shellcheck disable=SC2086
      stall_case $spec "$variant"
    done
  done
fi

# ------------------------------------------------------------------ redis
# redis_run TEST C N PORT PID: one redis-benchmark test, CPU of redis-server
# read from /proc around it (so connecting the C clients is included).
redis_run() {
  local t=$1 c=$2 n=$3 port=$4 pid=$5 s0 s1 m0 m1 c0 c1 t0 t1 csv op
  wait_quiet
  m0=$(machine_busy); s0=$(proc_ticks "$pid"); c0=$(child_ticks); t0=$(now_s)
  csv=$(timeout 300 "${CLI_PFX[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -t "$t" -c "$c" \
    -n "$n" -d 16 -P 1 --csv 2>> "$LOG" | tail -n 1)
  m1=$(machine_busy); s1=$(proc_ticks "$pid"); c1=$(child_ticks); t1=$(now_s)
  case $t in incr) op=add ;; *) op=$t ;; esac
  echo "$csv" | $PY -c '
import json, sys
t, c, n, op, ds, dm, dc, hz, wall, qw, bb = sys.argv[1:12]
ds, dm, dc, hz = int(ds), int(dm), int(dc), int(hz)
line = sys.stdin.read().strip()
r = {"test": "redis", "server": "redis", "dialect": "resp", "op": op,
     "redis_test": t.upper(), "connections": int(c), "requests": int(n),
     "wall_s": round(float(wall), 2), "quiet_wait_s": float(qw),
     "busy_before": float(bb)}
try:
    f = [x.strip("\"") for x in line.split(",")]
    rps = float(f[1])
    r.update(ops_per_s=rps, p50_us=float(f[4]) * 1e3, p99_us=float(f[6]) * 1e3,
             max_us=float(f[7]) * 1e3, errors=0,
             server_cpu_s=ds / hz, server_cpu_us_per_op=ds / hz * 1e6 / int(n),
             other_cpu_s=round((dm - ds - dc) / hz, 2))
except Exception as e:
    r.update(failed=True, stderr=line)
print(json.dumps(r))
' "$t" "$c" "$n" "$op" "$((s1 - s0))" "$((m1 - m0))" "$((c1 - c0))" "$HZ" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$QUIET_WAITED" \
    "$BUSY_BEFORE" >> "$JSON"
  log "  $(tail -n 1 "$JSON" | $PY -c '
import json, sys
r = json.loads(sys.stdin.read())
if r.get("failed"):
    print("redis %-5s %5d  FAILED %s" % (r["redis_test"], r["connections"], r["stderr"]))
else:
    print("redis       resp   %-8s %5d  %9.0f ops/s  p50 %8.1f  p99 %9.1f us  srv %6.2f us/op (incl. connect)  other-cpu %.2fs" % (r["op"], r["connections"], r["ops_per_s"], r["p50_us"], r["p99_us"], r["server_cpu_us_per_op"], r["other_cpu_s"]))
')"
}

if has_step redis; then
  log "## redis: redis-benchmark, 16 B values, no pipelining"
  RDIR=$(mktemp -d)
  TMPDIRS+=("$RDIR")
  # redis 7 takes --port 0 as "no TCP": ask the kernel for a free port.
  R_PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "${SRV_PFX[@]}" redis-server --bind 127.0.0.1 --port "$R_PORT" --save "" --appendonly no \
    --dir "$RDIR" --daemonize no --maxclients 10100 \
    --tcp-backlog "$SOMAX_USED" --logfile "$RDIR/redis.log" &
  R_PID=$!
  PIDS+=("$R_PID")
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p "$R_PORT" ping > /dev/null 2>&1 && break
    sleep 0.1
  done
  log "# redis: pid $R_PID, port $R_PORT ($(redis-server --version | cut -d' ' -f1-3))"
  for c in $CONNS; do
    # -n for about DURATION seconds: ~20k req/s with 1 connection,
    # ~100k+ with more.
    if [ "$c" -eq 1 ]; then n=$(awk -v d="$DURATION" 'BEGIN{print int(d*20000)}')
    else n=$(awk -v d="$DURATION" 'BEGIN{print int(d*100000)}'); fi
    for t in set get incr; do
      redis_run "$t" "$c" "$n" "$R_PORT" "$R_PID"
    done
  done
  if [ -n "$ADD_EXTRA" ]; then
    redis_run incr "$ADD_EXTRA" "$(awk -v d="$DURATION" 'BEGIN{print int(d*100000)}')" "$R_PORT" "$R_PID"
  fi
  stop_server "$R_PID"
fi

# ---------------------------------------------------------------- summary
log "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg); raw results: $JSON"
$PY "$HERE/summarize.py" "$JSON" --markdown "$TABLES" | tee -a "$LOG"
log "# Markdown tables: $TABLES"
}

main "$@"
