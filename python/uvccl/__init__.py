"""uvccl for asyncio: collectives that complete on asyncio's own thread.

uvccl's loop (libuv) is embedded in the running asyncio loop: its backend
fd is watched with ``add_reader`` and its next timer with ``call_at``, and
each wake-up runs one non-blocking turn of it. So every uvccl callback runs
on the thread that runs asyncio and resolves an ``asyncio.Future`` there:
no thread of this package's, no executor, and the event loop stays free
while collectives move data (uvccl bounds the work of each callback).

    pg = await uvccl.init_process_group("env://")
    await pg.allreduce(array, op="sum")       # in place, any writable buffer

Buffers are anything with the buffer protocol (bytearray, array.array,
numpy arrays, memoryviews), C-contiguous; the dtype comes from the buffer's
format (or ``dtype=`` where the format cannot say, e.g. "bfloat16").
"""

import asyncio
import builtins
import collections
import datetime
import json
import os
import pickle

from . import _core

__all__ = [
    "init_process_group", "ProcessGroup", "TCPStore", "HashStore",
    "StoreServer", "Error", "PeerError", "RevokedError", "AbortedError",
    "TimeoutError", "CancelledError", "MismatchError", "InvalidArgument",
    "flight_recorder", "version", "P2POp",
]

# One operation of batch_isend_irecv: op "isend" or "irecv" (or "send",
# "recv"), a buffer, the peer's group rank, a tag.
P2POp = collections.namedtuple("P2POp", "op buf peer tag", defaults=(0,))

version = _core.version


# ---- errors -----------------------------------------------------------------

class Error(Exception):
    """A uvccl error: ``code`` (negative), ``name`` ("UVCCL_EPEER", ...),
    ``message`` (uvccl's, naming the peer, key or op), and for a group that
    failed because of a rank, ``failure`` (a dict: cause, rank, global_rank,
    address, reporter, failed_ranks, host_lost) with ``rank`` the group rank
    that failed first (else None)."""

    def __init__(self, code, message, failure=None):
        super().__init__(message)
        self.code = code
        self.name = _core.strerror(code)[0]
        self.message = message
        self.failure = failure
        self.rank = failure["rank"] if failure else None
        self.global_rank = failure["global_rank"] if failure else None


class PeerError(Error):
    """A rank of the group failed (died, stopped, cut off, aborted)."""


class RevokedError(Error):
    """The group was revoked (``ProcessGroup.revoke``, here or elsewhere)."""


class AbortedError(Error):
    """This rank aborted the group (``ProcessGroup.abort``)."""


class TimeoutError(Error, builtins.TimeoutError):
    """The operation ran past its timeout."""


class CancelledError(Error):
    """The operation was cancelled (its group or store was closed)."""


class MismatchError(Error):
    """The ranks called mismatched collectives (fingerprint check)."""


class InvalidArgument(Error, ValueError):
    """uvccl refused the arguments (root out of range, sizes, ...)."""


_CLASSES = {
    _core.EPEER: PeerError,
    _core.EREVOKED: RevokedError,
    _core.EABORTED: AbortedError,
    _core.ETIMEDOUT: TimeoutError,
    _core.ECANCELED: CancelledError,
    _core.EMISMATCH: MismatchError,
    _core.EINVAL: InvalidArgument,
}


def _error(code, message, failure):
    return _CLASSES.get(code, Error)(code, message, failure)


_core.set_error_factory(_error)


# ---- the uv loop inside asyncio's ----------------------------------------------

class _BlockingSelector:
    """asyncio's selector, told when the loop is about to block: the uv
    loops on it arm their wake-ups then (uvccl_loop_before_block) and
    shorten the block to their next timer, instead of arming after every
    turn."""

    def __init__(self, selector):
        self._selector = selector
        self.hooks = []

    def select(self, timeout=None):
        if timeout is None or timeout > 0:
            for hook in self.hooks:
                t = hook()
                if t >= 0 and (timeout is None or t / 1000.0 < timeout):
                    timeout = t / 1000.0
        return self._selector.select(timeout)

    def __getattr__(self, name):
        return getattr(self._selector, name)


