"""Every literal atol / rtol below 1e-4 in tests/ and in the chapters' code cells cites its derivation
(issue 36): a fixed tiny tolerance between two computations holds on one CPU's rounding and fails on
another's (1.53e-5 against 1e-5 on an Intel Xeon). A literal passes when its line calls a function of
tests/tolerances.py, or carries a comment that names its derivation: the word "tolerances" (the module,
or the derivation written out), "derived", "bound", "ulp" or "float64". Zero (an exact claim) passes.

A chapter derives its tolerances with ``companion.tolerance`` (``float64_twin_atol``, ``gamma``, ...), which
tests/tolerances.py re-exports. ``NOTEBOOK_ALLOWED`` (cells by id, with why) and ``TESTS_ALLOWED`` (test files,
with a count) would list literals not derived yet; an entry that no longer matches fails, so the lists only
shrink. Both are empty: every literal in tests/ and in the chapters is derived (the last 15 chapter cells in
the round after issue 36)."""

import ast
import json
import re
from pathlib import Path

import pytest

import tolerances

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 1e-4
LITERAL = re.compile(r"\b(atol|rtol)\s*=\s*(\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?)")
CITES = re.compile(r"#.*\b(tolerances|derived|derivation|bound|ulps?|float64)\b", re.IGNORECASE)
NAMES = [n for n in dir(tolerances) if not n.startswith("_") and callable(getattr(tolerances, n))
         and getattr(getattr(tolerances, n), "__module__", "") in ("tolerances", "companion.tolerance")]

# (notebook, cell id) -> why it is allowed for now; keyed by the cell's id (stable when cells are added or
# removed around it). Empty: every chapter cell derives its tolerance.
NOTEBOOK_ALLOWED: dict[tuple[str, str], str] = {}

# tests/ files whose literals are not derived yet: file -> (how many, why); a count above what is found fails
# too, so that the list only shrinks. Empty since issue 36: every tests/ literal below 1e-4 cites its derivation.
TESTS_ALLOWED: dict[str, tuple[int, str]] = {}


def _offending(line: str) -> list[str]:
    """The literal tolerances below LIMIT (and above 0) on ``line`` that it does not cite a derivation for."""
    found = [m.group(0) for m in LITERAL.finditer(line) if 0 < float(m.group(2).replace("_", "")) < LIMIT]
    if not found or CITES.search(line) or any(re.search(rf"\b{n}\(", line) for n in NAMES):
        return []
    return found


def _test_files():
    here = Path(__file__).name
    return sorted(p for p in (ROOT / "tests").rglob("*.py") if p.name not in (here, "tolerances.py"))


def _notebook_cells():
    for nb in sorted((ROOT / "book").glob("*.ipynb")):
        cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        for i, cell in enumerate(cells):
            yield nb.name, cell.get("id", str(i)), "".join(cell["source"])


def test_the_scan_sees_what_it_should():
    assert NAMES and {"reduction_atol", "float32_paths_atol"} <= set(NAMES)
    # tolerances: the next two lines feed the scan strings, they compare nothing
    assert _offending("torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)") == [  # tolerances: an example
        "atol=1e-5", "rtol=1e-5"]  # tolerances: the example's two literals
    assert _offending("assert torch.allclose(a, b, atol=1e-6)") == ["atol=1e-6"]  # tolerances: an example
    assert _offending("close(a, b, atol=2e-3, rtol=0)") == []  # not tiny, and exact
    assert _offending("close(a, b, atol=1e-6)  # tolerances: 2 gamma_16 |x|, derived in the docstring") == []
    assert _offending("close(a, b, atol=reduction_atol(16, 3.0), rtol=0)") == []
    assert _offending("close(a, b, atol=1e-6)  # float32, logits of size ~1") == ["atol=1e-6"]  # tolerances: an example, no derivation
    ast.parse("\n".join(c for _, _, c in _notebook_cells() if not c.lstrip().startswith(("%", "!"))) or "pass")


def test_literal_tolerances_in_tests_cite_their_derivation():
    found: dict[str, list[str]] = {}
    for path in _test_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _offending(line):
                found.setdefault(path.name, []).append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    bad = [x for name, hits in found.items() if len(hits) > TESTS_ALLOWED.get(name, (0,))[0] for x in hits]
    assert not bad, "literal tolerances below 1e-4 without a derivation (tests/tolerances.py):\n" + "\n".join(bad)
    stale = {name: (n, len(found.get(name, ()))) for name, (n, _) in TESTS_ALLOWED.items() if len(found.get(name, ())) < n}
    assert not stale, f"TESTS_ALLOWED counts above what is found (lower them): {stale}"


def test_literal_tolerances_in_chapters_cite_their_derivation_or_are_listed():
    bad, seen = [], set()
    for name, cell_id, source in _notebook_cells():
        found = [x for line in source.splitlines() for x in _offending(line)]
        if found:
            seen.add((name, cell_id))
            if (name, cell_id) not in NOTEBOOK_ALLOWED:
                bad.append(f"{name} cell {cell_id!r}: {found}")
    assert not bad, "chapter cells with literal tolerances below 1e-4 and no derivation:\n" + "\n".join(bad)
    stale = sorted(set(NOTEBOOK_ALLOWED) - seen)
    assert not stale, f"NOTEBOOK_ALLOWED entries that no longer match (remove them): {stale}"


@pytest.mark.parametrize("value,tiny", [("1e-5", True), ("0.00001", True), ("1e-4", False), ("0", False), ("5e-3", False)])
def test_values_below_the_limit(value, tiny):
    assert bool(_offending(f"f(atol={value})")) == tiny
