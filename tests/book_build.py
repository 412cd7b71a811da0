"""One way to build the book for the tests that read it (``test_book.py``) and open it in a browser
(``test_book_browser.py``): a copy of the sources, built with warnings as errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpuformer_lib.tools.notebooks import REPO_ROOT

SOURCES = ("_config.yml", "_toc.yml", "book", "notebooks", "gpuformer_lib", "scripts", "bench_results")
"""What the build reads: ``bench_results`` holds the committed GPU results that the GPU views show."""


def build_book(tmp_path_factory) -> Path:
    """The ``_build/html`` folder of a copy of the book's sources, built once per test session: the two test
    files that read it may run in two pytest-xdist workers, which share the parent of their temporary folders
    (the first to take the lock builds; a failed build is left to the next to try again)."""
    from filelock import FileLock  # torch's own dependency

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built = shared / "gpuformer-book-build.txt"
    with FileLock(str(shared / "gpuformer-book-build.lock")):
        if built.exists():
            return Path(built.read_text(encoding="utf-8"))
        html = _build(tmp_path_factory)
        built.write_text(str(html), encoding="utf-8")
        return html


def _build(tmp_path_factory) -> Path:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    if not jupyter_book.exists():
        jupyter_book = shutil.which("jupyter-book")
    assert jupyter_book, "jupyter-book is not installed: run `make test`, which installs requirements.txt"
    # Build a copy of the sources, with the stray markdown that tools leave in hidden folders
    # (pytest's cache, a virtual environment), which must not break the build.
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if not (REPO_ROOT / name).exists():
            continue
        copy = shutil.copytree if (REPO_ROOT / name).is_dir() else shutil.copy2
        copy(REPO_ROOT / name, src / name)
    for stray in (".pytest_cache/README.md", ".venv/lib/README.md"):
        (src / stray).parent.mkdir(parents=True)
        (src / stray).write_text("# not part of the book\n")
    out = tmp_path_factory.mktemp("book")
    result = subprocess.run(
        [str(jupyter_book), "build", str(src), "--path-output", str(out), "--warningiserror", "--all"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"book build failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return out / "_build" / "html"
