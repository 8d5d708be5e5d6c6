"""The multi-head attention layer every model uses (chapters 1, 6, 8 and 9).

MultiHead(X) = Concat(head_1, ..., head_h) W_O, head_i = Attn(X W_Q^i, X W_K^{g(i)}, X W_V^{g(i)})
(Vaswani et al. 2017, section 3.2.2), with n_heads query heads and n_kv_heads key/value heads; query
head i reads key/value head g(i) = i // (n_heads / n_kv_heads):
- MHA: n_kv_heads = n_heads; GQA: 1 < n_kv_heads < n_heads; MQA: n_kv_heads = 1.

The layer's core is short: project q, k, v; normalise (QK-norm) and rotate (RoPE) the new rows; read
(``_read``: store in the cache, attend by the layer's path); project out. The construction arguments are
the layout (d, h, g, d_h, biases, fused QKV), ``causal``, ``rope``, the attention ``backend`` and dropout;
everything else a family changes is one ``AttentionVariant``, fixed when the layer is built:
cross-attention (keys and values from an encoder's output), sliding windows, StreamingLLM kept
initial tokens (``keep``), gpt-oss attention sinks (a learned per-head logit in the softmax
denominator), ALiBi, and three more that real families use:
- ``qk_norm`` (Qwen3, Gemma 3): an RMSNorm over each head's d_h channels of q and of k, applied
  before RoPE, so that the size of a score no longer grows with the size of the projections;
- ``scale``: the score factor when it is not 1 / sqrt(d_h) (Gemma's ``query_pre_attn_scalar`` s
  gives scale = s^(-1/2));
- ``softcap`` (Gemma 2): scores pass through c tanh(score / c) before the mask and the softmax, a
  smooth clamp to (-c, c) (``softcapped_attention``, the written-out path it forces).

The cache contract (``companion.cache``): forward gets the new rows x, their absolute positions and
an optional per-layer cache view; q, k, v are computed for the new rows only, RoPE is applied at the
absolute positions, k and v go to the view, and the new queries attend over everything it returns.
The attention path is chosen when the layer is built (again only if ``causal`` is set on it) and kept as data: ``self.path`` is "causal"
(causal, optionally windowed: the backend's fused kernel), "positions" (kept initial tokens: a mask from
absolute positions), "full" (encoder self-attention), "softcap" (Gemma 2's capped scores, written out)
or "cross"; ``self.cache_attends`` says whether a cache view may attend for the layer
(``LayerCache.attend``, plain causal attention only). A paged batch does: it stores k, v and reads
them back through its seats or a paged-attention kernel (``companion.inference.batch``: there the
engine's decode read ends); other views return None and the layer reads what ``update`` returns.

Two helpers for chapter 8: ``head_map(h, g)``, the map pi(r) from query heads to key/value heads, and
``sharing_costs(d, h, g, d_h, T)``, what scales with g (projection width, cache) and what with h
(score and value arithmetic), by formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS, attend
from companion.cache import LayerCache
from companion.norms import RMSNorm
from companion.positions import RotaryEmbedding, alibi_bias, alibi_slopes

__all__ = ["MultiHeadAttention", "AttentionVariant", "position_mask", "check_heads", "softcapped_attention", "head_map",
           "sharing_costs"]


def check_heads(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int | None) -> int:
    """Validate the head layout and return the head width d_h."""
    if n_heads < 1 or n_kv_heads < 1:
        raise ValueError(f"n_heads and n_kv_heads must be >= 1; got {n_heads}, {n_kv_heads}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads}): each kv head serves a whole group of query heads")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}) when head_dim is not given")
        head_dim = d_model // n_heads
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1; got {head_dim}")
    return head_dim


def head_map(n_heads: int, n_kv_heads: int) -> Tensor:
    """pi(r) = floor(r / (h / g)): the key/value head that query head r reads (chapter 8, 0-based).

    Returns a (h,) long tensor. Consecutive query heads form a group of h / g that shares one key/value
    head; this is the order ``companion.kernels.attend.expand_kv`` (``repeat_interleave``) produces and
    the order in which released GQA checkpoints store their heads.
    """
    check_heads(n_heads, n_heads, n_kv_heads, 1)
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def sharing_costs(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int | None = None,
                  tokens: int = 1) -> dict[str, int]:
    """What one self-attention layer with h query and g key/value heads costs, by formula (chapter 8).

    For T = ``tokens`` rows attending over all T rows (the full T x T grid, as a direct
    implementation computes it before masking):
    - ``q_params`` d h d_h, ``kv_params`` 2 d g d_h, ``out_params`` h d_h d (no biases);
    - ``kv_cache_per_token`` 2 g d_h numbers (K and V; times L layers and b bytes: 2 B L T g d_h b);
    - ``projection_flops`` 2 T d (h + 2g) d_h + 2 T h d_h d;
    - ``score_flops`` 2 h T^2 d_h (Q_r K_pi(r)^T for every query head r) and ``value_flops``
      2 h T^2 d_h (A_r V_pi(r)): these depend on h, not on g.
    """
    d_h = check_heads(d_model, n_heads, n_kv_heads, head_dim)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an int >= 1; got {tokens!r}")
    h, g, d, T = n_heads, n_kv_heads, d_model, tokens
    return {
        "q_params": d * h * d_h,
        "kv_params": 2 * d * g * d_h,
        "out_params": h * d_h * d,
        "kv_cache_per_token": 2 * g * d_h,
        "projection_flops": 2 * T * d * (h + 2 * g) * d_h + 2 * T * h * d_h * d,
        "score_flops": 2 * h * T * T * d_h,
        "value_flops": 2 * h * T * T * d_h,
    }


def position_mask(
    q_positions: Tensor, k_positions: Tensor, *, causal: bool = True, window: int | None = None, keep: int = 0
) -> Tensor:
    """Boolean (T, S) mask from absolute positions: key j is readable by query i when
    p_j <= p_i (causal), p_i - p_j < window (sliding window), or p_j < keep (kept initial tokens,
    still causal). Working from positions, not indices, keeps it right for any cache layout."""
    qp, kp = q_positions[:, None], k_positions[None, :]
    allowed = kp <= qp if causal else torch.ones(qp.shape[0], kp.shape[1], dtype=torch.bool, device=qp.device)
    if window is not None:
        near = (qp - kp) < window
        if keep:
            near = near | (kp < keep)
        allowed = allowed & near
    return allowed


def softcapped_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float, cap: float, sinks: Tensor | None = None
) -> Tensor:
    """softmax(c tanh(q k^T scale / c) + M) v with M = -inf where ``allowed`` is False (Gemma 2).

    q (B, h, T, d), k and v (B, g, S, d) with g dividing h, allowed broadcastable to (B, h, T, S),
    sinks (h,) optional per-head sink logits in the denominator. A row with no readable key is zero.
    """
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = cap * torch.tanh(scores / cap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)
        weights = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
    else:
        weights = scores.softmax(dim=-1)
    return torch.matmul(weights.nan_to_num(0.0), v)


@dataclass(frozen=True)
class AttentionVariant:
    """What a layer computes besides plain attention, fixed when the layer is built (``MultiHeadAttention``'s
    ``variant``). The defaults are the 2017 layer.

    cross: keys and values come from ``memory`` (an encoder's output): never causal, no positions.
    window: sliding window of w tokens (query p reads keys p - w + 1 .. p); keep: StreamingLLM's kept
        initial tokens, readable beside the window.
    sinks: one learned sink logit per head in the softmax denominator (gpt-oss).
    alibi: ALiBi's linear biases instead of rotary positions.
    qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3), eps ``qk_norm_eps``,
        gain 1 + w when ``qk_norm_offset`` (as Gemma 3 stores it).
    scale: the score factor when it is not 1 / sqrt(d_h) (Gemma's query_pre_attn_scalar s: s^(-1/2)).
    softcap: c of Gemma 2's score cap c tanh(score / c), or None.
    """

    cross: bool = False
    window: int | None = None
    keep: int = 0
    sinks: bool = False
    alibi: bool = False
    qk_norm: bool = False
    qk_norm_eps: float = 1e-6
    qk_norm_offset: bool = False
    scale: float | None = None
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 (a query always sees itself) or None; got {self.window}")
        if self.keep < 0:
            raise ValueError(f"keep must be >= 0; got {self.keep}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be > 0 or None; got {self.scale}")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap must be > 0 or None; got {self.softcap}")
        if self.cross and (self.window is not None or self.alibi):
            raise ValueError("cross-attention takes no window, rope or alibi: encoder positions are not comparable to decoder ones")


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with h query heads and g key/value heads (g divides h).

    Args:
        d_model: width of the residual stream d.
        n_heads, n_kv_heads: h and g (n_kv_heads defaults to n_heads: MHA).
        head_dim: d_h, defaults to d_model / n_heads.
        bias: biases on the q, k, v projections (GPT-2, the 2017 model, gpt-oss); ``out_bias`` on W_O.
        fused_qkv: one (d, (h + 2g) d_h) matrix for q, k, v instead of three; same function, one matmul.
        causal: mask the future (the one option a built layer may change: chapter 4's exercise turns
            it off in a copy, and the path is chosen again).
        rope: a ``RotaryEmbedding`` applied to q and k.
        backend: "auto", "reference", "sdpa", ... (``companion.kernels.attend.BACKENDS``).
        dropout: on the output, in training.
        variant: an ``AttentionVariant`` (cross-attention, window, kept tokens, sinks, ALiBi, QK-norm,
            scale, soft-cap); None is the plain layer.
    """

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None, *,
        bias: bool = False, out_bias: bool | None = None, fused_qkv: bool = True, causal: bool = True,
        rope: RotaryEmbedding | None = None, backend: str = "auto", dropout: float = 0.0,
        variant: AttentionVariant | None = None,
    ):
        super().__init__()
        self.variant = v = variant if variant is not None else AttentionVariant()
        if not isinstance(v, AttentionVariant):
            raise ValueError(f"variant must be an AttentionVariant or None; got {type(v).__name__}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.head_dim = check_heads(d_model, n_heads, n_kv_heads, head_dim)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if rope is not None and v.alibi:
            raise ValueError("use either rope or alibi, not both")
        if rope is not None and v.cross:
            raise ValueError("cross-attention takes no window, rope or alibi: encoder positions are not comparable to decoder ones")
        if rope is not None and rope.head_dim != self.head_dim:
            raise ValueError(f"rope.head_dim ({rope.head_dim}) must equal the attention head_dim ({self.head_dim})")
        self.d_model, self.n_heads, self.n_kv_heads, self.backend = d_model, n_heads, n_kv_heads, backend
        self.fused_qkv = fused_qkv and not v.cross  # cross-attention reads two different inputs
        h, g, dh = n_heads, n_kv_heads, self.head_dim
        if self.fused_qkv:
            self.qkv = nn.Linear(d_model, (h + 2 * g) * dh, bias=bias)
        else:
            self.q = nn.Linear(d_model, h * dh, bias=bias)
            self.k = nn.Linear(d_model, g * dh, bias=bias)
            self.v = nn.Linear(d_model, g * dh, bias=bias)
        self.out = nn.Linear(h * dh, d_model, bias=bias if out_bias is None else out_bias)
        self.rope = rope
        if v.alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(h), persistent=False)
        else:
            self.alibi_slopes = None
        # Sink logits start at 0: the "nowhere" option begins as likely as one ordinary key with score 0.
        self.sinks = nn.Parameter(torch.zeros(h)) if v.sinks else None
        self.dropout = nn.Dropout(dropout)
        if v.qk_norm:  # created only when asked, so other models' state dicts are unchanged
            self.q_norm = RMSNorm(dh, v.qk_norm_eps, offset=v.qk_norm_offset)
            self.k_norm = RMSNorm(dh, v.qk_norm_eps, offset=v.qk_norm_offset)
        self.causal = causal  # chooses the path

    # the variant, read as attributes (fixed: build another layer to change them)
    cross = property(lambda self: self.variant.cross)
    window = property(lambda self: self.variant.window)
    keep = property(lambda self: self.variant.keep)
    scale = property(lambda self: self.variant.scale)
    softcap = property(lambda self: self.variant.softcap)
    qk_norm = property(lambda self: self.variant.qk_norm)

    @property
    def causal(self) -> bool:
        return self._causal

    @causal.setter
    def causal(self, value: bool) -> None:
        """Set causal and choose the path: "cross", "softcap" (Gemma 2's capped scores, written out),
        "full" (encoder self-attention), "causal" (causal, optionally windowed: the backend's fused
        kernel) or "positions" (kept initial tokens: a mask from absolute positions)."""
        v = self.variant
        self._causal = bool(value) and not v.cross  # keys from the encoder's memory: never causal
        if v.cross:
            self.path = "cross"
        elif v.softcap is not None:
            self.path = "softcap"
        elif not self._causal and v.window is None:
            self.path = "full"
        else:
            self.path = "causal" if v.keep == 0 else "positions"
        # A cache view may attend for the layer (``LayerCache.attend``: store k, v and return causal,
        # optionally windowed attention with 1 / sqrt(d_h)) only when that is all this layer computes
        self.cache_attends = self.path == "causal" and not (v.sinks or v.alibi) and v.scale is None

    def _split_heads(self, x: Tensor, n: int) -> Tensor:  # (B, T, n*d_h) -> (B, n, T, d_h)
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def project_qkv(self, x: Tensor, memory: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, h, T, d_h), k and v (B, g, S, d_h) for the new rows (or the memory's rows)."""
        h, g, dh = self.n_heads, self.n_kv_heads, self.head_dim
        if self.fused_qkv:
            q, k, v = self.qkv(x).split([h * dh, g * dh, g * dh], dim=-1)
        else:
            src = memory if self.cross else x
            q, k, v = self.q(x), self.k(src), self.v(src)
        return self._split_heads(q, h), self._split_heads(k, g), self._split_heads(v, g)

    # the core: project, normalise and rotate, read (``_read``), project out ----------------------------
    def forward(self, x: Tensor, positions: Tensor | None = None, cache: LayerCache | None = None, *,
                memory: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """x (B, T, d) -> (B, T, d).

        positions: (T,) absolute positions of the new rows; default cache.length + arange(T).
        cache: this layer's view, or None (attend over x's own rows).
        memory: (B, S, d) encoder output, cross-attention only.
        mask: extra boolean mask broadcastable to (B, h, T, S), True = may read (e.g. padding).
        """
        B, T = self._check(x, cache, memory)
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T, device=x.device)
        q, k, v = self.project_qkv(x, memory)
        if self.qk_norm:  # per head, before RoPE (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:  # rotate at absolute positions BEFORE k is stored
            if positions.shape[0] != T:
                raise ValueError(f"positions must have one entry per row: {positions.shape[0]} vs T={T}")
            q, k = self.rope.rotate_qk(q, k, positions.to(x.device))  # one lookup for q and k
        out = self._read(q, k, v, positions, cache, mask)  # (B, h, T, d_h)
        return self._dropout(self.out(out.transpose(1, 2).reshape(B, T, -1)))

    def _check(self, x: Tensor, cache: LayerCache | None, memory: Tensor | None) -> tuple[int, int]:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}); got {tuple(x.shape)}")
        if self.cross and memory is None:
            raise ValueError("cross-attention needs memory (B, S, d_model)")
        if self.cross and cache is not None:
            raise ValueError("cross-attention keeps no cache here: its keys come from the fixed memory")
        return x.shape[0], x.shape[1]

    def _read(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cache: LayerCache | None,
              mask: Tensor | None) -> Tensor:
        """Store the new k, v in the cache (if any) and attend over every key it holds, by the path."""
        if cache is not None and self.cache_attends and mask is None:
            # A cache that can attend itself (a paged batch: its seats, or a kernel that reads the
            # pages) stores k, v and returns the output; None = it cannot, read it below.
            out = cache.attend(q, k, v, positions, window=self.window, backend=self.backend)
            if out is not None:
                return out
        if cache is not None:  # store the new rows, attend over everything the view returns
            k_positions, (k, v) = cache.update(positions, k, v)
            same_sequence = cache.same_sequence  # (T, S) when the view packs several sequences
            k_positions = k_positions.to(positions.device)
        else:
            k_positions, same_sequence = positions, None
        bias = None if self.alibi_slopes is None else alibi_bias(self.alibi_slopes, positions, k_positions)
        return self._PATHS[self.path](self, q, k, v, positions, k_positions, same_sequence, mask, bias)


    # The attention paths (``self.path``). Each gets q (B, h, T, d), k, v (B, g, S, d), the query and
    # key positions, the packed view's same-sequence mask (or None), the extra mask and ALiBi's bias.

    def _allowed(self, positions, k_positions, same_sequence, mask) -> Tensor:
        """(T, S) boolean from the absolute positions (causal, window, kept tokens), the same-sequence
        blocks of a packed batch and the extra mask."""
        allowed = position_mask(positions, k_positions, causal=self.causal, window=self.window, keep=self.keep)
        if same_sequence is not None:
            allowed = allowed & same_sequence.to(allowed.device)
        return allowed if mask is None else allowed & mask

    def _attend_causal(self, q, k, v, positions, k_positions, same_sequence, mask, bias) -> Tensor:
        """Causal (+ window): the stored keys are contiguous positions ending at the newest row, so
        query i sits at S - T + i (attend's convention) and the backend may use its fused causal /
        windowed kernel; a packed batch of sequences needs the mask from positions instead."""
        if same_sequence is not None:
            return self._attend_positions(q, k, v, positions, k_positions, same_sequence, mask, bias)
        return attend(q, k, v, causal=True, window=self.window, mask=mask, backend=self.backend, bias=bias,
                      sinks=self.sinks, scale=self.scale)

    def _attend_positions(self, q, k, v, positions, k_positions, same_sequence, mask, bias) -> Tensor:
        """Kept tokens (or packed sequences): the mask from the absolute positions themselves."""
        allowed = self._allowed(positions, k_positions, same_sequence, mask)
        return attend(q, k, v, mask=allowed, backend=self.backend, bias=bias, sinks=self.sinks, scale=self.scale)

    def _attend_full(self, q, k, v, positions, k_positions, same_sequence, mask, bias) -> Tensor:
        """Encoder self-attention: every key, only the extra mask (and a packed view's blocks)."""
        if same_sequence is not None:
            return self._attend_positions(q, k, v, positions, k_positions, same_sequence, mask, bias)
        return attend(q, k, v, mask=mask, backend=self.backend, bias=bias, sinks=self.sinks, scale=self.scale)

    def _attend_softcap(self, q, k, v, positions, k_positions, same_sequence, mask, bias) -> Tensor:
        """Gemma 2: the cap acts on the scores themselves, so they are written out. Causal and window
        by token index, as the "causal" path's fused kernel masks (query i at S - T + i over contiguous
        stored keys) and as transformers masks: position values with gaps or restarts only rotate."""
        if same_sequence is None and not self.keep:
            S, T = k.shape[-2], q.shape[-2]
            k_positions = torch.arange(S, device=q.device)
            positions = k_positions[S - T:]
        scale = self.scale if self.scale is not None else self.head_dim ** -0.5
        return softcapped_attention(q, k, v, self._allowed(positions, k_positions, same_sequence, mask), scale,
                                    self.softcap, self.sinks)

    _PATHS = {"causal": _attend_causal, "positions": _attend_positions, "full": _attend_full, "softcap": _attend_softcap,
              "cross": _attend_full}  # cross: every key of the memory, only the extra mask

    def _dropout(self, x: Tensor) -> Tensor:
        """Dropout where it acts (training, p > 0); otherwise x itself, without a module call."""
        return self.dropout(x) if self.training and self.dropout.p else x

    def extra_repr(self) -> str:
        kind = "MHA" if self.n_kv_heads == self.n_heads else ("MQA" if self.n_kv_heads == 1 else "GQA")
        parts = [f"{kind}, h={self.n_heads}, g={self.n_kv_heads}, d_h={self.head_dim}"]
        if self.cross:
            parts.append("cross")
        if self.window is not None:
            parts.append(f"window={self.window}")
        if self.keep:
            parts.append(f"keep={self.keep}")
        if self.sinks is not None:
            parts.append("sinks")
        if self.alibi_slopes is not None:
            parts.append("alibi")
        parts.append(f"backend={self.backend}")
        return ", ".join(parts)
