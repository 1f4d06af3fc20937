"""One rank of what runs on top of a CPU backend in PyTorch 2.x, for
t/run-torch2-ontop.sh, which runs it once with T_BACKEND=uvccl and once
with T_BACKEND=gloo in the same root and compares what each rank printed.

Prints "@res RANK NAME VALUE" (a result, the same with either backend),
"@check RANK OK NAME | detail" (a property of this run) and
"@skip RANK NAME | why" (this PyTorch lacks it). Every input is seeded, so
the two runs compute the same numbers; floating results are printed with
the precision that the same reductions in any order keep.
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
backend = os.environ.get("T_BACKEND", "uvccl")
if backend == "uvccl":
    import uvccl_torch  # noqa: F401  (registers "uvccl")


def res(name, value):
    print(f"@res {rank} {name} {value}", flush=True)


def check(ok, name, detail=""):
    print(f"@check {rank} {1 if ok else 0} {name} | {detail}", flush=True)


def skip(name, why):
    print(f"@skip {rank} {name} | {why}", flush=True)


def fmt(t):
    return "[" + ",".join("%.5g" % x for x in t.detach().flatten().tolist()) + "]"


def functional():
    """The functional collectives (what torch.compile, DTensor and FSDP2
    call): all_reduce, all_gather_tensor, reduce_scatter_tensor,
    all_to_all_single, each waited for."""
    import torch.distributed._functional_collectives as fc
    g = dist.group.WORLD
    x = torch.arange(4 * world, dtype=torch.float32) + rank
    res("fc_all_reduce", fmt(fc.wait_tensor(fc.all_reduce(x, "sum", g))))
    res("fc_all_gather", fmt(fc.wait_tensor(
        fc.all_gather_tensor(x[:3].contiguous(), 0, g))))
    res("fc_reduce_scatter", fmt(fc.wait_tensor(
        fc.reduce_scatter_tensor(x, "sum", 0, g))))
    res("fc_all_to_all", fmt(fc.wait_tensor(
        fc.all_to_all_single(x, None, None, g))))
    if hasattr(fc, "all_gather_into_tensor_coalesced"):
        outs = fc.all_gather_into_tensor_coalesced([x[:2].contiguous(), x[2:5].contiguous()], g)
        res("fc_all_gather_coalesced", "|".join(fmt(fc.wait_tensor(o)) for o in outs))


def dtensor():
    """DeviceMesh and DTensor on CPU: a sharded tensor made whole again,
    redistributed, and a matmul of sharded operands."""
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.tensor import (Replicate, Shard,
                                              distribute_tensor)
    except ImportError:
        from torch.distributed._tensor import (Replicate, Shard,
                                               distribute_tensor)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(7)
    a = torch.randn(4 * world, 6)
    b = torch.randn(6, 5)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    res("dt_local_shape", list(da.to_local().shape))
    res("dt_full", fmt(da.full_tensor().sum(0)))
    res("dt_matmul", fmt((da @ db).full_tensor().sum(0)))
    res("dt_redistribute", fmt(da.redistribute(mesh, [Shard(1)]).to_local().sum(0)))
    check(torch.allclose((da @ db).full_tensor(), a @ b, atol=1e-5),
          "dtensor", "sharded matmul equals the local one")


def mlp():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def batch(step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train(forward, model, steps):
    """steps SGD steps of forward on this rank's batches: the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def fsdp2():
    """fully_shard (FSDP2) of an MLP on a CPU mesh, 5 SGD steps: the losses
    and the parameters after, made whole."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            skip("fsdp2", f"PyTorch {torch.__version__} has no fully_shard")
            return
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = train(model, model, 5)
    res("fsdp2_losses", "[" + ",".join("%.5g" % v for v in losses) + "]")
    total = sum(p.full_tensor().double().sum().item() for p in model.parameters())
    res("fsdp2_params", "%.6g" % total)


def compiled_ddp():
    """torch.compile of a DDP model (dynamo's DDPOptimizer splits the graph
    at the buckets; aot_eager: no C++ code generation): losses and
    parameters after 3 steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(mlp())
    compiled = torch.compile(model, backend="aot_eager")
    losses = train(compiled, model, 3)
    res("cddp_losses", "[" + ",".join("%.5g" % v for v in losses) + "]")
    res("cddp_params", "%.6g" % sum(p.double().sum().item()
                                    for p in model.parameters()))


def detail():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the runner for this whole
    run): c10d wraps the backend in its ProcessGroupWrapper, which checks
    each collective's fingerprint against the other ranks' first; an
    allreduce of mismatched shapes is reported as such, not run."""
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") != "DETAIL":
        skip("detail", "not asked")
        return
    t = torch.ones(3)
    dist.all_reduce(t)
    res("detail_all_reduce", fmt(t))
    b = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    wrapped = type(b).__name__
    try:
        dist.all_reduce(torch.ones(2 + rank))
        check(False, "detail", f"{wrapped}: mismatched shapes ran")
    except RuntimeError as e:
        msg = str(e)
        check("Detected mismatch between collectives on ranks" in msg,
              "detail", f"{wrapped}: " + msg.splitlines()[0][:160])


def main():
    dist.init_process_group(backend, init_method="env://", rank=rank,
                            world_size=world)
    only = os.environ.get("T_ONLY", "")
    for f in (functional, dtensor, fsdp2, compiled_ddp, detail):
        if only and f.__name__ not in only.split(","):
            continue
        try:
            f()
        except Exception as e:  # noqa: BLE001  (reported, the next one runs)
            check(False, f.__name__, f"{type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''}")
            traceback.print_exc()
        if f is not detail:
            dist.barrier()
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


main()
