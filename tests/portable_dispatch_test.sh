#!/bin/bash
# The portable build (Highway kernels for every x86 target, chosen at run time) must run a
# target at least as wide as the one this machine's native build was compiled for (g++ 12's
# -march=native can name an older CPU than the one it runs on, e.g. Zen 4 as znver3, so the
# portable build may pick a better one), and give every compressor's selections and
# residuals bit for bit as the native build does.
#   portable_dispatch_test.sh NATIVE_DIGEST PORTABLE_DIGEST
set -eu
native=$("$1")
portable=$("$2")
native_target=$(echo "$native" | head -n 1)
portable_target=$(echo "$portable" | head -n 1)
echo "native build:   $native_target"
echo "portable build: $portable_target"
# Highway's x86 targets, narrowest first; a name not listed ranks 0.
rank() {
  local i=1
  for name in "Highway SSSE3" "Highway SSE4" "Highway AVX2" "Highway AVX3 (AVX-512)" "Highway AVX3_DL (AVX-512)"; do
    [ "$1" = "kernels: $name" ] && { echo "$i"; return; }
    i=$((i + 1))
  done
  echo 0
}
if [ "$(rank "$portable_target")" -eq 0 ] || [ "$(rank "$portable_target")" -lt "$(rank "$native_target")" ]; then
  echo "FAIL: the portable build dispatches to a narrower target than the native build's" >&2
  exit 1
fi
lines=$(echo "$native" | wc -l)
if [ "$(echo "$native" | tail -n +2)" != "$(echo "$portable" | tail -n +2)" ]; then
  echo "FAIL: selections differ between the builds:" >&2
  diff <(echo "$native" | tail -n +2) <(echo "$portable" | tail -n +2) >&2 || true
  exit 1
fi
echo "OK: $((lines - 1)) compressor runs bit-identical"
