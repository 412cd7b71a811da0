"""Chapter 8 (mixed precision) as the book shows it: what the review of chapters 7-12 found wrong cannot
come back. Reads the stored notebook: its markdown, its glued values and its outputs."""

import json
import re
from pathlib import Path

import pytest

import notebook_pages as pages

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "08_mixed_precision.ipynb"


@pytest.fixture(scope="module")
def nb():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def test_no_claim_that_chapter_1_measured_a_gpu(nb):
    md = pages.text(nb["cells"], "markdown")
    assert "Chapter 1 measured it" not in md
    assert "ratios of datasheet peaks" in md and "not measurements" in md and "{glue:text}`h100_16bit_ratio`" in md


def test_autocast_demo_uses_16_bit_inputs_and_says_the_lists_differ(nb):
    md, out = pages.text(nb["cells"], "markdown"), pages.outputs(nb["cells"])
    assert "inputs bfloat16" in out and "inputs are float32" not in out
    assert re.search(r"softmax\s+bfloat16\s+float32\s+<- differs", out)
    assert re.search(r"layer_norm\s+bfloat16\s+float32\s+<- differs", out)
    assert "The CPU's lists are\ndifferent" in md or "CPU's lists are different" in md.replace("\n", " ")
    assert "amp.html#autocast-op-reference" in md


def test_cuda_default_is_fp16_not_bf16(nb):
    md, glued = pages.text(nb["cells"], "markdown"), pages.glued(nb["cells"])
    assert "bf16 is the default" not in md
    assert glued["cuda_default"] == "float16"
    assert "dtype=torch.bfloat16" in md


def test_sixteen_bytes_in_every_mode_is_corrected(nb):
    md, out = pages.text(nb["cells"], "markdown"), pages.outputs(nb["cells"])
    assert "16 bytes per parameter in every mode" not in md
    assert re.search(r"autocast\s+18\s", out) and re.search(r"fp32 grads\s+20\s", out)


def test_typed_trend_replaced_by_a_measured_sweep(nb):
    md, glued = pages.text(nb["cells"], "markdown"), pages.glued(nb["cells"])
    assert "the\nsmaller the learning rate" not in md and "The first is the worst" not in md
    assert glued["lost_trend"] in ("rises as the learning rate falls", "falls as the learning rate falls",
                                   "does not move in one direction with the learning rate")
    assert glued["update_vs_gap"] in ("smaller", "larger")


def test_benchmark_sizes_are_checked_compute_bound(nb):
    out = pages.outputs(nb["cells"])
    rows = {m.group(1).strip(): float(m.group(2)) for m in
            re.finditer(r"^(T4 \(gpu-small\)|H100 SXM \(gpu\)|H100 SXM, this page's toy sizes)\s.*?(\S+)$", out, re.M)}
    from gpuformer_lib.mixed_precision import COMPUTE_BOUND_RATIO

    assert rows["T4 (gpu-small)"] >= COMPUTE_BOUND_RATIO and rows["H100 SXM (gpu)"] >= COMPUTE_BOUND_RATIO
    assert rows["H100 SXM, this page's toy sizes"] < 1


def test_unscale_before_clipping_and_accumulation_are_taught(nb):
    md = pages.text(nb["cells"], "markdown")
    assert "unscale_" in md and "accumulation" in md.lower()
    assert "No inf checks were recorded" in pages.outputs(nb["cells"])


def test_gpu_view_has_three_kinds_and_fp8_is_predicted_and_cited(nb):
    html = ""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            html += "".join(out.get("data", {}).get("text/html", ""))
    assert "gpuview-measured" in html and "gpuview-predicted" in html and "gpuview-published" in html
    assert "FP8 rate" in html and "torchao.float8" in html


def test_speed_words_agree_with_the_glued_speedups(nb):
    glued = pages.glued(nb["cells"])
    for part in glued["mode_speedups"].split(", "):
        m = re.match(r"(\w+) ([\d.]+)x \((slower|faster|within 25 %)\)", part)
        assert m, part
        s, word = float(m.group(2)), m.group(3)
        assert word == ("slower" if s < 0.8 else "faster" if s > 1.25 else "within 25 %")


def test_four_exercises_with_a_prediction_and_a_diagnosis(nb):
    md = pages.text(nb["cells"], "markdown")
    assert "### Exercise 8.3: predict, then measure" in md and "### Exercise 8.4: find the layer" in md
    sources = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "check_mixed_precision_state" not in sources  # the transcription exercise is gone
