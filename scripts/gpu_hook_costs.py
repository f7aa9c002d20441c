#!/usr/bin/python3
"""Where one rank's time goes in the hook's reduce-scatter exchange on a bucket, by op, the
collectives aside: the CUDA codecs (compress on the device, the exchange core on the host,
and in the compact coding the messages framed on the host: the host staging a device codec
would replace) against the CPU codecs, plain and compact entries. P ranks' codecs in one
process on the bundled LSTM gradient tiled to N (rank r's scaled and rotated), δ = 0.01,
SIDCo-E locally, the default owner policy (sidco-e-exact), error feedback; rank 0's ops timed (synchronized),
median of the steps after a warm-up. Prints one table a bucket size.

    python3 scripts/gpu_hook_costs.py [--ranks 4] [--log2n 22 24] [--steps 7] [--devices cpu cuda]

Run by `scripts/gpu_check.sh run` on a lent GPU; runs here on the CPU alone (--devices cpu)."""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

from sidco_torch.ops import _reduce_codec

OPS = ("encode", "frames 1", "unframe 1", "select", "frames 2", "unframe 2", "decode")


def gradient(log2n, dtype):
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.environ.get("SIDCO_GRADIENTS_DIR", os.path.join(here, "..", "examples", "data", "gradients"))
    base = torch.from_numpy(np.load(os.path.join(folder, "lstm_it10.npy")).astype(np.float32))
    n = 1 << log2n
    tiles = [base * (1 + t / 100) for t in range(-(-n // base.numel()))]
    return torch.cat(tiles)[:n].to(dtype)


def timed(device, f):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = f()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def step_times(device, wire, g, ranks, steps):
    """Rank 0's ms per op, median over the steps after the first."""
    ops = torch.ops.sidco
    n = g.numel()
    layers = [n // 3, n - n // 3]
    codecs = [_reduce_codec("sidco-e", {}, layers, g.dtype, 0.01, 1.25, ranks, r, "sidco-e-exact", device=device,
                            wire=wire)
              for r in range(ranks)]
    residuals = [torch.zeros(n, dtype=g.dtype, device=device) for _ in range(ranks)]
    inputs = [(g * (1 + r / 10)).roll(r * 997).to(device) for r in range(ranks)]
    block = codecs[0].block_bytes()
    times = {op: [] for op in OPS}
    compact = wire == "compact"
    for step in range(steps + 1):
        ms = {}

        def each_rank(op, call):
            """call(r) for every rank r, each timed; rank 0's time is op's this step."""
            results = []
            for r in range(ranks):
                out, t = timed(device, lambda: call(r))
                results.append(out)
                if r == 0:
                    ms[op] = t
            return results

        blocks = each_rank("encode", lambda r: ops.reduce_encode(inputs[r], residuals[r], codecs[r], 7, step).clone())
        if compact:
            messages = each_rank("frames 1", lambda r: ops.reduce_frames(blocks[r], codecs[r], False))
            sizes = [m[1].tolist() for m in messages]
            # Owner o's share of every rank's messages, as the all-to-all at split sizes moves them.
            inbound = [torch.cat([messages[r][0][sum(sizes[r][:o]):sum(sizes[r][:o + 1])] for r in range(ranks)])
                       for o in range(ranks)]
            received = [torch.empty(ranks * block, dtype=torch.uint8, device=device) for _ in range(ranks)]
            each_rank("unframe 1", lambda o: ops.reduce_unframe(inbound[o], [sizes[r][o] for r in range(ranks)],
                                                                list(received[o].view(ranks, block).unbind(0)),
                                                                codecs[o], False))
        else:
            received = [torch.cat([b[o * block:(o + 1) * block] for b in blocks]) for o in range(ranks)]
        outs = [torch.zeros(n, dtype=g.dtype, device=device) for _ in range(ranks)]
        selections = each_rank("select", lambda o: ops.reduce_select(received[o], outs[o], residuals[o],
                                                                      codecs[o]).clone())
        if compact:
            sent = each_rank("frames 2", lambda o: ops.reduce_frames(selections[o], codecs[o], True)[0])
            joined = torch.cat(sent)
            inboxes = [[torch.empty(block, dtype=torch.uint8, device=device) for _ in range(ranks)]
                       for _ in range(ranks)]
            each_rank("unframe 2", lambda r: ops.reduce_unframe(joined, [m.numel() for m in sent], inboxes[r],
                                                                codecs[r], True))
        else:
            inboxes = [selections] * ranks
        outs = [torch.zeros(n, dtype=g.dtype, device=device) for _ in range(ranks)]
        each_rank("decode", lambda r: ops.reduce_decode(inboxes[r], outs[r], residuals[r], codecs[r]))
        if step > 0:
            for op, t in ms.items():
                times[op].append(t)
    return {op: statistics.median(ts) for op, ts in times.items() if ts}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--log2n", type=int, nargs="+", default=[22, 24])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    args = parser.parse_args()
    devices = [torch.device(d) for d in args.devices]
    if any(d.type == "cuda" for d in devices) and not torch.cuda.is_available():
        print("no CUDA device: the CUDA columns are left out")
        devices = [d for d in devices if d.type != "cuda"]
    torch.manual_seed(0)
    for log2n in args.log2n:
        g = gradient(log2n, torch.float32)
        columns = [(d, w) for d in devices for w in ("plain", "compact")]
        results = {(d.type, w): step_times(d, w, g, args.ranks, args.steps) for d, w in columns}
        print(f"\nRank 0 of {args.ranks}, 2^{log2n} float32, δ = 0.01, SIDCo-E (ms, median of {args.steps} steps)")
        print("| op | " + " | ".join(f"{d.type} {w}" for d, w in columns) + " |")
        print("|---|" + "---:|" * len(columns))
        for op in OPS + ("step",):
            cells = []
            for d, w in columns:
                r = results[(d.type, w)]
                value = sum(r.values()) if op == "step" else r.get(op)
                cells.append("-" if value is None else f"{value:.2f}")
            print(f"| {op} | " + " | ".join(cells) + " |")
        for d in devices:
            r = results[(d.type, "compact")]
            framing = sum(r.get(op, 0) for op in ("frames 1", "unframe 1", "frames 2", "unframe 2"))
            print(f"{d.type} compact: framing {framing:.2f} ms of a {sum(r.values()):.2f} ms step "
                  f"({100 * framing / sum(r.values()):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
