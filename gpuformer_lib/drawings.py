"""Drawn diagrams, as SVG: the pictures a reader would rather look at than read about (the course's map, the
online softmax's tiles, a step's memory, a trace's two rows, tensor parallelism's split, a device mesh, ring
attention, the software stack).

Each function returns a :class:`Drawing`. Jupyter shows it (``_repr_svg_``), and the book shows the same SVG as
an image. Three rules make a drawing readable wherever it is shown; each drawing checks them as it is drawn
(:meth:`Drawing.check`), so a drawing that breaks one raises instead of shipping:

- **phone-sized text**: at most :data:`WIDTH` units wide and no text under :data:`MIN_FONT` units, so on a
  phone's 358 CSS px column its smallest text is still :data:`PHONE_MIN_PX` px or more
  (:meth:`Drawing.min_text_px`);
- **labels that fit and do not collide**: a box's label fits inside the box, and no two labels overlap,
  judged by an estimate of the text's width (:func:`text_width`: 0.6 em a character, generous for the sans
  fonts the book and Jupyter use);
- **light and dark pages**: a drawing brings its own white card, dark ink and pale fills, so it reads the same
  on a light page and on a dark one (on a transparent background, dark ink would vanish on a dark page).

Math in a label uses ``^{...}`` and ``_{...}`` for super- and subscripts (set smaller and raised or lowered)
and Unicode for the rest (ℓ, ′, −, √, ←).

Leaves out: numbers. A drawing is a schematic; the measured numbers are the chapters' cells' (the memory
timeline says "not to scale" on its face).
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from pathlib import Path

WIDTH = 540
"""The widest a drawing may be, in SVG units (CSS px at full size)."""
MIN_FONT = 15.0
"""The smallest text, in SVG units."""
TITLE_FONT = 16.0
"""A drawing's title and headings, in SVG units."""
PHONE_COLUMN_PX = 340
"""The narrowest a drawing is shown on a 390 px phone, in CSS px (a chapter's column is 358 px; a figure on a
Markdown page, with its margins, 344 px)."""
PHONE_MIN_PX = 9.0
"""The smallest text a phone may show, in CSS px."""
EM_PER_CHAR = 0.6
"""The estimated width of a character of the drawings' sans font, in em (an upper estimate)."""

INK = "#1f2328"
MUTED = "#57606a"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
FILLS = {"blue": "#dbe9f7", "orange": "#fde3c8", "green": "#dcf1d8", "purple": "#e8def3", "grey": "#eceef1",
         "red": "#f9d6d5", "yellow": "#fbf1c7", "white": "#ffffff"}
"""Pale fills: dark ink reads on every one of them."""
STROKES = {"blue": "#3b73b9", "orange": "#d9822b", "green": "#3c8d40", "purple": "#7b5aa6", "grey": "#8c959f",
           "red": "#c4403b", "yellow": "#b08800", "white": INK}

_MARKUP = re.compile(r"([_^])\{([^{}]*)\}")


def _runs(text: str) -> list[tuple[str, str]]:
    """``text`` as (kind, piece) runs: kind "" for plain text, "^" for a superscript, "_" for a subscript."""
    runs, at = [], 0
    for m in _MARKUP.finditer(text):
        if m.start() > at:
            runs.append(("", text[at:m.start()]))
        runs.append((m.group(1), m.group(2)))
        at = m.end()
    if at < len(text):
        runs.append(("", text[at:]))
    return runs


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """An upper estimate of a label's width in SVG units: :data:`EM_PER_CHAR` em a character (super- and
    subscripts at 0.75 of the size), 8 % more in bold."""
    em = sum(len(piece) * (0.75 if kind else 1.0) for kind, piece in _runs(text))
    return em * EM_PER_CHAR * size * (1.08 if bold else 1.0)


