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


def test_grouped_tile_order_is_taught_with_its_working_sets():
    """Review 2026-11-27 (ch2): "the matmul has no grouped ordering and no autotune". The page draws both orders,
    counts each wave's panels with kernels.wave_working_set (w + 1 against 2 sqrt(w) at w = 64), runs
    kernels.grouped_matmul against torch.matmul, names autotune, and states no GPU number for the grouped order."""
    cells = _cells()
    out = notebook_pages.outputs(cells)
    row = re.search(r"^\s*64\s+8\s+([\d.]+) \([^)]*\)\s+([\d.]+) \(", out, re.M)
    assert row and float(row.group(1)) == 65 and float(row.group(2)) == 16
    assert "grouped  : panels read by each wave of 9: [6, 6, 6, 6, 6, 6, 6, 6]" in out
    assert "grouped_matmul == torch.matmul" in out
    glued = notebook_pages.glued(cells)
    assert (glued["grp_rm"], glued["grp_gr"]) == ("65", "16")
    code, prose = _code(), _prose()
    assert "kernels.grouped_matmul(" in code and "kernels.wave_working_set(" in code
    assert "@triton.autotune" in prose and "no measurement of it is stored yet" in prose
