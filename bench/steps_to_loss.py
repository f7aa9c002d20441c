#!/usr/bin/python3
"""The steps one training run takes to reach another's final train loss, from the CSV
files examples/train_lm.py writes (--csv): the final loss is the mean of the base run's last
--window steps; a run reaches it at the first step whose mean over the --window steps up to it
is no higher. Used for the steps factor of the hook's exchange="auto" on the WikiText-2 LSTM
(docs/RESULTS.md):

  bench/steps_to_loss.py BASE.csv OTHER.csv [OTHER.csv ...]
"""
import argparse
import csv
import sys


def rows(path):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if r.get("train_loss")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("others", nargs="+")
    ap.add_argument("--window", type=int, default=20)
    a = ap.parse_args()
    base = rows(a.base)
    if len(base) < a.window:
        ap.error(f"{a.base} holds {len(base)} steps, fewer than --window {a.window}")
    losses = [float(r["train_loss"]) for r in base]
    target = sum(losses[-a.window:]) / a.window
    print(f"{a.base}: final train loss {target:.4f} (mean of its last {a.window} of {len(base)} steps)")
    base_steps = int(base[-1]["step"])
    for path in a.others:
        run = rows(path)
        loss = [float(r["train_loss"]) for r in run]
        reached = next((s for s in range(a.window - 1, len(loss))
                        if sum(loss[s - a.window + 1:s + 1]) / a.window <= target), None)
        if reached is None:
            print(f"{path}: does not reach it in {len(run)} steps")
            continue
        step = int(run[reached]["step"])
        print(f"{path}: reaches it at step {step} ({step / base_steps:.3f}x the base's {base_steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
