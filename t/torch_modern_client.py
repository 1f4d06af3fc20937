#!/usr/bin/env python3
"""PyTorch 2.x's own TCPStore client (the MODERN dialect: VALIDATE, PING,
CANCEL_WAIT, queues) against a running uvccl server.

usage: python3 t/torch_modern_client.py HOST:PORT

Exercises every operation the installed PyTorch's Python TCPStore has
(newer ones only if present: check, append, multi_get/multi_set, queues,
list_keys, barrier), with exact values, plus a 2-process gloo
init_process_group + all_reduce through tcp://HOST:PORT. Prints TAP
("ok N - ...", "not ok N - ...", "1..N") and a summary line; exits 1 if
anything failed. Run by t/run-torch-modern.sh against
`build/bin/uvccl-store serve`. Every key lives under a per-run namespace
so a server that is not fresh does not confuse the counts (list_keys is
exact only on a fresh server, and says so).

The same file is its own helper process (--helper MODE ...): a second
client that sets / pushes / joins a barrier later, and the ranks of the
process group.
"""
import datetime
import hashlib
import os
import signal
import subprocess
import sys
import time
import traceback

HELPER_TIMEOUT = 120
DESTROY_TIMEOUT = 30  # seconds


def secs(s):
    return datetime.timedelta(seconds=float(s))


def tcpstore(host, port, timeout=60, world_size=None):
    import torch.distributed as dist
    try:
        return dist.TCPStore(host, port, world_size=world_size,
                             is_master=False, timeout=secs(timeout))
    except RuntimeError as e:
        # Builds without libuv (Debian's 2.6 and later) refuse the default
        # use_libuv=True even for a client, which never uses it.
        if "libuv" not in str(e):
            raise
        return dist.TCPStore(host, port, world_size=world_size,
                             is_master=False, timeout=secs(timeout),
                             use_libuv=False)


def big_value(n=1 << 20):
    b = bytearray((i * 7 + 3) % 251 for i in range(n))
    for i in range(0, n, 4096):
        b[i] = 0
    return bytes(b)


BINARY = bytes(range(256)) + b"\x00\x00x\x00"


# --------------------------------------------------------------------------
# TAP

class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0
        self.skipped = 0

    def ok(self, cond, desc, diag=None):
        self.n += 1
        print("%sok %d - %s" % ("" if cond else "not ", self.n, desc),
              flush=True)
        if not cond:
            self.failed += 1
            if diag:
                for line in str(diag).splitlines():
                    print("#   " + line, flush=True)
        return bool(cond)

    def eq(self, got, want, desc):
        return self.ok(got == want, desc,
                       "got:      %r\nexpected: %r" % (_short(got), _short(want)))

    def skip(self, desc, why):
        self.n += 1
        self.skipped += 1
        print("ok %d - %s # SKIP %s" % (self.n, desc, why), flush=True)

    def note(self, msg):
        for line in str(msg).splitlines():
            print("# " + line, flush=True)

    def done(self):
        print("1..%d" % self.n, flush=True)
        print("# summary: %d tests, %d passed, %d failed, %d skipped"
              % (self.n, self.n - self.failed - self.skipped, self.failed,
                 self.skipped), flush=True)
        return 1 if self.failed else 0


def _short(v):
    if isinstance(v, (bytes, bytearray)) and len(v) > 80:
        return "<%d bytes, sha256 %s>" % (len(v),
                                          hashlib.sha256(v).hexdigest()[:16])
    return v


T = Tap()


def section(name):
    """Runs a test section; an exception fails it instead of the run."""
    def deco(fn):
        def run(*a):
            try:
                fn(*a)
            except Exception as e:  # noqa: BLE001
                T.ok(False, "%s: no unexpected exception" % name,
                     "%s: %s\n%s" % (type(e).__name__, e,
                                     traceback.format_exc()))
        run.__name__ = fn.__name__
        return run
    return deco


# --------------------------------------------------------------------------
# helper processes

def spawn_helper(*args, env=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__),
                             "--helper"] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=e)


def reap(p, timeout=HELPER_TIMEOUT):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    text = out.decode("utf-8", "replace")
    fields = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            fields.setdefault(k, v)
    return p.returncode, fields, text


