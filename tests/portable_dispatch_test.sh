#!/bin/bash
# The portable build (Highway kernels for every x86 target, chosen at run time) must run the
# target this machine's native build was compiled for, and give every compressor's
# selections and residuals bit for bit as the native build does.
#   portable_dispatch_test.sh NATIVE_DIGEST PORTABLE_DIGEST
set -eu
native=$("$1")
portable=$("$2")
echo "native build:   $(echo "$native" | head -n 1)"
echo "portable build: $(echo "$portable" | head -n 1)"
if [ "$(echo "$native" | head -n 1)" != "$(echo "$portable" | head -n 1)" ]; then
  echo "FAIL: the portable build does not dispatch to the native build's target" >&2
  exit 1
fi
lines=$(echo "$native" | wc -l)
if [ "$native" != "$portable" ]; then
  echo "FAIL: selections differ between the builds:" >&2
  diff <(echo "$native") <(echo "$portable") >&2 || true
  exit 1
fi
echo "OK: $((lines - 1)) compressor runs bit-identical"
