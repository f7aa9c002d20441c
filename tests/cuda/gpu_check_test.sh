#!/usr/bin/env bash
# scripts/gpu_check.sh on this build: `build` gathers every CUDA test and benchmark binary,
# the libraries a bare CUDA machine lacks and the Boost.Math headers into one folder of at
# most 48 MiB; `run` on it without a GPU says so and exits 77 (skipped), never 0.
# Usage: gpu_check_test.sh SOURCE_ROOT BUILD_ROOT
set -euo pipefail
source_root=$1 build_root=$2
folder=$(mktemp -d)/gpu-check
trap 'rm -rf "$(dirname "$folder")"' EXIT
SIDCO_GPU_BUILD=$build_root SIDCO_GPU_REUSE=1 "$source_root/scripts/gpu_check.sh" build "$folder"
fail() { echo "gpu_check_test: $*"; exit 1; }
for f in bin/test_host_device_math bin/test_cuda_backend bin/test_nccl_reduce bin/sidco-cuda-bench lib/libbenchmark.so.1debian \
         lib/libsidco_native_backtrace.so include/boost/math/special_functions/gamma.hpp commit arch; do
  [ -s "$folder/$f" ] || fail "$f missing from the folder"
done
bytes=$(du -sb "$folder" | cut -f1)
[ "$bytes" -le $((48 * 1024 * 1024)) ] || fail "$bytes bytes, over 48 MiB"
# Every shared library the binaries need resolves from the folder and the C/C++ runtimes,
# except NCCL and the driver, which the GPU machine brings.
missing=$(LD_LIBRARY_PATH=$folder/lib ldd "$folder"/bin/* | grep 'not found' | grep -v -e libnccl -e libcuda.so || true)
[ -z "$missing" ] || fail "unresolved: $missing"
# The crash tracer the torch steps preload: a fatal signal prints the native stack.
trace=$(LD_PRELOAD=$folder/lib/libsidco_native_backtrace.so bash -c 'kill -SEGV $$' 2>&1 || true)
grep -q "=== native backtrace: Segmentation fault" <<< "$trace" || fail "the native backtrace printed: $trace"
grep -q "libsidco_native_backtrace.so" <<< "$trace" || fail "no stack frames in: $trace"
rc=0
"$source_root/scripts/gpu_check.sh" run "$folder" > "$folder.run.log" 2>&1 || rc=$?
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  echo "a GPU is here: run gave $rc (see scripts/gpu_check.sh run for its table)"
  exit 77
fi
cat "$folder.run.log"
[ "$rc" = 77 ] || fail "run without a GPU exited $rc, not 77"
grep -q "no NVIDIA GPU" "$folder.run.log" || fail "run without a GPU did not say so"
echo "gpu_check build: $(find "$folder" -type f | wc -l) files, $((bytes / 1024)) KiB; run without a GPU: 77"
