#!/bin/sh
# The HTTP service example under wrk, against the same service in Python
# (asyncio + Gloo): see bench.py. Needs `make` first.
#   bench/server/run.sh [SECONDS]
cd "$(dirname "$0")/../.." && exec /usr/bin/python3 bench/server/bench.py "$@"
