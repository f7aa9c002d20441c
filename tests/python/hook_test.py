#!/usr/bin/python3
"""The DDP hook with 2 processes (gloo, 127.0.0.1), checked on every rank:
- the hook's result equals the average, in rank order, of what each rank sent (sent =
  gradient + old residual where the new residual is zero), bit for bit;
- sent + new residual = gradient + old residual, exactly, per element;
- several buckets, across DDP's bucket rebuild after the first iteration (start_iter=1),
  for Top-k (exact) and SIDCo-E (per layer);
- the first start_iter iterations are dense all-reduces;
- bad arguments raise with the message."""
import os
import socket
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import sidco_torch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recording_hook(records):
    """sidco_torch.hook, recording each bucket's input, residuals and output."""
    def hook(state, bucket):
        buffer = bucket.buffer()
        before = buffer.clone()
        bucket_state = state._buckets.get(bucket.index())
        old = bucket_state.residual.clone() if bucket_state is not None and bucket_state.residual is not None else None
        future = sidco_torch.hook(state, bucket)
        bucket_state = state._buckets.get(bucket.index())
        new = bucket_state.residual.clone() if bucket_state is not None and bucket_state.residual is not None else None
        path = state.stats()[bucket.index()]["path"]
        if old is None or old.numel() != before.numel():
            old = torch.zeros_like(before)
        records.append((bucket.index(), path, before, old, new, future.wait().clone()))
        return future
    return hook


def worker(rank, world, port, method, failures):
    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(0)  # the same model on every rank
        model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))
        # 2.4 MB of parameters: DDP's first bucket holds 1 MB, the rest 0.5 MB each after
        # the rebuild that follows the first iteration.
        ddp = DDP(model, bucket_cap_mb=0.5)
        state = sidco_torch.State(method=method, density=0.05, start_iter=1)
        records = []
        ddp.register_comm_hook(state, recording_hook(records))
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        buckets_seen = set()
        for step in range(4):
            records.clear()
            x = torch.randn(32, 64, generator=generator)
            y = torch.randint(0, 10, (32,), generator=generator)
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            for index, path, before, old, new, out in records:
                buckets_seen.add(index)
                if step < 1:
                    assert path == "dense", f"step {step}: bucket {index} not dense before start_iter"
                    continue
                assert path == "sparse", f"step {step}: bucket {index} took {path}"
                total = before + old
                # Exactly: sent + new residual = gradient + old residual.
                sent = torch.where(new == 0, total, torch.zeros_like(total))
                assert torch.equal(sent + new, total), f"step {step}: residual lost mass"
                # The result is the rank-order average of what every rank sent.
                everyone = [torch.empty_like(sent) for _ in range(world)]
                dist.all_gather(everyone, sent)
                expected = torch.zeros_like(sent)
                for r in range(world):
                    expected += everyone[r]
                expected /= world
                assert torch.equal(out, expected), f"step {step}: bucket {index} differs from the average"
                density = state.stats()[index]["density"]
                assert 0 < density <= 0.2, f"density {density}"
        assert len(buckets_seen) >= 2, f"one bucket only: {buckets_seen}"
        dist.destroy_process_group()
    except Exception:
        failures.put(f"rank {rank} ({method}): {traceback.format_exc()}")


def main():
    for method in ["top-k", "sidco-e"]:
        failures = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(2, free_port(), method, failures), nprocs=2, join=True)
        if not failures.empty():
            print(failures.get())
            return 1
        print(f"{method}: hook result, residual and buckets checked on 2 ranks")
    for bad, message in [(dict(density=0), "density = 0 is outside (0, 1]"),
                         (dict(density=1.5), "density = 1.5 is outside (0, 1]"),
                         (dict(start_iter=-1), "start_iter = -1"),
                         (dict(method="nope"), "method 'nope' is not one of")]:
        try:
            sidco_torch.State(**bad)
        except (ValueError, RuntimeError) as e:
            if message not in str(e):
                print(f"State({bad}) raised without the message: {e}")
                return 1
        else:
            print(f"State({bad}) did not raise")
            return 1
    print("bad arguments raise with their message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
