#!/bin/bash
# bench/cluster/pin.sh - runs a rank's program on one CPU, the (r+1)-th
# word of PIN_CPUS, r its RANK (OMPI_COMM_WORLD_RANK under mpirun). For
# cluster.sh's WRAP, to see what the ranks' placement on a machine's few
# CPUs does to them (the scheduler places them anew each run):
#   PIN_CPUS="0 1 1 0" WRAP=$PWD/bench/cluster/pin.sh bench/cluster/cluster.sh
set -eu
r=${RANK:-${OMPI_COMM_WORLD_RANK:?pin.sh: neither RANK nor OMPI_COMM_WORLD_RANK}}
read -r -a cpus <<< "${PIN_CPUS:?pin.sh: PIN_CPUS names a CPU a rank}"
[ "$r" -lt "${#cpus[@]}" ] || { echo "pin.sh: no CPU for rank $r in PIN_CPUS" >&2; exit 2; }
exec taskset -c "${cpus[$r]}" "$@"
