"""The cache interface every attention layer shares, and a simple contiguous cache (chapter 10).

The contract (shared DESIGN, "the one interface to get right early")
- A model's forward takes ``cache=None`` or a ``ModelCache``; layer l receives ``cache.layer(l)``,
  a ``LayerCache`` view, or None.
- The layer computes its per-row state (k and v; for MLA the latent c and the RoPE key) for the NEW
  rows only, with positions ``cache.length + i``, applies RoPE at those absolute positions, then calls
  ``view.update(positions, *rows)``. The view stores the rows and returns the key positions (S,) and
  the full stored tensors (..., S, d) to attend over. S >= T: the mask is (T, S), built from the
  absolute query and key positions.
- Without a cache the layer attends over its own rows, with key positions = query positions. The
  same code path runs in both cases; tests compare them.

What this module provides
- ``LayerCache``: the interface, a base class every view of the package derives from: ``length``,
  ``update`` (required), ``attend`` (optional: the default returns None) and ``same_sequence``
  (None unless the view packs several sequences). ``MultiHeadAttention`` and
  ``MultiHeadLatentAttention`` use exactly these four names and nothing else of a view.
- ``ContiguousLayerCache``: appends along the time dimension (dim -2). With ``window=w`` it keeps
  only the rows a sliding-window layer can still read (the last w - 1 before each append, plus
  ``keep`` initial rows for StreamingLLM-style kept tokens): a bounded ring, not a growing tensor.
- ``ModelCache``: one view per layer; ``length`` = positions already processed.
- ``PackedBatchCache``: several sequences' caches (contiguous or paged) driven by ONE forward over
  their new rows laid end to end in a single (1, N) row ("packed" or "varlen" batching, the way
  serving engines batch sequences of different lengths without padding). Its per-layer view sets
  ``same_sequence``, a (N, S) boolean that the attention layers AND into their position mask so
  no sequence reads another's keys.

Paged and quantised caches (``companion.inference.paged``, chapter 12) and the compiled decode step
(``companion.engine.compiled``) derive their views from the same ``LayerCache``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["LayerCache", "ContiguousLayerCache", "ModelCache", "PackedBatchCache", "PackedLayerView"]


class LayerCache:
    """One layer's view of a cache: what an attention layer may call, and all it may call.

    Attributes:
        length: absolute positions already stored: the next new row sits at position ``length``
            (views that are always given explicit positions, like packed batches, keep 0).
        same_sequence: None, or after ``update`` a (T, S) boolean: True where query row i and key
            row j belong to the same sequence. Set by views that pack several sequences into one row
            (``PackedLayerView``, the paged batch view); the layer ANDs it into its position mask.

    Subclasses implement ``update`` and may override ``attend``.
    """

    length: int = 0
    same_sequence: Tensor | None = None

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Store ``rows`` (each (..., T, d)) at absolute ``positions`` (T,); return (key_positions (S,),
        the full stored rows (..., S, d) each), S >= T: what the new queries attend over."""
        raise NotImplementedError(f"{type(self).__name__} must implement update")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, *, window: int | None = None,
               backend: str = "auto") -> Tensor | None:
        """Store k, v (B, g, T, d) at ``positions`` and return the causal attention (with a sliding
        ``window``) of q (B, h, T, d) over every stored key, (B, h, T, d_v); or return None, storing
        nothing, when the view has no attention path of its own (this default): the layer then calls
        ``update`` and attends itself. Layers ask for it only for plain causal (+ window) attention
        (no sinks, ALiBi, kept tokens or extra mask)."""
        return None


class ContiguousLayerCache(LayerCache):
    """Per-layer storage as plain tensors grown by concatenation along dim -2.

    Args:
        window: if set, a sliding-window layer of width w: after each append only the rows that a
            future query (position >= length) may still read are kept, i.e. the last w - 1.
        keep: number of initial positions never evicted (StreamingLLM "attention sink" tokens).
    """

    def __init__(self, window: int | None = None, keep: int = 0):
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None; got {window}")
        if keep < 0:
            raise ValueError(f"keep must be >= 0; got {keep}")
        self.window, self.keep = window, keep
        self.length = 0
        self.positions: Tensor | None = None  # (S_stored,)
        self.rows: tuple[Tensor, ...] | None = None

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        T = positions.shape[0]
        if any(r.shape[-2] != T for r in rows):
            raise ValueError(f"every stored tensor needs T={T} rows in dim -2; got {[tuple(r.shape) for r in rows]}")
        if T and int(positions[0]) != self.length:
            raise ValueError(f"new rows must start at position cache.length={self.length}; got {int(positions[0])}")
        if self.rows is None:
            all_pos, all_rows = positions, tuple(rows)
        else:
            if len(rows) != len(self.rows):
                raise ValueError(f"this cache stores {len(self.rows)} tensors per row; got {len(rows)}")
            all_pos = torch.cat((self.positions, positions))
            all_rows = tuple(torch.cat((old, new), dim=-2) for old, new in zip(self.rows, rows))
        self.length += T
        self.positions, self.rows = all_pos, all_rows
        if self.window is not None:
            # A future query at p >= length reads positions > p - window, i.e. >= length - window + 1,
            # plus the kept initial positions.
            alive = (all_pos >= self.length - self.window + 1) | (all_pos < self.keep)
            if not bool(alive.all()):
                idx = alive.nonzero().squeeze(1)
                self.positions = all_pos[idx]
                self.rows = tuple(r.index_select(-2, idx.to(r.device)) for r in all_rows)
        return all_pos, all_rows

    @property
    def stored(self) -> int:
        """Rows currently held (<= length; smaller for a windowed layer)."""
        return 0 if self.positions is None else int(self.positions.shape[0])

    def nbytes(self) -> int:
        return 0 if self.rows is None else sum(r.numel() * r.element_size() for r in self.rows)


