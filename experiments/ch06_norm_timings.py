"""Chapter 6: LayerNorm against RMSNorm on one CPU thread, repeated.

The chapter's optional section times four norms on a batch of 4096 rows of width 512: torch's fused
kernels (``F.layer_norm``, ``F.rms_norm``, through ``companion.norms``) and the formulas written out
(``fused=False``), interleaved one call of each in turn for 15 rounds after a warm-up round, and prints
how long RMSNorm took relative to LayerNorm, fused and written out, from the fastest run of each. One run
is one draw of a shared machine's load; this script repeats the chapter's measurement ``REPEATS`` times
and prints each repetition's two ratios and the load average, so that the text can quote their range:

    OMP_NUM_THREADS=1 python tools/kernel_path.py pinned -- python experiments/ch06_norm_timings.py

The table it printed is in experiments/ch06_norm_timings.md.
"""
import os
import time

import torch

import companion
from companion.norms import LayerNorm, RMSNorm

REPEATS, ROUNDS = 10, 15


def fastest(fns):
    """The fastest of ROUNDS interleaved calls of each function (after one warm-up call each)."""
    def once(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for fn in fns.values():
        once(fn)
    runs = [[once(fn) for fn in fns.values()] for _ in range(ROUNDS)]
    return dict(zip(fns, map(min, zip(*runs))))


def main():
    companion.profile()
    rows = torch.randn(4096, 512)
    norms = {("layer", "fused"): LayerNorm(512), ("rms", "fused"): RMSNorm(512),
             ("layer", "written"): LayerNorm(512, fused=False), ("rms", "written"): RMSNorm(512, fused=False)}
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("| repetition | fused: RMSNorm / LayerNorm | written out: RMSNorm / LayerNorm | load average |")
    print("|---:|---:|---:|---:|")
    fused, written = [], []
    with torch.no_grad():
        for r in range(REPEATS):
            t = fastest({key: (lambda m=m: m(rows)) for key, m in norms.items()})
            fused.append(t["rms", "fused"] / t["layer", "fused"])
            written.append(t["rms", "written"] / t["layer", "written"])
            print(f"| {r} | {fused[-1]:.0%} | {written[-1]:.0%} | {os.getloadavg()[0]:.1f} |", flush=True)
    print(f"fused: {min(fused):.0%} to {max(fused):.0%}; written out: {min(written):.0%} to {max(written):.0%}")


if __name__ == "__main__":
    main()
