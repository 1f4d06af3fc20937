#!/usr/bin/env python3
"""A client that stalls mid-request (bench/store's stall test).

Connects to HOST:PORT at once, waits DELAY seconds, then sends only the
first byte of an ADD request (its opcode) and stalls for HOLD seconds. Then,
with --finish, it sends the rest of the request (key "/stall", delta 1) and
reads the reply; without it, it just closes the connection.
With --dialect modern it first sends VALIDATE (00 CE F7 85 3C), so that the
stall is inside a modern-dialect request (opcode 4); 1.13 numbering is the
default (opcode 3). Standard library only; prints what it did to stderr.

Usage: stall_client.py HOST PORT [--delay S] [--hold S] [--finish]
                       [--dialect legacy|modern]
"""
import argparse
import socket
import struct
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("host")
ap.add_argument("port", type=int)
ap.add_argument("--delay", type=float, default=1.0)
ap.add_argument("--hold", type=float, default=2.0)
ap.add_argument("--finish", action="store_true")
ap.add_argument("--dialect", choices=["legacy", "modern"], default="legacy")
a = ap.parse_args()

t0 = time.monotonic()
s = socket.create_connection((a.host, a.port), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
op = 3
if a.dialect == "modern":
    s.sendall(b"\x00\xce\xf7\x85\x3c")
    op = 4
time.sleep(max(0.0, a.delay - (time.monotonic() - t0)))
s.sendall(bytes([op]))
t_stall = time.monotonic()
print("stall_client: sent opcode %d alone at t=%.3f s; holding %.1f s"
      % (op, t_stall - t0, a.hold), file=sys.stderr, flush=True)
time.sleep(a.hold)
if a.finish:
    key = b"/stall"
    s.sendall(struct.pack("<Q", len(key)) + key + struct.pack("<q", 1))
    reply = b""
    while len(reply) < 8:
        chunk = s.recv(8 - len(reply))
        if not chunk:
            break
        reply += chunk
    print("stall_client: finished the request at t=%.3f s, reply %r"
          % (time.monotonic() - t0, reply), file=sys.stderr, flush=True)
else:
    print("stall_client: closing without finishing at t=%.3f s"
          % (time.monotonic() - t0), file=sys.stderr, flush=True)
s.close()
