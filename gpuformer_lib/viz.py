"""Plots the chapters share, and the bridge from a notebook's numbers to the book's prose.

Covers: the roofline plot (measured ceilings, datasheet ceilings, operations placed on it);
attention heat-maps, and an explorer widget (pick a head and a query) that keeps working in the
static book because every view is rendered ahead of time and the controls are linked in the
browser; and :func:`glue` with :func:`prose`, which hand a measured value to the prose (so no number in the
text is typed by hand): a prose cell's Markdown output reads the same in the book, JupyterLab and Colab.

Also chapter 9's memory calculator (:func:`memory_calculator`): HTML controls and a script that
recomputes in the page, so it works in the static book without a kernel; its formulas are ported to
``js/memory_calculator.js`` and tested against ``memory``'s on a grid of every control value.

Leaves out: the roofline arithmetic itself (``bench``).
"""

from __future__ import annotations

import dataclasses
import html
import importlib.resources
import itertools
import json
import math
import re
import uuid
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np

from gpuformer_lib import bench, figures
from gpuformer_lib._checks import require_bools

figures.install()  # a notebook that imports this module shows its figures fitted and checked for a phone


class _PlainText:
    """Shows a string without the quotes its repr would add (where myst-nb is missing, e.g. Colab)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


GLUED: dict[str, str] = {}
"""Every value :func:`glue` recorded in this process, as the text the book shows (a string as itself, a number
as its ``str``): what :func:`prose` fills its ``{{name}}`` slots with."""

_SLOT = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the prose (``{{name}}`` in a :func:`prose` cell) and for myst-nb.

    Strings are glued as strings: their stored ``text/plain`` is the quoted ``repr``, which myst-nb's
    ``format_plain_text`` turns back into the exact string with ``ast.literal_eval``. (An unquoted
    "28,976" would be evaluated as the tuple ``(28, 976)``, and a ``\\t`` in "\\times" as a tab.)
    Without myst-nb the value is only displayed (when ``display`` is true), unquoted. Returns None,
    so a glue on a cell's last line adds no output.
    """
    GLUED[name] = value if isinstance(value, str) else str(value)
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as ipy_display

            ipy_display(_PlainText(value) if isinstance(value, str) else value)
        return
    myst_glue(name, str(value) if isinstance(value, str) else value, display=display)


def prose(template: str):
    """``template`` (Markdown) with each ``{{name}}`` replaced by the value :func:`glue` recorded under
    ``name``, as a Markdown output: a sentence whose numbers and words the measurement chose.

    A notebook writes such sentences in a code cell tagged ``remove-input`` and ``prose``: the book shows only
    the rendered output, as part of the page's text, and JupyterLab and Colab render it below the cell (a
    markdown cell's ``{glue:text}`` role rendered only in the book). Raises ``KeyError`` for a name nothing has
    glued yet (the cell that measures it has not run), and ``ValueError`` for a template without a slot (plain
    text belongs in a markdown cell)."""
    from IPython.display import Markdown

    if not isinstance(template, str):
        raise TypeError(f"prose takes the Markdown text as a str, got {type(template).__name__}")
    names = _SLOT.findall(template)
    if not names:
        raise ValueError("prose() text has no {{name}} slot: text that depends on no measured value belongs in a "
                         "markdown cell")
    missing = sorted({n for n in names if n not in GLUED})
    if missing:
        raise KeyError(f"prose() needs {', '.join(missing)}, which no cell has glued yet: run the cells above this "
                       "one first (Run > Run All Above)")
    return Markdown(_SLOT.sub(lambda m: GLUED[m.group(1)], template.strip("\n")))


