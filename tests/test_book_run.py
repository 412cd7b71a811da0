"""Two sizes of one notebook (gpuformer_lib.book_run): the run size is chosen by $GPUFORMER_RUN, the Makefile sets
it, and the stored outputs of every notebook that stamps its run are the book run of the current code."""

from __future__ import annotations

import ast
import json
import re
import subprocess

import pytest

from gpuformer_lib import book_run
from gpuformer_lib.tools.notebooks import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9]*.ipynb"))


def test_the_size_is_small_unless_book_is_asked_for(monkeypatch):
    monkeypatch.delenv(book_run.ENV, raising=False)
    assert book_run.size() == "small" and book_run.pick(1, 2) == 1
    monkeypatch.setenv(book_run.ENV, "book")
    assert book_run.size() == "book" and book_run.pick(1, 2) == 2
    monkeypatch.setenv(book_run.ENV, "")
    assert book_run.size() == "small"
    monkeypatch.setenv(book_run.ENV, "large")
    with pytest.raises(ValueError, match="GPUFORMER_RUN must be one of small, book"):
        book_run.size()


def _notebook(tmp_path, cells) -> None:
    (tmp_path / "notebooks").mkdir(exist_ok=True)
    (tmp_path / "gpuformer_lib").mkdir(exist_ok=True)
    (tmp_path / "gpuformer_lib" / "m.py").write_text("X = 1\n")
    (tmp_path / "notebooks" / "nb.ipynb").write_text(json.dumps({"cells": cells}))


def _code(src, tags=(), outputs=()):
    return {"cell_type": "code", "source": src, "metadata": {"tags": list(tags)}, "outputs": list(outputs)}


def test_the_code_hash_follows_code_and_modules_not_outputs_or_prose(tmp_path):
    _notebook(tmp_path, [_code("x = 1"), _code("prose('{{x}}')", ["prose"])])
    first = book_run.code_hash("nb", ["m"], root=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    _notebook(tmp_path, [_code("x = 1", outputs=[{"text": "1"}]), _code("prose('{{x}} words')", ["prose"]),
                         {"cell_type": "markdown", "source": "new words", "metadata": {}}])
    assert book_run.code_hash("nb", ["m"], root=tmp_path) == first
    _notebook(tmp_path, [_code("x = 2"), _code("prose('{{x}}')", ["prose"])])
    assert book_run.code_hash("nb", ["m"], root=tmp_path) != first
    _notebook(tmp_path, [_code("x = 1"), _code("prose('{{x}}')", ["prose"])])
    (tmp_path / "gpuformer_lib" / "m.py").write_text("X = 2\n")
    assert book_run.code_hash("nb", ["m"], root=tmp_path) != first
    with pytest.raises(FileNotFoundError, match="not a module"):
        book_run.code_hash("nb", ["missing"], root=tmp_path)


def test_a_stamp_reads_back(monkeypatch):
    monkeypatch.setenv(book_run.ENV, "book")
    line = book_run.stamp("15_forecasting_case_study", ["ltsf"])
    assert book_run.read_stamp(f"device cpu\n{line}\nplan: ...") == ("book", book_run.code_hash(
        "15_forecasting_case_study", ["ltsf"]))
    assert book_run.read_stamp("no stamp here") is None
    assert book_run.stamp("no_such_notebook", ["ltsf"]).endswith("code unknown")


def test_the_makefile_stores_the_book_run_and_checks_the_small_one():
    def dry(target, env=None):
        out = subprocess.run(["make", "-n", "--no-print-directory", target, "ONLY=notebooks/15_x.ipynb"],
                             cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=60)
        return out.stdout
    assert "GPUFORMER_RUN=book" in dry("outputs") and "notebooks/15_x.ipynb" in dry("outputs")
    makefile = (REPO_ROOT / "Makefile").read_text()
    line = next(ln for ln in makefile.splitlines() if "export GPUFORMER_RUN := small" in ln)
    for target in ("test", "rehearse", "grade", "student", "gpu-check"):
        assert target in line.split(":")[0].split(), target


def _stamped(path):
    """The modules a notebook's stamp names and the stamp in its stored outputs (None if it prints none)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    if "book_run.stamp(" not in code:
        return None
    modules = ast.literal_eval(re.search(r"BOOK_RUN_MODULES = (\([^)]*\))", code).group(1))
    texts = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            texts.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")))
    return modules, book_run.read_stamp("\n".join(texts))


STAMPED = [p for p in NOTEBOOKS if _stamped(p) is not None]


def test_the_case_studies_stamp_their_run():
    assert [p.name[:2] for p in STAMPED] == ["13", "14", "15"]


@pytest.mark.parametrize("path", STAMPED, ids=[p.name[:2] for p in STAMPED])
def test_stored_outputs_are_the_book_run_of_the_current_code(path):
    modules, stamp = _stamped(path)
    assert stamp is not None, f"{path.name}: no run stamp in the stored outputs; run `make outputs ONLY={path}`"
    size, code = stamp
    assert size == "book", (f"{path.name} stores a {size} run: the book shows the book run; "
                            f"`make outputs ONLY=notebooks/{path.name}`")
    assert code == book_run.code_hash(path.stem, modules), (
        f"{path.name}: its stored outputs come from other code than today's (its code cells or "
        f"gpuformer_lib/{', '.join(modules)} changed since): run `make outputs ONLY=notebooks/{path.name}` again")
