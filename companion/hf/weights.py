"""Tensor links between a companion model and a transformers one, and the checked copy along them.

A link ties some of our tensors to some of theirs with a map each way; ``_transfer`` requires every
tensor of the source to be read and every tensor of the target to be written."""

from __future__ import annotations

import re
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from companion.models.decoder import DecoderConfig

# A link ties some of our tensors to some of theirs: (ours, theirs, ours -> theirs, theirs -> ours).
Fn = Callable[[Sequence[Tensor]], list[Tensor]]


Link = tuple[tuple[str, ...], tuple[str, ...], Fn, Fn]


def _same(ours: str, theirs: str) -> Link:
    return (ours,), (theirs,), lambda t: [t[0]], lambda t: [t[0]]


def _transposed(ours: str, theirs: str) -> Link:  # GPT-2 Conv1D (in, out) <-> nn.Linear (out, in)
    return (ours,), (theirs,), lambda t: [t[0].t()], lambda t: [t[0].t()]


def _rows(ours: str, theirs: Sequence[str], sizes: Sequence[int]) -> Link:
    """One of our tensors = their tensors stacked along dim 0 (fused qkv <-> q_proj, k_proj, v_proj)."""
    return (ours,), tuple(theirs), lambda t: list(t[0].split(list(sizes), dim=0)), lambda t: [torch.cat(list(t), dim=0)]


def _experts_link(o: str, t: str, n: int) -> list[Link]:
    """Our experts e = 0..n-1 (gate, up, down SwiGLUs) <-> the fused (E, 2 d_ff, d) and (E, d, d_ff) tensors."""
    gate_up = tuple(f"{o}experts.{e}.{w}.weight" for e in range(n) for w in ("gate", "up"))
    down = tuple(f"{o}experts.{e}.down.weight" for e in range(n))

    def fuse(ts):
        return [torch.stack([torch.cat((ts[2 * e], ts[2 * e + 1]), dim=0) for e in range(n)])]

    def unfuse(ts):
        return [part for e in range(n) for part in ts[0][e].chunk(2, dim=0)]

    return [
        (gate_up, (t + "experts.gate_up_proj",), fuse, unfuse),
        (down, (t + "experts.down_proj",), lambda ts: [torch.stack(list(ts))], lambda ts: list(ts[0].unbind(0))),
    ]


def _gpt_oss_experts_link(o: str, t: str, n: int) -> list[Link]:
    """Our clamped SwiGLUs (gate, up, down with biases) <-> gpt-oss's fused tensors, which store the
    input dimension first and interleave the gate and up columns: gate_up_proj (E, d, 2 d_ff) with
    gate = [..., 0::2], up = [..., 1::2]; gate_up_proj_bias (E, 2 d_ff) likewise; down_proj (E, d_ff, d)."""
    names = [f"{o}experts.{e}.{w}.{p}" for e in range(n) for w in ("gate", "up") for p in ("weight", "bias")]

    def fuse(ts):
        ws, bs = [], []
        for e in range(n):
            gw, gb, uw, ub = ts[4 * e: 4 * e + 4]
            ws.append(torch.stack((gw.t(), uw.t()), dim=-1).flatten(-2))  # (d, d_ff, 2) -> (d, 2 d_ff)
            bs.append(torch.stack((gb, ub), dim=-1).flatten(-2))
        return [torch.stack(ws), torch.stack(bs)]

    def unfuse(ts):
        w, b = ts
        return [x for e in range(n) for x in (w[e][:, 0::2].t(), b[e][0::2], w[e][:, 1::2].t(), b[e][1::2])]

    downs_w = tuple(f"{o}experts.{e}.down.weight" for e in range(n))
    downs_b = tuple(f"{o}experts.{e}.down.bias" for e in range(n))
    return [
        (tuple(names), (t + "experts.gate_up_proj", t + "experts.gate_up_proj_bias"), fuse, unfuse),
        (downs_w, (t + "experts.down_proj",),
         lambda ts: [torch.stack([w.t() for w in ts])], lambda ts: [w.t() for w in ts[0].unbind(0)]),
        (downs_b, (t + "experts.down_proj_bias",),
         lambda ts: [torch.stack(list(ts))], lambda ts: list(ts[0].unbind(0))),
    ]


