"""Serving on a CUDA GPU: check the engine, then time it against transformers and measure decode bandwidth.

    python benchmarks/serving_gpu.py                    # bf16, d=2048, 16 layers, 64 requests: ~3-5 minutes
    python benchmarks/serving_gpu.py --dtype float16 --reps 2 --no-compile
    python benchmarks/serving_gpu.py --device cpu --tiny   # the whole flow on a tiny model, a few seconds (smoke test)

One run does everything, in this order, and stops at the first failure (exit status 1):
1. correctness, on the device, in float32 and in ``--dtype``:
   a. the Engine's greedy outputs for a batch of requests == each request run alone (``generate()``,
      contiguous cache), and in float32 == transformers' generate() on the same weights. A divergence counts as a near-tie, not a failure, when at the first differing
      token the no-cache forward's top-two logits are within ``TIE_TOL[dtype]`` (batched and single
      matmuls may round differently); anything else fails;
   b. logits of the paged attention kernels over the same random trace (prefill chunks, decode steps,
      shared prefixes): "triton" (``companion.kernels.triton_paged``) and "flex" (flex_attention over the
      pool) against "gather": float32 within ``KERNEL_TOL``; lower precision about as close to a float32
      run as "gather" itself is (see ``check_kernels``);
2. timing: the Engine (eager, and ``compile=True`` unless --no-compile) against transformers'
   generate() on the same weights (``companion.hf.to_hf``, sdpa, greedy, left padding, one static
   batch), equal and mixed output lengths, as ``benchmarks/serving.py hf`` does on a CPU; medians of
   interleaved rounds after a warm-up round (whose time, for compile=True, is the compile time). In
   bf16/fp16 both stacks' logits are checked against a float32 copy instead of token identity;
3. decode bandwidth utilisation: bytes one decode step must read
   (``companion.accounting.decode_step_bytes``: weights once + the K/V of every sequence) over the
   measured step time (``serving.decode_step_times``: Engine.step() with every sequence decoding,
   synchronised), against the device's peak bandwidth (``companion.accounting.GPU_PEAKS``, by device name) and the
   device-to-device copy bandwidth measured in the same run.

Prints markdown tables ready to paste into benchmarks/README.md. Without CUDA (and no ``--device cpu``)
it exits with status 2 and a message.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from companion.accounting import peak_bandwidth  # noqa: E402  (the one table of GPU peaks)

TIE_TOL = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.1}  # top-2 logit gap below which a greedy flip is a near-tie
KERNEL_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}  # max |logit diff| / max |logit|


def _bail(msg: str) -> None:
    print(f"serving_gpu.py: {msg}", file=sys.stderr)
    sys.exit(2)


class Failed(Exception):
    pass


# 1. correctness ------------------------------------------------------------------------------------
def check_engine_vs_alone(model, n_requests: int, new: int, seed: int = 0) -> dict:
    """Engine (all requests at once) vs generate() per request; near-ties allowed, see the docstring."""
    import torch

    from companion.engine import Engine
    from companion.inference.generate import SamplingParams, generate

    rng = random.Random(seed)
    V = model.config.vocab_size
    prompts = [[rng.randrange(V) for _ in range(rng.randint(4, 40))] for _ in range(n_requests)]
    lens = [rng.randint(1, new) for _ in range(n_requests)]
    engine = Engine(model, page_size=8, max_batch_tokens=128, max_seqs=n_requests)  # 128: chunked prefill too
    outs = engine.generate(prompts, [SamplingParams(max_new_tokens=k) for k in lens])
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    same = ties = 0
    max_gap = 0.0
    for p, k, o in zip(prompts, lens, outs):
        alone = generate(model, p, cache="contiguous", max_new_tokens=k).tokens[0]
        if alone == o.tokens:
            same += 1
            continue
        j = next(i for i, (a, b) in enumerate(zip(alone, o.tokens)) if a != b)
        with torch.no_grad():
            logits = model(torch.tensor([p + alone[:j]], device=next(model.parameters()).device))[0, -1].float()
        top2 = logits.topk(2).values
        gap = (top2[0] - top2[1]).item()
        if gap > TIE_TOL[dtype]:
            raise Failed(f"engine vs alone ({dtype}): request {o.id} differs at token {j} ({o.tokens[j]} vs {alone[j]}), "
                         f"top-2 logit gap {gap:.3g} > {TIE_TOL[dtype]}")
        ties += 1
        max_gap = max(max_gap, gap)
    return {"identical": same, "near_ties": ties, "max_tie_gap": max_gap, "n": n_requests,
            "requests": list(zip(prompts, lens, [o.tokens for o in outs]))}


def check_engine_vs_transformers(model, requests) -> str:
    """Float32 only: the Engine's greedy tokens (``requests``: (prompt, n, tokens) from
    ``check_engine_vs_alone``) against transformers' generate() on the same weights, each request alone.
    A divergence is a failure unless it is a near-tie of the companion's own logits (``TIE_TOL``).
    Returns "k/n" identical. In bf16 or fp16 two correct stacks part at near-ties, so there the
    timing run judges logits against float32 instead (``serving.low_precision_logits``)."""
    import torch

    from companion.hf import to_hf

    device = next(model.parameters()).device
    hf = to_hf(model, attn_implementation="sdpa").to(device).eval()
    hf.generation_config.eos_token_id = None  # stop at the length only, as the engine's requests do
    same = 0
    for p, k, tokens in requests:
        with torch.no_grad():
            out = hf.generate(torch.tensor([p], device=device), max_new_tokens=k, do_sample=False,
                              pad_token_id=0, use_cache=True)
        theirs = out[0, len(p):].tolist()
        if theirs == tokens:
            same += 1
            continue
        j = next(i for i, (a, b) in enumerate(zip(theirs, tokens)) if a != b)
        with torch.no_grad():
            top2 = model(torch.tensor([p + tokens[:j]], device=device))[0, -1].float().topk(2).values
        gap = (top2[0] - top2[1]).item()
        if gap > TIE_TOL["float32"]:
            raise Failed(f"engine vs transformers (float32): tokens differ at {j} ({tokens[j]} vs {theirs[j]}), "
                         f"top-2 logit gap {gap:.3g} > {TIE_TOL['float32']}")
    return f"{same}/{len(requests)}"


def check_kernels(model, kernels, steps: int = 12, seed: int = 0) -> dict:
    """Per kernel: the largest |logits - logits("gather")| / max |logits| over a random paged trace
    (prefill chunks, decode rows, a shared system prompt). Float32: each must stay within
    ``KERNEL_TOL["float32"]``. Lower precision: the same trace also runs through a float32 copy of
    the model ("gather"); a kernel fails when its error against that float32 run exceeds twice the
    error of the low-precision "gather" run against it plus ``KERNEL_TOL[dtype]`` / 10 (i.e. the
    kernel must be about as accurate as the path it replaces). Returns the errors, with
    "gather_vs_fp32" for low precision."""
    import copy

    import torch

    from companion.inference.generate import packed_forward
    from companion.inference.paged import PagedKVCache

    rng = random.Random(seed)
    V = model.config.vocab_size
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    name = str(dtype).removeprefix("torch.")
    models = {k: model for k in ("gather", *kernels)}
    if dtype != torch.float32:
        models["fp32"] = copy.deepcopy(model).float()
    pools = {k: PagedKVCache(m, n_pages=96, page_size=4, dtype=next(m.parameters()).dtype, device=device,
                             attention_kernel="gather" if k == "fp32" else k) for k, m in models.items()}
    system = [rng.randrange(V) for _ in range(9)]
    live: list[dict] = []
    worst = {k: 0.0 for k in kernels}
    vs_ref = {k: 0.0 for k in ("gather", *kernels)}
    with torch.no_grad():
        for step in range(steps):
            if len(live) < 6 and (step < 3 or rng.random() < 0.3):
                toks = (system if rng.random() < 0.5 else []) + [rng.randrange(V) for _ in range(rng.randint(1, 20))]
                live.append({"tokens": toks, "caches": {k: pool.new_sequence(toks) for k, pool in pools.items()}})
            chunks = []
            for s in live:
                done = s["caches"]["gather"].length
                pending = s["tokens"][done:]
                chunk = pending[: rng.randint(1, 8)] if pending else [rng.randrange(V)]
                if not pending:
                    s["tokens"].append(chunk[0])  # decoding: a new (random) token
                chunks.append(chunk)
            logits = {k: packed_forward(models[k], [s["caches"][k] for s in live], chunks).float() for k in pools}
            scale = logits["gather"].abs().max().item()
            for k in kernels:
                err = (logits[k] - logits["gather"]).abs().max().item() / scale
                worst[k] = max(worst[k], err)
                if dtype == torch.float32 and err > KERNEL_TOL[name]:
                    raise Failed(f"kernel {k!r} vs 'gather' ({name}): relative logit error {err:.3g} > {KERNEL_TOL[name]} at step {step}")
            if dtype != torch.float32:
                for k in vs_ref:
                    vs_ref[k] = max(vs_ref[k], (logits[k] - logits["fp32"]).abs().max().item() / scale)
                for k in kernels:
                    bound = 2 * vs_ref["gather"] + KERNEL_TOL[name] / 10
                    if vs_ref[k] > bound:
                        raise Failed(f"kernel {k!r} ({name}): relative logit error against float32 {vs_ref[k]:.3g} > {bound:.3g} "
                                     f"(2 x the 'gather' path's {vs_ref['gather']:.3g} + {KERNEL_TOL[name] / 10}) at step {step}")
    if dtype != torch.float32:
        worst["gather_vs_fp32"] = vs_ref["gather"]
    return worst


# 2. engine vs transformers -------------------------------------------------------------------------
def compare_hf(model, n_requests: int, new: int, mixed_range, prompt_range, reps: int, compiled: bool, hf_compiled: bool) -> dict:
    """``serving.compare_with_transformers`` on the model's device and dtype: equal and mixed output lengths."""
    from serving import compare_with_transformers

    rng = random.Random(4)
    V = model.config.vocab_size
    prompts = [[rng.randrange(V) for _ in range(rng.randint(*prompt_range))] for _ in range(n_requests)]
    workloads = {"equal": [new] * n_requests, "mixed": [rng.randint(*mixed_range) for _ in range(n_requests)]}
    title = (f"{_device_name(next(model.parameters()).device)}, {n_requests} requests (prompts {prompt_range[0]}..{prompt_range[1]}), "
             f"llama-like d={model.config.d_model}, {model.config.n_layers} layers ({model.num_parameters() / 1e6:.0f}M parameters)")
    result = compare_with_transformers(model, prompts, workloads, reps, compiled, hf_compiled, title)
    print("Low-precision runs can differ from transformers at near-tied logits (identical column).")
    return result


