"""Parameters, FLOPs and KV-cache bytes by formula (chapters 6, 8 and 10).

Formulas, written from the configs alone (tests hold them equal to the models' measured counts):
- attention (GQA): d (h + 2g) d_h [+ (h + 2g) d_h biases] + h d_h d [+ d];
- MLA: d d_c' + d_c' + d_c' h (d_h + d_R)  (or d h (d_h + d_R) without query compression)
       + d (d_c + d_R) + d_c + d_c h d_h + d_c h d_v + h d_v d;
- SwiGLU / GeGLU: 3 d d_f (+ 2 d_f + d biases: gpt-oss's clamped experts); MLP: 2 d d_f + d_f + d
  (with biases); MoE: d N (+ N router biases) + (N + N_shared) x one expert;
- norms: d (RMS) or 2d (LayerNorm with bias), two per layer, four with sandwich norms (Gemma); QK-norm
  adds 2 d_h per layer; sinks h per layer.
- ``PUBLISHED``: the shapes of released models (Llama 3 8B / 70B, Qwen3 8B / 30B-A3B, Gemma 3 27B,
  gpt-oss 20b / 120b, DeepSeek-V3) as ``DecoderConfig``s, from their published configs, so that the
  formulas above reproduce the totals their model cards state (tests/test_accounting.py).
- FLOPs per token: forward ~ 2 N_active + 2 L T_ctx (h d_h + h d_v) (scores and weighted sum);
  training ~ 3 x forward (= 6N + the attention term).
- KV cache per token: MHA/GQA/MQA 2 L g d_h b bytes; MLA L (d_c + d_R) b bytes.
- Bytes one decode step reads (``decode_step_bytes``): every weight once (what a batch of B decoding
  tokens needs, see below) + the K/V (or MLA latent + RoPE key) of every token each running sequence
  attends over, in every layer; the quantity that bounds decode speed by memory bandwidth.
- GPU peaks (``GPU_PEAKS``, ``peak_flops``, ``peak_bandwidth``): dense bf16 TFLOP/s and memory TB/s per
  device, the denominators of MFU (``benchmarks/train_gpu.py``) and of bandwidth utilisation
  (``benchmarks/serving_gpu.py``).
- The decode roofline (chapter 10): ``decode_step_flops`` (FLOPs of one decode step; over
  ``decode_step_bytes`` it is the step's arithmetic intensity), ``attainable_flops`` (min(pi, I beta)),
  and two quick probes of the machine at hand, ``measure_matmul_flops`` and ``measure_bandwidth``.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import NamedTuple, Sequence

import torch
from torch import nn

from companion.inference.kvquant import BITS, bytes_per_group
from companion.models.decoder import DecoderConfig
from companion.models.gpt import GPTConfig
from companion.models.seq2seq import Seq2SeqConfig

__all__ = ["decoder_parameters", "gpt_parameters", "seq2seq_parameters", "kv_cache_bytes", "mla_cache_bytes", "flops_per_token",
           "kv_bytes_per_token", "decode_step_bytes", "GpuPeak", "GPU_PEAKS", "gpu_peak", "peak_flops", "peak_bandwidth",
           "training_flops_per_token", "PUBLISHED", "published_config", "decode_step_flops", "attainable_flops",
           "measure_matmul_flops", "measure_bandwidth"]

# The shapes of released models, field by field from their published config.json files (hidden size,
# layers, heads, KV heads, head width, FFN / expert widths, vocabulary, experts, MLA ranks, windows).
# Weights are not needed: the counts follow from the shapes. max_seq_len is the released context.
PUBLISHED: dict[str, dict] = {
    "llama3-8b": dict(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, max_seq_len=8192, rope_base=500_000.0,
    ),
    "llama3-70b": dict(
        vocab_size=128256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672, max_seq_len=8192, rope_base=500_000.0,
    ),
    "qwen3-8b": dict(
        vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=12288, qk_norm=True,
        max_seq_len=40960, rope_base=1_000_000.0,
    ),
    "qwen3-30b-a3b": dict(
        vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, d_ff=6144, qk_norm=True,
        n_experts=128, top_k=8, moe_d_ff=768, max_seq_len=40960, rope_base=1_000_000.0,
    ),
    "gemma3-27b": dict(
        vocab_size=262208, d_model=5376, n_layers=62, n_heads=32, n_kv_heads=16, head_dim=128, d_ff=21504, ffn="geglu",
        qk_norm=True, norm_placement="sandwich", norm_offset=True, tie_embeddings=True, scale_embeddings=True,
        window=1024, global_every=6, rope_base=10_000.0, rope_base_global=1_000_000.0, query_pre_attn_scalar=168,
        rope_scaling="pi", rope_factor=8.0, rope_scaling_layers="global", max_seq_len=131072,
    ),
    "gpt-oss-20b": dict(
        vocab_size=201088, d_model=2880, n_layers=24, n_heads=64, n_kv_heads=8, head_dim=64, moe_d_ff=2880, n_experts=32,
        top_k=4, sinks=True, attn_bias=True, router_bias=True, moe_expert="clamped_swiglu", window=128, global_every=2,
        rope_base=150_000.0, rope_scaling="yarn_hf", rope_factor=32.0, rope_original_max_len=4096, rope_truncate=False,
        norm_eps=1e-5, max_seq_len=131072,
    ),
    "gpt-oss-120b": dict(
        vocab_size=201088, d_model=2880, n_layers=36, n_heads=64, n_kv_heads=8, head_dim=64, moe_d_ff=2880, n_experts=128,
        top_k=4, sinks=True, attn_bias=True, router_bias=True, moe_expert="clamped_swiglu", window=128, global_every=2,
        rope_base=150_000.0, rope_scaling="yarn_hf", rope_factor=32.0, rope_original_max_len=4096, rope_truncate=False,
        norm_eps=1e-5, max_seq_len=131072,
    ),
    "mistral-7b": dict(  # v0.1: a 4096-token sliding window on every layer (chapter 9)
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, window=4096,
        max_seq_len=32768, rope_base=10_000.0,
    ),
    "mixtral-8x7b": dict(  # 8 SwiGLU experts of Mistral 7B's width, top 2, softmax router (chapter 9)
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336, moe_d_ff=14336,
        n_experts=8, top_k=2, max_seq_len=32768, rope_base=1_000_000.0,
    ),
    "deepseek-v3": dict(  # the main model; the released checkpoint adds one multi-token-prediction layer
        vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, attention="mla", q_rank=1536, kv_rank=512,
        mla_head_dim=128, rope_dim=64, v_head_dim=128, d_ff=18432, moe_d_ff=2048, n_experts=256, n_shared_experts=1,
        top_k=8, first_dense_layers=3, router="sigmoid", bias_balancing=True, expert_groups=8, topk_groups=4,
        routed_scaling_factor=2.5, max_seq_len=163840,
    ),
}


def published_config(name: str, **overrides) -> DecoderConfig:
    """The ``DecoderConfig`` of a released model (``PUBLISHED``); shapes only, nothing is allocated."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown published model {name!r}; known: {', '.join(PUBLISHED)}")
    return DecoderConfig(**{**PUBLISHED[name], "name": name, **overrides})


