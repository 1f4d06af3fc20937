#!/usr/bin/python3
"""bench/chaos/summarize.py OUT_DIR: the chaos table, in Markdown, from
the JSON lines chaos.py wrote (OUT_DIR/*.json)."""
import glob
import json
import os
import sys


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def fmt(v):
    return "-" if v is None else ("%.3f" % v if v < 10 else "%.1f" % v)


def main():
    out = sys.argv[1]
    recs = []
    for f in sorted(glob.glob(os.path.join(out, "*.json"))):
        with open(f) as fh:
            recs += [json.loads(ln) for ln in fh if ln.strip()]
    keys = []
    for r in recs:
        k = (r["impl"], r["kind"])
        if k not in keys:
            keys.append(k)
    order = {"uvccl": 0, "gloo": 1, "mpi": 2}
    kinds = {"kill": 0, "stop": 1, "partition": 2}
    keys.sort(key=lambda k: (kinds[k[1]], order[k[0]]))
    print("| failure | impl | trials | survivors | clean error, right results "
          "| named the failed rank | went on (shrink) | signal deaths | hangs "
          "| wrong results | detection p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for impl, kind in keys:
        rs = [r for r in recs if r["impl"] == impl and r["kind"] == kind]
        if any("not_run" in r for r in rs):
            print("| %s | %s | not run: %s |||||||||| " % (
                kind, impl, rs[0]["not_run"]))
            continue
        trials = len(rs)
        setup = sum(1 for r in rs if r.get("setup_failed"))
        surv = clean = named = went = sig = hung = wrong = 0
        det = []
        for r in rs:
            for s in r.get("survivors", []):
                surv += 1
                wrong += 1 if s.get("bad") else 0
                if s.get("hung"):
                    hung += 1
                    continue
                reported = "detect_s" in s
                if impl == "mpi":
                    if not reported:
                        sig += 1  # killed by mpirun when a rank died
                elif s.get("exit") is not None and s["exit"] < 0:
                    sig += 1
                if reported:
                    det.append(s["detect_s"])
                    if not s.get("bad") and (impl == "mpi" or s.get("exit") == 0):
                        clean += 1
                    if s.get("culprit") == str(r.get("victim")):
                        named += 1
                a = s.get("after")
                if a and a[1] == 20 and a[2] == 0 and a[0] == r["world"] - 1:
                    went += 1
        print("| %s | %s | %d%s | %d | %d | %s | %s | %d | %d | %d | %s | %s |" % (
            kind, impl, trials, " (%d setup failed)" % setup if setup else "",
            surv, clean, named if impl == "uvccl" else "n/a",
            went if impl == "uvccl" else "n/a (cannot)", sig, hung, wrong,
            fmt(pct(det, 50)), fmt(pct(det, 99))))


if __name__ == "__main__":
    main()
