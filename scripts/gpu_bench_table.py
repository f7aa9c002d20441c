#!/usr/bin/env python3
"""The GPU check's benchmark table: each method's time at N = 2^26, δ = 0.001 as a ratio to a
device-to-device copy of the same gradient measured in the same run, beside the goals.
Usage: gpu_bench_table.py BENCH.json (sidco-cuda-bench --benchmark_format=json). Exits 1 when
nothing ran or the copy baseline is missing."""
import json
import sys

GOALS = {"sidco-e": "≤ 2.0× copy", "sidco-e:feedback": "≤ 4× copy",
         "sidco-e@one-pass": "≤ 2.0× copy (one_pass_select)",
         "sidco-e@one-pass:feedback": "≤ 4× copy (one_pass_select)"}


def main(path):
    report = json.load(open(path))
    runs = report.get("benchmarks", [])
    errors = {r["name"].split("/")[0]: r.get("error_message", "") for r in runs if r.get("error_occurred")}
    time = {r["name"].split("/")[0]: r["real_time"] for r in runs if not r.get("error_occurred")}
    density = {r["name"].split("/")[0]: r.get("density_ratio") for r in runs if not r.get("error_occurred")}
    gpu = report.get("context", {}).get("gpu", "?")
    if errors:
        for name, why in sorted(errors.items()):
            print(f"  {name}: error: {why}")
    copy = time.get("device-copy")
    if not copy:
        print("gpu_check: the device-copy baseline did not run")
        return 1
    print(f"GPU: {gpu}; device-copy {copy:.3f} ms = {2 * 4 * 2**26 / (copy * 1e-3) / 1e12:.2f} TB/s (read + write)")
    print("| method | ms | × copy | achieved / target density | goal |")
    print("|---|---:|---:|---:|---|")
    for name, t in sorted(time.items(), key=lambda kv: kv[1]):
        ratio = density.get(name)
        shown = f"{ratio:.3f}" if ratio is not None else ""
        print(f"| {name} | {t:.3f} | {t / copy:.2f} | {shown} | {GOALS.get(name, '')} |")
    e, radix, sort = time.get("sidco-e"), time.get("top-k"), time.get("radix-sort-top-k")
    failed = bool(errors)
    for name, goal in (("sidco-e", 2.0), ("sidco-e:feedback", 4.0), ("sidco-e@one-pass", 2.0),
                       ("sidco-e@one-pass:feedback", 4.0)):
        if name in time:
            met = time[name] / copy <= goal
            print(f"{name}: {time[name] / copy:.2f}x a copy (goal <= {goal}): {'met' if met else 'MISSED'}")
    if e and radix:
        print(f"our radix top-k / sidco-e: {radix / e:.2f}x (goal >= 3): {'met' if radix / e >= 3 else 'MISSED'}")
    if e and sort:
        print(f"full CUB radix sort top-k / sidco-e: {sort / e:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
