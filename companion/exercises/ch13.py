"""Checkers for chapter 13's exercises (the capstone: the modern decoder from equations to serving).

What this module provides (each registered with ``companion.exercises.register``):
- ``ch13.param_count``: ``fn(config) -> int``, the parameters of a dense, bias-free decoder of
  ``DecoderConfig`` ``config`` (pre-RMSNorm, RoPE, GQA with g key/value heads of width d_h, SwiGLU
  of width d_ff, optional QK-norm and tied embeddings): V d embeddings (twice when untied), per
  layer 2 d norm gains + d (h + 2 g) d_h + h d_h d attention + 3 d d_ff feed-forward (+ 2 d_h with
  QK-norm), and d for the final norm. Checked against ``Decoder.num_parameters()`` of the built model.
- ``ch13.kv_bytes``: ``fn(config, T, bytes_per_element) -> int``, the bytes of a contiguous KV cache
  holding T tokens of one sequence: 2 L T g d_h b (K and V of every layer, chapter 8's formula).
  Checked against the tensors a real ``ModelCache`` holds after a T-token prefill.
- ``ch13.qk_norm_layer``: ``fn(layer, H, positions) -> H_next``, one layer of the recurrence (13.2)
  to (13.7) with QK-norm (Qwen3): each head of q and k RMS-normalised over its d_h channels, with
  its own gain, *before* the rotation. ``layer`` is a ``companion.blocks.Block`` of a
  ``qwen3-like`` decoder, H (B, T, d), positions (T,) (the checker packs two documents, positions
  restarting at the second, so that a layer that ignores them fails). Checked against ``layer(H, positions)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from companion.exercises import ExerciseFailed, call, diagnose, diagnose_integer, integer_answer, register
from companion.models.common import from_preset


def _random_config(gen: torch.Generator, qk_norm: bool | None = None):
    """A small random llama-like (or qwen3-like) DecoderConfig: sizes the checkers vary."""
    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    g = pick([1, 2, 4])
    h = g * pick([1, 2, 3])
    head_dim = pick([8, 16])
    qk = pick([False, True]) if qk_norm is None else qk_norm
    model = from_preset(
        "qwen3-like" if qk else "llama-like", vocab_size=pick([50, 97, 256]), d_model=pick([32, 48, 64]),
        n_layers=pick([1, 2, 3]), n_heads=h, n_kv_heads=g, head_dim=head_dim, d_ff=pick([64, 96, None]),
        tie_embeddings=pick([False, True]), max_seq_len=64,
    )
    return model


# --- ch13.param_count --------------------------------------------------------------------------


@register("ch13.param_count")
def check_param_count(fn, gen, report) -> None:
    for _ in range(6):
        model = _random_config(gen)
        c = model.config
        case = (f"V={c.vocab_size}, d={c.d_model}, L={c.n_layers}, h={c.n_heads}, g={c.kv_heads}, "
                f"d_h={c.attn_head_dim}, d_ff={c.ffn_hidden}, tied={c.tie_embeddings}, qk_norm={c.qk_norm}")
        expected = model.num_parameters()
        got = integer_answer(case, call(case, fn, c))
        V, d, L, h, g, dh, ff = (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.kv_heads, c.attn_head_dim,
                                 c.ffn_hidden)
        embeddings = V * d * (1 if c.tie_embeddings else 2)
        layer = 2 * d + d * (h + 2 * g) * dh + h * dh * d + 3 * d * ff + (2 * dh if c.qk_norm else 0)
        other_tie = V * d * (2 if c.tie_embeddings else 1)
        diagnose_integer(case, got, expected, {
            "the count with h key/value heads instead of g (MHA's projections)":
                expected + L * 2 * d * (h - g) * dh,
            "the count without the RMSNorm gains": expected - L * 2 * d - d - (L * 2 * dh if c.qk_norm else 0),
            "the count with the embeddings' tying the other way round": expected - embeddings + other_tie,
            "the count with a 2-matrix feed-forward (no gate)": expected - L * d * ff,
            "the count with d_h = d / h instead of the config's head_dim":
                expected - L * (d * (h + 2 * g) * dh + h * dh * d) + L * (d * (h + 2 * g) + h * d) * (d // h),
        })
        assert got == embeddings + L * layer + d  # the reference formula itself agrees with the model
        report.cases.append(case)


# --- ch13.kv_bytes -------------------------------------------------------------------------------


@register("ch13.kv_bytes")
def check_kv_bytes(fn, gen, report) -> None:
    for _ in range(5):
        model = _random_config(gen, qk_norm=False)
        c = model.config
        T = int(torch.randint(1, 64, (), generator=gen))
        dtype = [torch.float32, torch.bfloat16][int(torch.randint(2, (), generator=gen))]
        b = torch.empty((), dtype=dtype).element_size()
        cache = model.to(dtype).new_cache()
        with torch.no_grad():
            model(torch.zeros(1, T, dtype=torch.long), cache=cache)
        held = cache.nbytes()  # what the filled cache's tensors occupy
        case = f"L={c.n_layers}, T={T}, h={c.n_heads}, g={c.kv_heads}, d_h={c.attn_head_dim}, {b} bytes"
        got = integer_answer(case, call(case, fn, c, T, b))
        L, g, dh = c.n_layers, c.kv_heads, c.attn_head_dim
        diagnose_integer(case, got, held, {
            "the cache with h heads instead of g (no sharing)": 2 * L * T * c.n_heads * dh * b,
            "K only (the factor 2 for V is missing)": L * T * g * dh * b,
            "the count in elements, not bytes": 2 * L * T * g * dh,
            "the cache of d_model channels per token instead of g d_h": 2 * L * T * c.d_model * b,
        })
        report.cases.append(case)


# --- ch13.qk_norm_layer --------------------------------------------------------------------------


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _layer_reference(layer, H, positions, qk_norm: bool = True, before_rope: bool = True, grouped: bool = True):
    """Eqs. (13.2)-(13.7) with QK-norm, written from the weights; the flags produce the typical mistakes."""
    attn, ffn = layer.attn, layer.ffn
    eps = layer.attn_norm.eps
    B, T, _ = H.shape
    h, g, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    X = _rms(H, layer.attn_norm.weight, eps)
    q, k, v = (X @ attn.qkv.weight.T).split([h * dh, g * dh, g * dh], dim=-1)
    q, k, v = (t.view(B, T, -1, dh).transpose(1, 2) for t in (q, k, v))
    cos, sin = attn.rope.cos_sin(positions)

    def rotate(x):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def norm(q, k):
        return _rms(q, attn.q_norm.weight, attn.q_norm.eps), _rms(k, attn.k_norm.weight, attn.k_norm.eps)

    if qk_norm and before_rope:
        q, k = norm(q, k)
    q, k = rotate(q), rotate(k)
    if qk_norm and not before_rope:
        q, k = norm(q, k)
    k, v = (t.repeat_interleave(h // g, 1) if grouped else t.repeat(1, h // g, 1, 1) for t in (k, v))
    O = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    U = H + O.transpose(1, 2).reshape(B, T, h * dh) @ attn.out.weight.T
    Z = _rms(U, layer.ffn_norm.weight, eps)
    return U + (F.silu(Z @ ffn.gate.weight.T) * (Z @ ffn.up.weight.T)) @ ffn.down.weight.T


@register("ch13.qk_norm_layer")
def check_qk_norm_layer(fn, gen, report) -> None:
    for _ in range(3):
        model = _random_config(gen, qk_norm=True).eval()
        with torch.no_grad():  # trained-looking gains: QK-norm's order against RoPE then matters
            for p in model.parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
        layer = model.layers[0]
        B, T = 2, int(torch.randint(3, 20, (), generator=gen))
        H = torch.randn(B, T, model.config.d_model, generator=gen)
        # two packed documents, positions restarting at the second: a shift of 0..T-1 alone would
        # cancel in q.k (RoPE sees differences only), so a layer that ignores `positions` fails here
        first = int(torch.randint(1, T - 1, (), generator=gen))
        positions = torch.cat((torch.arange(first), torch.arange(T - first)))
        c = model.config
        case = f"h={c.n_heads}, g={c.kv_heads}, d_h={c.attn_head_dim}, d={c.d_model}, T={T}"
        with torch.no_grad():
            expected = layer(H, positions, None)
            got = call(case, fn, layer, H.clone(), positions)
            if not isinstance(got, torch.Tensor):
                raise ExerciseFailed(f"{case}: expected a tensor, got {type(got).__name__}")
            mistakes = {
                "the layer without QK-norm": _layer_reference(layer, H, positions, qk_norm=False),
                "QK-norm applied after RoPE instead of before": _layer_reference(layer, H, positions, before_rope=False),
                "the heads grouped as r mod g instead of r // (h / g)": _layer_reference(layer, H, positions, grouped=False),
                "rotation by 0..T-1 instead of by `positions`": _layer_reference(layer, H, torch.arange(T)),
            }
            if c.kv_heads == c.n_heads:
                mistakes.pop("the heads grouped as r mod g instead of r // (h / g)")
            diagnose(case, got, expected, mistakes, atol=1e-4, rtol=1e-4)
        report.cases.append(case)


def reference_qk_norm_layer(layer, H, positions):
    """The reference answer of ``ch13.qk_norm_layer`` (the tests use it)."""
    return _layer_reference(layer, H, positions)


__all__ = ["check_param_count", "check_kv_bytes", "check_qk_norm_layer", "reference_qk_norm_layer"]
