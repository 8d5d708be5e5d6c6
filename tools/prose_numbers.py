"""Numbers the prose quotes against the numbers the chapter prints (issue 44, item 2).

Every numeral in a chapter's markdown must be backed by the chapter itself: it occurs, as printed or as
its rounding, in the code or the stored outputs that the reader has already met when reading it (the
code cells before it, and those of its own ``##`` section, since a section may announce what it is about
to compute), or it is listed with its source in ``tests/prose_numbers/<chapter>.json`` (a cited paper's
figure, a real model's config, a record under experiments/). The list is reviewed like code: each entry
says where the number comes from, and an entry no longer used is reported.

"As its rounding": the prose's ``1.62`` is backed by a printed ``1.6213`` (half up or half even), never
the other way round, and ``40,960`` by ``40960``. What is not a quoted number is left out before the
search, each by a rule: references to chapters, sections, figures, equations, tables and exercises; the
chapter's own equation numbers in parentheses; years (1950-2039); citation keys and other MyST roles;
link targets and HTML; the exercise difficulty ``[1]``-``[3]``; a numbered list's item numbers; powers
of ten written in maths (``10^{-9}``: a magnitude). Code's digit separators (``20_000``) and LaTeX's
(``65{,}504``) are read as the numbers they write; the words "one" to "ten" are words, not
numerals, and are not searched.

``python tools/prose_numbers.py book/ch10_kv_cache.ipynb`` prints what it finds (``--prune`` first
removes the listed numbers a chapter no longer needs); tests/test_prose_numbers.py
runs it over every chapter.
"""

from __future__ import annotations

import json
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([-+]?\d+))?(?=x\b|(?!\w))")
SECTION = re.compile(r"^##\s", re.M)
REFERENCE_WORDS = (r"Chapters?|chapters?|Fig(?:ure|s)?\.?|figures?|Eqs?\.|eqs?\.|[Ee]quations?|Tables?|tables?|"
                   r"[Ss]ections?|§|Exercises?|exercises?|Parts?|part|[Ll]ines?|[Cc]ells?")
# Removed before numerals are searched: what looks like a number but quotes no result.
NOT_QUOTES = [
    re.compile(r"\{[\w:-]+\}`[^`]*`"),                      # MyST roles: {cite}, {numref}, {eq}, {doc} ...
    re.compile(r"^\([\w-]+\)=\s*$", re.M),                  # MyST targets
    re.compile(r"https?://\S+"),
    re.compile(r"\]\([^)]*\)"),                             # link targets
    re.compile(r"<[^>]+>"),                                 # HTML tags and their attributes
    re.compile(r"^(?:`{3,}|:{3,})\{[^}]*\}.*$", re.M),      # directive lines
    re.compile(r"^:[\w-]+:.*$", re.M),                      # directive options
    re.compile(rf"(?:{REFERENCE_WORDS})\s+\d+(?:\.\d+)*(?:\s*(?:,|and|or|to|-|–)\s*\d+(?:\.\d+)*)*"),
    re.compile(r"\b(?:19[5-9]\d|20[0-3]\d)[a-z]?\b"),       # years
    re.compile(r"\[[1-3]\]\s*$", re.M),                     # an exercise's difficulty
    re.compile(r"^\s*\d+[.)]\s", re.M),                       # a numbered list's item numbers
    re.compile(r"\b10\^\{?[-−]?\d*\}?"),                      # a power of ten in maths: a magnitude, not a result
]


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value if isinstance(value, str) else json.dumps(value))


