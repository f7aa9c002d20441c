#!/usr/bin/env python3
"""Writes the seed corpus of compress_fuzz: one input per method with ordinary values, and a
few with NaN, infinities, denormals, signed zeros, a residual and raw density bits.
Layout: method byte, flags byte (1 feedback, 2 residual follows, 0x80 raw density bits),
4 density bytes, then float32 values."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
os.makedirs(out, exist_ok=True)
ordinary = [0.0, -0.0, 1e-3, -2e-3, 5e-4, 0.0, 3e-2, -1e-5, 7e-4, 0.0, -4e-3, 2e-3] * 8
special = [float("nan"), float("inf"), -float("inf"), 1e-45, -1e-45, 3.4e38, -3.4e38, 0.0, -0.0, 1.0]


def seed(name, method, flags, density_bits, values):
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([method, flags]) + struct.pack("<I", density_bits))
        f.write(struct.pack(f"<{len(values)}f", *values))


for method in range(14):
    seed(f"method{method:02d}", method, 0, 10000, ordinary)          # delta = 0.01
    seed(f"method{method:02d}_feedback", method, 3, 250000, ordinary + ordinary)
seed("special", 0, 0, 500000, special * 4)
seed("special_topk", 7, 1, 100000, special * 4)
seed("raw_density_nan", 5, 0x80, 0x7FC00000, ordinary)
seed("raw_density_2", 2, 0x80, struct.unpack("<I", struct.pack("<f", 2.0))[0], ordinary)
seed("single_value", 8, 1, 1000000, [0.5])
# Regression: a valid density of 2.3e-38 made DGC's sample size overflow size_t.
seed("dgc_tiny_density", 9, 0x80, 0x00F00000, ordinary)