@dataclasses.dataclass(frozen=True)
class Label:
    """A line of text placed at baseline ``y``; ``anchor`` "start", "middle" or "end" of ``x``."""

    x: float
    y: float
    text: str
    size: float
    anchor: str = "start"
    bold: bool = False
    colour: str = INK
    inside: tuple[float, float, float, float] | None = None
    """The box (x, y, width, height) the label must fit in, if any."""

    def bounds(self) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) of the label's estimated extent."""
        w = text_width(self.text, self.size, bold=self.bold)
        left = self.x - {"start": 0.0, "middle": w / 2, "end": w}[self.anchor]
        sup = any(kind == "^" for kind, _ in _runs(self.text))
        sub = any(kind == "_" for kind, _ in _runs(self.text))
        return left, self.y - self.size * (0.95 if sup else 0.8), left + w, self.y + self.size * (0.35 if sub else 0.22)

    def svg(self) -> str:
        weight = ' font-weight="bold"' if self.bold else ""
        parts = []
        for kind, piece in _runs(self.text):
            piece = html.escape(piece, quote=False)
            if kind:
                shift = "super" if kind == "^" else "sub"
                parts.append(f'<tspan baseline-shift="{shift}" font-size="{0.75 * self.size:g}">{piece}</tspan>')
            else:
                parts.append(piece)
        return (f'<text x="{self.x:g}" y="{self.y:g}" font-size="{self.size:g}" text-anchor="{self.anchor}" '
                f'fill="{self.colour}"{weight}>{"".join(parts)}</text>')


