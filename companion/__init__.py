"""companion: the code of the book, importable.

The map, module -> chapters. The mathematics sits flat, where a reader looks first; the systems
parts have named homes. Layers, lowest first (``tests/test_import_layers.py`` keeps them so: a module
imports only from its own layer or below, and there are no import circles):
mathematics -> kernels -> cache -> layers -> models -> tokenizers / data -> inference ->
accounting / hf -> engine / training -> notebook / exercises -> this package and its command line.

The mathematics
- ``companion.attention``: scaled dot-product attention, softmax and masks (1).
- ``companion.attention_backward``: attention's backward pass by hand, dQ, dK, dV (5).
- ``companion.positions``: sinusoidal, learned, RoPE (+ PI / NTK / YaRN), ALiBi (2, 7).
- ``companion.norms``: LayerNorm and RMSNorm written out (3, 6).
- ``companion.feedforward``: ReLU / GELU MLPs and SwiGLU (3, 6).
- ``companion.cache``: the per-layer cache interface and a contiguous cache (10).
- ``companion.mha``: the multi-head (GQA / MQA) attention layer: a short core, and what families
  change (window, kept tokens, sinks, ALiBi, QK-norm, scale, soft-cap, cross) in one ``AttentionVariant`` (1, 3, 8, 9).
- ``companion.mla``: multi-head latent attention, expanded and absorbed (8).
- ``companion.moe``: mixture of experts, routers and load balancing (9).
- ``companion.blocks``: pre- / post-norm residual blocks (3, 6).
- ``companion.models``: ``Seq2SeqTransformer`` (3), ``GPT`` (4), the configurable ``Decoder`` and its
  presets (6-9); ``from_preset(name)`` builds any of them.
- ``companion.accounting``: parameters, FLOPs, KV-cache bytes, GPU peaks, by formula (3, 6, 8, 10).
- ``companion.hf``: weights to and from Hugging Face transformers (6-9; optional extra ``hf``).
- ``companion.files``: atomic file writes and SHA-256 digests.
- ``companion.precision``: the training arithmetic a GPU's compute capability allows (bf16 / fp16 +
  scaler / fp32), and which dtypes the Triton kernels take there.

The systems
- ``companion.kernels``: ``attend``, the one attention entry point (reference, sdpa, tiled, triton);
  ``online_softmax`` (the state and its merge), ``flash`` (tiled attention and its recomputing
  backward) and ``traffic`` (the bytes a kernel moves) (11); Triton kernels
  (``triton_flash``, ``triton_paged``, imported lazily: triton + CUDA) and ``paged_reference`` (12).
- ``companion.inference``: ``generate`` (samplers, no / contiguous / paged caches; 4, 10, 12),
  ``translate`` (greedy and beam search, BLEU / chrF; 3), ``kvquant`` (int8 / int4 KV; 12), ``paged``
  (page pool, sequence views, seats), ``batch`` (a step's ``StepContext`` and the packed batch that
  reads K/V by it) and ``block_manager`` (free list, prefix hashing, copy-on-write) (12).
- ``companion.engine``: the continuous-batching server: sequence, scheduler, runner, compiled decode
  step, engine (12, 13).
- ``companion.training``: ``optim`` (Adam, AdamW, schedules; 5), ``losses`` (3, 4), ``trainer`` (one
  loop for every model: accumulation, bf16, DDP, exact resume), ``checkpoint``, ``cli`` (3-13).
- ``companion.data``: offline corpora (Shakespeare, verse-aligned Bibles) as ``datasets`` objects,
  batching, the trainer's data sources (``loaders``), synthetic tasks (3, 4).
- ``companion.tokenizers``: characters, words, byte-level BPE from scratch and via ``tokenizers`` (3, 4).

The decode path, as a reader walks it (chapter 12): four files, each calling only the next
1. ``companion/engine/engine.py``: ``Engine.step`` asks the scheduler (``engine/scheduler.py``, its
   numbered policy) for (sequence, n tokens) pairs and hands them to ``Runner.run``.
2. ``companion/engine/runner.py``: ``Runner.prepare`` fills the step's ``StepContext`` (token ids,
   positions, slot mapping, block tables, context lengths, seats) into buffers allocated once;
   ``Runner.forward`` runs the model over the packed (1, N) row with ``PagedBatch(kv, context)`` as
   its cache (the model's forward, ``companion.models``, gives layer i ``cache.layer(i)``).
3. ``companion/mha.py``: ``MultiHeadAttention.forward`` projects and rotates q, k, v; ``_read`` hands
   them to the cache view (``view.attend``).
4. ``companion/inference/batch.py``: ``PagedBatchLayerView.attend`` writes k, v at the context's
   slots and seat rows, and ``PagedBatch.paged_attention`` reads them back: for a decode step on a CPU
   ``GatherGroup.sdpa``, SDPA over a view of the seats; on a GPU a kernel of ``companion.kernels``
   over the pages and the context's block tables.
Below them: the pages (``inference/paged.py``, ``inference/block_manager.py``) and the kernels.

For the notebooks
- ``companion.profile()``: the quick / gpu switch, device choice and seeding every chapter starts
  with (the module is ``companion.notebook.profile``).
- ``companion.notebook``: ``style`` (``use_book_style()``, every chapter's first call), ``viz`` (plots
  and the book's PNG), ``phone_figures`` (each figure drawn again for a phone), ``widgets`` (explorers),
  ``attention_maps``.
- ``companion.exercises``: checkers for the chapters' exercises, ``check("ch01.masked_softmax", fn)``.
"""

__version__ = "0.1.0"

__all__ = ["Profile", "pick_device", "profile", "seed_everything", "__version__"]


def __getattr__(name: str):
    """``companion.profile`` and its siblings, imported on first use: ``import companion`` (and so
    ``python -m companion --help``) does not load torch, which takes seconds."""
    if name in ("Profile", "pick_device", "profile", "seed_everything"):
        from companion.notebook import profile as module

        return getattr(module, name)
    raise AttributeError(f"module 'companion' has no attribute {name!r}")
