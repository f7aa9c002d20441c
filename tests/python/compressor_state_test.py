#!/usr/bin/python3
"""sidco_torch.Compressor's saved state, on the bundled real gradients (one process, no ranks):
- a Compressor loaded from state_dict() (through torch.save / torch.load), pickled or
  deep-copied continues as the original does, bit for bit: the same indices, values, residual
  and report each later call, for adaptive SIDCo methods and Random-k's generator, whole and
  per layer, float32 and bfloat16, with error feedback; a fresh Compressor does not (so the
  state is what carries it);
- a state of another method or seed, a damaged layer state, a wrong layer count, an unknown
  dtype or bad layer sizes are refused with a sentence naming what is wrong, and the refused
  Compressor continues as it would have;
- an empty state (a Compressor that never compressed) loads as a fresh one."""
import copy
import io
import os
import pickle
import sys

import numpy as np
import torch

import sidco_torch
from checks import expect, failures, report

GRADIENTS = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data", "gradients")
DENSITY = 0.01


def gradients(dtype):
    """A fresh gradient each call: the bundled gradients of one model, rotated and scaled."""
    base = torch.from_numpy(np.load(os.path.join(GRADIENTS, "ffn_it200.npy")).astype(np.float32))
    other = torch.from_numpy(np.load(os.path.join(GRADIENTS, "ffn_it10.npy")).astype(np.float32))
    n = min(base.numel(), other.numel())
    return [(base[:n].roll(997 * step) * (1 + 0.1 * step) + other[:n].roll(-31 * step)).to(dtype)
            for step in range(8)]


def step(compressor, gradient, residual, layers):
    indices, values = compressor.compress(gradient, DENSITY, layer_sizes=layers, residual=residual)
    report = compressor.report()
    return indices, values, residual.clone(), (report["threshold"], report["selected"], report["stages"])


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a[:3], b[:3])) and a[3] == b[3]


def continuations(method, options, dtype, layers, restore):
    """(whether the restored copy continued as the original, whether a fresh one did): both run
    from call 4 on the same residual."""
    series = gradients(dtype)
    original = sidco_torch.Compressor(method, **options)
    residual = torch.zeros_like(series[0])
    for g in series[:4]:
        step(original, g, residual, layers)
    restored, fresh = restore(original), sidco_torch.Compressor(method, **options)
    r_original, r_restored, r_fresh = residual.clone(), residual.clone(), residual.clone()
    kept, fresh_same = True, True
    for g in series[4:]:
        a = step(original, g, r_original, layers)
        kept &= same(a, step(restored, g, r_restored, layers))
        fresh_same &= same(a, step(fresh, g, r_fresh, layers))
    return kept, fresh_same


def through_torch_save(compressor):
    buffer = io.BytesIO()
    torch.save(compressor.state_dict(), buffer)
    buffer.seek(0)
    loaded = sidco_torch.Compressor(compressor.method, **compressor.state_dict()["options"])
    loaded.load_state_dict(torch.load(buffer))
    return loaded


RESTORES = {"state_dict": through_torch_save, "pickle": lambda c: pickle.loads(pickle.dumps(c)),
            "deepcopy": copy.deepcopy}


