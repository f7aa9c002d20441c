#!/usr/bin/python3
"""The hook's local work per step, as the ops library of each given build does it: a
bucket's encode (SIDCo-E with error feedback into its payload) and the decode of P payloads
into the dense update, on the bundled LSTM gradient tiled to --size values (float32,
δ = --density), with the plain and the compact wire. Each build runs in a process of its
own (one ops library per process), the builds alternating for --rounds rounds; prints the
median ms per call of each build, each round, and the ratios to the first build.

  OMP_NUM_THREADS=2 /usr/bin/python3 bench/ops_speed.py OLD/build/python build/python
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(args):
    """In the child: (wire, op) -> median seconds, printed as lines 'wire op seconds'."""
    import numpy as np
    import torch
    import sidco_torch
    from sidco_torch import ops

    gradient = np.load(os.path.join(ROOT, "examples", "data", "gradients", "lstm_it10.npy")).astype(np.float32)
    gradient = torch.from_numpy(np.resize(gradient, args.size).copy())
    print("kernels", sidco_torch.cpu_kernels(), flush=True)
    for wire in ("plain", "compact"):
        codec = ops._codec("sidco-e", {}, [args.size], torch.float32, args.density, 1.5, wire=wire)
        residual = torch.zeros_like(gradient)
        out = torch.zeros_like(gradient)
        encode, decode = [], []
        for step in range(args.calls + 2):
            start = time.perf_counter()
            payload = torch.ops.sidco.encode(gradient, residual, codec, 0, step)
            middle = time.perf_counter()
            out.zero_()
            torch.ops.sidco.decode([payload] * args.ranks, out, None, codec)
            end = time.perf_counter()
            if step >= 2:  # the first calls size buffers
                encode.append(middle - start)
                decode.append(end - middle)
        print(wire, "encode", statistics.median(encode), flush=True)
        print(wire, "decode", statistics.median(decode), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("python_dirs", nargs="+", help="build/python folders, each holding sidco_torch")
    parser.add_argument("--size", type=int, default=11_300_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--ranks", type=int, default=4, help="payloads each decode reads")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args)
        return
    results = {}  # (dir, wire, op) -> [ms per round]
    for round_index in range(args.rounds):
        for directory in args.python_dirs:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(directory))
            command = [sys.executable, __file__, "--child", "--size", str(args.size), "--density",
                       str(args.density), "--ranks", str(args.ranks), "--calls", str(args.calls), directory]
            lines = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout.splitlines()
            for line in lines:
                fields = line.split()
                if fields[0] == "kernels":
                    print(f"round {round_index + 1}, {directory}: kernels {' '.join(fields[1:])}")
                else:
                    results.setdefault((directory, fields[0], fields[1]), []).append(1e3 * float(fields[2]))
    first = args.python_dirs[0]
    print(f"\nms per call, median of {args.calls}, each round; size {args.size}, density {args.density}, "
          f"{args.ranks} payloads decoded")
    for wire in ("plain", "compact"):
        for op in ("encode", "decode"):
            for directory in args.python_dirs:
                ms = results[(directory, wire, op)]
                ratios = [m / b for m, b in zip(ms, results[(first, wire, op)])]
                print(f"{wire:8} {op:7} {directory:40} " + " ".join(f"{m:8.2f}" for m in ms) +
                      "   x first: " + " ".join(f"{r:5.2f}" for r in ratios))


if __name__ == "__main__":
    main()
