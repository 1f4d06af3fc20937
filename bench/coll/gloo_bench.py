#!/usr/bin/python3
"""gloo_bench.py - the uvccl-bench measurement with PyTorch's Gloo backend.

Runs W processes on this host (multiprocessing spawn), rendezvous through a
TCPStore on 127.0.0.1, GLOO_SOCKET_IFNAME=lo, torch.set_num_threads(1),
float32 SUM. Must run with Debian's interpreter (/usr/bin/python3), the one
that sees python3-torch (1.13).

  /usr/bin/python3 bench/coll/gloo_bench.py --world 2 --op all -b 4 -e 64M

Same rules as tools/uvccl-bench.c and bench/coll/mpi_bench.c:
  * nccl-tests sizes: allreduce/broadcast/reduce = the buffer; allgather,
    gather = the whole output; reduce_scatter, alltoall, scatter = the whole
    input of a rank; rounded down to whole floats per block, skipped when a
    block would be empty. busbw: allreduce 2(W-1)/W, broadcast/reduce 1, the
    others (W-1)/W. algbw = size / time, GB = 1e9 B.
  * a barrier (not timed) before every iteration; every iteration timed on
    every rank (time.perf_counter around the call, which waits for the
    work); per iteration the MAX over ranks; rows show median and min.
  * the first size warms up for at least SETTLE_S (0.3 s) first, as
    tools/uvccl-bench.c does (-w or -n turn it off)
  * cap = clamp(256 MiB / size, 10, 1000) (barrier 1000); warmup =
    clamp(cap/10, 2, 20); iters = clamp(budget / mean warmup time (MAX over
    ranks), 10, cap); -n / -w override.
  * the last iteration is checked against locally computed values (outputs
    poisoned, or in-place inputs refilled, before it); "ok" is the AND over
    ranks.
Gloo's calls are c10d's: all_reduce, broadcast and reduce work in place
(timed on zeros, refilled for the checked iteration), all_gather and gather
use the list form (views of one buffer), alltoall is all_to_all_single.
An op the backend lacks (1.13's Gloo has no reduce_scatter) is probed once
and reported as unsupported.

Output: the table (op W size_B iters med_us min_us algbw_GBps busbw_GBps ok)
or, with --json, one JSON object per row with the keys of uvccl-bench.
Exit status: 0, 1 if a check failed or a rank failed.
"""
import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import time

SETTLE_S = 0.3  # seconds of warm-up before the first size

OPS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
       "alltoall", "gather", "scatter", "barrier"]
BLOCKS = {"allgather", "reduce_scatter", "alltoall", "gather", "scatter"}


def bus_factor(op, w):
    if op == "allreduce":
        return 2.0 * (w - 1) / w
    if op in ("broadcast", "reduce"):
        return 1.0
    return (w - 1) / w


def clamp(v, lo, hi):
    return lo if v < lo else hi if v > hi else v


