"""Formulas in companion.accounting == measured counts and bytes."""

import pytest
import torch

from companion.accounting import decoder_parameters, gpt_parameters, kv_cache_bytes, mla_cache_bytes, seq2seq_parameters
from companion.models import PRESETS, from_preset, preset_config


@pytest.mark.parametrize("name", list(PRESETS))
def test_decoder_parameter_formula(name):
    model = from_preset(name)
    assert decoder_parameters(model.config) == model.num_parameters()
    assert decoder_parameters(model.config, active=True) == model.num_parameters(active=True)


def test_variant_and_other_model_formulas():
    cfg = preset_config("llama-like", norm="layer", position="learned", ffn="gelu", attn_bias=True, ffn_bias=True, tie_embeddings=True, sinks=True)
    assert decoder_parameters(cfg) == from_preset("llama-like", norm="layer", position="learned", ffn="gelu", attn_bias=True, ffn_bias=True, tie_embeddings=True, sinks=True).num_parameters()
    for variant in ("gpt1", "gpt2"):
        m = from_preset("gpt2-tiny", variant=variant)
        assert gpt_parameters(m.config) == m.num_parameters()
    t = from_preset("tiny")
    assert seq2seq_parameters(t.config) == t.num_parameters()
    u = from_preset("tiny", share_embeddings=False)
    assert seq2seq_parameters(u.config) == u.num_parameters()


def test_seed_kv_table():
    L, T, h, dh = 32, 8192, 32, 128
    assert kv_cache_bytes(L, h, dh, T) == 4 * 2**30  # MHA (g = h = 32): 4 GiB
    assert kv_cache_bytes(L, 8, dh, T) == 2**30  # GQA g=8: 1 GiB
    assert kv_cache_bytes(L, 1, dh, T) == 128 * 2**20  # MQA: 128 MiB


@pytest.mark.parametrize("name", ["llama-like", "mistral-like", "deepseek-like"])
def test_cache_bytes_formula_matches_measured(name):
    model = from_preset(name).eval()
    c = model.config
    cache = model.new_cache()
    T = 12 if c.window is None else c.window - 1  # a windowed layer stores w-1 rows between steps
    model(torch.randint(0, 256, (1, T)), cache)
    if c.attention == "mla":
        expected = mla_cache_bytes(c.n_layers, c.kv_rank, c.rope_dim, T, bytes_per_value=4)
    else:
        expected = kv_cache_bytes(c.n_layers, c.kv_heads, c.attn_head_dim, T, bytes_per_value=4)
    assert cache.nbytes() == expected


# decode_step_bytes: the bytes one decode step reads ------------------------------------------------

from companion.accounting import decode_step_bytes, kv_bytes_per_token  # noqa: E402
from companion.inference.paged import PagedKVCache  # noqa: E402


def test_decode_step_bytes_hand_count():
    """llama-like: d=64, 2 layers, h=4, g=2, d_h=16, V=256, SwiGLU 192, untied, float32."""
    c = preset_config("llama-like")
    layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 2 * 64 + 3 * 64 * 192  # q,k,v + out; 2 RMS norms; SwiGLU
    weights = 2 * 64 + 256 * 64 + 64 + 2 * layer  # 2 looked-up rows; output head; final norm; layers
    kv = 2 * (2 * 2 * 16 * 4) * (5 + 7)  # layers x (K+V, g heads, d_h, 4 bytes) x tokens attended
    assert decode_step_bytes(c, [5, 7], param_bytes=4) == {"weights": 4 * weights, "kv": kv, "total": 4 * weights + kv}
    # bf16 weights, int8 pages: 16 + 4 bytes per (token, head) group
    assert decode_step_bytes(c, [5, 7], param_bytes=2, kv_bits=8)["kv"] == 2 * 2 * 2 * (16 + 4) * 12
    assert decode_step_bytes(c, [5, 7], param_bytes=2, kv_bits=4)["kv"] == 2 * 2 * 2 * (8 + 4) * 12


def _nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_weight_bytes_match_tensors(name, dtype):
    """Weights = every parameter tensor's bytes (tied matrices once), less the input table but for the
    B rows looked up; MoE: all experts when moe_experts = N, only top_k + shared + router otherwise."""
    model = from_preset(name).to(dtype)
    c, B, size = model.config, 3, torch.finfo(dtype).bits // 8
    total = _nbytes(model.parameters())
    expected = total if c.tie_embeddings else total - _nbytes([model.embed.weight]) + B * c.d_model * size
    kw = {"moe_experts": c.n_experts} if c.n_experts else {}
    assert decode_step_bytes(c, [4] * B, param_bytes=size, **kw)["weights"] == expected
    if c.n_experts:
        unused = sum(_nbytes(layer.ffn.experts[j].parameters()) for layer in model.layers if hasattr(layer.ffn, "experts")
                     for j in range(c.top_k, c.n_experts))
        assert decode_step_bytes(c, [4], param_bytes=size)["weights"] == expected - unused - (0 if c.tie_embeddings else 2 * c.d_model * size)


