"""Chapter 9, MoE load balancing: how uneven does a small router's load get, with and without balancing?

Trains the chapter's one-layer mixture (mixtral-like preset, width 32, 4 heads) on the chapter's
Bigram-Backcopy data for each balancing method and seed, and prints the load imbalance (busiest expert's
assignments over the mean) and the share of the least used experts, measured on the 64 x 64 held-out
tokens, the mean gate of the chosen expert there, and how far training moved the router
(||W_r - W_r(0)|| / ||W_r(0)||), then the mean and spread over seeds.

Gating (--gating): "switch" (the default, the chapter's setting) multiplies the chosen expert's output by
its unnormalised probability p_e (Switch Transformer, norm_topk_prob=False), which is how the
language-model loss reaches a top-1 router; "renormalised" divides the chosen gates by their sum, which
for top 1 makes every gate p/p = 1 and leaves the router without gradient (the chapter's first version,
issue 37). Run it on each kernel path (issue 22):

    python tools/kernel_path.py pinned -- python experiments/ch09_moe_balancing.py
    python tools/kernel_path.py alternate -- python experiments/ch09_moe_balancing.py
    python experiments/ch09_moe_balancing.py            # native path

The table it prints for the chapter's setting is in experiments/ch09_moe_balancing.md; the chapter's
asserts take their margins from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from companion.data.loaders import SequenceData
from companion.models import from_preset
from companion.moe import load_imbalance
from companion.training.trainer import TrainConfig, Trainer

V, N_TRIGGERS, BOS, T_TRAIN = 16, 4, 16, 64
METHODS = {"none": dict(aux_loss_coef=0.0),
           "auxiliary loss": dict(aux_loss_coef=0.05),
           "bias balancing": dict(aux_loss_coef=0.0, bias_balancing=True),
           "bias gamma 1e-2": dict(aux_loss_coef=0.0, bias_balancing=True, gamma=1e-2)}


def backcopy_data():
    """The chapter's training, held-out and stream sequences: the same seeds, the same order of draws."""
    torch.manual_seed(0)
    bigram = torch.distributions.Dirichlet(torch.full((V,), 0.2)).sample((V,))
    gen = torch.Generator().manual_seed(0)

    def sequences(n, T):
        x = torch.empty(n, T, dtype=torch.long)
        x[:, 0], x[:, 1] = BOS, torch.randint(0, V, (n,), generator=gen)
        for t in range(2, T):
            follow = torch.multinomial(bigram[x[:, t - 1]], 1, generator=gen).squeeze(1)
            copy = (x[:, t - 1] < N_TRIGGERS) & (t >= 3)
            x[:, t] = torch.where(copy, x[:, t - 2], follow)
        return x

    train, val = sequences(4000, T_TRAIN + 1), sequences(64, T_TRAIN + 1)
    stream = sequences(16, 4 * T_TRAIN + 1)           # the chapter's streams, drawn next
    return train, val, stream


def run(method, seed, train, val, experts, top_k, steps, lr, gating="switch"):
    data = SequenceData(train.tolist(), None, batch_size=16, validation=(val.tolist(), None))
    config = TrainConfig(steps=steps, lr=lr, warmup=20, weight_decay=0.0, log_every=50,
                         device="cpu", precision="fp32", progress=False, seed=seed)
    options = dict(METHODS[method])
    gamma = options.pop("gamma", 1e-3)
    torch.manual_seed(seed)
    model = from_preset("mixtral-like", vocab_size=V + 1, d_model=32, n_layers=1, n_heads=4,
                        moe_d_ff=32, n_experts=experts, top_k=top_k,
                        norm_topk_prob=gating == "renormalised", **options)
    ffn = model.layers[0].ffn
    ffn.bias_update_rate = gamma                       # DeepSeek-V3's gamma (1e-3 by default)
    router0 = ffn.router.weight.detach().clone()
    with torch.no_grad():
        model.eval()
        model(val[:, :-1])
        model.train()
    start_load = model.expert_load()[0]                # the untrained router's load
    untrained = (float(load_imbalance(start_load)), float(start_load.min() / start_load.sum()))
    val_loss = Trainer(model, data, config).fit().last("val_loss")
    model.eval()
    hidden = {}                                        # the MoE layer's input tokens
    handle = ffn.register_forward_hook(lambda m, a, o: hidden.setdefault("x", a[0]))
    with torch.no_grad():
        model(val[:, :-1])
        _, gates, _ = ffn.route(hidden["x"].reshape(-1, ffn.d))
    handle.remove()
    load = model.expert_load()[0]
    share = load / load.sum()
    moved = float((ffn.router.weight.detach() - router0).norm() / router0.norm())
    return (float(load_imbalance(load)), float(share.min()), val_loss,
            float(gates.sum(-1).mean()), moved) + untrained


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--gating", choices=("switch", "renormalised"), default="switch")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = os.environ.get("ATEN_CPU_CAPABILITY", "native")
    print(f"kernel path: ATEN_CPU_CAPABILITY={path}, torch capability "
          f"{torch.backends.cpu.get_cpu_capability()}; E={args.experts}, k={args.top_k}, "
          f"{args.steps} steps, lr {args.lr:g}, {args.gating} gates")
    train, val, _ = backcopy_data()
    methods = args.methods.split(",")
    rows = {}
    for method in methods:
        for seed in range(args.seeds):
            start = time.time()
            rows[method, seed] = run(method, seed, train, val, args.experts, args.top_k,
                                     args.steps, args.lr, args.gating)
            imb, low, loss, gate, moved, start_imb, start_low = rows[method, seed]
            print(f"{method:16s} seed {seed}: imbalance {imb:.2f} (untrained {start_imb:.2f}), "
                  f"least share {low:.3f} ({start_low:.3f}), val loss {loss:.3f}, "
                  f"mean gate {gate:.3f}, "
                  f"router moved {moved:.0%} "
                  f"({time.time() - start:.0f} s)", flush=True)
    print("method          imbalance mean (min..max)   least share mean   val loss mean")
    for method in methods:
        imb = [rows[method, s][0] for s in range(args.seeds)]
        low = [rows[method, s][1] for s in range(args.seeds)]
        loss = [rows[method, s][2] for s in range(args.seeds)]
        print(f"{method:16s} {statistics.mean(imb):5.2f} ({min(imb):.2f}..{max(imb):.2f})"
              f"        {statistics.mean(low):.3f}            {statistics.mean(loss):.3f}")


if __name__ == "__main__":
    main()
