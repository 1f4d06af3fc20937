"""DDP through the uvccl backend, beside Gloo, in one job.

One rank of a world started by torchrun (or any launcher setting RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The default group is uvccl's; a Gloo
group of the same ranks is made too. Each model trains twice from the same
initial parameters on the same synthetic data: once with DDP over uvccl,
once with DDP over Gloo. Each rank prints

    @check RANK OK NAME | detail     (the tests' verdicts)
    @time RANK BACKEND MODEL STEP_MS  (mean step time, after warm-up)

Options (environment): DDP_STEPS (100), DDP_MODELS ("mlp,cnn"; also
"big", about 25 M parameters, allreduce-bound), DDP_BACKENDS ("uvccl,gloo"),
DDP_DEVICE ("cpu"; "cuda": each rank trains on GPU RANK modulo the GPUs),
DDP_BATCH (samples per rank and step; default 32 for mlp, 16 cnn, 8 big:
"big" with 1 is closer to allreduce-bound, its 105 MB of gradients
outweighing the compute); "emb" (25.6 M parameters, a dense-gradient
embedding table and a small head) is allreduce-bound.
"""
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import uvccl_torch  # noqa: E402,F401  (registers "uvccl")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
steps = int(os.environ.get("DDP_STEPS", "100"))
models = os.environ.get("DDP_MODELS", "mlp,cnn").split(",")
backends = os.environ.get("DDP_BACKENDS", "uvccl,gloo").split(",")
device = os.environ.get("DDP_DEVICE", "cpu")
if device == "cuda":
    device = f"cuda:{rank % torch.cuda.device_count()}"
    torch.cuda.set_device(device)
torch.set_num_threads(1)


def _die_with_launcher():
    """A rank outlives a launcher killed outright (torchrun SIGKILLed by a
    test's timeout): then it goes too, rather than linger."""
    import threading
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


_die_with_launcher()


def check(ok, name, detail=""):
    print(f"@check {rank} {1 if ok else 0} {name} | {detail}", flush=True)


def make_model(kind):
    torch.manual_seed(1234)  # the same initial parameters on every rank
    if kind == "mlp":
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64),
                             nn.ReLU(), nn.Linear(64, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(16 * 4 * 4, 10))
    if kind == "emb":  # 25.6 M parameters, almost all in a table whose
        # gradient is dense (a recommender's embedding without sparse
        # gradients): little compute, 103 MB to allreduce every step
        return nn.Sequential(nn.Embedding(100_000, 256), nn.Flatten(),
                             nn.Linear(4 * 256, 64), nn.ReLU(),
                             nn.Linear(64, 10))
    if kind == "big":  # 26.3 M parameters (105 MB of float32 gradients)
        return nn.Sequential(nn.Linear(256, 4096), nn.ReLU(),
                             nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 2048), nn.ReLU(),
                             nn.Linear(2048, 10))
    raise ValueError(kind)


BATCH = {"mlp": 32, "cnn": 16, "big": 8, "emb": 32}


def batch(kind, step):
    g = torch.Generator().manual_seed(step * 100 + rank)
    n = int(os.environ.get("DDP_BATCH") or BATCH[kind])
    if kind == "emb":  # 4 ids per sample
        x = torch.randint(0, 100_000, (n, 4), generator=g)
    elif kind == "cnn":
        x = torch.randn(n, 1, 16, 16, generator=g)
    elif kind == "big":
        x = torch.randn(n, 256, generator=g)
    else:
        x = torch.randn(n, 32, generator=g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    return x, y


def train(kind, group):
    model = nn.parallel.DistributedDataParallel(make_model(kind).to(device),
                                                process_group=group)
    lr = 0.01 if kind == "big" else 0.05
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses, times = [], []
    for step in range(steps):
        x, y = batch(kind, step)
        x, y = x.to(device), y.to(device)
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    warm = times[min(5, len(times) - 1):]
    return model.module, losses, 1000 * sum(warm) / len(warm)


def same_everywhere(module, group):
    """Every parameter equal to rank 0's, exactly."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=group)
    return torch.equal(flat, ref), flat


def main():
    dist.init_process_group("uvccl")
    check(dist.get_backend() == "uvccl", "init",
          f"rank {rank} of {world} through {dist.get_backend()}")
    gloo = dist.new_group(backend="gloo") if "gloo" in backends else None
    for kind in models:
        results = {}
        for b in backends:
            group = None if b == "uvccl" else gloo
            module, losses, ms = train(kind, group)
            results[b] = (module, losses)
            print(f"@time {rank} {b} {kind} {ms:.3f}", flush=True)
        if "uvccl" not in results:
            continue
        module, losses = results["uvccl"]
        same, flat = same_everywhere(module, None)
        check(same, f"{kind}-equal", f"{kind}: {flat.numel()} parameters "
              f"equal on every rank after {steps} steps")
        if "gloo" in results:
            gmod, glosses = results["gloo"]
            gflat = torch.cat([p.detach().reshape(-1)
                               for p in gmod.parameters()])
            dl = max(abs(a - b) for a, b in zip(losses, glosses))
            dp = (flat - gflat).abs().max().item()
            # the sums' order differs (ring vs uvccl's algorithms): the
            # 26 M-parameter model's differences grow to ~1e-3 in 20 steps
            tol = 1e-2 if kind == "big" else 1e-4
            check(dl < tol and dp < tol, f"{kind}-gloo",
                  f"{kind}: losses within {dl:.2e} of Gloo's, parameters "
                  f"within {dp:.2e} (first loss {losses[0]:.4f}, last "
                  f"{losses[-1]:.4f})")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


try:
    main()
except Exception:
    check(False, "exception", traceback.format_exc().replace("\n", " / ")[-400:])
    sys.exit(1)
