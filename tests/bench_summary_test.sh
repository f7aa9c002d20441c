#!/usr/bin/env bash
# sidco-bench's smoke run (every method on the real LSTM gradient at delta 0.01) and its last
# screen: every method of the registry under its registry name (the run's context lists
# them on stderr), every method of the run listed once, in the suite's order, its spread over
# repetitions (none from one), each time over the
# streaming read and over our Top-k as the columns' definition gives them (the baselines at
# exactly 1.00; feedback-traffic, the :feedback rows' floor, a baseline without a density), and
# a density flagged exactly when it lies outside [0.8, 1.25]. JSON output stays JSON; a bad
# --summary names its value.
# Arguments: SIDCO_BENCH
set -euo pipefail
bench=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bench" --benchmark_filter='/2/0/100$' --benchmark_min_time=0.01 --benchmark_out="$tmp/run.json" \
  --benchmark_out_format=json > "$tmp/out.txt" 2> "$tmp/context.txt"
cat "$tmp/context.txt" "$tmp/out.txt"
grep -q '^Summary: LSTM (real) (input 2), N = 3689196, delta = 0.01 ' "$tmp/out.txt"
grep -q '^ms: one repetition' "$tmp/out.txt"
grep -q 'Library was built as DEBUG" warning above is about' "$tmp/out.txt"
sed -n '/^method /,$p' "$tmp/out.txt" | tail -n +2 > "$tmp/rows.txt"
# The suite's order of the (non-layer) methods in the console output above the summary.
grep -E '^[a-z0-9:-]+/2/0/100 ' "$tmp/out.txt" | sed 's|/2/0/100 .*||' > "$tmp/order.txt"
cut -d' ' -f1 "$tmp/rows.txt" | diff - "$tmp/order.txt"
[ "$(wc -l < "$tmp/rows.txt")" -ge 40 ] || { echo "too few methods in the summary"; exit 1; }
registry=$(sed -n 's/^sidco_methods: //p' "$tmp/context.txt" | tr -d ',')
[ "$(wc -w <<< "$registry")" -ge 18 ] || { echo "the context does not list the registry: '$registry'"; exit 1; }
for name in $registry; do
  for row in "$name" "$name:feedback"; do
    grep -qx -- "$row" <(cut -d' ' -f1 "$tmp/rows.txt") || { echo "no row $row"; exit 1; }
  done
done
# Each method's density counter unrounded (the summary prints two decimals; its flag is
# decided on the value itself, which near 0.8 or 1.25 the rounding hides).
/usr/bin/python3 -c '
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if "density_ratio" in b and b["name"].endswith("/2/0/100") and not b["name"].startswith("layers/"):
        print(b["name"][:-len("/2/0/100")], repr(b["density_ratio"]))' "$tmp/run.json" > "$tmp/exact.txt"
awk -v exact_file="$tmp/exact.txt" '
  BEGIN { while ((getline line < exact_file) > 0) { split(line, f, " "); exact[f[1]] = f[2] } }
  $1 == "streaming-read" { read = $2 } $1 == "top-k" { top = $2 }
  { ms[NR] = $2; spread[NR] = $3; over_read[NR] = $4; over_top[NR] = $5; density[NR] = $6; flag[NR] = $7; name[NR] = $1 }
  END {
    for (i = 1; i <= NR; ++i) {
      if (sprintf("%.2f", ms[i] / read) != over_read[i] && (ms[i] / read - over_read[i])^2 > 1e-4 * (ms[i] / read)^2 + 1e-4) { print "bad / streaming: " name[i]; bad = 1 }
      if (sprintf("%.2f", ms[i] / top) != over_top[i] && (ms[i] / top - over_top[i])^2 > 1e-4 * (ms[i] / top)^2 + 1e-4) { print "bad / top-k: " name[i]; bad = 1 }
      if (spread[i] != "-") { print "a spread from one repetition: " name[i]; bad = 1 }
      if (name[i] == "streaming-read" && (over_read[i] != "1.00" || density[i] != "")) { print "read row"; bad = 1 }
      if (name[i] == "top-k" && over_top[i] != "1.00") { print "top-k row"; bad = 1 }
      if (name[i] != "streaming-read" && name[i] != "nth-element-top-k" && name[i] != "feedback-traffic") {
        if (!(name[i] in exact)) { print "no density counter: " name[i]; bad = 1; continue }
        d = exact[name[i]] + 0
        if (sprintf("%.2f", d) != density[i]) { print "density printed wrong: " name[i] " " density[i] " of " d; bad = 1 }
        outside = d < 0.8 || d > 1.25
        if (outside != (flag[i] == "!")) { print "flag wrong: " name[i] " " d " [" flag[i] "]"; bad = 1 }
      }
    }
    exit bad
  }' "$tmp/rows.txt"

# Repetitions: the median of the runs and their spread, shown as such (and from the
# aggregates alone when only they are reported).
for only in false true; do
  "$bench" --benchmark_filter='^(streaming-read|top-k)/2/0/100$' --benchmark_min_time=0.01 --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=$only > "$tmp/reps.txt"
  grep -q '^ms: the \(fastest\|median\) of 3 repetitions' "$tmp/reps.txt" || { cat "$tmp/reps.txt"; exit 1; }
  sed -n '/^method /,$p' "$tmp/reps.txt" | tail -n +2 | awk '$3 !~ /^[0-9]+%$/ { print "no spread: " $0; bad = 1 } END { exit bad }'
done
"$bench" --benchmark_filter='^(streaming-read|top-k)/2/0/100$' --benchmark_min_time=0.01 --benchmark_format=json \
  > "$tmp/out.json"
/usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/out.json"
# bench/report.py reads JSON written before the rows took the registry's names as today's.
report=$(dirname "$0")/../bench/report.py
sed 's/"streaming-read/"streaming_read/g; s/"top-k/"top_k/g' "$tmp/out.json" > "$tmp/old.json"
grep -q '"top_k/2/0/100"' "$tmp/old.json"
/usr/bin/python3 "$report" "$tmp/out.json" --summary-only 2/0/100 > "$tmp/report.md"
/usr/bin/python3 "$report" "$tmp/old.json" --summary-only 2/0/100 | diff - "$tmp/report.md"
grep -q '^| top-k | .* | 1.00 | 1.00 |  |$' "$tmp/report.md" || { cat "$tmp/report.md"; exit 1; }
"$bench" --benchmark_filter='^top-k/2/0/100$' --benchmark_min_time=0.01 --summary=none > "$tmp/none.txt"
if grep -q '^Summary' "$tmp/none.txt"; then echo "--summary=none printed a summary"; exit 1; fi
"$bench" --benchmark_filter='^top-k/2/0/100$' --benchmark_min_time=0.01 --summary=1/25/1000 > "$tmp/absent.txt"
grep -q '^Summary: no run at 1/25/1000' "$tmp/absent.txt"
if "$bench" --summary=1/25 2> "$tmp/err.txt"; then echo "a bad --summary was accepted"; exit 1; fi
grep -q -- '--summary=1/25 is neither none nor INPUT/LOG2N/INVERSE' "$tmp/err.txt"
echo "summary ok"