class Drawing:
    """An SVG drawing ``width`` x ``height`` units on a white card, built by its methods and checked by
    :meth:`check` (called by :meth:`svg`)."""

    def __init__(self, name: str, width: float, height: float, title: str):
        if not 0 < width <= WIDTH or height <= 0:
            raise ValueError(f"a drawing is at most {WIDTH} units wide, got {width} x {height}")
        self.name, self.width, self.height, self.title = name, float(width), float(height), title
        self.shapes: list[str] = []
        self.labels: list[Label] = []

    # ----------------------------------------------------------------------------------------- drawing
    def box(self, x: float, y: float, w: float, h: float, lines: str | list[str] = (), *, fill: str = "blue",
            size: float = MIN_FONT, bold: bool = False, dashed: bool = False, rounded: float = 6,
            colour: str = INK) -> tuple[float, float, float, float]:
        """A filled box with ``lines`` of text centred in it (each must fit); returns (x, y, w, h)."""
        lines = [lines] if isinstance(lines, str) else list(lines)
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.shapes.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rounded:g}" '
                           f'fill="{FILLS[fill]}" stroke="{STROKES[fill]}" stroke-width="1.5"{dash}/>')
        step = size * 1.3
        first = y + h / 2 - step * (len(lines) - 1) / 2 + size * 0.35
        for i, line in enumerate(lines):
            self.labels.append(Label(x + w / 2, first + i * step, line, size, "middle", bold, colour, (x, y, w, h)))
        return x, y, w, h

    def text(self, x: float, y: float, text: str, *, size: float = MIN_FONT, anchor: str = "start",
             bold: bool = False, colour: str = INK) -> None:
        """A free label with its baseline at ``y``."""
        self.labels.append(Label(x, y, text, size, anchor, bold, colour))

    def line(self, x1: float, y1: float, x2: float, y2: float, *, arrow: bool = False, dashed: bool = False,
             colour: str = INK, width: float = 1.5) -> None:
        """A straight line, with an arrowhead at its end when ``arrow``."""
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.shapes.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{colour}" '
                           f'stroke-width="{width:g}"{dash}/>')
        if arrow:
            self._head(x2, y2, math.atan2(y2 - y1, x2 - x1), colour)

    def path(self, d: str, *, arrow_at: tuple[float, float, float] | None = None, colour: str = INK,
             width: float = 1.5, dashed: bool = False) -> None:
        """An SVG path ``d`` (no fill); ``arrow_at`` = (x, y, direction in radians) puts an arrowhead there."""
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.shapes.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width:g}"{dash}/>')
        if arrow_at:
            self._head(*arrow_at, colour)

    def polygon(self, points: list[tuple[float, float]], *, fill: str, opacity: float = 1.0) -> None:
        """A filled polygon (an area of a chart), outlined in its fill's stroke colour."""
        pts = " ".join(f"{x:g},{y:g}" for x, y in points)
        self.shapes.append(f'<polygon points="{pts}" fill="{FILLS[fill]}" stroke="{STROKES[fill]}" '
                           f'stroke-width="1" fill-opacity="{opacity:g}"/>')

    def _head(self, x: float, y: float, angle: float, colour: str) -> None:
        size = 8.0
        left = (x - size * math.cos(angle - 0.45), y - size * math.sin(angle - 0.45))
        right = (x - size * math.cos(angle + 0.45), y - size * math.sin(angle + 0.45))
        self.shapes.append(f'<polygon points="{x:g},{y:g} {left[0]:.1f},{left[1]:.1f} {right[0]:.1f},{right[1]:.1f}" '
                           f'fill="{colour}"/>')

    # ----------------------------------------------------------------------------------------- checks
    def min_text_px(self, column: float = PHONE_COLUMN_PX) -> float:
        """The smallest text's size in CSS px when the drawing is shown ``column`` px wide at most (an image is
        never shown wider than its own width)."""
        scale = min(1.0, column / self.width)
        return min(label.size for label in self.labels) * scale if self.labels else math.inf

    def problems(self) -> list[str]:
        """What breaks the rules of the module docstring, one line each; empty when the drawing is right."""
        found = []
        if self.min_text_px() < PHONE_MIN_PX:
            found.append(f"text of {self.min_text_px():.1f} px on a phone (at least {PHONE_MIN_PX:g})")
        for label in self.labels:
            left, top, right, bottom = label.bounds()
            if label.size < MIN_FONT:
                found.append(f"{label.text!r}: {label.size:g} units, under {MIN_FONT:g}")
            if left < 0 or top < 0 or right > self.width or bottom > self.height:
                found.append(f"{label.text!r} runs off the drawing")
            if label.inside:
                x, y, w, h = label.inside
                if left < x + 3 or right > x + w - 3 or top < y + 1 or bottom > y + h - 1:
                    found.append(f"{label.text!r} does not fit its box ({right - left:.0f} wide in {w:g})")
        for i, a in enumerate(self.labels):
            for b in self.labels[i + 1:]:
                (al, at, ar, ab), (bl, bt, br, bb) = a.bounds(), b.bounds()
                if al < br and bl < ar and at < bb and bt < ab:
                    found.append(f"{a.text!r} overlaps {b.text!r}")
        return found

    def check(self) -> "Drawing":
        found = self.problems()
        if found:
            raise ValueError(f"drawing {self.name!r}: " + "; ".join(found))
        return self

    # ----------------------------------------------------------------------------------------- output
    def svg(self) -> str:
        """The drawing as an SVG document (checked first)."""
        self.check()
        title = html.escape(self.title, quote=False)
        body = "\n".join(self.shapes + [label.svg() for label in self.labels])
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width:g} {self.height:g}" '
                f'width="{self.width:g}" height="{self.height:g}" role="img" font-family="{FONT}">\n'
                f"<title>{title}</title>\n"
                f'<rect x="0" y="0" width="{self.width:g}" height="{self.height:g}" rx="10" fill="#ffffff" '
                f'stroke="#d0d7de"/>\n{body}\n</svg>\n')

    def _repr_svg_(self) -> str:
        return self.svg()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.svg(), encoding="utf-8")
        return path


# --------------------------------------------------------------------------- the course


COURSE_PARTS = (
    ("Getting started", (("0", "Setup"),)),
    ("GPUs and how they compute", (("1", "Why GPUs"), ("2", "GPU programming"))),
    ("I · The Transformer from scratch", (("3", "Attention"), ("4", "Multi-head"), ("5", "Encoder-decoder"))),
    ("II · Training a Transformer", (("6", "Losses, optimizers"), ("7", "Training loop"))),
    ("III · Speed and memory on one GPU", (("8", "Mixed precision"), ("9", "Memory"), ("10", "Profiling"))),
    ("IV · Training on several GPUs", (("11", "Data parallel"), ("12", "Model parallel"))),
    ("V · Case studies", (("13", "Translation"), ("14", "Proteins"), ("15", "Forecasting"))),
    ("VI · Tools and what comes next", (("16", "Tools, next steps"),)),
)
"""The map's parts and chapters (number, short title), in the order of the table of contents
(``tests/test_drawings.py`` holds it against ``_toc.yml``)."""

_PART_FILLS = ("grey", "grey", "blue", "blue", "orange", "purple", "green", "yellow")


