"""Tables and a figure from bench/train_speed.py's JSON lines: per model, ranks and rate,
each method's step time (median over rounds) against the compute-only floor and the other
methods of the same run, and the goals of the hook checked from those ratios; the time to
the target perplexity.

  train_speed.py report build/train-speed/*.jsonl [--png docs/train_speed.png]
"""
import argparse
import json
import statistics
from collections import defaultdict


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    return "—" if v is None else f"{v:.{digits}f}"


def step_tables(rows):
    """One table per (model, ranks, rate): every method's medians and ratios."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("mode") == "step" and "error" not in r:
            groups[(r["model"], r["ranks"], r["rate"])][r["method"]].append(r)
    out, summary = [], {}
    for (model, ranks, rate), methods in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1], rate_order(g[0][2]))):
        m = {name: {k: median(rs, k) for k in ("ms", "floor_ms", "link_bytes", "wire_ms", "compress_ms", "decode_ms",
                                                 "density_p5", "density_p50", "density_p95", "payload_bytes",
                                                 "over_capacity", "parameters")}
             for name, rs in methods.items()}
        summary[(model, ranks, rate)] = m
        params = next(iter(m.values()))["parameters"]
        out.append(f"\n**{model}, {ranks} ranks, {rate}** ({params / 1e6:.1f}M parameters; floor: the same job's "
                   "steps without communication)\n")
        out.append("| method | ms/step | floor ms | × floor | over floor (ms) | MB/step on the link | wire ms | "
                   "compress ms | decode ms | × none | × powersgd | × top-k | density p5/p50/p95 |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, v in m.items():
            floor = v["floor_ms"]
            def ratio(other):
                o = m.get(other, {}).get("ms")
                return fmt(v["ms"] / o, 2) if o and v["ms"] else "—"
            density = "—" if v["density_p50"] is None else \
                f"{v['density_p5']:.2f}/{v['density_p50']:.2f}/{v['density_p95']:.2f}"
            out.append(f"| {name} | {fmt(v['ms'])} | {fmt(floor)} | {fmt(v['ms'] / floor, 2) if floor else '—'} | "
                       f"{fmt(v['ms'] - floor) if floor else '—'} | "
                       f"{fmt(v['link_bytes'] / 1e6 if v['link_bytes'] is not None else None, 2)} | "
                       f"{fmt(v['wire_ms'])} | {fmt(v['compress_ms'], 1)} | {fmt(v['decode_ms'], 1)} | "
                       f"{ratio('none')} | {ratio('powersgd')} | {ratio('top-k')} | {density} |")
    return out, summary


def rate_order(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return 0


def goals(summary, method="sidco-e"):
    """The hook's goals from the step tables' ratios: met or missed, with the numbers."""
    out = ["\n| goal | where | measured | |", "|---|---|---|---|"]

    def line(goal, where, value, ok):
        out.append(f"| {goal} | {where} | {value} | {'met' if ok else '**missed**'} |")

    for (model, ranks, rate), m in sorted(summary.items(), key=lambda g: (g[0][0], g[0][1], rate_order(g[0][2]))):
        s = m.get(method)
        if not s or s["ms"] is None:
            continue
        where = f"{model}, {ranks} ranks, {rate}"
        if rate == "1gbit":
            for other, limit in (("none", 0.5), ("powersgd", 0.9), ("top-k", 1.0)):
                o = m.get(other, {}).get("ms")
                if o:
                    line(f"{method} step ≤ {limit} × {other}'s", where, f"{s['ms'] / o:.2f}", s["ms"] / o <= limit)
            t = m.get("top-k", {}).get("compress_ms")
            if t and s["compress_ms"] is not None:
                line(f"{method} compress ≤ 0.6 × top-k's", where, f"{s['compress_ms'] / t:.2f}",
                     s["compress_ms"] / t <= 0.6)
        floor = s.get("floor_ms")
        if floor and s.get("wire_ms") is not None and rate in ("100mbit", "1gbit"):
            over, allowed = s["ms"] - floor, 1.25 * s["wire_ms"] + 0.1 * floor
            line(f"{method} over floor ≤ 1.25 × wire + 10% floor", where, f"{over:.0f} ms vs {allowed:.0f} ms",
                 over <= allowed)
        if s.get("density_p5") is not None:
            ok = s["density_p5"] >= 0.8 and s["density_p95"] <= 1.25 and not s["over_capacity"]
            line(f"{method} achieved/target p5–p95 in [0.8, 1.25], never over capacity", where,
                 f"{s['density_p5']:.2f}–{s['density_p95']:.2f}, {int(s['over_capacity'])} over", ok)
    return out


def converge_table(rows, target=None):
    """Training seconds until the test perplexity first reaches the target: the runs' own,
    or `target` read off their curves (every run evaluated on the same steps)."""
    runs = [r for r in rows if r.get("mode") == "converge"]
    if not runs:
        return []
    reached = {}
    for r in runs:
        if "error" in r:
            continue
        if target is None:
            reached[r["method"]] = (r.get("reached_step"), r.get("reached_seconds"))
        else:
            point = next((p for p in r["curve"] if p["perplexity"] <= target), None)
            reached[r["method"]] = (point["step"], point["seconds"]) if point else (None, None)
    out = [f"\n| method | steps to perplexity {fmt(target) if target else 'target'} | training seconds | × none | "
           "× powersgd | × top-k | final perplexity (steps) |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            out.append(f"| {r['method']} | failed | | | | | |")
            continue
        step, seconds = reached[r["method"]]
        def ratio(other):
            o = reached.get(other, (None, None))[1]
            return fmt(seconds / o, 2) if seconds and o else "—"
        last = r["curve"][-1] if r.get("curve") else None
        out.append(f"| {r['method']} | {step or 'not reached'} | {fmt(seconds)} | {ratio('none')} | "
                   f"{ratio('powersgd')} | {ratio('top-k')} | "
                   f"{fmt(last['perplexity'], 1) if last else '—'} ({last['step'] if last else '—'}) |")
    return out


def plot(rows, summary, path):
    try:
        import matplotlib
    except ImportError:
        print(f"\n(no {path}: matplotlib is not installed)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = [k for k in sorted(summary, key=lambda g: (g[0], g[1], rate_order(g[2]))) if k[1] == 2]
    runs = [r for r in rows if r.get("mode") == "converge" and "curve" in r]
    fig, axes = plt.subplots(1, 2 if runs else 1, figsize=(13 if runs else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    methods = []
    for m in summary.values():
        methods += [name for name in m if name not in methods]
    width = 0.8 / max(1, len(methods))
    for i, name in enumerate(methods):
        values = [summary[c].get(name, {}).get("ms") or 0 for c in cases]
        ax.bar([x + i * width for x in range(len(cases))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))])
    ax.set_xticklabels([f"{c[0]}\n{c[2]}" for c in cases])
    ax.set_ylabel("ms per step (2 ranks)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("time per training step on a shaped link")
    if runs:
        ax = axes[0][1]
        for r in runs:
            ax.plot([p["seconds"] for p in r["curve"]], [p["perplexity"] for p in r["curve"]], label=r["method"])
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.set_ylabel("test perplexity")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.set_title(f"{runs[0]['model']}, {runs[0]['ranks']} ranks, {runs[0]['rate']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--png", default="")
    ap.add_argument("--target", type=float, default=None, help="perplexity to read off the converge curves")
    a = ap.parse_args(argv)
    rows = load(a.inputs)
    tables, summary = step_tables(rows)
    print("\n".join(tables + goals(summary) + converge_table(rows, a.target)))
    if a.png:
        plot(rows, summary, a.png)
    return 0
