#!/usr/bin/python3
"""The table of scripts/lm_exchange_runs.sh: per run the last test perplexity, its ratio to
the same seed's SIDCo-E all-gather and exact Top-k runs, and for the reduce exchange the p5/p50/p95 of the per-step global density over the
target (the density of the update every rank applied).

  /usr/bin/python3 scripts/lm_exchange_table.py build/lm-exchange
"""
import csv
import glob
import os
import re
import sys


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def main(directory, target=0.01):
    runs = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.csv"))):
        match = re.fullmatch(r"(.+)-(\d+)\.csv", os.path.basename(path))
        if not match or ".tmp" in path:
            continue
        with open(path) as f:
            rows = list(csv.DictReader(f))
        runs[(match.group(1), int(match.group(2)))] = rows
    if not runs:
        print(f"lm_exchange_table: no runs in {directory}", file=sys.stderr)
        return 1
    print("| run | seed | steps | test perplexity | ÷ SIDCo-E all-gather | ÷ Top-k all-gather | "
          "global density ÷ target p5 / p50 / p95 |")
    print("|---|---|---|---|---|---|---|")
    for (name, seed), rows in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        evaluated = [r for r in rows if r["test_perplexity"]]
        perplexity = float(evaluated[-1]["test_perplexity"])
        ratios = []
        for base in ("sidco-e-allgather", "top-k-allgather"):
            other = runs.get((base, seed))
            if other is None:
                ratios.append("")
                continue
            last = [r for r in other if r["test_perplexity"]][-1]
            ratios.append(f"{perplexity / float(last['test_perplexity']):.3f}")
        sparse = [r for r in rows if r["exchange"] not in ("dense", "")]
        densities = [float(r["global_density"]) / target for r in sparse if r["global_density"]]
        spread = (f"{quantile(densities, 0.05):.2f} / {quantile(densities, 0.5):.2f} / "
                  f"{quantile(densities, 0.95):.2f}") if densities else ""
        print(f"| {name} | {seed} | {rows[-1]['step']} | {perplexity:.1f} | {ratios[0]} | {ratios[1]} | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/lm-exchange"))
