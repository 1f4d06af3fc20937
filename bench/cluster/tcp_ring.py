#!/usr/bin/python3
"""tcp_ring.py - what plain TCP moves through the emulated cluster's links.

The link limit that cluster.sh prints counts payload at the link's rate.
TCP cannot reach it: every segment carries headers (66 bytes a 1448-byte
segment on a 1500-byte MTU, with timestamps), and the acknowledgements of
what a host receives share its outgoing link with what it sends. This
program measures the floor that leaves: one process a host, a ring of
hosts, each sending BYTES to the next while it receives BYTES from the one
before, on STREAMS connections to the next host (bytes cut evenly across
them). BYTES is what cluster.sh's limit says the busiest host's link must
carry for the collective, so the time is that collective's limit through
TCP, at the same rates, queues and losses as the libraries see.

  tcp_ring.py --host I --hosts H --addr-fmt 10.215.0.%d --port P \
              --bytes N [--op OP --size S] [--streams S] [-n ITERS]
              [-w WARMUP] [--json]

Host I listens on its address (10.215.0.(I+1)) at P, connects S times to
host I+1. Before every iteration, a barrier (a token twice round the ring,
not timed); each iteration is timed on every host from the barrier's
release until it has sent and received everything; per iteration the
maximum over hosts (the hosts send theirs to host 0 at the end); host 0
prints the median and the minimum, in uvccl-bench's JSON keys.
"""
import argparse
import json
import selectors
import socket
import statistics
import sys
import time

CHUNK = 1 << 20
# a receiving socket wakes the selector once this much has arrived (or all
# that is left): when a lossy link's hosts send packets of one segment,
# waking for each would make this process, not the link, the limit
LOWAT = 256 << 10


def set_lowat(sock, n):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, min(n, LOWAT)))


def connect(addr, port, deadline):
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def recv_exact(s, view):
    got = 0
    while got < len(view):
        n = s.recv_into(view[got:], min(len(view) - got, CHUNK))
        if n == 0:
            raise ConnectionError("the peer closed its connection")
        got += n


def cut(total, streams):
    base, extra = divmod(total, streams)
    return [base + (1 if i < extra else 0) for i in range(streams)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", type=int, required=True)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--addr-fmt", default="10.215.0.%d")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--op", default="ring")
    ap.add_argument("--size", type=int, default=0,
                    help="the collective's size, for the row (default: --bytes)")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("-w", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not 1 <= a.streams <= 255:
        ap.error("--streams: 1 to 255")
    me, H, S = a.host, a.hosts, a.streams
    addr = lambda i: a.addr_fmt % (i + 1)
    deadline = time.monotonic() + 60

    lsn = socket.socket()
    lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsn.bind((addr(me), a.port))
    lsn.listen(64)
    # each connection says which stream it is: a lost handshake packet can
    # change the order in which the listener accepts them
    nxt = [connect(addr((me + 1) % H), a.port, deadline) for _ in range(S)]
    for i, c in enumerate(nxt):
        c.sendall(bytes([i]))
    prv = [None] * S
    for _ in range(S):
        c, _ = lsn.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        i = bytearray(1)
        recv_exact(c, memoryview(i))
        prv[i[0]] = c
    token = bytearray(1)

    def barrier():
        # twice round the ring on the first connection: the first round
        # says everyone arrived, the second lets everyone go
        for _ in range(2):
            if me == 0:
                nxt[0].sendall(b"t")
                recv_exact(prv[0], memoryview(token))
            else:
                recv_exact(prv[0], memoryview(token))
                nxt[0].sendall(b"t")

    parts = cut(a.bytes, S)
    out = [memoryview(bytearray(max(parts[i], 1))) for i in range(S)]
    inb = [memoryview(bytearray(max(parts[i], 1))) for i in range(S)]

    # one thread moves everything, as a library's loop would: non-blocking
    # sockets under a selector (starting threads inside the timed window
    # cost 0.1-0.2 ms an iteration here)
    def transfer():
        sel = selectors.DefaultSelector()
        at = {}
        for i in range(S):
            if parts[i] == 0:
                continue
            for sock, ev, buf in ((nxt[i], selectors.EVENT_WRITE, out[i]),
                                  (prv[i], selectors.EVENT_READ, inb[i])):
                sock.setblocking(False)
                sel.register(sock, ev, buf[:parts[i]])
                at[sock] = 0
            set_lowat(prv[i], parts[i])
        try:
            while at:
                for key, ev in sel.select():
                    sock, buf, off = key.fileobj, key.data, at[key.fileobj]
                    if ev & selectors.EVENT_WRITE:
                        n = sock.send(buf[off:off + CHUNK])
                    else:
                        n = sock.recv_into(buf[off:], min(len(buf) - off, CHUNK))
                        if n == 0:
                            raise ConnectionError("the peer closed its connection")
                        if 0 < len(buf) - off - n < LOWAT:
                            set_lowat(sock, len(buf) - off - n)
                    at[sock] = off + n
                    if at[sock] == len(buf):
                        sel.unregister(sock)
                        del at[sock]
        finally:
            sel.close()
            for c in nxt + prv:
                c.setblocking(True)
            for c in prv:
                set_lowat(c, 1)

    times = []
    for it in range(a.w + a.n):
        barrier()
        t0 = time.perf_counter()
        try:
            transfer()
        except OSError as e:
            print(f"tcp_ring: host {me}: {e}", file=sys.stderr)
            return 1
        if it >= a.w:
            times.append(time.perf_counter() - t0)

    # every host's times to host 0, which keeps each iteration's slowest
    deadline = time.monotonic() + 60
    if me != 0:
        s = connect(addr(0), a.port + 1, deadline)
        s.sendall(json.dumps(times).encode() + b"\n")
        s.close()
        return 0
    col = socket.socket()
    col.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    col.bind((addr(0), a.port + 1))
    col.listen(64)
    for _ in range(H - 1):
        c, _ = col.accept()
        data = b""
        while not data.endswith(b"\n"):
            d = c.recv(65536)
            if not d:
                break
            data += d
        c.close()
        times = [max(x, y) for x, y in zip(times, json.loads(data))]
    med, lo = statistics.median(times) * 1e6, min(times) * 1e6
    size = a.size or a.bytes
    if a.json:
        print(json.dumps({"op": a.op, "world": H, "bytes": size,
                          "iters": a.n, "time_us": med, "min_us": lo,
                          "wire_bytes": a.bytes, "streams": S, "ok": True}))
    else:
        print(f"{a.op} hosts {H} bytes {size} ({a.bytes} a link) streams {S}: "
              f"median {med:.0f} us, min {lo:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
