#!/usr/bin/env bash
# The language-model comparison of the README: examples/train_lm.py on 2 ranks for every
# method, one after the other (so that step times compare), CSVs into DIR (default
# build/lm-runs), then the plots and the table (scripts/plot_lm.py). About 40 minutes on
# two cores. Needs the built package (meson compile -C build) and python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/lm-runs}
steps=${STEPS:-400}
mkdir -p "$dir"
export PYTHONPATH=$PWD/build/python
run() {
  local name=$1
  shift
  [ -f "$dir/$name.csv" ] && { echo "$name: already run"; return; }
  /usr/bin/python3 examples/train_lm.py --ranks 2 --steps "$steps" --eval-every 50 "$@" --csv "$dir/$name.tmp.csv"
  mv "$dir/$name.tmp.csv" "$dir/$name.csv"
}
run none --method none
run powersgd --method powersgd
for density in 0.01 0.001; do
  for method in sidco-e sidco-gp top-k dgc random-k; do
    run "$method-$density" --method "$method" --density "$density"
  done
done
/usr/bin/python3 scripts/plot_lm.py "$dir" docs
