#!/usr/bin/python3
"""Argument errors of sidco_torch's Python entry points: each raised in Python as TypeError or
ValueError naming the argument and the value, before TorchScript sees it (no TorchScript
declaration, no error deferred to the first backward). One process, no ranks."""
import sys

import numpy
import torch

import sidco_torch
from checks import expect, failures, report


def same_selection(a, b):
    """Whether two compress results, (indices, values), are the same bits."""
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def main():
    expect(lambda: sidco_torch.State(method=3), TypeError, "method", "int 3", "sidco-e")
    expect(lambda: sidco_torch.State(method="sidco"), ValueError, "method", "'sidco'", "top-k")
    expect(lambda: sidco_torch.State(seed="x"), TypeError, "seed", "str 'x'")
    expect(lambda: sidco_torch.State(seed=1.5), TypeError, "seed", "float 1.5")
    expect(lambda: sidco_torch.State(seed=2**60 + 1), ValueError, "seed", str(2**60 + 1), "2^53")
    expect(lambda: sidco_torch.State(sed=1), ValueError, "option 'sed'", "seed")
    expect(lambda: sidco_torch.State(feedback="no"), TypeError, "feedback", "str 'no'")
    expect(lambda: sidco_torch.State(feedback=1), TypeError, "feedback", "int 1")
    expect(lambda: sidco_torch.State(process_group="gloo"), TypeError, "process_group", "str 'gloo'")
    expect(lambda: sidco_torch.State(density="0.01"), TypeError, "density", "str '0.01'")
    expect(lambda: sidco_torch.State(density=0), ValueError, "density = 0")
    expect(lambda: sidco_torch.register(torch.nn.Linear(2, 2), sidco_torch.State()), TypeError, "ddp_model",
           "DistributedDataParallel", "Linear")
    expect(lambda: sidco_torch.Compressor(method=None), TypeError, "method", "NoneType None")
    expect(lambda: sidco_torch.compress(torch.randn(100), 0.1, method="random-k", seed=-1), ValueError, "seed = -1")
    # The one-shot ops: layer sizes, density, size and scale by type, named with their value.
    g = torch.randn(1000)
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=[500.7, 499.3]), TypeError, "sidco_torch.compress",
           "layer_sizes[0]", "float 500.7")
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=[True, 999]), TypeError, "layer_sizes[0]", "bool True")
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=1000), TypeError, "layer_sizes", "sequence", "int 1000")
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=numpy.array([500.0, 500.0])), TypeError, "layer_sizes",
           "shape (2,)", "float64")
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=torch.ones(2, 2, dtype=torch.int64)), TypeError,
           "layer_sizes", "shape (2, 2)")
    expect(lambda: sidco_torch.compress(g, 0.01, layer_sizes=[500, -5, 505]), ValueError, "size -5 of layer 1")
    expect(lambda: sidco_torch.compress(g, "0.01"), TypeError, "density", "str '0.01'")
    expect(lambda: sidco_torch.compress(g, True), TypeError, "density", "bool True")
    # The argument by the name the caller gave it (the C++ says delta).
    expect(lambda: sidco_torch.compress(g, 1.5), ValueError, "sidco_torch.compress: density = 1.5 is outside (0, 1]")
    expect(lambda: sidco_torch.Compressor().compress(g, float("nan")), ValueError, "density = nan")
    indices, values = sidco_torch.compress(g, 0.01)
    expect(lambda: sidco_torch.decompress(indices, values, 1000.0), TypeError, "sidco_torch.decompress", "size",
           "float 1000.0")
    expect(lambda: sidco_torch.decompress(indices, values, -1), ValueError, "size = -1")
    expect(lambda: sidco_torch.scatter_add_(torch.zeros(1000), indices, values, "2"), TypeError, "scale", "str '2'")
    # Tensors where tensors go, said in Python (not TorchScript's "Expected a value of type").
    expect(lambda: sidco_torch.compress([1.0, 2.0], 0.5), TypeError, "sidco_torch.compress", "gradient",
           "torch.Tensor", "got list")
    expect(lambda: sidco_torch.compress(numpy.ones(4, dtype=numpy.float32), 0.5), TypeError, "gradient", "ndarray",
           "torch.from_numpy")
    expect(lambda: sidco_torch.compress(g, 0.01, residual=[0.0] * 1000), TypeError, "residual", "got list")
    expect(lambda: sidco_torch.decompress([1], values, 3), TypeError, "sidco_torch.decompress", "indices", "list")
    expect(lambda: sidco_torch.scatter_add_(numpy.zeros(1000), indices, values), TypeError,
           "sidco_torch.scatter_add_", "dense", "ndarray")
    # Layer sizes as numpy or torch integers give the list's selection.
    listed = sidco_torch.compress(g, 0.01, layer_sizes=[500, 500])
    for sizes in (numpy.array([500, 500]), torch.tensor([500, 500]), [numpy.int64(500), torch.tensor(500)]):
        if not same_selection(sidco_torch.compress(g, 0.01, layer_sizes=sizes), listed):
            failures.append(f"layer_sizes={sizes!r} selected otherwise than [500, 500]")
    if not torch.equal(sidco_torch.decompress(indices, values, numpy.int64(1000)),
                       sidco_torch.decompress(indices, values, 1000)):
        failures.append("decompress with a numpy size differs")
    # A negative index is named as given, not as 2^64 - 1.
    expect(lambda: sidco_torch.decompress(torch.tensor([3, -1]), torch.ones(2), 10), ValueError,
           "index -1 at position 1", "dense size 10")
    expect(lambda: sidco_torch.scatter_add_(torch.zeros(10), torch.tensor([-7]), torch.ones(1)), ValueError,
           "index -7 at position 0")
    # A view is compressed in its flattened order (a transposed weight's gradient); the residual,
    # written in place, must be contiguous.
    weight = torch.randn(300, 200)
    for view in (weight.t(), weight[:, ::2]):
        if not same_selection(sidco_torch.compress(view, 0.01), sidco_torch.compress(view.contiguous(), 0.01)):
            failures.append(f"a view of strides {view.stride()} selected otherwise than its contiguous copy")
    expect(lambda: sidco_torch.compress(weight, 0.01, residual=torch.zeros(200, 300).t()), ValueError, "residual",
           "not contiguous")
    # What is right still works: a seed the double holds exactly, and Random-k gives the same
    # selection for the same seed.
    a = sidco_torch.compress(torch.arange(100.0), 0.1, method="random-k", seed=2**53 - 1)[0]
    b = sidco_torch.compress(torch.arange(100.0), 0.1, method="random-k", seed=2**53 - 1)[0]
    if not torch.equal(a, b):
        failures.append("random-k with one seed gave two selections")
    sidco_torch.State(method="top-k", feedback=False, seed=7)
    return report("argument checks")


if __name__ == "__main__":
    sys.exit(main())