def plot_roofline(
    peak_flops: float,
    bandwidth: float,
    points: Sequence[tuple[str, float, float]] = (),
    *,
    extra_ceilings: Sequence[tuple[str, float]] = (),
    device_name: str = "",
    ax: plt.Axes | None = None,
) -> plt.Axes:
    """Draw a roofline: FLOP/s against arithmetic intensity (FLOP/byte), both axes logarithmic.

    ``peak_flops`` and ``bandwidth`` (bytes/s) make the main roof; ``extra_ceilings`` adds other
    compute roofs as ``(label, flops)``; ``points`` places operations as
    ``(label, intensity, achieved_flops)``.
    """
    if not (0 < peak_flops < math.inf and 0 < bandwidth < math.inf):
        raise ValueError(f"peak_flops and bandwidth must be positive and finite, got {peak_flops} and {bandwidth}")
    for point in points:  # both axes are logarithmic: a point at 0 or below would vanish without a word
        if len(point) != 3 or not (0 < point[1] < math.inf and 0 < point[2] < math.inf):
            raise ValueError(f"each point is (label, FLOP/byte > 0, FLOP/s > 0), got {point!r}")
    for ceiling in extra_ceilings:
        if len(ceiling) != 2 or not 0 < ceiling[1] < math.inf:
            raise ValueError(f"each extra ceiling is (label, FLOP/s > 0), got {ceiling!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5.5))
    ridge = peak_flops / bandwidth
    intensities = [p[1] for p in points] + [ridge]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    xs = [lo, ridge, hi]
    ax.plot(xs, [min(peak_flops, x * bandwidth) for x in xs], color="black", lw=2,
            label=f"roof: {bench.format_rate(peak_flops, 'FLOP/s')}, {bench.format_rate(bandwidth, 'B/s')}")
    ax.axvline(ridge, color="grey", ls=":", lw=1, label=f"ridge: {ridge:.3g} FLOP/byte")
    for label, flops in extra_ceilings:
        ax.plot([flops / bandwidth, hi], [flops, flops], ls="--", lw=1,
                label=f"{label}: {bench.format_rate(flops, 'FLOP/s')}")
    # each operation a marker of its own, named in the legend: labels beside the points fell on each other
    for i, ((label, intensity, achieved), marker) in enumerate(zip(points, itertools.cycle("os^DvP*X"))):
        # hollow, so that two operations at one spot (layer norm and GELU often are) both show
        ax.scatter([intensity], [achieved], zorder=3, s=60, marker=marker, facecolors="none", linewidths=1.6,
                   edgecolors=f"C{i}", label=figures.math_label(label))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"Roofline{': ' + device_name if device_name else ''}")
    ax.grid(True, which="both", alpha=0.3)
    legend_below(ax)
    return ax


def legend_below(ax: plt.Axes, ncol: int = 1):
    """The axes' legend under the plot, where it covers no line and has the figure's width: what a figure with
    many named lines needs on a phone. The figure grows by the legend's height, so the plot keeps its own."""
    from matplotlib.transforms import offset_copy

    size = plt.rcParams["font.size"]
    # anchored under the x axis's tick labels and label, whatever the axes' height (5 lines of text below it)
    under_the_label = offset_copy(ax.transAxes, fig=ax.figure, y=-5 * size, units="points")
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=under_the_label, ncol=ncol,
                       frameon=False)
    rows = -(-len(legend.get_texts()) // ncol)
    width, height = ax.figure.get_size_inches()
    ax.figure.set_size_inches(width, height + (rows * 1.6 + 2) * size / 72)
    return legend


def attention_heatmap(weights, query_labels: Sequence[str], key_labels: Sequence[str], *,
                      ax: plt.Axes | None = None, title: str = "", colorbar: bool = True) -> plt.Axes:
    """Heat-map of one head's (Tq, Tk) attention weights (a tensor or an array, after the softmax: values
    in [0, 1]): row i is where query i looks. Its colour bar reads the colours as weights from 0 to 1; with
    ``colorbar=False`` (panels that share one, ``fig.colorbar(ax.images[0], ax=axes)``) it is left out."""
    w = _as_array(weights)
    if w.shape != (len(query_labels), len(key_labels)):
        raise ValueError(f"weights {w.shape} do not match {len(query_labels)} query and {len(key_labels)} key labels")
    if w.size and not np.isnan(w).all() and (np.nanmin(w) < -1e-3 or np.nanmax(w) > 1 + 1e-3):
        raise ValueError(f"attention weights lie in [0, 1], got values from {np.nanmin(w):.3g} to {np.nanmax(w):.3g}: "
                         "these look like scores before the softmax; plot scores.softmax(-1)")
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label="attention weight", shrink=0.8)
    ax.set_xticks(range(len(key_labels)), key_labels, fontsize=8, rotation=90)  # upright: tokens side by side
    ax.set_yticks(range(len(query_labels)), query_labels, fontsize=8)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=9)
    return ax


