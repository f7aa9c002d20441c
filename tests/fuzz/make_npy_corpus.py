#!/usr/bin/env python3
"""Writes the seed corpus of npy_fuzz: valid float32 and float64 files, and the hostile
headers of the reader's regression test (a size claimed beyond the data, 10^30, negative,
not a tuple, duplicate keys, unbalanced, a 0xFFFFFFF0 header length)."""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "npy_corpus")
os.makedirs(out, exist_ok=True)


def npy(name, header, payload=b"", version=1, length=None):
    header = header.encode()
    prefix = 10 if version == 1 else 12
    header += b" " * ((64 - (prefix + len(header) + 1) % 64) % 64) + b"\n"
    size = struct.pack("<H" if version == 1 else "<I", len(header) if length is None else length)
    with open(os.path.join(out, name), "wb") as f:
        f.write(b"\x93NUMPY" + bytes([version, 0]) + size + header + payload)


f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
npy("valid_f4", f4 % "(3,)", struct.pack("<3f", 1.5, -2, 0))
npy("valid_f8", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", struct.pack("<2d", 0.25, 1e300), 2)
npy("claims_1e9", f4 % "(1000000000,)", struct.pack("<2f", 1, 2))
npy("claims_1e30", f4 % "(1000000000000000000000000000000,)")
npy("negative", f4 % "(-10,)", struct.pack("<f", 1))
npy("not_a_tuple", f4 % "(10)", struct.pack("<f", 1))
npy("duplicate_key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", struct.pack("<f", 1))
npy("unbalanced", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,, ", struct.pack("<f", 1))
npy("huge_header_length", "{}", version=2, length=0xFFFFFFF0)
npy("zero_values", f4 % "(0,)")
