#!/usr/bin/env bash
# Builds sidco with g++ (warnings are errors, Highway kernels) and runs the whole test suite;
# builds it again with clang++ (portable loops) under AddressSanitizer + UndefinedBehaviorSanitizer (any report fails) with
# the libFuzzer target, runs the suite and a 60 s fuzzing run there; then under ThreadSanitizer
# (Highway kernels) the tests of the CPU backend's threads; ends with one line:
# N passed, N failed[, N skipped].
#
# The sanitizer half runs beside the g++ half at the lowest CPU priority. Its compile takes
# what the g++ build leaves idle and yields to it. Its tests run in sessions of their own
# (meson's), which the kernel's autogroup schedules as equals of the g++ tests whatever their
# nice: the two suites' tests share the cores, filling each other's idle stretches (ranks
# waiting on each other, tests that run alone); their timeouts are tripled for that.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
sidco_install_missing
sidco_use_ccache
sidco_use_nvcc_deps

build_suite() {  # DIR [meson options]: configure and compile, the log shown only when it fails
  local dir=$1
  shift
  echo "== $dir: configure and build"
  sidco_configure "$dir" -Dwerror=true "$@" || return  # called in an || list, where set -e is off
  meson compile -C "$dir" ${SIDCO_JOBS:+-j "$SIDCO_JOBS"} > "$dir.compile.log" 2>&1 || { cat "$dir.compile.log"; return 1; }
}

test_suite() {  # DIR [meson test options]: every test, the failures' logs shown
  local dir=$1
  shift
  echo "== $dir: test"
  meson test -C "$dir" --no-rebuild --print-errorlogs "$@" > "$dir.test.log" 2>&1 || true
  grep -E '^ *[0-9]+/[0-9]+ ' "$dir.test.log" || true
  grep -E -A40 '^=+ [0-9]+/[0-9]+ =+$' "$dir.test.log" | grep -v '^$' | head -200 || true
}

count() {  # DIR: "passed failed skipped" from meson's test log
  grep -o '"result": "[A-Z]*"' "$1/meson-logs/testlog.json" | awk -F'"' '
    {c[$4]++} END {printf "%d %d %d", c["OK"]+c["EXPECTEDFAIL"],
      c["FAIL"]+c["UNEXPECTEDPASS"]+c["TIMEOUT"]+c["ERROR"], c["SKIP"]}'
}

# Without a GPU the CUDA code is compiled and never run: one architecture, the host side
# unoptimized, checks it. A machine with a GPU builds every architecture of gpu_arch, optimized.
gpu_options=(-Dgpu_compile_only=false)
nvidia-smi -L > /dev/null 2>&1 || gpu_options=(-Dgpu_arch=sm_80 -Dgpu_compile_only=true)

# What the sanitizer builds share: clang; line tables, which are all the sanitizers' reports
# need (full -g compiles slower); -O1, as AddressSanitizer's and libFuzzer's documentation
# suggest, which compiles in 0.75x clang's time at -O2 to the same results (clang fuses a * b
# + c only within one expression, at -O1 as at -O2); no benchmarks, CUDA, MPI or torch.
sanitizer_build() {  # DIR [meson options]
  local dir=$1
  shift
  CXX=clang++ build_suite "$dir" -Db_lundef=false -Ddebug=true -Doptimization=1 -Dbenchmarks=false -Dcuda=disabled \
    -Dmpi=disabled -Dtorch=disabled "$@"
}
# Highway's kernels in the g++ build, the portable loops under ASan + UBSan: the oracle tests
# cover both.
sanitized() {
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  sanitizer_build build-asan -Db_sanitize=address,undefined -Dhighway=disabled -Dfuzz=true \
    -Dfuzz_seconds="${SIDCO_FUZZ_SECONDS:-60}" "-Dcpp_args=-fno-sanitize-recover=all -gline-tables-only" &&
    test_suite build-asan --timeout-multiplier 3  # beside other work: slower, not hung
}
# The OpenMP regions under ThreadSanitizer, with LLVM's OpenMP and its Archer tool (see
# tests/meson.build, which sets their options): only the test program of threads is built there.
thread_sanitized() {
  sanitizer_build build-tsan -Db_sanitize=thread -Dexamples=false -Dtools=false -Dhighway=enabled \
    "-Dcpp_args=-gline-tables-only" &&
    test_suite build-tsan --timeout-multiplier 3
}
# In a session of its own, ended with this script however it ends. Where the kernel groups
# processes for scheduling by session (autogroup), groups share the CPU evenly whatever their
# processes' nice, so the new session's group is niced too, from inside it. Two compiles at a
# time: more would only hold memory while the g++ half has the cores.
rm -f build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json
SIDCO_JOBS=2 setsid --wait nice -n 19 bash -c "set -euo pipefail; { echo 19 > /proc/self/autogroup; } 2> /dev/null || true; $(declare -f sidco_configure build_suite test_suite sanitizer_build sanitized thread_sanitized); status=0; sanitized || status=\$?; thread_sanitized || status=\$?; exit \$status" \
  > build-sanitized.out 2>&1 &
sanitized_pid=$!
trap 'kill -- "-$sanitized_pid" 2> /dev/null || true' EXIT

CXX=g++ build_suite build -Dhighway=enabled "${gpu_options[@]}"
test_suite build
sanitized_status=0
wait "$sanitized_pid" || sanitized_status=$?
cat build-sanitized.out

read -r passed failed skipped <<< "$(count build)"
for sanitizer_build in build-asan build-tsan; do
  if [ -f "$sanitizer_build/meson-logs/testlog.json" ]; then
    read -r p f s <<< "$(count "$sanitizer_build")"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  fi
done
if [ "$sanitized_status" -ne 0 ]; then
  echo "a sanitizer build failed (exit $sanitized_status)"
  failed=$((failed + 1))
fi
if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