def course_map(parts=COURSE_PARTS) -> Drawing:
    """The course as a path: each part a band, its chapters inside it, from the hardware up to the case studies."""
    band_h, gap, margin = 66, 16, 12
    d = Drawing("course_map", WIDTH, 2 * margin + len(parts) * band_h + (len(parts) - 1) * gap,
                "The course's parts and chapters, in order")
    y = margin
    for i, ((title, chapters), fill) in enumerate(zip(parts, _PART_FILLS)):
        d.box(margin, y, WIDTH - 2 * margin, band_h, fill=fill, rounded=8)
        d.text(margin + 10, y + 21, title, size=TITLE_FONT, bold=True)
        n, inner = len(chapters), WIDTH - 2 * margin - 20
        chip_w = (inner - 8 * (n - 1)) / n
        for j, (number, short) in enumerate(chapters):
            d.box(margin + 10 + j * (chip_w + 8), y + 30, chip_w, 28, f"{number} {short}", fill="white", rounded=5)
        if i < len(parts) - 1:
            d.line(WIDTH / 2, y + band_h, WIDTH / 2, y + band_h + gap - 1, arrow=True, colour=MUTED)
        y += band_h + gap
    return d.check()


# --------------------------------------------------------------------------- chapter 3


def online_softmax_tiles() -> Drawing:
    """FlashAttention's loop for one tile of queries: key/value tiles arrive one at a time, each tile's scores
    update the running maximum m, normaliser ℓ and output accumulator a, and only the last step divides."""
    d = Drawing("online_softmax_tiles", WIDTH, 420, "One query tile against key and value tiles, left to right")
    d.text(12, 26, "One query tile meets the key/value tiles in turn", size=TITLE_FONT, bold=True)
    q_w, tile_w, gap, left = 118, 90, 8, 12
    x0 = left + q_w + 14
    d.box(left, 44, q_w, 48, ["query tile", "Q (b_{q} rows)"], fill="purple")
    tiles = [x0 + b * (tile_w + gap) for b in range(4)]
    for b, x in enumerate(tiles, start=1):
        d.box(x, 44, tile_w, 48, [f"K^{{({b})}}, V^{{({b})}}", "b_{k} keys"], fill="orange")
        d.box(x, 122, tile_w, 40, f"S^{{({b})}}", fill="yellow")
        d.line(x + tile_w / 2, 92, x + tile_w / 2, 120, arrow=True)
    d.text(left, 138, "scores of", size=MIN_FONT, colour=MUTED)
    d.text(left, 156, "one tile only", size=MIN_FONT, colour=MUTED)
    # the running state under each tile, left to right
    d.box(left, 196, q_w, 64, ["m = −∞", "ℓ = 0, a = 0"], fill="grey")
    for b, x in enumerate(tiles, start=1):
        d.box(x, 196, tile_w, 64, ["m, ℓ, a", f"after {b}"], fill="blue")
        d.line(x + tile_w / 2, 162, x + tile_w / 2, 194, arrow=True)
        before = left + q_w if b == 1 else tiles[b - 2] + tile_w
        d.line(before, 228, x - 1, 228, arrow=True)
    d.box(tiles[-1], 286, tile_w, 36, "O = a / ℓ", fill="green")
    d.line(tiles[-1] + tile_w / 2, 260, tiles[-1] + tile_w / 2, 284, arrow=True)
    d.text(left, 302, "each tile b updates:", size=MIN_FONT, bold=True)
    d.text(left, 334, "m′ = max(m, rowmax S^{(b)})", size=MIN_FONT)
    d.text(left, 360, "ℓ′ = ℓ e^{m − m′} + rowsum exp(S^{(b)} − m′)", size=MIN_FONT)
    d.text(left, 386, "a′ = a e^{m − m′} + exp(S^{(b)} − m′) V^{(b)}", size=MIN_FONT)
    d.text(left, 410, "No T × T matrix: one b_{q} × b_{k} tile of scores at a time.", size=MIN_FONT, colour=MUTED)
    return d.check()


# --------------------------------------------------------------------------- chapter 9


