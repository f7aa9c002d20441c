#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA parts (nvcc, CUB, NCCL from the toolkit),
# runs every CUDA and NCCL test and the CUDA benchmarks at N = 2^26, δ = 0.001, and prints
# the table bench/README.md takes: each test's result, the host waits per warm call, and
# each method's time as a ratio to a device-to-device copy of the gradient in the same run.
# Needs meson, ninja, a C++20 host compiler, the CUDA toolkit, doctest, Boost.Math and
# Google Benchmark (scripts/setup.sh installs them on Debian); no torch, no MPI.
# Usage: scripts/gpu_check.sh [build-dir]   (about 10 minutes on one H100)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check"
  exit 77
fi
nvidia-smi -L
for tool in meson ninja nvcc; do
  command -v "$tool" > /dev/null || { echo "gpu_check: $tool not found"; exit 1; }
done

mode=()
[ -f "$dir/build.ninja" ] && mode=(--reconfigure)
meson setup "${mode[@]}" "$dir" -Dcuda=enabled -Dtorch=disabled -Dmpi=disabled -Dexamples=false \
  -Dbuildtype=release > "$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; exit 1; }
ninja -C "$dir" tests/cuda/test_host_device_math tests/cuda/test_cuda_backend bench/sidco-cuda-bench \
  $(grep -q nccl_test "$dir/build.ninja" && echo tests/cuda/test_nccl_allreduce) > "$dir.compile.log" 2>&1 ||
  { tail -60 "$dir.compile.log"; exit 1; }

echo "== tests"
status=0
for t in host-device-math cuda-backend nccl-allreduce cuda-compile-errors; do
  if ! meson test -C "$dir" --no-rebuild --list 2>/dev/null | grep -qx "$t"; then
    printf '| %-20s | not built |\n' "$t"
    continue
  fi
  if meson test -C "$dir" --no-rebuild --print-errorlogs "$t" > "$dir.$t.log" 2>&1; then
    printf '| %-20s | pass |\n' "$t"
  else
    printf '| %-20s | FAIL (%s) |\n' "$t" "$dir.$t.log"
    status=1
  fi
done

echo "== host waits per warm call (cuda-backend's own count)"
grep -h "host waits per warm call" "$dir/meson-logs/testlog.txt" | sed 's/^/  /' | sort -u || true

echo "== benchmarks: N = 2^26 floats, delta = 0.001"
"$dir/bench/sidco-cuda-bench" --benchmark_filter='/1/26/1000$' --benchmark_min_time=0.5 \
  --benchmark_format=json > "$dir.bench.json" 2> "$dir.bench.err" || { cat "$dir.bench.err"; exit 1; }
python3 - "$dir.bench.json" <<'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
time = {r["name"].split("/")[0]: r["real_time"] for r in runs if "error_occurred" not in r}
copy = time.get("device_copy")
if not copy:
    sys.exit("gpu_check: the device_copy baseline did not run")
print(f"| method | ms | × copy | goal |")
print(f"|---|---:|---:|---|")
goals = {"sidco_e": "≤ 2.5", "sidco_e_feedback": "≤ 5"}
for name, t in sorted(time.items(), key=lambda kv: kv[1]):
    print(f"| {name} | {t:.3f} | {t / copy:.2f} | {goals.get(name, '')} |")
e, radix, sort = time.get("sidco_e"), time.get("top_k"), time.get("radix_sort_top_k")
if e and radix:
    print(f"sidco_e vs our radix top_k: {radix / e:.2f}x faster (goal >= 3)")
if e and sort:
    print(f"sidco_e vs a full CUB radix sort of the magnitudes: {sort / e:.2f}x faster (goal >= 3)")
EOF
exit $status
