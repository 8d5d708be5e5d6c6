"""The book's models: the 2017 encoder-decoder, GPT-1/2, and the configurable modern decoder.

Build any of them by preset name with ``from_preset(name, **overrides)`` ("llama-like", "gpt2-tiny",
"tiny", ...; ``companion.models.common``). The configs share one vocabulary for what they have in
common, so callers need no ``hasattr`` branches: ``d_model``, ``n_heads`` and ``context_length`` on all
three, ``n_layers`` on GPT and Decoder (GPT's own field names, n_embd, n_head, block_size, n_layer,
stay: they are GPT-2's).
"""

from torch import nn

from companion.models.common import FAMILIES, from_preset, preset_config, preset_family
from companion.models.decoder import PRESETS, Decoder, DecoderConfig
from companion.models.gpt import GPT, GPT_PRESETS, GPTConfig, gpt_from_preset
from companion.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer, seq2seq_from_preset

__all__ = [
    "from_preset", "preset_config", "preset_family", "FAMILIES",
    "Decoder", "DecoderConfig", "PRESETS",
    "GPT", "GPTConfig", "GPT_PRESETS", "gpt_from_preset",
    "Seq2SeqTransformer", "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "seq2seq_from_preset", "unwrap",
]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner
