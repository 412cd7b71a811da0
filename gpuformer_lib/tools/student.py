"""Make student copies of the notebooks: solution cells removed, outputs cleared.

    python -m gpuformer_lib.tools.student OUT_DIR [notebooks ...]   # or: make student

A solution is any cell tagged ``solution``. Each exercise's stub and check stay, so learners run
the checks themselves. The data files the notebooks open beside them (``notebooks/traces/``: every entry
of the notebooks' folder that is not a notebook or hidden) are copied too, so the copies run in a lab.

The command never destroys work: it refuses (exit code 2, nothing written) an output file that would
be one of its input notebooks or a course notebook (paths compared resolved, so ``./notebooks``,
``notebooks/../notebooks`` and symlinks are caught), an output file that holds solution cells, and,
unless ``--force``, an output folder holding notebooks it did not write or student copies edited
since (a learner's answers). Each copy records a hash of its cells to tell the two apart, and is
written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

import nbformat

from gpuformer_lib.tools.notebooks import (METADATA_KEY, REPO_ROOT, NotANotebookError, notebook_paths, read_notebook,
                                           write_notebook_atomically)

SOLUTION_TAG = "solution"
STUDENT_KEY = "gpuformer_student"
"""Metadata of a student copy: the notebook it came from and :func:`cells_hash` as written."""


def is_solution(cell) -> bool:
    """Whether a cell is an exercise's solution (tagged ``solution``): left out of student copies, and not
    what a grader expects a learner to have run."""
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def student_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` without solution cells and without outputs."""
    copy = nbformat.from_dict(nb)
    copy.cells = [c for c in copy.cells if not is_solution(c)]
    for cell in copy.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    copy.metadata.pop(METADATA_KEY, None)
    return copy


class OverwriteRefused(Exception):
    """Writing the student copies would destroy a notebook that is not a student copy of ours."""


def cells_hash(nb: nbformat.NotebookNode) -> str:
    """sha256 of every cell's type and source: what a learner edits (outputs from running it don't count)."""
    digest = hashlib.sha256()
    for cell in nb.cells:
        digest.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    return digest.hexdigest()


def _has_solutions(nb: nbformat.NotebookNode) -> bool:
    return any(is_solution(c) for c in nb.cells)


def _unchanged_copy(path: Path) -> bool:
    """Whether ``path`` is a student copy this command wrote and nobody has edited since."""
    try:
        nb = read_notebook(path)
    except NotANotebookError:
        return False
    written = nb.metadata.get(STUDENT_KEY, {}).get("cells_sha256")
    return written is not None and written == cells_hash(nb) and not _has_solutions(nb)


def course_notebooks() -> list[Path]:
    """Every notebook in the course's notebooks folder: never an output."""
    return sorted((REPO_ROOT / "notebooks").rglob("*.ipynb"))


def check_outputs(out_dir: Path, sources: list[Path], force: bool = False) -> None:
    """Raise :class:`OverwriteRefused`, saying what and what to do, unless writing the student copies of
    ``sources`` into ``out_dir`` only creates files or replaces unedited student copies (or, with
    ``force``, other notebooks without solution cells)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OverwriteRefused(f"{out_dir} is a file, not a folder: give a folder for the student copies, "
                               "e.g. _build/student")
    protected = {path.resolve(): path for path in [*sources, *course_notebooks()]}
    names = [path.name for path in sources]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OverwriteRefused(f"two input notebooks are both named {twice[0]}: their copies would overwrite each "
                               "other in one folder; make student copies of them one folder at a time")
    for name in names:
        target = (out_dir / name).resolve()
        if target in protected:
            raise OverwriteRefused(
                f"writing {out_dir / name} would overwrite the notebook {protected[target]} itself, solutions and "
                "outputs included. The first argument is the OUTPUT folder: `python -m gpuformer_lib.tools.student "
                "_build/student [notebooks ...]` (what `make student` does)")
        if target.exists() and _has_solutions(read_notebook(target)):
            raise OverwriteRefused(f"{out_dir / name} holds solution cells, so it is a source notebook, not a "
                                   "student copy: it is never overwritten (--force neither); choose another folder")
    if force or not out_dir.is_dir():
        return
    foreign = [path for path in sorted(out_dir.glob("*.ipynb")) if not _unchanged_copy(path)]
    if foreign:
        raise OverwriteRefused(
            f"{out_dir} already holds notebooks that are not unedited student copies written by this command "
            f"({', '.join(p.name for p in foreign[:5])}{', ...' if len(foreign) > 5 else ''}): a learner's answers, "
            "or another folder's notebooks. Choose an empty folder, move them away, or overwrite them with "
            f"`python -m gpuformer_lib.tools.student {out_dir} --force` (files with solution cells are never "
            "overwritten)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder for the copies, outside the course's notebooks")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter notebook")
    parser.add_argument("--force", action="store_true",
                        help="overwrite notebooks in OUT_DIR that are not unedited student copies (never a file "
                             "with solution cells, never an input or course notebook)")
    args = parser.parse_args(argv)
    sources = args.notebooks or notebook_paths(REPO_ROOT)
    try:
        originals = [read_notebook(path) for path in sources]
        check_outputs(args.out_dir, sources, args.force)
    except (NotANotebookError, OverwriteRefused) as err:
        print(f"student: refused, nothing written: {err}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path, nb in zip(sources, originals):
        copy = student_copy(nb)
        copy.metadata[STUDENT_KEY] = {"source": path.name, "cells_sha256": cells_hash(copy)}
        write_notebook_atomically(copy, args.out_dir / path.name)
        print(f"{args.out_dir / path.name}: {len(nb.cells) - len(copy.cells)} solution cell(s) removed")
    for data in copy_data_files(sources, args.out_dir):
        print(f"{data}: copied (data the notebooks open beside them)")
    return 0


def data_files(folder: Path) -> list[Path]:
    """What the notebooks in ``folder`` open beside them (chapter 10's ``traces/``): every entry that is not a
    notebook, not hidden and not a cache."""
    return sorted(p for p in folder.iterdir() if p.suffix != ".ipynb" and not p.name.startswith((".", "_"))
                  and p.name != "__pycache__")


def copy_data_files(sources: list[Path], out_dir: Path) -> list[Path]:
    """Copy the data files of the notebooks' folders into ``out_dir`` (replacing files of the same name, never
    deleting one), so that the student copies run there as in the course; returns what was copied."""
    copied = []
    for folder in sorted({path.resolve().parent for path in sources}):
        if folder == out_dir.resolve():
            continue
        for entry in data_files(folder):
            if entry.is_dir():
                shutil.copytree(entry, out_dir / entry.name, dirs_exist_ok=True)
            else:
                shutil.copy2(entry, out_dir / entry.name)
            copied.append(out_dir / entry.name)
    return copied


if __name__ == "__main__":
    sys.exit(main())
