"""What does the configurable design cost? Training throughput of the companion GPT on the CPU.

    .venv/bin/python benchmarks/model_overhead.py                 # d=256, 4 layers, context 256: ~2 min on 2 cores
    .venv/bin/python benchmarks/model_overhead.py --reps 30 --threads 1
    .venv/bin/python benchmarks/model_overhead.py --family llama --threads 1    # the llama-like Decoder vs LlamaForCausalLM
    .venv/bin/python benchmarks/model_overhead.py --decode 128,512,1024 --threads 1   # KV cache vs recompute

Three models of the same shape compute the same function (checked before timing: equal logits with
the same weights):
- companion: ``companion.models.from_preset("gpt2-tiny", ...)``, the book's GPT: the shared
  ``Block`` / ``MultiHeadAttention`` (cache contract, masks, backend switch) / ``MLP`` modules and
  the written-out ``LayerNorm``.
- plain: ``PlainGPT`` below, the same GPT-2 written as directly as possible for exactly this shape
  (``nn.LayerNorm``, one fused qkv ``nn.Linear``, ``F.scaled_dot_product_attention(is_causal=True)``,
  no options, no validation, no cache).
- companion+nnLN (diagnostic): the same companion model object graph with its written-out
  ``companion.norms.LayerNorm`` modules replaced by ``torch.nn.LayerNorm`` with the same weights;
  it separates the cost of the written-out norm (a teaching choice) from that of the configurable
  structure (``--no-diagnostic`` drops it).
- transformers: ``GPT2LMHeadModel`` with the companion's weights (``companion.hf.to_hf``), with its
  "sdpa" attention (its fastest CPU path).

``--family llama`` compares the llama-like ``Decoder`` (RMSNorm, RoPE, GQA with 2 key/value heads,
SwiGLU, untied head) with transformers' ``LlamaForCausalLM`` (sdpa attention) holding the same weights,
with no diagnostic row: its GQA attention already reads the g key/value heads in place
(``companion.kernels.attend`` passes ``enable_gqa=True`` to SDPA, as transformers does).

One step = forward + cross-entropy + backward on a (B, T) batch (no optimizer: it is the same for all
three); ``--forward`` times the forward alone (no_grad).

``--decode N1,N2,...`` measures instead what a KV-cache decode step costs beyond the model's own
one-row forward (issue 28, item 1), on the llama-like model of ``serving.py decode`` (d = 256, 4 layers,
4 heads, 2 key/value heads): generating N tokens from a 1-token prompt with ``generate``'s cache
("contiguous"), every step timed, against recomputing the prefix each step. So that a shared
machine's slow moments fall on both alike, the two are interleaved step by step in one process: the
cached generation advances one step, and at the middle step t of every block of ``--block`` steps the
no-cache forward of the t-token prefix (what ``generate(cache="none")`` runs at that step) is timed and
counts for its whole block (the midpoint rule; the recompute total is estimated, not run in full,
which would take hours at N = 1024 on a loaded 2-core machine). All models run in this one process with the same thread count; after warm-up steps, each
repetition times one step of every model in a rotating order (so a slow moment of the machine falls
on every model alike), and the report gives the median tokens/s of each model and the ratios of the
medians. The goal stated in the book: companion >= 0.95 x plain, and companion >= transformers.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from companion.models import GPT, from_preset  # noqa: E402
from companion.norms import LayerNorm  # noqa: E402


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_out = nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(B, T, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    """GPT-2 (pre-LN, learned positions, tanh GELU, tied head) for one fixed shape, nothing else."""

    def __init__(self, vocab: int, ctx: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(PlainBlock(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()

    @torch.no_grad()
    def load_from_companion(self, model: GPT) -> None:
        self.wte.weight.copy_(model.wte.weight)
        self.wpe.weight.copy_(model.wpe.weight)
        for mine, theirs in zip(self.blocks, model.blocks):
            pairs = [
                (mine.ln_1, theirs.attn_norm), (mine.ln_2, theirs.ffn_norm), (mine.qkv, theirs.attn.qkv),
                (mine.proj, theirs.attn.out), (mine.fc, theirs.ffn.up), (mine.fc_out, theirs.ffn.down),
            ]
            for a, b in pairs:
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
        self.ln_f.weight.copy_(model.ln_f.weight)
        self.ln_f.bias.copy_(model.ln_f.bias)


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), or platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def with_torch_layernorm(model: GPT) -> GPT:
    """A second companion GPT sharing ``model``'s parameters, its LayerNorms swapped for nn.LayerNorm."""
    twin = GPT(model.config)
    twin.load_state_dict(model.state_dict())
    for module in list(twin.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LayerNorm):
                fused = nn.LayerNorm(child.weight.shape[0], eps=child.eps)
                fused.weight, fused.bias = child.weight, child.bias
                setattr(module, child_name, fused)
    return twin


