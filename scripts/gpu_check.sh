#!/usr/bin/env bash
# The GPU check in two steps, for a GPU machine that has a driver, bash and python3 but no
# compilers' -dev packages (no meson needed there, nothing downloaded):
#
#   scripts/gpu_check.sh build [FOLDER]   here (nvcc, no GPU needed): every CUDA test and
#                                         benchmark binary, the libraries a bare CUDA machine
#                                         lacks (libbenchmark, libcudart) and the Boost.Math
#                                         headers the torch ops need, into FOLDER (default
#                                         gpu-check, git-ignored), at most 48 MiB.
#   scripts/gpu_check.sh run [FOLDER]     there, from a copy of this tree with FOLDER in it:
#                                         runs every test, the N = 2^26, δ = 0.001 benchmarks
#                                         and, where python3 has a CUDA torch, builds
#                                         sidco_torch's ops against that torch (no meson:
#                                         torch.utils.cpp_extension), runs the seeds'
#                                         comparison with torch.topk (scripts/gpu_seeds.py),
#                                         the hook's costs by op (scripts/gpu_hook_costs.py)
#                                         and the CUDA Python tests.
#                                         Prints one table. Exits 77 without a GPU; non-zero
#                                         when a GPU is visible and any test failed or skipped.
#
# NCCL comes from the GPU machine at run time (pip's nvidia-nccl, else the toolkit's).
# SIDCO_GPU_TORCH=0 skips the torch part (its build takes about 3 minutes there, on the CPU
# while the GPU runs the tests and benchmarks);
# SIDCO_GPU_QUICK=1 the benchmarks, the seeds' comparison and the hook's costs (a rerun of the
# tests after a fix);
# logs go to SIDCO_GPU_LOGS, else $OUT/gpu-check-logs where OUT is set, else FOLDER/logs; the
# tables are printed again at the end (a caller may keep only the output's tail);
# SIDCO_GPU_BENCH_ARGS adds benchmark arguments (another --benchmark_filter, repetitions).
# Architectures: SIDCO_GPU_ARCH (default sm_90: H100, H200), e.g. "sm_80,sm_90".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
step=${1:-}
folder=${2:-gpu-check}
case "$folder" in /*) ;; *) folder=$root/$folder ;; esac

build() {
  local dir=${SIDCO_GPU_BUILD:-build-gpu} arch=${SIDCO_GPU_ARCH:-sm_90}
  local targets=(tests/cuda/test_host_device_math tests/cuda/test_cuda_backend bench/sidco-cuda-bench)
  if [ "${SIDCO_GPU_REUSE:-0}" = 1 ]; then
    # An existing build's binaries as they are (the CI test of this script: no second build).
    [ -f "$dir/tests/cuda/test_nccl_allreduce" ] && targets+=(tests/cuda/test_nccl_allreduce)
    [ -f "$dir/tests/cuda/test_nccl_reduce" ] && targets+=(tests/cuda/test_nccl_reduce)
    arch=$(meson introspect "$dir" --buildoptions 2> /dev/null |
      python3 -c 'import json, sys; print(",".join(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "gpu_arch")))' ||
      echo '?')
  else
    for tool in meson ninja nvcc; do
      command -v "$tool" > /dev/null || { echo "gpu_check: $tool not found"; exit 1; }
    done
    # nvcc through the wrapper that asks for header dependencies (ccache inside it): a build
    # set up without it recompiles no CUDA object when only a header changed, so one is set
    # up anew.
    source scripts/setup.sh
    sidco_use_ccache
    sidco_use_nvcc_deps
    local mode=()
    if [ -f "$dir/build.ninja" ] && ! grep -q sidco-nvcc-deps-bin "$dir/build.ninja"; then
      echo "gpu_check: $dir was set up without CUDA header dependencies; setting it up anew"
      rm -rf "$dir"
    fi
    [ -f "$dir/build.ninja" ] && mode=(--reconfigure)
    mode+=(--native-file "$SIDCO_MESON_NATIVE")
    meson setup "${mode[@]}" "$dir" -Dcuda=enabled -Dtorch=disabled -Dmpi=disabled -Dexamples=false -Dtools=false \
      -Dbuildtype=release -Dgpu_compile_only=false -Dnative=false "-Dgpu_arch=[$(sed "s/[^,]*/'&'/g" <<< "$arch")]" \
      > "$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; exit 1; }
    grep -q test_nccl_allreduce "$dir/build.ninja" && targets+=(tests/cuda/test_nccl_allreduce)
    grep -q test_nccl_reduce "$dir/build.ninja" && targets+=(tests/cuda/test_nccl_reduce)
    echo "gpu_check: compiling ${targets[*]} for $arch (5 to 15 minutes on 2 cores)"
    ninja -C "$dir" "${targets[@]}" > "$dir.compile.log" 2>&1 || { tail -60 "$dir.compile.log"; exit 1; }
  fi

  rm -rf "$folder"
  mkdir -p "$folder/bin" "$folder/lib" "$folder/include"
  for t in "${targets[@]}"; do cp "$dir/$t" "$folder/bin/"; done
  strip "$folder"/bin/*
  # The shared libraries a bare CUDA machine lacks: every one the binaries need except the C
  # and C++ runtimes, the driver and NCCL (the machine's own, matched to its driver).
  ldd "$folder"/bin/* | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++.so*|libgcc_s.so*|libnccl.so*|libcuda.so*) ;;
      *) cp -L "$path" "$folder/lib/$name" ;;
    esac
  done
  # Boost.Math headers reached from sidco's headers (header-only; not on a bare machine): the
  # preprocessor's own list over every .hpp (the .cuh ones reach Boost only through them).
  local every
  every=$(mktemp --suffix=.cpp)
  (cd include && find sidco -name '*.hpp' | sed 's/.*/#include <&>/') > "$every"
  g++ -std=c++20 -Iinclude -M -MG "$every" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
    while read -r header; do
      mkdir -p "$folder/include/$(dirname "${header#/usr/include/}")"
      cp "$header" "$folder/include/${header#/usr/include/}"
    done
  rm -f "$every"
  # A native call stack for a crash in the torch steps (Python's faulthandler shows Python's).
  gcc -O1 -shared -fPIC -o "$folder/lib/libsidco_native_backtrace.so" scripts/native_backtrace.c
  git rev-parse HEAD > "$folder/commit" 2> /dev/null || true
  echo "$arch" > "$folder/arch"
  local bytes
  bytes=$(du -sb "$folder" | cut -f1)
  echo "gpu_check: $folder holds $(find "$folder" -type f | wc -l) files, $((bytes / 1024 / 1024)) MiB"
  if [ "$bytes" -gt $((48 * 1024 * 1024)) ]; then
    echo "gpu_check: $folder is over 48 MiB"
    exit 1
  fi
}