def helper_main(argv):
    signal.alarm(HELPER_TIMEOUT)
    mode, hostport = argv[0], argv[1]
    host, port = hostport.rsplit(":", 1)
    port = int(port)
    if mode == "set-later":
        key, value, delay = argv[2], argv[3], float(argv[4])
        s = tcpstore(host, port)
        time.sleep(delay)
        s.set(key, value)
        s.num_keys()  # a round trip: the set has arrived
    elif mode == "push-later":
        key, value, delay = argv[2], argv[3], float(argv[4])
        s = tcpstore(host, port)
        time.sleep(delay)
        s.queue_push(key, value)
        s.num_keys()
    elif mode == "barrier":
        key, ws, delay = argv[2], int(argv[3]), float(argv[4])
        s = tcpstore(host, port)
        time.sleep(delay)
        call_barrier(s, key, ws, 60)
    elif mode == "pg":
        rank, ws = int(argv[2]), int(argv[3])
        import torch
        import torch.distributed as dist
        # Every rank a client of the server at HOST:PORT (the elastic agent
        # store mode); plain tcp:// would make rank 0 bind the port itself.
        try:
            dist.init_process_group("gloo",
                                    init_method="tcp://%s:%d" % (host, port),
                                    rank=rank, world_size=ws,
                                    timeout=secs(90))
        except RuntimeError as e:
            # Builds without libuv (Debian's) fail in the agent store path,
            # which passes no use_libuv and so gets the refused default
            # (before any group state exists); such a job hands its own
            # client store over instead.
            if "libuv" not in str(e):
                raise
            dist.init_process_group("gloo", store=tcpstore(host, port),
                                    rank=rank, world_size=ws,
                                    timeout=secs(90))
        print("rank=%d" % dist.get_rank(), flush=True)
        t = torch.tensor([rank + 1.0, 10.0 * (rank + 1), 1.0])
        dist.all_reduce(t)
        print("all_reduce=%s" % ",".join("%g" % x for x in t.tolist()),
              flush=True)
        g = [torch.zeros(1) for _ in range(ws)]
        dist.all_gather(g, torch.tensor([float(rank * 7)]))
        print("all_gather=%s" % ",".join("%g" % x.item() for x in g),
              flush=True)
        # where a helper that hangs at the end stopped (its output is in
        # the failure's detail)
        print("stage=barrier", flush=True)
        dist.barrier()
        # Everything that went through the store is done: the rendezvous,
        # the collectives, the barrier.
        print("done=1", flush=True)
        # PyTorch 2.6's destroy_process_group has hung in rank 0 now and
        # then in CI (after the barrier, with rank 1 gone), inside
        # PyTorch's own teardown, where the store takes no part. A watchdog
        # that needs no GIL (faulthandler's thread) dumps every thread's
        # stack and exits, so the test tells that hang apart from a failure
        # of ours and shows where it was.
        import faulthandler
        print("stage=destroy", flush=True)
        faulthandler.dump_traceback_later(DESTROY_TIMEOUT, exit=True)
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()
        print("stage=destroyed", flush=True)
        return 0
    else:
        raise SystemExit("unknown helper mode " + mode)
    print("done=1", flush=True)
    return 0


def call_barrier(s, key, world_size, timeout_s):
    """Store.barrier (newest PyTorch). Its exact Python signature is not
    pinned down here: try the likely ones; TypeError means "not this one"."""
    attempts = [
        lambda: s.barrier(key, world_size, secs(timeout_s)),
        lambda: s.barrier(key, world_size),
        lambda: s.barrier(key=key, world_size=world_size,
                          timeout=secs(timeout_s)),
    ]
    last = None
    for a in attempts:
        try:
            return a()
        except TypeError as e:
            last = e
    raise NotImplementedError("barrier signature: %s (%s)"
                              % ((s.barrier.__doc__ or "").strip()
                                 .splitlines()[:1], last))


# --------------------------------------------------------------------------
# the tests

class Ctx:
    pass


