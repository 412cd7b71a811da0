"""Published GPU figures: numbers the course did not measure, each with the source it was read from.

The book shows three kinds of GPU number, labelled: *measured* on the device that ran the page,
*predicted* by the course's predictor (``predict``), and *published*, which
live here. A figure enters the registry only from a source its author opened and read: with the
number and its unit, the hardware, the software versions where the source gives them, the source's URL
and title, the table or figure it comes from, and a short verbatim quote that contains the number.
``tests/test_published.py`` checks every entry has all of these and that the quote contains the number;
``python -m gpuformer_lib.published`` writes the book's appendix page listing every entry.

The entries themselves are in :mod:`gpuformer_lib.published_figures`, one tuple per topic.

Leaves out: the course's predictions (``predict``) and the datasheet peak table (``bench.known_gpus``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from pathlib import Path

KINDS = ("measured", "predicted", "published")


@dataclasses.dataclass(frozen=True)
class PublishedFigure:
    """One number from a public source, as the source states it."""

    key: str
    """Short unique name used by the notebooks, e.g. ``'h100-sxm-bf16-dense-peak'``."""
    value: float
    """The number, in ``unit``, as the source gives it (no conversion)."""
    unit: str
    """Its unit as the source states it, e.g. ``'TFLOPS'``, ``'TB/s'``, ``'ms'``, ``'x'``."""
    quantity: str
    """What was measured or specified, in a few words, e.g. ``'dense BF16 Tensor Core peak'``."""
    hardware: str
    """The device (and how many), e.g. ``'NVIDIA H100 SXM5 80GB'``."""
    software: str
    """Software versions where the source gives them; ``'not stated'`` where it does not."""
    url: str
    """Where the source is (https)."""
    title: str
    """The source's title."""
    where: str
    """The table, figure or section of the source the number comes from."""
    quote: str
    """A short verbatim quote from the source that contains the number."""
    chapters: tuple[int, ...]
    """Chapters that show the figure."""
    note: str = ""
    """What a reader should know to compare it with the course's own numbers (optional)."""

    def __post_init__(self):
        for field in ("key", "unit", "quantity", "hardware", "software", "url", "title", "where", "quote"):
            text = getattr(self, field)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"published figure {self.key!r}: {field} must be a non-empty string")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", self.key):
            raise ValueError(f"published figure key {self.key!r}: use lower-case letters, digits, '.' and '-'")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ValueError(f"published figure {self.key!r}: value must be a finite number, got {self.value!r}")
        if not self.url.startswith("https://"):
            raise ValueError(f"published figure {self.key!r}: url must start with https://, got {self.url!r}")
        if not quote_contains(self.quote, self.value):
            raise ValueError(f"published figure {self.key!r}: the quote {self.quote!r} does not contain the "
                             f"number {self.value!r}: quote the sentence or table row the number is read from")
        if not self.chapters or not all(isinstance(c, int) and c >= 0 for c in self.chapters):
            raise ValueError(f"published figure {self.key!r}: chapters must name the chapters that show it")

    @property
    def written(self) -> str:
        """The number with as many decimals as the quote writes it: ``9.0`` stays ``9.0``, where
        :func:`format_value` would drop the zero that a version number such as a compute capability needs."""
        token = written_in(self.quote, self.value)
        if token is None or "." not in token or abs(self.value) >= 1e6:
            return format_value(self.value)
        return f"{self.value:.{len(token.split('.')[1])}f}"  # the quote's decimals: "9.0", "0.80"

    @property
    def label(self) -> str:
        """``value unit``, as printed on a page, the number written as the source writes it."""
        return f"{self.written} {self.unit}"


def figure_anchor(key: str) -> str:
    """The HTML id of a figure's entry on the appendix page (what Sphinx makes of the label: dots become
    hyphens), which a GPU view's published value links to."""
    return "fig-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def format_value(value: float) -> str:
    """The number as written in a source: no trailing zeros, thousands not separated."""
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.0f}"


