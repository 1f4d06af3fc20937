#!/bin/sh
# What TLS costs (issue 17), side by side in one run, alternating:
#  1) collectives: uvccl-bench allreduce on 4 ranks under uvccl-run, at
#     4 B, 1 MiB and 16 MiB, without TLS and with ($UVCCL_TLS_* for every
#     rank: the mesh and liveness links, and the store, over TLS);
#  2) store operations: uvccl-tls-store-bench (CLIENTS clients of uvccl's
#     client on one loop, SET then GET in closed loops) against
#     uvccl-store serve without TLS and with.
# Certificates: a throwaway CA and one EC P-256 certificate, made here
# with the openssl command. Prints markdown tables.
#   bench/tls/run.sh [REPEATS [CLIENTS [SECONDS]]]   (default 3, 8, 2)
set -e
cd "$(dirname "$0")/../.."
B=build
reps=${1:-3}
clients=${2:-8}
secs=${3:-2}
dir=$(mktemp -d)
trap 'kill $p1 $p2 2>/dev/null; rm -rf "$dir"' EXIT
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
(cd "$dir" &&
 openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj '/CN=bench CA' &&
 openssl req $ec -keyout rank.key -out rank.csr -subj '/CN=bench rank' &&
 openssl x509 -req -in rank.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
   -out rank.pem -days 2) >/dev/null 2>&1
tlsenv="UVCCL_TLS_CERT=$dir/rank.pem UVCCL_TLS_KEY=$dir/rank.key UVCCL_TLS_CA=$dir/ca.pem"

# uvccl-bench's busbw and median time at one size: "med_us busbw"
row() { sed 's/^\[0\] //' | awk -v s="$1" '$1=="allreduce" && $3==s {print $5, $8}'; }

echo "| repeat | size | plain: median us | plain: busbw GB/s | TLS: median us | TLS: busbw GB/s |"
echo "|---:|---:|---:|---:|---:|---:|"
i=1
while [ "$i" -le "$reps" ]; do
  "$B/bin/uvccl-run" -n 4 "$B/bin/uvccl-bench" -b 4 -e 16M -f 4 --budget 0.5 \
    --timeout 60 > "$dir/plain" 2>&1
  env $tlsenv "$B/bin/uvccl-run" -n 4 "$B/bin/uvccl-bench" -b 4 -e 16M -f 4 \
    --budget 0.5 --timeout 60 > "$dir/tls" 2>&1
  for s in 4 1048576 16777216; do
    p=$(row $s < "$dir/plain")
    t=$(row $s < "$dir/tls")
    echo "| $i | $s | ${p% *} | ${p#* } | ${t% *} | ${t#* } |"
  done
  i=$((i + 1))
done

"$B/bin/uvccl-store" serve --host 127.0.0.1 --port 0 --no-auth --no-tls --quiet > "$dir/open" &
p1=$!
env $tlsenv "$B/bin/uvccl-store" serve --host 127.0.0.1 --port 0 --no-auth --quiet > "$dir/secure" &
p2=$!
for f in open secure; do
  while ! grep -q listening "$dir/$f" 2>/dev/null; do sleep 0.05; done
done
po=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$dir/open")
ps=$(sed -n 's/.*:\([0-9]*\)$/\1/p' "$dir/secure")
echo
echo "| repeat | clients | plain: ops/s | TLS: ops/s |"
echo "|---:|---:|---:|---:|"
i=1
while [ "$i" -le "$reps" ]; do
  o=$(env -u UVCCL_TLS_CERT -u UVCCL_TLS_KEY -u UVCCL_TLS_CA \
      "$B/bench/uvccl-tls-store-bench" 127.0.0.1 "$po" "$clients" "$secs")
  t=$(env $tlsenv "$B/bench/uvccl-tls-store-bench" 127.0.0.1 "$ps" "$clients" "$secs")
  echo "| $i | $clients | $o | $t |"
  i=$((i + 1))
done