class _Driver:
    """One uv loop per asyncio loop, turned whenever its fd is readable, its
    next timer is due, or a call has started something (new handles are
    only registered with the kernel by a turn)."""

    def __init__(self, aloop):
        self.aloop = aloop
        self.core = _core.Loop()
        self._soon = False
        self._timer = None
        aloop.add_reader(self.core.fileno(), self._step)
        # A selector event loop (asyncio's own) says when it blocks; other
        # loops (uvloop) are armed after every turn instead.
        sel = getattr(aloop, "_selector", None)
        if sel is not None and hasattr(sel, "select"):
            if not isinstance(sel, _BlockingSelector):
                sel = aloop._selector = _BlockingSelector(sel)
            sel.hooks.append(self._before_block)
            self.core.set_host_arms(True)

    def _before_block(self):
        t = self.core.before_block()
        if t == 0:  # rings to read, or spinning: a turn instead of a block
            self.kick()
        return t

    def kick(self):
        if not self._soon:
            self._soon = True
            # Through the timer heap, not call_soon: asyncio's timers that
            # fell due during this turn then run before the next turn, not
            # after it (a 1 ms timer's lateness is one turn shorter).
            aloop = self.aloop
            aloop.call_at(aloop.time(), self._step)

    def _on_timer(self):
        self._timer = None
        self._step()

    def _step(self):
        self._soon = False
        self.after(self.core.run())

    def after(self, t):
        """What the uv loop said after a turn: its next timer is t ms away
        (-1: none; 0: more to do at once)."""
        if t == 0:
            self.kick()
        elif t > 0:
            when = self.aloop.time() + t / 1000.0
            timer = self._timer
            # an earlier wake-up is harmless (the turn finds nothing due)
            if timer is None or timer.when() > when + 0.0005:
                if timer is not None:
                    timer.cancel()
                self._timer = self.aloop.call_at(when, self._on_timer)

    def future(self):
        return self.aloop.create_future()


_drivers = {}  # id(asyncio loop) -> _Driver


def _driver():
    aloop = asyncio.get_running_loop()
    d = _drivers.get(id(aloop))
    if d is None or d.aloop is not aloop:
        for k in [k for k, v in _drivers.items() if v.aloop.is_closed()]:
            del _drivers[k]
        d = _drivers[id(aloop)] = _Driver(aloop)
    return d


def _secs(timeout):
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    return float(timeout)


def _bytes(value):
    return value.encode() if isinstance(value, str) else value


# ---- process groups ---------------------------------------------------------------

