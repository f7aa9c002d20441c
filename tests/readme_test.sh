#!/usr/bin/env bash
# The README's usage example is examples/quickstart.cpp, which the build compiles and this
# runs; it also compiles on its own, with nothing but the include path (and -fopenmp).
# Arguments: README QUICKSTART_SOURCE QUICKSTART_BINARY GRADIENT_FILE SOURCE_ROOT COMPILER...
set -euo pipefail
readme=$1
quickstart_src=$2
quickstart_bin=$3
gradient=$4
source_root=$5
shift 5
block=$(awk '/^```cpp quickstart/{on=1; next} on && /^```/{exit} on' "$readme")
[ -n "$block" ] || { echo "README has no \`\`\`cpp quickstart block"; exit 1; }
diff <(printf '%s\n' "$block") "$quickstart_src"
"$quickstart_bin" "$gradient" | grep -q "^kept [0-9]* of 301066"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' "$block" > "$tmp/example.cpp"
"$@" -std=c++20 -O1 -fopenmp -I "$source_root/include" "$tmp/example.cpp" -o "$tmp/example"
"$tmp/example" "$gradient" | grep -q "^kept [0-9]* of 301066"
if "$tmp/example" 2> /dev/null; then echo "the example ran without a file"; exit 1; fi
echo "README example matches examples/quickstart.cpp, compiles on its own and runs"
