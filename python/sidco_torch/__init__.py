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
or the installed site directory. SIDCO_TORCH_LIBRARY overrides where the library is.
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

from .ops import METHODS, Compressor, cpu_kernels, compress, decompress, methods, scatter_add_  # noqa: E402
from .arguments import ExchangeError  # noqa: E402
from .hook import State, hook, register  # noqa: E402
from .extension import extension_args, include_dir  # noqa: E402

__all__ = ["METHODS", "methods", "Compressor", "cpu_kernels", "compress", "decompress", "scatter_add_", "ExchangeError", "State",
           "hook", "register", "library_path", "extension_args", "include_dir"]
