#!/usr/bin/env bash
# Builds sidco with g++ (warnings are errors, Highway kernels) and runs the whole test suite;
# builds it again with clang++ (portable loops) under AddressSanitizer + UndefinedBehaviorSanitizer (any report fails) with
# the libFuzzer target, runs the suite and a 60 s fuzzing run there; ends with one line:
# N passed, N failed[, N skipped].
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
sidco_install_missing
sidco_use_ccache

passed=0 failed=0 skipped=0
run_suite() {
  local dir=$1
  shift
  echo "== $dir: configure and build"
  sidco_configure "$dir" -Dwerror=true "$@"
  meson compile -C "$dir" > "$dir.compile.log" 2>&1 || { cat "$dir.compile.log"; return 1; }
  echo "== $dir: test"
  meson test -C "$dir" --no-rebuild --print-errorlogs > "$dir.test.log" 2>&1 || true
  grep -E '^ *[0-9]+/[0-9]+ ' "$dir.test.log" || true
  grep -E -A40 '^=+ [0-9]+/[0-9]+ =+$' "$dir.test.log" | grep -v '^$' | head -200 || true
  local counts
  counts=$(grep -o '"result": "[A-Z]*"' "$dir/meson-logs/testlog.json" | awk -F'"' '
    {c[$4]++} END {printf "%d %d %d", c["OK"]+c["EXPECTEDFAIL"],
      c["FAIL"]+c["UNEXPECTEDPASS"]+c["TIMEOUT"]+c["ERROR"], c["SKIP"]}')
  read -r p f s <<< "$counts"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# Highway's kernels in the g++ build, the portable loops under the sanitizers: the oracle
# tests cover both. Line tables are all the sanitizers' reports need (full -g compiles slower).
CXX=g++ run_suite build -Dhighway=enabled
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
CXX=clang++ run_suite build-asan -Db_sanitize=address,undefined -Db_lundef=false \
  -Dbuildtype=debugoptimized -Dbenchmarks=false -Dcuda=disabled -Dmpi=disabled -Dtorch=disabled -Dhighway=disabled -Dfuzz=true \
  -Dfuzz_seconds="${SIDCO_FUZZ_SECONDS:-60}" "-Dcpp_args=-fno-sanitize-recover=all -gline-tables-only"

if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
