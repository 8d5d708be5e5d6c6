"""Chapter 4's diagrams: what each shows, and labels readable and apart."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from companion.notebook.diagrams import teacher_forcing_vs_generation
from companion.notebook.diagrams_ch04 import (gpt_architecture, sampling_step, token_rows,
                                              training_step, training_vs_generation)
from figure_layout import assert_readable_layout
from figure_layout import texts as _texts


def shown(fig):
    return [t.get_text() for t in _texts(fig)]


def test_generation_passes_read_the_whole_prefix():
    labels = shown(training_vs_generation(("a", "b", "c", "d")))
    # training: inputs a b c, labels b c d; generation: pass 1 reads a, pass 2 a b, pass 3 a b c,
    # and the three passes output b c d
    assert labels.count("a") == 1 + 3 and labels.count("b") == 2 + 2 + 1
    assert labels.count("c") == 2 + 1 + 1 and labels.count("d") == 2
    assert [s for s in labels if s.startswith("pass ")] == ["pass 1", "pass 2", "pass 3"]
    assert "training: teacher forcing" in labels and "generation: one pass per token" in labels


def test_the_old_generation_figure_still_draws():
    assert isinstance(teacher_forcing_vs_generation(), Figure)


def test_architecture_names_every_stage_with_shapes():
    labels = shown(gpt_architecture(n_layer=3))
    for part in ("wte $(V, d)$", "wpe $(T_{\\max}, d)$", "causal\nself-attention",
                 "MLP\n$d \\to 4d \\to d$", "head: $\\mathrm{wte}^{\\top}$\n(tied, $d \\to V$)", "(B, T)",
                 "(B, T, V)", "residual stream (B, T, d)"):
        assert part in labels, part
    assert "block, repeated N = 3 times (pre-LN)" in labels
    assert labels.count("LN") == 3 and labels.count("+") == 3


def test_training_step_and_sampling_show_their_stages_in_order():
    step = " ".join(shown(training_step()))
    order = ["random windows", "cross-entropy", "backward", "clip", "schedule", "AdamW"]
    assert [step.index(word) for word in order] == sorted(step.index(word) for word in order)
    sample = " ".join(shown(sampling_step()))
    order = ["prefix", "$z / \\tau$", "top-$k$ / top-$p$", "softmax", "draw one id"]
    assert [sample.index(word) for word in order] == sorted(sample.index(word) for word in order)


def test_token_rows_draw_one_box_per_token():
    rows = [list("the cat"), ["th", "e", " ", "c", "a", "t"], ["the", " ", "cat"]]
    labels = shown(token_rows(rows, ["bytes", "1 merge", "2 merges"]))
    assert "bytes (7)" in labels and "2 merges (3)" in labels
    assert labels.count("the") == 1 and labels.count("\u2423") == 3


@pytest.mark.parametrize("make", [training_vs_generation, gpt_architecture, training_step,
                                  sampling_step,
                                  lambda: token_rows([list(" the king"), [" the", " king"]],
                                                     ["bytes", "merges"])])
def test_labels_do_not_overlap_fit_the_column_and_are_readable(make):
    assert_readable_layout(make())


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="tokens must be at least 3"):
        training_vs_generation(("a", "b"))
    with pytest.raises(ValueError, match="n_layer must be"):
        gpt_architecture(0)
    with pytest.raises(ValueError, match="same text"):
        token_rows([["ab"], ["a", "c"]], ["x", "y"])
    with pytest.raises(ValueError, match="as many"):
        token_rows([["ab"]], ["x", "y"])
