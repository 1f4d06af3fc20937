"""One rank of t/5001-torch-backend.c: the uvccl backend against Gloo on the same inputs.

Run by t/5001-torch-backend.c as WORLD_SIZE processes with env://
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Prints "@check RANK OK NAME |
detail" lines, as the C tests' ranks do.
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import uvccl_torch  # noqa: E402  (registers "uvccl")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])


def check(ok, name, detail=""):
    print(f"@check {rank} {1 if ok else 0} {name} | {detail}", flush=True)


def inputs(seed, n, dtype, r=None):
    g = torch.Generator().manual_seed(seed * 1000 + (rank if r is None else r))
    if dtype.is_floating_point:
        return (torch.randint(-50, 50, (n,), generator=g).to(dtype)) / 4
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.uint8, torch.int8)
OPS = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
       dist.ReduceOp.PRODUCT)


def allreduce_input(dt, op, r=None):
    t = inputs(1, 37, dt, r)
    if dt == torch.uint8:
        t = t.abs().to(dt)
    if op == dist.ReduceOp.PRODUCT:
        t = (t.abs() % 3 + 1).to(dt)
    return t


def expected_allreduce(dt, op):
    """The reduction of every rank's input, computed here, exactly."""
    xs = torch.stack([allreduce_input(dt, op, r).double() for r in range(world)])
    if op == dist.ReduceOp.SUM:
        v = xs.sum(0)
    elif op == dist.ReduceOp.MAX:
        v = xs.max(0).values
    elif op == dist.ReduceOp.MIN:
        v = xs.min(0).values
    else:
        v = xs.prod(0)
    return v.to(dt)


def allreduce_cases(pg, skip=()):
    out = {}
    for dt in DTYPES:
        for op in OPS:
            if dt in skip:
                continue
            t = allreduce_input(dt, op)
            dist.all_reduce(t, op=op, group=pg)
            out[f"allreduce {dt} {op}"] = t
    return out