def memory_timeline() -> Drawing:
    """One training step's memory over time, as stacked areas: the weights and the optimizer's state all along,
    activations rising through the forward pass and freed through the backward pass, gradients growing as the
    backward pass reaches each layer, and the loss's temporaries on top at the peak."""
    d = Drawing("memory_timeline", WIDTH, 400, "Memory during one training step, schematic")
    d.text(12, 26, "Memory in one step (schematic, not to scale)", size=TITLE_FONT, bold=True)
    # time segments: (phase, width units, activations, gradients, loss temporaries), four layers each way
    segments = [("forward", 28, 30, 0, 0), ("forward", 28, 60, 0, 0), ("forward", 28, 90, 0, 0),
                ("forward", 28, 120, 0, 0), ("loss", 26, 120, 0, 35), ("loss", 26, 120, 0, 65),
                ("backward", 34, 120, 15, 0), ("backward", 34, 90, 30, 0), ("backward", 34, 60, 45, 0),
                ("backward", 34, 30, 60, 0), ("optimizer", 96, 0, 60, 0)]
    weights, state = 40, 80
    x0, x1, base, top = 44, 528, 330, 66
    total_units = sum(s[1] for s in segments)
    peak = max(weights + state + a + g + t for _, _, a, g, t in segments)
    sx, sy = (x1 - x0) / total_units, (base - top) / peak
    layers = [("weights", "blue"), ("optimizer state", "orange"), ("gradients", "purple"),
              ("activations", "green"), ("loss temporaries", "red")]
    edges, x = [], x0
    for _, units, a, g, t in segments:
        edges.append((x, x + units * sx, (weights, state, g, a, t)))
        x += units * sx
    for k, (_, fill) in enumerate(layers):
        upper, lower = [], []
        for left, right, heights in edges:
            below, height = sum(heights[:k]), heights[k]
            upper += [(left, base - (below + height) * sy), (right, base - (below + height) * sy)]
            lower += [(left, base - below * sy), (right, base - below * sy)]
        if any(h[k] for _, _, h in edges):
            d.polygon(upper + lower[::-1], fill=fill)
    d.line(x0, base, x1, base, colour=INK)
    d.line(x0, base, x0, top - 8, arrow=True, colour=INK)
    d.text(x0 + 6, top - 10, "memory", size=MIN_FONT, colour=MUTED)
    # the peak: at the loss's backward, before any activation is freed
    peak_y = base - peak * sy
    d.line(x0, peak_y, x1, peak_y, dashed=True, colour=STROKES["red"])
    d.text(x1, peak_y - 6, "peak: at the loss, before anything is freed", size=MIN_FONT, anchor="end",
           colour=STROKES["red"])
    # labels on their areas
    d.text(x0 + 8, base - weights * sy / 2 + 5, "weights", size=MIN_FONT)
    d.text(x0 + 8, base - (weights + state / 2) * sy + 5, "optimizer state (AdamW)", size=MIN_FONT)
    act_x = edges[5][0]
    d.text(act_x, base - (weights + state + 60) * sy + 5, "activations", size=MIN_FONT, anchor="middle")
    opt_left, opt_right, _ = edges[-1]
    d.text((opt_left + opt_right) / 2, base - (weights + state + 30) * sy + 5, "gradients", size=MIN_FONT,
           anchor="middle")
    d.text(edges[4][0] - 6, base - (weights + state + 120 + 20) * sy, "loss temporaries", size=MIN_FONT, anchor="end",
           colour=STROKES["red"])
    # phases under the axis
    spans: dict[str, list[float]] = {}
    for (phase, *_), (left, right, _) in zip(segments, edges):
        spans.setdefault(phase, [left, right])[1] = right
    for phase, (left, right) in spans.items():
        d.line(left + 2, base + 8, right - 2, base + 8, colour=MUTED)
        d.text((left + right) / 2, base + 28, phase, size=MIN_FONT, anchor="middle")
    d.text(12, 386, "zero_grad() frees the gradients before the next step", size=MIN_FONT,
           colour=MUTED)
    return d.check()


# --------------------------------------------------------------------------- chapter 10


