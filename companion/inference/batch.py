"""A packed batch over the page pool, and how attention reads it (chapter 12): the engine's decode
read path ends here.

The read, step by step (the files a reader opens from ``Engine.step``):
1. ``companion.engine.engine``: ``Engine.step`` schedules (sequence, n tokens) pairs and calls
   ``companion.engine.runner.Runner.run``, which calls ``packed_forward`` (this module): the new
   tokens of every sequence laid end to end in one (1, N) row, packed (``PagedKVCache.pack`` ->
   ``PagedBatch``: pages reserved, slot and seat indices computed once for all layers), and one
   forward of the model with ``cache=batch``; the model's forward (``companion.models``) hands
   layer i its view, ``batch.layer(i)``.
2. ``companion.mha``: the attention layer projects q, k, v for the new rows, rotates them (RoPE), and,
   being plain causal attention (``cache_attends``, decided when the layer was built), hands them to
   its cache view: ``view.attend(q, k, v, positions, window=...)``.
3. This module: ``PagedBatchLayerView.attend`` writes k, v into the pages (``PagePool.write_slots``)
   and into the sequences' seats (``SeatBuffers.write``), then ``PagedBatch.paged_attention`` reads
   them back by the pool's ``attention_kernel``. With "gather" (the CPU default) each ``GatherGroup``
   (the decoding sequences, then the prefilling ones) runs torch's SDPA over the seat buffers: the
   K/V read of a decode step is ``GatherGroup.sdpa``, a view of the seats, no copy.

What this module provides
- ``packed_forward(model, caches, chunks)``: one forward over several sequences' new tokens.
- ``SeatBuffers``: each running sequence's K/V in one row (seat) of dense per-layer buffers.
- ``GatherGroup``: sequences attended as one padded batch over their seats.
- ``PagedBatch``: several sequences of one pool in one forward; ``PagedBatchLayerView``, its
  ``LayerCache`` view of one layer.
- ``PAGED_KERNELS``: the ways a batch reads its keys ("gather", "reference", "triton", "flex").
The pages themselves (pool, block tables, prefix sharing) are ``companion.inference.paged``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.cache import LayerCache, PackedBatchCache
from companion.kernels.paged_flex import flex_attention, flex_block_mask, flex_logical_pages, paged_flex_mask_mod
from companion.kernels.paged_reference import page_slots, paged_attention_reference

__all__ = ["packed_forward", "SeatBuffers", "GatherGroup", "PagedBatch", "PagedBatchLayerView", "PAGED_KERNELS"]

PAGED_KERNELS = ("gather", "reference", "triton", "flex")


def packed_forward(model: nn.Module, caches: Sequence, chunks: Sequence[Sequence[int]]) -> Tensor:
    """Feed chunks[b] (new tokens of sequence b, at positions caches[b].length ...) through the model
    in ONE forward; returns the logits of each chunk's last token, (B, V). Caches are updated."""
    device = next(model.parameters()).device
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=device)[None]  # (1, N)
    positions = torch.tensor([j for c, ch in zip(caches, chunks) for j in range(c.length, c.length + len(ch))], dtype=torch.long, device=device)
    lengths = [len(c) for c in chunks]
    owner = getattr(caches[0], "owner", None)
    if owner is not None and all(getattr(c, "owner", None) is owner for c in caches):
        cache = owner.pack(caches, lengths)  # one pool's sequences: a PagedBatch
    else:
        cache = PackedBatchCache(caches, lengths)  # any other caches, one view per sequence
    logits = model(ids, cache=cache, positions=positions)[0]  # (N, V)
    if len(lengths) == ids.shape[1]:  # one token each (decoding): every row is a last row
        return logits
    last = torch.tensor(lengths).cumsum(0) - 1
    return logits[last.to(device)]