def logits_of(name: str, model: nn.Module, idx: Tensor) -> Tensor:
    return model(idx).logits if name == "transformers" else model(idx)


def step(name: str, model: nn.Module, idx: Tensor, targets: Tensor, forward_only: bool = False) -> float:
    for p in model.parameters():
        p.grad = None
    t0 = time.perf_counter()
    if forward_only:
        with torch.no_grad():
            logits_of(name, model, idx)
        return time.perf_counter() - t0
    loss = F.cross_entropy(logits_of(name, model, idx).flatten(0, 1), targets.flatten())
    loss.backward()
    return time.perf_counter() - t0


def decode_cost(lengths: list[int], block: int) -> None:
    """``--decode``: recompute / cache at each N, the two interleaved step by step (see the docstring)."""
    from companion.inference.generate import SamplingParams, stream

    torch.manual_seed(0)
    model = from_preset("llama-like", d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=max(lengths) + 1).eval()
    for _ in stream(model, [1], SamplingParams(max_new_tokens=8)):  # warm-up
        pass
    print(f"{platform.machine()} {platform.system()}, {cpu_model()}, torch {torch.__version__} (CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} thread(s); llama-like d=256, 4 layers, "
          f"1-token prompt, greedy; recompute sampled every {block} steps\n")
    print("| N | recompute (s, estimated) | cache (s) | recompute / cache | cached step (ms) | load average |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        steps = stream(model, [1], SamplingParams(max_new_tokens=n))
        seq, cached, recompute = [1], 0.0, 0.0
        with torch.no_grad():
            for step_no in range(1, n + 1):
                t0 = time.perf_counter()
                events = next(steps)
                cached += time.perf_counter() - t0
                if step_no % block == block // 2:  # the prefix this step reads without a cache
                    t0 = time.perf_counter()
                    int(model(torch.tensor(seq)[None])[0, -1].argmax())
                    recompute += (time.perf_counter() - t0) * block
                seq += [tok for _, tok in events]
        for _ in steps:
            pass
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"| {n} | {recompute:.2f} | {cached:.2f} | **{recompute / cached:.1f}x** | {1e3 * cached / n:.2f} | {load:.1f} |")


