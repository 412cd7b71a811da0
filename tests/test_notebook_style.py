"""Notebook code fits the book's column: the rendered page shows about 79 monospace characters at 1280 px
(688 px column), so longer lines scroll sideways. ``make format`` wraps code with black at 79."""

import pytest

from gpuformer_lib.tools.notebooks import code_cells, notebook_paths, read_notebook

MAX_LINE = 79


def long_lines(nb, limit: int = MAX_LINE) -> list[str]:
    found = []
    for index, cell in enumerate(code_cells(nb)):
        if "prose" in cell.metadata.get("tags", []):
            continue  # a prose cell's input is removed in the book: its text is the page's, wrapped there
        for number, line in enumerate(cell.source.splitlines(), 1):
            if len(line) > limit:
                found.append(f"code cell {index} line {number} ({len(line)} characters): {line.strip()[:60]}")
    return found


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_code_lines_fit_the_column(path):
    found = long_lines(read_notebook(path))
    assert not found, (f"{path.name}: {len(found)} code lines are wider than {MAX_LINE} characters and scroll "
                       "sideways in the book; run `make format` and wrap what is left by hand:\n  "
                       + "\n  ".join(found[:10]))


def test_the_check_sees_a_long_line():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n" + "y = '" + "a" * 80 + "'")])
    assert long_lines(nb) and "code cell 0 line 2" in long_lines(nb)[0]
