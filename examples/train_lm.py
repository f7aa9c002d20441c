#!/usr/bin/python3
"""Data-parallel training of a word-level LSTM language model on WikiText-2 (trained on
valid.txt, evaluated on test.txt, examples/data/wikitext-2), with the gradient exchanged by
DistributedDataParallel through a communication hook: none (dense all-reduce), powersgd
(PyTorch's own hook) or a sidco_torch method at a density, with error feedback. P CPU
processes over gloo on 127.0.0.1. Writes one CSV row per step (and the test perplexity
every --eval-every steps) for scripts/plot_lm.py.

  PYTHONPATH=build/python /usr/bin/python3 examples/train_lm.py --method sidco-e \
      --density 0.01 --ranks 2 --steps 600 --csv runs/sidco-e-0.01.csv
"""
import argparse
import csv
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wikitext  # noqa: E402  (the text, the model and the perplexity, shared with bench/train_speed.py)
import example_cli  # noqa: E402


def powersgd_bytes(model, rank):
    """What PowerSGD's hook sends per step: P and Q (rank r) for every matrix, the rest dense."""
    total = 0
    for p in model.parameters():
        if p.dim() > 1:
            n, m = p.shape[0], p.numel() // p.shape[0]
            total += 4 * rank * (n + m)
        else:
            total += 4 * p.numel()
    return total


def worker(rank, a, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    # Each rank trains on its own contiguous shard of the text.
    shard, test, vocabulary = wikitext.corpus(rank, a.ranks, a.eval_words)
    batches = wikitext.Batches(shard, a.batch, a.bptt)
    torch.manual_seed(a.seed)
    model = wikitext.LSTMModel(vocabulary, a.dim, a.layers, a.dropout)
    parameters = sum(p.numel() for p in model.parameters())
    # One bucket for every method: PowerSGD's hook issues collectives from future
    # callbacks, which gloo cannot keep in order across ranks once there are several
    # buckets (it aborts); DDP splits off a 1 MB first bucket unless told otherwise.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
    ddp = DDP(model, bucket_cap_mb=1024)
    hook_state = None
    if a.method == "powersgd":
        hook_state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(hook_state, powersgd.powerSGD_hook)
    elif a.method != "none":
        import sidco_torch
        hook_state = sidco_torch.State(method=a.method, density=a.density, start_iter=2, exchange=a.exchange,
                                       wire=a.wire)
        sidco_torch.register(ddp, hook_state)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    writer = None
    if rank == 0 and a.csv:
        os.makedirs(os.path.dirname(os.path.abspath(a.csv)), exist_ok=True)
        csv_file = open(a.csv, "w", newline="")
        writer = csv.writer(csv_file)
        writer.writerow(["step", "wall_seconds", "train_loss", "test_perplexity", "bytes_sent", "density",
                         "step_seconds", "compress_seconds", "exchange_seconds", "exchange", "global_density"])
    started = time.perf_counter()
    step = 0
    while step < a.steps:
        x, y = batches.next()
        step_started = time.perf_counter()
        out, batches.hidden = ddp(x, batches.hidden)
        loss = nn.functional.cross_entropy(out.view(-1, out.size(-1)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), a.clip)
        optimizer.step()
        step += 1
        step_seconds = time.perf_counter() - step_started
        losses = torch.tensor([loss.item()])
        dist.all_reduce(losses)
        if a.method in ("none", "powersgd") or (hook_state is not None and step <= 2):
            sent = 4 * parameters if a.method == "none" or step <= 2 else powersgd_bytes(model, a.powersgd_rank)
            density, compress, communicate = 1.0, 0.0, 0.0
            exchange, global_density = "dense", 1.0
        else:
            stats = hook_state.stats().values()
            sent = sum(s["bytes_sent"] for s in stats)
            density = sum(s["selected"] for s in stats) / sum(s["size"] for s in stats)
            compress = sum(s["compress_seconds"] for s in stats)
            communicate = sum(s["exchange_seconds"] for s in stats)
            exchange = "+".join(sorted({s.get("exchange", "dense") for s in stats}))
            # The reduce exchange reports the density of the update every rank applied; the
            # all-gather's update is the union of the ranks' selections (not counted here).
            global_density = (sum(s.get("global_density", 0.0) * s["size"] for s in stats)
                              / sum(s["size"] for s in stats)) if exchange == "reduce" else ""
        perplexity = ""
        if step % a.eval_every == 0 or step == a.steps:
            perplexity = wikitext.evaluate(model, test, a.bptt)
        if writer:
            writer.writerow([step, f"{time.perf_counter() - started:.3f}", f"{losses.item() / a.ranks:.5f}",
                             f"{perplexity:.3f}" if perplexity != "" else "", sent, f"{density:.6g}",
                             f"{step_seconds:.4f}", f"{compress:.4f}", f"{communicate:.4f}", exchange,
                             f"{global_density:.6g}" if global_density != "" else ""])
        if rank == 0 and perplexity != "":  # with or without --csv
            print(f"{a.method} {a.density if a.method not in ('none', 'powersgd') else ''} step {step}: "
                  f"train loss {losses.item() / a.ranks:.3f}, test perplexity {perplexity:.1f}, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
    if writer:
        csv_file.close()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="sidco-e",
                    help="none, powersgd, or a sidco_torch method (sidco-e, sidco-gp, top-k, dgc, random-k, ...)")
    ap.add_argument("--density", type=example_cli.density, default=0.01)
    ap.add_argument("--exchange", default="auto", choices=("auto", "allgather", "reduce"),
                    help="sidco_torch's exchange (auto: the all-gather at 2 ranks; from 3, timed in the first sparse steps)")
    ap.add_argument("--wire", default="plain", choices=("plain", "compact", "compact8", "auto"),
                    help="sidco_torch's entry coding (compact: bfloat16 values; compact8: a byte a value; auto: timed)")
    ap.add_argument("--ranks", type=example_cli.count, default=2)
    ap.add_argument("--steps", type=example_cli.count, default=600)
    ap.add_argument("--batch", type=example_cli.count, default=20)
    ap.add_argument("--bptt", type=example_cli.count, default=35)
    ap.add_argument("--dim", type=example_cli.count, default=128)
    ap.add_argument("--layers", type=example_cli.count, default=2)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--powersgd-rank", type=example_cli.count, default=2)
    ap.add_argument("--eval-every", type=example_cli.count, default=100)
    ap.add_argument("--eval-words", type=example_cli.count, default=30000,
                    help="test words the perplexity is measured on")
    ap.add_argument("--threads", type=example_cli.count, default=1, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    if a.method not in ("none", "powersgd"):  # here, not in every rank after the data has loaded
        methods = example_cli.import_sidco_torch(__file__).methods()
        if a.method not in methods:
            ap.error(f"--method {a.method} is none, powersgd or one of sidco_torch's: {', '.join(methods)}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The ranks' BLAS (OpenBLAS in Debian's torch) starts a thread per core unless told, and
    # torch.set_num_threads does not reach it: ranks sharing the cores would spin against each
    # other (2 ranks on 2 cores: 36 s for the test's run, 31 s with this). Read at its load,
    # in the spawned ranks.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    mp.spawn(worker, args=(a, port), nprocs=a.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
