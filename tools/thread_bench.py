"""How many torch threads should a chapter use on a small, shared CPU? Measure it.

    python tools/thread_bench.py               # 1 and 2 threads, alone and beside a busy process
    python tools/thread_bench.py --steps 40

One training step (forward, backward, Adam) of the chapter 3 quick-profile translator (a post-LN
encoder-decoder, d = 128, 4 heads, d_ff = 256, 2 + 2 layers, 3,000-word vocabularies, 32 pairs of
20-word sentences) is timed with 1 and with 2 torch threads, first with the machine otherwise idle
(as far as this script controls it), then while a second process keeps one core busy (a stand-in for
a second notebook, a test worker or another user). It also trains the same model for a few steps
from the same seed with 1 and with 2 threads and prints how far apart the losses end up: a float
reduction split over a different number of threads adds in a different order and rounds differently.

Prints a markdown table (median milliseconds per step) and the loss difference; CONTRIBUTING.md,
"Threads and determinism", records a run. The load average is printed too: other work on the
machine shifts every number.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch

from companion.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer


def _spin(stop) -> None:
    """Keep one core busy until told to stop."""
    torch.set_num_threads(1)
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _model_and_batch(seed: int = 0):
    torch.manual_seed(seed)
    config = Seq2SeqConfig(src_vocab_size=3000, tgt_vocab_size=3000, d_model=128, n_heads=4, d_ff=256,
                           n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.0,
                           share_embeddings=False)
    model = Seq2SeqTransformer(config)
    gen = torch.Generator().manual_seed(seed + 1)
    src = torch.randint(4, 3000, (32, 20), generator=gen)
    tgt = torch.randint(4, 3000, (32, 21), generator=gen)
    return model, src, tgt


def _step(model, optimizer, src, tgt) -> float:
    logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_ms(threads: int, steps: int) -> float:
    """Median wall-clock milliseconds of one training step with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    model, src, tgt = _model_and_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):  # warm-up: allocator, first-call dispatch
        _step(model, optimizer, src, tgt)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _step(model, optimizer, src, tgt)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def losses(threads: int, steps: int) -> list[float]:
    torch.set_num_threads(threads)
    model, src, tgt = _model_and_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return [_step(model, optimizer, src, tgt) for _ in range(steps)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    ap.add_argument("--train-steps", type=int, default=30, help="steps of the 1- vs 2-thread loss comparison")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.train_steps < 1:
        raise ValueError("--steps and --train-steps must be >= 1")
    print(f"cores: {os.cpu_count()}, torch {torch.__version__}, load average before: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rows = {}
    for threads in (1, 2):
        rows[(threads, "alone")] = step_ms(threads, args.steps)
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        time.sleep(0.5)
        for threads in (1, 2):
            rows[(threads, "shared")] = step_ms(threads, args.steps)
    finally:
        stop.set()
        spinner.join(timeout=10)
    print("\n| torch threads | alone (ms/step) | one core busy elsewhere (ms/step) |")
    print("|---:|---:|---:|")
    for threads in (1, 2):
        print(f"| {threads} | {rows[(threads, 'alone')]:.0f} | {rows[(threads, 'shared')]:.0f} |")
    one, two = losses(1, args.train_steps), losses(2, args.train_steps)
    first = next((i for i, (a, b) in enumerate(zip(one, two)) if a != b), None)
    print(f"\nloss after {args.train_steps} steps: 1 thread {one[-1]!r}, 2 threads {two[-1]!r}; "
          f"largest difference {max(abs(a - b) for a, b in zip(one, two)):.3g}; "
          f"first differing step: {first if first is not None else 'none'}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