def trace_rows() -> Drawing:
    """What a profiler trace shows on a GPU: the host row launching kernels, the stream row running them. Launch-
    bound, the stream waits between short kernels; GPU-bound, the host runs ahead and then waits in a sync."""
    d = Drawing("trace_rows", WIDTH, 372, "A trace's host row against its stream row, two cases")
    x0, x1 = 78, 528

    def panel(y, title, launches, kernels, sync=None):
        d.text(12, y, title, size=TITLE_FONT, bold=True)
        host_y, stream_y = y + 16, y + 62
        d.text(12, host_y + 20, "host", size=MIN_FONT)
        d.text(12, stream_y + 20, "stream", size=MIN_FONT)
        d.line(x0, host_y + 28, x1, host_y + 28, colour="#d0d7de")
        d.line(x0, stream_y + 28, x1, stream_y + 28, colour="#d0d7de")
        for (start, width), (k_start, k_width) in zip(launches, kernels):
            d.box(x0 + start, host_y + 4, width, 24, fill="blue", rounded=3)
            d.box(x0 + k_start, stream_y + 4, k_width, 24, fill="green", rounded=3)
            d.line(x0 + start + width / 2, host_y + 28, x0 + k_start + 2, stream_y + 4, colour=MUTED, width=1)
        if sync:
            start, width = sync
            d.box(x0 + start, host_y + 4, width, 24, "cudaStreamSynchronize", fill="red", rounded=3)
        return stream_y + 28

    # launch-bound: launches of 40, kernels of 14 right after each: gaps on the stream
    launches = [(i * 56, 40) for i in range(8)]
    kernels = [(s + 30, 14) for s, _ in launches]
    bottom = panel(28, "Launch-bound: the GPU waits for the host", launches, kernels)
    d.text(12, bottom + 24, "gaps on the stream row: fewer, larger kernels close them", size=MIN_FONT, colour=MUTED)
    # GPU-bound: launches packed at the start, kernels back to back, then the host waits
    launches = [(i * 22, 16) for i in range(8)]
    kernels = [(12 + i * 54, 52) for i in range(8)]
    bottom = panel(196, "GPU-bound: the host runs ahead, then waits", launches, kernels, sync=(184, 262))
    d.text(12, bottom + 24, "a solid stream row: the GPU never waits", size=MIN_FONT, colour=MUTED)
    d.text(12, 364, "blue: a launch; green: its kernel", size=MIN_FONT, colour=MUTED)
    d.text(x1, 364, "time →", size=MIN_FONT, anchor="end", colour=MUTED)
    return d.check()


# --------------------------------------------------------------------------- chapter 12


def tensor_parallel_mlp() -> Drawing:
    """Megatron's MLP on two ranks: W1 split by its output rows (column-parallel), the activation applied to each
    rank's hidden units alone, W2 split by the matching columns (row-parallel), and one all-reduce adding the two
    partial outputs."""
    d = Drawing("tensor_parallel_mlp", WIDTH, 446, "Tensor parallelism: an MLP split over two ranks")
    d.text(12, 26, "An MLP, Y = act(X W_{1}^{T}) W_{2}^{T}, on two ranks", size=TITLE_FONT, bold=True)
    lane_w, left = 250, 12
    lanes = (left, WIDTH - left - lane_w)
    d.box(left, 44, WIDTH - 2 * left, 36, "X: the same on both ranks", fill="grey")
    for r, x in enumerate(lanes):
        d.text(x + lane_w / 2, 110, f"rank {r}", size=TITLE_FONT, bold=True, anchor="middle")
        d.line(x + lane_w / 2, 80, x + lane_w / 2, 94, arrow=True)
        d.box(x, 120, lane_w, 64, ["column-parallel: half of", "W_{1}'s rows (hidden units)"], fill="blue")
        d.line(x + lane_w / 2, 184, x + lane_w / 2, 200, arrow=True)
        d.box(x, 202, lane_w, 36, f"H_{{{r}}} = act(X W_{{1,{r}}}^{{T}})", fill="blue")
        d.line(x + lane_w / 2, 238, x + lane_w / 2, 254, arrow=True)
        d.box(x, 256, lane_w, 64, ["row-parallel: the matching", "half of W_{2}'s columns"], fill="orange")
        d.line(x + lane_w / 2, 320, x + lane_w / 2, 336, arrow=True)
        d.box(x, 338, lane_w, 36, f"Y_{{{r}}} = H_{{{r}}} W_{{2,{r}}}^{{T}} (partial)", fill="orange")
        d.line(x + lane_w / 2, 374, x + lane_w / 2, 390, arrow=True)
    d.box(left, 392, WIDTH - 2 * left, 42, "all-reduce: Y = Y_{0} + Y_{1}, the only exchange forward", fill="red",
          bold=True)
    return d.check()