class SeatBuffers:
    """The running sequences' K/V kept readable for attention without a gather (the "gather" kernel).

    A seat is one row of dense buffers ``k[l], v[l]`` of shape (n_seats, capacity, g, d): while a
    sequence runs it holds a seat, and seat row j holds its token j as the pages do (dequantised
    when the pool is quantised). Every layer writes its new K/V twice, to its pages (the store of
    record: allocation, prefix sharing, copy-on-write and preemption work on pages) and to the seat;
    attention then reads the seats in place, so a decode step copies its new rows, never a whole
    prefix. Rows come from the pages only when a seat is taken (a shared prefix mapped from the pool,
    or a sequence whose pages were written by another path): ``fill`` copies the rows the seat lacks.
    Seats stay dense: the running sequences hold seats 0..n_held-1, and a sequence that leaves hands
    its seat to the holder of the last one, whose rows move there (one sequence copied, once), so a
    decode batch never attends over empty seats.

    The cost is memory: n_seats x capacity rows per layer besides the pages, one padded batch of the
    running sequences (seats: as many as ran at once; capacity: the longest of them). Both grow by
    doubling when a batch needs more (a copy of what is there, amortised) and never shrink; the
    compiled decode step sizes them once, for the pool's worth of full contexts (its graph has their
    shapes). Pages stay the unit of allocation: what max-length reservation would waste is bounded
    here by the longest running sequence, not by the context. A GPU reads the pages directly
    (``attention_kernel="triton"`` or "flex") and keeps no seats."""

    def __init__(self, token_shapes: list[list[tuple[int, ...]]], dtype: torch.dtype, device: torch.device):
        self.token_shapes, self.dtype, self.device = token_shapes, dtype, device
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.n_seats, self.capacity = 0, 0
        self.holders: list = []  # holders[s]: the sequence in seat s; seats 0..len(holders)-1 are held

    def acquire(self, seq) -> None:
        """Seat ``seq`` (a ``PagedSequenceCache``) in the next seat, empty (the buffers grow when full)."""
        if len(self.holders) == self.n_seats:
            self.reserve(max(1, 2 * self.n_seats), self.capacity)
        seq.seat, seq.seat_rows = len(self.holders), 0
        self.holders.append(seq)

    def release(self, seq) -> None:
        """``seq`` leaves its seat; the holder of the last seat moves into it (rows and all)."""
        seat, last = seq.seat, self.holders.pop()
        if last is not seq:
            for buffer in (*self.k, *self.v):
                buffer[seat, : last.seat_rows] = buffer[last.seat, : last.seat_rows]
            last.seat = seat
            self.holders[seat] = last
        seq.seat, seq.seat_rows = None, 0

    def reserve(self, n_seats: int, capacity: int) -> None:
        """Make room for seats 0..n_seats-1 and rows 0..capacity-1 (growing by doubling, zeros:
        rows past a sequence's end are masked, but must be finite, since 0 * NaN is NaN)."""
        if n_seats <= self.n_seats and capacity <= self.capacity:
            return
        S = max(n_seats, self.n_seats if n_seats <= self.n_seats else 2 * self.n_seats)
        C = max(capacity, self.capacity if capacity <= self.capacity else 2 * self.capacity)
        # ordinary tensors even under inference_mode (the engine's forward), so that a seat can
        # also change hands outside it (``release``, when the scheduler retires a sequence)
        with torch.inference_mode(False):
            for buffers, which in ((self.k, 0), (self.v, 1)):
                for layer, shapes in enumerate(self.token_shapes):
                    grown = torch.zeros(S, C, *shapes[which], dtype=self.dtype, device=self.device)
                    if layer < len(buffers):
                        grown[: self.n_seats, : self.capacity] = buffers[layer]
                        buffers[layer] = grown
                    else:
                        buffers.append(grown)
        self.n_seats, self.capacity = S, C

    def write(self, layer: int, flat_rows: Tensor, k: Tensor, v: Tensor) -> None:
        """k, v (N, g, d) into flat rows seat * capacity + position: one index_copy_ each."""
        for buffer, rows in ((self.k[layer], k), (self.v[layer], v)):
            buffer.view(-1, *buffer.shape[2:]).index_copy_(0, flat_rows, rows)

    def fill(self, pool: "PagePool", seq: "PagedSequenceCache") -> None:
        """Copy the rows seq's seat lacks (seat_rows .. length) from its pages, every layer."""
        start, end, p = seq.seat_rows, seq.length, pool.page_size
        if start < end:
            slots = page_slots(torch.tensor(seq.table, dtype=torch.long), p)[start:end].to(pool.device)
            rows = seq.seat * self.capacity + torch.arange(start, end, device=pool.device)
            for layer in range(len(self.k)):
                k, v = (pool.read_slots(layer, i, slots, self.dtype) for i in (0, 1))
                self.write(layer, rows, k, v)
        seq.seat_rows = end

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


