#!/usr/bin/python3
"""bench/chaos: the Gloo rank of the chaos benchmark (PyTorch's Gloo
backend through Debian's python3-torch), doing what uvccl_chaos does: the
same pseudo-random sequence of collectives, every result checked, until
one fails; then it reports when and why and exits (Gloo cannot shrink).

Lines (read by chaos.py):
  @ready RANK PID
  @bad RANK ITER N
  @err RANK T - - | MESSAGE     T: time.monotonic() (CLOCK_MONOTONIC)
Its world comes from env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

KINDS = ["allreduce", "broadcast", "allgather", "alltoall", "reduce_scatter",
         "barrier"]
M64 = (1 << 64) - 1


def pick(i):
    x = ((i + 1) * 0x9e3779b97f4a7c15) & M64
    x ^= x >> 29
    return int(x % 6), 1 << ((x >> 8) % 19)


def run_one(i, me, P):
    kind, n = pick(i)
    if kind in (3, 4):
        n = max(n // P, 1)
    bad = 0
    if kind == 0:
        t = torch.full((n,), float(me + 1))
        dist.all_reduce(t)
        bad = int((t != float(P * (P + 1) // 2)).sum())
    elif kind == 1:
        root = i % P
        t = torch.full((n,), float(i) if me == root else -1.0)
        dist.broadcast(t, root)
        bad = int((t != float(i)).sum())
    elif kind == 2:
        t = torch.full((n,), float(me * 3 + i % 5))
        out = [torch.empty(n) for _ in range(P)]
        dist.all_gather(out, t)
        bad = sum(int((out[q] != float(q * 3 + i % 5)).sum()) for q in range(P))
    elif kind == 3:
        src = torch.cat([torch.full((n,), float(me * 100 + q)) for q in range(P)])
        dst = torch.empty(n * P)
        dist.all_to_all_single(dst, src)
        want = torch.cat([torch.full((n,), float(q * 100 + me)) for q in range(P)])
        bad = int((dst != want).sum())
    elif kind == 4:
        # Gloo has no native reduce_scatter: an allreduce of the blocks,
        # each rank keeping its own (as PyTorch users do with Gloo).
        t = torch.full((n * P,), float(me + 1))
        dist.all_reduce(t)
        mine = t[me * n:(me + 1) * n]
        bad = int((mine != float(P * (P + 1) // 2)).sum())
    else:
        dist.barrier()
    return bad


def main():
    timeout = 20.0
    args = sys.argv[1:]
    if "--timeout" in args:
        timeout = float(args[args.index("--timeout") + 1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout))
    me, P = dist.get_rank(), dist.get_world_size()
    i = 0
    try:
        while True:
            bad = run_one(i, me, P)
            if bad:
                print("@bad %d %d %d" % (me, i, bad), flush=True)
            if i == 20:
                print("@ready %d %d" % (me, os.getpid()), flush=True)
            i += 1
    except Exception as e:  # Gloo raises RuntimeError on every failure
        msg = str(e).replace("\n", " ")[:300]
        print("@err %d %.6f - - | %s" % (me, time.monotonic(), msg), flush=True)
    # no destroy_process_group: with a peer gone it may block
    os._exit(0)


if __name__ == "__main__":
    main()
