#!/bin/bash
# bench/coll/long_turns.sh - what ran inside the loop's long callbacks.
#
# A callback's CPU time (the thread's clock, uvccl_loop_stats_t) counts
# more than uvccl's work: on a kernel built without
# CONFIG_IRQ_TIME_ACCOUNTING, every hard and soft interrupt handled while
# the thread is on a CPU is charged to the thread, among them the network
# stack's softirqs, which on the loopback deliver every rank's packets. This
# runs bench/coll/loop_lag.c once with a kernel trace of the interrupts, the
# thread switches and the page faults (tracefs, clock "mono", the clock of
# uv_hrtime), and bench/coll/long_turns.py splits each callback that took
# 2 ms of CPU or more ("a long turn" in uvccl's debug log) into what the
# interrupts took and what is left: the thread's own work, in uvccl and in
# its system calls.
#
# Usage: bench/coll/long_turns.sh [TAG]      (root: it writes to tracefs)
# Environment (defaults): W=4 TRANSPORT=tcp OPS=all SIZES=16M,64M,256M
#   JOBS=1 BUF_KB=262144 (the trace buffer a CPU)
#   BIN=build/bench/uvccl-loop-lag  KEEP= (1: keep each job's trace text)
# Output: bench/coll/out/TAG/{jobJ.txt,stderrJ.log,long_turns.md,
#   trace-stats.txt[,traceJ.txt]}
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TAG=${1:-long-turns-$(date +%Y%m%d-%H%M%S)}
OUT=$ROOT/bench/coll/out/$TAG
W=${W:-4}
TRANSPORT=${TRANSPORT:-tcp}
OPS=${OPS:-all}
SIZES=${SIZES:-16M,64M,256M}
JOBS=${JOBS:-1}
BUF_KB=${BUF_KB:-262144}
BIN=${BIN:-$ROOT/build/bench/uvccl-loop-lag}
RUN=$ROOT/build/bin/uvccl-run
T=/sys/kernel/tracing

if [ ! -w "$T/trace" ]; then
  echo "long_turns: needs root and tracefs at $T" >&2
  exit 1
fi
[ -x "$BIN" ] && [ -x "$RUN" ] || make -C "$ROOT" >/dev/null
mkdir -p "$OUT"

EVENTS="sched:sched_switch irq:irq_handler_entry irq:irq_handler_exit
irq:softirq_entry irq:softirq_exit exceptions:page_fault_user
exceptions:page_fault_kernel"
for v in local_timer call_function call_function_single reschedule irq_work \
         x86_platform_ipi error_apic spurious_apic thermal_apic; do
  EVENTS="$EVENTS irq_vectors:${v}_entry irq_vectors:${v}_exit"
done

# what the tracer was set to, given back at exit
old_clock=$(sed 's/.*\[\(.*\)\].*/\1/' "$T/trace_clock")
old_kb=$(sed 's/ .*//' "$T/buffer_size_kb")
old_on=$(cat "$T/tracing_on")
old_events=$(cat "$T/set_event")
restore() {
  echo 0 > "$T/tracing_on"
  : > "$T/set_event"
  : > "$T/trace"
  echo "$old_kb" > "$T/buffer_size_kb"
  echo "$old_clock" > "$T/trace_clock"
  for e in $old_events; do echo "$e" >> "$T/set_event"; done
  echo "$old_on" > "$T/tracing_on"
}
trap restore EXIT

tenv=""
[ "$TRANSPORT" = tcp ] && tenv="UVCCL_TRANSPORT=tcp"
: > "$OUT/long_turns.md"
: > "$OUT/trace-stats.txt"
for J in $(seq 1 "$JOBS"); do
  echo 0 > "$T/tracing_on"
  : > "$T/set_event"
  echo mono > "$T/trace_clock"
  echo "$BUF_KB" > "$T/buffer_size_kb"
  : > "$T/trace"
  for e in $EVENTS; do
    grep -qx "$e" "$T/available_events" && echo "$e" >> "$T/set_event"
  done
  echo "== W=$W $TRANSPORT job $J" >&2
  s0=$(awk '/^cpu /{print $9}' /proc/stat)
  echo 1 > "$T/tracing_on"
  env $tenv UVCCL_LOG=debug "$RUN" -n "$W" --no-prefix "$BIN" --op "$OPS" \
    --sizes "$SIZES" > "$OUT/job$J.txt" 2> "$OUT/stderr$J.log"
  echo 0 > "$T/tracing_on"
  s1=$(awk '/^cpu /{print $9}' /proc/stat)
  {
    echo "job $J: stolen by the hypervisor $(( (s1 - s0) * 1000 / $(getconf CLK_TCK) )) ms"
    for c in "$T"/per_cpu/cpu*; do
      echo "$(basename "$c"): $(grep -E '^(entries|overrun):' "$c/stats" | tr '\n' ' ')"
    done
  } >> "$OUT/trace-stats.txt"
  tr=$T/trace
  if [ -n "${KEEP:-}" ]; then cat "$T/trace" > "$OUT/trace$J.txt"; tr=$OUT/trace$J.txt; fi
  { echo "## W=$W, $TRANSPORT, job $J"; echo;
    /usr/bin/python3 "$ROOT/bench/coll/long_turns.py" "$OUT/stderr$J.log" "$tr"
    echo; } >> "$OUT/long_turns.md"
done
cat "$OUT/trace-stats.txt" "$OUT/long_turns.md"