def llama_models(args) -> dict[str, nn.Module]:
    """The llama-like Decoder and LlamaForCausalLM holding its weights."""
    companion = from_preset("llama-like", vocab_size=args.vocab, max_seq_len=args.ctx, n_layers=args.layers,
                            n_heads=args.heads, n_kv_heads=max(1, args.heads // 2), d_model=args.d)
    models: dict[str, nn.Module] = {"companion": companion}
    if not args.no_hf:
        from companion.hf import to_hf

        models["transformers"] = to_hf(companion, attn_implementation="sdpa")
    return models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256, help="context length = T of every batch")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--family", choices=("gpt", "llama"), default="gpt",
                    help="gpt: GPT-2 against PlainGPT and GPT2LMHeadModel; llama: the llama-like Decoder against LlamaForCausalLM")
    ap.add_argument("--forward", action="store_true", help="time the forward alone (no_grad), not forward + backward")
    ap.add_argument("--no-diagnostic", action="store_true", help="skip the diagnostic row companion+nnLN (--family gpt)")
    ap.add_argument("--decode", default=None, metavar="N1,N2,...",
                    help="instead: decode with the KV cache against recomputing, at these lengths (see the docstring)")
    ap.add_argument("--block", type=int, default=8, help="--decode: time the recompute once per this many steps")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers (e.g. when the hf extra is absent)")
    args = ap.parse_args()
    for f in ("d", "layers", "heads", "ctx", "vocab", "batch", "reps", "threads"):
        if getattr(args, f) < 1:
            ap.error(f"--{f} must be >= 1")
    if args.d % args.heads:
        ap.error(f"--d ({args.d}) must be divisible by --heads ({args.heads})")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.decode is not None:
        lengths = [int(n) for n in args.decode.split(",")]
        if args.block < 1 or any(n < args.block for n in lengths):
            ap.error("--block must be >= 1 and at most every --decode length")
        decode_cost(lengths, args.block)
        return

    if args.family == "llama":
        models = llama_models(args)
    else:
        companion = from_preset("gpt2-tiny", vocab_size=args.vocab, block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
        plain = PlainGPT(args.vocab, args.ctx, args.d, args.layers, args.heads)
        plain.load_from_companion(companion)
        models = {"companion": companion, "plain": plain}
        if not args.no_diagnostic:
            models["companion+nnLN"] = with_torch_layernorm(companion)
        if not args.no_hf:
            from companion.hf import to_hf

            models["transformers"] = to_hf(companion, attn_implementation="sdpa")
    companion = models["companion"]
    counts = {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"parameter counts differ: {counts}")

    idx = torch.randint(0, args.vocab, (args.batch, args.ctx))
    targets = torch.randint(0, args.vocab, (args.batch, args.ctx))
    with torch.no_grad():  # same function, so the timings compare like with like
        ref = companion.eval()(idx)
        for n, m in models.items():
            err = (logits_of(n, m.eval(), idx) - ref).abs().max().item()
            if err > 1e-4:
                raise SystemExit(f"{n} does not compute the companion's logits (max diff {err:.2e})")
    for m in models.values():
        m.train()  # dropout is 0 everywhere; train mode as in training

    names = list(models)
    for _ in range(args.warmup):
        for n in names:
            step(n, models[n], idx, targets, args.forward)
    times: dict[str, list[float]] = {n: [] for n in names}
    t_start = time.perf_counter()
    for r in range(args.reps):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for n in order:
            times[n].append(step(n, models[n], idx, targets, args.forward))
    total = time.perf_counter() - t_start

    tokens = args.batch * args.ctx
    tps = {n: [tokens / t for t in ts] for n, ts in times.items()}
    med = {n: statistics.median(v) for n, v in tps.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Measured {datetime.date.today()} on {platform.machine()} {platform.system()}, {cpu_model()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} (CPU capability {torch.backends.cpu.get_cpu_capability()}), {args.threads} threads"
        + (f", transformers {sys.modules['transformers'].__version__}" if "transformers" in sys.modules else "")
        + f"; {args.reps} interleaved repetitions after {args.warmup} warm-up, {total:.0f} s; load average at the end {load:.1f}."
    )
    print(
        f"Shape: d={args.d}, {args.layers} layers, {args.heads} heads, context {args.ctx}, vocab {args.vocab}, batch {args.batch} "
        f"({tokens} tokens per step), {counts['companion']:,} parameters, float32, "
        f"{'forward only' if args.forward else 'forward + backward'}, {args.family}.\n"
    )
    print("| model | median tokens/s | min | max | median step (ms) | companion / model |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in names:
        print(
            f"| {n} | {med[n]:,.0f} | {min(tps[n]):,.0f} | {max(tps[n]):,.0f} | {1000 * statistics.median(times[n]):.1f} | "
            f"{med['companion'] / med[n]:.3f} |"
        )
    print()
    paired = {n: statistics.median(c / x for c, x in zip(times[n], times["companion"])) for n in names}
    print("Paired (per repetition) speed ratios, medians: "
          + ", ".join(f"companion / {n} {paired[n]:.3f}" for n in names if n != "companion") + ".")
    if "plain" in med:
        goal_plain = med["companion"] / med["plain"]
        print(f"companion / plain = {goal_plain:.3f} (goal >= 0.95: {'met' if goal_plain >= 0.95 else 'NOT met'})")
    if "transformers" in med:
        goal_hf = med["companion"] / med["transformers"]
        print(f"companion / transformers = {goal_hf:.3f} (goal >= 1.00: {'met' if goal_hf >= 1.0 else 'NOT met'})")


if __name__ == "__main__":
    main()