def _norm(kind: str, d: int) -> int:
    return d if kind == "rms" else 2 * d


def _attention(c: DecoderConfig) -> int:
    d, h = c.d_model, c.n_heads
    if c.attention == "mla":
        qk, dv = c.mla_head_dim + c.rope_dim, c.v_head_dim or c.mla_head_dim
        q = d * h * qk if c.q_rank is None else d * c.q_rank + c.q_rank + c.q_rank * h * qk
        return q + d * (c.kv_rank + c.rope_dim) + c.kv_rank + c.kv_rank * h * (c.mla_head_dim + dv) + h * dv * d
    g, dh = c.kv_heads, c.attn_head_dim
    n = d * (h + 2 * g) * dh + h * dh * d
    if c.attn_bias:
        n += (h + 2 * g) * dh
    if c.attn_bias if c.attn_out_bias is None else c.attn_out_bias:
        n += d
    return n + (h if c.sinks else 0) + (2 * dh if c.qk_norm else 0)


def _ffn(kind: str, d: int, d_f: int, bias: bool) -> int:
    if kind in ("swiglu", "geglu", "clamped_swiglu"):
        return 3 * d * d_f + (2 * d_f + d if bias else 0)
    return 2 * d * d_f + (d_f + d if bias else 0)


def _expert(c: DecoderConfig) -> int:
    """Parameters of one routed expert: a SwiGLU of width moe_d_ff (gpt-oss's with biases)."""
    return _ffn(c.moe_expert, c.d_model, c.moe_d_ff or c.ffn_hidden, c.moe_expert == "clamped_swiglu")


