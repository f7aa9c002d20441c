#!/usr/bin/env python3
"""Plots loss and test accuracy per epoch of several train-digits runs into one PNG.

Usage: scripts/plot_training.py out.png run1.csv run2.csv ...
(each CSV from: mpirun -np P build/examples/train-digits --method M --csv runM.csv)"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], sys.argv[2:]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for path in runs:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        if not rows:
            continue
        epochs = [int(r["epoch"]) for r in rows]
        label = f"{rows[0]['method']} (δ={float(rows[0]['target_density']):g}, {rows[0]['ranks']} ranks)"
        loss_ax.plot(epochs, [float(r["train_loss"]) for r in rows], marker="o", label=label)
        acc_ax.plot(epochs, [float(r["test_accuracy"]) for r in rows], marker="o", label=label)
    loss_ax.set(xlabel="epoch", ylabel="training loss", yscale="log", title="Loss")
    acc_ax.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    acc_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
