#!/bin/sh
# make demo: real multi-rank worlds on this host.
#  1. the collectives: uvccl-run starts 4 ranks; each creates its group
#     from env:// (rank 0 hosts the store server itself), then uvccl-bench
#     runs every collective over a size sweep, checks every result and
#     prints nccl-tests-style timings;
#  1a. the loop stays responsive: 2 ranks run 64 MiB collectives started
#     from callbacks (as a server would) beside a 1 ms timer; how late
#     the timer fired, and the longest uvccl callback;
#  1b. a large world: 256 ranks (more than UVCCL_MESH_MAX, so sparse:
#     O(log N) store traffic, connections made when first needed), with
#     how long creation and the whole job took;
#  2. a rank dies: uvccl-run SIGKILLs rank 2 of 4 mid-run; the survivors
#     name it, shrink to a group of 3 and finish the sweep, results checked;
#  2a. it comes back: the same with uvccl-run --respawn, which serves the
#     store itself and starts the dead rank again; it joins the running
#     world (uvccl_pg_join) and the survivors grow back to 4; then a state
#     transfer (256 MiB, checksummed) against a broadcast of the same bytes;
#  3. a hang: rank 2 of 4 stalls before a collective; the others time out
#     naming whom they wait for, every rank dumps its flight recorder
#     (asked through the store) and uvccl-trace names rank 2;
#  4. the store: worker processes rendezvous through an embedded TCPStore
#     server and put a short load on it;
#  5. PyTorch, where python3-torch and the extension are: DDP on 4 local
#     ranks (torchrun) through the uvccl backend and through Gloo, from the
#     same initial parameters: step times side by side, results compared;
#  6. the HTTP service example (examples/vsearch): uvccl-vsearch on 4
#     ranks, H2O on rank 0's loop; a search, wrk for 3 s, then rank 2 is
#     killed: 503s naming it, the survivors shrink and serve every row;
#  7. the GPU, where there is one: 2 ranks sharing it through a TCP group
#     (buffers staged through pinned memory) and a 1-rank NCCL group;
#     elsewhere the reason there is none.
set -e
BUILD=${1:-build}
echo "== uvccl-run -n 4 uvccl-bench: every collective, 4 ranks, 4 B .. 4 MiB"
"$BUILD/bin/uvccl-run" -n 4 "$BUILD/bin/uvccl-bench" --op all -b 4 -e 4M -f 16 \
  --budget 0.2
echo
echo "== uvccl-run -n 2 uvccl-bench: allreduce, 2 ranks, 4 B .. 64 MiB (shared memory)"
"$BUILD/bin/uvccl-run" -n 2 "$BUILD/bin/uvccl-bench" --op allreduce -b 4 -e 64M -f 16 \
  --budget 0.2
echo
echo "== the same through loopback TCP only, as between hosts (UVCCL_TRANSPORT=tcp)"
UVCCL_TRANSPORT=tcp "$BUILD/bin/uvccl-run" -n 2 "$BUILD/bin/uvccl-bench" --op allreduce \
  -b 4 -e 64M -f 16 --budget 0.2
echo
echo "== the loop stays responsive: 2 ranks run 64 MiB collectives from callbacks, a 1 ms timer beside them"
echo "   (lag: how late the timer fired; os: the part the machine took from the loop's thread;"
echo "    cbcpu: the longest uvccl callback in CPU time; bench/coll/loop_lag.c)"
"$BUILD/bin/uvccl-run" -n 2 "$BUILD/bench/uvccl-loop-lag" --op allreduce,broadcast,allgather,reduce_scatter \
  --sizes 64M --iters 8
echo
echo "== a large world: uvccl-run -n 256 uvccl-bench (sparse: connections when first needed)"
T0=$(date +%s.%N)
"$BUILD/bin/uvccl-run" -n 256 "$BUILD/bin/uvccl-bench" --op allreduce,broadcast \
  -b 4 -e 4 -n 1 -w 1 2>&1 | grep -v '^\[[1-9]'
echo "# the whole job (256 processes started, created, two collectives, gone): $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $T0 }") s"
echo
echo "== a rank dies: uvccl-run -n 4 --kill 2@0.3 uvccl-bench --shrink-on-failure"
"$BUILD/bin/uvccl-run" -n 4 --kill 2@0.3 "$BUILD/bin/uvccl-bench" \
  --op allreduce,allgather -b 4 -e 4M -f 16 --budget 0.1 --shrink-on-failure
