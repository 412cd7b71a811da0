"""Chapter 2's page against the review of 2026-11-27 (verified errors 1, 5 and 6 of chapters 0-2) and issue 30
(its timing comparisons through ``bench.compare``)."""

import json
import re
from pathlib import Path

import notebook_pages

from gpuformer_lib import published

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_gpu_programming.ipynb"


def _cells():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def _prose() -> str:
    return " ".join(notebook_pages.text(_cells(), "markdown").split())


def _code() -> str:
    return "\n".join("".join(c["source"]) for c in _cells() if c["cell_type"] == "code")


def test_ptxas_allocates_the_registers_in_both_toolchains():
    """Error 5: "Triton's code generator, not nvcc, chooses ... the registers": ptxas allocates them for both."""
    prose = _prose()
    assert not re.search(r"not `nvcc`, chooses the instructions, the registers", prose)
    assert "`ptxas` allocates the registers in both toolchains" in prose


def test_the_per_operation_floor_is_chapter_1s():
    """Error 1: chapter 2 timed `one + one`, chapter 1 `x.add_(1)`; both now use roofline.launch_overhead
    (an in-place add of two 1-element tensors), and the page says which floor it is."""
    code = _code()
    assert "roofline.launch_overhead(device)" in code and "lambda: one + one" not in code
    assert "x.add_(one)" in _prose() and "chapter 1" in _prose()


def test_gpt_fast_is_set_against_the_peak_of_its_own_card():
    """Error 6: gpt-fast's 1397 GB/s was divided by the datasheet's 2039 GB/s although its A100 was power-limited
    to 330 W; its README's own estimate of that card's peak is registered and shown, both under chapter 2."""
    code = _code()
    assert 'figure("gpt-fast-a100-330w-peak-bandwidth")' in code
    peak = published.figure("gpt-fast-a100-330w-peak-bandwidth")
    assert "power-limited to 330 watts" in peak.quote and 2 in peak.chapters
    assert min(published.figure("gpt-fast-llama2-7b-decode-bandwidth").chapters) == 2  # its appendix section
    prose = _prose()
    assert "power-limited to 330 W" in prose and "gptfast_fraction" in prose
    assert "gptfast_datasheet_fraction" in prose


def test_timing_comparisons_go_through_bench_compare():
    """Issue 30: the interpreter's slowdown and the fused softmax's speedup come from interleaved rounds."""
    code = _code()
    assert code.count("bench.compare(") >= 2 and "fusion.verdict ==" in code and "interp.verdict ==" in code
    assert "fusion_speedup >= 1.1" not in code and "triton_s / torch_s" not in code
