#!/usr/bin/python3
"""The CUDA ops' device scratch comes from torch's caching allocator. Exits 77 (skip) without
a CUDA device or when this sidco_torch was built without CUDA ops. Checked, on the bundled
LSTM gradient tiled to 2^24 values:
- torch.cuda.memory_allocated() counts the scratch a compressor keeps between calls (more than
  its outputs and the residual);
- 1,000 calls on changing gradients grow neither torch's allocated nor its reserved memory;
- a limit set with torch.cuda.set_per_process_memory_fraction binds the ops too: a compress
  that cannot get its scratch raises torch's out-of-memory error and leaves the residual as
  it was."""
import os
import sys

import numpy as np
import torch

import sidco_torch

from ranks import cuda_skip_reason

GRADIENTS = os.environ.get("SIDCO_GRADIENTS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                                               "data", "gradients"))
N = 1 << 24


def gradient():
    base = torch.from_numpy(np.load(os.path.join(GRADIENTS, "lstm_it10.npy")).astype(np.float32))
    return base.repeat(-(-N // base.numel()))[:N].cuda()


def main():
    reason = cuda_skip_reason()
    if reason:
        print(f"{reason}: skipped")
        return 77
    g = gradient()
    residual = torch.zeros_like(g)
    compressor = sidco_torch.Compressor("sidco-e")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    indices, values = compressor.compress(g, 0.001, residual=residual)
    torch.cuda.synchronize()
    outputs = indices.numel() * indices.element_size() + values.numel() * values.element_size()
    kept = torch.cuda.memory_allocated() - before - outputs
    print(f"scratch kept by the compressor, as torch counts it: {kept / 2**20:.2f} MiB")
    assert kept > 0, f"torch counts no scratch ({kept} bytes beyond the outputs): not from its allocator"
    del indices, values

    for call in range(1, 1001):
        indices, values = compressor.compress(g * (1 + call % 5), 0.001, residual=residual)
        del indices, values
        if call == 10:
            torch.cuda.synchronize()
            settled = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    torch.cuda.synchronize()
    now = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    print(f"after 10 calls: allocated {settled[0] / 2**20:.1f} MiB, reserved {settled[1] / 2**20:.1f} MiB; "
          f"after 1,000: {now[0] / 2**20:.1f}, {now[1] / 2**20:.1f}")
    assert now[0] <= settled[0] and now[1] <= settled[1], f"1,000 calls grew memory: {settled} -> {now}"

    # A fresh compressor must allocate its scratch; allow torch only what it holds now.
    saved = residual.cpu()
    fresh = sidco_torch.Compressor("top-k")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved() / total)
    try:
        fresh.compress(g, 0.01, residual=residual)
        raise AssertionError("compress ran beyond torch's memory limit")
    except torch.cuda.OutOfMemoryError as e:
        print(f"over the limit: torch.cuda.OutOfMemoryError ({str(e).splitlines()[0][:100]})")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.equal(residual.cpu(), saved), "a failed compress changed the residual"
    print("the ops' device memory is torch's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
