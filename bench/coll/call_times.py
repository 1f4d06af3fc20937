#!/usr/bin/env python3
"""Sums bench/coll/call_times.c's files: one table of the system calls'
CPU times by kind and size for each folder given (a build's, from
bench/coll/loop_lag.sh with CALL_TIMES=1).

Usage: bench/coll/call_times.py DIR [DIR ...]
"""
import glob
import os
import sys

CLASSES = ["16-64 KiB", "64-128 KiB", "128-256 KiB", "256-384 KiB",
           "384-512 KiB", "512 KiB", "over 512 KiB"]
BUCKETS = ["<0.25", "<0.5", "<1", "<2", "<4", "<8", ">=8"]


def read(folder):
    cells = {}
    for path in glob.glob(os.path.join(folder, "*.txt")):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) != 6 + len(BUCKETS):
                    continue
                key = (p[0], int(p[1]))
                c = cells.setdefault(key, [0, 0, 0, 0, [0] * len(BUCKETS)])
                c[0] += int(p[2])
                c[1] += int(p[3])
                c[2] = max(c[2], int(p[4]))
                c[3] = max(c[3], int(p[5]))
                for i in range(len(BUCKETS)):
                    c[4][i] += int(p[6 + i])
    return cells


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for folder in sys.argv[1:]:
        cells = read(folder)
        print(f"\n{folder}: system calls by CPU time (ms)\n")
        print("| call | bytes moved | calls | mean us | max ms (CPU) | max ms (wall) | "
              + " | ".join(BUCKETS) + " | 2 ms or more |")
        print("|---|---|" + "---:|" * (5 + len(BUCKETS)))
        for (kind, cl), c in sorted(cells.items()):
            over = sum(c[4][4:])
            print(f"| {kind} | {CLASSES[cl]} | {c[0]} | {c[1] / c[0] / 1e3:.0f} | "
                  f"{c[2] / 1e6:.2f} | {c[3] / 1e6:.2f} | "
                  + " | ".join(str(x) for x in c[4]) + f" | {over} |")


if __name__ == "__main__":
    main()
