#!/usr/bin/env bash
# A doc's complete program is a file of examples/, which the build compiles: the doc's
# ```cpp TAG block equals that file; the build's binary and the block compiled on its own, with
# nothing but the include path (and -fopenmp), each print a line EXPECTED (an extended
# regular expression) matches; a program given ARGS fails without them.
#   doc_program_test.sh DOC TAG SOURCE BINARY EXPECTED SOURCE_ROOT COMPILER... [-- ARGS...]
set -euo pipefail
doc=$1 tag=$2 source=$3 binary=$4 expected=$5 source_root=$6
shift 6
compiler=() args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do compiler+=("$1"); shift; done
[ $# -gt 0 ] && shift && args=("$@")
block=$(awk -v tag="cpp $tag" '$0 == "```" tag {on=1; next} on && /^```/{exit} on' "$doc")
[ -n "$block" ] || { echo "$doc has no \`\`\`cpp $tag block"; exit 1; }
diff <(printf '%s\n' "$block") "$source"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' "$block" > "$tmp/example.cpp"
"${compiler[@]}" -std=c++20 -O1 -fopenmp -I "$source_root/include" "$tmp/example.cpp" -o "$tmp/example"
for program in "$binary" "$tmp/example"; do
  out=$("$program" "${args[@]}")
  printf '%s\n' "$out"
  grep -q -E "$expected" <<< "$out" || { echo "$program: no line matches $expected"; exit 1; }
  if [ ${#args[@]} -gt 0 ] && "$program" 2> /dev/null; then echo "$program ran without its arguments"; exit 1; fi
done
echo "$doc's $tag program matches $source, compiles on its own and runs"
