"""A Sphinx extension (loaded by _config.yml's ``local_extensions``): the bibliography in author-year form.

The chapters cite in author-year form (``bibtex_reference_style: author_year`` renders
``{cite}`vaswani2017attention``` as "[Vaswani et al., 2017]"). pybtex's own formatting styles label
the bibliography's entries [1], [2], ... or [VSP+17]; this one labels each entry the way the text
cites it, "Vaswani et al., 2017", and sorts the list by author, year and title, so a reader finds a
citation's entry by the words that cite it. Same author and year twice: "2017a", "2017b".

Use ``bibtex_default_style: authoryear`` in the Sphinx config.
"""

from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _surname(person) -> str:
    """The name a citation shows: the last names with their particles ("van der Maaten"), LaTeX removed."""
    parts = [*person.rich_prelast_names, *person.rich_last_names]
    return " ".join(part.render_as("text") for part in parts)


def _authors(entry) -> str:
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    if not people:
        return entry.fields.get("organization", entry.fields.get("institution", entry.key))
    names = [_surname(p) for p in people]
    if len(names) == 1:
        return names[0]
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return f"{names[0]} et al."


class AuthorYearLabels(BaseLabelStyle):
    """Labels "Surname, year", "Surname and Other, year", "Surname et al., year" (a/b for repeats)."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        base = [f"{_authors(e)}, {e.fields.get('year', 'n.d.')}" for e in entries]
        repeats = Counter(base)
        seen: Counter = Counter()
        for label in base:
            if repeats[label] > 1:
                suffix = "abcdefghijklmnopqrstuvwxyz"[seen[label]]
                seen[label] += 1
                yield label + suffix
            else:
                yield label


class AuthorYearStyle(PlainStyle):
    """pybtex's plain entry formatting with author-year labels, sorted by author, year and title."""

    default_label_style = AuthorYearLabels
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
