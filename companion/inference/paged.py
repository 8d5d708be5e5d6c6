"""A paged KV cache with prefix sharing and copy-on-write (chapter 12, PagedAttention).

Memory is a fixed pool of pages of p token slots each. A sequence owns a block table, a list of
physical page ids; the state of its token j lives in

    page = table[floor(j / p)],  slot = j mod p,

so a sequence grows one page at a time and wastes at most p - 1 slots (in its last page), instead
of reserving the whole context up front. All layers share the block table: physical page i of layer
l holds the same tokens as page i of every other layer, so one allocation serves the whole model.

Prefix sharing. Full pages are named by a hash chain over their tokens,
    h_0 = H(namespace),  h_k = H(h_{k-1}, tokens of page k),
where the namespace holds everything else that changes K/V: the model's identity, the version of its
weights (``weights_version``: a pool checks it whenever a sequence may map shared pages, and drops
every name when it changed), its config, the position scheme (positions start at 0 here), and the
storage format (dtype, bits). Equal h_k means
equal tokens at equal positions after equal prefixes, hence equal K/V in every layer, so a new
sequence whose prompt starts with registered pages maps them into its table (reference count + 1)
and skips computing them. A page is only written by a sequence that holds the sole reference: a
write into a shared page first copies it (copy-on-write). That happens when a prompt is entirely
covered by shared pages: its last token is recomputed (its logits are needed) into a private copy.

Freed pages go back to the free list, oldest first, and keep their hash until the allocator hands
them out again, so a later request (or a preempted one being recomputed) can still reuse them.

Sliding-window layers keep all their pages: pages are shared by every layer of a sequence, and a
model with any global layer needs them anyway; the window is enforced by the attention mask.
MLA layers store the latent c_j and the RoPE key k^R_j instead of K and V.

What this module provides
- ``kv_token_shapes(model)``: per layer, the per-token shapes of the tensors the layer caches.
- ``BlockManager``: free list, reference counts, hash chain, block tables (bookkeeping only).
- ``PagePool``: the storage tensors, optionally int8 / int4 quantised (``companion.inference.kvquant``).
- ``PagedKVCache``: pool + manager; ``new_sequence(tokens)`` -> ``PagedSequenceCache``.
- ``PagedSequenceCache`` / ``PagedLayerView``: the ``LayerCache`` protocol over a block table
  (reference path: write through the table, gather the pages back, then ordinary attention).
- ``SeatBuffers``: the "gather" kernel's read store: each running sequence's K/V in one row (seat)
  of dense per-layer buffers, written with the pages, read in place.
- ``PagedBatch``: several sequences in one forward (what the engine runs): one scatter per layer
  writes every new row; attention then reads per sequence (``attention_kernel="gather"``: the
  decoding sequences as one (B, 1) batch read from their seats in place, the prefilling ones as
  another; torch's SDPA), with the reference or the Triton paged-attention kernel, or (None) over
  all sequences laid end to end with a block mask.
- ``PoolExhausted``: raised before anything is modified when the pool cannot serve a request.
- ``paged_attention_reference(q, k_pages, v_pages, block_tables, seq_lens, q_seq, q_pos, ...)``: the
  PyTorch reference of paged attention (gather through the block tables, then masked attention), and
  ``check_paged_attention_args``, the argument rules it shares with the Triton kernel
  (``companion.kernels.triton_paged.paged_attention``, which reads K/V from the pages without the gather).
  ``PagedBatch.attend(layer, q, kernel="gather" | "reference" | "triton" | "flex")`` runs any of them
  on a packed batch; the attention layers reach it through ``PagedBatchLayerView.attend``.
- ``paged_flex_mask_mod`` / ``flex_logical_pages``: paged attention as torch's flex_attention over the
  whole page pool, with a block mask that maps each pool slot back to a position of the query's
  sequence (``attention_kernel="flex"``; compiled on CUDA, the unfused eager flex_attention on a CPU).
"""

from __future__ import annotations

import hashlib

