import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.tokenizers import WordTokenizer, split_words


def test_split_words_keeps_inner_apostrophes_and_punctuation():
    assert split_words("L'homme dit: « Non! » well-known, 12 rue") == [
        "l'homme", "dit", ":", "«", "non", "!", "»", "well-known", ",", "12", "rue"]
    assert split_words("Hello", lowercase=False) == ["Hello"]


def test_train_ranks_by_frequency_then_alphabet_and_caps_size():
    tok = WordTokenizer.train(["b a b c", "c b d"], max_size=7)
    assert tok.words == ["b", "c", "a"]  # b:3, c:2, then a/d tie (1 each) broken alphabetically, capped
    assert tok.vocab_size == 7
    assert tok.encode("b d") == [tok.id("b"), tok.id("<unk>")]
    assert tok.decode(tok.encode("B, c")) == "b <unk> c"  # ',' unseen


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["the", "cat", "sat", ",", ".", "on", "mat", "l'eau"]), min_size=0, max_size=20))
def test_round_trip_of_known_words(words):
    tok = WordTokenizer.train(["the cat sat , . on mat l'eau"])
    text = " ".join(words)
    assert tok.decode(tok.encode(text)) == tok.normalize(text) == text


def test_save_load(tmp_path):
    tok = WordTokenizer.train(["un deux trois deux"], min_count=2)
    assert tok.words == ["deux"]
    tok.save(tmp_path / "t.json")
    again = WordTokenizer.load(tmp_path / "t.json")
    assert again.to_dict() == tok.to_dict()


def test_bad_input():
    with pytest.raises(ValueError, match="empty"):
        WordTokenizer.train([""])
    with pytest.raises(ValueError, match="max_size"):
        WordTokenizer.train(["a"], max_size=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        WordTokenizer.train(["a"], unk=None, special_tokens=("<pad>",)).encode("b")
    with pytest.raises(ValueError, match=r"ids must be in"):
        WordTokenizer.train(["a"]).decode([99])
    with pytest.raises(ValueError, match="min_count"):
        WordTokenizer.train(["a"], min_count=0)
