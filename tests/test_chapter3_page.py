"""Chapter 3's page against the review of 2026-11-27 (chapter 3's verified errors 2 and 4) and issue 30."""

import json
import re
from pathlib import Path

import notebook_pages

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_attention.ipynb"


def _cells():
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def _prose() -> str:
    return " ".join(notebook_pages.text(_cells(), "markdown").split())


def _code() -> str:
    return "\n".join("".join(c["source"]) for c in _cells() if c["cell_type"] == "code")


def test_the_mask_minimal_attention_makes_is_counted():
    """Error 4: the page said the mask was "not counted", but minimal_attention computes ~mask (T x T bytes) on
    every call, inside the measured peak. The page now counts it and glues its size from T."""
    prose, code = _prose(), _code()
    # what is not counted is the mask built before the call; the ~mask made inside it is, in the text and sum
    for sentence in re.split(r"(?<=[.;])\s", prose):
        if re.search(r"\bnot counted\b", sentence) and "mask" in sentence:
            assert "built before the call" in sentence, sentence
    assert "`~mask` that `ta.minimal_attention` computes on every call" in prose
    assert "`~mask` made in the call" in prose
    assert re.search(r'mask_bytes = last\["T"\] \*\* 2', code) and 'glue("mem_mask"' in code


def test_the_growth_sentence_is_chosen_after_rounding():
    """Error 2: "grew 4.0-fold (3.9 to 4.0) against 4 ... below it": the side was chosen before the numbers were
    rounded for print. The words now come from tiled_attention.growth_against, which decides on the printed
    digits (its own tests hold the rule)."""
    code = _code()
    assert "growth_against(" in code and "growth_interval(" not in code
