"""RoPE settings <-> transformers ``rope_parameters`` (one dict, or one per layer type for Gemma 3)."""

from __future__ import annotations

import torch

from companion.hf.common import _FAMILY
from companion.models.decoder import DecoderConfig

def _rope_dict(c: DecoderConfig, scaling: str | None, theta: float, problems: list[str]) -> dict:
    """One transformers ``rope_parameters`` dict for a RoPE of base theta scaled by ``scaling``."""
    rope = {"rope_type": "default", "rope_theta": float(theta)}
    if scaling is not None and (c.rope_mscale or c.rope_mscale_all_dim):
        # DeepSeek's temperature (yarn) and its MLA softmax correction m(mscale_all_dim)^2, which
        # DeepseekV3Attention applies for every rope_type other than "default" (yarn_apply_mscale)
        rope.update(mscale=float(c.rope_mscale), mscale_all_dim=float(c.rope_mscale_all_dim))
    if scaling == "pi":
        rope.update(rope_type="linear", factor=float(c.rope_factor))
    elif scaling == "llama3":
        rope.update(
            rope_type="llama3", factor=float(c.rope_factor), low_freq_factor=float(c.rope_low_freq_factor),
            high_freq_factor=float(c.rope_high_freq_factor), original_max_position_embeddings=c.rope_original_max_len,
        )
    elif scaling == "yarn_hf":
        rope.update(
            rope_type="yarn", factor=float(c.rope_factor), beta_fast=float(c.rope_beta_fast),
            beta_slow=float(c.rope_beta_slow), truncate=bool(c.rope_truncate),
            original_max_position_embeddings=c.rope_original_max_len,
        )
        if c.rope_attention_factor is not None:
            rope["attention_factor"] = float(c.rope_attention_factor)
    elif scaling is not None:
        problems.append(
            f"rope_scaling={scaling!r} (transformers computes 'linear' = 'pi', 'llama3' and 'yarn' = 'yarn_hf'; "
            "the book's 'yarn' ramps over turns instead of channel indices and 'ntk' is a fixed base change, "
            "neither a rope_type)"
        )
    return rope


def _rope_parameters(c: DecoderConfig, arch: str, problems: list[str]) -> dict:
    """rope_parameters for the target: one dict, or (Gemma 3) one per layer type."""
    def kind(i):
        glob = c.is_global(i)
        base = c.rope_base_global if (c.rope_base_global is not None and glob) else c.rope_base
        return base, c.rope_scaling if (c.rope_scaling_layers == "all" or glob) else None

    kinds = {kind(i) for i in range(c.n_layers)}
    if arch == "gemma3_text":
        if not c.rope_truncate and any(kind(i)[1] == "yarn_hf" for i in range(c.n_layers)):
            problems.append("rope_truncate=False (Gemma 3 reads YaRN's truncate from the top of rope_parameters, "
                            "a dict per layer type, so a nested truncate=False is never applied)")
        local = kind(next((i for i in range(c.n_layers) if not c.is_global(i)), 0))
        glob = kind(next((i for i in range(c.n_layers) if c.is_global(i)), 0))
        return {"sliding_attention": _rope_dict(c, local[1], local[0], problems),
                "full_attention": _rope_dict(c, glob[1], glob[0], problems)}
    if len(kinds) > 1:
        problems.append(
            f"rope_base_global={c.rope_base_global} / rope_scaling_layers={c.rope_scaling_layers!r}: "
            f"a different RoPE on global layers (the {_FAMILY[arch]} class has one RoPE for all layers; "
            "Gemma 3 has one per layer kind)"
        )
    base, scaling = kinds.pop()
    return _rope_dict(c, scaling, base, problems)


