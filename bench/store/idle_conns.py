#!/usr/bin/env python3
"""Holds N idle connections to HOST:PORT (bench/store's idle step).

Opens N TCP connections (in batches, retrying refused/reset ones), sends
nothing on them (like the idle second connection of every 1.13 client),
prints "ready N" on stdout once all are open, and sleeps until killed.
Standard library only.

Usage: idle_conns.py HOST PORT N
"""
import resource
import signal
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
deadline = time.monotonic() + 120
while len(socks) < n:
    try:
        s = socket.create_connection((host, port), timeout=10)
        socks.append(s)
    except OSError as e:
        if time.monotonic() > deadline:
            print("idle_conns: gave up after %d connections: %s"
                  % (len(socks), e), file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(0.05)
    if len(socks) % 256 == 0:
        time.sleep(0.01)  # let the server's accept loop keep up
print("ready %d" % len(socks), flush=True)
while True:
    signal.pause()
