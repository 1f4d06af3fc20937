"""uvccl-vsearch in Python: nearest-neighbour search (L2) over a synthetic
table sharded across the ranks of a uvccl world, served over HTTP by rank 0
with aiohttp, on the asyncio loop that runs the collectives (no thread).

  uvccl-run -n 2 python3 examples/python/vsearch.py --port 8080
  curl -d '{"vector": [0.1, ...], "k": 5}' localhost:8080/search

Rank 0 batches the searches that arrive within a millisecond (up to
--batch), broadcasts the batch, every rank finds its shard's k nearest
rows, and an allgather brings them to rank 0, which merges them. When a
rank fails, the searches in flight and every later one get 503 with
uvccl's message, naming the rank; /healthz keeps answering (the loop is
alive) and says which rank failed."""
import argparse
import asyncio
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
import uvccl  # noqa: E402


def table(rows, dim, seed):
    """The whole table (every rank makes it and keeps its shard)."""
    return np.random.default_rng(seed).standard_normal((rows, dim)).astype(
        np.float32)


def shard_bounds(rows, rank, size):
    return rows * rank // size, rows * (rank + 1) // size


def nearest(shard, first_id, queries, k):
    """Each query's k nearest rows of the shard: (distances, ids), k x B."""
    d = ((queries[:, None, :] - shard[None, :, :]) ** 2).sum(axis=2)
    k = min(k, shard.shape[0])
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return (np.take_along_axis(d, idx, axis=1).astype(np.float32),
            (idx + first_id).astype(np.int64))


class Search:
    def __init__(self, pg, args):
        self.pg, self.args = pg, args
        lo, hi = shard_bounds(args.rows, pg.rank, pg.size)
        self.shard = table(args.rows, args.dim, args.seed)[lo:hi]
        self.first = lo
        self.queue = asyncio.Queue()
        self.failed = None

    async def batch(self, queries):
        """One batch on every rank: rank 0 passes its queries (B x dim),
        the others None; returns (distances, ids) of all shards at rank 0,
        size x B x k."""
        pg, a = self.pg, self.args
        hdr = np.array([0 if queries is None else len(queries)], np.int64)
        await pg.broadcast(hdr, 0)
        n = int(hdr[0])
        if n <= 0:
            return None
        q = queries if queries is not None else np.empty((n, a.dim), np.float32)
        await pg.broadcast(q, 0)
        dist = np.full((n, a.max_k), np.inf, np.float32)
        ids = np.full((n, a.max_k), -1, np.int64)
        d, i = nearest(self.shard, self.first, q, a.max_k)
        dist[:, :d.shape[1]], ids[:, :i.shape[1]] = d, i
        all_d = np.empty((pg.size, n, a.max_k), np.float32)
        all_i = np.empty((pg.size, n, a.max_k), np.int64)
        await pg.allgather(all_d, dist)
        await pg.allgather(all_i, ids)
        return all_d, all_i

    async def follower(self):
        while True:
            try:
                if await self.batch(None) is None:
                    return
            except uvccl.Error as e:
                print("rank %d: %s" % (self.pg.rank, e.message), flush=True)
                return

    async def leader(self):
        while True:
            first = await self.queue.get()
            if first is None:
                await self.batch(np.empty((0, self.args.dim), np.float32))
                return
            items = [first]
            await asyncio.sleep(0.001)
            while len(items) < self.args.batch and not self.queue.empty():
                items.append(self.queue.get_nowait())
            if self.failed is not None:
                for _, _, fut in items:
                    fut.set_exception(self.failed)
                continue
            try:
                all_d, all_i = await self.batch(
                    np.stack([v for v, _, _ in items]))
            except uvccl.Error as e:
                self.failed = e
                for _, _, fut in items:
                    fut.set_exception(e)
                continue
            for j, (_, k, fut) in enumerate(items):
                d = all_d[:, j, :].ravel()
                i = all_i[:, j, :].ravel()
                order = np.lexsort((i, d))[:k]
                fut.set_result([{"id": int(i[o]), "distance": float(d[o])}
                                for o in order if i[o] >= 0])

    async def search(self, vector, k):
        if self.failed is not None:
            raise self.failed
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((vector, k, fut))
        return await fut


async def serve(args):
    from aiohttp import web
    pg = await uvccl.init_process_group("env://")
    s = Search(pg, args)
    if pg.rank != 0:
        await s.follower()
        await pg.destroy()
        return

    async def search(request):
        try:
            body = json.loads(await request.read())
            vector = np.asarray(body["vector"], np.float32)
            k = int(body.get("k", 10))
            if vector.shape != (args.dim,) or not 1 <= k <= args.max_k:
                raise ValueError("a vector of %d numbers and 1 <= k <= %d"
                                 % (args.dim, args.max_k))
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        try:
            hits = await s.search(vector, k)
        except uvccl.Error as e:
            return web.json_response({"error": e.message,
                                      "failed_rank": e.rank}, status=503)
        return web.json_response({"results": hits})

    async def healthz(request):
        if s.failed is not None:
            return web.json_response({"status": "degraded",
                                      "failed_rank": s.failed.rank,
                                      "error": s.failed.message})
        return web.json_response({"status": "ok", "ranks": pg.size})

    app = web.Application()
    app.add_routes([web.post("/search", search), web.get("/healthz", healthz)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print("listening on %s:%d" % (args.host, port), flush=True)
    leader = asyncio.ensure_future(s.leader())
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await s.queue.put(None)
    if s.failed is None:
        await leader
    else:
        leader.cancel()
    await runner.cleanup()
    await pg.destroy()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-k", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
