"""What the Python tests share: a function run on spawned ranks, a sparse DDP step on
them, and whether this sidco_torch has CUDA ops to test."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import sidco_torch


def rank_context():
    """Where ranks come from: processes forked from a server that imported the test's main
    module (torch, sidco_torch) once, so that a rank starts in milliseconds instead of the
    second or two a fresh interpreter spends importing torch (hook_test.py alone starts some
    120 ranks). Nothing runs in the server, so no thread of torch's is forked mid-work."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "sidco_torch", "__main__"])
    return ctx


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago, for init_process_group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, *args, world=2, timeout=120):
    """target(rank, port, queue, *args) on world processes of rank_context() (port: free_port());
    each puts one result on queue. Returns the results sorted, after every process exited
    with 0."""
    port = free_port()
    ctx = rank_context()
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(target, rank, port, out, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=timeout) for _ in procs)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    finally:
        for p in procs:  # a rank that hangs must not keep this process from exiting
            if p.is_alive():
                p.kill()
    return results


def _rank_main(target, rank, port, out, *args):
    """target's rank, ended without destructors once its result is flushed: torch 1.13's
    gloo process group, destroyed at exit by DDP's reducer, joins its workers holding the
    GIL while a worker freeing a Python-made tensor waits for it (seen in the install
    test's ranks: hung there, one thread spinning on the closed store socket)."""
    target(rank, port, out, *args)
    out.close()
    out.join_thread()
    os._exit(0)


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


def first_step_refused(rank, port, out, methods):
    """For run_ranks: a small model's first DDP step with the hook, State(method=methods[rank]),
    on 2 gloo ranks; then the process group is destroyed and the function left at once (DDP's
    reducer then drops the group's last reference a moment after the step's collectives).
    Puts (rank, the State's error, whether it is an ExchangeError)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    state = sidco_torch.State(method=methods[rank], density=0.05, start_iter=0)
    sidco_torch.register(ddp, state)
    try:
        ddp(torch.randn(32, 64)).square().mean().backward()
    except RuntimeError:
        pass
    out.put((rank, str(state.error), isinstance(state.error, sidco_torch.ExchangeError)))
    dist.destroy_process_group()


def sparse_ddp_step(rank, port, out, backend="gloo", device="cpu", steps=1, exchange="auto", wire="auto"):
    """For run_ranks: a small model's DDP steps with the SIDCo-E hook on 2 ranks (device
    "cuda": rank r on GPU r with NCCL, on GPU 0 with gloo). Puts (rank, whether both ranks
    hold the same averaged gradients, the buckets' paths ("sparse (allgather)", "sparse
    (reduce)" or "dense"), nonzero gradients, size)."""
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    device = torch.device(device)
    ids = None
    if device.type == "cuda":
        device = torch.device("cuda", rank if backend == "nccl" else 0)
        torch.cuda.set_device(device)
        ids = [device.index]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    state = sidco_torch.State(method="sidco-e", density=0.05, start_iter=0, exchange=exchange, wire=wire)
    sidco_torch.register(ddp, state)
    torch.manual_seed(1 + rank)
    for _ in range(steps):
        ddp(torch.randn(32, 64, device=device)).square().mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(2)]
    dist.all_gather(gathered, grads)
    paths = {f"sparse ({s['exchange']})" if s["path"] == "sparse" else s["path"] for s in state.stats().values()}
    out.put((rank, bool(torch.equal(gathered[0], gathered[1])), paths, int((grads != 0).sum()), grads.numel()))
    dist.destroy_process_group()
