#!/usr/bin/env python3
"""The seeds' comparison on one GPU: SIDCo-E, SIDCo-GP and our radix Top-k (sidco_torch's CUDA
ops) against torch.topk as users call it (indices of the top |g|, then g at those indices), on
the same device buffers, each time a ratio to a device-to-device copy of the gradient measured
in the same run. Then the same with error feedback (the residual added before selection):
ours fused, against torch's add + torch.topk + gather + zeroing of the sent entries. Then where
a warm SIDCo-E call's time goes at 2^26 (its kernels by torch's profiler against its wall
time: the rest is the host's share). Last, the ops' device memory as torch's allocator and
the driver see it, and whether 1,000 calls grow it.

Inputs: the bundled real gradient (lstm_it10.npy, 3.7M values) tiled to N, each tile scaled by
1 + t/100 so that no value repeats 70 times at 2^28; and a heavy-tie input, the same with half
its entries (a fixed random half) exact zeros. N = 2^24, 2^26, 2^28; float32 and bfloat16;
δ = 0.01 and 0.001.

Usage: gpu_seeds.py GRADIENTS_DIR [JSON_OUT] [--quick] [--cpu]. Needs sidco_torch importable
with CUDA ops (SIDCO_TORCH_LIBRARY). Prints markdown tables; exits 1 when a method failed.
--quick: N = 2^20 and 2^22 only; --cpu: the same on CPU tensors, wall-clock timed and without
the memory part (a dry run of this script where there is no GPU)."""
import json
import os
import sys
import time

import numpy as np
import torch

import sidco_torch

SIZES = (24, 26, 28)
DEVICE = "cuda"
DTYPES = (torch.float32, torch.bfloat16)
DENSITIES = (0.01, 0.001)
INPUTS = ("real", "half-zeros")