import math
from functools import cached_property
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.cache import LayerCache
from companion.inference.block_manager import BlockManager, PoolExhausted
from companion.inference.kvquant import BITS, dequantize, quantize
from companion.kernels.paged_reference import check_paged_attention_args, page_slots, paged_attention_reference

__all__ = [
    "kv_token_shapes", "BlockManager", "PagePool", "SeatBuffers", "PagedKVCache", "PagedSequenceCache", "PagedLayerView", "PagedBatch",
    "GatherGroup", "PoolExhausted", "model_namespace", "paged_attention_reference", "check_paged_attention_args", "PAGED_KERNELS",
    "paged_flex_mask_mod", "flex_logical_pages", "flex_block_mask",
]

PAGED_KERNELS = ("gather", "reference", "triton", "flex")


def kv_token_shapes(model: nn.Module) -> list[list[tuple[int, ...]]]:
    """Per layer, the per-token shape of each cached tensor: MHA/GQA [(g, d_h), (g, d_h)] (K, V);
    MLA [(d_c,), (d_R,)] (latent, RoPE key). Works for ``Decoder`` and ``GPT``."""
    c = model.config
    if c.attention == "mla":
        return [[(c.kv_rank,), (c.rope_dim,)] for _ in range(c.n_layers)]
    return [[(c.kv_heads, c.attn_head_dim)] * 2 for _ in range(c.n_layers)]


REPORT_BUFFERS = ("last_load",)  # buffers that only report what a forward did; they do not shape K/V


def weights_version(model: nn.Module) -> tuple:
    """A key that changes when the model's weights change: for every parameter and buffer, its
    identity, its storage address and torch's version counter, which every in-place change made
    through the tensor itself bumps (an optimizer step, ``load_state_dict``, ``with torch.no_grad():
    w += delta``, merging a LoRA update into W). Edits through ``.data`` bypass the counter; after
    those call ``PagedKVCache.invalidate_prefixes()`` (``Engine.weights_changed()``)."""
    key = []
    # every parameter and buffer, except the reports that a forward rewrites and nothing reads back
    # (MoE's per-expert ``last_load``)
    buffers = [b for name, b in model.named_buffers() if not name.endswith(REPORT_BUFFERS)]
    for t in (*model.parameters(), *buffers):
        version = None if t.is_inference() else t._version  # inference tensors keep no counter
        key.append((id(t), t.data_ptr(), version))
    return tuple(key)


def model_namespace(model: nn.Module, extra: str = "") -> str:
    """What besides the tokens determines K/V: this model object and the version of its weights
    (``weights_version``), its config, the position scheme (absolute positions from 0) and the
    storage format."""
    version = hashlib.sha256(repr(weights_version(model)).encode()).hexdigest()[:16]
    return f"{type(model).__name__}@{id(model)}|weights-{version}|{model.config!r}|positions-from-0|{extra}"


