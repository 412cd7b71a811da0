"""What the page tests read from a stored notebook: its cells, the joined sources of one kind of cell, the text of
its stored outputs, and its glued values. One copy, shared by ``tests/test_chapter*_page.py``.

The tests import it as ``from notebook_pages import ...``: ``tests/`` has no ``__init__.py``, so pytest puts the
folder on ``sys.path``.
"""

import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RECORD = "application/papermill.record/text/plain"


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def load_cells(name: str) -> list:
    """The cells of ``notebooks/<name>``."""
    return json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))["cells"]


def cells_fixture(name: str):
    """A module-scoped ``cells`` fixture for ``notebooks/<name>``: ``cells = cells_fixture("07_....ipynb")``."""

    @pytest.fixture(scope="module")
    def cells():
        return load_cells(name)

    return cells


PROSE_TEMPLATE = re.compile(r'^prose\(r"""\n(.*)\n"""\)\s*$', re.S)


def is_prose(cell) -> bool:
    """A prose cell: code that renders a value-chosen paragraph (``viz.prose``), its input removed in the book."""
    return cell["cell_type"] == "code" and "prose" in cell.get("metadata", {}).get("tags", [])


def prose_markdown(cell) -> str:
    """A prose cell's text as the markdown it replaced: each ``{{name}}`` read as ``{glue:text}`name```."""
    match = PROSE_TEMPLATE.match("".join(cell["source"]))
    assert match, f"a prose cell is not one prose(r\"\"\"...\"\"\") call: {''.join(cell['source'])[:80]!r}"
    return re.sub(r"\{\{(\w+)\}\}", r"{glue:text}`\1`", match.group(1))


def with_parts(cells, cell) -> list:
    """The cell ``cell`` was split from, with all its parts, in order (ids ``<id>``, ``<id>-part2``, ...): code
    that assembles a sentence, a view or a table was moved out of the cell that computes, into cells of its own,
    folded in the book."""
    base = re.sub(r"-part\d+$", "", str(cell.get("id", "")))
    return [c for c in cells if re.fullmatch(re.escape(base) + r"(-part\d+)?", str(c.get("id", "")))]


def text(cells, kind: str) -> str:
    """The sources of the ``kind`` cells ("markdown" or "code"), one per line. The prose is "markdown": the
    markdown cells and the prose cells' text (:func:`prose_markdown`). Code is given with each bracketed call on
    one line (:func:`joined_code`), as tests search it for calls."""
    if kind == "markdown":
        return "\n".join(prose_markdown(c) if is_prose(c) else "".join(c["source"]) for c in cells
                         if c["cell_type"] == "markdown" or is_prose(c))
    sources = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == kind and not is_prose(c))
    return joined_code(sources) if kind == "code" else sources


def joined_code(source: str) -> str:
    """``source`` with the line breaks that a formatter puts inside brackets taken out: ``glue(\\n    "x",\\n    v,\\n)``
    reads ``glue("x", v)``, and strings split over lines are joined (``"a"\\n    " b"`` reads ``"a b"``)."""
    source = re.sub(r"([(\[{])[ \t]*\n\s*", r"\1", source)  # an opening bracket's line break
    source = re.sub(r",?[ \t]*\n\s*([)\]}])", r"\1", source)  # a closing bracket on its own line
    source = re.sub(r",[ \t]*\n\s*", ", ", source)  # one argument per line
    source = re.sub(r"(?<=[\"'])[ \t]*\n\s*(?=[+]?\s*f?[\"'])", " ", source)  # strings on consecutive lines
    source = re.sub(r"\n\s*((?:[-+*/%]|and|or|if|else|for|in)\s)", r" \1", source)  # an operator starting a line
    source = re.sub(r"([\"'])\s+(?:\+\s+)?f?([\"'])", lambda m: "" if m.group(1) == m.group(2) else m.group(0),
                    source)  # "a" "b" -> "ab", "a" + f"b" -> "ab"
    return _unwrapped_asserts(source)


def _unwrapped_asserts(source: str) -> str:
    """``assert (x == y), "why"`` (a formatter's wrapping of a long assert) reads ``assert x == y, "why"``."""
    out, start = [], 0
    for match in re.finditer(r"\bassert \(", source):
        depth, i = 0, match.end() - 1
        while i < len(source):
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            if depth == 0:
                break
            i += 1
        if i < len(source) and source[i + 1:i + 2] in (",", "\n", ""):
            out += [source[start:match.start()], "assert ", source[match.end():i]]
            start = i + 1
    return "".join(out) + source[start:]


def glue_uses(cells) -> set[str]:
    """The glue names the prose shows (``{glue:text}`name```)."""
    return set(re.findall(r"\{glue:text\}`([^`]+)`", text(cells, "markdown")))


def outputs(cells, mimes=("text/plain",), sep="\n") -> str:
    """Every stored output's text, as the book shows it: stream text, then each data value whose type starts with
    one of ``mimes`` (``("text/",)`` takes text/plain and text/html; ``"application/papermill"`` the glue records),
    the non-empty pieces joined by ``sep``."""
    pieces = []
    for cell in cells:
        for out in cell.get("outputs", []):
            pieces.append(_joined(out.get("text", "")))
            data = out.get("data", {})
            pieces.extend(_joined(data[key]) for mime in mimes for key in data if key.startswith(mime))
    return sep.join(p for p in pieces if p)


def _unquoted(text: str) -> str:
    """A stored string as the book shows it: myst-nb evaluates the repr (``'28,976'`` -> ``28,976``)."""
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return text.strip("'\"")
    return value if isinstance(value, str) else text


def glued(cells, strip_quotes: bool = True) -> dict[str, str]:
    """Glue name -> the value it stored (its papermill record, else its text/plain), read from the outputs whose
    ``metadata.scrapbook.name`` is set; with ``strip_quotes`` a string's repr quotes are taken off."""
    values = {}
    for cell in cells:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                data = out.get("data", {})
                value = _joined(data.get(RECORD, data.get("text/plain", "")))
                values[name] = _unquoted(value) if strip_quotes else value
    return values


def assert_glues_match(cells) -> None:
    """Every glued value is used in the prose, and every value the prose uses is glued."""
    used, stored = glue_uses(cells), set(glued(cells))
    assert used <= stored, f"used but never glued: {sorted(used - stored)}"
    assert stored <= used, f"glued but never used: {sorted(stored - used)}"


def assert_no_share_above_100(cells, mimes=("text/plain", "text/html")) -> None:
    """No stored output shows a percentage above 100 (a share, utilisation or efficiency cannot exceed it)."""
    text = outputs(cells, mimes=mimes)
    for match in re.finditer(r"(\d+(?:\.\d+)?)\s*%", text):
        assert float(match.group(1)) <= 100, text[max(0, match.start() - 80): match.end()]


def assert_gpu_view(cells) -> str:
    """The page's GPU view has its three kinds (measured, predicted, published) and names a T4 and an H100;
    returns the page's HTML outputs for further checks."""
    html = outputs(cells, mimes=("text/html",))
    for kind in ("measured", "predicted", "published"):
        assert f"gpuview-{kind}" in html, kind
    for gpu in ("T4", "H100"):
        assert gpu in html
    return html


def hidden_solutions(cells) -> list:
    """The solution cells, each asserted to be hidden (tagged ``hide-cell``) in the book."""
    solutions = [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
    assert all("hide-cell" in c["metadata"]["tags"] for c in solutions)
    return solutions


def assert_speed_words(words: str) -> None:
    """The acceleration table's verdict words (``AccelerationTable.summary()['speed_words']``) agree with the
    numbers printed in them: with the interleaved rounds' middle half, "sooner" only when the whole middle half
    is above 1 (and "slower" below), as ``bench.Comparison`` rules; without it, ``ratio_words``' margin of 1.1.
    Printed to two decimals, so either side of a boundary a value may have been rounded from is allowed."""
    near = lambda v: (v - 0.005, v, v + 0.005)  # noqa: E731
    m = re.search(r"(\d+\.\d+)x.*rounds: (\d+\.\d+)x-(\d+\.\d+)x", words)
    if m:
        value, low, high = (float(g) for g in m.groups())
        # the value is time to quality before / after (the rows' median times), the range the middle half of the
        # rounds' own speedups: two statistics of the same rounds, close but not nested (chapter 15's book run:
        # 1.05x beside 0.99x-1.03x), so only a far-off value fails
        assert low / 1.1 <= value <= high * 1.1, words
        rule = lambda v, lo, hi: ("sooner" if lo > 1 and v > 1.02 else  # noqa: E731
                                  "slower" if hi < 1 and v < 1 / 1.02 else "about as long")
        assert any(rule(v, lo, hi) in words for v in near(value) for lo in near(low) for hi in near(high)), words
        return
    m = re.search(r"(\d+\.\d+)x", words)
    if m:
        rule = lambda v: "sooner" if v >= 1.1 else "slower" if v <= 1 / 1.1 else "about as long"  # noqa: E731
        assert any(rule(v) in words for v in near(float(m.group(1)))), words
