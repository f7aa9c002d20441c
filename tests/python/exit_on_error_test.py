#!/usr/bin/python3
"""A rank's error ends every rank's process cleanly, as a user's script ends on an uncaught
exception: one rank's NaN at step 2 makes every rank's backward raise the same error, and
each rank then leaves at once, with DDP's later buckets possibly still in flight (no barrier,
no wait on the step's futures): by letting the exception end the interpreter, by
destroy_process_group() first, or by os._exit. Every rank must exit with status 1 after
raising the same message: none aborts (a gloo thread's std::terminate when a peer tears its
group down mid-collective) and none hangs. Each rank is a fresh interpreter, as under
torchrun. 2 ranks with the all-gather, 3 with the reduce-scatter exchange. And a rank that
dies mid-step (os._exit(9) in its hook for bucket 0 or 1 of step 2, as an OOM kill would end
it, its earlier buckets' collectives posted): every other rank's step raises (gloo's lost
connection) and exits 1, none hangs or aborts."""
import os
import subprocess
import sys
import time

from ranks import free_port

RUNS = 2
TIMEOUT = 90


def rank_main(rank, world, port, exchange, ending):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import sidco_torch
    from hook_test import batch, make, train_step

    torch.set_num_threads(1)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 16  # several buckets, so that later ones are in flight
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    state = sidco_torch.State(method="sidco-e", density=0.05, start_iter=1, exchange=exchange)
    dies_at = int(ending.partition(":")[2]) if ending.startswith("crash:") else None

    def dying(state, bucket):
        if rank == 1 and state.iteration == 2 and bucket.index() == dies_at:
            os._exit(9)
        return sidco_torch.hook(state, bucket)
    _, ddp, optimizer = make(state, rank, hook=dying)
    for step in range(2):
        train_step(ddp, optimizer, rank, step)
    x, y = batch(rank, 2)
    if rank == 1 and dies_at is None:
        x[0, 0] = float("nan")
    optimizer.zero_grad()
    try:
        nn.functional.cross_entropy(ddp(x), y).backward()
    except RuntimeError as e:
        print("RAISED", str(e).split("RuntimeError: ")[-1].split("\n")[0], flush=True)
        if ending == "destroy":
            dist.destroy_process_group()
        elif ending == "exit":
            os._exit(1)
        raise
    print("NO ERROR", flush=True)
    sys.exit(3)


def run_once(world, exchange, ending):
    """What went wrong in one run, None when every rank raised the same error and exited 1."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(world), str(port), exchange, ending],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    deadline = time.time() + TIMEOUT
    codes, outputs = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.time()))
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            codes.append("hung")
        outputs.append((out, err))
    raised = [next((line for line in out.splitlines() if line.startswith("RAISED")), None) for out, _ in outputs]
    if ending.startswith("crash:"):
        survivors = [r for r in range(world) if r != 1]
        if codes[1] == 9 and all(codes[r] == 1 and raised[r] and "Connection" in raised[r] for r in survivors):
            return None
    elif codes == [1] * world and None not in raised and len(set(raised)) == 1 and "rank 1 failed" in raised[0]:
        return None
    lines = [f"exit statuses {codes}"]
    for r, (out, err) in enumerate(outputs):
        lines.append(f"rank {r}: " + " | ".join((out + err).strip().splitlines()[-3:]))
    return "\n".join(lines)


def main():
    failures = 0
    runs = ((2, "allgather", "raise"), (2, "allgather", "destroy"), (3, "reduce", "raise"), (3, "reduce", "exit"),
            (2, "allgather", "crash:1"), (3, "reduce", "crash:0"), (3, "reduce", "crash:1"))
    for world, exchange, ending in runs:
        for run in range(1 if ending.startswith("crash:") else RUNS):  # a crash once (the test's time)
            problem = run_once(world, exchange, ending)
            if problem:
                failures += 1
                print(f"{world} ranks, {exchange}, {ending}, run {run}:\n{problem}", file=sys.stderr)
    if failures:
        print(f"exit_on_error_test: {failures} runs ended otherwise than every rank (every other rank, when "
              "one died) raising and exiting 1", file=sys.stderr)
        return 1
    total = sum(1 if ending.startswith("crash:") else RUNS for _, _, ending in runs)
    print(f"exit_on_error_test: {total} runs, every rank raised the same error and exited 1 (when rank 1 died "
          "mid-step, every other rank raised gloo's lost connection and exited 1)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        sys.exit(main())
