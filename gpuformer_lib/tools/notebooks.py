"""What the course checks about its notebooks, as functions the tests and ``make outputs`` share.

A notebook's stored outputs are trusted only if they were made by the code it holds now: when
``make outputs`` executes a notebook it records a hash of the code cells in the notebook's
metadata (under ``gpuformer``), and the tests recompute it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

METADATA_KEY = "gpuformer"
REPO_ROOT = Path(__file__).resolve().parents[2]


def code_cells(nb: Any) -> list[Any]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def code_hash(nb: Any) -> str:
    """sha256 of the notebook's code, cell by cell; trailing whitespace does not count."""
    digest = hashlib.sha256()
    for cell in code_cells(nb):
        digest.update(cell.source.rstrip().encode())
        digest.update(b"\0")
    return digest.hexdigest()


def notebook_paths(root: Path = REPO_ROOT) -> list[Path]:
    """The chapter notebooks, in order."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def toc_entries(root: Path = REPO_ROOT) -> list[str]:
    """Every ``file:`` in ``_toc.yml`` (the root too), as paths without extension."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [toc["root"]]

    def walk(items: Iterable[dict]) -> None:
        for item in items or ():
            if "file" in item:
                entries.append(item["file"])
            walk(item.get("chapters", ()))
            walk(item.get("sections", ()))

    walk(toc.get("parts", ()))
    walk(toc.get("chapters", ()))
    return [str(Path(entry).with_suffix("")) for entry in entries]


def error_outputs(nb: Any) -> list[tuple[int, str]]:
    """(cell index, error name) for every stored error output."""
    return [(i, out.get("ename", "?")) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]
