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
    """Per-layer storage in preallocated tensors, written in place along dim -2.

    The rows live in buffers (..., capacity, d) allocated on the first ``update`` and written row by
    row: a decode step costs the write of its one new row, not a copy of the whole cache (as
    ``torch.cat`` would). When the buffers are full they are reallocated at twice the size, so the
    copies add up to at most twice the rows stored (amortised O(1) per row). ``update`` returns views
    of the stored part; they stay valid until the next ``update``.

    Args:
        window: if set, a sliding-window layer of width w: a future query (position >= length) reads
            only the last w - 1 rows, so only those (plus the kept ones) are returned and counted;
            the older rows are dropped when the buffer fills (the live rows move to its front).
        keep: number of initial positions never evicted (StreamingLLM "attention sink" tokens).
        capacity: initial rows per buffer (default 256; grows by doubling).
    """

    def __init__(self, window: int | None = None, keep: int = 0, capacity: int = 256):
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None; got {window}")
        if keep < 0:
            raise ValueError(f"keep must be >= 0; got {keep}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1; got {capacity}")
        self.window, self.keep, self.capacity = window, keep, capacity
        self.length = 0
        # Buffer rows [0, _n) hold the positions [length - _n, length), in order. Kept initial rows
        # that a window layer's compaction moved out of the buffer wait in _kept (positions, rows).
        self._pos: Tensor | None = None  # (capacity,)
        self._buf: tuple[Tensor, ...] | None = None  # each (..., capacity, d)
        self._n = 0
        self._kept: tuple[Tensor, tuple[Tensor, ...]] | None = None

    def _first_live(self, lowest: int) -> int:
        """Buffer row of position max(lowest, first stored): rows below it are out of the window."""
        return min(self._n, max(0, lowest - (self.length - self._n)))

    def _live(self, lowest: int) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Positions and rows readable by queries whose window starts at ``lowest``: the kept initial
        rows below it, then the contiguous rows from ``lowest`` on (views where no kept row interferes)."""
        r0 = self._first_live(lowest)
        pos, rows = self._pos[r0 : self._n], tuple(b.narrow(-2, r0, self._n - r0) for b in self._buf)
        base = self.length - self._n
        n_kept = max(0, min(self.keep - base, r0))  # kept rows still in the buffer, below r0
        if self._kept is None and not n_kept:
            return pos, rows
        parts_pos = [self._pos[:n_kept], pos]
        parts_rows = [[b[..., :n_kept, :], r] for b, r in zip(self._buf, rows)]
        if self._kept is not None:
            parts_pos.insert(0, self._kept[0])
            for acc, k in zip(parts_rows, self._kept[1]):
                acc.insert(0, k)
        return torch.cat(parts_pos), tuple(torch.cat(acc, dim=-2) for acc in parts_rows)

    def _lowest(self, length: int) -> int:
        """The lowest position a query at position >= ``length`` reads through the window."""
        return 0 if self.window is None else length - self.window + 1

    def _make_room(self, T: int, like: Sequence[Tensor], positions: Tensor) -> None:
        """Ensure T free rows after row _n: drop rows out of the window first, then grow."""
        if self._buf is None:
            cap = max(self.capacity, T)
            self._pos = torch.empty(cap, dtype=positions.dtype, device=positions.device)
            self._buf = tuple(r.new_empty(*r.shape[:-2], cap, r.shape[-1]) for r in like)
            return
        if len(like) != len(self._buf):
            raise ValueError(f"this cache stores {len(self._buf)} tensors per row; got {len(like)}")
        cap = self._pos.shape[0]
        if self._n + T <= cap:
            return
        r0 = self._first_live(self._lowest(self.length))
        if r0:  # a window layer: move the live rows to the front (kept initial rows to _kept)
            base = self.length - self._n
            n_kept = max(0, min(self.keep - base, r0))
            if n_kept:
                kp, kr = self._pos[:n_kept].clone(), tuple(b[..., :n_kept, :].clone() for b in self._buf)
                if self._kept is not None:
                    kp = torch.cat((self._kept[0], kp))
                    kr = tuple(torch.cat((a, b), dim=-2) for a, b in zip(self._kept[1], kr))
                self._kept = (kp, kr)
            m = self._n - r0
            self._pos[:m] = self._pos[r0 : self._n].clone()
            for b in self._buf:
                b[..., :m, :] = b[..., r0 : self._n, :].clone()
            self._n = m
        if self._n + T > cap:  # grow: double (at least to fit)
            new_cap = max(2 * cap, self._n + T)
            pos = self._pos.new_empty(new_cap)
            pos[: self._n] = self._pos[: self._n]
            bufs = []
            for b in self._buf:
                nb = b.new_empty(*b.shape[:-2], new_cap, b.shape[-1])
                nb[..., : self._n, :] = b[..., : self._n, :]
                bufs.append(nb)
            self._pos, self._buf = pos, tuple(bufs)

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        T = positions.shape[0]
        for r in rows:
            if r.shape[-2] != T:
                raise ValueError(f"every stored tensor needs T={T} rows in dim -2; got {[tuple(r.shape) for r in rows]}")
        # The start is read on the host only from CPU positions (free there; on a GPU it would be a
        # device sync per layer and step, and the model made these positions from ``length`` itself).
        if T and positions.device.type == "cpu" and int(positions[0]) != self.length:
            raise ValueError(f"new rows must start at position cache.length={self.length}; got {int(positions[0])}")
        if self._buf is None or self._n + T > self._pos.shape[0] or len(rows) != len(self._buf):
            self._make_room(T, rows, positions)
        for r, b in zip(rows, self._buf):
            if r.shape[:-2] != b.shape[:-2] or r.shape[-1] != b.shape[-1]:
                raise ValueError(f"rows {[tuple(r.shape) for r in rows]} do not match the stored "
                                 f"{[tuple(b.shape) for b in self._buf]} outside dim -2")
        n = self._n
        self._pos[n : n + T] = positions
        for b, r in zip(self._buf, rows):  # the write of the new rows: all a step stores
            b.narrow(-2, n, T).copy_(r)
        lowest = self._lowest(self.length)  # what the new queries read: as before these rows came
        self._n += T
        self.length += T
        if self.window is None and self._kept is None:  # a global layer: rows [0, n + T), as views
            return self._pos[: n + T], tuple(b.narrow(-2, 0, n + T) for b in self._buf)
        return self._live(lowest)

    @property
    def positions(self) -> Tensor | None:
        """Positions of the rows a future query may read (S_stored,), in order."""
        return None if self._buf is None else self._live(self._lowest(self.length))[0]

    @property
    def rows(self) -> tuple[Tensor, ...] | None:
        """The stored rows a future query may read, each (..., S_stored, d)."""
        return None if self._buf is None else self._live(self._lowest(self.length))[1]

    @rows.setter
    def rows(self, new: Sequence[Tensor]) -> None:
        """Replace the stored rows (same positions, e.g. reordered along the batch by beam search)."""
        pos = self.positions
        if pos is None or any(r.shape[-2] != pos.shape[0] for r in new):
            raise ValueError("rows can only be replaced by tensors with one row per stored position")
        n_kept = int((pos < self._lowest(self.length)).sum())  # kept rows below the window
        self._kept = None if not n_kept else (pos[:n_kept].clone(), tuple(r[..., :n_kept, :].clone() for r in new))
        self._pos = pos[n_kept:].clone()
        self._buf = tuple(r[..., n_kept:, :].contiguous().clone() for r in new)
        self._n = self._pos.shape[0]

    @property
    def stored(self) -> int:
        """Rows currently readable (<= length; smaller for a windowed layer)."""
        if self._buf is None:
            return 0
        r0 = self._first_live(self._lowest(self.length))
        n_kept = max(0, min(self.keep - (self.length - self._n), r0))
        return self._n - r0 + n_kept + (0 if self._kept is None else int(self._kept[0].shape[0]))

    def nbytes(self) -> int:
        """Bytes of the readable rows (the buffers' spare capacity is not counted)."""
        if self._buf is None:
            return 0
        S = self.stored
        return sum(b.numel() // b.shape[-2] * S * b.element_size() for b in self._buf)

    def capacity_nbytes(self) -> int:
        """Bytes allocated, spare capacity included."""
        return 0 if self._buf is None else sum(b.numel() * b.element_size() for b in self._buf)


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

    caches: per-sequence caches, each with ``layer(i)`` (``ModelCache``, or paged sequences of
    different pools). Sequences of one page pool are packed by the pool itself
    (``companion.inference.generate.packed_forward`` -> ``companion.inference.batch.PagedBatch``), not here.
    new_lengths: rows each sequence contributes to this forward, in the order they are packed.
    """

    def __init__(self, caches: Sequence, new_lengths: Sequence[int]):
        self.caches, self.new_lengths = list(caches), list(new_lengths)
        self.length = 0

    def layer(self, i: int):
        if len(self.caches) == 1:  # one sequence (a decode loop): its own view, no packing to do
            return self.caches[0].layer(i)
        return PackedLayerView([c.layer(i) for c in self.caches], self.new_lengths)
