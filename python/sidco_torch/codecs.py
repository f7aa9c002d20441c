"""The hook's paths for one bucket: its codec and buffers (_Bucket), the all-gather and
reduce-scatter exchanges around their collectives, and the dense all-reduce. Every
collective is issued from a hook call (the reduce exchange's later phases from the step's
later calls: staged.py); the futures' callbacks do local work only."""
import re
import time
import warnings

import torch
import torch.distributed as dist

from .arguments import ExchangeError
from .ops import _codec, _reduce_codec
from .staged import _Staged


def _exchange_key(keys):
    """What names a reduce exchange's state: its parameters' keys, sorted (DDP may order a
    bucket's parameters otherwise after a reload; the exchange orders them so too)."""
    return "|".join(sorted(keys))


class _Layer:
    """A parameter's state outside any bucket: from load_state_dict, or between layouts."""

    def __init__(self, size, dtype, residual, compressor):
        self.size, self.dtype, self.residual, self.compressor = size, dtype, residual, compressor


class _Bucket:
    """One bucket layout's codec, residual and receive buffers. exchange: "allgather" (one
    all-gather of every rank's payload) or "reduce" (an all-to-all of blocks to the indices'
    owners, then an all-gather of the owners' selections)."""

    def __init__(self, state, keys, sizes, dtype, device, world, rank, exchange, wire):
        self.keys = keys
        self.sizes = sizes
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.dtype = dtype
        self.device = device
        self.exchange = exchange
        self.wire = wire  # "plain", "compact" or "compact8"
        # What it compresses at (this step's density) and plans capacity for (the agreed one).
        self.density, self.capacity_density = state._step_density, state._verified
        numel = sum(sizes)
        # On the bucket's device: a CUDA bucket is encoded, gathered (NCCL) and decoded there.
        self.residual = torch.zeros(numel, dtype=dtype, device=device) if state.feedback else None
        if exchange == "reduce":
            # The exchange lays the parameters out sorted by key: the same in every run.
            order = sorted(range(len(keys)), key=lambda i: keys[i])
            self.codec = _reduce_codec(state.method, state.options, sizes, dtype, self.density, state.capacity_slack,
                                       world, rank, state.owner, self.capacity_density, device, order, wire)
            payload = self.codec.block_bytes()
            self.received = torch.empty(world * payload, dtype=torch.uint8, device=device)
        else:
            self.codec = _codec(state.method, state.options, sizes, dtype, self.density, state.capacity_slack,
                                self.capacity_density, wire)
            payload = self.codec.payload_bytes()
        self.inbox = [torch.empty(payload, dtype=torch.uint8, device=device) for _ in range(world)]

    def payload_bytes(self):
        return self.codec.block_bytes() if self.exchange == "reduce" else self.codec.payload_bytes()

    def exchange_key(self):
        return _exchange_key(self.keys)


def _decoded(state, b, inbox, buffer, stats, decode):
    """decode(inbox, buffer, residual, codec): True once decoded (every rank's header said the
    bucket's density: it is agreed), False when nonfinite="skip" skipped the step (buffer is
    NaN); any other failure raises an ExchangeError."""
    try:
        decode(inbox, buffer, b.residual, b.codec)
    except RuntimeError as e:
        if state.nonfinite == "skip" and _nonfinite_only(inbox):
            state._skipped(stats, buffer)
            return False
        raise state._fail(ExchangeError(_named(str(e), b))) from e
    state._next_verified = b.density
    return True


def _named(message, b):
    """message with the bucket's flat index ("at index N", as sidco's non-finite check says)
    named as a parameter and an element of it: the same on every rank (their buckets agree)."""
    def name(match):
        index = int(match.group(1))
        for key, offset, size in zip(b.keys, b.offsets, b.sizes):
            if offset <= index < offset + size:
                return f"{match.group(0)} (parameter {key}, element {index - offset})"
        return match.group(0)
    return re.sub(r"at index (\d+)", name, message, count=1)