def decoder_parameters(c: DecoderConfig, active: bool = False) -> int:
    """Parameter count of ``Decoder(c)``; ``active``: only the top_k routed experts per MoE layer."""
    d, V = c.d_model, c.vocab_size
    n = V * d * (1 if c.tie_embeddings else 2) + (c.max_seq_len * d if c.position == "learned" else 0)
    n += _norm(c.norm, d) if c.norm_placement in ("pre", "sandwich") else 0  # final norm
    norms = 4 if c.norm_placement == "sandwich" else 2
    for i in range(c.n_layers):
        n += _attention(c) + norms * _norm(c.norm, d)
        if c.is_moe(i):
            used = c.top_k if active else c.n_experts
            shared = 3 * d * (c.moe_d_ff or c.ffn_hidden)
            n += d * c.n_experts + (c.n_experts if c.router_bias else 0) + used * _expert(c) + c.n_shared_experts * shared
        else:
            n += _ffn(c.ffn, d, c.ffn_hidden, c.ffn_bias)
    return n


def gpt_parameters(c: GPTConfig) -> int:
    """12 L d^2 + 13 L d + V d + T d (+ 2d for GPT-2's final LayerNorm): tied embedding counted once."""
    d, L = c.n_embd, c.n_layer
    return L * (12 * d * d + 13 * d) + c.vocab_size * d + c.block_size * d + (2 * d if c.variant == "gpt2" else 0)


def seq2seq_parameters(c: Seq2SeqConfig) -> int:
    d, f = c.d_model, c.d_ff
    attn = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    enc = c.n_encoder_layers * (attn + ffn + 2 * 2 * d)
    dec = c.n_decoder_layers * (2 * attn + ffn + 3 * 2 * d)
    emb = c.src_vocab_size * d if c.share_embeddings else (c.src_vocab_size + c.tgt_vocab_size) * d
    return enc + dec + emb


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, tokens: int = 1, batch: int = 1, bytes_per_value: int = 2) -> int:
    """M = 2 B L T g d_h b: keys and values of every layer, kv head and token."""
    return 2 * batch * n_layers * tokens * n_kv_heads * head_dim * bytes_per_value


def mla_cache_bytes(n_layers: int, kv_rank: int, rope_dim: int, tokens: int = 1, batch: int = 1, bytes_per_value: int = 2) -> int:
    """M_MLA = B L T (d_c + d_R) b: one latent and one shared RoPE key per token and layer."""
    return batch * n_layers * tokens * (kv_rank + rope_dim) * bytes_per_value


def flops_per_token(c: DecoderConfig, context: int, training: bool = False) -> int:
    """2 N_active (matmuls, embeddings excluded) + 2 L context h (d_qk + d_v) (attention); x3 for training."""
    n = decoder_parameters(c, active=True) - c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    n += c.vocab_size * c.d_model  # the output projection is a matmul
    if c.attention == "mla":
        dqk, dv = c.mla_head_dim + c.rope_dim, c.v_head_dim or c.mla_head_dim
    else:
        dqk = dv = c.attn_head_dim
    fwd = 2 * n + 2 * c.n_layers * context * c.n_heads * (dqk + dv)
    return 3 * fwd if training else fwd


def kv_bytes_per_token(c: DecoderConfig | GPTConfig, bytes_per_value: int = 2, bits: int | None = None) -> list[int]:
    """Per layer, the bytes one token's cached state occupies: K and V (g heads of d_h: GQA/MQA store
    g, not h), or MLA's latent c_j (d_c) and shared RoPE key (d_R). Float storage: ``kv_cache_bytes`` /
    ``mla_cache_bytes`` at one token and one layer; ``bits`` 8 or 4: the quantised pages of
    ``companion.inference.paged.PagePool``, one group per (token, head) (per token for each MLA tensor) of
    ``kvquant.bytes_per_group`` bytes (d bits/8 of data + a float32 scale)."""
    if bits is not None and bits not in BITS:
        raise ValueError(f"bits must be None or one of {BITS}; got {bits!r}")
    if c.attention == "mla":
        groups = [(1, c.kv_rank), (1, c.rope_dim)]
    else:
        groups = [(c.kv_heads, c.attn_head_dim)] * 2  # K and V: (groups, elements per group)
    if bits is None:
        if c.attention == "mla":
            per = mla_cache_bytes(1, c.kv_rank, c.rope_dim, bytes_per_value=bytes_per_value)
        else:
            per = kv_cache_bytes(1, groups[0][0], groups[0][1], bytes_per_value=bytes_per_value)
    else:
        per = sum(n * bytes_per_group(d, bits) for n, d in groups)
    return [per] * c.n_layers


