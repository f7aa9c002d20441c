"""A DistributedDataParallel communication hook that sends each bucket sparsified, in one
collective that overlaps the rest of the backward pass.

Per bucket, in the hook body: one C++ call compresses the bucket per tensor (with error
feedback), trims each tensor to a fixed capacity (what is trimmed goes back into the
residual) and packs the result into a payload of fixed size: a 64-byte header, 32-bit
indices, values in the bucket's dtype. One asynchronous all-gather of equal-sized payloads
is issued and its future returned at once; the decode (every rank's entries added in rank
order and averaged, one C++ call) runs in the future's then(), which does local work only.

A rank whose compression fails (a NaN, a damaged state) still sends a payload, carrying its
error; every rank's decode then raises the same error naming that rank, and what each rank
sent goes back into its residual. Nothing hangs, nothing desynchronizes.

State is kept per parameter (each tensor's residual, adaptive stages and capacity are its
own), so DDP's bucket rebuild and a new DDP wrapper find it again, and state_dict() /
load_state_dict() resume a run bit for bit.
"""
import math
import numbers
import re
import struct
import time
import warnings
import weakref
import zlib

import torch
import torch.distributed as dist

from .ops import METHODS, _check_method, _codec, _options_dict, _reduce_codec

_STATE_FORMAT = 2  # 2: rank and world size added (format 1 states load without that check)
_COMPRESSED = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_EXCHANGES = ("auto", "allgather", "reduce")
_NONFINITE = ("raise", "skip")
_PATHS = ("dense", "allgather", "reduce")  # how a bucket goes on the wire
_DTYPE_CODES = {torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4}
_DTYPE_NAMES = {code: str(dtype).replace("torch.", "") for dtype, code in _DTYPE_CODES.items()}


def _shortest(value, dtype):
    """The shortest decimal that rounds to the same dtype value (float32 0.01 is 0.01)."""
    exact = torch.tensor(value, dtype=dtype)
    for digits in range(1, 18):
        candidate = float(f"{value:.{digits}g}")
        if torch.tensor(candidate, dtype=dtype) == exact:
            return candidate
    return value


def _real_scalar(value, what):
    """A Python, numpy or 0-d tensor real as a float; a 16- or 32-bit float as the shortest
    decimal that names it (numpy.float32(0.01) is 0.01, not 0.009999999776)."""
    narrow = None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"sidco_torch.State: {what} must be a real scalar, got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        if value.dtype in (torch.float16, torch.bfloat16, torch.float32):
            narrow = value.dtype
        value = value.item()
    else:
        dtype = getattr(value, "dtype", None)  # a numpy scalar
        itemsize = getattr(dtype, "itemsize", 8)
        if getattr(dtype, "kind", "") == "f" and itemsize < 8:
            narrow = torch.float32 if itemsize == 4 else torch.float16
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"sidco_torch.State: {what} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    return _shortest(value, narrow) if narrow is not None and math.isfinite(value) else value


class ExchangeError(RuntimeError):
    """Raised alike on every rank when the ranks disagree (configuration, buckets, density) or
    one of them failed (its error is in the message). DDP's backward() re-raises what a hook
    raises as a RuntimeError whose message begins with "ExchangeError: " (torch passes no
    exception type through its reducer); the object itself is state.error."""


def _checked_density(value, what):
    value = _real_scalar(value, what)
    if not 0 < value <= 1:
        raise ValueError(f"sidco_torch.State: {what} = {value!r} is outside (0, 1]")
    return value


