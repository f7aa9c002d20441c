#!/usr/bin/env bash
# Bytes per rank per step of the dense all-reduce and of the hook's two exchanges at several
# world sizes, counted on the loopback of a private network namespace (needs root; nothing
# leaves the namespace): bench/exchange_bytes.py inside `unshare -n`. Options pass through,
# e.g. scripts/exchange_bytes.sh --ranks 4,8 --json build/exchange_bytes.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "exchange_bytes.sh: needs root (unshare -n)" >&2; exit 77; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec unshare -n -- bash -c 'ip link set lo up && exec "$@"' _ /usr/bin/python3 bench/exchange_bytes.py "$@"
