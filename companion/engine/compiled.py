"""A compiled decode step for the engine (``Engine(..., compile=True)``): ``torch.compile`` over the
model's forward for a step in which every running sequence feeds one token.

Why: at the book's toy sizes a decode step is about 200 small operations launched one by one from
Python (norms, projections, RoPE, SwiGLU, the paged gather and SDPA); their launch cost, not the
arithmetic, sets the step time on a CPU. Inductor fuses the elementwise work into a few C++ loops
and replays the whole step from one call.

What is compiled: ``Decoder.forward`` with a cache view that holds only tensors (``_StepCache``):
each layer writes its new K/V into the pool with one ``index_copy_`` and attends through
``companion.inference.paged.GatherGroup.attend``, the same code the eager "gather" path runs. The bookkeeping
(page allocation, block tables, slot indices) stays in eager Python, outside the graph, as do the
prefill steps (their shapes vary far more) and sampling.

Shapes. The batch size B and the longest context L change nearly every step, so those dimensions of
the step's inputs are marked dynamic (``maybe_mark_dynamic``): B and L are symbols, and one graph
serves every (B, L); the pool's and the weights' shapes stay static. torch specialises sizes 0 and 1,
so B = 1 gets a second graph; nothing else recompiles (the test counts graphs). The compiled function lives at module level, shared by every engine: a new ``Engine`` over
the same model, or over another model of the same shapes (weights are inputs of the graph, not
constants), with a pool of the same shapes, reuses the graphs already built; torch keeps at most 8
graphs per function (``torch._dynamo.config.recompile_limit``) and runs the step uncompiled beyond.

Per-step host cost. At these sizes a compiled step is about 1 ms, so what surrounds the graph
matters as much as the graph: the slot matrix is kept up to date incrementally (``CompiledDecode``),
the write slots are looked up inside the graph, and the generated wrapper is C++ (inductor's
``cpp_wrapper``: the Python wrapper spent about 0.2 ms a step on its size asserts, tensor views and
allocations). Dynamo still checks its guards on every call (about 0.1 ms: the model's modules and
parameters, the pool's tensors); they are kept, none is skipped.

Needs: torch.compile's inductor backend, which compiles C++ with the system compiler (g++ or clang++;
Debian: ``apt-get install g++``); ``compile_unavailable()`` says why it cannot run.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import Tensor, nn

from companion.cache import LayerCache
from companion.inference.paged import GatherGroup, PagedKVCache, PagePool
from companion.kernels.paged_reference import page_slots

__all__ = ["CompiledDecode", "compile_unavailable", "compile_unsupported"]

_compiled_step = None  # the torch.compile'd ``_decode_step``, built on first use


def compile_unavailable() -> str | None:
    """Why torch.compile (inductor, CPU) cannot run here, or None when it can."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        from torch import _dynamo

        if not _dynamo.is_dynamo_supported():
            return "torch.compile (dynamo) does not support this Python version"
    except Exception as exc:  # noqa: BLE001 - any import failure means: not available
        return f"torch._dynamo cannot be imported: {exc}"
    compilers = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in compilers):
        return "inductor needs a C++ compiler (g++ or clang++) on PATH; none was found"
    return None


def compile_unsupported(model: nn.Module) -> str | None:
    """Why the compiled decode step cannot serve ``model``, or None when it can: it serves ``Decoder``
    models whose every layer is plain causal (optionally windowed) multi-head / grouped-query
    attention, i.e. the layers that let the cache attend (``LayerCache.attend``), with dense FFNs."""
    from companion.mha import MultiHeadAttention
    from companion.models.decoder import Decoder

    if not isinstance(model, Decoder):
        return f"compile=True serves Decoder models; got {type(model).__name__}"
    c = model.config
    if c.attention == "mla":
        return "compile=True does not serve MLA layers (their latent cache has no attend path)"
    if c.n_experts:
        return "compile=True does not serve MoE layers (data-dependent routing)"
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if not isinstance(attn, MultiHeadAttention) or not attn._plain_causal(None) or attn.backend not in ("auto", "sdpa"):
            return f"compile=True needs plain causal attention with the sdpa backend in every layer; layer {i} is {attn.extra_repr()}"
    return None


