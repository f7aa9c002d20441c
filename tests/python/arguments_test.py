#!/usr/bin/python3
"""Argument errors of sidco_torch's Python entry points: each raised in Python as TypeError or
ValueError naming the argument and the value, before TorchScript sees it (no TorchScript
declaration, no error deferred to the first backward). One process, no ranks."""
import sys

import torch

import sidco_torch

failures = []


def expect(call, error, *words):
    try:
        call()
    except error as e:
        message = str(e)
        missing = [w for w in words if w not in message]
        if missing or "TorchScript" in message or "Declaration" in message:
            failures.append(f"{words}: message {message!r} lacks {missing}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure reported
        failures.append(f"{words}: {type(e).__name__} ({e}), not {error.__name__}")
        return
    failures.append(f"{words}: nothing raised")


def main():
    expect(lambda: sidco_torch.State(method=3), TypeError, "method", "int 3", "sidco-e")
    expect(lambda: sidco_torch.State(method="sidco"), ValueError, "method", "'sidco'", "top-k")
    expect(lambda: sidco_torch.State(seed="x"), TypeError, "seed", "str 'x'")
    expect(lambda: sidco_torch.State(seed=1.5), TypeError, "seed", "float 1.5")
    expect(lambda: sidco_torch.State(seed=2**60 + 1), ValueError, "seed", str(2**60 + 1), "2^53")
    expect(lambda: sidco_torch.State(sed=1), ValueError, "option 'sed'", "seed")
    expect(lambda: sidco_torch.State(feedback="no"), TypeError, "feedback", "str 'no'")
    expect(lambda: sidco_torch.State(feedback=1), TypeError, "feedback", "int 1")
    expect(lambda: sidco_torch.State(process_group="gloo"), TypeError, "process_group", "str 'gloo'")
    expect(lambda: sidco_torch.State(density="0.01"), TypeError, "density", "str '0.01'")
    expect(lambda: sidco_torch.State(density=0), ValueError, "density = 0")
    expect(lambda: sidco_torch.register(torch.nn.Linear(2, 2), sidco_torch.State()), TypeError, "ddp_model",
           "DistributedDataParallel", "Linear")
    expect(lambda: sidco_torch.Compressor(method=None), TypeError, "method", "NoneType None")
    expect(lambda: sidco_torch.compress(torch.randn(100), 0.1, method="random-k", seed=-1), ValueError, "seed = -1")
    # What is right still works: a seed the double holds exactly, and Random-k gives the same
    # selection for the same seed.
    a = sidco_torch.compress(torch.arange(100.0), 0.1, method="random-k", seed=2**53 - 1)[0]
    b = sidco_torch.compress(torch.arange(100.0), 0.1, method="random-k", seed=2**53 - 1)[0]
    if not torch.equal(a, b):
        failures.append("random-k with one seed gave two selections")
    sidco_torch.State(method="top-k", feedback=False, seed=7)
    for f in failures:
        print("FAIL", f)
    print("argument checks:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
