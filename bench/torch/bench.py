"""uvccl vs Gloo through PyTorch, side by side in one job.

    bench/torch/bench.py allreduce WORLD [ROUNDS]
    bench/torch/bench.py ddp WORLD MODEL STEPS [BATCH]
    bench/torch/bench.py fsdp2 WORLD STEPS [BATCH]

Starts WORLD ranks of itself on this host (env://). Every rank has both
backends: the default group is uvccl's, and a Gloo group of the same ranks
is made beside it, so both see the same machine at the same time.

allreduce: float32 dist.all_reduce at 4 B and 4 KiB (latency) and 1, 16,
64 MiB (bus bandwidth, 2(n-1)/n x bytes / time, as nccl-tests count it).
Each of ROUNDS rounds times every size on Gloo, then on uvccl; a cell is
the median over the rounds of each round's mean. Prints a markdown table.

ddp: DistributedDataParallel training of MODEL (t/py/torch_ddp.py's "mlp",
"cnn" or "big", about 25 M parameters) for STEPS steps on each backend,
BATCH samples per rank and step (default: the model's, see torch_ddp.py;
"big" with 1 is allreduce-bound); prints the mean step time (after 5
warm-up steps) and samples/s.

fsdp2: fully_shard (FSDP2) of an 8-layer 1024-wide MLP on a CPU DeviceMesh
over each backend's group (PyTorch 2.x whose FSDP2 runs on CPU: 2.14, not
2.6); the same columns as ddp.
"""
import os
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def launch(argv, world):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   BENCH_RANK="1", PYTHONWARNINGS="ignore",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__] + argv,
                                      env=env, stdout=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.stderr.write("".join(outs))
        sys.exit("a rank failed")
    return outs[0]


# ---- ranks ------------------------------------------------------------------

