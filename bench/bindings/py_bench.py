"""The asyncio binding's figures (bench/bindings/run.sh runs it under
uvccl-run, env://). Modes:
  chain [SIZES...]   back-to-back allreduces (float32, in place), each
                     awaited before the next: "py SIZE ITERS US BUSBW" on
                     rank 0, the same line as uvccl-bindings-chain's "c"
  lag BACKEND MIB S  a 1 ms asyncio timer's lateness (p50, p99, max) while
                     MIB-MiB allreduces run back to back for S seconds,
                     started from asyncio: BACKEND uvccl (awaited on the
                     loop), gloo (torch.distributed through
                     run_in_executor, as an asyncio server calls a
                     blocking library), idle (no collectives: the floor)
Each rank prints "lag BACKEND RANK p50_ms p99_ms max_ms ops op_ms_median".
"""
import asyncio
import os
import statistics
import sys
import time

import numpy as np


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100.0))] if xs else 0.0


async def chain(sizes):
    import uvccl
    pg = await uvccl.init_process_group("env://")
    for size in sizes:
        x = np.zeros(max(1, size // 4), np.float32)
        iters = 20000 if size <= 4096 else 400 if size <= 2 << 20 else 30
        for _ in range(iters // 10):
            await pg.allreduce(x)
        t = time.perf_counter()
        for _ in range(iters):
            await pg.allreduce(x)
        us = (time.perf_counter() - t) / iters * 1e6
        busbw = x.nbytes * 2.0 * (pg.size - 1) / pg.size / (us * 1e3)
        if pg.rank == 0:
            print("py %d %d %.2f %.3f" % (x.nbytes, iters, us, busbw),
                  flush=True)
    await pg.destroy()


async def ticker(lags, stop):
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.001)
        lags.append((loop.time() - t - 0.001) * 1e3)


async def lag(backend, mib, seconds):
    loop = asyncio.get_running_loop()
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    x = np.ones(mib << 18, np.float32)
    ops = []
    if backend == "uvccl":
        import uvccl
        pg = await uvccl.init_process_group("env://")
        await pg.allreduce(x)

        async def one():
            await pg.allreduce(x)
    elif backend == "gloo":
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=n)
        t = torch.from_numpy(x)
        dist.all_reduce(t)

        async def one():
            await loop.run_in_executor(None, dist.all_reduce, t)
    else:
        one = None
    lags = []
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(lags, stop))
    await asyncio.sleep(0.1)
    lags.clear()
    end = loop.time() + seconds
    if one is None:
        await asyncio.sleep(seconds)
    else:
        # every rank runs the same number of collectives: rank 0 decides
        # when to stop through the data (its last op carries -1 in x[0])
        while True:
            t0 = time.perf_counter()
            x[0] = -1.0 if (rank == 0 and loop.time() > end) else 0.0
            await one()
            ops.append((time.perf_counter() - t0) * 1e3)
            if x[0] < 0:
                break
    stop.set()
    await tick
    print("lag %s %d %.3f %.3f %.3f %d %.1f" % (
        backend, rank, pct(lags, 50), pct(lags, 99), max(lags), len(ops),
        statistics.median(ops) if ops else 0.0), flush=True)
    if backend == "uvccl":
        await pg.destroy()
    elif backend == "gloo":
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    if sys.argv[1] == "chain":
        units = {"K": 1 << 10, "M": 1 << 20}
        sizes = [int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)
                 for s in sys.argv[2:]] or [4, 1 << 20, 16 << 20]
        asyncio.run(chain(sizes))
    else:
        asyncio.run(lag(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