@section("basic")
def test_basic(c):
    s, ns = c.s, c.ns
    n0 = s.num_keys()
    s.set(ns + "k1", b"v1")
    T.eq(s.get(ns + "k1"), b"v1", "set + get")
    s.set(ns + "k1", "v1b")
    T.eq(s.get(ns + "k1"), b"v1b", "set overwrites (str encoded as UTF-8)")
    T.eq(c.s2.get(ns + "k1"), b"v1b", "a second client sees it")
    T.eq(s.add(ns + "cnt", 5), 5, "add on a missing key starts at 0")
    T.eq(s.add(ns + "cnt", 5), 10, "add again")
    T.eq(s.add(ns + "cnt", -12), -2, "add a negative delta")
    T.eq(s.add(ns + "cnt", 0), -2, "add 0 reads")
    T.eq(s.get(ns + "cnt"), b"-2", "add stores decimal text")
    T.eq(s.compare_set(ns + "cs", "", "d1"), b"d1",
         "compare_set: missing, empty expected: creates, returns desired")
    T.eq(s.get(ns + "cs"), b"d1", "compare_set: created")
    T.eq(s.compare_set(ns + "cs_missing", "exp", "d2"), b"exp",
         "compare_set: missing, non-empty expected: returns expected")
    T.eq(s.num_keys(), n0 + 3, "compare_set: ... and stores nothing")
    T.eq(s.compare_set(ns + "cs", "d1", "d3"), b"d3",
         "compare_set: match swaps, returns the new value")
    T.eq(s.compare_set(ns + "cs", "zzz", "d4"), b"d3",
         "compare_set: mismatch returns the current value")
    T.eq(s.get(ns + "cs"), b"d3", "compare_set: mismatch stored nothing")
    T.eq(s.delete_key(ns + "k1"), True, "delete_key of an existing key")
    T.eq(s.delete_key(ns + "k1"), False, "delete_key of a missing key")
    T.eq(s.num_keys(), n0 + 2, "num_keys exact (cnt, cs)")
    s.set(ns + "bin", BINARY)
    T.eq(s.get(ns + "bin"), BINARY, "binary value with NULs")
    s.set(ns + "empty", b"")
    T.eq(s.get(ns + "empty"), b"", "empty value")
    big = big_value()
    s.set(ns + "big", big)
    T.eq(c.s2.get(ns + "big"), big, "1 MiB value, read by another client")
    T.eq(s.num_keys(), n0 + 5, "num_keys exact (+ bin, empty, big)")
    c.keys |= {"cnt", "cs", "bin", "empty", "big"}


@section("check")
def test_check(c):
    s, ns = c.s, c.ns
    if not hasattr(s, "check"):
        T.skip("check", "not in this PyTorch")
        return
    T.eq(s.check([ns + "cs", ns + "empty"]), True,
         "check: all present (an empty value counts)")
    T.eq(s.check([ns + "cs", ns + "nope"]), False, "check: one missing")
    T.eq(s.check([ns + "cs_missing"]), False,
         "check: compare_set on a missing key stored nothing")


@section("blocking get")
def test_blocking_get(c):
    s, ns = c.s, c.ns
    p = spawn_helper("set-later", c.hostport, ns + "late", "released", 1.0)
    try:
        v = s.get(ns + "late")  # blocks until the helper sets it
    finally:
        rc, f, text = reap(p)
    T.eq(v, b"released", "get waits until another process sets the key")
    T.ok(rc == 0 and f.get("done") == "1", "the setter process succeeded",
         text)
    c.keys.add("late")


@section("wait")
def test_wait(c):
    s, s2, ns = c.s, c.s2, c.ns
    s.set(ns + "wt_exist", b"e1")
    T.eq(s.wait([ns + "wt_exist"], secs(5)), None,
         "wait on an existing key returns")
    t0 = time.monotonic()
    try:
        s.wait([ns + "wt_missing"], secs(1))
        T.ok(False, "wait on a missing key times out")
    except Exception as e:  # noqa: BLE001  (DistStoreError in 2.x)
        T.ok(isinstance(e, RuntimeError) or "Dist" in type(e).__name__,
             "wait on a missing key raises (%s)" % type(e).__name__)
        T.ok("timeout" in str(e).lower(), "with a timeout message: %s"
             % str(e).splitlines()[0][:120])
        T.ok(time.monotonic() - t0 >= 0.9, "after the timeout")
    # CANCEL_WAIT keeps the same connection in step.
    T.eq(s.get(ns + "wt_exist"), b"e1", "the same client: next get works")
    s2.set(ns + "wt_missing", b"m1")
    s2.set(ns + "wt_exist2", b"e2")
    T.eq(s.get(ns + "wt_exist2"), b"e2",
         "the same client: in step after the awaited key appears")
    T.eq(s.add(ns + "cnt", 1), -1, "the same client: add gets its own reply")
    T.eq(s.get(ns + "wt_missing"), b"m1",
         "the same client: gets the formerly awaited key")
    c.keys |= {"wt_exist", "wt_missing", "wt_exist2"}


