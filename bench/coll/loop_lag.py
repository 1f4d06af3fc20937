#!/usr/bin/env python3
"""Summarizes bench/coll/loop_lag.sh's raw.jsonl: per world size,
transport, collective, size and build, the worst job (the MAX over jobs of
each figure; op time: the median over jobs of each job's median, and the
worst op), as a Markdown table. Times in ms; steal: the most CPU time the
hypervisor took from the machine during one of those jobs (both CPUs)."""
import json
import statistics
import sys
from collections import defaultdict

cells = defaultdict(list)
order = []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    key = (r["world"], r["transport"], r["op"], r["mib"], r.get("build", "uvccl"))
    if key not in cells:
        order.append(key)
    cells[key].append(r)

print("| W | transport | op | MiB | build | jobs | lag p99 | lag max | os max | "
      "own p99 | own max | cb wall max | cb cpu max | cb >2 ms cpu | "
      "steady cb cpu max | steady >2 ms | "
      "MiB/cb | op ms (median) | op ms (worst) | steal ms | ok |")
print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "---:|---:|---:|---:|---:|---|")
for key in order:
    rs = cells[key]
    w, t, op, mib, build = key
    mx = lambda k: max(r[k] for r in rs)
    mxs = lambda k, alt: max(r.get(k, r[alt]) for r in rs)
    print("| %d | %s | %s | %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | "
          "%.2f | %.2f | %d | %.2f | %d | %.2f | %.1f | %.1f | %d | %s |" % (
              w, t, op, mib, build, len(rs), mx("lag_p99"), mx("lag_max"),
              mx("os_max"), mx("own_p99"), mx("own_max"),
              mx("cb_wall_max"), mx("cb_cpu_max"), mx("cb_over_2ms"),
              mxs("cb_cpu_max_steady", "cb_cpu_max"),
              mxs("cb_over_2ms_steady", "cb_over_2ms"),
              mx("cb_max_mib"), statistics.median(r["op_med"] for r in rs),
              mx("op_max"), max(r.get("steal_ms", 0) for r in rs),
              "exact" if all(r["ok"] for r in rs) else "WRONG"))

# --probe: the control beside uvccl's callbacks (bench/coll/loop_lag.c),
# summed over every cell, job and rank of a world size, transport and build
groups = defaultdict(lambda: defaultdict(float))
gorder = []
for key in order:
    for r in cells[key]:
        if "probes" not in r:
            continue
        g = key[:2] + key[4:]
        if g not in groups:
            gorder.append(g)
        s = groups[g]
        for k in ("probes", "probe_cpu_ms", "probes_over_1ms", "probes_over_2ms",
                  "cbs_all", "cb_cpu_ms", "cbs_over_1ms", "cbs_over_2ms"):
            s[k] += r[k]
        s["probe_max"] = max(s["probe_max"], r["probe_max"])
        s["probe_us"] = r["probe_us"]
if gorder:
    print("\nThe probe: a fixed piece of arithmetic on the loop at each tick, "
          "timed on the thread's CPU clock like uvccl's callbacks; over 2 ms "
          "a CPU second: how often each went over 2 ms of CPU, per second of "
          "the CPU time it ran.\n")
    print("| W | transport | build | probe us | probes | their CPU s | probes >=1 ms | "
          ">=2 ms | longest probe | over 2 ms a CPU second | uvccl callbacks | their CPU s | "
          ">=1 ms | >=2 ms | over 2 ms a CPU second |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for g in gorder:
        s = groups[g]
        pr = s["probes_over_2ms"] / (s["probe_cpu_ms"] / 1e3) if s["probe_cpu_ms"] else 0
        cr = s["cbs_over_2ms"] / (s["cb_cpu_ms"] / 1e3) if s["cb_cpu_ms"] else 0
        print("| %d | %s | %s | %d | %d | %.2f | %d | %d | %.2f | %.3f | %d | %.2f | %d | %d | %.3f |" % (
            g[0], g[1], g[2], s["probe_us"], s["probes"], s["probe_cpu_ms"] / 1e3,
            s["probes_over_1ms"], s["probes_over_2ms"], s["probe_max"], pr,
            s["cbs_all"], s["cb_cpu_ms"] / 1e3, s["cbs_over_1ms"], s["cbs_over_2ms"], cr))