def rank_allreduce(rounds):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(root, "python"))
    import uvccl_torch  # noqa: F401
    torch.set_num_threads(1)
    # BENCH_DEVICE=cuda: CUDA tensors (uvccl through NCCL where each rank
    # has its own GPU, else staged; PyTorch's own NCCL beside, where it can
    # run: a GPU per rank)
    dev = os.environ.get("BENCH_DEVICE", "cpu")
    rank = int(os.environ["RANK"])
    if dev == "cuda":
        dev = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(dev)
    dist.init_process_group("uvccl")
    n = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    backends = [("gloo", gloo), ("uvccl", None)]
    if dev != "cpu" and torch.cuda.device_count() >= n:
        backends.append(("nccl", dist.new_group(backend="nccl")))
    mode = ""
    if dev != "cpu":
        pg = dist.distributed_c10d._get_default_group()
        mode = pg._get_backend(torch.device("cuda")).cuda_mode()
    sizes = [4, 4096, 1 << 20, 16 << 20, 64 << 20]
    res = {(b, s): [] for b, _ in backends for s in sizes}
    sync = torch.cuda.synchronize if dev != "cpu" else (lambda: None)

    def iters(size):
        return {4: 2000, 4096: 1000, 1 << 20: 60, 16 << 20: 8}.get(size, 3)

    for _ in range(rounds):
        for size in sizes:
            t = torch.ones(size // 4, device=dev)
            for b, g in backends:
                k = iters(size)
                for _ in range(max(2, k // 20)):  # warm
                    dist.all_reduce(t, group=g)
                sync()
                dist.barrier(group=g)
                t0 = time.perf_counter()
                for _ in range(k):
                    dist.all_reduce(t, group=g)
                sync()
                res[(b, size)].append((time.perf_counter() - t0) / k)
    if dist.get_rank() == 0:
        where = "CPU tensors" if dev == "cpu" else \
            f"CUDA tensors ({torch.cuda.get_device_name()}, uvccl {mode})"
        print(f"allreduce float32 through PyTorch {torch.__version__}, {where}, "
              f"{n} ranks on one host, {rounds} rounds (median of the rounds' "
              f"means)\n")
        nccl = any(b == "nccl" for b, _ in backends)
        print("| size | Gloo | uvccl | uvccl vs Gloo |" +
              (" PyTorch NCCL |" if nccl else ""))
        print("|---:|---:|---:|---:|" + ("---:|" if nccl else ""))
        for size in sizes:
            g = statistics.median(res[("gloo", size)])
            u = statistics.median(res[("uvccl", size)])
            c = statistics.median(res[("nccl", size)]) if nccl else None
            if size <= 4096:
                cell = lambda x: f"{x * 1e6:.1f} us"  # noqa: E731
                ratio = f"{g / u:.2f}x faster"
            else:
                f = 2 * (n - 1) / n if n > 1 else 1  # one rank: algbw
                bw = lambda x: f * size / x / 1e9  # noqa: E731
                cell = lambda x: f"{bw(x):.2f} GB/s busbw"  # noqa: E731
                ratio = f"{bw(u) / bw(g):.2f}x the bandwidth"
            label = f"{size} B" if size < 1024 else (
                f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB")
            print(f"| {label} | {cell(g)} | {cell(u)} | {ratio} |" +
                  (f" {cell(c)} |" if nccl else ""))
    dist.destroy_process_group()


def rank_ddp(model, steps, batch):
    env = dict(os.environ, DDP_MODELS=model, DDP_STEPS=str(steps),
               DDP_BATCH=str(batch or ""),
               DDP_BACKENDS="gloo,uvccl",
               DDP_DEVICE=os.environ.get("BENCH_DEVICE", "cpu"))
    os.environ.update(env)
    sys.argv = [os.path.join(root, "t", "py", "torch_ddp.py")]
    import runpy
    runpy.run_path(sys.argv[0], run_name="__main__")


def rank_fsdp2(steps, batch):
    """FSDP2 (fully_shard, one unit a layer) of an MLP of 8 layers of
    1024 x 1024 (8.4 M parameters) on a CPU DeviceMesh over each backend's
    group in turn: mean step time after 5 warm-up steps, rank 0's clock;
    the two runs start from the same parameters and inputs, and their
    final losses are compared."""
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(root, "python"))
    import uvccl_torch  # noqa: F401
    from torch.distributed.device_mesh import DeviceMesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group("uvccl")
    rank = dist.get_rank()
    groups = {"gloo": dist.new_group(backend="gloo"),
              "uvccl": dist.group.WORLD}
    losses = {}
    for name in ("gloo", "uvccl"):
        mesh = DeviceMesh.from_group(groups[name], "cpu")
        torch.manual_seed(0)
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(batch, 1024, generator=g)
        times = []
        for _ in range(steps + 5):
            t0 = time.perf_counter()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        losses[name] = loss.item()
        dist.barrier(group=groups[name])
        if rank == 0:
            print(f"@time {rank} {name} fsdp2 {statistics.mean(times[5:]) * 1000:.3f}",
                  flush=True)
    ok = abs(losses["gloo"] - losses["uvccl"]) <= 1e-5 * max(1.0, abs(losses["gloo"]))
    print(f"@check {rank} {1 if ok else 0} fsdp2_loss | {losses}", flush=True)
    dist.destroy_process_group()


# ---- main -------------------------------------------------------------------

def main():
    mode = sys.argv[1]
    world = int(sys.argv[2])
    if os.environ.get("BENCH_RANK"):
        if mode == "allreduce":
            rank_allreduce(int(sys.argv[3]) if len(sys.argv) > 3 else 5)
        elif mode == "fsdp2":
            rank_fsdp2(int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 32)
        else:
            rank_ddp(sys.argv[3], int(sys.argv[4]),
                     int(sys.argv[5]) if len(sys.argv) > 5 else 0)
        return
    out = launch(sys.argv[1:], world)
    if mode == "allreduce":
        sys.stdout.write(out)
        return
    if mode == "fsdp2":
        model, steps = "fsdp2 MLP 8x1024", int(sys.argv[3])
        batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    else:
        model, steps = sys.argv[3], int(sys.argv[4])
    times = {}
    for line in out.splitlines():
        if line.startswith("@time "):
            _, _, b, m, ms = line.split()
            times[b] = float(ms)
        elif line.startswith("@check ") and line.split()[2] == "0":
            sys.exit("check failed: " + line)
    if mode != "fsdp2":
        batch = int(sys.argv[5]) if len(sys.argv) > 5 else \
            {"mlp": 32, "cnn": 16, "big": 8, "emb": 32}[model]
    g, u = times["gloo"], times["uvccl"]
    print(f"| {model}, batch {batch} | {world} | {steps} | {g:.2f} ms | {u:.2f} ms | "
          f"{(u / g - 1) * 100:+.0f}% | {batch * world / g * 1000:.0f} | "
          f"{batch * world / u * 1000:.0f} |")


if __name__ == "__main__":
    main()