# True, saying so, where SIDCO_GPU_QUICK=1 skips a measurement.
skipped_when_quick() {
  [ "${SIDCO_GPU_QUICK:-0}" = 1 ] || return 1
  echo "  skipped (SIDCO_GPU_QUICK=1)"
}

run() {
  [ -d "$folder/bin" ] || { echo "gpu_check: no $folder/bin; run 'scripts/gpu_check.sh build' first"; exit 1; }
  if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check"
    exit 77
  fi
  nvidia-smi -L
  # Logs: SIDCO_GPU_LOGS, else under $OUT where the caller collects files from there (the
  # lent machine's convention), else in the folder.
  local logs=${SIDCO_GPU_LOGS:-}
  [ -n "$logs" ] || logs=${OUT:+$OUT/gpu-check-logs}
  [ -n "$logs" ] || logs=$folder/logs
  mkdir -p "$logs"
  # The tables, printed again at the end for a caller that keeps only the output's tail.
  local summary=$logs/summary.txt
  : > "$summary"
  # NCCL: the machine's own (pip's nvidia-nccl beside its torch, else the toolkit's).
  local nccl
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
    2> /dev/null || true)
  export LD_LIBRARY_PATH="$folder/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export SIDCO_GRADIENTS_DIR=$root/examples/data/gradients
  local status=0
  # The torch ops' build takes minutes of the CPU and none of the GPU: it runs while the GPU
  # runs the tests and benchmarks, at the lowest priority and leaving 4 cores free, so that
  # the benchmarks' host side (launches, host waits) keeps cores of its own.
  local torch_build='' torch_started=0
  if [ "${SIDCO_GPU_TORCH:-1}" != 0 ] &&
     python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    local cores capability
    cores=$(nproc)
    # The architecture named, so that the build never opens a CUDA context (torch asks the
    # device otherwise): one appearing mid-test would change the free device memory that
    # test_cuda_backend's allocation-free check compares.
    capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -1 | tr -d ' ' || true)
    [[ "$capability" =~ ^[0-9]+\.[0-9]+$ ]] && export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$capability}
    MAX_JOBS=$((cores > 5 ? cores - 4 : 1)) nice -n 19 timeout 300 python3 "$root/scripts/gpu_torch_ops.py" \
      "$folder/include" "$folder/torch-build" > "$logs/torch-build.log" 2>&1 &
    torch_build=$!
    torch_started=$SECONDS
    echo "== sidco_torch's ops building beside the tests (log: $logs/torch-build.log)"
  fi
  echo "== tests ($(cat "$folder/commit" 2> /dev/null || echo '?'), built for $(cat "$folder/arch"))" |
    tee -a "$summary"
  printf '| %-22s | %-8s | %6s |\n' test result s | tee -a "$summary"
  for t in test_host_device_math test_cuda_backend test_nccl_allreduce test_nccl_reduce; do
    if [ ! -x "$folder/bin/$t" ]; then
      printf '| %-22s | %-8s | %6s |\n' "$t" "not built" - | tee -a "$summary"
      status=1
      continue
    fi
    local start rc=0 result
    start=$(date +%s%N)
    timeout 240 "$folder/bin/$t" > "$logs/$t.log" 2>&1 || rc=$?
    case $rc in
      0) result=pass ;;
      77) result="SKIPPED"; status=1 ;;  # a visible GPU the test could not use is a failure
      124) result="TIMEOUT"; status=1 ;;
      *) result="FAIL $rc"; status=1 ;;
    esac
    printf '| %-22s | %-8s | %6d |\n' "$t" "$result" $((($(date +%s%N) - start) / 1000000000)) | tee -a "$summary"
    [ "$result" = pass ] || tail -30 "$logs/$t.log" | sed 's/^/    /'
  done

  echo "== host waits per warm call (cuda-backend's own count)"
  grep -h "host waits per warm call" "$logs/test_cuda_backend.log" | sed 's/^/  /' | sort -u || echo "  (none printed)"

  echo "== benchmarks: N = 2^26 floats, delta = 0.001" | tee -a "$summary"
  # SIDCO_GPU_BENCH_ARGS: more benchmark arguments (a later filter replaces this one).
  # shellcheck disable=SC2086
  if skipped_when_quick; then
    :
  elif timeout 240 "$folder/bin/sidco-cuda-bench" --benchmark_filter='/1/26/1000/real_time$' \
       --benchmark_min_time=0.3 --benchmark_format=json ${SIDCO_GPU_BENCH_ARGS:-} \
       > "$logs/bench.json" 2> "$logs/bench.err"; then
    python3 "$root/scripts/gpu_bench_table.py" "$logs/bench.json" | tee -a "$summary" || status=1
  else
    echo "  sidco-cuda-bench failed:"; tail -20 "$logs/bench.err" | sed 's/^/    /'
    status=1
  fi

  echo "== cub::DeviceTopK in this machine's CCCL (CCCL 3.3 on)"
  local topk_headers
  topk_headers=$( (find /usr/local/cuda*/ /opt /usr/include -path '*cub/device/device_topk.cuh' 2> /dev/null;
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2> /dev/null |
      xargs -r -I{} find {} -path '*cub/device/device_topk.cuh' 2> /dev/null) | sort -u || true)
  if [ -n "$topk_headers" ]; then
    while read -r header; do
      echo "  present: $header (CUB_VERSION $(grep -m1 -oE 'define CUB_VERSION [0-9]+' \
        "$(dirname "$(dirname "$header")")/version.cuh" 2> /dev/null | awk '{print $3}'))"
    done <<< "$topk_headers"
  else
    echo "  absent: no cub/device/device_topk.cuh under the toolkits, /opt or Python's packages; nvcc: $(nvcc --version 2> /dev/null | tail -1)"
  fi

  echo "== sidco_torch against this machine's torch"
  if [ "${SIDCO_GPU_TORCH:-1}" = 0 ]; then
    echo "  skipped (SIDCO_GPU_TORCH=0)"
  elif [ -n "$torch_build" ]; then
    local waited=$SECONDS built=0
    wait "$torch_build" && built=1
    # What of the build the tests and benchmarks did not hide: device time spent waiting.
    echo "  the ops' build: $((SECONDS - torch_started)) s in all, $((SECONDS - waited)) s waited for here" |
      tee -a "$summary"
    if [ "$built" = 1 ]; then
      local library
      library=$(tail -1 "$logs/torch-build.log")
      # A crash prints Python's stack (faulthandler) and the native one (the preloaded tracer).
      local preload=$folder/lib/libsidco_native_backtrace.so
      [ -f "$preload" ] || preload=
      # python3 with these ops and the tracer loaded: ops_python SECONDS ARGS...
      ops_python() {
        local limit=$1
        shift
        LD_PRELOAD=$preload SIDCO_TORCH_LIBRARY=$library PYTHONPATH=$root/python:$root/tests/python \
          PYTHONUNBUFFERED=1 timeout "$limit" python3 -X faulthandler "$@"
      }
      # Step by step first, each step printed as it ends, so that a crash names its step (the
      # CUDA tests of 2026-11-26 died before their first line).
      ops_python 120 -c '
