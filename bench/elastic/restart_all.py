"""What a torchrun job does today when a rank dies, for the comparison with
examples/torch/elastic_ddp.py (same model, data, optimizer, kill):

    torchrun --nproc-per-node 4 --max-restarts 1 \\
        bench/elastic/restart_all.py --backend gloo --kill-rank 2 --kill-step 120

torchrun's agent stops every worker when one dies and starts them all
again; they rendezvous again, load the last checkpoint (rank 0 writes one
every --ckpt-every steps) and go on from its step. Rank 0 prints "final:
..." with the steps lost (done twice) and the time from the kill to the
first step at full size again (the kill time is written to the checkpoint
directory by the rank that dies).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples", "torch"))
from elastic_ddp import Model, batch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=120)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--ckpt-dir", default="/tmp/uvccl-restart-all")
    ap.add_argument("--print-every", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--lr", type=float, default=0.02)
    a = ap.parse_args()
    life = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if a.backend == "uvccl":
        import uvccl_torch  # noqa: F401
    # the agent's store, as env:// would reach it (a client made here: a
    # PyTorch built without libuv needs use_libuv=False said)
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60),
                          use_libuv=False)
    # each attempt its own keys, as env:// does under the agent
    store = dist.PrefixStore("/worker/attempt_%d" % life, store)
    dist.init_process_group(a.backend, store=store,
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    for p in model.parameters():
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    ckpt = os.path.join(a.ckpt_dir, "ckpt.pt")
    killed = os.path.join(a.ckpt_dir, "killed_at")
    step = 0
    if life == 0 and rank == 0:
        os.makedirs(a.ckpt_dir, exist_ok=True)
        for f in (ckpt, killed):
            if os.path.exists(f):
                os.unlink(f)
    dist.barrier()
    if life > 0 and os.path.exists(ckpt):
        st = torch.load(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
    resumed_from = step
    ddp = nn.parallel.DistributedDataParallel(model)
    reached = None  # the furthest step before the restart (lost = reached - step)
    if life > 0 and os.path.exists(killed):
        with open(killed) as f:
            t_kill, reached = f.read().split()
        t_kill, reached = float(t_kill), int(reached)
    full_again = None
    loss_v = float("nan")
    while step < a.steps:
        if life == 0 and rank == a.kill_rank and step == a.kill_step:
            with open(killed + ".tmp", "w") as f:
                f.write("%r %d" % (time.time(), step))
            os.rename(killed + ".tmp", killed)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        l = loss.detach().clone()
        dist.all_reduce(l)
        loss_v = float(l) / n
        if rank == 0 and reached is not None and full_again is None:
            full_again = time.time() - t_kill
        if rank == 0 and step % a.print_every == 0:
            print("step %d loss %.5f world %d" % (step, loss_v, n), flush=True)
        step += 1
        if rank == 0 and step % a.ckpt_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step}, ckpt + ".tmp")
            os.rename(ckpt + ".tmp", ckpt)
        if a.step_ms:
            time.sleep(a.step_ms / 1e3)
    if rank == 0:
        print("final: %d steps, loss -> %.5f, world %d, life %d, steps lost %s, "
              "full size again %s after the kill" % (
                  step, loss_v, n, life,
                  "%d" % (reached - resumed_from) if reached is not None
                  else "-",
                  "%.3f s" % full_again if full_again is not None else "never"),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
