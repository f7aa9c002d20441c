#!/usr/bin/python3
"""State(nonfinite="skip"), the mixed-precision loop's rule, on gloo ranks: an overflow (inf)
injected into one rank's gradients at one step makes every rank's reduced gradients
non-finite at that step, so that a GradScaler's rule (a non-finite gradient after the
exchange: skip the optimizer step) skips it on every rank; afterwards every rank continues
exactly as a run that never took that step does (parameters, residuals, adaptive state and
the iteration count, bit for bit). Checked for the all-gather exchange (2 ranks, overflow in
the sparse buckets and in a small dense bucket, during the dense warm-up, and at the step a
density schedule sends every bucket densely, their residuals folded in) and the
reduce-scatter exchange (3 ranks, flat and in two hops; 16 ranks, whose owners fit SIDCo-E),
and for an overflow in an nn.Embedding(sparse=True) gradient, all-reduced as DDP does (2 and
3 ranks). torch 1.13's GradScaler is CUDA-only (on CPU it disables itself), so the rule is
written out here; the GPU check runs a real one."""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import sidco_torch
from hook_test import SparseEmbedding, assert_same_exchanges, batch, make, run, token_batch

STEPS = 6


def rule_step(ddp, optimizer, rank, step, overflow_rank=None, where="first"):
    """One training step by GradScaler's rule; returns whether the step was skipped."""
    x, y = batch(rank, step)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(ddp(x), y)
    if rank == overflow_rank:
        # An overflow in one layer's gradient only (what a too-large loss scale does first).
        layer = ddp.module.first if where == "first" else ddp.module.last
        layer.weight.register_hook(lambda g: g * float("inf") if not getattr(layer, "_done", False) else g)
    loss.backward()
    if rank == overflow_rank:
        layer._done = True
    finite = finite_gradients(ddp)
    if finite:
        optimizer.step()
    return not finite


def finite_gradients(ddp):
    """GradScaler's test: every gradient finite (a sparse one's values)."""
    return all(bool(torch.isfinite(p.grad.coalesce().values() if p.grad.is_sparse else p.grad).all())
               for p in ddp.parameters() if p.grad is not None)


def assert_same_as_without(rank, model_a, state_a, model_b, state_b):
    """Run A (a step skipped) against run B (that step never taken): parameters, iteration,
    every layer's compressor state and residual, and the exchanges' state, bit for bit."""
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(a, b), f"rank {rank}: {name} differs by {(a - b).abs().max().item()}"
    sa, sb = state_a.state_dict(), state_b.state_dict()
    assert sa["iteration"] == sb["iteration"] == STEPS - 1, (sa["iteration"], sb["iteration"])
    assert sa["layers"].keys() == sb["layers"].keys()
    for key, layer in sa["layers"].items():
        other = sb["layers"][key]
        assert torch.equal(layer["compressor"], other["compressor"]), f"rank {rank}: {key}'s compressor state differs"
        assert (layer["residual"] is None) == (other["residual"] is None), f"rank {rank}: {key}'s residual"
        if layer["residual"] is not None:
            assert torch.equal(layer["residual"], other["residual"]), f"rank {rank}: {key}'s residual differs"
    assert_same_exchanges(sa["exchanges"], sb["exchanges"], f"rank {rank}")
    assert state_a.skipped_steps == 1, state_a.skipped_steps


def scenario_skip(rank, world, exchange, skipped_step, where, start_iter, min_bucket_elements, dense_from=None,
                  all_dense_from=None, density=0.05):
    """dense_from: from that iteration on, last.bias is one of dense_parameters (its residual,
    held from the sparse steps before, goes with it; a skipped step must put it back).
    all_dense_from: from that iteration on, a density schedule sends every bucket densely
    (each bucket's residual folded into it; a skipped step must put them back).
    exchange "reduce:two-hop": the reduce exchange with reduce_schedule="two-hop". From 16
    ranks (at density 0.01) the reduce exchange's owners fit SIDCo-E (checked: their state
    moves after the skipped step), so the owner state a skipped step puts back is one that
    changes; below, they run the exact Top-k."""
    exchange, _, schedule = exchange.partition(":")

    def fresh():
        holder = []
        dense = None if dense_from is None else (lambda name, p: name == "last.bias" and holder[0].iteration >= dense_from)
        scheduled = density if all_dense_from is None else (lambda t: density if t < all_dense_from else 0.9)
        state = sidco_torch.State(wire="plain", method="sidco-e", density=scheduled, start_iter=start_iter, exchange=exchange,
                                  nonfinite="skip", min_bucket_elements=min_bucket_elements, dense_parameters=dense,
                                  reduce_schedule=schedule or "auto")
        holder.append(state)
        return state
    # Run A: the overflow at skipped_step on rank 1; run B: that step never taken.
    state_a = fresh()
    model_a, ddp_a, opt_a = make(state_a, rank)
    skipped = [rule_step(ddp_a, opt_a, rank, step, 1 if step == skipped_step else None, where) for step in range(STEPS)]
    assert skipped == [step == skipped_step for step in range(STEPS)], f"rank {rank} skipped {skipped}"
    paths = {s["size"]: s["path"] for s in state_a.stats().values()}
    state_b = fresh()
    model_b, ddp_b, opt_b = make(state_b, rank)
    owners_fit = exchange == "reduce" and world >= 16
    for step in range(STEPS):
        if step != skipped_step:
            rule_step(ddp_b, opt_b, rank, step)
        if owners_fit and step == skipped_step - 1:
            before_skip = state_b.state_dict()["exchanges"]
    if owners_fit:
        # Owners fitted after the skipped step: on the plain wire nothing else in their state moves.
        after = state_b.state_dict()["exchanges"]
        assert any(not torch.equal(after[key], saved) for key, saved in before_skip.items()), \
            "no owner fitted after the skipped step: the test tests less"
    assert_same_as_without(rank, model_a, state_a, model_b, state_b)
    return (f"step {skipped_step} skipped on every rank, then bit-identical to a run without it (buckets: "
            + ", ".join(f"{size} values {path}" for size, path in sorted(paths.items())) + ")")


