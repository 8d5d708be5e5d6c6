"""A Sphinx extension (loaded by _config.yml's ``local_extensions``): what every chapter page opens and closes with.

Generated at build time from what the chapters hold, so nothing is typed by hand (issue 39):

- **The run-time line.** Right under the chapter's title (on the first screen at 1280 and at 400 px,
  where after the opening text and the objectives it sat 1.2 to 2.9 screens down) a one-line paragraph, ``Runs in about 15 s on a CPU (quick profile).``, from
  the measured time of the chapter in ``book/chapter_times.json`` (written by conftest.py after a full
  nbval run; tools/backmatter.py reads it for the instructor guide too). The file is a dependency of
  every chapter page, so a new measurement rebuilds them. A chapter with no measurement says the
  budget every chapter is held to (CONTRIBUTING.md: under 120 s). When ``book/chapter_times_gpu.json``
  (``benchmarks/chapters_gpu.py --times``, copied from a GPU run's results) holds the chapter, the line
  adds its time there with the device named: ``...; in under 2 min on an NVIDIA H200 (gpu profile).``
- **The core path.** When the chapter marks optional sections (a ``## Optional: ...`` heading tagged
  ``optional``; tools/core_path.py), the same line goes on with the core's estimated reading time:
  ``... (quick profile). Core path: about 55 min of reading, skipping the 3 sections marked Optional
  (...).`` Each optional section's HTML section gets the class ``optional-section`` (a marked left rule
  and a note under its title, _static/companion.css), so a reader sees where the core resumes.
- **The book's run time** for the landing page: the MyST substitution ``{{ book_run_time }}``
  (book/intro.md), the sum of the measured chapter times, with the range and the machine.
- **The exercise-difficulty legend.** A chapter's ``Exercises`` section opens with the legend of the
  ``[1]``/``[2]``/``[3]`` after each exercise title (chapter 1's wording), unless the chapter writes
  its own (a paragraph before the first exercise that says "difficulty").

tests/test_chapterpage.py checks each piece on a small document; tools/check_site.py checks the built
pages carry them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import core_path

TIMES = Path("book") / "chapter_times.json"
GPU_TIMES = Path("book") / "chapter_times_gpu.json"  # benchmarks/chapters_gpu.py --times, from a GPU run
RUNTIME_CLASS = "chapter-runtime"
LEGEND_CLASS = "exercise-legend"
OPTIONAL_CLASS = "optional-section"
OPTIONAL_NOTE = ("Optional: skip this section on a first reading; nothing in the core path after it "
                 "depends on it.")
BUDGET_S = 120  # CONTRIBUTING.md, "Budget"
LEGEND = ("Each exercise carries a difficulty in brackets after its title: 1 checks that you can apply the "
          "chapter, 2 asks for a short derivation or a function of your own, 3 is a longer derivation or an "
          "open experiment. Each has a worked solution; try first, then open it.")
CHAPTER = re.compile(r"(?:^|/)(ch\d\d_[\w-]+)$")


def load_times(path: Path) -> dict:
    """The measurement record, or {} when there is none (or it cannot be read)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec.get("seconds"), dict) else {}


def about_seconds(s: float) -> str:
    """A measured time as the text says it: to the nearest 5 s (at least 5 s), minutes from 2 min up."""
    if s >= 120:
        return f"about {round(s / 60)} min"
    return f"about {max(5, int(5 * round(s / 5)))} s"


def gpu_text(seconds: float, rec: dict) -> str:
    """The GPU half of the time line: the device named; a time measured with other chapters running
    beside it (``jobs`` > 1) is an upper bound, so it is said as one."""
    device = rec.get("device") or "a GPU"
    if not device.startswith("a "):  # "an NVIDIA H200", "an H100", "a Tesla T4": by the first word's sound
        word = device.split()[0]
        an = word[0] in ("AEFHILMNORSX" if word.isupper() else "AEIOUaeiou")
        device = f"{'an' if an else 'a'} {device}"
    if int(rec.get("jobs", 1)) > 1:
        bound = f"{math.ceil(seconds / 60)} min" if seconds >= 60 else f"{5 * math.ceil(seconds / 5)} s"
        return f"in under {bound} on {device} (gpu profile)"
    return f"{about_seconds(float(seconds))} on {device} (gpu profile)"


