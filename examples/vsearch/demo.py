#!/usr/bin/python3
"""make demo's look at uvccl-vsearch: 4 ranks under uvccl-run --keep-going
with rank 2 SIGKILLed 7 s in (uvccl-run --kill 2@7): a search for a stored
row, wrk for 3 s, then searches through the kill (503s naming rank 2, then
the 3 survivors answering with every row), /stats, a clean stop.
Usage: demo.py BUILD_DIR"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

build = sys.argv[1]
p = subprocess.Popen([os.path.join(build, "bin", "uvccl-run"), "-n", "4",
                      "--keep-going", "--kill", "2@7",
                      os.path.join(build, "bin", "uvccl-vsearch"), "--port",
                      "0", "--heartbeat", "2000"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, start_new_session=True)
t_start = time.time()
port = None
for line in p.stdout:
    if "listening on " in line:
        port = int(line.rsplit(":", 1)[1])
        print(f"  rank 0: {line.strip()} ({time.time() - t_start:.2f} s "
              "after the start: world, subgroups, 100,000 x 64 rows)")
        break
if port is None:
    sys.exit("uvccl-vsearch did not start")
log = []
threading.Thread(target=lambda: [log.append(l.rstrip()) for l in p.stdout],
                 daemon=True).start()
base = f"http://127.0.0.1:{port}"


def call(path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else
                                 json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


row = call("/rows/54321")[1]
t0 = time.time()
st, doc = call("/search", {"vector": row["vector"], "k": 3})
print(f"  POST /search (row 54321's vector, k 3): {st} in "
      f"{(time.time() - t0) * 1000:.1f} ms: {json.dumps(doc)}")
wrk = subprocess.run(["wrk", "-t2", "-c16", "-d3s", "--latency", "-s",
                      os.path.join(os.path.dirname(__file__), "..", "..",
                                   "bench", "server", "wrk.lua"),
                      base + "/", "--", "search"], capture_output=True,
                     text=True).stdout
for line in wrk.splitlines():
    if line.startswith("@wrk "):
        f = line.split()
        print(f"  wrk, 16 connections, 3 s: {float(f[2]):.0f} searches/s, "
              f"p50 {float(f[3]):.2f} ms, p99 {float(f[4]):.2f} ms, errors "
              f"{int(f[6]) + int(f[7])}")
st, s = call("/stats")
print(f"  /stats: {s['queries']} queries in {s['batches']} batches (mean "
      f"{s['mean_batch']}), ranks alive {s['ranks_alive']}")
print("  searching through rank 2's death (uvccl-run --kill 2@7) ...")
counts, first503 = {200: 0, 503: 0}, None
while time.time() - t_start < 11:
    i = int(time.time() * 1000) % 100000
    st, doc = call("/search", {"vector": call(f"/rows/{i}")[1]["vector"],
                               "k": 1})
    counts[st] = counts.get(st, 0) + 1
    if st == 503 and first503 is None:
        first503 = doc["error"]
print(f"  {counts[200]} answered, {counts[503]} got 503"
      + (f": {first503}" if first503 else ""))
st, doc = call("/healthz")
print(f"  GET /healthz: {st} {json.dumps(doc)}")
ok = all(call("/search", {"vector": call(f"/rows/{i}")[1]["vector"], "k": 1}
              )[1]["results"][0]["id"] == i for i in range(50000, 75000, 997))
print(f"  rows of rank 2's lost shard found by the survivors: "
      f"{'yes' if ok else 'NO'}")
st, s = call("/stats")
print(f"  /stats: state {s['state']}, ranks alive {s['ranks_alive']} of "
      f"{s['world_size']}, failed ranks {s['failed_ranks']}, epoch "
      f"{s['epoch']}")
os.killpg(p.pid, signal.SIGTERM)
p.wait(20)
for l in log:
    if "vsearch" in l or "uvccl-run" in l:
        print("  | " + l)
sys.exit(0 if ok else 1)
