#!/usr/bin/python3
"""The same service as uvccl-vsearch, written the way a Python user would:
an asyncio HTTP/1.1 server on rank 0 (keep-alive, Content-Length bodies),
torch.distributed with Gloo for the collectives, run in a one-thread pool
so that the event loop never blocks and every rank issues the same
collectives in the same order. Concurrent searches are batched (up to
--batch) into one broadcast and one gather, as uvccl-vsearch does. The
table is the same (table.h's generator, vectorized with numpy), so the
answers are the same. For bench/server/run.sh; start it with
  uvccl-run -n 4 /usr/bin/python3 bench/server/py_vsearch.py --port P
(env:// as torchrun sets it). Endpoints: POST /search, GET /healthz."""
import argparse
import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--dim", type=int, default=64)
ap.add_argument("--rows", type=int, default=100000)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--refresh-mb", type=int, default=0)
ap.add_argument("--refresh-ms", type=int, default=1000)
args = ap.parse_args()
torch.set_num_threads(1)

M = np.uint64


def table(lo, hi):
    """Rows [lo, hi): splitmix64(seed * golden + id * dim + j) >> 40."""
    with np.errstate(over="ignore"):
        idx = (np.arange(lo, hi, dtype=M)[:, None] * M(args.dim) +
               np.arange(args.dim, dtype=M)[None, :])
        x = M(args.seed) * M(0x9E3779B97F4A7C15) + idx
        x = x + M(0x9E3779B97F4A7C15)
        x = (x ^ (x >> M(30))) * M(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> M(27))) * M(0x94D049BB133111EB)
        x = x ^ (x >> M(31))
    return torch.from_numpy(((x >> M(40)).astype(np.float32) *
                             np.float32(1.0 / 8388608.0)) - 1.0)


dist.init_process_group("gloo", init_method="env://")
rank, size = dist.get_rank(), dist.get_world_size()
lo = rank * args.rows // size
hi = (rank + 1) * args.rows // size
shard = table(lo, hi)
B, D = args.batch, args.dim
KMAX = 100


def search_step(queries=None, ks=None):
    """One batch on every rank: broadcast [count, k...] and the queries,
    top-k of the shard, gather the candidates to rank 0."""
    hdr = torch.zeros(1 + B, dtype=torch.int64)
    q = torch.zeros(B, D)
    if rank == 0:
        hdr[0] = len(ks)
        hdr[1:1 + len(ks)] = torch.tensor(ks)
        q[:len(ks)] = torch.tensor(queries)
    dist.broadcast(hdr, 0)
    n = int(hdr[0])
    if n < 0:
        return "refresh" if n == -1 else "stop"
    dist.broadcast(q, 0)
    k = int(hdr[1:1 + n].max())
    d2 = torch.cdist(q[:n], shard).pow(2)
    vals, idx = torch.topk(d2, min(k, shard.shape[0]), largest=False)
    cand = torch.full((B, KMAX, 2), float("inf"), dtype=torch.float64)
    cand[:n, :vals.shape[1], 0] = vals.double()
    cand[:n, :vals.shape[1], 1] = (idx + lo).double()
    out = [torch.empty_like(cand) for _ in range(size)] if rank == 0 else None
    dist.gather(cand, out, dst=0)
    if rank != 0:
        return None
    allc = torch.cat(out, dim=1)  # B x size*KMAX x 2
    res = []
    for i in range(n):
        ki = int(hdr[1 + i])
        order = torch.argsort(allc[i, :, 0])[:ki]
        res.append([{"id": int(allc[i, j, 1]),
                     "distance": float(allc[i, j, 0]) ** 0.5} for j in order])
    return res


refresh_buf = torch.ones(args.refresh_mb << 18) if args.refresh_mb else None


def refresh_step():
    dist.all_reduce(refresh_buf)
    refresh_buf.fill_(1.0)


def command(n):
    hdr = torch.zeros(1 + B, dtype=torch.int64)
    hdr[0] = n
    dist.broadcast(hdr, 0)


if rank != 0:
    while True:
        r = search_step()
        if r == "refresh":
            refresh_step()
        elif r == "stop":
            break
    dist.destroy_process_group()
    raise SystemExit(0)

# ---- rank 0: asyncio HTTP ---------------------------------------------------
pool = ThreadPoolExecutor(1)
pending = []      # (vector, k, future)
running = False


async def batcher():
    global running
    loop = asyncio.get_running_loop()
    running = True
    while pending:
        batch, pending[:] = pending[:B], pending[B:]
        try:
            res = await loop.run_in_executor(
                pool, search_step, [v for v, _, _ in batch],
                [k for _, k, _ in batch])
            for (_, _, fut), r in zip(batch, res):
                fut.set_result((200, {"results": r}))
        except Exception as e:  # a peer died: Gloo raises
            for _, _, fut in batch:
                fut.set_result((503, {"error": str(e)}))
    running = False


async def refresher():
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(args.refresh_ms / 1000)
        await loop.run_in_executor(pool, lambda: (command(-1), refresh_step()))


async def handle(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            method, path, _ = line.decode("latin-1").split(" ", 2)
            length = 0
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                name, _, val = h.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(val)
            body = await reader.readexactly(length) if length else b""
            if path == "/healthz":
                status, doc = 200, {"status": "ok", "ranks_alive": size}
            elif path == "/search" and method == "POST":
                try:
                    req = json.loads(body)
                    vec, k = req["vector"], int(req.get("k", 10))
                    if len(vec) != D or not 1 <= k <= KMAX:
                        raise ValueError("bad vector or k")
                    fut = asyncio.get_running_loop().create_future()
                    pending.append((vec, k, fut))
                    if not running:
                        asyncio.ensure_future(batcher())
                    status, doc = await fut
                except (ValueError, KeyError, TypeError) as e:
                    status, doc = 400, {"error": str(e)}
            else:
                status, doc = 404, {"error": "not found"}
            out = json.dumps(doc).encode()
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (status, len(out)) + out)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", args.port,
                                        backlog=1024)
    if refresh_buf is not None:
        asyncio.ensure_future(refresher())
    print(f"listening on 127.0.0.1:{args.port}", flush=True)
    async with server:
        await server.serve_forever()


try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