def _nonfinite_only(payloads):
    """Whether the exchange failed only because some rank's values were not finite (read from
    the payloads' headers, the same on every rank)."""
    return bool(torch.ops.sidco.nonfinite_only([p.cpu() for p in payloads]))


def _held_residual(state, p):
    """The residual the state holds for parameter p (its bucket's slice, or what a checkpoint
    gave it before a bucket took it), or None."""
    key = state._key(p)
    owner, pending = state._owner.get(key), state._pending.get(key)
    if owner is not None and owner[0].residual is not None:
        b, i = owner
        return b.residual[b.offsets[i]: b.offsets[i] + b.sizes[i]]
    if pending is not None and pending.residual is not None:
        return pending.residual
    return None


def _fold_residuals(state, bucket):
    """The bucket's buffer with each of its parameters' residuals added, each residual then
    cleared: a parameter all-reduced densely sends its residual too, instead of keeping it
    unsent."""
    buffer = bucket.buffer()
    if not state.feedback:
        return buffer
    if buffer.is_sparse:
        return _fold_into_sparse(state, bucket, buffer)
    offset = 0
    for p in bucket.parameters():
        size, residual = p.numel(), _held_residual(state, p)
        if residual is not None and residual.numel() == size:
            buffer[offset: offset + size].add_(residual.to(device=buffer.device, dtype=buffer.dtype))
            if state.nonfinite == "skip":
                state._undo.append(lambda r=residual, saved=residual.clone(): r.copy_(saved))
            residual.zero_()
        offset += size
    return buffer


def _fold_into_sparse(state, bucket, buffer):
    """A sparse gradient (nn.Embedding(sparse=True), a bucket of its own) is never compressed,
    so its parameter has a residual only from a checkpoint saved while its gradient was dense:
    that residual is sent once, as rows added to a new sparse gradient, and the parameter's
    entry leaves the state (as if the run had been sparse from the start)."""
    (p,) = bucket.parameters()
    key = state._key(p)
    layer = state._pending.get(key)
    if layer is None or layer.residual is None or layer.residual.numel() != p.numel():
        return buffer
    del state._pending[key]
    if state.nonfinite == "skip":
        state._undo.append(lambda: state._pending.__setitem__(key, layer))
    rows = layer.residual.to(device=buffer.device, dtype=buffer.dtype).view(buffer.shape).to_sparse(buffer.sparse_dim())
    return (buffer + rows).coalesce()


def _all_reduce_dense(state, bucket, group, world, reason):
    buffer = _fold_residuals(state, bucket)
    if reason not in state._warned and not reason.startswith("iteration") and not buffer.is_sparse:
        state._warned.add(reason)
        warnings.warn(f"sidco_torch: bucket {bucket.index()} is all-reduced densely: {reason}", stacklevel=3)
    sent_values, sent_bytes = buffer.numel(), buffer.numel() * buffer.element_size()
    if buffer.is_sparse:  # its rows' indices (int64) and values, as the process group gathers them
        sent_values = buffer._values().numel()
        sent_bytes = buffer._indices().numel() * 8 + sent_values * buffer.element_size()
    stats = {"path": "dense", "reason": reason, "size": buffer.numel(), "selected": sent_values,
             "candidates": sent_values, "trimmed": 0, "capacity": sent_values,
             "density": sent_values / max(buffer.numel(), 1), "target_density": state._step_density,
             "threshold": 0.0, "stages": 0, "fallback": False, "compress_seconds": 0.0, "decode_seconds": 0.0,
             "bytes_sent": sent_bytes, "element_size": buffer.element_size(), "failed": False}
    state._stats[bucket.index()] = stats
    sent = time.perf_counter()
    buffer.div_(world)  # first: the sum of averages cannot overflow where the sum could
    state._in_flight.append(buffer)  # see State._in_flight: the all-reduce's work holds it

    def done(future):
        stats["exchange_seconds"] = time.perf_counter() - sent
        reduced = future.value()[0]
        values = reduced.coalesce().values() if reduced.is_sparse else reduced
        if state.nonfinite == "skip" and not bool(torch.isfinite(values).all()):
            state._skip = state._step_iteration  # the same sum on every rank: every rank skips
            stats["skipped"] = True
        return reduced

    return state._callbacks.then(dist.all_reduce(buffer, group=group, async_op=True).get_future(), done)


