"""A chapter's GPU view: measured, predicted and published numbers side by side, each labelled.

Every chapter ends its measurements with one table in this form, so that a reader who never runs a
notebook still sees what a GPU does, and can tell the three kinds of number apart:

- **measured**: timed or counted on the device that ran the page (:func:`measured`); its label names
  that device, and says so when a GPU profile was only rehearsed on a CPU;
- **predicted**: the course's own models (roofline time, FLOPs, bytes) from the datasheet figures of a
  T4 and an H100 in ``bench.known_gpus()`` (:func:`predicted`, with the predictors below);
- **published**: a figure from a public source, looked up in the registry (:func:`published`), which
  carries its hardware and source.

Predictors: :func:`compute_ceiling` (tensor cores for matrix products, CUDA cores for element-wise and
row-wise kernels: two roofs, not one), :func:`roofline_seconds` (max of compute time and memory time) and
:func:`matmul_prediction`.

Leaves out: measuring (``bench``), the registry's entries (``published_figures``), plotting rooflines
(``viz.plot_roofline``).
"""

from __future__ import annotations

import dataclasses
import html
import math
import numbers
from typing import Sequence

import torch

from gpuformer_lib import bench
from gpuformer_lib.published import KINDS, figure, format_value

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


def compute_ceiling(gpu: str, dtype: torch.dtype, *, tensor_cores: bool) -> float:
    """The compute roof in FLOP/s for work in ``dtype`` on ``gpu``.

    ``tensor_cores=True`` is for matrix products: the tensor-core peak of fp16/bf16 (TF32 for float32 on
    GPUs that have it, else the float32 rate). ``tensor_cores=False`` is for element-wise and row-wise
    kernels (softmax, layer norm, GELU, an add), which never run on tensor cores: their roof is the
    CUDA-core float32 rate, whatever the storage format (the arithmetic is done in float32). The two roofs
    differ 8-16x, so judging a softmax against the tensor-core peak misplaces it.
    """
    peak = datasheet(gpu)
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
    if not tensor_cores:
        return peak.fp32 * 1e12
    if dtype == torch.float32:
        return (peak.tf32 if peak.tf32 is not None else peak.fp32) * 1e12
    value = peak.fp16 if dtype == torch.float16 else peak.bf16
    if value is None:
        raise ValueError(f"the {peak.name} has no bfloat16 tensor cores (it needs compute capability 8.0 or "
                         "newer): predict for float16 instead")
    return value * 1e12


def bandwidth(gpu: str) -> float:
    """Datasheet memory bandwidth of ``gpu`` in bytes per second."""
    return datasheet(gpu).memory_bandwidth_gbs * 1e9


