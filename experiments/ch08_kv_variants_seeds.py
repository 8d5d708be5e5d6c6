"""Chapter 8, MHA, GQA and MQA on the same budget: how much of the stored ranking is the seed?

Trains the chapter's three character-level decoders (2 layers, width 64, h = 8 query heads with g = 8,
2 and 1 key/value heads, 150 steps, lr 1e-2, batch 16 of 64 characters on Shakespeare) from each seed
(initialisation, data order and Trainer seed, as the chapter's ``train_variant(g, seed)``) and prints
their final validation losses (20 evaluation batches), then the spread per variant. The chapter runs
seed 0 (and MHA with seed 1); its text quotes this script's table, recorded in
experiments/ch08_kv_variants_seeds.md:

    OMP_NUM_THREADS=1 python tools/kernel_path.py pinned -- python experiments/ch08_kv_variants_seeds.py
    OMP_NUM_THREADS=1 python tools/kernel_path.py alternate -- python experiments/ch08_kv_variants_seeds.py
"""

from __future__ import annotations

import argparse

import torch

from companion.data import shakespeare_dataset, split_text
from companion.data.loaders import LMData
from companion.models.decoder import Decoder, DecoderConfig
from companion.tokenizers import CharTokenizer
from companion.training.trainer import TrainConfig, Trainer

SHAPE = dict(d_model=64, n_layers=2, n_heads=8, max_seq_len=64)
VARIANTS = {"MHA": 8, "GQA": 2, "MQA": 1}


def character_ids():
    """The chapter's tokenizer and its training and validation characters as id tensors."""
    splits = {name: split_text(text) for name, text in shakespeare_dataset().items()}
    tok = CharTokenizer.train(splits["train"] + splits["validation"])
    return tok, *(torch.tensor(tok.encode(splits[name])) for name in ("train", "validation"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    seeds = parser.parse_args().seeds
    tok, train_ids, val_ids = character_ids()
    losses: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for seed in seeds:
        row = []
        for name, g in VARIANTS.items():
            torch.manual_seed(seed)
            model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, n_kv_heads=g, **SHAPE))
            data = LMData(train_ids, val_ids, batch_size=16, context=SHAPE["max_seq_len"], seed=seed)
            config = TrainConfig(steps=150, lr=1e-2, warmup=20, eval_batches=20, log_every=25,
                                 progress=False, seed=seed, device="cpu")
            loss = Trainer(model, data, config).fit().last("val_loss")
            losses[name].append(loss)
            row.append(f"{name} {loss:.3f}")
        print(f"seed {seed}: " + ", ".join(row), flush=True)
    for name, values in losses.items():
        print(f"{name}: {min(values):.3f} to {max(values):.3f} (spread {max(values) - min(values):.3f})")


if __name__ == "__main__":
    main()
