"""What the Python tests share: a function run on spawned ranks, and whether this
sidco_torch has CUDA ops to test."""
import socket

import torch
import torch.multiprocessing as mp

import sidco_torch


def run_ranks(target, *args, world=2, timeout=120):
    """target(rank, port, queue, *args) on world spawned processes (port: a free one on
    127.0.0.1 for init_process_group); each puts one result on queue. Returns the results
    sorted, after every process exited with 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, port, out, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return results


def cuda_skip_reason():
    """Why the CUDA ops cannot be tested here (no device, or built without them), or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        sidco_torch.compress(torch.zeros(4, device="cuda"), 0.5, method="top-k")
    except (RuntimeError, ValueError, NotImplementedError) as e:
        if "built without CUDA" in str(e) or "CUDA' backend" in str(e):
            return f"sidco_torch built without CUDA ops ({e})"
        raise
    return None
