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
C10D = torch._C._distributed_c10d  # WorkResult (2.6+), ErrorType (2.14+)
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


def gloo_lacks(gloo):
    """The dtypes whose allreduce this PyTorch's Gloo refuses (every rank
    refuses the same ones, before sending anything)."""
    lacks = []
    for dt in DTYPES:
        try:
            dist.all_reduce(torch.ones(1, dtype=dt), group=gloo)
        except RuntimeError:
            lacks.append(dt)
    return lacks


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


def more_ops(gloo):
    """PREMUL_SUM, sparse allreduce, all_gather_coalesced, batch_isend_irecv
    and the object collectives, against Gloo (or local results), then a
    timeout."""
    # PREMUL_SUM (a factor, as a number and as a tensor) against the sum of
    # every rank's input times the factor, computed here
    t = inputs(20, 33, torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.25))
    want = sum(inputs(20, 33, torch.float64, r) for r in range(world)) * 0.25
    t2 = inputs(20, 33, torch.float32)
    try:  # PyTorch 1.13: a list of tensors; 2.x: one tensor
        op = dist._make_nccl_premul_sum([torch.tensor([2.0])])
    except TypeError:
        op = dist._make_nccl_premul_sum(torch.tensor([2.0]))
    dist.all_reduce(t2, op=op)
    want2 = sum(inputs(20, 33, torch.float32, r) for r in range(world)) * 2
    check(torch.allclose(t, want) and torch.allclose(t2, want2), "premul",
          f"PREMUL_SUM x0.25 (float64) and x2 as a tensor (float32): max "
          f"error {(t - want).abs().max().item():.2e}")
    # sparse: each rank a few entries of a 10x4 tensor (overlapping)
    def sparse_input():
        idx = torch.tensor([[rank % 10, (rank + 3) % 10, 7],
                            [0, rank % 4, 2]])
        val = torch.tensor([1.0 + rank, 10.0 * rank, 0.5])
        return torch.sparse_coo_tensor(idx, val, (10, 4))
    mine, ref = sparse_input(), sparse_input()
    dist.all_reduce(mine)
    dist.all_reduce(ref, group=gloo)
    dense = sum(torch.sparse_coo_tensor(
        torch.tensor([[r % 10, (r + 3) % 10, 7], [0, r % 4, 2]]),
        torch.tensor([1.0 + r, 10.0 * r, 0.5]), (10, 4)).to_dense()
        for r in range(world))
    check(mine.is_sparse and torch.equal(mine.to_dense(), ref.to_dense()) and
          torch.equal(mine.to_dense(), dense), "sparse",
          f"sparse allreduce: {mine._nnz()} entries, equal to Gloo's and to "
          "the dense sum")
    # all_gather_coalesced: two tensors of two shapes, against Gloo's
    ins = [inputs(21, 6, torch.float32), inputs(22, 8, torch.float32).view(2, 4)]
    outs = [[torch.zeros(6), torch.zeros(2, 4)] for _ in range(world)]
    refs = [[torch.zeros(6), torch.zeros(2, 4)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    dist.all_gather_coalesced(refs, ins, group=gloo)
    want = [[inputs(21, 6, torch.float32, r),
             inputs(22, 8, torch.float32, r).view(2, 4)] for r in range(world)]
    check(all(torch.equal(a, b) and torch.equal(a, c)
              for o, w, f in zip(outs, want, refs)
              for a, b, c in zip(o, w, f)), "gather_coalesced",
          "all_gather_coalesced of a 6 and a 2x4 tensor, equal to Gloo's")
    # batch_isend_irecv around the ring, both directions
    right, left = (rank + 1) % world, (rank - 1) % world
    a, b = torch.zeros(3), torch.zeros(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), right),
           dist.P2POp(dist.isend, torch.full((3,), 100.0 + rank), left),
           dist.P2POp(dist.irecv, a, left), dist.P2POp(dist.irecv, b, right)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    check(torch.equal(a, torch.full((3,), float(left))) and
          torch.equal(b, torch.full((3,), 100.0 + right)), "batch_p2p",
          f"batch_isend_irecv: from the left {a[0].item()}, from the right "
          f"{b[0].item()}")
    # PyTorch 2's coalescing blocks (what batch_isend_irecv uses on CUDA
    # tensors): sends and receives inside start together at the end, and
    # one work covers the block; all_reduce's fast path becomes one
    # allreduce_coalesced
    if hasattr(dist, "_coalescing_manager") and \
            int(torch.__version__.split(".")[0]) >= 2:
        c, d = torch.zeros(4), torch.zeros(4)
        x, y = torch.full((5,), 1.0 + rank), torch.full((7,), 2.0 * rank)
        cpu = torch.device("cpu")
        with dist._coalescing_manager(device=cpu, async_ops=True) as cm:
            dist.isend(torch.full((4,), 10.0 + rank), right)
            dist.irecv(c, left)
            dist.isend(torch.full((4,), 20.0 + rank), left)
            dist.irecv(d, right)
        cm.wait()
        with dist._coalescing_manager(device=cpu, async_ops=True) as cm:
            dist.all_reduce(x)
            dist.all_reduce(y)
        cm.wait()
        sx = sum(1.0 + r for r in range(world))
        sy = sum(2.0 * r for r in range(world))
        check(torch.equal(c, torch.full((4,), 10.0 + left)) and
              torch.equal(d, torch.full((4,), 20.0 + right)) and
              torch.equal(x, torch.full((5,), sx)) and
              torch.equal(y, torch.full((7,), sy)), "coalescing",
              f"coalescing blocks: isend/irecv both ways ({c[0].item()}, "
              f"{d[0].item()}), two all_reduces ({x[0].item()}, "
              f"{y[0].item()})")
    else:
        check(True, "coalescing", "(PyTorch 1.13: no coalescing blocks)")
    # the object collectives (PyTorch's Python layer over our ops)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    bl = [{"k": [1, 2, 3]}, "two"] if rank == 0 else [None, None]
    dist.broadcast_object_list(bl, src=0)
    check(objs == [{"rank": r, "s": "x" * r} for r in range(world)] and
          bl == [{"k": [1, 2, 3]}, "two"], "objects",
          "all_gather_object and broadcast_object_list")
    # a timeout: rank 0 allreduces in a group of 1.5 s, the others do not
    # (they barrier later): a RuntimeError naming the rank it waited for
    import datetime
    short = dist.new_group(timeout=datetime.timedelta(seconds=1.5))
    if rank == 0 and world > 1:
        t0 = __import__("time").time()
        try:
            dist.all_reduce(torch.ones(4), group=short)
            check(False, "timeout", "the allreduce completed")
        except RuntimeError as e:
            took = __import__("time").time() - t0
            msg = str(e)
            check("timed out" in msg and "waiting for rank" in msg and
                  took < 10, "timeout",
                  f"after {took:.1f} s: {msg.splitlines()[0][:160]}")
    else:
        check(True, "timeout", "(rank 0 waits)")
    dist.barrier()


def backend_of(group=None):
    pg = group or dist.distributed_c10d._get_default_group()
    if isinstance(pg, uvccl_torch.ProcessGroupUVCCL):  # PyTorch 1.13
        return pg
    return pg._get_backend(torch.device("cpu"))


def newer_api(gloo):
    """PyTorch 2.x's newer Backend API, each where this PyTorch has it
    (the check says so where it does not): the coalesced into-tensor ops
    (c10d's _coalescing_manager, against Gloo's all_gather_into_tensor and
    the exact sums), Work.get_future_result, the group's get_error and
    set_timeout."""
    import datetime
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 1):
        ins = [inputs(30, 5, torch.float32), inputs(31, 3, torch.int64)]
        outs = [torch.zeros(5 * world), torch.zeros(3 * world, dtype=torch.int64)]
        rs_in = [inputs(32, 4 * world, torch.float64),
                 inputs(33, 2 * world, torch.int32)]
        rs_out = [torch.zeros(4, dtype=torch.float64),
                  torch.zeros(2, dtype=torch.int32)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        with dist._coalescing_manager(async_ops=True) as cm:
            for o, i in zip(rs_out, rs_in):
                dist.reduce_scatter_tensor(o, i)
        cm.wait()
        ref = [torch.zeros_like(o) for o in outs]
        for o, i in zip(ref, ins):
            dist.all_gather_into_tensor(o, i, group=gloo)
        want = [sum(inputs(32 + k, len(rs_in[k]), rs_in[k].dtype, r)
                    for r in range(world)).to(rs_in[k].dtype)
                .narrow(0, rank * len(rs_out[k]), len(rs_out[k]))
                for k in range(2)]
        ok = all(torch.equal(a, b) for a, b in zip(outs, ref)) and \
            all(torch.equal(a, b) for a, b in zip(rs_out, want))
        check(ok, "coalesced_into", "all_gather_into_tensor x2 (as Gloo's) "
              "and reduce_scatter_tensor x2 (exact) in _coalescing_manager"
              if ok else f"got {outs} {rs_out}, want {ref} {want}")
    else:
        check(True, "coalesced_into", f"PyTorch {torch.__version__} has none")
    if hasattr(getattr(dist, "Work", None), "get_future_result"):
        w = dist.all_reduce(torch.ones(3), async_op=True)
        got = w.get_future_result().wait()
        ok = got == int(C10D.WorkResult.SUCCESS)
        check(ok, "future_result", f"get_future_result() of an allreduce: {got}")
    else:
        check(True, "future_result", f"PyTorch {torch.__version__} has none")
    b = backend_of()
    if hasattr(b, "get_error") and hasattr(b, "set_timeout"):
        err = b.get_error()
        b.set_timeout(datetime.timedelta(seconds=45))
        t = torch.ones(2)
        dist.all_reduce(t)
        ok = err == C10D.ErrorType.SUCCESS and torch.equal(t, torch.full((2,), float(world)))
        check(ok, "get_error", f"get_error() {err}; set_timeout(45 s), then an "
              f"allreduce: {t.tolist()}")
    else:
        check(True, "get_error", f"PyTorch {torch.__version__} has none")
    # c10d's sequence number: each collective counts one, on uvccl's group
    # as on Gloo's (DETAIL's wrapper and the flight recorder read it)
    # (asked of the backend: 2.6's ProcessGroup answers only for the
    # backend types it knows, a plugin's is CUSTOM)
    seqs = []
    for g in (None, gloo):
        pg = g or dist.distributed_c10d._get_default_group()
        b = pg._get_backend(torch.device("cpu")) if hasattr(pg, "_get_backend") else pg
        before = b._get_sequence_number_for_group()
        for _ in range(3):
            dist.all_reduce(torch.ones(1), group=g)
        seqs.append(b._get_sequence_number_for_group() - before)
    check(seqs[0] == seqs[1] == 3, "sequence", f"3 allreduces count "
          f"{seqs[0]} (Gloo's group: {seqs[1]})")
    split_check(gloo)


def split_check(gloo):
    """split_group (2.14+): the world split into [1, 0] and [2 .. W-1]
    (at 3 ranks rank 2 is in none); each new group's ranks in the order
    given, its allreduce and allgather equal to those of a Gloo group of
    the same ranks. PyTorch's own split_group refuses a world with no
    device (checked), so it goes through uvccl_torch.split_group."""
    if not getattr(backend_of(), "supports_splitting", False):
        check(True, "split", f"PyTorch {torch.__version__}'s Backend cannot split")
        return
    splits = [[1, 0]] + ([list(range(2, world))] if world >= 4 else [])
    if world < 2:
        check(True, "split", "alone")
        return
    try:
        dist.split_group(split_ranks=splits)
        refused = "dist.split_group accepted a CPU world"
    except RuntimeError as e:
        refused = str(e).splitlines()[0][:80]
    sub = uvccl_torch.split_group(split_ranks=splits)
    mine = next((g for g in splits if rank in g), None)
    refs = [dist.new_group(ranks=sorted(g), backend="gloo") for g in splits]
    if mine is None:
        ok = sub == dist.GroupMember.NON_GROUP_MEMBER
        check(ok, "split", f"in no group: {sub}; PyTorch's own: {refused}")
        return
    ref = refs[splits.index(mine)]
    t = torch.arange(5, dtype=torch.float32) * (rank + 1)
    u = t.clone()
    dist.all_reduce(t, group=sub)
    dist.all_reduce(u, group=ref)
    got = [torch.zeros(1, dtype=torch.int64) for _ in mine]
    dist.all_gather(got, torch.tensor([rank]), group=sub)
    order = [int(x) for x in got]
    b = backend_of(sub)
    ok = (dist.get_rank(sub) == mine.index(rank) and order == mine and
          torch.equal(t, u) and b.name() == "uvccl")
    check(ok, "split", f"group {mine}: rank {dist.get_rank(sub)}, members in "
          f"order {order}, allreduce {t.tolist()} (Gloo's {u.tolist()}); "
          f"PyTorch's own: {refused}")
    dist.destroy_process_group(sub)



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
    # Checked against the exact reductions above only: what this build's
    # Gloo lacks (1.13: bfloat16; Debian's 2.14: float16 and bfloat16,
    # "Invalid scalar type"), and bfloat16, which Gloo reduces in bfloat16
    # step by step (2.6's PRODUCT of 4 ranks' values rounds where the exact
    # one does not)
    lacks = gloo_lacks(gloo)
    check(True, "gloo_dtypes", "Gloo lacks " + (", ".join(map(str, lacks))
                                                 if lacks else "nothing"))
    ref = run_ops(gloo, skip=set(lacks) | {torch.bfloat16})
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
    more_ops(gloo)
    newer_api(gloo)
    sub = dist.new_group(ranks=list(range(world)))
    t = torch.ones(4) * rank
    dist.all_reduce(t, group=sub)
    check(torch.equal(t, torch.full((4,), float(sum(range(world))))), "subgroup",
          f"new_group allreduce: {t.tolist()}")
    drivers(sub)
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def drivers(sub):
    """The thread that waits runs the backend's loop for a while (loop.h,
    drive): an operation nobody waits for still ends (the loop thread takes
    over), and two threads waiting on two groups at once both finish, every
    result right."""
    import threading
    import time
    t = torch.ones(4)
    dist.all_reduce(t)  # this thread drives
    t = torch.full((4,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    until = time.time() + 10
    while not w.is_completed() and time.time() < until:
        time.sleep(0.0005)
    want = float(sum(range(1, world + 1)))
    check(w.is_completed() and torch.equal(t, torch.full((4,), want)),
          "undriven", f"an allreduce not waited for ended: {t.tolist()}")
    bad = {}

    def loop(name, group, n):
        wrong = 0
        for i in range(n):
            x = torch.full((8,), float(rank + i))
            dist.all_reduce(x, group=group)
            wrong += not torch.equal(
                x, torch.full((8,), float(sum(r + i for r in range(world)))))
        bad[name] = wrong

    other = threading.Thread(target=loop, args=("sub", sub, 300))
    other.start()
    loop("world", None, 300)
    other.join(60)
    check(bad == {"sub": 0, "world": 0}, "threads",
          f"two threads, 300 allreduces each on their own group: wrong {bad}")


def tcpinit_main():
    """init_method="tcp://127.0.0.1:PORT" and no MASTER_ADDR, on a host
    whose name does not resolve (where the runner gives each rank a UTS
    namespace of its own, T_HOSTNAME names it): rank 0's store server is
    told as the address on the route to the job's TCPStore, not as the
    host name (which the other ranks could not resolve)."""
    import socket
    name = os.environ.get("T_HOSTNAME")
    if name:
        try:
            socket.sethostname(name)
        except OSError as e:
            name = None
            check(True, "premise", f"kept the host name ({e})")
    if name:
        try:
            socket.getaddrinfo(socket.gethostname(), None)
            check(False, "premise", f"{name} resolves")
        except OSError:
            check(True, "premise", f"the host name {name} does not resolve")
    port = os.environ.pop("MASTER_PORT")
    os.environ.pop("MASTER_ADDR", None)
    dist.init_process_group("uvccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    told = uvccl_torch._advertised_host(
        dist.distributed_c10d._get_default_store())
    check(told == "127.0.0.1", "told", f"the store server told as {told!r}")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    want = float(sum(range(1, world + 1)))
    check(torch.equal(t, torch.full((3,), want)), "tcpinit",
          f"tcp:// init, no MASTER_ADDR: allreduce {t.tolist()}")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def kill_main():
    """A peer killed mid-collective: rank world-1 SIGKILLs itself while a
    16 MiB allreduce is under way; every survivor gets a RuntimeError naming
    it (never a hang or a crash), and can still destroy its group."""
    import signal
    import time
    dist.init_process_group("uvccl", init_method="env://", rank=rank,
                            world_size=world)
    victim = world - 1
    t = torch.ones(4 << 20)
    dist.all_reduce(t)  # warm
    if rank == victim:
        dist.all_reduce(t, async_op=True)
        time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.time()
    try:
        for _ in range(20):
            dist.all_reduce(t)
        check(False, "killed", "every allreduce completed")
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        check(f"rank {victim}" in msg and time.time() - t0 < 30, "killed",
              f"after {time.time() - t0:.2f} s: {msg[:200]}")
    # the failure as PyTorch 2.x's newer API tells it
    b = backend_of()
    said = []
    if hasattr(getattr(dist, "Work", None), "get_future_result"):
        w = dist.all_reduce(t, async_op=True)
        said.append(("get_future_result", w.get_future_result().wait(),
                     int(C10D.WorkResult.COMM_ERROR)))
    if hasattr(b, "get_error"):
        said.append(("get_error", b.get_error(), C10D.ErrorType.COMM_ERROR))
    check(all(got == want for _, got, want in said), "failed_state",
          ", ".join(f"{n} {got}" for n, got, _ in said) or
          f"PyTorch {torch.__version__} has neither")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def shrink_main():
    """shrink_group (2.14+) at 4 ranks: rank 3 kills itself; the others'
    split_group fails naming it. Rank 2 stays alive and does not shrink;
    ranks 0 and 1 shrink excluding rank 2 only
    and get a RuntimeError naming rank 3 (never a hang); they shrink again
    excluding both and the new default group's allreduce is right."""
    import signal
    import time
    dist.init_process_group("uvccl", init_method="env://", rank=rank,
                            world_size=world)
    if not hasattr(dist, "shrink_group") or \
            not getattr(backend_of(), "supports_shrinking", False):
        check(True, "shrunk", f"PyTorch {torch.__version__} cannot shrink")
        check(True, "named", "-")
        check(True, "split_killed", "-")
        dist.destroy_process_group()
        check(True, "destroy", "destroy_process_group returned")
        return
    dist.barrier()
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    # a split with rank 3 dead: every caller's RuntimeError names it
    t0 = time.time()
    try:
        uvccl_torch.split_group(split_ranks=[[0, 1], [2, 3]])
        check(False, "split_killed", "split_group succeeded with rank 3 dead")
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        check("rank 3" in msg and time.time() - t0 < 30, "split_killed",
              f"split_group after {time.time() - t0:.2f} s: {msg[:200]}")
    if rank == 2:  # excluded, alive: waits, then leaves its own world
        time.sleep(4)
        check(True, "shrunk", "excluded")
        check(True, "named", "excluded")
        dist.destroy_process_group()
        check(True, "destroy", "destroy_process_group returned")
        return
    t0 = time.time()
    try:
        dist.shrink_group([2])
        check(False, "named", "shrink_group([2]) succeeded with rank 3 dead")
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        check("rank 3" in msg and time.time() - t0 < 30, "named",
              f"shrink_group([2]) after {time.time() - t0:.2f} s: {msg[:200]}")
    pg = dist.shrink_group([2, 3])
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    ok = (dist.get_world_size() == 2 and dist.get_rank() == rank and
          torch.equal(t, torch.full((4,), 3.0)) and
          backend_of(pg).name() == "uvccl")
    check(ok, "shrunk", f"shrink_group([2, 3]): world {dist.get_world_size()}, "
          f"rank {dist.get_rank()}, allreduce {t.tolist()}")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def fsdp_kill_main():
    """A rank killed during FSDP2 steps (PyTorch 2.x whose FSDP2 runs on
    CPU): rank world-1 SIGKILLs itself in its third step; every survivor's
    step raises a RuntimeError naming it (never a hang), and
    destroy_process_group returns."""
    import signal
    import time
    dist.init_process_group("uvccl", init_method="env://", rank=rank,
                            world_size=world)
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x = torch.randn(16, 256)
        model(x).sum().backward()  # FSDP2 on CPU works in this PyTorch
    except Exception as e:  # noqa: BLE001
        check(True, "fsdp_killed", f"FSDP2 on CPU does not run in PyTorch "
              f"{torch.__version__}: {type(e).__name__}")
        dist.destroy_process_group()
        check(True, "destroy", "destroy_process_group returned")
        return
    victim = world - 1
    t0 = time.time()
    try:
        for step in range(50):
            if rank == victim and step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            model(x).sum().backward()
        check(False, "fsdp_killed", "every step completed")
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        check(f"rank {victim}" in msg and time.time() - t0 < 30,
              "fsdp_killed", f"after {time.time() - t0:.2f} s: {msg[:200]}")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def abort_main():
    """abort(): rank 0 aborts its group from a timer thread while its own
    thread waits in a recv nobody sends to, and the others wait in an
    allreduce it never joins; all get a RuntimeError with its reason at
    once (not after the 60 s timeout), and everyone destroys cleanly."""
    import datetime
    import time
    dist.init_process_group("uvccl", init_method="env://", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    if not isinstance(pg, uvccl_torch.ProcessGroupUVCCL):  # PyTorch 2
        pg = pg._get_backend(torch.device("cpu"))
    dist.barrier()
    if rank == 0:
        # from a timer thread, while this rank's own thread waits in a recv
        # that nobody sends to (abort never waits for anything)
        import threading
        timer = threading.Timer(0.5, lambda: pg.abort("stopping the job"))
        timer.start()
        t0 = time.time()
        try:
            dist.recv(torch.zeros(1), src=1)
            check(False, "aborted", "the recv completed")
        except RuntimeError as e:
            msg = str(e).splitlines()[0]
            check("stopping the job" in msg and time.time() - t0 < 20,
                  "aborted", f"abort() from a timer thread ended this rank's "
                  f"own hung recv after {time.time() - t0:.2f} s: {msg[:160]}")
        timer.join()
        # (staying a moment: a process that exits at once can reach a peer
        # as "exited" before its notice does; see issue 14's notes)
        time.sleep(1.0)
    else:
        t0 = time.time()
        try:
            dist.all_reduce(torch.ones(8))
            check(False, "aborted", "the allreduce completed")
        except RuntimeError as e:
            msg = str(e).splitlines()[0]
            check("stopping the job" in msg and time.time() - t0 < 20,
                  "aborted", f"after {time.time() - t0:.2f} s: {msg[:200]}")
    dist.destroy_process_group()
    check(True, "destroy", "destroy_process_group returned")


def reconfigure_main():
    """c10d's reconfigure API (2.14+), 4 processes: ranks 0-2 make a world
    of 3; the 4th starts with enable_reconfigure=True (no world: an
    operation fails, saying so). All four reconfigure with their handles as
    a set (ranks: the sorted order), then as a list in reverse (ranks
    reversed); then the first three reconfigure without the 4th (it
    leaves). Each allreduce checked; a reused uuid, a handle list without
    this rank's and a foreign handle are refused."""
    import datetime
    if not hasattr(dist, "_reconfigure"):
        for name in ("supports", "set", "ordered", "shrunk", "refused"):
            check(True, name, f"PyTorch {torch.__version__} has no reconfigure")
        return
    joiner = rank == 3
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]), is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60),
                          use_libuv=False)
    dist.init_process_group("uvccl", store=store, rank=rank,
                            world_size=4 if joiner else 3,
                            enable_reconfigure=joiner)
    h = dist._get_reconfigure_handle()
    said = ""
    if joiner:
        try:
            dist.all_reduce(torch.ones(2))
        except RuntimeError as e:
            said = str(e).splitlines()[0]
    check(dist._supports_reconfigure() and h.startswith("uvccl:-1:") and
          (not joiner or "reconfigure" in said), "supports",
          f"handle {h}" + (f"; before: {said[:120]}" if joiner else ""))

    def meet(tag, who):
        store.set(f"t/{tag}/{rank}", dist._get_reconfigure_handle())
        keys = [f"t/{tag}/{r}" for r in who]
        store.wait(keys)
        return [store.get(k).decode() for k in keys]

    def allreduce_ok():
        t = torch.full((4,), float(dist.get_rank() + 1))
        dist.all_reduce(t)
        n = dist.get_world_size()
        return torch.equal(t, torch.full((4,), n * (n + 1) / 2.0)), t[0].item()

    hs = meet("a", range(4))
    dist._reconfigure(uuid=11, handles=set(hs)).wait()
    want = sorted(hs).index(hs[rank])
    good, v = allreduce_ok()
    check(good and dist.get_rank() == want and dist.get_world_size() == 4,
          "set", f"as a set: rank {dist.get_rank()} (sorted place {want}) of "
          f"{dist.get_world_size()}, allreduce {v}")
    hs = meet("b", range(4))
    dist._reconfigure(uuid=12, handles=hs[::-1]).wait()
    good, v = allreduce_ok()
    check(good and dist.get_rank() == 3 - rank, "ordered",
          f"as a list in reverse: rank {dist.get_rank()}, allreduce {v}")
    hs = meet("c", range(4))
    if joiner:
        dist.destroy_process_group()
        check(True, "shrunk", "left")
        check(True, "refused", "left")
        return
    dist._reconfigure(uuid=13, handles=hs[:3]).wait()
    good, v = allreduce_ok()
    check(good and dist.get_world_size() == 3 and dist.get_rank() == rank,
          "shrunk", f"without the 4th: rank {dist.get_rank()} of "
          f"{dist.get_world_size()}, allreduce {v}")
    msgs = []
    for uuid, handles in ((13, hs[:3]), (14, [x for x in hs[:3]
                                               if x != hs[rank]]),
                          (15, ["gloo:0:1:2:3"])):
        try:
            dist._reconfigure(uuid=uuid, handles=handles).wait()
            msgs.append("accepted")
        except (RuntimeError, ValueError) as e:
            msgs.append(str(e).splitlines()[0])
    good, v = allreduce_ok()  # a refused reconfigure leaves the world alone
    check(good and "fresh one" in msgs[0] and "not among" in msgs[1] and
          "uvccl handle" in msgs[2], "refused", " / ".join(m[:90] for m in msgs))
    dist.destroy_process_group()


# T_SCENARIO: which one this run is ("": the main one)
SCENARIOS = {"": main, "tcpinit": tcpinit_main, "kill": kill_main,
             "abort": abort_main, "shrink": shrink_main,
             "fsdp_kill": fsdp_kill_main, "reconfigure": reconfigure_main}

try:
    SCENARIOS[os.environ.get("T_SCENARIO", "")]()
except Exception:
    check(False, "exception", traceback.format_exc().replace("\n", " / ")[-300:])
    sys.exit(1)
