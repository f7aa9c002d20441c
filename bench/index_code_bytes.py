#!/usr/bin/python3
"""Bytes per index of the compact coding's two index codes (LEB128 gaps and Elias-Fano, the
shorter one sent: include/sidco/comm/compact.hpp) against Stream VByte (Lemire, Kurz, Rupp
2018; Debian's libstreamvbyte: a 2-bit length per integer, then 1-4 bytes), on the bundled
real gradients' Top-k selections at three densities. Stream VByte is the SIMD codec the
issue names; this is the measurement behind not adopting it: on every gradient and density
its code is longer than the shorter of ours.

    /usr/bin/python3 bench/index_code_bytes.py [GRADIENT.npy ...]

Counts follow each format's definition (the library's own figures come from the wire in
scripts/exchange_bytes.sh and scripts/mpi_exchange_bytes.sh); Stream VByte codes the gaps
(index minus the one before, less one), which favours it."""
import glob
import math
import os
import sys

import numpy as np


def leb128_bytes(gaps):
    return int(np.where(gaps < 1 << 7, 1, np.where(gaps < 1 << 14, 2, np.where(gaps < 1 << 21, 3, 4))).sum())


def elias_fano_bytes(count, dense_size):
    low = int(math.floor(math.log2(dense_size // count))) if dense_size // count > 0 else 0
    return (count * low + 7) // 8 + (count + ((dense_size - 1) >> low) + 1 + 7) // 8


def stream_vbyte_bytes(gaps):
    data = np.where(gaps < 1 << 8, 1, np.where(gaps < 1 << 16, 2, np.where(gaps < 1 << 24, 3, 4))).sum()
    return int(data) + (len(gaps) + 3) // 4  # the control bytes: 2 bits an integer


def main(files):
    files = files or sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "examples", "data", "gradients",
                                                   "*.npy")))
    print("| gradient | values | density | LEB128 gaps | Elias-Fano | ours (shorter) | Stream VByte | SVB / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = math.inf
    for path in files:
        g = np.abs(np.load(path).astype(np.float32).ravel())
        n = g.size
        for density in (0.1, 0.01, 0.001):
            k = max(1, int(density * n))
            indices = np.sort(np.argpartition(-g, k - 1)[:k]).astype(np.int64)
            gaps = np.diff(np.concatenate([[-1], indices])) - 1
            leb, ef, svb = leb128_bytes(gaps), elias_fano_bytes(k, n), stream_vbyte_bytes(gaps)
            ours = min(leb, ef)
            worst = min(worst, svb / ours)
            print(f"| {os.path.basename(path)} | {n} | {density} | {leb / k:.3f} | {ef / k:.3f} | {ours / k:.3f} | "
                  f"{svb / k:.3f} | {svb / ours:.2f} |")
    print(f"\nStream VByte's code is at least {worst:.2f}x the shorter of ours on every case above.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
