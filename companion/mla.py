"""Multi-head latent attention, MLA (DeepSeek-V2/V3; chapter 8).

Keys and values of every head are rebuilt from one small latent per token:
    c_j = RMSNorm(x_j W_DKV)                     (d_c numbers: what the cache stores)
    k_j^{C,r} = c_j U_K^r,   v_j^r = c_j U_V^r    (per-head up-projections)
    k_j^R = RoPE_j(x_j W_KR)                     (d_R numbers, one RoPE key shared by all heads; cached)
Queries, optionally through their own low-rank bottleneck c'_i = RMSNorm(x_i W_DQ):
    q_i^{C,r} = c'_i U_Q^r,   q_i^{R,r} = RoPE_i(c'_i U_QR^r)
    score_ij^r = (q_i^{C,r} . k_j^{C,r} + q_i^{R,r} . k_j^R) / sqrt(d_h + d_R)
RoPE is position dependent, so it cannot be folded into a fixed projection; that is why position
travels on the separate, uncompressed key k^R.

Two ways to compute the same thing:
- expanded: rebuild K^C and V for every cached position, then ordinary attention;
- absorbed (decode): q^{C,r} . (c_j U_K^r) = (q^{C,r} U_K^{rT}) . c_j, so each head's query is moved
  into latent space once and scores are taken against the cached latents directly; likewise
  sum_j a_ij c_j U_V^r = (sum_j a_ij c_j) U_V^r. Historical K and V are never materialised; the
  whole thing is MQA with one shared key [c_j, k_j^R] of width d_c + d_R and value c_j.
Cache per token and layer: d_c + d_R numbers, against 2 h d_h for MHA.

The pieces, for teaching and testing (chapter 8): ``latents`` (what is cached), ``queries``,
``expand`` (the historical K and V rebuilt from the cache), ``absorb_query`` (q^C U_K^T per head) and
``cache_width`` (d_c + d_R).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from companion.kernels.attend import BACKENDS, attend
from companion.cache import LayerCache
from companion.mha import position_mask
from companion.norms import RMSNorm
from companion.positions import RotaryEmbedding

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(nn.Module):
    """MLA with latent KV compression, decoupled RoPE and an optional query compression.

    Args:
        d_model, n_heads: d and h.
        kv_rank: d_c, the latent width (what is cached, with d_R).
        q_rank: d_c' for the query bottleneck, or None for a plain W_Q (DeepSeek-V2-Lite).
        head_dim: d_h of the content part of q and k; rope_dim: d_R; v_head_dim: d_v (default d_h).
        rope_base, rope: the RoPE used for the decoupled parts (a ``RotaryEmbedding`` of width d_R).
        absorbed: compute with the absorbed path (see module docstring); same outputs.
        norm_eps: eps of the two latent RMSNorms (on c and c'). DeepSeek-V3 fixes it at 1e-6, apart
            from the ``rms_norm_eps`` of the block's own norms: keep the two separate.
        scale: the score factor, default 1 / sqrt(d_h + d_R) (DeepSeek-V3 with YaRN multiplies it by
            (0.1 mscale_all_dim ln s + 1)^2).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_rank: int,
        q_rank: int | None = None,
        head_dim: int,
        rope_dim: int,
        v_head_dim: int | None = None,
        rope: RotaryEmbedding | None = None,
        absorbed: bool = False,
        backend: str = "auto",
        norm_eps: float = 1e-6,
        scale: float | None = None,
    ):
        super().__init__()
        for name, val in (("n_heads", n_heads), ("kv_rank", kv_rank), ("head_dim", head_dim), ("rope_dim", rope_dim)):
            if val < 1:
                raise ValueError(f"{name} must be >= 1; got {val}")
        if rope_dim % 2:
            raise ValueError(f"rope_dim must be even for RoPE (channels rotate in pairs); got {rope_dim}")
        if q_rank is not None and q_rank < 1:
            raise ValueError(f"q_rank must be >= 1 or None; got {q_rank}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        self.d_model, self.n_heads, self.kv_rank, self.q_rank = d_model, n_heads, kv_rank, q_rank
        self.head_dim, self.rope_dim = head_dim, rope_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.absorbed, self.backend = absorbed, backend
        h, qk = n_heads, head_dim + rope_dim
        if q_rank is None:
            self.q_proj = nn.Linear(d_model, h * qk, bias=False)
        else:
            self.q_down = nn.Linear(d_model, q_rank, bias=False)
            self.q_norm = RMSNorm(q_rank, norm_eps)
            self.q_up = nn.Linear(q_rank, h * qk, bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank + rope_dim, bias=False)  # [W_DKV | W_KR] in one matmul
        self.kv_norm = RMSNorm(kv_rank, norm_eps)
        self.k_up = nn.Linear(kv_rank, h * head_dim, bias=False)  # U_K, all heads
        self.v_up = nn.Linear(kv_rank, h * self.v_head_dim, bias=False)  # U_V, all heads
        self.out = nn.Linear(h * self.v_head_dim, d_model, bias=False)
        self.rope = rope if rope is not None else RotaryEmbedding(rope_dim)
        if self.rope.head_dim != rope_dim:
            raise ValueError(f"rope.head_dim ({self.rope.head_dim}) must equal rope_dim ({rope_dim})")
        if scale is not None and not scale > 0:
            raise ValueError(f"scale must be > 0 or None; got {scale}")
        self.scale = 1.0 / math.sqrt(qk) if scale is None else scale

    def queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, d) -> q^C (B, h, T, d_h), q^R (B, h, T, d_R) with RoPE applied."""
        B, T, _ = x.shape
        q = self.q_proj(x) if self.q_rank is None else self.q_up(self.q_norm(self.q_down(x)))
        q = q.view(B, T, self.n_heads, self.head_dim + self.rope_dim).transpose(1, 2)
        q_c, q_r = q.split([self.head_dim, self.rope_dim], dim=-1)
        return q_c, self.rope(q_r, positions)

    def latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, d) -> c (B, T, d_c) and k^R (B, T, d_R): the two things MLA caches."""
        c, k_r = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)
        return self.kv_norm(c), self.rope(k_r, positions)

    @property
    def cache_width(self) -> int:
        """Numbers cached per token and layer: d_c + d_R (the latent c_j and the shared RoPE key)."""
        return self.kv_rank + self.rope_dim

    def absorb_query(self, q_c: Tensor) -> Tensor:
        """q^C (B, h, T, d_h) -> q^C U_K^{rT} per head (B, h, T, d_c): the query moved into latent space,
        so that q^{C,r} . (c_j U_K^r) = (q^{C,r} U_K^{rT}) . c_j for every cached latent c_j."""
        if q_c.dim() != 4 or q_c.shape[1] != self.n_heads or q_c.shape[-1] != self.head_dim:
            raise ValueError(f"q_c must have shape (B, h={self.n_heads}, T, d_h={self.head_dim}); got {tuple(q_c.shape)}")
        w_uk = self.k_up.weight.view(self.n_heads, self.head_dim, self.kv_rank)  # U_K^r as (d_h, d_c)
        return torch.einsum("bhtd,hdc->bhtc", q_c, w_uk)

    def expand(self, c: Tensor, k_r: Tensor) -> tuple[Tensor, Tensor]:
        """Rebuild every head's key and value from the cache: c (B, S, d_c), k^R (B, S, d_R) ->
        k (B, h, S, d_h + d_R) = [c U_K^r, k^R] and v (B, h, S, d_v) = c U_V^r (the expanded path)."""
        if c.dim() != 3 or c.shape[-1] != self.kv_rank:
            raise ValueError(f"c must have shape (B, S, d_c={self.kv_rank}); got {tuple(c.shape)}")
        if k_r.shape != (*c.shape[:2], self.rope_dim):
            raise ValueError(f"k_r must have shape (B, S, d_R) = {(*c.shape[:2], self.rope_dim)}; got {tuple(k_r.shape)}")
        B, S, _ = c.shape
        h = self.n_heads
        k_c = self.k_up(c).view(B, S, h, self.head_dim).transpose(1, 2)
        v = self.v_up(c).view(B, S, h, self.v_head_dim).transpose(1, 2)
        return torch.cat((k_c, k_r.unsqueeze(1).expand(B, h, S, self.rope_dim)), dim=-1), v

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
        *,
        mask: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, d) -> (B, T, d); causal self-attention over the cached and new rows."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}); got {tuple(x.shape)}")
        B, T, _ = x.shape
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T, device=x.device)
        q_c, q_r = self.queries(x, positions)
        c, k_r = self.latents(x, positions)
        causal = True
        if cache is not None:
            k_positions, (c, k_r) = cache.update(positions, c, k_r)  # (B, S, d_c), (B, S, d_R)
            same_sequence = cache.same_sequence
            if same_sequence is not None:  # packed sequences: causality from absolute positions, per sequence
                allowed = position_mask(positions, k_positions.to(positions.device)) & same_sequence.to(positions.device)
                mask, causal = (allowed if mask is None else allowed & mask), False
        h, S = self.n_heads, c.shape[1]
        if self.absorbed:
            w_uk = self.k_up.weight.view(h, self.head_dim, self.kv_rank)  # U_K^r as (d_h, d_c) per head
            w_uv = self.v_up.weight.view(h, self.v_head_dim, self.kv_rank)
            q_lat = torch.einsum("bhtd,hdc->bhtc", q_c, w_uk)  # q^C U_K^T: the query in latent space
            query = torch.cat((q_lat, q_r), dim=-1)  # (B, h, T, d_c + d_R)
            key = torch.cat((c, k_r), dim=-1).unsqueeze(1)  # (B, 1, S, d_c + d_R): one shared "head"
            o_lat = attend(query, key, c.unsqueeze(1), causal=causal, mask=mask, scale=self.scale, backend=self.backend)
            o = torch.einsum("bhtc,hvc->bhtv", o_lat, w_uv)  # (sum_j a_ij c_j) U_V
        else:
            k_c = self.k_up(c).view(B, S, h, self.head_dim).transpose(1, 2)  # (B, h, S, d_h)
            v = self.v_up(c).view(B, S, h, self.v_head_dim).transpose(1, 2)
            k = torch.cat((k_c, k_r.unsqueeze(1).expand(B, h, S, self.rope_dim)), dim=-1)
            query = torch.cat((q_c, q_r), dim=-1)
            o = attend(query, k, v, causal=causal, mask=mask, scale=self.scale, backend=self.backend)
        return self.out(o.transpose(1, 2).reshape(B, T, -1))

    def extra_repr(self) -> str:
        return (
            f"h={self.n_heads}, d_c={self.kv_rank}, q_rank={self.q_rank}, d_h={self.head_dim}, d_R={self.rope_dim}, "
            f"d_v={self.v_head_dim}, absorbed={self.absorbed}, backend={self.backend}"
        )
