#!/usr/bin/env bash
# The PyTorch hook's test (tests/python/hook_test.py: 2 and 3 gloo ranks, every exchange,
# failures, checkpoints) with the ops library built under ThreadSanitizer. The hook's
# exchange callbacks call the ops on gloo's worker threads while the main thread encodes the
# next bucket; any race TSan sees between them fails this script. About 4 minutes of build
# and 5 of test on 2 cores; not part of scripts/test.sh for that. Usage:
#   scripts/thread_sanitized_hook.sh [BUILD_DIR]    (default build-tsan-hook)
#
# g++, not clang: Debian's torch 1.13 headers do not compile with clang 14 at C++20. The
# interpreter and torch are not instrumented: libtsan is preloaded, TSan skips their memory
# accesses (ignore_noninstrumented_modules) and sees their locks (the GIL, torch's futures)
# through its interceptors. One OpenMP thread, so that libgomp (which TSan cannot follow)
# starts no team.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
sidco_install_missing
sidco_use_ccache
dir=${1:-build-tsan-hook}

echo "== $dir: configure and build the ops under ThreadSanitizer"
CXX=g++ sidco_configure "$dir" -Db_sanitize=thread -Db_lundef=false -Ddebug=true -Doptimization=1 -Dtests=false \
  -Dbenchmarks=false -Dexamples=false -Dtools=false -Dcuda=disabled -Dmpi=disabled -Dtorch=enabled -Dhighway=enabled \
  -Dcpp_args=-g1
meson compile -C "$dir" > "$dir.compile.log" 2>&1 || { cat "$dir.compile.log"; exit 1; }
ops="$dir/python/sidco_torch/libsidco_torch_ops.so"
tsan=$(ldd "$ops" | awk '/libtsan/ {print $3}')
[ -n "$tsan" ] || { echo "$ops does not link libtsan"; exit 1; }

echo "== hook_test.py under ThreadSanitizer (every rank's reports in $dir/tsan-reports)"
rm -rf "$dir/tsan-reports" && mkdir -p "$dir/tsan-reports"
status=0
LD_PRELOAD="$tsan" PYTHONPATH="$dir/python" OMP_NUM_THREADS=1 \
  TSAN_OPTIONS="ignore_noninstrumented_modules=1:log_path=$PWD/$dir/tsan-reports/report" \
  /usr/bin/python3 tests/python/hook_test.py > "$dir/hook_test.log" 2>&1 || status=$?
reports=$(cat "$dir"/tsan-reports/report.* 2> /dev/null | grep -c '^WARNING: ThreadSanitizer' || true)
if [ "$status" -ne 0 ] || [ "$reports" -gt 0 ]; then
  tail -20 "$dir/hook_test.log"
  cat "$dir"/tsan-reports/report.* 2> /dev/null | head -80
  echo "hook_test.py exited $status with $reports ThreadSanitizer reports"
  exit 1
fi
echo "hook_test.py passed with no ThreadSanitizer report"
