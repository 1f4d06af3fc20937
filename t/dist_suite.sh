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
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/torch-suite}
worlds=${WORLDS:-2 3 4}
py=/usr/bin/python3
if ! $py -c 'import torch.distributed' 2>/dev/null; then
  echo "torch-suite: skipped: no python3-torch"
  exit 0
fi
if ! ls python/uvccl_torch/_C*.so >/dev/null 2>&1; then
  echo "torch-suite: skipped: the extension is not built (libtorch-dev)"
  exit 0
fi
mkdir -p "$out"
for w in $worlds; do
  if [ "${GLOO:-0}" = 1 ]; then
    echo "== Gloo, world $w ($(date +%T))"
    $py t/py/dist_suite.py gloo "$w" "$out/gloo-$w.tsv" >"$out/gloo-$w.log" 2>&1
  else
    cp "t/py/suite-gloo/gloo-$w.tsv" "$out/gloo-$w.tsv"
  fi
  for mode in uvccl-as-gloo uvccl; do
    echo "== $mode, world $w: the tests Gloo passes ($(date +%T))"
    $py t/py/dist_suite.py "$mode" "$w" "$out/$mode-$w.tsv" \
      --passed-in "$out/gloo-$w.tsv" >"$out/$mode-$w.log" 2>&1
  done
done
$py t/py/dist_suite_report.py "$out" $worlds >"$out/report.md"
rc=$?
sed -n '1,/^$/p' "$out/report.md"
sed -n '/^Passing with Gloo, with neither/,$p' "$out/report.md"
echo "torch-suite: the whole report is $out/report.md"
exit $rc