def test_decode_step_bytes_gpt():
    model = from_preset("gpt2-tiny")
    c = model.config
    expected = _nbytes(model.parameters()) - _nbytes([model.wpe.weight]) + 2 * c.n_embd * 4
    r = decode_step_bytes(c, [3, 9], param_bytes=4)
    assert r["weights"] == expected and r["kv"] == c.n_layer * 2 * c.n_embd * 4 * 12


@pytest.mark.parametrize("name", ["llama-like", "deepseek-like", "gemma3-like"])
@pytest.mark.parametrize("bits", [None, 8, 4])
def test_kv_bytes_per_token_match_allocated_pages(name, bits):
    """Bytes per token from the formula == what companion.inference.paged allocates (data + scales) per slot."""
    model = from_preset(name)
    kv = PagedKVCache(model, n_pages=5, page_size=4, bits=bits)
    assert sum(kv_bytes_per_token(model.config, 4, bits)) * 5 * 4 == kv.pool.nbytes()["total"]
    if bits is None and name != "gemma3-like":  # global layers: a step reads every cached token
        assert decode_step_bytes(model.config, [6, 2], param_bytes=4)["kv"] == 8 * kv.pool.nbytes()["total"] // 20


@pytest.mark.parametrize("T", [3, 15, 16, 40])
def test_decode_step_kv_bytes_windowed_match_contiguous_cache(T):
    """mistral-like (every layer a window of 16): after T tokens the contiguous cache holds min(T, w-1)
    rows per layer; the next step reads those plus its own new row."""
    model = from_preset("mistral-like").eval()
    c = model.config
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 256, (1, T)), cache)
    assert decode_step_bytes(c, [T + 1], param_bytes=4)["kv"] == cache.nbytes() + sum(kv_bytes_per_token(c, 4))


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(context_lengths=[]), "context_lengths"), (dict(context_lengths=[0]), "context_lengths"),
        (dict(context_lengths=[257]), "context_lengths"), (dict(context_lengths="ab"), "context_lengths"),
        (dict(context_lengths=[2.5]), "context_lengths"), (dict(context_lengths=7), "context_lengths"),
        (dict(param_bytes=0), "param_bytes"), (dict(param_bytes=float("nan")), "param_bytes"),
        (dict(param_bytes=-2), "param_bytes"), (dict(kv_bytes=0), "kv_bytes"), (dict(kv_bits=3), "kv_bits"),
        (dict(moe_experts=2), "moe_experts"), (dict(param_bytes=0.5), "kv_bytes"),
    ],
)
def test_decode_step_bytes_bad_input(kwargs, arg):
    c = preset_config("llama-like")  # max_seq_len 256, dense
    kwargs = {"context_lengths": [4], **kwargs}
    with pytest.raises(ValueError, match=arg):
        decode_step_bytes(c, **kwargs)


def test_decode_step_bytes_bad_moe_and_config():
    c = preset_config("mixtral-like")
    for bad in (0, 9, True):
        with pytest.raises(ValueError, match="moe_experts"):
            decode_step_bytes(c, [4], moe_experts=bad)
    with pytest.raises(ValueError, match="c must be"):
        decode_step_bytes(object(), [4])
    with pytest.raises(ValueError, match="bits"):
        kv_bytes_per_token(c, 2, bits=2)
    assert decode_step_bytes(c, [4], param_bytes=0.5, kv_bytes=2)["weights"] * 4 == decode_step_bytes(c, [4], param_bytes=2)["weights"]


