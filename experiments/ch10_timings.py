"""Chapter 10's two timing-dependent outputs, repeated to record their spread.

1. The fitted log-log exponents of the decode-step time against the context N, without and with a
   cache (the chapter's quick profile: llama-like, d 64, 2 layers, N = 64..1024, best of 15
   interleaved rounds).
2. The batch at which a decode step of Llama 3 8B's shape (fp32 weights, 1024 tokens of context)
   reaches this CPU's ridge point, from the two probes (matmul n = 256, copy of 32 MiB).

The chapter's stored run is one sample of each; this script repeats both for three seeds:

    OMP_NUM_THREADS=1 .venv/bin/python tools/kernel_path.py pinned -- .venv/bin/python experiments/ch10_timings.py
"""

import time

import numpy as np
import torch

from companion.accounting import (decode_step_bytes, decode_step_flops, measure_bandwidth,
                                  measure_matmul_flops, published_config)
from companion.models import from_preset


def exponents(seed: int) -> tuple[float, float]:
    """Fitted exponents (no cache, cache) of the per-token time against N."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = from_preset("llama-like", d_model=64, n_layers=2, max_seq_len=1100).eval()
    contexts = [64, 128, 256, 512, 1024]
    ids = torch.randint(0, 256, (1, contexts[-1] + 16), generator=gen)
    best = {(N, c): float("inf") for N in contexts for c in (False, True)}

    def timed(ids, cache=None):
        start = time.perf_counter()
        model(ids, cache)
        return time.perf_counter() - start

    with torch.inference_mode():
        caches = {N: model.new_cache() for N in contexts}
        for N in contexts:
            model(ids[:, :N], caches[N])
        for r in range(15):
            for N in contexts:
                best[N, False] = min(best[N, False], timed(ids[:, : N + 1]))
                best[N, True] = min(best[N, True], timed(ids[:, N + r : N + r + 1], caches[N]))
    fit = [np.polyfit(np.log(contexts), np.log([best[N, c] for N in contexts]), 1)[0]
           for c in (False, True)]
    return fit[0], fit[1]


def ridge_batch() -> tuple[float, int | None]:
    """(this CPU's ridge point, the first batch in 1..256 whose decode intensity reaches it)."""
    peak = measure_matmul_flops(torch.device("cpu"), torch.float32, n=256, repeats=10)
    bandwidth = measure_bandwidth(torch.device("cpu"), nbytes=1 << 25)
    llama3 = published_config("llama3-8b")
    for B in [1, 2, 4, 8, 16, 32, 64, 128, 256]:
        lengths = [1024] * B
        i = decode_step_flops(llama3, lengths) / decode_step_bytes(llama3, lengths, param_bytes=4)["total"]
        if i >= peak / bandwidth:
            return peak / bandwidth, B
    return peak / bandwidth, None


def main() -> None:
    """One table row per seed, in the format experiments/ch10_timings.md records."""
    torch.set_num_threads(1)
    columns = ["seed", "exponent, no cache", "exponent, cache", "ridge (FLOP/byte)", "batch at the ridge"]
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    print("| " + " | ".join(columns) + " |\n|" + "---:|" * len(columns))
    for seed in (0, 1, 2):
        cells = [seed, *exponents(seed), *ridge_batch()]
        text = [f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells]
        print("| " + " | ".join(text) + " |", flush=True)


if __name__ == "__main__":
    main()
