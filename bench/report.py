#!/usr/bin/env python3
"""Turns sidco-bench's JSON output into the tables of docs/RESULTS.md (CPU benchmarks).

Usage: bench/report.py latest.json [more.json ...] [--plot time_vs_n.png]
                       [--summary INPUT/LOG2N/INVERSE | --summary-only INPUT/LOG2N/INVERSE] > table.md
(later files replace the runs they repeat: e.g. a run of the targets with repetitions)
Ratios are of times measured in the same run: compress / streaming read (the bandwidth
ceiling) and std::nth_element Top-k / compress (the speed-up over exact Top-k).

It starts with one screen for one configuration (by default the largest N on Laplace values
at the smallest density run): per method its time over the streaming read and over our
radix Top-k, and its achieved / target density, with densities outside [0.8, 1.25] flagged
(a method that keeps far fewer entries than asked is not faster, it does less work).
Methods are listed in the suite's order, not ranked. --summary-only prints that alone."""
import json
import sys

INPUTS = {0: "normal", 1: "laplace", 2: "lstm (real)", 3: "cnn (real)", 4: "transformer bucket (170 layers)",
          5: "gpt lm (real, it 200)", 6: "gpt lm with error feedback (real, it 100)", 7: "1,000 small layers"}
REAL_SIZES = {2: 3689196, 3: 900490, 4: 1 << 25, 5: 17717713, 6: 17717713, 7: 2995031}
BASELINES = ("streaming-read", "nth-element-top-k", "feedback-traffic")
# Rows whose old underscore name is not the registry's name with hyphens.
LEGACY = {"streaming_read": "streaming-read", "nth_element_top_k": "nth-element-top-k",
          "sidco_e_exact_k": "sidco-e-exact", "sidco_e_fixed3": "sidco-e:fixed3",
          "sidco_e_single_serial": "sidco-e-single:serial"}


def canonical(name):
    """A row's name as sidco-bench spells it now (the registry's name, a variant after a
    colon), so that JSON written before the rows took the registry's names reads the same."""
    prefix, suffix = "", ""
    if name.startswith("layers/"):
        prefix, name = "layers/", name[len("layers/"):]
    if name.endswith("/whole"):
        name, suffix = name[:-len("/whole")], "/whole"
    variant = ""
    for old, new in (("_feedback_fresh", ":fresh-feedback"), ("_feedback", ":feedback")):
        if name.endswith(old):
            name, variant = name[:-len(old)], new
            break
    return prefix + LEGACY.get(name, name.replace("_", "-")) + variant + suffix


def load(path, runs):
    """Adds path's runs to runs (replacing those it repeats). With --benchmark_repetitions,
    the median of the repetitions stands for each benchmark."""
    with open(path) as f:
        data = json.load(f)
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") != "median":
                continue
        elif b.get("repetitions", 1) > 1:
            continue
        parts = (b["run_name"] if "run_name" in b else b["name"]).split("/")
        name = canonical("/".join(parts[:-3]))
        kind, log2n, inverse = (int(a) for a in parts[-3:])
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b.get("time_unit", "ns")]
        runs[(name, kind, log2n, inverse)] = {
            "seconds": b["real_time"] * unit,
            "density_ratio": b.get("density_ratio"),
            "alloc_bytes": b.get("alloc_bytes"),
            "workspace_bytes": b.get("workspace_bytes"),
        }
    return data.get("context", {})


def size_of(kind, log2n):
    return REAL_SIZES.get(kind, 1 << log2n)


