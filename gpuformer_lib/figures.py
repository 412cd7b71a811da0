"""Matplotlib figures that read on a phone: every figure a notebook shows is fitted and checked as it is drawn.

A book page shows a figure at most as wide as its text column: 358 CSS px on a 390-px phone
(:data:`PHONE_COLUMN_PX`). A PNG wider than that is shrunk, and its text with it: a legend at 8 pt in a figure 13
inches wide came out at about 3 px. So before a figure becomes a PNG, :func:`fit` makes it

- at most :data:`MAX_WIDTH_IN` inches wide (a wider one keeps its height and loses width);
- with no text under the size that shows at :data:`MIN_TEXT_PX` CSS px when the PNG is shrunk to the phone's
  column, computed from the PNG's width and each text's size in points (smaller text is raised to it);
- laid out again (constrained layout), its long titles and labels wrapped at its edge, and an axis's tick labels
  thinned where they would run into each other at that size;

and :func:`render_png` then measures what it drew (:class:`FigureReport`): the smallest text as the phone shows
it, any two texts that overlap, any label with a caret or underscore left as plain text where math was meant
(``QK^T``; write ``$QK^\\top$``), a legend over a line or a marker, and a heat-map with no colour bar. Asked
to be strict, it raises :class:`UnreadableFigure`, naming what it found; a notebook's figures are drawn anyway
and their problems stored. The report rides along in the PNG output's metadata (key :data:`METADATA_KEY`), so
the tests of the stored notebooks and of the built book check every figure by the same numbers.

:func:`install` makes this what a notebook's ``plt.show()`` uses (IPython's PNG formatter for a figure); ``viz``
calls it when a notebook imports it.

Leaves out: the drawn SVG diagrams (``drawings``, which check themselves by the same rule) and the figures inside
widgets (``viz`` renders those with :func:`render_png` too, with no metadata to carry).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import re
import struct

import matplotlib
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator, NullFormatter

PHONE_COLUMN_PX = 358
"""The book's text column on a 390-px-wide phone, in CSS px: the narrowest a figure is shown."""
MIN_TEXT_PX = 9.0
"""The smallest text, in CSS px, a figure may show at :data:`PHONE_COLUMN_PX`."""
TARGET_TEXT_PX = 9.5
"""What :func:`fit` raises small text to: a little above :data:`MIN_TEXT_PX`, so the PNG's tight crop (which
may widen it by a legend placed outside) rarely needs a second pass."""
MAX_WIDTH_IN = 6.0
"""The widest figure, in inches: at 6 inches the smallest text is about 10.8 pt."""
DPI = 144
"""Pixels per inch of the PNGs: sharp on a phone's dense screen."""
METADATA_KEY = "gpuformer_figure"
"""Where a PNG output's metadata holds its :class:`FigureReport` (as a dict)."""
OVERLAP_PX = 1.5
"""Two texts overlap when their boxes share more than this many pixels (at :data:`DPI`) both ways."""

TICK_GAP_PX = 6.0
"""The least room, in pixels at :data:`DPI`, between two tick labels of an axis: labels that touch read as one
number ("10000120001400")."""

_PLAIN_MATH = re.compile(r"[A-Za-z0-9)\]][\^][-A-Za-z0-9{(]|\b[A-Za-z]{1,3}_[A-Za-z0-9]\b|\bsqrt\(")


class UnreadableFigure(ValueError):
    """A figure that would not read at a phone's width, or whose labels overlap: what to change is in the text."""


@dataclasses.dataclass(frozen=True)
class FigureReport:
    """What :func:`render_png` drew: the PNG's width in pixels, its smallest text in pixels of the PNG, that text
    as a phone shows it (CSS px at :data:`PHONE_COLUMN_PX`), and the problems found (empty when readable)."""

    width_px: int
    min_text_px: float
    phone_text_px: float
    problems: tuple[str, ...] = ()

    def as_metadata(self) -> dict:
        return {"width_px": self.width_px, "min_text_px": round(self.min_text_px, 2),
                "phone_text_px": round(self.phone_text_px, 2), "problems": list(self.problems)}


_CARET = re.compile(r"\b([A-Za-z]+)\^([A-Za-z0-9]+)\b")


def math_label(text: str) -> str:
    """``text`` with each ``X^Y`` outside ``$...$`` typeset as math (``attention QK^T`` -> ``attention
    $QK^{T}$``, ``QK^T`` with a transpose's T): for names that code keeps plain, shown in a figure."""
    parts = text.split("$")
    for i in range(0, len(parts), 2):
        parts[i] = _CARET.sub(lambda m: "$" + m[1] + "^{" + ("\\top" if m[2] == "T" else m[2]) + "}$", parts[i])
    return "$".join(parts)


def phone_text_px(text_px: float, width_px: float, column: float = PHONE_COLUMN_PX) -> float:
    """CSS px of text ``text_px`` pixels tall in a PNG ``width_px`` wide, shown at most ``column`` px wide."""
    if width_px <= 0 or text_px <= 0:
        raise ValueError(f"a PNG's width and its text size must be positive, got {width_px} and {text_px}")
    return text_px * min(1.0, column / width_px)