def _hf_rope_fields(rp: dict, problems: list[str]) -> tuple[float, dict]:
    """(base, our rope_* fields) from one transformers rope_parameters dict."""
    kind = rp.get("rope_type", "default")
    base = float(rp.get("rope_theta", 10000.0))
    partial = rp.get("partial_rotary_factor")
    if kind != "default" and partial not in (None, 1, 1.0):
        # the families' own default RoPE ignores the field; the scaled ones (modeling_rope_utils) compute
        # frequencies for int(head_dim * factor) channels only, which companion does not model
        problems.append(f"partial_rotary_factor={partial} with rope_type={kind!r} (companion rotates every "
                        "channel of the head; transformers' scaled RoPE would rotate a fraction)")
        return base, {}
    if kind == "default":
        return base, {}
    mscales = dict(rope_mscale=float(rp.get("mscale") or 0.0),
                   rope_mscale_all_dim=float(rp.get("mscale_all_dim") or 0.0))
    if kind in ("linear", "llama3", "yarn") and rp.get("factor") is None:
        problems.append(f"rope_parameters factor={rp.get('factor')!r} (rope_type={kind!r} needs its factor)")
        return base, {}
    if kind == "linear":
        return base, dict(rope_scaling="pi", rope_factor=float(rp["factor"]), **mscales)
    if kind == "llama3":
        return base, dict(
            **mscales, rope_scaling="llama3", rope_factor=float(rp["factor"]),
            rope_low_freq_factor=float(rp["low_freq_factor"]), rope_high_freq_factor=float(rp["high_freq_factor"]),
            rope_original_max_len=int(rp["original_max_position_embeddings"]),
        )
    if kind == "yarn":
        return base, dict(
            **mscales, rope_scaling="yarn_hf", rope_factor=float(rp["factor"]),
            rope_beta_fast=float(rp.get("beta_fast") or 32.0),
            rope_beta_slow=float(rp.get("beta_slow") or 1.0), rope_truncate=bool(rp.get("truncate", True)),
            rope_original_max_len=int(rp["original_max_position_embeddings"]),
            rope_attention_factor=rp.get("attention_factor"),
        )
    problems.append(
        f"rope_parameters rope_type={kind!r} (mapped: 'default', 'linear', 'llama3', 'yarn'; 'dynamic' changes the "
        "frequencies with the sequence length, 'longrope' per channel)"
    )
    return base, {}


def _hf_rope(h, arch: str, layer_global: list[bool], problems: list[str]) -> dict:
    rp = dict(getattr(h, "rope_parameters", None) or {})
    partial = {} if getattr(h, "partial_rotary_factor", None) is None else {"partial_rotary_factor": h.partial_rotary_factor}
    if arch != "gemma3_text":
        rp = {**partial, **rp}  # the config's own field, where rope_parameters lacks it
        base, fields = _hf_rope_fields(rp, problems)
        return dict(rope_base=base, **fields)
    # transformers 5.24 _compute_yarn_parameters reads truncate from config.rope_parameters itself, which for
    # Gemma 3 is the dict of layer types: a nested truncate=False is never seen, the ramp is always truncated
    local_base, local = _hf_rope_fields({**partial, **rp["sliding_attention"], "truncate": True}, problems)
    glob_base, glob = _hf_rope_fields({**partial, **rp["full_attention"], "truncate": True}, problems)
    out = dict(rope_base=local_base, rope_base_global=glob_base if glob_base != local_base else None)
    has_local, has_global = not all(layer_global), any(layer_global)
    if local and has_local:
        if glob != local and has_global:
            problems.append(f"rope_parameters={rp}: a scaled RoPE on sliding layers ({local}) and another on "
                            f"full layers ({glob})")
        out.update(local)
    elif glob and has_global:
        out.update(glob, rope_scaling_layers="global" if has_local else "all")
    return out


def _use_their_frequencies(hf_model, model, arch: str) -> None:
    """Give every RoPE of ``model`` (converted from ``hf_model``) the float32 theta_i and the cos / sin
    factor that transformers' model holds and rotates with (its rotary module's ``inv_freq`` buffer and
    ``attention_scaling``, which transformers' own rope init functions computed), instead of ours: ours
    are computed in float64 and rounded once, theirs in float32, 1-2 ulps apart, and the angle m theta_i
    carries that difference times m (logits 7.5e-5 apart at position 8,000, 7e-4 at 40,000). Layers
    that shared a RoPE module share its replacement. Gemma 3 holds one set per layer type."""
    from companion.positions import RotaryEmbedding

    rotary = hf_model.model.rotary_emb
    types = list(getattr(hf_model.config, "layer_types", None) or []) if arch == "gemma3_text" else []
    made = {}
    for i, layer in enumerate(model.layers):
        ours = layer.attn.rope
        kind = types[i] if types else ""
        prefix = f"{kind}_" if kind else ""
        theirs = getattr(rotary, prefix + "inv_freq").to(torch.float32)
        scaling = getattr(rotary, prefix + "attention_scaling")
        key = (id(ours), kind)
        if key not in made:
            made[key] = RotaryEmbedding(ours.head_dim, ours.base, ours.scaling, ours.factor,
                                        inv_freq=theirs.cpu(), temperature=scaling)
        layer.attn.rope = made[key]