class PagePool:
    """Storage: for layer l and cached tensor i, ``data[l][i]`` of shape (n_pages, p, *token_shape)
    (or quantised: int8 (n_pages, p, ..., d), int4 (n_pages, p, ..., d/2) uint8, with float32 scales
    (n_pages, p, ...) in ``scales[l][i]``: one per token and head)."""

    def __init__(
        self, token_shapes: list[list[tuple[int, ...]]], n_pages: int, page_size: int, *,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", bits: int | None = None,
    ):
        if bits is not None and bits not in BITS:
            raise ValueError(f"bits must be None or one of {BITS}; got {bits}")
        self.bits, self.dtype, self.page_size, self.device = bits, dtype, page_size, torch.device(device)
        self.data: list[list[Tensor]] = []
        self.scales: list[list[Tensor]] = []
        for shapes in token_shapes:
            layer_data, layer_scales = [], []
            for shape in shapes:
                if bits is None:
                    layer_data.append(torch.zeros(n_pages, page_size, *shape, dtype=dtype, device=device))
                else:
                    if bits == 4 and shape[-1] % 2:
                        raise ValueError(f"int4 storage needs an even last dimension; got token shape {shape}")
                    last = shape[-1] if bits == 8 else shape[-1] // 2
                    qdtype = torch.int8 if bits == 8 else torch.uint8
                    layer_data.append(torch.zeros(n_pages, page_size, *shape[:-1], last, dtype=qdtype, device=device))
                    layer_scales.append(torch.ones(n_pages, page_size, *shape[:-1], dtype=torch.float32, device=device))
            self.data.append(layer_data)
            self.scales.append(layer_scales)

    def write_slots(self, layer: int, i: int, flat_slots: Tensor, rows: Tensor, read_dtype: torch.dtype | None = None) -> Tensor | None:
        """rows (T, *token_shape) into flat slot indices page * p + slot: one index_copy_ per tensor.
        With ``read_dtype``, also return the rows as a later read gives them back in that dtype
        (dequantised when the pool is quantised): what the seat buffers store (``SeatBuffers``)."""
        if self.bits is None:
            stored = rows.to(self.dtype)
            self.data[layer][i].view(-1, *self.data[layer][i].shape[2:]).index_copy_(0, flat_slots, stored)
            return None if read_dtype is None else stored.to(read_dtype)
        q, s = quantize(rows, self.bits)
        self.data[layer][i].view(-1, *q.shape[1:]).index_copy_(0, flat_slots, q)
        self.scales[layer][i].view(-1, *s.shape[1:]).index_copy_(0, flat_slots, s)
        return None if read_dtype is None else dequantize(q, s, self.bits, read_dtype)

    def read(self, layer: int, i: int, pages: Tensor, n_tokens: int, dtype: torch.dtype) -> Tensor:
        """Gather ``pages`` in order and return their first ``n_tokens`` slots, (n_tokens, *token_shape)."""
        data = self.data[layer][i][pages].flatten(0, 1)[:n_tokens]
        if self.bits is None:
            return data.to(dtype)
        return dequantize(data, self.scales[layer][i][pages].flatten(0, 1)[:n_tokens], self.bits, dtype)

    def read_slots(self, layer: int, i: int, flat_slots: Tensor, dtype: torch.dtype) -> Tensor:
        """Rows at flat slot indices page * p + slot, (S, *token_shape): one gather for a whole batch."""
        data = self.data[layer][i].flatten(0, 1).index_select(0, flat_slots)  # index_select: the fast gather on CPU
        if self.bits is None:
            return data.to(dtype)
        return dequantize(data, self.scales[layer][i].flatten(0, 1).index_select(0, flat_slots), self.bits, dtype)

    def copy_page(self, src: int, dst: int) -> None:
        for tensors in (*self.data, *self.scales):
            for t in tensors:
                t[dst] = t[src]

    def nbytes(self) -> dict[str, int]:
        """Bytes allocated: data and scale metadata separately."""
        data = sum(t.numel() * t.element_size() for layer in self.data for t in layer)
        scales = sum(t.numel() * t.element_size() for layer in self.scales for t in layer)
        return {"data": data, "scales": scales, "total": data + scales}


class SeatBuffers:
    """The running sequences' K/V kept readable for attention without a gather (the "gather" kernel).

    A seat is one row of dense buffers ``k[l], v[l]`` of shape (n_seats, capacity, g, d): while a
    sequence runs it holds a seat, and seat row j holds its token j as the pages do (dequantised
    when the pool is quantised). Every layer writes its new K/V twice, to its pages (the store of
    record: allocation, prefix sharing, copy-on-write and preemption work on pages) and to the seat;
    attention then reads the seats in place, so a decode step copies its new rows, never a whole
    prefix. Rows come from the pages only when a seat is taken (a shared prefix mapped from the pool,
    or a sequence whose pages were written by another path): ``fill`` copies the rows the seat lacks.

    The cost is memory: n_seats x capacity rows per layer besides the pages, sized like one padded
    batch of the longest running sequence (the engine preallocates max_seqs x context). A GPU reads
    the pages directly instead (``attention_kernel="triton"`` or "flex") and needs no seats.
    Both dimensions grow by doubling when a batch needs more (a copy of what is there, amortised)."""

    def __init__(self, token_shapes: list[list[tuple[int, ...]]], dtype: torch.dtype, device: torch.device):
        self.token_shapes, self.dtype, self.device = token_shapes, dtype, device
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.n_seats, self.capacity = 0, 0
        self._free: list[int] = []  # seats no sequence holds, below n_seats

    def acquire(self) -> int:
        """The lowest free seat (the buffers grow when none is free)."""
        if not self._free:
            self.reserve(max(1, 2 * self.n_seats), self.capacity)
        seat = min(self._free)
        self._free.remove(seat)
        return seat

    def release(self, seat: int) -> None:
        self._free.append(seat)

    def reserve(self, n_seats: int, capacity: int) -> None:
        """Make room for seats 0..n_seats-1 and rows 0..capacity-1 (growing by doubling, zeros:
        rows past a sequence's end are masked, but must be finite, since 0 * NaN is NaN)."""
        if n_seats <= self.n_seats and capacity <= self.capacity:
            return
        S = max(n_seats, self.n_seats if n_seats <= self.n_seats else 2 * self.n_seats)
        C = max(capacity, self.capacity if capacity <= self.capacity else 2 * self.capacity)
        for buffers, which in ((self.k, 0), (self.v, 1)):
            for layer, shapes in enumerate(self.token_shapes):
                grown = torch.zeros(S, C, *shapes[which], dtype=self.dtype, device=self.device)
                if layer < len(buffers):
                    grown[: self.n_seats, : self.capacity] = buffers[layer]
                    buffers[layer] = grown
                else:
                    buffers.append(grown)
        self._free += range(self.n_seats, S)
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


class PagedKVCache:
    """A page pool for one model plus its block manager.

    Args:
        model: a ``Decoder`` or ``GPT`` (its config gives the per-token shapes).
        n_pages, page_size: pool size in pages and p, the token slots per page.
        bits: None (store in ``dtype``), 8 or 4 (quantised, ``companion.inference.kvquant``).
        prefix_sharing: look up and register full pages by their hash chain.
        attention_kernel: how the attention layers of a packed batch (``pack``) read the pages, one of
            ``PAGED_KERNELS`` or None; see ``PagedBatch``. "gather" (default) is the fast path on a
            CPU: it keeps the running sequences' K/V in ``SeatBuffers`` too (memory: one padded
            batch of them besides the pages); "triton" needs CUDA (or TRITON_INTERPRET=1) and float pages, as does "reference";
            "flex" (torch's flex_attention over the pool, float pages) is meant for CUDA, where it is
            compiled; on a CPU it runs unfused (every query against every pool slot: a check, not a
            fast path).
    """

    def __init__(
        self, model: nn.Module, n_pages: int, page_size: int = 16, *, bits: int | None = None,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", prefix_sharing: bool = True,
        attention_kernel: str | None = "gather",
    ):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1; got {page_size}")
        if n_pages < 1:
            raise ValueError(f"n_pages must be >= 1; got {n_pages}")
        if attention_kernel is not None and attention_kernel not in PAGED_KERNELS:
            raise ValueError(f"attention_kernel must be None or one of {PAGED_KERNELS}; got {attention_kernel!r}")
        if attention_kernel in ("reference", "triton", "flex") and bits is not None:
            raise ValueError(f"attention_kernel={attention_kernel!r} reads float pages; with bits={bits} use 'gather' or None")
        if attention_kernel == "flex" and _flex_attention() is None:
            raise ValueError(f"attention_kernel='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); torch is {torch.__version__}")
        self.model, self.page_size, self.dtype, self.prefix_sharing = model, page_size, dtype, prefix_sharing
        self.attention_kernel = attention_kernel
        self.n_layers = len(kv_token_shapes(model))
        self.pool = PagePool(kv_token_shapes(model), n_pages, page_size, dtype=dtype, device=device, bits=bits)
        # "gather" reads K/V from per-sequence seats, written as the pages are (MLA layers: packed path)
        mla = len(kv_token_shapes(model)[0][0]) != 2
        self.seats = SeatBuffers(kv_token_shapes(model), dtype, self.pool.device) if attention_kernel == "gather" and not mla else None
        self._format = f"{dtype}|bits={bits}"
        self.manager = BlockManager(n_pages, page_size, model_namespace(model, self._format), on_copy=self.pool.copy_page)
        self._weights = weights_version(model)
        self.invalidations = 0  # times the registered prefixes were dropped because the weights changed

    def invalidate_prefixes(self) -> None:
        """Drop every registered prefix page (a new hash-chain root): call after changing the model's
        weights in a way ``weights_version`` cannot see (through ``.data``)."""
        self._weights = weights_version(self.model)
        self.manager.rename(model_namespace(self.model, self._format) + f"|{self.invalidations + 1}")
        self.invalidations += 1

    def check_weights(self) -> bool:
        """Invalidate the registered prefixes if the weights changed since they were computed (checked
        whenever a sequence may map shared pages); True if it did."""
        if weights_version(self.model) == self._weights:
            return False
        self.invalidate_prefixes()
        return True

    @property
    def n_free(self) -> int:
        return self.manager.n_free

    @property
    def n_pages(self) -> int:
        return self.manager.n_pages

    def pack(self, seqs: Sequence["PagedSequenceCache"], new_lengths: Sequence[int]) -> "PagedBatch":
        """A packed forward over several of this pool's sequences (see ``PagedBatch``)."""
        return PagedBatch(self, seqs, new_lengths)

    def new_sequence(self, tokens: Sequence[int] | None = None) -> "PagedSequenceCache":
        """An empty sequence cache; with ``tokens`` (and prefix sharing on) its leading full pages are
        mapped from the pool when registered, and ``length`` starts after them (at most len(tokens) - 1,
        so the last token is always computed: its logits are what the caller wants)."""
        seq = PagedSequenceCache(self)
        if tokens is not None and self.prefix_sharing and len(tokens) > 0:
            self.check_weights()  # pages computed with other weights must not be shared
            seq.table = self.manager.share_prefix(tokens)
            seq.length = min(len(seq.table) * self.page_size, len(tokens) - 1)
        return seq


