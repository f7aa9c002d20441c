"""The hook's paths for one bucket: its codec and buffers (_Bucket), the all-gather and
reduce-scatter exchanges around their collectives, and the dense all-reduce. Every
collective is issued from the hook body; the futures' callbacks do local work only."""
import re
import time
import warnings

import torch
import torch.distributed as dist

from .arguments import ExchangeError
from .ops import _codec, _reduce_codec


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
        self.wire = wire  # "plain", "compact" or (the all-gather) "compact8"
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


def _fold_residuals(state, bucket):
    """Adds each of the bucket's parameters' residuals into the bucket and clears it: a
    parameter all-reduced densely sends its residual too, instead of keeping it unsent."""
    if not state.feedback:
        return
    buffer = bucket.buffer()
    offset = 0
    for p in bucket.parameters():
        key, size = state._key(p), p.numel()
        owner, pending = state._owner.get(key), state._pending.get(key)
        if owner is not None and owner[0].residual is not None:
            b, i = owner
            residual = b.residual[b.offsets[i]: b.offsets[i] + b.sizes[i]]
        elif pending is not None and pending.residual is not None:
            residual = pending.residual
        else:
            residual = None
        if residual is not None and residual.numel() == size:
            buffer[offset: offset + size].add_(residual.to(device=buffer.device, dtype=buffer.dtype))
            if state.nonfinite == "skip":
                state._undo.append(lambda r=residual, saved=residual.clone(): r.copy_(saved))
            residual.zero_()
        offset += size


def _all_reduce_dense(state, bucket, group, world, reason):
    buffer = bucket.buffer()
    _fold_residuals(state, bucket)
    if reason not in state._warned and not reason.startswith("iteration"):
        state._warned.add(reason)
        warnings.warn(f"sidco_torch: bucket {bucket.index()} is all-reduced densely: {reason}", stacklevel=3)
    stats = {"path": "dense", "reason": reason, "size": buffer.numel(), "selected": buffer.numel(),
             "candidates": buffer.numel(), "trimmed": 0, "capacity": buffer.numel(), "density": 1.0,
             "target_density": state._step_density, "threshold": 0.0, "stages": 0, "fallback": False,
             "compress_seconds": 0.0, "decode_seconds": 0.0, "bytes_sent": buffer.numel() * buffer.element_size(),
             "element_size": buffer.element_size(), "failed": False}
    state._stats[bucket.index()] = stats
    sent = time.perf_counter()
    buffer.div_(world)  # first: the sum of averages cannot overflow where the sum could
    state._in_flight.append(buffer)  # see State._in_flight: the all-reduce's work holds it

    def done(future):
        stats["exchange_seconds"] = time.perf_counter() - sent
        reduced = future.value()[0]
        if state.nonfinite == "skip" and not bool(torch.isfinite(reduced).all()):
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


def _gather_and_decode(state, b, buffer, sent, group, encoded, stats, decode, more_stats=None, into=None,
                       unpack=None):
    """One asynchronous all-gather of sent into the bucket's inbox (or into, views of its
    heads, or tensors unpack() writes into the inbox first), decoded by decode in the
    future's then() (local work only); more_stats(codec report) adds to the statistics."""
    state._in_flight.extend([sent, *(into or [])])
    gathered = dist.all_gather(into or b.inbox, sent, group=group, async_op=True).get_future()
    return _decode_when(state, b, buffer, gathered, encoded, stats, decode, more_stats, unpack)


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


def _agreed_head(state, used, size, group, device):
    """The head every rank sends of each of its payloads (of size bytes): the longest any
    rank's uses (used: this rank's longest), by one all-reduce of an integer; the payloads
    are zero past what they use, so the receivers read the same bytes."""
    longest = torch.tensor([int(used)], dtype=torch.int64, device=device)
    state._in_flight.append(longest)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    return min(size, max(64, int(longest.item())))


def _heads(payload, inbox, head):
    """What an all-gather at an agreed head sends and receives into: payload's head and
    each inbox slot's, whose tails are zeroed (what pack left), so the decode reads whole
    payloads."""
    for p in inbox:
        p[head:].zero_()
    return payload[:head], [p[:head] for p in inbox]


