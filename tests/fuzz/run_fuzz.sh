#!/usr/bin/env bash
# Runs the fuzzer for a fixed time from the checked-in seed corpus (new inputs go to a
# scratch folder, not into the repository). Usage: run_fuzz.sh FUZZER SECONDS SEED_DIR
# A failing input is kept: copied into FUZZ_ARTIFACTS (default: the current folder, the
# build folder under meson test) and printed in base64, so a CI log alone reproduces it
# (base64 -d > crash; FUZZER crash).
set -euo pipefail
fuzzer=$1
seconds=$2
seeds=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/corpus" "$scratch/found"
# libFuzzer exits 77 on a crash by default, which meson would count as a skip.
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
  -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$scratch/found/" "$scratch/corpus" "$seeds" || status=$?
if [ "$status" -ne 0 ]; then
  keep=${FUZZ_ARTIFACTS:-.}
  mkdir -p "$keep"
  for found in "$scratch"/found/*; do
    [ -e "$found" ] || continue
    cp "$found" "$keep/"
    echo "run_fuzz.sh: $(basename "$fuzzer") failed on $(basename "$found") ($(wc -c < "$found") bytes), kept as" \
      "$keep/$(basename "$found"); in base64:" >&2
    base64 "$found" >&2
  done
fi
exit "$status"