class ProcessGroup:
    """A group of ranks. Every method that talks to other ranks is a
    coroutine; in-place operations return their buffer. ``timeout``
    (seconds or a timedelta) bounds one operation; the group's default is
    30 minutes, as c10d's."""

    __slots__ = ("_g", "_d", "__weakref__")

    def __init__(self, core, driver):
        self._g = core
        self._d = driver

    def __repr__(self):
        return "<uvccl.ProcessGroup rank %d of %d>" % (self.rank, self.size)

    @property
    def rank(self):
        return self._g.rank

    @property
    def size(self):
        return self._g.size

    def _future(self):
        d = self._d
        if asyncio.get_running_loop() is not d.aloop:
            raise RuntimeError("this group belongs to another event loop")
        return d.aloop.create_future()

    async def allreduce(self, buf, op="sum", *, dtype=None, timeout=None):
        f = self._future()
        self._d.after(self._g.allreduce(f, buf, None, 0, op, dtype, _secs(timeout)))
        await f
        return buf

    all_reduce = allreduce

    async def broadcast(self, buf, src=0, *, dtype=None, timeout=None):
        f = self._future()
        self._d.after(self._g.broadcast(f, buf, None, src, "sum", dtype,
                                       _secs(timeout)))
        await f
        return buf

    async def reduce(self, buf, dst=0, op="sum", *, dtype=None, timeout=None):
        """In place: buf holds the result at dst (elsewhere, its input is
        left as it was or used as scratch)."""
        f = self._future()
        self._d.after(self._g.reduce(f, buf, None, dst, op, dtype, _secs(timeout)))
        await f
        return buf

    async def allgather(self, output, input, *, dtype=None, timeout=None):
        """output holds size x input, rank i's at block i."""
        f = self._future()
        self._d.after(self._g.allgather(f, output, input, 0, "sum", dtype,
                                       _secs(timeout)))
        await f
        return output

    all_gather_into_tensor = allgather

    async def reduce_scatter(self, output, input, op="sum", *, dtype=None,
                             timeout=None):
        """input holds size blocks of output's length; output gets the
        reduction of block rank."""
        f = self._future()
        self._d.after(self._g.reduce_scatter(f, output, input, 0, op, dtype,
                                            _secs(timeout)))
        await f
        return output

    reduce_scatter_tensor = reduce_scatter

    async def alltoall(self, output, input, *, dtype=None, timeout=None):
        """Block i of input goes to rank i; block j of output comes from
        rank j."""
        f = self._future()
        self._d.after(self._g.alltoall(f, output, input, 0, "sum", dtype,
                                      _secs(timeout)))
        await f
        return output

    all_to_all_single = alltoall

    async def gather(self, input, output=None, dst=0, *, dtype=None,
                     timeout=None):
        """output (size x input) at dst only."""
        f = self._future()
        self._d.after(self._g.gather(f, output, input, dst, "sum", dtype,
                                    _secs(timeout)))
        await f
        return output

    async def scatter(self, output, input=None, src=0, *, dtype=None,
                      timeout=None):
        """input (size x output) at src only."""
        f = self._future()
        self._d.after(self._g.scatter(f, output, input, src, "sum", dtype,
                                     _secs(timeout)))
        await f
        return output

    async def allreduce_coalesced(self, bufs, op="sum", *, dtype=None,
                                  timeout=None):
        """Every buffer (one dtype) reduced in place, as one operation."""
        bufs = list(bufs)
        f = self._future()
        self._d.after(self._g.allreduce_coalesced(f, bufs, op, dtype,
                                                  _secs(timeout)))
        await f
        return bufs

    async def allgatherv(self, outputs, input, *, dtype=None, timeout=None):
        """Uneven: outputs[i] (one a rank) receives rank i's input, of any
        length; this rank's output must hold as many elements as its
        input."""
        outputs = list(outputs)
        f = self._future()
        self._d.after(self._g.allgatherv(f, outputs, input, dtype,
                                         _secs(timeout)))
        await f
        return outputs

    async def reduce_scatterv(self, output, input, counts, op="sum", *,
                              dtype=None, timeout=None):
        """Uneven: block i of input holds counts[i] elements; output gets
        the reduction of block rank."""
        f = self._future()
        self._d.after(self._g.reduce_scatterv(f, output, input, list(counts),
                                              op, dtype, _secs(timeout)))
        await f
        return output

    async def alltoallv(self, output, input, send_counts, recv_counts, *,
                        dtype=None, timeout=None):
        """c10d's all_to_all_single with split sizes: send_counts[i]
        elements go to rank i, recv_counts[j] come from rank j."""
        f = self._future()
        self._d.after(self._g.alltoallv(f, output, input, list(send_counts),
                                        list(recv_counts), dtype,
                                        _secs(timeout)))
        await f
        return output

    async def monitored_barrier(self, *, wait_all=False, timeout=None):
        """c10d's monitored_barrier: rank 0 collects every rank within the
        timeout; the error names the rank that did not come (all of them
        with wait_all)."""
        f = self._future()
        self._d.after(self._g.monitored_barrier(f, wait_all, _secs(timeout)))
        await f

    async def barrier(self, *, timeout=None):
        f = self._future()
        self._d.after(self._g.barrier(f, _secs(timeout)))
        await f

    async def send(self, buf, dst, tag=0, *, timeout=None):
        f = self._future()
        self._d.after(self._g.send(f, buf, dst, tag, _secs(timeout)))
        await f

    async def recv(self, buf, src=-1, tag=0, *, timeout=None):
        """Receives into buf (a message no longer than it; src -1: any
        rank). Returns (sender rank, length)."""
        f = self._future()
        self._d.after(self._g.recv(f, buf, src, tag, _secs(timeout)))
        return await f

    async def batch_isend_irecv(self, ops, *, timeout=None):
        """c10d's batch_isend_irecv: every P2POp (or (op, buf, peer[, tag])
        tuple) started at once; one entry an op: None for a send, (sender,
        length) for a receive."""
        items = []
        for o in ops:
            o = P2POp(*o)
            if o.op not in ("isend", "irecv", "send", "recv"):
                raise ValueError("batch_isend_irecv: op must be 'isend' or "
                                 "'irecv', not %r" % (o.op,))
            items.append((o.op in ("isend", "send"), o.buf, o.peer, o.tag))
        f = self._future()
        self._d.after(self._g.p2p_batch(f, items, _secs(timeout)))
        return await f

    async def broadcast_bytes(self, data, src=0, *, timeout=None):
        """src's bytes (data there; None elsewhere) on every rank."""
        f = self._future()
        self._d.after(self._g.broadcast_bytes(f, data, src, _secs(timeout)))
        return await f

    async def allgather_bytes(self, data, *, timeout=None):
        """Every rank's bytes, whatever their lengths: a list, by rank."""
        f = self._future()
        self._d.after(self._g.allgather_bytes(f, data, 0, _secs(timeout)))
        return await f

    async def gather_bytes(self, data, dst=0, *, timeout=None):
        """Every rank's bytes at dst (a list, by rank); None elsewhere."""
        f = self._future()
        self._d.after(self._g.gather_bytes(f, data, dst, _secs(timeout)))
        return await f

    async def scatter_bytes(self, payloads, src=0, *, timeout=None):
        """This rank's entry of src's list of one payload a rank."""
        f = self._future()
        self._d.after(self._g.scatter_bytes(f, payloads, src, _secs(timeout)))
        return await f

    # c10d's object collectives, pickled (trust the ranks you unpickle from)
    async def broadcast_object(self, obj, src=0, *, timeout=None):
        data = pickle.dumps(obj) if self.rank == src else None
        return pickle.loads(await self.broadcast_bytes(data, src, timeout=timeout))

    async def all_gather_object(self, obj, *, timeout=None):
        return [pickle.loads(b) for b in
                await self.allgather_bytes(pickle.dumps(obj), timeout=timeout)]

    async def gather_object(self, obj, dst=0, *, timeout=None):
        got = await self.gather_bytes(pickle.dumps(obj), dst, timeout=timeout)
        return None if got is None else [pickle.loads(b) for b in got]

    async def scatter_object(self, objs, src=0, *, timeout=None):
        data = [pickle.dumps(o) for o in objs] if self.rank == src else None
        return pickle.loads(await self.scatter_bytes(data, src, timeout=timeout))

    def premul_sum(self, factor):
        """A reduce op of this group: the sum of each input times factor
        (c10d's premul_sum): allreduce(buf, op=pg.premul_sum(0.5))."""
        return self._g.premul_sum(factor)

    async def split(self, color, key=None):
        """c10d's split: ranks with one color form a group, ordered by key.
        Collective over this group; None where color < 0."""
        f = self._future()
        self._d.after(self._g.split(f, color, self.rank if key is None else key))
        try:
            g = await f
        except Error as e:
            if e.name == "UVCCL_ENOTMEMBER":
                return None
            raise
        return ProcessGroup(g, self._d)

    def new_group(self, ranks, tag=None):
        """A subgroup of these ranks (every rank of this group calls it, in
        the same order); None on ranks outside it. Immediate: no messages."""
        g = self._g.new_group(list(ranks), tag)
        return None if g is None else ProcessGroup(g, self._d)

    async def shrink(self, exclude=()):
        """The survivors agree on who failed and get a group of the others
        (also leaving out ``exclude``). This group is unusable after it."""
        f = self._future()
        self._d.after(self._g.shrink(f, list(exclude)))
        return ProcessGroup(await f, self._d)

    def revoke(self, reason=None):
        self._g.revoke(reason)
        self._d.kick()

    def abort(self, reason=None):
        self._g.abort(reason)
        self._d.kick()

    def failure(self):
        """None while healthy; else the dict that errors carry."""
        return self._g.failure()

    def global_rank(self, group_rank):
        return self._g.global_rank(group_rank)

    def peer_transport(self, group_rank):
        return self._g.peer_transport(group_rank)

    def set_timeout(self, timeout):
        self._g.set_timeout(_secs(timeout))

    async def destroy(self):
        """Pending operations fail with CancelledError; connections close
        cleanly."""
        f = self._future()
        self._g.destroy(f)
        self._d.kick()
        await f

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.destroy()


