"""One rank of the CUDA-tensor checks of the uvccl backend (t/run-torch-cuda.sh).

Every operation runs twice on the uvccl default group, on the same inputs:
once on CPU tensors (which t/5001 checks against Gloo) and once on CUDA
tensors; the CUDA results must equal the CPU ones. Then: the transport the
ranks agreed on (T_MODE: nccl or staged), the caller's stream ordering the
inputs, async work and futures, a CUDA tensor on the wrong device. Run with
env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); prints "@check RANK OK
NAME | detail" lines.
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
import uvccl_torch  # noqa: E402

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
R = dist.ReduceOp


def check(ok, name, detail=""):
    print(f"@check {rank} {1 if ok else 0} {name} | {detail}", flush=True)


def inputs(seed, n, dtype, dev, r=None):
    g = torch.Generator().manual_seed(seed * 1000 + (rank if r is None else r))
    t = torch.randint(-50, 50, (n,), generator=g)
    if dtype.is_floating_point:
        t = t.to(dtype) / 4
    elif dtype == torch.bool:
        t = t > 0
    elif dtype == torch.uint8:
        t = t.abs().to(dtype)
    else:
        t = t.to(dtype)
    return t.to(dev)


def ops(dev):
    """name -> result tensor (on the host), every operation on dev."""
    out = {}
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
               torch.int32, torch.int64, torch.uint8, torch.int8):
        for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
            t = inputs(1, 37, dt, dev)
            if op == R.PRODUCT:
                t = (t.abs() % 3 + 1).to(dt)
            dist.all_reduce(t, op=op)
            out[f"allreduce {dt} {op}"] = t.cpu()
    for op in (R.BAND, R.BOR, R.BXOR):  # staged on every rank under NCCL
        t = inputs(2, 16, torch.int32, dev)
        dist.all_reduce(t, op=op)
        out[f"allreduce int32 {op}"] = t.cpu()
    t = inputs(3, 40, torch.float32, dev)
    dist.all_reduce(t, op=R.AVG)
    out["allreduce AVG"] = t.cpu()
    t = inputs(4, 33, torch.float64, dev)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.25))
    out["premul_sum"] = t.cpu()
    t = inputs(5, 1000, torch.float32, dev)
    dist.broadcast(t, src=world - 1)
    out["broadcast"] = t.cpu()
    t = inputs(6, 100, torch.float32, dev)
    dist.reduce(t, dst=1 % world)
    if rank == 1 % world:
        out["reduce"] = t.cpu()
    t = inputs(7, 10, torch.int64, dev)
    outs = [torch.zeros(10, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(outs, t)
    out["all_gather"] = torch.cat(outs).cpu()
    flat = torch.zeros(world * 10, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(flat, t)
    out["all_gather_into_tensor"] = flat.cpu()
    big = inputs(8, 64, torch.float32, dev)
    dist.all_reduce(big[::2])  # non-contiguous
    out["allreduce non-contiguous"] = big.cpu()
    t = inputs(9, 12, torch.float32, dev)
    if rank == 0:
        gl = [torch.zeros(12, device=dev) for _ in range(world)]
        dist.gather(t, gather_list=gl, dst=0)
        out["gather"] = torch.cat(gl).cpu()
    else:
        dist.gather(t, dst=0)
    r = torch.zeros(6, device=dev)
    sl = [inputs(10, 6, torch.float32, dev) + i for i in range(world)]
    dist.scatter(r, scatter_list=sl if rank == world - 1 else None,
                 src=world - 1)
    out["scatter"] = r.cpu()
    ins = [inputs(11 + i, 5, torch.float32, dev) for i in range(world)]
    r = torch.zeros(5, device=dev)
    dist.reduce_scatter(r, ins)
    out["reduce_scatter"] = r.cpu()
    r = torch.zeros(5, device=dev)
    dist.reduce_scatter_tensor(r, torch.cat(ins))
    out["reduce_scatter_tensor"] = r.cpu()
    rows_in = [i + 1 for i in range(world)]
    rows_out = [rank + 1] * world
    t = inputs(12, sum(rows_in) * 2, torch.float32, dev).reshape(-1, 2)
    r = torch.zeros(sum(rows_out), 2, device=dev)
    dist.all_to_all_single(r, t, output_split_sizes=rows_out,
                           input_split_sizes=rows_in)
    out["all_to_all_single splits"] = r.cpu()
    ins = [inputs(13 + i, i + 2, torch.float32, dev) for i in range(world)]
    outs = [torch.zeros(rank + 2, device=dev) for _ in range(world)]
    dist.all_to_all(outs, ins)
    out["all_to_all"] = torch.cat(outs).cpu()
    ts = [inputs(14, 7, torch.float32, dev), inputs(15, 3, torch.float32, dev)]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = torch.cat(ts).cpu()
    if world > 1:
        t = torch.full((5,), float(rank), device=dev)
        r = torch.zeros(5, device=dev)
        if rank % 2 == 0:
            dist.send(t, (rank + 1) % world)
            dist.recv(r, (rank - 1) % world)
        else:
            dist.recv(r, (rank - 1) % world)
            dist.send(t, (rank + 1) % world)
        out["send/recv"] = r.cpu()
        t = torch.full((3,), float(rank), device=dev)
        r = torch.zeros(3, device=dev)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, t, (rank + 1) % world),
            dist.P2POp(dist.irecv, r, (rank - 1) % world)])
        for q in reqs:
            q.wait()
        out["batch_isend_irecv"] = r.cpu()
    dist.barrier()
    return out


def main():
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("uvccl")
    pg = dist.distributed_c10d._get_default_group()
    mode = pg._get_backend(torch.device("cuda")).cuda_mode()
    want = os.environ.get("T_MODE", "")
    check(mode == want, "mode", f"CUDA tensors travel '{mode}' (want '{want}')")

    cpu, gpu = ops("cpu"), ops(f"cuda:{dev}")
    bad = [k for k in cpu if k not in gpu or not torch.equal(cpu[k], gpu[k])]
    check(not bad and len(cpu) == len(gpu), "ops",
          f"{len(cpu)} operations on CUDA tensors equal to the same on CPU "
          f"tensors" + (f"; differ: {bad[:5]}" if bad else ""))

    # the caller's stream orders the inputs: a slow kernel then a write on
    # a side stream, the collective called under that stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros(1 << 20, device=dev)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time
        x.add_(rank + 1)
        dist.all_reduce(x)
    # (x was made on s: the default stream reads it after s, as PyTorch
    # asks of tensors used across streams)
    torch.cuda.current_stream().wait_stream(s)
    want = world * (world + 1) / 2
    check(bool((x == want).all()), "stream",
          f"allreduce after a slow kernel on a side stream: {x[0].item()} "
          f"everywhere (want {want})")

    # async: the work, its future, and a big tensor
    t = torch.ones(4 << 20, device=dev)
    work = dist.all_reduce(t, async_op=True)
    v = work.get_future().wait()[0]
    work.wait()
    check(bool((t == world).all()) and v.is_cuda and bool((v == world).all()),
          "async", f"16 MiB allreduce, async: wait() and the future give "
          f"{t[0].item()}")

    # many in a row, each result used by the next kernel on the stream
    # (NCCL: wait() orders the stream and returns without waiting for the
    # GPU; the values must still come out right)
    t = torch.ones(1000, device=dev)
    for _ in range(20):
        dist.all_reduce(t)
        t.div_(world)
    check(bool((t == 1).all()), "chain",
          f"20 allreduces, each followed by a kernel on its result: "
          f"{t[0].item()} (want 1.0)")

    # a CUDA tensor on a device this group does not use (NCCL mode only)
    if mode == "nccl" and torch.cuda.device_count() > 1:
        other = (dev + 1) % torch.cuda.device_count()
        try:
            dist.all_reduce(torch.ones(4, device=other))
            check(False, "wrong-device", "no error")
        except RuntimeError as e:
            check("NCCL group is on" in str(e), "wrong-device", str(e)[:120])

    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


try:
    main()
except Exception:
    check(False, "exception",
          traceback.format_exc().replace("\n", " / ")[-600:])
    sys.exit(1)