def parse_size(s):
    s0 = s
    s = s.strip()
    if s.endswith(("B", "b")):
        s = s[:-1]
    if s.endswith("i"):
        s = s[:-1]
    mult = 1
    if s and s[-1] in "kKmMgG":
        mult = 1 << {"k": 10, "m": 20, "g": 30}[s[-1].lower()]
        s = s[:-1]
    try:
        return int(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError("bad size %r" % s0)


def sizes(a, op, w):
    """(bytes, n) per row: n = elements, per block for the split ops."""
    if op == "barrier":
        return [(0, 0)]
    out = []
    size = a.minbytes
    while size <= a.maxbytes:
        if op in BLOCKS:
            n = size // (4 * w)
            b = n * 4 * w
        else:
            n = size // 4
            b = n * 4
        if n > 0:
            out.append((b, n))
        size *= a.stepfactor
    return out


def worker(rank, w, port, a, addr="127.0.0.1"):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tmo = datetime.timedelta(seconds=a.timeout)
    store = dist.TCPStore(addr, port, w, rank == 0, timeout=tmo)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=w,
                            timeout=tmo)
    init_ms = (time.perf_counter() - t0) * 1e3
    root = a.root
    me = rank == root
    f32 = torch.float32

    maxf = a.maxbytes // 4 + 16
    sbuf = torch.zeros(maxf, dtype=f32)
    rbuf = torch.zeros(maxf, dtype=f32)

    k = max(1, min(7, (1 << 24) // w))

    def mov(r, start, n):
        i = torch.arange(start, start + n, dtype=torch.int64)
        return ((r * 7919 + i) % (1 << 20)).to(f32)

    def red(r, start, n):
        i = torch.arange(start, start + n, dtype=torch.int64)
        return ((r * 5 + i) % k + 1).to(f32)

    def red_sum(start, n):
        s = torch.zeros(n, dtype=f32)
        for r in range(w):
            s += red(r, start, n)
        return s

    POISON = float("nan")

    def setup(op, n):
        """Returns (call, fill, poison, verify) for op with n elements."""
        s = sbuf[:n * w] if op in BLOCKS else sbuf[:n]
        if op == "allreduce":
            buf = rbuf[:n]
            return (lambda: dist.all_reduce(buf),
                    lambda: buf.zero_(),
                    lambda: buf.copy_(red(rank, 0, n)),
                    lambda: torch.equal(buf, red_sum(0, n)))
        if op == "broadcast":
            buf = rbuf[:n]
            return (lambda: dist.broadcast(buf, root),
                    lambda: buf.copy_(mov(root, 0, n)) if me else None,
                    lambda: None if me else buf.fill_(POISON),
                    lambda: torch.equal(buf, mov(root, 0, n)))
        if op == "reduce":
            buf = rbuf[:n]
            return (lambda: dist.reduce(buf, root),
                    lambda: buf.zero_(),
                    lambda: buf.copy_(red(rank, 0, n)),
                    lambda: (not me) or torch.equal(buf, red_sum(0, n)))
        if op == "allgather":
            inp = sbuf[:n]
            out = rbuf[:n * w]
            outs = list(out.view(w, n).unbind(0))
            return (lambda: dist.all_gather(outs, inp),
                    lambda: inp.copy_(mov(rank, 0, n)),
                    lambda: out.fill_(POISON),
                    lambda: all(torch.equal(outs[j], mov(j, 0, n)) for j in range(w)))
        if op == "gather":
            inp = sbuf[:n]
            out = rbuf[:n * w]
            outs = list(out.view(w, n).unbind(0)) if me else None
            return (lambda: dist.gather(inp, gather_list=outs, dst=root),
                    lambda: inp.copy_(mov(rank, 0, n)),
                    lambda: out.fill_(POISON) if me else None,
                    lambda: (not me) or all(torch.equal(outs[j], mov(j, 0, n)) for j in range(w)))
        if op == "reduce_scatter":
            out = rbuf[:n]
            ins = list(s.view(w, n).unbind(0))
            return (lambda: dist.reduce_scatter(out, ins),
                    lambda: s.copy_(red(rank, 0, n * w)),
                    lambda: out.fill_(POISON),
                    lambda: torch.equal(out, red_sum(rank * n, n)))
        if op == "alltoall":
            out = rbuf[:n * w]
            return (lambda: dist.all_to_all_single(out, s),
                    lambda: s.copy_(mov(rank, 0, n * w)),
                    lambda: out.fill_(POISON),
                    lambda: all(torch.equal(out[j * n:(j + 1) * n], mov(j, rank * n, n))
                                for j in range(w)))
        if op == "scatter":
            out = rbuf[:n]
            ins = list(s.view(w, n).unbind(0)) if me else None
            return (lambda: dist.scatter(out, scatter_list=ins, src=root),
                    lambda: s.copy_(mov(root, 0, n * w)) if me else None,
                    lambda: out.fill_(POISON),
                    lambda: torch.equal(out, mov(root, rank * n, n)))
        if op == "barrier":
            return (lambda: dist.barrier(), lambda: None, lambda: None, lambda: True)
        raise SystemExit("unknown op " + op)

    def emit(d):
        if a.json:
            print(json.dumps(d))
        elif d.get("unsupported"):
            print("%-15s %3d %s" % (d["op"], w, "unsupported: " + d["unsupported"]))
        elif d["op"] == "barrier":
            print("%-15s %3d %10s %6d %12.2f %12.2f %11s %11s %3s" % (
                d["op"], w, "-", d["iters"], d["time_us"], d["min_us"], "-", "-",
                "yes" if d["ok"] else "NO"))
        else:
            print("%-15s %3d %10d %6d %12.2f %12.2f %11.3f %11.3f %3s" % (
                d["op"], w, d["bytes"], d["iters"], d["time_us"], d["min_us"],
                d["algbw_gbps"], d["busbw_gbps"], "yes" if d["ok"] else "NO"))
        sys.stdout.flush()

    if rank == 0 and not a.json:
        print("# gloo_bench (%s): torch %s gloo, W=%d, float32 sum, root %d, budget %.2f s, "
              "check %s, GLOO_SOCKET_IFNAME=lo, torch threads 1, init %.1f ms"
              % (a.label, torch.__version__, w, root, a.budget, "on" if a.check else "off",
                 init_ms))
        print("# time = median (min) over iterations of the MAX over ranks; GB = 1e9 B")
        print("%-15s %3s %10s %6s %12s %12s %11s %11s %3s" % (
            "op", "W", "size_B", "iters", "med_us", "min_us", "algbw_GBps", "busbw_GBps", "ok"))
        sys.stdout.flush()

    failed = False
    settled = False
    for op in a.ops:
        for nbytes, n in sizes(a, op, w):
            call, fill, poison, verify = setup(op, n)
            fill()
            try:
                call()  # the first warm-up call doubles as the probe
            except RuntimeError as e:
                # unsupported ops raise on every rank alike
                if rank == 0:
                    emit({"impl": a.label, "op": op, "dtype": "float32", "redop": "sum",
                          "world": w, "bytes": None, "iters": 0, "time_us": None,
                          "min_us": None, "algbw_gbps": None, "busbw_gbps": None,
                          "ok": None, "unsupported": str(e).splitlines()[0][:100]})
                break
            cap = 1000 if op == "barrier" else clamp((256 << 20) // max(nbytes, 1), 10, 1000)
            warm = a.warmup_iters if a.warmup_iters > 0 else clamp(cap // 10, 2, 20)
            if not settled and a.warmup_iters == 0 and a.iters == 0:
                # the first size settles first, as tools/uvccl-bench.c does
                settled = True
                s0 = time.perf_counter()
                while True:
                    for _ in range(warm):
                        dist.barrier()
                        call()
                    spent = torch.tensor([time.perf_counter() - s0], dtype=torch.float64)
                    dist.all_reduce(spent, op=dist.ReduceOp.MAX)
                    if spent.item() >= SETTLE_S:
                        break
            tot = 0.0
            for _ in range(warm):
                dist.barrier()
                t = time.perf_counter()
                call()
                tot += time.perf_counter() - t
            tw = torch.tensor([tot / warm], dtype=torch.float64)
            dist.all_reduce(tw, op=dist.ReduceOp.MAX)
            if a.iters > 0:
                iters = a.iters
            else:
                iters = clamp(int(a.budget / max(tw.item(), 1e-9)), 10, cap)
            ts = [0.0] * (iters + 1)
            for i in range(iters):
                if a.check and i == iters - 1:
                    poison()
                dist.barrier()
                t = time.perf_counter()
                call()
                ts[i] = (time.perf_counter() - t) * 1e6
            ts[iters] = 0.0 if (not a.check or verify()) else 1.0
            tt = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            res = tt.tolist()
            ok = res[iters] == 0.0
            failed |= not ok
            if rank == 0:
                s = sorted(res[:iters])
                med, mn = s[iters // 2], s[0]
                d = {"impl": a.label, "op": op, "dtype": "float32", "redop": "sum",
                     "world": w, "bytes": nbytes, "iters": iters, "time_us": round(med, 3),
                     "min_us": round(mn, 3), "algbw_gbps": None, "busbw_gbps": None,
                     "ok": ok}
                if op != "barrier":
                    alg = nbytes / (med * 1e-6) / 1e9
                    d["algbw_gbps"] = round(alg, 4)
                    d["busbw_gbps"] = round(alg * bus_factor(op, w), 4)
                emit(d)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", "-W", type=int, default=2)
    ap.add_argument("-b", "--minbytes", type=parse_size, default=4)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=0)
    ap.add_argument("-w", "--warmup_iters", type=int, default=0)
    ap.add_argument("--op", default="allreduce",
                    help="NAME[,NAME...] or all: " + " ".join(OPS))
    ap.add_argument("-r", "--root", type=int, default=0)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds: store and collective timeout")
    ap.add_argument("--check", dest="check", action="store_true", default=True)
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--label", default="gloo")
    ap.add_argument("--env", action="store_true",
                    help="be one rank of a world started elsewhere: RANK, "
                    "WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and "
                    "GLOO_SOCKET_IFNAME) from the environment, as "
                    "bench/cluster/cluster.sh starts them in its hosts")
    a = ap.parse_args()
    ops = []
    for o in a.op.split(","):
        o = "broadcast" if o == "bcast" else o
        for x in (OPS if o == "all" else [o]):
            if x not in OPS:
                ap.error("unknown op " + x)
            if x not in ops:
                ops.append(x)
    a.ops = ops
    if a.world < 1 or not (0 <= a.root < a.world) or a.stepfactor < 2 or a.minbytes < 1 \
            or a.minbytes > a.maxbytes:
        ap.error("bad --world/--root/-f/-b/-e")

    if a.env:
        e = os.environ
        worker(int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["MASTER_PORT"]), a,
               e.get("MASTER_ADDR", "127.0.0.1"))
        sys.exit(0)
    ctx = mp.get_context("spawn")
    port = free_port()
    ps = [ctx.Process(target=worker, args=(r, a.world, port, a)) for r in range(a.world)]
    for p in ps:
        p.start()
    deadline = time.monotonic() + a.timeout * 10
    rc = 0
    # A rank that dies leaves the others blocked in a collective: once one
    # exits with an error, stop the rest (each by its own handle).
    while any(p.is_alive() for p in ps):
        bad = [p for p in ps if p.exitcode not in (None, 0)]
        if bad or time.monotonic() > deadline:
            rc = 1
            time.sleep(1.0)
            for p in ps:
                if p.is_alive():
                    p.terminate()
            break
        time.sleep(0.05)
    for p in ps:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
        if p.exitcode != 0:
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
