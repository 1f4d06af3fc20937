#!/usr/bin/env python3
"""Markdown tables from bench/coll/run.sh's raw results (standard library).

Usage: summarize.py [TAG | DIR]   (default: the newest bench/coll/out/*/)

Reads DIR/IMPL-WN.json (one JSON object per row, as printed by uvccl-bench
--json, gloo_bench.py --json and mpi_bench --json) and prints, per op and
W: the median time (us) per size for uvccl, uvccl busy-poll, gloo, mpi-tcp
and mpi-shm; then the busbw (GB/s) tables; then the targets at W=2, for
both uvccl modes:
  * small allreduce latency, 4 B .. 4 KiB: uvccl / mpi-tcp <= 1x and
    uvccl / gloo <= 0.1x (time ratios, per size; met when every size meets)
  * allreduce busbw at >= 1 MiB: uvccl / mpi-tcp >= 1x and uvccl / gloo
    >= 2x (busbw ratios, per size; met when every size meets)
A cell is "-" when there is no row, "n/a" when the op is unsupported, and
ends in "!" when that row's correctness check failed.
"""
import glob
import json
import math
import os
import re
import sys

IMPLS = ["uvccl", "uvccl-bp", "uvccl-cma", "uvccl-cma-bp", "uvccl-ip", "uvccl-tcp", "uvccl-tcp-bp", "gloo", "mpi-tcp", "mpi-shm"]
HEAD = {"uvccl": "uvccl", "uvccl-bp": "uvccl busy-poll",
        "uvccl-cma": "uvccl single copy",
        "uvccl-cma-bp": "uvccl single copy busy-poll",
        "uvccl-ip": "uvccl in place", "uvccl-tcp": "uvccl TCP only",
        "uvccl-tcp-bp": "uvccl TCP only busy-poll", "gloo": "gloo",
        "mpi-tcp": "mpi-tcp", "mpi-shm": "mpi-shm"}
OP_ORDER = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
            "alltoall", "gather", "scatter", "barrier"]
SMALL = (4, 4096)
LARGE_MIN = 1 << 20


def find_dir(arg):
    here = os.path.dirname(os.path.abspath(__file__))
    if arg is None:
        dirs = [d for d in glob.glob(os.path.join(here, "out", "*")) if os.path.isdir(d)]
        if not dirs:
            sys.exit("summarize.py: no results under %s" % os.path.join(here, "out"))
        return max(dirs, key=os.path.getmtime)
    if os.path.isdir(arg):
        return arg
    d = os.path.join(here, "out", arg)
    if os.path.isdir(d):
        return d
    sys.exit("summarize.py: no such results: %s" % arg)


