#!/usr/bin/env bash
# Bytes per rank per step of the MPI exchanges (dense MPI_Allreduce, the one-round all-gather
# and the reduce-scatter exchange) at several rank counts, counted on the loopback of a
# private network namespace (needs root; nothing leaves it) with Open MPI's TCP transport
# (no shared memory): build/bench/sidco-mpi-exchange-bytes under mpirun inside `unshare -n`.
#   scripts/mpi_exchange_bytes.sh [BUILD_DIR] [RANKS...]   (default: build 4 8 16 32)
# One JSON line per run on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "mpi_exchange_bytes.sh: needs root (unshare -n)" >&2; exit 77; }
build=${1:-build}
shift || true
[ $# -gt 0 ] && ranks=("$@") || ranks=(4 8 16 32)
binary=$build/bench/sidco-mpi-exchange-bytes
[ -x "$binary" ] || { echo "mpi_exchange_bytes.sh: $binary not built (meson compile -C $build)" >&2; exit 1; }
export OMP_NUM_THREADS=1
# MODES, GRADIENTS (names under examples/data/gradients) and DENSITIES choose a part, e.g.
#   MODES="allgather allgather-compact" GRADIENTS="lstm_it10 cnn_it200 ffn_it200" DENSITIES="0.01 0.1" \
#     scripts/mpi_exchange_bytes.sh build 2 4        (docs/MPI.md's compact table)
for gradient in ${GRADIENTS:-lstm_it10}; do
  for density in ${DENSITIES:-0.01}; do
    for p in "${ranks[@]}"; do
      for mode in ${MODES:-dense allgather allgather-compact allgather-exact reduce reduce-exact}; do
        unshare -n -- bash -c 'ip link set lo up && exec "$@"' _ \
          mpirun --allow-run-as-root --oversubscribe -np "$p" --mca btl self,tcp --mca pml ob1 \
            --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$binary" --mode "$mode" --density "$density" \
            --gradient "examples/data/gradients/$gradient.npy" | sed "s/^{/{\"gradient\": \"$gradient\", \"density\": $density, /"
      done
    done
  done
done
