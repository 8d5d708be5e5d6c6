"""companion: the code of the book, importable.

One concept per module, named for the concept:
- ``companion.attention``: scaled dot-product attention and masks (chapter 1).
- ``companion.profile``: the quick/gpu switch, device choice and seeding used by every chapter.
- ``companion.viz``: the plots the chapters share.
- ``companion.norms``: LayerNorm and RMSNorm written out (chapters 3, 6).
- ``companion.positions``: sinusoidal, learned, RoPE (+ PI / NTK / YaRN), ALiBi (chapters 2, 7).
- ``companion.feedforward``: ReLU/GELU MLPs and SwiGLU (chapters 3, 6).
- ``companion.moe``: mixture of experts, routers and load balancing (chapter 9).
- ``companion.cache``: the per-layer cache interface and a contiguous cache (chapter 10).
- ``companion.mha``: the multi-head (GQA/MQA) attention layer with masks, sinks, ALiBi (chapters 1, 8, 9).
- ``companion.mla``: multi-head latent attention, expanded and absorbed (chapter 8).
- ``companion.blocks``: pre-/post-norm residual blocks (chapters 3, 6).
- ``companion.models``: Seq2SeqTransformer, GPT and the configurable Decoder with presets.
- ``companion.accounting``: parameters, FLOPs and KV-cache bytes by formula (chapters 6, 8, 10).
- ``companion.generate``: samplers and generate() with no / contiguous / paged caches (chapters 10, 12).
- ``companion.paged``: the paged KV cache: block tables, free list, prefix hashing, copy-on-write (chapter 12).
- ``companion.kvquant``: int8 / int4 KV quantisation with per-(token, head) scales (chapter 12).
- ``companion.engine``: the continuous-batching serving engine (scheduler, runner, sequences) (chapter 12).
- ``companion.data``: offline corpora (Shakespeare, verse-aligned Bibles), ``datasets`` objects, batching, synthetic tasks.
- ``companion.tokenizers``: character-level, byte-level BPE from scratch, and the same BPE via ``tokenizers``.
- ``companion.optim``: Adam, AdamW, parameter groups, gradient clipping, learning-rate schedules.
- ``companion.losses``: cross-entropy with ignore index and loss masks, label smoothing.
- ``companion.train``: one training loop for every model (accumulation, bf16, DDP, exact resume, history, MFU).
- ``companion.checkpoint``: safetensors + JSON checkpoints, written atomically, SHA-256 checked, never unpickled.
- ``companion.translate``: greedy and beam search for the encoder-decoder; corpus BLEU and chrF.
- ``companion.train_cli``: the ``train`` and ``sample`` commands of ``python -m companion``.
- ``companion.backends``: ``attend``, the one attention entry point (reference, sdpa, tiled, triton).
- ``companion.flash``: the online softmax, tiled attention and its recomputing backward (chapter 11).
- ``companion.triton_flash``: the same as Triton GPU kernels (imported lazily; needs triton and CUDA).
- ``companion.triton_paged``: paged attention as a Triton kernel reading K/V from the page pool (lazily; triton + CUDA).
- ``companion.hf``: weights to and from Hugging Face transformers (optional extra ``hf``).
- ``companion.attention_maps``: record the cross-attention weights a model used (chapter 3).
- ``companion.widgets``: the ipywidgets explorers of the chapters.
- ``companion.files``: atomic file writes and SHA-256 digests.
"""

from .profile import Profile, pick_device, profile, seed_everything

__version__ = "0.1.0"

__all__ = ["Profile", "pick_device", "profile", "seed_everything", "__version__"]
