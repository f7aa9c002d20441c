#!/usr/bin/env bash
# The MPI exchanges at many ranks under SimGrid's SMPI (bench/smpi_exchange.cpp): builds the
# program with smpicxx, then runs each exchange at each rank count on each platform of
# bench/smpi/ and gradient, communication only (--cfg=smpi/simulate-computation:no), with Open
# MPI's choice of collective algorithms. One JSON line per run (its platform added) on stdout;
# bench/smpi_model.py compares them with the alpha-beta model.
#   bench/smpi_exchange.sh [OUT_DIR]      (OUT_DIR: where the program is built; default /tmp/sidco-smpi)
# Environment: RANKS ("16 64 256 1024"), MODES ("dense allgather reduce reduce-two-hop"; also
# reduce-exact, reduce-two-hop-compact, reduce-two-hop-compact8, allgather-compact,
# allgather-compact8; reduce and reduce-exact run the flat schedule, reduce-two-hop the
# default), GRADIENTS
# ("iid hot"), PLATFORMS ("10gbps 100gbps"), N (262144), DENSITY (0.01), WARMUP (1), STEPS (3), METHOD
# (top-k: the exchange's losses apart from the estimate's), ALLGATHER_MAX (256: its receive
# buffer is P payloads a rank, 27 GB in all at 1,024 ranks), COMPUTE (1: with the ranks' compute,
# each burst timed on this machine and charged as it took here: smpi/host-speed set to the
# platform's 100 Gflop/s), FAIL ("HOW STEP": every run's step STEP fails on its last rank, its
# compress throwing or, "dense", its wait() given a dense one value short; the line then says
# how many ranks raised and whether alike), EXTRA (more smpirun --cfg flags).
# Needs libsimgrid-dev (smpicxx, smpirun); 1,024 ranks of 2^18 values take about 2 minutes
# and 6 GB for the flat reduce exchange, and far longer in two hops (SMPI simulates each of
# its point-to-point messages: 256 ranks about a minute, 1,024 ranks 10 to 30 minutes a step).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/sidco-smpi}
mkdir -p "$out"
command -v smpicxx > /dev/null || { echo "smpi_exchange.sh: smpicxx not found (Debian: libsimgrid-dev)" >&2; exit 77; }
smpicxx -std=c++20 -O2 -DNDEBUG -I include bench/smpi_exchange.cpp -o "$out/smpi-exchange"
for i in $(seq 0 1023); do echo "node-$i"; done > "$out/hosts"
failing=()
if [ -n "${FAIL:-}" ]; then
  read -r how step <<< "$FAIL"
  failing=(--fail-how "$how" --fail-step "$step")
fi
compute=${COMPUTE:-0}
if [ "$compute" = 1 ]; then
  computation=(--cfg=smpi/simulate-computation:yes --cfg=smpi/host-speed:100Gf)
else
  computation=(--cfg=smpi/simulate-computation:no)
fi
for platform in ${PLATFORMS:-10gbps 100gbps}; do
  for gradient in ${GRADIENTS:-iid hot}; do
    for p in ${RANKS:-16 64 256 1024}; do
      for mode in ${MODES:-dense allgather reduce reduce-two-hop}; do
        [[ "$mode" == allgather* ]] && [ "$p" -gt "${ALLGATHER_MAX:-256}" ] && continue
        line=$(smpirun -np "$p" -platform "bench/smpi/cluster-$platform.xml" -hostfile "$out/hosts" \
          --cfg=smpi/coll-selector:ompi "${computation[@]}" --log=root.thres:critical ${EXTRA:-} \
          "$out/smpi-exchange" --mode "$mode" --gradient "$gradient" --n "${N:-262144}" --density "${DENSITY:-0.01}" \
          --warmup "${WARMUP:-1}" --steps "${STEPS:-3}" --method "${METHOD:-top-k}" "${failing[@]}" | tail -1)
        echo "${line%\}}, \"platform\": \"$platform\", \"compute\": $compute}"
      done
    done
  done
done
