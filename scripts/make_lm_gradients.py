#!/usr/bin/python3
# Copied from the shared tools of the sidco project (../shared/tools/make_lm_gradients.py),
# unchanged but for this note; examples/data/wikitext-2 holds the text it reads.
"""Dump whole-model gradients of a small GPT-style language model at realistic bucket size.

Trains on CPU, fixed seeds, a decoder-only transformer (untied token embedding and LM
head, learned positions, pre-LayerNorm blocks, causal self-attention, GELU MLP) on the
WikiText-2 validation text (examples/data/wikitext-2/valid.txt; vocabulary from the text, with
<eos> at line ends), with SGD + momentum (no Adam). At chosen iterations it saves the flattened
whole-model gradient (float32, 1-D .npy, parameters in model.parameters() order):
  gpt_it{N}.npy     plain run, the raw gradient (no error feedback)
  gpt_ef_it{N}.npy  a second run that sends Top-k (density 1%) of grad + residual and
                    keeps the rest as residual (error feedback); the saved vector is
                    grad + residual, the one a compressor sees (as make_gradients.py)
and manifest.json in the format of data/gradients/manifest.json (model, iteration,
error_feedback, elements, loss, zeros, layers[name, offset, size]). The untied input
embedding gives exact zeros (rows of words absent from the batch); the LM head, the
attention/MLP matrices and the LayerNorm gains/biases are dense.

Defaults: 4 blocks, d_model 384, 6 heads, context 64, batch 8, SGD lr 0.05 momentum 0.9,
update clipped to global norm 1.0 (saved vectors are unclipped), 17.7M parameters
(10.6M of them in the embedding and LM head: 13,777 words). Larger models:
--layers/--dim. The files are big (4 bytes a parameter): keep them out of the repo.

usage: /usr/bin/python3 make_lm_gradients.py TEXT_FILE OUT_DIR [--iters 20,200] [--ef-iters 100]
                             [--layers 4] [--dim 384] [--heads 6] [--seed N] [--stats-only]
Needs python3-torch, python3-numpy, python3-scipy (Debian packages). Debian's torch
calls the system libblas.so.3, which is the reference BLAS (~4 GFLOPS) unless OpenBLAS
is installed; without touching the system alternative, run with an extracted
libopenblas0-pthread:  apt-get download libopenblas0-pthread && dpkg -x *.deb ob &&
  LD_LIBRARY_PATH=$PWD/ob/usr/lib/x86_64-linux-gnu/openblas-pthread /usr/bin/python3 ...
Bitwise reproducible only with the same BLAS and thread count (--threads, default 2).
"""
import argparse, json, math, os, sys, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F



class Block(nn.Module):
    def __init__(s, d, heads):
        super().__init__()
        s.heads = heads
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.out = nn.Linear(4 * d, d)

    def forward(s, x, mask):
        B, T, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, s.heads, D // s.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // s.heads)
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + s.out(F.gelu(s.fc(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s, vocab, d, n_layers, heads, ctx):
        super().__init__()
        s.wte = nn.Embedding(vocab, d); s.wpe = nn.Embedding(ctx, d)
        s.blocks = nn.ModuleList([Block(d, heads) for _ in range(n_layers)])
        s.ln_f = nn.LayerNorm(d); s.head = nn.Linear(d, vocab)
        s.register_buffer("mask", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1))
        for n, p in s.named_parameters():          # GPT-2 style init
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers) if n.endswith(("proj.weight", "out.weight")) else 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(s, idx):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.blocks:
            x = b(x, s.mask)
        return s.head(s.ln_f(x))


def corpus(path):
    words = []
    for line in open(path, encoding="utf-8"):
        words += line.split() + ["<eos>"]
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    return torch.tensor([vocab[w] for w in words]), len(vocab)


def layers(model):
    out, off = [], 0
    for n, p in model.named_parameters():
        out.append({"name": n, "offset": off, "size": p.numel()}); off += p.numel()
    return out


