"""Make student copies of the notebooks: solution cells removed, outputs cleared.

    python -m gpuformer_lib.tools.student OUT_DIR [notebooks ...]   # or: make student

A solution is any cell tagged ``solution``. Each exercise's stub and check stay, so learners run
the checks themselves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from gpuformer_lib.tools.notebooks import METADATA_KEY, notebook_paths

SOLUTION_TAG = "solution"


def student_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` without solution cells and without outputs."""
    copy = nbformat.from_dict(nb)
    copy.cells = [c for c in copy.cells if SOLUTION_TAG not in c.get("metadata", {}).get("tags", [])]
    for cell in copy.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    copy.metadata.pop(METADATA_KEY, None)
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter notebook")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path in args.notebooks or notebook_paths():
        nb = nbformat.read(path, as_version=4)
        copy = student_copy(nb)
        nbformat.write(copy, args.out_dir / path.name)
        print(f"{args.out_dir / path.name}: {len(nb.cells) - len(copy.cells)} solution cell(s) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
