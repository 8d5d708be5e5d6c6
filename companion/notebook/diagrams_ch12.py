"""Chapter 12's diagrams (paged serving), drawn with matplotlib in the style of
``companion.notebook.diagrams``.

What this module provides, each drawing function returning a ``matplotlib.figure.Figure``:
- ``block_tables(tables, n_pages, page_size)``: the block tables of a few live sequences over one
  page pool, shared pages hatched, each logical page shaded by its filled slots.
- ``pages_to_seats(tables, seats, n_pages, page_size)``: the three places a running sequence's keys
  and values live on a CPU engine: the page pool (the store of record, shared and freed by page),
  each sequence's block table (which pool page holds its logical page k), and its seat, one dense
  row where token j sits at column j, as the block table's slots give it (equation (12.2)).
- ``static_grid(news, batch)`` and ``continuous_grid(decisions, n_requests)``: what each request
  does at each step under a static batch and under a continuous-batching scheduler, one letter a
  step: ``w`` waiting, ``p`` prefill, ``d`` decode, ``x`` finished but still computed (a static
  batch's idle row), ``.`` done.
- ``batching_schedule(static, continuous)``: the two grids drawn one above the other, requests
  down, steps across.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from companion.notebook.diagrams import FONT, _canvas

__all__ = ["block_tables", "pages_to_seats", "static_grid", "continuous_grid", "batching_schedule",
           "SCHEDULE_COLOURS"]

EDGE = "#444444"
SHARED, SEQ_COLOURS = "#d9d9d9", ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fa9fb5", "#c7e9c0")


def block_tables(tables: dict, n_pages: int, page_size: int) -> Figure:
    """The block tables of a few live sequences over one page pool (chapter 12).

    ``tables``: {sequence id: (block table, tokens stored)}, e.g. ``companion.engine.trace.block_tables``
    of a running engine. Top row: the pool's physical pages, coloured by the sequence that holds
    each one (grey and hatched: held by several, i.e. a shared prefix page; white: free). Below, one
    row per sequence: its logical pages 0, 1, ... in table order, each showing the physical page id
    it maps to and, shaded, how many of its p slots are filled (token j is in logical page
    floor(j / p) at offset j mod p)."""
    owners = _check_tables(tables, n_pages, page_size, max_p=None, max_pages=32, max_seqs=len(SEQ_COLOURS))
    colour = {sid: SEQ_COLOURS[i] for i, sid in enumerate(tables)}
    cell, x0, row = min(0.32, 7.4 / n_pages), 1.45, 0.5
    height = 1.75 + row * len(tables)
    fig, ax = _canvas(9.0, height)
    y_pool = height - 0.6
    ax.text(0.1, y_pool + cell / 2, "page pool", ha="left", va="center", fontsize=FONT, weight="bold")
    for page in range(n_pages):
        held = owners.get(page, [])
        face = "white" if not held else colour[held[0]] if len(held) == 1 else SHARED
        ax.add_patch(Rectangle((x0 + page * cell, y_pool), cell, cell, facecolor=face, edgecolor="#444444",
                               linewidth=0.8, hatch="//" if len(held) > 1 else None))
        ax.text(x0 + (page + 0.5) * cell, y_pool + cell + 0.08, str(page), ha="center", va="bottom", fontsize=9)
    y = y_pool - 0.45
    ax.text(0.1, y + 0.1, "logical page:", ha="left", va="center", fontsize=9)
    width = max(len(t) for t, _ in tables.values())
    for k in range(width):
        ax.text(x0 + (k + 0.5) * cell, y + 0.1, str(k), ha="center", va="center", fontsize=9)
    for sid, (table, length) in tables.items():
        y -= row
        ax.text(0.1, y + cell / 2, f"seq {sid}, T={length}", ha="left", va="center", fontsize=9)
        for k, page in enumerate(table):
            filled = min(page_size, length - k * page_size) / page_size
            x = x0 + k * cell
            ax.add_patch(Rectangle((x, y), cell * filled, cell, facecolor=colour[sid], linewidth=0))
            ax.add_patch(Rectangle((x, y), cell, cell, facecolor="none", edgecolor="#444444", linewidth=0.8,
                                   hatch="//" if len(owners[page]) > 1 else None))
            # on a white patch of its own, so that a shared page's hatching does not run through it
            ax.text(x + cell / 2, y + cell / 2, str(page), ha="center", va="center", fontsize=9,
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.6))
    legend = [("white", None, "free page"), (SHARED, "//", "shared page (ref > 1)"),
              (SEQ_COLOURS[0], None, f"filled slots (p = {page_size})")]
    for i, (face, hatch, label) in enumerate(legend):
        lx = 0.1 + i * 2.9
        ax.add_patch(Rectangle((lx, 0.12), 0.25, 0.25, facecolor=face, edgecolor="#444444", hatch=hatch))
        ax.text(lx + 0.35, 0.245, label, ha="left", va="center", fontsize=9)
    return fig


# waiting, prefill, decode, idle (computed, finished), done
SCHEDULE_COLOURS = {"w": "#f2f2f2", "p": "#E69F00", "d": "#56B4E9", "x": "#CC79A7", ".": "white"}
SCHEDULE_LABELS = {"w": "waiting", "p": "prefill (gives token 1)", "d": "decode",
                   "x": "finished, row still computed"}


def _check_tables(tables: dict, n_pages: int, page_size: int, max_p: int | None = 8, max_pages: int = 16,
                  max_seqs: int = 4) -> dict[int, list[int]]:
    """{page: the sequences holding it}, after checking that ``tables`` fit a figure: at most ``max_p``
    slots a page (None: any; a figure that draws slots needs few), ``max_pages`` pages, ``max_seqs``
    sequences, each holding ceil(length / p) pages of the pool."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1 or (
            max_p is not None and page_size > max_p):
        rule = ">= 1" if max_p is None else f"in [1, {max_p}] (slots are drawn)"
        raise ValueError(f"page_size must be an int {rule}; got {page_size!r}")
    if isinstance(n_pages, bool) or not isinstance(n_pages, int) or not 1 <= n_pages <= max_pages:
        raise ValueError(f"n_pages must be an int in [1, {max_pages}] (to fit the column); got {n_pages!r}")
    if not 1 <= len(tables) <= min(max_seqs, len(SEQ_COLOURS)):
        raise ValueError(f"tables must hold 1 to {min(max_seqs, len(SEQ_COLOURS))} sequences; got {len(tables)}")
    owners: dict[int, list[int]] = {}
    for sid, (table, length) in tables.items():
        if len(table) != -(-length // page_size):
            raise ValueError(f"tables: sequence {sid} stores {length} tokens in {len(table)} pages;"
                             f" a table holds ceil(length / p) = {-(-length // page_size)} pages")
        for page in table:
            if not 0 <= page < n_pages:
                raise ValueError(f"tables: sequence {sid} maps page {page}, outside the pool [0, {n_pages})")
            owners.setdefault(page, []).append(sid)
    return owners


def pages_to_seats(tables: dict, seats: dict, n_pages: int, page_size: int) -> Figure:
    """Pool pages -> block tables -> seat rows for a few running sequences (chapter 12).

    ``tables``: {sequence id: (block table, tokens stored)}, as ``engine.trace.block_tables`` gives;
    ``seats``: {sequence id: its seat (row of the seat buffers)}. Top: the pool, one box a page of
    ``page_size`` slots, coloured by the sequence holding it (grey and hatched: shared). Middle:
    each sequence's block table. Bottom: the seat rows, token j of a sequence in column j, each run
    of p tokens coloured like the page it came from and labelled with that page's id. Arrows follow
    one page of the first sequence from the pool through its table entry to its seat columns."""
    owners = _check_tables(tables, n_pages, page_size)
    if sorted(seats) != sorted(tables) or sorted(seats.values()) != list(range(len(seats))):
        raise ValueError(f"seats must give each sequence of tables one of the seats 0..{len(tables) - 1};"
                         f" got {seats!r}")
    colour = {sid: SEQ_COLOURS[i] for i, sid in enumerate(tables)}
    face = {page: colour[h[0]] if len(h) == 1 else SHARED for page, h in owners.items()}
    longest = max(length for _, length in tables.values())
    slot = min(0.11, 6.9 / (n_pages * page_size))        # a pool slot
    seat_slot = min(0.4, 6.9 / longest)                     # a seat column
    x0, n = 1.75, len(tables)
    height = 2.75 + 0.42 * (n - 1)
    fig, ax = _canvas(8.8, height)
    y_pool = height - 0.75
    ax.text(0.05, y_pool + 0.14, "page pool", ha="left", va="center", fontsize=FONT, weight="bold")
    ax.text(0.05, y_pool - 0.16, f"(p = {page_size} slots)", ha="left", va="center", fontsize=FONT)
    page_w = slot * page_size
    for page in range(n_pages):
        x = x0 + page * page_w
        held = owners.get(page, [])
        ax.add_patch(Rectangle((x, y_pool), page_w, 0.28, facecolor=face.get(page, "white"),
                               edgecolor=EDGE, linewidth=1.0, hatch="//" if len(held) > 1 else None))
        for r in range(1, page_size):           # the p slots of the page
            ax.plot([x + r * slot] * 2, [y_pool, y_pool + 0.07], color=EDGE, linewidth=0.5)
        ax.text(x + page_w / 2, y_pool + 0.33, str(page), ha="center", va="bottom", fontsize=FONT)
    # block tables: one short row of page ids per sequence
    y_tab = y_pool - 0.75
    ax.text(0.05, y_tab + 0.15, "block tables", ha="left", va="center", fontsize=FONT, weight="bold")
    entry, tx = 0.36, x0
    table_x: dict[int, float] = {}
    for sid, (table, _) in tables.items():
        # the name on the table's left, level with it: the arrows from the pool end on the table's
        # top edge and leave from its bottom edge, so they never cross a name
        ax.text(tx, y_tab + 0.15, f"seq {sid}", ha="left", va="center", fontsize=FONT)
        tx += 0.6
        table_x[sid] = tx
        for k, page in enumerate(table):
            ax.add_patch(Rectangle((tx + k * entry, y_tab), entry, 0.3, facecolor=face[page],
                                   edgecolor=EDGE, linewidth=1.0,
                                   hatch="//" if len(owners[page]) > 1 else None))
            ax.text(tx + (k + 0.5) * entry, y_tab + 0.15, str(page), ha="center", va="center",
                    fontsize=FONT, bbox=dict(facecolor="white", edgecolor="none", pad=0.6))
        tx += len(table) * entry + 0.3
    # seat rows: token j of a sequence at column j, runs of p coloured by their page
    y_seat = y_tab - 0.75
    ax.text(0.05, y_seat + 0.15, "seats", ha="left", va="center", fontsize=FONT, weight="bold")
    for j in range(0, longest, page_size):            # token positions, under the seats
        ax.text(x0 + (j + 0.5) * seat_slot, y_seat - (n - 1) * 0.42 - 0.2, f"j = {j}",
                ha="center", va="center", fontsize=FONT)
    seat_y: dict[int, float] = {}
    for sid, (table, length) in tables.items():
        y = y_seat - seats[sid] * 0.42
        seat_y[sid] = y
        ax.text(x0 - 0.1, y + 0.14, f"seat {seats[sid]}: seq {sid}", ha="right", va="center",
                fontsize=FONT)
        for k, page in enumerate(table):
            filled = min(page_size, length - k * page_size)
            x = x0 + k * page_size * seat_slot
            for r in range(filled):
                ax.add_patch(Rectangle((x + r * seat_slot, y), seat_slot, 0.28, facecolor=face[page],
                                       edgecolor="#888888", linewidth=0.5,
                                       hatch="//" if len(owners[page]) > 1 else None))
            ax.add_patch(Rectangle((x, y), filled * seat_slot, 0.28, facecolor="none", edgecolor=EDGE,
                                   linewidth=1.0))
            ax.text(x + filled * seat_slot / 2, y + 0.14, f"page {page}", ha="center", va="center",
                    fontsize=FONT, bbox=dict(facecolor="white", edgecolor="none", pad=0.6))
        ax.add_patch(Rectangle((x0 + length * seat_slot, y), (longest - length) * seat_slot, 0.28,
                               facecolor="white", edgecolor="#aaaaaa", linewidth=0.6))
    # follow the last page of the first sequence: pool -> table -> seat
    sid = next(iter(tables))
    table, length = tables[sid]
    k, page = len(table) - 1, table[-1]
    start = (x0 + (page + 0.5) * page_w, y_pool)
    middle = (table_x[sid] + (k + 0.5) * entry, y_tab + 0.3)
    end = (x0 + (k * page_size + min(page_size, length - k * page_size) / 2) * seat_slot,
           seat_y[sid] + 0.28)
    for a, b in ((start, middle), ((middle[0], y_tab), end)):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, color="#333333",
                                     linewidth=1.2, shrinkA=2, shrinkB=2))
    return fig