def test_one_table_of_gpu_peaks_serves_flops_and_bandwidth():
    import importlib.util
    from pathlib import Path

    from companion.accounting import GPU_PEAKS, gpu_peak, peak_bandwidth

    assert gpu_peak("NVIDIA H200", "bf16_tflops") == 989.0 and gpu_peak("NVIDIA H200", "tbs") == 4.8
    assert gpu_peak("NVIDIA GH200 480GB", "tbs") == 4.0  # the more specific row first
    # a row with only one number lets the other fall through to the next matching row
    assert gpu_peak("NVIDIA A100 80GB PCIe", "tbs") == 1.935 and gpu_peak("NVIDIA A100 80GB PCIe", "bf16_tflops") == 312.0
    assert gpu_peak("Tesla T4", "bf16_tflops") is None and gpu_peak("Some Other GPU", "tbs") is None
    for row in GPU_PEAKS:  # every row is reachable: no earlier row shadows it for the numbers it gives
        for field in ("bf16_tflops", "tbs"):
            if getattr(row, field) is not None:
                assert gpu_peak(f"NVIDIA {row.name}", field) == getattr(row, field), (row, field)
    with pytest.raises(ValueError, match="field must be one of"):
        gpu_peak("NVIDIA H200", "tflops")
    # the serving benchmark reads the same table, not a copy of its own
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serving_gpu.py"
    spec = importlib.util.spec_from_file_location("serving_gpu_for_test", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.peak_bandwidth is peak_bandwidth and not hasattr(module, "PEAK_TBS")


# The totals the model cards state (rounded as stated), and which embedding matrices each card's "active"
# count includes: cards differ, and the test says which convention each one uses.
# - Llama 3 8B / 70B: meta-llama/Meta-Llama-3-8B and -70B model cards ("8B", "70B"); the exact counts
#   8,030,261,248 and 70,553,706,496 are those the Hugging Face Hub shows for the safetensors.
# - Qwen3-8B card: "Number of Parameters: 8.2B; Number of Parameters (Non-Embedding): 6.95B".
# - Qwen3-30B-A3B card: "30.5B in total and 3.3B activated; Non-Embedding: 29.9B" (active counts
#   both embedding matrices).
# - Gemma 3 27B (google/gemma-3-27b-it card and technical report): "27B"; the report's table 1 gives
#   25,600M non-embedding parameters for the language model (its 0.4B vision encoder is not modelled).
# - gpt-oss model card (OpenAI, 2025), table 1: 120b 116.83B total, 5.13B active; 20b 20.91B total,
#   3.61B active (active counts the unembedding, not the input embedding).
# - DeepSeek-V3 technical report: "671B total parameters with 37B activated for each token" (the
#   14B multi-token-prediction module is extra); its active count excludes the input embedding.
CARDS = {
    # name: (total, active, one unit of the card's last digit (0: exact), active counts the input embedding)
    "llama3-8b": (8_030_261_248, 8_030_261_248, 0, True),
    "llama3-70b": (70_553_706_496, 70_553_706_496, 0, True),
    "qwen3-8b": (8.2e9, 8.2e9, 1e8, True),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 1e8, True),
    "gemma3-27b": (27e9, 27e9, 1e9, True),
    "gpt-oss-20b": (20.91e9, 3.61e9, 1e7, False),
    "gpt-oss-120b": (116.83e9, 5.13e9, 1e7, False),
    "deepseek-v3": (671e9, 37e9, 1e9, False),
}


@pytest.mark.parametrize("name", list(CARDS))
def test_published_parameter_counts_match_model_cards(name):
    from companion.accounting import published_config

    c = published_config(name)
    total, active, unit, with_input_embedding = CARDS[name]
    ours = decoder_parameters(c)
    ours_active = decoder_parameters(c, active=True) - (0 if with_input_embedding else c.vocab_size * c.d_model)

    # within one unit of the card's last digit (cards round, and Qwen's "3.3B" truncates 3.35B)
    assert abs(ours - total) <= unit, f"{ours:,}"
    assert abs(ours_active - active) <= unit, f"{ours_active:,}"


def test_published_non_embedding_counts():
    from companion.accounting import published_config

    def non_embedding(name):
        c = published_config(name)
        return decoder_parameters(c) - c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)

    assert abs(non_embedding("qwen3-8b") - 6.95e9) <= 1e7  # Qwen3-8B card
    assert abs(non_embedding("qwen3-30b-a3b") - 29.9e9) <= 1e8  # Qwen3-30B-A3B card
    assert abs(non_embedding("gemma3-27b") - 25_600e6) <= 1e6  # Gemma 3 report, table 1


# KV cache per token, bf16 (2 bytes), from the configs: 2 L g d_h b for GQA, L (d_c + d_R) b for MLA.
# Cards do not state these; the values are the formulas of chapter 8 on the published shapes
# (DeepSeek-V2 paper, table 1: MLA caches (d_c + d_R) l elements per token; d_c = 512, d_R = 64 in V3).
KV_BYTES = {
    "llama3-8b": 2 * 32 * 8 * 128 * 2,  # 128 KiB
    "llama3-70b": 2 * 80 * 8 * 128 * 2,  # 320 KiB
    "qwen3-8b": 2 * 36 * 8 * 128 * 2,
    "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2,
    "gemma3-27b": 2 * 62 * 16 * 128 * 2,  # every layer; the 52 local layers keep at most 1024 tokens
    "gpt-oss-20b": 2 * 24 * 8 * 64 * 2,  # every layer; half of them keep at most 128 tokens
    "gpt-oss-120b": 2 * 36 * 8 * 64 * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,  # 70,272 bytes: MLA
}


@pytest.mark.parametrize("name", list(KV_BYTES))
def test_published_kv_bytes_per_token(name):
    from companion.accounting import published_config

    c = published_config(name)
    assert sum(kv_bytes_per_token(c, 2)) == KV_BYTES[name]
    if c.window is not None:  # at a long context the windowed layers stop growing
        long = decode_step_bytes(c, [32768], param_bytes=2)["kv"]
        n_global = sum(w is None for w in c.layer_windows())
        per_layer = KV_BYTES[name] // c.n_layers
        assert long == per_layer * (n_global * 32768 + (c.n_layers - n_global) * c.window)
