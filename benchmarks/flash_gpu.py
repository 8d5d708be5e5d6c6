"""Build, check and time the Triton FlashAttention kernel against torch SDPA's flash backend, on a CUDA GPU.

    python benchmarks/flash_gpu.py                 # bf16, the full grid, a few minutes
    python benchmarks/flash_gpu.py --dtype float16 --seqlens 1024 4096

One run does everything, in this order, and stops at the first failure:
1. correctness: for d = 64 and 128, causal and not, GQA and T != S included, the kernel's O, logsumexp
   and dQ, dK, dV are compared with float32 attention (torch SDPA on float32 copies);
2. timing: at T = 1k, 4k, 16k (batch x T = 16k tokens, h = 2048 / d heads, as in the FlashAttention-2
   paper), d = 64 and 128, causal and not: forward and forward + backward of the Triton kernel and of
   SDPA restricted to its FLASH_ATTENTION backend, in TFLOP/s and as a ratio (goal: forward >= 0.8x SDPA).

FLOPs counted as in the FlashAttention papers: forward 4 B h T^2 d (two matmuls), halved when causal;
backward 2.5x the forward (five matmuls instead of two).

On a machine without CUDA (or without triton) it exits at once with a message saying so.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _bail(msg: str) -> None:
    print(f"flash_gpu.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tokens", type=int, default=16384, help="batch x T, kept constant across T")
    ap.add_argument("--width", type=int, default=2048, help="h x d, kept constant across d")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        _bail("needs a CUDA GPU; none is visible here (this benchmark has nothing to run on a CPU: "
              "see benchmarks/flash_memory.py for the CPU measurements)")
    from companion.kernels import triton_flash

    if triton_flash.triton is None:
        _bail("needs triton: pip install 'companion[triton]'")
    if triton_flash.INTERPRET:
        _bail("TRITON_INTERPRET=1 is set; unset it to time the compiled kernels")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton_flash.triton.__version__}, {args.dtype}")

    # ------------------------------------------------------------------ 1. correctness (includes compiling)
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(0)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    worst = 0.0
    for d in args.head_dims:
        for causal in (False, True):
            for (B, h, g, T, S) in ((2, 8, 8, 1000, 1000), (1, 8, 2, 333, 1024)):
                q = torch.randn(B, h, T, d, device=dev, generator=gen, dtype=dtype)
                k = torch.randn(B, g, S, d, device=dev, generator=gen, dtype=dtype)
                v = torch.randn(B, g, S, d, device=dev, generator=gen, dtype=dtype)
                do = torch.randn(B, h, T, d, device=dev, generator=gen, dtype=dtype)
                ref_in = [x.float().repeat_interleave(h // g, dim=1).requires_grad_() if i else x.float().requires_grad_()
                          for i, x in enumerate((q, k, v))]
                mask = None
                if causal:  # queries are the last T of S positions
                    mask = torch.ones(T, S, dtype=torch.bool, device=dev).tril(S - T)
                ref = F.scaled_dot_product_attention(*ref_in, attn_mask=mask)
                ref_grads = torch.autograd.grad((ref * do.float()).sum(), ref_in)
                ref_dk = ref_grads[1].unflatten(1, (g, h // g)).sum(2)
                ref_dv = ref_grads[2].unflatten(1, (g, h // g)).sum(2)
                o, lse = triton_flash.flash_forward(q, k, v, causal=causal)
                dq, dk, dv = triton_flash.flash_backward(q, k, v, o, lse, do, causal=causal)
                for name, a, b in (("O", o, ref), ("dQ", dq, ref_grads[0]), ("dK", dk, ref_dk), ("dV", dv, ref_dv)):
                    scale = b.abs().max().item() + 1e-6
                    err = (a.float() - b).abs().max().item() / scale
                    worst = max(worst, err)
                    limit = tol if name == "O" else 5 * tol
                    if not err <= limit:  # also catches NaN
                        _bail(f"MISMATCH d={d} causal={causal} shape={(B, h, g, T, S)} {name}: max error {err:.3g} "
                              f"of the largest value (limit {limit:g})")
    print(f"correctness: every variant within tolerance (worst relative error {worst:.2e}); "
          f"compile + check took {time.perf_counter() - t0:.1f} s\n")

    # ------------------------------------------------------------------ 2. timing
    print("| d | causal | T | batch x heads | Triton fwd TFLOP/s | SDPA flash fwd TFLOP/s | fwd ratio | Triton fwd+bwd TFLOP/s | SDPA flash fwd+bwd TFLOP/s | fwd+bwd ratio |")
    print("|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in args.head_dims:
        h = max(1, args.width // d)
        for causal in (False, True):
            for T in args.seqlens:
                B = max(1, args.tokens // T)
                q, k, v = (torch.randn(B, h, T, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
                do = torch.randn(B, h, T, d, device=dev, dtype=dtype)
                fwd_flops = 4 * B * h * T * T * d * (0.5 if causal else 1.0)

                def tri_fwd():
                    return triton_flash.flash_forward(q, k, v, causal=causal)

                def tri_fwd_bwd():
                    o, lse = triton_flash.flash_forward(q, k, v, causal=causal)
                    return triton_flash.flash_backward(q, k, v, o, lse, do, causal=causal)

                def sdpa_fwd():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def sdpa_fwd_bwd():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return torch.autograd.grad(o, (q, k, v), do)

                ms = {}
                for name, fn in (("tf", tri_fwd), ("tfb", tri_fwd_bwd), ("sf", sdpa_fwd), ("sfb", sdpa_fwd_bwd)):
                    try:
                        ms[name] = do_bench(fn, warmup=25, rep=100)
                    except RuntimeError as e:  # e.g. SDPA has no flash kernel for this dtype / GPU
                        print(f"<!-- {name} failed at d={d} T={T}: {str(e).splitlines()[0]} -->")
                        ms[name] = float("nan")
                tflops = {n: (fwd_flops if n in ("tf", "sf") else 3.5 * fwd_flops) / (t * 1e-3) / 1e12 for n, t in ms.items()}
                print(f"| {d} | {'yes' if causal else 'no'} | {T} | {B} x {h} | {tflops['tf']:.1f} | {tflops['sf']:.1f} | "
                      f"{tflops['tf'] / tflops['sf']:.2f} | {tflops['tfb']:.1f} | {tflops['sfb']:.1f} | {tflops['tfb'] / tflops['sfb']:.2f} |",
                      flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
