"""Figures fitted and checked for a phone (gpuformer_lib.figures), and every figure stored in the notebooks."""

from __future__ import annotations

import base64
import struct

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from gpuformer_lib import figures  # noqa: E402
from gpuformer_lib.tools.notebooks import notebook_paths, read_notebook  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_phone_text_px_shrinks_text_with_a_wide_png_only():
    assert figures.phone_text_px(20, 716) == pytest.approx(10.0)
    assert figures.phone_text_px(12, 300) == 12  # narrower than the column: shown at its own size
    with pytest.raises(ValueError, match="positive"):
        figures.phone_text_px(0, 700)


def test_a_wide_figure_with_tiny_text_is_fitted_until_it_reads_on_a_phone():
    """Chapter 1's old roofline pair: 13 inches wide, legend at 7 pt, about 3 px on a phone."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax in axes:
        ax.plot([1, 2, 3], label="a line")
        ax.legend(fontsize=7)
    data, report = figures.render_png(fig)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.width_px == struct.unpack(">I", data[16:20])[0]
    assert report.width_px <= figures.MAX_WIDTH_IN * figures.DPI * 1.1
    assert report.phone_text_px >= figures.MIN_TEXT_PX
    assert report.phone_text_px == pytest.approx(report.min_text_px * figures.PHONE_COLUMN_PX / report.width_px)
    assert not report.problems


def test_a_long_title_wraps_instead_of_widening_the_png():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 2])
    ax.set_title("a title far too long for one line of a phone's figure, " * 3)
    _, report = figures.render_png(fig)
    assert report.width_px <= figures.MAX_WIDTH_IN * figures.DPI * 1.1
    assert report.phone_text_px >= figures.MIN_TEXT_PX


@pytest.mark.parametrize("label, wrong", [
    ("attention QK^T", True),       # the review's raw caret
    ("x_1 against x_2", True),
    ("tiles of B_M = B_N", True),
    ("a slope of 1/sqrt(L)", True),
    ("n^3 flops", True),
    ("$QK^\\top$ scores", False),
    ("d_model = 512", False),     # an identifier, not a subscript
    ("loss (nats)", False),
])
def test_math_written_as_plain_text_is_named(label, wrong):
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([1, 2])
    ax.set_xlabel(label)
    _, report = figures.render_png(fig, strict=False)
    assert any("math as plain text" in p for p in report.problems) == wrong
    if wrong:
        with pytest.raises(figures.UnreadableFigure, match="between \\$ signs"):
            figures.render_png(fig)


def test_two_labels_on_top_of_each_other_are_refused_by_name():
    """The review's "GELU" drawn on "layer norm"."""
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([1, 2])
    ax.annotate("GELU", (0.5, 1.5))
    ax.annotate("layer norm", (0.5, 1.5))
    with pytest.raises(figures.UnreadableFigure, match="'GELU' overlaps 'layer norm'"):
        figures.render_png(fig)
    _, report = figures.render_png(fig, strict=False)
    assert len(report.problems) == 1


def test_a_wrapped_title_is_checked_as_well_as_a_one_line_label():
    """A text of several lines (a wrapped title) is drawn line by line; it is still one text to check."""
    fig, axes = plt.subplots(2, 1, figsize=(5, 4))
    axes[1].set_title("the second panel's title,\nin two lines")
    axes[1].text(0.5, 1.15, "a note on it", transform=axes[1].transAxes, ha="center")
    with pytest.raises(figures.UnreadableFigure, match="'a note on it' overlaps"):
        figures.render_png(fig)


def test_labels_apart_pass_and_the_report_reads_as_metadata():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([0, 1], [0, 1])
    ax.annotate("GELU", (0.1, 0.8))
    ax.annotate("layer norm", (0.7, 0.1))
    _, report = figures.render_png(fig)
    meta = report.as_metadata()
    assert meta["problems"] == [] and meta["width_px"] == report.width_px
    assert meta["phone_text_px"] >= figures.MIN_TEXT_PX


def _memory_lines(ax):
    """Chapter 14's crop-memory figure: a rising line under two GPUs' capacities, the H100's near the top."""
    crops = (256, 512, 1024, 2048, 4096, 8192)
    ax.plot(crops, [1.2, 2.1, 3.8, 7.3, 14.5, 28], "o-", label="predicted, GPU preset's model, batch 32")
    for name, gib, color in (("T4", 15, "tab:orange"), ("H100", 79, "tab:green")):
        ax.axhline(gib, ls="--", color=color, label=f"{name}: {gib} GiB")
    ax.set(xscale="log", yscale="log")


def test_a_legend_over_a_line_is_refused_by_the_line_s_name():
    fig, ax = plt.subplots(figsize=(6, 2.8))
    _memory_lines(ax)
    ax.legend()  # "best" finds no free corner: the box sits on the H100 line
    with pytest.raises(figures.UnreadableFigure, match="the legend covers data \\('H100: 79 GiB'\\)"):
        figures.render_png(fig)


