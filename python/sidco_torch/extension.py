"""sidco's C++ headers in an extension of one's own, built by torch.utils.cpp_extension:

    from torch.utils import cpp_extension
    import sidco_torch
    cpp_extension.load(name="my_ops", sources=["my_ops.cpp"], is_python_module=False,
                       **sidco_torch.extension_args())

compiles my_ops.cpp against the headers this package's ops were built from, with their flags
(C++20, OpenMP, Highway's SIMD kernels chosen at run time, and this build's source digest, so
that a method it adds is refused by a sidco_torch built from other sources), and links it with
the ops library, so that a compressor composed there from sidco's policies gives the same bits
as the package's op of the same preset, and can be added as a method the hook takes
(sidco_torch/csrc/added_methods.hpp).
"""
import importlib
import os

from . import library_path as _library_path

_HERE = os.path.dirname(os.path.abspath(__file__))


def _build_config():
    """build_config.py, which meson writes beside the package, or None (absent when the package
    is imported from the source tree itself, as the GPU check does with ops it built apart)."""
    try:
        return importlib.import_module(".build_config", __package__)
    except ImportError:
        return None


def _source_digest():
    """The digest of the sources this package and its ops were built from (source_digest.py,
    which meson writes with scripts/source_digest.py), or "" where it is absent (the package
    imported from the source tree itself, as the GPU check does) or unreadable. Never raises:
    the agreement shows "unknown" in its gather and every rank raises alike, where an exception
    here would leave the others waiting in it."""
    try:
        digest = str(importlib.import_module(".source_digest", __package__).DIGEST)
    except Exception:  # noqa: BLE001 (any failure is told to every rank through the gather)
        return ""
    return digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else ""


def _config():
    """build_config.py, or an error saying why the flags are not known."""
    config = _build_config()
    if config is None:
        raise RuntimeError(f"sidco_torch: no build_config.py in {_HERE}: this copy of the package was not built by "
                           "meson (meson compile, or pip), so the flags its ops were built with are not known")
    return config


def _source(key):
    """A source-tree directory build_config.py recorded ("" when installed or not built)."""
    config = _build_config()
    return getattr(config, key) if config is not None else ""


def include_dir():
    """The directory holding sidco/sidco.hpp: installed in the package, or the source tree's
    include/ in a development build (or beside python/ when imported from the tree itself)."""
    candidates = (os.path.join(_HERE, "include"), _source("SOURCE_INCLUDE"),
                  os.path.join(_HERE, os.pardir, os.pardir, "include"))
    for candidate in candidates:
        if candidate and os.path.isfile(os.path.join(candidate, "sidco", "sidco.hpp")):
            return os.path.normpath(candidate)
    raise FileNotFoundError(f"sidco_torch: sidco's headers are in none of {', '.join(c for c in candidates if c)}")


def _include_paths():
    """include_dir(), and where sidco_torch/csrc/added_methods.hpp is when that is elsewhere."""
    paths = [include_dir()]
    for candidate in (paths[0], _source("SOURCE_PYTHON"), os.path.join(_HERE, os.pardir)):
        if candidate and os.path.isfile(os.path.join(candidate, "sidco_torch", "csrc", "added_methods.hpp")):
            candidate = os.path.normpath(candidate)
            return paths if candidate == paths[0] else paths + [candidate]
    raise FileNotFoundError(f"sidco_torch: sidco_torch/csrc/added_methods.hpp is neither in {paths[0]} nor in the "
                            "source tree")


def extension_args(highway=None):
    """Keyword arguments for torch.utils.cpp_extension.load and load_inline: the include
    directories, the compile flags and the link flags (the ops library, found at run time where
    it is now). highway: None (as this package was built), True, or False (the portable loops,
    with no libhwy to link; not the package's bits). The flags define SIDCO_TORCH_SOURCE_DIGEST
    as 0x and this build's source digest (where it has one): a method the extension adds
    carries it, and ops built from other sources, which the extension's compressor was not
    compiled to run with, refuse the method as it is added."""
    if highway is not None and not isinstance(highway, bool):
        raise TypeError(f"extension_args: highway = {highway!r} is not None, True or False")
    config = _config()
    if highway and not config.HIGHWAY:
        raise ValueError("extension_args: highway = True, but this sidco_torch was built without Highway "
                         "(its build found no libhwy-dev)")
    use_highway = config.HIGHWAY if highway is None else highway
    digest = _source_digest()
    library = os.path.realpath(_library_path)
    directory, name = os.path.split(library)
    return {
        "extra_include_paths": _include_paths(),
        "extra_cflags": list(config.CXX_FLAGS) + (list(config.HIGHWAY_CFLAGS) if use_highway else [])
        + ([f"-DSIDCO_TORCH_SOURCE_DIGEST=0x{digest}"] if digest else []),
        "extra_ldflags": list(config.LD_FLAGS) + (list(config.HIGHWAY_LIBS) if use_highway else [])
        + [f"-L{directory}", f"-l:{name}", f"-Wl,-rpath,{directory}"],
    }
