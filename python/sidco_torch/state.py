"""The hook's State: its arguments, the parameters' keys, the statistics, and the bookkeeping
of each step (the density, a skipped step put back, each bucket's codec)."""
import difflib
import math
import statistics
import time
import warnings
import weakref

import torch
import torch.distributed as dist

from .agreement import _Agreement
from .arguments import (_COMPRESSED, _EXCHANGES, _NONFINITE, _REDUCE_SCHEDULES, _WIRES, _checked_density, _flag, _owner_name,
                        _real_scalar, _whole_number)
from .callbacks import _StepCallbacks
from .checkpoint import _Checkpoints
from .codecs import _Bucket, _Layer
from .ops import _check_method, _codec, _options_dict


# State's own arguments (a misspelt one arrives among the compressor's options).
_ARGUMENTS = ("method", "density", "process_group", "start_iter", "min_bucket_elements", "feedback",
              "capacity_slack", "exchange", "owner", "nonfinite", "wire", "dense_parameters")


# From how many ranks reduce_schedule="auto" takes two hops (docs/PYTORCH.md).
_TWO_HOP_FROM = 16

# exchange="auto" (among 3 or more ranks on CPU buckets) and wire="auto" (on CPU buckets)
# time their choices from the first sparse step: each (exchange, wire) pair in a block of
# _PROBE_STEPS steps, the pairs in order, _PROBE_ROUNDS times; the first step of each block
# untimed (it builds the codecs and agrees the new wire format).
_PROBE_ROUNDS = 2
_PROBE_STEPS = 3
# The reduce exchange applies k entries a step where the all-gather applies the union of the
# ranks' selections, which grows with P; so it needs more steps to the same loss, the more
# the ranks: measured on the synthetic-token LSTM of bench/default_exchange_loss.py (two
# seeds, the larger ratio rounded up to 0.05; docs/PYTORCH.md), (ranks, steps factor).
# "auto" keeps it when its step is at most 1 / factor of the all-gather's.
_REDUCE_STEPS_FACTORS = ((4, 1.15), (8, 1.20), (16, 1.25), (32, 1.30))
# wire="auto" takes, for an exchange, the most precise of its wires whose steps are at most
# _WIRE_MARGIN longer than the fastest one's: narrower values for a gain within the probe's
# noise would only cost precision (and the same run could choose differently each time).
_WIRE_PRECISION = ("plain", "compact", "compact8")
_WIRE_MARGIN = 0.03


def _reduce_steps_factor(ranks):
    """How many times the all-gather's steps the reduce exchange needs to its loss among
    ranks: the measured factors, linear in log2(ranks) between them, the first below them
    and the last beyond them (not measured there)."""
    points = _REDUCE_STEPS_FACTORS
    if ranks <= points[0][0]:
        return points[0][1]
    for (p0, f0), (p1, f1) in zip(points, points[1:]):
        if ranks <= p1:
            return f0 + (f1 - f0) * (math.log2(ranks) - math.log2(p0)) / (math.log2(p1) - math.log2(p0))
    return points[-1][1]


def _precise_enough(seconds):
    """(seconds, wire) of the most precise wire whose step (seconds: wire -> the ranks' mean
    of medians) is within _WIRE_MARGIN of the fastest wire's."""
    fastest = min(seconds.values())
    wire = next(w for w in _WIRE_PRECISION if w in seconds and seconds[w] <= fastest * (1 + _WIRE_MARGIN))
    return seconds[wire], wire


def _scheduled(schedule, iteration):
    """schedule(iteration), with a sentence when it cannot be called so."""
    try:
        return schedule(iteration)
    except TypeError as e:
        raise TypeError(f"sidco_torch.State: the density schedule, called as density({iteration}) (a schedule takes "
                        f"the iteration, an int, and returns a density), raised TypeError: {e}") from e


def _summed(stats):
    """One step's statistics (State.stats()'s values) summed over its buckets."""
    out = dict(values=0, sent=0, bytes_sent=0, dense_bytes=0, compress_ms=0.0, exchange_ms=0.0, decode_ms=0.0,
               hook_ms=0.0, sparse_buckets=0, dense_buckets=0)
    for s in stats:
        dense = s["path"] == "dense"
        out["values"] += s["size"]
        out["sent"] += s["selected"] + s.get("dense_values", 0)  # a dense bucket's selected: every value
        out["bytes_sent"] += s["bytes_sent"]
        out["dense_bytes"] += s["size"] * s.get("element_size", 4)
        out["compress_ms"] += 1e3 * s.get("compress_seconds", 0.0)
        out["exchange_ms"] += 1e3 * s.get("exchange_seconds", 0.0)
        out["decode_ms"] += 1e3 * s.get("decode_seconds", 0.0)
        out["hook_ms"] += 1e3 * s.get("hook_seconds", 0.0)
        out["dense_buckets" if dense else "sparse_buckets"] += 1
    return out


