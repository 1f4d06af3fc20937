"""4 B dist.all_reduce latency through PyTorch, uvccl and Gloo side by side
in one job: W processes on this host, each alternating 5 blocks of 3,000
uvccl calls (the default group) and 500 Gloo calls (a new_group beside it).
Rank 0 prints the median of the blocks' means, and the blocks.

    python3 bench/torch/latency.py W
    UROOT=/other/checkout python3 bench/torch/latency.py W
        the extension under that tree's python/ (an A/B of two builds)
"""
import os
import socket
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))


def rank():
    import torch
    import torch.distributed as dist
    root = os.environ.get("UROOT") or os.path.dirname(os.path.dirname(here))
    sys.path.insert(0, os.path.join(root, "python"))
    import uvccl_torch  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group("uvccl")
    gloo = dist.new_group(backend="gloo")
    t = torch.ones(1)
    res = {"uvccl": [], "gloo": []}
    for _ in range(5):
        for name, g in (("uvccl", None), ("gloo", gloo)):
            k = 3000 if name == "uvccl" else 500
            for _ in range(100):
                dist.all_reduce(t, group=g)
            dist.barrier(group=g)
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t, group=g)
            res[name].append((time.perf_counter() - t0) / k * 1e6)
    if dist.get_rank() == 0:
        print(f"W={dist.get_world_size()} uvccl 4B median "
              f"{statistics.median(res['uvccl']):.1f} us (blocks "
              f"{[round(x, 1) for x in res['uvccl']]}), gloo "
              f"{statistics.median(res['gloo']):.1f} us", flush=True)
    dist.destroy_process_group()


def main():
    if os.environ.get("RANK") is not None:
        rank()
        return 0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                           env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(n),
                                    MASTER_ADDR="127.0.0.1",
                                    MASTER_PORT=str(port)))
          for r in range(n)]
    return max(p.wait() for p in ps)


if __name__ == "__main__":
    sys.exit(main())