def run_ops(pg, skip=()):
    """Every operation of this step on pg; returns their results."""
    out = allreduce_cases(pg, skip)
    t = inputs(2, 1000, torch.float32)
    dist.broadcast(t, src=world - 1, group=pg)
    out["broadcast"] = t
    t = inputs(3, 100, torch.float32)
    dist.reduce(t, dst=1 % world, op=dist.ReduceOp.SUM, group=pg)
    if rank == 1 % world:
        out["reduce"] = t
    t = inputs(4, 10, torch.int64)
    outs = [torch.zeros(10, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(outs, t, group=pg)
    out["all_gather"] = torch.cat(outs)
    if pg is None:  # Gloo 1.13 has no all_gather_into_tensor: against all_gather
        flat = torch.zeros(world * 10, dtype=torch.int64)
        dist.all_gather_into_tensor(flat, t, group=pg)
        out["all_gather_into_tensor"] = flat
    # non-contiguous: every other element of a bigger tensor
    if pg is None:  # (Gloo 1.13 reduces the wrong elements of a strided view)
        big = inputs(5, 64, torch.float32)
        view = big[::2]
        dist.all_reduce(view, group=pg)
        out["allreduce non-contiguous"] = big
    # async: wait() and the future
    t = inputs(6, 1 << 16, torch.float32)
    work = dist.all_reduce(t, group=pg, async_op=True)
    fut = work.get_future()
    work.wait()
    out["allreduce async"] = fut.wait()[0]
    dist.barrier(group=pg)
    # the rest of the collectives
    t = inputs(7, 12, torch.float32)
    if rank == 0:
        gl = [torch.zeros(12) for _ in range(world)]
        dist.gather(t, gather_list=gl, dst=0, group=pg)
        out["gather"] = torch.cat(gl)
    else:
        dist.gather(t, dst=0, group=pg)
    r = torch.zeros(6)
    if rank == world - 1:
        sl = [inputs(8, 6, torch.float32) + i for i in range(world)]
        dist.scatter(r, scatter_list=sl, src=world - 1, group=pg)
    else:
        dist.scatter(r, src=world - 1, group=pg)
    out["scatter"] = r
    ins = [inputs(9 + i, 5, torch.float32) for i in range(world)]
    r = torch.zeros(5)
    if pg is None:  # Gloo 1.13 has no reduce_scatter: against the sum, below
        dist.reduce_scatter(r, ins, group=pg)
        out["reduce_scatter"] = r
        flat = torch.zeros(5)
        dist.reduce_scatter_tensor(flat, torch.cat(ins), group=pg)
        out["reduce_scatter_tensor"] = flat
    t = inputs(10, 3 * world, torch.int64).reshape(world, 3)
    r = torch.zeros(world, 3, dtype=torch.int64)
    dist.all_to_all_single(r, t, group=pg)
    out["all_to_all_single"] = r
    # uneven splits: rank r sends i + 1 rows to rank i
    rows_in = [i + 1 for i in range(world)]
    rows_out = [rank + 1] * world
    t = inputs(11, sum(rows_in) * 2, torch.float32).reshape(-1, 2)
    r = torch.zeros(sum(rows_out), 2)
    dist.all_to_all_single(r, t, output_split_sizes=rows_out,
                           input_split_sizes=rows_in, group=pg)
    out["all_to_all_single splits"] = r
    if pg is None:  # Gloo 1.13 has no all_to_all: against the inputs, below
        ins = [inputs(12 + i, i + 2, torch.float32) for i in range(world)]
        outs = [torch.zeros(rank + 2) for _ in range(world)]
        dist.all_to_all(outs, ins, group=pg)
        out["all_to_all"] = torch.cat(outs)
    ts = [inputs(13, 7, torch.float32), inputs(14, 3, torch.float32)]
    dist.all_reduce_coalesced(ts, group=pg)
    out["all_reduce_coalesced"] = torch.cat(ts)
    # send/recv around a ring
    t = torch.full((5,), float(rank))
    r = torch.zeros(5)
    if world > 1:
        if rank % 2 == 0:
            dist.send(t, (rank + 1) % world, group=pg)
            dist.recv(r, (rank - 1) % world, group=pg)
        else:
            dist.recv(r, (rank - 1) % world, group=pg)
            dist.send(t, (rank + 1) % world, group=pg)
    out["send/recv"] = r
    return out


def main():
    dist.init_process_group("uvccl", init_method="env://", rank=rank,
                            world_size=world)
    check(dist.get_backend() == "uvccl", "init",
          f"backend {dist.get_backend()}, rank {dist.get_rank()} of "
          f"{dist.get_world_size()}")
    gloo = dist.new_group(backend="gloo")
    mine = run_ops(None)
    # every allreduce against the reduction computed here
    bad = [f"{dt} {op}" for dt in DTYPES for op in OPS
           if not torch.equal(mine[f"allreduce {dt} {op}"],
                              expected_allreduce(dt, op))]
    check(not bad, "exact", f"{len(DTYPES) * len(OPS)} allreduces (8 dtypes x "
          "SUM MAX MIN PRODUCT) exact" if not bad else f"wrong: {bad[:4]}")
    want = inputs(5, 64, torch.float32)
    want[::2] = sum(inputs(5, 64, torch.float32, r)[::2] for r in range(world))
    check(torch.equal(mine["allreduce non-contiguous"], want), "strided",
          "allreduce of a strided view: its elements reduced, the others kept")
    ref = run_ops(gloo, skip=(torch.bfloat16,))  # Gloo 1.13 has no bfloat16
    ref["all_gather_into_tensor"] = ref["all_gather"]
    want = sum(inputs(9 + rank, 5, torch.float32, r) for r in range(world))
    ref["reduce_scatter"] = ref["reduce_scatter_tensor"] = want
    ref["all_to_all"] = torch.cat([inputs(12 + rank, rank + 2, torch.float32, i)
                                   for i in range(world)])
    bad = [k for k in ref if not torch.equal(mine[k], ref[k])]
    check(not bad, "same",
          f"{len(ref)} results equal to Gloo's" if not bad else f"differ: {bad[:5]}")
    # errors are exceptions, not crashes
    try:
        dist.all_reduce(torch.zeros(3, dtype=torch.int16))
        check(False, "error", "int16 was accepted")
    except RuntimeError as e:
        check("not supported" in str(e), "error", str(e).splitlines()[0][:120])
    # recv from any source, and the sender it names
    if world > 1:
        if rank == 0:
            got = set()
            for _ in range(world - 1):
                r = torch.zeros(2)
                w = dist.irecv(r)   # no src: any source
                w.wait()
                got.add((w._source_rank(), int(r[0].item())))
            check(got == {(i, i * 10) for i in range(1, world)}, "anysource",
                  f"senders named: {sorted(got)}")
        else:
            dist.send(torch.full((2,), float(rank * 10)), 0)
            check(True, "anysource", "sent")
    else:
        check(True, "anysource", "alone")
    # (dist.monitored_barrier is gated to Gloo in 1.13's Python layer: the
    # group's own binding reaches the backend)
    default = dist.distributed_c10d._get_default_group()
    default.monitored_barrier(timeout=__import__("datetime").timedelta(seconds=30),
                              wait_all_ranks=True)
    check(True, "monitored", "monitored_barrier passed")
    sub = dist.new_group(ranks=list(range(world)))
    t = torch.ones(4) * rank
    dist.all_reduce(t, group=sub)
    check(torch.equal(t, torch.full((4,), float(sum(range(world))))), "subgroup",
          f"new_group allreduce: {t.tolist()}")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


try:
    main()
except Exception:
    check(False, "exception", traceback.format_exc().replace("\n", " / ")[-300:])
    sys.exit(1)