def _as_array(weights) -> np.ndarray:
    """A tensor (on any device, with or without gradients) or an array, as a float NumPy array."""
    if hasattr(weights, "detach"):
        return weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=float)


def _png(fig) -> bytes:
    try:
        return figures.render_png(fig, strict=False)[0]
    finally:
        plt.close(fig)


def attention_explorer(weights, query_labels: Sequence[str], key_labels: Sequence[str]):
    """An ipywidgets explorer of (H, Tq, Tk) attention weights: pick a head to see its heat-map,
    pick a query to see where it looks in every head.

    Every view is rendered to an image now and the controls switch between them in the browser
    (``jslink``), so the explorer works in the static book as well as in a running notebook.

    Without ipywidgets (a bare Python, a GPU node without the Jupyter packages) it degrades instead of
    failing: it returns a :class:`StaticAttentionViews`, every head's heat-map as an image with a line saying
    how to get the controls.
    """
    weights = _as_array(weights)
    if weights.ndim != 3 or weights.shape[1:] != (len(query_labels), len(key_labels)):
        raise ValueError(f"weights must be one example's (H, Tq, Tk) = (H, {len(query_labels)}, {len(key_labels)}) "
                         f"attention weights, got shape {weights.shape}: take weights[0] of a (B, H, Tq, Tk) batch")
    try:
        import ipywidgets as widgets
    except ImportError:
        return _static_attention_views(weights, query_labels, key_labels)
    n_heads, n_queries = weights.shape[0], weights.shape[1]
    head_views = []
    for h in range(n_heads):
        fig, ax = plt.subplots(figsize=(3.6, 3.6))
        attention_heatmap(weights[h], query_labels, key_labels, ax=ax, title=f"head {h}: all queries")
        head_views.append(widgets.Image(value=_png(fig), format="png"))
    query_views = []
    for q in range(n_queries):
        fig, ax = plt.subplots(figsize=(3.6, 0.45 * n_heads + 1.2))
        attention_heatmap(weights[:, q, :], [f"head {h}" for h in range(n_heads)], key_labels, ax=ax,
                          title=f"query {q} ({query_labels[q]}) in every head")
        ax.set_ylabel("")
        query_views.append(widgets.Image(value=_png(fig), format="png"))
    stack = getattr(widgets, "Stack", widgets.Tab)  # Stack needs ipywidgets 8; Tab works in 7 too
    heads, queries = stack(head_views, selected_index=0), stack(query_views, selected_index=0)
    head_pick = widgets.IntSlider(0, 0, n_heads - 1, description="head")
    query_pick = widgets.IntSlider(0, 0, n_queries - 1, description="query")
    widgets.jslink((head_pick, "value"), (heads, "selected_index"))
    widgets.jslink((query_pick, "value"), (queries, "selected_index"))
    return widgets.HBox([widgets.VBox([head_pick, heads]), widgets.VBox([query_pick, queries])])


NO_WIDGETS_NOTE = ("ipywidgets is not installed in this Python, so the explorer's controls are left out: every "
                   "head's heat-map is shown instead (pip install ipywidgets, then re-run the cell, for the explorer)")


