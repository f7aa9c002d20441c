"""What the example scripts share on the command line: sidco_torch, or one sentence saying how
to make it importable (instead of a ModuleNotFoundError traceback), and argparse types that
refuse counts below 1 and densities outside (0, 1] before any work (instead of ranks that
never start, a division by zero in each, or a run that does nothing and exits 0)."""
import argparse
import os
import sys


def import_sidco_torch(script):
    """The sidco_torch module; exits naming `script` when it is not importable."""
    try:
        import sidco_torch
    except ModuleNotFoundError as missing:
        if missing.name != "sidco_torch":
            raise
        sys.exit(f"{os.path.basename(script)}: sidco_torch is not importable: run it with "
                 "PYTHONPATH=build/python after meson compile -C build, or pip install the package "
                 "(docs/PYTORCH.md#install)")
    return sidco_torch


def count(text):
    """argparse's type for a count of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def density(text):
    """argparse's type for a density in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is outside (0, 1]")
    return value
