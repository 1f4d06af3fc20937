"""Multi-process worlds of the asyncio binding: ranks.py in 2-4 processes
(env://), every check of a scenario passed on every rank."""
import asyncio
import os
import signal
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def world(scenario, n, extra_env=None, timeout=180):
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=os.path.join(ROOT, "python"))
        env.update(extra_env or {})
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, os.path.join(HERE, "ranks.py"), scenario,
            env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT))
    try:
        outs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in procs)), timeout)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
    return [(p.returncode, o.decode(errors="replace")) for p, (o, _) in
            zip(procs, outs)]


def passed(out, names):
    lines = out.splitlines()
    bad = [l for l in lines if l.startswith("not ok")]
    missing = [n for n in names if "ok " + n not in lines]
    return not bad and not missing and "done" in lines, (bad, missing, out)


COLLECTIVES = ["init", "allreduce_dtypes", "allreduce_avg", "allreduce_array",
               "allreduce_bytearray", "allreduce_memoryview_4MiB",
               "allreduce_bfloat16", "broadcast_roots", "reduce_roots",
               "allgather", "reduce_scatter", "alltoall", "gather",
               "scatter", "barrier", "monitored_barrier",
               "allreduce_coalesced", "allgatherv", "reduce_scatterv",
               "alltoallv", "broadcast_bytes", "allgather_bytes",
               "gather_bytes", "scatter_bytes", "broadcast_object",
               "all_gather_object", "scatter_object", "gather_object",
               "batch_isend_irecv", "premul_sum",
               "send_recv", "recv_any", "concurrent",
               "split", "new_group", "split_none", "flight_recorder",
               "store_get", "store_add", "store_check", "store_timeout",
               "destroy"]


@pytest.mark.parametrize("n", [2, 4])
async def test_collectives_exact(n):
    for r, (rc, out) in enumerate(await world("collectives", n)):
        ok, why = passed(out, COLLECTIVES)
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_peer_killed_mid_allreduce():
    res = await world("kill", 3)
    assert res[2][0] == -signal.SIGKILL, res[2]
    for r in (0, 1):
        rc, out = res[r]
        ok, why = passed(out, ["peer_error", "loop_alive", "later_call",
                               "failure", "shrink"])
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_wrong_sizes_across_ranks():
    for r, (rc, out) in enumerate(await world("mismatch", 2,
                                              {"UVCCL_DEBUG": "detail"})):
        ok, why = passed(out, ["mismatch"])
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_timeout_and_revoke():
    for r, (rc, out) in enumerate(await world("timeout_revoke", 2)):
        ok, why = passed(out, ["timeout", "after_timeout", "revoked"])
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_abort():
    for r, (rc, out) in enumerate(await world("abort", 2)):
        ok, why = passed(out, ["aborted_here", "aborted_peer"])
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_init_from_store_and_tcp_url():
    for r, (rc, out) in enumerate(await world("init_store", 2)):
        ok, why = passed(out, ["init_store", "init_tcp_url"])
        assert rc == 0 and ok, "rank %d (exit %s): %s" % (r, rc, why)


async def test_example_server_survives_a_rank():
    """examples/python/vsearch.py at 2 ranks: searches over HTTP equal the
    brute-force answer; after rank 1 is SIGKILLed a search gets 503 naming
    it, /healthz still answers (the loop is alive), SIGTERM stops rank 0."""
    import importlib.util
    import aiohttp
    import numpy as np
    path = os.path.join(ROOT, "examples", "python", "vsearch.py")
    spec = importlib.util.spec_from_file_location("vsearch", path)
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   UVCCL_HEARTBEAT_TIMEOUT_MS="3000")
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, path, "--port", "0", "--rows", "3000", "--dim",
            "8", env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT))
    try:
        line = await asyncio.wait_for(procs[0].stdout.readline(), 60)
        assert line.startswith(b"listening on"), line
        url = "http://" + line.split()[-1].decode()
        full = vs.table(3000, 8, 1)
        rng = np.random.default_rng(7)
        async with aiohttp.ClientSession() as http:
            async def search(vec, k):
                async with http.post(url + "/search", json={
                        "vector": vec.tolist(), "k": k}) as resp:
                    return resp.status, await resp.json()
            queries = rng.standard_normal((12, 8)).astype(np.float32)
            answers = await asyncio.gather(*(search(q, 5) for q in queries))
            for q, (status, body) in zip(queries, answers):
                assert status == 200, body
                want = np.argsort(((full - q) ** 2).sum(axis=1),
                                  kind="stable")[:5]
                assert [h["id"] for h in body["results"]] == list(want)
            status, body = await search(queries[0][:3], 5)
            assert status == 400 and "8 numbers" in body["error"]
            procs[1].kill()
            await procs[1].wait()
            status, body = await search(queries[0], 5)
            assert status == 503 and body["failed_rank"] == 1, body
            assert "rank 1" in body["error"], body
            async with http.get(url + "/healthz") as resp:
                health = await resp.json()
            assert health["status"] == "degraded" and health["failed_rank"] == 1
        procs[0].send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(procs[0].wait(), 30) == 0
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