def tiled(gradients_dir, n, dtype, ties):
    base = torch.from_numpy(np.load(os.path.join(gradients_dir, "lstm_it10.npy")).astype(np.float32)).to(DEVICE)
    tiles = -(-n // base.numel())
    scale = 1 + torch.arange(tiles, device=DEVICE, dtype=torch.float32) / 100
    g = (base.unsqueeze(0) * scale.unsqueeze(1)).flatten()[:n]
    if ties:
        generator = torch.Generator(device=DEVICE).manual_seed(7)
        g[torch.rand(n, device=DEVICE, generator=generator) < 0.5] = 0
    return g.to(dtype).contiguous()


def timed(fn, reps, warm=2):
    """Milliseconds a call: the median of reps calls, each bracketed by events on torch's
    current stream (the ops order their own stream against it at every call)."""
    for _ in range(warm):
        fn()
    times = []
    if DEVICE == "cpu":
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return float(np.median(times))
    torch.cuda.synchronize()
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def torch_top_k(g, k):
    indices = torch.topk(g.abs(), k, sorted=False).indices
    return indices, g[indices]


class TorchFeedback:
    """Error feedback as a user writes it around torch.topk."""

    def __init__(self, g):
        self.residual = torch.zeros_like(g)

    def __call__(self, g, k):
        self.residual.add_(g)
        indices, values = torch_top_k(self.residual, k)
        self.residual.index_fill_(0, indices, 0)
        return indices, values


def measure(gradients_dir, log2n, dtype, density, kind, reps):
    n = 1 << log2n
    k = max(1, round(density * n))
    g = tiled(gradients_dir, n, dtype, kind == "half-zeros")
    copy_out = torch.empty_like(g)
    row = {"n": n, "log2n": log2n, "dtype": str(dtype).replace("torch.", ""), "density": density, "input": kind,
           "k": k, "ms": {}, "selected": {}, "errors": {}}

    def run(name, fn):
        try:
            row["ms"][name] = timed(fn, reps)
            last = fn()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            if last is not None:
                row["selected"][name] = int(last[0].numel()) / k
        except Exception as e:  # noqa: BLE001 - a failed method is a row's error, the others still run
            row["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"

    run("copy", lambda: (copy_out.copy_(g), None)[1])
    run("torch.topk", lambda: torch_top_k(g, k))
    for method in ("top-k", "sidco-e", "sidco-gp"):
        compressor = sidco_torch.Compressor(method)
        run(method, lambda c=compressor: c.compress(g, density))
    feedback = TorchFeedback(g)
    run("feedback+torch.topk", lambda: feedback(g, k))
    del feedback
    for method in ("top-k", "sidco-e"):
        compressor = sidco_torch.Compressor(method)
        residual = torch.zeros_like(g)
        run(f"feedback {method}", lambda c=compressor, r=residual: c.compress(g, density, residual=r))
        del residual
    del g, copy_out
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def memory_report():
    """The ops' device memory at 2^26 float32: what torch's allocator sees and what the
    driver's free memory says; then 1,000 calls at 2^20 and whether either grows."""
    out = {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    g = torch.randn(1 << 26, device="cuda")
    compressor = sidco_torch.Compressor("sidco-e")
    residual = torch.zeros_like(g)
    torch.cuda.synchronize()
    free0, allocated0, reserved0 = torch.cuda.mem_get_info()[0], torch.cuda.memory_allocated(), \
        torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    indices, values = compressor.compress(g, 0.001, residual=residual)
    torch.cuda.synchronize()
    free1, allocated1, reserved1 = torch.cuda.mem_get_info()[0], torch.cuda.memory_allocated(), \
        torch.cuda.memory_reserved()
    driver_taken = free0 - free1
    torch_reserved = reserved1 - reserved0
    out["first_call_2^26"] = {
        "torch_peak_over_start_mib": (torch.cuda.max_memory_allocated() - allocated0) / 2**20,
        "torch_allocated_after_mib": (allocated1 - allocated0) / 2**20,
        "outputs_mib": (indices.numel() * 8 + values.numel() * 4) / 2**20,
        "driver_taken_mib": driver_taken / 2**20,
        "outside_torch_mib": (driver_taken - torch_reserved) / 2**20,
    }
    del g, residual, indices, values, compressor
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    g = torch.randn(1 << 20, device="cuda")
    compressor = sidco_torch.Compressor("sidco-e")
    samples = {}
    start = time.time()
    for call in range(1, 1001):
        indices, values = compressor.compress(g * (1 + call % 7), 0.01)
        del indices, values
        if call in (10, 1000):
            torch.cuda.synchronize()
            samples[call] = (torch.cuda.mem_get_info()[0], torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    out["calls_2^20"] = {
        "seconds": time.time() - start,
        "driver_free_change_10_to_1000_mib": (samples[1000][0] - samples[10][0]) / 2**20,
        "torch_allocated_change_mib": (samples[1000][1] - samples[10][1]) / 2**20,
        "torch_reserved_change_mib": (samples[1000][2] - samples[10][2]) / 2**20,
    }
    return out


def kernel_profile(gradients_dir, log2n=26, density=0.001, calls=20):
    """Where a warm SIDCo-E call's time goes, float32 and bfloat16: its kernels' time (torch's
    profiler, CUPTI) against the wall time of the calls; the difference is the host's share
    (host waits, launches, the op's stream ordering and output copies)."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    for dtype in DTYPES:
        g = tiled(gradients_dir, 1 << log2n, dtype, False)
        compressor = sidco_torch.Compressor("sidco-e")
        for _ in range(3):
            compressor.compress(g, density)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(calls):
                compressor.compress(g, density)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / calls * 1e3
        kernels = []
        for event in prof.key_averages():
            # The device's own events (kernels, copies, sets): a host op's device time
            # counts its kernels again.
            if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            device_us = getattr(event, "device_time_total", None)
            if device_us is None:
                device_us = getattr(event, "cuda_time_total", 0)
            if device_us:
                kernels.append((device_us / calls, event.count // calls, event.key[:90]))
        kernels.sort(reverse=True)
        name = str(dtype).replace("torch.", "")
        total = sum(k[0] for k in kernels) / 1e3
        print(f"SIDCo-E at 2^{log2n}, {name}, δ = {density}: {wall:.3f} ms a call (wall), "
              f"its device work {total:.3f} ms (the profiler's events a call):")
        for us, count, key in kernels[:14]:
            print(f"  {us:8.1f} µs  ×{count}  {key}")
        out[name] = {"wall_ms": wall, "device_ms": total, "kernels": kernels[:30]}
        del g
    return out


def ratio(row, name, base="copy"):
    a, b = row["ms"].get(name), row["ms"].get(base)
    return f"{a / b:.2f}" if a and b else "-"


def print_tables(rows):
    print("| N | dtype | δ | input | copy ms | SIDCo-E | SIDCo-GP | our Top-k | torch.topk | torch.topk / SIDCo-E "
          "| our Top-k / best Top-k |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ms = r["ms"]
        best = min((ms[m] for m in ("top-k", "torch.topk") if m in ms), default=None)
        own = f"{ms['top-k'] / best:.2f}" if best and "top-k" in ms else "-"
        print(f"| 2^{r['log2n']} | {r['dtype']} | {r['density']} | {r['input']} | {ms.get('copy', 0):.3f} | "
              f"{ratio(r, 'sidco-e')} | {ratio(r, 'sidco-gp')} | {ratio(r, 'top-k')} | {ratio(r, 'torch.topk')} | "
              f"{ratio(r, 'torch.topk', 'sidco-e')} | {own} |")
    print()
    print("With error feedback (× copy; the last column: fused SIDCo-E over the feedback pass plus the best Top-k)")
    print("| N | dtype | δ | input | SIDCo-E fb | our Top-k fb | add + torch.topk + zero | SIDCo-E fb / best |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        ms = r["ms"]
        best = min((ms[m] for m in ("feedback top-k", "feedback+torch.topk") if m in ms), default=None)
        fused = f"{ms['feedback sidco-e'] / best:.2f}" if best and "feedback sidco-e" in ms else "-"
        print(f"| 2^{r['log2n']} | {r['dtype']} | {r['density']} | {r['input']} | {ratio(r, 'feedback sidco-e')} | "
              f"{ratio(r, 'feedback top-k')} | {ratio(r, 'feedback+torch.topk')} | {fused} |")
    print()
    print("Selected / k (last call; feedback rows grow their residual every call, so theirs is the last call's)")
    for r in rows:
        picked = ", ".join(f"{m} {v:.3f}" for m, v in r["selected"].items())
        print(f"  2^{r['log2n']} {r['dtype']} δ={r['density']} {r['input']}: {picked}")


def main(argv):
    gradients_dir = argv[1]
    json_out = argv[2] if len(argv) > 2 and not argv[2].startswith("--") else None
    quick = "--quick" in argv
    global DEVICE
    DEVICE = "cpu" if "--cpu" in argv else "cuda"
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (dry run)"
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    sizes = (20, 22) if quick else SIZES
    rows = []
    for log2n in sizes:
        reps = {20: 5, 22: 5, 24: 30, 26: 10, 28: 5}[log2n]
        for dtype in DTYPES:
            for density in DENSITIES:
                for kind in INPUTS:
                    row = measure(gradients_dir, log2n, dtype, density, kind, reps)
                    rows.append(row)
                    print(f"  2^{log2n} {row['dtype']} δ={density} {kind}: " +
                          ", ".join(f"{m} {t:.3f}" for m, t in row["ms"].items()) + " ms", flush=True)
                    for name, why in row["errors"].items():
                        print(f"  error: 2^{log2n} {dtype} {density} {kind} {name}: {why}", flush=True)
    print_tables(rows)
    try:
        profile_of = kernel_profile(gradients_dir, 22 if quick else 26)
    except Exception as e:  # noqa: BLE001 - a profiler that cannot run leaves the tables standing
        print(f"kernel profile: not taken ({type(e).__name__}: {e})")
        profile_of = {}
    memory = memory_report() if DEVICE == "cuda" else {}
    print("Memory:", json.dumps(memory, indent=1))
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows, "profile": profile_of,
                       "memory": memory}, f, indent=1)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
