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
"""

from .profile import Profile, pick_device, profile, seed_everything

__version__ = "0.1.0"

__all__ = ["Profile", "pick_device", "profile", "seed_everything", "__version__"]
