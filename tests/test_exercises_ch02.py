"""Chapter 2's exercise checkers accept a correct answer and name the usual mistakes.

Every correct answer below is written from the formulas, independently of the checkers' own
references (which use companion.positions and PyTorch's FLOP counter).
"""

import math

import pytest
import torch

from exercise_checks import fails
from companion.exercises import check, checkers


def omega(d, base=10000.0, exponent=2):
    """Pair frequencies base^(-exponent * i / d), i = 0 .. d/2 - 1 (exponent 2 is right)."""
    return base ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)


def interleave(even, odd):
    out = torch.empty(*even.shape[:-1], 2 * even.shape[-1], dtype=even.dtype)
    out[..., 0::2], out[..., 1::2] = even, odd
    return out


def table(positions, d):
    angles = positions.double()[:, None] * omega(d)
    return interleave(angles.sin(), angles.cos())


def test_chapter_2_checkers_are_registered():
    names = {"ch02.sinusoidal_table", "ch02.shift_matrix", "ch02.position_similarity",
             "ch02.attention_flops", "ch02.rope_interleaved", "ch02.dilated_stack"}
    assert names == {name for name in checkers() if name.startswith("ch02.")}


# ----------------------------------------------------------------------------- sinusoidal table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sinusoidal_table_accepts_a_float32_answer(seed):
    def answer(positions, d):
        angles = positions.float()[:, None] * omega(d).float()
        return interleave(angles.sin(), angles.cos())

    report = check("ch02.sinusoidal_table", answer, seed=seed, quiet=True)
    assert len(report.cases) == 5


def test_sinusoidal_table_names_swapped_sin_and_cos():
    def swapped(positions, d):
        angles = positions.double()[:, None] * omega(d)
        return interleave(angles.cos(), angles.sin())

    fails("ch02.sinusoidal_table", swapped, "sin and cos are swapped")


def test_sinusoidal_table_names_halves_instead_of_interleaving():
    def halves(positions, d):
        angles = positions.double()[:, None] * omega(d)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)

    fails("ch02.sinusoidal_table", halves, "two halves", "interleave")


def test_sinusoidal_table_names_the_exponent_i_over_d():
    def half_exponent(positions, d):
        angles = positions.double()[:, None] * omega(d, exponent=1)
        return interleave(angles.sin(), angles.cos())

    fails("ch02.sinusoidal_table", half_exponent, "exponent i/d", "2i/d")


def test_sinusoidal_table_names_a_wrong_base():
    def base_1000(positions, d):
        angles = positions.double()[:, None] * omega(d, base=1000.0)
        return interleave(angles.sin(), angles.cos())

    fails("ch02.sinusoidal_table", base_1000, "pair 0", "base (10000)")


def test_sinusoidal_table_names_ignored_positions_and_wrong_shape():
    fails("ch02.sinusoidal_table", lambda positions, d: table(torch.arange(len(positions)), d),
          "ignores the positions argument")
    fails("ch02.sinusoidal_table", lambda positions, d: table(positions, d).T, "wrong shape")


def test_sinusoidal_table_reports_the_learners_exception():
    def broken(positions, d):
        raise RuntimeError("boom")

    fails("ch02.sinusoidal_table", broken, "case 1", "RuntimeError: boom")


# ----------------------------------------------------------------------------- shift matrix