class _StepCache:
    """The cache of one compiled decode step: the pool's tensors, the step's key slots (as a
    ``GatherGroup``: B sequences, one query each, L keys) and the slots its new K/V go to."""

    length = 0  # positions are always passed

    def __init__(self, pool: PagePool, group: GatherGroup, write_slots: Tensor):
        self.pool, self.group, self.write_slots = pool, group, write_slots

    def layer(self, i: int) -> "_StepLayerView":
        return _StepLayerView(self, i)


class _StepLayerView(LayerCache):

    def __init__(self, cache: _StepCache, layer: int):
        self.cache, self.layer_index = cache, layer

    def update(self, positions: Tensor, *rows: Tensor):
        raise RuntimeError("the compiled decode step serves layers that attend through the cache only (see compile_unsupported)")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, *, window: int | None = None, backend: str = "auto") -> Tensor:
        """As ``companion.inference.paged.PagedBatchLayerView.attend`` for a pure decode step: q (1, h, B, d),
        k, v (1, g, B, d) -> (1, h, B, d)."""
        c = self.cache
        for i, rows in enumerate((k, v)):
            c.pool.write_slots(self.layer_index, i, c.write_slots, rows[0].movedim(-2, 0))
        out = c.group.attend(c.pool, self.layer_index, q[0].transpose(0, 1), window, None)  # (B, h, d)
        return out.transpose(0, 1).unsqueeze(0)


def _decode_step(model: nn.Module, pool: PagePool, ids: Tensor, positions: Tensor, slots: Tensor) -> Tensor:
    """ids (1, B) the new tokens, positions (B,) theirs, slots (B, L) the flat pool slots of every
    sequence's keys 0..L-1 (past a sequence's end: any slot, masked) -> logits (B, V). Runs traced by
    torch.compile. The slot each new K/V goes to is the one of its own position, looked up here (one
    input less to guard, one eager op less per step)."""
    B, L = slots.shape
    write_slots = slots.gather(1, positions.view(B, 1)).view(B)
    group = GatherGroup(None, positions.view(B, 1), slots.reshape(-1), None, None, B, 1, L)
    return model(ids, cache=_StepCache(pool, group, write_slots), positions=positions)[0]


def _step_function():
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(_decode_step, fullgraph=True, options={"cpp_wrapper": True})
    return _compiled_step


