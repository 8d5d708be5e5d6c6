"""tools/tag_cells.py keeps a chapter's plumbing off its page (issue 39, item 4): every chapter obeys the
rules, the script adds exactly what they want and nothing twice, and a planted chapter shows each rule."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import tag_cells  # noqa: E402

CHAPTERS = sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb"))
PENDING = tag_cells.PENDING  # tagged later: python tools/tag_cells.py book/<chapter>.ipynb, then off the list


def _cell(kind: str, source: str, tags: list[str] | None = None) -> dict:
    cell = {"cell_type": kind, "id": f"x{abs(hash(source)) % 10**6}", "metadata": {}, "source": source}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    if tags is not None:
        cell["metadata"]["tags"] = tags
    return cell


def planted() -> dict:
    """A chapter as an author writes it: every cell the rules touch, none tagged yet."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        _cell("markdown", "(ch-x)=\n# A chapter\n\nOpening.\n\n```{admonition} Learning objectives\n1. one\n```"),
        _cell("code", 'import subprocess, sys\nif "google.colab" in sys.modules:\n    pass\n'
                      "# (Written by tools/sync_bootstrap.py from one template: edit it there.)", ["hide-cell"]),
        _cell("markdown", "The next cell loads the companion package."),
        _cell("code", "import companion\nP = companion.profile()\nprint(P)", ["hide-input"]),
        _cell("markdown", "We use the plays of chapter 4."),
        _cell("code", "text = load()\nprint(len(text))"),
        _cell("markdown", "## First section\n\nThe next cell is prose after the first section and stays."),
        _cell("code", "fig, ax = plt.subplots()\nglue_figure('fig-x', fig)", ["remove-output", "slide"]),
        _cell("code", 'glue_figure("fig-y", diagram())', ["remove-output", "remove-input"]),
        _cell("code", 'record = root / "experiments" / "x.jsonl"\nprint(table(record))', ["claim-x"]),
        _cell("code", "assert within_record('gpt', 2.1)"),
        _cell("code", "x = 1 + 1\nassert x == 2"),
    ]}


def _tags(nb: dict) -> list[list[str]]:
    return [c["metadata"].get("tags", []) for c in nb["cells"]]


def test_each_rule_on_a_planted_chapter():
    nb = planted()
    assert len(tag_cells.violations(nb)) == 7
    assert tag_cells.apply(nb) == 7
    tags = _tags(nb)
    assert tags[0] == [] and tags[4] == [] and tags[6] == []          # title, prose, the first section
    assert tags[1] == ["remove-cell"]                                  # rule 1 (hide-cell replaced)
    assert tags[2] == ["remove-cell"]                                  # rule 3: "The next cell ..."
    assert tags[3] == []                                               # rule 2: the set-up cell shown
    assert tags[5] == ["remove-cell"]                                  # rule 3: code before the first section
    assert tags[7] == ["remove-output", "slide", "hide-input"]         # rule 4
    assert tags[8] == ["remove-output", "remove-input"]                # rule 4, already hidden: unchanged
    assert tags[9] == ["claim-x", "hide-input"] and tags[10] == ["hide-input"]  # rule 5, the claim tag kept
    assert tags[11] == []                                              # a check stays in view
    assert tag_cells.violations(nb) == []


def test_tagging_twice_changes_nothing(tmp_path):
    path = tmp_path / "ch99_x.ipynb"
    path.write_text(json.dumps(planted(), indent=1, ensure_ascii=False) + "\n")
    assert tag_cells.main([str(path)]) == 0
    once = path.read_text()
    assert tag_cells.main([str(path)]) == 0 and path.read_text() == once
    assert tag_cells.main(["--check", str(path)]) == 0


def test_check_names_the_cell_and_exits_1(tmp_path, capsys):
    path = tmp_path / "ch99_x.ipynb"
    path.write_text(json.dumps(planted(), indent=1) + "\n")
    before = path.read_text()
    assert tag_cells.main(["--check", str(path)]) == 1
    assert path.read_text() == before  # --check writes nothing
    out = capsys.readouterr().out
    assert "the set-up cell (rule 2): needs 'shown', has ['hide-input']" in out


def test_only_tags_change():
    nb = planted()
    tagged = copy.deepcopy(nb)
    tag_cells.apply(tagged)
    for a, b in zip(nb["cells"], tagged["cells"]):
        a["metadata"].pop("tags", None), b["metadata"].pop("tags", None)
    assert nb == tagged


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_obeys_the_rules(request, path):
    if path.stem in PENDING:
        request.applymarker(pytest.mark.xfail(strict=True, reason="not tagged yet: python tools/tag_cells.py "
                                              f"book/{path.name}, then take it off PENDING"))
    problems = tag_cells.violations(json.loads(path.read_text()))
    assert not problems, f"{path.name}: run python tools/tag_cells.py book/{path.name}\n" + "\n".join(problems)
