#!/usr/bin/env bash
# Convergence of the two exchanges (issue 36's goal): examples/train_lm.py on 4 ranks at
# density 0.01 with SIDCo-E over the reduce-scatter exchange, SIDCo-E over the all-gather
# and exact Top-k over the all-gather, two seeds, one run after another, CSVs into DIR
# (default build/lm-exchange), then the table (scripts/lm_exchange_table.py). About 55
# minutes on two cores (STEPS=300). Needs the built package (meson compile -C build).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/lm-exchange}
steps=${STEPS:-300}
mkdir -p "$dir"
export PYTHONPATH=$PWD/build/python OMP_NUM_THREADS=1
run() {
  local name=$1
  shift
  [ -f "$dir/$name.csv" ] && { echo "$name: already run"; return; }
  /usr/bin/python3 examples/train_lm.py --ranks 4 --density 0.01 --steps "$steps" --eval-every 100 "$@" \
    --csv "$dir/$name.tmp.csv"
  mv "$dir/$name.tmp.csv" "$dir/$name.csv"
}
for seed in 1 2; do
  run "sidco-e-reduce-$seed" --method sidco-e --exchange reduce --seed "$seed"
  run "sidco-e-allgather-$seed" --method sidco-e --exchange allgather --seed "$seed"
  run "top-k-allgather-$seed" --method top-k --exchange allgather --seed "$seed"
done
/usr/bin/python3 scripts/lm_exchange_table.py "$dir"
