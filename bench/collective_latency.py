"""The latency of the smallest collective the hook issues per bucket (an all_reduce of one
int64, what agrees the reduce exchange's block head), between gloo ranks on 127.0.0.1:
mean over 500 calls after 50 warm-up calls, printed per world size.
    /usr/bin/python3 bench/collective_latency.py [--ranks 2,4,8]"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from loopback import free_port


def run(rank, world, port, calls):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    one = torch.zeros(1, dtype=torch.int64)
    for _ in range(50):
        dist.all_reduce(one)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(one)
    if rank == 0:
        print(f"{world} ranks: all_reduce of one int64 takes {(time.perf_counter() - start) / calls * 1e3:.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    for world in (int(r) for r in args.ranks.split(",")):
        mp.spawn(run, args=(world, free_port(), args.calls), nprocs=world)
