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

What this module provides (the pages; how attention reads them is ``companion.inference.batch``)
- ``kv_token_shapes(model)``: per layer, the per-token shapes of the tensors the layer caches.
- ``BlockManager`` (``companion.inference.block_manager``): free list, reference counts, hash chain,
  block tables (bookkeeping only).
- ``PagePool``: the storage tensors, optionally int8 / int4 quantised (``companion.inference.kvquant``).
- ``PagedKVCache``: pool + manager (+ the "gather" kernel's ``SeatBuffers``);
  ``new_sequence(tokens)`` -> ``PagedSequenceCache``. Several sequences in one forward (what the
  engine runs) are ``companion.inference.batch.PagedBatch``, which imports this module (never the
  other way round).
- ``SeatBuffers``: each running sequence's K/V also in one row (seat) of dense per-layer buffers,
  what the "gather" kernel reads; ``PAGED_KERNELS``: the ways a packed batch reads its keys.
- ``PagedSequenceCache`` / ``PagedLayerView``: the ``LayerCache`` protocol over one block table
  (reference path: write through the table, gather the pages back, then ordinary attention).
- ``PoolExhausted``: raised before anything is modified when the pool cannot serve a request.
The paged-attention kernels that read the pool: ``companion.kernels.paged_reference`` (PyTorch),
``companion.kernels.triton_paged`` (Triton) and ``companion.kernels.paged_flex`` (flex_attention).
"""

from __future__ import annotations

import hashlib

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from companion.cache import LayerCache
from companion.inference.block_manager import BlockManager, PoolExhausted
from companion.inference.kvquant import BITS, dequantize, quantize
from companion.kernels.paged_flex import flex_available
from companion.kernels.paged_reference import page_slots

__all__ = [
    "kv_token_shapes", "BlockManager", "PagePool", "PagedKVCache", "PagedSequenceCache", "PagedLayerView", "PoolExhausted",
    "model_namespace", "weights_version", "PAGED_KERNELS", "SeatBuffers",
]

# The ways a packed batch's attention reads its keys (``companion.inference.batch.PagedBatch``).
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


class PagedKVCache:
    """A page pool for one model plus its block manager.

    Args:
        model: a ``Decoder`` or ``GPT`` (its config gives the per-token shapes).
        n_pages, page_size: pool size in pages and p, the token slots per page.
        bits: None (store in ``dtype``), 8 or 4 (quantised, ``companion.inference.kvquant``).
        prefix_sharing: look up and register full pages by their hash chain.
        attention_kernel: how the attention layers of a packed batch (``companion.inference.batch.PagedBatch``) read the pages, one of
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
        if attention_kernel == "flex" and not flex_available():
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
            self.owner.seats.release(self)
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

    def fill(self, pool: PagePool, seq: PagedSequenceCache) -> None:
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
