"""Chapter 6: deep post-LN and pre-LN stacks trained without warm-up, over seeds, with two controls.

The chapter trains stacks of 12 and 24 of the companion's blocks (width 32, 4 heads, GELU MLP, Xavier-normal
matrices, as in its gradient measurement) with Adam (betas 0.9, 0.98) at a constant learning rate of 1e-2
from the first step, 60 steps of 16 windows of 32 characters, three seeds, and finds that post-LN stalls at
the loss of a model that knows only character frequencies while pre-LN trains past it. This script repeats
that grid and adds two controls at 12 layers for post-LN: a linear warm-up (10 and 30 steps) to the same
learning rate, and a ten times smaller learning rate without warm-up. One row per run: the mean training
loss of the last 10 steps.

    OMP_NUM_THREADS=1 python tools/kernel_path.py pinned -- python experiments/ch06_depth_warmup.py

The table it printed is in experiments/ch06_depth_warmup.md.
"""
import time

import torch
import torch.nn.functional as F
from torch import nn

import companion
from companion.blocks import Block
from companion.data import shakespeare_dataset, split_text
from companion.data.loaders import LMData
from companion.feedforward import MLP
from companion.mha import MultiHeadAttention
from companion.norms import LayerNorm
from companion.tokenizers import CharTokenizer

STEPS = 60


class Stack(nn.Module):
    """Embedding, L blocks of one placement, (a final LN for pre-LN), output head; Xavier-normal."""

    def __init__(self, vocab, n_layers, placement, d=32, n_heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, MultiHeadAttention(d, n_heads, bias=True), MLP(d, 4 * d, "gelu"),
                                          placement=placement) for _ in range(n_layers))
        self.norm = LayerNorm(d) if placement == "pre" else nn.Identity()
        self.head = nn.Linear(d, vocab)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)

    def forward(self, x):
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h))


def train(ids, vocab, placement, n_layers, seed, lr=1e-2, warmup=0):
    torch.manual_seed(seed)
    stack = Stack(vocab, n_layers, placement)
    opt = torch.optim.Adam(stack.parameters(), lr=lr, betas=(0.9, 0.98))
    data = LMData(ids, None, batch_size=16, context=32, seed=seed)
    losses = []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        x, y = data.next_batch()
        loss = F.cross_entropy(stack(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


def main():
    companion.profile()
    plays = shakespeare_dataset()
    train_text, val_text = split_text(plays["train"]), split_text(plays["validation"])
    chars = CharTokenizer.train(train_text + val_text)
    ids, val = torch.tensor(chars.encode(train_text)), torch.tensor(chars.encode(val_text))
    counts = torch.bincount(ids, minlength=chars.vocab_size).double() + 1
    print(f"character frequencies alone: {-(counts / counts.sum()).log()[val].mean():.2f} nats/char")
    grid = [(12, "post", 1e-2, 0), (12, "pre", 1e-2, 0), (24, "post", 1e-2, 0), (24, "pre", 1e-2, 0),
            (12, "post", 1e-2, 10), (12, "post", 1e-2, 30), (12, "post", 1e-3, 0)]
    print("| layers | placement | learning rate | warm-up steps | seed 0 | seed 1 | seed 2 | CPU s / run |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n_layers, placement, lr, warmup in grid:
        ends, start = [], time.process_time()
        for seed in range(3):
            ends.append(train(ids, chars.vocab_size, placement, n_layers, seed, lr, warmup)[-10:].mean().item())
        cpu = (time.process_time() - start) / 3
        print(f"| {n_layers} | {placement}-LN | {lr:g} | {warmup} | " + " | ".join(f"{e:.2f}" for e in ends)
              + f" | {cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
