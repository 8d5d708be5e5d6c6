"""Chapter 9, StreamingLLM: the trained Bigram-Backcopy model streamed with positions counted inside the cache.

For each seed, trains the chapter's 2-layer llama-like model (500 steps on 64-token sequences) and measures
the mean loss on the chapter's 16 streams of 256 tokens, inside the trained length (positions 8-63) and
beyond it (64-255): full attention; a window of 8 keeping 0, 1 or 4 first tokens with positions counted
inside the cache (``companion.streaming.StreamingCache``); and the same window with the kept tokens at
their absolute positions (the layers' own window= / keep=). Then the aliasing check: the 4 kept tokens
placed at a fixed distance D from the window (``gap``), loss on positions 16-39 of the streams, averaged
over bands of D. Run on each kernel path:

    python tools/kernel_path.py pinned -- python experiments/ch09_streaming.py
    python tools/kernel_path.py alternate -- python experiments/ch09_streaming.py
    python experiments/ch09_streaming.py

The tables are in experiments/ch09_streaming.md.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

from ch09_moe_balancing import T_TRAIN, V, backcopy_data
from companion.data.loaders import SequenceData
from companion.models import from_preset
from companion.streaming import StreamingCache
from companion.training.trainer import TrainConfig, Trainer

SHAPE = dict(vocab_size=V + 1, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, max_seq_len=4 * T_TRAIN + 1)
DISTANCES = range(48, 401, 16)       # the chapter's grid of distances D
BANDS = {"48-92": (48, 93), "100-190": (100, 191), "200-240": (200, 241), "300-370": (300, 371)}


def losses(logits, y):
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(0)


def streamed(model, x, y, window, keep, gap=0):
    cache = StreamingCache(model, window=window, keep=keep, gap=gap)
    with torch.no_grad():
        return losses(torch.cat([model(x[:, t:t + 1], cache=cache) for t in range(x.shape[1])], 1), y)


def measure(seed, train, val, stream):
    data = SequenceData(train.tolist(), None, batch_size=16, validation=(val.tolist(), None))
    run = TrainConfig(steps=500, lr=1e-2, warmup=30, weight_decay=0.0, eval_every=0, log_every=50,
                      device="cpu", precision="fp32", progress=False, seed=seed)
    torch.manual_seed(seed)
    model = from_preset("llama-like", **SHAPE)
    Trainer(model, data, run).fit()
    model.eval()
    x, y = stream[:, :-1], stream[:, 1:]
    row = {}
    with torch.no_grad():
        curves = {"full": losses(model(x), y)}
        for keep in (1, 4):
            absolute = from_preset("llama-like", **SHAPE, window=8, keep=keep)
            absolute.load_state_dict(model.state_dict())
            curves[f"absolute {keep}"] = losses(absolute.eval()(x), y)
    for keep in (0, 1, 4):
        curves[f"in-cache {keep}"] = streamed(model, x, y, 8, keep)
    for name, c in curves.items():
        row[name] = (c[8:T_TRAIN].mean().item(), c[T_TRAIN:].mean().item())
    short_x, short_y = stream[:, :40], stream[:, 1:41]
    by_distance = {d: streamed(model, short_x, short_y, 8, 4, d - 8)[16:].mean().item()
                   for d in DISTANCES}
    row["bands"] = {band: sum(v for d, v in by_distance.items() if lo <= d < hi)
                    / sum(1 for d in by_distance if lo <= d < hi) for band, (lo, hi) in BANDS.items()}
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"kernel path: ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'native')}, "
          f"torch capability {torch.backends.cpu.get_cpu_capability()}")
    train, val, stream = backcopy_data()
    for seed in range(args.seeds):
        row = measure(seed, train, val, stream)
        cells = "  ".join(f"{name} {a:.3f}/{b:.3f}" for name, (a, b) in
                          ((n, v) for n, v in row.items() if n != "bands"))
        print(f"seed {seed} (inside 8-63 / beyond 64-255): {cells}")
        print(f"seed {seed} kept 4 at distance D, loss by band of D: "
              + "  ".join(f"{band}: {v:.3f}" for band, v in row["bands"].items()), flush=True)


if __name__ == "__main__":
    main()