class PagedSequenceCache:
    """One sequence in a ``PagedKVCache``: its block table and ``length`` (tokens whose state is stored).
    ``layer(i)`` is the ``LayerCache`` view of layer i."""

    def __init__(self, owner: PagedKVCache):
        self.owner = owner
        self.table: list[int] = []
        self.length = 0
        self._views = [PagedLayerView(self, i) for i in range(owner.n_layers)]
        self._hashes: list[bytes] = []  # hash chain of the full computed pages, extended by ``commit``
        self._unnamed_seen = -1  # ``manager.unnamed`` at the last ``commit`` (-1: never committed)
        self.seat: int | None = None  # its row of the pool's ``SeatBuffers`` (taken by the first packed batch)
        self.seat_rows = 0  # rows 0..seat_rows-1 of the seat equal the pages'

    def advance(self, n: int, seat_written: bool = False) -> None:
        """Every layer has stored the next n tokens (the one place a sequence's length moves on);
        ``seat_written``: they went to its seat as well."""
        if seat_written and self.seat_rows == self.length:
            self.seat_rows += n
        self.length += n

    def layer(self, i: int) -> "PagedLayerView":
        return self._views[i]

    def __len__(self) -> int:
        return self.owner.n_layers

    def pages_needed(self, n_new: int) -> int:
        return self.owner.manager.pages_needed(self.table, self.length, self.length + n_new)

    def reserve(self, n_new: int) -> None:
        """Make room for the next ``n_new`` tokens (pages + copy-on-write); ``PoolExhausted`` if short."""
        self.owner.manager.prepare_write(self.table, self.length, self.length + n_new)

    def commit(self, tokens: Sequence[int]) -> None:
        """Register this sequence's full computed pages (``tokens`` = all its tokens so far) for sharing."""
        if not self.owner.prefix_sharing:
            return
        manager = self.owner.manager
        # called every step for every sequence; registering is idempotent, so when no new page has
        # filled up and no page anywhere lost its name since our last call, it would change nothing
        if self.length // self.owner.page_size == len(self._hashes) and manager.unnamed == self._unnamed_seen:
            return
        self._hashes = manager.chain(tokens[: self.length], self._hashes)
        manager.register(self.table, tokens, self.length, self._hashes)
        self._unnamed_seen = manager.unnamed

    def free(self) -> None:
        self.owner.manager.free(self.table)
        if self.seat is not None:
            self.owner.seats.release(self.seat)
            self.seat, self.seat_rows = None, 0
        self.length = 0
        self._hashes, self._unnamed_seen = [], -1

    def nbytes_held(self) -> int:
        """Bytes of pool storage this sequence's pages occupy (whole pages, the unit of allocation)."""
        return len(self.table) * self.owner.pool.nbytes()["total"] // self.owner.n_pages


