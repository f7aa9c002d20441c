#!/usr/bin/env python3
"""The digest of the sources a sidco_torch build compiles and runs: sidco's headers, the ops'
C++/CUDA sources and the package's Python files. Ranks whose digests differ run different
code under the same names, which the hook's agreement refuses (python/sidco_torch/agreement.py).

  source_digest.py --list ROOT                  the files, one a line (meson reads them at setup)
  source_digest.py --root ROOT --output F FILE...  writes F, the module sidco_torch.source_digest
  source_digest.py --root ROOT --output F --cpp C FILE...  and C, the ops library's copy (C++)
  source_digest.py --root ROOT                  prints the digest of the files --list names

Each file counts by its path relative to ROOT and its bytes, so a development build, a pip
install and another machine's build of the same tree agree.
"""
import argparse
import hashlib
import os
import sys

# Relative to the project root: what the ops library and the package are built from.
_TREES = (("include/sidco", (".hpp", ".cuh", ".h")),
          ("python/sidco_torch", (".py", ".cpp", ".hpp", ".cu", ".cuh")))
# Written by meson per build (flags, paths): not code every rank must share.
_LEFT_OUT = {"python/sidco_torch/build_config.py", "python/sidco_torch/source_digest.py"}


def listed(root):
    """The files the digest covers, as paths relative to root, sorted."""
    found = []
    for tree, suffixes in _TREES:
        for folder, _, names in os.walk(os.path.join(root, tree)):
            for name in names:
                path = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if name.endswith(suffixes) and path not in _LEFT_OUT:
                    found.append(path)
    return sorted(found)


def digest(root, paths):
    """SHA-256 over each file's relative path and bytes, in path order."""
    h = hashlib.sha256()
    for path in sorted(os.path.relpath(os.path.abspath(p), os.path.abspath(root)).replace(os.sep, "/")
                       for p in paths):
        with open(os.path.join(root, path), "rb") as f:
            data = f.read()
        h.update(f"{path}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def tree_digest(root):
    """(digest, file count) of the files listed(root) names: what a build of root writes."""
    paths = listed(root)
    return digest(root, [os.path.join(root, p) for p in paths]), len(paths)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", metavar="ROOT", help="print the files the digest covers")
    ap.add_argument("--root", help="the project root the paths are relative to")
    ap.add_argument("--output", help="the module to write")
    ap.add_argument("--cpp", help="the C++ source to write beside it: the digest the ops library was built from")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    if a.list:
        print("\n".join(os.path.join(a.list, p) for p in listed(a.list)))
        return 0
    if not a.root:
        ap.error("--root ROOT is needed")
    value, count = (digest(a.root, a.files), len(a.files)) if a.files else tree_digest(a.root)
    if not a.output:
        print(value)
        return 0
    with open(a.output, "w") as f:
        f.write('"""The digest of the sources this sidco_torch was built from (written by meson with\n'
                'scripts/source_digest.py): the hook\'s agreement compares it across ranks."""\n'
                f"DIGEST = \"{value}\"\nFILES = {count}\n")
    if a.cpp:
        # The form SIDCO_TORCH_SOURCE_DIGEST takes in an extension (0x and the digest), which
        # add_method_factories compares before it reads anything an extension hands it; the
        # package compares it with DIGEST at import (torch.ops.sidco.source_digest).
        with open(a.cpp, "w") as f:
            f.write("// Written by meson with scripts/source_digest.py: the sources this ops library was built from.\n"
                    "namespace sidco_torch {\n"
                    f"extern const char ops_source_digest[] = \"0x{value}\";\n"
                    "}  // namespace sidco_torch\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