def run(a, ids, V, iters, ef, manifest):
    torch.manual_seed(a.seed); np.random.seed(a.seed)
    model = GPT(V, a.dim, a.layers, a.heads, a.ctx)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    opt = torch.optim.SGD(params, lr=a.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(a.seed + 1)        # same batches in both runs
    residual = torch.zeros(n)
    k = max(1, int(0.01 * n))
    tag = "gpt_ef" if ef else "gpt"
    print(f"[{tag}] params {n} vocab {V} d {a.dim} layers {a.layers} batch {a.batch}x{a.ctx}", flush=True)
    t0 = time.time()
    for it in range(1, max(iters) + 1):
        starts = torch.randint(0, len(ids) - a.ctx - 1, (a.batch,), generator=gen)
        x = torch.stack([ids[s:s + a.ctx] for s in starts]); y = torch.stack([ids[s + 1:s + a.ctx + 1] for s in starts])
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)); loss.backward()
        g = torch.cat([p.grad.reshape(-1) for p in params])
        if ef:
            vec = g + residual                            # what the compressor sees
            idx = vec.abs().topk(k, sorted=False).indices
            upd = torch.zeros(n); upd[idx] = vec[idx]
            residual = vec.clone(); residual[idx] = 0
            off = 0
            for p in params:                              # the optimizer sees the sparse update
                p.grad.copy_(upd[off:off + p.numel()].view_as(p)); off += p.numel()
        else:
            vec = g
        if it in iters:
            name = f"{tag}_it{it}.npy"
            np.save(os.path.join(a.out_dir, name), vec.numpy().astype(np.float32))
            manifest[name] = {"model": "gpt", "iteration": it, "error_feedback": ef, "elements": n,
                              "loss": float(loss), "zeros": int((vec == 0).sum()), "layers": layers(model)}
            print(f"  saved {name} loss {float(loss):.3f}", flush=True)
        if it % 20 == 0 or it == 1:
            print(f"  it {it} loss {float(loss):.3f} {time.time() - t0:.0f}s", flush=True)
        if a.clip > 0:                                    # clips the update, not the saved vector
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()


def stats(out_dir, manifest):
    from scipy.stats import kurtosis
    for name, m in sorted(manifest.items()):
        v = np.load(os.path.join(out_dir, name))
        nz = v[v != 0]
        print(f"\n{name}: elements {v.size} exact zeros {1 - nz.size / v.size:.2%} loss {m['loss']:.3f} "
              f"kurtosis(non-zeros, excess) {kurtosis(nz, fisher=True):.1f} mean|g| {np.abs(nz).mean():.3e}")
        groups = {}
        for L in m["layers"]:
            s = v[L["offset"]:L["offset"] + L["size"]]
            key = L["name"].split(".", 2)[-1] if L["name"].startswith("blocks.") else L["name"]
            gg = groups.setdefault(key, [0, 0, 0.0, 0])
            gg[0] += 1; gg[1] += s.size; gg[2] += float(np.square(s, dtype=np.float64).sum()); gg[3] += int((s == 0).sum())
        print(f"  {'layer (summed over blocks)':<28}{'n':>3}{'size':>11}{'zeros':>8}{'rms':>11}")
        for key, (c, size, ss, z) in groups.items():
            print(f"  {key:<28}{c:>3}{size:>11}{z / size:>8.1%}{math.sqrt(ss / size):>11.3e}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("text"); ap.add_argument("out_dir"); ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--iters", default="20,200"); ap.add_argument("--ef-iters", default="100")
    ap.add_argument("--layers", type=int, default=4); ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6); ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8); ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2); ap.add_argument("--stats-only", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.makedirs(a.out_dir, exist_ok=True)
    mpath = os.path.join(a.out_dir, "manifest.json")
    manifest = json.load(open(mpath)) if os.path.exists(mpath) else {}
    if not a.stats_only:
        ids, V = corpus(a.text)
        if a.iters:
            run(a, ids, V, sorted(int(i) for i in a.iters.split(",")), False, manifest)
        if a.ef_iters:
            run(a, ids, V, sorted(int(i) for i in a.ef_iters.split(",")), True, manifest)
        json.dump(manifest, open(mpath, "w"), indent=1)
    stats(a.out_dir, manifest)
