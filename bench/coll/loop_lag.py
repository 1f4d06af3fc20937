#!/usr/bin/env python3
"""Summarizes bench/coll/loop_lag.sh's raw.jsonl: per world size,
transport, collective and size, the worst job (the MAX over jobs of each
figure; op time: the median over jobs of each job's median, and the worst
op), as a Markdown table. Times in ms."""
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
    key = (r["world"], r["transport"], r["op"], r["mib"])
    if key not in cells:
        order.append(key)
    cells[key].append(r)

print("| W | transport | op | MiB | jobs | lag p99 | lag max | os max | "
      "own p99 | own max | cb wall max | cb cpu max | cb >2 ms cpu | "
      "MiB/cb | op ms (median) | op ms (worst) | ok |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
      "---:|---:|---|")
for key in order:
    rs = cells[key]
    w, t, op, mib = key
    mx = lambda k: max(r[k] for r in rs)
    print("| %d | %s | %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | "
          "%.2f | %.2f | %d | %.2f | %.1f | %.1f | %s |" % (
              w, t, op, mib, len(rs), mx("lag_p99"), mx("lag_max"),
              mx("os_max"), mx("own_p99"), mx("own_max"),
              mx("cb_wall_max"), mx("cb_cpu_max"), mx("cb_over_2ms"),
              mx("cb_max_mib"), statistics.median(r["op_med"] for r in rs),
              mx("op_max"), "exact" if all(r["ok"] for r in rs) else "WRONG"))
