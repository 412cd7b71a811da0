"""The registry of published figures: every entry complete, its quote containing its number, the
appendix page up to date; and the GPU view that shows them beside measured and predicted numbers."""

import dataclasses

import pytest
import torch

from gpuformer_lib import bench, gpu_view, published
from gpuformer_lib.predict import roofline
from gpuformer_lib.published import PublishedFigure


def entry(**changes):
    base = dict(key="x-peak", value=989.4, unit="TFLOPS", quantity="dense BF16 peak", hardware="H100 SXM",
                software="not stated", url="https://example.org/h100", title="A datasheet", where="Table 1",
                quote="BF16 Tensor Core 989.4 teraFLOPS", chapters=(1,))
    base.update(changes)
    return PublishedFigure(**base)


def test_every_registered_figure_is_complete_and_quotes_its_number():
    figures = published.figures()
    assert len({f.key for f in figures}) == len(figures)
    for f in figures:
        for field in dataclasses.fields(PublishedFigure):
            if field.name != "note":
                assert getattr(f, field.name) not in ("", None, ()), (f.key, field.name)
        assert f.url.startswith("https://") and published.quote_contains(f.quote, f.value), f.key


def test_each_of_chapters_0_to_16_shows_a_published_figure():
    shown = {c for f in published.figures() for c in f.chapters}
    chapters = set(range(17))
    assert chapters <= shown, f"chapters without a published figure: {sorted(chapters - shown)}"


@pytest.mark.parametrize("changes, words", [
    (dict(quote="BF16 Tensor Core 989 teraFLOPS"), "does not contain the number"),
    (dict(url="http://example.org"), "https://"),
    (dict(title=" "), "title must be"),
    (dict(value=float("nan")), "finite"),
    (dict(value=True), "finite"),
    (dict(key="Bad Key"), "lower-case"),
    (dict(chapters=()), "chapters"),
])
def test_an_incomplete_entry_is_refused(changes, words):
    with pytest.raises(ValueError, match=words):
        entry(**changes)


def test_quotes_match_numbers_as_sources_write_them():
    assert published.quote_contains("up to 3,350 GB/s", 3350)
    assert published.quote_contains("reaching 72.0% of peak", 72)
    assert not published.quote_contains("reaching 172% of peak", 72)
    assert not published.quote_contains("H100 80GB", 8)


def test_the_appendix_page_lists_every_entry_and_is_up_to_date():
    text = published.appendix_markdown()
    for f in published.figures():
        assert f"`{f.key}`" in text and f.url in text and f.quote in text
    assert published.main(["--check"]) == 0, "run: python -m gpuformer_lib.published"


def test_unknown_key_lists_the_registered_ones():
    with pytest.raises(KeyError, match="registered"):
        published.figure("no-such-figure")


# --------------------------------------------------------------------------- the GPU view


def test_predictions_use_two_roofs():
    # a matrix product sits under the tensor-core roof, an element-wise kernel under the CUDA-core one
    h100 = bench.lookup_gpu_peak("H100 SXM")
    assert roofline.datasheet_ceiling("H100 SXM", torch.bfloat16, tensor_cores=True) == h100.bf16 * 1e12
    assert roofline.datasheet_ceiling("H100 SXM", torch.bfloat16, tensor_cores=False) == h100.fp32 * 1e12
    assert roofline.datasheet_ceiling("T4", torch.float32, tensor_cores=True) == 8.1e12  # no TF32 on a T4
    with pytest.raises(ValueError, match="float16 instead"):
        roofline.datasheet_ceiling("T4", torch.bfloat16, tensor_cores=True)


def test_matmul_prediction_is_the_roofline():
    big = roofline.datasheet_matmul(8192, 8192, 8192, torch.float16, "H100 SXM")
    assert big.bound == "compute" and big.flops_per_second == pytest.approx(989.4e12)
    thin = roofline.datasheet_matmul(16, 8192, 8192, torch.float16, "T4")
    assert thin.bound == "memory"
    assert thin.seconds == pytest.approx((16 * 8192 * 2 + 8192 * 8192) * 2 / 320e9)
    assert roofline.datasheet_seconds(0, 320e9, "T4", torch.float32, tensor_cores=False) == pytest.approx(1.0)


def test_view_rows_are_labelled_and_impossible_values_refused():
    view = gpu_view.gpu_view("copy bandwidth", [
        gpu_view.measured("copy", 20.0, "GB/s", how="bench.measure_copy_bandwidth"),
        gpu_view.predicted("copy", 320.0, "GB/s", gpu="T4", model="datasheet bandwidth"),
    ])
    text = str(view)
    assert "measured" in text and "predicted" in text and "T4 (course predictor)" in text
    assert "<table" in view._repr_html_() and "published" in view._repr_html_()
    assert view.value("copy", "predicted", "T4") == 320.0
    with pytest.raises(bench.ImpossibleValueError):
        gpu_view.measured("MFU", 122.0, "%", how="x")
    with pytest.raises(bench.ImpossibleValueError):
        gpu_view.measured("rate", -1.0, "GB/s", how="x")
    with pytest.raises(ValueError, match="kind"):
        gpu_view.ViewRow("x", "guessed", "d", 1.0, "s", "b")


def test_a_rehearsed_measurement_says_it_is_a_cpu_number(monkeypatch):
    monkeypatch.setenv("GPUFORMER_REHEARSE", "t4")
    assert "not a GPU's number" in gpu_view.measured("x", 1.0, "s", how="y").device


def test_check_fraction():
    assert bench.check_fraction("efficiency", 0.5) == 0.5
    with pytest.raises(bench.ImpossibleValueError, match="152 %"):
        bench.check_fraction("layer norm", 1.52, ceiling="the measured roof")
    with pytest.raises(bench.ImpossibleValueError, match="negative"):
        bench.check_fraction("efficiency", -0.1)


def test_a_label_writes_the_number_with_the_decimals_of_its_quote():
    """The review's error: the appendix printed the H100's compute capability, quoted as "9.0", as "9"."""
    assert published.figure("h100-compute-capability").label == "9.0 (major.minor)"
    assert "`h100-compute-capability`: 9.0 (major.minor)" in published.appendix_markdown()
    assert published.figure("t4-devicequery-sm-count").label == "40 SMs"  # "(040)" in the quote: no leading zero
    for entry in published.figures():
        token = published.written_in(entry.quote, entry.value)
        decimals = len(token.split(".")[1]) if token and "." in token else 0
        shown = entry.label.removesuffix(f" {entry.unit}")
        assert (len(shown.split(".")[1]) if "." in shown else 0) == decimals or abs(entry.value) >= 1e6, entry.key