def static_grid(news, batch: int) -> list[str]:
    """A static batch: requests in groups of ``batch`` in order; a group runs one prefill step and
    then decodes until its longest request has all its tokens (``news[i]`` tokens take ``news[i]``
    steps, the prefill giving the first); a request done early keeps its row (``x``) until then."""
    news = list(news)
    if batch < 1 or not news or min(news) < 1:
        raise ValueError(f"need batch >= 1 and news of positive ints; got {batch!r}, {news!r}")
    rows = ["" for _ in news]
    for g in range(0, len(news), batch):
        group = range(g, min(g + batch, len(news)))
        span = max(news[i] for i in group)
        for i in range(len(news)):
            if i in group:
                rows[i] += "p" + "d" * (news[i] - 1) + "x" * (span - news[i])
            else:
                rows[i] += ("w" if i > group[-1] else ".") * span
    return rows


def continuous_grid(decisions, n_requests: int) -> list[str]:
    """The grid of a recorded scheduler: ``decisions[t]`` lists (request id, tokens, "prefill" or
    "decode") for step t; a request waits before its first step and is done after its last."""
    steps = len(decisions)
    rows = [["w"] * steps for _ in range(n_requests)]
    last = [-1] * n_requests
    for t, batch in enumerate(decisions):
        for rid, _, kind in batch:
            if not 0 <= rid < n_requests:
                raise ValueError(f"decisions: request {rid} outside 0..{n_requests - 1}")
            rows[rid][t] = "p" if kind == "prefill" else "d"
            last[rid] = t
    for rid, row in enumerate(rows):
        for t in range(last[rid] + 1, steps):
            row[t] = "."
    return ["".join(row) for row in rows]