def shift(k, d, sign=1.0):
    M = torch.zeros(d, d, dtype=torch.float64)
    c, s = torch.cos(k * omega(d)), sign * torch.sin(k * omega(d))
    for i in range(d // 2):
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = c[i], s[i]
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -s[i], c[i]
    return M


def test_shift_matrix_accepts_the_rotation():
    assert len(check("ch02.shift_matrix", shift, quiet=True).cases) == 5


def test_shift_matrix_names_the_inverse_rotation():
    fails("ch02.shift_matrix", lambda k, d: shift(k, d, sign=-1.0), "shifts by -k")


def test_shift_matrix_names_missing_frequencies_and_a_broken_property():
    def no_omega(k, d):
        return torch.block_diag(*[torch.tensor([[math.cos(k), math.sin(k)],
                                                [-math.sin(k), math.cos(k)]])] * (d // 2))

    fails("ch02.shift_matrix", no_omega, "angle k instead of k w_i")
    message = fails("ch02.shift_matrix", lambda k, d: torch.eye(d), "differs from P_(p+k)")
    assert "first at p = 60" in message


# ----------------------------------------------------------------------------- similarity


def test_position_similarity_accepts_the_cosine_sum():
    def answer(offsets, d):
        return torch.cos(offsets.double()[:, None] * omega(d)).sum(-1)

    assert len(check("ch02.position_similarity", answer, quiet=True).cases) == 4


def test_position_similarity_names_channel_sum_and_normalisation():
    def over_channels(offsets, d):
        return 2 * torch.cos(offsets.double()[:, None] * omega(d)).sum(-1)

    def cosine(offsets, d):
        return torch.cos(offsets.double()[:, None] * omega(d)).mean(-1)

    fails("ch02.position_similarity", over_channels, "d/2", "pairs")
    fails("ch02.position_similarity", cosine, "cosine similarity")


# ----------------------------------------------------------------------------- FLOPs


def test_attention_flops_accepts_the_formula():
    report = check("ch02.attention_flops", lambda n, d: 8 * n * d**2 + 4 * n**2 * d, quiet=True)
    assert len(report.cases) == 6


@pytest.mark.parametrize("wrong, needle", [
    (lambda n, d: 4 * n**2 * d, "only the scores"),
    (lambda n, d: 6 * n * d**2 + 4 * n**2 * d, "output projection"),
    (lambda n, d: 4 * n * d**2 + 2 * n**2 * d, "multiply-adds"),
    (lambda n, d: 8 * n * d**2, "only the four projections"),
    (lambda n, d: "many", "expected a number"),
])
def test_attention_flops_names_the_usual_miscounts(wrong, needle):
    fails("ch02.attention_flops", wrong, needle)


def test_attention_flops_reports_the_measured_count_otherwise():
    fails("ch02.attention_flops", lambda n, d: 7, "expected 589,824 FLOPs", "got 7")


# ----------------------------------------------------------------------------- interleaved RoPE


def rope(x, positions, sign=1.0):
    angles = sign * positions.double()[:, None] * omega(x.shape[-1])
    even, odd = x.double()[..., 0::2], x.double()[..., 1::2]
    return interleave(even * angles.cos() - odd * angles.sin(),
                      even * angles.sin() + odd * angles.cos())


def test_rope_interleaved_accepts_the_pairwise_rotation():
    assert len(check("ch02.rope_interleaved", rope, quiet=True).cases) == 4


def test_rope_interleaved_names_direction_layout_and_identity():
    fails("ch02.rope_interleaved", lambda x, p: rope(x, p, sign=-1.0), "wrong way")
    fails("ch02.rope_interleaved", lambda x, p: x, "nothing was rotated")

    def half_split(x, positions):
        d = x.shape[-1]
        perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
        return rope(x[..., torch.argsort(perm)], positions)[..., perm]

    fails("ch02.rope_interleaved", half_split, "i + d/2")


# ----------------------------------------------------------------------------- dilated stack


def dilated_stack(dilation=lambda layer: 2**layer, pad=lambda dil: (dil, 0)):
    """A fresh stack: call k applies a kernel-2 convolution with dilation ``dilation(k)``."""
    def make():
        state = {"layer": 0}
        weight = torch.rand(4, 4, 2) + 0.1

        def layer(H):
            dil = dilation(state["layer"])
            state["layer"] += 1
            padded = torch.nn.functional.pad(H.T[None], pad(dil))
            return torch.nn.functional.conv1d(padded, weight, dilation=dil)[0].T
        return layer
    return make


def test_dilated_stack_accepts_doubling_causal_layers():
    report = check("ch02.dilated_stack", dilated_stack(), quiet=True)
    assert report.cases[0] == "n=8: ends meet after 3 layers"


def test_dilated_stack_names_a_dilation_that_does_not_double():
    message = fails("ch02.dilated_stack", dilated_stack(dilation=lambda layer: 1),
                    "dilation 2^(k-1)")
    assert "after 2 layer(s) output 7 reads inputs 5..7" in message


def test_dilated_stack_names_a_stack_that_reads_the_future_and_a_wrong_shape():
    fails("ch02.dilated_stack", dilated_stack(pad=lambda dil: (0, dil)), "not causal")
    fails("ch02.dilated_stack", dilated_stack(pad=lambda dil: (dil, dil)), "expected (n, 4)")
    fails("ch02.dilated_stack", lambda: "layer", "callable")