@section("append")
def test_append(c):
    s, ns = c.s, c.ns
    if not hasattr(s, "append"):
        T.skip("append", "not in this PyTorch")
        return
    s.append(ns + "ap", b"x")
    T.eq(s.get(ns + "ap"), b"x", "append creates the key")
    s.append(ns + "ap", b"y\x00z")
    T.eq(s.get(ns + "ap"), b"xy\x00z", "append concatenates")
    c.keys.add("ap")


@section("multi")
def test_multi(c):
    s, ns = c.s, c.ns
    if not (hasattr(s, "multi_set") and hasattr(s, "multi_get")):
        T.skip("multi_get / multi_set", "not in this PyTorch")
        return
    n0 = s.num_keys()
    s.multi_set([ns + "m1", ns + "m2", ns + "m3"], [b"one", b"", BINARY])
    T.eq(s.num_keys(), n0 + 3, "multi_set adds its keys")
    T.eq(s.multi_get([ns + "m1", ns + "m2", ns + "m3"]), [b"one", b"", BINARY],
         "multi_get returns every value in order")
    T.eq(s.multi_get([ns + "m3", ns + "cs"]), [BINARY, b"d3"],
         "multi_get of keys set by different ops")
    c.keys |= {"m1", "m2", "m3"}


@section("queues")
def test_queues(c):
    s, ns = c.s, c.ns
    if not all(hasattr(s, m) for m in ("queue_push", "queue_pop",
                                       "queue_len")):
        T.skip("queue_push / queue_pop / queue_len", "not in this PyTorch")
        return
    import torch.distributed as dist
    n0 = s.num_keys()
    q = ns + "q"
    try:
        n = s.queue_len(q)
    except NotImplementedError as e:
        # Newer clients (2.14 here) refuse queues when made with use_libuv=False,
        # the only kind a build without libuv (Debian's) can make.
        T.skip("queue_push / queue_pop / queue_len", str(e))
        return
    T.eq(n, 0, "queue_len of a missing queue")
    s.queue_push(q, b"i1")
    s.queue_push(q, "i2")
    T.eq(s.queue_len(q), 2, "queue_len after 2 pushes")
    T.eq(s.num_keys(), n0, "queues are not counted by num_keys")
    T.eq(s.queue_pop(q, block=False), b"i1", "queue_pop is FIFO")
    T.eq(s.queue_pop(q), b"i2", "queue_pop (block=True) with an item")
    T.eq(s.queue_len(q), 0, "queue_len after popping all")
    empty_err = getattr(dist, "DistQueueEmptyError", None)
    try:
        s.queue_pop(q, block=False)
        T.ok(False, "queue_pop(block=False) on an empty queue raises")
    except Exception as e:  # noqa: BLE001
        T.ok((empty_err is not None and isinstance(e, empty_err))
             or "empty" in str(e).lower(),
             "queue_pop(block=False) on an empty queue raises %s"
             % type(e).__name__, str(e))
    T.eq(s.add(ns + "cnt", 0), -1, "the connection is still in step")
    p = spawn_helper("push-later", c.hostport, q, "i3", 1.0)
    try:
        v = s.queue_pop(q)  # blocks until the helper pushes
    finally:
        rc, f, text = reap(p)
    T.eq(v, b"i3", "a blocking queue_pop is released by another's push")
    T.ok(rc == 0 and f.get("done") == "1", "the pusher process succeeded",
         text)


