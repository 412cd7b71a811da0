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
"""The folder above the library: a clone of the course when the library runs from one (or was installed from
one with ``pip install -e``). After a plain ``pip install`` it is a folder of site-packages' parents, which
holds no notebooks: :func:`checkout_root` says so instead of finding none."""


class NotACheckoutError(FileNotFoundError):
    """The notebooks were looked for in a folder that is not a clone of the course (no ``notebooks/`` there)."""


def checkout_root(root: Path | str | None = None) -> Path:
    """``root`` (default :data:`REPO_ROOT`), checked to be a clone of the course: a folder with ``notebooks/``.

    Raises :class:`NotACheckoutError`, naming the folder and the fix, where it is not one: the library was
    installed into site-packages (``pip install gpuformer-lib``, not ``pip install -e .`` from a clone), so it
    does not know where the notebooks are. A tool given that folder would otherwise find zero notebooks and
    say nothing."""
    given = root is not None
    root = Path(REPO_ROOT if root is None else root)
    if (root / "notebooks").is_dir():
        return root
    where = (f"{root} was given as the course's folder" if given else
             f"gpuformer_lib is installed at {Path(__file__).resolve().parents[1]}, not in a clone of the course "
             f"(a plain `pip install`, not `pip install -e .`), so it looked in {root}")
    raise NotACheckoutError(
        f"no notebooks/ folder in {root}: {where}. The notebooks, tests and make targets ship only with the "
        "repository. Run from a clone (git clone the course, cd into it and run `python -m ...` or `make ...` "
        "there; `pip install -e .` makes an installed library point at it), or pass the clone's path "
        "(`--repo DIR` for gpu_check, the notebooks' paths for the tools that take them).")




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


def notebook_paths(root: Path | str | None = None) -> list[Path]:
    """The chapter notebooks of the clone at ``root`` (default :data:`REPO_ROOT`), in order;
    :class:`NotACheckoutError` where ``root`` is not a clone (see :func:`checkout_root`), and where a clone holds
    none (a broken checkout), rather than an empty list that a caller would run as "all passed"."""
    root = checkout_root(root)
    paths = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise NotACheckoutError(f"{root / 'notebooks'} holds no chapter notebook (NN_*.ipynb): is the clone "
                                "complete? `git status` there says what is missing")
    return paths


def toc_entries(root: Path | str | None = None) -> list[str]:
    """Every ``file:`` in ``_toc.yml`` (the root too), as paths without extension."""
    import yaml

    root = checkout_root(root)
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
