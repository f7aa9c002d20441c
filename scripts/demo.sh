#!/usr/bin/env bash
# Builds sidco-eval and runs every preset at densities 0.1, 0.01, 0.001 on the bundled real
# gradients. Extra arguments go to sidco-eval (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
sidco_install_missing
sidco_configure build -Dbuildtype=release
meson compile -C build examples/sidco-eval > build.compile.log 2>&1 || { cat build.compile.log; exit 1; }
rm -f build.compile.log
exec ./build/examples/sidco-eval "$@"
