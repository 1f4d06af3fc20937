#!/usr/bin/env bash
# make torch-suite: PyTorch's own distributed test suite
# (torch/testing/_internal/distributed/distributed_test.py, shipped by
# python3-torch) against the uvccl backend, through t/py/dist_suite.py, at
# world sizes 2, 3 and 4. Gloo's outcomes on this kind of machine are in
# t/py/suite-gloo/gloo-W.tsv (GLOO=1 runs Gloo again instead); every test
# that passes there runs with uvccl both ways (as the plugin backend
# "uvccl", and as the groups c10d would build with Gloo), and must pass in
# at least one (t/py/dist_suite_report.py says why a test can run only one
# way). Results and the report go to OUT (build/torch-suite).
#
#   make torch-suite                 # WORLDS="2 3 4"
#   WORLDS=2 GLOO=1 t/dist_suite.sh
#   UVCCL_SUITE_START=fork make torch-suite   # forked ranks (CI): faster
#   TORCH_ROOT=/opt/uvccl-torch/sid t/dist_suite.sh
#       the suite of that root's PyTorch (tools/torch-root.sh), against the
#       extension t/run-torch2-backend.sh built there (`prove
#       t/5003-torch2-backend.t` builds it); Gloo runs there too (no
#       reference outcomes are kept for a PyTorch that moves); results in
#       build/torch-suite-ROOTNAME
set -u
cd "$(dirname "$0")/.."
root=${TORCH_ROOT:-}
if [ -n "$root" ]; then
  out=${OUT:-build/torch-suite-$(basename "$root")}
  src=$root/uvccl-src
  if ! ls "$src"/python/uvccl_torch/_C*.so >/dev/null 2>&1; then
    echo "torch-suite: $root has no built extension (prove t/5003-torch2-backend.t builds it)" >&2
    exit 2
  fi
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  cp t/py/dist_suite.py t/py/dist_suite_report.py "$src/t/py/"
  rm -rf "$src/build/torch-suite"
  mkdir -p "$src/build/torch-suite"
  GLOO=1
  # Debian builds PyTorch without libuv: its TCPStore needs USE_LIBUV=0
  py() {
    chroot "$root" /usr/bin/env USE_LIBUV=0 \
      UVCCL_SUITE_START="${UVCCL_SUITE_START:-}" /bin/sh -c \
      'cd /uvccl-src && exec python3 "$@"' sh "$@"
  }
  # where the ranks write (inside the root), as the host sees it
  at=$src/build/torch-suite
  in=build/torch-suite
else
  out=${OUT:-build/torch-suite}
  py() { /usr/bin/python3 "$@"; }
  if ! py -c 'import torch.distributed' 2>/dev/null; then
    echo "torch-suite: skipped: no python3-torch"
    exit 0
  fi
  if ! ls python/uvccl_torch/_C*.so >/dev/null 2>&1; then
    echo "torch-suite: skipped: the extension is not built (libtorch-dev)"
    exit 0
  fi
  at=$out
  in=$out
fi
worlds=${WORLDS:-2 3 4}
echo "torch-suite: PyTorch $(py -c 'import torch; print(torch.__version__)')"
mkdir -p "$out"
for w in $worlds; do
  if [ "${GLOO:-0}" = 1 ]; then
    echo "== Gloo, world $w ($(date +%T))"
    py t/py/dist_suite.py gloo "$w" "$in/gloo-$w.tsv" >"$out/gloo-$w.log" 2>&1
  else
    cp "t/py/suite-gloo/gloo-$w.tsv" "$at/gloo-$w.tsv"
  fi
  for mode in uvccl-as-gloo uvccl; do
    echo "== $mode, world $w: the tests Gloo passes ($(date +%T))"
    py t/py/dist_suite.py "$mode" "$w" "$in/$mode-$w.tsv" \
      --passed-in "$in/gloo-$w.tsv" >"$out/$mode-$w.log" 2>&1
  done
done
[ "$at" = "$out" ] || cp "$at"/*.tsv "$out/"
/usr/bin/python3 t/py/dist_suite_report.py "$out" $worlds >"$out/report.md"
rc=$?
sed -n '1,/^$/p' "$out/report.md"
sed -n '/^Passing with Gloo/,$p' "$out/report.md"
echo "torch-suite: the whole report is $out/report.md"
exit $rc
