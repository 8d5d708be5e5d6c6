"""Chapter 13's exercise checkers accept the reference and reject typical wrong answers, saying why."""

import pytest
import torch
import torch.nn.functional as F

from companion.exercises import ExerciseFailed, check, checkers
from companion.exercises.ch13 import reference_qk_norm_layer

SEEDS = [0, 1, 2]


def test_chapter_13_checkers_are_registered():
    assert {"ch13.param_count", "ch13.kv_bytes", "ch13.qk_norm_layer"} <= set(checkers())


# --- param_count -------------------------------------------------------------------------------


def good_count(c):
    V, d, L, h, g, dh, ff = (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.kv_heads,
                             c.attn_head_dim, c.ffn_hidden)
    layer = 2 * d + d * (h + 2 * g) * dh + h * dh * d + 3 * d * ff + (2 * dh if c.qk_norm else 0)
    return V * d * (1 if c.tie_embeddings else 2) + L * layer + d


def mha_count(c):
    return good_count(c) + c.n_layers * 2 * c.d_model * (c.n_heads - c.kv_heads) * c.attn_head_dim


def always_untied(c):
    return good_count(c) + (c.vocab_size * c.d_model if c.tie_embeddings else 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_param_count_accepts_the_formula(seed):
    assert len(check("ch13.param_count", good_count, seed=seed, quiet=True).cases) == 6


@pytest.mark.parametrize("wrong, hint", [
    (mha_count, "h key/value heads instead of g"),
    (lambda c: good_count(c) - 2 * c.n_layers * c.d_model - c.d_model
     - (2 * c.n_layers * c.attn_head_dim if c.qk_norm else 0), "without the RMSNorm gains"),
    (lambda c: float(good_count(c)), "must return an int"),
])
def test_param_count_rejects_typical_mistakes(wrong, hint):
    # seed 0 draws GQA configs with g < h for the first case
    with pytest.raises(ExerciseFailed, match=hint):
        for seed in range(6):
            check("ch13.param_count", wrong, seed=seed, quiet=True)


def test_param_count_names_the_tying_mistake():
    with pytest.raises(ExerciseFailed, match="tying"):
        for seed in range(10):
            check("ch13.param_count", always_untied, seed=seed, quiet=True)


# --- kv_bytes ------------------------------------------------------------------------------------


def good_kv(c, T, b):
    return 2 * c.n_layers * T * c.kv_heads * c.attn_head_dim * b


@pytest.mark.parametrize("seed", SEEDS)
def test_kv_bytes_accepts_the_formula(seed):
    assert check("ch13.kv_bytes", good_kv, seed=seed, quiet=True).cases


@pytest.mark.parametrize("wrong, hint", [
    (lambda c, T, b: c.n_layers * T * c.kv_heads * c.attn_head_dim * b, "factor 2"),
    (lambda c, T, b: 2 * c.n_layers * T * c.kv_heads * c.attn_head_dim, "elements, not bytes"),
])
def test_kv_bytes_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(ExerciseFailed, match=hint):
        check("ch13.kv_bytes", wrong, seed=0, quiet=True)


def test_kv_bytes_names_the_missing_sharing():
    def no_sharing(c, T, b):
        return 2 * c.n_layers * T * c.n_heads * c.attn_head_dim * b

    with pytest.raises(ExerciseFailed, match="h heads instead of g"):
        for seed in range(10):
            check("ch13.kv_bytes", no_sharing, seed=seed, quiet=True)


# --- qk_norm_layer -------------------------------------------------------------------------------


def own_layer(layer, H, positions):
    """An independent answer: the eqs. with the library's RMSNorm calls and explicit softmax."""
    attn, ffn = layer.attn, layer.ffn
    B, T, _ = H.shape
    h, g, dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    X = layer.attn_norm(H)
    q, k, v = attn.project_qkv(X)
    q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.rope(q, positions), attn.rope(k, positions)
    k, v = k[:, torch.arange(h) // (h // g)], v[:, torch.arange(h) // (h // g)]
    s = q @ k.transpose(-1, -2) / dh ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    O = s.softmax(-1) @ v
    U = H + attn.out(O.transpose(1, 2).reshape(B, T, h * dh))
    Z = layer.ffn_norm(U)
    return U + ffn.down(F.silu(ffn.gate(Z)) * ffn.up(Z))


@pytest.mark.parametrize("answer", [reference_qk_norm_layer, own_layer])
@pytest.mark.parametrize("seed", SEEDS)
def test_qk_norm_layer_accepts_correct_layers(answer, seed):
    assert len(check("ch13.qk_norm_layer", answer, seed=seed, quiet=True).cases) == 3


def after_rope(layer, H, positions):
    from companion.exercises.ch13 import _layer_reference
    return _layer_reference(layer, H, positions, before_rope=False)


def no_qk_norm(layer, H, positions):
    from companion.exercises.ch13 import _layer_reference
    return _layer_reference(layer, H, positions, qk_norm=False)


def rotated_from_zero(layer, H, positions):
    """The mistake the chapter's own solution once made: positions ignored, rows rotated by 0..T-1."""
    from companion.exercises.ch13 import _layer_reference
    return _layer_reference(layer, H, torch.arange(H.shape[1]))


@pytest.mark.parametrize("wrong, hint", [
    (after_rope, "after RoPE"),
    (rotated_from_zero, "instead of by `positions`"),
    (no_qk_norm, "without QK-norm"),
    (lambda layer, H, positions: H, "values differ"),
    (lambda layer, H, positions: H[:, :-1], "wrong shape"),
    (lambda layer, H, positions: 1 / 0, "raised ZeroDivisionError"),
])
def test_qk_norm_layer_rejects_typical_mistakes(wrong, hint):
    with pytest.raises(ExerciseFailed, match=hint):
        check("ch13.qk_norm_layer", wrong, seed=0, quiet=True)
