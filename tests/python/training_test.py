#!/usr/bin/python3
"""A short data-parallel training run with the hook (2 ranks, gloo) reaches a loss within
a stated margin of the uncompressed run: the WikiText-2 LSTM of examples/train_lm.py, 120
steps, SIDCo-E at density 0.01 with error feedback against a dense all-reduce. The margin:
the mean training loss over the last 20 steps at most 3% above the uncompressed run's
(measured: about 2% above). Also checks the hook's achieved density over those steps."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_lm.py")


def run(method, directory):
    path = os.path.join(directory, f"{method}.csv")
    subprocess.run([sys.executable, EXAMPLE, "--method", method, "--density", "0.01", "--ranks", "2",
                    "--steps", "120", "--eval-every", "1000", "--eval-words", "2000", "--csv", path], check=True)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows


def main():
    with tempfile.TemporaryDirectory() as directory:
        dense = run("none", directory)
        sparse = run("sidco-e", directory)
    tail = lambda rows, key: [float(r[key]) for r in rows[-20:]]
    dense_loss = sum(tail(dense, "train_loss")) / 20
    sparse_loss = sum(tail(sparse, "train_loss")) / 20
    density = sum(tail(sparse, "density")) / 20
    print(f"mean training loss over the last 20 of 120 steps: dense {dense_loss:.3f}, "
          f"SIDCo-E at 0.01 {sparse_loss:.3f} ({100 * (sparse_loss / dense_loss - 1):+.1f}%); "
          f"achieved density {density:.4f}")
    if sparse_loss > 1.03 * dense_loss:
        print("SIDCo-E is more than 3% behind the uncompressed run")
        return 1
    if not 0.008 <= density <= 0.0125:
        print(f"achieved density {density} is not near 0.01")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
