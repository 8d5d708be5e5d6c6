"""book/claims.md against the cells it links to (issue 37, item 2).

Each claim of the index is a sentence that a tagged cell checks (tools/backmatter.py). A reader
takes the sentence at its word, so its numbers and its scope must be the ones the cell checks. A
program cannot read meaning, but it can catch the drift this index has shown: a claim that says
"8x" over asserts made at 4x, a threshold changed in the cell and not in the sentence. Two rules,
on every claim of every chapter:

- every number of the claim's text appears in its cell's source or stored output, in one of the
  forms code writes it ("1,600" as 1600 or 1_600, "30%" as 30 or 0.3, "4x" as 4);
- a claim that bounds a quantity ("at least 5", "at most 1.70", "within 0.2") finds that bound
  in a comparison of the cell's source (">= 5", "<= 1.70", "< 0.2", ...).

Numbers that name things rather than measure them (GPT-2, Llama 3.1, ch07, fp16, d_k = 16 written
as a word like "2-layer") are skipped: a digit glued to a letter or to a hyphen after a letter.
``KNOWN`` lists the claims of chapters whose owners have not yet reworded them, with what is
wrong; a claim fixed must leave it (the test fails on a stale entry too).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import backmatter  # noqa: E402

# a number as prose writes it: 1,600  0.2  30%  4x  1e-5; not glued to a letter (GPT-2, ch07, x8)
NUMBER = re.compile(r"(?<![\w.\-/^_])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e-?\d+)?)(%|x\b)?"
                    r"(?![\w-])")
BOUND = re.compile(r"\b(at least|at most|more than|less than|fewer than|within|below|above|under)\s+"
                   r"(\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)(%)?")
# a number that a comparison, a margin or a tolerance uses: "< 0.2", "+ 0.3", "5 *", "a tolerance of 1e-5"
COMPARE = re.compile(r"(?:[<>]=?|[+\-*]|=)\s*(\d[\d_]*(?:\.\d+)?(?:e-?\d+)?)"
                     r"|(\d[\d_]*(?:\.\d+)?(?:e-?\d+)?)(?=\s*(?:\*|[<>]=?))")
# a number that names a model or a part of the book: Llama 3.1, Gemma 3, chapter 4
NAMED = re.compile(r"(?:Llama|Gemma|Qwen|Mistral|Mixtral|Phi|GPT|chapter|Chapter|section|Section)[\s-]*$")

# claim name -> why it is listed (claims whose text lives in a chapter not reworded yet)
KNOWN: dict[str, str] = {}


def _values(token: str, suffix: str | None) -> set[float]:
    """The values a prose number may be written as in code: 30% as 30 or 0.3, 1,600 as 1600."""
    value = float(token.replace(",", ""))
    return {value, value / 100} if suffix == "%" else {value}


def _cell_text(cell: dict) -> str:
    text = "".join(cell.get("source", ""))
    for out in cell.get("outputs", []):
        text += "\n" + "".join(out.get("text", ""))
        text += "\n" + "".join(out.get("data", {}).get("text/plain", ""))
    return text


def _numbers_in(text: str) -> set[float]:
    return {float(n.replace("_", "")) for n in re.findall(r"\d[\d_]*(?:\.\d+)?(?:e-?\d+)?", text)}


def _close(values: set[float], have: set[float]) -> bool:
    return any(abs(v - h) <= 1e-9 * max(1.0, abs(v)) for v in values for h in have)


def _tagged_cells():
    for path in backmatter.chapters(ROOT / "book"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            for tag in cell.get("metadata", {}).get("tags", []):
                if tag.startswith("claim-"):
                    found = backmatter.claims({"cells": [cell]}, path.stem)
                    yield path.stem, tag, found[0].text, cell


CLAIMS = list(_tagged_cells())


def problems(text: str, cell: dict) -> list[str]:
    """What in claim ``text`` its ``cell`` does not back: numbers it never writes, bounds it never
    compares against."""
    body = _cell_text(cell)
    have = _numbers_in(body)
    out = []
    for m in NUMBER.finditer(text):
        if NAMED.search(text[:m.start()]):
            continue
        if not _close(_values(m[1], m[2]), have):
            out.append(f"the number {m[0]} is not in the cell")
    source = "".join(cell.get("source", ""))
    code = "\n".join(line.split("#")[0] for line in source.splitlines())   # not comments
    compared = {float((a or b).replace("_", "")) for a, b in COMPARE.findall(code)}
    for m in BOUND.finditer(text):
        if not _close(_values(m[2], m[3]), compared):
            out.append(f"'{m[0]}' is a bound no comparison of the cell uses")
    return out


def test_the_claims_of_the_book_were_found():
    assert len(CLAIMS) > 40
    names = [name for _, name, _, _ in CLAIMS]
    assert len(names) == len(set(names)), "two cells carry the same claim tag"


@pytest.mark.parametrize("chapter, name, text, cell", CLAIMS, ids=[c[1] for c in CLAIMS])
def test_claim_numbers_and_bounds_match_its_cell(chapter, name, text, cell):
    found = problems(text, cell)
    if name in KNOWN:
        assert found, f"{name} now matches its cell: remove it from KNOWN"
        pytest.xfail(f"{name}: {KNOWN[name]}")
    assert not found, f"{chapter} {name}: {found}\n  claim: {text}"


def test_known_entries_name_real_claims():
    names = {name for _, name, _, _ in CLAIMS}
    assert set(KNOWN) <= names, set(KNOWN) - names


@pytest.mark.parametrize("text, source, bad", [
    ("Read at 8x its length, the loss rises.", "assert beyond[4] > inside[4] + 0.3", ["8x"]),
    ("It reaches at most 1.70 nats.", "assert val <= 1.70", []),
    ("It answers at least 30% exactly.", "assert exact >= 0.3", []),
    ("It answers at least 40% exactly.", "assert exact >= 0.3  # 40 in a comment", ["at least 40"]),
    ("A budget of 1,600 steps.", "steps = 1_600", []),
    ("GPT-2 and Llama 3.1 agree.", "assert True", []),
])
def test_the_rules_on_examples(text, source, bad):
    found = problems(text, {"source": source, "outputs": []})
    assert len(found) == len(bad) and all(b in f for b, f in zip(bad, found)), found