def _all_reduce_slices(state, b, buffer, slices, group, world):
    """State(dense_parameters=...): the bucket's slices that hold them leave it before it is
    compressed (zeros stay, which the compressor passes over; a residual they held from before
    goes with them, put back if nonfinite="skip" skips the step) and are averaged by one
    asynchronous all_reduce of their own."""
    parts = []
    for offset, size in slices:
        part = buffer[offset: offset + size]
        if b.residual is not None:
            held = b.residual[offset: offset + size]
            part.add_(held.to(part.dtype))
            if state.nonfinite == "skip":
                state._undo.append(lambda r=held, saved=held.clone(): r.copy_(saved))
            held.zero_()
        parts.append(part.clone())
        part.zero_()
    values = torch.cat(parts).div_(world)  # first: the sum of averages cannot overflow where the sum could
    state._in_flight.append(values)
    return dist.all_reduce(values, group=group, async_op=True).get_future()


def _with_slices(state, future, reduced, slices):
    """The bucket's future with the densely averaged slices written back in (local work)."""
    def merged(both):
        sparse, dense = both.value()
        out = sparse.value()  # a failed exchange raises here
        values = dense.value()[0]
        at = 0
        for offset, size in slices:
            out[offset: offset + size].copy_(values[at: at + size])
            at += size
        return out

    return state._callbacks.then(torch.futures.collect_all([future, reduced]), merged)


def _sparse_stats(state, b, buffer, report, compress_seconds, bytes_sent):
    """A sparse bucket's statistics from its codec's report (State.stats() lists them)."""
    return {"path": "sparse", "exchange": b.exchange, "size": buffer.numel(), "selected": int(report["selected"]),
            "candidates": int(report["candidates"]), "trimmed": int(report["trimmed"]),
            "capacity": int(report["capacity"]), "density": report["density"], "target_density": state._step_density,
            "threshold": report["threshold"], "stages": int(report["stages"]), "fallback": bool(report["fallback"]),
            "compress_seconds": compress_seconds, "bytes_sent": bytes_sent, "failed": bool(report["failed"]),
            "element_size": buffer.element_size(),
            "wire": b.wire,
            # what this rank's payload costs each entry it carries (headers and slack included)
            "bytes_per_entry": bytes_sent / max(1, int(report["selected"]))}


def _encode(state, bucket, b, iteration, problem, encode, encode_failure):
    """This rank's payload (or blocks) by encode, or its problem by encode_failure, so that
    every rank raises it; with nonfinite="skip", what the step will change is kept first."""
    buffer = bucket.buffer()
    if state.nonfinite == "skip":
        state._save_bucket(b)
    if problem is None:
        return encode(buffer, b.residual, b.codec, bucket.index(), iteration)
    return encode_failure(buffer, b.codec, problem, bucket.index(), iteration)


def _gather_and_decode(state, b, buffer, sent, group, encoded, stats, decode):
    """One asynchronous all-gather of sent into the bucket's inbox, decoded by decode in the
    future's then() (local work only)."""
    state._in_flight.append(sent)
    gathered = dist.all_gather(b.inbox, sent, group=group, async_op=True).get_future()
    return _decode_when(state, b, buffer, gathered, encoded, stats, decode)


