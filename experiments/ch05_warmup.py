"""Chapter 5: the post-LN warm-up experiment over seeds, and whether the stalled runs predict character frequencies.

The chapter's section "Why a post-LN model needs warm-up" trains a 6-layer post-LN GPT (d = 64,
4 heads, context 32, batches of 16, AdamW at 2e-3, betas (0.9, 0.98), no decay, no clipping) for 200
steps with and without a 100-step warm-up, seeds 0-2. This script repeats exactly those runs on the
current CPU kernel path, and for each run records

- the mean training loss over the last 25 steps (what the chapter's table prints), and
- the mean KL divergence KL(p(. | context) || unigram) of the trained model's predictions from the
  corpus's character frequencies, over 32 fixed windows of 32 characters: about 0 for a model that
  predicts the same frequencies whatever the context, large for one that uses the context.

One JSON line per run is appended to experiments/ch05_warmup.jsonl; `--table` prints the table that
experiments/ch05_warmup.md records.

    python tools/kernel_path.py pinned -- python experiments/ch05_warmup.py
    python tools/kernel_path.py alternate -- python experiments/ch05_warmup.py
    python experiments/ch05_warmup.py          # the native path
    python experiments/ch05_warmup.py --table
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
RECORD = HERE / "ch05_warmup.jsonl"
STEPS, WARM, TAIL = 200, 100, 25


def corpus():
    from companion.data import shakespeare_dataset, split_text
    from companion.tokenizers import CharTokenizer

    text = split_text(shakespeare_dataset()["train"])[:300_000]
    tok = CharTokenizer.train(text)
    ids = torch.tensor(tok.encode(text))
    freq = torch.bincount(ids, minlength=tok.vocab_size).double() / len(ids)
    return ids, freq, tok.vocab_size


def run(seed: int, warmup: int, ids, V: int):
    """The chapter's train_post_ln(seed, warmup, 200): (losses, model)."""
    from companion.data import lm_batch
    from companion.models.gpt import GPT, GPTConfig
    from companion.training.optim import AdamW, ConstantWithWarmup, scheduler

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=V, block_size=32, n_layer=6, n_head=4, n_embd=64,
                          variant="gpt1"))
    opt = AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.0)
    lr_sched = scheduler(opt, ConstantWithWarmup(warmup))
    batches = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(STEPS):
        x, y = lm_batch(ids, 16, 32, generator=batches)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        lr_sched.step()
        losses.append(loss.item())
    return torch.tensor(losses), model


def kl_from_unigram(model, ids, freq) -> float:
    """Mean over positions of KL(p(. | context) || unigram frequencies), in nats (the chapter's probe)."""
    from companion.data import lm_batch

    x, _ = lm_batch(ids, 32, 32, generator=torch.Generator().manual_seed(123))
    with torch.no_grad():
        log_p = torch.log_softmax(model(x).double(), -1)
    log_q = freq.clamp_min(1e-12).log()
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()


def path_name() -> str:
    pins = os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("MKL_CBWR")
    named = {("avx2", "AVX2"): "pinned", ("default", "COMPATIBLE"): "alternate"}
    return named.get(pins, f"native {torch.backends.cpu.get_cpu_capability()}")


def table(rows: list[dict]) -> str:
    lines = ["| path | seed | no warm-up: loss | KL | warm-up: loss | KL |",
             "|---|---:|---:|---:|---:|---:|"]
    runs = {(r["path"], r["seed"], r["warmup"]): r for r in rows}
    for path, seed in sorted({(r["path"], r["seed"]) for r in rows}):
        cells = []
        for w in (0, WARM):
            r = runs.get((path, seed, w))
            cells += [f"{r['loss']:.3f}", f"{r['kl']:.3f}"] if r else ["", ""]
        lines.append(f"| {path} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        rows = [json.loads(s) for s in RECORD.read_text().splitlines() if s.strip()]
        print(table(rows))
        return 0
    sys.path.insert(0, str(HERE.parent))
    import companion

    companion.profile()
    ids, freq, V = corpus()
    unigram = -(freq[freq > 0] * freq[freq > 0].log()).sum().item()
    for seed in args.seeds:
        for warmup in (0, WARM):
            losses, model = run(seed, warmup, ids, V)
            row = dict(path=path_name(), seed=seed, warmup=warmup, unigram=round(unigram, 4),
                       loss=round(losses[-TAIL:].mean().item(), 4),
                       kl=round(kl_from_unigram(model, ids, freq), 4))
            print(json.dumps(row), flush=True)
            with RECORD.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
