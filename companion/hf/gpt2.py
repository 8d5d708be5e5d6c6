"""GPT-2 (GPT2LMHeadModel) <-> the companion GPT: config and tensor links."""

from __future__ import annotations

from companion.hf.common import _TANH_GELU_ACTS, _hf_class, _require
from companion.hf.weights import Link, _same, _transposed
from companion.models.gpt import GPTConfig



def _gpt_to_hf_config(c: GPTConfig, tied: bool = True):
    """GPT2Config of ``c``; ``tied=False`` when the GPT's lm_head was replaced by a matrix of its own."""
    _require(
        [f"variant={c.variant!r}: GPT2LMHeadModel is the pre-LN GPT-2 (variant='gpt2'); "
         "GPT-1 is post-LN with exact GELU"]
        if c.variant != "gpt2" else []
    )
    last = c.vocab_size - 1  # GPT-2's <|endoftext|> is the last id of its vocabulary
    return _hf_class("gpt2", 0)(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        n_inner=4 * c.n_embd, activation_function="gelu_new", resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, layer_norm_epsilon=c.layer_norm_eps, scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False, add_cross_attention=False,
        tie_word_embeddings=tied, bos_token_id=last, eos_token_id=last,
    )


def _gpt_from_hf_config(h, backend: str, tied: bool | None = None) -> GPTConfig:
    """``tied``: whether lm_head and wte are one matrix, from the tensors (default: the config's flag)."""
    problems = []
    if h.activation_function not in _TANH_GELU_ACTS:
        problems.append(f"activation_function={h.activation_function!r} (GPT-2 uses the tanh GELU, 'gelu_new')")
    if h.n_inner not in (None, 4 * h.n_embd):
        problems.append(f"n_inner={h.n_inner} (the companion GPT's MLP is 4 * n_embd = {4 * h.n_embd} wide)")
    if not h.scale_attn_weights or h.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_weights must be True and scale_attn_by_inverse_layer_idx False "
                        "(scores / sqrt(d_h))")
    if getattr(h, "add_cross_attention", False):
        problems.append("add_cross_attention=True (the companion GPT is decoder-only)")
    if not (h.tie_word_embeddings if tied is None else tied):
        problems.append(f"tie_word_embeddings={h.tie_word_embeddings} with an lm_head.weight that is not "
                        "transformer.wte.weight (the companion GPT always ties lm_head to wte)")
    drops = {h.resid_pdrop, h.embd_pdrop, h.attn_pdrop}
    if len(drops) != 1:
        problems.append(f"resid_pdrop, embd_pdrop, attn_pdrop = {h.resid_pdrop}, {h.embd_pdrop}, {h.attn_pdrop} "
                        "(one dropout rate here)")
    _require(problems, "companion")
    return GPTConfig(
        vocab_size=h.vocab_size, block_size=h.n_positions, n_layer=h.n_layer, n_head=h.n_head, n_embd=h.n_embd,
        variant="gpt2", dropout=float(h.resid_pdrop), layer_norm_eps=h.layer_norm_epsilon, backend=backend,
        name="from-hf",
    )


def _gpt_links(c: GPTConfig) -> list[Link]:
    links = [_same("wte.weight", "transformer.wte.weight"), _same("wpe.weight", "transformer.wpe.weight")]
    for i in range(c.n_layer):
        o, t = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            links += [_same(o + ours + ".weight", t + theirs + ".weight"),
                      _same(o + ours + ".bias", t + theirs + ".bias")]
        linears = (("attn.qkv", "attn.c_attn"), ("attn.out", "attn.c_proj"), ("ffn.up", "mlp.c_fc"),
                   ("ffn.down", "mlp.c_proj"))
        for ours, theirs in linears:
            links += [_transposed(o + ours + ".weight", t + theirs + ".weight"),
                      _same(o + ours + ".bias", t + theirs + ".bias")]
    links += [_same("ln_f.weight", "transformer.ln_f.weight"), _same("ln_f.bias", "transformer.ln_f.bias")]
    return links + [_same("lm_head.weight", "lm_head.weight")]