class GatherGroup:
    """Sequences attended together as one padded batch (the "gather" path of ``PagedBatch``):
    B sequences, up to T new rows each, L keys each (positions 0..L-1, beyond a sequence's end masked),
    read from their seats (``SeatBuffers``).

    seats (B,) each sequence's seat; rows (B, T): the packed row of query (b, t) (a padded t repeats
    the sequence's last row), or None when the group is every row of the batch, one per sequence, in
    order (a pure decode step); q_pos (B, T) their absolute positions; real (R,) which of the B * T
    (b, t) pairs are real rows, and dest (R,) their packed rows.

    Decoding (T = 1) reads the seat buffers in place: the attention batch is seats 0..n-1 (n = the
    highest seat + 1), each query put at its seat's row; a seat no member holds attends to its row 0
    (finite, discarded). Prefilling (T > 1) copies its members' rows out of the seats (index_select):
    a prefill's own work (B * T * L) outweighs the copy (B * L)."""

    def __init__(self, seats, rows, q_pos, real, dest, B, T, L, seat_pos=None):
        self.seats, self.rows, self.q_pos, self.real, self.dest = seats, rows, q_pos, real, dest
        self.B, self.T, self.L = B, T, L
        # seat_pos (n, 1), decoding only, when the members are not seats 0..B-1 in order: the
        # position of the query at each seat's row (0 where no member sits): see ``at_seats``
        self.in_place = seat_pos is not None
        self.seat_pos = seat_pos if self.in_place else q_pos
        self.n = self.seat_pos.shape[0]  # batch rows of the attention
        self._masks: dict[tuple[int | None, int], Tensor] = {}

    @staticmethod
    def at_seats(seats: Tensor, q_pos: Tensor, n: int) -> Tensor:
        """(n, 1): q_pos (B, 1) moved to the rows seats (B,) of an n-row batch, 0 elsewhere."""
        return torch.zeros(n, 1, dtype=q_pos.dtype, device=q_pos.device).index_copy_(0, seats, q_pos)

    def mask(self, window: int | None, r: int) -> Tensor:
        """(n, 1, r * T, L) boolean, True = may read: key j <= the row's position (causal, which also
        hides every key past the sequence's end) and, with a window, position - j < window; repeated
        for the r query heads that share one K/V head (they are laid out as r * T query rows)."""
        key = (window, r)
        if key not in self._masks:
            q_pos = self.seat_pos
            kpos = torch.arange(self.L, device=q_pos.device)
            allowed = kpos[None, None, :] <= q_pos[:, :, None]  # (n, T, L)
            if window is not None:
                allowed = allowed & (q_pos[:, :, None] - kpos[None, None, :] < window)
            n, T, L = allowed.shape
            self._masks[key] = allowed[:, None, None].expand(n, 1, r, T, L).reshape(n, 1, r * T, L)
        return self._masks[key]

    def sdpa(self, seat_k: Tensor, seat_v: Tensor, q: Tensor, window: int | None, scale: float | None) -> Tensor:
        """q (B * T, h, d), the group's query rows in (b, t) order -> (B * T, h, d_v), over one layer's
        seat buffers seat_k, seat_v (n_seats, capacity, g, d). Tensor ops only (the compiled decode
        step of ``companion.engine.compiled`` runs it with symbolic B and L)."""
        h, d = q.shape[1], q.shape[2]
        g = seat_k.shape[2]
        r, B, T, L = h // g, self.B, self.T, self.L
        if T == 1:  # in place: seats 0..n-1, rows 0..L-1, a view
            k, v = seat_k[: self.n, :L], seat_v[: self.n, :L]
        else:
            k, v = seat_k[:, :L].index_select(0, self.seats), seat_v[:, :L].index_select(0, self.seats)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (n, g, L, d)
        # query head i reads K/V head i // r: the r heads of a group become r * T query rows of one
        # "head", so K/V are used as stored, never repeated (GQA without the copy)
        qg = q.view(B, T, g, r, d).permute(0, 2, 3, 1, 4).reshape(B, g, r * T, d)
        if self.in_place:
            qg = qg.new_zeros(self.n, g, r * T, d).index_copy_(0, self.seats, qg)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=self.mask(window, r), scale=scale)  # (n, g, r * T, d_v)
        if self.in_place:
            o = o.index_select(0, self.seats)
        return o.view(B, g, r, T, -1).permute(0, 3, 1, 2, 4).reshape(B * T, h, -1)


