#!/bin/sh
# Builds the PyTorch backend's extension (python/uvccl_torch/_C*.so) against
# the PyTorch of $PYTHON (default python3): a pip-installed one, say, where
# `make` builds it against Debian's libtorch-dev. Where that PyTorch has CUDA
# the extension serves CUDA tensors too (uvccl NCCL groups, or staging).
# Needs build/libuvccl.a (make), a C++17 compiler (C++20 for the newest
# PyTorch; $CXX, default g++),
# libuv's headers ($UV_CFLAGS, $UV_LIBS, default -luv) and OpenSSL
# ($SSL_LIBS, default -lssl -lcrypto).
#
#   PYTHON=/opt/venv/bin/python3 tools/torch-ext.sh
set -e
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CXX=${CXX:-g++}
[ -f build/libuvccl.a ] || { echo "torch-ext: build/libuvccl.a missing (run make)" >&2; exit 2; }
vars=$("$PY" - <<'PYEOF'
import os, sysconfig, torch
d = os.path.dirname(torch.__file__)
print("TORCH_DIR=%s" % d)
print("SUFFIX=%s" % sysconfig.get_config_var("EXT_SUFFIX"))
print("PYINC=%s" % sysconfig.get_paths()["include"])
print("ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("CUDA=%s" % (torch.version.cuda or ""))
# torch's pybind11 identity: the extension's classes derive from torch's
for k in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    print("PB_%s=%s" % (k, getattr(torch._C, "_PYBIND11_" + k, "") or ""))
inc = ""
if torch.version.cuda:
    from torch.utils import cpp_extension as ce
    for c in ([os.path.join(ce.CUDA_HOME, "include")] if ce.CUDA_HOME else []) + \
             [os.path.join(p, "nvidia", s, "include")
              for p in __import__("site").getsitepackages()
              for s in ("cu13", "cuda_runtime")]:
        if os.path.exists(os.path.join(c, "cuda_runtime_api.h")):
            inc = c
            break
print("CUDA_INC=%s" % inc)
PYEOF
)
eval "$vars"
if [ ! -f "$PYINC/Python.h" ]; then
  echo "torch-ext: no Python.h in $PYINC (PYINC=dir to override)" >&2
  [ -n "$PYINC_OVERRIDE" ] && PYINC=$PYINC_OVERRIDE || exit 2
fi
defs="-D_GLIBCXX_USE_CXX11_ABI=$ABI"
[ -n "$PB_COMPILER_TYPE" ] && defs="$defs -DPYBIND11_COMPILER_TYPE=\\\"$PB_COMPILER_TYPE\\\""
[ -n "$PB_STDLIB" ] && defs="$defs -DPYBIND11_STDLIB=\\\"$PB_STDLIB\\\""
[ -n "$PB_BUILD_ABI" ] && defs="$defs -DPYBIND11_BUILD_ABI=\\\"$PB_BUILD_ABI\\\""
cuda_flags=""
cuda_libs=""
if [ -n "$CUDA" ]; then
  [ -n "$CUDA_INC" ] || { echo "torch-ext: PyTorch has CUDA $CUDA but no cuda_runtime_api.h was found" >&2; exit 2; }
  cuda_flags="-DUVCCL_TORCH_CUDA -I$CUDA_INC"
  cuda_libs="-lc10_cuda"
fi
# a pip wheel carries its headers and libraries; Debian's are in /usr
tinc=$TORCH_DIR/include
[ -d "$tinc/torch" ] || tinc=/usr/include
tlib=$TORCH_DIR/lib
[ -d "$tlib" ] || tlib=/usr/lib
# the C++ standard those headers ask for (C++20 in the newest PyTorch)
std=c++17
grep -qs '__cplusplus < 202002L' "$tinc/torch/csrc/api/include/torch/all.h" && std=c++20
out=python/uvccl_torch/_C$SUFFIX
echo "torch-ext: $out (PyTorch in $TORCH_DIR${CUDA:+, CUDA $CUDA})"
eval "$CXX -std=$std -O2 -g -fPIC -shared -Wall -Wno-unused-parameter $defs \
  $cuda_flags -Iinclude -I$PYINC -I$tinc \
  -I$tinc/torch/csrc/api/include ${UV_CFLAGS:-} \
  -o $out python/uvccl_torch/csrc/*.cpp build/libuvccl.a \
  ${UV_LIBS:--luv} -L$tlib -Wl,-rpath,$tlib \
  -ltorch -ltorch_cpu -lc10 -ltorch_python $cuda_libs \
  ${SSL_LIBS:--lssl -lcrypto} -pthread -ldl -lm"
