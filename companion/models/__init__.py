"""The book's models: the 2017 encoder-decoder, GPT-1/2, and the configurable modern decoder."""

from torch import nn

from companion.models.decoder import PRESETS, Decoder, DecoderConfig, from_preset, preset_config
from companion.models.gpt import GPT, GPT_PRESETS, GPTConfig, gpt_from_preset
from companion.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer, seq2seq_from_preset

__all__ = [
    "Decoder", "DecoderConfig", "PRESETS", "from_preset", "preset_config",
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