class PagedLayerView(LayerCache):
    """``LayerCache`` over a block table: write new rows to their slots (``page_slots``), read back every
    stored row by gathering the sequence's pages in table order (the PyTorch reference path)."""

    def __init__(self, seq: PagedSequenceCache, layer: int):
        self.seq, self.layer_index = seq, layer

    @property
    def length(self) -> int:
        # One length for all layers: the sequence advances it after its last layer has written.
        return self.seq.length

    def update(self, positions: Tensor, *rows: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        seq, p = self.seq, self.seq.owner.page_size
        start, T = seq.length, positions.shape[0]
        if rows[0].shape[0] != 1:
            raise ValueError(f"a paged sequence view stores one sequence: rows need batch size 1; got {rows[0].shape[0]}")
        if T and int(positions[0]) != start:
            raise ValueError(f"new rows must start at position length={start}; got {int(positions[0])}")
        end = start + T
        seq.owner.manager.prepare_write(seq.table, start, end)  # no-op after the first layer of a forward
        pool, device = seq.owner.pool, positions.device
        table = torch.tensor(seq.table, dtype=torch.long)
        slots = page_slots(table, p)[positions.detach().cpu().long()].to(pool.device)
        for i, r in enumerate(rows):
            pool.write_slots(self.layer_index, i, slots, r[0].movedim(-2, 0))
        out = tuple(
            pool.read(self.layer_index, i, table[: math.ceil(end / p)], end, r.dtype).movedim(0, -2).unsqueeze(0).to(r.device)
            for i, r in enumerate(rows)
        )
        if self.layer_index == len(seq) - 1:  # the last layer has written: the sequence now holds `end` tokens
            seq.advance(T)
        return torch.arange(end, device=device), out


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

    def attend(self, seat_k: Tensor, seat_v: Tensor, q: Tensor, window: int | None, scale: float | None) -> Tensor:
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
                    seq.seat, seq.seat_rows = self.seats.acquire(), 0
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
            o = grp.attend(k, v, q if grp.rows is None else q[grp.rows.view(-1)], window, scale)  # (B * T, h, d_v)
            if grp.rows is None:
                return o
            if out is None:
                out = o.new_empty(N, h, o.shape[-1])
            out.index_copy_(0, grp.dest, o.index_select(0, grp.real))
        return out

    def attend(self, layer: int, q: Tensor, *, kernel: str = "reference", window: int | None = None, scale: float | None = None) -> Tensor:
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
        flex = _flex_attention(compiled=q.device.type == "cuda")
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
        out = batch.attend(self.layer_index, q[0].transpose(0, 1), kernel=kernel, window=window)  # (N, h, d)
        batch._written()
        return out.transpose(0, 1).unsqueeze(0)


# ----------------------------------------------------------------------------------------------
# Paged attention with torch's flex_attention: a block mask over the page pool
# ----------------------------------------------------------------------------------------------

_flex_compiled = None


def _flex_attention(compiled: bool = False, create: bool = False):
    """torch's flex_attention (compiled: torch.compile'd once, for CUDA), or ``create_block_mask``
    with create=True; None when this torch has no flex_attention."""
    global _flex_compiled
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError:
        return None
    if create:
        return fa.create_block_mask
    if not compiled:
        return _flex_eager
    if _flex_compiled is None:
        # default (automatic) dynamic shapes. Not used on a CPU: there, in torch 2.13, the compiled flex
        # kernel works for static shapes but its C++ template fails to build once shapes turn dynamic
        # (CppCompileError, "cur_kvSplitSize7 was not declared"), and the query count changes every step
        _flex_compiled = torch.compile(fa.flex_attention)
    return _flex_compiled


def _flex_eager(*args, **kwargs):
    """flex_attention uncompiled (dense scores: the CPU check path), without its once-per-process
    advice to compile it."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(*args, **kwargs)


def flex_block_mask(mask_mod, n_q: int, n_kv: int, device, block: int = 128):
    """A flex_attention BlockMask for ``mask_mod`` over n_q query rows and n_kv keys, built from the
    dense (n_q, n_kv) mask that ``mask_mod`` gives on broadcast index tensors (one vectorised call;
    ``create_block_mask`` evaluates it under nested vmaps, far slower in eager mode): blocks of
    ``block`` x ``block`` with some readable entry are partial, those with only readable entries full."""
    from torch.nn.attention.flex_attention import BlockMask

    dense = mask_mod(None, None, torch.arange(n_q, device=device)[:, None], torch.arange(n_kv, device=device)[None, :])
    nq, nk = -(-n_q // block), -(-n_kv // block)
    padded = torch.zeros(nq * block, nk * block, dtype=torch.bool, device=device)
    padded[:n_q, :n_kv] = dense
    blocks = padded.view(nq, block, nk, block)
    any_, full = blocks.any(3).any(1), blocks.all(3).all(1)  # (nq, nk)
    partial = any_ & ~full

    def as_kv_blocks(which):  # per query block: how many, and which kv blocks (listed first)
        order = torch.argsort((~which).to(torch.int8), dim=-1, stable=True)
        return which.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    return BlockMask.from_kv_blocks(*as_kv_blocks(partial), *as_kv_blocks(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(n_q, n_kv))


def flex_logical_pages(tables: Sequence[Sequence[int]], n_pages: int) -> Tensor:
    """(B, n_pages) long: entry [b, page] = k when physical ``page`` is logical page k of sequence b
    (tables[b][k] == page), else -1. The inverse of the block tables, per sequence (a page shared by
    several sequences has an entry in each of their rows)."""
    logical = torch.full((len(tables), n_pages), -1, dtype=torch.long)
    for b, table in enumerate(tables):
        if table:
            logical[b, torch.tensor(table, dtype=torch.long)] = torch.arange(len(table))
    return logical


def paged_flex_mask_mod(q_seq: Tensor, q_pos: Tensor, logical_pages: Tensor, page_size: int, window: int | None = None):
    """The flex_attention ``mask_mod(b, h, q_idx, kv_idx)`` of paged attention over a whole pool whose
    slots are laid end to end (kv_idx = page * p + offset): query row q_idx (sequence q_seq[q_idx], at
    position q_pos[q_idx]) may read slot kv_idx when that slot's page is logical page k of its own
    sequence (``flex_logical_pages``), i.e. the slot holds position j = k * p + offset, and
    j <= q_pos (causal; this also hides every slot past the sequence's end) and, with a window,
    q_pos - j < window. Tensor ops only: it runs under flex's vmap and on plain broadcast index
    tensors alike (the tests build the dense (N, S) mask with it)."""

    def mask_mod(b, h, q_idx, kv_idx):
        k = logical_pages[q_seq[q_idx], kv_idx // page_size]
        j = k * page_size + kv_idx % page_size
        allowed = (k >= 0) & (j <= q_pos[q_idx])
        if window is not None:
            allowed = allowed & (q_pos[q_idx] - j < window)
        return allowed

    return mask_mod
