#!/bin/sh
# The cost of authentication. 1) At a store connection: a uvccl-store
# server with a secret and one without, side by side, ROUNDS rounds each
# way, alternating (new client, set, get, close). 2) At a world's
# creation: uvccl-create-bench under uvccl-run (a fresh secret: the store,
# every mesh connection and liveness link prove it) and under uvccl-run
# --no-auth, CREATES creations each way, alternating, 3 repeats, for 4, 8
# and 16 ranks (a 16-rank creation opens 240 connections: more would run
# loopback out of ephemeral ports while the last ones wait in TIME_WAIT).
# Prints markdown tables.
#   bench/auth/run.sh [ROUNDS [REPEATS [CREATES]]]
#   (default 2000 rounds, 5 repeats, 10 creations)
set -e
cd "$(dirname "$0")/../.."
B=build
rounds=${1:-2000}
reps=${2:-5}
creates=${3:-10}
secret=bench-secret-$$
dir=$(mktemp -d)
printf '%s\n' "$secret" > "$dir/secret"
chmod 600 "$dir/secret"
"$B/bin/uvccl-store" serve --host 127.0.0.1 --port 0 --no-auth --quiet > "$dir/open" &
p1=$!
"$B/bin/uvccl-store" serve --host 127.0.0.1 --port 0 --auth-file "$dir/secret" --quiet > "$dir/auth" &
p2=$!
trap 'kill $p1 $p2 2>/dev/null; rm -rf "$dir"' EXIT
for f in open auth; do
  while ! grep -q listening "$dir/$f" 2>/dev/null; do sleep 0.05; done
done
po=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$dir/open")
pa=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$dir/auth")
echo "| repeat | open: median us | open: p99 us | secured: median us | secured: p99 us |"
echo "|---:|---:|---:|---:|---:|"
i=1
while [ $i -le "$reps" ]; do
  o=$("$B/bench/uvccl-auth-bench" 127.0.0.1 "$po" "$rounds")
  a=$("$B/bench/uvccl-auth-bench" 127.0.0.1 "$pa" "$rounds" "$secret")
  echo "| $i | ${o% *} | ${o#* } | ${a% *} | ${a#* } |"
  i=$((i + 1))
done

echo
echo "| ranks | repeat | open: median ms | open: p90 ms | secured: median ms | secured: p90 ms |"
echo "|---:|---:|---:|---:|---:|---:|"
for n in 4 8 16; do
  i=1
  while [ $i -le 3 ]; do
    o=$("$B/bin/uvccl-run" -n "$n" --no-auth "$B/bench/uvccl-create-bench" "$creates" | sed 's/^\[0\] //')
    a=$("$B/bin/uvccl-run" -n "$n" "$B/bench/uvccl-create-bench" "$creates" | sed 's/^\[0\] //')
    echo "| $n | $i | ${o% *} | ${o#* } | ${a% *} | ${a#* } |"
    i=$((i + 1))
  done
done
