"""Run by install_test.sh with an installed sidco_torch: it must come from VENV (argv[1]),
compress exactly, carry a sparse DDP step over 2 gloo ranks, hold the source's headers and
name the source's digest;
with --extension, an extension of one's own builds on them (examples/torch_extension.py) and
gives the package's bits."""
import filecmp
import os
import subprocess
import sys

import torch

import sidco_torch
from ranks import run_ranks, sparse_ddp_step

VENV = os.path.realpath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_headers():
    """include_dir() is the package's own copy of include/sidco, every file the same bytes."""
    installed = os.path.join(sidco_torch.include_dir(), "sidco")
    assert os.path.realpath(installed).startswith(VENV + os.sep), f"headers from {installed}, not from {VENV}"
    source = os.path.join(ROOT, "include", "sidco")
    files = sorted(os.path.relpath(os.path.join(d, f), source) for d, _, names in os.walk(source) for f in names)
    copies = sorted(os.path.relpath(os.path.join(d, f), installed) for d, _, names in os.walk(installed) for f in names)
    assert files == copies, f"installed headers differ in their names: {sorted(set(files) ^ set(copies))}"
    _, mismatch, errors = filecmp.cmpfiles(source, installed, files, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    # And what an extension includes to add methods of its own.
    added = ["added_methods.hpp", "engine.hpp"]
    _, mismatch, errors = filecmp.cmpfiles(os.path.join(ROOT, "python", "sidco_torch", "csrc"),
                                           os.path.join(sidco_torch.include_dir(), "sidco_torch", "csrc"), added,
                                           shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    return len(files) + len(added)


def main():
    where = os.path.realpath(sidco_torch.__file__)
    assert where.startswith(VENV + os.sep), f"sidco_torch imported from {where}, not from {VENV}"
    assert os.path.realpath(sidco_torch.library_path).startswith(os.path.dirname(where)), sidco_torch.library_path
    # Built portable (pyproject.toml: -Dnative=false): the kernels must be the best Highway
    # target this x86 CPU has, chosen at run time.
    kernels = sidco_torch.cpu_kernels()
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    if flags:
        if {"avx512f", "avx512vl", "avx512dq", "avx512bw"} <= flags:
            best = "AVX3"
        elif {"avx2", "fma", "bmi2"} <= flags:
            best = "AVX2"
        elif "sse4_2" in flags:
            best = "SSE4"
        else:
            best = "SSSE3" if "ssse3" in flags else "portable"
        assert best in kernels, f"portable build runs {kernels!r}; this CPU's best target is {best}"
    # Top-k is exact: the same set as torch.topk on |x|.
    x = torch.randn(10000, generator=torch.Generator().manual_seed(3))
    indices, values = sidco_torch.compress(x, 0.01, method="top-k")
    expected = torch.topk(x.abs(), 100).indices.sort().values
    assert torch.equal(indices.sort().values, expected), "top-k differs from torch.topk"
    assert torch.equal(values, x[indices])
    headers = check_headers()
    # The installed build names the same sources as the tree it came from (and so agrees with
    # a development build of that tree, or another machine's install of it).
    from sidco_torch.source_digest import DIGEST
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import source_digest
    assert DIGEST == source_digest.tree_digest(ROOT)[0], DIGEST
    if "--extension" in sys.argv[2:]:
        # The example prints each call and exits non-zero when its SIDCo-E differs from the package's.
        # CXX names pip's compiler, which may be a launcher and a compiler ("ccache c++"):
        # torch.utils.cpp_extension runs CXX as one program, so it gets its default.
        env = {k: v for k, v in os.environ.items() if k != "CXX"}
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "torch_extension.py"), "--calls", "2"],
                       check=True, env=env)
    results = run_ranks(sparse_ddp_step)
    for rank, same, paths, nonzero, size in results:
        assert same, f"rank {rank}: the averaged gradients differ between ranks"
        assert paths == {"sparse (allgather)"}, f"rank {rank}: bucket paths {paths}"
        assert 0 < nonzero < size, (rank, nonzero, size)
    print(f"sidco_torch from {os.path.dirname(where)} ({kernels}): top-k exact, a 2-rank sparse DDP step "
          f"({results[0][3]} of {results[0][4]} values averaged), {headers} headers")


if __name__ == "__main__":
    main()