def test_a_legend_over_a_marker_is_refused():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.scatter([1, 2, 3], [1, 2, 3], label="operations")
    ax.legend(loc="center")
    _, report = figures.render_png(fig, strict=False)
    assert report.problems == ("the legend covers data ('operations'): move it off the lines (viz.legend_below(ax), "
                               "or loc=)",)


@pytest.mark.parametrize("place", ["below", "free corner"])
def test_a_legend_off_the_data_passes(place):
    from gpuformer_lib import viz

    fig, ax = plt.subplots(figsize=(6, 2.8))
    if place == "below":
        _memory_lines(ax)
        viz.legend_below(ax)
    else:
        ax.plot([0, 1], [0, 1], label="rising")
        ax.legend(loc="upper left")
    _, report = figures.render_png(fig)
    assert not report.problems


def _heat(ax, limit=1.0, cmap="viridis"):
    return ax.imshow([[0.0, 0.5], [0.25, limit]], cmap=cmap, vmin=0, vmax=limit)


def test_a_heat_map_with_no_colour_bar_is_refused():
    fig, ax = plt.subplots(figsize=(4, 3))
    _heat(ax)
    with pytest.raises(figures.UnreadableFigure, match="heat-map in 'viridis' has no colour bar"):
        figures.render_png(fig)


def test_a_mesh_with_no_colour_bar_is_refused_too():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.pcolormesh([[0.0, 1.0], [2.0, 3.0]], cmap="magma")
    _, report = figures.render_png(fig, strict=False)
    assert report.problems == ("a heat-map in 'magma' has no colour bar: add fig.colorbar(image, ax=..., label=...)",)


def test_one_colour_bar_explains_only_the_maps_with_its_limits():
    fig, axes = plt.subplots(2, 1, figsize=(4, 6), layout="constrained")
    fig.colorbar(_heat(axes[0]), ax=axes, label="weight")
    _heat(axes[1], limit=2.0)  # other limits: the bar's colours do not read its values
    _, report = figures.render_png(fig, strict=False)
    assert len(report.problems) == 1 and "no colour bar" in report.problems[0]


@pytest.mark.parametrize("how", ["own bar", "shared bar", "qualitative", "bar made without a layout"])
def test_heat_maps_that_say_what_their_colours_mean_pass(how):
    if how == "shared bar":
        fig, axes = plt.subplots(2, 1, figsize=(4, 6), layout="constrained")
        images = [_heat(ax) for ax in axes]
        fig.colorbar(images[-1], ax=axes, label="weight")
    elif how == "qualitative":  # chapter 2's waves: colours name groups, and the title says which
        fig, ax = plt.subplots(figsize=(4, 3))
        _heat(ax, limit=9.0, cmap="tab10")
    else:
        fig, ax = plt.subplots(figsize=(4, 3), layout="constrained" if how == "own bar" else None)
        fig.colorbar(_heat(ax), ax=ax, label="weight")
    _, report = figures.render_png(fig)
    assert not report.problems


def test_install_needs_an_ipython():
    assert figures.install() is False  # pytest is no IPython kernel


def _stored_figures():
    for path in notebook_paths():
        nb = read_notebook(path)
        for index, cell in enumerate(nb.cells):
            for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
                if "image/png" in output.get("data", {}):
                    yield path.name, index, output


def test_every_stored_figure_was_fitted_and_reads_on_a_phone():
    """Each PNG a notebook stores (what the book shows) carries the report that figures.render_png made when it
    was drawn, for this very PNG (its width), with text of at least 9 px on a phone and no problem."""
    problems, seen = [], 0
    for name, index, output in _stored_figures():
        seen += 1
        report = output.get("metadata", {}).get("image/png", {}).get(figures.METADATA_KEY)
        where = f"{name} cell {index}"
        if report is None:
            problems.append(f"{where}: a figure not drawn through gpuformer_lib.figures (re-execute the notebook)")
            continue
        width = struct.unpack(">I", base64.b64decode(output["data"]["image/png"])[16:20])[0]
        if width != report["width_px"]:
            problems.append(f"{where}: its report is of a PNG {report['width_px']} px wide, this one is {width}")
        if report["phone_text_px"] < figures.MIN_TEXT_PX or report["problems"]:
            problems.append(f"{where}: {report}")
    assert seen >= 40, f"only {seen} figures stored in the notebooks"
    assert not problems, "\n".join(problems)


def test_crowded_minor_labels_of_a_short_log_axis_are_left_out():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([30, 400], [30, 400])  # a decade and a bit: matplotlib labels the minor ticks too
    ax.set_xscale("log")
    ax.set_yscale("log")
    _, report = figures.render_png(fig)
    assert not report.problems
    assert type(ax.xaxis.get_minor_formatter()).__name__ == "NullFormatter"


def test_crowded_major_labels_of_a_linear_axis_are_thinned():
    """Chapter 10's ladder: 10000, 12500, 15000, 17500 ran into each other at a phone's text size."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.barh(["a", "b"], [11_000, 19_000])
    ax.set_xlim(0, 20_000)
    ax.xaxis.set_major_locator(matplotlib.ticker.MultipleLocator(2_500))
    _, report = figures.render_png(fig)
    assert not report.problems
    assert type(ax.xaxis.get_major_locator()).__name__ == "MaxNLocator"
