"""Compares two runs of t/py/torch_ontop.py, one through uvccl and one
through Gloo, in DIR (files uvccl.RANK and gloo.RANK): every result equal
rank by rank, every check that passes with Gloo passing with uvccl (one
that fails with both is PyTorch's own limit, listed), nothing missing.
Prints one line (what was compared) and exits 0, or prints what differs
and exits 1.

    python3 t/py/ontop_report.py DIR WORLD
"""
import os
import re
import sys

d, world = sys.argv[1], int(sys.argv[2])


def parse(path):
    out = {"res": {}, "ok": set(), "bad": {}, "skip": {}}
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        m = re.match(r"@res \d+ (\S+) (.*)", line)
        if m:
            out["res"][m.group(1)] = m.group(2).strip()
        m = re.match(r"@check \d+ ([01]) (\S+) \| ?(.*)", line)
        if m and m.group(1) == "1":
            out["ok"].add(m.group(2))
        elif m:
            out["bad"][m.group(2)] = m.group(3).strip()
        m = re.match(r"@skip \d+ (\S+) \| ?(.*)", line)
        if m:
            out["skip"][m.group(1)] = m.group(2).strip()
    return out


problems, both_fail, nres = [], {}, 0
for r in range(world):
    u = parse(os.path.join(d, "uvccl.%d" % r))
    g = parse(os.path.join(d, "gloo.%d" % r))
    if "destroy" not in u["ok"]:
        problems.append("rank %d: uvccl's run did not end" % r)
    for k, v in g["res"].items():
        if k not in u["res"]:
            problems.append("rank %d: %s missing with uvccl" % (r, k))
        elif u["res"][k] != v:
            problems.append("rank %d: %s: uvccl %s, Gloo %s" %
                            (r, k, u["res"][k][:80], v[:80]))
        else:
            nres += 1
    for k, why in u["bad"].items():
        if k in g["bad"]:
            both_fail[k] = why
        else:
            problems.append("rank %d: %s fails with uvccl only: %s" %
                            (r, k, why))
    if not g["res"]:
        problems.append("rank %d: Gloo's run gave no results" % r)
if problems:
    print("\n".join(problems[:20]))
    sys.exit(1)
print("%d results equal to Gloo's%s" % (
    nres, "".join("; %s fails with Gloo too (%s)" % (k, v[:90])
                  for k, v in sorted(both_fail.items()))))