@section("list_keys")
def test_list_keys(c):
    s, ns = c.s, c.ns
    # PR #167883 (Nov 2025) added it; it was called "list" during review.
    name = next((n for n in ("list_keys", "list")
                 if callable(getattr(s, n, None))), None)
    if name is None:
        T.skip("list_keys", "not in this PyTorch")
        return
    keys = getattr(s, name)()
    keys = [k.decode() if isinstance(k, bytes) else k for k in keys]
    mine = sorted(k[len(ns):] for k in keys if k.startswith(ns))
    T.eq(mine, sorted(c.keys), "list_keys: every key this run set")
    T.ok("init/" not in keys, "list_keys: init/ is not a user key")
    if c.fresh:
        T.ok(not any(k.startswith("/") for k in keys),
             "list_keys: without the '/' prefix", repr(keys[:10]))
        T.eq(len(keys), s.num_keys(),
             "list_keys: as many as num_keys (fresh server, no init/)")


@section("barrier")
def test_barrier(c):
    s, ns = c.s, c.ns
    if not hasattr(s, "barrier"):
        T.skip("barrier", "not in this PyTorch")
        return
    try:
        call_barrier(s, ns + "bar1", 1, 30)
    except NotImplementedError as e:
        T.skip("barrier", str(e))
        return
    T.ok(True, "barrier with world_size 1 returns")
    p = spawn_helper("barrier", c.hostport, ns + "bar2", 2, 1.0)
    try:
        call_barrier(s, ns + "bar2", 2, 60)
    finally:
        rc, f, text = reap(p)
    T.ok(True, "barrier of 2 processes returns")
    T.ok(rc == 0 and f.get("done") == "1", "the other party returned too",
         text)
    c.keys |= {"bar1", "bar2"}


@section("process group")
def test_process_group(c):
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "0",
           "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    ps = [spawn_helper("pg", c.hostport, r, 2, env=env) for r in range(2)]
    for r, p in enumerate(ps):
        rc, f, text = reap(p)
        destroyed = "stage=destroyed" in text
        stuck = (f.get("done") == "1" and not destroyed
                 and "Timeout (" in text)
        good = T.ok(f.get("done") == "1" and (rc == 0 or stuck),
                    "rank %d: init_process_group(gloo) through this server, "
                    "collectives, barrier" % r,
                    "exit status %s (negative: the signal)\n%s"
                    % (rc, text[-3000:]))
        if good:
            T.eq(f.get("rank"), str(r), "rank %d: its rank" % r)
            T.eq(f.get("all_reduce"), "3,30,2", "rank %d: all_reduce sums" % r)
            T.eq(f.get("all_gather"), "0,7", "rank %d: all_gather" % r)
        if stuck:
            T.note("rank %d: destroy_process_group stacks:\n%s"
                   % (r, text[-3000:]))
            T.skip("rank %d: destroy_process_group returns, exit 0" % r,
                   "PyTorch's own teardown hung %d s after the last store "
                   "operation (known in PyTorch: pytorch#75097)"
                   % DESTROY_TIMEOUT)
        elif good:
            T.ok(destroyed and rc == 0,
                 "rank %d: destroy_process_group returns, exit 0" % r,
                 "exit status %s\n%s" % (rc, text[-3000:]))


def main(argv):
    if len(argv) >= 1 and argv[0] == "--helper":
        return helper_main(argv[1:])
    if len(argv) != 1 or ":" not in argv[0]:
        print(__doc__, file=sys.stderr)
        return 2
    signal.alarm(600)
    hostport = argv[0]
    host, port = hostport.rsplit(":", 1)
    import torch
    T.note("torch %s, python %s" % (torch.__version__, sys.version.split()[0]))
    c = Ctx()
    c.hostport = hostport
    c.ns = "uvccl_modern_%d/" % os.getpid()
    c.keys = set()
    try:
        c.s = tcpstore(host, int(port))
        c.s2 = tcpstore(host, int(port))
    except Exception as e:  # noqa: BLE001
        T.ok(False, "connect to %s" % hostport, "%s: %s" % (type(e).__name__, e))
        return T.done()
    T.ok(True, "connect to %s" % hostport)
    c.fresh = c.s.num_keys() == 0
    T.note("server is %s" % ("fresh" if c.fresh else "not fresh"))
    for t in (test_basic, test_check, test_blocking_get, test_wait,
              test_append, test_multi, test_queues, test_list_keys,
              test_barrier, test_process_group):
        t(c)
    return T.done()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