def _reduce(state, bucket, b, group, iteration, problem, started):
    """The reduce-scatter exchange: blocks to the indices' owners (all_to_all_single, waited
    for here: the owners' selection needs them), each owner's selection all-gathered
    asynchronously, and decoded in the future's then() (local work only). CPU buckets, and
    CUDA buckets in the compact coding, send each payload at its own size (_reduce_framed;
    a CUDA codec frames on the host); CUDA buckets in the plain coding send their blocks and
    selections at the head the longest block uses (one all-reduce agrees it), not at the
    capacity's fixed size: the slack and the minimum size stay home."""
    buffer = bucket.buffer()
    blocks = _encode(state, bucket, b, iteration, problem, torch.ops.sidco.reduce_encode,
                     torch.ops.sidco.reduce_encode_failure)
    encoded = time.perf_counter()
    if blocks.device.type == "cpu":
        if state.schedule_for(len(b.inbox)) == "two-hop":
            return _reduce_two_hop(state, bucket, b, group, blocks, encoded, started)
        return _reduce_framed(state, bucket, b, group, blocks, encoded, started)
    if b.wire == "compact":
        return _reduce_framed(state, bucket, b, group, blocks, encoded, started)
    world, size = len(b.inbox), b.payload_bytes()
    head = _agreed_head(state, b.codec.report()["longest_block"], size, group, blocks.device)
    if head < size:
        received = torch.empty(world * head, dtype=torch.uint8, device=blocks.device)
        heads = blocks.view(world, size)[:, :head].contiguous().view(-1)
        state._in_flight.extend([received, heads])
        dist.all_to_all_single(received, heads, group=group)
        slots = b.received.view(world, size)
        slots[:, :head].copy_(received.view(world, head))
        slots[:, head:].zero_()
    else:
        state._in_flight.append(blocks)
        dist.all_to_all_single(b.received, blocks, group=group)
    # The bucket and residual checked here, before the all-gather: a problem travels.
    selection = torch.ops.sidco.reduce_select(b.received, buffer, b.residual, b.codec)
    report = b.codec.report()
    # The selections' head without another round: an owner keeps at most its share of what it
    # received, received / P entries rounded (comm/reduce/steps.hpp), so at most what the
    # longest block holds; a failure's message takes at most 64 + 256 bytes.
    chosen = min(size, max(head, 64 + 256))
    sent, into = _heads(selection, b.inbox, chosen) if chosen < size else (selection, None)
    # What this rank hands the collectives: its P - 1 blocks and its selection, at the heads.
    stats = _sparse_stats(state, b, buffer, report, encoded - started, (world - 1) * head + chosen)
    stats["schedule"] = "flat"
    state._stats[bucket.index()] = stats

    return _gather_and_decode(state, b, buffer, sent, group, encoded, stats, torch.ops.sidco.reduce_decode,
                              _reduce_stats(buffer, (world - 1) * (head + chosen)), into=into)


def _reduce_stats(buffer, bytes_received):
    """The reduce exchange's statistics from its codec's report after the decode."""
    def more(done):
        return dict(union_density=done["union_entries"] / buffer.numel(),
                    global_density=done["global_selected"] / buffer.numel(), returned=int(done["returned"]),
                    bytes_received=bytes_received, dropped=done["returned"] / max(1.0, done["selected"]))
    return more


def _reduce_framed(state, bucket, b, group, blocks, encoded, started):
    """The reduce-scatter exchange with each payload at the size it uses (comm/reduce/
    frames.hpp: a count, the values, the indices gap-coded; each block led by the digest of
    the step's fields, which its owner checks), on the bucket's device: the blocks' sizes by
    one all-to-all, the blocks by another at those split sizes (waited for: the owners'
    selection needs them), the selections all-gathered asynchronously at the longest one's
    size (one all-reduce agrees it), and decoded in the future's then() (local work only)."""
    buffer = bucket.buffer()
    world, size = len(b.inbox), b.payload_bytes()
    rank = dist.get_rank(group)
    device = blocks.device
    frames, sizes = torch.ops.sidco.reduce_frames(blocks, b.codec, False)
    incoming = torch.empty_like(sizes)
    state._in_flight.extend([frames, sizes, incoming])
    dist.all_to_all_single(incoming, sizes, group=group)
    sent_sizes, received_sizes = sizes.tolist(), incoming.tolist()
    received = torch.empty(sum(received_sizes), dtype=torch.uint8, device=device)
    state._in_flight.append(received)
    dist.all_to_all_single(received, frames, output_split_sizes=received_sizes, input_split_sizes=sent_sizes,
                           group=group)
    torch.ops.sidco.reduce_unframe(received, received_sizes, list(b.received.view(world, size).unbind(0)), b.codec,
                                   False)
    # The bucket and residual checked here, before the all-gather: a problem travels.
    selection = torch.ops.sidco.reduce_select(b.received, buffer, b.residual, b.codec)
    report = b.codec.report()
    frame = torch.ops.sidco.reduce_frames(selection, b.codec, True)[0]
    longest = torch.tensor([frame.numel()], dtype=torch.int64, device=device)
    state._in_flight.append(longest)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    head = int(longest.item())
    sent = torch.zeros(head, dtype=torch.uint8, device=device)
    sent[:frame.numel()] = frame
    gathered = [torch.empty(head, dtype=torch.uint8, device=device) for _ in range(world)]
    # What this rank hands the collectives for the others: its P - 1 blocks' messages, its
    # selection's (at the agreed head), and the sizes.
    blocks_sent = sum(sent_sizes) - sent_sizes[rank]
    stats = _sparse_stats(state, b, buffer, report, encoded - started, blocks_sent + head + 8 * (world - 1))
    stats["schedule"] = "flat"
    state._stats[bucket.index()] = stats
    received_bytes = sum(received_sizes) - received_sizes[rank] + (world - 1) * (head + 8)
    return _gather_and_decode(
        state, b, buffer, sent, group, encoded, stats, torch.ops.sidco.reduce_decode,
        _reduce_stats(buffer, received_bytes), into=gathered,
        unpack=lambda: torch.ops.sidco.reduce_unframe(torch.cat(gathered), [head] * world, b.inbox, b.codec, True))


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