# 3. decode bandwidth -------------------------------------------------------------------------------
def _device_name(dev) -> str:
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return platform.processor() or platform.machine() or "cpu"


def bandwidth_table(model, batches, prompt_len: int, steps: int, compiled: bool, bw_bytes: int) -> list[dict]:
    import torch

    from companion.accounting import decode_step_bytes
    from serving import decode_step_times, memory_bandwidth

    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    size = torch.finfo(dtype).bits // 8
    name = _device_name(dev)
    peak = peak_bandwidth(name) if dev.type == "cuda" else None
    bw = memory_bandwidth(dev, bw_bytes)
    print(f"\n### Decode bandwidth utilisation on {name}, {str(dtype).removeprefix('torch.')}: llama-like d={model.config.d_model}, "
          f"{model.config.n_layers} layers, prompts of {prompt_len}, median of {steps} decode steps\n")
    print(f"Peak bandwidth (data sheet): {f'{peak:.2f} TB/s' if peak else 'unknown for this device'}; measured in this run "
          f"({bw_bytes / 2**30:.2f} GiB float32): copy {bw['copy_GBs'] / 1e3:.2f} TB/s (read + write), read (sum) {bw['read_GBs'] / 1e3:.2f} TB/s.\n")
    print("| engine | batch | step ms | tokens/s | MB read per step (weights + KV) | achieved TB/s | % of peak | % of measured copy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    # one pool shape for every batch (the Engine's default for max(batches) sequences, as in compare_hf):
    # compiled engines then share their decode graphs instead of compiling once per batch size
    n_pages = max(batches) * -(-model.config.max_seq_len // 16)
    modes = [("eager", False)] + ([("compile=True", True)] if compiled else [])
    rows = []
    for label, comp in modes:
        for B in batches:
            try:
                r = decode_step_times(model, B, prompt_len=prompt_len, steps=steps, compile=comp, n_pages=n_pages)
            except Exception as e:
                if not comp:
                    raise
                print(f"| {label} | {B} | failed: {type(e).__name__}: {str(e)[:200]} | | | | | |")
                break
            i = r["times"].index(statistics.median_low(r["times"]))
            t, ctx = r["times"][i], r["contexts"][i]
            b = decode_step_bytes(model.config, ctx, param_bytes=size)
            tbs = b["total"] / t / 1e12
            rows.append({"engine": label, "batch": B, "step_s": t, "TBs": tbs})
            pk = f"{100 * tbs / peak:.1f}%" if peak else "n/a"
            print(f"| {label} | {B} | {1e3 * t:.2f} | {B / t:.0f} | {b['weights'] / 1e6:.0f} + {b['kv'] / 1e6:.1f} | {tbs:.3f} | {pk} | "
                  f"{100 * tbs / (bw['copy_GBs'] / 1e3):.1f}% |")
    print("\nMB read per step: ``decode_step_bytes`` (weights once, the input table only for the looked-up rows, + K/V of every "
          "token each sequence attends over); a lower bound on traffic. Step time: Engine.step() with every sequence decoding, "
          "synchronised; it includes the engine's Python bookkeeping and sampling.")
    return rows


# driver ----------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a smoke test of the flow)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="low precision checked and timed")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and workload: the whole flow in seconds")
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new", type=int, default=64, help="new tokens per request, equal workload")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="leave out Engine(compile=True)")
    ap.add_argument("--compile", action="store_true", help="with --tiny: include Engine(compile=True) (left out by default: slow on a CPU)")
    ap.add_argument("--hf-compile", action="store_true", help="also time transformers with a static cache + torch.compile")
    ap.add_argument("--skip", nargs="*", default=[], choices=["check", "hf", "bandwidth"], help="parts to leave out")
    args = ap.parse_args(argv)

    import torch

    start = time.perf_counter()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        _bail("needs a CUDA GPU; none is visible here (run with --device cpu --tiny for a smoke test of the flow, "
              "and benchmarks/serving.py for the CPU measurements)")
    if dev.type != "cuda" and not args.tiny:
        _bail("without CUDA only the smoke test runs: add --tiny")
    from companion.models import from_preset

    low = getattr(torch, args.dtype)
    import transformers

    print(f"# {_device_name(dev)}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{'tiny smoke run' if args.tiny else 'full run'}")
    compiled = not args.no_compile and (not args.tiny or args.compile)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 checks in float32
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)

    # 1. correctness
    if "check" not in args.skip:
        from companion.kernels import triton_flash

        kernels = []
        if dev.type == "cuda" or triton_flash.INTERPRET:
            if triton_flash.triton is not None:
                kernels.append("triton")
            else:
                print("triton kernel: not checked (triton is not installed)")
        else:
            print("triton kernel: not checked on a CPU (needs CUDA, or TRITON_INTERPRET=1)")
        kernels.append("flex")
        if dev.type != "cuda":
            kernels.append("reference")
        print("\n### Correctness\n")
        print("| dtype | engine greedy == each request alone | engine greedy == transformers | near-ties (largest top-2 gap) | "
              + " | ".join(f"{k} vs gather (max rel. logit err)" for k in kernels) + " | gather vs float32 copy |")
        print("|---|---:|---:|---:|" + "---:|" * (len(kernels) + 1))
        for dtype in (torch.float32, low):
            torch.manual_seed(0)
            small = dict() if args.tiny else dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=512)
            model = from_preset("llama-like", **small).to(device=dev, dtype=dtype).eval()
            try:
                eng = check_engine_vs_alone(model, n_requests=6 if args.tiny else 24, new=6 if args.tiny else 24)
                vs_hf = (check_engine_vs_transformers(model, eng["requests"]) if dtype == torch.float32
                         else "by logits (timing run)")
                ker = check_kernels(model, kernels, steps=6 if args.tiny else 16)
            except Failed as e:
                print(f"\nFAILED: {e}")
                return 1
            print(f"| {str(dtype).removeprefix('torch.')} | {eng['identical']}/{eng['n']} | {vs_hf} | {eng['near_ties']} ({eng['max_tie_gap']:.2g}) | "
                  + " | ".join(f"{ker[k]:.1e}" for k in kernels) + f" | {ker.get('gather_vs_fp32', 0):.1e} |")
        print(f"\n(tolerances: near-tie top-2 gap {TIE_TOL}; kernels {KERNEL_TOL}; {time.perf_counter() - start:.0f} s so far)")

    # 2. + 3. timing, at a GPU size (or tiny)
    torch.manual_seed(1)
    if args.tiny:
        big = dict()
        sizes = dict(n_requests=6, new=6, mixed_range=(1, 8), prompt_range=(4, 16), reps=1)
        bw = dict(batches=(1, 4), prompt_len=8, steps=3, bw_bytes=2**24)
    else:
        big = dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                   vocab_size=args.vocab, max_seq_len=1024)
        sizes = dict(n_requests=args.requests, new=args.new, mixed_range=(8, 2 * args.new), prompt_range=(16, 128), reps=args.reps)
        bw = dict(batches=(1, 16, 64), prompt_len=128, steps=16, bw_bytes=2**30)
    model = from_preset("llama-like", **big).to(device=dev, dtype=low).eval()
    if "hf" not in args.skip:
        compare_hf(model, compiled=compiled, hf_compiled=args.hf_compile, **sizes)
        print(f"\n({time.perf_counter() - start:.0f} s so far)")
    if "bandwidth" not in args.skip:
        bandwidth_table(model, compiled=compiled, **bw)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
