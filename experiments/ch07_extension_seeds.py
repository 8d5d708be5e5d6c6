"""Chapter 7, extension and copying over training seeds: how much of the stored run is the seed?

Trains, from each seed (initialisation, data order and Trainer seed), the chapter's two character models (RoPE and ALiBi; 2 layers, width 64, 4 heads of 16, 300
steps on 64-character Shakespeare windows) and its RoPE look-back copier (32-token sequences of 16
random tokens, target the token 12 back, 200 steps), and prints:

- the mean loss on positions 0-63 and 64 and later, read at 2x, 4x and 8x the trained length, for plain
  RoPE, PI, NTK, YaRN (fixed factor s = L'/64) and ALiBi;
- at 8x, the loss past 64 under dynamic scaling, s = max(1, l/64) in blocks of 64 (the chapter's
  ``dynamic_loss``), for PI, NTK and YaRN;
- the RoPE copier's accuracy on positions 64-127 and 128-255, the last position up to which it stays at
  or above 0.9, and its means over 48-position blocks from 64.

The chapter runs seed 0; its asserts take their margins from this script's table, recorded in
experiments/ch07_extension_seeds.md:

    OMP_NUM_THREADS=1 python tools/kernel_path.py pinned -- python experiments/ch07_extension_seeds.py
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from companion.data import shakespeare_dataset, split_text
from companion.data.loaders import LMData
from companion.models.decoder import Decoder, DecoderConfig
from companion.tokenizers import CharTokenizer
from companion.training.trainer import TrainConfig, Trainer

T0, V, LAG, T_COPY = 64, 16, 12, 32
SHAPE = dict(d_model=64, n_layers=2, n_heads=4)


class LookBack:
    """Random tokens; the target at position t is the token at t - LAG (the chapter's task)."""

    def __init__(self, T, batch=32, seed=0):
        self.T, self.batch = T, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next_batch(self):
        x = torch.randint(0, V, (self.batch, self.T), generator=self.gen)
        y = x.roll(LAG, dims=1)
        y[:, :LAG] = -100
        return x, y

    def eval_batches(self, max_batches=None):
        return iter(())

    def shard(self, rank, world):
        pass

    def state_dict(self):
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, state):
        self.gen.set_state(state["generator"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    plays = shakespeare_dataset()
    train_text, val_text = split_text(plays["train"]), split_text(plays["validation"])
    tok = CharTokenizer.train(train_text + val_text)
    train_ids, val_ids = torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text))

    def make_model(position, seed):
        torch.manual_seed(seed)
        return Decoder(DecoderConfig(vocab_size=tok.vocab_size, max_seq_len=1024, position=position,
                                     **SHAPE))

    def train(model, seed):
        data = LMData(train_ids, None, batch_size=16, context=T0, seed=seed)
        config = TrainConfig(steps=300, lr=1e-2, warmup=20, log_every=50, progress=False, device="cpu",
                             seed=seed)
        Trainer(model, data, config).fit()
        return model

    @torch.no_grad()
    def loss_by_position(model, T, n=16, stride=512):
        x = torch.stack([val_ids[w * stride: w * stride + T] for w in range(n)])
        y = torch.stack([val_ids[w * stride + 1: w * stride + T + 1] for w in range(n)])
        return F.cross_entropy(model.eval()(x).transpose(1, 2), y, reduction="none").mean(0)

    def rescaled(model, scheme, factor):
        if scheme == "none":
            return model
        other = Decoder(dataclasses.replace(model.config, rope_scaling=scheme, rope_factor=factor,
                                            rope_original_max_len=T0))
        other.load_state_dict(model.state_dict())
        return other.eval()

    def dynamic_loss(model, scheme, T=8 * T0):
        parts = [loss_by_position(model, T0)]
        for end in range(2 * T0, T + 1, T0):
            parts.append(loss_by_position(rescaled(model, scheme, end / T0), end)[-T0:])
        return torch.cat(parts)

    for seed in args.seeds:
        rope_lm, alibi_lm = train(make_model("rope", seed), seed), train(make_model("alibi", seed), seed)
        print(f"seed {seed}: mean loss on positions 0-63 | 64 and later")
        for m in ("none", "pi", "ntk", "yarn", "alibi"):
            cells = []
            for f in (2, 4, 8):
                model = alibi_lm if m == "alibi" else rescaled(rope_lm, m, f)
                c = loss_by_position(model, T0 * f)
                cells.append(f"{f}x: {c[:T0].mean():.2f} | {c[T0:].mean():.2f}")
            print(f"  {m:6} " + "    ".join(cells))
        print("  dynamic scaling, 8x, loss past 64: " + ", ".join(
            f"{m} {dynamic_loss(rope_lm, m)[T0:].mean():.2f}" for m in ("pi", "ntk", "yarn")))
        torch.manual_seed(seed)
        copier = Decoder(DecoderConfig(vocab_size=V, max_seq_len=512, position="rope", **SHAPE))
        config = TrainConfig(steps=200, lr=3e-3, warmup=20, progress=False, device="cpu", seed=seed)
        Trainer(copier, LookBack(T_COPY, seed=seed), config).fit()
        with torch.no_grad():
            x, y = LookBack(256, batch=64, seed=1).next_batch()
            acc = (copier.eval()(x).argmax(-1) == y).float().mean(0)
        below = (acc[64:] < 0.9).nonzero()
        held = int(below[0]) + 63 if len(below) else 255
        blocks = " ".join(f"{acc[a:a + 48].mean():.2f}" for a in range(64, 256, 48))
        print(f"  copier: 12-63 {acc[LAG:64].mean():.2f}, 64-127 {acc[64:128].mean():.2f}, "
              f"128-255 {acc[128:].mean():.2f}; >= 0.9 up to position {held}; "
              f"48-position blocks from 64: {blocks}", flush=True)


if __name__ == "__main__":
    main()
