"""companion.course (python -m companion course): a student edition has no solution code and still executes top
to bottom; slides come from the cells tagged for them."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_runner import execute_notebook

ROOT = Path(__file__).resolve().parent.parent
from companion import course


def _code(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_student_edition_replaces_every_solution_with_a_stub():
    nb = {"cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "```{exercise} X [1]\n:label: ex-x\n```"},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": "````{solution-start} ex-x\n````\nSecret prose"},
        {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout",
                                                                      "text": "42\n"}], "execution_count": 1,
         "source": "def f(x):\n    return x + 1  # SECRET\n\nreport = check('ch01.f', f, seed=0)"},
        {"cell_type": "markdown", "id": "d", "metadata": {}, "source": "````{solution-end}\n````"},
        {"cell_type": "markdown", "id": "e", "metadata": {}, "source": "after"},
    ]}
    out, n = course.student_edition(nb)
    assert n == 1
    text = json.dumps(out)
    assert "SECRET" not in text and "Secret prose" not in text and "42" not in text
    assert [c["id"] for c in out["cells"]] == ["a", "b-student", "b-stub", "e"]
    stub = "".join(out["cells"][2]["source"])
    ns: dict = {"check": lambda name, fn, seed=None: fn(1)}
    exec(stub, ns)  # the stub reports instead of raising
    with pytest.raises(NotImplementedError, match="ex-x: not done yet"):
        ns["f"](1)


def test_parse_chapters_rejects_unknown_chapters():
    available = {1: Path("ch01.ipynb"), 3: Path("ch03.ipynb")}
    assert course.parse_chapters("1,3", available) == [Path("ch01.ipynb"), Path("ch03.ipynb")]
    with pytest.raises(ValueError, match="chapters must exist"):
        course.parse_chapters("2", available)
    with pytest.raises(ValueError, match="chapters must be numbers"):
        course.parse_chapters("one", available)


def test_help_explains_every_option():
    r = subprocess.run([sys.executable, "-m", "companion", "course", "--help"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0
    parser_options = ["--chapters", "--out", "--student", "--instructor", "--title", "--no-outputs", "--force", "--book",
                      "--slides", "--reveal-prefix"]
    for opt in parser_options:
        line = next(l for l in r.stdout.splitlines() if l.strip().startswith(opt))
        assert len(line.split(maxsplit=2)) >= 2, f"{opt} has no help text"


@pytest.mark.slow
def test_student_edition_of_two_chapters_executes_top_to_bottom(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    chapters = sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb"))[:2]
    numbers = ",".join(str(int(p.name[2:4])) for p in chapters)
    assert course.main(["--chapters", numbers, "--student", "--out", str(tmp_path / "course")]) == 0
    env = {**os.environ, "COMPANION_PROFILE": "quick", "COMPANION_PROGRESS": "0"}
    for path in sorted((tmp_path / "course" / "book").glob("ch*.ipynb")):
        source = json.loads(next(p for p in chapters if p.name == path.name).read_text())
        nb = nbformat.read(path, as_version=4)
        student = {l.strip() for l in _code(nb).splitlines()}
        # Every substantial line of solution code is gone, except the signatures the stubs keep on
        # purpose and lines that also occur outside the solutions (a shared import, say).
        secret = {l.strip() for l in _code(_solutions_only(source)).splitlines()
                  if len(l.strip()) > 20 and not l.strip().startswith(("def ", "class "))}
        leaked = (secret & student) - solution_lines_outside(source)
        assert not leaked, f"{path.name}: solution code in the student edition: {sorted(leaked)[:3]}"
        executed = tmp_path / f"executed-{path.name}"
        status, err = execute_notebook(path, executed, env)
        assert status == 0, f"{path.name} (student edition) fails:\n{err[-4000:]}"
        nb = nbformat.read(executed, as_version=4)
        stubs = [c for c in nb.cells if c.get("id", "").endswith("-stub")]
        assert stubs, "no stubs in the student edition"
        printed = "".join(o.get("text", "") for c in stubs for o in c.outputs)
        assert printed.count("not done yet") >= len(stubs)


def _solutions_only(nb: dict) -> dict:
    cells, inside = [], False
    for c in nb["cells"]:
        text = "".join(c["source"])
        if c["cell_type"] == "markdown" and "{solution-start}" in text:
            inside = True
        elif c["cell_type"] == "markdown" and "{solution-end}" in text:
            inside = False
        elif inside:
            cells.append(c)
    return {"cells": cells}


def solution_lines_outside(nb: dict) -> set[str]:
    """Code lines that also occur outside the solutions (a shared import, say): allowed in the stub."""
    inside = {id(c) for c in _solutions_only(nb)["cells"]}
    return {l.strip() for c in nb["cells"] if c["cell_type"] == "code" and id(c) not in inside
            for l in "".join(c["source"]).splitlines()}


def test_myst_markup_becomes_plain_markdown_for_slides():
    md = ("(sec-x)=\n## Masks {cite}`vaswani2017attention,shazeer2019fast`\n\nSee {numref}`fig-a` and "
          "{ref}`the masks <sec-masks>`.\n\n$$\na = b\n$$ (eq-ab)\n\n```{admonition} Learning objectives\n"
          ":class: tip\n- one\n```\n\n```{glue:figure} fig-a\n:name: fig-a\nA caption\n```\nafter")
    out = course.myst_to_markdown(md)
    assert out == ("## Masks [vaswani2017attention, shazeer2019fast]\n\nSee the figure and the masks.\n\n"
                   "$$\na = b\n$$\n\n**Learning objectives**\n\n- one\n\nafter")


def test_slides_keep_only_tagged_cells_and_hide_code_unless_asked():
    def cell(kind, text, *tags):
        c = {"cell_type": kind, "id": text[:8], "metadata": {"tags": list(tags)}, "source": text}
        return c | ({"outputs": [], "execution_count": None} if kind == "code" else {})

    nb = {"cells": [cell("markdown", "# Title", "slide"), cell("code", "x = 1"), cell("code", "plot()", "slide"),
                    cell("code", "shown()", "slide-continue", "slide-code")], "metadata": {}, "nbformat": 4,
          "nbformat_minor": 5}
    deck = course.slides_notebook(nb)["cells"]
    assert [c["source"] for c in deck] == ["# Title", "plot()", "shown()"]
    assert [c["metadata"]["slideshow"]["slide_type"] for c in deck] == ["slide", "slide", "-"]
    assert deck[1]["metadata"]["transient"] == {"remove_source": True} and "transient" not in deck[2]["metadata"]
    with pytest.raises(ValueError, match="has no cells tagged 'slide'"):
        course.slides_notebook({"cells": [cell("code", "x = 1")]})
    with pytest.raises(ValueError, match="must be tagged 'slide'"):
        course.slides_notebook({"cells": [cell("code", "x = 1", "slide-continue")]})


def test_every_chapter_has_slides_and_exports_a_deck(tmp_path):
    pytest.importorskip("nbconvert")
    chapters = sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb"))
    for path in chapters:
        nb = json.loads(path.read_text())
        assert len(course.slides_notebook(nb)["cells"]) >= 3, f"{path.name}: tag its cells for slides"
    first = chapters[0]
    assert course.main(["--chapters", str(int(first.name[2:4])), "--slides", "--out", str(tmp_path / "c"),
                        "--book", str(ROOT)]) == 0
    html = (tmp_path / "c" / "slides" / f"{first.stem}.slides.html").read_text()
    tagged = course.slides_notebook(json.loads(first.read_text()))["cells"]
    assert html.count('<section>') - html.count('<section>\n<section>') >= sum(
        c["metadata"]["slideshow"]["slide_type"] == "slide" for c in tagged) - 1
    assert "```{" not in html and "{cite}`" not in html  # no raw MyST on a slide
    assert "image/png" in html or "data:image/png" in html  # the figures' outputs


_EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[ \t]*(?P<title>[^\n]*)\n(?P<body>.*?)^\1[ \t]*$", re.M | re.S)


def _exercises(nb: dict) -> list[tuple[str, str]]:
    """(title, text) of every {exercise} block of the notebook's Markdown cells, in order."""
    return [(m.group("title").strip(), m.group("body").strip()) for c in nb["cells"] if c["cell_type"] == "markdown"
            for m in _EXERCISE.finditer("".join(c["source"]))]


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("ch[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_student_edition_keeps_every_exercise_statement(path):
    instructor = json.loads(path.read_text())
    student, _ = course.student_edition(instructor)
    expected = _exercises(instructor)
    assert expected, f"{path.name} has no exercises"
    assert _exercises(student) == expected


def test_text_sharing_a_cell_with_a_solution_fence_is_kept():
    nb = {"cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {},
         "source": "```{exercise} A [1]\n:label: ex-a\nDo A.\n```\n\n````{solution-start} ex-a\n````\nSecret A"},
        {"cell_type": "code", "id": "b", "metadata": {}, "outputs": [], "execution_count": None, "source": "x = 1"},
        {"cell_type": "markdown", "id": "c", "metadata": {},
         "source": "````{solution-end}\n````\n\n```{exercise} B [1]\n:label: ex-b\nDo B.\n```\n\n"
                   "````{solution-start} ex-b\n````\nSecret B"},
        {"cell_type": "markdown", "id": "d", "metadata": {}, "source": "````{solution-end}\n````\nafter"},
    ]}
    out, n = course.student_edition(nb)
    assert n == 2
    text = json.dumps(out)
    assert "Secret" not in text and "x = 1" not in text
    assert [title for title, _ in _exercises(out)] == ["A [1]", "B [1]"]
    assert [c["id"] for c in out["cells"]] == ["a-before", "a-student", "a-stub", "c-after-before", "c-after-student",
                                               "c-after-stub", "d-after"]


