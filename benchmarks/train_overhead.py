"""Trainer overhead: companion.training.trainer.Trainer against a bare hand-written loop, same model, same batches.

    .venv/bin/python benchmarks/train_overhead.py                 # about a minute on 2 cores
    .venv/bin/python benchmarks/train_overhead.py --threads 2 --rounds 12 --steps-per-round 25

Both loops train their own copy of one initialisation of a character GPT on Shakespeare (the issue's
calibration shape: 2 layers, d = 64, 4 heads, context 64, batch 32) with the same optimizer
(companion.training.optim AdamW), gradient clipping, warmup + cosine schedule and batches (two LMData sources
with one seed). They take turns: each round runs ``--steps-per-round`` steps of one, then of the other
(the order alternates), so slow and fast moments of a shared machine hit both alike. The trainer runs
through its public ``fit()`` (progress bar off, logging every 10 steps, no evaluation data), so the
per-round set-up of ``fit`` counts as overhead too.

Before timing, the script checks that both loops produce bit-identical losses: the comparison is of
the same computation, only the bookkeeping differs. It prints the median tokens/s of each and the
overhead 1 - trainer / bare (goal: under 5%).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from companion.data import load, split_text
from companion.models import GPT, GPTConfig
from companion.training.optim import WarmupCosine, build_optimizer, clip_grad_norm, scheduler
from companion.tokenizers import CharTokenizer
from companion.data.loaders import LMData
from companion.training.trainer import TrainConfig, Trainer


def make_model(vocab: int, args) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, block_size=args.context, n_layer=args.layers, n_head=4, n_embd=args.d))


class Bare:
    """The loop a reader would write by hand."""

    def __init__(self, model, data, total_steps: int, lr: float):
        self.model, self.data = model, data
        self.opt = build_optimizer(model, "adamw", lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
        self.sched = scheduler(self.opt, WarmupCosine(10, total_steps, 0.1))

    def step(self) -> torch.Tensor:
        x, y = self.data.next_batch()
        logits = self.model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of (bare, trainer) turns")
    parser.add_argument("--steps-per-round", type=int, default=20, help="optimizer steps per turn")
    parser.add_argument("--d", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--context", type=int, default=64, help="context length")
    parser.add_argument("--batch", type=int, default=32, help="batch size")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    ds = load("shakespeare")
    text = split_text(ds["train"])
    tok = CharTokenizer.train(text)
    stream = torch.tensor(tok.encode(text))
    total = 20 + args.rounds * args.steps_per_round

    # 1. the same computation: 20 steps of each from one initialisation give identical losses
    bare = Bare(make_model(tok.vocab_size, args), LMData(stream, None, args.batch, args.context), total, 3e-3)
    config = TrainConfig(steps=total, lr=3e-3, warmup=10, log_every=1, progress=False)
    trainer = Trainer(make_model(tok.vocab_size, args), LMData(stream, None, args.batch, args.context), config)
    bare_losses = [float(bare.step()) for _ in range(20)]
    trainer.fit(steps=20)
    same = bare_losses == trainer.history.series("loss")[1]
    print(f"identical losses over 20 steps: {same}")
    if not same:
        raise SystemExit("the two loops diverged: the comparison would not be fair")

    # 2. interleaved timing
    trainer.config.log_every = 10
    tokens = args.steps_per_round * args.batch * args.context
    rates = {"bare": [], "trainer": []}
    start_all = time.perf_counter()
    for r in range(args.rounds):
        for name in (("bare", "trainer") if r % 2 == 0 else ("trainer", "bare")):
            t0 = time.perf_counter()
            if name == "bare":
                for _ in range(args.steps_per_round):
                    bare.step()
            else:
                trainer.fit(steps=trainer.step + args.steps_per_round)
            rates[name].append(tokens / (time.perf_counter() - t0))
    wall = time.perf_counter() - start_all

    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} thread(s); "
          f"GPT d={args.d} L={args.layers} T={args.context} B={args.batch}; {args.rounds} rounds x "
          f"{args.steps_per_round} steps each; {wall:.0f} s; load average {load1:.1f}")
    print("| loop | median tokens/s | min | max |")
    print("|---|---:|---:|---:|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {min(values):,.0f} | {max(values):,.0f} |")
    ratios = [t / b for t, b in zip(rates["trainer"], rates["bare"])]
    overhead = 1 - statistics.median(rates["trainer"]) / statistics.median(rates["bare"])
    print(f"overhead (1 - median trainer / median bare): {overhead:+.1%}; per-round ratio median "
          f"{statistics.median(ratios):.3f}, range {min(ratios):.3f} to {max(ratios):.3f}")


if __name__ == "__main__":
    main()