def plot(runs, path, methods, kind=1, inverse=1000):
    """Time per call against N for each registry method (log-log), with the two baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for name in list(BASELINES) + methods + ["sidco-e-single:feedback"]:
        points = sorted((n, r["seconds"]) for (m, k, n, i), r in runs.items()
                        if m == name and k == kind and i == inverse)
        if not points:
            continue
        style = {"streaming-read": "k--", "nth-element-top-k": "k:", "feedback-traffic": "k-."}.get(name, "o-")
        ax.plot([2 ** n for n, _ in points], [s * 1e3 for _, s in points], style, label=name)
    ax.set(xscale="log", yscale="log", xlabel="N (values)", ylabel="time per call (ms)",
           title=f"{INPUTS[kind]} values, δ = {1 / inverse:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_targets(rows, form):
    """One row a target: its value on Laplace and on normal values at N = 2^25, δ = 0.001."""
    for label, f, goal in rows:
        cells = []
        for kind in (1, 0):
            try:
                cells.append(form.format(f((kind, 25, 1000))))
            except (TypeError, ZeroDivisionError, KeyError):
                cells.append("—")
        print(f"| {label} | {cells[0]} | {cells[1]} | {goal} |")
    print()


def summary(runs, methods, config):
    """One screen for one configuration: every method against the read and our Top-k."""
    kind, log2n, inverse = config
    read, top = runs.get(("streaming-read",) + config), runs.get(("top-k",) + config)
    print(f"### Summary: {INPUTS.get(kind, kind)}, N = {size_of(kind, log2n)}, δ = {1 / inverse:g}")
    print()
    print("Time over the streaming read (the bandwidth ceiling) and over our radix Top-k, from the same "
          "run; achieved / target density of the call timed; ⚠ outside [0.8, 1.25]: not comparable. "
          "Not ranked.")
    print()
    print("| method | ms | ÷ streaming read | ÷ top-k | achieved / target | |")
    print("|---|---:|---:|---:|---:|---|")
    for name in list(BASELINES) + methods:
        run = runs.get((name,) + config)
        if not run:
            continue
        ms = run["seconds"] * 1e3
        over_read = f"{run['seconds'] / read['seconds']:.2f}" if read else "—"
        over_top = f"{run['seconds'] / top['seconds']:.2f}" if top else "—"
        ratio = run["density_ratio"]
        flag = "⚠" if ratio is not None and not 0.8 <= ratio <= 1.25 else ""
        shown = f"{ratio:.2f}" if ratio is not None else ""
        print(f"| {name} | {ms:.3f} | {over_read} | {over_top} | {shown} | {flag} |")
    print()


def parse_config(text):
    try:
        kind, log2n, inverse = (int(part) for part in text.split("/"))
    except ValueError:
        sys.exit(f"report.py: --summary {text!r} is not INPUT/LOG2N/INVERSE (e.g. 1/25/1000)")
    return kind, log2n, inverse


def main():
    args = sys.argv[1:]
    plot_path = None
    if "--plot" in args:
        plot_path = args[args.index("--plot") + 1]
        del args[args.index("--plot"):args.index("--plot") + 2]
    chosen, only = None, False
    for flag in ("--summary", "--summary-only"):
        if flag in args:
            chosen, only = parse_config(args[args.index(flag) + 1]), flag == "--summary-only"
            del args[args.index(flag):args.index(flag) + 2]
    runs = {}
    for path in args:
        context = load(path, runs)
    configs = sorted({(k, n, i) for (name, k, n, i) in runs if not name.startswith("layers/")})
    methods = []
    for (name, *_rest) in runs:
        if name not in methods and name not in BASELINES and not name.startswith("layers/"):
            methods.append(name)
    # The registry's methods, in its order: the run's context lists them (older runs: the
    # rows without a variant).
    listed = [m.strip() for m in context.get("sidco_methods", "").split(",") if m.strip()]
    registry = [m for m in listed if m in methods] or [m for m in methods if ":" not in m]
    if plot_path:
        plot(runs, plot_path, registry)
    if chosen is None and configs:
        laplace = [c for c in configs if c[0] == 1] or configs
        chosen = max(laplace, key=lambda c: (c[1], c[2]))
    if chosen is not None:
        if chosen not in configs:
            sys.exit(f"report.py: no run at {'/'.join(map(str, chosen))}; the runs have "
                     + ", ".join("/".join(map(str, c)) for c in configs))
        summary(runs, methods, chosen)
    if only:
        return

    def t(name, config):
        run = runs.get((name,) + config)
        return run["seconds"] if run else None

    print(f"Machine: {context.get('num_cpus', '?')} CPUs at {context.get('mhz_per_cpu', '?')} MHz, "
          f"run {context.get('date', '?')}, {context.get('library_build_type', '?')} Google Benchmark, "
          f"backend::cpu kernels: {context.get('sidco_kernels', '?')}.")
    print()

    # The targets of issue 4: N = 2^25, delta = 0.001, 2 threads, on Laplace values
    # (single-stage SIDCo-E's own model) and on normal values.
    print("### Targets (N = 2^25, δ = 0.001)")
    print()
    print("| target | laplace | normal | goal |")
    print("|---|---|---|---|")
    rows = [
        ("SIDCo-E single-stage / streaming read", lambda c: t("sidco-e-single", c) / t("streaming-read", c), "≤ 2.5"),
        ("nth_element / SIDCo-E single-stage", lambda c: t("nth-element-top-k", c) / t("sidco-e-single", c), "≥ 20"),
        ("SIDCo-E 3 stages / single-stage", lambda c: t("sidco-e:fixed3", c) / t("sidco-e-single", c), "≤ 1.15"),
        ("SIDCo-E adaptive / single-stage", lambda c: t("sidco-e", c) / t("sidco-e-single", c), "≤ 1.15"),
        ("exact_k (SIDCo-E) / SIDCo-E adaptive", lambda c: t("sidco-e-exact", c) / t("sidco-e", c), "≤ 1.3"),
        ("single-stage with / without error feedback",
         lambda c: t("sidco-e-single:feedback", c) / t("sidco-e-single", c), "≤ 1.6"),
        ("nth_element / radix Top-k", lambda c: t("nth-element-top-k", c) / t("top-k", c), "≥ 3"),
        ("SIDCo-E single-stage: cpu / serial backend speed-up",
         lambda c: t("sidco-e-single:serial", c) / t("sidco-e-single", c), "—"),
    ]
    print_targets(rows, "{:.2f}")

    # Issue 14: the default method at the cost of two reads, per layer too.
    print("### Targets of the two-read default (N = 2^25, δ = 0.001)")
    print()
    print("| target | laplace | normal | goal |")
    print("|---|---|---|---|")
    rows = [
        ("SIDCo-E adaptive (default) / single-stage", lambda c: t("sidco-e", c) / t("sidco-e-single", c), "≤ 1.2"),
        ("SIDCo-E adaptive / streaming read", lambda c: t("sidco-e", c) / t("streaming-read", c), "≤ 2.5"),
        ("radix Top-k / SIDCo-E adaptive", lambda c: t("top-k", c) / t("sidco-e", c), "≥ 2"),
        ("SIDCo-E adaptive with / without error feedback (a fresh gradient each call)",
         lambda c: t("sidco-e:fresh-feedback", c) / t("sidco-e", c), "≤ 1.3"),
        ("the same, one gradient repeated (the residual ramps)",
         lambda c: t("sidco-e:feedback", c) / t("sidco-e", c), "—"),
        ("SIDCo-E adaptive with error feedback (a fresh gradient each call) / its traffic (feedback-traffic)",
         lambda c: t("sidco-e:fresh-feedback", c) / t("feedback-traffic", c), "—"),
        ("workspace kept / input bytes (%)",
         lambda c: 100 * (runs[("sidco-e",) + c]["workspace_bytes"] or 0) / (4 * size_of(c[0], c[1])), "≤ 10"),
    ]
    print_targets(rows, "{:.3g}")

    layered = sorted({(k, n, i) for (name, k, n, i) in runs if name.startswith("layers/")})
    if layered:
        print("### Per layer (segmented), against the whole vector and per-layer Top-k")
        print()
        print("Times in ms; ratios of times from the same run; [achieved / target density].")
        print()
        print("| input | δ | read | SIDCo-E whole | SIDCo-E per layer | per layer / whole (≤ 1.25) | "
              "Top-k per layer | Top-k / SIDCo-E per layer (≥ 2) | SIDCo-GP per layer | with feedback |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for c in layered:
            def ms(name):
                r = runs.get((name,) + c)
                return r["seconds"] * 1e3 if r else None
            def ratio(name):
                r = runs.get((name,) + c)
                return f" [{r['density_ratio']:.2f}]" if r and r["density_ratio"] is not None else ""
            whole, per_layer, top = ms("layers/sidco-e/whole"), ms("layers/sidco-e"), ms("layers/top-k")
            gp, feedback, read = ms("layers/sidco-gp"), ms("layers/sidco-e:feedback"), ms("layers/streaming-read")
            cell = lambda v: f"{v:.2f}" if v is not None else "—"
            print(f"| {INPUTS[c[0]]} | {1 / c[2]:g} | {cell(read)} | {cell(whole)}{ratio('layers/sidco-e/whole')} | "
                  f"{cell(per_layer)}{ratio('layers/sidco-e')} | "
                  f"{per_layer / whole if per_layer and whole else float('nan'):.2f} | {cell(top)} | "
                  f"{top / per_layer if top and per_layer else float('nan'):.1f} | {cell(gp)}{ratio('layers/sidco-gp')} | "
                  f"{cell(feedback)}{ratio('layers/sidco-e:feedback')} |")
        print()
    print("Heap bytes allocated per warm call (`alloc_bytes`) and kept between calls "
          "(`workspace_bytes`), laplace, N = 2^25, δ = 0.001:")
    print()
    print("| method | alloc_bytes | workspace_bytes |")
    print("|---|---|---|")
    for name in methods:
        run = runs.get((name, 1, 25, 1000))
        if run and run["alloc_bytes"] is not None:
            print(f"| {name} | {run['alloc_bytes']:.0f} | {run['workspace_bytes'] or 0:.0f} |")
    print()

    print("### Every configuration")
    print()
    print("Per cell: compress time / streaming read, then (speed-up over std::nth_element), "
          "then [achieved / target density].")
    print()
    shown = [m for m in methods if ":serial" not in m]
    for kind in sorted({k for (k, _, _) in configs}):
        print(f"#### {INPUTS[kind]}")
        print()
        cols = [c for c in configs if c[0] == kind]
        header = " | ".join(f"N={size_of(k, n)} δ={1 / i:g}" for (k, n, i) in cols)
        print(f"| method | stream ms | nth ms | {header} |" if False else f"| method | {header} |")
        print("|---|" + "---|" * len(cols))
        print("| streaming read (ms) | " + " | ".join(
            f"{t('streaming-read', c) * 1e3:.2f}" if t('streaming-read', c) else "—" for c in cols) + " |")
        print("| nth_element (ms) | " + " | ".join(
            f"{t('nth-element-top-k', c) * 1e3:.1f}" if t('nth-element-top-k', c) else "—" for c in cols) + " |")
        for name in shown:
            cells = []
            for c in cols:
                run, base, nth = runs.get((name,) + c), t("streaming-read", c), t("nth-element-top-k", c)
                if not run or not base or not nth:
                    cells.append("—")
                    continue
                cells.append(f"{run['seconds'] / base:.1f} ({nth / run['seconds']:.1f}×) [{run['density_ratio']:.2f}]")
            print(f"| {name} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
