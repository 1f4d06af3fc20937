#!/bin/bash
# Packs what a GPU machine without our build tools needs to run the GPU
# tests and benchmarks: the built programs, the GPU tests, libuv, into .gpu/
# (ignored by git; carry it to the machine). There, from the repository
# root:
#
#   . .gpu/unpack.sh && tools/gpu-check.sh DIR      # or bench/gpu/*.sh
#
# unpack.sh puts the programs back under build/ and t/, and sets
# LD_LIBRARY_PATH to the packed libuv and to the CUDA runtime and NCCL of
# the machine's PyTorch wheels (python3's nvidia.* packages). The tests
# name build/ by the absolute path they were built in, so unpack.sh links
# that path to build/ where it does not exist. For the PyTorch extension
# (tools/torch-ext.sh, built there by tools/gpu-check.sh) it packs
# libuvccl.a and libuv's headers, and unpack.sh points UV_CFLAGS and
# UV_LIBS at them.
#
#   tools/gpu-pack.sh            # after make and make tests
set -eu
cd "$(dirname "$0")/.."
[ -x build/bin/uvccl-bench ] && [ -x build/bench/stage_bench ] &&
  [ -x build/bench/uvccl-loop-lag ] ||
  { echo "gpu-pack: build first (make && make tests)" >&2; exit 2; }
rm -rf .gpu
mkdir -p .gpu/build/bench .gpu/t .gpu/lib
cp -a build/bin build/fake build/libuvccl.a .gpu/build/
rm -f .gpu/build/bin/uvccl-vsearch .gpu/build/bin/uvccl-demo
cp build/bench/stage_bench build/bench/nccl_bench build/bench/uvccl-loop-lag \
  .gpu/build/bench/
# the system calls' times beside the loop's lag (CALL_TIMES=1 loop_lag.sh)
[ -f build/bench/call_times.so ] && cp build/bench/call_times.so .gpu/build/bench/
for t in t/3001-*.t t/3002-gpu-device-cuda.t t/3004-*.t t/3010-*.t t/204*.t; do
  [ -f "$t" ] && cp "$t" .gpu/t/
done
uv=$(ldd build/bin/uvccl-bench | awk '/libuv\.so/ { print $3 }')
[ -n "$uv" ] && cp -L "$uv" .gpu/lib/
uvh=$(echo '#include <uv.h>' | ${CC:-cc} $(pkg-config --cflags libuv 2>/dev/null) -M -E - 2>/dev/null |
  tr ' \\' '\n\n' | grep '/uv\.h$' | head -1)
if [ -n "$uvh" ]; then
  mkdir -p .gpu/include
  cp -r "$uvh" "$(dirname "$uvh")/uv" .gpu/include/
fi
cat > .gpu/unpack.sh << EOF
# sourced on the GPU machine, from the repository root
mkdir -p build && cp -a .gpu/build/. build/ && cp .gpu/t/*.t t/
_nv=\$(python3 -c 'import nvidia, glob, os; print(":".join(d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib"))))' 2>/dev/null)
export LD_LIBRARY_PATH=\$PWD/.gpu/lib\${_nv:+:\$_nv}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
[ -e "$PWD/build" ] || { mkdir -p "$PWD" && ln -s "\$PWD/build" "$PWD/build"; }
# for tools/torch-ext.sh: the packed libuv and its headers
if [ -d .gpu/include ]; then export UV_CFLAGS="-I\$PWD/.gpu/include"; fi
if ls .gpu/lib/libuv.so* > /dev/null 2>&1; then
  export UV_LIBS="\$(ls \$PWD/.gpu/lib/libuv.so* | head -1) -Wl,-rpath,\$PWD/.gpu/lib"
fi
EOF
du -sh .gpu | sed 's/^/gpu-pack: /'
