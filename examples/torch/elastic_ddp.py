"""Elastic DDP on the uvccl backend: a rank dies, the survivors go on at
once, and its replacement joins the running job, which is whole again.

    PYTHONPATH=python build/bin/uvccl-run --respawn=1 --no-auth -n 4 \\
        python3 examples/torch/elastic_ddp.py --kill-rank 2 --kill-step 120

Needs a PyTorch with c10d's reconfigure API (2.14: init_process_group(
enable_reconfigure=True), _get_reconfigure_handle, _reconfigure).

uvccl-run serves the job's store for the whole run (--host-store, which
--respawn implies), so it outlives any rank, and starts a rank that died
again with UVCCL_JOIN=1. What happens:

- 4 ranks train a small model with DDP (SGD with momentum on a synthetic
  regression; each rank draws its own batch from (step, rank)).
- At --kill-step, rank --kill-rank kills itself (SIGKILL, its first life).
  The survivors' collective fails (uvccl names the rank); they meet in the
  store, agree who is left (the first proposal stored wins), reconfigure
  the world to the 3 of them and redo the step: no step is lost.
- The replacement starts with enable_reconfigure=True (no world yet), says
  it is there, and waits. Every --check-every steps rank 0 looks for
  joiners (and tells the others with a broadcast, so they all decide at
  the same step); then the members and the joiner reconfigure to 4, the
  members first (ranks kept), the joiner last.
- After each reconfigure the new rank 0 broadcasts the step, the model
  (DDP's own construction does it) and the optimizer's state: the joiner
  continues the loss curve where the others are.

Rank 0 prints the loss every --print-every steps and each change of the
world ("shrunk to 3 ranks", "grew to 4 ranks (rank 3 joined)"), with the
time since the kill; at the end, "final: ..." with the step count, the
steps lost (none: a failed step is tried again), the failed attempts, and
the time from the kill to training at full size.
"""
import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import uvccl_torch  # noqa: F401  (registers the "uvccl" backend)

P = "elastic/"  # the example's keys in the job's store


def log(*a):
    print(*a, flush=True)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)


