#!/usr/bin/env bash
# scripts/gpu_check.sh on this build: `build` gathers every CUDA test and benchmark binary,
# the libraries a bare CUDA machine lacks and the Boost.Math headers into one folder of at
# most 48 MiB; `run` on it without a GPU says so and exits 77 (skipped), never 0. Given the
# torch ops library, `run` also goes through every step once with a stand-in GPU (nvidia-smi)
# and a stand-in CUDA torch (python3): the ops' build starts before the tests, at the lowest
# priority, for the architecture nvidia-smi names, and the torch steps load what it built; no
# step is lost from the summary.
# Usage: gpu_check_test.sh SOURCE_ROOT BUILD_ROOT [TORCH_OPS_LIBRARY]
set -euo pipefail
source_root=$1 build_root=$2 torch_ops=${3:-}
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
if [ -n "$torch_ops" ]; then
  stand_in=$(dirname "$folder")/stand-in
  mkdir -p "$stand_in"
  printf '#!/bin/sh\ncase "$*" in *compute_cap*) echo "9.0" ;; *) echo "GPU 0: stand-in" ;; esac\n' \
    > "$stand_in/nvidia-smi"
  # torch "has CUDA"; the ops' "build" notes its priority, jobs and architectures and names the
  # built library.
  cat > "$stand_in/python3" << STAND_IN
#!/bin/bash
case "\$*" in
  *"torch.cuda.is_available()"*) exit 0 ;;
  *gpu_torch_ops.py*)
    echo "stand-in build: nice \$(nice), MAX_JOBS \$MAX_JOBS, TORCH_CUDA_ARCH_LIST \${TORCH_CUDA_ARCH_LIST:-unset}"
    echo "$torch_ops"
    exit 0 ;;
esac
exec /usr/bin/python3 "\$@"
STAND_IN
  chmod +x "$stand_in/nvidia-smi" "$stand_in/python3"
  rc=0
  PATH=$stand_in:$PATH SIDCO_GPU_QUICK=1 SIDCO_GPU_LOGS=$stand_in/logs "$source_root/scripts/gpu_check.sh" run "$folder" \
    > "$folder.stand-in.log" 2>&1 || rc=$?
  cat "$folder.stand-in.log"
  [ "$rc" = 1 ] || fail "run with a stand-in GPU exited $rc, not 1 (its tests cannot pass)"
  first=$(grep -m1 -e "^== sidco_torch's ops building" -e "^== tests" "$folder.stand-in.log")
  [[ "$first" == "== sidco_torch's ops building"* ]] || fail "the ops' build did not start before the tests"
  # The architecture comes from nvidia-smi: the build opens no CUDA context beside the tests.
  grep -q "stand-in build: nice 19, MAX_JOBS [1-9][0-9]*, TORCH_CUDA_ARCH_LIST 9.0$" "$stand_in/logs/torch-build.log" ||
    fail "the ops' build ran as: $(cat "$stand_in/logs/torch-build.log")"
  grep -q "step: cpu compress [1-9]" "$folder.stand-in.log" || fail "the torch steps did not run on the built ops"
  summary=$(sed -n '/^== summary/,$p' "$folder.stand-in.log")
  for row in test_cuda_backend cuda_ops_test cuda_memory_test cuda_hook_test cuda_amp_test; do
    grep -q "| $row " <<< "$summary" || fail "$row missing from the summary"
  done
fi
echo "gpu_check build: $(find "$folder" -type f | wc -l) files, $((bytes / 1024)) KiB; run without a GPU: 77"
