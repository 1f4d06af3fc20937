"""PyTorch's own TCPStore server (the 1.13 legacy daemon on Debian), for
t/1021-store-torch-server.c.

usage: torch_store_server.py

Starts a master TCPStore on a free port, prints "port=P" and "pid=N", and
serves until its stdin reaches EOF (the test closes it, or dies). A
watchdog alarm ends it if nothing does.
"""
import datetime
import os
import signal
import sys

signal.alarm(int(os.environ.get("UVCCL_PY_ALARM", "150")))

import torch.distributed as dist  # noqa: E402

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
print("port=%d" % store.port, flush=True)
print("pid=%d" % os.getpid(), flush=True)
sys.stdin.read()
print("stopping", flush=True)
del store
print("stopped", flush=True)
