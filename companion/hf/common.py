"""What every part of companion.hf shares: the transformers classes per family, the lazy import of
transformers, and the one way a conversion refuses (``_require``)."""

from __future__ import annotations

import warnings

import torch

DECODER_ARCHS = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3",
)


_HF_CLASSES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


_GEMMA = ("gemma2", "gemma3_text")


_QWEN3 = ("qwen3", "qwen3_moe")


# Classes that read a sliding/full list per layer (layer_types). Qwen3-MoE has the field in neither its config
# nor its attention (transformers 5.24 modeling_qwen3_moe: one sliding_window for every layer), like Mistral.
_LAYER_TYPED = ("qwen2", "qwen3", "gemma2", "gemma3_text", "gpt_oss")


_LAYER_TYPES = ("sliding_attention", "full_attention")


# Classes whose attention reads sliding_window (LlamaForCausalLM and DeepSeek-V3 never do: a
# sliding_window key on their configs changes nothing in transformers, and nothing here).
_WINDOWED = ("mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gpt_oss")


# Classes whose attention reads attention_bias (Mistral and Mixtral build q, k, v and o without biases
# whatever the key says; Qwen2 has q, k, v biases always).
_ATTENTION_BIASED = ("llama", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "gpt_oss")


_MOE_ARCHS = ("mixtral", "qwen3_moe", "gpt_oss")


_FAMILY = {
    "llama": "Llama", "mistral": "Mistral", "mixtral": "Mixtral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3", "gpt_oss": "gpt-oss",
    "deepseek_v3": "DeepSeek-V3",
}


_GEGLU_ACT = "gelu_pytorch_tanh"  # Gemma's gate: the tanh GELU

# transformers' names (ACT2FN) for the functions the companion computes: SiLU (SwiGLU's gate) is also
# "swish"; the tanh GELU (GeGLU's gate, GPT-2's MLP) is also "gelu_new", "gelu_fast" and "gelu_accurate", the same
# formula 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) written in other operations.
_SILU_ACTS = ("silu", "swish")
_TANH_GELU_ACTS = (_GEGLU_ACT, "gelu_new", "gelu_fast", "gelu_accurate")


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("companion.hf needs transformers: pip install 'companion[hf]'") from e
    return transformers


def _hf_class(arch: str, which: int):
    tf = _transformers()
    name = _HF_CLASSES[arch][which]
    if not hasattr(tf, name):
        raise ValueError(f"the installed transformers {tf.__version__} has no {name}; arch={arch!r} is unavailable")
    return getattr(tf, name)


def _require(problems: list[str], missing_in: str = "transformers") -> None:
    """Raise one ValueError listing every feature ``missing_in`` ("transformers": the target class,
    converting to HF; "companion": converting from HF) cannot express."""
    if problems:
        raise ValueError(f"{missing_in} has no equivalent for: " + "; ".join(problems))


def _special_ids(vocab_size: int, bos: int | None, eos: int | None) -> dict:
    """HF configs carry bos/eos ids; keep the usual ones when they fit the (toy) vocabulary."""
    return dict(
        bos_token_id=bos if bos is not None and bos < vocab_size else None,
        eos_token_id=eos if eos is not None and eos < vocab_size else None,
    )


def _tied_from_tensors(flag: bool, embedding: torch.Tensor, head: torch.Tensor, where: str) -> bool:
    """Whether the input embedding and the output matrix are one matrix: the same storage. Equal values
    in two tensors are not one matrix (an untied model whose head starts as a copy of its embedding
    stays untied, as transformers keeps it by its flag: one training step apart, they differ). A model
    whose config says tied but whose output matrix was replaced after loading (fine-tuning code unties
    them so) converts untied, with a warning: building it tied from the flag would keep one of the two
    matrices and drop the other."""
    same = embedding.shape == head.shape and embedding.data_ptr() == head.data_ptr() \
        and embedding.device == head.device
    if flag and not same:
        warnings.warn(f"{where}: the config ties the embeddings (tie_word_embeddings=True), but the output matrix "
                      "is not the input embedding's tensor; converting with untied embeddings, as the tensors are",
                      stacklevel=3)
    return same


def _one_dtype(module, dtype: torch.dtype | None, what: str, may_keep=lambda name: False) -> torch.dtype:
    """``dtype`` when given, else the one floating dtype of ``module``'s parameters (a conversion keeps the
    source's precision), leaving out float32 ones that the transformers class may keep in float32 in a
    lower-precision model (``may_keep(name)``: its keep-in-float32 lists, ``weights._float32_names``);
    other mixtures refuse to guess."""
    if dtype is not None:
        return dtype
    found = {p.dtype for n, p in module.named_parameters()
             if p.is_floating_point() and not (p.dtype == torch.float32 and may_keep(n))}
    if len(found) != 1:
        raise ValueError(f"{what} holds parameters of dtypes {sorted(map(str, found))}: pass dtype= to choose the "
                         "converted model's")
    return found.pop()
