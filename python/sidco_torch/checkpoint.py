"""Checkpoints of the hook's State: state_dict() and load_state_dict(), checked whole before
anything changes, so that a resumed run repeats an uninterrupted one bit for bit, and a
state that cannot apply is refused at load with a sentence, never carried into every step."""
import torch
import torch.distributed as dist

from .arguments import _COMPRESSED, _EXCHANGES, _STATE_FORMAT, _WIRES, _checked_density, _owner_name
from .codecs import _Layer, _exchange_key
from .ops import _codec


class _Checkpoints:
    """State's checkpoint methods (a mixin: State holds the data they read)."""

    def state_dict(self):
        """Everything a resumed run needs to repeat an uninterrupted one bit for bit: the
        iteration, and per parameter its residual and its compressor's state (adaptive
        stages, generators), keyed by parameter name (or DDP's order without register()).
        Between steps only: during one (from a wrapping hook, after some buckets' calls) it
        raises, since part of the step's state has changed and part has not."""
        if self._in_step and not self._step_failed:
            raise RuntimeError("sidco_torch.State.state_dict: called during a step (some buckets of this backward "
                               "pass were exchanged, others not yet): call it between steps, after backward() "
                               "returns")
        self._settle()
        layers = {key: {"size": layer.size, "dtype": layer.dtype, "residual": layer.residual,
                        "compressor": layer.compressor} for key, layer in self._pending.items()}
        for key, (bucket, i) in self._owner.items():
            layers[key] = self._export(bucket, i)
        # The reduce exchange's owner state, per set of parameters (DDP may order
        # a bucket's parameters otherwise after a reload; the exchange orders them by key).
        exchanges = dict(self._pending_exchanges)
        for keys, b in self._buckets.items():
            if b.exchange == "reduce":
                exchanges[_exchange_key(keys)] = b.codec.exchange_state()
        rank, world = self._rank_and_world()
        agreed = self._next_verified if self._next_verified is not None else self._verified
        return {"format": _STATE_FORMAT, "method": self.method, "density": self.density, "agreed_density": agreed,
                "capacity_slack": self.capacity_slack, "feedback": self.feedback, "options": dict(self.options),
                "iteration": self.iteration, "keys": self._keying or "order", "rank": rank, "world": world,
                "exchange": self.exchange, "owner": self.owner, "layers": layers, "exchanges": exchanges,
                "auto_exchange": self._probe_state()}

    def _probe_state(self):
        """exchange="auto"'s and wire="auto"'s probe, so that a resumed run alternates as the
        uninterrupted one would and keeps its choice (None: nothing measured yet)."""
        if self._auto is None and self._probe_start is None:
            return None
        return {"chosen": self._auto, "start": self._probe_start,
                "times": {e: list(t) for e, t in self._probe_times.items()}}

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
        # A damaged or hand-made state lacks a field: a sentence, not a KeyError from deep inside.
        for field in ("method", "capacity_slack", "feedback", "options", "keys", "iteration", "layers"):
            if field not in d:
                raise ValueError(f"sidco_torch.State.load_state_dict: the state has no {field!r}; pass what "
                                 "State.state_dict() returned")
        if not isinstance(d["layers"], dict) or not all(isinstance(key, str) for key in d["layers"]):
            raise ValueError("sidco_torch.State.load_state_dict: layers is not a dict of parameter keys (str) to "
                             f"their state: {d['layers']!r:.80}")
        # States saved before the exchange and owner options had their defaults.
        defaults = {"exchange": "auto", "owner": "sidco-e-exact"}
        # The density may differ (a schedule, set_density): residuals and adaptive state do not depend on it.
        for field in ("method", "capacity_slack", "feedback", "options", "exchange", "owner"):
            mine, theirs = getattr(self, field), d.get(field, defaults.get(field))
            if field == "owner" and theirs in ("sidco-e", "sidco-e-exact", "top-k"):
                theirs = _owner_name(theirs, warn=False)  # saved under the owner's first name
            if theirs != mine:
                raise ValueError(f"sidco_torch.State.load_state_dict: the state has {field} {theirs!r}, this "
                                 f"State {mine!r}; make the State as the state was made")
        if d["keys"] not in ("names", "order") or (self._keying is not None and d["keys"] != self._keying):
            raise ValueError(f"sidco_torch.State.load_state_dict: the state is keyed by parameter {d['keys']}, "
                             f"this State by {self._keying}: register both alike (sidco_torch.register names "
                             "them)")
        iteration = d["iteration"]
        if not (isinstance(iteration, int) and not isinstance(iteration, bool) and iteration >= 0):
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
                isinstance(k, str) and isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1
                for k, v in exchanges.items()):
            raise ValueError("sidco_torch.State.load_state_dict: exchanges is not a dict of parameter keys to uint8 "
                             "tensors")
        exchanges = {_exchange_key(key.split("|")): state for key, state in exchanges.items()}
        for key, state in exchanges.items():
            self._check_exchange_state(key, state, layers, world)
        probe = self._checked_probe(d.get("auto_exchange"))
        # Everything checked: apply.
        self._pending_exchanges = {k: v.clone() for k, v in exchanges.items()}
        self._load_probe(probe)
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

    def _checked_probe(self, probe):
        """A saved auto_exchange entry, refused with a sentence when damaged; one saved before
        wire="auto" (its times keyed by exchange alone, its choice without a wire) read as
        timed with the wire it ran: this State's, plain for "auto" (then the default)."""
        if probe is None:
            return None
        where = "sidco_torch.State.load_state_dict: auto_exchange"
        if not isinstance(probe, dict) or set(probe) != {"chosen", "start", "times"}:
            raise ValueError(f"{where} is not a probe's state: {probe!r}")
        chosen, start, times = probe["chosen"], probe["start"], probe["times"]
        ran = "plain" if self.wire == "auto" else self.wire
        exchanges = tuple(e for e in _EXCHANGES if e != "auto")
        wires = tuple(w for w in _WIRES if w != "auto")
        if isinstance(times, dict) and set(times) == {"allgather", "reduce"}:
            times = {f"{e}/{ran}": t for e, t in times.items() if t}
        if isinstance(chosen, dict) and "wire" not in chosen:
            chosen = dict(chosen, wire=ran)
        if chosen is not None and not (isinstance(chosen, dict) and chosen.get("chosen") in exchanges
                                       and chosen.get("wire") in wires
                                       and isinstance(chosen.get("ranks"), int) and chosen["ranks"] >= 2):
            raise ValueError(f"{where}: chosen {chosen!r}")
        if start is not None and not (isinstance(start, int) and start >= 0):
            raise ValueError(f"{where}: start {start!r}")
        pairs = {f"{e}/{w}" for e in exchanges for w in wires}
        if not (isinstance(times, dict) and set(times) <= pairs and all(
                isinstance(t, list) and all(isinstance(v, float) and v >= 0 for v in t) for t in times.values())):
            raise ValueError(f"{where}: times {times!r}")
        return {"chosen": chosen, "start": start, "times": times}

    def _load_probe(self, probe):
        self._reset_probe()
        if probe is None:
            return
        chosen = probe["chosen"]
        if chosen is not None:
            self._auto = dict(chosen)
        self._probe_start = probe["start"]
        self._probe_times = {e: list(t) for e, t in probe["times"].items()}

    def _check_exchange_state(self, key, state, layers, world):
        """A saved reduce exchange state that could never apply is refused here: saved among
        another number of ranks, over another number of values, or by another owner."""
        where = f"sidco_torch.State.load_state_dict: the reduce exchange state of parameters {key.replace('|', ', ')}"
        try:
            _, ranks, size, owner = torch.ops.sidco.exchange_state_info(state.contiguous())
        except (RuntimeError, ValueError) as e:  # a damaged state raises ValueError (std::invalid_argument)
            raise ValueError(f"{where} is damaged: {e}") from e
        if world is not None and ranks != world:
            raise ValueError(f"{where} was saved among {ranks} ranks; this process group has {world}. The reduce "
                             "exchange's owner state is its ranks': resume among as many ranks, or drop "
                             "state_dict['exchanges'] (the owners then start afresh)")
        names = key.split("|")
        if all(name in layers for name in names):
            values = sum(layers[name].size for name in names)
            if values != size:
                raise ValueError(f"{where} covers {size} values; those parameters hold {values}")
        if owner and owner != self.owner:
            raise ValueError(f"{where} was saved by owner {owner!r}; this State's owner is {self.owner!r}")

    def _checked_layer(self, key, entry):
        where = f"sidco_torch.State.load_state_dict: layer {key}"
        fields = ("size", "dtype", "residual", "compressor")
        if not isinstance(entry, dict) or not all(field in entry for field in fields):
            has = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ValueError(f"{where} is not a dict with {', '.join(fields)} (it has {has})")
        size, dtype, residual, compressor = (entry[field] for field in fields)
        if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
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
                               nonfinite=self.nonfinite, wire=self.wire, reduce_schedule=self.reduce_schedule,
                               reduce_steps_factor=self.reduce_steps_factor, dense_parameters=self.dense_parameters, **self.options),
                "state": self.state_dict()}

    def __setstate__(self, pickled):
        self.__init__(**pickled["config"])
        self.load_state_dict(pickled["state"])  # names come back with attach() or register()