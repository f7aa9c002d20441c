"""An extension of one's own on sidco's headers (examples/torch_extension.cpp), built with
torch.utils.cpp_extension and sidco_torch.extension_args(): its SIDCo-E gives sidco_torch's
"sidco-e" bits on every bundled real gradient, its own composition keeps error feedback exact
and its threshold's cut, bad arguments raise errors that name them and change nothing, and the
methods it adds run in sidco_torch's Compressor and DDP hook (2 gloo ranks, both exchanges)
with the bits of the built-in method they equal, carry their compressor's type and the sources
they were compiled against (refused as they are added by ops built from others); ranks that
added different compressors under one name are refused alike."""
import copy
import ctypes
import json
import os
import shutil
import sys
import tempfile

import numpy
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils import cpp_extension

import sidco_torch
import sidco_torch.ops
import sidco_torch.source_digest
from ranks import first_step_refused, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import torch_extension  # noqa: E402

GRADIENTS = os.environ.get("SIDCO_GRADIENTS_DIR", os.path.join(ROOT, "examples", "data", "gradients"))


def gradients():
    for name in sorted(os.listdir(GRADIENTS)):
        if name.endswith(".npy"):
            yield name, torch.from_numpy(numpy.load(os.path.join(GRADIENTS, name)).astype(numpy.float32).ravel())


def check_arguments():
    args = sidco_torch.extension_args()
    include = args["extra_include_paths"][0]
    assert os.path.samefile(include, os.path.join(ROOT, "include")), include
    assert "-std=c++20" in args["extra_cflags"], args
    # The sources the extension is compiled against, as the number a method it adds carries.
    digest = sidco_torch.source_digest.DIGEST
    assert f"-DSIDCO_TORCH_SOURCE_DIGEST=0x{digest}" in args["extra_cflags"], args
    portable = sidco_torch.extension_args(highway=False)
    assert not any("HWY" in f or "HIGHWAY" in f for f in portable["extra_cflags"]), portable
    assert "-lhwy" not in portable["extra_ldflags"], portable
    try:
        sidco_torch.extension_args(highway="yes")
        raise AssertionError("highway='yes' was accepted")
    except TypeError as e:
        assert "highway = 'yes'" in str(e), e


def check_same_bits(classes):
    """Four calls with error feedback and one without, at two densities, on every gradient."""
    cases = 0
    for name, gradient in gradients():
        for density in (0.01, 0.001):
            mine, theirs = classes.SidcoE(), sidco_torch.Compressor("sidco-e")
            my_residual, their_residual = torch.zeros_like(gradient), torch.zeros_like(gradient)
            for call in range(5):
                feedback = call < 4
                got = mine.compress(gradient, density, my_residual if feedback else None)
                expected = theirs.compress(gradient, density, residual=their_residual if feedback else None)
                where = f"{name}, density {density}, call {call}"
                assert torch.equal(got[0], expected[0]), f"{where}: indices differ"
                assert torch.equal(got[1], expected[1]), f"{where}: values differ"
                assert torch.equal(my_residual, their_residual), f"{where}: residuals differ"
                assert mine.threshold() == theirs.report()["threshold"], where
                cases += 1
    return cases


def check_composition(classes):
    """Gamma / generalized-Pareto, two fixed stages, with error feedback: every value sent
    plus the residual left is the gradient plus the old residual, bit for bit; everything
    sent lies above the threshold and everything kept back at or below it."""
    calls = 0
    for name, gradient in gradients():
        compressor = classes.GammaGPTwoStages()
        residual = torch.zeros_like(gradient)
        density = 0.01
        for call in range(4):
            accumulated = gradient + residual
            indices, values = compressor.compress(gradient, density, residual)
            where = f"{name}, call {call}"
            sent = torch.zeros_like(gradient)
            sent[indices] = values
            assert torch.equal(sent + residual, accumulated), f"{where}: not conserved"
            assert torch.equal(values, accumulated[indices]), f"{where}: values are not the accumulated ones"
            assert bool((indices[1:] > indices[:-1]).all()), f"{where}: indices not ascending"
            threshold = compressor.threshold()
            unsent = torch.ones(gradient.numel(), dtype=torch.bool)
            unsent[indices] = False
            assert float(values.abs().min()) > threshold, where
            assert float(accumulated[unsent].abs().max()) <= threshold, where
            assert compressor.stages() == 2, (where, compressor.stages())
            # A statistical estimate, not an exact count: 4x either way catches a model wired
            # into the wrong slot (one user's ran at 0.01x), while the fits' spread on these
            # gradients is 0.6-1.9x.
            ratio = indices.numel() / gradient.numel() / density
            assert 0.25 <= ratio <= 4, f"{where}: {ratio:.3f}x the target density"
            calls += 1
    return calls


