"""Chapter 6's exercise checkers accept a correct answer and name the usual mistakes.

The correct answers below are written from the formulas (the square root of the mean square, the
gated product, the parameter count term by term), independently of the checkers' references
(``torch.nn.functional.rms_norm`` and ``silu``, a built ``Decoder``)."""

import pytest
import torch

from exercise_checks import fails
from companion.exercises import check, checkers


def test_chapter_6_checkers_are_registered():
    names = {"ch06.rms_norm", "ch06.swiglu", "ch06.decoder_parameters"}
    assert names == {name for name in checkers() if name.startswith("ch06.")}


# --- rms_norm


def rms_norm(x, gain, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rms_norm_accepts_the_formula(seed):
    assert len(check("ch06.rms_norm", rms_norm, seed=seed, quiet=True).cases) == 3


def test_rms_norm_accepts_a_float32_answer():
    check("ch06.rms_norm", lambda x, g, eps: rms_norm(x.float(), g.float(), eps), quiet=True)


def test_rms_norm_names_layer_norm():
    def layer_norm(x, gain, eps):
        c = x - x.mean(-1, keepdim=True)
        return c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps) * gain

    fails("ch06.rms_norm", layer_norm, "case 1", "LayerNorm", "does not centre")


def test_rms_norm_names_the_sum_and_the_missing_gain():
    fails("ch06.rms_norm", lambda x, g, eps: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * g,
          "mean of the squares, not their sum")
    fails("ch06.rms_norm", lambda x, g, eps: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps),
          "without the gain")


def test_rms_norm_names_eps_outside_the_root():
    # only the tiny-scale case tells them apart: the diagnosis must name case 3
    wrong = lambda x, g, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * g  # noqa: E731
    fails("ch06.rms_norm", wrong, "case 3", "eps added outside")


def test_rms_norm_reports_a_wrong_shape_and_an_exception():
    fails("ch06.rms_norm", lambda x, g, eps: rms_norm(x, g, eps).sum(-1), "wrong shape")
    fails("ch06.rms_norm", lambda x, g, eps: x.rms(), "raised AttributeError")


# --- swiglu


def swiglu(x, w_gate, w_up, w_down):
    a = x @ w_gate
    return (a / (1 + torch.exp(-a)) * (x @ w_up)) @ w_down


@pytest.mark.parametrize("seed", [0, 3])
def test_swiglu_accepts_the_formula(seed):
    assert len(check("ch06.swiglu", swiglu, seed=seed, quiet=True).cases) == 3


def test_swiglu_names_swapped_projections_and_other_gates():
    fails("ch06.swiglu", lambda x, g, u, d: swiglu(x, u, g, d), "swapped")
    fails("ch06.swiglu", lambda x, g, u, d: (torch.sigmoid(x @ g) * (x @ u)) @ d, "sigmoid gate")
    fails("ch06.swiglu", lambda x, g, u, d: (torch.nn.functional.gelu(x @ g) * (x @ u)) @ d, "GeGLU")
    fails("ch06.swiglu", lambda x, g, u, d: torch.nn.functional.silu((x @ g) * (x @ u)) @ d, "after the product")


# --- decoder_parameters


def decoder_parameters(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied):
    d_h = d // n_heads
    attention = d * n_heads * d_h + 2 * d * n_kv_heads * d_h + n_heads * d_h * d
    layer = attention + 3 * d * d_ff + 2 * d
    return n_layers * layer + d + vocab * d * (1 if tied else 2)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_decoder_parameters_accepts_the_count(seed):
    assert len(check("ch06.decoder_parameters", decoder_parameters, seed=seed, quiet=True).cases) == 4


def test_decoder_parameters_names_mha_heads_and_double_tying():
    def mha(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied):
        return decoder_parameters(vocab, d, n_layers, n_heads, n_heads, d_ff, tied)

    fails("ch06.decoder_parameters", mha, "case 1", "n_kv_heads of them")

    def twice(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied):
        return decoder_parameters(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, False)

    fails("ch06.decoder_parameters", twice, "case 2", "counted twice")


def test_decoder_parameters_names_forgotten_norms_and_a_two_matrix_ffn():
    def no_norms(*args):
        vocab, d, n_layers = args[:3]
        return decoder_parameters(*args) - (2 * n_layers + 1) * d

    fails("ch06.decoder_parameters", no_norms, "RMSNorm gains forgotten")

    def mlp(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied):
        return decoder_parameters(vocab, d, n_layers, n_heads, n_kv_heads, d_ff, tied) - n_layers * d * d_ff

    fails("ch06.decoder_parameters", mlp, "two matrices")


def test_decoder_parameters_rejects_a_fraction_and_says_by_how_much_an_unknown_error_is_off():
    fails("ch06.decoder_parameters", lambda *a: decoder_parameters(*a) + 0.5, "whole number")
    message = fails("ch06.decoder_parameters", lambda *a: decoder_parameters(*a) + 7, "off by +7")
    assert "--" not in message  # no known mistake is claimed
