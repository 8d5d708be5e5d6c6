"""StreamingLLM's cache: a sliding window plus kept first tokens, with positions counted inside the cache.

Xiao et al. (2024) stream a model past its trained length by keeping the first ``keep`` tokens (the
attention sinks) and the last ``window`` tokens, and by giving RoPE the rows' places *in the cache*
rather than in the text: the kept rows are slots 0..keep-1, the window follows, and the newest query
sits in the last slot. Every distance a query sees is then at most keep + window - 1, whatever the
length of the stream. (``companion.cache.ContiguousLayerCache(window=, keep=)`` keeps the same rows but
at their absolute positions, so a kept token drifts ever further from the query.)

How: an attention layer rotates its new keys at their absolute positions before it calls
``update`` (the cache contract of ``companion.cache``). ``StreamingLayerCache`` undoes that rotation
and stores keys *unrotated*; on every read it rotates the rows it returns at slot + delta, where
delta = (absolute position of the first new query) - (its slot). The queries were rotated at their
absolute positions, which are slot + delta too, so every score sees the in-cache distance. The key
positions it returns are those same slot + delta values, so the layer's causal mask is right.

Limits, checked: the model's attention layers must be plain causal RoPE layers (no window, no kept
tokens, no ALiBi: the cache does the evicting), and once the cache is full a step must bring one token
(a chunk of several new tokens is accepted as long as every one of its queries would read the same
rows, e.g. a prompt shorter than keep + window).
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.cache import LayerCache, ModelCache

__all__ = ["StreamingLayerCache", "StreamingCache"]


class StreamingLayerCache(LayerCache):
    """One layer's StreamingLLM cache: ``keep`` first rows and the last ``window`` rows (the newest
    query's own row included), keys stored without rotation and rotated at in-cache positions when read.

    Args:
        rope: the layer's ``RotaryEmbedding`` (its ``cos_sin`` and ``rotate``).
        window: recent rows a query reads, its own included (>= 1).
        keep: first rows never evicted (StreamingLLM's attention sinks).
        gap: an experiment's knob, 0 for StreamingLLM: the kept rows are read ``gap`` positions
            further back than their slots, so a query sees them at distance gap + (its slot - theirs).
    """

    def __init__(self, rope, window: int, keep: int = 0, gap: int = 0):
        if window < 1:
            raise ValueError(f"window must be >= 1; got {window}")
        if keep < 0:
            raise ValueError(f"keep must be >= 0; got {keep}")
        if gap < 0:
            raise ValueError(f"gap must be >= 0; got {gap}")
        self.rope, self.window, self.keep, self.gap = rope, window, keep, gap
        self.length = 0
        self.positions: Tensor | None = None  # (S_stored,) absolute positions of the stored rows
        self.keys: Tensor | None = None  # (..., S_stored, d_h), unrotated
        self.values: Tensor | None = None

    def _turn(self, x: Tensor, positions: Tensor, inverse: bool = False) -> Tensor:
        cos, sin = self.rope.cos_sin(positions.abs().to(x.device))
        sin = torch.where(positions.to(x.device)[:, None] < 0, -sin, sin)  # R(-a) = R(a)^T
        if inverse:  # the rotation times the temperature factor m, undone: (1/m) R(-theta)
            norm = cos * cos + sin * sin
            cos, sin = cos / norm, -sin / norm
        return self.rope.rotate(x, cos.to(x.dtype), sin.to(x.dtype))

    def readable(self, all_pos: Tensor, query: int) -> Tensor:
        """Which of the rows at ``all_pos`` a query at absolute position ``query`` reads."""
        return ((all_pos < self.keep) | (all_pos > query - self.window)) & (all_pos <= query)

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        T = positions.shape[0]
        if k.shape[-2] != T or v.shape[-2] != T:
            raise ValueError(f"k and v need T={T} rows in dim -2; got {tuple(k.shape)}, {tuple(v.shape)}")
        if T == 0:
            raise ValueError("update needs at least one new row")
        first, last = int(positions[0]), int(positions[-1])
        if first != self.length or last != first + T - 1:
            raise ValueError(f"new rows must be positions {self.length}..; got {first}..{last}")
        plain = self._turn(k, positions, inverse=True)  # the key before RoPE
        positions = positions.cpu()
        if self.keys is None:
            all_pos, all_k, all_v = positions, plain, v
        else:
            all_pos = torch.cat((self.positions, positions))
            all_k = torch.cat((self.keys, plain), dim=-2)
            all_v = torch.cat((self.values, v), dim=-2)
        read = self.readable(all_pos, last)  # what the newest query reads
        if T > 1 and not bool((read | ~self.readable(all_pos, first)).all()):
            raise ValueError("once the window is full, feed the stream one token at a time: the queries "
                             f"of a chunk of {T} would read different rows")
        idx = read.nonzero().squeeze(1)
        n = idx.numel()
        delta = first - (n - T)  # absolute position - slot, the same for every new query
        slots = torch.arange(n) + delta
        slots[: int((all_pos[idx] < self.keep).sum())] -= self.gap
        keys = self._turn(all_k.index_select(-2, idx.to(all_k.device)), slots)
        values = all_v.index_select(-2, idx.to(all_v.device))
        # keep for later what a future query (position >= length) can still read
        self.length += T
        alive = ((all_pos < self.keep) | (all_pos >= self.length - self.window + 1)).nonzero().squeeze(1)
        self.positions = all_pos[alive]
        self.keys = all_k.index_select(-2, alive.to(all_k.device))
        self.values = all_v.index_select(-2, alive.to(all_v.device))
        return slots, (keys, values)

    @property
    def stored(self) -> int:
        """Rows held for later: at most keep + window - 1."""
        return 0 if self.positions is None else int(self.positions.shape[0])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)


class StreamingCache(ModelCache):
    """A model's StreamingLLM cache: one ``StreamingLayerCache`` per attention layer.

    ``StreamingCache(model, window=8, keep=1)`` for a ``companion.models.Decoder`` whose layers attend
    causally with RoPE and no window of their own; pass it as ``model(idx, cache=...)``. ``layer``,
    ``length``, ``nbytes`` and ``len`` are ``ModelCache``'s.
    """

    def __init__(self, model, window: int, keep: int = 0, gap: int = 0):
        attns = [layer.attn for layer in model.layers]
        for i, attn in enumerate(attns):
            if getattr(attn, "rope", None) is None:
                raise ValueError(f"layer {i} has no RoPE: in-cache positions need rotary keys")
            if getattr(attn, "window", None) is not None or getattr(attn, "keep", 0):
                raise ValueError(f"layer {i} has its own window or kept tokens: give the streaming cache "
                                 "a model that attends causally over all it is given")
            if getattr(attn, "alibi_slopes", None) is not None or getattr(attn, "softcap", None) is not None:
                raise ValueError(f"layer {i} uses ALiBi or a score cap, which this cache does not handle")
        self.layers = [StreamingLayerCache(attn.rope, window, keep, gap) for attn in attns]
