"""The book's models: the 2017 encoder-decoder, GPT-1/2, and the configurable modern decoder."""

from .decoder import PRESETS, Decoder, DecoderConfig, from_preset, preset_config
from .gpt import GPT, GPT_PRESETS, GPTConfig, gpt_from_preset
from .seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer, seq2seq_from_preset

__all__ = [
    "Decoder", "DecoderConfig", "PRESETS", "from_preset", "preset_config",
    "GPT", "GPTConfig", "GPT_PRESETS", "gpt_from_preset",
    "Seq2SeqTransformer", "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "seq2seq_from_preset",
]
