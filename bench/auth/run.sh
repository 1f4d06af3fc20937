#!/bin/sh
# The cost of store authentication at connect: a uvccl-store server with a
# secret and one without, side by side, ROUNDS rounds each way, alternating
# (new client, set, get, close). Prints a markdown table.
#   bench/auth/run.sh [ROUNDS [REPEATS]]     (default 2000 rounds, 5 repeats)
set -e
cd "$(dirname "$0")/../.."
B=build
rounds=${1:-2000}
reps=${2:-5}
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