def _positive(name: str, x, integer: bool = True) -> None:
    ok = isinstance(x, int) if integer else isinstance(x, Real)
    if isinstance(x, bool) or not ok or not x > 0 or (not integer and not math.isfinite(x)):
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}; got {x!r}")


def decode_step_bytes(
    c: DecoderConfig | GPTConfig, context_lengths: Sequence[int], *, param_bytes: float = 2, kv_bytes: int | None = None,
    kv_bits: int | None = None, moe_experts: int | None = None,
) -> dict[str, int]:
    """Bytes one decode step must read from memory: the weights once plus the cached K/V of every
    running sequence. A lower bound on traffic (activations, the K/V rows written and anything read
    twice are not counted); bytes / step time is the achieved bandwidth, compared with the device's.

    Args:
        c: a ``DecoderConfig`` or ``GPTConfig``.
        context_lengths: one entry per sequence of the batch (B = its length): the tokens that
            sequence's new query attends over at this step, the new token included (>= 1, <= the
            model's context). A sliding-window layer reads min(n, w + keep) of them.
        param_bytes: bytes per weight element (2 for bf16/fp16, 4 for fp32; 0.5 for int4 weights).
        kv_bytes: bytes per cached element with float pages (default: ``param_bytes``).
        kv_bits: 8 or 4 for int8 / int4 pages (data + float32 scales, ``kv_bytes_per_token``).
        moe_experts: routed experts read per MoE layer; default min(N, top_k x B), i.e. every token's
            top_k taken as distinct (exact at B = 1, an upper bound above); pass the distinct experts
            the router actually picked to be exact.

    How weights count:
    - every matrix and vector of the layers, the final norm and the output projection (V x d), once
      per step however many sequences decode (that is why batching amortises decode);
    - the input embedding: only the B rows looked up (B d elements), not the V x d table; with tied
      embeddings the table is read once, by the output projection, and the lookup is not counted
      again; learned positions likewise B rows;
    - MoE layers: the router (d N) + the shared experts + ``moe_experts`` routed experts.

    Returns {"weights", "kv", "total"} in bytes (rounded to whole bytes).
    """
    if not isinstance(c, (DecoderConfig, GPTConfig)):
        raise ValueError(f"c must be a DecoderConfig or GPTConfig; got {type(c).__name__}")
    if isinstance(context_lengths, (str, bytes)) or not isinstance(context_lengths, Sequence) or not len(context_lengths):
        raise ValueError(f"context_lengths must be a non-empty sequence of ints, one per sequence; got {context_lengths!r}")
    gpt = isinstance(c, GPTConfig)
    context = c.context_length
    for n in context_lengths:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= context:
            raise ValueError(f"context_lengths must hold ints in [1, {context}] (the model's context); got {n!r}")
    _positive("param_bytes", param_bytes, integer=False)
    if kv_bytes is not None:
        _positive("kv_bytes", kv_bytes)
    if kv_bits is not None and kv_bits not in BITS:
        raise ValueError(f"kv_bits must be None or one of {BITS}; got {kv_bits!r}")
    B = len(context_lengths)
    if gpt:
        d = c.n_embd
        n = gpt_parameters(c) - c.block_size * d + B * d  # tied wte read whole by the head; B position rows
        windows = [None] * c.n_layer
        keep = 0
    else:
        d, V = c.d_model, c.vocab_size
        n = decoder_parameters(c)
        if not c.tie_embeddings:
            n -= V * d - B * d  # the input table: only the B looked-up rows
        if c.position == "learned":
            n -= c.max_seq_len * d - B * d
        moe_layers = [i for i in range(c.n_layers) if c.is_moe(i)]
        if moe_layers:
            used = min(c.n_experts, c.top_k * B) if moe_experts is None else moe_experts
            if isinstance(used, bool) or not isinstance(used, int) or not 1 <= used <= c.n_experts:
                raise ValueError(f"moe_experts must be an int in [1, n_experts={c.n_experts}] or None; got {moe_experts!r}")
            n -= len(moe_layers) * (c.n_experts - used) * _expert(c)
        elif moe_experts is not None:
            raise ValueError(f"moe_experts applies to MoE models only (n_experts > 0); got {moe_experts!r}")
        windows = c.layer_windows()
        keep = c.keep
    if kv_bytes is None and kv_bits is None:
        if not float(param_bytes).is_integer():
            raise ValueError(f"kv_bytes must be given when param_bytes is fractional ({param_bytes}): float K/V take whole bytes")
        kv_bytes = int(param_bytes)
    per_token = kv_bytes_per_token(c, kv_bytes or 1, kv_bits)  # with kv_bits, kv_bytes plays no part
    kv = sum(per * sum(ctx if w is None else min(ctx, w + keep) for ctx in context_lengths) for per, w in zip(per_token, windows))
    weights = round(n * param_bytes)
    return {"weights": weights, "kv": kv, "total": weights + kv}


