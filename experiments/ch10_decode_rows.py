"""Chapter 10's memory-bound check: a decode step with 8 rows against one with 1 row.

The chapter asserts step(B=8) < 6 step(B=1) for a llama-like model of 22.8M parameters (d 512, 8 layers)
after 128 tokens, best of 5 interleaved rounds (a compute-bound step would cost about 8x). This script
repeats the measurement for 3 seeds and prints the ratio, to set that margin from a measured spread:

    OMP_NUM_THREADS=1 .venv/bin/python tools/kernel_path.py pinned -- .venv/bin/python experiments/ch10_decode_rows.py
    OMP_NUM_THREADS=1 .venv/bin/python tools/kernel_path.py alternate -- .venv/bin/python experiments/ch10_decode_rows.py
"""

import time

import torch

from companion.models import from_preset


def ratio(seed: int) -> float:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    mb = from_preset("llama-like", d_model=512, n_layers=8, n_heads=8, n_kv_heads=2, max_seq_len=160).eval()
    ids = torch.randint(0, 256, (8, 136), generator=gen)
    best = {1: float("inf"), 8: float("inf")}
    with torch.inference_mode():
        caches = {B: mb.new_cache() for B in best}
        for B in best:
            mb(ids[:B, :128], caches[B])
        for r in range(5):
            for B in best:
                start = time.perf_counter()
                mb(ids[:B, 128 + r : 129 + r], caches[B])
                best[B] = min(best[B], time.perf_counter() - start)
    return best[8] / best[1]


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    print("| seed | step(B=8) / step(B=1) |")
    print("|---:|---:|")
    for seed in (0, 1, 2):
        print(f"| {seed} | {ratio(seed):.2f} |")