def _bits(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


class _Layer:
    """A parameter's state outside any bucket: from load_state_dict, or between layouts."""

    def __init__(self, size, dtype, residual, compressor):
        self.size, self.dtype, self.residual, self.compressor = size, dtype, residual, compressor


class _Bucket:
    """One bucket layout's codec, residual and receive buffers. exchange: "allgather" (one
    all-gather of every rank's payload) or "reduce" (an all-to-all of blocks to the regions'
    owners, then an all-gather of the owners' selections)."""

    def __init__(self, state, keys, sizes, dtype, device, world, rank, exchange):
        self.keys = keys
        self.sizes = sizes
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.dtype = dtype
        self.device = device
        self.exchange = exchange
        # What it compresses at (this step's density) and plans capacity for (the agreed one).
        self.density, self.capacity_density = state._step_density, state._verified
        numel = sum(sizes)
        # On the bucket's device: a CUDA bucket is encoded, gathered (NCCL) and decoded there.
        self.residual = torch.zeros(numel, dtype=dtype, device=device) if state.feedback else None
        if exchange == "reduce":
            self.codec = _reduce_codec(state.method, state.options, sizes, dtype, self.density, state.capacity_slack,
                                       world, rank, state.owner, self.capacity_density, device)
            payload = self.codec.block_bytes()
            self.received = torch.empty(world * payload, dtype=torch.uint8, device=device)
        else:
            self.codec = _codec(state.method, state.options, sizes, dtype, self.density, state.capacity_slack,
                                self.capacity_density)
            payload = self.codec.payload_bytes()
        self.inbox = [torch.empty(payload, dtype=torch.uint8, device=device) for _ in range(world)]

    def payload_bytes(self):
        return self.codec.block_bytes() if self.exchange == "reduce" else self.codec.payload_bytes()


class State:
    """What the hook keeps between steps.

    method: a sidco_torch method (sidco_torch.METHODS); density in (0, 1], any real scalar,
    or a schedule: a function of the iteration returning one (evaluated once a step, alike on
    every rank; set_density() changes it during training); process_group: None for the default group; start_iter: iterations all-reduced densely
    first; min_bucket_elements: smaller buckets are all-reduced densely; feedback: error
    feedback (recommended); capacity_slack: each tensor sends at most ceil(slack k) entries,
    k = max(1, floor(density n)); exchange: "allgather" (one all-gather of every rank's
    selection: (P - 1) slack 8k bytes a rank), "reduce" (an all-to-all of fixed-size blocks to
    P regions' owners, then an all-gather of each owner's selection of its region's reduced
    values: about 2 slack 8k bytes a rank whatever P) or "auto" (see
    exchange_for); owner: how a region's owner selects from its reduced values, "sidco-e"
    (SIDCo-E's threshold, trimmed to the region's share) or "top-k"; nonfinite: what a step
    does when some rank's bucket holds NaN or +-Inf, "raise" (every rank raises the same error
    naming that rank: a NaN in a float32 run is a bug to see) or "skip" (for mixed precision:
    every rank's reduced bucket is filled with NaN, so that a GradScaler skips the step on
    every rank, and at the next step every residual, adaptive state and the iteration count
    are put back as they were before the skipped one; costs a copy of each bucket's residual
    and state per step); options: passed to the compressor (seed).

    One State serves one model. Register it with sidco_torch.register(ddp_model, state) so
    that its state_dict() is keyed by parameter name; with ddp_model.register_comm_hook(state,
    sidco_torch.hook) it is keyed by the order DDP first hands the parameters over, which is
    the same in every run of the same model."""

    def __init__(self, method="sidco-e", density=0.01, process_group=None, start_iter=2,
                 min_bucket_elements=1024, feedback=True, capacity_slack=1.25, exchange="auto", owner="sidco-e",
                 nonfinite="raise", **options):
        schedule = density if callable(density) else None
        density = _checked_density(density(0) if schedule else density, "density(0)" if schedule else "density")
        capacity_slack = _real_scalar(capacity_slack, "capacity_slack")
        if not 1 <= capacity_slack <= 1000:
            raise ValueError(f"sidco_torch.State: capacity_slack = {capacity_slack!r} is outside [1, 1000]")
        if not (isinstance(start_iter, int) and not isinstance(start_iter, bool) and start_iter >= 0):
            raise ValueError(f"sidco_torch.State: start_iter = {start_iter!r} is not a non-negative integer")
        if not (isinstance(min_bucket_elements, int) and not isinstance(min_bucket_elements, bool)
                and min_bucket_elements >= 0):
            raise ValueError(f"sidco_torch.State: min_bucket_elements = {min_bucket_elements!r} is not a "
                             "non-negative integer")
        if exchange not in _EXCHANGES:
            raise ValueError(f"sidco_torch.State: exchange = {exchange!r} is not one of {', '.join(_EXCHANGES)}")
        if nonfinite not in _NONFINITE:
            raise ValueError(f"sidco_torch.State: nonfinite = {nonfinite!r} is not 'raise' or 'skip'")
        if owner not in ("sidco-e", "top-k"):
            raise ValueError(f"sidco_torch.State: owner = {owner!r} is not 'sidco-e' or 'top-k'")
        if not isinstance(feedback, bool):
            raise TypeError(f"sidco_torch.State: feedback must be True or False, got {type(feedback).__name__} "
                            f"{feedback!r}")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError("sidco_torch.State: process_group must be a torch.distributed ProcessGroup (from "
                            f"dist.new_group) or None for the default group, got {type(process_group).__name__} "
                            f"{process_group!r}")
        _check_method(method, "sidco_torch.State")
        _options_dict(options, "sidco_torch.State")
        _codec(method, options, [1], torch.float32, density, capacity_slack)  # what only the ops know: here
        self.method = method
        self.exchange = exchange
        self.owner = owner
        self.nonfinite = nonfinite
        self._density = density    # the density, or the schedule's first value
        self._schedule = schedule  # the schedule, or None
        self.process_group = process_group
        self.start_iter = start_iter
        self.min_bucket_elements = min_bucket_elements
        self.feedback = feedback
        self.capacity_slack = capacity_slack
        self.options = dict(options)
        self.iteration = 0
        self._reset()

    def _reset(self):
        self._buckets = {}      # parameter keys -> _Bucket
        self._owner = {}        # parameter key -> (_Bucket, layer index)
        self._pending = {}      # parameter key -> _Layer, not yet in a bucket
        self._stats = {}
        self._keys = {}         # id(parameter) -> (weakref, key)
        self._keying = None     # "names" (attach) or "order" (DDP's), once known
        self._module = None
        self._complete = False  # a whole iteration has been seen: the model's parameters are known
        self._agreed = False
        self._signatures = {}   # bucket index -> what every rank agreed its payload is
        self._pending_exchanges = {}  # "|".join(keys) -> a reduce codec's saved regions and owner state
        self._loaded_from = None  # (rank, world) of a loaded state, checked by the next agreement
        self._warned = set()
        self._in_step = False   # a hook call of this iteration has run, its last bucket's not yet
        self._undo = []         # nonfinite="skip": what puts this step's state back
        self._skip = None       # nonfinite="skip": the iteration this step started at, once it is skipped
        self._step_iteration = self.iteration
        self._step_density = None  # this step's density (the schedule's value at its iteration)
        self._step_problem = None  # why this rank's schedule gave no density this step
        # The density every rank last agreed on (at the first call, then through decoded
        # payloads' headers): capacities and the dense/sparse choice follow it, so a density
        # changed on one rank only makes the next exchange fail alike on every rank, never
        # makes the ranks' collectives differ in size.
        self._verified = None
        self._next_verified = None
        self.error = None       # the last ExchangeError the hook raised
        self.skipped_steps = 0  # steps skipped for non-finite values (nonfinite="skip")

    @property
    def density(self):
        """The density at the current iteration."""
        return self._density_at(self.iteration)

    def set_density(self, density):
        """Sends at density from the next step on (replacing a schedule), keeping every
        residual and adaptive state. Call it alike on every rank: a rank whose density differs
        makes the next exchange raise the same error on every rank. Capacities follow one
        step later (the step that changes it still sends at most what the old density's
        capacity holds; the rest waits in the residual)."""
        self._density = _checked_density(density, "density")
        self._schedule = None

    def _density_at(self, iteration):
        if self._schedule is None:
            return self._density
        return _checked_density(self._schedule(iteration), f"density({iteration})")

    def exchange_for(self, world, device_type="cpu"):
        """The exchange the hook uses among world ranks. "auto" follows the byte model each
        rank's sent bytes per step give (k = density n entries of 4 + v bytes, slack s):
        allgather (P - 1) s k (4 + v); reduce 2 (P - 1) (64 + ceil(s k / P) (4 + v)), about
        2 s k (4 + v): reduce from 3 ranks on, allgather at 2 (the same bytes in one round
        fewer). The cost model of bench/cost_model.py, with this machine's latency and compute,
        agrees from 3 ranks on at 1 to 100 Gbit/s and puts the two within 2% at 2
        (docs/RESULTS.md). On CUDA buckets "auto" keeps the all-gather: the reduce exchange
        runs there (exchange="reduce") but its time on GPUs is not measured yet."""
        if self.exchange != "auto":
            return self.exchange
        return "reduce" if world >= 3 and device_type == "cpu" else "allgather"

    # ----- registration and parameter keys

    def attach(self, module):
        """Keys the state by module's parameter names (register() calls this). Attaching the
        same module again (say, to a new DDP wrapper) keeps every residual."""
        served = self._module() if self._module is not None else None
        if served is not None and served is not module:
            raise ValueError("sidco_torch.State: this State already serves another model "
                             f"({type(served).__name__}); one State serves one model: give "
                             f"{type(module).__name__} a State of its own")
        if self._keying == "order":
            raise ValueError("sidco_torch.State: this State keys its parameters by DDP's order (the hook ran, "
                             "or an order-keyed state was loaded, before attach()); attach or register first")
        named = list(module.named_parameters())
        for name, p in named:
            if p.requires_grad and p.dtype not in _COMPRESSED:
                raise TypeError(f"sidco_torch.State: parameter {name} is {p.dtype}; sidco_torch compresses "
                                "float32, float64, float16 and bfloat16 buckets")
        if self._module is None and self._pending:  # a state loaded before: its names must be this model's
            self._check_names(self._pending, {name for name, _ in named})
        for name, p in named:
            self._keys[id(p)] = (weakref.ref(p), name)
        self._module = weakref.ref(module)
        self._keying = "names"

    @staticmethod
    def _check_names(keys, names):
        unknown = sorted(set(keys) - set(names))
        if unknown:
            shown = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise ValueError(f"sidco_torch.State: the state holds {len(unknown)} parameter(s) this model does not "
                             f"have ({shown}); it was saved from another model")

    def _key(self, p):
        entry = self._keys.get(id(p))
        if entry is not None and entry[0]() is p:
            return entry[1]
        if self._keying == "names" or self._complete:
            if self._keying == "names" and self._module is None:
                raise ValueError("sidco_torch.State: this State holds a state keyed by parameter names: "
                                 "register it with sidco_torch.register(ddp_model, state)")
            raise ValueError("sidco_torch.State: a bucket holds a parameter of another model (shape "
                             f"{tuple(p.shape)}); one State serves one model: give each model its own State")
        self._keying = "order"
        key = f"#{len(self._keys)}"
        self._keys[id(p)] = (weakref.ref(p), key)
        return key

    # ----- statistics

    def stats(self):
        """The last step's statistics, per bucket index: path (sparse or dense, and the reason
        when dense), size, selected, candidates, trimmed, capacity, density (achieved),
        target_density, threshold (-1 when per layer), stages, fallback (some tensor's fit
        degenerated and the radix threshold replaced it), compress_seconds,
        exchange_seconds (from the payload's send to its decode), decode_seconds, bytes_sent
        (what this rank hands the collectives: its all-gather payload; with exchange "reduce",
        its P - 1 blocks and its selection), failed, exchange ("allgather" or "reduce"); with
        "reduce" also union_density (the owners' reduced entries over the bucket),
        global_density (the global selection's), returned (entries this rank sent that the
        owners left out: back in its residual), dropped (their share of what it sent) and
        bytes_received; with nonfinite="skip", skipped (the bucket came back as NaN because
        some rank's held non-finite values)."""
        return {index: dict(s) for index, s in self._stats.items()}

    # ----- checkpoints

    def state_dict(self):
        """Everything a resumed run needs to repeat an uninterrupted one bit for bit: the
        iteration, and per parameter its residual and its compressor's state (adaptive
        stages, generators), keyed by parameter name (or DDP's order without register())."""
        self._settle()
        layers = {key: {"size": layer.size, "dtype": layer.dtype, "residual": layer.residual,
                        "compressor": layer.compressor} for key, layer in self._pending.items()}
        for key, (bucket, i) in self._owner.items():
            layers[key] = self._export(bucket, i)
        # The reduce exchange's regions and owner state, per bucket layout.
        exchanges = dict(self._pending_exchanges)
        for keys, b in self._buckets.items():
            if b.exchange == "reduce":
                exchanges["|".join(keys)] = b.codec.exchange_state()
        rank, world = self._rank_and_world()
        agreed = self._next_verified if self._next_verified is not None else self._verified
        return {"format": _STATE_FORMAT, "method": self.method, "density": self.density, "agreed_density": agreed,
                "capacity_slack": self.capacity_slack, "feedback": self.feedback, "options": dict(self.options),
                "iteration": self.iteration, "keys": self._keying or "order", "rank": rank, "world": world,
                "exchange": self.exchange, "owner": self.owner, "layers": layers, "exchanges": exchanges}

    def _rank_and_world(self):
        """This process's rank and world size in the State's group (None, None before
        torch.distributed is initialized)."""
        if not (dist.is_available() and dist.is_initialized()):
            return None, None
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return dist.get_rank(group), dist.get_world_size(group)

    def load_state_dict(self, state_dict):
        """Restores what state_dict() returned: checked whole before anything changes."""
        d = state_dict
        if not isinstance(d, dict) or d.get("format") not in (1, _STATE_FORMAT):
            raise ValueError(f"sidco_torch.State.load_state_dict: not a sidco_torch state (format "
                             f"{d.get('format') if isinstance(d, dict) else type(d).__name__})")
        saved_by = (d.get("rank"), d.get("world"))
        if any(v is not None and not (isinstance(v, int) and v >= 0) for v in saved_by):
            raise ValueError(f"sidco_torch.State.load_state_dict: rank {saved_by[0]!r}, world {saved_by[1]!r}")
        rank, world = self._rank_and_world()
        if None not in saved_by and rank is not None and saved_by != (rank, world):
            raise ValueError(f"sidco_torch.State.load_state_dict: this state was saved by rank {saved_by[0]} of "
                             f"{saved_by[1]}, this process is rank {rank} of {world}; the state holds that rank's "
                             "residuals: each rank saves and loads its own (torch.save(state.state_dict(), "
                             "f'sidco-{rank}.pt'))")
        # States saved before the exchange and owner options had their defaults.
        defaults = {"exchange": "auto", "owner": "sidco-e"}
        # The density may differ (a schedule, set_density): residuals and adaptive state do not depend on it.
        for field in ("method", "capacity_slack", "feedback", "options", "exchange", "owner"):
            mine, theirs = getattr(self, field), d.get(field, defaults.get(field))
            if theirs != mine:
                raise ValueError(f"sidco_torch.State.load_state_dict: the state has {field} {theirs!r}, this "
                                 f"State {mine!r}; make the State as the state was made")
        if d["keys"] not in ("names", "order") or (self._keying is not None and d["keys"] != self._keying):
            raise ValueError(f"sidco_torch.State.load_state_dict: the state is keyed by parameter {d['keys']}, "
                             f"this State by {self._keying}: register both alike (sidco_torch.register names "
                             "them)")
        iteration = d["iteration"]
        if not (isinstance(iteration, int) and iteration >= 0):
            raise ValueError(f"sidco_torch.State.load_state_dict: iteration {iteration!r}")
        agreed = d.get("agreed_density")
        if agreed is not None:
            agreed = _checked_density(agreed, "the state's agreed_density")
        layers = {}
        for key, entry in d["layers"].items():
            layers[key] = self._checked_layer(key, entry)
        module = self._module() if self._module is not None else None
        if d["keys"] == "names" and module is not None:
            self._check_names(layers, (name for name, _ in module.named_parameters()))
        exchanges = d.get("exchanges", {})
        if not isinstance(exchanges, dict) or not all(
                isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1 for v in exchanges.values()):
            raise ValueError("sidco_torch.State.load_state_dict: exchanges is not a dict of uint8 tensors")
        # Everything checked: apply.
        self._pending_exchanges = {k: v.clone() for k, v in exchanges.items()}
        self._keying = d["keys"]
        self.iteration = iteration
        self._verified, self._next_verified, self._in_step = agreed, None, False
        # The next hook call agrees again: the iteration, and who saved the state, on every rank.
        self._agreed = False
        self._loaded_from = None if None in saved_by else saved_by
        self._pending = {}
        for key, layer in layers.items():
            owner = self._owner.get(key)
            if owner is not None:
                self._import(owner[0], owner[1], layer)
            else:
                self._pending[key] = layer

    def _checked_layer(self, key, entry):
        where = f"sidco_torch.State.load_state_dict: layer {key}"
        size, dtype, residual, compressor = entry["size"], entry["dtype"], entry["residual"], entry["compressor"]
        if not (isinstance(size, int) and size > 0):
            raise ValueError(f"{where}: size {size!r}")
        if dtype not in _COMPRESSED:
            raise ValueError(f"{where}: dtype {dtype!r}")
        if self.feedback != (residual is not None):
            raise ValueError(f"{where}: residual {'missing' if residual is None else 'present'} with feedback "
                             f"{self.feedback}")
        if residual is not None and (not isinstance(residual, torch.Tensor) or residual.dtype != dtype
                                     or residual.numel() != size):
            raise ValueError(f"{where}: residual is not a {dtype} tensor of {size} values")
        if residual is not None and not bool(torch.isfinite(residual).all()):
            bad = int((~torch.isfinite(residual)).sum())
            raise ValueError(f"{where}: residual holds {bad} non-finite value(s); every later step would fail "
                             "on every rank")
        if not (isinstance(compressor, torch.Tensor) and compressor.dtype == torch.uint8 and compressor.dim() == 1):
            raise ValueError(f"{where}: compressor state is not a uint8 tensor")
        # A damaged compressor state is refused here, not at the first step.
        _codec(self.method, self.options, [size], dtype, self._density, self.capacity_slack).load_layer_state(
            0, compressor.contiguous())
        current = self._owner.get(key)
        if current is not None and (current[0].sizes[current[1]] != size or current[0].dtype != dtype):
            raise ValueError(f"{where}: {size} {dtype} values, the model's parameter has "
                             f"{current[0].sizes[current[1]]} {current[0].dtype}")
        return _Layer(size, dtype, None if residual is None else residual.detach().clone().contiguous(),
                      compressor.detach().clone().contiguous())

    def _export(self, bucket, i):
        size = bucket.sizes[i]
        residual = None
        if bucket.residual is not None:
            residual = bucket.residual[bucket.offsets[i]: bucket.offsets[i] + size].clone()
        return {"size": size, "dtype": bucket.dtype, "residual": residual, "compressor": bucket.codec.layer_state(i)}

    def _import(self, bucket, i, layer):
        if layer.size != bucket.sizes[i] or layer.dtype != bucket.dtype:
            raise ValueError(f"sidco_torch.State: layer {bucket.keys[i]} was saved with {layer.size} {layer.dtype} "
                             f"values; the model's parameter has {bucket.sizes[i]} {bucket.dtype}")
        if bucket.residual is not None:
            bucket.residual[bucket.offsets[i]: bucket.offsets[i] + layer.size].copy_(layer.residual)
        bucket.codec.load_layer_state(i, layer.compressor)

    def __getstate__(self):
        # The process group cannot be pickled (PowerSGD's state drops it too).
        return {"config": dict(method=self.method, density=self._schedule or self._density, start_iter=self.start_iter,
                               min_bucket_elements=self.min_bucket_elements, feedback=self.feedback,
                               capacity_slack=self.capacity_slack, exchange=self.exchange, owner=self.owner,
                               nonfinite=self.nonfinite, **self.options),
                "state": self.state_dict()}

    def __setstate__(self, pickled):
        self.__init__(**pickled["config"])
        self.load_state_dict(pickled["state"])  # names come back with attach() or register()

    # ----- the hook's bookkeeping

    def _begin_step(self):
        """At a step's first hook call: the previous step put back if it was skipped; the
        density agreed in its payloads adopted; this step's density."""
        if not self._in_step:
            self._settle()
            if self._next_verified is not None:
                self._verified, self._next_verified = self._next_verified, None
            self._in_step = True
            self._step_iteration = self.iteration
            try:
                self._step_density, self._step_problem = self._density_at(self.iteration), None
            except (TypeError, ValueError) as e:  # sent as this rank's failure: every rank raises it
                self._step_density = self._verified if self._verified is not None else self._density
                self._step_problem = f"{type(e).__name__}: {e}"

    def _settle(self):
        """nonfinite="skip": puts back what a skipped step changed (residuals, compressor and
        exchange state, the iteration count), once all its buckets are decoded."""
        undo, self._undo = self._undo, []
        if self._skip is None:
            return
        for restore in reversed(undo):
            restore()
        self._next_verified = None  # as if the step had not run
        self.iteration = self._skip
        self._skip = None
        self.skipped_steps += 1

    def _save_bucket(self, b):
        """nonfinite="skip": what encode and decode will change in this bucket, to put back."""
        residual = None
        if b.residual is not None:
            if getattr(b, "saved_residual", None) is None:
                b.saved_residual = torch.empty_like(b.residual)
            residual = b.saved_residual.copy_(b.residual)
        layers = [b.codec.layer_state(i) for i in range(len(b.sizes))]
        exchange = b.codec.exchange_state() if b.exchange == "reduce" else None

        def restore():
            if residual is not None:
                b.residual.copy_(residual)
            for i, layer in enumerate(layers):
                b.codec.load_layer_state(i, layer)
            if exchange is not None:
                b.codec.load_exchange_state(exchange)
        self._undo.append(restore)

    def _skipped(self, stats, buffer):
        """nonfinite="skip": this bucket's exchange failed for non-finite values on some rank
        (every rank sees the same): the bucket comes back as NaN, the step is undone."""
        self._skip = self._step_iteration
        stats["skipped"] = True
        buffer.fill_(float("nan"))

    def _fail(self, error):
        self.error = error
        return error

    def _agree_configuration(self, group, world, device):
        """Every rank's configuration, compared once (the first hook call of this State in this
        process): a difference would make the payloads' sizes differ."""
        verified = self._verified if self._verified is not None else self._step_density
        fields = [("format", _STATE_FORMAT), ("method", zlib.crc32(self.method.encode())),
                  ("density", _bits(self._step_density)), ("agreed density", _bits(verified)),
                  ("capacity_slack", _bits(self.capacity_slack)),
                  ("feedback", int(self.feedback)), ("start_iter", self.start_iter),
                  ("min_bucket_elements", self.min_bucket_elements),
                  ("options", zlib.crc32(repr(sorted(self.options.items())).encode())),
                  ("exchange", _EXCHANGES.index(self.exchange)), ("owner", int(self.owner == "top-k")),
                  ("nonfinite", _NONFINITE.index(self.nonfinite)),
                  ("iteration", self.iteration), ("ranks", world)]
        rank = dist.get_rank(group)
        loaded = self._loaded_from
        # Whether this rank loaded a state another rank (or another world) saved: -1 if not.
        fields.append(("loaded", -1 if loaded is None or loaded == (rank, world) else loaded[0] * 65536 + loaded[1]))
        # On the buckets' device: NCCL gathers CUDA tensors only.
        mine = torch.tensor([v for _, v in fields], dtype=torch.int64, device=device)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=group)
        everyone = [t.cpu() for t in everyone]
        shown = {"density": lambda bits: struct.unpack("<d", struct.pack("<q", bits))[0],
                 "agreed density": lambda bits: struct.unpack("<d", struct.pack("<q", bits))[0],
                 "capacity_slack": lambda bits: struct.unpack("<d", struct.pack("<q", bits))[0]}
        loaded_at = len(fields) - 1
        for rank, theirs in enumerate(everyone):
            if int(theirs[loaded_at]) >= 0:
                saver, saved_world = divmod(int(theirs[loaded_at]), 65536)
                raise self._fail(ExchangeError(
                    f"sidco_torch.State: rank {rank} loaded the state that rank {saver} of {saved_world} saved; the "
                    "state holds that rank's residuals: each rank saves and loads its own "
                    "(torch.save(state.state_dict(), f'sidco-{rank}.pt'))"))
            for j, (name, _) in enumerate(fields[:loaded_at]):
                if theirs[j] != everyone[0][j]:
                    if name in ("method", "options", "exchange", "owner", "nonfinite"):
                        # Hashes and indices on the wire: the values themselves, from every rank
                        # (each one found this same difference, so each joins this gather).
                        readable = [None] * world
                        dist.all_gather_object(readable, {"method": self.method, "options": dict(sorted(
                            self.options.items())), "exchange": self.exchange, "owner": self.owner,
                            "nonfinite": self.nonfinite}, group=group)
                        theirs_shown, first_shown = readable[rank][name], readable[0][name]
                    else:
                        show = shown.get(name, lambda v: v)
                        theirs_shown, first_shown = show(int(theirs[j])), show(int(everyone[0][j]))
                    raise self._fail(ExchangeError(
                        f"sidco_torch.State: rank {rank} has {name} {theirs_shown!r}, rank 0 has {first_shown!r}; "
                        "every rank must make its State alike"))
        self._agreed = True
        self._loaded_from = None
        self._verified = verified
        if world == 1 and "world" not in self._warned:
            self._warned.add("world")
            warnings.warn("sidco_torch: a world of one rank has nothing to exchange; the hook still compresses (error "
                          "feedback delays part of each update), as it would among several", stacklevel=4)

    def _agree_wire_format(self, group, world, bucket, path, payload_bytes):
        """What this bucket puts on the wire (path, dtype, values, bytes), compared across ranks
        whenever it changes (the first steps, DDP's bucket rebuild, the switch at start_iter),
        before the collective whose sizes it decides: gloo aborts the process on a size
        mismatch, so a rank whose bucket differs (another dtype under fp16_compress_wrapper,
        another layout) must be refused before it."""
        buffer = bucket.buffer()
        mine = (bucket.index(), _PATHS.index(path), _DTYPE_CODES.get(buffer.dtype, 0), buffer.numel(), payload_bytes)
        if self._signatures.get(bucket.index()) == mine:
            return
        everyone = [torch.empty(len(mine), dtype=torch.int64, device=buffer.device) for _ in range(world)]
        dist.all_gather(everyone, torch.tensor(mine, dtype=torch.int64, device=buffer.device), group=group)
        everyone = [tuple(int(v) for v in t.cpu()) for t in everyone]
        first = everyone[0]
        for rank, theirs in enumerate(everyone):
            if theirs == first:
                continue
            index, path0, dtype0, numel0, bytes0 = first
            _, path1, dtype1, numel1, bytes1 = theirs
            if theirs[0] != index:
                what = f"is at bucket {theirs[0]}, rank 0 at bucket {index}"
            elif dtype1 != dtype0:
                what = (f"sends bucket {index} as {_DTYPE_NAMES.get(dtype1, dtype1)}, rank 0 as "
                        f"{_DTYPE_NAMES.get(dtype0, dtype0)} (a communication hook wrapper on some ranks only?)")
            elif numel1 != numel0:
                what = f"has {numel1} values in bucket {index}, rank 0 has {numel0}"
            elif path1 != path0:
                how = ("dense", "by all-gather", "by reduce-scatter")
                what = f"sends bucket {index} {how[path1]}, rank 0 {how[path0]}"
            else:
                what = f"sends bucket {index} in {bytes1}-byte payloads, rank 0 in {bytes0} (another layout)"
            raise self._fail(ExchangeError(f"sidco_torch.State: rank {rank} {what}; every rank must hand the hook "
                                           "the same buckets"))
        self._signatures[bucket.index()] = mine

    def _bucket(self, bucket, world):
        """The bucket's state, and what went wrong on this rank alone (None: nothing). A
        problem of one rank must travel in its payload, never be raised before the
        collective, or the other ranks would wait for it."""
        params = bucket.parameters()
        sizes = [p.numel() for p in params]
        buffer = bucket.buffer()
        if sum(sizes) != buffer.numel():
            raise ValueError(f"sidco_torch.State: bucket {bucket.index()} holds {buffer.numel()} values, its "
                             f"parameters {sum(sizes)}")
        keys = tuple(self._key(p) for p in params)
        exchange = self.exchange_for(world, buffer.device.type)
        b = self._buckets.get(keys)
        if b is not None and b.dtype == buffer.dtype and b.device == buffer.device and len(b.inbox) == world \
                and b.exchange == exchange and b.density == self._step_density \
                and b.capacity_density == self._verified:
            return b, None
        previous = b
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        b = _Bucket(self, keys, sizes, buffer.dtype, buffer.device, world, dist.get_rank(group), exchange)
        # Each parameter's state follows it: from the bucket that held it, or a loaded state.
        try:
            for i, key in enumerate(keys):
                owner = self._owner.get(key)
                if owner is not None:
                    self._import(b, i, _Layer(**self._export(*owner)))
                elif key in self._pending:
                    self._import(b, i, self._pending[key])
            saved = self._pending_exchanges.get("|".join(keys))
            if previous is not None and previous.exchange == "reduce" == exchange and len(previous.inbox) == world:
                saved = previous.codec.exchange_state()  # a new density or dtype keeps the regions
            if saved is not None and exchange == "reduce":
                b.codec.load_exchange_state(saved)
        except Exception as e:  # noqa: BLE001 - any of it is this rank's failure to report
            return b, f"{type(e).__name__}: {e}"
        self._pending_exchanges.pop("|".join(keys), None)
        for i, key in enumerate(keys):
            self._pending.pop(key, None)
            self._owner[key] = (b, i)
        self._buckets[keys] = b
        self._warn_density(bucket.index(), sizes, b.density)
        owners = {id(owner[0]) for owner in self._owner.values()}
        for other in [k for k, v in self._buckets.items() if id(v) not in owners]:
            del self._buckets[other]
        return b, None

    def _warn_density(self, index, sizes, density):
        """Once per bucket and density: each tensor keeps at least one entry (k = max(1,
        floor(density n))), so tensors under 1 / density values raise what the bucket sends."""
        kept = sum(max(1, math.floor(density * n)) for n in sizes)
        wanted = density * sum(sizes)
        reason = ("density", index, density)
        if kept > 1.1 * wanted and reason not in self._warned:
            self._warned.add(reason)
            small = sum(1 for n in sizes if density * n < 1)
            warnings.warn(f"sidco_torch: bucket {index} sends {kept / wanted:.3g}x the density asked ({density:g}): "
                          f"each tensor keeps at least one entry, and {small} of its {len(sizes)} tensors have fewer "
                          f"than 1/density = {1 / density:.3g} values", stacklevel=4)

    def _why_dense(self, buffer, world, iteration):
        """Why this bucket goes dense, or None; from the agreed density, so that every rank
        chooses alike."""
        density = self._verified
        if iteration < self.start_iter:
            return f"iteration {iteration} < start_iter {self.start_iter}"
        if buffer.numel() < self.min_bucket_elements:
            return f"{buffer.numel()} values < min_bucket_elements {self.min_bucket_elements}"
        value = buffer.element_size()
        if self.exchange_for(world, buffer.device.type) == "reduce":
            # Two rounds of about slack k entries against a ring all-reduce's 2 (P - 1) / P x the bucket.
            if density * self.capacity_slack * (4 + value) >= value:
                return (f"density x capacity_slack = {density * self.capacity_slack:.3g} makes the exchanged "
                        "entries outweigh a dense all-reduce")
            return None
        # The gathered payloads against a ring all-reduce's 2 x the bucket.
        if world * density * self.capacity_slack * (4 + value) >= 2 * value:
            return (f"density x ranks x capacity_slack = {density * world * self.capacity_slack:.3g} "
                    f"makes the gathered entries outweigh a dense all-reduce")
        return None


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
    state.attach(ddp_model.module)
    ddp_model.register_comm_hook(state, comm_hook or hook)


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
             "failed": False}
    state._stats[bucket.index()] = stats
    sent = time.perf_counter()
    buffer.div_(world)  # first: the sum of averages cannot overflow where the sum could

    def done(future):
        stats["exchange_seconds"] = time.perf_counter() - sent
        reduced = future.value()[0]
        if state.nonfinite == "skip" and not bool(torch.isfinite(reduced).all()):
            state._skip = state._step_iteration  # the same sum on every rank: every rank skips
            stats["skipped"] = True
        return reduced

    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(done)


