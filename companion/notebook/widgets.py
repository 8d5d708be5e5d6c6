"""ipywidgets explorers used by the chapters.

What this module provides
- ``softmax_temperature_explorer(scores, values=None)``: a slider for the factor that multiplies
  the scores before the softmax (1/sqrt(d_k) in equation 1.2, or 1/temperature when sampling) and
  a bar chart of the resulting weights, redrawn as the slider moves.
- ``positional_encoding_explorer(d, max_len)``: two sliders, a position and a channel pair, showing
  the sinusoidal encoding of that position (chapter 2, equation 2.1) and that pair's wave over all
  positions.
- ``sampling_explorer(logits, labels)``: two sliders, temperature and top-p, and a bar chart of the
  next-token distribution they leave (chapter 4): the tempered softmax over the nucleus, zero
  outside it.
- ``rope_frequency_explorer(head_dim, trained_len, max_len)``: a base slider, a context-extension
  scheme (none, PI, NTK, YaRN, Llama 3) and its factor s (chapter 7): the frequency of every RoPE
  pair against the plain one, and the rotary score of a vector with itself at each offset,
  <R_m q, R_0 q> / |q|^2, with the trained length marked.

- ``softmax_temperature_frames`` and ``sampling_frames``: the same pictures pre-drawn for a grid of
  slider positions, as a ``FramePlayer``: HTML sliders that switch between the frames in the browser.
  The rendered book has no kernel, so a live widget's slider there moves its number but never its
  plot; the frames are what the static page shows (the live widget stays in the notebook). Frames
  are drawn at 2 PNG px per CSS px and at most about 410 px wide (two panels stacked), so the same
  frame is sharp on a scale-2 screen and its labels stay >= 9 px in a phone's 352 px column.
- ``glue_player(name, player)``: a player shown as a numbered, captioned figure, as
  ``diagrams.glue_figure`` does for a figure (``{glue:figure} name`` in the markdown).

The explorers are thin: the numbers they show come from ``companion.attention``.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import matplotlib.pyplot as plt
import torch

from companion.attention import stable_softmax
from companion.inference.generate import filter_logits
from companion.positions import sinusoidal_table
from companion.notebook.viz import book_png

__all__ = ["softmax_temperature_explorer", "positional_encoding_explorer", "sampling_explorer", "rope_frequency_explorer",
           "FramePlayer", "frame_player", "softmax_temperature_frames", "sampling_frames", "positional_encoding_frames",
           "rope_frequency_frames", "glue_player", "FRAME_RATIO"]

FRAME_RATIO = 2  # PNG px per CSS px of a player's frames


def _controls() -> dict:
    """Keyword arguments for every slider and dropdown: the description at its full width ("temperature",
    not "temperat..."), the control as wide as a phone allows."""
    import ipywidgets as widgets

    return {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="min(100%, 30em)")}


def _fit_ylim(ax, values, *, headroom: float = 1.15) -> None:
    """A y axis from 0 to just above the tallest bar, so the bars use the plot's height (a fixed 0..1
    axis left small probabilities at the bottom eighth of it)."""
    top = float(max(values)) if len(values) else 1.0
    ax.set_ylim(0, max(top * headroom, 1e-3))


def softmax_temperature_explorer(
    scores: Sequence[float] | torch.Tensor,
    labels: Sequence[str] | None = None,
    *,
    scale: float = 1.0,
    scale_range: tuple[float, float] = (0.05, 4.0),
):
    """Return an ipywidgets ``interactive`` showing softmax(scale * scores) for a slider-chosen scale."""
    import ipywidgets as widgets  # imported here so the package works without a notebook stack

    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.dim() != 1 or s.numel() < 2:
        raise ValueError(f"scores must be a 1-D sequence of at least 2 numbers; got shape {tuple(s.shape)}")
    lo, hi = scale_range
    if not (0 < lo < hi and lo <= scale <= hi):
        raise ValueError(f"scale_range must satisfy 0 < low <= scale <= high; got {scale_range} with scale={scale}")
    names = list(labels) if labels is not None else [f"key {j}" for j in range(s.numel())]
    if len(names) != s.numel():
        raise ValueError(f"labels must have {s.numel()} entries; got {len(names)}")

    def draw(scale: float) -> None:
        _softmax_figure(s, names, scale)
        plt.show()

    slider = widgets.FloatSlider(value=scale, min=lo, max=hi, step=0.05, description="scale",
                                 continuous_update=False, **_controls())
    return widgets.interactive(draw, scale=slider)


def _softmax_figure(s: torch.Tensor, names: list[str], scale: float):
    w = stable_softmax(scale * s)
    fig, ax = plt.subplots(figsize=(5.0, 2.8))
    ax.bar(names, w.numpy(), color="tab:blue")
    _fit_ylim(ax, w.numpy())
    ax.set_ylabel("weight")
    ax.set_title(f"softmax({scale:.2f} x scores): max weight {float(w.max()):.3f}")
    return fig


def positional_encoding_explorer(d: int = 64, max_len: int = 256, *, base: float = 10000.0):
    """Return an ipywidgets ``interactive``: the sinusoidal vector PE[p] for a chosen position p, and
    the sine/cosine pair i traced over every position, with its wavelength 2 pi base^(2i/d)."""
    import ipywidgets as widgets

    if d < 2 or d % 2:
        raise ValueError(f"d must be even and >= 2; got {d}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2; got {max_len}")
    table = sinusoidal_table(torch.arange(max_len), d, base).double()  # (max_len, d)

    def draw(position: int, pair: int) -> None:
        _positional_figure(table, base, position, pair)
        plt.show()

    pos = widgets.IntSlider(value=10, min=0, max=max_len - 1, description="position", continuous_update=False,
                            **_controls())
    pair = widgets.IntSlider(value=0, min=0, max=d // 2 - 1, description="pair i", continuous_update=False,
                             **_controls())
    return widgets.interactive(draw, position=pos, pair=pair)


def _positional_figure(table: torch.Tensor, base: float, position: int, pair: int):
    d = table.shape[1]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(5.0, 5.2))  # stacked: one figure for phone and desktop
    ax1.bar(range(d), table[position].numpy(), color=["tab:blue", "tab:orange"] * (d // 2))
    ax1.set_ylim(-1.1, 1.1)
    ax1.set_xlabel("channel (blue: sin, orange: cos)")
    ax1.set_title(f"PE[{position}]")
    wavelength = 2 * math.pi * base ** (2 * pair / d)
    ax2.plot(table[:, 2 * pair].numpy(), label="sin")
    ax2.plot(table[:, 2 * pair + 1].numpy(), label="cos")
    ax2.axvline(position, color="k", lw=0.8)
    ax2.set_xlabel("position")
    ax2.set_title(f"pair {pair}: wavelength {wavelength:,.1f}")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    return fig


def sampling_explorer(
    logits: Sequence[float] | torch.Tensor,
    labels: Sequence[str],
    *,
    show: int = 12,
    temperature: float = 1.0,
    top_p: float = 1.0,
):
    """Return an ipywidgets ``interactive``: softmax(filter(logits / temperature, top_p)) over the
    ``show`` most likely tokens, as the sampler of ``companion.inference.generate`` would draw them."""
    import ipywidgets as widgets

    z = torch.as_tensor(logits, dtype=torch.float32)
    if z.dim() != 1 or z.numel() < 2:
        raise ValueError(f"logits must be a 1-D sequence of at least 2 numbers; got shape {tuple(z.shape)}")
    if len(labels) != z.numel():
        raise ValueError(f"labels must have one entry per logit ({z.numel()}); got {len(labels)}")
    if not (0.1 <= temperature <= 2.0 and 0.05 <= top_p <= 1.0):
        raise ValueError(f"temperature must be in [0.1, 2] and top_p in [0.05, 1]; got {temperature}, {top_p}")
    order = torch.argsort(z, descending=True)[:show]
    names = [repr(labels[int(i)]).strip("'") for i in order]

    def draw(temperature: float, top_p: float) -> None:
        _sampling_figure(z, order, names, temperature, top_p)
        plt.show()

    t_slider = widgets.FloatSlider(value=temperature, min=0.1, max=2.0, step=0.05, description="temperature",
                                   continuous_update=False, **_controls())
    p_slider = widgets.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top-p",
                                   continuous_update=False, **_controls())
    return widgets.interactive(draw, temperature=t_slider, top_p=p_slider)


def _sampling_figure(z: torch.Tensor, order: torch.Tensor, names: list[str], temperature: float, top_p: float):
    probs = torch.softmax(filter_logits(z, temperature, None, top_p), dim=-1)
    kept = int((probs > 0).sum())
    fig, ax = plt.subplots(figsize=(5.0, 2.8))  # 400 px: a phone shows its labels >= 9 px
    ax.bar(names, probs[order].numpy(), color=["tab:blue" if probs[i] > 0 else "lightgrey" for i in order])
    _fit_ylim(ax, probs[order].numpy())
    ax.set_ylabel("probability")
    ax.set_title(f"temperature {temperature:.2f}, top-p {top_p:.2f}: {kept} tokens can be drawn")
    return fig


ROPE_EXPLORER_SCHEMES = ("none", "pi", "ntk", "yarn", "llama3")


def rope_frequency_explorer(head_dim: int = 16, trained_len: int = 64, max_len: int = 512, *,
                            base: float = 10000.0, scheme: str = "none", factor: float = 4.0):
    """Return an ipywidgets ``interactive`` over RoPE's frequencies (chapter 7, equation 7.3).

    Controls: log10 of the base, a context-extension scheme and its factor s. Left panel: the
    frequency omega_r of each pair r (log scale, the chapter's notation) as
    ``companion.positions.rope_inverse_frequencies`` computes it, beside the plain omega_r =
    base^(-2r/d_h). Right panel: the rotary score of a vector of ones with itself at offset n,
    <R_n q, R_0 q> / |q|^2 = m^2 mean_r cos(n omega_r), m = sqrt(1/t) the factor YaRN puts on q and
    k (t its temperature, as in the paper; m = 1 for the other schemes), for n up to ``max_len``, with ``trained_len`` marked: the scores a model
    never saw lie to its right."""
    import ipywidgets as widgets

    if head_dim < 4 or head_dim % 2:
        raise ValueError(f"head_dim must be even and >= 4; got {head_dim}")
    if not 2 <= trained_len < max_len:
        raise ValueError(f"need 2 <= trained_len < max_len; got trained_len={trained_len}, max_len={max_len}")
    if scheme not in ROPE_EXPLORER_SCHEMES:
        raise ValueError(f"scheme must be one of {ROPE_EXPLORER_SCHEMES}; got {scheme!r}")
    if not (1.0 <= factor <= 16.0 and 10.0 <= base <= 1e7):
        raise ValueError(f"factor must be in [1, 16] and base in [10, 1e7]; got {factor}, {base}")

    def draw(log10_base: float, scheme: str, factor: float) -> None:
        _rope_figure(head_dim, trained_len, max_len, log10_base, scheme, factor)
        plt.show()

    base_slider = widgets.FloatSlider(value=math.log10(base), min=1.0, max=7.0, step=0.1,
                                      description="log10 base", continuous_update=False, **_controls())
    scheme_box = widgets.Dropdown(options=list(ROPE_EXPLORER_SCHEMES), value=scheme, description="scheme",
                                  **_controls())
    factor_slider = widgets.FloatSlider(value=factor, min=1.0, max=16.0, step=0.5, description="factor s",
                                        continuous_update=False, **_controls())
    return widgets.interactive(draw, log10_base=base_slider, scheme=scheme_box, factor=factor_slider)


def _rope_figure(head_dim: int, trained_len: int, max_len: int, log10_base: float, scheme: str, factor: float):
    from companion.positions import rope_inverse_frequencies, rope_turns

    offsets = torch.arange(max_len, dtype=torch.float64)
    b = 10.0 ** log10_base
    plain, _ = rope_inverse_frequencies(head_dim, b)
    scaling = None if scheme == "none" else scheme
    theta, temperature = rope_inverse_frequencies(head_dim, b, scaling, factor, trained_len)
    score = temperature**2 * torch.cos(offsets[:, None] * theta.double()).mean(-1)  # (max_len,)
    turning = int((rope_turns(theta, trained_len) >= 1).sum())
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(5.0, 5.4))  # stacked: one figure for phone and desktop
    pairs = range(head_dim // 2)
    ax1.semilogy(pairs, plain.numpy(), "o", color="lightgrey", label="plain")
    ax1.semilogy(pairs, theta.numpy(), ".", color="tab:blue", label=scheme)
    ax1.set_xlabel("pair $r$")
    ax1.set_ylabel(r"$\omega_r$ (radians / position)")
    ax1.set_title(f"base {b:,.0f}: {turning} of {head_dim // 2} pairs turn within {trained_len}")
    ax1.legend(loc="upper right")
    ax2.plot(offsets.numpy(), score.numpy(), color="tab:blue")
    ax2.axvline(trained_len, color="grey", ls="--", lw=1)
    ax2.set_xlabel("offset n")
    ax2.set_title(f"score of q with itself, {scheme}, s = {factor:g}")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- pre-drawn frames for the static page

# One handler for every slider of a player: the frame key is the sliders' positions joined by commas.
_ON_INPUT = ("var r=this.closest('.companion-frames'),s=r.querySelectorAll('input'),k=[];"
             "s.forEach(function(e,i){k.push(e.value);"
             "e.nextElementSibling.textContent=JSON.parse(r.dataset.labels)[i][e.value];});"
             "r.querySelector('img').src=JSON.parse(r.dataset.frames)[k.join(',')];")


@dataclass
class FramePlayer:
    """Pre-drawn frames of a figure over a grid of slider positions, shown with HTML range sliders that
    switch frames in the browser (no kernel needed). ``frames`` maps "i,j,..." (each slider's index)
    to a PNG as a data URL; Jupyter and the book render it through ``_repr_html_``."""

    names: list[str]
    values: list[list]
    frames: dict[str, str]
    start: list[int]
    fmt: str = "{:.2f}"
    alt: str = ""

    def __repr__(self) -> str:  # the frames themselves are for the browser, not for a text output
        grid = ", ".join(f"{n}: {len(v)}" for n, v in zip(self.names, self.values))
        return f"FramePlayer({grid}; {len(self.frames)} frames)"

    def key(self, *indices: int) -> str:
        return ",".join(str(i) for i in indices)

    def _repr_html_(self) -> str:
        labels = [[self.fmt.format(v) if isinstance(v, (int, float)) else str(v) for v in vals] for vals in self.values]
        rows = []
        for i, (name, vals) in enumerate(zip(self.names, self.values)):
            rows.append(
                f'<label style="display:block">{html.escape(name)} '
                f'<input type="range" min="0" max="{len(vals) - 1}" step="1" value="{self.start[i]}" '
                f'aria-label="{html.escape(name)}" oninput="{html.escape(_ON_INPUT)}" '
                f'style="width:min(60%,20em);vertical-align:middle">'
                f'<output style="margin-left:0.5em">{labels[i][self.start[i]]}</output></label>')
        first = self.frames[self.key(*self.start)]
        png = base64.b64decode(first.split(",", 1)[1])
        width = round(int.from_bytes(png[16:20], "big") / FRAME_RATIO)  # the PNG header: CSS px
        # Each frame is shown at its own width in CSS px (frames differ by a few px: their titles).
        fit = f"this.width=Math.round(this.naturalWidth/{FRAME_RATIO})"
        return (f'<div class="companion-frames" data-frames="{html.escape(json.dumps(self.frames))}" '
                f'data-labels="{html.escape(json.dumps(labels))}">' + "".join(rows)
                + f'<img src="{first}" width="{width}" onload="{fit}" alt="{html.escape(self.alt)}" '
                'style="max-width:100%;height:auto"></div>')


def _png(fig) -> str:
    """One frame as a data URL: the book's PNG (labels >= 11 px, recorded in the PNG) at
    ``FRAME_RATIO`` PNG px per CSS px."""
    data, _ = book_png(fig, ratio=FRAME_RATIO)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(data).decode()


def frame_player(draw: Callable[..., object], grid: dict[str, Sequence[float]], start: dict[str, float], *,
                 fmt: str = "{:.2f}", alt: str = "") -> FramePlayer:
    """Draw ``draw(**values)`` (a function returning a matplotlib figure) at every point of ``grid``
    (slider name -> its positions) and return the ``FramePlayer`` that shows them, starting at ``start``."""
    if not grid or any(len(v) < 2 for v in grid.values()):
        raise ValueError(f"grid must give every slider at least 2 positions; got {dict(grid)}")
    if set(start) != set(grid):
        raise ValueError(f"start must name the grid's sliders {sorted(grid)}; got {sorted(start)}")
    names, values = list(grid), [list(v) for v in grid.values()]
    missing = [n for n, vals in zip(names, values) if start[n] not in vals]
    if missing:
        raise ValueError(f"start must be a position of each slider's grid; {missing} are not")
    frames = {}
    for point in itertools.product(*(range(len(v)) for v in values)):
        kwargs = {n: vals[i] for n, vals, i in zip(names, values, point)}
        frames[",".join(map(str, point))] = _png(draw(**kwargs))
    return FramePlayer(names, values, frames, [vals.index(start[n]) for n, vals in zip(names, values)], fmt, alt)


def softmax_temperature_frames(scores, labels: Sequence[str] | None = None, *,
                               scales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0), scale: float = 1.0) -> FramePlayer:
    """``softmax_temperature_explorer``'s picture pre-drawn at ``scales``, for the static page."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    names = list(labels) if labels is not None else [f"key {j}" for j in range(s.numel())]
    return frame_player(lambda scale: _softmax_figure(s, names, scale), {"scale": scales}, {"scale": scale},
                        alt="bar chart of the softmax weights at the chosen scale")


def sampling_frames(logits, labels: Sequence[str], *, show: int = 12,
                    temperatures: Sequence[float] = (0.5, 1.0, 1.5), top_ps: Sequence[float] = (0.5, 0.9, 1.0),
                    temperature: float = 1.0, top_p: float = 1.0) -> FramePlayer:
    """``sampling_explorer``'s picture pre-drawn at every (temperature, top-p) pair, for the static page."""
    z = torch.as_tensor(logits, dtype=torch.float32)
    if len(labels) != z.numel():
        raise ValueError(f"labels must have one entry per logit ({z.numel()}); got {len(labels)}")
    order = torch.argsort(z, descending=True)[:show]
    names = [repr(labels[int(i)]).strip("'") for i in order]
    return frame_player(lambda **at: _sampling_figure(z, order, names, at["temperature"], at["top-p"]),
                        {"temperature": temperatures, "top-p": top_ps}, {"temperature": temperature, "top-p": top_p},
                        alt="bar chart of the next-token probabilities at the chosen temperature and top-p")


def positional_encoding_frames(d: int = 64, max_len: int = 128, *, base: float = 10000.0,
                               positions: Sequence[int] = (0, 10, 100), pairs: Sequence[int] = (0, 8, 31),
                               position: int = 10, pair: int = 0) -> FramePlayer:
    """``positional_encoding_explorer``'s picture pre-drawn at every (position, pair), for the static page."""
    if max(positions) >= max_len or max(pairs) >= d // 2:
        raise ValueError(f"positions must be < max_len ({max_len}) and pairs < d/2 ({d // 2})")
    table = sinusoidal_table(torch.arange(max_len), d, base).double()
    return frame_player(lambda position, pair: _positional_figure(table, base, position, pair),
                        {"position": positions, "pair": pairs}, {"position": position, "pair": pair}, fmt="{:d}",
                        alt="the sinusoidal vector at the chosen position, and the chosen pair's wave over all positions")


def rope_frequency_frames(head_dim: int = 16, trained_len: int = 64, max_len: int = 512, *, base: float = 10000.0,
                          schemes: Sequence[str] = ROPE_EXPLORER_SCHEMES, factors: Sequence[float] = (2.0, 8.0),
                          scheme: str = "none", factor: float = 2.0) -> FramePlayer:
    """``rope_frequency_explorer``'s picture pre-drawn for every scheme and factor at one base."""
    unknown = [x for x in schemes if x not in ROPE_EXPLORER_SCHEMES]
    if unknown:
        raise ValueError(f"schemes must be among {ROPE_EXPLORER_SCHEMES}; got {unknown}")
    return frame_player(
        lambda **at: _rope_figure(head_dim, trained_len, max_len, math.log10(base), at["scheme"], at["factor s"]),
        {"scheme": schemes, "factor s": factors}, {"scheme": scheme, "factor s": factor}, fmt="{:g}",
        alt="RoPE frequencies per pair and the rotary score against offset, for the chosen scheme and factor")


def glue_player(name: str, player: FramePlayer) -> None:
    """Show ``player`` and record it under ``name`` for a ``{glue:figure}`` directive, so the page
    numbers and captions it like a figure (the same ``scrapbook`` metadata as ``diagrams.glue_figure``)."""
    if not isinstance(player, FramePlayer):
        raise ValueError(f"player must be a FramePlayer; got {type(player).__name__}")
    if not (isinstance(name, str) and name.startswith("fig-")):
        raise ValueError(f"name must be a figure label starting with 'fig-'; got {name!r}")
    from IPython.display import display

    display({"text/html": player._repr_html_(), "text/plain": repr(player)}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": ""}})
