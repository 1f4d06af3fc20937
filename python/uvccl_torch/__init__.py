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


def _create(store, rank, world_size, timeout, deferred=False):
    dev, ident, nccl = _gpu()
    return _C.ProcessGroupUVCCL(store, rank, world_size, timeout, "uvccl",
                                dev, ident, nccl, _advertised_host(store),
                                deferred)


def _create_extended(opts, backend_options):
    """c10d's extended creator (PyTorch with reconfigure): the same group,
    made without a world where init_process_group(enable_reconfigure=True)
    asked for the reconfigure regime (reconfigure() makes it)."""
    return _create(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                   bool(getattr(opts, "enable_reconfigure", False)))


if "UVCCL" not in _dist.Backend._plugins:
    _devices = ["cpu", "cuda"] if _C.cuda else ["cpu"]
    if hasattr(_dist.distributed_c10d, "_reconfigure"):
        _dist.Backend.register_backend("uvccl", _create_extended,
                                       extended_api=True, devices=_devices)
    else:
        try:  # PyTorch 2: CPU tensors, and CUDA ones if built so
            _dist.Backend.register_backend("uvccl", _create, devices=_devices)
        except TypeError:  # PyTorch 1.13: no devices argument
            _dist.Backend.register_backend("uvccl", _create)


def split_group(parent_pg=None, split_ranks=None, timeout=None,
                pg_options=None, group_desc=None):
    """torch.distributed.split_group for groups on CPU.

    PyTorch 2.14's split_group refuses a world bound to no accelerator
    before it asks the backend ("No device associated with the default
    pg"); uvccl splits CPU groups (on the parent's connections: no store,
    no new sockets). Every rank of parent_pg calls it with the same
    split_ranks (lists of parent ranks, disjoint; the order in a list is
    the new ranks' order); a rank in none gets GroupMember.NON_GROUP_MEMBER.
    Where the default group is bound to a device, this is
    torch.distributed.split_group itself. Needs a PyTorch whose Backend
    can split (2.14 or newer)."""
    if not hasattr(_dist, "split_group") or \
            not hasattr(_C.ProcessGroupUVCCL, "supports_splitting"):
        raise RuntimeError("uvccl_torch.split_group: PyTorch %s cannot split "
                           "groups (2.14 or newer can); use new_group"
                           % _torch.__version__)
    c10d = _dist.distributed_c10d
    default = c10d._get_default_group()
    if default.bound_device_id is not None:
        return _dist.split_group(parent_pg, split_ranks, timeout, pg_options,
                                 group_desc)
    if not split_ranks:
        raise ValueError("split_ranks cannot be None or empty")
    parent_pg = parent_pg or default
    world = c10d._world
    if parent_pg not in world.pg_group_ranks:
        raise ValueError("Group %s is not registered" % (parent_pg,))
    to_group = world.pg_group_ranks[parent_pg]
    to_global = {g: r for r, g in to_group.items()}
    me = default.rank()
    if me not in to_group:
        raise ValueError("Global rank %d is not part of the parent group" % me)
    backend = parent_pg._get_backend(_torch.device("cpu"))
    if not getattr(backend, "supports_splitting", False):
        raise RuntimeError("uvccl_torch.split_group: the parent group's CPU "
                           "backend (%s) cannot split" % backend.name())
    my_group = split_ranks[0]
    for ranks in split_ranks:
        if not ranks:
            raise ValueError("the split group cannot be empty")
        if len(ranks) != len(set(ranks)):
            raise ValueError("the split group cannot have duplicate ranks")
        if any(r not in to_global for r in ranks):
            raise ValueError("split group %s: ranks of the parent group are "
                             "0 to %d" % (ranks, parent_pg.size() - 1))
        if to_group[me] in ranks:
            my_group = ranks
            break
    name, _ = world.pg_map[parent_pg]
    pg_backend = _dist.Backend(name)
    if timeout is None:
        timeout = c10d._get_default_timeout(pg_backend)
    group_name = c10d._process_group_name(my_group, use_hashed_name=True)
    child = parent_pg.split_group(my_group, timeout=timeout, opts=pg_options,
                                  group_name=group_name, group_desc=group_desc)
    if child is None:
        return c10d.GroupMember.NON_GROUP_MEMBER
    c10d._register_pg_in_world(
        child, backend_name=pg_backend, store=child.get_group_store(),
        group_name=group_name,
        backend_config=str(c10d.BackendConfig(pg_backend)),
        rank_mapping={to_global[g]: i for i, g in enumerate(my_group)})
    return child
