"""A DistributedDataParallel communication hook that sends each bucket sparsified, in one
collective that overlaps the rest of the backward pass.

Per bucket, in the hook body: one C++ call compresses the bucket per tensor (with error
feedback), trims each tensor to a fixed capacity (what is trimmed goes back into the
residual) and packs the result into a payload of fixed size: a 64-byte header, 32-bit
indices, values in the bucket's dtype. One asynchronous all-gather of equal-sized payloads
is issued and its future returned at once; the decode (every rank's entries added in rank
order and averaged, one C++ call) runs in the future's then(), which does local work only.
The step's last bucket is decoded before its hook call returns: that call ends the step
(callbacks.py).

A rank whose compression fails (a NaN, a damaged state) still sends a payload, carrying its
error; every rank's decode then raises the same error naming that rank, and what each rank
sent goes back into its residual. Nothing hangs, nothing desynchronizes.

State is kept per parameter (each tensor's residual, adaptive stages and capacity are its
own), so DDP's bucket rebuild and a new DDP wrapper find it again, and state_dict() /
load_state_dict() resume a run bit for bit.

The package's modules: state.py (State: arguments, keys, statistics, each step's
bookkeeping), agreement.py (what every rank must agree on before a collective),
checkpoint.py (state_dict, load_state_dict), codecs.py (a bucket's codec and the paths
around its collectives), staged.py (the reduce exchange's phases, posted at the step's later
hook calls), callbacks.py (the futures' then(), and the step's end, which no
callback outlives), arguments.py (checks and names); this one registers the hook.
"""
import time

import torch
import torch.distributed as dist

from .codecs import _all_reduce_dense, _all_reduce_slices, _allgather, _reduce, _with_slices
from .state import State


def register(ddp_model, state, comm_hook=None):
    """ddp_model.register_comm_hook(state, comm_hook or sidco_torch.hook), with state keyed by
    the model's parameter names (a checkpoint then survives a change of bucket size or
    parameter order). comm_hook: a hook that wraps sidco_torch.hook, if any."""
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("sidco_torch.register: ddp_model must be a torch.nn.parallel.DistributedDataParallel "
                        f"(the hook is a DDP communication hook), got {type(ddp_model).__name__}; wrap the model "
                        "first: DistributedDataParallel(model)")
    if not isinstance(state, State):
        raise TypeError(f"sidco_torch.register: state must be a sidco_torch.State, got {type(state).__name__}")
    group = getattr(ddp_model, "process_group", None)
    state._check_group(group)
    state.attach(ddp_model.module)
    state._serve_group(group)
    ddp_model.register_comm_hook(state, comm_hook or hook)


def hook(state, bucket):
    """The communication hook: sidco_torch.register(ddp_model, state), or
    ddp_model.register_comm_hook(state, sidco_torch.hook)."""
    called = time.perf_counter()
    try:
        future = _hook_call(state, bucket)
    except BaseException:
        if isinstance(state, State):
            state._callbacks.finish(failed=True)  # no callback outlives a step that raises either
        raise
    # What backward waited for in this call: its compression, the agreements, earlier buckets'
    # staged phases, and at the step's last call the drain and the decodes.
    state._stats[bucket.index()]["hook_seconds"] = time.perf_counter() - called
    return future


def _hook_call(state, bucket):
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    first_call = state._begin_step(bucket.index())
    if not state._agreed:
        state._agree_configuration(group, world, bucket.buffer().device)
    if first_call:
        state._probe_step(group, world, bucket.buffer().device.type)
    for p in bucket.parameters():
        state._key(p)  # a parameter of another model is refused on every path
    iteration = state.iteration
    last = bucket.is_last()
    if last:
        state.iteration += 1
        state._complete = True
        state._in_step = False
    # Earlier buckets' staged exchanges a phase further, before this bucket's collectives.
    state._advance_exchanges()
    state._callbacks.at_step_end = last
    try:
        future = _exchange(state, bucket, group, world, iteration)
    except BaseException:
        # The rounds in flight finish first (the agreements raise on every rank alike, at the
        # same call), so that their decodes put every rank's state in order.
        state._advance_exchanges(drain=True)
        raise
    if last:
        state._advance_exchanges(drain=True)
        state._callbacks.finish()
    return future


def _exchange(state, bucket, group, world, iteration):
    """The bucket's path: dense, or sparse by its exchange; its future."""
    buffer = bucket.buffer()
    reason = state._why_dense(buffer, world, iteration)
    if reason is not None:
        state._agree_wire_format(group, world, bucket, "dense", buffer.numel() * buffer.element_size())
        return _all_reduce_dense(state, bucket, group, world, reason)
    b, problem = state._bucket(bucket, world)
    problem = problem or state._step_problem
    slices = state._dense_slices(bucket)
    dense_values = sum(n for _, n in slices)
    state._agree_wire_format(group, world, bucket, b.exchange, b.payload_bytes(), dense_values)
    started = time.perf_counter()  # after the agreement (a wait for every rank) and the codec's setup
    reduced = _all_reduce_slices(state, b, buffer, slices, group, world) if slices else None
    path = _reduce if b.exchange == "reduce" else _allgather
    future = path(state, bucket, b, group, iteration, problem, started)
    if reduced is None:
        return future
    stats = state._stats[bucket.index()]
    stats["dense_values"] = dense_values  # a staged exchange's bytes_sent adds them when it is set
    stats["bytes_sent"] = stats.get("bytes_sent", 0) + dense_values * buffer.element_size()
    return _with_slices(state, future, reduced, slices)
