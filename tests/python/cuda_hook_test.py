#!/usr/bin/python3
"""The communication hook's encode and decode on CUDA buckets against the CPU's. Exits 77
(skip) without a CUDA device or when this sidco_torch was built without CUDA. Checked:
- two ranks' codecs in one process, on the bundled real gradients, per layer, with error
  feedback, float32 and float16, SIDCo-E and Top-k, a capacity that trims, plain, compact
  and compact8 entries: every payload byte, the bytes used, the decoded bucket and the
  residuals (which hold what narrowing rounds off) equal the CPU codecs', bit for bit, step
  by step;
- a rank that fails: decode raises the same error on CUDA as on the CPU, and the residual
  gets back what this rank sent, as on the CPU;
- the reduce-scatter exchange's codecs, three ranks' in one process, on the bundled real
  gradients with error feedback, per layer, float32 and float16, owners by SIDCo-E and by
  Top-k, blocks that trim, plain, compact and compact8 entries (compact ones: both rounds
  through the messages the hook sends, framed on the host by the CUDA codec): every block, every
  message, every owner's selection, the update and the residuals equal the CPU codecs', bit
  for bit, step by step (the regions move on as in training); a rank that fails: every rank
  raises the same error, and each residual gets back what its rank sent, as on the CPU;
- 2-rank DDP steps with the hook on CUDA buckets (NCCL with 2 GPUs, else gloo on one), by
  all-gather and by reduce-scatter (plain, compact and compact8 entries each):
  every rank ends with the same averaged gradients, all sent sparse."""
import os
import sys

import numpy as np
import torch

from sidco_torch.ops import _codec, _reduce_codec

from ranks import cuda_skip_reason, run_ranks, sparse_ddp_step

