"""Chapter 6: GPT against the modern decoder, and the modern decoder with one change undone, over seeds.

The chapter trains each model once (seed 0) in its quick profile; this script repeats the same runs
(same data, recipe, sizes and steps as the chapter's `train`) for several seeds on the current CPU
kernel path, appends one JSON line per run to experiments/ch06_ablation.jsonl, and prints the table
of mean and spread that experiments/ch06_ablation.md records and the chapter prints.

    python tools/kernel_path.py pinned -- python experiments/ch06_ablation.py --seeds 0 1 2
    python tools/kernel_path.py alternate -- python experiments/ch06_ablation.py --seeds 0 1 2
    python experiments/ch06_ablation.py --table        # the table from the recorded runs

Variants: "gpt" (the companion's GPT: pre-LayerNorm, learned positions, MHA, GELU MLP of width 4d,
biases, GPT-2's initialisation with scaled residual projections); "modern" (llama-like: pre-RMSNorm,
RoPE, GQA with 2 key/value heads, SwiGLU, no biases, plain N(0, 0.02) initialisation); and the modern
decoder with one change undone: "learned" (learned positions), "layernorm" (LayerNorm instead of
RMSNorm), "gelu" (a GELU MLP of width 4d instead of SwiGLU), "mha" (4 key/value heads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RECORD = HERE / "ch06_ablation.jsonl"
STEPS, CONTEXT = 300, 64
SHAPE = dict(n_layers=2, n_heads=4, d_model=64)
CHANGES = {"modern": {}, "learned": dict(position="learned"), "layernorm": dict(norm="layer"),
           "gelu": dict(ffn="gelu"), "mha": dict(n_kv_heads=4)}
VARIANTS = ["gpt", *CHANGES]
LABELS = {"gpt": "GPT", "modern": "modern decoder", "learned": "modern, learned positions",
          "layernorm": "modern, LayerNorm", "gelu": "modern, GELU MLP 4d", "mha": "modern, MHA (g = h)"}


def chapter_data():
    """Chapter 6's character stream: training characters, the held-out slice, and V."""
    from companion.data import shakespeare_dataset, split_text
    from companion.tokenizers import CharTokenizer

    plays = shakespeare_dataset()
    train_text, val_text = split_text(plays["train"]), split_text(plays["validation"])
    chars = CharTokenizer.train(train_text + val_text)
    char_train = torch.tensor(chars.encode(train_text))
    char_val = torch.tensor(chars.encode(val_text))
    return char_train, char_val[: 16 * 32 * CONTEXT + 1], chars.vocab_size


def make_model(variant: str, V: int):
    from companion.models import from_preset
    from companion.models.gpt import GPT, GPTConfig

    if variant == "gpt":
        return GPT(GPTConfig(vocab_size=V, block_size=CONTEXT, n_layer=SHAPE["n_layers"],
                             n_head=SHAPE["n_heads"], n_embd=SHAPE["d_model"]))
    changes = {"n_kv_heads": 2, **CHANGES[variant]}
    return from_preset("llama-like", vocab_size=V, max_seq_len=CONTEXT, tie_embeddings=True,
                       **SHAPE, **changes)


def train_once(variant: str, seed: int, data) -> dict:
    """The chapter's `train(make, seed)`: the same recipe, returning the held-out loss."""
    from companion.data.loaders import LMData
    from companion.training.trainer import TrainConfig, Trainer

    char_train, held_out, V = data
    torch.manual_seed(seed)
    model = make_model(variant, V)
    loader = LMData(char_train, held_out, batch_size=32, context=CONTEXT, seed=seed)
    config = TrainConfig(steps=STEPS, lr=1e-2, warmup=min(30, STEPS - 1), eval_every=50,
                         eval_batches=None, log_every=10, progress=False)
    start = time.process_time()
    history = Trainer(model, loader, config).fit()
    return dict(variant=variant, seed=seed, val_loss=history.last("val_loss"),
                params=model.num_parameters(), cpu_s=round(time.process_time() - start, 1))


def kernel_path() -> str:
    import os

    cap = torch.backends.cpu.get_cpu_capability()
    pins = os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("MKL_CBWR")
    return {("avx2", "AVX2"): "pinned", ("default", "COMPATIBLE"): "alternate"}.get(pins, f"native {cap}")


def load() -> list[dict]:
    if not RECORD.exists():
        return []
    return [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]


def table(rows: list[dict]) -> str:
    """Markdown: per variant, the loss of each (path, seed), the mean and the spread (max - min)."""
    runs = {(r["variant"], r["path"], r["seed"]): r for r in rows}   # the last record of a run wins
    columns = sorted({(r["path"], r["seed"]) for r in rows})
    lines = ["| model | params | " + " | ".join(f"{p} s{s}" for p, s in columns)
             + " | mean | min | max |", "|---|---:|" + "---:|" * (len(columns) + 3)]
    for v in VARIANTS:
        got = [runs[v, p, s] for p, s in columns if (v, p, s) in runs]
        if not got:
            continue
        vals = [r["val_loss"] for r in got]
        cells = [f"{runs[v, p, s]['val_loss']:.3f}" if (v, p, s) in runs else "" for p, s in columns]
        lines.append(f"| {LABELS[v]} | {got[0]['params']:,} | " + " | ".join(cells)
                     + f" | {statistics.mean(vals):.3f} | {min(vals):.3f} | {max(vals):.3f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="*", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--table", action="store_true", help="print the table of recorded runs")
    args = parser.parse_args(argv)
    if args.table:
        print(table(load()))
        return 0
    sys.path.insert(0, str(HERE.parent))
    import companion

    companion.profile()                        # one thread, as the chapter's quick profile
    data, path = chapter_data(), kernel_path()
    for seed in args.seeds:
        for variant in args.variants:
            save(dict(path=path, **train_once(variant, seed, data)))
    return 0


def save(row: dict) -> None:
    """Append one run to the record, and show it."""
    line = json.dumps(row)
    with RECORD.open("a") as f:
        f.write(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