def _with_ratios(sums):
    out = dict(sums)
    out["density"] = sums["sent"] / sums["values"] if sums["values"] else 0.0
    out["bytes_ratio"] = sums["bytes_sent"] / sums["dense_bytes"] if sums["dense_bytes"] else 0.0
    return out


class State(_Checkpoints, _Agreement):
    """What the hook keeps between steps: per parameter, its residual and compressor state;
    per bucket, its codec; the iteration. One paragraph per argument:

    method: a sidco_torch method (sidco_torch.methods(): the built-in METHODS and those extensions
    added), "sidco-e" by default.

    density: the share of each tensor sent, in (0, 1]: any real scalar, or a schedule (a
    function of the iteration returning one, evaluated once a step, alike on every rank).
    set_density() changes it during training. Each tensor keeps k = max(1, floor(density n)).
    With exchange "allgather" every rank applies the union of the ranks' selections (up to P k
    entries); with "reduce" every rank applies the global selection of about k entries.

    process_group: the group the hook exchanges in; None for the default group, or the DDP
        model's when sidco_torch.register() gives it one (DDP(model, process_group=...)).

    start_iter: the first iterations are all-reduced densely (their residual is folded in).

    min_bucket_elements: smaller buckets are all-reduced densely.

    dense_parameters: parameters never compressed (say, normalization layers or a small
    output layer whose every update matters): their names (as model.named_parameters() gives
    them; needs sidco_torch.register) or a function (name, parameter) -> bool. Their values
    leave the bucket before it is compressed and are averaged by one all_reduce of their own,
    issued beside the bucket's sparse exchange; every rank must name the same ones (the hook
    compares the counts per bucket before the collectives).

    feedback: error feedback (recommended): what is not sent waits in a residual per tensor.

    capacity_slack: each tensor sends at most ceil(slack k) entries (the payloads have a fixed
    size); what is over goes back into the residual.

    exchange: "allgather" (one all-gather of every rank's selection: (P - 1) slack 8k bytes a
    rank), "reduce" (an all-to-all of fixed-size blocks to P owners, each index owned by one
    rank by a hash of it, then an all-gather of each owner's selection of its reduced
    values: about 2 slack 8k bytes a rank whatever P), or "auto" (see exchange_for).

    reduce_steps_factor: for exchange="auto", how many times the all-gather's steps the
    reduce exchange needs to the same loss on this model (f of exchange_for), a number in
    [0.5, 10]; None (the default): the factors measured on a synthetic LSTM, 1.15 to 1.30 by
    the number of ranks, which lean to the all-gather where a model needs fewer (the
    WikiText-2 LSTM needed 1.10 at 8 ranks). Unused when the exchange is named.

    owner: how an owner in the "reduce" exchange selects from the sums it reduced, by the
    method registry's names: "sidco-e-exact" (SIDCo-E's threshold, trimmed to exactly the
    owner's share; the default) or "top-k" (exact Top-k). "sidco-e", its first name, still
    works with a DeprecationWarning.

    wire: how the entries go on the wire: "plain" (32-bit indices, values in the
    bucket's dtype: (P - 1) slack 8k bytes a rank for float32) or "compact" (values narrowed
    to half their width: float32 as bfloat16, float64 as float32, 16-bit as they are; what
    rounding takes off stays in the residual; indices as variable-length gaps, one or two
    bytes each), in payloads of a fixed size (zeros after what they use): 3-4 bytes an
    entry where plain ones take 10. In the reduce exchange the values a rank
    sends are rounded alike, and so is each owner's update (what that takes off stays in the
    owner's carry, added to the index's next update it keeps); both travel narrowed. On CUDA
    buckets too, by either exchange (their payloads are packed, and their messages framed,
    on the host; not yet run on a GPU). "auto" (the default): timed
    against plain in the first sparse steps, the most precise within 3% of the fastest kept
    (see wire_for); plain on CUDA buckets. "compact8": as compact, with each value in one byte
    (4 significant bits on a scale each payload shares: its largest value's binade and the
    15 below; what rounding takes off, or a value below that range, stays in the residual;
    in the reduce exchange an owner's update below its scale's range is sent as 0 and kept
    whole in its carry): 2-2.5 bytes an entry. "auto" times it with each exchange it times.

    reduce_schedule: how the "reduce" exchange moves CPU buckets' blocks and selections:
    "flat" (an all-to-all of the blocks, then an all-gather of the owners' selections: P - 1
    messages a rank each way, each block crossing one link), "two-hop" (the MPI exchange's
    default: through an intermediate of a sqrt(P) grid, by send/recv, O(sqrt P) messages a
    rank each way, most blocks crossing two links: fewer latencies), or "auto" (see
    schedule_for). Either way each bucket's rounds are posted a phase at a time by the step's
    later hook calls, while backward goes on (staged.py), never waited for in the call that
    starts them. The same update either way, bit for bit.
    CUDA buckets move flat.

    nonfinite: what a step does when some rank's bucket holds NaN or +-Inf: "raise" (every
    rank raises the same error naming that rank: a NaN in a float32 run is a bug to see) or
    "skip" (for mixed precision: every rank's reduced bucket is filled with NaN, so that a
    GradScaler skips the step on every rank, and at the next step every residual, adaptive
    state and the iteration count are put back as they were before the skipped one; costs a
    copy of each bucket's residual and state per step).

    options: passed to the compressor (seed: random-k's shared seed).

    One State serves one model. Register it with sidco_torch.register(ddp_model, state) so
    that its state_dict() is keyed by parameter name; with ddp_model.register_comm_hook(state,
    sidco_torch.hook) it is keyed by the order DDP first hands the parameters over, which is
    the same in every run of the same model. A step that fails on any rank raises the same
    ExchangeError on every rank, with every rank's sent entries back in its residual and
    every exchange's owner state as before the step: the next step works."""

    def __init__(self, method="sidco-e", density=0.01, process_group=None, start_iter=2,
                 min_bucket_elements=1024, feedback=True, capacity_slack=1.25, exchange="auto", owner="sidco-e-exact",
                 nonfinite="raise", wire="auto", dense_parameters=None, reduce_schedule="auto",
                 reduce_steps_factor=None, **options):
        schedule = density if callable(density) else None
        density = _checked_density(_scheduled(schedule, 0) if schedule else density,
                                   "density(0)" if schedule else "density")
        capacity_slack = _real_scalar(capacity_slack, "capacity_slack")
        if not 1 <= capacity_slack <= 1000:
            raise ValueError(f"sidco_torch.State: capacity_slack = {capacity_slack!r} is outside [1, 1000]")
        start_iter = _whole_number(start_iter, "start_iter")
        min_bucket_elements = _whole_number(min_bucket_elements, "min_bucket_elements")
        if exchange not in _EXCHANGES:
            raise ValueError(f"sidco_torch.State: exchange = {exchange!r} is not one of "
                             f"{', '.join(map(repr, _EXCHANGES))}")
        if wire not in _WIRES:
            raise ValueError(f"sidco_torch.State: wire = {wire!r} is not one of {', '.join(map(repr, _WIRES))}")
        if reduce_schedule not in _REDUCE_SCHEDULES:
            raise ValueError(f"sidco_torch.State: reduce_schedule = {reduce_schedule!r} is not one of "
                             f"{', '.join(map(repr, _REDUCE_SCHEDULES))}")
        if reduce_steps_factor is not None:
            reduce_steps_factor = _real_scalar(reduce_steps_factor, "reduce_steps_factor")
            if not 0.5 <= reduce_steps_factor <= 10:
                raise ValueError(f"sidco_torch.State: reduce_steps_factor = {reduce_steps_factor!r} is outside "
                                 "[0.5, 10] (or None: the measured factors)")
        if nonfinite not in _NONFINITE:
            raise ValueError(f"sidco_torch.State: nonfinite = {nonfinite!r} is not 'raise' or 'skip'")
        owner = _owner_name(owner)
        feedback = _flag(feedback, "feedback")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError("sidco_torch.State: process_group must be a torch.distributed ProcessGroup (from "
                            f"dist.new_group) or None for the default group, got {type(process_group).__name__} "
                            f"{process_group!r}")
        if dense_parameters is not None and not callable(dense_parameters):
            # Listed once: a generator checked and then read again would give no names at all.
            names = (None if isinstance(dense_parameters, (str, bytes)) or not hasattr(dense_parameters, "__iter__")
                     else list(dense_parameters))
            if names is None or not all(isinstance(n, str) for n in names):
                raise TypeError("sidco_torch.State: dense_parameters must be parameter names (a list of str) or a "
                                f"function (name, parameter) -> bool, got {dense_parameters!r}")
            dense_parameters = frozenset(names)
        _check_method(method, "sidco_torch.State")
        _options_dict(options, "sidco_torch.State", _ARGUMENTS)
        # What only the ops know ("auto" may choose either coding).
        _codec(method, options, [1], torch.float32, density, capacity_slack,
               wire="plain" if wire == "plain" else "compact")
        self.method = method
        self.wire = wire
        self.exchange = exchange
        self.reduce_schedule = reduce_schedule
        self.reduce_steps_factor = reduce_steps_factor
        self.owner = owner
        self.nonfinite = nonfinite
        self._density = density    # the density, or the schedule's first value
        self._schedule = schedule  # the schedule, or None
        # Held weakly: the hook's then() callbacks hold the State, and a gloo worker that runs
        # one can drop the last reference to it; holding the group too, it would then destroy
        # the group on the group's own worker (which joins itself: torch aborts the process).
        # The group lives while torch.distributed (until destroy_process_group) or DDP holds it.
        self._process_group = None if process_group is None else weakref.ref(process_group)
        self.start_iter = start_iter
        self.min_bucket_elements = min_bucket_elements
        self.dense_parameters = dense_parameters
        self.feedback = feedback
        self.capacity_slack = capacity_slack
        self.options = dict(options)
        self.iteration = 0
        self._clock = time.perf_counter  # exchange="auto"'s probe times steps by it
        self._reset()

    @property
    def process_group(self):
        """The group the hook exchanges in; None for the default group."""
        if self._process_group is None:
            return None
        group = self._process_group()
        if group is None:
            raise RuntimeError("sidco_torch.State: its process_group is gone (destroyed, and no DDP model holds it "
                               "any more): build a new State for the new group")
        return group

    def _check_group(self, group):
        """register(): the hook must exchange in the DDP model's process group (a data-parallel
        group of a hybrid-parallel job): a State made for another group is refused, and so is
        one that has already exchanged in the default group."""
        mine = self.process_group
        if group is None or mine is group or (mine is None and group is dist.group.WORLD):
            return
        if mine is not None:
            raise ValueError("sidco_torch.register: the State's process_group is not the DDP model's (DDP(model, "
                             "process_group=...)); the hook would exchange among other ranks than DDP's: give the "
                             "State the same group, or none (register then takes DDP's)")
        if self._buckets or self._agreed:
            raise ValueError("sidco_torch.register: this State has exchanged in the default group; the DDP model "
                             "uses another process group: build a new State for it")

    def _serve_group(self, group):
        """register(): a State without a process_group takes the DDP model's."""
        if group is not None and group is not dist.group.WORLD and self._process_group is None:
            self._process_group = weakref.ref(group)

    def _reset(self):
        self._buckets = {}      # parameter keys -> _Bucket
        self._owner = {}        # parameter key -> (_Bucket, layer index)
        self._pending = {}      # parameter key -> _Layer, not yet in a bucket
        self._stats = {}
        self._totals = {}  # summary()'s sums over the steps before the last
        # Tensors this step handed to collectives, kept until the next step begins: a gloo
        # worker left holding the last reference to a tensor Python made takes the GIL to free
        # it, and torch 1.13 joins its workers holding the GIL when the process group goes
        # (the DDP reducer's destructor at exit): the two then wait for each other forever.
        self._in_flight = []
        self._callbacks = _StepCallbacks(lambda *futures: self._in_flight.extend(futures))
        self._keys = {}         # id(parameter) -> (weakref, key)
        self._global_ranks = {}  # id(process group) -> its ranks' global ranks
        self._keying = None     # "names" (attach) or "order" (DDP's), once known
        self._module = None
        self._complete = False  # a whole iteration has been seen: the model's parameters are known
        self._agreed = False
        self._signatures = {}   # bucket index -> what every rank agreed its payload is
        self._pending_exchanges = {}  # _exchange_key(keys) -> a reduce codec's saved owner state
        self._loaded_from = None  # (rank, world) of a loaded state, checked by the next agreement
        self._warned = set()
        self._in_step = False   # a hook call of this iteration has run, its last bucket's not yet
        self._step_failed = False  # this step raised an ExchangeError
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
        self._step_began = None  # when this step's first hook call ran
        self._staged = []       # reduce buckets whose exchange has phases still to post (staged.py)
        self._last_index = -1   # the bucket index of this step's last hook call
        self._reset_probe()

    def _reset_probe(self):
        """exchange="auto"'s and wire="auto"'s measurement, from its start."""
        self._auto = None          # auto_exchange(): the choice and what it was made from, once made
        self._probe_start = None   # the iteration the probe began at
        self._probe_times = {}     # "exchange/wire" -> this rank's timed steps with it, seconds
        self._probe_last = None    # (iteration, when it began) of the last probed step

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
        return _checked_density(_scheduled(self._schedule, iteration), f"density({iteration})")

    def exchange_for(self, world, device_type="cpu"):
        """The exchange the hook uses among world ranks this step. "auto": the all-gather at 2
        ranks (the reduce exchange's bytes in one round more) and on CUDA buckets (the reduce
        exchange runs there, exchange="reduce", but is not timed on GPUs yet). From 3 ranks on
        CPU buckets it measures: from the first sparse step the probe (see auto_exchange)
        times both, then every rank takes the one with the shorter time to the same loss: the
        reduce exchange when the ranks' mean of their median step times with it is at most 1 /
        f of the all-gather's, f the steps it needs to the same loss over the all-gather's (it
        applies k entries a step where the all-gather applies the union of the ranks'
        selections): State(reduce_steps_factor=...) where given, otherwise 1.15 at 3 and 4
        ranks, 1.20 at 8, 1.25 at 16, 1.30 from 32, between them by log2(world) (measured on a
        synthetic LSTM; on the WikiText-2 LSTM it needed fewer: docs/PYTORCH.md).
        By bytes alone it would always win from 3 ranks (about 2 s k (4 + v) bytes a rank
        against (P - 1) s k (4 + v)), which on a fast link or a small model loses time (docs/
        PYTORCH.md). auto_exchange() says what was measured and chosen."""
        return self._configuration(world, device_type)[0]

    def steps_factor_for(self, world):
        """f of exchange_for among world ranks: State(reduce_steps_factor=...), or the measured
        factors where it is None."""
        if self.reduce_steps_factor is not None:
            return self.reduce_steps_factor
        return _reduce_steps_factor(world)

    def wire_for(self, world, device_type="cpu"):
        """The entry coding the hook uses among world ranks this step. "auto": "plain" on CUDA
        buckets (compact is not timed there: not yet run on a GPU) and in a world of one;
        otherwise the probe (see auto_exchange) times both codings with each exchange it times
        and every rank takes, for the exchange chosen, the most precise coding (plain, compact,
        compact8) whose steps were at most 3% longer than the fastest one's: compact
        sends a third of the bytes but narrows, codes and expands the entries, which pays on
        a slow link and may cost on a fast one (docs/PYTORCH.md). The loss is the same either
        way (final training loss within 0.1% on two language models; compact8's within 0.02%
        on the LSTM, 2.5% above on average over 24 seeds on a digits MLP's near-zero loss:
        docs/RESULTS.md)."""
        return self._configuration(world, device_type)[1]

    def _choices(self, world, device_type):
        """(the exchanges, the wires) this State may use among world ranks: more than one of
        either when it is "auto" and there is something to time."""
        if self.exchange != "auto":
            exchanges = (self.exchange,)
        else:
            exchanges = ("allgather", "reduce") if world >= 3 and device_type == "cpu" else ("allgather",)
        if self.wire != "auto":
            wires = (self.wire,)
        else:
            # compact last: the pair taken by bytes (the last) narrows no further than bfloat16.
            wires = ("plain", "compact8", "compact") if world >= 2 and device_type == "cpu" else ("plain",)
        return exchanges, wires

    def _candidates(self, world, device_type):
        """The (exchange, wire) pairs of _choices, in the probe's order."""
        exchanges, wires = self._choices(world, device_type)
        return tuple((e, w) for w in wires for e in exchanges)

    def _configuration(self, world, device_type):
        """This step's (exchange, wire)."""
        candidates = self._candidates(world, device_type)
        if len(candidates) == 1:
            return candidates[0]
        if self._auto is not None and self._auto["ranks"] == world:
            return self._auto["chosen"], self._auto["wire"]
        probed = self._probed(self._step_iteration, candidates)
        # Before the probe (dense steps): by bytes, the last pair (the reduce exchange, compact).
        return probed or candidates[-1]

    def _probed(self, iteration, candidates):
        """The (exchange, wire) the probe runs at iteration, None outside it."""
        position = iteration - self._probe_start if self._probe_start is not None else -1
        if 0 <= position < _PROBE_ROUNDS * len(candidates) * _PROBE_STEPS:
            return candidates[position // _PROBE_STEPS % len(candidates)]
        return None

    def auto_exchange(self):
        """What exchange="auto" and wire="auto" measured (among 3 or more ranks on CPU buckets
        for the exchange, 2 or more for the wire), once they chose; None before, or with both
        named. From the first sparse step the probe runs each (exchange, wire) pair it may use
        for 3 steps (the first untimed), the pairs in turn, twice: 12 steps for the exchange
        alone, 18 for the wire alone (plain, compact8, compact), 36 for both; then one
        all_gather of every rank's median step time per pair, and the same choice on every
        rank: {"chosen" (the exchange), "wire", "seconds" ("exchange/wire" -> the ranks' mean
        of their medians), "ranks", "iteration" (the step it chose at)}; when it chose the
        exchange also "allgather_seconds" and "reduce_seconds" (each exchange's time with the
        wire it would take) and "steps_factor" (f of exchange_for: the reduce exchange kept
        when reduce_seconds x f <= allgather_seconds)."""
        return dict(self._auto) if self._auto is not None else None

    def _probe_step(self, group, world, device_type):
        """At a step's first hook call, when something is "auto": the last probed step's time
        noted; once the probe's steps are done, every rank's medians gathered (one
        all_gather) and the same exchange and wire chosen on every rank."""
        candidates = self._candidates(world, device_type)
        if len(candidates) == 1:
            return
        if self._auto is not None:
            if self._auto["ranks"] == world:
                return
            self._reset_probe()  # a state chosen among another number of ranks measures again
        now, iteration = self._step_began, self._step_iteration
        if self._probe_start is None:
            if iteration < self.start_iter:
                return
            self._probe_start = iteration
        if self._probe_last is not None:
            last, began = self._probe_last
            probed = self._probed(last, candidates)
            if probed is not None and (last - self._probe_start) % _PROBE_STEPS and last < iteration:
                self._probe_times.setdefault("/".join(probed), []).append(now - began)
        self._probe_last = (iteration, now)
        if iteration - self._probe_start < _PROBE_ROUNDS * len(candidates) * _PROBE_STEPS:
            return
        keys = ["/".join(c) for c in candidates]
        times = self._probe_times
        mine = torch.tensor([statistics.median(times[k]) if times.get(k) else -1.0 for k in keys],
                            dtype=torch.float64)
        everyone = self._kept_all_gather(mine, group, world)
        # The same sums in the same order on every rank: the same choice.
        seconds = {k: sum(float(t[j]) for t in everyone) / world for j, k in enumerate(keys)}
        exchanges, wires = self._choices(world, device_type)
        self._auto = {"ranks": world, "iteration": iteration, "seconds": seconds}
        if min(float(t.min()) for t in everyone) < 0:
            # Some rank timed no step of some pair (resumed mid-probe): by bytes.
            chosen, wire = exchanges[-1], wires[-1]
        else:
            best = {e: _precise_enough({w: seconds[f"{e}/{w}"] for e2, w in candidates if e2 == e})
                    for e in exchanges}
            chosen = exchanges[0]
            if len(exchanges) == 2:
                factor = self.steps_factor_for(world)
                allgather, reduce = best["allgather"][0], best["reduce"][0]
                chosen = "reduce" if reduce * factor <= allgather else "allgather"
                self._auto.update(allgather_seconds=allgather, reduce_seconds=reduce, steps_factor=factor)
            wire = best[chosen][1]
        self._auto.update(chosen=chosen, wire=wire)
        if chosen == "allgather":
            # The owners' states the probe kept would never be used (and would tie a saved
            # state to this number of ranks).
            self._pending_exchanges.clear()

    def schedule_for(self, world):
        """The reduce exchange's schedule among world ranks on CPU buckets. "auto": "flat"
        below 16 ranks, "two-hop" from 16: counted on the loopback at 16 gloo ranks, two hops
        took 0.81-0.88x flat's step time in every model and bucket size tried and 0.47-1.11x its
        bytes; at 8 ranks the two were within 5% of each other (docs/PYTORCH.md)."""
        if self.reduce_schedule != "auto":
            return self.reduce_schedule
        return "two-hop" if world >= _TWO_HOP_FROM else "flat"

    def _group_ranks(self, group):
        """The global rank of each rank of group (send/recv take global ranks)."""
        ranks = self._global_ranks.get(id(group))
        if ranks is None:
            ranks = [dist.distributed_c10d._get_global_rank(group, r) if group is not dist.group.WORLD else r
                     for r in range(dist.get_world_size(group))]
            self._global_ranks[id(group)] = ranks
        return ranks

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
        if isinstance(self.dense_parameters, frozenset):
            names = [name for name, _ in named]
            for name in sorted(self.dense_parameters - set(names)):
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"sidco_torch.State: dense_parameters names {name!r}, which is not a parameter of "
                                 f"{type(module).__name__}{hint}")
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

    def _dense_slices(self, bucket):
        """The bucket's (offset, size) slices that hold dense_parameters."""
        if self.dense_parameters is None:
            return []
        slices, offset = [], 0
        for p in bucket.parameters():
            key = self._key(p)
            if callable(self.dense_parameters):
                dense = bool(self.dense_parameters(key, p))
            else:
                if self._keying != "names":
                    raise ValueError("sidco_torch.State: dense_parameters names parameters, which needs "
                                     "sidco_torch.register(ddp_model, state) (the hook knows them by name only then)")
                dense = key in self.dense_parameters
            if dense:
                slices.append((offset, p.numel()))
            offset += p.numel()
        return slices

    # ----- statistics

    def stats(self):
        """The last step's statistics, per bucket index: path (sparse or dense, and the reason
        when dense), size, selected, candidates, trimmed, capacity, density (achieved),
        target_density, threshold (-1 when per layer), stages, fallback (some tensor's fit
        degenerated and the radix threshold replaced it), compress_seconds
        (this rank's encode), exchange_seconds (from the payload's send to its decode, the
        waits for the other ranks in it), decode_seconds, hook_seconds (the hook call's own time:
        what backward waited for at this bucket, earlier buckets' staged phases and, at the
        step's last call, the decodes included), bytes_sent
        (what this rank hands the collectives: its all-gather payload; with exchange "reduce",
        its P - 1 blocks and its selection: on CPU buckets as frames at their own sizes and the
        P - 1 sizes, on CUDA buckets at the heads the ranks agreed; in two hops, the messages of
        both rounds, forwarded frames included), bytes_per_entry (bytes_sent
        over selected), wire
        ("plain", "compact" or "compact8"), element_size (a value's bytes), failed, exchange ("allgather" or
        "reduce"), dense_values (with dense_parameters: the values all-reduced densely beside the
        exchange, their bytes in bytes_sent); with
        "reduce" also schedule ("flat" or "two-hop"), union_density (the owners' reduced entries
        over the bucket),
        global_density (the global selection's), returned (entries this rank sent that the
        owners left out: back in its residual), dropped (their share of what it sent) and
        bytes_received; with nonfinite="skip", skipped (the bucket came back as NaN because
        some rank's held non-finite values)."""
        return {index: dict(s) for index, s in self._stats.items()}

    def summary(self):
        """What to log each step: {"step": the last step's totals over its buckets, "total": the
        same summed over every step this State ran (since it was made; a loaded state_dict
        does not carry them)}. Each holds density (entries sent over the values, dense
        buckets counting every value, a sparse gradient its rows' values), bytes_sent (what this rank handed the collectives),
        dense_bytes (what DDP's all-reduce would have been handed: every bucket whole),
        bytes_ratio (their ratio), compress_ms, exchange_ms, decode_ms, hook_ms (the time inside
        the hook's calls, which the backward pass waits for), sparse_buckets, dense_buckets;
        "total" adds steps and skipped_steps. For example, with TensorBoard:

            s = state.summary()
            writer.add_scalar("sidco/density", s["step"]["density"], step)
            writer.add_scalar("sidco/bytes_vs_dense", s["total"]["bytes_ratio"], step)
        """
        step = _summed(self._stats.values())
        total = {key: self._totals.get(key, 0) + value for key, value in step.items()}
        total["steps"] = self._totals.get("steps", 0) + (1 if self._stats else 0)
        total["skipped_steps"] = self.skipped_steps
        return {"step": _with_ratios(step), "total": _with_ratios(total)}

    # ----- the hook's bookkeeping

    def _begin_step(self, index):
        """At a step's first hook call (bucket index): the previous step put back if it was
        skipped; the density agreed in its payloads adopted; this step's density. True at a
        step's first call: the first since a step's last bucket, or a bucket index no higher
        than the last call's (DDP hands the buckets over in order, so a step cut short by a
        raise in some hook body is over when the next one starts)."""
        if self._in_step and index > self._last_index:
            self._last_index = index
            return False
        self._last_index = index
        self._step_began = self._clock()
        # A step cut short (a hook body raised on every rank) may leave staged exchanges:
        # they finish alike on every rank, and are decoded, before this step's collectives start.
        self._advance_exchanges(drain=True)
        # Cut short by a wrapping hook, no finish() ran: the decodes left with the workers end
        # here (a no-op after a step that ended).
        self._callbacks.finish(failed=True)
        self._settle()
        if self._stats:  # the last step's statistics join the totals (summary())
            for key, value in _summed(self._stats.values()).items():
                self._totals[key] = self._totals.get(key, 0) + value
            self._totals["steps"] = self._totals.get("steps", 0) + 1
            self._stats = {}
        if self._next_verified is not None:
            self._verified, self._next_verified = self._next_verified, None
        self._in_flight = []  # the last step's collectives are done: DDP waited for them
        self._in_step = True
        self._step_failed = False
        self._step_iteration = self.iteration
        try:
            self._step_density, self._step_problem = self._density_at(self.iteration), None
        except (TypeError, ValueError) as e:  # sent as this rank's failure: every rank raises it
            self._step_density = self._verified if self._verified is not None else self._density
            self._step_problem = f"{type(e).__name__}: {e}"
        return True

    def _advance_exchanges(self, drain=False):
        """Every staged exchange a phase further (all of them to their end: drain=True, at the
        step's last hook call), in the order they were staged, the same on every rank. A phase
        whose collective failed raises here, and the exchanges left are given up (their
        futures carry that error): the process group cannot be trusted after it."""
        while self._staged:
            staged, self._staged = self._staged, []
            for i, exchange in enumerate(staged):
                try:
                    if not exchange.advance(drain):
                        self._staged.append(exchange)
                except BaseException as e:
                    for left in [*self._staged, *staged[i + 1:]]:
                        left.abandon(e)
                    self._staged = []
                    raise
            if not drain:
                return

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
        self._step_failed = True  # a step a raise cut short may be checkpointed (state_dict)
        return error

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
        exchange, wire = self._configuration(world, buffer.device.type)
        b = self._buckets.get(keys)
        if b is not None and b.dtype == buffer.dtype and b.device == buffer.device and len(b.inbox) == world \
                and b.exchange == exchange and b.wire == wire and b.density == self._step_density \
                and b.capacity_density == self._verified:
            return b, None
        # A reduce exchange's owner state carries over to a new codec of the same
        # parameters (a new density or dtype, or DDP's rebuild ordering them otherwise).
        previous = next((v for v in self._buckets.values() if v.exchange == "reduce" == exchange
                         and len(v.inbox) == world and set(v.keys) == set(keys)), None)
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        b = _Bucket(self, keys, sizes, buffer.dtype, buffer.device, world, dist.get_rank(group), exchange, wire)
        # Each parameter's state follows it: from the bucket that held it, or a loaded state.
        try:
            for i, key in enumerate(keys):
                owner = self._owner.get(key)
                if owner is not None:
                    self._import(b, i, _Layer(**self._export(*owner)))
                elif key in self._pending:
                    self._import(b, i, self._pending[key])
        except Exception as e:  # noqa: BLE001 - any of it is this rank's failure to report
            return b, f"{type(e).__name__}: {e}"
        problem = None
        saved = self._pending_exchanges.pop(b.exchange_key(), None) if exchange == "reduce" else None
        if previous is not None:
            saved = previous.codec.exchange_state()
        if saved is not None and exchange == "reduce":
            try:
                b.codec.load_exchange_state(saved)
            except Exception as e:  # noqa: BLE001 - raised on every rank this step; the next starts afresh
                problem = f"{type(e).__name__}: the saved reduce exchange state does not apply: {e}"
        for i, key in enumerate(keys):
            self._pending.pop(key, None)
            self._owner[key] = (b, i)
        replaced = self._buckets.get(keys)
        self._buckets[keys] = b
        self._warn_density(bucket.index(), sizes, b.density)
        owners = {id(owner[0]) for owner in self._owner.values()}
        dropped = [self._buckets.pop(k) for k, v in list(self._buckets.items()) if id(v) not in owners]
        for old in dropped + ([replaced] if replaced is not None else []):
            if old.exchange == "reduce" != exchange and self._auto is None:
                # exchange="auto"'s probe comes back to it: its owners' state waits as a loaded one.
                self._pending_exchanges[old.exchange_key()] = old.codec.exchange_state()
        return b, problem

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
        """Why this bucket goes dense, or None; from this step's density (the schedule's value:
        the agreed one may be a dense step's, never re-agreed while every step goes dense).
        Ranks whose densities differ choose differently: _agree_wire_format names them."""
        density = self._step_density
        if buffer.is_sparse:  # nn.Embedding(sparse=True): DDP gives such a parameter a bucket of its own
            return "a sparse gradient: all-reduced as DDP does (it holds only the rows the batch touched)"
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