GRADIENTS = os.environ.get("SIDCO_GRADIENTS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                                               "data", "gradients"))


def load(name, dtype):
    return torch.from_numpy(np.load(os.path.join(GRADIENTS, name)).astype(np.float32)).to(dtype)


def codecs_agree(method, dtype, wire):
    g = [load("cnn_it200.npy", dtype), load("cnn_it200.npy", dtype).flip(0) * 0.5]
    n = g[0].numel()
    layers = [n // 3, n - n // 3]
    make = lambda: _codec(method, {}, layers, dtype, 0.01, 1.0, wire=wire)  # noqa: E731 - slack 1: trims
    cpu = [make(), make()]
    gpu = [make(), make()]
    res_cpu = [torch.zeros(n, dtype=dtype) for _ in range(2)]
    res_gpu = [torch.zeros(n, dtype=dtype, device="cuda") for _ in range(2)]
    trimmed = 0
    for step in range(3):
        sent_cpu = [torch.ops.sidco.encode(g[r] * (1 + step), res_cpu[r], cpu[r], 7, step).clone() for r in range(2)]
        sent_gpu = [torch.ops.sidco.encode((g[r] * (1 + step)).cuda(), res_gpu[r], gpu[r], 7, step).clone()
                    for r in range(2)]
        for r in range(2):
            assert torch.equal(sent_gpu[r].cpu(), sent_cpu[r]), f"{method} {dtype} {wire} step {step}: payload {r} differs"
            used = [int(c.report()["used_bytes"]) for c in (cpu[r], gpu[r])]
            assert used[0] == used[1], f"{method} {dtype} {wire} step {step}: bytes used {used}"
            trimmed += int(gpu[r].report()["trimmed"])
        out_cpu = [torch.empty(n, dtype=dtype) for _ in range(2)]
        out_gpu = [torch.empty(n, dtype=dtype, device="cuda") for _ in range(2)]
        for r in range(2):
            torch.ops.sidco.decode(sent_cpu, out_cpu[r], res_cpu[r], cpu[r])
            torch.ops.sidco.decode(sent_gpu, out_gpu[r], res_gpu[r], gpu[r])
            assert torch.equal(out_gpu[r].cpu(), out_cpu[r]), f"{method} {dtype} step {step}: decode differs"
            assert torch.equal(res_gpu[r].cpu(), res_cpu[r]), f"{method} {dtype} step {step}: residual differs"
    # Rank 1 fails: both raise the same error; rank 0's sent entries go back to its residual.
    failed_cpu = [torch.ops.sidco.encode(g[0], res_cpu[0], cpu[0], 7, 3).clone(),
                  torch.ops.sidco.encode_failure(g[1], cpu[1], "out of memory", 7, 3).clone()]
    failed_gpu = [torch.ops.sidco.encode(g[0].cuda(), res_gpu[0], gpu[0], 7, 3).clone(),
                  torch.ops.sidco.encode_failure(g[1].cuda(), gpu[1], "out of memory", 7, 3).clone()]
    messages = []
    for payloads, out, residual, codec in ((failed_cpu, torch.empty(n, dtype=dtype), res_cpu[0], cpu[0]),
                                           (failed_gpu, torch.empty(n, dtype=dtype, device="cuda"), res_gpu[0],
                                            gpu[0])):
        try:
            torch.ops.sidco.decode(payloads, out, residual, codec)
            raise AssertionError("a failed rank's payload decoded")
        except RuntimeError as e:
            messages.append(str(e).splitlines()[0])
    assert messages[0] == messages[1] and "out of memory" in messages[0], messages
    assert torch.equal(res_gpu[0].cpu(), res_cpu[0]), "the failed exchange's residual differs"
    return trimmed


def framed_blocks(blocks, codecs, block, device):
    """Round 1 in the compact coding's messages (reduce_frames, reduce_unframe), as the hook's
    all-to-all at split sizes moves them: what each owner receives, and every rank's messages
    and their sizes (two tensors a rank)."""
    ops, ranks = torch.ops.sidco, len(blocks)
    messages = [ops.reduce_frames(blocks[r], codecs[r], False) for r in range(ranks)]
    sizes = [m[1].tolist() for m in messages]
    received = []
    for o in range(ranks):
        parts = [messages[r][0][sum(sizes[r][:o]):sum(sizes[r][:o + 1])] for r in range(ranks)]
        slots = torch.empty(ranks * block, dtype=torch.uint8, device=device)
        ops.reduce_unframe(torch.cat(parts), [sizes[r][o] for r in range(ranks)],
                           list(slots.view(ranks, block).unbind(0)), codecs[o], False)
        received.append(slots)
    return received, [t for m in messages for t in m]


def framed_selections(selections, codecs, block, device):
    """Round 2 in the compact coding's messages, as the hook's all-gather moves them: every
    rank's slots, and the owners' messages."""
    ops, ranks = torch.ops.sidco, len(selections)
    messages = [ops.reduce_frames(selections[o], codecs[o], True)[0] for o in range(ranks)]
    slots = []
    for r in range(ranks):
        mine = [torch.empty(block, dtype=torch.uint8, device=device) for _ in range(ranks)]
        ops.reduce_unframe(torch.cat(messages), [m.numel() for m in messages], mine, codecs[r], True)
        slots.append(mine)
    return slots, messages


def reduce_codecs_agree(owner, dtype, wire="plain", devices=("cpu", "cuda"), ranks=3):
    ops = torch.ops.sidco
    base = load("cnn_it200.npy", dtype)
    g = [base * (1 + r) if r % 2 == 0 else base.flip(0) * 0.5 for r in range(ranks)]
    n = base.numel()
    layers = [n // 3, n - n // 3]
    # slack 1: blocks trim; the layers in the exchange's order reversed
    codecs = [[_reduce_codec("sidco-e", {}, layers, dtype, 0.01, 1.0, ranks, r, owner, device=device, order=[1, 0],
                             wire=wire) for r in range(ranks)] for device in devices]
    residuals = [[torch.zeros(n, dtype=dtype, device=device) for _ in range(ranks)] for device in devices]
    block = codecs[0][0].block_bytes()
    trimmed = 0
    for step in range(4):
        results = []
        for device, cs, res in zip(devices, codecs, residuals):
            if step < 3:
                blocks = [ops.reduce_encode((g[r] * (1 + step)).to(device), res[r], cs[r], 7, step).clone()
                          for r in range(ranks)]
            else:  # the last rank fails
                blocks = [ops.reduce_encode(g[r].to(device), res[r], cs[r], 7, step).clone() for r in range(ranks - 1)]
                blocks.append(ops.reduce_encode_failure(g[-1].to(device), cs[-1], "out of memory", 7, step).clone())
            messages = []
            if wire != "plain":
                received, messages = framed_blocks(blocks, cs, block, device)
            else:
                received = [torch.cat([b[o * block:(o + 1) * block] for b in blocks]) for o in range(ranks)]
            selections = [ops.reduce_select(received[o], torch.zeros(n, dtype=dtype, device=device), res[o],
                                            cs[o]).clone() for o in range(ranks)]
            if wire != "plain":
                inboxes, sent = framed_selections(selections, cs, block, device)
                messages += sent
            else:
                inboxes = [selections] * ranks
            outs, errors = [], []
            for r in range(ranks):
                out = torch.zeros(n, dtype=dtype, device=device)
                try:
                    ops.reduce_decode(inboxes[r], out, res[r], cs[r])
                except RuntimeError as e:
                    errors.append(str(e).splitlines()[0])
                outs.append(out)
            results.append((blocks, selections, outs, errors, messages))
        what = f"reduce owner {owner} {dtype} {wire} step {step}"
        cpu, gpu = results
        for r in range(ranks):
            assert torch.equal(gpu[0][r].cpu(), cpu[0][r].cpu()), f"{what}: rank {r}'s blocks differ"
            assert torch.equal(gpu[1][r].cpu(), cpu[1][r].cpu()), f"{what}: owner {r}'s selection differs"
            assert torch.equal(gpu[2][r].cpu(), cpu[2][r].cpu()), f"{what}: rank {r}'s update differs"
            assert torch.equal(residuals[1][r].cpu(), residuals[0][r].cpu()), f"{what}: rank {r}'s residual differs"
        assert len(gpu[4]) == len(cpu[4]) == (3 * ranks if wire != "plain" else 0), what
        for x, y in zip(gpu[4], cpu[4]):  # the messages (and, round 1, their sizes), byte for byte
            assert torch.equal(x.cpu(), y.cpu()), f"{what}: the messages differ"
        assert gpu[3] == cpu[3], f"{what}: errors {gpu[3]} on {devices[1]}, {cpu[3]} on {devices[0]}"
        if step < 3:
            assert not cpu[3] and bool((cpu[2][0] != 0).any()), f"{what}: {cpu[3]}"
            trimmed += sum(int(c.report()["trimmed"]) for c in codecs[1])
            if wire != "plain":  # 1- or 2-byte values and gap codes: a few bytes an entry where plain takes 8
                framed = sum(m.numel() for m in cpu[4][:2 * ranks:2])
                entries = sum(int(c.report()["selected"] - c.report()["trimmed"]) for c in codecs[0])
                assert framed < 4.0 * entries, f"{what}: {framed} bytes framed for {entries} entries"
        else:
            assert len(cpu[3]) == ranks and len(set(cpu[3])) == 1 and "out of memory" in cpu[3][0], cpu[3]
        for c_cpu, c_gpu in zip(codecs[0], codecs[1]):
            assert torch.equal(c_gpu.exchange_state(), c_cpu.exchange_state()), f"{what}: the exchanges' states differ"
    return trimmed


def ddp_steps_agree(backend, exchange, wire):
    results = run_ranks(sparse_ddp_step, backend, "cuda", 2, exchange, wire, timeout=180)
    for rank, same, paths, nonzero, size in results:
        assert same, f"rank {rank}: the averaged gradients differ between ranks ({exchange}, {wire})"
        assert paths == {f"sparse ({exchange})"}, f"rank {rank}: bucket paths {paths}"
        assert 0 < nonzero < size, (rank, nonzero, size)
    print(f"2-rank DDP steps on CUDA buckets over {backend} by {exchange}, {wire} entries: every rank has the "
          "same averaged gradients")


def main():
    reason = cuda_skip_reason()
    if reason:
        print(f"{reason}: skipped")
        return 77
    for method in ("sidco-e", "top-k"):
        for dtype in (torch.float32, torch.float16):
            for wire in ("plain", "compact", "compact8"):
                trimmed = codecs_agree(method, dtype, wire)
                print(f"{method} {dtype} {wire}: CUDA codec equals the CPU codec ({trimmed} entries trimmed)")
    for owner in ("sidco-e-exact", "top-k"):
        for dtype in (torch.float32, torch.float16):
            for wire in ("plain", "compact", "compact8"):
                trimmed = reduce_codecs_agree(owner, dtype, wire)
                assert trimmed > 0, f"owner {owner} {dtype} {wire}: no block trimmed, the test checks less than it says"
                print(f"reduce exchange, owner {owner}, {dtype}, {wire}: the CUDA codecs equal the CPU's ({trimmed} "
                      "entries trimmed)")
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    for exchange in ("allgather", "reduce"):
        for wire in ("plain", "compact", "compact8"):
            ddp_steps_agree(backend, exchange, wire)
    return 0


if __name__ == "__main__":
    sys.exit(main())
