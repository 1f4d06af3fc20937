"""PyTorch's own distributed test suite against uvccl.

Runs torch/testing/_internal/distributed/distributed_test.py (shipped by
python3-torch) the way PyTorch's test/distributed/test_distributed_spawn.py
does: one class joining TestDistBackend and DistributedTest._DistTestBase,
every test in its own world of WORLD_SIZE spawned processes, configured by
BACKEND, WORLD_SIZE and TEMP_DIR.

    dist_suite.py MODE WORLD_SIZE OUT.tsv [NAME_SUBSTRING ... | --passed-in TSV]

MODE:
  gloo           PyTorch's Gloo, untouched: the reference outcomes
  uvccl          BACKEND=uvccl, a plugin backend whose features are declared
                 in DistTestCases.backend_feature (the way a third-party
                 backend runs the suite)
  uvccl-as-gloo  BACKEND=gloo, but every group c10d would build with Gloo is
                 a uvccl group (distributed_c10d.ProcessGroupGloo patched), so
                 the tests PyTorch gates to Gloo (monitored barrier,
                 allreduce_coalesced, batch_isend_irecv, barrier timeouts,
                 get_future, sparse allreduce) run on uvccl too

OUT.tsv gets one line per test: name, outcome (pass, fail, error, skip),
seconds, and the first line of the reason. Tests their decorators skip
outright (a backend or world size they need) are recorded as skipped
without starting processes. --passed-in TSV runs only the tests that
passed in an earlier run's TSV (Gloo's, for the uvccl modes). The exit status is 0 when the
suite ran, whatever the outcomes; comparing modes is the caller's job.

This file is the spawned ranks' main module too (multiprocessing's spawn
imports it again in each), so the mode's setup below runs in every rank.
"""
import os
import sys
import tempfile
import time
import unittest

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))

MODE = os.environ.get("UVCCL_SUITE_MODE")
if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.stderr.write(__doc__)
        sys.exit(2)
    MODE = sys.argv[1]
    os.environ["UVCCL_SUITE_MODE"] = MODE
    os.environ["WORLD_SIZE"] = sys.argv[2]
    os.environ["BACKEND"] = "uvccl" if MODE == "uvccl" else "gloo"
    if "TEMP_DIR" not in os.environ:
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="uvccl-suite-")
    out_path = sys.argv[3]
    patterns = sys.argv[4:]
    # common_utils parses the command line when imported
    sys.argv = sys.argv[:1]

