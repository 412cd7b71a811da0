"""What the course checks about its notebooks, as functions the tests and ``make outputs`` share.

A notebook's stored outputs are trusted only if they were made by the code it holds now: when
``make outputs`` executes a notebook it records a hash of the code cells in the notebook's
metadata (under ``gpuformer``), and the tests recompute it. The commands read a notebook with
:func:`read_notebook` (a clear error for a file that is not one) and write one with
:func:`write_notebook_atomically` (never a half-written file).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
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


class NotANotebookError(ValueError):
    """A path given as a notebook is missing, or is not a Jupyter notebook."""


def read_notebook(path: Path) -> Any:
    """``path`` read as an nbformat-4 notebook; :class:`NotANotebookError`, naming the file, if it is not one."""
    import nbformat

    path = Path(path)
    if not path.is_file():
        raise NotANotebookError(f"no such notebook: {path} (give the path of an .ipynb file)")
    if path.suffix != ".ipynb":
        raise NotANotebookError(f"{path} is not a notebook: give .ipynb files")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as err:  # noqa: BLE001  nbformat raises JSON, schema and conversion errors alike
        raise NotANotebookError(f"{path} cannot be read as a Jupyter notebook ({type(err).__name__}: "
                                f"{str(err)[:200]}): is it corrupted or half-written? Restore it from git") from err


def write_notebook_atomically(nb: Any, path: Path) -> None:
    """Write ``nb`` to ``path`` through a temporary file in the same folder and ``os.replace``: an
    interruption leaves the old file or the new one, never a half-written notebook. An existing
    file keeps its permissions (mkstemp makes the temporary file private)."""
    import nbformat

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".ipynb.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        if path.exists():
            shutil.copymode(path, tmp)
        else:
            os.chmod(tmp, 0o644)  # what a notebook saved by Jupyter gets under the usual umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def output_text(cell: Any, html: bool = False) -> str:
    """What a code cell's stored outputs say: streams and text/plain, and with ``html`` the text of
    text/html outputs too (tags removed), as a reader of the book sees them."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
            if html:
                parts.append(re.sub(r"<[^>]+>", " ", str(out["data"].get("text/html", ""))))
    return "".join(parts)
