"""A compiled decode step for the engine (``Engine(..., compile=True)``): ``torch.compile`` over the
model's forward for a step in which every running sequence feeds one token.

Why: at the book's toy sizes a decode step is about 200 small operations launched one by one from
Python (norms, projections, RoPE, SwiGLU, the paged gather and SDPA); their launch cost, not the
arithmetic, sets the step time on a CPU. Inductor fuses the elementwise work into a few C++ loops
and replays the whole step from one call.

What is compiled: ``Decoder.forward`` with a cache view that holds only tensors (``_StepCache``):
each layer writes its new K/V into the pool and into the sequences' seats with one ``index_copy_``
each and attends through ``companion.inference.batch.GatherGroup.sdpa`` over the seat buffers, the
same code the eager "gather" path runs. The bookkeeping (page allocation, seats, the slot and seat
row of each new token) stays in eager Python, outside the graph, as do the prefill steps (their
shapes vary far more) and sampling.

Shapes. The batch size B, the seats in use n and the longest context L change nearly every step, so
those dimensions of the step's inputs are marked dynamic (``maybe_mark_dynamic``): one graph serves
every (B, n, L); the pool's, the seats' and the weights' shapes stay static. torch specialises sizes
0 and 1, so B = 1 gets a second graph; nothing else recompiles (the test counts graphs). The
compiled function lives at module level, shared by every engine: a new ``Engine`` over the same
model, or over another model of the same shapes (weights are inputs of the graph, not constants),
with a pool of the same shapes, reuses the graphs already built; torch keeps at most 8 graphs per
function (``torch._dynamo.config.recompile_limit``) and runs the step uncompiled beyond.

Per-step host cost. At these sizes a compiled step is about 1 ms, so what surrounds the graph
matters as much as the graph: the step's integers go to the device in one ``torch.tensor`` call (``StepBuffers.fill``),
and the generated wrapper is C++ (inductor's ``cpp_wrapper``: the Python wrapper spent about 0.2 ms
a step on its size asserts, tensor views and allocations). Dynamo still checks its guards on every
call (about 0.1 ms: the model's modules and parameters, the pool's tensors); they are kept.

Needs: torch.compile's inductor backend, which compiles C++ with the system compiler (g++ or clang++;
Debian: ``apt-get install g++``); ``compile_unavailable()`` says why it cannot run.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import Tensor, nn

from companion.cache import LayerCache
from companion.inference.batch import GatherGroup, StepContext
from companion.inference.paged import PagedKVCache, PagePool, SeatBuffers

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
        if not isinstance(attn, MultiHeadAttention) or not attn.cache_attends or attn.backend not in ("auto", "sdpa"):
            return f"compile=True needs plain causal attention with the sdpa backend in every layer; layer {i} is {attn.extra_repr()}"
    return None


class _StepCache:
    """The cache of one compiled decode step: the pool and its seats, the step's keys (as a
    ``GatherGroup``: B sequences, one query each, L keys, at their seats) and where its new K/V go."""

    length = 0  # positions are always passed

    def __init__(self, pool: PagePool, seats: SeatBuffers, group: GatherGroup, write_slots: Tensor, seat_rows: Tensor):
        self.pool, self.seats, self.group, self.write_slots, self.seat_rows = pool, seats, group, write_slots, seat_rows

    def layer(self, i: int) -> "_StepLayerView":
        return _StepLayerView(self, i)


class _StepLayerView(LayerCache):

    def __init__(self, cache: _StepCache, layer: int):
        self.cache, self.layer_index = cache, layer

    def update(self, positions: Tensor, *rows: Tensor):
        raise RuntimeError("the compiled decode step serves layers that attend through the cache only (see compile_unsupported)")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, *, window: int | None = None, backend: str = "auto") -> Tensor:
        """As ``companion.inference.batch.PagedBatchLayerView.attend`` for a pure decode step: q (1, h, B, d),
        k, v (1, g, B, d) -> (1, h, B, d)."""
        c, layer = self.cache, self.layer_index
        stored = [c.pool.write_slots(layer, i, c.write_slots, rows[0].movedim(-2, 0), c.seats.dtype) for i, rows in enumerate((k, v))]
        c.seats.write(layer, c.seat_rows, *stored)
        out = c.group.sdpa(c.seats.k[layer], c.seats.v[layer], q[0].transpose(0, 1), window, None)  # (B, h, d)
        return out.transpose(0, 1).unsqueeze(0)


def _decode_step(model: nn.Module, pool: PagePool, seats: SeatBuffers, ids: Tensor, index: Tensor, seat_pos: Tensor,
                 key_pos: Tensor) -> Tensor:
    """ids (1, B) the new tokens; index (4, B): their positions, the sequences' seats, the pool slots
    and the seat rows their new K/V go to; seat_pos (n, 1) each seat's query position
    (``GatherGroup.at_seats``); key_pos (L,) the key positions 0..L-1 (its length is all that is
    read) -> logits (B, V). Runs traced by torch.compile."""
    positions, seat_ids, write_slots, seat_rows = index
    B, L = positions.shape[0], key_pos.shape[0]
    group = GatherGroup(seat_ids, None, positions.view(B, 1), None, None, B, 1, L, seat_pos)
    return model(ids, cache=_StepCache(pool, seats, group, write_slots, seat_rows), positions=positions)[0]


def _step_function():
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(_decode_step, fullgraph=True, options={"cpp_wrapper": True})
    return _compiled_step


class CompiledDecode:
    """The engine's compiled decode step over ``kv``'s pool: ``__call__(context)`` feeds each
    sequence of a decode step's ``StepContext`` its one token and returns the logits (B, V). Raises
    ValueError (naming ``compile``) when compile cannot run here or cannot serve the model.

    The bookkeeping outside the graph (pages, seats, slots, seat rows) is the context's, filled by the
    runner for every step, compiled or not. The seat buffers are sized once for as many full
    contexts as the pool holds (their shapes are part of the graph: growing them would recompile)."""

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
        context = model.config.context_length
        kv.seats.reserve(max(1, kv.n_pages * kv.page_size // context), context)

    def __call__(self, context: StepContext) -> Tensor:
        """Logits (B, V) of a decode step whose context the runner filled (``StepBuffers.fill``: pages
        reserved, seats taken and filled, slots and seat rows computed): nothing is derived here."""
        kv, seats = self.kv, self.kv.seats
        # the graph's inputs: the context's tokens, positions, seats, slots and seat rows as one (5, B)
        ids_index = torch.stack((context.input_ids, context.positions, context.seats, context.slot_mapping, context.seat_rows))
        ids, index = ids_index[:1], ids_index[1:]
        seat_pos = GatherGroup.at_seats(index[1], index[0].view(-1, 1), max(seq.seat for seq in context.caches) + 1)
        key_pos = torch.arange(max(context.ends), device=kv.pool.device)
        # B, n and L are symbols from the first compile on (the pool's, the seats' and the weights'
        # shapes stay static); "maybe": B = 1 may still be specialised (a second graph)
        for t, dim in ((ids, 1), (index, 1), (seat_pos, 0), (key_pos, 0)):
            torch._dynamo.maybe_mark_dynamic(t, dim)
        logits = self.step(self.model, kv.pool, seats, ids, index, seat_pos, key_pos)
        for cache in context.caches:  # every layer has written, pages and seats
            cache.advance(1, seat_written=True)
        return logits