def load(d):
    rows = {}   # (impl, op, world) -> {bytes: row}
    unsupported = {}
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = re.match(r"(.+)-W(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        impl = m.group(1)
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            key = (impl, r["op"], int(r["world"]))
            if r.get("unsupported"):
                unsupported[key] = r["unsupported"]
                continue
            rows.setdefault(key, {})[int(r["bytes"] or 0)] = r
    return rows, unsupported


def size_name(b):
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return "%d MiB" % (b >> 20)
    if b >= 1 << 10 and b % (1 << 10) == 0:
        return "%d KiB" % (b >> 10)
    return "%d B" % b


def fmt_t(v):
    if v is None:
        return "-"
    if v < 10:
        return "%.2f" % v
    if v < 100:
        return "%.1f" % v
    return "%.0f" % v


def fmt_bw(v):
    return "-" if v is None else "%.2f" % v


def fmt_ratio(v):
    if v is None:
        return "-"
    return "%.3fx" % v if v < 0.1 else "%.2fx" % v


def main():
    d = find_dir(sys.argv[1] if len(sys.argv) > 1 else None)
    rows, unsupported = load(d)
    impls = [i for i in IMPLS if any(k[0] == i for k in list(rows) + list(unsupported))]
    impls += sorted({k[0] for k in list(rows) + list(unsupported)} - set(impls))
    ops = sorted({k[1] for k in list(rows) + list(unsupported)},
                 key=lambda o: OP_ORDER.index(o) if o in OP_ORDER else 99)
    worlds = sorted({k[2] for k in list(rows) + list(unsupported)})
    out = []
    p = out.append

    p("# uvccl CPU collectives vs Gloo and Open MPI (%s)" % os.path.basename(os.path.normpath(d)))
    p("")
    env = os.path.join(d, "env.txt")
    if os.path.exists(env):
        for line in open(env):
            p("    " + line.rstrip())
        p("")
    p("Time = median over iterations of the MAX over ranks (us); busbw in GB/s "
      "(nccl-tests factors); \"!\" = the correctness check failed; \"n/a\" = "
      "unsupported; \"-\" = no row.")
    p("")

    def cell(impl, op, w, b, what):
        if (impl, op, w) in unsupported:
            return "n/a"
        r = rows.get((impl, op, w), {}).get(b)
        if r is None:
            return "-"
        v = r.get(what)
        s = fmt_t(v) if what == "time_us" else fmt_bw(v)
        return s + ("!" if r.get("ok") is False else "")

    def table(what, title):
        for op in ops:
            if what != "time_us" and op == "barrier":
                continue
            for w in worlds:
                sizes = sorted({b for i in impls for b in rows.get((i, op, w), {})})
                if not sizes and not any((i, op, w) in unsupported for i in impls):
                    continue
                p("### %s, W=%d: %s" % (op, w, title))
                p("")
                p("| size | " + " | ".join(HEAD.get(i, i) for i in impls) + " |")
                p("|---:|" + "---:|" * len(impls))
                for b in sizes or [None]:
                    name = "-" if op == "barrier" or b is None else size_name(b)
                    p("| %s | %s |" % (name, " | ".join(cell(i, op, w, b, what) for i in impls)))
                p("")

    p("## Median time (us)")
    p("")
    table("time_us", "median time (us)")
    p("## Bus bandwidth (GB/s)")
    p("")
    table("busbw_gbps", "busbw (GB/s)")

    # ---------------------------------------------------------- targets
    p("## Targets at W=2")
    p("")
    W = 2
    checks = [
        ("small allreduce latency (4 B .. 4 KiB)", "time_us", "mpi-tcp", "<=", 1.0,
         lambda b: SMALL[0] <= b <= SMALL[1]),
        ("small allreduce latency (4 B .. 4 KiB)", "time_us", "gloo", "<=", 0.1,
         lambda b: SMALL[0] <= b <= SMALL[1]),
        ("allreduce busbw (>= 1 MiB)", "busbw_gbps", "mpi-tcp", ">=", 1.0,
         lambda b: b >= LARGE_MIN),
        ("allreduce busbw (>= 1 MiB)", "busbw_gbps", "gloo", ">=", 2.0,
         lambda b: b >= LARGE_MIN),
    ]
    p("Ratios are uvccl / peer at each size (time for latency, busbw for "
      "bandwidth); a target is met when it holds at every size; the geometric "
      "mean is shown for reference.")
    p("")
    p("| target | uvccl mode | vs | per size | geomean | worst | met |")
    p("|---|---|---|---|---:|---:|---|")
    for title, what, peer, cmp, goal, sel in checks:
        for mode in ("uvccl", "uvccl-bp", "uvccl-ip"):
            if mode == "uvccl-ip" and not rows.get((mode, "allreduce", W)):
                continue
            mine = rows.get((mode, "allreduce", W), {})
            theirs = rows.get((peer, "allreduce", W), {})
            sizes = sorted(b for b in mine if sel(b) and b in theirs)
            ratios = []
            parts = []
            for b in sizes:
                a, t = mine[b].get(what), theirs[b].get(what)
                if a is None or t is None or t == 0 or (what == "time_us" and a == 0):
                    continue
                r = a / t
                ratios.append(r)
                bad = "" if mine[b].get("ok", True) is not False else "!"
                parts.append("%s %s%s" % (size_name(b), fmt_ratio(r), bad))
            if not ratios:
                p("| %s %s %gx | %s | %s | no data | - | - | - |" % (title, cmp, goal, HEAD[mode], peer))
                continue
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            worst = max(ratios) if cmp == "<=" else min(ratios)
            met = worst <= goal if cmp == "<=" else worst >= goal
            if any(mine[b].get("ok") is False for b in sizes):
                met = False
            p("| %s %s %gx | %s | %s | %s | %s | %s | %s |" % (
                title, cmp, goal, HEAD[mode], peer, ", ".join(parts), fmt_ratio(geo),
                fmt_ratio(worst), "yes" if met else "**NO**"))
    p("")
    bad = sorted({"%s %s W=%d %s" % (k[0], k[1], k[2], size_name(b))
                  for k, v in rows.items() for b, r in v.items() if r.get("ok") is False})
    if bad:
        p("Correctness check FAILED: " + "; ".join(bad))
        p("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
