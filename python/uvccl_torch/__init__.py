"""uvccl as a PyTorch distributed backend.

    import uvccl_torch  # registers the backend "uvccl"
    torch.distributed.init_process_group("uvccl", ...)

The extension (_C) is built by `make` where PyTorch's development files are
installed; with PYTHONPATH=python from the repository root it imports from
the source tree.

CUDA tensors (an extension built against a PyTorch with CUDA): through a
uvccl NCCL group where every rank has a GPU of its own and NCCL is there,
else staged through pinned host memory over uvccl's TCP group
($UVCCL_TORCH_CUDA = auto, nccl or staged; the group's cuda_mode() says
which). Each rank's GPU is PyTorch's current device when the group is made
(call torch.cuda.set_device(local_rank) first, as with NCCL).
"""
import os as _os

import torch as _torch
import torch.distributed as _dist

from . import _C

ProcessGroupUVCCL = _C.ProcessGroupUVCCL


def _gpu():
    """(device, identity, NCCL there) of this rank's GPU, or (-1, "", False).
    Two ranks' identities are equal only where they share the GPU."""
    if not _C.cuda or not _torch.cuda.is_available():
        return -1, "", False
    dev = _torch.cuda.current_device()
    props = _torch.cuda.get_device_properties(dev)
    uuid = getattr(props, "uuid", None)
    if uuid is None:  # older PyTorch: what the process sees as this device
        uuid = "%s:%d" % (_os.environ.get("CUDA_VISIBLE_DEVICES", "*"), dev)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    import socket
    ident = "%s|%s|%s" % (socket.gethostname(), boot, uuid)
    return dev, ident, bool(_dist.is_nccl_available())


def _advertised_host(store):
    """The address rank 0's store server is told as: $MASTER_ADDR, else
    this host's address on the route to the job's TCPStore (as the C
    library picks the mesh's interface; an init_method="tcp://HOST:PORT"
    job sets no MASTER_ADDR, and the host name may not resolve, or
    resolve to 127.0.1.1, which no other host reaches), else "" (the
    host name)."""
    if _os.environ.get("MASTER_ADDR"):
        return ""
    s = store
    while isinstance(s, _dist.PrefixStore):
        s = s.underlying_store
    if not isinstance(s, _dist.TCPStore):
        return ""
    import socket
    try:
        infos = socket.getaddrinfo(s.host, s.port, type=socket.SOCK_DGRAM)
    except OSError:
        return ""
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as u:
                u.connect(addr)  # UDP: nothing is sent
                return u.getsockname()[0]
        except OSError:
            continue
    return ""


def _create(store, rank, world_size, timeout):
    dev, ident, nccl = _gpu()
    return _C.ProcessGroupUVCCL(store, rank, world_size, timeout, "uvccl",
                                dev, ident, nccl, _advertised_host(store))


if "UVCCL" not in _dist.Backend._plugins:
    try:  # PyTorch 2: the backend serves CPU tensors, and CUDA ones if built so
        _dist.Backend.register_backend(
            "uvccl", _create, devices=["cpu", "cuda"] if _C.cuda else ["cpu"])
    except TypeError:  # PyTorch 1.13: no devices argument
        _dist.Backend.register_backend("uvccl", _create)
