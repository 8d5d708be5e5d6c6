"""companion.tokenizers: round trips, save/load, and the from-scratch BPE against the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from companion.tokenizers import ByteBPE, CharTokenizer, FastByteBPE, bytes_to_unicode, pretokenize

ROOT = Path(__file__).resolve().parents[1]
# A corpus that is always present: this package's own prose and code (English with symbols and digits).
CORPUS = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "companion").glob("**/*.py"))
          if p.parent.name in ("tokenizers", "data") or p.name in ("optim.py", "losses.py", "attention.py")]
SPECIAL = "<|endoftext|>"


@pytest.fixture(scope="module")
def trained():
    scratch_hf = ByteBPE.train(CORPUS, 600, [SPECIAL], min_frequency=2, tie_break="hf")
    scratch_id = ByteBPE.train(CORPUS, 600, [SPECIAL], min_frequency=2, tie_break="id")
    fast = FastByteBPE.train(CORPUS, 600, [SPECIAL], min_frequency=2)
    return scratch_hf, scratch_id, fast


def test_corpus_is_substantial():
    assert sum(map(len, CORPUS)) > 30_000


def test_bytes_to_unicode_is_a_printable_bijection():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord("a")] == "a" and table[ord(" ")] == "\u0120"


@given(st.text())
def test_pretokenize_covers_the_text(text):
    assert "".join(pretokenize(text)) == text


def test_scratch_merges_equal_the_library_with_its_tie_break(trained):
    scratch_hf, _, fast = trained
    assert len(fast.merges) == len(scratch_hf.merges) == 600 - 256 - 1
    assert scratch_hf.merges == fast.merges
    sample = CORPUS[0][:3000] + f" {SPECIAL} naïve café 日本語 🎉\r\n\t x"
    assert [scratch_hf.token_bytes(t) for t in scratch_hf.encode(sample)] == \
           [fast.token_bytes(t) for t in fast.encode(sample)]


def test_tie_break_is_the_only_difference(trained):
    scratch_hf, scratch_id, _ = trained
    first = next((i for i, (a, b) in enumerate(zip(scratch_hf.merges, scratch_id.merges)) if a != b), None)
    if first is not None:  # on this corpus the orders diverge: it must be at a tie
        assert scratch_hf.merges[:first] == scratch_id.merges[:first]
        (pair_hf, count_hf), (pair_id, count_id) = scratch_hf.train_history[first], scratch_id.train_history[first]
        assert count_hf == count_id and pair_hf != pair_id
    # A corpus built to tie: "qz" and " w" occur once each. By byte value ' ' (32) < 'q' (113), so
    # tie_break="id" merges " w"; the library ranks ' ' by its stand-in U+0120, after every printable
    # byte, and merges "qz". tie_break="hf" follows the library.
    texts = ["qz w"]
    assert FastByteBPE.train(texts, 257, min_frequency=1).merges == [(b"q", b"z")]
    assert ByteBPE.train(texts, 257, min_frequency=1, tie_break="hf").merges == [(b"q", b"z")]
    assert ByteBPE.train(texts, 257, min_frequency=1, tie_break="id").merges == [(b" ", b"w")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(), insert_special=st.booleans())
def test_round_trip_arbitrary_unicode(trained, text, insert_special):
    if insert_special:
        text = text[: len(text) // 2] + SPECIAL + text[len(text) // 2 :]
    for tokenizer in trained:
        ids = tokenizer.encode(text)
        assert all(0 <= t < tokenizer.vocab_size for t in ids)
        assert tokenizer.decode(ids) == text
        if insert_special:
            assert tokenizer.special_tokens[SPECIAL] in ids


def test_bpe_compresses_and_save_load(trained, tmp_path):
    for tokenizer in trained:
        ids = tokenizer.encode(CORPUS[1])
        assert len(ids) < 0.6 * len(CORPUS[1].encode("utf-8"))  # 343 merges: about 2 bytes a token
        path = tmp_path / f"{type(tokenizer).__name__}.json"
        tokenizer.save(path)
        loaded = type(tokenizer).load(path)
        assert loaded.encode(CORPUS[1]) == ids
        assert loaded.vocab_size == tokenizer.vocab_size and loaded.special_tokens == tokenizer.special_tokens
    with pytest.raises(ValueError, match="not a companion.FastByteBPE"):
        FastByteBPE.load(tmp_path / "ByteBPE.json")


def test_bpe_rejects_bad_input():
    with pytest.raises(ValueError, match="vocab_size must be >= 256"):
        ByteBPE.train(["abc"], 100)
    with pytest.raises(ValueError, match="texts must not be empty"):
        ByteBPE.train([], 300)
    with pytest.raises(ValueError, match="texts must not be empty"):
        FastByteBPE.train([""], 300)
    with pytest.raises(ValueError, match="tie_break must be"):
        ByteBPE.train(["abc"], 300, tie_break="random")
    with pytest.raises(ValueError, match="merges must only combine earlier symbols"):
        ByteBPE([(b"ab", b"c")])
    with pytest.raises(ValueError, match="token must be in"):
        ByteBPE().decode([256])


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abc xyz\n!é🎉"))
def test_char_round_trip(text):
    tokenizer = CharTokenizer.train("abc xyz\n!é🎉", special_tokens=["<pad>", "<eos>"])
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_char_tokenizer_specials_unknown_and_files(tmp_path):
    tokenizer = CharTokenizer.train(["hello", "world"], special_tokens=["<pad>", "<unk>"], unk="<unk>")
    assert tokenizer.vocab_size == 2 + len(set("helloworld"))
    assert tokenizer.encode("<pad>he") == [0, tokenizer.encode("h")[0], tokenizer.encode("e")[0]]
    assert tokenizer.decode(tokenizer.encode("hex")) == "he<unk>"
    tokenizer.save(tmp_path / "c.json")
    assert CharTokenizer.load(tmp_path / "c.json").encode("world") == tokenizer.encode("world")
    strict = CharTokenizer.train("abc")
    with pytest.raises(ValueError, match="outside the vocabulary: \\['z'\\]"):
        strict.encode("abz")
    with pytest.raises(ValueError, match="the corpus is empty"):
        CharTokenizer.train("")