def _hops(state, group, phase, tag):
    """One phase of the two-hop schedule, posted and waited for. Returns the received buffers."""
    work, received = _post_hops(state, group, phase, tag)
    for w in work:
        w.wait()
    return received


class _RoundTwo:
    """A bucket's owners' selections moving in two hops (phases 3 and 4), advanced a phase at
    each later hook call of the step (State._advance_round_twos), so that they travel while
    autograd computes the next buckets; every rank advances them at the same calls (DDP calls
    the hook for the same buckets in the same order), and the step's last call drains them.
    Once its messages are in, the bucket's inbox is filled and its future completes: the
    decode runs in that future's then(), as on the other paths."""

    def __init__(self, state, group, b, selection, stats, blocks_sent, blocks_received):
        self.state, self.group, self.b, self.stats = state, group, b, stats
        self.blocks_sent, self.bytes_received = blocks_sent, blocks_received  # round 1's; round 2 adds
        self.future = torch.futures.Future()
        self.work, self.inbound = _post_hops(state, group, torch.ops.sidco.reduce_hops_first(selection, b.codec, True), 3)
        self.phase = 3

    def advance(self):
        """Waits for the phase in flight and starts the next; True once the selections are in."""
        for w in self.work:
            w.wait()
        sidco = torch.ops.sidco
        if self.phase == 3:
            self.work, self.inbound = _post_hops(self.state, self.group,
                                                 sidco.reduce_hops_second(self.inbound, self.b.codec, True), 4)
            self.phase = 4
            return False
        sent, received = sidco.reduce_hops_finish(self.inbound, self.b.inbox, self.b.codec, True)
        self.stats["bytes_sent"] += sent
        self.stats["bytes_per_entry"] = (self.blocks_sent + sent) / max(1, self.stats["selected"])
        self.bytes_received += received
        self.future.set_result(None)
        return True


def _reduce_two_hop(state, bucket, b, group, blocks, encoded, started):
    """The reduce-scatter exchange for CPU buckets in two hops (State(reduce_schedule=...);
    sidco/comm/reduce/hops.hpp, the MPI exchange's router): each rank's blocks, as frames at
    their own size, go to the owners through an intermediate of a sqrt(P) grid, and the
    owners' selections come back the same way: O(sqrt P) messages a rank each way, where
    the flat exchange's all-to-all and ring all-gather take P - 1. Round 1 (the blocks) is
    waited for in the hook body (phase 2 forwards what phase 1 brought, and the owners'
    selection needs it); round 2 (the selections) is posted here and advanced by the step's
    later hook calls (_RoundTwo), overlapping the rest of the backward pass; the decode runs
    in the future's then() once it is in, like the other paths."""
    buffer = bucket.buffer()
    world, size = len(b.inbox), b.payload_bytes()
    sidco = torch.ops.sidco
    first = _hops(state, group, sidco.reduce_hops_first(blocks, b.codec, False), 1)
    second = _hops(state, group, sidco.reduce_hops_second(first, b.codec, False), 2)
    blocks_sent, blocks_received = sidco.reduce_hops_finish(second, list(b.received.view(world, size).unbind(0)),
                                                            b.codec, False)
    # The bucket and residual checked here, before round 2: a problem travels.
    selection = sidco.reduce_select(b.received, buffer, b.residual, b.codec)
    report = b.codec.report()
    stats = _sparse_stats(state, b, buffer, report, encoded - started, blocks_sent)
    stats["schedule"] = "two-hop"
    state._stats[bucket.index()] = stats
    round_two = _RoundTwo(state, group, b, selection, stats, blocks_sent, blocks_received)
    state._round_twos.append(round_two)
    return _decode_when(state, b, buffer, round_two.future, encoded, stats, sidco.reduce_decode,
                        lambda done: _reduce_stats(buffer, round_two.bytes_received)(done))


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
