"""pytest for the asyncio binding. With $UVCCL_TAP_FILE set (t/7001 sets
it), each test's outcome is also written there as a TAP line, which that
C test prints for prove."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "python"))

_tap = None


def pytest_configure(config):
    global _tap
    path = os.environ.get("UVCCL_TAP_FILE")
    if path:
        _tap = open(path, "w", buffering=1)


def pytest_runtest_logreport(report):
    if _tap is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.skipped:
            _tap.write("ok - %s # SKIP\n" % report.nodeid)
        elif report.passed:
            _tap.write("ok - %s\n" % report.nodeid)
        else:
            _tap.write("not ok - %s\n" % report.nodeid)