# What one uvccl callback may do before it returns to the loop, in asyncio:
# half of uvccl's default. A 1 ms asyncio timer waits for about two turns
# (the one it fell due in, and the one queued before its task), where a
# uv timer waits for one, so this keeps its lateness where C's is
# (bench/RESULTS.md, "Bindings").
TURN_US = 250
TURN_BYTES = 256 << 10


async def init_process_group(init_method="env://", *, rank=-1,
                             world_size=-1, store=None, timeout=None,
                             prefix=None, turn_us=None, turn_bytes=None):
    """The world group, from a URL ("env://", "tcp://HOST:PORT",
    "file://PATH") or a store (with rank and world_size). turn_us and
    turn_bytes bound each uvccl callback on the loop (default: $UVCCL_TURN_US
    and $UVCCL_TURN_BYTES, else TURN_US and TURN_BYTES)."""
    d = _driver()
    if turn_us is None:
        turn_us = 0 if "UVCCL_TURN_US" in os.environ else TURN_US
    if turn_bytes is None:
        turn_bytes = 0 if "UVCCL_TURN_BYTES" in os.environ else TURN_BYTES
    core_store = None
    if store is not None:
        core_store = store._s
        init_method = None
        if rank < 0 or world_size <= 0:
            raise ValueError("init_process_group: a store needs rank and "
                             "world_size")
    f = d.future()
    d.after(d.core.init_group(f, init_method, core_store, rank, world_size,
                              _secs(timeout), prefix, turn_bytes, turn_us))
    return ProcessGroup(await f, d)


