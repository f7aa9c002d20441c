# Sourced by test.sh and demo.sh: installs what the build needs from Debian's packages
# (only what is missing; silent when everything is there) and configures a build directory.

sidco_packages=(meson ninja-build g++ clang cmake pkg-config doctest-dev libboost-math-dev
                libbenchmark-dev libhwy-dev libomp-dev libclang-rt-14-dev libopenmpi-dev openmpi-bin libtorch-dev
                python3-torch python3-numpy libopenblas0-pthread nlohmann-json3-dev libcli11-dev iproute2
                python3-venv python3-pip python3-mesonpy python3-build libsimgrid-dev ccache)

sidco_install_missing() {
  local missing=()
  for p in "${sidco_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
}

# sidco_use_ccache: the C and C++ compilers the build runs (g++, clang++, and those of the
# consumers tests build with CMake and by hand) through ccache, by masquerade links first on
# PATH (nvcc runs it itself: sidco_use_nvcc_deps); paths below this checkout hashed relative to
# it, so that a second run, in this clone or a new one, finds what the first compiled.
# Nothing happens without ccache.
sidco_use_ccache() {
  command -v ccache > /dev/null || return 0
  local links="${XDG_CACHE_HOME:-$HOME/.cache}/sidco-ccache-bin" compiler
  mkdir -p "$links"
  for compiler in gcc g++ cc c++ clang clang++; do ln -sf "$(command -v ccache)" "$links/$compiler"; done
  export PATH="$links:$PATH" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-6G}"
}

# sidco_use_nvcc_deps: nvcc (when there is one) through a wrapper that asks it
# for the header dependencies Meson 1.0 does not (-MD -MF OUT.d -MT OUT on a compile to OUT),
# so that ninja rebuilds a CUDA object when a header it includes changes (without them an
# edited .cuh or .hpp left every CUDA object as it was). ccache, where there is one, runs
# inside the wrapper, after the flags: it then keeps the dependency file with the object and
# writes it on a hit too (behind ccache, a hit wrote none, and ninja forgot that object's
# headers). Written only when its text changes. Affects build directories set up after it
# (Meson records the compiler then, and every later build of them, in any shell, runs the
# wrapper); one set up with the earlier wrapper (sidco-nvcc-bin, ccache in front) keeps it.
sidco_use_nvcc_deps() {
  local real wrapper="${XDG_CACHE_HOME:-$HOME/.cache}/sidco-nvcc-deps-bin/nvcc" text launcher=""
  real=$(command -v nvcc) || return 0
  command -v ccache > /dev/null && launcher="$(command -v ccache) "
  text=$(cat <<WRAPPER
#!/usr/bin/env bash
# Written by sidco's scripts/setup.sh (sidco_use_nvcc_deps): ${launcher}$real, with header dependencies.
args=("\$@") out="" compile=0 deps=0
for ((i = 0; i < \${#args[@]}; i++)); do
  case "\${args[i]}" in
    -c) compile=1 ;;
    -o) out=\${args[i + 1]:-} ;;
    -M | -MM | -MD | -MMD | -MF | -MT | -E | --generate-dependencies* | --dependency-output*) deps=1 ;;
  esac
done
[ "\$compile" = 1 ] && [ -n "\$out" ] && [ "\$deps" = 0 ] && args+=(-MD -MF "\$out.d" -MT "\$out")
exec ${launcher}"$real" "\${args[@]}"
WRAPPER
)
  mkdir -p "$(dirname "$wrapper")"
  if [ ! -x "$wrapper" ] || [ "$(cat "$wrapper")" != "$text" ]; then
    printf '%s\n' "$text" > "$wrapper.new" && chmod +x "$wrapper.new" && mv "$wrapper.new" "$wrapper"
  fi
  # Meson 1.0 takes a CUDA compiler from a native file only (no variable) and records its path.
  printf "[binaries]\ncuda = ['%s']\n" "$wrapper" > "$wrapper.ini"
  export SIDCO_MESON_NATIVE="$wrapper.ini"
}

# sidco_configure DIR [meson options...]: set up DIR, or reconfigure it (which also picks
# up options added since it was set up). The log is shown only when it fails.
sidco_configure() {
  local dir=$1
  shift
  local mode=()
  [ -f "$dir/build.ninja" ] && mode=(--reconfigure)
  [ -n "${SIDCO_MESON_NATIVE:-}" ] && mode+=(--native-file "$SIDCO_MESON_NATIVE")
  meson setup "${mode[@]}" "$dir" "$@" > "$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  rm -f "$dir.setup.log"
}
