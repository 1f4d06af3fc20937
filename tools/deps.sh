#!/bin/sh
# Installs the Debian packages uvccl needs to build and test, where missing.
# Runs as root (CI, developer machines) or through sudo; does nothing when
# everything is already there.
set -e
need=""
[ -f /usr/include/uv.h ] || need="$need libuv1-dev"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v prove >/dev/null 2>&1 || need="$need perl"
# The real PyTorch client and server for the interoperability tests.
[ -f /usr/lib/python3/dist-packages/torch/__init__.py ] || need="$need python3-torch"
# The PyTorch backend's extension (python/uvccl_torch): libtorch's and
# Python's headers, pybind11's.
[ -f /usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp ] || need="$need libtorch-dev"
[ -n "$(ls /usr/include/python3*/Python.h 2>/dev/null)" ] || need="$need python3-dev"
[ -f /usr/include/pybind11/pybind11.h ] || need="$need pybind11-dev"
# The asyncio binding's tests (t/py/asyncio): pytest with its asyncio
# plugin, numpy arrays as buffers, aiohttp for the example server, venv
# and pip for its offline `pip install` test.
/usr/bin/python3 -c "import pytest, pytest_asyncio, numpy, aiohttp, ensurepip, setuptools" >/dev/null 2>&1 ||
  need="$need python3-pytest python3-pytest-asyncio python3-numpy python3-aiohttp python3-venv python3-pip python3-setuptools"
command -v g++ >/dev/null 2>&1 || need="$need g++"
# The Node.js addon (node/): node, npm, and Node's headers (uv.h, node_api.h).
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
[ -f "$(dirname "$(dirname "$(command -v node 2>/dev/null || echo /usr/bin/node)")")/include/node/node_api.h" ] ||
  need="$need libnode-dev"
command -v redis-server >/dev/null 2>&1 || need="$need redis-server"
command -v redis-benchmark >/dev/null 2>&1 || need="$need redis-tools"
command -v clang >/dev/null 2>&1 || need="$need clang"
# The HTTP service example (examples/vsearch): H2O on libuv (its headers
# include OpenSSL's), and wrk for its load tests and benchmark.
[ -f /usr/include/h2o.h ] || need="$need libh2o-dev"
[ -f /usr/include/openssl/ssl.h ] || need="$need libssl-dev"
# The openssl command makes the TLS tests' and benchmark's certificates.
command -v openssl >/dev/null 2>&1 || need="$need openssl"
command -v wrk >/dev/null 2>&1 || need="$need wrk"
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || command -v ip >/dev/null 2>&1 || need="$need iproute2"
[ -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || need="$need libclang-rt-14-dev"
# The memory checker: make valgrind, and the Node.js addon's test under it.
command -v valgrind >/dev/null 2>&1 || need="$need valgrind"
[ -z "$need" ] && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "deps: installing$need"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq $need >/dev/null
