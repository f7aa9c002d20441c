#!/usr/bin/env bash
# sidco-eval: CSV shape, method names, a missing file and a malformed file.
set -euo pipefail
eval_bin=$1
data=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$eval_bin" --csv --repeat 1 --input "$data/ffn_it200.npy" --method sidco-e --method sidco-gp \
  --density 0.01 --density 0.001 > "$tmp/out.csv"
head -1 "$tmp/out.csv" | grep -q '^file,method,target_density,achieved_density,ratio,threshold,stages,selected,time_ms,elements_per_s,speedup_vs_nth_element$'
[ "$(wc -l < "$tmp/out.csv")" -eq 5 ] || { echo "expected 4 rows"; cat "$tmp/out.csv"; exit 1; }
grep -q '^ffn_it200.npy,sidco-e,0.001,' "$tmp/out.csv"
grep -q '^ffn_it200.npy,sidco-gp,0.01,' "$tmp/out.csv"
# Every achieved/target ratio within [0.5, 2].
awk -F, 'NR > 1 && ($5 < 0.5 || $5 > 2) { print "ratio out of range: " $0; bad = 1 } END { exit bad }' "$tmp/out.csv"

if "$eval_bin" --input "$tmp/missing.npy" 2> "$tmp/err"; then echo "missing file accepted"; exit 1; fi
grep -q "cannot open" "$tmp/err"
printf 'not numpy' > "$tmp/bad.npy"
if "$eval_bin" --input "$tmp/bad.npy" 2> "$tmp/err"; then echo "malformed file accepted"; exit 1; fi
grep -q "bad magic" "$tmp/err"
if "$eval_bin" --method nope 2> "$tmp/err"; then echo "unknown method accepted"; exit 1; fi
grep -q "unknown method 'nope'" "$tmp/err"
echo "sidco-eval checks passed"
