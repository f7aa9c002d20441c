#!/usr/bin/python3
"""Builds examples/torch_extension.cpp (compressors composed from sidco's policies in an
extension of one's own) with torch.utils.cpp_extension and sidco_torch.extension_args(), and
runs it with error feedback on a bundled real gradient:

  PYTHONPATH=build/python /usr/bin/python3 examples/torch_extension.py
  /usr/bin/python3 examples/torch_extension.py --gradient G.npy --density 0.001   # pip-installed sidco_torch

It compresses the gradient several times with SIDCo-E from the extension and with
sidco_torch's own "sidco-e" side by side (same indices, values and residual, bit for bit),
then with the extension's gamma / generalized-Pareto composition, which it then adds as a
method ("gamma-gp-two-stages") and compresses per layer through sidco_torch.Compressor, as
State(method="gamma-gp-two-stages") would in the DDP hook. The first build takes about 30 s;
torch caches it (TORCH_EXTENSIONS_DIR).
"""
import json
import argparse
import os

import numpy
import torch
from torch.utils import cpp_extension

import example_cli

sidco_torch = example_cli.import_sidco_torch(__file__)

HERE = os.path.dirname(os.path.abspath(__file__))


def build(verbose=False):
    """Compiles and loads the extension: torch.classes.my_sidco.SidcoE and .GammaGPTwoStages."""
    cpp_extension.load(name="my_sidco", sources=[os.path.join(HERE, "torch_extension.cpp")],
                       is_python_module=False, verbose=verbose, **sidco_torch.extension_args())
    return torch.classes.my_sidco


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradient", default=os.path.join(HERE, "data", "gradients", "lstm_it10.npy"))
    parser.add_argument("--density", type=example_cli.density, default=0.01)
    parser.add_argument("--calls", type=example_cli.count, default=5)
    parser.add_argument("--verbose", action="store_true", help="show the compiler's command lines")
    args = parser.parse_args()

    classes = build(args.verbose)
    gradient = torch.from_numpy(numpy.load(args.gradient).astype(numpy.float32).ravel())
    mine, theirs = classes.SidcoE(), sidco_torch.Compressor("sidco-e")
    my_residual, their_residual = torch.zeros_like(gradient), torch.zeros_like(gradient)
    for call in range(args.calls):
        indices, values = mine.compress(gradient, args.density, my_residual)
        expected = theirs.compress(gradient, args.density, residual=their_residual)
        same = (torch.equal(indices, expected[0]) and torch.equal(values, expected[1])
                and torch.equal(my_residual, their_residual))
        print(f"call {call}: SidcoE kept {indices.numel()} of {gradient.numel()} "
              f"({indices.numel() / gradient.numel() / args.density:.3f}x the target), threshold "
              f"{mine.threshold():.6g}; sidco_torch's sidco-e {'the same bits' if same else 'DIFFERS'}")
        if not same:
            raise SystemExit("the extension's SIDCo-E differs from sidco_torch's sidco-e")
    composed = classes.GammaGPTwoStages()
    residual = torch.zeros_like(gradient)
    for call in range(args.calls):
        indices, values = composed.compress(gradient, args.density, residual)
        print(f"call {call}: GammaGPTwoStages kept {indices.numel()} "
              f"({indices.numel() / gradient.numel() / args.density:.3f}x the target), "
              f"threshold {composed.threshold():.6g}, {composed.stages()} stages")

    # Added as methods, the compositions go wherever sidco_torch takes a method name.
    if "gamma-gp-two-stages" not in sidco_torch.methods():
        torch.ops.my_sidco.add_methods()
    manifest = os.path.join(os.path.dirname(args.gradient), "manifest.json")
    layers = []
    if os.path.exists(manifest):
        with open(manifest) as f:
            layers = [layer["size"] for layer in json.load(f).get(os.path.basename(args.gradient), {}).get("layers", [])]
    added = sidco_torch.Compressor("gamma-gp-two-stages")
    residual = torch.zeros_like(gradient)
    for call in range(args.calls):
        indices, _ = added.compress(gradient, args.density, layers, residual)
        print(f"call {call}: method gamma-gp-two-stages over {len(layers) or 'no'} layers kept {indices.numel()} "
              f"({indices.numel() / gradient.numel() / args.density:.3f}x the target)")


if __name__ == "__main__":
    main()
