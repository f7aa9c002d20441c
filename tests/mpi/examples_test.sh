#!/usr/bin/env bash
# docs/MPI.md's programs are examples/mpi_*.cpp, which the build compiles: each block of the
# doc equals its file, and each program runs at 2 ranks, printing 5 steps that applied about
# the target (1% of 2^20) with nothing trimmed.
#   examples_test.sh MPI_MD MPIRUN SOURCE_ROOT BUILD_ROOT
set -euo pipefail
doc=$1 mpirun=$2 root=$3 build=$4
for name in reduce_exchange allgather_exchange; do
  block=$(awk -v tag="cpp mpi_$name" '$0 == "```" tag {on=1; next} on && /^```/{exit} on' "$doc")
  [ -n "$block" ] || { echo "$doc has no \`\`\`cpp mpi_$name block"; exit 1; }
  diff <(printf '%s\n' "$block") "$root/examples/mpi_$name.cpp"
  out=$("$mpirun" -np 2 "$build/examples/mpi-${name//_/-}")
  printf '%s\n' "$out"
  [ "$(printf '%s\n' "$out" | grep -c '^step [0-4]: .*trimmed 0')" -eq 5 ] || { echo "mpi_$name: not 5 good steps"; exit 1; }
done
# The reduce exchange applies about k = 10,485 entries a step, the all-gather about 2k.
/usr/bin/python3 - <<PY
import re, subprocess
out = subprocess.run(["$mpirun", "-np", "2", "$build/examples/mpi-reduce-exchange"], capture_output=True, text=True,
                     check=True).stdout
applied = [int(m) for m in re.findall(r"applied (\d+) of", out)]
assert len(applied) == 5 and all(0.9 * 10485 <= a <= 1.1 * 10485 for a in applied), applied
PY
echo "docs/MPI.md's programs match examples/ and run at 2 ranks"
