#!/usr/bin/env bash
# examples/ddp_train.py as a user runs it: 100 steps on 2 gloo ranks saving each rank's
# checkpoint, then 50 more resumed from it; the test accuracy must reach 0.85 (about 0.93
# here), and the parameters after 50 saved + 50 resumed steps must equal those after 100
# uninterrupted ones, bit for bit (the CRC-32 rank 0 prints), with either wire. Without
# sidco_torch importable, it and the other example scripts say how to get it; train_lm.py
# refuses a method sidco_torch lacks before it starts its ranks; they refuse counts below 1
# and densities outside (0, 1]; train_lm.py reports its evaluations; ddp_train.py refuses a
# missing checkpoint or GPU before it starts its ranks.
#   example_ddp_test.sh PYTHON SOURCE_ROOT
set -euo pipefail
python=$1 root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
crc() { sed -n 's/.*parameters crc32 \([0-9a-f]*\).*/\1/p' "$1"; }
refused() {  # TEXT SCRIPT ARGS...: the example exits 2 (argparse's error), saying TEXT
  local text=$1 status=0 out
  shift
  out=$("$python" "$root/examples/$1" "${@:2}" 2>&1) || status=$?
  [ "$status" -eq 2 ] && grep -q -F -e "$text" <<< "$out" || { echo "$*: exit $status, $out"; exit 1; }
}
# Without sidco_torch on the path (unless it is installed): a sentence saying how to get it,
# not a traceback.
unknown_method="--method no-such-method is none, powersgd or one of sidco_torch's: "
for script in "ddp_train.py --help" "torch_extension.py --help" "train_lm.py --method no-such-method"; do
  status=0
  # shellcheck disable=SC2086  # the script's name and its arguments
  out=$(env -u PYTHONPATH "$python" "$root"/examples/$script 2>&1) || status=$?
  if [ "$status" -ne 0 ] && { ! grep -q -e "sidco_torch is not importable: run it with PYTHONPATH" \
                                 -e "$unknown_method" <<< "$out" || grep -q Traceback <<< "$out"; }; then
    echo "$script without PYTHONPATH: exit $status, $out"
    exit 1
  fi
done
# With it, train_lm.py names the methods it takes, before any rank starts.
refused "${unknown_method}sidco-e, " train_lm.py --method no-such-method
# A count below 1 or a density outside (0, 1] is refused, naming it (it ran no rank, divided by
# zero in each, or did nothing and exited 0).
while read -r script option value refusal; do
  refused "argument $option: $refusal" "$script" "$option" "$value"
done <<'CASES'
ddp_train.py --ranks 0 0 is below 1
ddp_train.py --steps 0 0 is below 1
train_lm.py --eval-every 0 0 is below 1
train_lm.py --density 0 0.0 is outside (0, 1]
torch_extension.py --calls 0 0 is below 1
torch_extension.py --density 5 5.0 is outside (0, 1]
CASES
# train_lm.py reports its evaluations without --csv too (it printed only with one).
out=$("$python" "$root/examples/train_lm.py" --ranks 2 --steps 3 --eval-every 3 --eval-words 500)
grep -q "^sidco-e 0.01 step 3: train loss" <<< "$out" || { echo "train_lm.py printed no evaluation: $out"; exit 1; }
# ddp_train.py refuses, before it starts its ranks, a checkpoint missing for a rank and, where
# torch sees no GPU, --device cuda (each rank raised a traceback).
refused "error: --resume $tmp/none: no checkpoint $tmp/none.0" ddp_train.py --ranks 2 --resume "$tmp/none"
if [ "$("$python" -c 'import torch; print(torch.cuda.is_available())')" = False ]; then
  refused "error: --device cuda: torch sees no CUDA device" ddp_train.py --device cuda
fi
# --save makes the checkpoints' folder.
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 100 --save "$tmp/saved/run.pt"
for rank in 0 1; do [ -s "$tmp/saved/run.pt.$rank" ] || { echo "no checkpoint for rank $rank"; exit 1; }; done
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 50 --resume "$tmp/saved/run.pt" --min-accuracy 0.85
refused "no checkpoint $tmp/saved/run.pt.2 (one a rank, PREFIX.RANK, for --ranks 3)" \
  ddp_train.py --ranks 3 --resume "$tmp/saved/run.pt"
for wire in plain compact; do
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 60 --wire $wire | tee "$tmp/straight"
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 30 --wire $wire --save "$tmp/half.pt" > /dev/null
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 30 --wire $wire --resume "$tmp/half.pt" | tee "$tmp/resumed"
  [ -n "$(crc "$tmp/straight")" ] && [ "$(crc "$tmp/straight")" = "$(crc "$tmp/resumed")" ] ||
    { echo "wire $wire: 30 + 30 resumed steps differ from 60 uninterrupted ones"; exit 1; }
done
echo "resumed runs equal uninterrupted ones, bit for bit (plain and compact)"