def runtime_text(docname: str, rec: dict, gpu: dict | None = None) -> str | None:
    """The time line of chapter ``docname`` (``book/ch01_attention``), or None for a page that is no chapter.
    ``rec``: the CPU record (``TIMES``); ``gpu``: the record benchmarks/chapters_gpu.py ``--times`` wrote
    (``GPU_TIMES``), whose chapters that passed add their GPU time."""
    m = CHAPTER.search(docname)
    if not m:
        return None
    name = m.group(1) + ".ipynb"
    seconds = rec.get("seconds", {}).get(name)
    cpu = (f"under {BUDGET_S // 60} min" if seconds is None else about_seconds(float(seconds)))
    on_gpu = None if (gpu or {}).get("dry_run") else (gpu or {}).get("seconds", {}).get(name)
    tail = f"; {gpu_text(float(on_gpu), gpu)}" if on_gpu is not None else ""
    return f"Runs in {cpu} on a CPU (quick profile){tail}."


def book_time_text(rec: dict) -> str:
    """The landing page's sentence on how long the whole book takes to run."""
    seconds = [float(s) for s in rec.get("seconds", {}).values()]
    if not seconds:
        return (f"Every chapter is held to under {BUDGET_S // 60} min on a two-core CPU in the quick profile; "
                "no full run has been measured yet.")
    total = sum(seconds)
    cores = rec.get("cores")
    where = f"a {cores}-core CPU" if cores else "a CPU"
    minutes = max(1, round(total / 60))
    detail = ", ".join(str(x) for x in (f"on an {rec['cpu']}" if rec.get("cpu") else "", rec.get("date")) if x)
    return (f"Run one after another on {where} in the quick profile, the {len(seconds)} chapters take about "
            f"{minutes} min in all, from {about_seconds(min(seconds))[6:]} to {about_seconds(max(seconds))[6:]} "
            f"a chapter" + (f" (measured {detail})." if detail else "."))


def _text(node) -> str:
    return node.astext() if node is not None else ""


def add_runtime(doctree, text: str) -> bool:
    """Put the time line right under the title of the page's top section; False when there is none
    or the line is there already."""
    from docutils import nodes

    top = next(iter(doctree.findall(nodes.section)), None)
    if top is None or any(RUNTIME_CLASS in p.get("classes", []) for p in top.findall(nodes.paragraph)):
        return False
    para = nodes.paragraph(text, text, classes=[RUNTIME_CLASS])
    title = top.next_node(nodes.title)
    at = top.index(title) + 1 if title is not None and title.parent is top else 0
    top.insert(at, para)
    return True


def add_legend(doctree) -> bool:
    """Open the Exercises section with the difficulty legend unless it has one; False when nothing changed."""
    from docutils import nodes

    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is None or title.parent is not section or _text(title).strip() != "Exercises":
            continue
        for child in section.children[1:]:
            if not isinstance(child, nodes.paragraph):
                break  # the first exercise (or anything else): the chapter's own legend would come before
            if "difficulty" in _text(child).lower():
                return False
        section.insert(section.index(title) + 1, nodes.paragraph(LEGEND, LEGEND, classes=[LEGEND_CLASS]))
        return True
    return False


def mark_optional(doctree) -> int:
    """Give each section titled ``Optional: ...`` the class OPTIONAL_CLASS and a one-line note under
    its title; return how many sections were marked (0 when they already were)."""
    from docutils import nodes

    marked = 0
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is None or title.parent is not section:
            continue
        if not _text(title).startswith(core_path.OPTIONAL_PREFIX) or OPTIONAL_CLASS in section["classes"]:
            continue
        section["classes"].append(OPTIONAL_CLASS)
        note = nodes.paragraph(OPTIONAL_NOTE, OPTIONAL_NOTE, classes=["optional-note"])
        section.insert(section.index(title) + 1, note)
        marked += 1
    return marked


def core_line(notebook: Path) -> str | None:
    """The core-path sentence of a chapter notebook, or None (no notebook, or no optional section)."""
    try:
        return core_path.core_text(core_path.load(notebook))
    except (OSError, ValueError, KeyError):
        return None


def _times_path(app) -> Path:
    return Path(app.srcdir) / TIMES


def _config_inited(app, config) -> None:
    subs = dict(config.myst_substitutions or {}) if hasattr(config, "myst_substitutions") else {}
    subs.setdefault("book_run_time", book_time_text(load_times(_times_path(app))))
    config.myst_substitutions = subs


def _doctree_read(app, doctree) -> None:
    docname = app.env.docname
    gpu_path = Path(app.srcdir) / GPU_TIMES
    text = runtime_text(docname, load_times(_times_path(app)), load_times(gpu_path))
    if text is None:
        return
    app.env.note_dependency(str(_times_path(app)))
    if gpu_path.exists():
        app.env.note_dependency(str(gpu_path))
    notebook = Path(app.srcdir) / f"{docname}.ipynb"
    core = core_line(notebook)
    add_runtime(doctree, f"{text} {core}" if core else text)
    mark_optional(doctree)
    add_legend(doctree)


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("doctree-read", _doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
