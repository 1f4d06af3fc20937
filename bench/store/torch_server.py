#!/usr/bin/python3
"""PyTorch 1.13's TCPStore server (legacy backend, the only one in 1.13) on
HOST:PORT (default 127.0.0.1, a free port). Prints "listening on HOST:PORT"
once the server is up, then sleeps until killed (SIGTERM: default action, immediate exit).
Must run with the Debian interpreter: /usr/bin/python3 (python3-torch).
Usage: /usr/bin/python3 torch_server.py [HOST] [PORT]
"""
import datetime
import signal
import sys

import torch
import torch.distributed as dist

host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
# is_master=True starts the server daemon thread in this process (and a
# client of its own, which stays idle); world_size None and
# wait_for_workers=False: no "init/" counting.
store = dist.TCPStore(host, port, None, True, datetime.timedelta(seconds=300),
                      wait_for_workers=False)
print("listening on %s:%d (torch %s)" % (host, store.port, torch.__version__),
      flush=True)
while True:
    signal.pause()
