#!/usr/bin/python3
"""Plots and tabulates the language-model runs of scripts/lm_runs.sh.

usage: scripts/plot_lm.py RUN_DIR OUT_DIR
Writes OUT_DIR/lm_perplexity.png (test perplexity against step and against wall time),
OUT_DIR/lm_density.png (achieved / target density over the steps: the SIDCo paper's
estimation figure) and prints the table of docs/RESULTS.md (markdown)."""
import csv
import glob
import os
import sys


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in r:
            r[k] = float(r[k]) if r[k] != "" else None
    return rows


def label(name):
    return name.replace("-0.01", " δ=0.01").replace("-0.001", " δ=0.001")


def main():
    run_dir, out_dir = sys.argv[1], sys.argv[2]
    runs = {os.path.basename(p)[:-4]: load(p) for p in sorted(glob.glob(os.path.join(run_dir, "*.csv")))
            if not p.endswith(".tmp.csv")}
    order = ["none", "powersgd"] + [f"{m}-{d}" for d in ("0.01", "0.001")
                                     for m in ("sidco-e", "sidco-gp", "top-k", "dgc", "random-k")]
    names = [n for n in order if n in runs]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"none": "k", "powersgd": "tab:gray", "sidco-e": "tab:blue", "sidco-gp": "tab:cyan",
              "top-k": "tab:red", "dgc": "tab:green", "random-k": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for n in names:
        method = n.rsplit("-0.", 1)[0]
        style = "--" if n.endswith("0.001") else "-"
        points = [(r["step"], r["wall_seconds"], r["test_perplexity"]) for r in runs[n] if r["test_perplexity"]]
        axes[0].plot([p[0] for p in points], [p[2] for p in points], style, color=colors[method], label=label(n))
        axes[1].plot([p[1] for p in points], [p[2] for p in points], style, color=colors[method], label=label(n))
    axes[0].set(xlabel="step", ylabel="test perplexity", yscale="log", title="WikiText-2, 2-layer LSTM, 2 ranks")
    axes[1].set(xlabel="wall time (s)", ylabel="test perplexity", yscale="log", title="against wall time")
    for ax in axes:
        ax.set_ylim(top=2000)  # Random-k starts far above the others
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "lm_perplexity.png"), dpi=100)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, density in zip(axes, ("0.01", "0.001")):
        for n in names:
            if not n.endswith("-" + density):
                continue
            method = n.rsplit("-0.", 1)[0]
            rows = [r for r in runs[n] if r["density"] < 1]
            ax.plot([r["step"] for r in rows], [r["density"] / float(density) for r in rows], color=colors[method],
                    label=method, linewidth=0.6, alpha=0.8)
            # The running mean over 50 steps: what the closed loop holds at the target.
            values = [r["density"] / float(density) for r in rows]
            mean = [sum(values[max(0, i - 49): i + 1]) / len(values[max(0, i - 49): i + 1]) for i in range(len(values))]
            if method.startswith("sidco"):
                ax.plot([r["step"] for r in rows], mean, color=colors[method], linewidth=2, label=f"{method}, 50-step mean")
        ax.axhline(1.0, color="k", linewidth=0.6)
        ax.set(xlabel="step", title=f"achieved / target density, δ = {density}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set(ylabel="achieved / target")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "lm_density.png"), dpi=100)

    print("| method | δ | final test perplexity | wall time (s) | time per step (s) | MB sent per step and rank |"
          " achieved / target density, last 100 steps (mean) | compress (ms/step) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        rows = runs[n]
        last = rows[-1]
        final = [r["test_perplexity"] for r in rows if r["test_perplexity"]][-1]
        warm = [r for r in rows if r["step"] > 2]
        per_step = sum(r["step_seconds"] for r in warm) / len(warm)
        sent = sum(r["bytes_sent"] for r in warm) / len(warm) / 1e6
        method, _, density = n.partition("-0.")
        density = "0." + density if density else "—"
        if n in ("none", "powersgd"):
            method, ratio = n, "—"
        else:
            method = n[: -len(density) - 1]
            tail = [r["density"] / float(density) for r in rows[-100:]]
            ratio = f"{sum(tail) / len(tail):.3f}"
        compress = sum(r["compress_seconds"] for r in warm) / len(warm) * 1e3
        print(f"| {method} | {density} | {final:.1f} | {last['wall_seconds']:.0f} | {per_step:.3f} | {sent:.2f} |"
              f" {ratio} | {compress:.1f} |")


if __name__ == "__main__":
    main()