def flight_recorder(reason=None):
    """The flight recorder's dump (docs/trace-format.md) as a dict: the last
    operations of every group of this process, pending ones with the peers
    they wait for."""
    return json.loads(_driver().core.trace_json(reason))


# ---- stores ---------------------------------------------------------------------

class _Store:
    __slots__ = ("_s", "_d")

    def __init__(self, core, driver):
        self._s = core
        self._d = driver

    def _future(self):
        return self._d.aloop.create_future()

    async def _run(self, method, *args):
        f = self._future()
        t = method(f, *args)
        self._d.after(0 if t is None else t)
        return await f

    async def set(self, key, value):
        await self._run(self._s.set, key, _bytes(value))

    async def get(self, key):
        """Waits (up to the store's timeout) for the key; its value."""
        return await self._run(self._s.get, key)

    async def add(self, key, amount=1):
        return await self._run(self._s.add, key, amount)

    async def compare_set(self, key, expected, desired):
        return await self._run(self._s.compare_set, key, _bytes(expected),
                               _bytes(desired))

    async def wait(self, keys, timeout=None):
        await self._run(self._s.wait, list(keys), _secs(timeout))

    async def check(self, keys):
        return await self._run(self._s.check, list(keys))

    async def delete_key(self, key):
        return await self._run(self._s.delete_key, key)

    async def num_keys(self):
        return await self._run(self._s.num_keys)

    async def append(self, key, value):
        await self._run(self._s.append, key, _bytes(value))

    async def multi_get(self, keys):
        """Waits for every key; their values, in order."""
        return await self._run(self._s.multi_get, list(keys))

    async def multi_set(self, keys, values):
        await self._run(self._s.multi_set, list(keys), [_bytes(v) for v in values])

    async def list_keys(self):
        return await self._run(self._s.list_keys)

    # Queues (the newer TCPStore dialect, and in-process stores).
    async def queue_push(self, key, value):
        await self._run(self._s.queue_push, key, _bytes(value))

    async def queue_pop(self, key, block=False):
        """The oldest item; with block, waits for one (up to the store's
        timeout), else raises Error (UVCCL_EQEMPTY) on an empty queue."""
        return await self._run(self._s.queue_pop, key, block)

    async def queue_len(self, key):
        return await self._run(self._s.queue_len, key)

    def set_timeout(self, timeout):
        self._s.set_timeout(_secs(timeout))

    async def close(self):
        await self._run(self._s.close)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class TCPStore(_Store):
    """A client of a TCPStore server (uvccl's or PyTorch's)."""

    __slots__ = ()

    @classmethod
    async def connect(cls, host, port, *, timeout=None, world_size=0):
        d = _driver()
        st = cls(d.core.tcp_store(host, port, _secs(timeout), world_size), d)
        await st._run(st._s.connect)
        return st


class HashStore(_Store):
    """An in-process store (PyTorch's HashStore)."""

    __slots__ = ()

    def __init__(self):
        d = _driver()
        super().__init__(d.core.hash_store(), d)


class StoreServer:
    """A TCPStore server on this loop (PyTorch's clients speak to it too)."""

    __slots__ = ("_sv", "_d")

    @classmethod
    async def start(cls, host=None, port=0):
        d = _driver()
        sv = cls()
        sv._sv = d.core.store_server(host, port)
        sv._d = d
        return sv

    @property
    def port(self):
        return self._sv.port

    async def close(self):
        f = self._d.future()
        self._sv.close(f)
        self._d.kick()
        await f

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
