#!/usr/bin/env bash
# Bytes per rank per step of the dense all-reduce and of the hook's two exchanges at several
# world sizes, counted on the loopback of a private network namespace (needs root; nothing
# leaves the namespace): bench/exchange_bytes.py inside `unshare -n`. Options pass through,
# e.g. scripts/exchange_bytes.sh --ranks 4,8 --json build/exchange_bytes.jsonl
# RATE (e.g. 100mbit): the loopback shaped to that rate (tbf, as scripts/train_speed.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "exchange_bytes.sh: needs root (unshare -n)" >&2; exit 77; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec unshare -n -- bash -c 'ip link set lo up && { [ -z "$0" ] || tc qdisc add dev lo root tbf rate "$0" burst 256kb latency 20ms; } && exec "$@"' \
  "${RATE:-}" /usr/bin/python3 bench/exchange_bytes.py "$@"
