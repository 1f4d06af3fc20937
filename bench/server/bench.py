#!/usr/bin/python3
"""The HTTP service under load: uvccl-vsearch (H2O + uvccl on one loop)
against the same service in Python (asyncio + torch.distributed Gloo in a
thread pool, bench/server/py_vsearch.py), 4 ranks on this host, 100,000
rows of 64 floats. wrk at 1, 16, 64 and 256 connections for SECONDS each:
requests/s, p50/p99/max latency, errors; then /healthz alone (4
connections). Each service twice: idle, and with a 64 MiB allreduce every
second beside the searches. Prints markdown tables.

  bench/server/run.sh [SECONDS]      # default 10"""
import os
import socket
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.environ.get("UVCCL_BUILD_DIR", os.path.join(root, "build"))
secs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
RUN = os.path.join(build, "bin", "uvccl-run")
here = os.path.join(root, "bench", "server")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(impl, refresh):
    port = free_port()
    extra = ["--refresh-mb", "64", "--refresh-ms", "1000"] if refresh else []
    if impl == "uvccl":
        cmd = [RUN, "-n", "4", os.path.join(build, "bin", "uvccl-vsearch"),
               "--port", str(port)] + extra
    else:
        cmd = [RUN, "-n", "4", "/usr/bin/python3",
               os.path.join(here, "py_vsearch.py"), "--port", str(port)] + extra
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line or "listening on" in line:
            break
    time.sleep(1)
    return p, port


def stop(p):
    import signal
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(10)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def wrk(port, conns, args):
    cmd = ["wrk", "-t", str(min(2, conns)), "-c", str(conns), "-d",
           f"{secs}s", "--timeout", "10s", "-s", os.path.join(here, "wrk.lua"),
           f"http://127.0.0.1:{port}/", "--"] + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("@wrk "):
            f = line.split()[1:]
            return {"n": int(f[0]), "rps": float(f[1]), "p50": float(f[2]),
                    "p99": float(f[3]), "max": float(f[4]),
                    "status": int(f[5]), "sock": int(f[6])}
    return None


rows = []
for refresh in (False, True):
    for impl in ("uvccl", "python"):
        p, port = start(impl, refresh)
        for c in (1, 16, 64, 256):
            rows.append((refresh, impl, f"search, {c} conn",
                         wrk(port, c, ("search", str(c), "64"))))
        rows.append((refresh, impl, "healthz, 4 conn",
                     wrk(port, 4, ("healthz",))))
        stop(p)

name = {"uvccl": "uvccl-vsearch (H2O + uvccl)",
        "python": "Python asyncio + Gloo (thread pool)"}
for refresh in (False, True):
    print(f"\n{'with a 64 MiB allreduce every second' if refresh else 'idle'}"
          f" ({secs} s per row, 4 ranks, 100,000 x 64 rows)\n")
    print("| service | load | requests/s | p50 ms | p99 ms | max ms | errors |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for rf, impl, load, r in rows:
        if rf != refresh:
            continue
        if r is None:
            print(f"| {name[impl]} | {load} | (wrk failed) | | | | |")
            continue
        err = r["status"] + r["sock"]
        print(f"| {name[impl]} | {load} | {r['rps']:.0f} | {r['p50']:.2f} | "
              f"{r['p99']:.2f} | {r['max']:.1f} | {err} |")
