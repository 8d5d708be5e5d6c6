"""Chapter 3's exercise checkers accept the reference and reject typical wrong answers, saying why."""

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from companion.exercises import ExerciseFailed, check, checkers

SEEDS = [0, 1, 2]


def test_chapter_3_checkers_are_registered():
    names = {"ch03.layer_norm", "ch03.shift_targets", "ch03.label_smoothing_loss", "ch03.chrf"}
    assert names <= set(checkers())


# --- layer norm --------------------------------------------------------------------------------


def layer_norm_by_formula(x, gamma, beta, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * gamma + beta


def layer_norm_unbiased(x, gamma, beta, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + eps) * gamma + beta


def layer_norm_over_tokens(x, gamma, beta, eps):
    mu = x.mean(-2, keepdim=True)
    var = ((x - mu) ** 2).mean(-2, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * gamma + beta


def layer_norm_without_eps(x, gamma, beta, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / ((x - mu) ** 2).mean(-1, keepdim=True).sqrt() * gamma + beta


def layer_norm_without_affine(x, gamma, beta, eps):
    return layer_norm_by_formula(x, 1.0, 0.0, eps)


@pytest.mark.parametrize("seed", SEEDS)
def test_layer_norm_accepts_the_formula(seed):
    report = check("ch03.layer_norm", layer_norm_by_formula, seed=seed, quiet=True)
    assert len(report.cases) == 4 and "variance 0" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (layer_norm_unbiased, r"unbiased variance \(divide by d - 1\)"),
    (layer_norm_over_tokens, r"statistics over the tokens"),
    (layer_norm_without_eps, r"token 1 is constant .* NaN/inf"),
    (layer_norm_without_affine, r"without gamma and beta"),
])
def test_layer_norm_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch03.layer_norm", wrong, seed=0, quiet=True)


# --- shifted targets ---------------------------------------------------------------------------


def shift_by_hand(targets, bos, eos, pad):
    width = max(len(t) for t in targets) + 1
    tgt_in = [[bos, *t] + [pad] * (width - len(t) - 1) for t in targets]
    labels = [[*t, eos] + [-100] * (width - len(t) - 1) for t in targets]
    return torch.tensor(tgt_in), torch.tensor(labels)


def shift_labels_padded_with_pad(targets, bos, eos, pad):
    tgt_in, labels = shift_by_hand(targets, bos, eos, pad)
    return tgt_in, labels.masked_fill(labels == -100, pad)


def shift_not_shifted(targets, bos, eos, pad):
    tgt_in, _ = shift_by_hand(targets, bos, eos, pad)
    return tgt_in, tgt_in.clone()


def shift_without_bos(targets, bos, eos, pad):
    _, labels = shift_by_hand(targets, bos, eos, pad)
    return labels.masked_fill(labels == -100, pad), labels


@pytest.mark.parametrize("seed", SEEDS)
def test_shift_targets_accepts_the_reference(seed):
    report = check("ch03.shift_targets", shift_by_hand, seed=seed, quiet=True)
    assert len(report.cases) == 3 and "padding needed" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (shift_labels_padded_with_pad, r"labels: .*labelled -100 so the loss ignores it"),
    (shift_not_shifted, r"labels: .*labels are the targets one position ahead"),
    (shift_without_bos, r"decoder_input: .*must start with BOS"),
    (lambda *a: shift_by_hand(*a)[0], r"expected a pair \(decoder_input, labels\)"),
])
def test_shift_targets_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch03.shift_targets", wrong, seed=0, quiet=True)


# --- label smoothing ---------------------------------------------------------------------------


def smoothing_by_formula(logits, targets, eps):
    keep = targets != -100
    logp, y = torch.log_softmax(logits[keep], -1), targets[keep]
    K = logits.shape[-1]
    q = (1 - eps) * F.one_hot(y, K).to(logp.dtype) + eps / K
    return -(q * logp).sum(-1).mean()


