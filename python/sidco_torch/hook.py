"""A DistributedDataParallel communication hook that sends each bucket sparsified.

Per bucket: the residual (error feedback) is added, the bucket is compressed per layer
(the bucket's parameters give the layout), every rank's count is all-gathered, then the
(index, value) payload padded to the largest count (gloo rejects uneven all-gathers); the
entries are scatter-added in rank order (the same bits on every rank), averaged, and
returned in a completed future. Every collective is issued from the hook body, never from
a future's callback (collectives from callbacks run on other threads and hang or abort
gloo once there are several buckets). DDP rebuilds its buckets after the first iteration:
the first start_iter iterations run dense (as PowerSGD's start_powerSGD_iter), and per-bucket
state is keyed by the bucket's index and layout, so a rebuild cannot misalign it. Buckets
below min_bucket_elements, and densities where the gathered entries would outweigh the
dense bucket (density x ranks >~ 1), are all-reduced densely.
"""
import time

import torch
import torch.distributed as dist

from .ops import Compressor, scatter_add_


class _Bucket:
    def __init__(self, state, size, layers, dtype):
        self.compressor = Compressor(state.method, **state.options)
        self.residual = torch.zeros(size, dtype=dtype) if state.feedback else None
        self.size = size
        self.layers = layers


class State:
    """What the hook keeps between steps. method: a sidco_torch.Compressor method
    (sidco-e, sidco-gp, sidco-gamma-gp, top-k, dgc, random-k, ...); density in (0, 1];
    process_group: None for the default group; start_iter: iterations all-reduced densely
    first; feedback: error feedback (recommended); options: passed to the compressor."""

    def __init__(self, method="sidco-e", density=0.01, process_group=None, start_iter=2,
                 min_bucket_elements=1024, feedback=True, **options):
        if not (isinstance(density, (int, float)) and 0 < density <= 1):
            raise ValueError(f"sidco_torch.State: density = {density} is outside (0, 1]")
        if not (isinstance(start_iter, int) and start_iter >= 0):
            raise ValueError(f"sidco_torch.State: start_iter = {start_iter} is not a non-negative integer")
        if not (isinstance(min_bucket_elements, int) and min_bucket_elements >= 0):
            raise ValueError(f"sidco_torch.State: min_bucket_elements = {min_bucket_elements} is not a "
                             "non-negative integer")
        Compressor(method, **options)  # an unknown method or option fails here, with its message
        self.method = method
        self.density = float(density)
        self.process_group = process_group
        self.start_iter = start_iter
        self.min_bucket_elements = min_bucket_elements
        self.feedback = feedback
        self.options = options
        self.iteration = 0
        self._buckets = {}
        self._stats = {}

    def stats(self):
        """The last step's statistics, per bucket index: path (dense or sparse), size,
        selected, density (achieved), target_density, threshold (-1 when per layer),
        stages, compress_seconds, communicate_seconds, bytes_sent (per rank)."""
        return {index: dict(s) for index, s in self._stats.items()}

    def _bucket(self, index, size, layers, dtype):
        bucket = self._buckets.get(index)
        if bucket is None or bucket.size != size or bucket.layers != layers:
            bucket = self._buckets[index] = _Bucket(self, size, layers, dtype)
        return bucket


def _dense(state, bucket, group, world, started):
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    buffer.div_(world)
    state._stats[bucket.index()] = {
        "path": "dense", "size": buffer.numel(), "selected": buffer.numel(), "density": 1.0,
        "target_density": state.density, "threshold": 0.0, "stages": 0, "compress_seconds": 0.0,
        "communicate_seconds": time.perf_counter() - started, "bytes_sent": buffer.numel() * buffer.element_size()}
    return buffer


def hook(state, bucket):
    """The communication hook: ddp_model.register_comm_hook(state, sidco_torch.hook)."""
    started = time.perf_counter()
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    size = buffer.numel()
    future = torch.futures.Future()
    if (state.iteration < state.start_iter or size < state.min_bucket_elements
            or state.density * world >= 1):
        result = _dense(state, bucket, group, world, started)
    else:
        layers = [g.numel() for g in bucket.gradients()]
        if sum(layers) != size:
            layers = []  # a layout DDP did not give: one estimate for the bucket
        b = state._bucket(bucket.index(), size, layers, buffer.dtype)
        indices, values = b.compressor.compress(buffer, state.density, layers, b.residual)
        report = b.compressor.report()
        compressed = time.perf_counter()
        # Counts first, then the payload padded to the largest count.
        count = torch.tensor([indices.numel()], dtype=torch.int64)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(counts, count, group=group)
        counts = [int(c.item()) for c in counts]
        largest = max(counts)
        padded_indices = torch.zeros(largest, dtype=torch.int64)
        padded_values = torch.zeros(largest, dtype=values.dtype)
        padded_indices[:indices.numel()] = indices
        padded_values[:values.numel()] = values
        all_indices = [torch.empty(largest, dtype=torch.int64) for _ in range(world)]
        all_values = [torch.empty(largest, dtype=values.dtype) for _ in range(world)]
        dist.all_gather(all_indices, padded_indices, group=group)
        dist.all_gather(all_values, padded_values, group=group)
        buffer.zero_()
        for r in range(world):  # rank order: the same sums on every rank
            scatter_add_(buffer, all_indices[r][:counts[r]], all_values[r][:counts[r]])
        buffer.div_(world)
        result = buffer
        state._stats[bucket.index()] = {
            "path": "sparse", "size": size, "selected": indices.numel(), "density": indices.numel() / size,
            "target_density": state.density, "threshold": report["threshold"], "stages": int(report["stages"]),
            "compress_seconds": compressed - started, "communicate_seconds": time.perf_counter() - compressed,
            "bytes_sent": largest * (8 + values.element_size()) + 8}
    if bucket.is_last():
        state.iteration += 1
    future.set_result(result)
    return future
