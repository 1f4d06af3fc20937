#!/usr/bin/python3
"""bench/chaos/chaos.py - failures injected into running collectives,
uvccl side by side with Gloo (python3-torch) and Open MPI.

Every trial starts a world of W ranks of IMPL running the same
pseudo-random sequence of collectives with every result checked (see
uvccl_chaos.c, gloo_chaos.py, mpi_chaos.c), waits until all ranks are
past their warm-up, waits a random 0.2-1.0 s, then hits a random rank
other than 0 (rank 0 hosts the store for uvccl and Gloo):
  kill       SIGKILL
  stop       SIGSTOP (SIGKILLed once the trial is over)
  partition  its packets dropped both ways (blackhole routes; the ranks
             run in network namespaces on a bridge: root and iproute2)
and watches the others (the survivors) until they exit or DEADLINE s
pass. Per trial and survivor it records: did it report an error (and
when: detection time, from the injection to its report, same clock), its
exit (status or signal), a hang (still running at the deadline), wrong
results (never acceptable), and for uvccl whether it named the right rank
and went on after shrinking (20 more collectives, checked).

Usage: chaos.py --impl uvccl|gloo|mpi --kind kill|stop|partition
                [--trials N] [--world W] [--timeout S] [--heartbeat S]
                [--deadline S] [--json FILE]
Prints one JSON line per trial (also appended to --json)."""
import argparse
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = "/usr/bin/python3"
IP = next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(p)), None)
NET = "10.213.7."


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ip(*args, check=True):
    r = subprocess.run([IP] + list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.returncode


class Netns:
    """W namespaces on a bridge, rank r at NET r+1 (as t/netns.h)."""

    def __init__(self, w):
        self.w = w
        tag = os.getpid()
        self.ns = ["uvch%c%d" % (chr(ord("A") + r), tag) for r in range(w)]
        self.sw = "uvchS%d" % tag
        for n in self.ns + [self.sw]:
            ip("netns", "del", n, check=False)
            ip("netns", "add", n)
        ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        ip("-n", self.sw, "link", "set", "br0", "up")
        for r, n in enumerate(self.ns):
            port = "p%c" % chr(ord("A") + r)
            ip("-n", n, "link", "add", "eth0", "type", "veth", "peer", "name",
               port, "netns", self.sw)
            ip("-n", self.sw, "link", "set", port, "master", "br0")
            ip("-n", self.sw, "link", "set", port, "up")
            ip("-n", n, "addr", "add", NET + "%d/24" % (r + 1), "dev", "eth0")
            ip("-n", n, "link", "set", "eth0", "up")
            ip("-n", n, "link", "set", "lo", "up")

    def blackhole(self, victim, add):
        for r in range(self.w):
            for q in range(self.w):
                if q == r or (r != victim and q != victim):
                    continue
                ip("-n", self.ns[r], "route", "add" if add else "del",
                   "blackhole", NET + "%d/32" % (q + 1), check=False)

    def remove(self):
        for n in self.ns + [self.sw]:
            ip("netns", "del", n, check=False)


def rank_cmd(impl, a):
    if impl == "uvccl":
        return [os.path.join(ROOT, "build/bench/uvccl_chaos"), "--timeout",
                str(a.timeout), "--heartbeat", str(a.heartbeat)]
    return [PY, os.path.join(ROOT, "bench/chaos/gloo_chaos.py"), "--timeout",
            str(a.timeout)]


def start(impl, a, netns):
    """Popen objects (one per rank, or one mpirun)."""
    port = free_port()
    if impl == "mpi":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
               str(a.world), "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
               "--mca", "btl_tcp_if_include", "lo", "--mca",
               "oob_tcp_if_include", "lo",
               os.path.join(ROOT, "build/bench/mpi_chaos")]
        return [subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)]
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo")
        env.pop("UVCCL_SOCKET_IFNAME", None)
        cmd = rank_cmd(impl, a)
        if netns is not None:
            env["MASTER_ADDR"] = NET + "1"
            env["GLOO_SOCKET_IFNAME"] = "eth0"
            cmd = [IP, "netns", "exec", netns.ns[r]] + cmd
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def trial(impl, kind, a, netns):
    procs = start(impl, a, netns)
    sel = selectors.DefaultSelector()
    for p in procs:
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, p)
    lines, partial = [], {}
    ready, errs, bad, after = {}, {}, {}, {}

    def pump(t):
        for key, _ in sel.select(timeout=t):
            data = key.fileobj.read()
            if not data:
                sel.unregister(key.fileobj)
                continue
            buf = partial.get(key.fileobj, "") + data
            *done, rest = buf.split("\n")
            partial[key.fileobj] = rest
            for ln in done:
                lines.append(ln)
                f = ln.split()
                if not f:
                    continue
                if f[0] == "@ready":
                    ready[int(f[1])] = int(f[2])
                elif f[0] == "@err":
                    errs[int(f[1])] = (float(f[2]), f[3], f[4],
                                       ln.split("| ", 1)[-1][:200])
                elif f[0] == "@bad":
                    bad[int(f[1])] = bad.get(int(f[1]), 0) + int(f[3])
                elif f[0] == "@after":
                    after[int(f[1])] = (int(f[2]), int(f[3]), int(f[4]))

    rec = {"impl": impl, "kind": kind, "world": a.world}
    t0 = time.monotonic()
    while len(ready) < a.world and time.monotonic() - t0 < 60:
        pump(0.05)
        if all(p.poll() is not None for p in procs):
            break
    if len(ready) < a.world:
        rec["setup_failed"] = True
        rec["tail"] = lines[-5:]
        for p in procs:
            p.kill()
            p.wait()
        return rec
    time.sleep(random.uniform(0.2, 1.0))
    victim = random.randrange(1, a.world)
    vpid = ready[victim]
    t_inj = time.monotonic()
    if kind == "kill":
        os.kill(vpid, signal.SIGKILL)
    elif kind == "stop":
        os.kill(vpid, signal.SIGSTOP)
    else:
        netns.blackhole(victim, True)
    rec["victim"] = victim
    survivors = [r for r in range(a.world) if r != victim]
    deadline = t_inj + a.deadline
    while time.monotonic() < deadline:
        pump(0.05)
        if impl == "mpi":
            if procs[0].poll() is not None:
                rec["mpirun_exit_after_s"] = round(time.monotonic() - t_inj, 3)
                rec["mpirun_exit"] = procs[0].returncode
                break
        elif all(procs[r].poll() is not None for r in survivors):
            break
    hung = []
    for r in survivors:
        pid = ready[r]
        running = (procs[0].poll() is None and alive(pid)) if impl == "mpi" \
            else procs[r].poll() is None
        if running:
            hung.append(r)
    # end of the trial: everything goes
    if kind == "partition":
        netns.blackhole(victim, False)
    for r in range(a.world):
        try:
            os.kill(ready[r], signal.SIGKILL)
            os.kill(ready[r], signal.SIGCONT)
        except OSError:
            pass
    for p in procs:
        try:
            p.kill()
        except OSError:
            pass
        p.wait()
    pump(0)
    res = []
    for r in survivors:
        s = {"rank": r, "hung": r in hung}
        if r in errs:
            t, culprit, cause, msg = errs[r]
            s["detect_s"] = round(t - t_inj, 4)
            s["culprit"] = culprit
            s["cause"] = cause
            s["msg"] = msg
        if impl == "mpi":
            s["exit"] = None
        else:
            s["exit"] = procs[r].returncode
        s["bad"] = bad.get(r, 0)
        if r in after:
            s["after"] = after[r]
        res.append(s)
    rec["survivors"] = res
    if impl == "mpi":
        rec.setdefault("mpirun_exit", procs[0].returncode)
        rec["mpirun_says"] = [ln[:160] for ln in lines if ln and not ln.startswith("@")][:4]
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, choices=["uvccl", "gloo", "mpi"])
    ap.add_argument("--kind", required=True, choices=["kill", "stop", "partition"])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--heartbeat", type=float, default=3.0)
    ap.add_argument("--deadline", type=float, default=40.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    netns = None
    if a.kind == "partition":
        if a.impl == "mpi" or os.geteuid() != 0 or IP is None:
            rec = {"impl": a.impl, "kind": a.kind, "world": a.world,
                   "not_run": "partition needs root, iproute2 and ranks in "
                              "namespaces (mpirun cannot place them)"}
            print(json.dumps(rec), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            return
        netns = Netns(a.world)
    try:
        for i in range(a.trials):
            rec = trial(a.impl, a.kind, a, netns)
            rec["trial"] = i
            print(json.dumps(rec), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    finally:
        if netns is not None:
            netns.remove()


if __name__ == "__main__":
    main()
