"""Python names over the custom ops (torch.ops.sidco.*) and classes (torch.classes.sidco.*)."""
import difflib

import torch

from .arguments import _checked_density, _integer, _integers, _real_scalar, _tensor, _whole_number

#: Every built-in method, name -> one-line description, from the C++ method table (sidco/methods.hpp).
METHODS = dict(torch.ops.sidco.methods())


def methods():
    """Every method the ops take now, name -> description: METHODS, then those extensions
    added (sidco_torch/csrc/added_methods.hpp; docs/PYTORCH.md, "An extension of one's own")."""
    return {**METHODS, **dict(torch.ops.sidco.methods(True))}


def cpu_kernels():
    """The CPU kernels the ops run: the Highway target chosen for this CPU at load time
    (e.g. "Highway AVX2"), or "portable"."""
    return torch.ops.sidco.cpu_kernels()

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _method_origin(method):
    """(composition, built against) of a method an extension added: its compressor's type, and
    the source digest of the sidco_torch it was compiled against ("" when its flags did not say:
    not built with extension_args()); ("", "") for a built-in method or an unknown name."""
    composition, flag = torch.ops.sidco.method_origin(method)
    return composition, flag[2:] if flag.startswith("0x") else flag


def _check_method(method, where):
    """A method name from methods(); argument errors raised here, before TorchScript sees them.
    A method from an extension compiled against other sidco_torch sources is not among them: the
    ops refused it as it was added (and the package, at import, ops built from other sources)."""
    known = methods()
    if not isinstance(method, str):
        raise TypeError(f"{where}: method must be a str, one of {', '.join(known)}; got "
                        f"{type(method).__name__} {method!r}")
    if method not in known:
        raise ValueError(f"{where}: method {method!r} is not one of {', '.join(known)}")
    return method


