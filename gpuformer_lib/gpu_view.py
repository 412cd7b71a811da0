"""A chapter's GPU view: measured, predicted and published numbers side by side, each labelled.

Every chapter ends its measurements with one table in this form, so that a reader who never runs a
notebook still sees what a GPU does, and can tell the three kinds of number apart:

- **measured**: timed or counted on the device that ran the page (:func:`measured`); its label names
  that device, and says so when a GPU profile was only rehearsed on a CPU;
- **predicted**: the course's predictor (``gpuformer_lib.predict``) for a T4 and an H100 of
  ``bench.known_gpus()`` (:func:`predicted`), with its validated error beside;
- **published**: a figure from a public source, looked up in the registry (:func:`published`), which
  carries its hardware and source.

:func:`datasheet` finds a GPU's datasheet peaks by name.

Leaves out: predicting (``predict``: the datasheet roofline is ``predict.roofline``), measuring (``bench``), the registry's entries (``published_figures``), plotting rooflines
(``viz.plot_roofline``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Sequence

import torch

from gpuformer_lib import bench, gpu_results
from gpuformer_lib.gpu_results import shown
from gpuformer_lib.published import KINDS, figure

PREDICTION_GPUS = ("T4", "H100 SXM")
"""The two GPUs every chapter predicts for: the Colab T4 a learner may have, and a data-centre H100."""


# --------------------------------------------------------------------------- predictors


def datasheet(gpu: str) -> bench.GpuPeak:
    """The datasheet peaks of a GPU named as in ``bench.known_gpus()`` (``'T4'``, ``'H100 SXM'``, ...)."""
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a name such as 'T4' or 'H100 SXM', got {gpu!r}")
    for peak in bench.known_gpus():
        if peak.name.lower() == gpu.lower():
            return peak
    peak = bench.lookup_gpu_peak(gpu)
    if peak is None:
        raise ValueError(f"{gpu!r} is not in the datasheet table; choose one of "
                         f"{', '.join(p.name for p in bench.known_gpus())}")
    return peak


# --------------------------------------------------------------------------- rows and the view


@dataclasses.dataclass(frozen=True)
class ViewRow:
    """One number of a GPU view."""

    quantity: str
    """What the number is, the same words on every row that compares the same thing."""
    kind: str
    """``'measured'``, ``'predicted'`` or ``'published'``."""
    device: str
    """Where: the device that ran the page, the GPU predicted for, or the published hardware."""
    value: float
    unit: str
    basis: str
    """How it was obtained: the measurement, the model and its inputs, or the source."""
    url: str = ""
    key: str = ""
    """A published row's key in the registry: the book links its value to the appendix's entry."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real) or not math.isfinite(self.value):
            raise ValueError(f"{self.quantity}: value must be a finite number, got {self.value!r}")
        if self.value < 0:
            raise bench.ImpossibleValueError(f"{self.quantity}: a negative {self.unit} ({self.value!r}) is impossible")
        if self.unit.strip() == "%" and self.value > 100:
            raise bench.ImpossibleValueError(f"{self.quantity} = {self.value:.0f} % is over 100 %: check the "
                                             "ceiling it is a fraction of")