def _sparse_stats(state, buffer, report, exchange, compress_seconds, bytes_sent):
    """A sparse bucket's statistics from its codec's report (State.stats() lists them)."""
    return {"path": "sparse", "exchange": exchange, "size": buffer.numel(), "selected": int(report["selected"]),
            "candidates": int(report["candidates"]), "trimmed": int(report["trimmed"]),
            "capacity": int(report["capacity"]), "density": report["density"], "target_density": state._step_density,
            "threshold": report["threshold"], "stages": int(report["stages"]), "fallback": bool(report["fallback"]),
            "compress_seconds": compress_seconds, "bytes_sent": bytes_sent, "failed": bool(report["failed"])}


def _reduce(state, bucket, b, group, iteration, problem, started):
    """The reduce-scatter exchange: blocks to the regions' owners (all_to_all_single, waited
    for here: the owners' selection needs them), each owner's selection all-gathered
    asynchronously, and decoded in the future's then() (local work only)."""
    buffer = bucket.buffer()
    if state.nonfinite == "skip":
        state._save_bucket(b)
    if problem is None:
        blocks = torch.ops.sidco.reduce_encode(buffer, b.residual, b.codec, bucket.index(), iteration)
    else:
        blocks = torch.ops.sidco.reduce_encode_failure(buffer, b.codec, problem, bucket.index(), iteration)
    encoded = time.perf_counter()
    dist.all_to_all_single(b.received, blocks, group=group)
    selection = torch.ops.sidco.reduce_select(b.received, b.codec)
    report = b.codec.report()
    stats = _sparse_stats(state, buffer, report, "reduce", encoded - started, int(report["payload_bytes"]) * len(b.inbox))
    state._stats[bucket.index()] = stats
    inbox = b.inbox

    def decode(future):
        future.value()  # a failed all-gather raises here
        began = time.perf_counter()
        stats["exchange_seconds"] = began - encoded
        if not _decoded(state, b, inbox, buffer, stats, torch.ops.sidco.reduce_decode):
            return buffer
        done = b.codec.report()
        stats["decode_seconds"] = time.perf_counter() - began
        stats.update(union_density=done["union_entries"] / buffer.numel(),
                     global_density=done["global_selected"] / buffer.numel(),
                     returned=int(done["returned"]), bytes_received=int(done["bytes_received"]),
                     dropped=done["returned"] / max(1.0, done["selected"]))
        return buffer

    return dist.all_gather(inbox, selection, group=group, async_op=True).get_future().then(decode)


