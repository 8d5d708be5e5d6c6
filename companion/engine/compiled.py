"""A compiled decode step for the engine (``Engine(..., compile=True)``): ``torch.compile`` over the
model's forward for a step in which every running sequence feeds one token.

Why: at the book's toy sizes a decode step is about 200 small operations launched one by one from
Python (norms, projections, RoPE, SwiGLU, the paged gather and SDPA); their launch cost, not the
arithmetic, sets the step time on a CPU. Inductor fuses the elementwise work into a few C++ loops
and replays the whole step from one call.

What is compiled: ``Decoder.forward`` with a cache view that holds only tensors (``_StepCache``):
each layer writes its new K/V into the pool with one ``index_copy_`` and attends through
``companion.paged._Group.attend``, the same code the eager "gather" path runs. The bookkeeping
(page allocation, block tables, slot indices) stays in eager Python, outside the graph, as do the
prefill steps (their shapes vary far more) and sampling.

Shapes. The batch size B and the longest context L change nearly every step, so those dimensions of
the step's inputs are marked dynamic (``maybe_mark_dynamic``): B and L are symbols, and one graph
serves every (B, L); the pool's and the weights' shapes stay static. torch specialises sizes 0 and 1,
so B = 1 gets a second graph; nothing else recompiles (the test counts graphs). The compiled function lives at module level, shared by every engine: a new ``Engine`` over
the same model, or over another model of the same shapes (weights are inputs of the graph, not
constants), with a pool of the same shapes, reuses the graphs already built; torch keeps at most 8
graphs per function (``torch._dynamo.config.recompile_limit``) and runs the step uncompiled beyond.

Needs: torch.compile's inductor backend, which compiles C++ with the system compiler (g++ or clang++;
Debian: ``apt-get install g++``); ``compile_unavailable()`` says why it cannot run.
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import Tensor, nn

from ..paged import PagedKVCache, PagePool, _Group

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
    from ..mha import MultiHeadAttention
    from ..models.decoder import Decoder

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
    ``_Group``: B sequences, one query each, L keys) and the slots its new K/V go to."""

    length = 0  # positions are always passed

    def __init__(self, pool: PagePool, group: _Group, write_slots: Tensor):
        self.pool, self.group, self.write_slots = pool, group, write_slots

    def layer(self, i: int) -> "_StepLayerView":
        return _StepLayerView(self, i)


class _StepLayerView:
    length = 0

    def __init__(self, cache: _StepCache, layer: int):
        self.cache, self.layer_index = cache, layer

    def update(self, positions: Tensor, *rows: Tensor):
        raise RuntimeError("the compiled decode step serves layers that attend through the cache only (see compile_unsupported)")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, *, window: int | None = None, backend: str = "auto") -> Tensor:
        """As ``companion.paged.PagedBatchLayerView.attend`` for a pure decode step: q (1, h, B, d),
        k, v (1, g, B, d) -> (1, h, B, d)."""
        c = self.cache
        for i, rows in enumerate((k, v)):
            c.pool.write_slots(self.layer_index, i, c.write_slots, rows[0].movedim(-2, 0))
        out = c.group.attend(c.pool, self.layer_index, q[0].transpose(0, 1), window, None)  # (B, h, d)
        return out.transpose(0, 1).unsqueeze(0)


def _decode_step(model: nn.Module, pool: PagePool, ids: Tensor, positions: Tensor, slots: Tensor, write_slots: Tensor) -> Tensor:
    """ids (1, B) the new tokens, positions (B,) theirs, slots (B, L) the flat pool slots of every
    sequence's keys 0..L-1 (past a sequence's end: any slot, masked), write_slots (B,) where the new
    K/V go -> logits (B, V). Runs traced by torch.compile."""
    B, L = slots.shape
    group = _Group(None, positions.view(B, 1), slots.reshape(-1), None, None, B, 1, L)
    return model(ids, cache=_StepCache(pool, group, write_slots), positions=positions)[0]


def _step_function():
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(_decode_step, fullgraph=True)
    return _compiled_step


class CompiledDecode:
    """The engine's compiled decode step over ``kv``'s pool: ``__call__(caches, tokens)`` feeds
    ``tokens[b]`` to sequence ``caches[b]`` (one token each) and returns the logits (B, V). Raises
    ValueError (naming ``compile``) when compile cannot run here or cannot serve the model."""

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

    def __call__(self, caches, tokens: list[int]) -> Tensor:
        batch = self.kv.pack(caches, [1] * len(caches))  # eager bookkeeping: pages reserved, slots computed
        device = self.kv.pool.device
        L = int(batch.seq_lens.max())
        # row-major strides even for B = 1 (a (1, L) slice counts as contiguous with its old stride)
        slots = batch.all_slots[:, :L].clone(memory_format=torch.contiguous_format)
        ids = torch.tensor(tokens, dtype=torch.long, device=device)[None]
        positions, write_slots = batch.q_pos.to(device), batch.write_slots
        # B and L are symbols from the first compile on (the pool's and the weights' shapes stay static);
        # "maybe": B = 1 may still be specialised (a second graph)
        for t, dims in ((ids, (1,)), (positions, (0,)), (slots, (0, 1)), (write_slots, (0,))):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(t, dim)
        logits = self.step(self.model, self.kv.pool, ids, positions, slots, write_slots)
        batch.advance()
        return logits