def check_errors(classes):
    """Each bad argument raises an error naming it; the residual stays as it was, and the
    compressor still works afterwards."""
    gradient = torch.randn(10000, generator=torch.Generator().manual_seed(7))
    compressor = classes.SidcoE()
    residual = torch.randn(10000, generator=torch.Generator().manual_seed(8)) * 1e-3
    before = residual.clone()
    bad = [((gradient, 1.5, residual), ValueError, "delta = 1.5"),
           ((gradient, 0.0, residual), ValueError, "delta = 0"),
           ((torch.full((10000,), float("nan")), 0.01, residual), ValueError, "non-finite"),
           ((gradient.double(), 0.01, residual), RuntimeError, "gradient: a contiguous CPU float32"),
           ((gradient, 0.01, torch.zeros(10)), RuntimeError, "residual: 10 values for a gradient of 10000")]
    for args, kind, words in bad:
        try:
            compressor.compress(*args)
            raise AssertionError(f"{words}: no error")
        except kind as e:
            assert words in str(e), (words, str(e))
        assert torch.equal(residual, before), f"{words}: the residual changed"
    indices, values = compressor.compress(gradient, 0.01, residual)
    assert indices.numel() > 0 and torch.equal(values, (gradient + before)[indices])


def check_origins():
    """What each added method is: its compressor's type (the extension's two differ) and this
    build's source digest, from the flag extension_args() gave the compiler."""
    digest = sidco_torch.source_digest.DIGEST
    sidco_e, sidco_e_digest = sidco_torch.ops._method_origin("my-sidco-e")
    gamma_gp, gamma_gp_digest = sidco_torch.ops._method_origin("gamma-gp-two-stages")
    assert sidco_e_digest == gamma_gp_digest == digest, (sidco_e_digest, gamma_gp_digest, digest)
    assert sidco_e.startswith("sidco::compressor<") and "exponential" in sidco_e, sidco_e
    assert gamma_gp.startswith("sidco::compressor<") and "gamma" in gamma_gp and "pareto" in gamma_gp, gamma_gp
    assert sidco_torch.ops._method_origin("sidco-e") == ("", ""), "a built-in method has an origin"


# A small extension that adds SIDCo-E on the serial backend under the name it is given.
SMALL_EXTENSION = r"""
#include <string>

#include <sidco/presets.hpp>
#include <sidco_torch/csrc/added_methods.hpp>

// What add_method raised ("" when it added the method).
extern "C" const char* add_serial_sidco_e(const char* name) {
  static std::string raised;
  try {
    sidco_torch::add_method<sidco::presets::sidco_e<sidco::backend::serial>>(name, "SIDCo-E, serial");
    raised.clear();
  } catch (const sidco::error& e) {
    raised = e.what();
  }
  return raised.c_str();
}
"""
DIGEST_FLAG = "-DSIDCO_TORCH_SOURCE_DIGEST=0x"


def add_from_small_extension(scratch, build, name, digest_flag):
    """Builds SMALL_EXTENSION as `build`, with extension_args()' flags and digest_flag in place
    of their digest flag (None: left out), and adds `name` from it; gives what add_method raised."""
    args = sidco_torch.extension_args(highway=False)
    flags = [f for f in args["extra_cflags"] if not f.startswith(DIGEST_FLAG)]
    assert len(flags) == len(args["extra_cflags"]) - 1, args
    args["extra_cflags"] = flags + ([digest_flag] if digest_flag else [])
    source = os.path.join(scratch, "small_extension.cpp")
    with open(source, "w") as f:
        f.write(SMALL_EXTENSION)
    cpp_extension.load(name=build, sources=[source], is_python_module=False, **args)
    small = ctypes.CDLL(os.path.join(scratch, build, f"{build}.so"))
    small.add_serial_sidco_e.restype = ctypes.c_char_p
    return small.add_serial_sidco_e(name.encode()).decode()


