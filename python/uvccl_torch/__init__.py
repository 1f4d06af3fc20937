"""uvccl as a PyTorch distributed backend.

    import uvccl_torch  # registers the backend "uvccl"
    torch.distributed.init_process_group("uvccl", ...)

The extension (_C) is built by `make` where PyTorch's development files are
installed; with PYTHONPATH=python from the repository root it imports from
the source tree.
"""
import torch.distributed as _dist

from . import _C

ProcessGroupUVCCL = _C.ProcessGroupUVCCL


def _create(store, rank, world_size, timeout):
    return _C.ProcessGroupUVCCL(store, rank, world_size, timeout)


if "UVCCL" not in _dist.Backend._plugins:
    try:  # PyTorch 2: the backend serves CPU tensors
        _dist.Backend.register_backend("uvccl", _create, devices=["cpu"])
    except TypeError:  # PyTorch 1.13: no devices argument
        _dist.Backend.register_backend("uvccl", _create)
