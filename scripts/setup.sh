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
# PATH (Meson puts ccache before nvcc itself); paths below this checkout hashed relative to
# it, so that a second run, in this clone or a new one, finds what the first compiled.
# Nothing happens without ccache.
sidco_use_ccache() {
  command -v ccache > /dev/null || return 0
  local links="${XDG_CACHE_HOME:-$HOME/.cache}/sidco-ccache-bin" compiler
  mkdir -p "$links"
  for compiler in gcc g++ cc c++ clang clang++; do ln -sf "$(command -v ccache)" "$links/$compiler"; done
  export PATH="$links:$PATH" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-6G}"
}

# sidco_configure DIR [meson options...]: set up DIR, or reconfigure it (which also picks
# up options added since it was set up). The log is shown only when it fails.
sidco_configure() {
  local dir=$1
  shift
  local mode=()
  [ -f "$dir/build.ninja" ] && mode=(--reconfigure)
  meson setup "${mode[@]}" "$dir" "$@" > "$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  rm -f "$dir.setup.log"
}
