"""Training throughput and model FLOPs utilisation of a 124M-parameter GPT on one CUDA GPU.

One script, one run: build GPT-2 small (``from_preset("gpt2")``, context 1024), train it on random
token windows with the companion's ``Trainer`` in each requested configuration (bf16 autocast, SDPA
attention, with and without ``torch.compile``), and print tokens/s and MFU = achieved model FLOP/s
divided by the device's peak dense bf16 rate (``companion.accounting.GPU_PEAKS``). The goal in the
book's issue tracker is MFU >= 40% with compile.

    python benchmarks/train_gpu.py                      # a few minutes on an H100-class GPU
    python benchmarks/train_gpu.py --steps 30 --batch 8 --no-compile

Random tokens are enough: throughput does not depend on what the tokens say. On a machine without
CUDA the script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from companion.models import from_preset
from companion.data.loaders import LMData
from companion.training.trainer import Trainer, TrainConfig
from companion.accounting import peak_flops, training_flops_per_token


def run(compile_model: bool, steps: int, batch: int, context: int, warmup_steps: int) -> dict:
    torch.manual_seed(0)
    model = from_preset("gpt2", block_size=context)
    tokens = torch.randint(0, model.config.vocab_size, (batch * (context + 1) * 64,))
    data = LMData(tokens, None, batch_size=batch, context=context)
    config = TrainConfig(steps=warmup_steps + steps, lr=6e-4, schedule="constant", precision="auto",
                         compile=compile_model, log_every=1, progress=False, eval_every=0, device="cuda")
    trainer = Trainer(model, data, config)
    trainer.fit(warmup_steps)                      # compilation and allocator warm-up, not timed
    torch.cuda.synchronize()
    start = time.perf_counter()
    history = trainer.fit(warmup_steps + steps)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = steps * batch * context / seconds
    flops = training_flops_per_token(model, context)
    peak = peak_flops(torch.device("cuda"))
    step_rates = [r["tokens_per_s"] for r in history.records if "tokens_per_s" in r][-steps:]
    return {
        "compile": compile_model,
        "tokens_per_s": tokens_per_s,
        "median_step_tokens_per_s": statistics.median(step_rates) if step_rates else float("nan"),
        "mfu": tokens_per_s * flops / peak if peak and flops else None,
        "params": model.num_parameters(),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="timed optimizer steps per configuration")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation happens here)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--context", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--no-compile", action="store_true", help="measure only the eager model")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("train_gpu.py measures a CUDA GPU; none is available here.", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}; peak bf16 {peak_flops(torch.device('cuda')) or float('nan'):.3g} FLOP/s")
    print("| compile | params | tokens/s | median step tokens/s | MFU | peak memory (GiB) |")
    print("|:---:|---:|---:|---:|---:|---:|")
    for compile_model in ([False] if args.no_compile else [False, True]):
        r = run(compile_model, args.steps, args.batch, args.context, args.warmup)
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"| {compile_model} | {r['params']:,} | {r['tokens_per_s']:,.0f} | {r['median_step_tokens_per_s']:,.0f} | {mfu} | {r['peak_memory_gib']:.1f} |")
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
