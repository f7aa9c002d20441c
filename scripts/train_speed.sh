#!/usr/bin/env bash
# The shaped-network training benchmark of the README: bench/train_speed.py in a private
# network namespace (unshare -n) whose loopback tc shapes to each rate in turn, so that
# every rank talks over that link and nothing leaves the namespace. Needs root. Writes
# JSON lines into DIR (default build/train-speed), then the tables and docs/train_speed.png.
#   scripts/train_speed.sh [DIR]          everything (about 90 minutes on 2 cores)
#   RATES="1gbit" RANKS="2" MODELS="lstm" CONVERGE=0 scripts/train_speed.sh   a part of it
#   STEP=0 scripts/train_speed.sh DIR     only the time-to-perplexity runs
# PNG= skips the figure; PACKAGE=DIR takes sidco_torch from DIR (default build/python). PREVIOUS=DIR adds sidco-e@previous, the hook of an earlier build's python directory (unless METHODS names NAME@previous).
# STEP_ARGS="--warmup 2 --steps 4" passes more options to every step run (the test's short runs).
# STEP_ARGS="--bucket-mb 1" runs DDP with smaller buckets (many of them).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/train-speed}
mkdir -p "$dir"
[ "$(id -u)" -eq 0 ] || { echo "train_speed.sh: needs root (unshare -n and tc)" >&2; exit 77; }
unshare -n bash -c 'ip link set lo up && tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 20ms' 2>/dev/null ||
  { echo "train_speed.sh: unshare -n, ip or tc (iproute2, sch_tbf) is not available here" >&2; exit 77; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
density=${DENSITY:-0.01}
methods=${METHODS:-compute,none,powersgd,sidco-e,sidco-gp,top-k,dgc}
[ -n "${PREVIOUS:-}" ] && [[ "$methods" != *@previous* ]] && methods="$methods,sidco-e@previous"
bench=(/usr/bin/python3 bench/train_speed.py)
[ -n "${PREVIOUS:-}" ] && bench+=(--previous "$PREVIOUS")
[ -n "${PACKAGE:-}" ] && bench+=(--package "$PACKAGE")

# shaped RATE COMMAND...: COMMAND inside a new network namespace whose loopback runs at RATE.
shaped() {
  local rate=$1
  shift
  unshare -n -- bash -c 'ip link set lo up && tc qdisc add dev lo root tbf rate "$0" burst 256kb latency 20ms && exec "$@"' \
    "$rate" "$@"
}

[ "${STEP:-1}" = 1 ] || MODELS=none
for model in ${MODELS:-lstm gpt}; do
  [ "$model" = none ] && continue
  for ranks in ${RANKS:-2 4}; do
    for rate in ${RATES:-100mbit 1gbit 10gbit}; do
      echo "== step: $model, $ranks ranks, $rate"
      shaped "$rate" "${bench[@]}" step --model "$model" --ranks "$ranks" --rate "$rate" --density "$density" \
        --methods "$methods" --rounds "${ROUNDS:-2}" ${STEP_ARGS:-} --json "$dir/step.jsonl"
    done
  done
done
if [ "${CONVERGE:-1}" = 1 ]; then
  echo "== converge: lstm, 2 ranks, 1gbit"
  shaped 1gbit "${bench[@]}" converge --model lstm --ranks 2 --rate 1gbit --density "$density" \
    --methods "${CONVERGE_METHODS:-none,powersgd,sidco-e,sidco-gp,top-k,dgc}" --target "${TARGET:-600}" \
    --max-steps "${MAX_STEPS:-600}" \
    --json "$dir/converge.jsonl"
fi
png=${PNG-docs/train_speed.png}
/usr/bin/python3 bench/train_speed.py report "$dir"/*.jsonl ${png:+--png "$png"}