def check_stale_extension(scratch):
    """A method from an extension compiled against another digest (as a setup.py build left
    from before an upgrade would be) is refused as it is added, before the ops read what it
    hands over (its layout is the other headers'), and nothing is added."""
    digest = sidco_torch.source_digest.DIGEST
    other = "0" * 64 if digest != "0" * 64 else "1" * 64
    raised = add_from_small_extension(scratch, "stale_sidco", "stale-sidco-e", DIGEST_FLAG + other)
    expected = (f"sidco: add_method: method 'stale-sidco-e' comes from an extension compiled against other "
                f"sidco_torch sources (source digest 0x{other[:15]}...) than these ops' (0x{digest[:15]}...): "
                "rebuild the extension with sidco_torch.extension_args()")
    assert raised == expected, f"a method compiled against other sources: {raised or 'added'}"
    assert "stale-sidco-e" not in sidco_torch.methods(), "a refused method was added"


def check_unflagged_extension(scratch):
    """An extension compiled without the digest flag: nothing to compare, so its method is
    added, carries no digest, and runs in sidco_torch.Compressor."""
    raised = add_from_small_extension(scratch, "unflagged_sidco", "unflagged-sidco-e", None)
    assert raised == "", f"a method compiled without the digest flag was refused: {raised}"
    composition, built_against = sidco_torch.ops._method_origin("unflagged-sidco-e")
    assert "sidco::backend::basic_serial" in composition and built_against == "", (composition, built_against)
    gradient = dict(gradients())["lstm_it10.npy"]
    indices, values = sidco_torch.Compressor("unflagged-sidco-e").compress(gradient, 0.01)
    kept = torch.ones_like(gradient, dtype=torch.bool)
    kept[indices] = False
    assert indices.numel() > 0 and torch.equal(values, gradient[indices]), "the values sent are not the gradient's"
    assert values.abs().min() >= gradient[kept].abs().max(), "a value kept back is larger than one sent"


def check_added_methods(classes):
    """The methods the extension adds: refused before it adds them, then taken by
    sidco_torch.Compressor with the bits of the compressor they were made from (whole and per
    layer, every element type, with error feedback); a name is added once."""
    try:
        sidco_torch.Compressor("my-sidco-e")
        raise AssertionError("an unknown method was accepted")
    except ValueError as e:
        assert "method 'my-sidco-e' is not one of" in str(e), e
    for names, words in ((("sidco-gp", "x"), "add_method: name 'sidco-gp' is a built-in method's"),
                         (("", "x"), "add_method: name '' is not 1 to 64 letters"),
                         (("my sidco", "x"), "add_method: name 'my sidco' is not 1 to 64 letters"),
                         (("m" * 65, "x"), "is not 1 to 64 letters")):
        try:
            torch.ops.my_sidco.add_methods(*names)
            raise AssertionError(f"{names}: added")
        except ValueError as e:
            assert words in str(e), (words, str(e))
    assert sidco_torch.methods() == sidco_torch.METHODS, "a refused name was added"
    torch.ops.my_sidco.add_methods()
    added = {name: description for name, description in sidco_torch.methods().items()
             if name not in sidco_torch.METHODS}
    assert list(added) == ["my-sidco-e", "gamma-gp-two-stages"], added
    check_origins()
    try:
        torch.ops.my_sidco.add_methods()
        raise AssertionError("a method was added twice")
    except ValueError as e:
        assert "add_method: name 'my-sidco-e' was added before" in str(e), e

    with open(os.path.join(GRADIENTS, "manifest.json")) as f:
        layers = [layer["size"] for layer in json.load(f)["lstm_it10.npy"]["layers"]]
    gradient = dict(gradients())["lstm_it10.npy"]
    calls = 0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        g = gradient.to(dtype)
        for sizes in ([], layers):
            mine, theirs = sidco_torch.Compressor("my-sidco-e"), sidco_torch.Compressor("sidco-e")
            my_residual, their_residual = torch.zeros_like(g), torch.zeros_like(g)
            for call in range(3):
                got = mine.compress(g, 0.01, sizes, my_residual)
                expected = theirs.compress(g, 0.01, sizes, their_residual)
                where = f"{dtype}, {len(sizes) or 'no'} layers, call {call}"
                assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), where
                assert torch.equal(my_residual, their_residual), where
                assert mine.report() == theirs.report(), where
                calls += 1
            # An added method's state saves and loads like a built-in one's: a copy continues alike.
            copied, copied_residual = copy.deepcopy(mine), my_residual.clone()
            got, again = mine.compress(g, 0.01, sizes, my_residual), copied.compress(g, 0.01, sizes, copied_residual)
            where = f"{dtype}, {len(sizes) or 'no'} layers, a copy"
            assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]), where
            assert torch.equal(my_residual, copied_residual) and mine.report() == copied.report(), where
    # The added name runs the extension's own composition.
    added, direct = sidco_torch.Compressor("gamma-gp-two-stages"), classes.GammaGPTwoStages()
    for call in range(3):
        got = added.compress(gradient, 0.01)
        expected = direct.compress(gradient, 0.01, None)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), f"gamma-gp call {call}"
        assert added.report()["stages"] == 2
        calls += 1
    return calls