def test_parse_chapters_refuses_a_backwards_range():
    available = {1: Path("ch01.ipynb"), 2: Path("ch02.ipynb"), 3: Path("ch03.ipynb")}
    with pytest.raises(ValueError, match="a range must run from the lower number to the higher"):
        course.parse_chapters("3-1", available)
    r = subprocess.run([sys.executable, "-m", "companion", "course", "--chapters", "3-1", "--out", "unused"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "3-1" in r.stderr


def test_out_naming_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        course.main(["--chapters", "1", "--out", str(target)])
    assert exit_info.value.code == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_course_readme_installs_from_the_repository(tmp_path):
    assert course.main(["--chapters", "1", "--out", str(tmp_path / "c")]) == 0
    readme = (tmp_path / "c" / "README.md").read_text()
    assert "pip install companion`" not in readme and "pip install companion\n" not in readme
    assert f"git+{course.REPOSITORY}" in readme


# --- issue 40: a course never overwrites the book, nor a student's edits ------------------------------


def small_book(root: Path) -> Path:
    """A book root with two one-exercise chapters and a _config.yml: enough for course.main."""
    (root / "book").mkdir(parents=True)
    (root / "_config.yml").write_text("title: A small book\n")
    (root / "book" / "intro.md").write_text("# A small book\n")
    for n in (1, 2):
        nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "markdown", "id": "t", "metadata": {}, "source": f"# Chapter {n}"},
            {"cell_type": "markdown", "id": "s", "metadata": {}, "source": "````{solution-start} ex-a\n````"},
            {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [], "execution_count": None,
             "source": "def f(x):\n    return x  # SOLUTION"},
            {"cell_type": "markdown", "id": "e", "metadata": {}, "source": "````{solution-end}\n````"}]}
        (root / "book" / f"ch0{n}_small.ipynb").write_text(json.dumps(nb))
    return root


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_naming_the_book_root_or_its_sources_is_refused_by_any_spelling(tmp_path, capsys, monkeypatch):
    root = small_book(tmp_path / "root")
    (tmp_path / "link").symlink_to(root)
    before = tree(tmp_path)
    for out, rule in [(root, "is the book's root"), (root / "book" / "..", "is the book's root"),
                      (tmp_path / "link", "is the book's root"), (Path("."), "is the book's root"),
                      (Path("book"), f"is inside the book's source folder {root / 'book'}"),
                      (root / "book" / "course", "is inside the book's source folder")]:
        monkeypatch.chdir(root)
        with pytest.raises(SystemExit) as exit_info:
            course.main(["--chapters", "1", "--student", "--force", "--book", str(root), "--out", str(out)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"--out {out} {rule}" in err, (out, err)
        assert tree(tmp_path) == before  # nothing written


def test_force_keeps_a_notebook_edited_since_the_cut_and_removes_only_unedited_files(tmp_path, capsys):
    root = small_book(tmp_path / "root")
    out = tmp_path / "course"
    cut = ["--student", "--book", str(root), "--out", str(out)]
    assert course.main(["--chapters", "1-2", *cut]) == 0
    mine = out / "book" / "ch01_small.ipynb"
    edited = mine.read_text().replace("not done yet", "my answer")
    mine.write_text(edited)
    capsys.readouterr()
    assert course.main(["--chapters", "1-2", *cut, "--force"]) == 0
    err_out = capsys.readouterr().out
    assert (f"course: --force kept 1 file(s) edited since they were written (or not written by a course cut) in "
            f"{out / 'previous-1'}: book/ch01_small.ipynb") in err_out
    assert (out / "previous-1" / "book" / "ch01_small.ipynb").read_text() == edited
    assert "SOLUTION" not in mine.read_text() and mine.read_text() != edited
    # a cut of chapter 2 alone: chapter 1, unedited this time, goes (it is not in the new _toc); nothing else kept
    assert course.main(["--chapters", "2", *cut, "--force"]) == 0
    assert not mine.exists() and not (out / "previous-2").exists()
    assert (out / "book" / "ch02_small.ipynb").is_file()


# Issue 40, item 15: a cut course builds offline with maths and widgets, and with 0 warnings.


def _vendored_in_book() -> bool:
    return (ROOT / "_vendor" / "site" / "vendor" / "mathjax" / "tex-chtml.js").is_file()


@pytest.mark.skipif(not _vendored_in_book(), reason="the book's _vendor/ is made by `make book` / `make test` "
                                                      "(tools/vendor_assets.py, network once)")
def test_a_cut_course_holds_everything_its_config_loads(tmp_path):
    import yaml

    out = tmp_path / "course"
    assert course.main(["--chapters", "1", "--student", "--out", str(out)]) == 0
    config = yaml.safe_load((out / "_config.yml").read_text())
    sphinx = config["sphinx"]
    for name, folder in sphinx["local_extensions"].items():  # chapterpage was missing: the build failed
        assert (out / folder / f"{name}.py").is_file(), name
    assert (out / "book" / "chapter_times.json").is_file()  # what chapterpage reads
    (extra,) = sphinx["config"]["html_extra_path"]
    static = Path("_static")  # mathjax_path and the widget scripts are relative to the HTML's _static/
    for script in [sphinx["config"]["mathjax_path"], *sphinx["config"]["nb_ipywidgets_js"]]:
        in_html = os.path.normpath(static / script)  # e.g. vendor/mathjax/tex-chtml.js
        assert (out / extra / in_html).is_file(), script
    assert "_vendor" in config["exclude_patterns"]


def test_references_to_pages_left_out_become_plain_text():
    pages = {"ch01_a": "(ch-a)=\n# Attention\n\nSee {ref}`Chapter 2 <ch-b>`, {ref}`ch-b`, {eq}`eq-b`, "
                       "{numref}`Figure %s <fig-b>`, {doc}`ch02_b`, {ref}`the glossary <glossary>`, "
                       "{ref}`ch-a`, {eq}`eq-a` and {ref}`unknown`.\n\n$$ x $$ (eq-a)\n"}
    book = {**pages, "ch02_b": "(ch-b)=\n# Positions\n\n$$ y $$ (eq-b)\n\n```{figure} f.png\n:name: fig-b\n```\n",
            "glossary": "(glossary)=\n# Glossary\n"}
    plain = course.plain_references(pages, book)
    card = ":::{grid-item-card} Start\n:link: %s\n:link-type: %s\nText\n:::\n"
    assert plain(card % ("ch-b", "ref")) == ":::{grid-item-card} Start\nText\n:::\n"  # unlinked, kept
    assert plain(card % ("ch02_b", "doc")) == ":::{grid-item-card} Start\nText\n:::\n"
    assert plain(card % ("ch-a", "ref")) == card % ("ch-a", "ref")
    assert plain(pages["ch01_a"]) == (
        "(ch-a)=\n# Attention\n\nSee Chapter 2, Positions, an equation of Positions, a figure of Positions, Positions, the "
        "glossary, {ref}`ch-a`, {eq}`eq-a` and {ref}`unknown`.\n\n$$ x $$ (eq-a)\n")


def test_a_cut_chapter_refers_only_to_what_the_cut_holds(tmp_path):
    out = tmp_path / "course"
    (ROOT / "_vendor").exists() or pytest.skip("needs the book's _vendor/ (make book)")
    assert course.main(["--chapters", "1,13", "--out", str(out)]) == 0
    pages = {p.stem: course._page_text(p) for p in (out / "book").iterdir() if p.suffix in (".md", ".ipynb")}
    defined = {label for text in pages.values() for label in course.page_labels(text)}
    book = {p.stem: course._page_text(p) for p in (ROOT / "book").iterdir() if p.suffix in (".md", ".ipynb")}
    everywhere = {label for text in book.values() for label in course.page_labels(text)}
    for name, text in pages.items():
        for m in course._XREF.finditer(text):
            explicit = course._EXPLICIT.match(m.group("text"))
            target = (explicit.group("target") if explicit else m.group("text")).strip()
            if m.group("role") == "doc":
                assert Path(target).name in pages, (name, m.group(0))
            elif target in everywhere:
                assert target in defined, (name, m.group(0))
        for m in course._CARD_LINK.finditer(text):  # intro.md's "Start reading" card linked ch-attention
            target = m.group("target")
            assert (Path(target).name in pages) if m.group("kind") == "doc" else (target in defined), m.group(0)
    assert "Chapter 2 is about" in pages["ch01_attention"]  # was {ref}`Chapter 2 <ch-positions>`
    assert "{doc}`1 <ch01_attention>`" in pages["ch13_capstone"]  # in the cut: kept
    assert "{doc}`ch04_gpt`" not in pages["ch13_capstone"] and "{doc}`2 <ch02_positions>`" not in \
        pages["ch13_capstone"]


def test_vendored_assets_that_cannot_be_made_refuse_the_cut(tmp_path, capsys):
    book = tmp_path / "book_root"
    (book / "tools").mkdir(parents=True)
    (book / "tools" / "vendor_assets.py").write_text("import sys\ndef main(root):\n    sys.exit('no network')\n")
    (book / "_config.yml").write_text("sphinx:\n  config:\n    html_extra_path: [_vendor/site]\n")
    import argparse

    with pytest.raises(SystemExit):
        course._vendored(book, argparse.ArgumentParser(prog="course"))
    err = capsys.readouterr().err
    assert "the course needs the book's MathJax and widget JavaScript in" in err and "no network" in err
