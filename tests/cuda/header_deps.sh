#!/usr/bin/env bash
# Every CUDA object of this build has its headers recorded, so that an edited header rebuilds
# it. Meson 1.0 asks nvcc for none; scripts/setup.sh's wrapper does (sidco_use_nvcc_deps), and
# runs ccache after adding the flags so that a cache hit writes them too (behind ccache a hit
# wrote none: the object then stayed stale across header edits). Skips (77) in a build whose
# nvcc is not that wrapper (set up by hand). Usage: header_deps.sh BUILD_ROOT
set -euo pipefail
build=$1
if ! grep -q 'sidco-nvcc-deps-bin/nvcc' "$build/build.ninja"; then
  echo "nvcc here is not scripts/setup.sh's wrapper (a build set up by hand): skipped"
  exit 77
fi
ninja=$(command -v ninja || command -v ninja-build)
objects=$("$ninja" -C "$build" -t targets all | sed -n 's/^\([^:]*\.cu\.o\): .*/\1/p' | sort -u)
[ -n "$objects" ] || { echo "header_deps: no CUDA object in $build"; exit 1; }
bad=0 checked=0
for object in $objects; do
  [ -f "$build/$object" ] || continue  # not built (a target outside the default set)
  checked=$((checked + 1))
  count=$("$ninja" -C "$build" -t deps "$object" | sed -n 's/.*#deps \([0-9]*\).*/\1/p')
  # Each includes sidco's headers and CUDA's: far more than a handful.
  if [ "${count:-0}" -lt 20 ]; then
    echo "header_deps: $object records ${count:-no} headers"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "every CUDA object built here records its headers ($checked objects)"
exit "$bad"
