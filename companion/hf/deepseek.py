"""DeepSeek-V3 (DeepseekV3ForCausalLM): MLA and V3 routing, config both ways and tensor links."""

from __future__ import annotations

import torch
from torch import Tensor

from companion.hf.common import _hf_class, _require, _special_ids
from companion.hf.weights import Link, _experts_link, _same
from companion.models.decoder import DecoderConfig

# transformers' DeepseekV3Attention builds q_a_layernorm and kv_a_layernorm with the RMSNorm default
# eps, 1e-6, not config.rms_norm_eps (so does DeepSeek's own modelling code).
_DEEPSEEK_LATENT_EPS = 1e-6


def _deepseek_to_hf_config(c: DecoderConfig, p: list[str], common: dict):
    if c.attention != "mla":
        p.append(f"attention={c.attention!r} with arch='deepseek_v3' (DeepSeek-V3 uses MLA: attention='mla')")
    if c.attn_bias:
        p.append("attn_bias=True with arch='deepseek_v3' (MLA here has no biases)")
    if c.ffn_bias:
        p.append("ffn_bias=True with arch='deepseek_v3'")
    if c.mla_norm_eps != _DEEPSEEK_LATENT_EPS:
        p.append(f"mla_norm_eps={c.mla_norm_eps} (DeepseekV3's q_a_layernorm / kv_a_layernorm use eps "
                 f"{_DEEPSEEK_LATENT_EPS:g} always)")
    flags = [c.is_moe(i) for i in range(c.n_layers)]
    moe = any(flags)
    first = flags.index(True) if moe else c.n_layers
    if moe and not all(flags[first:]):
        p.append(f"moe_layers={c.moe_layers} (DeepSeek-V3's dense layers are the first first_k_dense_replace)")
    if moe:
        if c.router != "sigmoid":
            p.append(f"router={c.router!r} (DeepSeek-V3 routes with sigmoid scores: router='sigmoid')")
    _require(p)
    d_moe = c.moe_d_ff or c.ffn_hidden
    return _hf_class("deepseek_v3", 0)(
        **common, intermediate_size=c.ffn_hidden, moe_intermediate_size=d_moe, num_key_value_heads=c.n_heads,
        n_shared_experts=c.n_shared_experts if moe else 1, n_routed_experts=c.n_experts if moe else 1,
        num_experts_per_tok=c.top_k if moe else 1, first_k_dense_replace=first,
        routed_scaling_factor=float(c.routed_scaling_factor) if moe else 1.0, n_group=c.expert_groups if moe else 1,
        topk_group=(c.topk_groups or c.expert_groups) if moe else 1, norm_topk_prob=c.norm_topk_prob if moe else True,
        kv_lora_rank=c.kv_rank, q_lora_rank=c.q_rank, qk_rope_head_dim=c.rope_dim, qk_nope_head_dim=c.mla_head_dim,
        v_head_dim=c.v_head_dim or c.mla_head_dim, rope_interleave=True, attention_bias=False,
        **_special_ids(c.vocab_size, 0, 1),
    )


