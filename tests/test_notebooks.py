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


# Modules a chapter reaches that the package's dependencies do not install, and why a learner on Colab has them
# or the chapter runs without them.
NOT_DEPENDENCIES = {
    "IPython": "every Jupyter kernel has it",
    "ipywidgets": "Colab and JupyterLab ship it; viz draws a static view without it",
    "myst_nb": "the book's glue store only: viz.glue works without it",
    "pynvml": "the gpu extra (nvidia-ml-py), read only on an NVIDIA GPU and skipped where it is missing",
    "psutil": "a dependency where there is no /proc (not Linux); Colab ships it",
    "triton": "part of PyTorch's CUDA build on Linux, as on Colab's GPU runtimes",
    "nbformat": "the tools extra: imported only by the tools that read notebook files, inside their functions",
    "yaml": "the tools extra: imported only by the tools that read _toc.yml, inside their functions",
}


def _imports(source: str) -> set[str]:
    import ast

    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def _library_file(module: str):
    path = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def reached_modules(source: str) -> set[str]:
    """Top-level third-party modules that ``source`` imports, directly or through the library's modules (their
    imports anywhere in the file, functions included, relative ones followed), plus the ONNX packages that
    ``deploy`` imports by name."""
    import ast
    import sys

    seen, third, todo = set(), set(), list(_imports(source))
    while todo:
        module = todo.pop()
        top = module.split(".")[0]
        if top != "gpuformer_lib":
            if top not in sys.stdlib_module_names:
                third.add(top)
            continue
        path = _library_file(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        if path.stem == "deploy":
            from gpuformer_lib.deploy import ONNX_PACKAGES

            third |= set(ONNX_PACKAGES)
        todo += _imports(text)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                package = ".".join(base.relative_to(REPO_ROOT).parts)
                module = package + (f".{node.module}" if node.module else "")
                todo += [module, *(f"{module}.{a.name}" for a in node.names)]
    return third


def installed_by_the_package() -> set[str]:
    """Top-level modules of the package's dependencies (pyproject.toml) and of everything they require."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names, todo = set(), [Requirement(d).name for d in deps]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in names:
            continue
        names.add(name)
        try:
            todo += [Requirement(r).name for r in (md.requires(name) or []) if "extra ==" not in r]
        except md.PackageNotFoundError:
            continue
    modules = set()
    for module, dists in md.packages_distributions().items():
        if any(d.lower().replace("_", "-") in names for d in dists):
            modules.add(module)
    return modules


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_what_a_chapter_imports_is_installed_by_its_first_cell(path):
    """The first cell installs the package, which brings its dependencies: every module the chapter reaches is one
    of them, or a documented exception (chapter 16's ONNX packages are dependencies, so Colab has them)."""
    code = "\n".join(c.source for c in code_cells(load(path)))
    missing = reached_modules(code) - installed_by_the_package() - set(NOT_DEPENDENCIES)
    assert not missing, f"{path.name} imports {sorted(missing)}, which its first cell does not install"


def test_the_import_check_follows_the_library():
    assert {"onnx", "onnxscript", "onnxruntime"} <= reached_modules("from gpuformer_lib import deploy")
    assert "sacrebleu" in reached_modules("from gpuformer_lib import generate")
    assert reached_modules("import pandas\nimport json") == {"pandas"}
    assert "pandas" not in installed_by_the_package()


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
