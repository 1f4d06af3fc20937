#!/usr/bin/python3
"""uvccl-vsearch (examples/vsearch) on 4 local ranks under uvccl-run
--keep-going, checked from outside through HTTP: answers against a
brute-force search in this script over the rows the service itself serves
(and those rows against the documented generator), under concurrent
clients, with bad inputs and a slow client, with a refresh allreduce
running, then with rank 2 killed mid-load and rank 1 stopped (SIGSTOP),
then a clean stop. Prints TAP. Usage: vsearch_check.py BUILD_DIR"""
import atexit
import http.client
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

build = sys.argv[1]
RUN = os.path.join(build, "bin", "uvccl-run")
VS = os.path.join(build, "bin", "uvccl-vsearch")
ROWS, DIM = 3000, 16
n_test = 0
failed = 0


def ok(cond, msg):
    global n_test, failed
    n_test += 1
    if not cond:
        failed += 1
    print(("ok" if cond else "not ok") + f" {n_test} - {msg}", flush=True)
    return cond


def note(msg):
    for line in str(msg).splitlines():
        print("# " + line, flush=True)


def diag(msg):
    """Like note, on stderr: prove shows it (the ranks' output on a
    failure; a CI log then says what went wrong)."""
    for line in str(msg).splitlines():
        print("# " + line, file=sys.stderr, flush=True)


# ---- the table, as table.h documents it ----------------------------------
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def value(seed, dim, i, j):
    h = splitmix64((seed * 0x9E3779B97F4A7C15 + i * dim + j) & M64)
    return (h >> 40) * (1.0 / 8388608.0) - 1.0


# ---- HTTP -------------------------------------------------------------------
class Client:
    def __init__(self, port, timeout=30):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def req(self, method, path, body=None):
        hdr = {"Content-Type": "application/json"} if body is not None else {}
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        try:
            self.c.request(method, path, body=body, headers=hdr)
            r = self.c.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError,
                ConnectionResetError):
            # the server closed an idle kept-alive connection (the client
            # timeout): a new one, as HTTP clients do
            self.c.close()
            self.c.request(method, path, body=body, headers=hdr)
            r = self.c.getresponse()
        data = r.read()
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = None
        return r.status, doc, data

    def close(self):
        self.c.close()


def brute(rows, vec, k):
    d = []
    for i, r in enumerate(rows):
        s = 0.0
        for a, b in zip(r, vec):
            s += (a - b) * (a - b)
        d.append((s, i))
    d.sort()
    return d[:k]


def check_answer(rows, vec, k, doc):
    """The reply's ids are the k nearest (ties and float32 rounding allowed
    for): each id's true distance equals the one reported, and the reported
    distances are the brute-force ones in order."""
    if not doc or "results" not in doc:
        return False, "no results"
    res = doc["results"]
    want = brute(rows, vec, k)
    if len(res) != len(want):
        return False, f"{len(res)} results, expected {len(want)}"
    for (wd, wi), r in zip(want, res):
        true = math.sqrt(sum((a - b) ** 2 for a, b in zip(rows[r["id"]], vec)))
        if abs(true - r["distance"]) > 1e-4 * max(1.0, true):
            return False, f"id {r['id']}: distance {r['distance']}, true {true}"
        if abs(math.sqrt(wd) - r["distance"]) > 1e-4 * max(1.0, true):
            return False, (f"rank {res.index(r)}: {r['id']} at {r['distance']}"
                           f", brute force {wi} at {math.sqrt(wd)}")
    return True, ""