def _options_dict(options, where="sidco_torch", arguments=()):
    """The compressor options as the ops take them (name -> double): seed, a whole number the
    double holds exactly (below 2^53), is the only one. arguments: the caller's own argument
    names, suggested for a misspelt option (State(dnsity=0.1): did you mean density?)."""
    parsed = {}
    for name, value in options.items():
        if name != "seed":
            close = difflib.get_close_matches(name, ["seed", *arguments], n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: option {name!r} is not known (known: seed){hint}")
        seed = _integer(value, "seed", where)
        if not 0 <= seed < 2**53:
            raise ValueError(f"{where}: seed = {seed} is outside [0, 2^53) (the ops carry it exactly only there)")
        parsed[name] = float(seed)
    return parsed


def _codec(method, options, layer_sizes, dtype, density, slack, capacity_density=None, wire="plain"):
    """A bucket's codec: its compressor per layer, capacity (planned for capacity_density,
    density by default) and payload format (wire: "plain", "compact" or "compact8")."""
    if dtype not in _DTYPES:
        raise TypeError(f"sidco_torch: dtype {dtype} is not one of {', '.join(map(str, _DTYPES))}")
    return torch.classes.sidco.Codec(method, _options_dict(options), [int(n) for n in layer_sizes], _DTYPES[dtype],
                                     float(density), float(slack),
                                     float(density if capacity_density is None else capacity_density), str(wire))


def _reduce_codec(method, options, layer_sizes, dtype, density, slack, ranks, rank, owner, capacity_density=None,
                  device="cpu", order=None, wire="plain"):
    """A bucket's side of the reduce-scatter exchange on its device (capacity as _codec's);
    order: the exchange's order of the layers (order[c] is the layer at position c; None: the
    bucket's); wire: "plain", "compact" (values rounded to half their width and sent
    narrowed in both rounds' frames) or "compact8" (rounded to 8-bit codes, a byte each)."""
    if dtype not in _DTYPES:
        raise TypeError(f"sidco_torch: dtype {dtype} is not one of {', '.join(map(str, _DTYPES))}")
    return torch.classes.sidco.ReduceCodec(method, _options_dict(options), [int(n) for n in layer_sizes],
                                           [int(i) for i in order or []], _DTYPES[dtype], float(density), float(slack),
                                           int(ranks), int(rank), owner,
                                           float(density if capacity_density is None else capacity_density),
                                           str(torch.device(device)), str(wire))


class Compressor:
    """One tensor's compressor (its adaptive state and per-layer layout persist across
    calls, and follow the tensor to another device). method: one of sidco_torch.methods();
    options: seed (random-k). state_dict() / load_state_dict() save and restore the state;
    pickle and copy.deepcopy carry it too."""

    _STATE_FORMAT = 1

    def __init__(self, method="sidco-e", **options):
        _check_method(method, "sidco_torch.Compressor")
        self._options = _options_dict(options, "sidco_torch.Compressor")
        self._given = {name: int(value) for name, value in self._options.items()}  # as the caller wrote them
        self._impl = torch.classes.sidco.Compressor(method, self._options)
        self.method = method

    def compress(self, gradient, density, layer_sizes=None, residual=None):
        """(indices int64, values) of gradient (+ residual, which keeps what is not sent) at
        density; estimated per layer when layer_sizes is given."""
        where = "sidco_torch.compress"
        gradient = _tensor(gradient, "gradient", where)
        residual = None if residual is None else _tensor(residual, "residual", where)
        sizes = [] if layer_sizes is None else _integers(layer_sizes, "layer_sizes", where)
        return torch.ops.sidco.compress(gradient, _checked_density(density, "density", where), sizes, residual,
                                        self._impl)

    def report(self):
        """What the last compress did: threshold, selected, density, stages, ..."""
        return dict(self._impl.report())

    def state_dict(self):
        """The adaptive state, for torch.save: per element type compressed so far, the
        whole-tensor engine and the last per-layer one (its layer sizes and each layer's bytes).
        A Compressor of the same method and options continues from it bit for bit; the
        residual is the caller's and is not in it."""
        engines = [{"dtype": dtype, "layer_sizes": list(sizes), "layers": list(layers)}
                   for dtype, sizes, layers in self._impl.state()]
        return {"format": self._STATE_FORMAT, "method": self.method,
                "options": dict(self._given), "engines": engines}

    def load_state_dict(self, state):
        """Restores what state_dict() saved: all of it, or a ValueError naming what is wrong
        having changed nothing."""
        where = "sidco_torch.Compressor.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: state must be the dict state_dict() returns, got {type(state).__name__}")
        for field in ("format", "method", "options", "engines"):
            if field not in state:
                raise ValueError(f"{where}: the state has no {field!r} (not one state_dict() returned?)")
        if state["format"] != self._STATE_FORMAT:
            raise ValueError(f"{where}: format {state['format']!r} is not {self._STATE_FORMAT}, the one this "
                             "sidco_torch reads")
        if state["method"] != self.method:
            raise ValueError(f"{where}: the state is of method {state['method']!r}, this Compressor's is "
                             f"{self.method!r}")
        options = _options_dict(state["options"], where) if isinstance(state["options"], dict) else None
        if options != self._options:
            raise ValueError(f"{where}: the state's options {state['options']!r} are not this Compressor's "
                             f"{self._given!r}")
        if not isinstance(state["engines"], (list, tuple)):
            raise ValueError(f"{where}: engines must be a list, got {type(state['engines']).__name__}")
        engines = []
        for i, engine in enumerate(state["engines"]):
            if not isinstance(engine, dict) or not {"dtype", "layer_sizes", "layers"} <= engine.keys():
                raise ValueError(f"{where}: engines[{i}] is not a dict of dtype, layer_sizes and layers")
            if not isinstance(engine["dtype"], str):
                raise ValueError(f"{where}: engines[{i}]['dtype'] must be a str, got {engine['dtype']!r}")
            layers = engine["layers"]
            if not isinstance(layers, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in layers):
                raise ValueError(f"{where}: engines[{i}]['layers'] must be a list of uint8 tensors")
            engines.append((engine["dtype"], _integers(engine["layer_sizes"], f"engines[{i}]['layer_sizes']", where),
                            list(layers)))
        try:
            self._impl.load_state(engines)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"{where}: {str(e).removeprefix('sidco: ')}") from None

    def __reduce_ex__(self, protocol):
        # The C++ object has no pickled form of its own: a copy is a new Compressor given this
        # one's state.
        return _restored_compressor, (self.method, dict(self._given), self.state_dict())


def _restored_compressor(method, options, state):
    compressor = Compressor(method, **options)
    compressor.load_state_dict(state)
    return compressor


def compress(gradient, density, method="sidco-e", layer_sizes=None, residual=None, **options):
    """One-shot compress with a fresh compressor (no adaptive state kept)."""
    return Compressor(method, **options).compress(gradient, density, layer_sizes, residual)


def decompress(indices, values, size):
    where = "sidco_torch.decompress"
    return torch.ops.sidco.decompress(_tensor(indices, "indices", where), _tensor(values, "values", where),
                                      _whole_number(size, "size", where))


def scatter_add_(dense, indices, values, scale=1.0):
    where = "sidco_torch.scatter_add_"
    return torch.ops.sidco.scatter_add_(_tensor(dense, "dense", where), _tensor(indices, "indices", where),
                                        _tensor(values, "values", where), _real_scalar(scale, "scale", where))
