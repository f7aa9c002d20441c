#!/usr/bin/python3
"""An alpha-beta model of one training step's gradient exchange for the dense ring
all-reduce, the hook's all-gather and reduce-scatter exchanges and PowerSGD, at P = 2 ... 1024
ranks on links of 1, 10 and 100 Gbit/s, with its constants measured on this machine:

  alpha      one message's latency: half the round trip of a 4-byte gloo send/recv between
             two processes on the loopback (--alpha-us replaces it);
  compute    per rank, per step, on one thread, on real gradients: SIDCo-E's compress
             (encode), the owners' selection and the decodes of both exchanges, read from
             `bench/fill_in.py --timing --json` rows (P = 2 ... 32 measured; beyond, the
             owner's and the reduce decode's costs are held at the largest P's, the
             all-gather decode grows linearly in P, as its P payloads do); PowerSGD's
             matrix products and orthogonalization for the same model's matrices, timed here;
  fill-in    union / k of the P local selections (the same rows; a power law in P fitted
             to them beyond the largest P): the density the all-gather exchange applies.

Time per step (B the link's bytes per second, k = density N, s the capacity slack, payloads
of 64-byte headers and 8-byte entries; every collective a ring or pairwise exchange, no
overlap with backward, no contention between ranks):

  dense      2 (P-1) alpha + 2 (P-1)/P 4N / B
  allgather  (P-1) (alpha + (64 + 8 s k) / B) + compress + decode(P)
  reduce     2 (P-1) (alpha + (64 + 8 ceil(s k / P)) / B) + compress + owner select + decode
  powersgd   3 rings: 6 (P-1) alpha + 2 (P-1)/P 4 (r sum(n + m) + vectors) / B + its compute

This is the hook's model (gloo: flat collectives, a ring all-reduce) with this machine's
loopback latency. Checked against SimGrid's SMPI (bench/smpi_model.py), a plain alpha-beta
charge of the same bytes is 21-69% short of the simulated time: SMPI's calibration charges a
message under 1.4 KB about twice the latency and a third to four fifths of the link's rate
(one of 64 KiB or more 11.6 latencies), which bench/smpi_model.py adds, landing within 8%;
and Open MPI's dense all-reduce there is Rabenseifner's (2 log2 P messages), not a ring.

Prints the model's table and where each wins; --png plots time against P per link speed.
The hook's exchange="auto" follows it at 2 ranks (the all-gather); from 3 it times both
exchanges in the run's first sparse steps instead (docs/PYTORCH.md).

  /usr/bin/python3 bench/fill_in.py --timing --json build/fill_in_timing.jsonl
  /usr/bin/python3 bench/cost_model.py --fill-in build/fill_in_timing.jsonl --png docs/cost_model.png
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import wikitext  # noqa: E402
from loopback import free_port  # noqa: E402

HEADER = 64
ENTRY = 8
LINKS_GBITS = (1, 10, 100)
RANKS = (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _ping_pong(rank, port, rounds, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.zeros(1)
    times = []
    for i in range(rounds):
        started = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        times.append(time.perf_counter() - started)
    if rank == 0:
        out.put(statistics.median(times[rounds // 10:]) / 2)
    dist.barrier()
    dist.destroy_process_group()


def measure_alpha(rounds=2000):
    """Half the median round trip of a 4-byte gloo send/recv on the loopback, in seconds."""
    port = free_port()
    context = mp.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=_ping_pong, args=(r, port, rounds, out)) for r in range(2)]
    for p in procs:
        p.start()
    alpha = out.get(timeout=300)
    for p in procs:
        p.join()
    return alpha


def powersgd_shapes(model):
    """(n, m) of every matrix PowerSGD compresses, and the count of values it sends dense."""
    matrices, vectors = [], 0
    for p in model.parameters():
        if p.dim() > 1:
            matrices.append((p.shape[0], p.numel() // p.shape[0]))
        else:
            vectors += p.numel()
    return matrices, vectors


def measure_powersgd(matrices, rank, repeat=3):
    """Seconds of PowerSGD's local work per step on one thread: M Q, orthogonalize P, M^T P,
    the approximation P Q^T and the error feedback (M - P Q^T), for every matrix."""
    torch.manual_seed(1)
    work = [(torch.randn(n, m), torch.randn(m, rank)) for n, m in matrices]
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        for m_, q in work:
            p = m_ @ q
            p, _ = torch.linalg.qr(p)
            q = m_.t() @ p
            approximation = p @ q.t()
            m_.sub_(approximation).add_(approximation)  # the residual update, values unchanged
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def fitted(rows, key):
    """A power law a P^b through (P, rows' key) by least squares in log-log."""
    xs = [math.log(r["ranks"]) for r in rows]
    ys = [math.log(r[key]) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - b * mx), b


class Model:
    def __init__(self, rows, alpha, powersgd_seconds, powersgd_values, slack):
        self.rows = sorted(rows, key=lambda r: r["ranks"])
        self.n, self.density, self.alpha, self.slack = rows[0]["n"], rows[0]["density"], alpha, slack
        self.k = max(1, int(self.density * self.n))
        self.compress = statistics.median(r["reduce_encode_ms"] for r in rows) / 1e3
        self.allgather_compress = statistics.median(r["allgather_encode_ms"] for r in rows) / 1e3
        last = self.rows[-1]
        self.owner, self.reduce_decode = last["owner_select_ms"] / 1e3, last["reduce_decode_ms"] / 1e3
        self.decode_per_rank = statistics.median(r["allgather_decode_ms"] / r["ranks"] for r in rows) / 1e3
        self.union = fitted(self.rows, "union_over_k")
        self.powersgd_seconds, self.powersgd_values = powersgd_seconds, powersgd_values

    def union_over_k(self, p):
        measured = {r["ranks"]: r["union_over_k"] for r in self.rows}
        a, b = self.union
        return measured.get(p, min(p, a * p ** b))

    def seconds(self, method, p, link_bytes):
        a, n, k, s = self.alpha, self.n, self.k, self.slack
        if method == "dense":
            return 2 * (p - 1) * a + 2 * (p - 1) / p * 4 * n / link_bytes
        if method == "allgather":
            payload = HEADER + ENTRY * math.ceil(s * k)
            return ((p - 1) * (a + payload / link_bytes) + self.allgather_compress + self.decode_per_rank * p)
        if method == "reduce":
            block = HEADER + ENTRY * math.ceil(s * k / p)
            return 2 * (p - 1) * (a + block / link_bytes) + self.compress + self.owner + self.reduce_decode
        if method == "powersgd":
            return 6 * (p - 1) * a + 2 * (p - 1) / p * 4 * self.powersgd_values / link_bytes + self.powersgd_seconds
        raise ValueError(method)


METHODS = ("dense", "allgather", "reduce", "powersgd")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fill-in", required=True, help="bench/fill_in.py --timing --json rows (one model)")
    ap.add_argument("--model", default="lstm", help="which model's rows to read")
    ap.add_argument("--alpha-us", type=float, default=0.0, help="a latency instead of measuring one")
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--powersgd-ms", type=float, default=0.0,
                    help="PowerSGD's compute per step from an earlier run instead of timing it (on a busy machine)")
    ap.add_argument("--slack", type=float, default=1.25)
    ap.add_argument("--json", default="", help="append the constants and the table here")
    ap.add_argument("--png", default="")
    a = ap.parse_args()
    with open(a.fill_in) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("model") == a.model and "reduce_encode_ms" in r]
    if len(rows) < 2:
        ap.error(f"--fill-in {a.fill_in}: fewer than 2 timed rows of model {a.model} (run fill_in.py --timing)")
    alpha = a.alpha_us * 1e-6 if a.alpha_us > 0 else measure_alpha()
    spec = {"lstm": ("lstm", 342, 2), "gpt": ("gpt", 256, 4)}[a.model]
    _, _, vocabulary = wikitext.corpus(0, 1, 10)
    torch.set_num_threads(1)
    matrices, vectors = powersgd_shapes(wikitext.make_model(spec[0], vocabulary, spec[1], spec[2]))
    powersgd_values = a.powersgd_rank * sum(n + m for n, m in matrices) + vectors
    powersgd = a.powersgd_ms * 1e-3 if a.powersgd_ms > 0 else measure_powersgd(matrices, a.powersgd_rank)
    model = Model(rows, alpha, powersgd, powersgd_values, a.slack)
    ua, ub = model.union
    print(f"{a.model}: N = {model.n}, density {model.density} (k = {model.k}), slack {a.slack}; "
          f"alpha {alpha * 1e6:.1f} us (gloo send/recv on the loopback); per step on one thread: compress "
          f"{model.compress * 1e3:.1f} ms, owner select {model.owner * 1e3:.2f} ms, reduce decode "
          f"{model.reduce_decode * 1e3:.2f} ms, all-gather decode {model.decode_per_rank * 1e3:.2f} ms per rank, "
          f"PowerSGD rank {a.powersgd_rank} {model.powersgd_seconds * 1e3:.1f} ms ({powersgd_values} values); "
          f"union / k = {ua:.2f} P^{ub:.2f}")
    print()
    print("| Gbit/s | P | dense ms | allgather ms | reduce ms | PowerSGD ms | fastest | reduce ÷ allgather | "
          "all-gather applies (× k) |")
    print("|---|---|---|---|---|---|---|---|---|")
    table = []
    for gbits in LINKS_GBITS:
        link = gbits * 1e9 / 8
        for p in RANKS:
            t = {m: model.seconds(m, p, link) for m in METHODS}
            best = min(t, key=t.get)
            table.append(dict(gbits=gbits, ranks=p, best=best, **{m + "_ms": 1e3 * v for m, v in t.items()}))
            print(f"| {gbits} | {p} | {1e3 * t['dense']:.1f} | {1e3 * t['allgather']:.1f} | {1e3 * t['reduce']:.1f} | "
                  f"{1e3 * t['powersgd']:.1f} | {best} | {t['reduce'] / t['allgather']:.2f} | "
                  f"{model.union_over_k(p):.1f} |")
    for gbits in LINKS_GBITS:
        link = gbits * 1e9 / 8
        cross = next((p for p in range(2, 4097) if model.seconds("reduce", p, link) < model.seconds("allgather", p, link)),
                     None)
        print(f"{gbits} Gbit/s: reduce is faster than allgather from P = {cross}")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(dict(model=a.model, n=model.n, density=model.density, alpha_us=alpha * 1e6,
                                    compress_ms=model.compress * 1e3, owner_ms=model.owner * 1e3,
                                    powersgd_ms=model.powersgd_seconds * 1e3, table=table)) + "\n")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(LINKS_GBITS), figsize=(12, 3.8), sharey=True)
        ps = [2 ** e for e in range(1, 11)]
        styles = {"dense": "k-", "allgather": "o-", "reduce": "s-", "powersgd": "^--"}
        labels = {"dense": "dense ring all-reduce", "allgather": "sidco all-gather",
                  "reduce": "sidco reduce-scatter", "powersgd": f"PowerSGD rank {a.powersgd_rank}"}
        for ax, gbits in zip(axes, LINKS_GBITS):
            link = gbits * 1e9 / 8
            for m in METHODS:
                ax.plot(ps, [1e3 * model.seconds(m, p, link) for p in ps], styles[m], label=labels[m], markersize=3)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{gbits} Gbit/s")
            ax.set_xlabel("ranks P")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("exchange ms per step (model)")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{a.model} ({model.n / 1e6:.1f}M values), δ = {model.density}, α = {alpha * 1e6:.0f} µs",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
