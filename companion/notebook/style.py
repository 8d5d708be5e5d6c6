"""The one call at the top of every chapter: ``use_book_style()``.

It applies the book's figure style (``companion.notebook.viz.apply_style``) and, inside IPython, routes
every figure a cell shows or glues through the book's renditions: ``viz.book_png`` as the PNG (the
desktop column, and what Jupyter and Colab show) and ``phone_figures.book_html`` as the HTML (a
``<picture>`` with the phone rendition beside it, which the book's pages show). It sits above both
modules, since the phone rendition builds on ``viz``; no SVG (nbval would compare its text).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from companion.notebook.phone_figures import book_html
from companion.notebook.viz import DPI, apply_style, book_png

__all__ = ["use_book_style"]


def use_book_style(dpi: int = DPI) -> None:
    """The book's figure style, and its PNG and phone renditions for everything displayed."""
    apply_style(dpi)
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # plain Python: nothing to configure
        return
    set_matplotlib_formats("png")
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, book_png)
        shell.display_formatter.formatters["text/html"].for_type(Figure, book_html)
