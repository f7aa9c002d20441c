#!/usr/bin/env bash
# A short data-parallel run on 2 ranks with fixed seeds: SIDCo-E with error feedback at
# delta = 0.01 must reach a test accuracy within 2 points of the uncompressed run.
set -euo pipefail
# Arguments: train-digits, mpirun, the digits CSV, [epochs].
train=$1
mpirun=$2
data=$3
epochs=${4:-15}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpirun" -np 2 "$train" --data "$data" --method none --epochs "$epochs" --csv "$tmp/none.csv"
"$mpirun" -np 2 "$train" --data "$data" --method sidco-e --density 0.01 --epochs "$epochs" --csv "$tmp/sidco.csv"
final() { tail -1 "$1" | cut -d, -f6; }
dense=$(final "$tmp/none.csv")
sidco=$(final "$tmp/sidco.csv")
density=$(tail -1 "$tmp/sidco.csv" | cut -d, -f7)
echo "final test accuracy: uncompressed $dense%, SIDCo-E at 0.01 with error feedback $sidco% (achieved density $density)"
awk -v d="$dense" -v s="$sidco" 'BEGIN { if (d < 85) { print "the uncompressed run did not learn"; exit 1 }
                                         if (d - s > 2) { print "SIDCo-E is more than 2 points behind"; exit 1 } }'
awk -v a="$density" 'BEGIN { if (a < 0.005 || a > 0.02) { print "achieved density " a " is not near 0.01"; exit 1 } }'