def hook_steps(rank, port, out, exchange):
    """For run_ranks: four DDP steps with the hook, once with "sidco-e" and once with
    "my-sidco-e" from the same start; puts (rank, whether each step's averaged gradients are
    the same bits, the buckets' paths)."""
    torch_extension.build()  # the parent's build, loaded from TORCH_EXTENSIONS_DIR
    torch.ops.my_sidco.add_methods()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    steps, paths = {}, set()
    for method in ("sidco-e", "my-sidco-e"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        ddp = nn.parallel.DistributedDataParallel(model)
        state = sidco_torch.State(method=method, density=0.05, start_iter=0, exchange=exchange)
        sidco_torch.register(ddp, state)
        torch.manual_seed(1 + rank)
        steps[method] = []
        for _ in range(4):
            model.zero_grad()
            ddp(torch.randn(32, 64)).square().mean().backward()
            steps[method].append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        paths |= {f"{s['path']} ({s['exchange']})" for s in state.stats().values()}
    same = all(torch.equal(a, b) for a, b in zip(steps["sidco-e"], steps["my-sidco-e"]))
    out.put((rank, same, sorted(paths)))
    dist.destroy_process_group()


def swapped_methods(rank, port, out):
    """For run_ranks: each rank adds the extension's two compressors under swapped names, so
    that "mine" is SIDCo-E on rank 0 and the gamma/GP composition on rank 1; puts (rank, the
    State's error, whether it is an ExchangeError) after the first step."""
    torch_extension.build()
    torch.ops.my_sidco.add_methods(*(("mine", "theirs") if rank == 0 else ("theirs", "mine")))
    first_step_refused(rank, port, out, ("mine", "mine"))


def check_hook():
    for exchange in ("allgather", "reduce"):
        for rank, same, paths in run_ranks(hook_steps, exchange):
            assert same, f"{exchange}, rank {rank}: my-sidco-e's steps differ from sidco-e's"
            assert paths == [f"sparse ({exchange})"], (exchange, rank, paths)
    # One name, different compressors: refused on every rank alike, before any payload, by
    # their types (each rank's "mine" is the other's "theirs").
    results = run_ranks(swapped_methods)
    sidco_e, gamma_gp = (sidco_torch.ops._method_origin(name)[0] for name in ("my-sidco-e", "gamma-gp-two-stages"))
    expected = f"sidco_torch.State: rank 1 has method's composition {gamma_gp!r}, rank 0 has {sidco_e!r}"
    for rank, error, exchange_error in results:
        assert exchange_error and expected in error, (rank, error)
    assert results[0][1] == results[1][1], results


def main():
    check_arguments()
    scratch = tempfile.mkdtemp(prefix="sidco-extension-")
    try:
        # A fresh directory: torch's cache keys on the sources and flags, not on the headers.
        os.environ["TORCH_EXTENSIONS_DIR"] = scratch
        classes = torch_extension.build()
        check_stale_extension(scratch)
        same = check_same_bits(classes)
        composed = check_composition(classes)
        check_errors(classes)
        added = check_added_methods(classes)
        check_unflagged_extension(scratch)
        check_hook()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"extension: SIDCo-E the same bits as sidco_torch's in {same} calls; "
          f"the gamma/GP composition conserved and cut at its threshold in {composed} calls; errors named; "
          f"its added methods the same bits in {added} Compressor calls and in 4 DDP steps at 2 ranks over "
          "both exchanges; one name for two compressors refused on both ranks")


if __name__ == "__main__":
    main()
