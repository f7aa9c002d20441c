#!/usr/bin/env python3
"""Writes the seed corpus of compress_fuzz: one input per method with ordinary values, whole
and per layer, and a few with NaN, infinities, denormals, signed zeros, a residual and raw
density bits. Layout: method byte, flags byte (1 feedback, 2 residual follows, 0x40 per layer,
0x80 raw density bits), 4 density bytes; per layer, a byte (layers 1 + its low 3 bits, 8: each
layer at the density) and a weight byte per layer; then float32 values."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
os.makedirs(out, exist_ok=True)
ordinary = [0.0, -0.0, 1e-3, -2e-3, 5e-4, 0.0, 3e-2, -1e-5, 7e-4, 0.0, -4e-3, 2e-3] * 8
special = [float("nan"), float("inf"), -float("inf"), 1e-45, -1e-45, 3.4e38, -3.4e38, 0.0, -0.0, 1.0]


def seed(name, method, flags, density_bits, values, layers=b""):
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([method, flags]) + struct.pack("<I", density_bits) + layers)
        f.write(struct.pack(f"<{len(values)}f", *values))


# The 19 methods of sidco::methods::table, then Top-k on the serial backend.
for method in range(20):
    seed(f"method{method:02d}", method, 0, 10000, ordinary)          # delta = 0.01
    seed(f"method{method:02d}_feedback", method, 3, 250000, ordinary + ordinary)
    # Per layer, with feedback: three layers sharing delta = 0.05.
    seed(f"method{method:02d}_layers", method, 0x41, 50000, ordinary * 2, bytes([2, 10, 200, 40]))
seed("special", 0, 0, 500000, special * 4)
seed("special_topk", 7, 1, 100000, special * 4)
seed("raw_density_nan", 5, 0x80, 0x7FC00000, ordinary)
seed("raw_density_2", 2, 0x80, struct.unpack("<I", struct.pack("<f", 2.0))[0], ordinary)
seed("single_value", 8, 1, 1000000, [0.5])
# Regression: a valid density of 2.3e-38 made DGC's sample size overflow size_t.
seed("dgc_tiny_density", 9, 0x80, 0x00F00000, ordinary)
# Regression: SIDCo-Gamma-GP per layer (three layers, each at delta = 0.229321), feedback, its
# second call: the adaptive stages' count converted an infinity to int (undefined).
seed("stage_count_infinite", 2, 0x41, 229321,
     [1.2123978600438442e-25, 902313672704.0, 5.760337441201262e+28, 24512036.0, 1.582635618709758e-19,
      2.996481448410523e+32, 1.8470187487645655e+31, 7.587845151046301e+31, 7.0993110946776935e+28,
      0.0016496798489242792, 2.9964779667041625e+32, 1.8470187487645655e+31, 2.070437209123291e-19,
      1.740823388753387e+25, 1.6852665712204187e+22], bytes([0x0A, 32, 118, 97]))
