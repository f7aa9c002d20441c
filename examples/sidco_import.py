"""sidco_torch for the example scripts, or one sentence saying how to make it importable
(instead of a ModuleNotFoundError traceback)."""
import os
import sys


def import_sidco_torch(script):
    """The sidco_torch module; exits naming `script` when it is not importable."""
    try:
        import sidco_torch
    except ModuleNotFoundError as missing:
        if missing.name != "sidco_torch":
            raise
        sys.exit(f"{os.path.basename(script)}: sidco_torch is not importable: run it with PYTHONPATH=build/python after "
                 "meson compile -C build, or pip install the package (docs/PYTORCH.md#install)")
    return sidco_torch
