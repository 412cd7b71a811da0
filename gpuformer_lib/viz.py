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
from typing import Any, Sequence

import matplotlib.pyplot as plt


class _PlainText:
    """Shows a string without the quotes its repr would add, so prose reads '147 GFLOP/s'."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book (``{glue:text}`name` `` in a markdown cell).

    Strings are glued without quotes. Without myst-nb the value is only displayed (when
    ``display`` is true). Returns None, so a glue on a cell's last line adds no output.
    """
    shown = _PlainText(value) if isinstance(value, str) else value
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as ipy_display

            ipy_display(shown)
        return
    myst_glue(name, shown, display=display)


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
    if peak_flops <= 0 or bandwidth <= 0:
        raise ValueError("peak_flops and bandwidth must be positive")
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
    """Heat-map of one head's (Tq, Tk) attention weights: row i is where query i looks."""
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    w = weights.detach().float().cpu().numpy()
    if w.shape != (len(query_labels), len(key_labels)):
        raise ValueError(f"weights {w.shape} do not match {len(query_labels)} query and {len(key_labels)} key labels")
    ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(key_labels)), key_labels, fontsize=8)
    ax.set_yticks(range(len(query_labels)), query_labels, fontsize=8)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=9)
    return ax


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