@dataclasses.dataclass(frozen=True)
class StaticAttentionViews:
    """What :func:`attention_explorer` shows without ipywidgets: one PNG heat-map per head, and why."""

    head_pngs: tuple[bytes, ...]
    note: str = NO_WIDGETS_NOTE

    def _repr_html_(self) -> str:
        import base64

        images = "".join(f'<img alt="head {h}" style="display:inline-block;margin:2px" '
                         f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'
                         for h, png in enumerate(self.head_pngs))
        return f"<div><p><em>{html.escape(self.note)}</em></p>{images}</div>"

    def __repr__(self) -> str:
        return f"{self.note} [{len(self.head_pngs)} heads]"


def _static_attention_views(weights: np.ndarray, query_labels: Sequence[str],
                            key_labels: Sequence[str]) -> StaticAttentionViews:
    pngs = []
    for h in range(weights.shape[0]):
        fig, ax = plt.subplots(figsize=(3.6, 3.6))
        attention_heatmap(weights[h], query_labels, key_labels, ax=ax, title=f"head {h}: all queries")
        pngs.append(_png(fig))
    return StaticAttentionViews(tuple(pngs))


# --------------------------------------------------------------------------- the memory calculator (chapter 9)

GPU_MEMORY_GIB = {"Colab T4 (16 GB)": 15.0, "A100 40GB": 39.4, "A100 80GB / H100 80GB": 79.1, "H200 (141 GB)": 139.8}
"""Usable memory of common GPUs in GiB (what ``torch.cuda.get_device_properties`` reports)."""

PRECISION_SETTINGS = {
    "fp32": dict(param_bytes=4, activation_bytes=4),
    "bf16 autocast (fp32 weights)": dict(param_bytes=4, activation_bytes=2, autocast=True),
    "bf16 weights + fp32 master copy": dict(param_bytes=2, activation_bytes=2, master_weights=True),
}


def memory_report_html(memory, gpu_gib: float | None = None, title: str = "", peak=None) -> str:
    """An HTML table of a ``TrainingMemory`` with a bar per row, and whether it fits ``gpu_gib``. With ``peak``
    (``memory.predicted_peak(...)``) the total reads "saved tensors (the sum above)", a row adds the predicted
    peak (its moment holds the loss's temporaries, so a zero "loss temporaries" row is left out), and the verdict
    is the peak's. With ``gpu_gib`` a last row gives the GPU's memory; every bar is on the largest row's scale,
    so the peak's bar stands beside the GPU's."""
    if not (hasattr(memory, "rows") and hasattr(memory, "total")):
        raise TypeError(f"memory must be a TrainingMemory (memory.training_memory(...)), got {type(memory).__name__}")
    if gpu_gib is not None and not 0 < gpu_gib < math.inf:
        raise ValueError(f"gpu_gib must be the GPU's memory in GiB (> 0) or None, got {gpu_gib!r}")
    rows = []
    shown = [(("saved tensors (the sum above)" if peak is not None and name == "total" else name), value)
             for name, value in memory.rows()
             if not (peak is not None and name == "loss_temporaries" and value == 0)]  # the peak's moment has them
    if peak is not None:
        shown.append((f"predicted peak (at the {peak.moment})", peak.peak))
    if gpu_gib:
        shown.append(("the GPU's memory", round(gpu_gib * 2**30)))
    # every bar on one scale, the largest row's, so the peak's bar and the GPU's can be compared at a glance
    scale = max(1, max(value for _, value in shown))
    for name, value in shown:
        colour = ("#c44e52" if name.startswith("predicted peak") else "#8c8c8c" if name == "the GPU's memory"
                  else "" if name in ("total", "saved tensors (the sum above)") else "#4c72b0")
        bar = (f'<div style="background:{colour};height:0.8em;width:{min(100 * value / scale, 100):.1f}%"></div>'
               if colour else "")
        rows.append(f"<tr><td>{name.replace('_', ' ')}</td><td style='text-align:right;white-space:nowrap'>"
                    f"{value / 2**30:.2f} GiB</td><td style='width:50%'>{bar}</td></tr>")
    verdict = ""
    if gpu_gib:
        spare = gpu_gib - (memory.total if peak is None else peak.peak) / 2**30
        verdict = (f"<p>Fits in {gpu_gib:.1f} GiB with {spare:.1f} GiB to spare (before the CUDA context, about "
                   "0.5 GiB, and the allocator's fragmentation).</p>" if spare > 0 else
                   f"<p><b>Does not fit</b> in {gpu_gib:.1f} GiB: {-spare:.1f} GiB over.</p>")
    head = f"<p><b>{title}</b></p>" if title else ""
    return f"{head}<table>{''.join(rows)}</table>{verdict}"


