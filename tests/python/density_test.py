#!/usr/bin/python3
"""Density schedules and State.set_density on gloo ranks. Checked:
- a schedule (density=lambda iteration: ...) and set_density() called at the same step give
  the same training, bit for bit; every step's payload header carries that step's density;
  the capacity follows one step after a change (the changing step still fits the old one);
  nothing is lost at the change: sent + new residual = gradient + old residual, every step;
- a density set on one rank only: the next exchange raises the same error on every rank,
  naming both densities, without hanging;
- resume across a change (the checkpoint taken right before the changing step, whose
  capacity still follows the old density) repeats the uninterrupted run bit for bit, for the all-gather (2 ranks) and reduce (3 ranks) exchanges;
- a schedule that returns a bad value raises ValueError naming the iteration and the value
  (at construction for iteration 0; later, on every rank alike)."""
import io
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import sidco_torch
from hook_test import batch, make, read_payload, recording_hook, run, train_step

CHANGE, STEPS = 3, 6


def schedule(iteration):
    return 0.2 if iteration < CHANGE else 0.05


def scenario_schedule(rank, world):
    records, per_step = [], []
    state = sidco_torch.State(wire="plain", method="sidco-e", density=schedule, start_iter=1, exchange="allgather")
    model, ddp, optimizer = make(state, rank, hook=recording_hook(records))
    for step in range(STEPS):
        records.clear()
        train_step(ddp, optimizer, rank, step)
        sparse = [r for r in records if r["path"] == "sparse"]
        assert step < 1 or sparse, f"step {step}: no sparse bucket"
        for r in sparse:
            header, indices, values = read_payload(r["inbox"][rank], r["before"].dtype)
            assert header["sequence"] == step and header["delta"] == schedule(step), (step, header)
            assert r["stats"]["target_density"] == schedule(step), r["stats"]
            sent = torch.zeros_like(r["before"])
            sent[indices] = values
            assert torch.equal(sent + r["new"], r["before"] + r["old"]), f"step {step}: mass lost at the change"
        per_step.append({r["index"]: header_capacity(r, rank) for r in sparse})
    # Capacity: planned for 0.2 through the changing step, for 0.05 after it.
    for index, capacity in per_step[CHANGE].items():
        assert capacity == per_step[CHANGE - 1][index], (index, per_step)
        assert per_step[CHANGE + 1][index] < capacity / 3, (index, per_step)
    scheduled = [p.detach().clone() for p in model.parameters()]
    # The same with set_density() at the same step.
    state = sidco_torch.State(wire="plain", method="sidco-e", density=0.2, start_iter=1, exchange="allgather")
    model, ddp, optimizer = make(state, rank)
    for step in range(STEPS):
        if step == CHANGE:
            state.set_density(0.05)
        assert state.density == schedule(step)
        train_step(ddp, optimizer, rank, step)
    for a, b in zip(scheduled, model.parameters()):
        assert torch.equal(a, b.detach()), "set_density differs from the schedule"
    return f"capacities {per_step[CHANGE - 1]} -> {per_step[CHANGE + 1]}; schedule = set_density, bit for bit"


def header_capacity(record, rank):
    header, _, _ = read_payload(record["inbox"][rank], record["before"].dtype)
    return header["capacity"]


def failing_step(ddp, optimizer, rank, step):
    """The first line of the error this step raises (it must raise)."""
    try:
        train_step(ddp, optimizer, rank, step)
    except RuntimeError as e:
        # backward() raised at the first failed bucket; the later buckets' collectives may still
        # run: a barrier after them, so that no rank tears the group down under a peer's.
        dist.barrier()
        return str(e).split("ExchangeError: ")[-1].split("\n")[0]
    raise AssertionError(f"rank {rank}: no error at step {step}")


