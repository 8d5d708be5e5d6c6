"""companion.data: LM windows, bucketed pair batches with masks, synthetic tasks, hub loading offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from companion.attention import padding_mask
from companion.data import synthetic
from companion.data.batching import IGNORE_INDEX, lm_batch, lm_eval_batches, pair_batches
from companion.data.hub import load_hub_pairs, load_hub_text

FIXTURES = Path(__file__).parent / "fixtures"


def test_lm_batch_windows_and_shift():
    data = torch.arange(1000)
    g = torch.Generator().manual_seed(0)
    x, y = lm_batch(data, batch_size=16, context=32, generator=g)
    assert x.shape == y.shape == (16, 32)
    assert torch.equal(y, x + 1)  # on arange, the next token is the id plus one
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # contiguous windows
    assert int(x[:, 0].max()) <= 1000 - 33
    x2, _ = lm_batch(data, 16, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    starts = torch.cat([lm_batch(data, 64, 32, generator=g)[0][:, 0] for _ in range(20)])
    assert len(set(starts.tolist())) > 500  # random windows cover the data


def test_lm_batch_rejects_bad_input():
    data = torch.arange(10)
    with pytest.raises(ValueError, match="context must be <= len\\(data\\) - 1 = 9"):
        lm_batch(data, 2, 10)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        lm_batch(data, 0, 4)
    with pytest.raises(ValueError, match="1-D tensor"):
        lm_batch(data.view(2, 5), 1, 2)
    with pytest.raises(ValueError, match="context must be <= len"):
        lm_batch(torch.tensor([], dtype=torch.long), 1, 1)


def test_lm_eval_batches_cover_every_window_once():
    data = torch.arange(101)
    batches = list(lm_eval_batches(data, batch_size=3, context=10))
    xs = torch.cat([x for x, _ in batches])
    assert xs.shape == (10, 10)
    assert torch.equal(xs.flatten(), torch.arange(100))
    assert torch.equal(torch.cat([y for _, y in batches]).flatten(), torch.arange(1, 101))


def test_pair_batches_pad_mask_and_bucket():
    pairs = synthetic.make_pairs("reverse", 400, vocab_size=12, min_len=1, max_len=20, seed=1)
    batches = pair_batches(pairs, 16, pad_id=0, bos_id=1, eos_id=2, seed=0)
    assert sum(b.src.shape[0] for b in batches) == 400
    seen = sorted(tuple(b.src[i, : b.src_lengths[i]].tolist()) for b in batches for i in range(b.src.shape[0]))
    assert seen == sorted(tuple(x) for x, _ in pairs)  # every pair exactly once
    padded = sum(int(b.src.numel() - b.src_lengths.sum()) for b in batches)
    unbucketed = pair_batches(pairs, 16, pad_id=0, bos_id=1, eos_id=2, seed=0, pool_batches=1)
    padded_plain = sum(int(b.src.numel() - b.src_lengths.sum()) for b in unbucketed)
    assert padded < padded_plain / 3  # bucketing removes most padding
    b = batches[0]
    B, S = b.src.shape
    T = b.tgt_in.shape[1]
    assert b.src_mask.shape == (B, 1, 1, S) and b.src_mask.dtype == torch.bool
    assert torch.equal(b.src_mask, padding_mask(b.src_lengths, S))
    assert b.tgt_mask.shape == (B, 1, T, T)
    assert not b.tgt_mask[:, 0, 0, 1:].any()  # causal
    i = int(b.tgt_lengths.argmin())
    n = int(b.tgt_lengths[i])
    assert b.tgt_in[i, 0] == 1 and (b.tgt_in[i, n:] == 0).all()
    assert b.labels[i, n - 1] == 2 and (b.labels[i, n:] == IGNORE_INDEX).all()
    assert torch.equal(b.labels[i, : n - 1], b.tgt_in[i, 1:n])  # labels = decoder input shifted
    assert b.n_target_tokens == int(b.tgt_lengths.sum())
    again = pair_batches(pairs, 16, pad_id=0, bos_id=1, eos_id=2, seed=0)
    assert all(torch.equal(a.src, c.src) for a, c in zip(batches, again))
    other_epoch = pair_batches(pairs, 16, pad_id=0, bos_id=1, eos_id=2, seed=0, epoch=1)
    assert any(a.src.shape != c.src.shape or not torch.equal(a.src, c.src) for a, c in zip(batches, other_epoch))


def test_pair_batches_rejects_bad_input():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        pair_batches([([4], [5])], 0, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="pairs must not be empty"):
        pair_batches([], 4, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="pairs\\[1\\] has an empty source"):
        pair_batches([([4], [5]), ([], [5])], 4, pad_id=0, bos_id=1, eos_id=2)


def test_synthetic_tasks():
    for task, rule in [("copy", list), ("reverse", lambda x: x[::-1]), ("sort", sorted)]:
        pairs = synthetic.make_pairs(task, 50, vocab_size=10, min_len=2, max_len=6, seed=3)
        assert all(y == rule(x) for x, y in pairs)
        assert all(2 <= len(x) <= 6 and all(4 <= t < 10 for t in x) for x, _ in pairs)
    assert synthetic.make_pairs("copy", 5, seed=1) == synthetic.make_pairs("copy", 5, seed=1)
    assert synthetic.make_pairs("copy", 5, seed=1) != synthetic.make_pairs("copy", 5, seed=2)
    sequences, masks = synthetic.to_lm([([5, 6], [6, 5])])
    assert sequences == [[5, 6, synthetic.SEP, 6, 5, synthetic.EOS]]
    assert masks == [[False, False, False, True, True, True]]
    with pytest.raises(ValueError, match="task must be one of \\['copy', 'reverse', 'sort'\\]"):
        synthetic.make_pairs("add", 3)
    with pytest.raises(ValueError, match="vocab_size must be > 4"):
        synthetic.make_pairs("copy", 3, vocab_size=4)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {"cache_dir": str(tmp_path / "hf")}


def test_hub_text_path_on_local_fixture(offline):
    ds = load_hub_text(str(FIXTURES / "hub_text"), **offline)
    assert set(ds) == {"train", "validation"}
    assert ds["train"].column_names == ["text"]
    assert ds["validation"][0]["text"].startswith("Lily baked bread")
    with pytest.raises(ValueError, match="text_column must be one of \\['text'\\]"):
        load_hub_text(str(FIXTURES / "hub_text"), text_column="story", **offline)


def test_hub_pairs_both_layouts(offline):
    wmt = load_hub_pairs(str(FIXTURES / "hub_pairs_wmt"), "fr", "en", **offline)
    assert wmt["validation"][0]["translation"] == {"fr": "Elle lit une lettre.", "en": "She reads a letter."}
    flat = load_hub_pairs(str(FIXTURES / "hub_pairs_flat"), "en", "de", **offline)
    assert set(flat) == {"train", "test"}
    assert flat["train"].column_names == ["translation"]
    assert flat["test"][0]["translation"]["de"] == "Ein Hund rennt am Strand."
    with pytest.raises(ValueError, match="needs a 'translation' column or columns named 'en' and 'es'"):
        load_hub_pairs(str(FIXTURES / "hub_pairs_flat"), "en", "es", **offline)
    with pytest.raises(ValueError, match="src and tgt must be among the translation languages"):
        load_hub_pairs(str(FIXTURES / "hub_pairs_wmt"), "en", "de", **offline)
