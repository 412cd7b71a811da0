"""Two sizes of one notebook: the small run that checks every code path, and the book run whose outputs readers see.

A case study's models only learn at sizes a 2-core CI machine cannot afford, so its notebook runs at two sizes,
chosen by one environment variable, ``GPUFORMER_RUN`` (:data:`ENV`):

- ``small`` (the default, and what ``make test``, ``make rehearse``, ``make grade``, ``make gpu-check``, the
  student copies and a learner's first run use): every cell runs, at sizes that take seconds;
- ``book`` (``make outputs`` sets it): the sizes at which the models learn; the outputs stored in the notebook,
  which the book shows, come from this run.

A notebook asks :func:`pick` for each size-dependent setting, and prints :func:`stamp` once: the size it ran at
and a hash of its code (its code cells and the library modules it names). ``tests/test_book_runs.py`` reads the
stamp in the stored outputs and refuses outputs that are not the book run of the current code, so a change to
the code means running the book size again (``make outputs NOTEBOOKS=...``).

Leaves out: the device's size presets (``profiles``: ``cpu``, ``gpu-small``, ``gpu``), which choose sizes by the
hardware; a book run on a GPU uses both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence, TypeVar

ENV = "GPUFORMER_RUN"
SIZES = ("small", "book")
STAMP = re.compile(r"run size: (?P<size>[a-z]+) \(\$GPUFORMER_RUN\); code (?P<code>[0-9a-f]{12})")
"""How :func:`stamp` reads in a stored output: what the stored-output tests look for."""

REPO_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def size() -> str:
    """The run size: ``$GPUFORMER_RUN``, ``'small'`` when unset or empty; anything else is refused by name."""
    value = os.environ.get(ENV, "").strip().lower() or "small"
    if value not in SIZES:
        raise ValueError(f"${ENV} must be one of {', '.join(SIZES)} (or unset, meaning small), got {value!r}")
    return value


def pick(small: T, book: T) -> T:
    """``book`` in a book run, ``small`` otherwise."""
    return book if size() == "book" else small


def code_hash(notebook: str, modules: Sequence[str], root: Path | None = None) -> str:
    """Twelve hex digits of the SHA-256 of the notebook's code cells (``notebooks/<notebook>.ipynb``, sources
    only, in order) and the source files of the library ``modules`` (names under ``gpuformer_lib``, e.g.
    ``'ltsf'``): what the stored outputs were computed by. Outputs, metadata, markdown and the prose cells
    (tagged ``prose``: templates that only fill in glued values) do not count."""
    root = root or REPO_ROOT
    path = root / "notebooks" / f"{notebook}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the code hash reads the notebook from the course's checkout")
    h = hashlib.sha256()
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code" and "prose" not in cell.get("metadata", {}).get("tags", []):
            h.update("".join(cell["source"]).encode("utf-8") + b"\0")
    for name in sorted(modules):
        source = root / "gpuformer_lib" / (name.replace(".", "/") + ".py")
        if not source.exists():
            raise FileNotFoundError(f"{source}: {name!r} is not a module of gpuformer_lib")
        h.update(name.encode() + b"\0" + source.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def stamp(notebook: str, modules: Sequence[str]) -> str:
    """The line a notebook prints once: its run size and its code's hash (``unknown`` where the notebook is not
    in a checkout, as in Colab, where nothing is stored)."""
    try:
        code = code_hash(notebook, modules)
    except FileNotFoundError:
        code = "unknown"
    return f"run size: {size()} (${ENV}); code {code}"


def read_stamp(text: str) -> tuple[str, str] | None:
    """``(size, code)`` from a stored output's text, or ``None`` if it holds no stamp."""
    m = STAMP.search(text)
    return (m["size"], m["code"]) if m else None
