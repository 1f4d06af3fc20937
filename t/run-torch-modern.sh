#!/usr/bin/env bash
# PyTorch 2.x's TCPStore client (the modern dialect) against our server:
# starts build/bin/uvccl-store serve on a free port of 127.0.0.1, runs
# t/torch_modern_client.py against it, stops the server, and exits with
# the script's status. Builds nothing: run `make` first.
#
#   t/run-torch-modern.sh            # python3 from PATH (must have torch)
#   PYTHON=/usr/bin/python3 t/run-torch-modern.sh
#   UVCCL_STORE=build-san/bin/uvccl-store t/run-torch-modern.sh
#   TORCH_ROOT=/opt/uvccl-torch/trixie t/run-torch-modern.sh  # see
#                                          # tools/torch-root.sh
set -u
cd "$(dirname "$0")/.."

STORE=${UVCCL_STORE:-build/bin/uvccl-store}
if [ ! -x "$STORE" ]; then
  echo "run-torch-modern: $STORE not found; run make first" >&2
  exit 2
fi
if [ -n "${TORCH_ROOT:-}" ]; then
  # A root made by tools/torch-root.sh; `run` copies the script in.
  python=(tools/torch-root.sh run "$TORCH_ROOT" python3)
  client=/uvccl/torch_modern_client.py
else
  python=("${PYTHON:-python3}")
  client=t/torch_modern_client.py
fi
if ! "${python[@]}" -c 'import torch.distributed' 2>/dev/null; then
  echo "run-torch-modern: ${python[*]} has no torch.distributed" >&2
  exit 2
fi

tmp=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 50); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$STORE" serve --host 127.0.0.1 --port 0 >"$tmp/out" 2>"$tmp/err" &
server_pid=$!

port=
for _ in $(seq 300); do # 30 s
  port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$tmp/out" | head -n1)
  [ -n "$port" ] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "run-torch-modern: the server did not report its port" >&2
  cat "$tmp/out" "$tmp/err" >&2
  exit 2
fi
echo "# uvccl-store serving on 127.0.0.1:$port (pid $server_pid)"

GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} \
  "${python[@]}" "$client" "127.0.0.1:$port"
status=$?

if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "run-torch-modern: the server died during the run" >&2
  cat "$tmp/err" >&2
  [ "$status" -eq 0 ] && status=1
else
  kill -TERM "$server_pid"
  wait "$server_pid"
  rc=$?
  server_pid=
  if [ "$rc" -ne 0 ]; then
    echo "run-torch-modern: the server exited $rc on SIGTERM" >&2
    cat "$tmp/err" >&2
    [ "$status" -eq 0 ] && status=1
  fi
fi
exit "$status"