def check_continuation():
    n = gradients(torch.float32)[0].numel()
    cases = [("sidco-e", {}), ("sidco-gp", {}), ("random-k", {"seed": 11})]
    for method, options in cases:
        for dtype in (torch.float32, torch.bfloat16):
            for layers in (None, [n // 4, n // 2, n - n // 4 - n // 2]):
                for name, restore in RESTORES.items():
                    kept, fresh_same = continuations(method, options, dtype, layers, restore)
                    case = f"{method} {dtype} {'per layer' if layers else 'whole'} via {name}"
                    if not kept:
                        failures.append(f"{case}: the restored Compressor did not continue as the original")
                    if fresh_same:
                        failures.append(f"{case}: a fresh Compressor continued as the original too (the test "
                                        "cannot tell a restored state from none)")


def check_refusals():
    series = gradients(torch.float32)
    n = series[0].numel()
    layers = [n // 2, n - n // 2]
    compressor = sidco_torch.Compressor("sidco-e")
    residual = torch.zeros_like(series[0])
    for g in series[:3]:
        step(compressor, g, residual, None)
        step(compressor, g, residual, layers)
    twin, twin_residual = copy.deepcopy(compressor), residual.clone()
    good = compressor.state_dict()
    if [(e["dtype"], e["layer_sizes"], len(e["layers"])) for e in good["engines"]] != [
            ("float32", [], 1), ("float32", layers, 2)]:
        failures.append(f"state_dict's engines: {[(e['dtype'], e['layer_sizes']) for e in good['engines']]}")

    def damaged(**change):
        state = copy.deepcopy(good)
        engine = state["engines"][change.pop("engine", 1)]
        engine.update(change)
        return state

    where = "sidco_torch.Compressor.load_state_dict"
    load = compressor.load_state_dict
    expect(lambda: sidco_torch.Compressor("sidco-gp").load_state_dict(good), ValueError, where, "'sidco-e'",
           "'sidco-gp'")
    expect(lambda: sidco_torch.Compressor("random-k", seed=3).load_state_dict(
        sidco_torch.Compressor("random-k", seed=4).state_dict()), ValueError, "options", "{'seed': 4}", "{'seed': 3}")
    expect(lambda: load([1, 2]), TypeError, "state must be the dict", "list")
    expect(lambda: load({k: v for k, v in good.items() if k != "engines"}), ValueError, "no 'engines'")
    expect(lambda: load({**good, "format": 2}), ValueError, "format 2")
    short = good["engines"][1]["layers"][1][:-8]
    expect(lambda: load(damaged(layers=[good["engines"][1]["layers"][0], short])), ValueError, where, "engine 1",
           "per layer", "state: ends before")
    expect(lambda: load(damaged(layers=good["engines"][1]["layers"][:1])), ValueError, "engine 1",
           "1 layer states for an engine of 2 layers")
    expect(lambda: load(damaged(engine=0, dtype="int8")), ValueError, "engine 0", "dtype 'int8'")
    expect(lambda: load(damaged(layer_sizes=[n, -1])), ValueError, "engine 1", "size -1 of layer 1")
    expect(lambda: load(damaged(layers=[torch.zeros(8, dtype=torch.int32)] * 2)), ValueError, "engine 1", "uint8")
    expect(lambda: load(damaged(layers=["x"])), ValueError, "engines[1]['layers']")
    expect(lambda: load({**good, "engines": "x"}), ValueError, "engines must be a list, got str")
    expect(lambda: load({**good, "engines": [good["engines"][0], 3]}), ValueError,
           "engines[1] is not a dict of dtype, layer_sizes and layers")
    expect(lambda: load(damaged(engine=0, dtype=torch.float32)), ValueError,
           "engines[0]['dtype'] must be a str, got torch.float32")
    # A state of another method's bytes in this method's entry: refused by the state's own names.
    other = sidco_torch.Compressor("sidco-gp")
    other.compress(series[0], DENSITY)
    expect(lambda: load(damaged(engine=0, layers=other.state_dict()["engines"][0]["layers"])), ValueError,
           "engine 0", "was expected")
    # Every refusal above changed nothing: the Compressor continues as its copy does.
    for g in series[3:]:
        for sizes in (None, layers):
            if not same(step(compressor, g, residual, sizes), step(twin, g, twin_residual, sizes)):
                failures.append("a refused load_state_dict changed the Compressor")
                return


def check_empty_state():
    series = gradients(torch.float32)
    never_used = sidco_torch.Compressor("random-k", seed=5)
    if never_used.state_dict()["engines"]:
        failures.append("a Compressor that never compressed saved engines")
    used = sidco_torch.Compressor("random-k", seed=5)
    used.compress(series[0], DENSITY)
    used.load_state_dict(never_used.state_dict())
    fresh = sidco_torch.Compressor("random-k", seed=5)
    for g in series[1:3]:
        if not all(torch.equal(a, b) for a, b in zip(used.compress(g, DENSITY), fresh.compress(g, DENSITY))):
            failures.append("an empty state did not load as a fresh Compressor")
            return


def main():
    check_continuation()
    check_refusals()
    check_empty_state()
    return report("compressor state")


if __name__ == "__main__":
    sys.exit(main())
