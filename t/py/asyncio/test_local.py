"""The asyncio binding in one process: a world of one rank over a
HashStore, stores, and bad arguments answered with clear exceptions (the
group still working after each)."""
import array
import asyncio
import datetime

import numpy as np
import pytest

import uvccl


@pytest.fixture
async def pg():
    g = await uvccl.init_process_group(store=uvccl.HashStore(), rank=0,
                                       world_size=1)
    yield g
    await g.destroy()


async def still_works(pg):
    x = np.arange(5, dtype=np.float32)
    assert (await pg.allreduce(x)) is x
    assert np.array_equal(x, np.arange(5, dtype=np.float32))


async def test_world_of_one(pg):
    assert (pg.rank, pg.size) == (0, 1)
    await still_works(pg)
    out = np.zeros(3, np.int64)
    await pg.allgather(out, np.array([1, 2, 3], np.int64))
    assert list(out) == [1, 2, 3]
    await pg.barrier(timeout=datetime.timedelta(seconds=5))


async def test_file_url(tmp_path):
    g = await uvccl.init_process_group("file://%s" % (tmp_path / "store"),
                                       rank=0, world_size=1)
    x = np.array([2, 3], np.int64)
    await g.allreduce(x, op="product")
    assert list(x) == [2, 3] and g.size == 1
    await g.destroy()


@pytest.mark.parametrize("buf,exc,words", [
    (b"abcd", TypeError, "writable"),
    ("text", TypeError, "buffer protocol"),
    (np.zeros(4, np.uint16), TypeError, "cannot be reduced"),
    (np.zeros((4, 4), np.float32)[:, 0], TypeError, "C-contiguous"),
    (np.zeros(4, ">f4"), TypeError, "cannot be reduced"),
])
async def test_bad_buffers(pg, buf, exc, words):
    with pytest.raises(exc, match=words):
        await pg.allreduce(buf)
    await still_works(pg)


async def test_bad_arguments(pg):
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="unknown reduce op"):
        await pg.allreduce(x, op="median")
    with pytest.raises(ValueError, match="unknown dtype"):
        await pg.allreduce(x, dtype="float128")
    with pytest.raises(ValueError, match="whole number"):
        await pg.allreduce(bytearray(6), dtype="float32")
    with pytest.raises(ValueError, match="positive"):
        await pg.allreduce(x, timeout=-1)
    with pytest.raises(ValueError, match="output holds 3 elements"):
        await pg.allgather(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="output holds int32, the input float32"):
        await pg.allgather(np.zeros(4, np.int32), np.zeros(4, np.float32))
    with pytest.raises(uvccl.InvalidArgument) as e:
        await pg.broadcast(x, src=3)
    assert isinstance(e.value, ValueError) and e.value.code < 0
    with pytest.raises(ValueError, match="root needs an output"):
        await pg.gather(x, None, dst=0)
    with pytest.raises(ValueError, match="send_counts has 2 entries"):
        await pg.alltoallv(x, x, [2, 2], [4])
    with pytest.raises(ValueError, match="add up to"):
        await pg.alltoallv(x, x, [3], [4])
    with pytest.raises(ValueError, match="is negative"):
        await pg.reduce_scatterv(x, x, [-1])
    with pytest.raises(TypeError, match="buffer 1 holds float64"):
        await pg.allreduce_coalesced([x, np.zeros(2)])
    with pytest.raises(ValueError, match="1 outputs|2 outputs"):
        await pg.allgatherv([x, x], x)
    with pytest.raises(ValueError, match="op must be 'isend' or 'irecv'"):
        await pg.batch_isend_irecv([("put", x, 0)])
    with pytest.raises(uvccl.InvalidArgument):  # with itself: refused
        await pg.batch_isend_irecv([("isend", x, 0), ("irecv", x, 0)])
    with pytest.raises(TypeError, match="a list of one payload a rank"):
        await pg.scatter_bytes(None)
    with pytest.raises(TypeError, match="op must be a name"):
        await pg.allreduce(x, op=0.5)
    half = np.full(2, 4.0)
    await pg.allreduce(half, op=pg.premul_sum(0.5))
    assert list(half) == [2.0, 2.0]
    assert await pg.all_gather_object({"k": 1}) == [{"k": 1}]
    assert await pg.broadcast_bytes(b"xy") == b"xy"
    # data movement takes any format, as bytes
    u = np.arange(4, dtype=np.uint16)
    await pg.broadcast(u, src=0)
    assert list(u) == [0, 1, 2, 3]
    await still_works(pg)


async def test_destroyed_group_refuses(pg):
    g = await uvccl.init_process_group(store=uvccl.HashStore(), rank=0,
                                       world_size=1, prefix="other")
    await g.destroy()
    with pytest.raises(uvccl.Error, match="destroyed"):
        await g.allreduce(np.zeros(1, np.float32))
    await g.destroy()  # twice is fine


async def test_other_event_loop(pg):
    import threading
    err = []

    def elsewhere():
        async def go():
            try:
                await pg.allreduce(np.zeros(1, np.float32))
            except RuntimeError as e:
                err.append(str(e))
        asyncio.run(go())

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert err and "another event loop" in err[0]