def batching_schedule(static: list[str], continuous: list[str]) -> Figure:
    """Two grids, requests down and steps across: a static batch above, continuous batching below,
    each cell coloured by what the request does in that step (``SCHEDULE_COLOURS``)."""
    if len(static) != len(continuous) or not static:
        raise ValueError("static and continuous must describe the same requests")
    for grid in (static, continuous):
        if any(ch not in SCHEDULE_COLOURS for row in grid for ch in row) or len({len(r) for r in grid}) != 1:
            raise ValueError(f"a grid is equal-length rows of the letters {''.join(SCHEDULE_COLOURS)}")
    n, steps = len(static), max(len(static[0]), len(continuous[0]))
    cw, ch, x0 = min(0.32, 6.9 / steps), 0.24, 1.6
    panel = n * ch + 0.75
    height = 2 * panel + 0.95
    fig, ax = _canvas(8.8, height)
    titles = (f"static batches: {len(static[0])} steps", f"continuous batching: {len(continuous[0])} steps")
    for p, (grid, title) in enumerate(zip((static, continuous), titles)):
        top = height - 0.2 - p * panel
        ax.text(0.05, top - 0.02, title, ha="left", va="center", fontsize=FONT, weight="bold")
        for i, row in enumerate(grid):
            y = top - 0.45 - (i + 1) * ch
            ax.text(x0 - 0.1, y + ch / 2, f"request {i}", ha="right", va="center", fontsize=FONT)
            for t, state in enumerate(row):
                ax.add_patch(Rectangle((x0 + t * cw, y), cw, ch, facecolor=SCHEDULE_COLOURS[state],
                                       edgecolor="#999999", linewidth=0.5))
        for t in range(0, steps, 5):
            ax.text(x0 + (t + 0.5) * cw, top - 0.3, str(t), ha="center", va="center", fontsize=FONT)
    ax.text(x0 - 0.1, height - 0.5, "step", ha="right", va="center", fontsize=FONT)
    for i, (state, label) in enumerate(SCHEDULE_LABELS.items()):
        lx = 0.05 + i * 2.15
        ax.add_patch(Rectangle((lx, 0.15), 0.25, 0.22, facecolor=SCHEDULE_COLOURS[state], edgecolor=EDGE))
        ax.text(lx + 0.33, 0.26, label, ha="left", va="center", fontsize=FONT)
    return fig
