"""Tag a chapter's set-up, bookkeeping and plotting cells so the rendered page shows the chapter, not its plumbing.

    python tools/tag_cells.py book/ch01_attention.ipynb ...   # add the tags (idempotent)
    python tools/tag_cells.py --check book/ch*.ipynb          # exit 1, naming every cell that breaks a rule

Jupyter Book reads cell tags: ``remove-cell`` keeps a cell out of the page (it stays in the notebook,
runs there and under nbval), ``hide-input`` folds the code behind a "Show code cell source" toggle and
shows the output. Tags change no output, so a chapter is never re-executed for them. The rules (issue 39,
item 4: the first screen is the chapter's opening, objectives and its run time, nothing else):

1. **The Colab bootstrap cell** (written by tools/sync_bootstrap.py) is ``remove-cell``.
2. **The set-up cell**, the code cell that calls ``companion.profile()`` (imports, the profile and its
   grey ``profile=quick device=cpu seed=0`` line), is *shown*: no hiding tag (issue 49, item 3: the
   code on the page runs when copied into a fresh kernel, so the imports and ``P`` it uses are on the
   page; tests/test_page_code.py checks every chapter). It sits after the opening and the objectives,
   below the first screen, which the run-time line under the title now opens.
3. **Before the first section** (the first ``## `` heading), every other code cell is ``remove-cell``,
   and so is a Markdown cell that introduces the removed set-up ("The next cell ..."). The first
   cell (label, title, opening, objectives) and other prose stay.
4. **Figure code**: a code cell that draws a figure (calls ``glue_figure(`` or ``plt.subplots(``, or
   carries MyST-NB figure metadata) shows its figure, not its plotting code: ``hide-input`` unless it
   is already hidden or removed (``hide-input``, ``hide-cell``, ``remove-input`` or ``remove-cell``).
5. **Experiment bookkeeping**: a code cell that reads a recorded experiment (its source names the
   ``experiments`` folder or calls ``recorded_*(`` or ``within_record(``) is ``hide-input``: its
   printed table stays, the file handling folds away. (Not removed: such a cell can carry a
   ``claim-`` tag that the index of checked claims links to.)

A rule only adds tags (rule 2 only takes hiding tags away), and a tag it adds replaces the weaker ones it contradicts (``remove-cell``
replaces ``hide-cell``/``hide-input``/``remove-input``/``remove-output``); a cell already tagged as a
rule wants is left alone, so running it twice changes nothing. tests/test_cell_tags.py checks that
every chapter obeys the rules, so a new chapter cannot bring the plumbing back onto its first screen.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REMOVE = "remove-cell"
HIDE = "hide-input"
SHOW = "shown"  # not a tag: the cell carries none of HIDDEN
HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
BOOTSTRAP_MARK = "tools/sync_bootstrap.py"
# Chapters being edited when the rules came in (issue 39), to be tagged by running this script on them and
# then taken off this list: tests/test_cell_tags.py expects them to break the rules until then (strictly, so
# it says when one is tagged and still listed), and tools/check_layout.py reports their first screen
# without failing on it.
PENDING: set[str] = set()
FIGURE_CODE = re.compile(r"\bglue_figure\(|\bplt\.subplots\(")
BOOKKEEPING = re.compile(r"""["']experiments["']|\brecorded_\w*\(|\bwithin_record\(""")


def _source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def wanted(nb: dict) -> dict[int, tuple[str, str]]:
    """{cell index: (tag, the rule's reason)} for every cell a rule applies to."""
    out: dict[int, tuple[str, str]] = {}
    before_first_section = True
    for i, cell in enumerate(nb["cells"]):
        text = _source(cell)
        if cell["cell_type"] == "markdown":
            if re.search(r"^## ", text, re.M):
                before_first_section = False
            elif before_first_section and i > 0 and text.lstrip().startswith("The next cell"):
                out[i] = (REMOVE, "introduces the set-up cell (rule 3)")
            continue
        if cell["cell_type"] != "code":
            continue
        if "google.colab" in text and BOOTSTRAP_MARK in text:
            out[i] = (REMOVE, "the Colab bootstrap (rule 1)")
        elif "companion.profile()" in text:
            out[i] = (SHOW, "the set-up cell (rule 2)")
        elif before_first_section:
            out[i] = (REMOVE, "code before the first section (rule 3)")
        elif FIGURE_CODE.search(text) or "figure" in cell.get("metadata", {}).get("mystnb", {}):
            out[i] = (HIDE, "figure code (rule 4)")
        elif BOOKKEEPING.search(text):
            out[i] = (HIDE, "experiment bookkeeping (rule 5)")
    return out


def obeys(tags: list[str], tag: str) -> bool:
    if tag == SHOW:
        return not HIDDEN & set(tags)
    if tag == REMOVE:
        return REMOVE in tags
    return bool(HIDDEN & set(tags))


def violations(nb: dict) -> list[str]:
    return [f"cell {i} (id {nb['cells'][i].get('id', '?')}), {reason}: needs '{tag}', has {_tags(nb['cells'][i])}"
            for i, (tag, reason) in wanted(nb).items() if not obeys(_tags(nb["cells"][i]), tag)]


def apply(nb: dict) -> int:
    """Add the tags the rules want to ``nb`` in place; the number of cells changed."""
    changed = 0
    for i, (tag, _) in wanted(nb).items():
        cell = nb["cells"][i]
        tags = _tags(cell)
        if obeys(tags, tag):
            continue
        if tag == SHOW:
            cell.setdefault("metadata", {})["tags"] = [t for t in tags if t not in HIDDEN]
            changed += 1
            continue
        if tag == REMOVE:
            tags = [t for t in tags if t not in ("hide-cell", "hide-input", "remove-input", "remove-output")]
        cell.setdefault("metadata", {})["tags"] = tags + [tag]
        changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a cell breaks a rule")
    args = ap.parse_args(argv)
    bad = 0
    for path in args.notebooks:
        raw = path.read_text()
        nb = json.loads(raw)
        if args.check:
            for v in violations(nb):
                print(f"{path}: {v}")
                bad += 1
            continue
        n = apply(nb)
        if n:
            # The layout the notebooks are saved in (tools/execute_notebooks.py): indent 1, UTF-8.
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {n} cell(s) tagged")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
