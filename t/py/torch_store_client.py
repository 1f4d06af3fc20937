"""PyTorch's own TCPStore client, driven by uvccl's interoperability tests
(t/1020-store-torch-client.c, t/1021-store-torch-server.c).

usage: torch_store_client.py PORT MODE [ARGS...]

Every result is printed as one "name=value" line (bytes as lowercase hex,
so binary values survive) for the C test to parse and assert with exact
values; anything else on stdout/stderr is diagnostics. Connects to
127.0.0.1 only. A watchdog alarm ends the process if the test that
started it went away.
"""
import datetime
import hashlib
import os
import signal
import sys
import time

signal.alarm(int(os.environ.get("UVCCL_PY_ALARM", "100")))

HOST = "127.0.0.1"


def out(name, value):
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).hex()
    print("%s=%s" % (name, value), flush=True)


def secs(s):
    return datetime.timedelta(seconds=float(s))


def client(port, world_size=None, timeout=30):
    import torch.distributed as dist
    return dist.TCPStore(HOST, port, world_size=world_size, is_master=False,
                         timeout=secs(timeout))


def big_value(n=1 << 20):
    """The 1 MiB pattern the C tests generate too: byte i = (i*7 + 3) % 251,
    with a NUL every 4096 bytes."""
    b = bytearray((i * 7 + 3) % 251 for i in range(n))
    for i in range(0, n, 4096):
        b[i] = 0
    return bytes(b)


BINARY = bytes(range(256)) + b"\x00\x00x\x00"


def mode_basic(port):
    """Every 1.13 operation, on a server nobody else uses yet."""
    s = client(port, world_size=2)  # adds 1 to the unprefixed "init/"
    out("num_keys0", s.num_keys())
    s.set("k1", b"v1")
    out("get_k1", s.get("k1"))
    s.set("k1", "v1b")  # str values are encoded as UTF-8
    out("get_k1b", s.get("k1"))
    out("add1", s.add("cnt", 5))
    out("add2", s.add("cnt", 5))
    out("add3", s.add("cnt", -12))
    out("add4", s.add("cnt", 0))
    out("get_cnt", s.get("cnt"))
    # compare_set, the four rows of the semantics table.
    out("cs_create", s.compare_set("cs", "", "d1"))
    out("get_cs1", s.get("cs"))
    out("cs_missing", s.compare_set("cs_missing", "exp", "d2"))
    out("num_keys_after_cs", s.num_keys())
    out("cs_swap", s.compare_set("cs", "d1", "d3"))
    out("get_cs3", s.get("cs"))
    out("cs_mismatch", s.compare_set("cs", "zzz", "d4"))
    out("get_cs4", s.get("cs"))
    out("del1", s.delete_key("k1"))
    out("del2", s.delete_key("k1"))
    out("num_keys1", s.num_keys())
    s.set("bin", BINARY)
    out("get_bin", s.get("bin"))
    s.set("empty", b"")
    out("get_empty", s.get("empty"))
    big = big_value()
    s.set("big", big)
    got = s.get("big")
    out("big_len", len(got))
    out("big_sha", hashlib.sha256(got).hexdigest())
    out("big_same", int(got == big))
    out("num_keys2", s.num_keys())
    out("done", 1)


def mode_set(port, key, hexval):
    s = client(port)
    s.set(key, bytes.fromhex(hexval))
    out("num_keys", s.num_keys())  # a round trip: the set has arrived
    out("done", 1)


def mode_get(port, *keys):
    s = client(port)
    for key in keys:
        v = s.get(key)
        if len(v) > 4096:
            out("len_" + key, len(v))
            out("is_big_" + key, int(v == big_value()))
        else:
            out("value_" + key, v)
    out("done", 1)


def mode_getwait(port, key, timeout):
    """A get that blocks until someone else sets key."""
    s = client(port, timeout=float(timeout))
    out("value", s.get(key))
    out("done", 1)


def mode_setlater(port, key, value, delay):
    s = client(port)
    time.sleep(float(delay))
    s.set(key, value)
    out("num_keys", s.num_keys())
    out("done", 1)


def mode_waittimeout(port):
    """wait() on a missing key times out; then the SAME client goes on."""
    s = client(port)
    s.set("wt_exist", b"e1")
    t0 = time.monotonic()
    try:
        s.wait(["wt_missing"], secs(1))
        out("wait_raised", 0)
    except Exception as e:  # 1.13: RuntimeError("Socket Timeout")
        out("wait_raised", 1)
        out("wait_exc", type(e).__name__)
        out("wait_msg", str(e).replace("\n", " "))
    out("wait_waited", int(time.monotonic() - t0 >= 0.9))
    out("get_after", s.get("wt_exist"))
    # The stale registration of wt_missing was replaced by the get's WAIT,
    # so setting wt_missing now must not send this client a stray byte.
    other = client(port)
    other.set("wt_missing", b"m1")
    other.set("wt_exist2", b"e2")
    out("get_after2", s.get("wt_exist2"))
    out("get_missing_now", s.get("wt_missing"))
    out("wait_now", int(s.wait(["wt_missing"], secs(5)) is None))
    out("done", 1)


def mode_adder(port, key, n):
    """Adds 1 to key n times; prints every result, in order. All adders
    start together: each counts itself in, then waits for "adders_go"."""
    s = client(port, timeout=60)
    s.add("adders_started", 1)
    s.wait(["adders_go"])
    res = [s.add(key, 1) for _ in range(int(n))]
    out("adds", ",".join(str(r) for r in res))
    out("final_seen", s.get(key))
    out("done", 1)


def mode_pg(port, rank, world_size):
    """A real job: gloo rendezvous through the store at tcp://, all_reduce.

    The tcp:// handler makes rank 0 start its own TCPStore server on the
    port, which is ours; with TORCHELASTIC_USE_AGENT_STORE (the elastic
    agent hosts the store) every rank is a client, as here."""
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "0"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    rank, world_size = int(rank), int(world_size)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (HOST, port),
                            rank=rank, world_size=world_size,
                            timeout=secs(60))
    out("rank", dist.get_rank())
    out("world_size", dist.get_world_size())
    t = torch.tensor([rank + 1.0, 10.0 * (rank + 1), 1.0])
    dist.all_reduce(t)
    out("all_reduce", ",".join("%g" % x for x in t.tolist()))
    g = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(g, torch.tensor([float(rank * 7)]))
    out("all_gather", ",".join("%g" % x.item() for x in g))
    dist.barrier()
    dist.destroy_process_group()
    out("done", 1)


MODES = {
    "basic": mode_basic,
    "set": mode_set,
    "get": mode_get,
    "getwait": mode_getwait,
    "setlater": mode_setlater,
    "waittimeout": mode_waittimeout,
    "adder": mode_adder,
    "pg": mode_pg,
}


def main():
    port = int(sys.argv[1])
    MODES[sys.argv[2]](port, *sys.argv[3:])


if __name__ == "__main__":
    main()