def _llama_links(c: DecoderConfig, arch: str) -> list[Link]:
    """Every family with Llama's tensor names (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Gemma 2/3, gpt-oss)."""
    h, g, dh = c.n_heads, c.kv_heads, c.attn_head_dim
    out_bias = c.attn_bias if c.attn_out_bias is None else c.attn_out_bias
    links = [_same("embed.weight", "model.embed_tokens.weight")]
    for i in range(c.n_layers):
        o, t = f"layers.{i}.", f"model.layers.{i}."
        if c.norm_placement == "sandwich":  # Gemma: pre and post norm around each sublayer
            norms = (("attn_norm", "input_layernorm"), ("attn_post_norm", "post_attention_layernorm"),
                     ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_post_norm", "post_feedforward_layernorm"))
        else:
            norms = (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"))
        links += [_same(o + ours + ".weight", t + theirs + ".weight") for ours, theirs in norms]
        qkv = [t + f"self_attn.{x}_proj" for x in "qkv"]
        for p in ("weight", "bias") if c.attn_bias else ("weight",):
            links.append(_rows(o + f"attn.qkv.{p}", [n + f".{p}" for n in qkv], (h * dh, g * dh, g * dh)))
        for p in ("weight", "bias") if out_bias else ("weight",):
            links.append(_same(o + f"attn.out.{p}", t + f"self_attn.o_proj.{p}"))
        if c.qk_norm:
            links += [_same(o + f"attn.{x}_norm.weight", t + f"self_attn.{x}_norm.weight") for x in "qk"]
        if c.sinks:
            links.append(_same(o + "attn.sinks", t + "self_attn.sinks"))
        if c.is_moe(i) and arch == "gpt_oss":
            links += [_same(o + f"ffn.router.{p}", t + f"mlp.router.{p}") for p in ("weight", "bias")]
            links += _gpt_oss_experts_link(o + "ffn.", t + "mlp.", c.n_experts)
        elif c.is_moe(i):
            links.append(_same(o + "ffn.router.weight", t + "mlp.gate.weight"))
            links += _experts_link(o + "ffn.", t + "mlp.", c.n_experts)
        else:
            for p in ("weight", "bias") if c.ffn_bias else ("weight",):
                links += [_same(o + f"ffn.{w}.{p}", t + f"mlp.{w}_proj.{p}") for w in ("gate", "up", "down")]
    return links + [_same("final_norm.weight", "model.norm.weight"), _same("lm_head.weight", "lm_head.weight")]


# Tensors that are state, not weights: the MoE load report of the last forward, and our routing bias
# when the target has none (Mixtral; the bias is unused unless bias_balancing=True, which then raises).
_OURS_NOT_WEIGHTS = ("ffn.last_load", "ffn.balance_bias")


def _transfer(src: nn.Module, dst: nn.Module, links: list[Link], forward: bool) -> None:
    """Copy every linked tensor from src to dst; check that nothing in src is left unread and nothing in
    dst unwritten (apart from our non-weight state), and that every shape matches."""
    s_sd, d_sd = src.state_dict(), dst.state_dict()
    new, read = {}, set()
    for ours, theirs, to_theirs, to_ours in links:
        src_keys, dst_keys, fn = (ours, theirs, to_theirs) if forward else (theirs, ours, to_ours)
        missing = [k for k in src_keys if k not in s_sd]
        if missing:
            raise ValueError(f"the source model has no tensor(s) {missing}: its layout does not match its config")
        outs = fn([s_sd[k] for k in src_keys])
        for k, v in zip(dst_keys, outs, strict=True):
            if k not in d_sd or d_sd[k].shape != v.shape:
                expected = tuple(d_sd[k].shape) if k in d_sd else "absent"
                raise ValueError(f"tensor {k}: expected {expected}, converted {tuple(v.shape)}")
            new[k] = v.detach().clone().to(d_sd[k].dtype)
        read.update(src_keys)

    def is_state(k: str) -> bool:
        return k.endswith(_OURS_NOT_WEIGHTS)

    unread = [k for k in s_sd if k not in read and not (forward and is_state(k))]
    unwritten = [k for k in d_sd if k not in new and not (not forward and is_state(k))]
    if unread or unwritten:
        raise ValueError(f"weights not mapped: unread in source {unread}, unwritten in target {unwritten}")
    d_sd.update(new)
    dst.load_state_dict(d_sd, strict=True)


def _float32_names(hf_cls, dtype: torch.dtype) -> Callable[[str], bool]:
    """Which tensor names of a transformers class it keeps in float32 in a model of ``dtype``, read from
    the class: ``_keep_in_fp32_modules`` in a float16 model, ``_keep_in_fp32_modules_strict`` in a
    float16 or bfloat16 one (gpt-oss's norm gains; DeepSeek-V3's router and its correction bias). A name
    is kept when one of the listed patterns occurs in it (``*`` any text), as transformers' loader
    matches them (``PreTrainedModel._get_dtype_plan``)."""
    keep = list(getattr(hf_cls, "_keep_in_fp32_modules", None) or ()) if dtype == torch.float16 else []
    if dtype in (torch.float16, torch.bfloat16):
        keep += list(getattr(hf_cls, "_keep_in_fp32_modules_strict", None) or ())
    pattern = re.compile("|".join(f"(?:{k.replace('*', '.*')})" for k in keep)) if keep else None
    return lambda name: pattern is not None and pattern.search(name) is not None


def _ours_kept_float32(links: list[Link], kept: Callable[[str], bool]) -> list[str]:
    """Our tensors linked only to tensors the transformers class keeps in float32."""
    return [o for ours, theirs, _, _ in links if theirs and all(map(kept, theirs)) for o in ours]


def _set_dtypes(module: nn.Module, values: dict[str, Tensor]) -> None:
    """Replace the named parameters' / buffers' data with ``values`` (their dtype included)."""
    for name, value in values.items():
        owner, _, leaf = name.rpartition(".")
        getattr(module.get_submodule(owner), leaf).data = value
