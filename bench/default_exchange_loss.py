#!/usr/bin/python3
"""What the hook's default exchange gives a new user, in loss (issue "A thousand workers"):
a 2-layer LSTM language model on synthetic tokens (a Zipf-like unigram draw with a fixed
successor table, so there is something to learn), P gloo ranks on 127.0.0.1, SGD with
momentum, sidco_torch.State(method="sidco-e", density=0.01) with exchange="auto" (the
default: from 3 ranks on it times both exchanges in its first sparse steps and keeps the
one with the shorter time to loss) against exchange="allgather" and plain
DDP (dense all-reduce), the same steps and seeds; "reduce:compact" (any exchange with
":compact") runs it with State(wire="compact"). Each rank draws its own batches; the
model's embedding rows of this batch's tokens are the large, moving part of the gradient.
Prints one line per run (its seconds per step from step 10 on, all ranks on this machine;
with the reduce exchange, also the density its update applied over the target, p5 / median /
p95 over steps 10 on) and, at the end, the final train loss (the mean of the last 20 steps)
of each run over the all-gather's, and the time to loss: when the run's mean of 20 steps
first reaches the all-gather's final loss (step and seconds; --steps longer than the
all-gather's by --extra lets a run that needs more steps get there).

  PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/default_exchange_loss.py \\
      --ranks 4 --steps 200 --seeds 1 2
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from loopback import free_port


class LM(nn.Module):
    def __init__(self, vocabulary, dim):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.out = nn.Linear(dim, vocabulary)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x))[0])


def batch(generator, a):
    """A batch of sequences: token t+1 is t's fixed successor with probability 0.7, else a
    Zipf-like draw."""
    weights = 1.0 / torch.arange(1, a.vocabulary + 1, dtype=torch.float64)
    successor = torch.randperm(a.vocabulary, generator=torch.Generator().manual_seed(99))
    tokens = torch.empty(a.batch, a.bptt + 1, dtype=torch.long)
    tokens[:, 0] = torch.multinomial(weights, a.batch, replacement=True, generator=generator)
    for t in range(1, a.bptt + 1):
        follow = torch.rand(a.batch, generator=generator) < 0.7
        fresh = torch.multinomial(weights, a.batch, replacement=True, generator=generator)
        tokens[:, t] = torch.where(follow, successor[tokens[:, t - 1]], fresh)
    return tokens[:, :-1], tokens[:, 1:]


def worker(rank, a, exchange, seed, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(seed)
    model = LM(a.vocabulary, a.dim)
    ddp = DDP(model)
    if exchange != "dense":
        import sidco_torch
        exchange, _, wire = exchange.partition(":")
        state = sidco_torch.State(method="sidco-e", density=a.density, start_iter=2, exchange=exchange,
                                  wire=wire or "plain")
        sidco_torch.register(ddp, state)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    losses, applied, times = [], [], []
    steps = a.steps if exchange == "allgather" else a.steps + a.extra
    start = time.perf_counter()
    for step in range(steps):
        x, y = batch(generator, a)
        loss = nn.functional.cross_entropy(ddp(x).reshape(-1, a.vocabulary), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / a.ranks)
        times.append(time.perf_counter() - start)
        stats = state.stats().values() if exchange != "dense" else []
        sparse = [s for s in stats if s.get("exchange") == "reduce" and s["path"] == "sparse"]
        if step >= 10 and sparse:
            applied.append(sum(s["global_density"] * s["size"] for s in sparse) /
                           sum(s["target_density"] * s["size"] for s in sparse))
    used = "dense"
    if exchange != "dense":
        used = state.exchange_for(a.ranks)
        measured = state.auto_exchange()
        if measured:  # auto's choice, and the step times it chose by
            used += (f" chosen at step {measured['iteration']}: all-gather {1e3 * measured['allgather_seconds']:.1f} "
                     f"ms, reduce {1e3 * measured['reduce_seconds']:.1f} ms a step, steps factor "
                     f"{measured['steps_factor']:.3f}")
    if rank == 0:
        applied.sort()
        spread = (f"{applied[len(applied) // 20]:.3f}/{applied[len(applied) // 2]:.3f}/"
                  f"{applied[len(applied) * 19 // 20]:.3f}" if applied else "-")
        with open(out, "w") as f:
            json.dump({"used": used, "losses": losses, "times": times, "spread": spread}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--vocabulary", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bptt", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--extra", type=int, default=0, help="steps beyond --steps for the runs other than the all-gather")
    ap.add_argument("--exchanges", nargs="+", default=["auto", "allgather", "dense"],
                    help="auto, allgather, reduce or dense; EXCHANGE:compact for the compact wire")
    a = ap.parse_args()
    import tempfile
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            for exchange in a.exchanges:
                out = os.path.join(tmp, f"{exchange}-{seed}")
                mp.spawn(worker, args=(a, exchange, seed, free_port(), out), nprocs=a.ranks, join=True)
                with open(out) as f:
                    run = json.load(f)
                runs[(exchange, seed)] = run
                final = sum(run["losses"][a.steps - 20:a.steps]) / 20
                per_step = (run["times"][-1] - run["times"][9]) / (len(run["times"]) - 10)
                density = f", applied density / target p5/p50/p95 {run['spread']}" if run["spread"] != "-" else ""
                print(f"seed {seed}, exchange={exchange} ({run['used']}): final train loss {final:.4f} at step "
                      f"{a.steps}, {per_step:.4f} s a step{density}", flush=True)
    if "allgather" in a.exchanges:
        for (exchange, seed), run in runs.items():
            base = runs[("allgather", seed)]
            target = sum(base["losses"][-20:]) / 20
            final = sum(run["losses"][a.steps - 20:a.steps]) / 20
            reached = next((s for s in range(19, len(run["losses"]))
                            if sum(run["losses"][s - 19:s + 1]) / 20 <= target), None)
            when = (f"reaches it at step {reached + 1}, {run['times'][reached]:.1f} s (all-gather: step {a.steps}, "
                    f"{base['times'][-1]:.1f} s)" if reached is not None
                    else f"does not reach it in {len(run['losses'])} steps")
            print(f"seed {seed}, {exchange}: {final / target:.3f}x the all-gather's loss at step {a.steps}; {when}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
