#!/usr/bin/env bash
# sidco consumed as users do: (1) as a Meson subproject, where it must build and install
# nothing but its dependency object; (2) installed, through find_package(sidco) from a tiny
# CMake project, whose imported target must carry what it needs to compile and run; (3) as
# CMake source through add_subdirectory (FetchContent's way), adding no targets of its own;
# (4) the README's headers-only install, which must build nothing (its time is printed).
# Arguments: SOURCE_ROOT BUILD_DIR.
set -euo pipefail
source_root=$1
build_dir=$(cd "$2" && pwd)
# Scratch inside the build directory: the consumers' compile commands then name their files
# by the same relative paths in every clone, and a compiler cache hashing paths relative to
# the checkout (scripts/test.sh) serves a second run.
tmp=$(mktemp -d "$build_dir/packaging-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/main.cpp" <<'CPP'
#include <cstdio>
#include <vector>
#include <sidco/sidco.hpp>
int main() {
  std::vector<float> g(100000);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = float((i * 7919) % 1000) * 1e-3f - 0.5f;
  sidco::presets::sidco_e<> compressor;
  sidco::sparse_vector<float> out;
  const auto report = compressor.compress<float>(g, 0.01, out);
  std::printf("kept %zu\n", report.selected);
  return report.selected > 0 ? 0 : 1;
}
CPP

echo "== as a Meson subproject"
mkdir -p "$tmp/meson/subprojects"
cp "$tmp/main.cpp" "$tmp/meson/"
ln -s "$source_root" "$tmp/meson/subprojects/sidco"
cat > "$tmp/meson/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
sidco_dep = dependency('sidco', fallback: ['sidco', 'sidco_dep'])
executable('app', 'main.cpp', dependencies: sidco_dep)
MESON
meson setup "$tmp/meson/build" "$tmp/meson" > "$tmp/meson.log" 2>&1 || { cat "$tmp/meson.log"; exit 1; }
targets=$(meson introspect --targets "$tmp/meson/build" | /usr/bin/python3 -c 'import json, sys; print(" ".join(sorted(t["name"] for t in json.load(sys.stdin))))')
[ "$targets" = "app" ] || { echo "the subproject adds targets: $targets"; exit 1; }
installed=$(meson introspect --installed "$tmp/meson/build")
[ "$installed" = "{}" ] || { echo "the subproject installs files: $installed"; exit 1; }
meson compile -C "$tmp/meson/build" > "$tmp/meson-compile.log" 2>&1 || { cat "$tmp/meson-compile.log"; exit 1; }
"$tmp/meson/build/app"
echo "only the consumer's target; nothing installed"

echo "== installed, through find_package(sidco)"
meson install -C "$build_dir" --destdir "$tmp/stage" --no-rebuild > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
prefix=$(meson introspect --buildoptions "$build_dir" | /usr/bin/python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
config=$(find "$tmp/stage$prefix" -name sidcoConfig.cmake | head -1)
[ -n "$config" ] || { echo "no sidcoConfig.cmake was installed"; exit 1; }
mkdir -p "$tmp/cmake"
cp "$tmp/main.cpp" "$tmp/cmake/"
cat > "$tmp/cmake/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
find_package(sidco 0.1 REQUIRED)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE sidco::sidco)
CMAKE
cmake -S "$tmp/cmake" -B "$tmp/cmake/build" -DCMAKE_PREFIX_PATH="$tmp/stage$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
cmake --build "$tmp/cmake/build" > "$tmp/cmake-build.log" 2>&1 || { cat "$tmp/cmake-build.log"; exit 1; }
"$tmp/cmake/build/app"
# With Highway, the consumer compiles as pkg-config's users do: -DHWY_SHARED_DEFINE too.
if grep -q "SIDCO_HIGHWAY=1" "$tmp/cmake/build/compile_commands.json"; then
  grep -q "HWY_SHARED_DEFINE" "$tmp/cmake/build/compile_commands.json" ||
    { echo "sidco::sidco compiles with Highway but without HWY_SHARED_DEFINE"; exit 1; }
fi
echo "the CMake consumer builds and runs against $(dirname "$config")"

echo "== as CMake source, through add_subdirectory (what FetchContent_MakeAvailable does)"
meson_version=$(sed -n "s/^  version: '\([0-9.]*\)',$/\1/p" "$source_root/meson.build")
cmake_version=$(sed -n 's/^project(sidco VERSION \([0-9.]*\) .*/\1/p' "$source_root/CMakeLists.txt")
[ -n "$meson_version" ] && [ "$meson_version" = "$cmake_version" ] ||
  { echo "meson.build says version '$meson_version', CMakeLists.txt '$cmake_version'"; exit 1; }
mkdir -p "$tmp/subdir"
cp "$tmp/main.cpp" "$tmp/subdir/"
cat > "$tmp/subdir/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
add_subdirectory("$source_root" sidco)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE sidco::sidco)
CMAKE
cmake -S "$tmp/subdir" -B "$tmp/subdir/build" -DCMAKE_BUILD_TYPE=Release > "$tmp/subdir.log" 2>&1 ||
  { cat "$tmp/subdir.log"; exit 1; }
cmake --build "$tmp/subdir/build" > "$tmp/subdir-build.log" 2>&1 || { cat "$tmp/subdir-build.log"; exit 1; }
"$tmp/subdir/build/app"
targets=$(cmake --build "$tmp/subdir/build" --target help | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p' | grep -vxE 'all|clean|depend|edit_cache|rebuild_cache|install.*|list_install_components|app|main\.(o|i|s)' || true)
[ -z "$targets" ] || { echo "add_subdirectory(sidco) adds targets: $targets"; exit 1; }
echo "the add_subdirectory consumer builds and runs; sidco adds no targets of its own"

echo "== the headers-only install the README gives"
started=$(date +%s%N)
meson setup "$tmp/headers" "$source_root" --prefix "$tmp/headers-prefix" -Dtests=false -Dbenchmarks=false \
  -Dexamples=false -Dtools=false -Dtorch=disabled -Dcuda=disabled -Dmpi=disabled > "$tmp/headers.log" 2>&1 || { cat "$tmp/headers.log"; exit 1; }
meson install -C "$tmp/headers" > "$tmp/headers-install.log" 2>&1 || { cat "$tmp/headers-install.log"; exit 1; }
milliseconds=$(( ($(date +%s%N) - started) / 1000000 ))
built=$(grep -c "^\[[0-9]*/[0-9]*\]" "$tmp/headers-install.log" || true)
[ "$built" -eq 0 ] || { echo "the headers-only install built $built targets"; exit 1; }
[ -f "$tmp/headers-prefix/include/sidco/sidco.hpp" ] || { echo "no sidco.hpp installed"; exit 1; }
echo "headers-only install: nothing built, ${milliseconds} ms (README: seconds)"