def _raise_small_text(fig: Figure, points: float) -> None:
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for which in ("major", "minor"):
                ticks = axis.get_major_ticks() if which == "major" else axis.get_minor_ticks()
                size = ticks[0].label1.get_fontsize() if ticks else matplotlib.rcParams["xtick.labelsize"]
                if isinstance(size, str) or size < points:
                    axis.set_tick_params(which=which, labelsize=points)
    for text in fig.findobj(Text):
        if text.get_fontsize() < points:
            text.set_fontsize(points)


def fit(fig: Figure, target_px: float = TARGET_TEXT_PX, width_px: float | None = None) -> None:
    """Make ``fig`` at most :data:`MAX_WIDTH_IN` wide and raise its text to what shows at ``target_px`` CSS px
    on a phone, for a PNG ``width_px`` wide (by default the figure's own width at :data:`DPI`); lay it out again."""
    w, h = fig.get_size_inches()
    if w > MAX_WIDTH_IN:
        fig.set_size_inches(MAX_WIDTH_IN, h)
    width_px = width_px or fig.get_size_inches()[0] * DPI
    points = target_px * 72 / DPI * max(1.0, width_px / PHONE_COLUMN_PX)
    _raise_small_text(fig, points)
    keep = {id(t) for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()}
    keep |= {id(t) for legend in fig.findobj(Legend) for t in legend.get_texts() + [legend.get_title()]}
    for text in fig.findobj(Text):
        if id(text) not in keep:
            text.set_wrap(True)  # a long title or label breaks at the figure's edge instead of widening the PNG
    if not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        # laid out again for the new sizes, including the ones a cell's tight_layout() had fixed for the old;
        # a colour bar made without constrained layout cannot be placed by it (matplotlib refuses the switch, or
        # divides by zero laying it out): such a figure is laid out once more as it was
        if any(getattr(ax, "_colorbar", None) is not None for ax in fig.axes):
            fig.tight_layout()
        else:
            fig.set_layout_engine("constrained")


def _drawn_texts(fig: Figure):
    """Each text the figure draws (tick labels outside the view and annotations off their axes are not drawn),
    its box and size in pixels, and the renderer that drew them. Every ``Text.draw`` of one drawing is recorded:
    the renderer alone cannot tell which text a line of a wrapped, several-line title belongs to."""
    from matplotlib.backends.backend_agg import RendererAgg

    fig.set_dpi(DPI)
    renderer = RendererAgg(int(fig.bbox.width), int(fig.bbox.height), DPI)
    drawn: dict[int, Text] = {}
    original = Text.draw

    def record(text, r, *args, **kwargs):
        if r is renderer and text.get_visible() and text.get_text().strip():
            drawn[id(text)] = text
        return original(text, r, *args, **kwargs)

    Text.draw = record
    try:
        fig.draw(renderer)
    finally:
        Text.draw = original
    return [(t, t.get_window_extent(renderer), t.get_fontsize() * DPI / 72) for t in drawn.values()], renderer


