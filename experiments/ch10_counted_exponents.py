"""The exponents chapter 10's counts give, for comparison with the measured decode-time exponents.

Chapter 10 fits log(time per decoded token) against log N. This script fits the same line to the
work counted for each step (``companion.accounting.flops_per_token``: the projections, the output
layer and the scores), so that the measured exponents can be compared with what the arithmetic
alone would give at the same sizes:

- without a cache, the step at context N is a forward over N + 1 tokens: (N + 1) times the
  per-token matmul work, plus the dense score grid, (N + 1)^2 query-key pairs;
- with a cache, it is one row: ``flops_per_token(config, N + 1)``.

Both model sizes of the chapter's timing cell: the quick profile (d 64, 2 layers, N = 64..1024) and
the gpu profile (d 512, 8 layers, N = 256..4096). No timer, so the result is the same on every machine:

    .venv/bin/python experiments/ch10_counted_exponents.py
"""

import numpy as np

from companion.accounting import flops_per_token
from companion.models import from_preset

SIZES = {"quick": (64, 2, [64, 128, 256, 512, 1024]),
         "gpu": (512, 8, [256, 512, 1024, 2048, 4096])}


def counted_exponents(d_model: int, n_layers: int, contexts: list[int]) -> tuple[float, float]:
    """Log-log slopes (no cache, cache) of the counted FLOPs of one decode step against N."""
    config = from_preset("llama-like", d_model=d_model, n_layers=n_layers,
                         max_seq_len=contexts[-1] + 16).config
    matmuls = flops_per_token(config, 0)                    # per token, without the scores
    per_pair = flops_per_token(config, 1) - matmuls         # one query-key pair, all layers
    without = [(N + 1) * matmuls + (N + 1) ** 2 * per_pair for N in contexts]
    cached = [flops_per_token(config, N + 1) for N in contexts]
    fit = lambda y: float(np.polyfit(np.log(contexts), np.log(y), 1)[0])
    return fit(without), fit(cached)


if __name__ == "__main__":
    for profile, (d, layers, contexts) in SIZES.items():
        no_cache, cache = counted_exponents(d, layers, contexts)
        print(f"{profile:5} (d {d}, {layers} layers, N {contexts[0]}..{contexts[-1]}): "
              f"counted exponents no cache {no_cache:.2f}, cache {cache:.2f}")
