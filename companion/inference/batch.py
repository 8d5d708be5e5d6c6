"""One step of the engine, as attention reads it (chapter 12): the step's metadata in one object,
the packed batch over the page pool, and its read of K and V. The decode path ends here.

The read, file by file, from ``Engine.step`` (four files, one direction):
1. ``companion.engine.engine``: ``Engine.step`` schedules (sequence, n tokens) pairs and calls
   ``Runner.run``.
2. ``companion.engine.runner``: ``Runner.run`` fills the step's ``StepContext`` (this module) in its
   static ``StepBuffers``: token ids, positions, slot mapping, block tables, context lengths, seats,
   built once for every layer and every attention path; then one forward of the model over the
   packed (1, N) row with ``cache=PagedBatch(kv, context)``. (The model's forward, in
   ``companion.models``, only hands layer i the view ``batch.layer(i)``.)
3. ``companion.mha``: the attention layer projects q, k, v for the new rows, rotates them (RoPE) and,
   being plain causal attention (``cache_attends``, chosen when the layer was built), hands them to
   the view: ``view.attend(q, k, v, positions, window=...)``.
4. This module: ``PagedBatchLayerView.attend`` writes k, v to the pages (``PagePool.write_slots`` at
   ``context.slot_mapping``) and to the seats (``SeatBuffers.write`` at ``context.seat_rows``), then
   ``PagedBatch.paged_attention`` reads them back by the pool's ``attention_kernel``. With "gather"
   (the CPU default) the K/V read of a decode step is ``GatherGroup.sdpa``: a view of the seats.

What this module provides
- ``StepContext``: one step's metadata; ``StepBuffers``: the preallocated tensors it lives in, sized
  for the largest batch bucket (``bucket_sizes``), refilled every step at the same addresses.
- ``GatherGroup``: sequences attended as one padded batch over their seats.
- ``PagedBatch``: several sequences of one pool in one forward; ``PagedBatchLayerView``, its
  ``LayerCache`` view of one layer.
The pages themselves (pool, block tables, prefix sharing, seats) are ``companion.inference.paged``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.cache import LayerCache
from companion.inference.paged import PAGED_KERNELS, PagedKVCache, PagedSequenceCache, SeatBuffers
from companion.kernels.paged_flex import flex_attention, flex_block_mask, flex_logical_pages, paged_flex_mask_mod
from companion.kernels.paged_reference import page_slots, paged_attention_reference

__all__ = ["StepContext", "StepBuffers", "bucket_sizes", "SeatBuffers", "GatherGroup", "PagedBatch",
           "PagedBatchLayerView", "PAGED_KERNELS"]


def bucket_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (the last bucket is ``limit`` itself): the sizes a step's batch
    is padded up to, so that a step has one of O(log limit) shapes (what a CUDA graph is captured for)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1; got {limit!r}")
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(min(2 * sizes[-1], limit))
    return sizes


def _bucket(n: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= n)


# the padding of the rows past a step's real ones: read nothing, written nowhere (negative = none,
# as a write kernel that skips slot < 0 reads it), belonging to no sequence
ROW_PAD = {"input_ids": 0, "positions": 0, "slot_mapping": -1, "row_seq": -1, "seat_rows": -1}
SEQ_PAD = {"context_lens": 0, "seats": -1}


@dataclass
class StepContext:
    """The metadata of one step, built once (``StepBuffers.fill``) and read by every attention path:
    "gather" (seats), "reference" and "triton" (block tables), "flex" (its block mask) and the packed
    path (slots of every stored row). Tensors are views of the step buffers: the first N (rows) or
    B (sequences) entries; ``padded(name)`` gives the same buffer at the bucket size.

    Rows (N = the new tokens of the step, the packed (1, N) input, sequence by sequence):
        input_ids (N,), positions (N,) absolute positions, slot_mapping (N,) the flat pool slot
        page * p + offset each row's K/V go to, row_seq (N,) its sequence b, seat_rows (N,) its flat
        row seat * capacity + position in the seat buffers ("gather" only, else -1).
    Sequences (B):
        block_tables (B, W) physical pages, padded with page 0 (never read: keys past a sequence's
        end are masked; W = the longest table of the step), context_lens (B,) tokens stored after
        this step (the keys its rows may read), seats (B,) ("gather" only, else -1).
    Host copies, for the Python-side layout: ``caches``, ``new_lengths``, ``ends`` (context_lens as
    ints), ``tables`` (block tables as lists)."""

    input_ids: Tensor
    positions: Tensor
    slot_mapping: Tensor
    row_seq: Tensor
    seat_rows: Tensor
    block_tables: Tensor
    context_lens: Tensor
    seats: Tensor
    caches: list
    new_lengths: list[int]
    ends: list[int]
    tables: list[list[int]]
    buffers: "StepBuffers"

    @property
    def decoding(self) -> bool:
        """Every sequence feeds one token (a decode step)."""
        return len(self.new_lengths) == self.input_ids.shape[0]

    def padded(self, name: str) -> Tensor:
        """Field ``name`` at the step's bucket size: the real entries, then inert padding."""
        buf = self.buffers
        if name in ROW_PAD:
            return buf.rows[list(ROW_PAD).index(name), : _bucket(len(self.positions), buf.token_buckets)]
        B = _bucket(len(self.ends), buf.seq_buckets)
        if name == "block_tables":
            return buf.block_tables[:B]
        return buf.seqs[list(SEQ_PAD).index(name), :B]

    def last_rows(self, logits: Tensor) -> Tensor:
        """(N, V) logits of every row -> (B, V) those of each sequence's last row."""
        if self.decoding:
            return logits
        last = torch.tensor(self.new_lengths).cumsum(0) - 1
        return logits[last.to(logits.device)]


