#!/usr/bin/env bash
# Runs the target rows of two sidco-bench builds in one sitting, alternately (ROUNDS rounds of
# 9 repetitions each, default 2; odd rounds run the old build first, even rounds the new one,
# since which of a pair runs first moves its timings on this VM, streaming_read included), and
# prints median times and after/before ratios. The default rows: every method of the registry
# and its variants (NAME, NAME:feedback, sidco-e:fixed3, sidco-e-single:serial, ...) and the
# two baselines, at N = 2^25, delta = 0.001 on inputs 0 and 1; the pattern also matches the
# underscore names of builds from before the rows took the registry's names, and rows are
# paired by bench/report.py's canonical(). FILTER replaces it (a --benchmark_filter regex).
#   bench/before_after.sh OLD/bench/sidco-bench NEW/bench/sidco-bench [OUT_DIR]
set -euo pipefail
before=$1
after=$2
out=${3:-bench/results}
rounds=${ROUNDS:-2}
filter=${FILTER:-'^[a-z0-9_:-]+/[01]/25/1000$'}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  order="before after"
  [ $((round % 2)) = 0 ] && order="after before"
  for which in $order; do
    binary=$before
    [ "$which" = after ] && binary=$after
    OMP_NUM_THREADS=2 "$binary" --benchmark_min_time=0.3 --benchmark_repetitions=9 \
      --benchmark_report_aggregates_only=false --benchmark_filter="$filter" \
      --benchmark_out="$out/$which-$round.json" --benchmark_out_format=json > /dev/null 2>&1
  done
done
/usr/bin/python3 - "$out" "$rounds" "$(dirname "$0")" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from report import canonical
times = {"before": {}, "after": {}}
for which in times:
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/{which}-{r}.json"))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            parts = b["run_name"].split("/")
            name = canonical("/".join(parts[:-3])) + "/" + "/".join(parts[-3:])
            times[which].setdefault(name, []).append(b["real_time"] * scale * 1e3)
print("| row (N = 2^25, δ = 0.001) | before (ms) | after (ms) | after / before |")
print("|---|---|---|---|")
for name in times["before"]:
    if name not in times["after"]:
        continue
    b, a = statistics.median(times["before"][name]), statistics.median(times["after"][name])
    print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.2f} |")
PY
