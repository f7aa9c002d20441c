#!/usr/bin/env bash
# Issue 56's convergence check of wire="compact": the WikiText-2 LSTM (examples/train_lm.py)
# with SIDCo-E at RANKS ranks (default 4) over EXCHANGE (default reduce: named, so that no
# timing chooses it), plain and compact entries (WIRES, default "plain compact"; compact8 with
# EXCHANGE=allgather), seeds SEEDS (default "1 2"), runs interleaved (the wires in turn per
# seed), STEPS steps each (default 400), CSVs into DIR (default build/lm-wire), then each run's
# final training loss (the mean of the last 50 steps, which one noisy step does not move) and
# test perplexity, each wire against the first.
# About 10 minutes a run on two idle cores at 4 ranks. Needs the built package (meson compile
# -C build) and python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/lm-wire}
steps=${STEPS:-400}
ranks=${RANKS:-4}
seeds=${SEEDS:-1 2}
exchange=${EXCHANGE:-reduce}
mkdir -p "$dir"
export PYTHONPATH=$PWD/build/python
for seed in $seeds; do
  for wire in ${WIRES:-plain compact}; do
    name=$wire-seed$seed
    [ -f "$dir/$name.csv" ] && { echo "$name: already run"; continue; }
    /usr/bin/python3 examples/train_lm.py --method sidco-e --density 0.01 --ranks "$ranks" --steps "$steps" \
      --eval-every "$steps" --exchange "$exchange" --wire "$wire" --seed "$seed" --csv "$dir/$name.tmp.csv"
    mv "$dir/$name.tmp.csv" "$dir/$name.csv"
  done
done
/usr/bin/python3 - "$dir" "${WIRES:-plain compact}" $seeds <<'EOF'
import csv, os, sys
folder, wires, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def final(name):
    rows = list(csv.DictReader(open(os.path.join(folder, name + ".csv"))))
    tail = [float(r["train_loss"]) for r in rows[-50:]]
    ppl = [r["test_perplexity"] for r in rows if r["test_perplexity"]]
    return sum(tail) / len(tail), float(ppl[-1]) if ppl else float("nan"), len(rows)
base = wires[0]
for wire in wires[1:]:
    print(f"| seed | {base} loss (last 50) | {wire} loss | {wire} / {base} | {base} perplexity | {wire} perplexity "
          "| steps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for seed in seeds:
        p, c = final(f"{base}-seed{seed}"), final(f"{wire}-seed{seed}")
        print(f"| {seed} | {p[0]:.4f} | {c[0]:.4f} | {c[0] / p[0]:.4f} | {p[1]:.1f} | {c[1]:.1f} | {p[2]} |")
EOF
