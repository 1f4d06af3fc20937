#!/usr/bin/python3
"""bench/coll/ab.py RAW: the table of bench/coll/ab.sh's output (lines
"build round op bytes busbw"): each cell's busbw (GB/s) in every round for
builds A and B, and the ratio of B's median to A's."""
import statistics
import sys

cells = {}
for line in open(sys.argv[1]):
    build, _, op, size, bw = line.split()
    cells.setdefault((op, int(size)), {}).setdefault(build, []).append(float(bw))
print("| op | size | A (busbw, GB/s, each round) | B | B / A (medians) |")
print("|---|---:|---|---|---:|")
ratios = []
for (op, size), d in sorted(cells.items()):
    fmt = lambda xs: ", ".join("%.2f" % x for x in xs)
    if "A" not in d or "B" not in d:
        continue
    r = statistics.median(d["B"]) / statistics.median(d["A"])
    ratios.append(r)
    print("| %s | %g MiB | %s | %s | %.2fx |" % (op, size / 1048576, fmt(d["A"]),
                                               fmt(d["B"]), r))
if ratios:
    print()
    print("B / A over the %d cells: median %.2fx, lowest %.2fx, highest %.2fx" %
          (len(ratios), statistics.median(ratios), min(ratios), max(ratios)))