async def test_hash_store():
    st = uvccl.HashStore()
    await st.set("a", "1")
    assert await st.get("a") == b"1"
    assert await st.add("n", 5) == 5
    assert await st.add("n", -2) == 3
    assert await st.compare_set("a", "1", "2") == b"2"
    assert await st.compare_set("a", "x", "3") == b"2"
    assert await st.check(["a", "n"]) and not await st.check(["zz"])
    assert await st.num_keys() == 2
    assert await st.delete_key("a") is True
    assert await st.delete_key("a") is False
    await st.set("a", "x")
    await st.append("a", "+")
    assert await st.get("a") == b"x+"
    await st.multi_set(["m1", "m2"], ["1", b"22"])
    assert await st.multi_get(["m2", "m1"]) == [b"22", b"1"]
    assert sorted(await st.list_keys()) == ["a", "m1", "m2", "n"]
    await st.queue_push("q", "first")
    await st.queue_push("q", "second")
    assert await st.queue_len("q") == 2
    assert await st.queue_pop("q") == b"first"
    assert await st.queue_pop("q", block=True) == b"second"
    with pytest.raises(uvccl.Error) as e:
        await st.queue_pop("q")
    assert e.value.name == "UVCCL_EQEMPTY"
    with pytest.raises(ValueError, match="2 keys, 1 values"):
        await st.multi_set(["k1", "k2"], ["v"])
    st.set_timeout(0.1)
    with pytest.raises(uvccl.TimeoutError):
        await st.get("missing")
    with pytest.raises(uvccl.TimeoutError):
        await st.wait(["missing"], timeout=0.1)
    await st.close()
    with pytest.raises(uvccl.Error, match="closed"):
        await st.get("a")


async def test_tcp_store_server_and_client():
    async with await uvccl.StoreServer.start("127.0.0.1", 0) as server:
        assert server.port > 0
        a = await uvccl.TCPStore.connect("127.0.0.1", server.port)
        b = await uvccl.TCPStore.connect("127.0.0.1", server.port)
        waiter = asyncio.ensure_future(b.get("late"))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await a.set("late", b"\x00\x01value")
        assert await waiter == b"\x00\x01value"
        assert await b.add("c", 2) == 2 and await a.add("c", 3) == 5
        await a.multi_set(["m1", "m2"], ["1", "2"])
        assert await b.multi_get(["m1", "m2"]) == [b"1", b"2"]
        await a.queue_push("q", "item")
        assert await b.queue_len("q") == 1
        assert await b.queue_pop("q", block=True) == b"item"
        assert "m1" in await b.list_keys()
        await a.close()
        await b.close()


async def test_store_unreachable():
    with pytest.raises(uvccl.Error) as e:
        await uvccl.TCPStore.connect("127.0.0.1", 1, timeout=0.5)
    assert e.value.code < 0 and e.value.message


async def test_loop_serves_others_while_waiting(pg):
    # a pending store get keeps nothing blocked: timers keep firing
    st = uvccl.HashStore()
    pending = asyncio.ensure_future(st.get("never"))
    t0 = asyncio.get_running_loop().time()
    for _ in range(20):
        await asyncio.sleep(0.001)
    assert asyncio.get_running_loop().time() - t0 < 1.0
    assert not pending.done()
    await st.close()
    with pytest.raises(uvccl.CancelledError):
        await pending


def test_flight_recorder_and_errors():
    async def go():
        g = await uvccl.init_process_group(store=uvccl.HashStore(), rank=0,
                                           world_size=1, prefix="fr")
        await g.allreduce(array.array("d", [1.0]))
        fr = uvccl.flight_recorder("pytest")
        await g.destroy()
        return fr
    fr = asyncio.run(go())
    assert fr["format"] == "uvccl-flight-recorder"
    assert any(e.get("op") == "allreduce" for e in fr["entries"])
    assert issubclass(uvccl.TimeoutError, TimeoutError)
    assert uvccl.version


def test_pip_install_offline(tmp_path):
    """pip install ./python/uvccl, offline, into a virtual environment: the
    installed package (not the repository's) imports and runs a world of
    one."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                        str(venv)], check=True, capture_output=True)
    except subprocess.CalledProcessError as e:
        pytest.skip("no venv with pip here: %s" % e.stderr.decode()[-200:])
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation",
                        "--no-index", "-q", os.path.join(root, "python", "uvccl")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import asyncio, array, uvccl\n"
            "async def go():\n"
            "    g = await uvccl.init_process_group(store=uvccl.HashStore(), rank=0, world_size=1)\n"
            "    a = array.array('f', [1.5, 2.5])\n"
            "    await g.allreduce(a)\n"
            "    await g.destroy()\n"
            "    return list(a)\n"
            "print(asyncio.run(go()), uvccl.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, "-c", code], capture_output=True, text=True,
                       cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[1.5, 2.5]") and str(venv) in r.stdout, r.stdout