class CompiledDecode:
    """The engine's compiled decode step over ``kv``'s pool: ``__call__(caches, tokens)`` feeds
    ``tokens[b]`` to sequence ``caches[b]`` (one token each) and returns the logits (B, V). Raises
    ValueError (naming ``compile``) when compile cannot run here or cannot serve the model.

    Slot bookkeeping is incremental. In steady decoding the same sequences run step after step and
    each block table only grows by a page every p steps, so rebuilding the (B, L) slot matrix (and a
    whole ``PagedBatch``) every step is wasted host work, which at these sizes costs a sizeable part
    of a compiled step. Instead row b of a preallocated slot buffer mirrors the block table of the
    sequence in batch row b (``_tables`` keeps the page list it was written from): a row is rewritten
    only where its table changed (a new page, or a copy-on-write replacing the page being written),
    and every row is rebuilt when the set or order of sequences changes. ``rebuild_slots`` gives the
    same matrix from scratch (the tests compare the two)."""

    def __init__(self, model: nn.Module, kv: PagedKVCache):
        reason = compile_unavailable() or compile_unsupported(model)
        if reason is not None:
            raise ValueError(f"compile=True cannot be used: {reason}")
        if kv.attention_kernel != "gather" or kv.pool.bits is not None:
            raise ValueError(
                f"compile=True needs attention_kernel='gather' and float pages (kv_bits=None); got "
                f"attention_kernel={kv.attention_kernel!r}, kv_bits={kv.pool.bits}"
            )
        self.model, self.kv = model, kv
        self.step = _step_function()
        p = kv.page_size
        # a row covers the longest table a sequence can have (the model's context; at most the pool)
        self._width = min(-(-model.config.context_length // p), kv.n_pages) * p
        self._slots = torch.zeros(0, self._width, dtype=torch.long, device=kv.pool.device)
        self._caches: list = []  # the sequence in each row of ``_slots``, as of the last step
        self._tables: list[list[int]] = []  # the block table each row was written from
        self._lengths: list[int] = []  # each row's sequence length after the last step

    def _write_pages(self, row: int, table: list[int], first: int) -> None:
        """Row ``row`` of the slot buffer, pages first.. of ``table`` (``page_slots``: the slot formula)."""
        p = self.kv.page_size
        pages = torch.tensor(table[first:], dtype=torch.long, device=self._slots.device)
        self._slots[row, first * p : len(table) * p] = page_slots(pages, p)

    def _update_slots(self, caches) -> None:
        """Bring the slot buffer's rows in line with the block tables of ``caches`` (see the class docstring)."""
        B = len(caches)
        if B > self._slots.shape[0]:  # grow (rarely: up to the engine's max_seqs)
            grown = torch.zeros(max(B, 2 * self._slots.shape[0]), self._width, dtype=torch.long, device=self._slots.device)
            grown[: self._slots.shape[0]] = self._slots
            self._slots = grown
        # the same sequences, in the same rows, untouched since our last step (any other step feeding
        # them would have moved their lengths): only this step's reservation can have changed a table
        same = len(caches) == len(self._caches) and all(
            c is old and c.length == n for c, old, n in zip(caches, self._caches, self._lengths)
        )
        if not same:
            self._caches, self._tables = list(caches), [[] for _ in caches]
        p = self.kv.page_size
        for row, (cache, known) in enumerate(zip(caches, self._tables)):
            table, k = cache.table, cache.length // p
            # a one-token write at position `length` appends a page or replaces page k (copy-on-write)
            if same and len(table) == len(known) and table[k] == known[k]:
                continue
            first = next((j for j, (a, b) in enumerate(zip(table, known)) if a != b), min(len(table), len(known)))
            self._write_pages(row, table, first)
            known[:] = table

    def rebuild_slots(self, caches) -> Tensor:
        """(B, width) the slot matrix built from scratch from the block tables (for tests)."""
        out = torch.zeros(len(caches), self._width, dtype=torch.long, device=self._slots.device)
        p = self.kv.page_size
        for row, cache in enumerate(caches):
            pages = torch.tensor(cache.table, dtype=torch.long, device=out.device)
            out[row, : len(cache.table) * p] = page_slots(pages, p)
        return out

    def __call__(self, caches, tokens: list[int]) -> Tensor:
        manager = self.kv.manager
        for cache in caches:  # eager bookkeeping: pages reserved (a no-op when the scheduler already did)
            manager.prepare_write(cache.table, cache.length, cache.length + 1)
        self._update_slots(caches)
        lengths = [cache.length for cache in caches]
        B, L = len(caches), max(lengths) + 1
        # one host-to-tensor copy for the tokens and their positions
        ids_pos = torch.tensor([tokens, lengths], dtype=torch.long, device=self.kv.pool.device)
        ids, positions = ids_pos[:1], ids_pos[1]
        slots = self._slots[:B, :L]  # a view: strides (width, 1) for every B and L, so no restride guard
        # B and L are symbols from the first compile on (the pool's and the weights' shapes stay static);
        # "maybe": B = 1 may still be specialised (a second graph)
        for t, dims in ((ids, (1,)), (positions, (0,)), (slots, (0, 1))):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(t, dim)
        logits = self.step(self.model, self.kv.pool, ids, positions, slots)
        for cache in caches:  # every layer has written: each sequence now holds one more token
            cache.length += 1
        self._lengths = [n + 1 for n in lengths]
        return logits
