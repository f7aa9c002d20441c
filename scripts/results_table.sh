#!/usr/bin/env bash
# Regenerates docs/RESULTS.md's density tables from sidco-eval --csv: achieved/target density (first call,
# no adaptation) and, in parentheses, the speed-up over std::nth_element Top-k measured in
# the same run. Usage: scripts/results_table.sh [sidco-eval binary] [extra sidco-eval args]
set -euo pipefail
cd "$(dirname "$0")/.."
eval_bin=${1:-build-demo/tools/sidco-eval}
shift || true
table() {
  local methods=("$@")
  local args=()
  for m in "${methods[@]}"; do args+=(--method "$m"); done
  "$eval_bin" --csv --repeat 5 "${args[@]}" "${extra[@]}" | awk -F, -v methods="${methods[*]}" '
    NR == 1 { next }
    { key = $1 SUBSEP $3; name = $2; sub(/\/layers$/, "", name); ratio[key, name] = $5; speed[key, name] = $11
      if (!(key in seen)) { seen[key] = 1; order[++rows] = key } }
    END {
      n = split(methods, col, " ")
      printf "| file | δ |"; for (i = 1; i <= n; i++) printf " %s |", col[i]; print ""
      printf "|---|---|"; for (i = 1; i <= n; i++) printf "---|"; print ""
      for (r = 1; r <= rows; r++) {
        split(order[r], part, SUBSEP)
        printf "| %s | %s |", part[1], part[2]
        for (i = 1; i <= n; i++) printf " %.2f× (%.1f×) |", ratio[order[r], col[i]], speed[order[r], col[i]]
        print ""
      }
    }'
}
extra=("$@")
# The columns come from the registry (sidco-eval --list): the SIDCo fits (about k, named
# sidco-*), then every other method; per layer, the SIDCo fits and the exact-count methods.
sidco=() peers=() exact=()
while read -r name promise; do
  case "$promise" in
    baseline) ;;  # std::nth_element: the speed reference of every cell
    about-k) if [[ $name == sidco-* ]]; then sidco+=("$name"); else peers+=("$name"); fi ;;
    *) peers+=("$name") exact+=("$name") ;;
  esac
done < <("$eval_bin" --list)
echo "SIDCo, whole vector:"
echo
table "${sidco[@]}"
echo
echo "Peers and exact selection, whole vector:"
echo
table "${peers[@]}"
echo
echo "Per layer (--layers manifest.json, capped proportional budget):"
echo
extra+=(--layers examples/data/gradients/manifest.json)
table "${sidco[@]}" "${exact[@]}"