def _thin_crowded_ticks(fig: Figure, drawn) -> bool:
    """Fewer tick labels on an axis where two of its ``drawn`` labels overlap: its minor labels left out first (a
    short log axis's 2x10^2, 3x10^2, ...), then, on a linear axis, about half as many major ticks (10000, 12500,
    15000 at a phone's text size). Returns whether any axis changed (the figure must then be drawn again)."""
    boxes = {id(t): box for t, box, _ in drawn}

    def crowded(ticks) -> bool:
        shown = [boxes[id(label)] for tick in ticks for label in (tick.label1, tick.label2) if id(label) in boxes]
        return any(_overlap(a, b, TICK_GAP_PX) for i, a in enumerate(shown) for b in shown[i + 1:])

    changed = False
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            minor, major = axis.get_minor_ticks(), axis.get_major_ticks()
            if any(id(t.label1) in boxes or id(t.label2) in boxes for t in minor) and crowded(minor + major):
                axis.set_minor_formatter(NullFormatter())
                changed = True
            elif axis.get_scale() == "linear" and crowded(major):
                shown = sum(id(t.label1) in boxes or id(t.label2) in boxes for t in major)
                axis.set_major_locator(MaxNLocator(nbins=max(2, shown // 2)))
                changed = True
    return changed


def _overlap(box_a, box_b, gap: float = -OVERLAP_PX) -> bool:
    """Whether two boxes come closer than ``gap`` pixels both ways (by default: share more than
    :data:`OVERLAP_PX`)."""
    wide = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
    tall = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
    return wide > -gap and tall > -gap


def _overlaps(drawn) -> list[str]:
    return [f"{a.get_text()!r} overlaps {b.get_text()!r}"
            for i, (a, box_a, _) in enumerate(drawn) for b, box_b, _ in drawn[i + 1:] if _overlap(box_a, box_b)]


def _legends_over_data(fig: Figure, renderer) -> list[str]:
    """Legends drawn over a line or a marker of their axes: a reader cannot see the data under the box (chapter
    14's memory figure hid its H100 line so). A legend outside the axes (:func:`viz.legend_below`) covers none."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    found = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        box = Bbox.intersection(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
        if box is None:
            continue
        box = box.padded(-OVERLAP_PX)
        covered = [line.get_label() for line in ax.get_lines() if line.get_visible() and len(line.get_xydata())
                   and line.get_transform().transform_path(line.get_path()).intersects_bbox(box, filled=False)]
        covered += [points.get_label() for points in ax.collections
                    if isinstance(points, PathCollection) and points.get_visible() and any(
                        box.contains(x, y) for x, y in points.get_offset_transform().transform(points.get_offsets()))]
        if covered:
            names = ", ".join(repr(name) for name in covered if not name.startswith("_")) or "unnamed data"
            found.append(f"the legend covers data ({names}): move it off the lines (viz.legend_below(ax), or loc=)")
    return found


def _heat_maps_without_scale(fig: Figure) -> list[str]:
    """Heat-maps (an image or a mesh in a graded colour map) that no colour bar explains: without one a reader
    cannot tell 0.2 from 0.8. A qualitative map of a few colours (``tab10``, naming groups the title explains)
    needs none; one colour bar serves every map with the same colours and limits."""
    from matplotlib.collections import QuadMesh

    maps = [m for ax in fig.axes for m in (*ax.images, *(c for c in ax.collections if isinstance(c, QuadMesh)))]

    def scale(m):
        return m.get_cmap().name, m.norm.vmin, m.norm.vmax

    explained = {scale(m) for m in maps if getattr(m, "colorbar", None) is not None}
    return [f"a heat-map in {m.get_cmap().name!r} has no colour bar: add fig.colorbar(image, ax=..., label=...)"
            for m in maps if m.get_cmap().N > 20 and scale(m) not in explained]


def _plain_math(texts) -> list[str]:
    found = []
    for text, _, _ in texts:
        s = text.get_text()
        outside = "".join(part for i, part in enumerate(s.split("$")) if i % 2 == 0)
        if _PLAIN_MATH.search(outside):
            found.append(f"{s!r} writes math as plain text (put it between $ signs: $QK^\\top$, $x_1$)")
    return found


def _png_width(data: bytes) -> int:
    return struct.unpack(">I", data[16:20])[0]


def render_png(fig: Figure, *, strict: bool = True) -> tuple[bytes, FigureReport]:
    """``fig`` fitted (:func:`fit`) and drawn to PNG bytes, with its :class:`FigureReport`. With ``strict`` (the
    default) a figure with problems raises :class:`UnreadableFigure` instead."""
    fit(fig)
    for _ in range(4):
        texts, renderer = _drawn_texts(fig)
        if _thin_crowded_ticks(fig, texts):
            texts, renderer = _drawn_texts(fig)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
        data = buffer.getvalue()
        width = _png_width(data)
        smallest = min((size for _, _, size in texts), default=TARGET_TEXT_PX * 2)
        if phone_text_px(smallest, width) >= MIN_TEXT_PX:
            break
        fit(fig, width_px=width)  # the tight crop came out wider than the figure: raise the text again
    problems = []
    shown = phone_text_px(smallest, width)
    if shown < MIN_TEXT_PX:
        problems.append(f"its smallest text shows at {shown:.1f} px on a phone, under {MIN_TEXT_PX:g}")
    problems += (_overlaps(texts) + _plain_math(texts) + _legends_over_data(fig, renderer)
                 + _heat_maps_without_scale(fig))
    report = FigureReport(width, smallest, shown, tuple(problems))
    if strict and problems:
        raise UnreadableFigure("this figure would not read in the book: " + "; ".join(problems)
                               + ". Give it fewer or shorter labels, more room (figsize), or one idea per figure.")
    return data, report


def _formatter(fig: Figure):
    # not strict: a notebook runs on (CI's nbval, a learner's GPU), and the report with its problems is stored
    # with the PNG, where tests/test_figures.py refuses it in the outputs the book shows
    data, report = render_png(fig, strict=False)
    return data, {METADATA_KEY: report.as_metadata()}


def install() -> bool:
    """Make IPython show every figure through :func:`render_png` (with its report in the output's metadata), now
    and before each cell, since matplotlib's inline backend may register its own formatter later. Returns whether
    there was an IPython to install into."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False

    if "inline" in matplotlib.get_backend():
        # loading the inline backend registers its own formatter: load it first, so that ours replaces it
        importlib.import_module("matplotlib_inline.backend_inline")

    def ensure(*_args) -> None:
        png = shell.display_formatter.formatters["image/png"]
        if png.type_printers.get(Figure) is not _formatter:
            png.for_type(Figure, _formatter)

    ensure()
    if not any(getattr(cb, "__name__", "") == "gpuformer_figures_ensure"
               for cb in shell.events.callbacks["pre_run_cell"]):
        ensure.__name__ = "gpuformer_figures_ensure"
        shell.events.register("pre_run_cell", ensure)
    return True