def device_mesh() -> Drawing:
    """A 2 x 2 device mesh: tensor parallel inside each pair (every layer, over the fast links), FSDP2 across the
    pairs (all-gathered weights, reduce-scattered gradients); each rank holds a quarter of each weight."""
    d = Drawing("device_mesh", WIDTH, 380, "A 2 x 2 device mesh: tensor parallel in a pair, FSDP2 across pairs")
    d.text(12, 26, "A 2 × 2 mesh of four ranks", size=TITLE_FONT, bold=True)
    box_w, box_h, left, top = 176, 70, 52, 84
    right = WIDTH - 12 - box_w
    for row in range(2):
        for col in range(2):
            x, y = (left, right)[col], top + row * 170
            d.box(x, y, box_w, box_h, [f"rank {2 * row + col}", f"TP half {col}", f"FSDP half {row}"], fill="blue")
        y = top + row * 170 + box_h / 2
        d.line(left + box_w, y, right, y, colour=STROKES["orange"], width=3)
        d.text((left + box_w + right) / 2, y - 10, "TP", size=MIN_FONT, anchor="middle", bold=True,
               colour=STROKES["orange"])
        d.text((left + box_w + right) / 2, y + 22, "every layer", size=MIN_FONT, anchor="middle",
               colour=STROKES["orange"])
    for col in range(2):
        x = (left, right)[col] + box_w / 2
        d.line(x, top + box_h, x, top + 170, colour=STROKES["green"], width=3, dashed=True)
    d.text(left + box_w / 2 + 8, top + box_h + 30, "FSDP2: all-gather weights,", size=MIN_FONT, colour=STROKES["green"])
    d.text(left + box_w / 2 + 8, top + box_h + 50, "reduce-scatter gradients", size=MIN_FONT, colour=STROKES["green"])
    d.text(12, 60, "tensor parallel (TP) inside each pair, on the fast links", size=MIN_FONT, colour=MUTED)
    d.text(12, 352, "Each rank holds a quarter of each weight: a half by TP,", size=MIN_FONT, colour=MUTED)
    d.text(12, 372, "and half of that by FSDP2.", size=MIN_FONT, colour=MUTED)
    return d.check()


def ring_attention(n: int = 4) -> Drawing:
    """Ring attention on ``n`` ranks: rank r holds the queries of chunk r; at step j it attends to chunk
    (r - j) mod n and passes that chunk's keys and values to rank r + 1. With a causal mask a chunk from a later
    rank is all future and skipped."""
    d = Drawing("ring_attention", WIDTH, 400, f"Ring attention on {n} ranks")
    d.text(12, 26, f"Ring attention on {n} ranks (causal)", size=TITLE_FONT, bold=True)
    box_w, gap, left = 100, 24, 42
    xs = [left + r * (box_w + gap) for r in range(n)]
    for r, x in enumerate(xs):
        d.box(x, 44, box_w, 48, [f"rank {r}", f"Q_{{{r}}}, K_{{{r}}}, V_{{{r}}}"], fill="purple")
        if r < n - 1:
            d.line(x + box_w, 68, x + box_w + gap - 1, 68, arrow=True)
    # the ring closes: from the last rank back to the first, below the boxes
    end, start = xs[-1] + box_w / 2, xs[0] + box_w / 2
    d.path(f"M {end:g} 92 L {end:g} 112 L {start:g} 112 L {start:g} 94", arrow_at=(start, 93, -math.pi / 2))
    d.text((start + end) / 2, 130, "K, V move one rank on each step", size=MIN_FONT, anchor="middle", colour=MUTED)
    # which chunk each rank attends to at each step
    row_h, top = 44, 166
    d.text(12, top - 12, "step", size=MIN_FONT, colour=MUTED)
    for j in range(n):
        y = top + j * row_h
        d.text(12, y + 27, f"{j}", size=MIN_FONT)
        for r, x in enumerate(xs):
            chunk = (r - j) % n
            if j <= r:
                d.box(x, y, box_w, row_h - 6, f"K_{{{chunk}}}, V_{{{chunk}}}", fill="green" if j else "blue")
            else:
                d.box(x, y, box_w, row_h - 6, "skip", fill="grey", dashed=True, colour=MUTED)
    d.text(12, top + n * row_h + 16, "skip: the chunk's keys all lie in the future", size=MIN_FONT, colour=MUTED)
    d.text(12, top + n * row_h + 38, "partials merge by log-sum-exp, as in chapter 3", size=MIN_FONT, colour=MUTED)
    return d.check()