class PagedBatch:
    """Several sequences of one pool in one packed forward, with the bookkeeping done once for all
    layers. Pages are reserved (and copied on write) up front; the new rows of every layer are then
    written with one scatter through their flat slot index page * p + slot.

    Reading them back for attention, by ``attention_kernel`` (the pool's choice, see ``PagedKVCache``):
    - "gather" (fast on a CPU): sequences are attended per sequence, not packed: one padded batch of
      the decoding sequences (one query row each: the decode fast path) and one of the prefilling
      ones, over the sequences' seats (``SeatBuffers``: each layer writes its new rows there as well
      as to the pages), with torch's SDPA and a (B, T, L) causal mask. The decode batch reads the
      seat buffers in place (no copy); the prefill batch copies its members' rows out of them. Work
      is B * T * L, not N * sum of all lengths as in the packed layout below.
    - "flex": torch's flex_attention of the packed query rows over every slot of the pool, with a
      BlockMask from ``paged_flex_mask_mod`` (see there); on CUDA it is compiled into one fused kernel
      that skips the pool blocks no query may read; on a CPU the unfused (dense) reference runs.
    - "reference" / "triton": ``paged_attention_reference`` / ``companion.kernels.triton_paged.paged_attention``
      over the packed query rows and the block tables (the Triton kernel reads K/V from the pages).
    - None: the layers call ``update`` and attend over all sequences' keys laid end to end, with the
      (N, S) block mask ``same_sequence`` (the packed layout of ``companion.cache.PackedBatchCache``);
      MLA layers and layers with sinks, ALiBi or kept tokens always take this path.
    """

    length = 0  # the model's forward is always given the rows' positions

    def __init__(self, owner: PagedKVCache, seqs: Sequence[PagedSequenceCache], new_lengths: Sequence[int]):
        p = owner.page_size
        for seq, n in zip(seqs, new_lengths):  # all allocation happens here, before any layer writes
            owner.manager.prepare_write(seq.table, seq.length, seq.length + n)
        self.owner, self.seqs, self.new_lengths = owner, list(seqs), list(new_lengths)
        device = owner.pool.device
        starts = [seq.length for seq in seqs]
        ends = [s + n for s, n in zip(starts, new_lengths)]
        B = len(self.seqs)
        # the block tables, padded with page 0 (never read: every key past a sequence's end is masked)
        width = max([len(seq.table) for seq in seqs] + [1])
        self.block_tables = torch.tensor([seq.table + [0] * (width - len(seq.table)) for seq in seqs], dtype=torch.long).view(B, width)
        self.seq_lens = torch.tensor(ends, dtype=torch.long)
        self.q_seq = torch.tensor([b for b, n in enumerate(new_lengths) for _ in range(n)], dtype=torch.long)
        self.q_pos = torch.tensor([j for s, e in zip(starts, ends) for j in range(s, e)], dtype=torch.long)
        # flat slot of logical position j of sequence b, all j the tables cover (B, width * p)
        self._all_slots = page_slots(self.block_tables, p).to(device)
        self.write_slots = self._all_slots[self.q_seq.to(device), self.q_pos.to(device)]  # (N,)
        self.layers_done = 0
        self._groups: list[GatherGroup] | None = None
        self.seats = owner.seats if owner.attention_kernel == "gather" else None
        if self.seats is not None:  # every sequence in a seat that holds its rows so far
            for seq in self.seqs:
                if seq.seat is None:
                    self.seats.acquire(seq)
            self.seats.reserve(self.seats.n_seats, max(ends + [1]))
            for seq in self.seqs:
                self.seats.fill(owner.pool, seq)
            seat_of = torch.tensor([seq.seat for seq in self.seqs], dtype=torch.long, device=device)
            self.seat_rows = seat_of[self.q_seq.to(device)] * self.seats.capacity + self.q_pos.to(device)  # (N,)
        self._flex_masks: dict = {}

    # the packed layout (update path) ------------------------------------------------------------------
    @cached_property
    def read_slots(self) -> Tensor:
        """(S,) flat slots of every stored row of every sequence, laid end to end (S = sum of lengths)."""
        return torch.cat([self._all_slots[b, :n] for b, n in enumerate(self.seq_lens.tolist())])

    @cached_property
    def key_positions(self) -> Tensor:
        return torch.cat([torch.arange(n) for n in self.seq_lens.tolist()]).to(self.owner.pool.device)

    @cached_property
    def same_sequence(self) -> Tensor:
        """(N, S): query row n and key row s belong to the same sequence."""
        k_seg = torch.repeat_interleave(torch.arange(len(self.seqs)), self.seq_lens)
        return (self.q_seq[:, None] == k_seg[None, :]).to(self.owner.pool.device)

    # the gather path --------------------------------------------------------------------------------
    def groups(self) -> list[GatherGroup]:
        """The decoding sequences (one new row) as one padded batch, the prefilling ones as another."""
        if self._groups is None:
            self._groups = []
            device = self.owner.pool.device
            lens = self.new_lengths
            ends = self.seq_lens.tolist()
            first = [0]
            for n in lens:
                first.append(first[-1] + n)
            for members in ([b for b, n in enumerate(lens) if n == 1], [b for b, n in enumerate(lens) if n > 1]):
                if not members:
                    continue
                B, T = len(members), max(lens[b] for b in members)
                L = max(ends[b] for b in members)
                # padded query t of sequence b repeats its last row: a real position, so no softmax row is empty
                rows = [[first[b] + min(t, lens[b] - 1) for t in range(T)] for b in members]
                q_pos = [[ends[b] - lens[b] + min(t, lens[b] - 1) for t in range(T)] for b in members]
                real = [i * T + t for i, b in enumerate(members) for t in range(lens[b])]
                dest = [first[b] + t for b in members for t in range(lens[b])]
                in_order = T == 1 and B == len(lens)  # every row, one per sequence, in packed order
                as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
                seat_list = [self.seqs[b].seat for b in members]
                seats, q_pos = as_tensor(seat_list), as_tensor(q_pos)
                # decoding members not at seats 0..B-1 in order: attend at the seats (see GatherGroup)
                seat_pos = None
                if T == 1 and seat_list != list(range(B)):
                    seat_pos = GatherGroup.at_seats(seats, q_pos, max(seat_list) + 1)
                self._groups.append(GatherGroup(
                    seats, None if in_order else as_tensor(rows), q_pos,
                    None if in_order else as_tensor(real), None if in_order else as_tensor(dest), B, T, L, seat_pos,
                ))
        return self._groups

    def group_keys(self, layer: int, dtype: torch.dtype) -> list[tuple[GatherGroup, Tensor, Tensor]]:
        """Each group with the K/V buffers it reads in layer ``layer``: the seat buffers."""
        seat_k, seat_v = self.seats.k[layer].to(dtype), self.seats.v[layer].to(dtype)  # no copy when equal
        return [(grp, seat_k, seat_v) for grp in self.groups()]

    def _gather_attend(self, layer: int, q: Tensor, window: int | None, scale: float | None) -> Tensor:
        """q (N, h, d) -> (N, h, d): each group reads its keys and runs SDPA (see the class docstring)."""
        N, h, d = q.shape
        out = None
        for grp, k, v in self.group_keys(layer, q.dtype):
            o = grp.sdpa(k, v, q if grp.rows is None else q[grp.rows.view(-1)], window, scale)  # (B * T, h, d_v)
            if grp.rows is None:
                return o
            if out is None:
                out = o.new_empty(N, h, o.shape[-1])
            out.index_copy_(0, grp.dest, o.index_select(0, grp.real))
        return out

    def paged_attention(self, layer: int, q: Tensor, *, kernel: str = "reference", window: int | None = None, scale: float | None = None) -> Tensor:
        """Causal attention of this batch's N new query rows q (N, h, d) over layer ``layer``'s pages,
        after that layer has written its new K/V (``layer(i).update`` or ``layer(i).attend``).
        kernel: "gather" (per-sequence padded batches, torch SDPA), "reference" (gather through the
        block tables, then masked attention, in PyTorch), "triton" (``companion.kernels.triton_paged``:
        reads K/V from the pages directly; CUDA, or TRITON_INTERPRET=1) or "flex" (flex_attention over
        the pool with a block mask, ``paged_flex_mask_mod``). Returns (N, h, d)."""
        if kernel not in PAGED_KERNELS:
            raise ValueError(f"kernel must be one of {PAGED_KERNELS}; got {kernel!r}")
        pool = self.owner.pool
        if not 0 <= layer < self.owner.n_layers:
            raise ValueError(f"layer must be in [0, {self.owner.n_layers}); got {layer}")
        if len(pool.data[layer][0].shape) != 4:
            raise ValueError("paged attention needs K/V pages (n_pages, p, g, d); this layer caches an MLA latent")
        if kernel == "gather":  # the seats hold dequantised rows: quantised pools too
            if self.seats is None:
                raise ValueError("kernel='gather' reads the seats of a pool built with attention_kernel='gather'; this one has none")
            return self._gather_attend(layer, q, window, scale)
        if pool.bits is not None:
            raise ValueError(f"kernel={kernel!r} reads float pages; this pool stores bits={pool.bits} (use kernel='gather' or the layer views)")
        k_pages, v_pages = pool.data[layer][0], pool.data[layer][1]
        index = (self.block_tables, self.seq_lens, self.q_seq, self.q_pos)
        if kernel == "triton":  # reads the pool as it is: q must have the pool's dtype
            from companion.kernels.triton_paged import paged_attention

            return paged_attention(q, k_pages, v_pages, *(t.to(q.device) for t in index), scale=scale, window=window)
        if kernel == "flex":
            return self._flex_attend(layer, q.to(k_pages.dtype), window, scale).to(q.dtype)
        return paged_attention_reference(q, k_pages.to(q.dtype), v_pages.to(q.dtype), *index, scale=scale, window=window)

    def flex_block_mask(self, window: int | None):
        """The BlockMask of this batch (N query rows against every slot of the pool), one per window,
        built once per step and shared by the layers."""
        if window not in self._flex_masks:
            device = self.owner.pool.device
            pool = self.owner.pool.data[0][0]
            logical = flex_logical_pages([seq.table for seq in self.seqs], pool.shape[0]).to(device)
            mask_mod = paged_flex_mask_mod(self.q_seq.to(device), self.q_pos.to(device), logical, self.owner.page_size, window)
            self._flex_masks[window] = flex_block_mask(mask_mod, self.q_seq.shape[0], pool.shape[0] * pool.shape[1], device)
        return self._flex_masks[window]

    def _flex_attend(self, layer: int, q: Tensor, window: int | None, scale: float | None) -> Tensor:
        """q (N, h, d) -> (N, h, d): flex_attention of the packed rows over the whole pool, viewed as
        one sequence of n_pages * p keys (no gather: the block mask says which slots each row reads)."""
        pool = self.owner.pool
        k_pages, v_pages = pool.data[layer][0], pool.data[layer][1]
        n_pages, p, g, d = k_pages.shape
        k = k_pages.view(1, n_pages * p, g, d).transpose(1, 2)  # (1, g, S_pool, d), a view
        v = v_pages.view(1, n_pages * p, g, -1).transpose(1, 2)
        flex = flex_attention(compiled=q.device.type == "cuda")
        out = flex(q.transpose(0, 1)[None], k, v, block_mask=self.flex_block_mask(window), scale=scale, enable_gqa=g != q.shape[1])
        return out[0].transpose(0, 1)

    def layer(self, i: int) -> "PagedBatchLayerView":
        return PagedBatchLayerView(self, i)

    def _written(self) -> None:
        self.layers_done += 1
        if self.layers_done == self.owner.n_layers:  # every layer has written: the sequences advance
            for seq, n in zip(self.seqs, self.new_lengths):
                seq.advance(n, seat_written=self.seats is not None)