def _deepseek_from_hf_config(h, p: list[str], common: dict) -> DecoderConfig:
    if h.attention_bias:
        p.append("attention_bias=True (MLA here has no biases)")
    moe = h.first_k_dense_replace < h.num_hidden_layers
    if moe:
        groups = h.n_group or 1
        if h.n_routed_experts % groups or (groups > 1 and h.n_routed_experts // groups < 2):
            p.append(f"n_group={h.n_group} with n_routed_experts={h.n_routed_experts} (groups of >= 2 experts each)")
        elif h.num_experts_per_tok > (h.topk_group or groups) * (h.n_routed_experts // groups):
            p.append(f"num_experts_per_tok={h.num_experts_per_tok} with topk_group={h.topk_group} of n_group={h.n_group} "
                     "(more experts than the chosen groups hold: DeepseekV3TopkRouter would pick masked ones)")
    _require(p, "companion")
    routing = dict(
        expert_groups=(h.n_group or 1) if moe else 1, topk_groups=(h.topk_group or h.n_group or 1) if moe else None,
        norm_topk_prob=bool(h.norm_topk_prob) if moe else True,
        routed_scaling_factor=float(h.routed_scaling_factor) if moe else 1.0,
    )
    return DecoderConfig(
        **common, attention="mla", kv_rank=h.kv_lora_rank, q_rank=h.q_lora_rank, mla_head_dim=h.qk_nope_head_dim,
        rope_dim=h.qk_rope_head_dim, v_head_dim=h.v_head_dim, d_ff=h.intermediate_size,
        n_experts=h.n_routed_experts if moe else 0, top_k=h.num_experts_per_tok if moe else 2,
        n_shared_experts=h.n_shared_experts if moe else 0, moe_d_ff=h.moe_intermediate_size,
        first_dense_layers=h.first_k_dense_replace if moe else 0, router="sigmoid", bias_balancing=moe,
        mla_norm_eps=_DEEPSEEK_LATENT_EPS, **routing,
    )


def _deinterleave(n: int) -> Tensor:
    """Index map taking DeepSeek's interleaved RoPE channels (pairs 2i, 2i+1) to our halves (i, i + n/2)."""
    return torch.cat((torch.arange(0, n, 2), torch.arange(1, n, 2)))


def _shared_experts_links(f: str, tm: str, c: DecoderConfig) -> list[Link]:
    """Our n shared SwiGLUs <-> DeepSeek-V3's one SwiGLU of n times the width (the sum of n SwiGLUs is
    the wider one with the hidden units concatenated). n = 0: transformers still builds the module, of
    width 0 (it adds zero); we have none, and its three empty matrices link to nothing."""
    n, d = c.n_shared_experts, c.d_model
    links = []
    for w, dim in (("gate", 0), ("up", 0), ("down", 1)):
        ours = tuple(f"{f}shared.{s}.{w}.weight" for s in range(n))
        empty = (0, d) if dim == 0 else (d, 0)
        to_theirs = ((lambda ts, dim=dim: [torch.cat(list(ts), dim=dim)]) if n
                     else (lambda ts, empty=empty: [torch.zeros(empty)]))
        links.append((ours, (f"{tm}shared_experts.{w}_proj.weight",), to_theirs,
                      lambda ts, dim=dim, n=n: list(ts[0].chunk(n, dim=dim)) if n else []))
    return links


def _deepseek_links(c: DecoderConfig, interleaved: bool) -> list[Link]:
    h, dn, dr, dc = c.n_heads, c.mla_head_dim, c.rope_dim, c.kv_rank
    dv = c.v_head_dim or dn
    perm = _deinterleave(dr) if interleaved else torch.arange(dr)
    inv = torch.argsort(perm)

    def q_to_theirs(ts):  # per head [nope | rope]: permute the rope rows into their channel order
        w = ts[0].view(h, dn + dr, -1)
        return [torch.cat((w[:, :dn], w[:, dn:][:, inv]), dim=1).reshape(h * (dn + dr), -1)]

    def q_to_ours(ts):
        w = ts[0].view(h, dn + dr, -1)
        return [torch.cat((w[:, :dn], w[:, dn:][:, perm]), dim=1).reshape(h * (dn + dr), -1)]

    def kv_a_to_theirs(ts):  # [latent c | rope key]
        return [torch.cat((ts[0][:dc], ts[0][dc:][inv]), dim=0)]

    def kv_a_to_ours(ts):
        return [torch.cat((ts[0][:dc], ts[0][dc:][perm]), dim=0)]

    def kv_b_to_theirs(ts):  # k_up (h dn, dc), v_up (h dv, dc) -> (h (dn + dv), dc), per head [k | v]
        return [torch.cat((ts[0].view(h, dn, dc), ts[1].view(h, dv, dc)), dim=1).reshape(h * (dn + dv), dc)]

    def kv_b_to_ours(ts):
        k, v = ts[0].view(h, dn + dv, dc).split([dn, dv], dim=1)
        return [k.reshape(h * dn, dc), v.reshape(h * dv, dc)]

    links = [_same("embed.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layers):
        o, t = f"layers.{i}.", f"model.layers.{i}."
        a, ta = o + "attn.", t + "self_attn."
        links += [_same(o + "attn_norm.weight", t + "input_layernorm.weight"),
                  _same(o + "ffn_norm.weight", t + "post_attention_layernorm.weight")]
        if c.q_rank is None:
            links.append(((a + "q_proj.weight",), (ta + "q_proj.weight",), q_to_theirs, q_to_ours))
        else:
            links += [_same(a + "q_down.weight", ta + "q_a_proj.weight"),
                      _same(a + "q_norm.weight", ta + "q_a_layernorm.weight")]
            links.append(((a + "q_up.weight",), (ta + "q_b_proj.weight",), q_to_theirs, q_to_ours))
        links += [
            ((a + "kv_down.weight",), (ta + "kv_a_proj_with_mqa.weight",), kv_a_to_theirs, kv_a_to_ours),
            _same(a + "kv_norm.weight", ta + "kv_a_layernorm.weight"),
            ((a + "k_up.weight", a + "v_up.weight"), (ta + "kv_b_proj.weight",), kv_b_to_theirs, kv_b_to_ours),
            _same(a + "out.weight", ta + "o_proj.weight"),
        ]
        if c.is_moe(i):
            f, tm = o + "ffn.", t + "mlp."
            links += [_same(f + "router.weight", tm + "gate.weight"),
                      _same(f + "balance_bias", tm + "gate.e_score_correction_bias")]
            links += _experts_link(f, tm, c.n_experts)
            links += _shared_experts_links(f, tm, c)
        else:
            links += [_same(o + f"ffn.{w}.weight", t + f"mlp.{w}_proj.weight") for w in ("gate", "up", "down")]
    return links + [_same("final_norm.weight", "model.norm.weight"), _same("lm_head.weight", "lm_head.weight")]
