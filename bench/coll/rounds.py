#!/usr/bin/python3
"""bench/coll/rounds.py RAW: the table of bench/coll/rounds.sh's output
(lines "tool round op bytes busbw"): each cell's busbw per round, and the
ratio of uvccl's median (and the old build's, if any) to vader's."""
import statistics
import sys

cells = {}
for line in open(sys.argv[1]):
    tool, _, op, size, bw = line.split()
    cells.setdefault((op, int(size)), {}).setdefault(tool, []).append(float(bw))
tools = [t for t in ("old", "uvccl") if any(t in d for d in cells.values())]
head = ["op", "size"] + ["before" if t == "old" else "uvccl" for t in tools] + ["vader"]
head += ["%s / vader" % ("before" if t == "old" else "uvccl") for t in tools]
print("| " + " | ".join(head) + " |")
print("|---|---:|" + "---|" * (len(tools) + 1) + "---:|" * len(tools))
met = {t: 0 for t in tools}
for (op, size), d in sorted(cells.items()):
    fmt = lambda xs: ", ".join("%.2f" % x for x in xs)
    v = statistics.median(d["vader"])
    row = [op, "%g MiB" % (size / 1048576)] + [fmt(d[t]) for t in tools] + [fmt(d["vader"])]
    for t in tools:
        r = statistics.median(d[t]) / v
        met[t] += r >= 1
        row.append("%.2fx" % r)
    print("| " + " | ".join(row) + " |")
print()
for t in tools:
    print("%s: %d of %d cells at or above vader (medians)" %
          ("before" if t == "old" else "uvccl", met[t], len(cells)))
