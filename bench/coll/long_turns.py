#!/usr/bin/python3
"""What ran inside each long callback of a loop_lag run (bench/coll/long_turns.sh).

    long_turns.py STDERR_LOG TRACE

STDERR_LOG: the ranks' stderr with UVCCL_LOG=debug, whose "a long turn"
lines give each callback of 2 ms of CPU or more: its site, its CPU and
wall-clock time, its start (uv_hrtime, seconds) and its thread. TRACE: the
text of a tracefs trace of the same run (clock "mono"), with the events
sched_switch, irq_handler_*, softirq_*, irq_vectors:*_entry/exit and
page_fault_*. Prints a Markdown table: for each long callback, the time its
thread was on a CPU inside it, what the interrupts handled there took
(charged to the thread where the kernel has no IRQ time accounting), and
what is left, the thread's own work (uvccl's, and its system calls').
"Longest silence": the longest stretch inside the callback with no event
at all on the thread's CPU; past one timer tick (4 ms at HZ=250) the
virtual CPU missed its tick, i.e. did not run guest code for about that
long, time the hypervisor held it that the thread's clock still counts.
"""
import bisect
import re
import sys

TURN = re.compile(r"uvccl\[rank (\d+)\] debug loop: a long turn: (\w+), "
                  r"([\d.]+) ms of CPU \(([\d.]+) ms on the clock, from "
                  r"([\d.]+) s\), (\d+) bytes, thread (\d+)")
LINE = re.compile(r"^\s*(.*?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(\d+)\]\s+"
                  r"(?:\S+\s+)?([\d.]+):\s+(\w+):\s?(.*)$")
SWITCH = re.compile(r"prev_pid=(\d+).*==> next_comm=.* next_pid=(\d+)")
SOFTIRQ = re.compile(r"action=(\w+)")
IRQ = re.compile(r"name=(\S+)")


def turns_of(path):
    turns = []
    with open(path, errors="replace") as f:
        for line in f:
            m = TURN.search(line)
            if not m:
                continue
            t0 = float(m.group(5))
            wall = float(m.group(4)) / 1e3
            turns.append(dict(rank=int(m.group(1)), site=m.group(2),
                              cpu=float(m.group(3)), wall=wall * 1e3,
                              t0=t0, t1=t0 + wall, bytes=int(m.group(6)),
                              tid=int(m.group(7)), oncpu=0.0, faults=0,
                              silent=0.0, cat={}))
    return turns


class Windows:
    """The long turns of one thread, by start, to find those an interval
    overlaps."""

    def __init__(self, turns):
        self.turns = sorted(turns, key=lambda t: t["t0"])
        self.starts = [t["t0"] for t in self.turns]
        self.longest = max((t["t1"] - t["t0"] for t in self.turns), default=0)

    def add(self, a, b, key):
        if b <= a:
            return
        i = bisect.bisect_right(self.starts, b)
        lo = a - self.longest
        while i > 0 and self.starts[i - 1] >= lo:
            i -= 1
            t = self.turns[i]
            d = min(b, t["t1"]) - max(a, t["t0"])
            if d <= 0:
                continue
            if key == "oncpu":
                t["oncpu"] += d
            elif key == "silent":
                t["silent"] = max(t["silent"], d)
            else:
                t["cat"][key] = t["cat"].get(key, 0.0) + d

    def fault(self, ts):
        i = bisect.bisect_right(self.starts, ts)
        while i > 0:
            i -= 1
            t = self.turns[i]
            if t["t0"] < ts - self.longest:
                break
            if t["t0"] <= ts <= t["t1"]:
                t["faults"] += 1


def scan(trace, wins):
    stack = {}      # cpu -> [[key, start, child time]]
    oncpu = {}      # tid -> since when it runs
    last = {}       # cpu -> (time of its last event, the task then)
    with open(trace, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                continue
            m = LINE.match(line)
            if not m:
                continue
            pid, cpu, ts, ev, rest = (int(m.group(2)), int(m.group(3)),
                                      float(m.group(4)), m.group(5),
                                      m.group(6))
            # a stretch with no event at all on a CPU that runs one of
            # the threads: not even its timer tick (HZ), so the virtual
            # CPU did not run guest code then, whatever the thread's
            # clock says
            prev = last.get(cpu)
            if prev is not None and prev[1] in wins:
                wins[prev[1]].add(prev[0], ts, "silent")
            last[cpu] = (ts, pid)
            if ev == "sched_switch":
                s = SWITCH.search(rest)
                if not s:
                    continue
                prev, nxt = int(s.group(1)), int(s.group(2))
                if prev in wins and prev in oncpu:
                    wins[prev].add(oncpu.pop(prev), ts, "oncpu")
                if nxt in wins:
                    oncpu[nxt] = ts
                continue
            if ev.startswith("page_fault"):
                if pid in wins:
                    wins[pid].fault(ts)
                continue
            if ev.endswith("_entry"):
                if ev == "softirq_entry":
                    a = SOFTIRQ.search(rest)
                    key = "softirq " + (a.group(1) if a else "?")
                elif ev == "irq_handler_entry":
                    a = IRQ.search(rest)
                    key = "irq " + (a.group(1) if a else "?")
                else:
                    key = "irq " + ev[:-len("_entry")]
                stack.setdefault(cpu, []).append([key, ts, 0.0])
            elif ev.endswith("_exit"):
                st = stack.get(cpu)
                if not st:
                    continue  # entered before the trace began
                key, t0, child = st.pop()
                if st:
                    st[-1][2] += ts - t0
                if pid in wins:
                    # the part not spent in nested handlers: charge that
                    # only, spread over the interval (good to a few us)
                    span = ts - t0
                    if span > 0 and child < span:
                        wins[pid].add(t0 + child, ts, key)
    # a thread still on a CPU when the trace stopped
    for tid, since in oncpu.items():
        wins[tid].add(since, since + 1e9, "oncpu")


def main():
    turns = turns_of(sys.argv[1])
    if not turns:
        print("no long turns in %s" % sys.argv[1])
        return
    by_tid = {}
    for t in turns:
        by_tid.setdefault(t["tid"], []).append(t)
    wins = {tid: Windows(ts) for tid, ts in by_tid.items()}
    scan(sys.argv[2], wins)
    print("| rank | site | KiB | CPU ms | on a CPU ms | interrupts ms "
          "| of which network softirqs | page faults | longest silence ms "
          "| own ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    own_over = 0
    own_max = 0.0
    totals = {}
    for t in sorted(turns, key=lambda t: -t["cpu"]):
        irq = sum(t["cat"].values()) * 1e3
        net = sum(v for k, v in t["cat"].items()
                  if k in ("softirq NET_RX", "softirq NET_TX")) * 1e3
        for k, v in t["cat"].items():
            totals[k] = totals.get(k, 0.0) + v * 1e3
        own = max(t["cpu"] - irq, 0.0)
        own_max = max(own_max, own)
        own_over += own >= 2.0
        print("| %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %d | %.2f | %.2f |"
              % (t["rank"], t["site"], t["bytes"] // 1024, t["cpu"],
                 t["oncpu"] * 1e3, irq, net, t["faults"], t["silent"] * 1e3,
                 own))
    print()
    print("%d callbacks of 2 ms of CPU or more; without the interrupts "
          "handled inside them, %d (the longest %.2f ms)." % (
              len(turns), own_over, own_max))
    print("Interrupt time inside them, by handler (ms): " + ", ".join(
        "%s %.2f" % (k, v) for k, v in sorted(totals.items(),
                                              key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
