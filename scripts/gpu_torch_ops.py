#!/usr/bin/env python3
"""Builds sidco_torch's ops library (CPU and CUDA ops) against this interpreter's torch without
meson, with torch.utils.cpp_extension (nvcc and ninja): the GPU check's way of meeting the
torch users have. Usage: gpu_torch_ops.py BOOST_INCLUDE BUILD_DIR [--cpu]; --cpu leaves the
CUDA ops out (a CPU-only torch). Prints the library's path on its last line."""
import glob
import os
import subprocess
import sys

from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "python", "sidco_torch", "csrc")


def main(boost_include, build_dir, cpu_only=False):
    os.makedirs(build_dir, exist_ok=True)
    # The digest the ops compare an extension's against (source_digest.cpp), as meson writes it.
    digest_cpp = os.path.join(build_dir, "source_digest.cpp")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "source_digest.py"), "--root", ROOT,
                    "--output", os.path.join(build_dir, "source_digest.py"), "--cpp", digest_cpp], check=True)
    # Sorted: library.cpp links last, as it did when the load-order bug showed (kept as a check).
    ops = sorted(glob.glob(os.path.join(CSRC, "*.cpp")) + glob.glob(os.path.join(CSRC, "cpu", "*.cpp")) +
                 ([] if cpu_only else glob.glob(os.path.join(CSRC, "cuda", "*.cu"))))
    sources = [digest_cpp] + ops
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    # A compiler that links its C++ runtime statically (the H100 machine's /opt/gcc) puts a
    # second libstdc++ into the library; exported, its symbols mix with the one the process
    # loaded, and the first number formatted into an error message crashed (2026-11-26). Kept
    # private, the copy is self-contained. Harmless where libstdc++ is linked dynamically.
    ldflags = ["-fopenmp", "-Wl,--exclude-libs,ALL"]
    cpp_extension.load(
        name="sidco_torch_ops", sources=sources, build_directory=build_dir, is_python_module=False, verbose=True,
        extra_include_paths=[os.path.join(ROOT, "include"), os.path.abspath(boost_include)],
        extra_cflags=["-std=c++20", "-O2", "-fopenmp"], extra_ldflags=ldflags,
        extra_cuda_cflags=["-std=c++20", "-O2"], with_cuda=not cpu_only)
    print(os.path.join(build_dir, "sidco_torch_ops.so"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--cpu" in sys.argv[3:])
