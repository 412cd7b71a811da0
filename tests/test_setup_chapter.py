"""Chapter 0's prose against the review's findings: each test would have caught one of the errors it listed."""

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def markdown(name: str) -> str:
    cells = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def outputs(name: str) -> str:
    cells = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]
    text = []
    for c in cells:
        for o in c.get("outputs", []):
            text.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


SETUP = "00_setup.ipynb"


def test_no_promise_of_gpu_results_the_page_does_not_show():
    text = markdown(SETUP)
    assert "can still see GPU results" not in text and "as measured on the GPU each page names" not in text
    # what the page says instead is true of its stored output: a view with the three kinds of number
    shown = outputs(SETUP)
    assert all(kind in shown for kind in ("measured", "predicted", "published"))


def test_missing_native_bf16_is_not_called_slower():
    text = markdown(SETUP) + outputs(SETUP)
    assert "emulated (slower than fp32)" not in text
    assert not re.search(r"emulated on most CPUs and run \*?slower", text)
    assert "oneDNN" in markdown(SETUP)  # the table says where the speed of 16-bit CPU kernels comes from


def test_the_first_timed_call_is_not_said_to_create_the_cuda_context():
    text = markdown(SETUP)
    assert "first call on a GPU pays one-off costs (creating the CUDA context" not in text
    assert "cuBLAS handle" in text and "lazily" in text


def test_seeding_is_not_said_to_make_gpu_runs_repeat_exactly():
    text = markdown(SETUP)
    assert "makes a run repeat exactly" not in text
    assert "warn_only=True" in text and "CUBLAS_WORKSPACE_CONFIG" in text and "atomic" in text


def test_the_sm_row_points_at_a_section_that_exists():
    assert "chapter 2, occupancy and waves" in markdown(SETUP)
    chapter2 = markdown("02_gpu_programming.ipynb").lower()
    assert "occupancy" in chapter2 and "wave" in chapter2