def _outputs(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(_text(out["text"]))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/") or mime.endswith("json"):
                parts.append(_text(value))
    # A figure inlined in HTML prints no number (its image/png is not read either): a figure's <picture>
    # (companion.notebook.phone_figures) as a whole, a frame player's images (base64 holds digits by
    # chance, which backed prose numbers no output printed), character references (&#x27; is ').
    return re.sub(r'<picture class="companion-figure">.*?</picture>|data:image/[a-z]+;base64,[A-Za-z0-9+/=]+'
                  r"|&#x?[0-9a-fA-F]+;", "", "\n".join(parts))


def _key(match: re.Match) -> tuple[str, str, str]:
    """(integer digits without commas, '.fraction' or '', exponent or '')."""
    return match.group(1).replace(",", ""), match.group(2) or "", str(int(match.group(3))) if match.group(3) else ""


def numbers(text: str) -> set[tuple[str, str, str]]:
    """The numerals of code or output text; Python's digit separators (``20_000``) read as one number."""
    return {_key(m) for m in NUMBER.finditer(re.sub(r"(?<=\d)_(?=\d)", "", text))}


def backed(quoted: tuple[str, str, str], printed: set[tuple[str, str, str]]) -> bool:
    """The quoted number occurs as printed, or is a rounding of a printed number with more decimals."""
    if quoted in printed:
        return True
    digits, frac, exp = quoted
    places = len(frac) - 1 if frac else 0
    value, step = Decimal(digits + frac), Decimal(1).scaleb(-places)
    for p_digits, p_frac, p_exp in printed:
        if p_exp != exp or len(p_frac) - 1 <= places:
            continue
        full = Decimal(p_digits + p_frac)
        if value in (full.quantize(step, ROUND_HALF_UP), full.quantize(step, ROUND_HALF_EVEN)):
            return True
    return False


def prose(text: str) -> str:
    text = text.replace("{,}", ",")  # LaTeX's thousands separator: $65{,}504$ is 65,504
    for rule in NOT_QUOTES:
        text = rule.sub(" ", text)
    return text


def quoted_numbers(cells: list[dict]) -> list[tuple[int, str, int]]:
    """(cell index, the number as written, section index) for every numeral the markdown quotes; a
    markdown cell that opens a ``##`` section part-way belongs, from there on, to the new section."""
    section, out = 0, []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        text, start = _text(cell.get("source", "")), 0
        cuts = [m.start() for m in SECTION.finditer(text)] + [len(text)]
        for cut in cuts:
            for m in NUMBER.finditer(prose(text[start:cut])):
                out.append((i, m.group(0), section))
            if cut < len(text):
                section += 1
            start = cut
    return out


def section_of_cells(cells: list[dict]) -> list[int]:
    """The ``##`` section each cell ends in (a cell that opens one belongs to it)."""
    section, out = 0, []
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            section += len(SECTION.findall(_text(cell.get("source", ""))))
        out.append(section)
    return out


def unbacked(cells: list[dict]) -> list[tuple[int, str]]:
    """Quoted numbers neither printed nor written in the code the reader has met by then."""
    sections = section_of_cells(cells)
    per_cell = [numbers(_text(c.get("source", ""))) | numbers(_outputs(c)) if c.get("cell_type") == "code" else set()
                for c in cells]
    out = []
    for i, written, section in quoted_numbers(cells):
        seen = set()
        for j, found in enumerate(per_cell):
            if j < i or sections[j] == section:
                seen |= found
        m = NUMBER.fullmatch(written)
        if not backed(_key(m), seen):
            out.append((i, written))
    return out


SOURCES = Path(__file__).resolve().parent.parent / "tests" / "prose_numbers"


def sources_path(notebook: Path) -> Path:
    """tests/prose_numbers/chNN.json for book/chNN_name.ipynb."""
    return SOURCES / f"{notebook.stem.split('_')[0]}.json"


def load_sources(notebook: Path) -> dict[str, str]:
    path = sources_path(notebook)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def problems(notebook: Path) -> list[str]:
    """What tests/test_prose_numbers.py reports for one chapter."""
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    sources = load_sources(Path(notebook))
    missing = unbacked(cells)
    out = [f"cell {i}: the prose quotes {n}, which the chapter does not print (nor its code write) by then, "
           f"and tests/prose_numbers/ gives no source" for i, n in missing if n not in sources]
    used = {n for _, n in missing}
    out += [f"tests/prose_numbers: {n!r} is listed but no longer needed" for n in sources if n not in used]
    out += [f"tests/prose_numbers: {n!r} has no source" for n, s in sources.items() if not str(s).strip()]
    return out


def prune(notebook: Path) -> list[str]:
    """Remove the listed numbers the chapter no longer needs from its sources file; return them."""
    path, sources = sources_path(notebook), load_sources(notebook)
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    used = {n for _, n in unbacked(cells)}
    stale = [n for n in sources if n not in used]
    if stale:
        kept = {n: s for n, s in sources.items() if n in used}
        path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return stale


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--prune":
        for path in argv[1:]:
            print(f"{path}: removed {prune(Path(path)) or 'nothing'}")
        return 0
    status = 0
    for path in argv:
        found = problems(Path(path))
        print(f"{path}: {len(found)} problem(s)")
        for p in found:
            print(f"  {p}")
        status |= bool(found)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
