#!/usr/bin/env bash
# Runs the fuzzer for a fixed time from the checked-in seed corpus (new inputs go to a
# scratch folder, not into the repository). Usage: run_fuzz.sh FUZZER SECONDS SEED_DIR
set -euo pipefail
fuzzer=$1
seconds=$2
seeds=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# libFuzzer exits 77 on a crash by default, which meson would count as a skip.
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
  -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$scratch/" "$scratch" "$seeds"