import torch
print("step: torch", torch.__version__, flush=True)
import sidco_torch
print("step: import, methods:", len(sidco_torch.METHODS), flush=True)
g = torch.randn(100000)
print("step: cpu compress", sidco_torch.compress(g, 0.01)[0].numel(), flush=True)
try:
    sidco_torch.decompress(torch.tensor([7]), torch.tensor([1.0]), 3)
except Exception as e:  # noqa: BLE001 - the message is what is checked
    print("step: cpu error message:", type(e).__name__, e, flush=True)
d = g.cuda()
torch.cuda.synchronize()
print("step: cuda tensor", d.device, flush=True)
c = sidco_torch.Compressor("top-k")
print("step: compressor", flush=True)
i, v = c.compress(d, 0.01)
print("step: cuda top-k returned", flush=True)
torch.cuda.synchronize()
print("step: cuda top-k", i.numel(), i.device, flush=True)
print("step: cuda sidco-e", sidco_torch.compress(d, 0.01)[0].numel(), flush=True)
print("step: cuda decompress", float(sidco_torch.decompress(i, v, d.numel()).abs().sum()), flush=True)
' > "$logs/torch-steps.log" 2>&1 || status=1
      sed 's/^/  /' "$logs/torch-steps.log" | head -80
      echo "== the seeds' comparison: SIDCo and Top-k against torch.topk (ratios to a device copy)"
      if ! skipped_when_quick; then
        ops_python 200 "$root/scripts/gpu_seeds.py" "$SIDCO_GRADIENTS_DIR" "$logs/seeds.json" \
          > "$logs/seeds.log" 2>&1 || { echo "  gpu_seeds.py failed or timed out"; status=1; }
        cat "$logs/seeds.log"
      fi
      echo "== the hook's reduce exchange by op: CUDA codecs (host staging) against the CPU's" | tee -a "$summary"
      if ! skipped_when_quick; then
        ops_python 240 "$root/scripts/gpu_hook_costs.py" > "$logs/hook_costs.log" 2>&1 ||
          { echo "  gpu_hook_costs.py failed or timed out"; status=1; }
        tee -a "$summary" < "$logs/hook_costs.log"
      fi
      for t in cuda_ops_test cuda_memory_test cuda_hook_test cuda_amp_test; do
        local rc=0
        ops_python 180 "$root/tests/python/$t.py" > "$logs/$t.log" 2>&1 || rc=$?
        case $rc in
          0) printf '| %-22s | pass |\n' "$t" | tee -a "$summary" ;;
          *) printf '| %-22s | FAIL %s |\n' "$t" "$rc" | tee -a "$summary"; tail -60 "$logs/$t.log" | sed 's/^/    /'
             status=1 ;;
        esac
      done
    else
      echo "  building the ops against $(python3 -c 'import torch; print(torch.__version__)') failed:"
      grep -m20 -E "error|Error" "$logs/torch-build.log" | sed 's/^/    /' || tail -30 "$logs/torch-build.log"
      status=1
    fi
  else
    echo "  python3 has no CUDA torch: not checked"
  fi
  echo "== summary (the tables above again; logs in $logs)"
  cat "$summary"
  return $status
}

case "$step" in
  build) build ;;
  run) run ;;
  *) echo "usage: scripts/gpu_check.sh build|run [FOLDER]"; exit 2 ;;
esac
