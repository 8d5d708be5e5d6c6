"""Serving throughput measurement shared by ``python -m companion bench-serve`` and benchmarks/serving.py:
the same requests generated one after another (contiguous cache) and by the ``Engine`` at once."""

from __future__ import annotations

import random
import time

import torch
from torch import nn

from companion.inference.generate import SamplingParams, generate
from companion.engine.engine import Engine

__all__ = ["serve_benchmark"]


def serve_benchmark(
    model: nn.Module, n_requests: int = 16, new_tokens: int = 32, prompt_range: tuple[int, int] = (16, 64),
    page_size: int = 16, max_batch_tokens: int = 1024, seed: int = 0,
) -> dict:
    """Greedy generation of ``n_requests`` random prompts; returns timings, tokens/s and whether the
    engine's outputs equal the sequential ones."""
    for name, value in (("n_requests", n_requests), ("new_tokens", new_tokens), ("page_size", page_size),
                        ("max_batch_tokens", max_batch_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be >= 1 and an integer; got {value!r}")
    lo, hi = prompt_range
    if isinstance(lo, bool) or isinstance(hi, bool) or not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"prompt_range must be two integers 1 <= lo <= hi; got {prompt_range!r}")
    model.eval()
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n_requests)]
    params = SamplingParams(max_new_tokens=new_tokens)
    start = time.perf_counter()
    sequential = [generate(model, p, params, cache="contiguous").tokens[0] for p in prompts]
    t_seq = time.perf_counter() - start
    # the page pool is allocated at start-up, before the clock starts (as a server does)
    engine = Engine(model, page_size=page_size, max_batch_tokens=max_batch_tokens, max_seqs=n_requests)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    t_eng = time.perf_counter() - start
    total = sum(len(o.tokens) for o in outs)
    ttft = sorted(o.ttft_s for o in outs)
    return {
        "requests": n_requests, "generated_tokens": total, "sequential_s": t_seq, "engine_s": t_eng,
        "sequential_tok_s": total / t_seq, "engine_tok_s": total / t_eng, "speedup": t_seq / t_eng,
        "median_ttft_s": ttft[len(ttft) // 2], "identical": [o.tokens for o in outs] == sequential,
        "engine_steps": engine.steps, "threads": torch.get_num_threads(),
        "stopped_at_context": sum(o.finish_reason == "context" for o in outs),  # before new_tokens: context full
    }
