"""The multi-head attention layer every model uses (chapters 1, 6, 8 and 9).

MultiHead(X) = Concat(head_1, ..., head_h) W_O, head_i = Attn(X W_Q^i, X W_K^{g(i)}, X W_V^{g(i)})
(Vaswani et al. 2017, section 3.2.2), with n_heads query heads and n_kv_heads key/value heads; query
head i reads key/value head g(i) = i // (n_heads / n_kv_heads):
- MHA: n_kv_heads = n_heads; GQA: 1 < n_kv_heads < n_heads; MQA: n_kv_heads = 1.

Options, each one a constructor argument: fused QKV projection (one matrix, one matmul), biases,
cross-attention (keys and values from an encoder's output), causal / padding / sliding-window masks,
StreamingLLM kept initial tokens (``keep``), gpt-oss attention sinks (a learned per-head logit in
the softmax denominator), RoPE or ALiBi, and the attention backend (``companion.kernels.attend``).
Three more options that real families use:
- ``qk_norm`` (Qwen3, Gemma 3): an RMSNorm over each head's d_h channels of q and of k, applied
  before RoPE, so that the size of a score no longer grows with the size of the projections;
- ``scale``: the score factor when it is not 1 / sqrt(d_h) (Gemma's ``query_pre_attn_scalar`` s
  gives scale = s^(-1/2));
- ``softcap`` (Gemma 2): scores pass through c tanh(score / c) before the mask and the softmax, a
  smooth clamp to (-c, c) (``softcapped_attention``, the written-out path it forces).

The cache contract (``companion.cache``): forward gets the new rows x, their absolute positions and
an optional per-layer cache view; q, k, v are computed for the new rows only, RoPE is applied at the
absolute positions, k and v go to the view, and the new queries attend over everything it returns.
The attention path is chosen once, when the layer is built, and kept as data: ``self.path`` is "causal"
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


import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS, attend
from companion.cache import LayerCache
from companion.norms import RMSNorm
from companion.positions import RotaryEmbedding, alibi_bias, alibi_slopes

__all__ = ["MultiHeadAttention", "position_mask", "check_heads", "softcapped_attention", "head_map",
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


def _path_option(name: str) -> property:
    """An attention option the layer's path is chosen from (``MultiHeadAttention._choose_path``):
    stored as ``_name``; setting it chooses the path again."""
    private = "_" + name

    def get(self):
        return getattr(self, private)

    def set(self, value) -> None:
        setattr(self, private, value)
        self._choose_path()

    return property(get, set)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with h query heads and g key/value heads (g divides h).

    Args:
        d_model: width of the residual stream d.
        n_heads, n_kv_heads: h and g (n_kv_heads defaults to n_heads: MHA).
        head_dim: d_h, defaults to d_model / n_heads.
        bias: biases on the q, k, v projections (GPT-2, the 2017 model, gpt-oss); ``out_bias`` on W_O.
        fused_qkv: one (d, (h + 2g) d_h) matrix for q, k, v instead of three; same function, one matmul.
        cross: keys and values come from ``memory`` (the encoder output), never causal, no positions.
        causal, window, keep: masking (window = sliding window of w tokens; keep = kept initial tokens).
        sinks: learn one sink logit per head (gpt-oss).
        rope: a ``RotaryEmbedding`` applied to q and k; ``alibi``: add ALiBi biases instead.
        backend: "auto", "reference", "sdpa", ... (``companion.kernels.attend.BACKENDS``).
        qk_norm: RMSNorm on each head of q and k before RoPE (eps ``qk_norm_eps``, gain 1 + w when
            ``qk_norm_offset``, as Gemma 3 stores it).
        scale: score factor (default 1 / sqrt(d_h)); softcap: c of the score soft-cap, or None.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        bias: bool = False,
        out_bias: bool | None = None,
        fused_qkv: bool = True,
        cross: bool = False,
        causal: bool = True,
        window: int | None = None,
        keep: int = 0,
        sinks: bool = False,
        rope: RotaryEmbedding | None = None,
        alibi: bool = False,
        backend: str = "auto",
        dropout: float = 0.0,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        qk_norm_offset: bool = False,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be > 0 or None; got {scale}")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"softcap must be > 0 or None; got {softcap}")
        self.head_dim = check_heads(d_model, n_heads, n_kv_heads, head_dim)
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 (a query always sees itself) or None; got {window}")
        if keep < 0:
            raise ValueError(f"keep must be >= 0; got {keep}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if rope is not None and alibi:
            raise ValueError("use either rope or alibi, not both")
        if rope is not None and rope.head_dim != self.head_dim:
            raise ValueError(f"rope.head_dim ({rope.head_dim}) must equal the attention head_dim ({self.head_dim})")
        if cross and (window is not None or rope is not None or alibi):
            raise ValueError("cross-attention takes no window, rope or alibi: encoder positions are not comparable to decoder ones")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.cross, self._causal = cross, causal  # _choose_path: a cross layer is never causal
        self._window, self._keep, self.backend = window, keep, backend
        self.fused_qkv = fused_qkv and not cross  # cross-attention reads two different inputs
        h, g, dh = n_heads, n_kv_heads, self.head_dim
        if self.fused_qkv:
            self.qkv = nn.Linear(d_model, (h + 2 * g) * dh, bias=bias)
        else:
            self.q = nn.Linear(d_model, h * dh, bias=bias)
            self.k = nn.Linear(d_model, g * dh, bias=bias)
            self.v = nn.Linear(d_model, g * dh, bias=bias)
        self.out = nn.Linear(h * dh, d_model, bias=bias if out_bias is None else out_bias)
        self.rope = rope
        if alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(h), persistent=False)
        else:
            self.alibi_slopes = None
        # Sink logits start at 0: the "nowhere" option begins as likely as one ordinary key with score 0.
        self.sinks = nn.Parameter(torch.zeros(h)) if sinks else None
        self.dropout = nn.Dropout(dropout)
        self.scale, self.softcap = scale, softcap
        if qk_norm:  # created only when asked, so other models' state dicts are unchanged
            self.q_norm = RMSNorm(dh, qk_norm_eps, offset=qk_norm_offset)
            self.k_norm = RMSNorm(dh, qk_norm_eps, offset=qk_norm_offset)
        self.qk_norm = qk_norm
        self._choose_path()

    def _choose_path(self) -> None:
        """The attention path, chosen once from the options ("cross" or a key of ``_PATHS``), not at
        every call; again only when ``causal``, ``window`` or ``keep`` is set on a built layer."""
        if self.cross:
            self._causal = False  # keys from the encoder's memory: never causal, whatever was set
            self.path = "cross"
        elif self.softcap is not None:
            self.path = "softcap"
        elif not self._causal and self._window is None:
            self.path = "full"
        else:
            self.path = "causal" if self._keep == 0 else "positions"
        # A cache view may attend for the layer (``LayerCache.attend``: store k, v and return causal,
        # optionally windowed attention with 1 / sqrt(d_h)) only when that is all this layer computes:
        # no sinks, ALiBi, kept tokens, own scale or cap (and, per call, no extra mask)
        self.cache_attends = (self.path == "causal" and self.sinks is None and self.alibi_slopes is None
                              and self.scale is None)

    # The options the path depends on: setting one on a built layer (chapter 4's exercise turns
    # ``causal`` off in a copy) chooses the path again instead of being ignored.
    causal = _path_option("causal")
    window = _path_option("window")
    keep = _path_option("keep")

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

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        *,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, d) -> (B, T, d).

        positions: (T,) absolute positions of the new rows; default cache.length + arange(T).
        cache: this layer's view, or None (attend over x's own rows).
        memory: (B, S, d) encoder output, cross-attention only.
        mask: extra boolean mask broadcastable to (B, h, T, S), True = may read (e.g. padding).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}); got {tuple(x.shape)}")
        if self.path == "cross":
            if memory is None:
                raise ValueError("cross-attention needs memory (B, S, d_model)")
            if cache is not None:
                raise ValueError("cross-attention keeps no cache here: its keys come from the fixed memory")
            q, k, v = self.project_qkv(x, memory)
            out = attend(q, k, v, mask=mask, backend=self.backend, sinks=self.sinks, scale=self.scale)
            return self._dropout(self.out(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)))

        B, T, _ = x.shape
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T, device=x.device)
        q, k, v = self.project_qkv(x)
        if self.qk_norm:  # per head, before RoPE (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:  # rotate at absolute positions BEFORE k is stored
            if positions.shape[0] != T:
                raise ValueError(f"positions must have one entry per row: {positions.shape[0]} vs T={T}")
            q, k = self.rope.rotate_qk(q, k, positions.to(x.device))  # one lookup for q and k
        out = None
        if cache is not None and self.cache_attends and mask is None:
            # A cache that can attend itself (a paged batch: its seats, or a kernel that reads the
            # pages) stores k, v and returns the output; None = it cannot, read it below.
            out = cache.attend(q, k, v, positions, window=self.window, backend=self.backend)
        if out is None:
            if cache is not None:  # store the new rows, attend over everything the view returns
                k_positions, (k, v) = cache.update(positions, k, v)
                same_sequence = cache.same_sequence  # (T, S) when the view packs several sequences
                k_positions = k_positions.to(positions.device)
            else:
                k_positions, same_sequence = positions, None
            bias = None if self.alibi_slopes is None else alibi_bias(self.alibi_slopes, positions, k_positions)
            out = self._PATHS[self.path](self, q, k, v, positions, k_positions, same_sequence, mask, bias)
        return self._dropout(self.out(out.transpose(1, 2).reshape(B, T, -1)))

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

    _PATHS = {"causal": _attend_causal, "positions": _attend_positions, "full": _attend_full, "softcap": _attend_softcap}

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