def roofline_seconds(flops: float, nbytes: float, gpu: str, dtype: torch.dtype, *, tensor_cores: bool) -> float:
    """Predicted time of one kernel: max(FLOPs / compute roof, bytes / bandwidth). A lower bound: a real
    kernel adds launch overhead (microseconds) and reaches only a fraction of either roof (chapter 1 measures how much)."""
    for name, value in (("flops", flops), ("nbytes", nbytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if flops == 0 and nbytes == 0:
        raise ValueError("a kernel with no FLOPs and no bytes has no time to predict")
    return max(flops / compute_ceiling(gpu, dtype, tensor_cores=tensor_cores), nbytes / bandwidth(gpu))


@dataclasses.dataclass(frozen=True)
class MatmulPrediction:
    """Roofline prediction for one (m, k) x (k, n) product, each operand read once and the result written once."""

    gpu: str
    flops: int
    nbytes: int
    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds

    @property
    def bound(self) -> str:
        """``'compute'`` or ``'memory'``: which roof the prediction sits under."""
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def matmul_prediction(m: int, n: int, k: int, dtype: torch.dtype, gpu: str) -> MatmulPrediction:
    """Roofline time of an m x k by k x n product in ``dtype`` on ``gpu`` (tensor cores)."""
    flops = bench.matmul_flops(m, n, k)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = (m * k + k * n + m * n) * itemsize
    return MatmulPrediction(datasheet(gpu).name, flops, nbytes, flops / compute_ceiling(gpu, dtype, tensor_cores=True),
                            nbytes / bandwidth(gpu))


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
    """A number the course's models predict for ``gpu`` from its datasheet figures; ``model`` says which
    model and inputs, e.g. ``'roofline: 2mnk / 989 TFLOP/s'``."""
    return ViewRow(quantity, "predicted", f"{datasheet(gpu).name} (datasheet)", float(value), unit, model)


def published(key: str, quantity: str | None = None) -> ViewRow:
    """The registry's figure ``key`` as a row; ``quantity`` renames it to match the rows it compares with."""
    f = figure(key)
    return ViewRow(quantity or f.quantity, "published", f.hardware, float(f.value), f.unit,
                   f"{f.title}, {f.where}", f.url)


_KIND_COLOUR = {"measured": "#1b7837", "predicted": "#2166ac", "published": "#762a83"}
"""One colour per kind, so a reader tells them apart at a glance (the word is always there too)."""


@dataclasses.dataclass(frozen=True)
class GpuView:
    """The rows of a chapter's GPU view; shows as an HTML table in a notebook and as text elsewhere."""

    title: str
    rows: tuple[ViewRow, ...]

    def __post_init__(self):
        if not self.rows:
            raise ValueError("a GPU view needs at least one row")
        if not all(isinstance(r, ViewRow) for r in self.rows):
            raise TypeError("rows must be ViewRows: build them with measured(), predicted() and published()")

    def kinds(self) -> set[str]:
        return {r.kind for r in self.rows}

    def value(self, quantity: str, kind: str, device_contains: str = "") -> float:
        """The one value of ``kind`` for ``quantity`` (on a device whose label contains ``device_contains``)."""
        hits = [r for r in self.rows if r.quantity == quantity and r.kind == kind and device_contains in r.device]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} rows for {quantity!r} {kind} {device_contains!r}, expected one")
        return hits[0].value

    def __str__(self) -> str:
        header = ("quantity", "kind", "device", "value", "basis")
        table = [header] + [(r.quantity, r.kind, r.device, f"{_shown(r.value, r.unit)} {r.unit}", r.basis)
                            for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        lines = [self.title]
        for row in table:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        body = []
        for r in self.rows:
            basis = esc(r.basis)
            if r.url:
                basis = f'<a href="{esc(r.url)}">{basis}</a>'
            cell = "padding:2px 8px;vertical-align:top"
            body.append(
                f'<tr class="gpuview-{r.kind}"><td style="{cell}">{esc(r.quantity)}</td>'
                f'<td style="{cell};color:{_KIND_COLOUR[r.kind]}"><b>{r.kind}</b></td>'
                f'<td style="{cell}">{esc(r.device)}</td>'
                f'<td style="{cell};text-align:right;white-space:nowrap">{esc(_shown(r.value, r.unit))} '
                f'{esc(r.unit)}</td><td style="{cell}">{basis}</td></tr>')
        return (f"<table class='gpuview'><caption style='caption-side:top;text-align:left'><b>{esc(self.title)}"
                "</b> &mdash; <b>measured</b>: on the device that ran this page; <b>predicted</b>: the course's "
                "models from datasheet figures; <b>published</b>: a cited source (appendix)</caption>"
                "<tr><th>quantity</th><th>kind</th><th>device</th><th>value</th><th>basis</th></tr>"
                + "".join(body) + "</table>")


ONE_DECIMAL_UNITS = ("(major.minor)",)
"""Units whose values always show one decimal: a compute capability 9.0 is '9.0', never '9'."""


def _shown(value: float, unit: str) -> str:
    """The value as a view shows it: one decimal for :data:`ONE_DECIMAL_UNITS`, else three significant figures."""
    if unit.strip() in ONE_DECIMAL_UNITS:
        return f"{value:.1f}"
    return format_value(_round(value))


def _round(value: float) -> float:
    """Three significant figures for display (the stored value keeps every digit); a whole number is shown
    whole (a published 15102 MBytes stays 15102, as its quote writes it)."""
    if value == 0:
        return 0.0
    if float(value).is_integer():
        return value
    digits = 3 - int(math.floor(math.log10(abs(value)))) - 1
    return round(value, digits)


def gpu_view(title: str, rows: Sequence[ViewRow]) -> GpuView:
    """A chapter's GPU view from its rows (measured, predicted and published)."""
    return GpuView(title, tuple(rows))
