#!/usr/bin/env bash
# The README's usage example is examples/quickstart.cpp, which the build compiles and this runs.
set -euo pipefail
readme=$1
quickstart_src=$2
quickstart_bin=$3
block=$(awk '/^```cpp quickstart/{on=1; next} on && /^```/{exit} on' "$readme")
[ -n "$block" ] || { echo "README has no \`\`\`cpp quickstart block"; exit 1; }
diff <(printf '%s\n' "$block") "$quickstart_src"
"$quickstart_bin" | grep -q "^kept [0-9]* of 301066"
echo "README example matches examples/quickstart.cpp and runs"
