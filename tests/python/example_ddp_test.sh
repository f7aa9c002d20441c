#!/usr/bin/env bash
# examples/ddp_train.py as a user runs it: 100 steps on 2 gloo ranks saving each rank's
# checkpoint, then 50 more resumed from it; the test accuracy must reach 0.85 (about 0.93
# here), and the parameters after 50 saved + 50 resumed steps must equal those after 100
# uninterrupted ones, bit for bit (the CRC-32 rank 0 prints), with either wire. Without
# sidco_torch importable, it says how to get it.
#   example_ddp_test.sh PYTHON SOURCE_ROOT
set -euo pipefail
python=$1 root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
crc() { sed -n 's/.*parameters crc32 \([0-9a-f]*\).*/\1/p' "$1"; }
# Without sidco_torch on the path (unless it is installed): a sentence saying how to get it,
# not a traceback.
status=0
out=$(env -u PYTHONPATH "$python" "$root/examples/ddp_train.py" --help 2>&1) || status=$?
if [ "$status" -ne 0 ] && { ! grep -q "sidco_torch is not importable: run it with PYTHONPATH" <<< "$out" ||
                              grep -q Traceback <<< "$out"; }; then
  echo "ddp_train.py --help without PYTHONPATH: exit $status, $out"
  exit 1
fi
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 100 --save "$tmp/run.pt"
for rank in 0 1; do [ -s "$tmp/run.pt.$rank" ] || { echo "no checkpoint for rank $rank"; exit 1; }; done
"$python" "$root/examples/ddp_train.py" --ranks 2 --steps 50 --resume "$tmp/run.pt" --min-accuracy 0.85
for wire in plain compact; do
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 60 --wire $wire | tee "$tmp/straight"
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 30 --wire $wire --save "$tmp/half.pt" > /dev/null
  "$python" "$root/examples/ddp_train.py" --ranks 2 --steps 30 --wire $wire --resume "$tmp/half.pt" | tee "$tmp/resumed"
  [ -n "$(crc "$tmp/straight")" ] && [ "$(crc "$tmp/straight")" = "$(crc "$tmp/resumed")" ] ||
    { echo "wire $wire: 30 + 30 resumed steps differ from 60 uninterrupted ones"; exit 1; }
done
echo "resumed runs equal uninterrupted ones, bit for bit (plain and compact)"