def written_in(quote: str, value: float) -> str | None:
    """The first token of ``quote`` that writes ``value`` (with or without thousands separators, trailing
    zeros or a sign), as the quote writes it less its separators; ``None`` when none does."""
    plain = quote.replace(",", "").replace("\u2009", "").replace("\u202f", "")
    for token in re.findall(r"\d+(?:\.\d+)?|\.\d+", plain):  # "0.6" may be written ".6" (C source)
        if math.isclose(float(token), abs(value), rel_tol=0, abs_tol=1e-9):
            return token
    return None


def quote_contains(quote: str, value: float) -> bool:
    """Whether ``quote`` writes ``value`` (with or without thousands separators, trailing zeros or a sign)."""
    return written_in(quote, value) is not None


@functools.lru_cache(maxsize=None)
def figures() -> tuple[PublishedFigure, ...]:
    """Every registered figure, in registry order, each checked as it is built; keys are unique."""
    from gpuformer_lib.published_figures import FIGURES

    built = tuple(PublishedFigure(**entry) for entry in FIGURES)
    keys = [f.key for f in built]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise ValueError(f"published figure keys must be unique; repeated: {duplicated}")
    return built


def figure(key: str) -> PublishedFigure:
    """The figure registered under ``key``; a ``KeyError`` that lists the keys otherwise."""
    for entry in figures():
        if entry.key == key:
            return entry
    raise KeyError(f"no published figure {key!r}; registered: {', '.join(f.key for f in figures())}")


def appendix_markdown() -> str:
    """The book's appendix page: every entry, grouped by chapter, with its source and quote."""
    lines = [
        "# Appendix: published GPU figures",
        "",
        "Every number the book labels **published** is listed here with the source it was read from: the",
        "hardware, the software where the source states it, the table or figure, and a verbatim quote that",
        "contains the number. The course did not measure these numbers; compare them with the **measured**",
        "(on the device that ran the page) and **predicted** (the course's predictor and memory calculator)",
        "numbers beside them on each page. The entries live in",
        "`gpuformer_lib/published_figures.py`; a test checks each has all its fields and that its quote",
        "contains its number, and another that this page is up to date (`python -m gpuformer_lib.published`",
        "writes it).",
        "",
    ]
    by_chapter: dict[int, list[PublishedFigure]] = {}
    for entry in figures():
        by_chapter.setdefault(min(entry.chapters), []).append(entry)
    for chapter in sorted(by_chapter):
        lines += [f"## First shown in chapter {chapter}", ""]
        for e in by_chapter[chapter]:
            lines += [
                f"({figure_anchor(e.key)})=",  # the anchor a GPU view's published value links to
                f"### `{e.key}`: {e.label}",
                "",
                f"- **What**: {e.quantity}",
                f"- **Hardware**: {e.hardware}",
                f"- **Software**: {e.software}",
                f"- **Source**: [{e.title}]({e.url}), {e.where}",
                f"- **Quote**: \u201c{e.quote}\u201d",
                f"- **Shown in chapters**: {', '.join(str(c) for c in e.chapters)}",
            ]
            if e.note:
                lines.append(f"- **Note**: {e.note}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


APPENDIX = Path(__file__).resolve().parent.parent / "book" / "published_figures.md"


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuformer_lib.published [--check]``: write (or check) the appendix page."""
    argv = sys.argv[1:] if argv is None else argv
    text = appendix_markdown()
    if argv == ["--check"]:
        if not APPENDIX.exists() or APPENDIX.read_text() != text:
            print(f"{APPENDIX} is out of date: run python -m gpuformer_lib.published", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python -m gpuformer_lib.published [--check]", file=sys.stderr)
        return 2
    APPENDIX.write_text(text)
    print(f"wrote {APPENDIX} ({len(figures())} figures)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
