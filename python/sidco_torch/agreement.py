"""What every rank must agree on before a collective's sizes depend on it: the State's
configuration (once), and each bucket's wire format (whenever it changes). A difference is
the same ExchangeError on every rank, raised before the collective it would have broken."""
import pickle
import warnings
import zlib

import torch
import torch.distributed as dist

from .extension import _source_digest
from .ops import _method_origin, methods
from .arguments import (_DTYPE_CODES, _DTYPE_NAMES, _EXCHANGES, _NONFINITE, _PATHS, _REDUCE_SCHEDULES, _STATE_FORMAT, _WIRES, ExchangeError,
                        _bits, _float_of_bits)


def _digest_field(digest):
    """A digest's first 60 bits, as an int64 field of the agreement (-1: none)."""
    return int(digest[:15], 16) if digest else -1


def _digest_shown(field):
    return f"{field:015x}" if field >= 0 else "unknown (no source_digest.py)"


# The first gather of every agreement, two int64 (this tag and the digest), kept as it is in
# every later version: gloo aborts a process whose all_gather lengths differ from a peer's,
# so builds are told apart before the gather whose length depends on the build.
_FIRST_GATHER_TAG = 0x5349444330  # "SIDC0"


class _Agreement:
    """State's agreement methods (a mixin: State holds the data they read)."""

    def _agree_configuration(self, group, world, device):
        """Every rank's configuration, compared once (the first hook call of this State in this
        process): a difference would make the payloads' sizes differ."""
        verified = self._verified if self._verified is not None else self._step_density
        # A method an extension added is known here by its name, its description and its
        # compressor's type (the extension's own code is not compared; the ops refused it as it
        # was added unless it was compiled against these sources or without the digest flag).
        description = methods().get(self.method, "")
        composition = _method_origin(self.method)[0]
        self._agree_sources(group, world, device)
        fields = [("format", _STATE_FORMAT), ("method", zlib.crc32(self.method.encode())),
                  ("method's composition", zlib.crc32(composition.encode())),
                  ("method's description", zlib.crc32(description.encode())),
                  ("density", _bits(self._step_density)), ("agreed density", _bits(verified)),
                  ("capacity_slack", _bits(self.capacity_slack)),
                  ("feedback", int(self.feedback)), ("start_iter", self.start_iter),
                  ("min_bucket_elements", self.min_bucket_elements),
                  ("options", zlib.crc32(repr(sorted(self.options.items())).encode())),
                  ("exchange", _EXCHANGES.index(self.exchange)), ("owner", int(self.owner == "top-k")),
                  ("nonfinite", _NONFINITE.index(self.nonfinite)), ("wire", _WIRES.index(self.wire)),
                  ("reduce_schedule", _REDUCE_SCHEDULES.index(self.reduce_schedule)),
                  # auto's factor: ranks with different ones could choose different exchanges.
                  ("reduce_steps_factor", _bits(self.reduce_steps_factor or 0.0)),
                  ("iteration", self.iteration), ("ranks", world),
                  # exchange="auto"'s choice and probe, as loaded: the ranks must alternate alike.
                  ("auto exchange", _EXCHANGES.index(self._auto["chosen"]) if self._auto is not None else 0),
                  ("auto wire", _WIRES.index(self._auto["wire"]) if self._auto is not None else -1),
                  ("auto probe start", -1 if self._probe_start is None else self._probe_start)]
        rank = dist.get_rank(group)
        loaded = self._loaded_from
        # Whether this rank loaded a state another rank (or another world) saved: -1 if not.
        fields.append(("loaded", -1 if loaded is None or loaded == (rank, world) else loaded[0] * 65536 + loaded[1]))
        # On the buckets' device: NCCL gathers CUDA tensors only.
        mine = torch.tensor([v for _, v in fields], dtype=torch.int64, device=device)
        everyone = [t.cpu() for t in self._kept_all_gather(mine, group, world)]
        shown = {"density": _float_of_bits, "agreed density": _float_of_bits, "capacity_slack": _float_of_bits,
                 "reduce_steps_factor": lambda bits: _float_of_bits(bits) or None,
                 "auto exchange": lambda index: _EXCHANGES[index] if index else "not chosen yet",
                 "auto wire": lambda index: _WIRES[index] if index >= 0 else "not chosen yet",
                 "auto probe start": lambda start: start if start >= 0 else "not started"}
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
                    if name in ("method", "method's composition", "method's description", "options", "exchange",
                                "owner", "nonfinite", "wire", "reduce_schedule"):
                        # Hashes and indices on the wire: the values themselves, from every rank
                        # (each one found this same difference, so each joins this gather).
                        readable = self._gather_objects({
                            "method": self.method, "method's composition": composition,
                            "method's description": description,
                            "options": dict(sorted(self.options.items())), "exchange": self.exchange,
                            "owner": self.owner, "nonfinite": self.nonfinite, "wire": self.wire,
                            "reduce_schedule": self.reduce_schedule}, group, world, device)
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

    def _agree_sources(self, group, world, device):
        """Every rank's source digest, in the first gather (_FIRST_GATHER_TAG): other code
        explains whatever else differs, and only the same code gathers the same fields."""
        mine = torch.tensor([_FIRST_GATHER_TAG, _digest_field(_source_digest())], dtype=torch.int64, device=device)
        everyone = self._kept_all_gather(mine, group, world)
        tags, digests = zip(*((int(t[0]), int(t[1])) for t in (t.cpu() for t in everyone)))
        for rank in range(world):
            if tags[rank] != _FIRST_GATHER_TAG or digests[rank] != digests[0]:
                theirs = _digest_shown(digests[rank]) if tags[rank] == _FIRST_GATHER_TAG else "unknown (another agreement)"
                raise self._fail(ExchangeError(
                    f"sidco_torch.State: rank {rank} runs sidco_torch built from other sources than rank 0 "
                    f"(source digest {theirs}, rank 0 {_digest_shown(digests[0])}): every rank must run the same "
                    "build of sidco_torch (sidco_torch.source_digest.DIGEST names it)"))

    def _kept_all_gather(self, mine, group, world):
        """Every rank's mine (one shape on every rank), gathered and waited for; mine and the
        gathered tensors stay in _in_flight (see State._in_flight: no gloo worker frees them)."""
        everyone = [torch.empty_like(mine) for _ in range(world)]
        self._in_flight.extend([mine, *everyone])
        dist.all_gather(everyone, mine, group=group)
        return everyone

    def _gather_objects(self, value, group, world, device):
        """Every rank's value (picklable), as dist.all_gather_object gives them, but through
        tensors kept in _in_flight: all_gather_object frees its own as it returns, which can
        leave a gloo worker the last reference (see State._in_flight; seen: a rank hung in the
        DDP reducer's destructor right after this error was raised)."""
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
        lengths = [int(s) for s in self._kept_all_gather(size, group, world)]
        padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
        padded[:data.numel()] = data.to(device)
        everyone = self._kept_all_gather(padded, group, world)
        return [pickle.loads(t[:n].cpu().numpy().tobytes()) for t, n in zip(everyone, lengths)]

    def _agree_wire_format(self, group, world, bucket, path, payload_bytes, dense_values=0):
        """What this bucket puts on the wire (path, dtype, values, bytes), compared across ranks
        whenever it changes (the first steps, DDP's bucket rebuild, the switch at start_iter),
        before the collective whose sizes it decides: gloo aborts the process on a size
        mismatch, so a rank whose bucket differs (another dtype under fp16_compress_wrapper,
        another layout) must be refused before it."""
        buffer = bucket.buffer()
        mine = (bucket.index(), _PATHS.index(path), _DTYPE_CODES.get(buffer.dtype, 0), buffer.numel(), payload_bytes,
                dense_values)
        if self._signatures.get(bucket.index()) == mine:
            return
        signature = torch.tensor(mine, dtype=torch.int64, device=buffer.device)
        everyone = [tuple(int(v) for v in t.cpu()) for t in self._kept_all_gather(signature, group, world)]
        first = everyone[0]
        for rank, theirs in enumerate(everyone):
            if theirs == first:
                continue
            index, path0, dtype0, numel0, bytes0, dense0 = first
            _, path1, dtype1, numel1, bytes1, dense1 = theirs
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
            elif dense1 != dense0:
                what = (f"all-reduces {dense1} values of bucket {index} densely (dense_parameters), rank 0 {dense0}; "
                        "give every rank the same dense_parameters")
            else:
                what = f"sends bucket {index} in {bytes1}-byte payloads, rank 0 in {bytes0} (another layout)"
            raise self._fail(ExchangeError(f"sidco_torch.State: rank {rank} {what}; every rank must hand the hook "
                                           "the same buckets"))
        self._signatures[bucket.index()] = mine