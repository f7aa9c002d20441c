#!/usr/bin/python3
"""How the union of P ranks' local selections fills in as P grows, on real gradients: one
model (the WikiText-2 LSTM or transformer of the training benchmark, trained --warm steps
first), one step's data split into P shards (each rank's batch drawn from its own contiguous
shard of the text), each shard's gradient compressed locally by SIDCo-E at --density, then:

  union / k       distinct indices the P local selections hold, over k = density N (an
                  all-gather of selections delivers all of them; 1 would be full overlap,
                  P none at all);
  kept of own     the share of a rank's own selection that the global selection (the k
                  largest magnitudes of the sum of what every rank sent: what the
                  reduce-scatter exchange's owners keep) holds, averaged over ranks;
  global of union the global selection's share of the union.

Prints a markdown table; --json appends rows; --png plots union / k against P.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import wikitext  # noqa: E402

MODELS = {
    "lstm": dict(kind="lstm", dim=342, layers=2, batch=20, bptt=35, lr=1.0, clip=0.25),
    "gpt": dict(kind="gpt", dim=256, layers=4, batch=8, bptt=64, lr=0.1, clip=1.0),
}


def flat_gradient(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def gradient(model, x, y):
    model.zero_grad()
    out, _ = model(x)
    nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1)).backward()
    return flat_gradient(model).clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="lstm")
    ap.add_argument("--ranks", default="2,4,8,16,32")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--warm", type=int, default=100, help="training steps before the measured one")
    ap.add_argument("--method", default="sidco-e")
    ap.add_argument("--package", default=os.path.join(HERE, "..", "build", "python"))
    ap.add_argument("--json", default="")
    ap.add_argument("--png", default="")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.package))
    import sidco_torch

    torch.manual_seed(1)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    spec = MODELS[a.model]
    shard, _, vocab = wikitext.corpus(0, 1, 10)
    model = wikitext.make_model(spec["kind"], vocab, spec["dim"], spec["layers"])
    model.eval()  # no dropout: the shards' gradients differ by their data alone
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9)
    warm = wikitext.Batches(shard, spec["batch"], spec["bptt"])
    for _ in range(a.warm):
        x, y = warm.next()
        gradient(model, x, y)
        nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        optimizer.step()
    n = sum(p.numel() for p in model.parameters())
    k = max(1, int(a.density * n))
    print(f"{a.model}: {n} parameters after {a.warm} steps, density {a.density}: k = {k}; {a.method} per shard")
    print("| ranks | union / k | kept of own | global of union | local density / target |")
    print("|---|---|---|---|---|")
    rows = []
    for ranks in [int(r) for r in a.ranks.split(",")]:
        selections, total = [], torch.zeros(n)
        local = []
        for r in range(ranks):
            part, _, _ = wikitext.corpus(r, ranks, 10)
            x, y = wikitext.Batches(part, spec["batch"], spec["bptt"]).next()
            g = gradient(model, x, y)
            indices, values = sidco_torch.compress(g, a.density, method=a.method)
            selections.append(indices)
            total.index_add_(0, indices, values)
            local.append(indices.numel() / k)
        union = torch.unique(torch.cat(selections))
        top = torch.topk(total.abs(), k).indices
        in_global = torch.zeros(n, dtype=torch.bool)
        in_global[top] = True
        kept = sum(float(in_global[s].float().mean()) for s in selections) / ranks
        row = dict(model=a.model, ranks=ranks, density=a.density, union_over_k=union.numel() / k, kept_of_own=kept,
                   global_of_union=k / union.numel(), local_over_target=sum(local) / ranks)
        rows.append(row)
        print(f"| {ranks} | {row['union_over_k']:.2f} | {kept:.3f} | {row['global_of_union']:.3f} | "
              f"{row['local_over_target']:.2f} |", flush=True)
    if a.json:
        with open(a.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ps = [r["ranks"] for r in rows]
        ax.plot(ps, [r["union_over_k"] for r in rows], "o-", label="union of local selections / k")
        ax.plot(ps, ps, ":", color="grey", label="no overlap (P)")
        ax.plot(ps, [r["kept_of_own"] * 10 for r in rows], "s--", label="kept of own selection × 10")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("ranks P")
        ax.set_title(f"{a.model}, {a.method} at δ = {a.density}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
