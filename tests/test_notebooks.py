"""Hygiene of the committed notebooks: stored outputs are current, error-free and complete.

nbval re-executes the notebooks; these tests check what the *book* shows, which is the outputs
stored in the files by ``make outputs``.
"""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

from gpuformer_lib.tools.notebooks import (METADATA_KEY, REPO_ROOT, code_cells, code_hash, error_outputs,
                                           notebook_paths, output_text, toc_entries)

NOTEBOOKS = notebook_paths()
IDS = [p.name for p in NOTEBOOKS]


def load(path: Path):
    return nbformat.read(path, as_version=4)


def outputs_text(cell) -> str:
    return output_text(cell)


def test_chapters_exist():
    assert [p.name[:3] for p in NOTEBOOKS][:2] == ["00_", "01_"]


def test_every_notebook_is_in_the_toc_and_every_toc_entry_exists():
    entries = toc_entries()
    for path in NOTEBOOKS:
        rel = str(path.relative_to(REPO_ROOT).with_suffix(""))
        assert rel in entries, f"{rel} is not in _toc.yml: add it so the book shows it"
    for entry in entries:
        assert any((REPO_ROOT / entry).with_suffix(ext).exists() for ext in (".md", ".ipynb")), \
            f"_toc.yml names {entry}, which does not exist"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_outputs_were_made_by_the_current_code(path):
    nb = load(path)
    meta = nb.metadata.get(METADATA_KEY)
    assert meta, f"{path.name} has no '{METADATA_KEY}' metadata: run `make outputs`"
    assert meta["code_hash"] == code_hash(nb), \
        f"{path.name}: code changed after its outputs were made; run `make outputs` to refresh them"
    for key in ("executed_at", "hardware", "versions", "preset"):
        assert key in meta, f"{path.name}: metadata lacks {key!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_stored_errors_and_every_cell_ran_in_order(path):
    nb = load(path)
    assert not error_outputs(nb), f"{path.name} stores error outputs in cells {error_outputs(nb)}"
    counts = [c.execution_count for c in code_cells(nb) if c.source.strip()]
    assert counts == list(range(1, len(counts) + 1)), \
        f"{path.name}: cells were not run once, top to bottom (execution counts {counts})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_opens_with_hardware_and_preset(path):
    cells = code_cells(load(path))
    opening = next((c for c in cells[:3] if "run_header(" in c.source), None)
    assert opening is not None, f"{path.name}: one of the first code cells must print run_header(...)"
    text = outputs_text(opening)
    assert text.startswith("device") and "size preset" in text


def course_version() -> str:
    import tomllib

    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_colab_setup_cell_installs_this_repository_at_the_version_of_pyproject(path):
    """Colab installs the course at the tag named after pyproject.toml's version (not an unpinned main, which
    may have moved on from the notebook the learner opened)."""
    url = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())["repository"]["url"]
    first = code_cells(load(path))[0]
    assert "google.colab" in first.source, f"{path.name}: the first code cell must be the Colab set-up"
    installed = re.findall(r"git\+(\S+?)[\"']", first.source)
    assert installed == [f"{url}@v{course_version()}"], \
        f"{path.name}: the set-up cell installs {installed}, not {url} at the tag v{course_version()}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_at_least_three_exercises_with_hidden_solutions(path):
    nb = load(path)
    solutions = [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]
    assert len(solutions) >= 3, f"{path.name} has {len(solutions)} exercise solutions; each chapter needs 3"
    for cell in solutions:
        assert "hide-cell" in cell.metadata["tags"], f"{path.name}: a solution is not folded away"
        assert "assert check_" in cell.source, f"{path.name}: a solution does not assert its check"
        assert "✅" in outputs_text(cell), f"{path.name}: a stored solution output does not show its check passing"


# The checks above must be able to fail: exercise them on doctored notebooks.

def test_code_hash_sees_code_changes_but_not_outputs(tmp_path):
    nb = load(NOTEBOOKS[0])
    before = code_hash(nb)
    cell = code_cells(nb)[1]
    cell.outputs = []
    assert code_hash(nb) == before
    cell.source += "\nprint('changed')"
    assert code_hash(nb) != before


def test_error_outputs_are_found():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1/0")])
    nb.cells[0].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="", traceback=[])]
    assert error_outputs(nb) == [(0, "ZeroDivisionError")]
