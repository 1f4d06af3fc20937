"""PyTorch's own TCPStore server (the 1.13 legacy daemon on Debian), for
t/1021-store-torch-server.c, and PyTorch 2.x's for t/1022-store-torch2.c.

usage: torch_store_server.py [libuv|legacy]

With a backend named (2.x only), use_libuv says which; a build without
libuv prints "unavailable=..." and exits 3.

Starts a master TCPStore on a free port, prints "port=P" and "pid=N", and
serves until its stdin reaches EOF (the test closes it, or dies). A
watchdog alarm ends it if nothing does.
"""
import datetime
import os
import signal
import sys

signal.alarm(int(os.environ.get("UVCCL_PY_ALARM", "150")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

kw = {}
if len(sys.argv) > 1:  # a backend named: PyTorch 2.x only
    kw["use_libuv"] = sys.argv[1] == "libuv"
try:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                          wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30), **kw)
except RuntimeError as e:
    if "libuv" not in str(e):
        raise
    print("unavailable=%s" % e, flush=True)  # a build without libuv
    sys.exit(3)
print("version=%s" % torch.__version__, flush=True)
print("backend=%s" % ("libuv" if getattr(store, "libuvBackend", False)
                      else "poll"), flush=True)
print("port=%d" % store.port, flush=True)
print("pid=%d" % os.getpid(), flush=True)
sys.stdin.read()
print("stopping", flush=True)
del store
print("stopped", flush=True)
