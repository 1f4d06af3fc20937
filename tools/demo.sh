#!/bin/sh
# make demo: a real multi-process world through an embedded store server.
set -e
BUILD=${1:-build}
echo "== uvccl-demo: 4 worker processes"
"$BUILD/bin/uvccl-demo" -n 4 --ops 3000
echo
echo "== uvccl-demo: 32 worker processes"
"$BUILD/bin/uvccl-demo" -n 32 --ops 600
