"""Execute notebooks in place and record what they ran on: ``make outputs``.

    python -m gpuformer_lib.tools.execute                     # every chapter notebook
    python -m gpuformer_lib.tools.execute notebooks/01_*.ipynb

Each notebook runs top to bottom in a fresh kernel on the best device present (or the one
``--device``/``$GPUFORMER_DEVICE`` names: ``make outputs DEVICE=cuda`` fails at once if there is no
GPU, instead of silently storing CPU outputs). Stored outputs are what the book shows, so a rehearsed
profile (``$GPUFORMER_REHEARSE``) is refused. The hardware is described in a subprocess, so this
process holds no CUDA context while the notebooks run. On success its metadata gains a ``gpuformer`` entry: the hardware
summary, the size preset, the run size (``$GPUFORMER_RUN``: ``make outputs`` sets ``book``, see
``gpuformer_lib.book_run``), library versions, the date, the run time and a hash of the code cells,
and the file is replaced atomically (a crash or Ctrl-C leaves the old notebook or the new one, never
half of one). A notebook that fails (an error in a cell, a cell past ``--timeout``, a dead kernel) is
left as it was, the others still run, and the command exits non-zero, naming what failed; so is one
that was saved from an editor while it ran (the edit is kept). Every path is checked to be a readable
notebook before anything runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from tqdm.auto import tqdm

import json
import subprocess

from gpuformer_lib import book_run
from gpuformer_lib.device import DEVICE_ENV, DeviceNotAvailableError, pick_device
from gpuformer_lib.profiles import REHEARSE_ENV
from gpuformer_lib.tools.notebooks import (METADATA_KEY, NotANotebookError, code_hash, error_outputs, notebook_paths,
                                           read_notebook, write_notebook_atomically)

NOTEBOOK_FAILURES = (CellExecutionError, CellTimeoutError, DeadKernelError)
"""How running a notebook fails: a cell raised, ran past the timeout, or killed the kernel."""


class NotebookChangedError(RuntimeError):
    """The notebook's file changed while it was being executed: writing the run would lose that edit."""


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("torch", "gpuformer-lib", "numpy", "matplotlib", "nbclient", "ipykernel"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _describe_in_subprocess() -> tuple[dict, str]:
    """(hardware summary, preset name) as the notebooks' kernels see them, computed in a child process."""
    code = ("import json; from gpuformer_lib.device import choose_preset, hardware_summary; "
            "s = hardware_summary(); print(json.dumps([s.as_dict(), choose_preset(s.device).name]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    hardware, preset = json.loads(out.stdout.strip().splitlines()[-1])
    hardware["compute_capability"] = tuple(hardware["compute_capability"] or ()) or None
    return hardware, preset


def _refuse_error_outputs(nb) -> None:
    """Raise :class:`CellExecutionError` for an error a cell showed without failing: IPython catches what a
    display formatter raises and shows it as an error output, while the cell itself succeeds."""
    shown = [f"cell {index}: {name}" for index, name in error_outputs(nb)]
    if shown:
        raise CellExecutionError("cells showed errors without failing (see their outputs):\n" + "\n".join(shown),
                                 "ShownError", shown[0])


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _drop_unshown_widget_state(nb) -> None:
    """Forget the widgets' state when no output shows a widget: the book loads the 4 MB widget bundle on every
    page whose notebook stores widget state, and a widget made but never shown needs none."""
    shown = any(WIDGET_VIEW in output.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
                for output in cell.get("outputs", []))
    if not shown:
        nb.metadata.pop("widgets", None)


def execute_notebook(path: Path, timeout: int = 1800, kernel_name: str = "python3",
                     described: tuple[dict, str] | None = None) -> float:
    """Run ``path`` in place; return the seconds it took. Raises one of :data:`NOTEBOOK_FAILURES` if it
    fails, :class:`NotebookChangedError` if the file was saved meanwhile; either way the file is untouched."""
    original = path.read_bytes()
    nb = nbformat.reads(original.decode("utf-8"), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    _refuse_error_outputs(nb)
    _drop_unshown_widget_state(nb)
    hardware, preset = described or _describe_in_subprocess()
    nb.metadata[METADATA_KEY] = {
        "executed_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(seconds, 1),
        "hardware": hardware,
        "preset": preset,
        "run_size": book_run.size(),
        "versions": _versions(),
        "code_hash": code_hash(nb),
    }
    if path.read_bytes() != original:
        raise NotebookChangedError(f"{path} was changed on disk while it ran (saved from an editor?): the executed "
                                   "version was not written, so the change is kept; run it again")
    write_notebook_atomically(nb, path.resolve())  # resolved: a symlinked notebook stays a symlink
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all chapters)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    parser.add_argument("--device", default=os.environ.get(DEVICE_ENV) or None,
                        help="device the notebooks must run on (cpu, cuda, cuda:N, mps); default: the best present")
    args = parser.parse_args(argv)
    if os.environ.get(REHEARSE_ENV):
        parser.error(f"{REHEARSE_ENV} is set: a rehearsal computes on the CPU at toy sizes and must not become "
                     "the book's stored outputs. Unset it to run `make outputs`.")
    if args.device:
        try:
            pick_device(args.device)
        except (DeviceNotAvailableError, ValueError) as err:
            parser.error(f"--device {args.device}: {err}")
        os.environ[DEVICE_ENV] = args.device  # the kernels inherit it
    paths = args.notebooks or notebook_paths()
    for path in paths:  # all of them before the first runs, which may take an hour
        try:
            read_notebook(path)
        except NotANotebookError as err:
            parser.error(str(err))
    described = hardware, preset = _describe_in_subprocess()  # once: every notebook runs on the same machine
    print(f"running on {hardware['gpu_name'] or hardware['device']} with the '{preset}' preset, at the "
          f"{book_run.size()} run size (${book_run.ENV})", flush=True)
    failed = []
    for path in tqdm(paths, desc="notebooks", unit="nb"):
        try:
            seconds = execute_notebook(path, args.timeout, args.kernel, described)
        except (*NOTEBOOK_FAILURES, NotebookChangedError) as err:
            failed.append(path)
            tqdm.write(f"FAILED {path} (left unchanged):\n{err}")
            continue
        tqdm.write(f"{seconds:7.1f} s  {path}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