# ---- the service ------------------------------------------------------------
class Service:
    def __init__(self, extra):
        self.p = subprocess.Popen(
            [RUN, "-n", "4", "--keep-going", VS, "--port", "0", "--rows",
             str(ROWS), "--dim", str(DIM), "--seed", "7", "--heartbeat",
             "1000", "--client-timeout", "1500", "--max-body", "1048576"]
            + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
        self.err = []
        # whatever happens to this script, the service goes with it
        atexit.register(self.kill)
        threading.Thread(target=self._drain_err, daemon=True).start()
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.p.stdout.readline()
            if not line:
                break
            if "listening on " in line:
                self.port = int(line.rsplit(":", 1)[1])
                break
        threading.Thread(target=self._drain_out, daemon=True).start()

    def _drain_err(self):
        for line in self.p.stderr:
            self.err.append(line.rstrip())

    def _drain_out(self):
        for _ in self.p.stdout:
            pass

    def rank_pid(self, rank):
        """The process of a rank: a child of uvccl-run whose RANK is rank."""
        kids = []
        for tid in os.listdir(f"/proc/{self.p.pid}/task"):
            with open(f"/proc/{self.p.pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        for pid in kids:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env:
                return pid
        return None

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self):
        try:
            os.killpg(self.p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            return None


def wait_healthy(port, ranks, timeout=20):
    deadline = time.time() + timeout
    doc = None
    while time.time() < deadline:
        try:
            c = Client(port, 5)
            st, doc, _ = c.req("GET", "/healthz")
            c.close()
            if st == 200 and doc["ranks_alive"] == ranks:
                return doc
        except OSError:
            pass
        time.sleep(0.1)
    return doc


def main():
    rng = random.Random(11)
    svc = Service(["--refresh-mb", "4", "--refresh-ms", "200"])
    if not ok(svc.port is not None, "4 ranks: rank 0 prints 'listening on "
              "HOST:P'"):
        diag("\n".join(svc.err[-20:]))
        svc.stop()
        print(f"1..{n_test}")
        return 1
    port = svc.port
    c = Client(port)
    st, doc, _ = c.req("GET", "/healthz")
    ok(st == 200 and doc == {"status": "ok", "ranks_alive": 4, "epoch": 0},
       f"GET /healthz: {st} {doc}")

    # every row, through the service; a few against the generator
    rows = []
    bad = None
    for i in range(ROWS):
        st, doc, _ = c.req("GET", f"/rows/{i}")
        if st != 200 or doc["id"] != i or len(doc["vector"]) != DIM:
            bad = (i, st, doc)
            break
        rows.append(doc["vector"])
    ok(bad is None, f"GET /rows/ID for all {ROWS} rows" +
       (f": row {bad}" if bad else ""))
    gen_ok = all(abs(rows[i][j] - value(7, DIM, i, j)) < 1e-7
                 for i in (0, 1, 1234, ROWS - 1) for j in range(DIM))
    ok(gen_ok, "rows equal table.h's generator (splitmix64 of seed, id, j)")

    # searches against brute force
    worst = ""
    good = 0
    for t in range(40):
        vec = [rng.uniform(-1, 1) for _ in range(DIM)]
        k = [1, 5, 10, 50][t % 4]
        st, doc, _ = c.req("POST", "/search", {"vector": vec, "k": k})
        fine, why = check_answer(rows, vec, k, doc) if st == 200 else (
            False, f"status {st}")
        good += fine
        if not fine and not worst:
            worst = why
    ok(good == 40, f"40 searches (k 1, 5, 10, 50) equal a brute-force search"
       f" over the rows ({good}/40){': ' + worst if worst else ''}")
    st, doc, _ = c.req("POST", "/search", {"vector": rows[2345]})
    ok(st == 200 and len(doc["results"]) == 10 and
       doc["results"][0] == {"id": 2345, "distance": 0} and
       doc["ranks"] == 4, "a stored row searched for comes first at distance"
       f" 0, k defaults to 10 ({doc['results'][:1] if doc else st})")

    # concurrent clients, each its own connection
    results = []
    lock = threading.Lock()

    def client_thread(seed, n):
        r = random.Random(seed)
        cc = Client(port)
        for _ in range(n):
            vec = [r.uniform(-1, 1) for _ in range(DIM)]
            k = r.choice([1, 3, 10])
            try:
                s, d, _ = cc.req("POST", "/search", {"vector": vec, "k": k})
            except OSError as e:
                s, d = str(e), None
            with lock:
                results.append((vec, k, s, d))
        cc.close()

    ths = [threading.Thread(target=client_thread, args=(100 + i, 25))
           for i in range(16)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    good = sum(1 for v, k, s, d in results
               if s == 200 and check_answer(rows, v, k, d)[0])
    st, stats, _ = c.req("GET", "/stats")
    ok(good == 400, f"16 clients x 25 concurrent searches: {good}/400 right")
    ok(stats["queries"] >= 441 and stats["batches"] <= stats["queries"] and
       stats["requests"]["5xx"] == 0,
       f"/stats: {stats['queries']} queries in {stats['batches']} batches "
       f"(mean {stats['mean_batch']}), p50 {stats['search_latency_us']['p50']}"
       f" us, p99 {stats['search_latency_us']['p99']} us")
    ok(stats["refreshes"]["ok"] >= 1 and stats["refreshes"]["bad"] == 0,
       f"the refresh allreduce (4 MiB every 200 ms) ran beside the searches: "
       f"{stats['refreshes']}")

    # bad input: clear errors, the service unaffected
    cases = [
        ("POST", "/search", '{"vector": [1, 2', 400, "ends early"),
        ("POST", "/search", "not json", 400, "invalid JSON"),
        ("POST", "/search", {"vector": [1, 2, 3]}, 400,
         f"vector has 3 numbers, expected {DIM}"),
        ("POST", "/search", {"vector": [0.5] * DIM, "k": 0}, 400,
         "k must be an integer from 1 to 100"),
        ("POST", "/search", {"vector": [0.5] * DIM, "k": 1000}, 400,
         "k must be"),
        ("POST", "/search", {"vector": [0.5] * DIM, "k": 2.5}, 400,
         "k must be"),
        ("POST", "/search", {"vector": ["a"] * DIM}, 400, "expected a number"),
        ("POST", "/search", '{"vector": [' + ",".join(["1e999"] * DIM) + "]}",
         400, "not a finite float"),
        ("POST", "/search", '{"vector": [NaN]}', 400, "invalid JSON"),
        ("POST", "/search", "[" * 100000, 400, "invalid JSON"),
        ("POST", "/search", '{"x": ' + "[" * 50 + "]" * 50 + "}", 400,
         "nested too deeply"),
        ("POST", "/search", '{"vector": [' + ",".join(["0"] * DIM) + "]} x",
         400, "trailing characters"),
        ("POST", "/search", "", 400, "invalid JSON"),
        ("GET", "/search", None, 405, "use POST /search"),
        ("GET", "/rows/abc", None, 400, "decimal number"),
        ("GET", f"/rows/{ROWS}", None, 404, "no such row"),
        ("GET", "/nope", None, 404, "not found"),
    ]
    bad = []
    for method, path, body, want, text in cases:
        try:
            st, doc, raw = c.req(method, path, body)
        except OSError as e:
            st, doc, raw = str(e), None, b""
            c = Client(port)
        if st != want or not doc or text not in doc.get("error", ""):
            bad.append(f"{method} {path} {str(body)[:30]!r}: {st} {raw[:100]!r}")
    ok(not bad, f"{len(cases)} bad requests get 400/404/405 with a clear "
       "message on the same connection" + (": " + "; ".join(bad) if bad else ""))
    # a body over the limit is refused when its length is announced, before
    # it is sent (a client that sends it anyway may see the reset that
    # follows)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: 2097152\r\n\r\n{")
    s.settimeout(10)
    try:
        got = s.recv(4096)
    except OSError as e:
        got = str(e).encode()
    s.close()
    ok(got.startswith(b"HTTP/1.1 413 "), f"a 2 MiB body gets 413 (limit "
       f"1 MiB): {got[:30]!r}")

    # a slow client: its connection closed at the client timeout, others
    # served meanwhile
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    t0 = time.time()
    st, doc, _ = Client(port).req("POST", "/search", {"vector": rows[7], "k": 1})
    ok(st == 200 and doc["results"][0]["id"] == 7,
       "another client is served while a slow one holds a request half sent")
    s.settimeout(10)
    try:
        got = s.recv(4096)
    except socket.timeout:
        got = b"(still open after 10 s)"
    waited = time.time() - t0
    ok(got == b"" or b" 408 " in got or b" 400 " in got,
       f"the slow client's connection is closed by the server after "
       f"{waited:.1f} s (client timeout 1.5 s): {got[:40]!r}")
    s.close()
    st, doc, _ = c.req("GET", "/healthz")
    ok(st == 200 and doc["status"] == "ok", "healthy after the bad input")

    # rank 2 killed mid-load: every request answered, 200 right or 503 naming
    # rank 2; then the survivors serve every row again
    results.clear()
    stop = threading.Event()

    def load_thread(seed):
        r = random.Random(seed)
        cc = Client(port)
        while not stop.is_set():
            i = r.randrange(ROWS)
            try:
                s_, d, _ = cc.req("POST", "/search", {"vector": rows[i], "k": 1})
            except OSError as e:
                s_, d = "connection: " + str(e), None
                cc = Client(port)
            with lock:
                results.append((i, s_, d))
        cc.close()

    ths = [threading.Thread(target=load_thread, args=(200 + i,))
           for i in range(8)]
    for th in ths:
        th.start()
    time.sleep(1.0)
    pid2 = svc.rank_pid(2)
    os.kill(pid2, signal.SIGKILL)
    t_kill = time.time()
    time.sleep(2.5)
    stop.set()
    for th in ths:
        th.join()
    n200 = sum(1 for i, s_, d in results if s_ == 200 and
               d["results"][0] == {"id": i, "distance": 0})
    n503 = [d for i, s_, d in results if s_ == 503]
    other = [(i, s_, d) for i, s_, d in results if s_ not in (200, 503) or
             (s_ == 200 and d["results"][0] != {"id": i, "distance": 0})]
    named = all("rank 2 " in d.get("error", "") for d in n503)
    ok(not other and n200 > 0, f"rank 2 SIGKILLed under 8 clients' load: "
       f"{len(results)} requests, {n200} right, {len(n503)} 503, "
       f"{len(other)} else{': ' + str(other[:2]) if other else ''}")
    ok(named, "each 503 names rank 2: " +
       (n503[0]["error"] if n503 else "(none: the kill fell between batches)"))
    doc = wait_healthy(port, 3)
    ok(doc is not None and doc.get("ranks_alive") == 3,
       f"the service goes on with 3 ranks: {doc}")
    st, stats, _ = c.req("GET", "/stats")
    ok(stats["failed_ranks"] == [2] and "rank 2" in stats["last_failure"],
       f"/stats names the failed rank: {stats['failed_ranks']}, "
       f"{stats['last_failure'][:90]}")
    miss = [i for i in range(0, ROWS, 7) if c.req(
        "POST", "/search", {"vector": rows[i], "k": 1})[1]["results"][0]
        != {"id": i, "distance": 0}]
    ok(not miss, f"every 7th row (rank 2's shard included) found at distance"
       f" 0 by the 3 survivors{': missing ' + str(miss[:5]) if miss else ''}")
    vec = [rng.uniform(-1, 1) for _ in range(DIM)]
    st, doc, _ = c.req("POST", "/search", {"vector": vec, "k": 20})
    fine, why = check_answer(rows, vec, 20, doc) if st == 200 else (False, st)
    ok(fine and doc["ranks"] == 3, f"a k=20 search after the shrink equals "
       f"brute force {why}")

    # rank 1 stopped (hung): found by the heartbeats, named, shrunk away
    pid1 = svc.rank_pid(1)
    os.kill(pid1, signal.SIGSTOP)
    t0 = time.time()
    st, doc, _ = c.req("POST", "/search", {"vector": rows[5], "k": 1})
    waited = time.time() - t0
    ok(st == 503 and "rank 1 " in doc["error"] and "heartbeat" in doc["error"],
       f"a search while rank 1 is stopped: {st} after {waited:.1f} s: "
       f"{doc.get('error', '') if doc else ''}")
    doc = wait_healthy(port, 2)
    ok(doc is not None and doc.get("ranks_alive") == 2,
       f"the service goes on with 2 ranks: {doc}")
    miss = [i for i in range(0, ROWS, 11) if c.req(
        "POST", "/search", {"vector": rows[i], "k": 1})[1]["results"][0]
        != {"id": i, "distance": 0}]
    ok(not miss, "every 11th row found by the 2 survivors")
    try:
        os.kill(pid1, signal.SIGKILL)  # (a stopped process dies of it too)
    except ProcessLookupError:
        pass
    c.close()

    # a clean stop
    t0 = time.time()
    rc = svc.stop()
    ok(rc is not None, f"SIGTERM stops the service in {time.time() - t0:.1f}"
       f" s (uvccl-run exit status {rc})")
    leftovers = [l for l in svc.err if "AddressSanitizer" in l or
                 "runtime error" in l or "LeakSanitizer" in l]
    ok(not leftovers, "no sanitizer report" +
       (": " + leftovers[0] if leftovers else ""))
    if failed:
        # a sanitizer's report whole (it may be longer than the tail)
        first = next((i for i, l in enumerate(svc.err) if "Sanitizer" in l
                      or "runtime error" in l), None)
        if first is not None:
            diag("\n".join(svc.err[max(0, first - 5):first + 80]))
        diag("\n".join(svc.err[-40:]))
    print(f"1..{n_test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
