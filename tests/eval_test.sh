#!/usr/bin/env bash
# sidco-eval: CSV shape, method names, a missing file and a malformed file, a file named
# without --input, the README's method list against the one sidco-eval prints from
# sidco::methods::table, and --list.
# Arguments: SIDCO_EVAL GRADIENTS_DIR README
set -euo pipefail
eval_bin=$1
data=$2
readme=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$eval_bin" --csv --repeat 1 --input "$data/ffn_it200.npy" --method sidco-e --method sidco-gp \
  --density 0.01 --density 0.001 > "$tmp/out.csv"
head -1 "$tmp/out.csv" | grep -q '^file,method,target_density,achieved_density,ratio,threshold,stages,selected,time_ms,elements_per_s,speedup_vs_nth_element,fallback$'
[ "$(wc -l < "$tmp/out.csv")" -eq 5 ] || { echo "expected 4 rows"; cat "$tmp/out.csv"; exit 1; }
grep -q '^ffn_it200.npy,sidco-e,0.001,' "$tmp/out.csv"
grep -q '^ffn_it200.npy,sidco-gp,0.01,' "$tmp/out.csv"
# Every achieved/target ratio within [0.5, 2].
awk -F, 'NR > 1 && ($5 < 0.5 || $5 > 2) { print "ratio out of range: " $0; bad = 1 } END { exit bad }' "$tmp/out.csv"

# Layer-wise: every layer estimated on its own, method names marked /layers; exact methods
# deliver exactly the target.
"$eval_bin" --csv --repeat 1 --layers "$data/manifest.json" --input "$data/cnn_it200.npy" \
  --method sidco-e --method top-k --method sidco-e-exact --density 0.01 > "$tmp/layers.csv"
grep -q '^cnn_it200.npy,sidco-e/layers,0.01,' "$tmp/layers.csv"
awk -F, '$2 ~ /(top-k|exact)\/layers/ && ($5 < 0.999 || $5 > 1.001) { print "not exact: " $0; bad = 1 } END { exit bad }' "$tmp/layers.csv"
printf '{"other.npy": {"layers": [{"offset": 0, "size": 10}]}}' > "$tmp/manifest.json"
if "$eval_bin" --layers "$tmp/manifest.json" --input "$data/ffn_it10.npy" 2> "$tmp/err"; then echo "file missing from manifest accepted"; exit 1; fi
grep -q "has no entry for ffn_it10.npy" "$tmp/err"

if "$eval_bin" --input "$tmp/missing.npy" 2> "$tmp/err"; then echo "missing file accepted"; exit 1; fi
grep -q "cannot open" "$tmp/err"
printf 'not numpy' > "$tmp/bad.npy"
if "$eval_bin" --input "$tmp/bad.npy" 2> "$tmp/err"; then echo "malformed file accepted"; exit 1; fi
grep -q "bad magic" "$tmp/err"
if "$eval_bin" --method nope 2> "$tmp/err"; then echo "unknown method accepted"; exit 1; fi
grep -q "unknown method 'nope'" "$tmp/err"
# Bad arguments and hostile inputs: a clear message and a non-zero exit, never a crash
# (exit codes above 128 are signals).
expect_refusal() {
  local expected=$1
  shift
  set +e
  "$eval_bin" "$@" > /dev/null 2> "$tmp/err"
  local status=$?
  set -e
  if [ "$status" -eq 0 ] || [ "$status" -ge 128 ]; then echo "sidco-eval $* exited $status"; cat "$tmp/err"; exit 1; fi
  grep -qF -- "$expected" "$tmp/err" || { echo "sidco-eval $*: no '$expected' in:"; cat "$tmp/err"; exit 1; }
}
for d in 2 1.5 -0.5 0 inf nan; do
  expect_refusal "--density: $d is outside (0, 1]" --input "$data/ffn_it10.npy" --density "$d"
done
expect_refusal "--repeat: 0 is not a whole number" --repeat 0
expect_refusal "--density: 'abc' is not a number" --density abc
expect_refusal "not expected: --bogus" --bogus
expect_refusal "not expected: $data/ffn_it10.npy (a gradient file is named with --input FILE.npy)" "$data/ffn_it10.npy"
expect_refusal "--repeat: 2.5 is not a whole number" --repeat 2.5
expect_refusal "--repeat: 1e7 is not a whole number" --repeat 1e7
expect_refusal "sidco-eval: sidco: manifest '$tmp': is a directory, not a manifest file" --layers "$tmp" \
  --input "$data/ffn_it10.npy"
printf '{"ffn_it10.npy": {"layers": [{"offset": 0, "size": 10}]}, "ffn_it10.npy": {"layers": []}}' > "$tmp/twice.json"
expect_refusal "'ffn_it10.npy' is listed twice" --layers "$tmp/twice.json" --input "$data/ffn_it10.npy"
# Numbers as the help writes them (1e0 is 1), and a density far below one entry of the file:
# its ratio in exponent form, not hundreds of digits.
"$eval_bin" --csv --repeat 1e0 --input "$data/ffn_it10.npy" --method top-k --density 1e-300 > "$tmp/tiny.csv"
ratio=$(awk -F, 'NR == 2 { print $5 }' "$tmp/tiny.csv")
case "$ratio" in *e+*) [ "${#ratio}" -le 12 ] || { echo "ratio printed as $ratio"; exit 1; } ;;
  *) echo "ratio at density 1e-300 printed as $ratio"; exit 1 ;; esac
npy_dir=$(mktemp -d -p "$tmp")
expect_refusal "is a directory, not a .npy file" --input "$npy_dir"
npy() {  # npy FILE HEADER [PAYLOAD_BYTES]: a version-1 file with that header dict
  /usr/bin/python3 -c 'import struct, sys
header = sys.argv[2].encode()
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(int(sys.argv[3])))' "$1" "$2" "${3:-0}"
}
npy "$tmp/empty.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }"
expect_refusal "holds no values" --input "$tmp/empty.npy"
npy "$tmp/huge.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,), }" 8
expect_refusal "truncated data (expected 1000000000 values" --input "$tmp/huge.npy"
npy "$tmp/negative.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (-10,), }" 40
expect_refusal "negative dimension" --input "$tmp/negative.npy"
diff <(awk '/^```text methods$/{on=1; next} on && /^```/{exit} on' "$readme") \
  <("$eval_bin" --help | awk '/^Methods:$/{on=1; next} on' | sed '/^$/d') ||
  { echo "README's method list differs from sidco-eval --help (sidco::methods::table)"; exit 1; }
# --list, what scripts/results_table.sh builds its columns from: the --help list's names in
# its order, each with its count promise as the registry states it.
"$eval_bin" --list > "$tmp/list.txt"
diff <(cut -d' ' -f1 "$tmp/list.txt") <("$eval_bin" --help | awk '/^Methods:$/{on=1; next} on && NF {print $1}') ||
  { echo "--list and --help name different methods"; exit 1; }
grep -qx 'sidco-e about-k' "$tmp/list.txt" && grep -qx 'top-k top-k' "$tmp/list.txt" &&
  grep -qx 'random-k exactly-k' "$tmp/list.txt" && grep -qx 'topk-nth-element baseline' "$tmp/list.txt" ||
  { echo "--list promises:"; cat "$tmp/list.txt"; exit 1; }
echo "sidco-eval checks passed"