def hook(state, bucket):
    """The communication hook: sidco_torch.register(ddp_model, state), or
    ddp_model.register_comm_hook(state, sidco_torch.hook)."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    state._begin_step()
    if not state._agreed:
        state._agree_configuration(group, world, bucket.buffer().device)
    for p in bucket.parameters():
        state._key(p)  # a parameter of another model is refused on every path
    iteration = state.iteration
    if bucket.is_last():
        state.iteration += 1
        state._complete = True
        state._in_step = False
    buffer = bucket.buffer()
    reason = state._why_dense(buffer, world, iteration)
    if reason is not None:
        state._agree_wire_format(group, world, bucket, "dense", buffer.numel() * buffer.element_size())
        return _all_reduce_dense(state, bucket, group, world, reason)
    started = time.perf_counter()
    b, problem = state._bucket(bucket, world)
    problem = problem or state._step_problem
    state._agree_wire_format(group, world, bucket, b.exchange, b.payload_bytes())
    if b.exchange == "reduce":
        return _reduce(state, bucket, b, group, iteration, problem, started)
    if state.nonfinite == "skip":
        state._save_bucket(b)
    if problem is None:
        payload = torch.ops.sidco.encode(buffer, b.residual, b.codec, bucket.index(), iteration)
    else:
        payload = torch.ops.sidco.encode_failure(buffer, b.codec, problem, bucket.index(), iteration)
    report = b.codec.report()
    encoded = time.perf_counter()
    stats = _sparse_stats(state, buffer, report, "allgather", encoded - started, int(report["payload_bytes"]))
    state._stats[bucket.index()] = stats
    inbox = b.inbox

    def decode(future):
        future.value()  # a failed all-gather raises here
        began = time.perf_counter()
        stats["exchange_seconds"] = began - encoded
        if not _decoded(state, b, inbox, buffer, stats, torch.ops.sidco.decode):
            return buffer
        stats["decode_seconds"] = time.perf_counter() - began
        return buffer

    return dist.all_gather(inbox, payload, group=group, async_op=True).get_future().then(decode)