class PagedBatchLayerView(LayerCache):
    """Layer i of a ``PagedBatch``: the ``LayerCache`` protocol for packed rows (1, ..., N, d), plus
    ``attend``, which the attention layer prefers when the pool has an ``attention_kernel``."""

    def __init__(self, batch: PagedBatch, layer: int):
        self.batch, self.layer_index = batch, layer
        self.length = 0  # positions are passed explicitly for packed batches
        self.same_sequence: Tensor | None = None

    def _store(self, positions: Tensor, rows: Sequence[Tensor]) -> None:
        batch, pool = self.batch, self.batch.owner.pool
        if positions.shape[0] != batch.write_slots.shape[0]:
            raise ValueError(f"this packed batch feeds {batch.write_slots.shape[0]} rows; got {positions.shape[0]}")
        seats = batch.seats
        read_dtype = None if seats is None else seats.dtype
        stored = [pool.write_slots(self.layer_index, i, batch.write_slots, r[0].movedim(-2, 0), read_dtype)
                  for i, r in enumerate(rows)]
        if seats is not None:  # the seats receive the same rows (as a read of the pages gives them)
            seats.write(self.layer_index, batch.seat_rows, *stored)

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        batch, pool = self.batch, self.batch.owner.pool
        self._store(positions, rows)
        out = tuple(
            pool.read_slots(self.layer_index, i, batch.read_slots, r.dtype).movedim(0, -2).unsqueeze(0).to(r.device)
            for i, r in enumerate(rows)
        )
        self.same_sequence = batch.same_sequence.to(positions.device)
        batch._written()
        return batch.key_positions.to(positions.device), out

    def attend(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, *, window: int | None = None, backend: str = "auto") -> Tensor | None:
        """Store k, v (1, g, N, d) and return causal attention (sliding window ``window``) of q
        (1, h, N, d) over each row's own sequence, (1, h, N, d); or None, having stored nothing, when
        the pool has no attention kernel or the layer asked for a backend the kernel does not provide
        (the layer then calls ``update`` and attends itself)."""
        batch = self.batch
        kernel = batch.owner.attention_kernel
        if kernel is None or (kernel == "gather" and backend not in ("auto", "sdpa")):
            return None
        self._store(positions, (k, v))
        out = batch.paged_attention(self.layer_index, q[0].transpose(0, 1), kernel=kernel, window=window)  # (N, h, d)
        batch._written()
        return out.transpose(0, 1).unsqueeze(0)
