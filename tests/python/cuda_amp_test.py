#!/usr/bin/python3
"""A real mixed-precision loop on CUDA (torch.autocast float16 and a GradScaler) with the hook
on 2 ranks (NCCL with 2 GPUs, else gloo on one). Exits 77 (skip) without a CUDA device or
when this sidco_torch was built without CUDA ops. Checked:
- nonfinite="skip": a GradScaler whose first scale (2^24) overflows float16 gradients skips
  those steps on every rank and halves its scale until the gradients fit, then trains; every
  rank skips the same steps, ends with the same parameters, finite, and the loss falls;
- nonfinite="raise" (the default): the first overflow raises on every rank, naming a rank."""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import sidco_torch
from ranks import cuda_skip_reason, run_ranks

STEPS = 40


def amp_loop(rank, port, out, backend, nonfinite):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    device = torch.device("cuda", rank if backend == "nccl" else 0)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    state = sidco_torch.State(method="sidco-e", density=0.05, start_iter=1, nonfinite=nonfinite)
    sidco_torch.register(ddp, state)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    # torch.amp.GradScaler("cuda") from torch 2.3 on; torch.cuda.amp's before.
    scaler = (torch.amp.GradScaler("cuda", init_scale=2.0 ** 24, growth_interval=1000) if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(init_scale=2.0 ** 24, growth_interval=1000))
    generator = torch.Generator(device="cpu").manual_seed(10 + rank)
    teacher = torch.Generator(device="cpu").manual_seed(99)
    target = torch.randn(64, 10, generator=teacher).to(device)
    skipped, losses, error = [], [], None
    try:
        for step in range(STEPS):
            x = torch.randn(64, 64, generator=generator).to(device)
            y = (x @ target).argmax(1)
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(ddp(x), y)
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            skipped.append(scaler.get_scale() < scale)
            losses.append(float(loss.detach()))
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(params) for _ in range(2)]
    if error is None:
        dist.all_gather(gathered, params)
    out.put((rank, error, skipped, losses, bool(torch.isfinite(params).all()),
             error is None and bool(torch.equal(gathered[0], gathered[1])), state.skipped_steps))
    dist.destroy_process_group()


def main():
    reason = cuda_skip_reason()
    if reason:
        print(f"{reason}: skipped")
        return 77
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    results = run_ranks(amp_loop, backend, "skip", timeout=300)
    for rank, error, skipped, losses, finite, same, counted in results:
        assert error is None, f"rank {rank}: {error}"
        assert skipped == results[0][2], f"rank {rank} skipped other steps: {skipped} vs {results[0][2]}"
        # From 2^24 a few halvings bring float16 gradients into range (from 2^40, 22 on an H100).
        assert 1 <= sum(skipped) <= STEPS // 2, f"rank {rank}: {sum(skipped)} steps skipped"
        assert counted == sum(skipped), (counted, skipped)  # dense steps (before start_iter) counted too
        assert finite and same, f"rank {rank}: finite {finite}, same parameters on both ranks {same}"
        assert sum(losses[-5:]) < sum(losses[:5]), f"rank {rank}: the loss did not fall: {losses}"
    print(f"GradScaler with nonfinite='skip' over {backend}: {sum(results[0][2])} overflowing steps skipped on both "
          f"ranks, then trained (loss {results[0][3][0]:.3f} -> {results[0][3][-1]:.3f}), same parameters")
    results = run_ranks(amp_loop, backend, "raise", timeout=300)
    messages = {error for _, error, *rest in results}
    assert len(messages) == 1 and None not in messages and "non-finite" in next(iter(messages)), messages
    print(f"GradScaler with nonfinite='raise': every rank raised: {next(iter(messages))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
