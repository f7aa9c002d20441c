"""sidco for PyTorch: gradient sparsification as custom ops and a DDP communication hook.

    import sidco_torch
    state = sidco_torch.State(method="sidco-e", density=0.01)
    sidco_torch.register(ddp_model, state)   # = register_comm_hook(state, sidco_torch.hook), keyed by name
    ...
    print(state.stats())                     # the last step's statistics, per bucket
    torch.save({"sidco": state.state_dict(), ...}, path)   # and state.load_state_dict(...) to resume

    cpp_extension.load(name=..., sources=[...], **sidco_torch.extension_args())   # sidco's headers in your own op

Importable with PYTHONPATH pointing at the directory that holds this package next to the
built ops library (libsidco_torch_ops.so): `build/python` after `meson compile -C build`,
or the installed site directory. SIDCO_TORCH_LIBRARY overrides where the library is (one
built from the same sources: import refuses a library built from others).
"""
import os as _os

import torch as _torch


def _load():
    here = _os.path.dirname(_os.path.abspath(__file__))
    candidates = [_os.environ.get("SIDCO_TORCH_LIBRARY", ""), _os.path.join(here, "libsidco_torch_ops.so")]
    for path in candidates:
        if path and _os.path.exists(path):
            _torch.ops.load_library(path)
            return path
    raise ImportError("sidco_torch: the ops library libsidco_torch_ops.so is not next to this package "
                      f"({here}); build it (meson compile -C build) and put build/python on PYTHONPATH, "
                      "or set SIDCO_TORCH_LIBRARY")


library_path = _load()


def _check_library_sources():
    """Refuses an ops library built from other sources than these Python files (a library from
    another build through SIDCO_TORCH_LIBRARY, an install that mixed two versions): the Python
    side would call ops whose schemas and behaviour it was not written for. Nothing to compare
    where this package has no digest (imported from the source tree)."""
    from .extension import _source_digest
    package = _source_digest()
    if not package:
        return
    try:
        library = str(_torch.ops.sidco.source_digest())
        named = f"source digest {library[:17]}..."
    except (AttributeError, RuntimeError):  # a library older than the op
        library, named = "", "no source digest: an older build"
    if library != "0x" + package:
        raise ImportError(f"sidco_torch: the ops library {library_path} was built from other sources ({named}) than "
                          f"this package's Python files (0x{package[:15]}...): rebuild or reinstall sidco_torch, or "
                          "point SIDCO_TORCH_LIBRARY at the library built with these files")


_check_library_sources()

from .ops import METHODS, Compressor, cpu_kernels, compress, decompress, methods, scatter_add_  # noqa: E402
from .arguments import ExchangeError  # noqa: E402
from .hook import State, hook, register  # noqa: E402
from .extension import extension_args, include_dir  # noqa: E402

__all__ = ["METHODS", "methods", "Compressor", "cpu_kernels", "compress", "decompress", "scatter_add_", "ExchangeError", "State",
           "hook", "register", "library_path", "extension_args", "include_dir"]