def scenario_one_rank(rank, world):
    state = sidco_torch.State(wire="plain", method="sidco-e", density=0.05, start_iter=1)
    model, ddp, optimizer = make(state, rank)
    for step in range(2):
        train_step(ddp, optimizer, rank, step)
    if rank == 1:
        state.set_density(0.02)
    message = failing_step(ddp, optimizer, rank, 2)
    assert "has density 0.02, rank 0 has 0.05" in message, message
    return message


def scenario_resume(rank, world, exchange):
    def fresh():
        return sidco_torch.State(wire="plain", method="sidco-e", density=schedule, start_iter=1, exchange=exchange)

    def build(state):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1, find_unused_parameters=True)
        sidco_torch.register(ddp, state)
        return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    state = fresh()
    model, ddp, optimizer = build(state)
    for step in range(STEPS):
        train_step(ddp, optimizer, rank, step)
    uninterrupted = [p.detach().clone() for p in model.parameters()]
    state = fresh()
    model, ddp, optimizer = build(state)
    for step in range(CHANGE):
        train_step(ddp, optimizer, rank, step)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sidco": state.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved)
    assert checkpoint["sidco"]["agreed_density"] == schedule(CHANGE - 1), checkpoint["sidco"]["agreed_density"]
    state = fresh()
    state.load_state_dict(checkpoint["sidco"])
    model, ddp, optimizer = build(state)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    for step in range(CHANGE, STEPS):
        train_step(ddp, optimizer, rank, step)
    for a, b in zip(uninterrupted, model.parameters()):
        assert torch.equal(a, b.detach()), f"resumed run differs by {(a - b.detach()).abs().max().item()}"
    return "bit-identical"


def scenario_bad_schedule(rank, world):
    state = sidco_torch.State(wire="plain", method="sidco-e", density=lambda it: 0.05 if it < 2 or rank == 0 else 1.5,
                              start_iter=1)
    model, ddp, optimizer = make(state, rank)
    for step in range(2):
        train_step(ddp, optimizer, rank, step)
    message = failing_step(ddp, optimizer, rank, 2)
    assert "rank 1 failed" in message and "density(2) = 1.5 is outside (0, 1]" in message, message
    return message


def scenario_warnings(rank, world):
    """A world of one, and a density under one entry per small tensor, say so once."""
    import warnings
    state = sidco_torch.State(wire="plain", method="sidco-e", density=0.0001, start_iter=0)
    model, ddp, optimizer = make(state, rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            train_step(ddp, optimizer, rank, step)
    said = [str(w.message) for w in caught if "sidco_torch" in str(w.message)]
    assert sum("a world of one rank" in m for m in said) == 1, said
    dense = [m for m in said if "x the density asked (0.0001)" in m]
    assert dense and all("each tensor keeps at least one entry" in m for m in dense), said
    assert len(dense) == len(set(dense)), f"warned more than once: {dense}"
    return dense[0]


def check_arguments():
    for density, expected in [(lambda it: 0.0, "density(0) = 0.0 is outside (0, 1]"),
                              (lambda it: "x", "density(0) must be a real number")]:
        try:
            sidco_torch.State(density=density)
        except (ValueError, TypeError) as e:
            assert expected in str(e), e
        else:
            raise AssertionError(f"{expected}: accepted")
    state = sidco_torch.State(density=0.1)
    try:
        state.set_density(2)
    except ValueError as e:
        assert "density = 2.0 is outside (0, 1]" in str(e), e
    else:
        raise AssertionError("set_density(2) accepted")
    assert state.density == 0.1


def main():
    check_arguments()
    print("warnings:", run(scenario_warnings, 1)[0])
    print("schedule:", run(scenario_schedule, 2)[0])
    print("density set on rank 1 only:", run(scenario_one_rank, 2)[0])
    print("a schedule that fails on rank 1:", run(scenario_bad_schedule, 2)[0])
    for exchange, world in (("allgather", 2), ("reduce", 3)):
        print(f"resume across a change ({exchange}, {world} ranks):", run(scenario_resume, world, exchange,
                                                                        timeout=240)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
