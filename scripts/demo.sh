#!/usr/bin/env bash
# Builds sidco-eval (in build-demo/, so that a build/ you configure yourself keeps its own
# options) and runs every preset at densities 0.1, 0.01, 0.001 on the bundled real
# gradients. Extra arguments go to sidco-eval (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
sidco_install_missing
sidco_configure build-demo -Dbuildtype=release
meson compile -C build-demo tools/sidco-eval > build-demo.compile.log 2>&1 || { cat build-demo.compile.log; exit 1; }
rm -f build-demo.compile.log
exec ./build-demo/tools/sidco-eval "$@"
