#!/usr/bin/python3
"""The CUDA ops (dispatch key CUDA) against the CPU ops on the bundled real gradients. Exits
77 (skip) without a CUDA device or when this sidco_torch was built without CUDA. Checked:
- exact Top-k on a CUDA tensor returns the CPU op's indices and values, whole and per layer;
- error feedback: sent + new residual = gradient + old residual exactly, for float32 and
  float64, with the gradient written on a side stream just before compress;
- SIDCo-E's threshold selection keeps exactly the |x| above its reported threshold;
- scatter_add_/decompress on the device equal the CPU ops; a bad index raises, changing nothing;
- a Compressor's state, moved from the CPU to the device and copied there, continues bit for bit."""
import copy
import os
import sys

import numpy as np
import torch

import sidco_torch

from ranks import cuda_skip_reason

GRADIENTS = os.environ.get("SIDCO_GRADIENTS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                                               "data", "gradients"))


def load(name, dtype=torch.float32):
    return torch.from_numpy(np.load(os.path.join(GRADIENTS, name)).astype(np.float32)).to(dtype)


def check_saved_state(gradient):
    """A Compressor's state saved on the device (deepcopy, which goes through state_dict()) and
    one moved there from the CPU: the copy continues as the original, bit for bit, on the
    device, whole and per layer."""
    n = gradient.numel()
    for method, options in (("sidco-e", {}), ("random-k", {"seed": 3})):
        for layers in (None, [n // 3, n - n // 3]):
            original = sidco_torch.Compressor(method, **options)
            original.compress(gradient.cpu(), 0.01, layer_sizes=layers)  # its state then follows to the device
            residual = torch.zeros_like(gradient)
            for step in range(3):
                original.compress(gradient * (1 + step), 0.01, layer_sizes=layers, residual=residual)
            copied, copied_residual = copy.deepcopy(original), residual.clone()
            for step in range(3, 6):
                a = original.compress(gradient * (1 + step), 0.01, layer_sizes=layers, residual=residual)
                b = copied.compress(gradient * (1 + step), 0.01, layer_sizes=layers, residual=copied_residual)
                assert all(torch.equal(x, y) for x, y in zip(a, b)) and torch.equal(residual, copied_residual), \
                    f"{method} layers {layers} step {step}: a copy of a device Compressor continued otherwise"
                assert original.report() == copied.report()


def main():
    reason = cuda_skip_reason()
    if reason:
        print(f"{reason}: skipped")
        return 77
    g = load("cnn_it200.npy")
    for layers in (None, [g.numel() // 3, g.numel() - g.numel() // 3]):
        i_cpu, v_cpu = sidco_torch.compress(g, 0.01, method="top-k", layer_sizes=layers)
        i_gpu, v_gpu = sidco_torch.compress(g.cuda(), 0.01, method="top-k", layer_sizes=layers)
        assert i_gpu.dtype == torch.int64 and i_gpu.is_cuda and v_gpu.is_cuda
        assert torch.equal(i_gpu.cpu(), i_cpu) and torch.equal(v_gpu.cpu(), v_cpu), f"top-k differs (layers {layers})"
    side = torch.cuda.Stream()
    for dtype in (torch.float32, torch.float64):
        host = load("ffn_it200.npy", dtype)
        compressor = sidco_torch.Compressor("sidco-e")
        residual = torch.zeros_like(host, device="cuda")
        for step in range(3):
            with torch.cuda.stream(side):
                gradient = (host * (1 + step)).cuda(non_blocking=True)
                before = residual.clone()
                indices, values = compressor.compress(gradient, 0.01, residual=residual)
                sent = torch.zeros_like(gradient).index_put_((indices,), values)
                assert torch.equal(sent + residual, gradient + before), f"{dtype} step {step}: feedback not exact"
                t = compressor.report()["threshold"]
                kept = (gradient + before).double().abs() > t  # sidco compares in double
                assert torch.equal(kept.nonzero().flatten(), indices), f"{dtype} step {step}: not exactly |x| > t"
        torch.cuda.synchronize()
    i, v = sidco_torch.compress(g, 0.01, method="top-k")
    dense_cpu = sidco_torch.decompress(i, v, g.numel())
    dense_gpu = sidco_torch.decompress(i.cuda(), v.cuda(), g.numel())
    assert torch.equal(dense_gpu.cpu(), dense_cpu)
    target = torch.ones(g.numel(), device="cuda")
    bad = i.clone().cuda()
    bad[-1] = g.numel()
    try:
        sidco_torch.scatter_add_(target, bad, v.cuda())
        raise AssertionError("an out-of-range index was accepted")
    except ValueError as e:
        assert "out of range" in str(e), e
    assert torch.equal(target, torch.ones_like(target)), "a refused scatter_add_ changed the tensor"
    check_saved_state(load("ffn_it200.npy").cuda())
    print("CUDA ops equal the CPU ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