# --- training throughput: FLOPs per token and the GPUs' peaks ---------------------------------------

class GpuPeak(NamedTuple):
    """One row of ``GPU_PEAKS``: a device-name substring, its dense bf16 tensor-core peak (TFLOP/s)
    and its DRAM (HBM/GDDR) bandwidth (TB/s); None where the row does not say."""

    name: str
    bf16_tflops: float | None
    tbs: float | None


# The one table of GPU peaks, from the vendors' data sheets (dense, no sparsity). Matched against
# torch.cuda.get_device_name() by case-insensitive substring: the first row that matches and has the
# number asked for wins, so more specific names come first (a row may give only one of the two).
GPU_PEAKS: list[GpuPeak] = [
    GpuPeak("GB200", 2500.0, None),
    GpuPeak("B200", 2250.0, None),
    GpuPeak("GH200", 989.0, 4.0),
    GpuPeak("H200", 989.0, 4.8),
    GpuPeak("H100 PCIe", 756.0, 2.0),
    GpuPeak("H100 NVL", None, 3.9),
    GpuPeak("H100", 989.0, 3.35),
    GpuPeak("H800", 989.0, 3.35),
    GpuPeak("A100 80GB PCIe", None, 1.935),
    GpuPeak("A100-SXM4-80GB", None, 2.039),
    GpuPeak("A100", 312.0, 1.555),
    GpuPeak("A800", 312.0, 2.039),
    GpuPeak("L40S", 362.0, 0.864),
    GpuPeak("L40", None, 0.864),
    GpuPeak("L4", 121.0, 0.3),
    GpuPeak("A10G", 70.0, 0.6),  # AWS's A10G; the A10 itself is listed as 125
    GpuPeak("A10", 125.0, 0.6),
    GpuPeak("RTX 4090", 165.0, 1.008),
    GpuPeak("RTX 3090", 71.0, 0.936),
    GpuPeak("V100", None, 0.9),
    GpuPeak("T4", None, 0.32),
]


def gpu_peak(device_name: str, field: str) -> float | None:
    """``field`` ("bf16_tflops" or "tbs") of the GPU named ``device_name`` from ``GPU_PEAKS``, or None."""
    if field not in GpuPeak._fields[1:]:
        raise ValueError(f"field must be one of {GpuPeak._fields[1:]}; got {field!r}")
    for row in GPU_PEAKS:
        value = getattr(row, field)
        if value is not None and row.name.lower() in device_name.lower():
            return value
    return None


