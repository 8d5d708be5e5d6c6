"""Chapter 9, learned sinks: how much weight do the heads put on token 0, with and without a sink logit?

For each seed, trains the chapter's 2-layer llama-like Bigram-Backcopy model (500 steps on 64-token
sequences) twice, as the chapter does: plain, and with a learned sink logit per head (gpt-oss,
``sinks=True``). For each it prints the largest mean weight any head puts on token 0 (mean over the 64
held-out sequences and the queries at positions 16-63, the chapter's ``on_first.max()``) and, for the
sink model, the largest mean weight on the sink logit. Run on each kernel path:

    python tools/kernel_path.py pinned -- python experiments/ch09_sink_weights.py
    python tools/kernel_path.py alternate -- python experiments/ch09_sink_weights.py

The table is in experiments/ch09_streaming.md (section "Weight on token 0").
"""

from __future__ import annotations

import os

import torch

from ch09_moe_balancing import T_TRAIN, backcopy_data
from ch09_streaming import SHAPE
from companion.attention import causal_mask
from companion.data.loaders import SequenceData
from companion.mha import MultiHeadAttention
from companion.models import from_preset
from companion.training.trainer import TrainConfig, Trainer


def weights(model, seqs):
    """(B, L, h, T, T[+1]) attention weights, the sink's share as a last column when there is one."""
    recorded = []

    def hook(layer, args, kwargs, out):
        x, positions = args[0], args[1]
        q, k, _ = layer.project_qkv(x)
        cos, sin = layer.rope.cos_sin(positions)
        q, k = layer.rope.rotate(q, cos, sin), layer.rope.rotate(k, cos, sin)
        scores = q @ k.transpose(-1, -2) * layer.head_dim ** -0.5
        scores = scores.masked_fill(~causal_mask(x.shape[1]), float("-inf"))
        if layer.sinks is not None:
            scores = torch.cat([scores, layer.sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], -1)
        recorded.append(scores.softmax(-1))

    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    hooks = [m.register_forward_hook(hook, with_kwargs=True) for m in layers]
    with torch.no_grad():
        model(seqs[:, :-1])
    for h in hooks:
        h.remove()
    return torch.stack(recorded, 1)


def measure(seed, train, val, sinks):
    data = SequenceData(train.tolist(), None, batch_size=16, validation=(val.tolist(), None))
    run = TrainConfig(steps=500, lr=1e-2, warmup=30, weight_decay=0.0, eval_every=0, log_every=50,
                      device="cpu", precision="fp32", progress=False, seed=seed)
    torch.manual_seed(seed)
    model = from_preset("llama-like", **SHAPE, sinks=sinks)
    Trainer(model, data, run).fit()
    w = weights(model.eval(), val)[..., 16:T_TRAIN, :]
    return w[..., 0].mean(dim=(0, 3)).max().item(), w[..., -1].mean(dim=(0, 3)).max().item()


def main(seeds=range(3)):
    torch.set_num_threads(1)
    path = os.environ.get("ATEN_CPU_CAPABILITY", "native")
    print(f"kernel path {path} (torch: {torch.backends.cpu.get_cpu_capability()}), seeds {list(seeds)}")
    train, val, _ = backcopy_data()
    for seed in seeds:
        plain, _ = measure(seed, train, val, sinks=False)
        with_sinks, on_sink = measure(seed, train, val, sinks=True)
        print(f"seed {seed}: largest weight on token 0: plain {plain:.3f}, learned sinks "
              f"{with_sinks:.3f}; largest weight on the sink logit {on_sink:.3f}", flush=True)


if __name__ == "__main__":
    main()
