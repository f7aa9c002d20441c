"""WikiText-2 language modelling for the examples and the training benchmark: the text
(examples/data/wikitext-2: trained on valid.txt, evaluated on test.txt), two models (a
word-level LSTM, a GPT-style transformer) and the test perplexity."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "wikitext-2")


def tokenize(path, vocabulary=None):
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words += line.split() + ["<eos>"]
    if vocabulary is None:
        vocabulary = {w: i for i, w in enumerate(sorted(set(words) | {"<unk>"}))}
    unk = vocabulary["<unk>"]
    return torch.tensor([vocabulary.get(w, unk) for w in words], dtype=torch.long), vocabulary


def corpus(rank, ranks, eval_words):
    """This rank's contiguous shard of the training text, the test text's first eval_words
    words, and the vocabulary size."""
    train, vocabulary = tokenize(os.path.join(DATA, "valid.txt"))
    test, _ = tokenize(os.path.join(DATA, "test.txt"), vocabulary)
    shard = train.numel() // ranks
    return train[rank * shard: (rank + 1) * shard], test[:eval_words], len(vocabulary)


class LSTMModel(nn.Module):
    """Embedding, a multi-layer LSTM, a linear decoder (untied)."""

    def __init__(self, vocab, dim, layers, dropout):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, layers, dropout=dropout, batch_first=False)
        self.drop = nn.Dropout(dropout)
        self.decode = nn.Linear(dim, vocab)

    def forward(self, x, hidden=None):  # x: (time, batch)
        out, hidden = self.lstm(self.drop(self.embed(x)), hidden)
        return self.decode(self.drop(out)), hidden


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.heads)
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A decoder-only transformer (as scripts/make_lm_gradients.py): untied token embedding
    and head, learned positions, pre-LayerNorm blocks. Input (time, batch) like the LSTM's."""

    def __init__(self, vocab, d, layers, heads, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scaled = name.endswith(("proj.weight", "out.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if scaled else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x, hidden=None):
        x = x.t()  # (batch, time)
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        # Made here, not a buffer: DDP broadcasts buffers at construction, and gloo has no bool.
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), 1)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(self.ln_f(h)).transpose(0, 1), None


def batchify(data, batch):
    n = data.numel() // batch
    return data[: n * batch].view(batch, n).t().contiguous()  # (time, batch)


def evaluate(model, data, bptt, batch=10):
    """Test perplexity of model on data (a 1-D token tensor)."""
    data = batchify(data, batch)
    model.eval()
    hidden = None
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            x, y = data[i: i + bptt], data[i + 1: i + 1 + bptt]
            x = x[: y.size(0)]
            out, hidden = model(x, hidden)
            total += F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    model.train()
    return math.exp(total / count)


class Batches:
    """Consecutive (input, target) windows of bptt steps over a rank's shard, carrying the
    LSTM's hidden state between windows (detached), restarting at the end."""

    def __init__(self, shard, batch, bptt):
        self.data, self.bptt = batchify(shard, batch), bptt
        self.position, self.hidden = 0, None

    def next(self):
        if self.position + self.bptt + 1 > self.data.size(0):
            self.position, self.hidden = 0, None
        x = self.data[self.position: self.position + self.bptt]
        y = self.data[self.position + 1: self.position + 1 + self.bptt]
        self.position += self.bptt
        if self.hidden is not None:
            self.hidden = tuple(h.detach() for h in self.hidden)
        return x, y


def make_model(kind, vocab, dim, layers, dropout=0.2, heads=4, context=64):
    if kind == "lstm":
        return LSTMModel(vocab, dim, layers, dropout)
    if kind == "gpt":
        return GPT(vocab, dim, layers, heads, context)
    raise ValueError(f"model {kind!r} is not lstm or gpt")