def peak_flops(device: torch.device | str) -> float | None:
    """Peak dense bf16 FLOP/s of a CUDA device from ``GPU_PEAKS`` (None on CPU or if unknown)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    tflops = gpu_peak(torch.cuda.get_device_name(device), "bf16_tflops")
    return None if tflops is None else tflops * 1e12


def peak_bandwidth(device_name: str) -> float | None:
    """Peak memory bandwidth in TB/s of the GPU named ``device_name`` from ``GPU_PEAKS``, or None."""
    return gpu_peak(device_name, "tbs")


def training_flops_per_token(model: nn.Module, context: int) -> int | None:
    """Training FLOPs per token (forward + backward ~ 3 x forward), ``companion.accounting.flops_per_token``.

    Decoder: its config directly. GPT: the same formula on the equivalent Decoder config (LayerNorm,
    GELU MLP with biases, learned positions, tied embeddings), minus the position table, which is a
    lookup, not a matmul. Seq2SeqTransformer: None (the accounting module has no encoder-decoder formula).
    """
    from companion.models import GPT, Decoder, DecoderConfig, unwrap

    model = unwrap(model)
    if isinstance(model, Decoder):
        c = model.config
        flops = flops_per_token(c, context, training=True)
        if c.position == "learned":
            flops -= 3 * 2 * c.max_seq_len * c.d_model
        return flops
    if isinstance(model, GPT):
        g = model.config
        c = DecoderConfig(
            vocab_size=g.vocab_size, d_model=g.n_embd, n_layers=g.n_layer, n_heads=g.n_head, max_seq_len=g.block_size,
            norm="layer", position="learned", ffn="gelu", d_ff=4 * g.n_embd, ffn_bias=True, attn_bias=True,
            tie_embeddings=True,
        )
        return flops_per_token(c, context, training=True) - 3 * 2 * g.block_size * g.n_embd
    return None


# --- the decode roofline (chapter 10) ---------------------------------------------------------------

def decode_step_flops(c: DecoderConfig, context_lengths: Sequence[int]) -> int:
    """FLOPs of one decode step of B sequences, one new token each (chapter 10):
    sum_b [ 2 N_matmul + sum_l 2 h (d_qk + d_v) n_{b,l} ], the matmul part of ``flops_per_token`` plus
    the scores and weighted sum over the n_{b,l} keys the new query of sequence b reads in layer l:
    its context n_b on a global layer, min(n_b, w + keep) on a sliding-window layer, as
    ``decode_step_bytes`` counts them. Divided by ``decode_step_bytes(...)["total"]`` it is the
    arithmetic intensity I of the step, the x axis of the roofline (eq. roofline of the GPU appendix).
    MLA counts as ``flops_per_token`` does, per head with d_qk = d_h + d_R (the up-projection of the
    cached latents is not counted: the absorbed form skips it).
    """
    if not isinstance(c, DecoderConfig):
        raise ValueError(f"c must be a DecoderConfig; got {type(c).__name__}")
    if isinstance(context_lengths, (str, bytes)) or not isinstance(context_lengths, Sequence) or not len(context_lengths):
        raise ValueError(f"context_lengths must be a non-empty sequence of ints, one per sequence; got {context_lengths!r}")
    for n in context_lengths:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= c.context_length:
            raise ValueError(f"context_lengths must hold ints in [1, {c.context_length}] (the model's context); got {n!r}")
    if c.attention == "mla":
        dqk, dv = c.mla_head_dim + c.rope_dim, c.v_head_dim or c.mla_head_dim
        windows = [None] * c.n_layers
    else:
        dqk = dv = c.attn_head_dim
        windows = c.layer_windows()
    matmuls = flops_per_token(c, context=0)  # 2 N_matmul: every weight multiply-add of one token
    per_key = 2 * c.n_heads * (dqk + dv)  # one query against one key: score (d_qk) + weighted sum (d_v)
    attention = sum(per_key * (n if w is None else min(n, w + c.keep)) for n in context_lengths for w in windows)
    return len(context_lengths) * matmuls + attention


def attainable_flops(intensity: float, peak: float, bandwidth: float) -> float:
    """The roofline: min(pi, I beta) FLOP/s for a kernel of arithmetic intensity I (FLOP per byte) on
    a processor of peak rate pi (FLOP/s) and memory bandwidth beta (byte/s); the ridge point, where
    the two bounds meet, is I* = pi / beta."""
    for name, x in (("intensity", intensity), ("peak", peak), ("bandwidth", bandwidth)):
        _positive(name, x, integer=False)
    return min(peak, intensity * bandwidth)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 256,
                         repeats: int = 5) -> float:
    """A quick compute probe: the best rate (FLOP/s) of ``repeats`` (n x n) @ (n x n) products, 2 n^3
    FLOPs each. A lower bound on the machine's peak (a small product does not fill a big GPU), good
    enough to place the roof of a roofline; the first product warms up and is not timed."""
    import time

    _positive("n", n)
    _positive("repeats", repeats)
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def measure_bandwidth(device: torch.device | str = "cpu", nbytes: int = 1 << 25, repeats: int = 5) -> float:
    """A quick memory probe: the best rate (byte/s) of ``repeats`` copies of an ``nbytes`` buffer into
    another, 2 nbytes moved each (read once, written once). Use a buffer larger than the caches (the
    32 MiB default is for a CPU; a GPU's L2 holds 50 MB, so give it more) or it measures the cache."""
    import time

    _positive("nbytes", nbytes)
    _positive("repeats", repeats)
    device = torch.device(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best
