"""Plots the chapters share, and the bridge from a notebook's numbers to the book's prose.

Covers: the roofline plot (measured ceilings, datasheet ceilings, operations placed on it);
attention heat-maps, and an explorer widget (pick a head and a query) that keeps working in the
static book because every view is rendered ahead of time and the controls are linked in the
browser; and :func:`glue`, which hands a measured value to the book's prose through myst-nb (so
no number in the text is typed by hand) and still works where myst-nb is not installed (Colab).

Leaves out: the roofline arithmetic itself (``bench``).
"""

from __future__ import annotations

import io
import math
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np


class _PlainText:
    """Shows a string without the quotes its repr would add (where myst-nb is missing, e.g. Colab)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book (``{glue:text}`name` `` in a markdown cell).

    Strings are glued as strings: their stored ``text/plain`` is the quoted ``repr``, which myst-nb's
    ``format_plain_text`` turns back into the exact string with ``ast.literal_eval``. (An unquoted
    "28,976" would be evaluated as the tuple ``(28, 976)``, and a ``\\t`` in "\\times" as a tab.)
    Without myst-nb the value is only displayed (when ``display`` is true), unquoted. Returns None,
    so a glue on a cell's last line adds no output.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as ipy_display

            ipy_display(_PlainText(value) if isinstance(value, str) else value)
        return
    myst_glue(name, str(value) if isinstance(value, str) else value, display=display)


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
        _, ax = plt.subplots(figsize=(8, 5))
    ridge = peak_flops / bandwidth
    intensities = [p[1] for p in points] + [ridge]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    xs = [lo, ridge, hi]
    ax.plot(xs, [min(peak_flops, x * bandwidth) for x in xs], color="black", lw=2,
            label=f"roof: {peak_flops / 1e12:.3g} TFLOP/s, {bandwidth / 1e9:.3g} GB/s")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak_flops), textcoords="offset points",
                xytext=(4, -14), fontsize=8, color="grey")
    for label, flops in extra_ceilings:
        ax.plot([flops / bandwidth, hi], [flops, flops], ls="--", lw=1, label=f"{label}: {flops / 1e12:.3g} TFLOP/s")
    for label, intensity, achieved in points:
        ax.scatter([intensity], [achieved], zorder=3, s=36)
        ax.annotate(label, (intensity, achieved), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"Roofline{': ' + device_name if device_name else ''}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def attention_heatmap(weights, query_labels: Sequence[str], key_labels: Sequence[str], *,
                      ax: plt.Axes | None = None, title: str = "") -> plt.Axes:
    """Heat-map of one head's (Tq, Tk) attention weights (a tensor or an array, after the softmax: values
    in [0, 1]): row i is where query i looks."""
    w = _as_array(weights)
    if w.shape != (len(query_labels), len(key_labels)):
        raise ValueError(f"weights {w.shape} do not match {len(query_labels)} query and {len(key_labels)} key labels")
    if w.size and not np.isnan(w).all() and (np.nanmin(w) < -1e-3 or np.nanmax(w) > 1 + 1e-3):
        raise ValueError(f"attention weights lie in [0, 1], got values from {np.nanmin(w):.3g} to {np.nanmax(w):.3g}: "
                         "these look like scores before the softmax; plot scores.softmax(-1)")
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(key_labels)), key_labels, fontsize=8)
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
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def attention_explorer(weights, query_labels: Sequence[str], key_labels: Sequence[str]):
    """An ipywidgets explorer of (H, Tq, Tk) attention weights: pick a head to see its heat-map,
    pick a query to see where it looks in every head.

    Every view is rendered to an image now and the controls switch between them in the browser
    (``jslink``), so the explorer works in the static book as well as in a running notebook.
    """
    import ipywidgets as widgets

    weights = _as_array(weights)
    if weights.ndim != 3 or weights.shape[1:] != (len(query_labels), len(key_labels)):
        raise ValueError(f"weights must be one example's (H, Tq, Tk) = (H, {len(query_labels)}, {len(key_labels)}) "
                         f"attention weights, got shape {weights.shape}: take weights[0] of a (B, H, Tq, Tk) batch")
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
    (``memory.predicted_peak(...)``) the total reads "saved tensors", a row adds the predicted peak, and the
    verdict is the peak's."""
    if not (hasattr(memory, "rows") and hasattr(memory, "total")):
        raise TypeError(f"memory must be a TrainingMemory (memory.training_memory(...)), got {type(memory).__name__}")
    if gpu_gib is not None and not 0 < gpu_gib < math.inf:
        raise ValueError(f"gpu_gib must be the GPU's memory in GiB (> 0) or None, got {gpu_gib!r}")
    total = max(memory.total, 1)
    rows = []
    shown = [(("saved tensors" if peak is not None and name == "total" else name), value)
             for name, value in memory.rows()]
    if peak is not None:
        shown.append((f"predicted peak (at the {peak.moment})", peak.peak))
    for name, value in shown:
        width = 100 * value / total
        bar = (f'<div style="background:#4c72b0;height:0.8em;width:{min(width, 100):.1f}%"></div>'
               if name not in ("total", "saved tensors") and not name.startswith("predicted peak") else "")
        rows.append(f"<tr><td>{name.replace('_', ' ')}</td><td style='text-align:right'>{value / 2**30:.2f} GiB</td>"
                    f"<td style='width:50%'>{bar}</td></tr>")
    verdict = ""
    if gpu_gib:
        spare = gpu_gib - (memory.total if peak is None else peak.peak) / 2**30
        verdict = (f"<p>Fits in {gpu_gib:.1f} GiB with {spare:.1f} GiB to spare (before the CUDA context, about "
                   "0.5 GiB, and the allocator's fragmentation).</p>" if spare > 0 else
                   f"<p><b>Does not fit</b> in {gpu_gib:.1f} GiB: {-spare:.1f} GiB over.</p>")
    head = f"<p><b>{title}</b></p>" if title else ""
    return f"{head}<table>{''.join(rows)}</table>{verdict}"