def _decode_when(state, b, buffer, future, encoded, stats, decode, more_stats=None, unpack=None):
    """The bucket's inbox decoded by decode in future's then() (local work only), once the
    collective that fills it (future) is done."""
    def done(future):
        future.value()  # a failed collective raises here
        began = time.perf_counter()
        stats["exchange_seconds"] = began - encoded
        if unpack is not None:
            unpack()
        if not _decoded(state, b, b.inbox, buffer, stats, decode):
            return buffer
        stats["decode_seconds"] = time.perf_counter() - began
        if more_stats is not None:
            stats.update(more_stats(b.codec.report()))
        return buffer

    return state._callbacks.then(future, done)


def _reduce(state, bucket, b, group, iteration, problem, started):
    """The reduce-scatter exchange: blocks to the indices' owners, then each owner's selection
    to every rank, staged (staged.py): the phases are posted at this and the step's later hook
    calls, never waited for in this one, and the decode runs in the future's then() (local
    work only). CPU buckets move flat (_framed_stages) or in two hops (_two_hop_stages, by
    State.schedule_for); CUDA buckets move flat, in the compact codings framed, in the plain
    one at the heads the longest block uses (_plain_head_stages)."""
    buffer = bucket.buffer()
    blocks = _encode(state, bucket, b, iteration, problem, torch.ops.sidco.reduce_encode,
                     torch.ops.sidco.reduce_encode_failure)
    encoded = time.perf_counter()
    # Filled in once the owners have selected (its first phases are still to come).
    stats = {"path": "sparse", "exchange": "reduce", "wire": b.wire, "failed": False}
    state._stats[bucket.index()] = stats
    moved = {"unpack": lambda: None}  # what the last phase leaves the decode
    if blocks.device.type == "cpu" and state.schedule_for(len(b.inbox)) == "two-hop":
        stages = _two_hop_stages(state, b, buffer, group, blocks, encoded - started, stats, moved, bucket.index())
    elif blocks.device.type == "cpu" or b.wire in ("compact", "compact8"):
        stages = _framed_stages(state, b, buffer, group, blocks, encoded - started, stats, moved)
    else:
        stages = _plain_head_stages(state, b, buffer, group, blocks, encoded - started, stats, moved)
    staged = _Staged(state, stages)
    state._staged.append(staged)
    return _decode_when(state, b, buffer, staged.future, encoded, stats, torch.ops.sidco.reduce_decode,
                        lambda done: _reduce_stats(buffer, moved["bytes_received"])(done),
                        unpack=lambda: moved["unpack"]())


def _reduce_stats(buffer, bytes_received):
    """The reduce exchange's statistics from its codec's report after the decode."""
    def more(done):
        return dict(union_density=done["union_entries"] / buffer.numel(),
                    global_density=done["global_selected"] / buffer.numel(), returned=int(done["returned"]),
                    bytes_received=bytes_received, dropped=done["returned"] / max(1.0, done["selected"]))
    return more


def _selected(state, b, buffer, stats, compress_seconds, schedule):
    """Round 2's selection from the blocks in b.received (the bucket and residual are checked
    here, before the selections move: a problem travels), and the bucket's statistics."""
    selection = torch.ops.sidco.reduce_select(b.received, buffer, b.residual, b.codec)
    stats.update(_sparse_stats(state, b, buffer, b.codec.report(), compress_seconds, 0))
    stats["schedule"] = schedule
    return selection


def _sent(stats, bytes_sent):
    """What this rank handed the exchange's collectives for the others, in the bucket's
    statistics (bytes_sent adds the dense slices' all-reduce: State(dense_parameters=...))."""
    stats["bytes_sent"] = bytes_sent + stats.get("dense_values", 0) * stats["element_size"]
    stats["bytes_per_entry"] = bytes_sent / max(1, stats["selected"])