class ModelCache:
    """One ``ContiguousLayerCache`` per layer. ``windows[l]`` bounds layer l (None = global)."""

    def __init__(self, n_layers: int, windows: Sequence[int | None] | None = None, keep: int = 0):
        windows = [None] * n_layers if windows is None else list(windows)
        if len(windows) != n_layers:
            raise ValueError(f"windows needs one entry per layer ({n_layers}); got {len(windows)}")
        self.layers = [ContiguousLayerCache(w, keep) for w in windows]

    def layer(self, i: int) -> ContiguousLayerCache:
        return self.layers[i]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)


class PackedLayerView(LayerCache):
    """One layer's view over several sequences packed into one row.

    ``update(positions (N,), *rows (1, ..., N, d))`` splits the new rows by sequence, hands each slice
    to that sequence's own layer view (which may be contiguous, windowed or paged), and returns the
    concatenation of what they return: key positions (S,) and rows (1, ..., S, d), S = sum of S_b.
    ``same_sequence`` (N, S) then says which (query, key) pairs may interact at all; the layer still
    applies causality / window / kept tokens from the absolute positions, each sequence's own.
    """

    def __init__(self, views: Sequence[LayerCache], new_lengths: Sequence[int]):
        if len(views) != len(new_lengths):
            raise ValueError(f"need one new_lengths entry per view; got {len(new_lengths)} for {len(views)} views")
        if any(n < 1 for n in new_lengths):
            raise ValueError(f"every packed sequence needs >= 1 new row; got new_lengths={list(new_lengths)}")
        self.views, self.new_lengths = list(views), list(new_lengths)
        self.length = 0  # positions are always passed explicitly for packed batches
        self.same_sequence: Tensor | None = None

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        N = sum(self.new_lengths)
        if positions.shape[0] != N or any(r.shape[0] != 1 or r.shape[-2] != N for r in rows):
            raise ValueError(f"packed rows must be (1, ..., N={N}, d) with N positions; got {[tuple(r.shape) for r in rows]}, {tuple(positions.shape)}")
        key_pos, key_rows, q_seg, k_seg = [], [[] for _ in rows], [], []
        start = 0
        for b, (view, n) in enumerate(zip(self.views, self.new_lengths)):
            kp, kr = view.update(positions[start : start + n], *(r[..., start : start + n, :] for r in rows))
            key_pos.append(kp.to(positions.device))
            for acc, r in zip(key_rows, kr):
                acc.append(r)
            q_seg.append(torch.full((n,), b, device=positions.device))
            k_seg.append(torch.full((kp.shape[0],), b, device=positions.device))
            start += n
        self.same_sequence = torch.cat(q_seg)[:, None] == torch.cat(k_seg)[None, :]  # (N, S) block structure
        return torch.cat(key_pos), tuple(torch.cat(acc, dim=-2) for acc in key_rows)


class PackedBatchCache:
    """``ModelCache``-like wrapper: ``layer(i)`` packs layer i of every sequence's cache.

    caches: per-sequence caches, each with ``layer(i)`` (``ModelCache`` or ``companion.inference.paged.PagedSequenceCache``).
    new_lengths: rows each sequence contributes to this forward, in the order they are packed.
    """

    def __init__(self, caches: Sequence, new_lengths: Sequence[int]):
        self.caches, self.new_lengths = list(caches), list(new_lengths)
        self.length = 0
        # Caches that share one owner with a ``pack`` method (the paged pool) batch the work of all
        # sequences per layer themselves; any other mix goes through one view per sequence.
        owner = getattr(self.caches[0], "owner", None) if self.caches else None
        self._packed = None
        if hasattr(owner, "pack") and all(getattr(c, "owner", None) is owner for c in self.caches):
            self._packed = owner.pack(self.caches, self.new_lengths)

    def layer(self, i: int):
        if self._packed is not None:
            return self._packed.layer(i)
        return PackedLayerView([c.layer(i) for c in self.caches], self.new_lengths)