# --------------------------------------------------------------------------- chapter 16


def software_stack() -> Drawing:
    """The layers under ``y = x @ w`` on an NVIDIA GPU, and which come with ``pip install torch`` and which with
    the machine: each can be the one that is missing or too old."""
    d = Drawing("software_stack", WIDTH, 398, "The software stack under PyTorch")
    d.text(12, 26, "What runs y = x @ w on an NVIDIA GPU", size=TITLE_FONT, bold=True)
    left, w, h, gap = 12, 372, 44, 10
    rows = [("your code: the model, the training loop", "grey", None),
            ("PyTorch: tensors, autograd, nn, optim", "blue", None),
            (None, None, None),
            ("CUDA runtime", "blue", None),
            ("NVIDIA driver (nvidia-smi)", "orange", None),
            ("the GPU: SMs, tensor cores, HBM", "orange", None)]
    ys = [44 + i * (h + gap) for i in range(len(rows))]
    for (text, fill, _), y in zip(rows, ys):
        if text:
            d.box(left, y, w, h, text, fill=fill)
    # the libraries' row: three boxes side by side
    y = ys[2]
    d.box(left, y, 226, h, "cuBLAS · cuDNN · NCCL", fill="blue")
    d.box(left + 236, y, w - 236, h, "Triton kernels", fill="blue")
    # brackets: what pip installs, what the machine brings
    bx = left + w + 14
    for (first, last, lines, colour) in ((1, 3, ["pip install", "torch", "(wheels)"], STROKES["blue"]),
                                         (4, 5, ["the", "machine"], STROKES["orange"])):
        top, bottom = ys[first], ys[last] + h
        d.path(f"M {bx:g} {top:g} L {bx + 8:g} {top:g} L {bx + 8:g} {bottom:g} L {bx:g} {bottom:g}",
               colour=colour, width=2)
        mid = (top + bottom) / 2 - 9 * (len(lines) - 1)
        for i, line in enumerate(lines):
            d.text(bx + 16, mid + 18 * i + 5, line, size=MIN_FONT, colour=colour)
    d.text(12, 380, "torch.compile writes Triton kernels; NCCL all-reduces", size=MIN_FONT, colour=MUTED)
    return d.check()


DRAWINGS = {"course_map": course_map, "online_softmax_tiles": online_softmax_tiles,
            "memory_timeline": memory_timeline, "trace_rows": trace_rows, "tensor_parallel_mlp": tensor_parallel_mlp,
            "device_mesh": device_mesh, "ring_attention": ring_attention, "software_stack": software_stack}
"""Every drawing by name: the book's pages show each one (``tests/test_drawings.py``)."""


BOOK_FILES = {"course_map": "book/diagrams/course_map.svg"}
"""The drawings the book's Markdown pages show as files (a notebook shows its drawing as a cell's output)."""


def main(argv: list[str] | None = None) -> int:
    """Write :data:`BOOK_FILES` (``python -m gpuformer_lib.drawings``), or with ``--check`` say whether they are
    current (exit status 1 when one is not)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpuformer_lib.drawings", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="only check that the files are current")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    stale = []
    for name, relative in BOOK_FILES.items():
        path, svg = root / relative, DRAWINGS[name]().svg()
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != svg:
                stale.append(relative)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(svg, encoding="utf-8")
            print(f"wrote {relative}")
    for relative in stale:
        print(f"{relative} is not current: run python -m gpuformer_lib.drawings")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