def smoothing_over_wrong_words(logits, targets, eps):
    keep = targets != -100
    logp, y = torch.log_softmax(logits[keep], -1), targets[keep]
    K = logits.shape[-1]
    one_hot = F.one_hot(y, K).to(logp.dtype)
    q = (1 - eps) * one_hot + eps / (K - 1) * (1 - one_hot)
    return -(q * logp).sum(-1).mean()


def smoothing_summed(logits, targets, eps):
    return smoothing_by_formula(logits, targets, eps) * (targets != -100).sum()


def smoothing_per_row(logits, targets, eps):
    return F.cross_entropy(logits, targets, label_smoothing=eps, reduction="none")


@pytest.mark.parametrize("seed", SEEDS)
def test_label_smoothing_accepts_the_formula(seed):
    report = check("ch03.label_smoothing_loss", smoothing_by_formula, seed=seed, quiet=True)
    assert len(report.cases) == 3 and "-100 (padding)" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (smoothing_over_wrong_words, r"eps spread over the K - 1 wrong words"),
    (smoothing_summed, r"the sum over targets; the loss is their mean"),
    (smoothing_per_row, r"expected a scalar .* one loss per row"),
])
def test_label_smoothing_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch03.label_smoothing_loss", wrong, seed=0, quiet=True)


# --- chrF --------------------------------------------------------------------------------------


def _order_stats(hyps, refs, n, strip=True):
    h = r = m = 0
    for hyp, ref in zip(hyps, refs):
        if strip:
            hyp, ref = "".join(hyp.split()), "".join(ref.split())
        a = Counter(hyp[i:i + n] for i in range(len(hyp) - n + 1))
        b = Counter(ref[i:i + n] for i in range(len(ref) - n + 1))
        h, r, m = h + sum(a.values()), r + sum(b.values()), m + sum((a & b).values())
    return h, r, m


def chrf_by_hand(hyps, refs, beta=2.0, strip=True):
    ps, rs = [], []
    for n in range(1, 7):
        h, r, m = _order_stats(hyps, refs, n, strip)
        if h and r:
            ps.append(m / h)
            rs.append(m / r)
    if not ps:
        return 0.0
    p, r = sum(ps) / len(ps), sum(rs) / len(rs)
    return 0.0 if p + r == 0 else 100 * (1 + beta**2) * p * r / (beta**2 * p + r)


def chrf_f1(hyps, refs):
    return chrf_by_hand(hyps, refs, beta=1.0)


def chrf_mean_of_f(hyps, refs):
    total = 0.0
    for n in range(1, 7):
        h, r, m = _order_stats(hyps, refs, n)
        p, rec = (m / h if h else 0.0), (m / r if r else 0.0)
        total += 0.0 if p + rec == 0 else 5 * p * rec / (4 * p + rec)
    return 100 * total / 6


def chrf_with_spaces(hyps, refs):
    return chrf_by_hand(hyps, refs, strip=False)


@pytest.mark.parametrize("seed", SEEDS)
def test_chrf_accepts_a_computation_by_hand(seed):
    report = check("ch03.chrf", chrf_by_hand, seed=seed, quiet=True)
    assert len(report.cases) == 4 and "empty output" in str(report)


@pytest.mark.parametrize("wrong, message", [
    (chrf_f1, r"beta = 1 \(F1\)"),
    (chrf_mean_of_f, r"the mean of one F-score per order"),
    (chrf_with_spaces, r"chrF removes whitespace"),
    (lambda h, r: chrf_by_hand(h, r) / 100, r"0-1 scale"),
])
def test_chrf_rejects_typical_mistakes(wrong, message):
    with pytest.raises(ExerciseFailed, match=message):
        check("ch03.chrf", wrong, seed=0, quiet=True)


def test_a_crashing_answer_is_reported_with_its_case():
    def broken(x, gamma, beta, eps):
        raise RuntimeError("boom")

    with pytest.raises(ExerciseFailed, match=r"x \(4, 8\).* raised RuntimeError: boom"):
        check("ch03.layer_norm", broken, seed=0, quiet=True)