@dataclasses.dataclass(frozen=True)
class SuiteLink:
    """A quantity of the view that the GPU suite measures: its committed results show in the view's row of that
    quantity, one column per device (:mod:`gpuformer_lib.gpu_results`)."""

    quantity: str
    item: str
    """The suite item's key, ``chNN.name`` (``python -m gpuformer_lib.gpu_suite --list``)."""
    path: str
    """Where the number is in the item's record: ``values.NAME``, ``measurements.NAME`` (its median),
    ``comparisons.NAME.speedup``."""
    unit: str
    scale: float = 1.0
    """What the stored number is multiplied by to be in ``unit`` (stored seconds shown in ms: 1e3)."""
    predicted_path: str = ""
    """Where the item recorded its own prediction of the same number on that device, if it did: shown in the
    columns of GPUs the page makes no prediction for (the H200's, for one)."""

    def __post_init__(self):
        # the item's existence is checked by tests/test_gpu_results.py: importing the suite's items here would
        # import its kernels into every chapter
        if not re.fullmatch(r"ch\d\d\.[a-z0-9_]+", self.item):
            raise ValueError(f"item must be a suite item's key such as 'ch05.training_step', got {self.item!r}")
        for path in (self.path, self.predicted_path or "values.x"):
            if path.split(".")[0] not in ("values", "measurements", "comparisons") or path.count(".") < 1:
                raise ValueError(f"path must be values.NAME, measurements.NAME or comparisons.NAME.FIELD, got "
                                 f"{path!r}")
        if not (isinstance(self.scale, numbers.Real) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number, got {self.scale!r}")


def device_label() -> str:
    """The device that ran this page, as a measured row names it; a rehearsal says it is a CPU's number."""
    from gpuformer_lib.device import hardware_summary
    from gpuformer_lib.profiles import current_profile, display_only

    profile = current_profile()
    if profile.rehearsal:
        with display_only():  # a label: no choice is made from the profile's name
            return f"this page's CPU (rehearsing {profile.name}: not a GPU's number)"
    summary = hardware_summary()
    if summary.gpu_name is not None:
        return summary.gpu_name
    n = summary.torch_threads
    return f"this page's CPU ({summary.cpu_model}, torch uses {n} thread{'' if n == 1 else 's'})"


def measured(quantity: str, value: float, unit: str, *, how: str, device: str | None = None) -> ViewRow:
    """A number measured on the device that ran the page (``device`` defaults to :func:`device_label`)."""
    return ViewRow(quantity, "measured", device or device_label(), float(value), unit, how)


def predicted(quantity: str, value: float, unit: str, *, gpu: str, model: str) -> ViewRow:
    """A number the course's predictor (``gpuformer_lib.predict``) gives for ``gpu`` (a datasheet name);
    ``model`` says which inputs and what set it, e.g. ``'course predictor, eager; host-bound'``. The row's
    device reads ``'<GPU> (course predictor)'``."""
    return ViewRow(quantity, "predicted", f"{datasheet(gpu).name} (course predictor)", float(value), unit, model)


def published(key: str, quantity: str | None = None) -> ViewRow:
    """The registry's figure ``key`` as a row; ``quantity`` renames it to match the rows it compares with."""
    f = figure(key)
    return ViewRow(quantity or f.quantity, "published", f.hardware, float(f.value), f.unit,
                   f"{f.title}, {f.where}", f.url, f.key)


def on_gpus(quantity: str, item: str, path: str, unit: str, *, scale: float = 1.0, predicted: str = "") -> SuiteLink:
    """The row of ``quantity`` shows every committed GPU measurement of suite ``item`` at ``path`` (in ``unit``,
    the stored number times ``scale``), and says plainly where none has been committed yet; ``predicted`` is the
    path of the item's own prediction of that number, where it records one."""
    return SuiteLink(quantity, item, path, unit, float(scale), predicted)


@dataclasses.dataclass(frozen=True)
class GpuView:
    """The rows of a chapter's GPU view and its links to the GPU suite; shows as an HTML table in a notebook
    (one row per quantity, one column per device) and as text elsewhere."""

    title: str
    rows: tuple[ViewRow, ...]
    links: tuple[SuiteLink, ...] = ()

    def __post_init__(self):
        if not self.rows:
            raise ValueError("a GPU view needs at least one row")
        if not all(isinstance(r, ViewRow) for r in self.rows):
            raise TypeError("rows must be ViewRows: build them with measured(), predicted() and published()")
        if not all(isinstance(link, SuiteLink) for link in self.links):
            raise TypeError("links must be SuiteLinks: build them with on_gpus()")

    def kinds(self) -> set[str]:
        return {r.kind for r in self.rows}

    def value(self, quantity: str, kind: str, device_contains: str = "") -> float:
        """The one value of ``kind`` for ``quantity`` (on a device whose label contains ``device_contains``)."""
        hits = [r for r in self.rows if r.quantity == quantity and r.kind == kind and device_contains in r.device]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} rows for {quantity!r} {kind} {device_contains!r}, expected one")
        return hits[0].value

    def spec(self) -> dict:
        """Everything the view shows but the committed GPU results: what the page stores, so that the book's
        build can draw the view again with the results committed since (``gpu_results.redraw_views``)."""
        here = next((r.device for r in self.rows if r.kind == "measured"), "")
        return {"title": self.title, "here": here, "rows": [dataclasses.asdict(r) for r in self.rows],
                "links": [dataclasses.asdict(link) for link in self.links]}

    def __str__(self) -> str:
        header = ("quantity", "kind", "device", "value", "basis")
        table = [header] + [(r.quantity, r.kind, r.device, f"{shown(r.value, r.unit)} {r.unit}", r.basis)
                            for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        lines = [self.title]
        for row in table:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
        if self.links:
            lines.append("measured on GPUs (committed suite results): "
                         + "; ".join(f"{link.quantity} <- {link.item} {link.path}" for link in self.links))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return gpu_results.render_view(self.spec(), gpu_results.load_results())


def gpu_view(title: str, rows: Sequence[ViewRow | SuiteLink]) -> GpuView:
    """A chapter's GPU view from its rows (measured, predicted and published) and its links to the GPU suite
    (:func:`on_gpus`), in any order."""
    rows = tuple(rows)
    return GpuView(title, tuple(r for r in rows if not isinstance(r, SuiteLink)),
                   tuple(r for r in rows if isinstance(r, SuiteLink)))