echo
echo "== it comes back: uvccl-run -n 4 --respawn --kill 2@0.3 uvccl-bench --elastic"
"$BUILD/bin/uvccl-run" -n 4 --respawn --kill 2@0.3 "$BUILD/bin/uvccl-bench" \
  --op allreduce,allgather -b 4 -e 4M -f 16 --budget 0.1 --elastic
echo
echo "== bringing a joiner up to date: uvccl-run -n 2 uvccl-transfer-bench (256 MiB in 64 buffers)"
"$BUILD/bin/uvccl-run" -n 2 "$BUILD/bench/uvccl-transfer-bench" --size 256M --iters 3
echo
echo "== a hang: rank 2 stalls 6 s before its 40th operation; timeout 2 s; UVCCL_TRACE_DIR set"
TRACE_DIR=$(mktemp -d)
UVCCL_TRACE_DIR=$TRACE_DIR UVCCL_TRACE_POLL_MS=500 "$BUILD/bin/uvccl-run" -n 4 \
  --keep-going "$BUILD/bin/uvccl-bench" --op allreduce -b 4 -e 64 -f 4 \
  --budget 0.05 --stall 2@40:6 --timeout 2 || true
echo
echo "== uvccl-trace $TRACE_DIR ($(ls "$TRACE_DIR" | wc -l) dumps)"
"$BUILD/bin/uvccl-trace" "$TRACE_DIR" || true
rm -rf "$TRACE_DIR"
echo
echo "== uvccl-demo: the store, 4 worker processes"
"$BUILD/bin/uvccl-demo" -n 4 --ops 3000
echo
echo "== uvccl-demo: the store, 32 worker processes"
"$BUILD/bin/uvccl-demo" -n 32 --ops 600
echo
echo "== PyTorch: torchrun --nproc_per_node 4, DDP (small MLP, 60 steps) over Gloo, then over uvccl"
if ls python/uvccl_torch/_C*.so >/dev/null 2>&1 && [ -x /usr/bin/torchrun ]; then
  LOGS=$(mktemp -d)
  PORT=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # (--redirects 1 --tee 1: torchrun 1.13 on Python 3.11 cannot parse its
  # own defaults)
  DDP_STEPS=60 DDP_MODELS=mlp DDP_BACKENDS=gloo,uvccl PYTHONWARNINGS=ignore \
    OMP_NUM_THREADS=1 /usr/bin/torchrun --nproc_per_node 4 \
    --master_addr 127.0.0.1 --master_port "$PORT" --redirects 1 --tee 1 \
    --log_dir "$LOGS" t/py/torch_ddp.py 2>/dev/null |
    sed -n 's/^\[default[0-9]*\]://p' | awk '
      /^@time 0 / { t[$3] = $5 }
      /^@check / { n++; if ($3 != 1) bad++; else if ($2 == 0) print "  rank 0: " substr($0, index($0, "|") + 2) }
      END {
        if (t["gloo"] && t["uvccl"])
          printf "  DDP step (mean after warm-up): Gloo %.2f ms, uvccl %.2f ms (%+.0f%%)\n", t["gloo"], t["uvccl"], (t["uvccl"] / t["gloo"] - 1) * 100
        printf "  %d checks on 4 ranks, %d failed\n", n, bad
      }'
  rm -rf "$LOGS"
else
  echo "skipped: python3-torch or the extension is missing (make builds it where libtorch-dev is installed)"
fi
echo
echo "== the HTTP service example: uvccl-run -n 4 --keep-going --kill 2@7 uvccl-vsearch (H2O on rank 0's loop)"
if [ -x "$BUILD/bin/uvccl-vsearch" ] && command -v wrk >/dev/null 2>&1; then
  /usr/bin/python3 examples/vsearch/demo.py "$BUILD"
else
  echo "skipped: uvccl-vsearch or wrk is missing (make builds it where libh2o-dev is installed)"
fi
echo
echo "== GPU"
if out=$("$BUILD/bin/uvccl-run" -n 2 "$BUILD/bin/uvccl-bench" --gpu \
    --op allreduce,allgather,broadcast -b 4K -e 64M -f 16 --budget 0.2 2>&1); then
  echo "$out"
  "$BUILD/bin/uvccl-run" -n 1 "$BUILD/bin/uvccl-bench" --backend nccl \
    --op allreduce,allgather,broadcast -b 4K -e 64M -f 16 --budget 0.2
else
  echo "skipped: $(echo "$out" | grep -m1 -o 'no CUDA.*\|--gpu: .*' || echo "$out" | tail -1)"
fi
