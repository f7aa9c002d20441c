#!/usr/bin/python3
"""A complete data-parallel training script with sidco_torch's hook: an MLP on the bundled UCI
digits (examples/data/digits), P CPU ranks over gloo on 127.0.0.1, SIDCo-E at a density that
ramps down (a schedule), each rank checkpointing its own sidco state, and a resume.

  PYTHONPATH=build/python /usr/bin/python3 examples/ddp_train.py --ranks 2 --steps 100 --save run.pt
  PYTHONPATH=build/python /usr/bin/python3 examples/ddp_train.py --ranks 2 --steps 50 --resume run.pt

With --device cuda (NCCL where there are as many GPUs as ranks, else gloo on one) it trains
in mixed precision: torch.autocast float16 and a GradScaler, with the State's
nonfinite="skip", so that a step whose gradients overflow on any rank is skipped on all.

Each step's batch is drawn from a generator seeded by the rank and the global step, so that a
resumed run sees the batches an uninterrupted one would: rank 0 prints a CRC-32 of the
parameters, equal for 100 steps straight and for 50 saved + 50 resumed (the test checks it).
--wire compact sends the hook's compact entries (docs/PYTORCH.md); --seed sets the initial
model (the same on every rank).
"""
import argparse
import os
import socket
import sys
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import example_cli

sidco_torch = example_cli.import_sidco_torch(__file__)

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits", "digits.csv")


def density(iteration):
    """A warm-up: 20% of each gradient for 20 steps, then 5% (DGC ramps down this way, in stages)."""
    return 0.2 if iteration < 20 else 0.05


def load_digits():
    rows = torch.tensor([[float(v) for v in line.split(",")] for line in open(DIGITS)])
    return rows[:, :64] / 16.0, rows[:, 64].long()


def train(rank, world, port, args):
    dist.init_process_group("nccl" if args.device == "cuda" and torch.cuda.device_count() >= world else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device(args.device, rank % max(1, torch.cuda.device_count())) if args.device == "cuda" else None
    x, y = load_digits()
    test_x, test_y = x[-297:], y[-297:]          # the last 297 for testing
    x, y = x[:-297][rank::world], y[:-297][rank::world]  # each rank its shard of the rest
    torch.manual_seed(args.seed)                 # the same initial model on every rank
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = model.to(device or "cpu")
    ddp = DDP(model, device_ids=[device.index] if device else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    amp = device is not None  # mixed precision on CUDA: an overflowing step is skipped on every rank
    state = sidco_torch.State(method="sidco-e", density=density, start_iter=2, nonfinite="skip" if amp else "raise",
                              wire=args.wire, exchange=args.exchange)
    sidco_torch.register(ddp, state)
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    if args.resume:  # each rank its own file: the state holds this rank's residuals
        checkpoint = torch.load(f"{args.resume}.{rank}", map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        state.load_state_dict(checkpoint["sidco"])
    first = state.iteration  # the global step this run starts at (0, or where the checkpoint was)
    selected = size = 0      # entries sent and offered, over this run's sparse steps
    losses = []
    for step in range(first, first + args.steps):
        generator = torch.Generator().manual_seed(1000 + rank + 7919 * step)  # by global step: resumes alike
        batch = torch.randint(0, len(x), (64,), generator=generator)
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = nn.functional.cross_entropy(ddp(x[batch].to(model[0].weight.device)),
                                               y[batch].to(model[0].weight.device))
        try:
            scaler.scale(loss).backward()
        except RuntimeError:
            if isinstance(state.error, sidco_torch.ExchangeError):  # every rank stops here, at the same step
                print(f"rank {rank}: the exchange failed: {state.error}", file=sys.stderr)
            raise
        scaler.step(optimizer)  # optimizer.step(), unless the gradients overflowed (under AMP)
        scaler.update()
        losses.append(loss.item())
        for s in state.stats().values():
            if s["path"] == "sparse":
                selected, size = selected + s["selected"], size + s["size"]
    digest = zlib.crc32(torch.cat([p.detach().cpu().flatten() for p in model.parameters()]).numpy().tobytes())
    with torch.no_grad():
        accuracy = (model(test_x.to(model[0].weight.device)).argmax(1).cpu() == test_y).float().mean().item()
    if args.save:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                    "sidco": state.state_dict()}, f"{args.save}.{rank}")
    if rank == 0:
        last = losses[-20:]
        print(f"step {state.iteration}: loss {sum(last) / len(last):.4g} (mean of the last {len(last)} steps), "
              f"test accuracy {accuracy:.3f}, density sent {selected / max(1, size):.4f} over this run's sparse steps "
              f"(asked {state.density} now), parameters crc32 {digest:08x}"
              + (f", {state.skipped_steps} overflowing steps skipped" if amp else ""))
    dist.barrier()  # every rank done with the group before any tears it down
    dist.destroy_process_group()
    if accuracy < args.min_accuracy:
        sys.exit(f"rank {rank}: test accuracy {accuracy:.3f} < {args.min_accuracy}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=example_cli.count, default=2)
    parser.add_argument("--steps", type=example_cli.count, default=100)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--save", help="checkpoint prefix (one file per rank: PREFIX.RANK)")
    parser.add_argument("--resume", help="checkpoint prefix to resume from")
    parser.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 below this test accuracy")
    parser.add_argument("--wire", choices=("plain", "compact", "compact8", "auto"), default="plain",
                        help="the hook's entry coding")
    parser.add_argument("--seed", type=int, default=0, help="the initial model's seed")
    parser.add_argument("--exchange", choices=("auto", "allgather", "reduce"), default="auto")
    args = parser.parse_args()
    # Here rather than in every rank, each with a traceback.
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.resume:
        missing = next((path for path in (f"{args.resume}.{rank}" for rank in range(args.ranks))
                        if not os.path.isfile(path)), None)
        if missing:
            parser.error(f"--resume {args.resume}: no checkpoint {missing} (one a rank, PREFIX.RANK, for "
                         f"--ranks {args.ranks})")
    if args.save:
        os.makedirs(os.path.dirname(os.path.abspath(args.save)), exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(args.ranks, port, args), nprocs=args.ranks)


if __name__ == "__main__":
    main()
