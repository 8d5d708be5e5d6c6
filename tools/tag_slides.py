"""Give a chapter a first set of slide tags, for ``python -m companion course --slides``.

    python tools/tag_slides.py book/ch04_gpt.ipynb ...   # only chapters with no slide tags yet

The starting deck: the title cell, each section's opening cell (a Markdown cell that starts with
``## ``, except the exercises), each cell that makes a numbered figure (``glue_figure("fig-...`` or mystnb figure metadata)
and the summary each start a slide. Authors then adjust the tags by hand (``slide``,
``slide-continue``, ``slide-code``; companion/course.py explains them); a chapter that already has
slide tags is left alone, so hand edits survive.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TAGS = ("slide", "slide-continue")


def starts_a_slide(cell: dict, index: int) -> bool:
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    if cell["cell_type"] == "markdown":
        return index == 0 or (text.startswith("## ") and not text.startswith("## Exercises"))
    return 'glue_figure("fig-' in text or "figure" in cell.get("metadata", {}).get("mystnb", {})


def tag(path: Path) -> int:
    nb = json.loads(path.read_text())
    if any(t in c.get("metadata", {}).get("tags", []) for c in nb["cells"] for t in TAGS):
        return 0
    n = 0
    for i, cell in enumerate(nb["cells"]):
        if starts_a_slide(cell, i):
            cell.setdefault("metadata", {}).setdefault("tags", []).append("slide")
            n += 1
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return n


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {tag(Path(name))} cells tagged 'slide'")