def _framed_stages(state, b, buffer, group, blocks, compress_seconds, stats, moved):
    """The flat schedule with each payload at the size it uses (comm/reduce/frames.hpp: a
    count, the values, the indices gap-coded; each block led by the digest of the step's
    fields, which its owner checks), on the bucket's device, in four phases: the blocks' sizes
    (all-to-all), the blocks at those split sizes (all-to-all), the longest selection's size
    (all-reduce), the selections at that size (all-gather)."""
    world, size = len(b.inbox), b.payload_bytes()
    rank = dist.get_rank(group)
    device = blocks.device
    frames, sizes = torch.ops.sidco.reduce_frames(blocks, b.codec, False)
    incoming = torch.empty_like(sizes)
    state._in_flight.extend([frames, sizes, incoming])
    yield [dist.all_to_all_single(incoming, sizes, group=group, async_op=True)]

    sent_sizes, received_sizes = sizes.tolist(), incoming.tolist()
    received = torch.empty(sum(received_sizes), dtype=torch.uint8, device=device)
    state._in_flight.append(received)
    yield [dist.all_to_all_single(received, frames, output_split_sizes=received_sizes,
                                  input_split_sizes=sent_sizes, group=group, async_op=True)]

    torch.ops.sidco.reduce_unframe(received, received_sizes, list(b.received.view(world, size).unbind(0)), b.codec,
                                   False)
    selection = _selected(state, b, buffer, stats, compress_seconds, "flat")
    frame = torch.ops.sidco.reduce_frames(selection, b.codec, True)[0]
    longest = torch.tensor([frame.numel()], dtype=torch.int64, device=device)
    state._in_flight.append(longest)
    yield [dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group, async_op=True)]

    head = int(longest.item())
    sent = torch.zeros(head, dtype=torch.uint8, device=device)
    sent[:frame.numel()] = frame
    gathered = [torch.empty(head, dtype=torch.uint8, device=device) for _ in range(world)]
    state._in_flight.extend([sent, *gathered])
    # Its P - 1 blocks' messages, its selection's (at the agreed head), and the sizes.
    _sent(stats, sum(sent_sizes) - sent_sizes[rank] + head + 8 * (world - 1))
    moved["bytes_received"] = sum(received_sizes) - received_sizes[rank] + (world - 1) * (head + 8)
    moved["unpack"] = lambda: torch.ops.sidco.reduce_unframe(torch.cat(gathered), [head] * world, b.inbox, b.codec,
                                                             True)
    return dist.all_gather(gathered, sent, group=group, async_op=True).get_future()


def _plain_head_stages(state, b, buffer, group, blocks, compress_seconds, stats, moved):
    """The flat schedule for CUDA buckets in the plain coding, in three phases: the head the
    longest block uses (all-reduce; the payloads are zero past what they use, so the
    receivers read the same bytes), the blocks at that head (all-to-all), the selections at
    the head they can use (all-gather): the slack and the minimum size stay home."""
    world, size = len(b.inbox), b.payload_bytes()
    longest = torch.tensor([int(b.codec.report()["longest_block"])], dtype=torch.int64, device=blocks.device)
    state._in_flight.append(longest)
    yield [dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group, async_op=True)]

    head = min(size, max(64, int(longest.item())))
    if head < size:
        received = torch.empty(world * head, dtype=torch.uint8, device=blocks.device)
        heads = blocks.view(world, size)[:, :head].contiguous().view(-1)
        state._in_flight.extend([received, heads])
        yield [dist.all_to_all_single(received, heads, group=group, async_op=True)]
        slots = b.received.view(world, size)
        slots[:, :head].copy_(received.view(world, head))
        slots[:, head:].zero_()
    else:
        state._in_flight.append(blocks)
        yield [dist.all_to_all_single(b.received, blocks, group=group, async_op=True)]

    selection = _selected(state, b, buffer, stats, compress_seconds, "flat")
    # The selections' head without another round: an owner keeps at most its share of what it
    # received, received / P entries rounded (comm/reduce/steps.hpp), so at most what the
    # longest block holds; a failure's message takes at most 64 + 256 bytes.
    chosen = min(size, max(head, 64 + 256))
    sent, into = (selection[:chosen], [p[:chosen] for p in b.inbox]) if chosen < size else (selection, b.inbox)
    for p in b.inbox:
        p[chosen:].zero_()  # the decode reads whole payloads
    state._in_flight.extend([sent, *into])
    _sent(stats, (world - 1) * head + chosen)
    moved["bytes_received"] = (world - 1) * (head + chosen)
    return dist.all_gather(into, sent, group=group, async_op=True).get_future()


