"""Chapter 12's throughput cells, repeated: one request at a time against the engine, 16 requests.

Runs the chapter's cells as they stand (same model, same requests, best of three), prints the batched
pass's cost in single passes and the tokens/s ratio. Usage, on the chapter's kernel paths:
    OMP_NUM_THREADS=1 .venv/bin/python tools/kernel_path.py pinned -- .venv/bin/python experiments/ch12_pass_cost.py
The record is experiments/ch12_pass_cost.md.
"""

import random
import time

from companion.engine import Engine
from companion.inference.generate import SamplingParams, generate
from companion.models import from_preset


def measure() -> tuple[float, float]:
    """(a batched pass / a single pass, tokens/s engine / alone), as the chapter computes them."""
    model = from_preset("llama-like").eval()
    rng = random.Random(3)
    reqs = [[rng.randrange(256) for _ in range(rng.randint(8, 32))] for _ in range(16)]
    news = [rng.randint(4, 32) for _ in reqs]
    params = [SamplingParams(max_new_tokens=n) for n in news]
    seq_s, eng_s = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        for prompt, sp in zip(reqs, params):
            generate(model, prompt, sp, cache="contiguous")
        seq_s.append(time.perf_counter() - t0)
        engine = Engine(model, page_size=16, max_batch_tokens=1024, max_seqs=16)
        t0 = time.perf_counter()
        engine.generate(reqs, params)
        eng_s.append(time.perf_counter() - t0)
    seq, eng = min(seq_s), min(eng_s)
    return (eng / engine.steps) / (seq / sum(news)), seq / eng


if __name__ == "__main__":
    cost, speedup = measure()
    print(f"a batched pass costs {cost:.1f} single ones; tokens/s {speedup:.1f} times")
