"""Chapter 11: is torch's fused CPU attention (SDPA) faster than the book's tiled_attention, and by how much?

The chapter's timing cell, repeated: T = 1024, 4 heads of width 64, causal, forward only, one thread;
the two calls alternate seven times and each keeps its fastest run (the one the machine's load touched
least), and the ratio SDPA / tiled is printed. Each repeat draws new inputs (seed 0, 1, 2, ...).
Run it on each kernel path (issue 22):

    python tools/kernel_path.py pinned -- python experiments/ch11_sdpa_vs_tiled.py
    python tools/kernel_path.py alternate -- python experiments/ch11_sdpa_vs_tiled.py
    python experiments/ch11_sdpa_vs_tiled.py            # native path

The tables it printed are in experiments/ch11_sdpa_vs_tiled.md; the chapter asserts only ratio < 1.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from companion.kernels.flash import tiled_attention


def ratio(seed: int, T: int = 1024, heads: int = 4, d: int = 64, block: int = 128, reps: int = 7):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, T, d, generator=gen) for _ in range(3))
    tiled, sdpa = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        tiled_attention(q, k, v, causal=True, block_q=block, block_k=block)
        t1 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        tiled.append(t1 - t0)
        sdpa.append(time.perf_counter() - t1)
    return min(tiled), min(sdpa)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = os.environ.get("ATEN_CPU_CAPABILITY", "native")
    print(f"kernel path: ATEN_CPU_CAPABILITY={path}, MKL_CBWR={os.environ.get('MKL_CBWR', '-')}")
    print("| seed | tiled (ms) | SDPA (ms) | SDPA / tiled |")
    print("|--:|--:|--:|--:|")
    ratios = []
    for seed in range(args.repeats):
        t, s = ratio(seed)
        ratios.append(s / t)
        print(f"| {seed} | {t * 1e3:.1f} | {s * 1e3:.1f} | {s / t:.2f} |")
    print(f"range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