def scenario_skip_sparse_gradient(rank, world, exchange, skipped_step):
    """An overflow in one rank's nn.Embedding(sparse=True) gradient, which the hook all-reduces
    as DDP does (a bucket of its own): every rank skips that step, and the model's compressed
    buckets then continue as a run without that step, bit for bit."""

    def run_once(overflow_step):
        state = sidco_torch.State(wire="plain", method="sidco-e", density=0.05, start_iter=0, exchange=exchange,
                                  nonfinite="skip")
        torch.manual_seed(0)
        model = SparseEmbedding()
        ddp = DDP(model, bucket_cap_mb=0.05)
        sidco_torch.register(ddp, state)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        skipped = []
        for step in range(STEPS):
            if overflow_step is None and step == skipped_step:
                continue  # run B: that step never taken
            tokens, labels = token_batch(rank, step)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(tokens), labels)
            handle = None
            if rank == 1 and step == overflow_step:
                handle = model.embed.weight.register_hook(lambda grad: grad * float("inf"))
            loss.backward()
            if handle is not None:
                handle.remove()
            finite = finite_gradients(ddp)
            if finite:
                optimizer.step()
            skipped.append(not finite)
        return model, state, skipped

    model_a, state_a, skipped = run_once(skipped_step)
    assert skipped == [step == skipped_step for step in range(STEPS)], f"rank {rank} skipped {skipped}"
    model_b, state_b, _ = run_once(None)
    assert_same_as_without(rank, model_a, state_a, model_b, state_b)
    return f"step {skipped_step} skipped on every rank, then bit-identical to a run without it"


def scenario_raise(rank, world):
    """The default: the same overflow raises on every rank, naming the rank."""
    state = sidco_torch.State(method="sidco-e", density=0.05, start_iter=1)
    model, ddp, optimizer = make(state, rank)
    rule_step(ddp, optimizer, rank, 0)
    try:
        rule_step(ddp, optimizer, rank, 1, overflow_rank=1)
    except RuntimeError as e:
        message = str(e)
        dist.barrier()  # after the later buckets' collectives, before any rank tears the group down
    else:
        raise AssertionError(f"rank {rank}: no error with nonfinite='raise'")
    assert "rank 1 failed" in message and "non-finite" in message, message
    # Named as a parameter, not a flat index of the bucket; the same object on the State.
    assert "(parameter first.weight, element " in message, message
    assert message.startswith("Got the following error when running the callback: ExchangeError: "), message
    assert isinstance(state.error, sidco_torch.ExchangeError) and str(state.error) in message, state.error
    return message.split("ExchangeError: ")[1].split("\n")[0]


def check_arguments():
    try:
        sidco_torch.State(nonfinite="ignore")
    except ValueError as e:
        assert "nonfinite = 'ignore'" in str(e), e
    else:
        raise AssertionError("nonfinite='ignore' accepted")


def main():
    check_arguments()
    print("raise (the default):", run(scenario_raise, 2)[0])
    # Buckets after the first step: 'middle' and 'last' (133,898 values), 'first' (16,896);
    # min_bucket_elements 20,000 sends 'first' densely.
    for exchange, world, step, where, start_iter, smallest in [("allgather", 2, 3, "first", 1, 3000),
                                                               ("allgather", 2, 3, "first", 1, 20000),
                                                               ("allgather", 2, 0, "last", 2, 3000),
                                                               ("reduce", 3, 2, "last", 1, 3000),
                                                               ("reduce:two-hop", 3, 2, "last", 1, 3000)]:
        out = run(scenario_skip, world, exchange, step, where, start_iter, smallest, timeout=240)
        print(f"skip ({exchange}, {world} ranks, overflow in '{where}' at step {step}, start_iter {start_iter}, "
              f"min_bucket_elements {smallest}):", out[0])
    out = run(scenario_skip, 16, "reduce", 3, "last", 1, 3000, None, None, 0.01, timeout=240)
    print("skip (reduce, 16 ranks in two hops, density 0.01, the owners fitted, overflow in 'last' at step 3):", out[0])
    out = run(scenario_skip, 2, "allgather", 2, "first", 1, 3000, 2, timeout=240)
    print("skip with last.bias going dense at that step (its residual put back):", out[0])
    out = run(scenario_skip, 2, "allgather", 3, "last", 1, 3000, None, 3, timeout=240)
    print("skip with every bucket going dense at that step by the density schedule (their residuals put back):",
          out[0])
    for exchange, world in (("allgather", 2), ("reduce", 3)):
        out = run(scenario_skip_sparse_gradient, world, exchange, 2, timeout=240)
        print(f"skip, overflow in a sparse embedding gradient ({exchange}, {world} ranks):", out[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
