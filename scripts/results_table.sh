#!/usr/bin/env bash
# Regenerates the README's "Does it deliver" table: achieved/target density (first call, no
# adaptation) and speed-up over std::nth_element Top-k, from sidco-eval --csv.
# Usage: scripts/results_table.sh [sidco-eval binary]
set -euo pipefail
cd "$(dirname "$0")/.."
eval_bin=${1:-build/examples/sidco-eval}
methods=(sidco-e sidco-gp sidco-gamma-gp sidco-e-single sidco-e-paper sidco-gp-paper sidco-gamma-gp-paper)
args=()
for m in "${methods[@]}"; do args+=(--method "$m"); done
"$eval_bin" --csv --repeat 5 "${args[@]}" | awk -F, -v methods="${methods[*]}" '
  NR == 1 { next }
  { key = $1 SUBSEP $3; ratio[key, $2] = $5; speed[key, $2] = $11
    if (!(key in seen)) { seen[key] = 1; order[++rows] = key } }
  END {
    n = split(methods, m, " ")
    printf "| file | δ |"; for (i = 1; i <= n; i++) printf " %s |", m[i]; print ""
    printf "|---|---|"; for (i = 1; i <= n; i++) printf "---|"; print ""
    for (r = 1; r <= rows; r++) {
      split(order[r], part, SUBSEP)
      printf "| %s | %s |", part[1], part[2]
      for (i = 1; i <= n; i++) printf " %.2f× (%.1f×) |", ratio[order[r], m[i]], speed[order[r], m[i]]
      print ""
    }
  }'