CALCULATOR_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
"""The sequence lengths the calculator offers."""

CALCULATOR_MAX_MICRO_BATCH = 64
"""The micro-batch slider's end (it starts at 1)."""

CALCULATOR_OPTIMIZERS = ("adamw", "sgd_momentum", "sgd")
"""The optimizers the calculator offers (``training_memory``'s names)."""

CALCULATOR_SHARDING = {"none": 0, "ZeRO-1: optimizer": 1, "ZeRO-2: + gradients": 2, "ZeRO-3 / FSDP: + weights": 3}
"""Sharding choices: the ZeRO stage, each sharding one more state over the ranks."""

CALCULATOR_RANKS = (1, 2, 4, 8, 16, 64)
"""The rank counts the calculator offers to shard over (used with a ZeRO stage only)."""

_EXACT_IN_PAGE = 2**53 // 100
"""Largest byte count the page's script shows exactly: it computes in doubles, exact to 2^53, and the bars'
widths take 100 times a row (as Python's ``100 * value / total`` does, with ints)."""


@dataclasses.dataclass(frozen=True)
class CalculatorChoice:
    """One setting of the memory calculator's controls, named as the page's script names them."""

    model: str
    """A name in the calculator's ``models``."""
    batch_size: int = 8
    """The micro-batch, 1 to ``CALCULATOR_MAX_MICRO_BATCH``."""
    seq_len: int = 1024
    """Tokens per sequence, one of ``CALCULATOR_SEQ_LENS``."""
    precision: str = "fp32"
    """A name in ``PRECISION_SETTINGS``."""
    optimizer: str = "adamw"
    """One of ``CALCULATOR_OPTIMIZERS``."""
    fused_attention: bool = True
    """Fused (flash) attention, else explicit attention with its (T, T) tensors."""
    checkpointing: bool = False
    """Activation checkpointing: each layer keeps its input only."""
    sharding: int = 0
    """The ZeRO stage, a value of ``CALCULATOR_SHARDING`` (0: nothing sharded)."""
    ranks: int = 8
    """Ranks the sharded states are split over, one of ``CALCULATOR_RANKS``; ignored at stage 0."""
    gpu: str = "A100 80GB / H100 80GB"
    """A name in ``GPU_MEMORY_GIB``, to compare with."""

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or \
                not 1 <= self.batch_size <= CALCULATOR_MAX_MICRO_BATCH:
            raise ValueError(f"batch_size must be an int from 1 to {CALCULATOR_MAX_MICRO_BATCH} (the slider's "
                             f"range), got {self.batch_size!r}")
        for name, allowed in (("seq_len", CALCULATOR_SEQ_LENS), ("precision", tuple(PRECISION_SETTINGS)),
                              ("optimizer", CALCULATOR_OPTIMIZERS), ("sharding", tuple(CALCULATOR_SHARDING.values())),
                              ("ranks", CALCULATOR_RANKS), ("gpu", tuple(GPU_MEMORY_GIB))):
            value = getattr(self, name)
            if isinstance(value, bool) or type(value) is not type(allowed[0]) or value not in allowed:
                raise ValueError(f"{name} must be one of the calculator's choices {list(allowed)}, got {value!r}")
        require_bools(fused_attention=self.fused_attention, checkpointing=self.checkpointing)


