"""sidco's C++ headers in an extension of one's own, built by torch.utils.cpp_extension:

    from torch.utils import cpp_extension
    import sidco_torch
    cpp_extension.load(name="my_ops", sources=["my_ops.cpp"], is_python_module=False,
                       **sidco_torch.extension_args())

compiles my_ops.cpp against the headers this package's ops were built from, with their flags
(C++20, OpenMP, Highway's SIMD kernels chosen at run time), so that a compressor composed there
from sidco's policies gives the same bits as the package's own op of the same preset.
"""
import os

from . import build_config as _config


def include_dir():
    """The directory holding sidco/sidco.hpp: installed in the package, or the source tree's
    include/ in a development build."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "include"), _config.SOURCE_INCLUDE):
        if candidate and os.path.isfile(os.path.join(candidate, "sidco", "sidco.hpp")):
            return candidate
    raise FileNotFoundError(f"sidco_torch: sidco's headers are neither in {os.path.join(here, 'include')} nor in "
                            f"the source tree it was built from ({_config.SOURCE_INCLUDE or 'none recorded'})")


def extension_args(highway=None):
    """Keyword arguments for torch.utils.cpp_extension.load and load_inline: the include
    directory and the compile and link flags. highway: None (as this package was built), True
    or False (the portable loops, with no libhwy to link; not the package's bits)."""
    if highway is not None and not isinstance(highway, bool):
        raise TypeError(f"extension_args: highway = {highway!r} is not None, True or False")
    if highway and not _config.HIGHWAY:
        raise ValueError("extension_args: highway = True, but this sidco_torch was built without Highway "
                         "(its build found no libhwy-dev)")
    use_highway = _config.HIGHWAY if highway is None else highway
    return {
        "extra_include_paths": [include_dir()],
        "extra_cflags": list(_config.CXX_FLAGS) + (list(_config.HIGHWAY_CFLAGS) if use_highway else []),
        "extra_ldflags": list(_config.LD_FLAGS) + (list(_config.HIGHWAY_LIBS) if use_highway else []),
    }