sys.path.insert(0, os.path.join(here, "stubs"))  # expecttest
sys.path.insert(0, os.path.join(root, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402
from torch.testing._internal import common_distributed  # noqa: E402

# The suite's ranks turn on DDP's experimental ReplicatedTensor mode, which
# imports torch.distributed._shard.sharded_tensor: on Debian (PyTorch 1.13,
# Python 3.11) that import fails ("mutable default ... for field
# tensor_properties"), and every DDP test with it, whatever the backend.
# Left off, DDP runs the way users run it.
# (PyTorch 2.x has no such mode.)
try:
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402
    _rt._set_ddp_with_replicated_tensor = lambda value: None
except ImportError:
    pass

if MODE in ("uvccl", "uvccl-as-gloo"):
    import uvccl_torch  # noqa: E402,F401  (registers "uvccl")

if MODE == "uvccl":
    # what a plugin declares: uvccl runs every CPU collective and DDP, and
    # makes subgroups
    feats = common_distributed.DistTestCases.backend_feature
    feats["plugin"].add("uvccl")
    feats["ddp"].add("uvccl")
    feats["subgroup"].add("uvccl")

if MODE == "uvccl-as-gloo":
    _Gloo = c10d.ProcessGroupGloo

    class _UvcclAsGloo(uvccl_torch.ProcessGroupUVCCL):
        """uvccl under Gloo's name: a class, so that c10d's isinstance
        checks against ProcessGroupGloo (2.x) hold for it."""
        # the names code asks of ProcessGroupGloo besides construction
        _Options = _Gloo._Options
        create_device = _Gloo.create_device
        create_default_device = _Gloo.create_default_device

        def __init__(self, store, rank, size, timeout=c10d.default_pg_timeout,
                     **_ignored):  # 2.14: enable_reconfigure=
            super().__init__(store, rank, size, timeout, "gloo")

    _uvccl_as_gloo = _UvcclAsGloo
    c10d.ProcessGroupGloo = _uvccl_as_gloo
    # PyTorch 2.14 builds Gloo through its registered creator (the builtin
    # backends are plugins there, registered at first use through an entry
    # point), not through the module's name
    if hasattr(dist.Backend, "_ensure_backend_registered"):
        dist.Backend._ensure_backend_registered("gloo")
    _plugins = getattr(dist.Backend, "_plugins", {})
    if "GLOO" in _plugins and hasattr(_plugins["GLOO"], "_replace"):
        def _create_as_gloo(opts, backend_options=None):
            return _UvcclAsGloo(opts.store, opts.group_rank, opts.group_size,
                                opts.timeout)
        _plugins["GLOO"] = _plugins["GLOO"]._replace(creator_fn=_create_as_gloo)

    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each group with a Gloo helper
    # group that checks the collectives match; that helper must be a real
    # ProcessGroupGloo (the wrapper's type): the group it checks is uvccl's
    _wrap = c10d._create_process_group_wrapper

    def _wrapper_with_real_gloo(*args, **kwargs):
        c10d.ProcessGroupGloo = _Gloo
        try:
            return _wrap(*args, **kwargs)
        finally:
            c10d.ProcessGroupGloo = _uvccl_as_gloo

    c10d._create_process_group_wrapper = _wrapper_with_real_gloo

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # UVCCL_SUITE_START=fork: ranks forked from this process, which has
        # torch imported already (about a second less per test than
        # spawning, as PyTorch's old test_distributed_fork.py ran them);
        # this process never starts a group, so nothing is forked mid-use
        if os.environ.get("UVCCL_SUITE_START") == "fork":
            self._start_processes(
                torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


class Recorder(unittest.TextTestResult):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.rows = []
        self._t0 = 0.0

    def startTest(self, test):
        self._t0 = time.time()
        super().startTest(test)

    def _row(self, test, outcome, why=""):
        why = (why or "").strip().splitlines()
        # the last line of a traceback says what went wrong
        why = why[-1] if why else ""
        name = test.id().split(".")[-1]
        self.rows.append((name, outcome, "%.1f" % (time.time() - self._t0),
                          why.replace("\t", " ")[:300]))
        with open(out_path, "a") as f:
            f.write("\t".join(self.rows[-1]) + "\n")

    def addSuccess(self, test):
        super().addSuccess(test)
        self._row(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._row(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._row(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._row(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._row(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._row(test, "fail", "unexpected success")


def main():
    names = sorted(n for n in dir(TestDistBackendWithSpawn)
                   if n.startswith("test_"))
    if patterns[:1] == ["--passed-in"]:
        with open(patterns[1]) as f:
            passed = {ln.split("\t")[0] for ln in f
                      if ln.split("\t")[1:2] == ["pass"]}
        names = [n for n in names if n in passed]
    elif patterns:
        names = [n for n in names if any(p in n for p in patterns)]
    open(out_path, "w").close()
    # skipped by a decorator at import: no need to start a world for them
    static = [n for n in names
              if getattr(getattr(TestDistBackendWithSpawn, n),
                         "__unittest_skip__", False)]
    with open(out_path, "a") as f:
        for n in static:
            why = getattr(getattr(TestDistBackendWithSpawn, n),
                          "__unittest_skip_why__", "")
            f.write(f"{n}\tskip\t0.0\t{why}\n")
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names
                               if n not in static)
    runner = unittest.TextTestRunner(resultclass=Recorder, verbosity=2,
                                     stream=sys.stderr)
    runner.run(suite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