def calculator_data(models: dict | None = None) -> dict:
    """What the calculator's page script needs, as plain JSON-ready values: per model (a name to a
    ``TransformerConfig``; default: GPT-2 small, medium and XL) its parameters, counted exactly on a model
    built on the ``meta`` device (no memory allocated), and its sizes; ``PRECISION_SETTINGS``, the optimizers'
    state bytes per parameter (from ``training_memory``) and ``GPU_MEMORY_GIB``. Python's result
    (:func:`calculator_report_html`) is computed from the same dict, so the two cannot read different inputs.

    Raises ``ValueError`` for a model so large that the page, which computes in doubles, could not show every
    setting exactly."""
    import torch

    from gpuformer_lib.memory import predicted_peak, training_memory
    from gpuformer_lib.model import DecoderLM, TransformerConfig, count_parameters, gpt2_config

    if models is None:
        models = {"GPT-2 small (12 x 768)": gpt2_config(), "GPT-2 medium (24 x 1024)": gpt2_config(1024, 24, 16),
                  "GPT-2 XL (48 x 1600)": gpt2_config(1600, 48, 25)}
    if not isinstance(models, dict):
        raise TypeError(f"models must be a dict of a name to a TransformerConfig, got {type(models).__name__}")
    if not models:
        raise ValueError("models is empty: give the calculator at least one model (or None for GPT-2's sizes)")
    data = {"models": {}, "precisions": {}, "gpus": dict(GPU_MEMORY_GIB),
            "optimizer_state_bytes": {name: training_memory(1, optimizer=name).optimizer
                                      for name in CALCULATOR_OPTIMIZERS}}
    for name, setting in PRECISION_SETTINGS.items():
        data["precisions"][name] = {"param_bytes": setting["param_bytes"],
                                    "activation_bytes": setting["activation_bytes"],
                                    "autocast": setting.get("autocast", False),
                                    "master_weights": setting.get("master_weights", False)}
    for name, config in models.items():
        if not isinstance(name, str) or not isinstance(config, TransformerConfig):
            raise TypeError(f"models maps a name (str) to a TransformerConfig, got {name!r}: "
                            f"{type(config).__name__}")
        with torch.device("meta"):
            n_params = count_parameters(DecoderLM(config))
        data["models"][name] = {"n_params": n_params, "n_layers": config.n_decoder_layers,
                                "d_model": config.d_model, "n_heads": config.n_heads, "d_ff": config.d_ff,
                                "vocab_size": config.vocab_size}
        # the largest values any setting shows: the longest batch, nothing sharded, each precision and kernel
        for precision, fused, checkpointing in itertools.product(PRECISION_SETTINGS, (True, False), (True, False)):
            choice = CalculatorChoice(name, batch_size=CALCULATOR_MAX_MICRO_BATCH, seq_len=max(CALCULATOR_SEQ_LENS),
                                      precision=precision, fused_attention=fused, checkpointing=checkpointing)
            settings = calculator_settings(data, choice)
            largest = max(training_memory(n_params, **settings).total, predicted_peak(n_params, **settings).peak)
            if largest > _EXACT_IN_PAGE:
                raise ValueError(f"{name}: up to {largest:,} bytes, more than the page's script computes exactly "
                                 f"({_EXACT_IN_PAGE:,}, doubles): use a smaller model")
    return data