class StepBuffers:
    """The static tensors a ``StepContext`` lives in, allocated once for the largest bucket:
    ``max_tokens`` rows, ``max_seqs`` sequences, ``max_pages`` pages a block table. Every ``fill``
    writes the same tensors (their addresses never change), pads the rows up to the step's bucket
    with inert values (``ROW_PAD``, ``SEQ_PAD``) and returns views of the real ones: the eager
    forward runs only the real rows; a captured graph would run the bucket (``StepContext.padded``)."""

    def __init__(self, max_tokens: int, max_seqs: int, max_pages: int, device: torch.device | str = "cpu"):
        self.token_buckets, self.seq_buckets = bucket_sizes(max_tokens), bucket_sizes(max_seqs)
        self.max_pages = max_pages
        long = dict(dtype=torch.long, device=device)
        self._row_pad = torch.tensor(list(ROW_PAD.values()), **long)[:, None].expand(-1, max_tokens).contiguous()
        self._seq_pad = torch.tensor(list(SEQ_PAD.values()), **long)[:, None].expand(-1, max_seqs).contiguous()
        self.rows = self._row_pad.clone()  # (5, max_tokens): the ROW_PAD fields, in that order
        self.seqs = self._seq_pad.clone()  # (2, max_seqs): the SEQ_PAD fields
        self.block_tables = torch.zeros(max_seqs, max_pages, **long)

    @classmethod
    def for_pool(cls, kv: PagedKVCache, max_tokens: int, max_seqs: int, context: int) -> StepBuffers:
        """Buffers for steps of at most ``max_tokens`` rows and ``max_seqs`` sequences of ``context`` tokens."""
        return cls(max_tokens, max_seqs, -(-context // kv.page_size), kv.pool.device)

    def fill(self, kv: PagedKVCache, caches: Sequence[PagedSequenceCache], new_lengths: Sequence[int],
             chunks: Sequence[Sequence[int]]) -> StepContext:
        """Reserve the pages (and seats) of a step that feeds ``chunks[b]`` (``new_lengths[b]`` tokens)
        to sequence ``caches[b]``, and write its metadata into the buffers: all of a step's host work
        before the forward, done once for every layer and path."""
        B, N = len(caches), sum(new_lengths)
        if B > self.seq_buckets[-1] or N > self.token_buckets[-1]:
            raise ValueError(f"a step of {B} sequences, {N} rows exceeds the buffers' {self.seq_buckets[-1]}, {self.token_buckets[-1]}")
        p, seats = kv.page_size, kv.seats
        for seq, n in zip(caches, new_lengths):  # all allocation happens here, before any layer writes
            kv.manager.prepare_write(seq.table, seq.length, seq.length + n)
        ends = [seq.length + n for seq, n in zip(caches, new_lengths)]
        if seats is not None:  # every sequence in a seat that holds its rows so far
            for seq in caches:
                if seq.seat is None:
                    seats.acquire(seq)
            seats.reserve(seats.n_seats, max(ends))
            for seq in caches:
                seats.fill(kv.pool, seq)
        rows: list[list[int]] = [[], [], [], [], []]  # ROW_PAD's fields
        ids, pos, slot, owner, seat_row = rows
        for b, (seq, n, chunk) in enumerate(zip(caches, new_lengths, chunks)):
            table, cap = seq.table, seats.capacity if seats is not None else 0
            ids.extend(chunk)
            for j in range(seq.length, seq.length + n):
                pos.append(j)
                slot.append(table[j // p] * p + j % p)
                owner.append(b)
                seat_row.append(seq.seat * cap + j if seats is not None else -1)
        tables = [seq.table for seq in caches]
        W = max(len(t) for t in tables)
        if W > self.max_pages:
            raise ValueError(f"a block table of {W} pages exceeds the buffers' max_pages={self.max_pages}")
        seat_list = [seq.seat for seq in caches] if seats is not None else [-1] * B
        Nb, Bb = _bucket(N, self.token_buckets), _bucket(B, self.seq_buckets)
        self.rows[:, :N] = torch.tensor(rows, dtype=torch.long)
        self.rows[:, N:Nb] = self._row_pad[:, : Nb - N]
        self.seqs[:, :B] = torch.tensor([ends, seat_list], dtype=torch.long)
        self.seqs[:, B:Bb] = self._seq_pad[:, : Bb - B]
        self.block_tables[:Bb].zero_()
        self.block_tables[:B, :W] = torch.tensor([t + [0] * (W - len(t)) for t in tables], dtype=torch.long)
        per_row = dict(zip(ROW_PAD, self.rows[:, :N]))  # input_ids, positions, slot_mapping, row_seq, seat_rows
        per_seq = dict(zip(SEQ_PAD, self.seqs[:, :B]))  # context_lens, seats
        return StepContext(
            **per_row, **per_seq, block_tables=self.block_tables[:B, :W], caches=list(caches),
            new_lengths=list(new_lengths), ends=ends, tables=[list(t) for t in tables], buffers=self,
        )


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
    """Several sequences of one pool in one packed forward, read through one ``StepContext`` (the
    pages were reserved, and copied on write, when it was filled); the new rows of every layer are
    written with one scatter through ``context.slot_mapping``.

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
      over the packed query rows and the context's block tables (the Triton kernel reads K/V from the pages).
    - None: the layers call ``update`` and attend over all sequences' keys laid end to end, with the
      (N, S) block mask ``same_sequence`` (the packed layout of ``companion.cache.PackedBatchCache``);
      MLA layers and layers with sinks, ALiBi or kept tokens always take this path.

    ``PagedBatch(owner, context)``, or ``PagedBatch(owner, seqs, new_lengths)`` to fill a context of
    its own (buffers of this batch's size; the chunks' token ids are not needed and left 0).
    """

    length = 0  # the model's forward is always given the rows' positions

    def __init__(self, owner: PagedKVCache, context: StepContext | Sequence[PagedSequenceCache],
                 new_lengths: Sequence[int] | None = None):
        if not isinstance(context, StepContext):
            seqs, n = list(context), list(new_lengths)
            buffers = StepBuffers(max(1, sum(n)), len(seqs), max(len(s.table) for s in seqs) + max(n), owner.pool.device)
            context = buffers.fill(owner, seqs, n, [[0] * k for k in n])
        self.owner, self.context = owner, context
        self.seqs, self.new_lengths = context.caches, context.new_lengths
        self.layers_done = 0
        self._groups: list[GatherGroup] | None = None
        self.seats = owner.seats if owner.attention_kernel == "gather" else None
        self._flex_masks: dict = {}

    # the packed layout (update path) ------------------------------------------------------------------
    @cached_property
    def _all_slots(self) -> Tensor:
        """(B, W * p): flat slot of logical position j of sequence b, every j the tables cover."""
        return page_slots(self.context.block_tables, self.owner.page_size)

    @cached_property
    def read_slots(self) -> Tensor:
        """(S,) flat slots of every stored row of every sequence, laid end to end (S = sum of lengths)."""
        return torch.cat([self._all_slots[b, :n] for b, n in enumerate(self.context.ends)])

    @cached_property
    def key_positions(self) -> Tensor:
        return torch.cat([torch.arange(n) for n in self.context.ends]).to(self.owner.pool.device)

    @cached_property
    def same_sequence(self) -> Tensor:
        """(N, S): query row n and key row s belong to the same sequence."""
        ctx = self.context
        k_seg = torch.repeat_interleave(torch.arange(len(ctx.ends), device=ctx.context_lens.device), ctx.context_lens)
        return ctx.row_seq[:, None] == k_seg[None, :]

    # the gather path --------------------------------------------------------------------------------
    def groups(self) -> list[GatherGroup]:
        """The decoding sequences (one new row) as one padded batch, the prefilling ones as another."""
        if self._groups is None:
            self._groups = []
            ctx = self.context
            device = ctx.positions.device
            lens, ends = ctx.new_lengths, ctx.ends
            seat_list = [seq.seat for seq in self.seqs]
            if ctx.decoding:  # every row, one per sequence, in packed order: the context's own tensors
                B = len(lens)
                seat_pos = None if seat_list == list(range(B)) else GatherGroup.at_seats(ctx.seats, ctx.positions.view(B, 1), max(seat_list) + 1)
                self._groups.append(GatherGroup(ctx.seats, None, ctx.positions.view(B, 1), None, None, B, 1, max(ends), seat_pos))
                return self._groups
            first = [0]
            for n in lens:
                first.append(first[-1] + n)
            as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
            for members in ([b for b, n in enumerate(lens) if n == 1], [b for b, n in enumerate(lens) if n > 1]):
                if not members:
                    continue
                B, T = len(members), max(lens[b] for b in members)
                L = max(ends[b] for b in members)
                # padded query t of sequence b repeats its last row: a real position, so no softmax row is empty
                rows = [[first[b] + min(t, lens[b] - 1) for t in range(T)] for b in members]
                q_pos = as_tensor([[ends[b] - lens[b] + min(t, lens[b] - 1) for t in range(T)] for b in members])
                real = [i * T + t for i, b in enumerate(members) for t in range(lens[b])]
                dest = [first[b] + t for b in members for t in range(lens[b])]
                seats = as_tensor([seat_list[b] for b in members])
                # decoding members not at seats 0..B-1 in order: attend at the seats (see GatherGroup)
                seat_pos = None
                if T == 1 and [seat_list[b] for b in members] != list(range(B)):
                    seat_pos = GatherGroup.at_seats(seats, q_pos, max(seat_list[b] for b in members) + 1)
                self._groups.append(GatherGroup(seats, as_tensor(rows), q_pos, as_tensor(real), as_tensor(dest), B, T, L, seat_pos))
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
        ctx = self.context
        index = (ctx.block_tables, ctx.context_lens, ctx.row_seq, ctx.positions)
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
            ctx = self.context
            logical = flex_logical_pages(ctx.tables, pool.shape[0]).to(device)
            mask_mod = paged_flex_mask_mod(ctx.row_seq.to(device), ctx.positions.to(device), logical, self.owner.page_size, window)
            self._flex_masks[window] = flex_block_mask(mask_mod, ctx.row_seq.shape[0], pool.shape[0] * pool.shape[1], device)
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
        slots = batch.context.slot_mapping
        if positions.shape[0] != slots.shape[0]:
            raise ValueError(f"this packed batch feeds {slots.shape[0]} rows; got {positions.shape[0]}")
        seats = batch.seats
        read_dtype = None if seats is None else seats.dtype
        stored = [pool.write_slots(self.layer_index, i, slots, r[0].movedim(-2, 0), read_dtype)
                  for i, r in enumerate(rows)]
        if seats is not None:  # the seats receive the same rows (as a read of the pages gives them)
            seats.write(self.layer_index, batch.context.seat_rows, *stored)

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
