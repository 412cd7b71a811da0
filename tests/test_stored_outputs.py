"""What the book shows cannot be impossible: a scan of every stored output and markdown cell.

- no percentage over 100 on a line that reads it as a share of a ceiling (utilisation, efficiency, MFU,
  "of peak", "of the roof"), and no negative rate: the cell that printed it should have failed
  (``bench.check_fraction``);
- no control character in a markdown cell (a ``\\t`` written into the JSON turns ``$T \\times T$`` into
  "T <TAB>imes T" on the page).
"""

import re

import nbformat
import pytest

from gpuformer_lib.tools.notebooks import notebook_paths, output_text

NOTEBOOKS = notebook_paths()
IDS = [p.name for p in NOTEBOOKS]

_SHARE_WORDS = re.compile(r"utili[sz]ation|efficien|\bMFU\b|of (the )?(peak|roof|ceiling|datasheet)|% of", re.I)
_PERCENT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*%")
_NEGATIVE_RATE = re.compile(r"(?<![\w.\-])-\d+(?:\.\d+)?\s*[kMGTP]?(?:B/s|FLOP/s|FLOPS|tokens/s|samples/s)")


def stored_text(cell) -> str:
    return output_text(cell, html=True)


def impossible_lines(text: str) -> list[str]:
    """Lines that state a share of a ceiling over 100 % or a negative rate."""
    found = []
    for line in text.splitlines():
        if _SHARE_WORDS.search(line) and any(float(v) > 100 for v in _PERCENT.findall(line)):
            found.append(line.strip())
        elif _NEGATIVE_RATE.search(line):
            found.append(line.strip())
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_stored_output_states_an_impossible_value(path):
    nb = nbformat.read(path, as_version=4)
    bad = [(i, line) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
           for line in impossible_lines(stored_text(cell))]
    assert not bad, f"{path.name}: impossible values in stored outputs (cell, line): {bad[:5]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_markdown_has_no_control_characters(path):
    nb = nbformat.read(path, as_version=4)
    bad = [(i, repr(ch)) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
           for ch in set(cell.source) if ord(ch) < 32 and ch != "\n"]
    assert not bad, f"{path.name}: control characters in markdown cells (a '\\t' in the JSON?): {bad}"


def test_the_scan_finds_what_it_must():
    assert impossible_lines("layer norm: 152 % of the measured roof")
    assert impossible_lines("MFU 122.3 %")
    assert impossible_lines("copy: -3.2 GB/s")
    assert not impossible_lines("layer norm: 52 % of the measured roof")
    assert not impossible_lines("loss fell by 300 % relative")  # not a share of a ceiling
    assert not impossible_lines("step 12-3 GB/s")  # a range, not a negative rate
