#!/usr/bin/python3
"""The hook's per-step density on the WikiText-2 LSTM of bench/train_speed.py (2 gloo ranks,
δ = 0.01, the all-gather, plain wire), bucket by bucket, and a replay of one bucket's
gradients through sidco_torch.Compressor with error feedback, for the adaptive loop's
behaviour on real, changing gradients (docs/RESULTS.md, "Per-step density").

  PYTHONPATH=build/python bench/hook_density_trace.py record DIR [--steps 34]
      each step's candidates / k per bucket (rank 0's; the compressor's count before the
      capacity's trim) and the trimmed count; saves rank 0's bucket 0 as it reaches the hook
      (after DDP's bucket rebuild) into DIR/bucket0.npy, its parameters' sizes into
      DIR/sizes.npy
  PYTHONPATH=build/python bench/hook_density_trace.py replay DIR [--method sidco-e]
      compresses the saved gradients in order, per layer, with a residual (no trim):
      each call's achieved / target density per layer and its passes
"""
import argparse
import os
import sys

import numpy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def record_rank(rank, port, a):
    import torch.distributed as dist
    import sidco_torch
    import train_speed
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    job = train_speed.Job(argparse.Namespace(model="lstm", ranks=2, eval_words=1000, seed=1, density=a.density,
                                             powersgd_rank=4), "compute", rank)
    saved = []

    def recording(state, bucket):
        # DDP's first step runs one bucket of every parameter; from the rebuild on, bucket 0
        # is the last layers' (the decoder's, on this model).
        if rank == 0 and bucket.index() == 0 and job.steps_done >= 2:
            saved.append(bucket.buffer().detach().clone())
            if len(saved) == 1:
                numpy.save(os.path.join(a.dir, "sizes.npy"), numpy.array([p.numel() for p in bucket.parameters()]))
        return sidco_torch.hook(state, bucket)

    job.ddp = torch.nn.parallel.DistributedDataParallel(job.model)
    job.state = sidco_torch.State(method=a.method, density=a.density, start_iter=2, exchange="allgather", wire="plain")
    job.sidco = True
    sidco_torch.register(job.ddp, job.state, comm_hook=recording)
    job.optimizer = torch.optim.SGD(job.ddp.parameters(), lr=1.0, momentum=0.9)
    job.method = a.method
    for step in range(a.steps):
        job.steps_done = step
        job.step()
        stats = job.state.stats()
        if rank == 0 and all(s["path"] == "sparse" for s in stats.values()):
            print(f"step {step:3d}  " + "  ".join(
                f"bucket {i} ({s['size']}): candidates / k {s['candidates'] / (a.density * s['size']):.3f}, "
                f"trimmed {s['trimmed']}" for i, s in sorted(stats.items())), flush=True)
    if rank == 0:
        numpy.save(os.path.join(a.dir, "bucket0.npy"), torch.stack(saved).numpy())
    dist.barrier()
    dist.destroy_process_group()


def record(a):
    import torch.multiprocessing as mp
    os.makedirs(a.dir, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    ranks = [ctx.Process(target=record_rank, args=(r, a.port, a)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    return max(p.exitcode for p in ranks)


def replay(a):
    import sidco_torch
    gradients = numpy.load(os.path.join(a.dir, "bucket0.npy"), mmap_mode="r")
    sizes = [int(n) for n in numpy.load(os.path.join(a.dir, "sizes.npy"))]
    starts = numpy.cumsum([0] + sizes)
    compressor = sidco_torch.Compressor(a.method)
    residual = torch.zeros(sum(sizes))
    for call in range(gradients.shape[0]):
        indices, _ = compressor.compress(torch.from_numpy(numpy.array(gradients[call])), a.density, sizes, residual)
        per_layer = numpy.histogram(indices.numpy(), bins=starts)[0] / (a.density * numpy.array(sizes))
        report = compressor.report()
        print(f"call {call:3d}  whole {indices.numel() / (a.density * sum(sizes)):.3f}  layers "
              + " ".join(f"{r:.3f}" for r in per_layer) + f"  passes {int(report['passes'])}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("record", "replay"))
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=34)
    ap.add_argument("--method", default="sidco-e")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--port", type=int, default=29591)
    a = ap.parse_args()
    return record(a) if a.mode == "record" else replay(a)


if __name__ == "__main__":
    sys.exit(main())
