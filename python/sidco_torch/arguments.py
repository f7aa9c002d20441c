"""What sidco_torch's entry points take and raise: argument checks that name the argument and
its value, the names of the State's choices, and the one error every rank raises alike."""
import math
import numbers
import struct
import warnings

import torch

_STATE_FORMAT = 2  # 2: rank and world size added (format 1 states load without that check)
_COMPRESSED = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_EXCHANGES = ("auto", "allgather", "reduce")
_NONFINITE = ("raise", "skip")
_WIRES = ("plain", "compact", "auto", "compact8")
_REDUCE_SCHEDULES = ("auto", "flat", "two-hop")
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


def _whole_number(value, what, where="sidco_torch.State"):
    """A Python, numpy or 0-d integer tensor's value, at least 0, as an int (a count or an
    iteration read from a config often arrives as numpy.int64)."""
    value = _integer(value, what, where)
    if value < 0:
        raise ValueError(f"{where}: {what} = {value} is negative")
    return value


def _numpy(value):
    """Whether value is a numpy array or scalar (numpy itself not imported for it)."""
    return type(value).__module__ == "numpy"


def _integral(tensor):
    """Whether a tensor holds integers (not floats, complex numbers or bools)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _integer(value, what, where):
    """A Python, numpy or 0-d integer tensor's value as an int; anything else (a float, a bool)
    a TypeError naming it."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or not _integral(value):
            raise TypeError(f"{where}: {what} must be an integer, got a tensor of shape {tuple(value.shape)} and "
                            f"dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {what} must be an integer, got {type(value).__name__} {value!r}")
    return int(value)


def _flag(value, what, where="sidco_torch.State"):
    """True or False, from a Python or numpy bool or a one-value bool tensor; anything else (1,
    "no") a TypeError naming it."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item())
    if isinstance(value, bool) or (_numpy(value) and type(value).__name__ == "bool_"):
        return bool(value)
    raise TypeError(f"{where}: {what} must be True or False, got {type(value).__name__} {value!r}")


def _tensor(value, what, where):
    """value, when it is a torch.Tensor; otherwise a TypeError naming it (before TorchScript's
    "Expected a value of type 'Tensor'")."""
    if isinstance(value, torch.Tensor):
        return value
    hint = "; torch.from_numpy(array) wraps a numpy array without a copy" if _numpy(value) else ""
    raise TypeError(f"{where}: {what} must be a torch.Tensor, got {type(value).__name__}{hint}")


def _integers(values, what, where):
    """A list, tuple, 1-d integer tensor or numpy array of integers as a list of int (their
    range is the caller's to check); anything else a TypeError naming it."""
    if isinstance(values, torch.Tensor) or _numpy(values):
        dtype, shape = values.dtype, tuple(values.shape)
        integral = _integral(values) if isinstance(values, torch.Tensor) else getattr(dtype, "kind", "") in "iu"
        if len(shape) != 1 or not integral:
            raise TypeError(f"{where}: {what} must be integers, got {type(values).__name__} of shape {shape} and "
                            f"dtype {dtype}")
        return values.tolist()  # Python ints
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{where}: {what} must be a sequence of integers, got {type(values).__name__} {values!r}")
    return [_integer(v, f"{what}[{i}]", where) for i, v in enumerate(values)]


def _real_scalar(value, what, where="sidco_torch.State"):
    """A Python, numpy or 0-d tensor real as a float; a 16- or 32-bit float as the shortest
    decimal that names it (numpy.float32(0.01) is 0.01, not 0.009999999776)."""
    narrow = None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{where}: {what} must be a real scalar, got a tensor of shape "
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
        raise TypeError(f"{where}: {what} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    return _shortest(value, narrow) if narrow is not None and math.isfinite(value) else value


class ExchangeError(RuntimeError):
    """Raised alike on every rank when the ranks disagree (configuration, buckets, density) or
    one of them failed (its error is in the message). DDP's backward() re-raises what a hook
    raises as a RuntimeError whose message begins with "ExchangeError: " (torch passes no
    exception type through its reducer); the object itself is state.error."""


def _checked_density(value, what, where="sidco_torch.State"):
    value = _real_scalar(value, what, where)
    if not 0 < value <= 1:
        raise ValueError(f"{where}: {what} = {value!r} is outside (0, 1]")
    return value


def _bits(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _float_of_bits(bits):
    """The float _bits(x) was made from."""
    return struct.unpack("<d", struct.pack("<q", bits))[0]

# Owners by the method registry's names; the hook's first spelling still works, with a warning.
_OWNERS = ("sidco-e-exact", "top-k")
_OWNER_ALIASES = {"sidco-e": "sidco-e-exact"}


def _owner_name(owner, where="sidco_torch.State", warn=True):
    """owner as the registry names it ("sidco-e" is "sidco-e-exact", deprecated)."""
    if owner in _OWNER_ALIASES:
        if warn:
            warnings.warn(f"{where}: owner {owner!r} is now called {_OWNER_ALIASES[owner]!r} (the method registry's "
                          "name); the old name will be removed", DeprecationWarning, stacklevel=3)
        return _OWNER_ALIASES[owner]
    if owner not in _OWNERS:
        raise ValueError(f"{where}: owner = {owner!r} is not one of {', '.join(map(repr, _OWNERS))}")
    return owner

