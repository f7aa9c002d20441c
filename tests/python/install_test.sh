#!/usr/bin/env bash
# sidco_torch installed as a user installs it: from a copy of the source as a clean clone has
# it, `pip install --no-build-isolation` into a fresh virtual environment that sees the
# interpreter's torch, then a wheel from `python -m build --no-isolation` into another; each
# imported from outside the source tree and run (a compress and a 2-rank hook step); the first
# also builds an extension of one's own on the installed headers (examples/torch_extension.py).
#   install_test.sh PYTHON SOURCE_ROOT [WORK_PARENT [MESON_OPTION...]]
# exits 77 without venv, pip, meson-python or build. WORK_PARENT (default $TMPDIR or /tmp)
# holds its scratch directory. The build directory sits in the copy of the source as build/
# sits in a checkout, and the MESON_OPTIONs (the calling build's werror) go to its setup, its
# compiler named by CXX as the calling build names it (the test sets both): the compile
# commands are then the calling build's own for the same objects, which a compiler cache
# hashing paths relative to the checkout (scripts/test.sh) serves.
set -euo pipefail
python=$1 root=$(cd "$2" && pwd)
pip_setup=() build_setup=()  # pip install's and python -m build's spelling of each option
for option in "${@:4}"; do
  pip_setup+=(--config-settings "setup-args=$option") build_setup+=("-Csetup-args=$option")
done
for module in venv pip mesonpy build; do
  "$python" -c "import $module" 2> /dev/null ||
    { echo "install_test: $python cannot import $module (Debian: python3-venv python3-pip python3-mesonpy python3-build)"; exit 77; }
done
tmp=$(mktemp -d "${3:-${TMPDIR:-/tmp}}/install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Tracked and untracked-but-not-ignored files: what a clean clone of this tree would hold.
mkdir "$tmp/src"
if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard |
     tar --null --files-from=- --ignore-failed-read -cf - 2> /dev/null) | tar -xf - -C "$tmp/src"
else
  tar -C "$root" --exclude='./build*' -cf - . | tar -xf - -C "$tmp/src"
fi

smoke() {  # VENV [--extension]: import from $tmp, not the source tree, and run
  (cd "$tmp" && OMP_NUM_THREADS=1 TORCH_EXTENSIONS_DIR="$tmp/extensions" \
     "$1/bin/python" "$root/tests/python/install_smoke.py" "$@")
}

# Both front ends drive meson-python's build_wheel; they share one build directory, so the
# second reuses the first's objects (a full build of the ops takes minutes on 2 cores)
# and still configures, installs and packs its wheel itself.
echo "== pip install --no-build-isolation"
"$python" -m venv --system-site-packages "$tmp/venv"
(cd "$tmp" && "$tmp/venv/bin/pip" install -q --no-index --no-build-isolation \
   --config-settings builddir="$tmp/src/build" "${pip_setup[@]}" "$tmp/src")
smoke "$tmp/venv" --extension

echo "== python -m build --no-isolation --wheel, then pip install the wheel"
(cd "$tmp/src" && "$tmp/venv/bin/python" -m build --no-isolation --wheel -Cbuilddir="$tmp/src/build" \
   "${build_setup[@]}" --outdir "$tmp/dist" . > "$tmp/build.log" 2>&1) ||
  { tail -40 "$tmp/build.log"; exit 1; }
wheel=$(ls "$tmp"/dist/*.whl)
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("sidco_torch/__init__.py", "sidco_torch/hook.py", "sidco_torch/ops.py", "sidco_torch/libsidco_torch_ops.so",
             "sidco_torch/extension.py", "sidco_torch/build_config.py", "sidco_torch/source_digest.py",
             "sidco_torch/include/sidco/sidco.hpp",
             "sidco_torch/include/sidco_torch/csrc/added_methods.hpp"):
    assert want in names, (want, names)
# The ops library's copy of the digest is compiled in, not shipped.
assert "sidco_torch/source_digest.cpp" not in names, names
stray = [n for n in names if not n.startswith(("sidco_torch/", "sidco_torch-", "sidco_torch.", "sidco-torch"))]
assert not stray, f"the wheel holds files outside the package: {stray}"
name = sys.argv[1].rsplit("/", 1)[1]
# A native library inside: a platform wheel, never py3-none-any.
assert not name.endswith("-none-any.whl"), name
print("wheel:", name, len(names), "files")
PY
"$python" -m venv --system-site-packages "$tmp/venv2"
(cd "$tmp" && "$tmp/venv2/bin/pip" install -q --no-index "$wheel")
smoke "$tmp/venv2"
echo "install checks passed"
