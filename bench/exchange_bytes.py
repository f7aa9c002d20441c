#!/usr/bin/python3
"""Bytes each rank puts on the wire per training step, counted on the loopback of a private
network namespace (/proc/net/dev, TCP/IP included), not self-reported: DDP's dense
all-reduce, the hook's all-gather exchange and its reduce-scatter exchange, at several
world sizes. Run it as root through scripts/exchange_bytes.sh, which starts it inside
`unshare -n` (nothing leaves the namespace); every rank is a gloo process on 127.0.0.1.

The model is a stack of linear layers (--width, --layers: 2.1M parameters by default) fed
random batches; each configuration runs --warmup steps, then counts the link's bytes over
--steps steps and divides by steps and ranks. k = density x parameters; the table shows
bytes per rank per step and their ratio to 8k (an entry of 4-byte index and 4-byte value).
"""
import argparse
import json
import os
import queue
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from loopback import free_port


def link_bytes():
    with open("/proc/net/dev") as f:
        return next(int(line.split(":", 1)[1].split()[8]) for line in f if line.strip().startswith("lo:"))


def make_model(width, layers):
    torch.manual_seed(0)
    parts = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(width, 10))


def worker(rank, world, port, a, mode, results):
    try:
        torch.set_num_threads(1)
        sys.path.insert(0, a.package)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        model = make_model(a.width, a.layers)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
        state = None
        if mode != "dense":
            import sidco_torch
            # "reduce-compact": the compact wire ("-compact8": compact8); a -two-hop or -flat
            # suffix: that reduce_schedule
            exchange = mode.split("-")[0]
            wire = "compact8" if "-compact8" in mode else "compact" if "-compact" in mode else "plain"
            schedule = next((s for s in ("two-hop", "flat") if mode.endswith("-" + s)), "auto")
            state = sidco_torch.State(method=a.method, density=a.density, start_iter=1, exchange=exchange,
                                      wire=wire, reduce_schedule=schedule)
            sidco_torch.register(ddp, state)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)

        def step():
            x = torch.randn(32, a.width, generator=g)
            y = torch.randint(0, 10, (32,), generator=g)
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
        for _ in range(a.warmup):
            step()
        dist.barrier()
        before = link_bytes()
        started = time.perf_counter()
        for _ in range(a.steps):
            step()
        seconds = time.perf_counter() - started
        # Every rank has sent its last step's bytes once each rank's step is done.
        dist.barrier()
        after = link_bytes()
        stats = state.stats() if state is not None else {}
        used = sorted({s.get("exchange", "dense") if s["path"] == "sparse" else "dense" for s in stats.values()})
        global_density = [s["global_density"] for s in stats.values() if "global_density" in s]
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, True, {"bytes": after - before, "seconds": seconds, "used": used,
                                  "global_density": global_density}))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run(a, world, mode):
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, a, mode, results)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        while len(out) < world:
            rank, ok, value = results.get(timeout=a.timeout)
            if not ok:
                raise RuntimeError(f"rank {rank}: {value}")
            out[rank] = value
    except queue.Empty:
        raise RuntimeError(f"{mode} at {world} ranks: no result in {a.timeout} s")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    # The barrier and the counters' reads add a few hundred bytes: negligible.
    return {"bytes_per_rank_step": out[0]["bytes"] / a.steps / world, "seconds_per_step": out[0]["seconds"] / a.steps,
            "used": out[0]["used"], "global_density": out[0]["global_density"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8,16")
    ap.add_argument("--modes", default="dense,allgather,reduce",
                    help="dense, allgather, reduce; a -compact or -compact8 suffix: that wire; then -two-hop or -flat: "
                         "that reduce_schedule (default 'auto')")
    ap.add_argument("--method", default="sidco-e")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--package", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    a.package = os.path.abspath(a.package)
    link_bytes()  # fails early outside Linux
    parameters = sum(p.numel() for p in make_model(a.width, a.layers).parameters())
    k = a.density * parameters
    print(f"{parameters} parameters, density {a.density}: k = {k:.0f}, 8k = {8 * k / 1e6:.3f} MB, "
          f"dense 4N = {4 * parameters / 1e6:.2f} MB")
    print("| ranks | exchange | MB per rank per step | ÷ 8k | ÷ 4N | s per step |")
    print("|---|---|---|---|---|---|")
    rows = []
    for world in [int(r) for r in a.ranks.split(",")]:
        for mode in a.modes.split(","):
            r = run(a, world, mode)
            b = r["bytes_per_rank_step"]
            print(f"| {world} | {mode} | {b / 1e6:.3f} | {b / (8 * k):.2f} | {b / (4 * parameters):.3f} | "
                  f"{r['seconds_per_step']:.2f} |", flush=True)
            rows.append(dict(ranks=world, mode=mode, parameters=parameters, density=a.density, **r))
    if a.json:
        with open(a.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