def calculator_settings(data: dict, choice: CalculatorChoice) -> dict:
    """``training_memory``'s (and ``predicted_peak``'s) arguments for one setting of the calculator."""
    if choice.model not in data["models"]:
        raise ValueError(f"model must be one of the calculator's models {list(data['models'])}, got {choice.model!r}")
    model, stage = data["models"][choice.model], choice.sharding
    ranks = choice.ranks if stage else 1
    return dict(optimizer=choice.optimizer, n_layers=model["n_layers"], d_model=model["d_model"],
                n_heads=model["n_heads"], d_ff=model["d_ff"], seq_len=choice.seq_len, batch_size=choice.batch_size,
                vocab_size=model["vocab_size"], fused_attention=choice.fused_attention,
                checkpointing=choice.checkpointing, shard_optimizer=ranks if stage >= 1 else 1,
                shard_gradients=ranks if stage >= 2 else 1, shard_weights=ranks if stage >= 3 else 1,
                **PRECISION_SETTINGS[choice.precision])


def calculator_report_html(data: dict, choice: CalculatorChoice) -> str:
    """The calculator's result for one setting: ``memory_report_html`` of the saved tensors and the predicted
    peak, titled with the model and the micro-batch (the page's script writes the same, character for
    character)."""
    from gpuformer_lib.memory import predicted_peak, training_memory

    settings = calculator_settings(data, choice)
    n_params = data["models"][choice.model]["n_params"]
    title = (f"{html.escape(choice.model)}: {n_params / 1e6:.0f} M parameters, {choice.batch_size} x "
             f"{choice.seq_len} tokens per micro-batch, per GPU")
    return memory_report_html(training_memory(n_params, **settings), data["gpus"][choice.gpu], title,
                              peak=predicted_peak(n_params, **settings))


def memory_calculator_script() -> str:
    """The source of the page's script (``gpuformer_lib/js/memory_calculator.js``): the calculator's formulas
    and ``memory_report_html`` ported to JavaScript."""
    return importlib.resources.files("gpuformer_lib").joinpath("js/memory_calculator.js").read_text(encoding="utf-8")


def _field(label: str, control: str, *, checkbox: bool = False) -> str:
    """One labelled control; the fields wrap onto as many lines as the page's width needs."""
    if checkbox:
        return (f'<label style="display:flex;align-items:center;gap:0.4em;flex:1 1 14em;min-width:0;'
                f'max-width:100%">{control}<span>{label}</span></label>')
    return (f'<label style="display:flex;flex-direction:column;flex:1 1 14em;min-width:0;max-width:100%">'
            f'<span>{label}</span>{control}</label>')


def _select(uid: str, name: str, options, chosen) -> str:
    """A ``<select>`` of ``(label, value)`` pairs, disabled until the page's script enables it."""
    items = "".join(f'<option value="{html.escape(str(value))}"{" selected" if value == chosen else ""}>'
                    f'{html.escape(str(label))}</option>' for label, value in options)
    return (f'<select id="{uid}-{name}" data-control="{name}" disabled '
            f'style="width:100%;max-width:100%;box-sizing:border-box">{items}</select>')


def _checkbox(uid: str, name: str, checked: bool) -> str:
    return f'<input type="checkbox" id="{uid}-{name}" data-control="{name}"{" checked" if checked else ""} disabled>'


