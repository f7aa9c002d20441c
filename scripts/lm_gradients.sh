#!/usr/bin/env bash
# Generates a transformer language model's real gradients (17.7M values, 52 layers) for the
# per-layer benchmarks: gpt_it20.npy and gpt_it200.npy (plain), gpt_ef_it100.npy (with
# error feedback) and their manifest.json, into DIR (default build/lm-gradients). About
# 6 minutes on two cores with OpenBLAS; 280 MB, never committed. Then:
#   SIDCO_LM_GRADIENTS=build/lm-gradients build/bench/sidco-bench --benchmark_filter=layers/
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/lm-gradients}
if [ -f "$dir/gpt_ef_it100.npy" ] && [ -f "$dir/gpt_it200.npy" ]; then
  echo "$dir already holds the gradients"
  exit 0
fi
packages=(python3-torch python3-numpy python3-scipy libopenblas0-pthread)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi
mkdir -p "$dir"
/usr/bin/python3 scripts/make_lm_gradients.py examples/data/wikitext-2/valid.txt "$dir" \
  --iters 20,200 --ef-iters 100