def batch(step, rank, n=64):
    """A rank's batch at a step: the same wherever it is drawn."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(n, 16, generator=g)
    w = torch.arange(16, dtype=torch.float32) / 16.0
    y = (x @ w).unsqueeze(1) + 0.1 * torch.sin(3 * x[:, :1])
    return x, y


class Job:
    def __init__(self, args):
        self.args = args
        self.store = dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=args.timeout),
            use_libuv=False)
        self.life = int(os.environ.get("UVCCL_RESPAWN_COUNT", "0") or 0)
        self.joiner = os.environ.get("UVCCL_JOIN") == "1"
        self.first_rank = int(os.environ["RANK"])
        torch.manual_seed(0)  # every rank makes the same model
        self.model = Model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr,
                                   momentum=0.9)
        for p in self.model.parameters():  # the state exists from the start
            self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.step = 0
        self.round = 0        # reconfigures so far (the store's numbering)
        self.admitted = 0     # joiners let in so far
        self.redone = 0
        self.checked = -1     # the last step whose look for joiners is done
        dist.init_process_group(
            "uvccl", store=self.store, rank=self.first_rank,
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=args.timeout),
            enable_reconfigure=self.joiner)
        self.ddp = None

    # ---- the world ------------------------------------------------------

    def decide(self, r, members, uuid_hint=None):
        """Round r: every member left posts its handle; the first
        proposal stored (members in their rank order, then the joiners
        waiting, in arrival order) is what all of them apply."""
        s = self.store
        me = dist._get_reconfigure_handle()
        s.set(P + "r%d/alive/%d" % (r, dist.get_rank()), me)
        s.add(P + "r%d/count" % r, 1)
        t0 = time.time()
        while True:  # everyone expected, or no one more for a while
            n = s.add(P + "r%d/count" % r, 0)
            if n >= members or time.time() - t0 > self.args.settle:
                break
            time.sleep(0.01)
        alive = []
        for k in range(dist.get_world_size()):
            key = P + "r%d/alive/%d" % (r, k)
            if s.check([key]):
                alive.append(s.get(key).decode())
        nj = s.add(P + "joiners", 0)
        joiners = [s.get(P + "join/%d/handle" % i).decode()
                   for i in range(self.admitted, nj)]
        mine = "%d|%s" % (nj, ",".join(alive + joiners))
        won = s.compare_set(P + "r%d/decision" % r, "", mine).decode()
        got_nj, hs = won.split("|", 1)
        for i in range(self.admitted, int(got_nj)):
            s.set(P + "join/%d/round" % i, str(r))
        return int(got_nj), hs.split(",")

    def reconfigure(self, r, nj, handles, why):
        before = dist.get_world_size() if self.ddp is not None else 0
        t0 = time.time()
        dist._reconfigure(uuid=r, handles=handles).wait()
        self.round = r
        self.admitted = nj
        self.ddp = nn.parallel.DistributedDataParallel(self.model)
        # the step and the optimizer's state, from the new rank 0 (DDP's
        # construction sent the parameters)
        st = torch.tensor([self.step, self.redone, self.checked],
                          dtype=torch.int64)
        dist.broadcast(st, 0)
        self.step, self.redone, self.checked = (int(v) for v in st)
        for p in self.model.parameters():
            dist.broadcast(self.opt.state[p]["momentum_buffer"], 0)
        if dist.get_rank() == 0:
            kill = self.killed_at()
            since = " %.3f s after the kill" % (time.time() - kill) \
                if kill else ""
            n = dist.get_world_size()
            what = ("grew to %d ranks (%d joined)" % (n, n - before)
                    if n > before else "shrunk to %d ranks" % n
                    if n < before else "reconfigured, %d ranks" % n)
            log("%s at step %d%s (%s round %d: %.1f ms)" % (
                what, self.step, since, why, r, 1e3 * (time.time() - t0)))

    def killed_at(self):
        if self.store.check([P + "killed_at"]):
            return float(self.store.get(P + "killed_at").decode())
        return 0.0

    def join(self):
        s = self.store
        i = s.add(P + "joiners", 1) - 1
        s.set(P + "join/%d/handle" % i, dist._get_reconfigure_handle())
        r = int(s.get(P + "join/%d/round" % i).decode())  # waits
        won = s.get(P + "r%d/decision" % r).decode()
        nj, hs = won.split("|", 1)
        self.reconfigure(r, int(nj), hs.split(","), "join")

    # ---- training -------------------------------------------------------

    def train_step(self):
        x, y = batch(self.step, dist.get_rank())
        self.opt.zero_grad()
        loss = nn.functional.mse_loss(self.ddp(x), y)
        loss.backward()  # DDP's allreduce: a dead peer fails it here
        self.opt.step()
        # the mean loss over the world, for the curve
        l = loss.detach().clone()
        dist.all_reduce(l)
        return float(l) / dist.get_world_size()

    def run(self):
        a = self.args
        if self.joiner:
            self.join()
        else:
            self.reconfigure_first()
        full = int(os.environ["WORLD_SIZE"])
        full_again = None
        losses = {}
        while self.step < a.steps:
            if (not self.joiner and self.life == 0 and
                    self.first_rank == a.kill_rank and self.step == a.kill_step):
                self.store.set(P + "killed_at", repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                if self.step % a.check_every == 0 and \
                        self.checked != self.step:
                    n = torch.tensor([self.store.add(P + "joiners", 0)
                                      if dist.get_rank() == 0 else 0])
                    dist.broadcast(n, 0)
                    self.checked = self.step  # joiners get it from rank 0
                    if int(n) > self.admitted:
                        nj, hs = self.decide(self.round + 1,
                                             dist.get_world_size())
                        self.reconfigure(self.round + 1, nj, hs, "join")
                loss = self.train_step()
            except RuntimeError as e:
                if dist.get_rank() == 0 or a.verbose:
                    log("step %d failed: %s" % (self.step, str(e)[:160]))
                nj, hs = self.decide(self.round + 1,
                                     dist.get_world_size() - 1)
                self.redone += 1
                self.reconfigure(self.round + 1, nj, hs, "shrink")
                continue
            losses[self.step] = loss
            if dist.get_rank() == 0:
                if full_again is None and dist.get_world_size() == full and \
                        self.killed_at():
                    full_again = time.time() - self.killed_at()
                if self.step % a.print_every == 0:
                    log("step %d loss %.5f world %d" %
                        (self.step, loss, dist.get_world_size()))
            self.step += 1
            if a.step_ms:
                time.sleep(a.step_ms / 1e3)
        if dist.get_rank() == 0:
            first = losses.get(0, float("nan"))
            # no completed step is ever done again: a step that fails is
            # tried again by the new world (failed attempts)
            log("final: %d steps, loss %.5f -> %.5f, world %d, steps lost 0, "
                "failed attempts %d, full size again %s after the kill" %
                (self.step, first, losses[self.step - 1],
                 dist.get_world_size(), self.redone,
                 "%.3f s" % full_again if full_again is not None else "never"))
        dist.barrier()
        dist.destroy_process_group()

    def reconfigure_first(self):
        """The first world is the one init_process_group made: it only
        needs DDP and a known round."""
        self.ddp = nn.parallel.DistributedDataParallel(self.model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=120)
    ap.add_argument("--check-every", type=int, default=5)
    ap.add_argument("--print-every", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=10.0,
                    help="sleep after each step (the compute of a real model)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds a round waits for members that may be dead")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if not hasattr(dist, "_reconfigure"):
        log("elastic_ddp: PyTorch %s has no reconfigure API (2.14 or newer)"
            % torch.__version__)
        sys.exit(2)
    Job(args).run()


if __name__ == "__main__":
    main()
