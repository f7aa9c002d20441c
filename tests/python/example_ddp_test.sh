#!/usr/bin/env bash
# examples/ddp_train.py as a user runs it: 100 steps on 2 gloo ranks saving each rank's
# checkpoint, then 50 more resumed from it; the test accuracy must reach 0.85 (about 0.93 here).
#   example_ddp_test.sh PYTHON SOURCE_ROOT
set -euo pipefail
python=$1 root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 100 --save "$tmp/run.pt"
for rank in 0 1; do [ -s "$tmp/run.pt.$rank" ] || { echo "no checkpoint for rank $rank"; exit 1; }; done
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 50 --resume "$tmp/run.pt" --min-accuracy 0.85