def memory_calculator(models: dict | None = None, *, batch_size: int = 8, seq_len: int = 1024):
    """An ipywidgets calculator of training memory (``memory.training_memory``) for a ``DecoderLM``:
    model, micro-batch, sequence length, precision, optimizer, attention kernel, activation
    checkpointing, ZeRO stage and ranks, and a GPU to compare with.

    ``models`` maps a name to a ``TransformerConfig`` (default: GPT-2 small, medium and XL sizes).
    Parameters are counted exactly on a model built on the ``meta`` device (no memory allocated).
    The result is an HTML widget, so the book shows the first setting; the controls recompute in a
    running notebook.
    """
    import ipywidgets as widgets
    import torch

    from gpuformer_lib.memory import predicted_peak, training_memory
    from gpuformer_lib.model import DecoderLM, count_parameters, gpt2_config

    if models is None:
        models = {"GPT-2 small (12 x 768)": gpt2_config(), "GPT-2 medium (24 x 1024)": gpt2_config(1024, 24, 16),
                  "GPT-2 XL (48 x 1600)": gpt2_config(1600, 48, 25)}
    counts = {}

    def n_params(name: str) -> int:
        if name not in counts:
            with torch.device("meta"):
                counts[name] = count_parameters(DecoderLM(models[name]))
        return counts[name]

    style = {"description_width": "120px"}
    layout = widgets.Layout(width="330px")
    model = widgets.Dropdown(options=list(models), description="model", style=style, layout=layout)
    batch = widgets.IntSlider(batch_size, 1, 64, description="micro-batch", style=style, layout=layout)
    length = widgets.Dropdown(options=[128, 256, 512, 1024, 2048, 4096, 8192], value=seq_len,
                              description="sequence length", style=style, layout=layout)
    precision = widgets.Dropdown(options=list(PRECISION_SETTINGS), description="precision", style=style,
                                 layout=layout)
    optimizer = widgets.Dropdown(options=["adamw", "sgd_momentum", "sgd"], description="optimizer", style=style,
                                 layout=layout)
    fused = widgets.Checkbox(True, description="fused (flash) attention", style=style)
    checkpointing = widgets.Checkbox(False, description="activation checkpointing", style=style)
    zero = widgets.Dropdown(options=[("none", 0), ("ZeRO-1: optimizer", 1), ("ZeRO-2: + gradients", 2),
                                     ("ZeRO-3 / FSDP: + weights", 3)], description="sharding", style=style,
                            layout=layout)
    ranks = widgets.Dropdown(options=[1, 2, 4, 8, 16, 64], value=8, description="ranks sharded over", style=style,
                             layout=layout)
    gpu = widgets.Dropdown(options=list(GPU_MEMORY_GIB), value="A100 80GB / H100 80GB", description="GPU",
                           style=style, layout=layout)
    out = widgets.HTML()

    def update(_=None) -> None:
        c = models[model.value]
        stage, n = zero.value, ranks.value if zero.value else 1
        settings = dict(
            optimizer=optimizer.value, n_layers=c.n_decoder_layers, d_model=c.d_model,
            n_heads=c.n_heads, d_ff=c.d_ff, seq_len=length.value, batch_size=batch.value, vocab_size=c.vocab_size,
            fused_attention=fused.value, checkpointing=checkpointing.value, shard_optimizer=n if stage >= 1 else 1,
            shard_gradients=n if stage >= 2 else 1, shard_weights=n if stage >= 3 else 1,
            **PRECISION_SETTINGS[precision.value])
        mem = training_memory(n_params(model.value), **settings)
        peak = predicted_peak(n_params(model.value), **settings)
        title = (f"{model.value}: {n_params(model.value) / 1e6:.0f} M parameters, {batch.value} x {length.value} "
                 "tokens per micro-batch, per GPU")
        out.value = memory_report_html(mem, GPU_MEMORY_GIB[gpu.value], title, peak=peak)

    controls = [model, batch, length, precision, optimizer, fused, checkpointing, zero, ranks, gpu]
    for control in controls:
        control.observe(update, names="value")
    update()
    half = (len(controls) + 1) // 2
    return widgets.VBox([widgets.HBox([widgets.VBox(controls[:half]), widgets.VBox(controls[half:])]), out])


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