def _post_hops(state, group, phase, tag):
    """One phase of the two-hop schedule posted: its messages sent (isend) and received
    (irecv, into buffers zeroed first: a message lies at the front of its buffer). Returns
    the work to wait for and the buffers that receive."""
    peers, messages, sources, most = phase
    ranks = state._group_ranks(group)
    received = [torch.zeros(n, dtype=torch.uint8) for n in most]
    state._in_flight.extend([*messages, *received])
    work = [dist.isend(m, ranks[p], group=group, tag=tag) for p, m in zip(peers, messages)]
    work += [dist.irecv(r, ranks[p], group=group, tag=tag) for p, r in zip(sources, received)]
    return work, received


def _two_hop_stages(state, b, buffer, group, blocks, compress_seconds, stats, moved, index):
    """The two-hop schedule for CPU buckets (State(reduce_schedule=...); sidco/comm/reduce/
    hops.hpp, the MPI exchange's router): each rank's blocks, as frames at their own size, go
    to the owners through an intermediate of a sqrt(P) grid, and the owners' selections come
    back the same way: O(sqrt P) messages a rank each way, where the flat schedule's
    all-to-all and ring all-gather take P - 1. Four phases of send/recv: the blocks' two hops,
    then the selections', each tagged by the bucket (index) and the phase, so that no two
    messages in flight between two ranks share a tag."""
    world, size = len(b.inbox), b.payload_bytes()
    sidco = torch.ops.sidco
    tag = 4 * index
    work, first = _post_hops(state, group, sidco.reduce_hops_first(blocks, b.codec, False), tag + 1)
    yield work
    work, second = _post_hops(state, group, sidco.reduce_hops_second(first, b.codec, False), tag + 2)
    yield work
    blocks_sent, blocks_received = sidco.reduce_hops_finish(second, list(b.received.view(world, size).unbind(0)),
                                                            b.codec, False)
    selection = _selected(state, b, buffer, stats, compress_seconds, "two-hop")
    _sent(stats, blocks_sent)
    work, inbound = _post_hops(state, group, sidco.reduce_hops_first(selection, b.codec, True), tag + 3)
    yield work
    work, inbound = _post_hops(state, group, sidco.reduce_hops_second(inbound, b.codec, True), tag + 4)
    yield work
    sent, received = sidco.reduce_hops_finish(inbound, b.inbox, b.codec, True)
    _sent(stats, blocks_sent + sent)
    moved["bytes_received"] = blocks_received + received
    return None


def _allgather(state, bucket, b, group, iteration, problem, started):
    """The all-gather exchange: this rank's payload all-gathered asynchronously, every
    rank's decoded in the future's then() (local work only)."""
    buffer = bucket.buffer()
    payload = _encode(state, bucket, b, iteration, problem, torch.ops.sidco.encode, torch.ops.sidco.encode_failure)
    report = b.codec.report()
    encoded = time.perf_counter()
    # Compact payloads go whole too (zeros after what they use): agreeing the longest used
    # head first saved 15-18% of their bytes but waited in the hook body for every rank and
    # for the earlier buckets' exchanges, bucket after bucket (docs/PYTORCH.md).
    stats = _sparse_stats(state, b, buffer, report, encoded - started, payload.numel())
    state._stats[bucket.index()] = stats
    return _gather_and_decode(state, b, buffer, payload, group, encoded, stats, torch.ops.sidco.decode)