def memory_calculator(models: dict | None = None, *, batch_size: int = 8, seq_len: int = 1024):
    """A calculator of training memory (``memory.training_memory`` and ``memory.predicted_peak``) for a
    ``DecoderLM``: model, micro-batch, sequence length, precision, optimizer, attention kernel, activation
    checkpointing, ZeRO stage and ranks, and a GPU to compare with.

    ``models`` maps a name to a ``TransformerConfig`` (default: GPT-2 small, medium and XL sizes); see
    :func:`calculator_data`. Returns an ``IPython.display.HTML``: native HTML controls and a script that
    recomputes the result in the page (the formulas ported to ``gpuformer_lib/js/memory_calculator.js`` and
    tested against the Python on a grid of every control value), so it works without a kernel: in the
    static book, in JupyterLab, and in any front end that runs an HTML output's scripts (Colab does). The
    first result is computed here, in Python, so the page shows a correct result even where no script runs
    (JavaScript off, a notebook Jupyter does not trust, a notebook viewer); there the controls stay
    disabled and a note says why. Each call gets its own element ids, so several calculators work on one
    page.
    """
    from IPython.display import HTML

    data = calculator_data(models)
    first = CalculatorChoice(next(iter(data["models"])), batch_size=batch_size, seq_len=seq_len)
    uid = f"gpuformer-memcalc-{uuid.uuid4().hex[:12]}"
    batch = (f'<input type="range" id="{uid}-batch_size" data-control="batch_size" min="1" '
             f'max="{CALCULATOR_MAX_MICRO_BATCH}" step="1" value="{batch_size}" disabled '
             f'style="width:100%;max-width:100%;box-sizing:border-box;margin:0.3em 0">')
    fields = [
        _field("model", _select(uid, "model", [(name, name) for name in data["models"]], first.model)),
        _field(f'micro-batch: <output data-shows="batch_size">{batch_size}</output>', batch),
        _field("sequence length", _select(uid, "seq_len", [(n, n) for n in CALCULATOR_SEQ_LENS], seq_len)),
        _field("precision", _select(uid, "precision", [(name, name) for name in PRECISION_SETTINGS],
                                    first.precision)),
        _field("optimizer", _select(uid, "optimizer", [(name, name) for name in CALCULATOR_OPTIMIZERS],
                                    first.optimizer)),
        _field("sharding", _select(uid, "sharding", CALCULATOR_SHARDING.items(), first.sharding)),
        _field("ranks sharded over", _select(uid, "ranks", [(n, n) for n in CALCULATOR_RANKS], first.ranks)),
        _field("GPU", _select(uid, "gpu", [(name, name) for name in GPU_MEMORY_GIB], first.gpu)),
        _field("fused (flash) attention", _checkbox(uid, "fused_attention", first.fused_attention), checkbox=True),
        _field("activation checkpointing", _checkbox(uid, "checkpointing", first.checkpointing), checkbox=True),
    ]
    source = memory_calculator_script()
    payload = json.dumps(data, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    if "</script" in source.lower() or "<!--" in source:
        raise ValueError("memory_calculator.js holds '</script' or '<!--', which would end or hide the page's script")
    script = (f"<script>(function () {{\n{source}\ngpuformerMemoryCalculator.mount(document.currentScript, "
              f"{json.dumps(uid)}, {payload});\n}}());</script>")
    page = (f'<div class="gpuformer-memcalc" id="{uid}" style="max-width:100%;box-sizing:border-box">'
            f'<div class="gpuformer-memcalc-controls" style="display:flex;flex-wrap:wrap;gap:0.5em 1.5em;'
            f'margin-bottom:0.8em">{"".join(fields)}</div>'
            '<p class="gpuformer-memcalc-static-note" style="font-size:0.85em;opacity:0.8">Computed in Python for '
            "the settings shown. The controls recompute it where the page's script runs: the online book, or a "
            "notebook you ran or trust.</p>"
            f'<div class="gpuformer-memcalc-result" id="{uid}-result" aria-live="polite" '
            f'style="max-width:100%;overflow-x:auto">{calculator_report_html(data, first)}</div>{script}</div>')
    return HTML(page)


# --------------------------------------------------------------------------- showing code kept in files


def show_source(obj, name: str | None = None):
    """Display the source of a library function or class (``show_source(ring_all_reduce)``), or of the
    function ``name`` in a script (``show_source(distributed.worker_path("data_parallel"), "hello")``), highlighted.

    Chapters run their distributed workers from scripts (a function defined in a cell cannot be
    started in another process); this shows the code that ran, read from the file, never a copy."""
    import ast
    import inspect
    from pathlib import Path

    from IPython.display import Code

    if name is None:
        return Code(inspect.getsource(obj), language="python")
    text = Path(obj).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            return Code("\n".join(text.splitlines()[start: node.end_lineno]), language="python")
    raise ValueError(f"{obj} defines no function or class named {name!r}")
